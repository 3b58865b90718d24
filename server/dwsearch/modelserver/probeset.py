"""The probe set the package ships: customer-support chat in English, Malay, Chinese and
rojak (code-switched Malay/English/Chinese), written as customers and agents type it.

Two users read it: the int8 quantization guard, which compares an int8 export with fp32 on
`guard_texts()` and `RERANK_PROBES`, and `dwsearch model-check`, which measures the deployed
models' cross-lingual recall on `TOPICS` and their reranking on `RERANK_PROBES`.

Each topic is one request said four ways. The four versions share no topic keyword (no
"refund" in the Malay line, no order number in all four), so only a model that reads each
language can match them; rojak keeps the topic's word in Malay or Chinese and English only
for filler, as it is typed. Edit it as users would write, never to fit one model's mistakes.
"""

from __future__ import annotations

from dataclasses import dataclass

LANGUAGES = ("en", "ms", "zh", "rojak")


@dataclass(frozen=True)
class Topic:
    """One customer request in the four languages."""

    name: str
    en: str
    ms: str
    zh: str
    rojak: str

    def text(self, language: str) -> str:
        """The request in `language` (one of LANGUAGES)."""
        if language not in LANGUAGES:
            raise ValueError(f"unknown language {language!r}; one of {', '.join(LANGUAGES)}")
        text: str = getattr(self, language)
        return text


TOPICS: tuple[Topic, ...] = (
    Topic(
        name="refund_not_received",
        en="hi, i sent the shoes back two weeks ago and still haven't got my refund. when will the money be back?",
        ms="salam, saya dah pulangkan kasut tu dua minggu lepas tapi duit belum masuk lagi. bila boleh dapat balik duit saya?",
        zh="你好，我两个星期前已经把鞋子寄回去了，到现在还没收到退款，钱什么时候会退回来？",
        rojak="boss, kasut dah hantar balik 2 minggu already tapi 退款 still belum masuk lagi, bila nak dapat?",
    ),
    Topic(
        name="parcel_late",
        en="my parcel was supposed to arrive on monday, it's friday now and the tracking hasn't moved since. where is it?",
        ms="bungkusan saya sepatutnya sampai hari isnin, sekarang dah jumaat dan status penghantaran tak bergerak langsung. barang kat mana ni?",
        zh="我的包裹说星期一会到，现在都星期五了，物流信息一直没更新，到底到哪里了？",
        rojak="barang saya patut sampai isnin, sekarang dah jumaat 还没到 lagi, 物流 tak gerak langsung, macam mana ni?",
    ),
    Topic(
        name="password_reset",
        en="i forgot my password and the reset email never shows up in my inbox, how do i get back in?",
        ms="saya terlupa kata laluan, dah minta tukar tapi emel untuk set semula tak sampai-sampai. macam mana nak masuk akaun?",
        zh="我忘记密码了，点了重设可是一直没收到邮件，怎么才能重新登入？",
        rojak="saya lupa 密码 la, tekan tukar dah banyak kali tapi 邮件 tak sampai pun, camne nak masuk balik?",
    ),
    Topic(
        name="card_payment_failed",
        en="tried paying by credit card three times and it keeps telling me the payment didn't go through, my bank says the card is fine",
        ms="saya cuba bayar guna kad kredit tiga kali, asyik keluar pembayaran ditolak, padahal baki dalam kad masih banyak",
        zh="我用信用卡付款试了三次，每次都显示交易失败，银行说我的卡没有问题",
        rojak="pakai 信用卡 bayar tiga kali pun gagal, keluar declined je, 银行 cakap kad takde masalah",
    ),
    Topic(
        name="change_delivery_address",
        en="i just placed an order but put my old address, can you change it so it gets delivered to my new place?",
        ms="saya baru buat pesanan tapi tersalah letak alamat lama, boleh tukar alamat penghantaran ke rumah baru tak?",
        zh="我刚下单可是填错了旧地址，可以帮我把收货地址改成新家的吗？",
        rojak="baru checkout tadi tapi letak 地址 lama, boleh tolong tukar hantar ke rumah baru saya tak?",
    ),
    Topic(
        name="cancel_order",
        en="please cancel my order, i bought it by mistake and don't want it anymore",
        ms="tolong batalkan pesanan saya, tertekan beli tadi, saya tak nak dah",
        zh="请帮我取消订单，我不小心买错了，不想要了",
        rojak="sis tolong 取消 yang saya beli tadi, tertekan salah, tak nak dah",
    ),
    Topic(
        name="warranty_claim",
        en="my rice cooker stopped working after four months, is it still under warranty and what do i do to get it fixed?",
        ms="periuk nasi saya rosak lepas empat bulan guna, masih dalam tempoh jaminan tak? macam mana nak mohon baiki?",
        zh="我的电饭锅用了四个月就坏了，还在保修期内吗？要怎么申请维修？",
        rojak="periuk nasi saya 坏了 baru 4 bulan, 保修 masih ada tak? camne nak hantar baiki?",
    ),
    Topic(
        name="app_crashes_on_login",
        en="the app closes by itself every time i try to log in, i've reinstalled it twice already",
        ms="aplikasi tertutup sendiri setiap kali saya nak masuk akaun, dah pasang semula dua kali",
        zh="每次登录，应用程式就自己闪退，我已经重装两次了",
        rojak="aplikasi ni asyik 闪退 bila nak 登录, dah buang pasang balik pun sama je",
    ),
    Topic(
        name="promo_code_not_working",
        en="the discount code from your newsletter isn't working at checkout, it says invalid",
        ms="kod baucar yang korang hantar tak boleh guna masa bayar, keluar tak sah",
        zh="你们电邮里的优惠码结账时用不了，一直显示无效",
        rojak="优惠码 yang korang bagi tu tak jalan la masa bayar, dia kata tak sah",
    ),
    Topic(
        name="opening_hours",
        en="what time does your store open on sundays, and are you open on public holidays?",
        ms="kedai korang buka pukul berapa hari ahad? cuti umum buka tak?",
        zh="请问你们门市星期天几点开？公共假期有营业吗？",
        rojak="kedai korang 星期天 buka pukul berapa? 公共假期 ada buka tak?",
    ),
    Topic(
        name="item_arrived_damaged",
        en="the vase arrived smashed and the box was crushed on one side, i want a replacement",
        ms="pasu yang sampai semalam dah pecah, kotak pun kemek sebelah. saya nak ganti yang baru",
        zh="昨天收到的花瓶碎了，箱子一边都压扁了，我要换一个新的",
        rojak="pasu sampai semalam dah 碎了, kotak pun kemek, boleh 换 baru tak?",
    ),
    Topic(
        name="account_locked",
        en="my account got locked after too many wrong tries and it keeps saying try again later, it's been a whole day",
        ms="akaun saya kena sekat sebab salah masuk banyak kali, asyik suruh cuba lagi nanti. dah sehari dah",
        zh="我的账号因为输错太多次被锁了，一直叫我稍后再试，已经一整天了",
        rojak="akaun kena 锁 sebab salah banyak kali, dah satu hari still tak boleh masuk",
    ),
    Topic(
        name="official_invoice",
        en="can you send me an official invoice for my purchase? my company needs it to reimburse me",
        ms="boleh hantar resit rasmi untuk pembelian saya? majikan perlukan untuk tuntutan",
        zh="可以寄一张正式发票给我吗？公司报销需要用",
        rojak="boleh bagi 发票 rasmi tak? 公司 nak untuk 报销",
    ),
    Topic(
        name="stop_marketing_messages",
        en="stop sending me marketing messages every day, how do i unsubscribe?",
        ms="tolong berhenti hantar mesej iklan hari-hari, macam mana nak henti langgan?",
        zh="不要每天发广告信息给我了，怎么取消订阅？",
        rojak="jangan la hantar 广告 tiap-tiap hari, macam mana nak berhenti terima?",
    ),
)

# Closed conversation windows as the sweep embeds them: one line per message.
WINDOWS: tuple[str, ...] = (
    "customer: hi, my order still hasn't arrived, it's been 8 days\n"
    "agent: sorry about that! could you share your order number?\n"
    "customer: it's 58213\n"
    "agent: thanks, the courier has it at the sorting centre, it should reach you tomorrow",
    "customer: i was charged twice for the same order\n"
    "agent: i can see two payments of RM89.90, one of them will be reversed within 3 working days\n"
    "customer: ok thanks, will i get an email?\n"
    "agent: yes, you'll get a confirmation once it's done",
    "customer: hai, saya nak tukar saiz baju yang saya beli semalam\n"
    "agent: boleh, saiz apa yang cik nak?\n"
    "customer: dari M ke L\n"
    "agent: baik, kami akan hantar yang baru dan kurier akan ambil yang lama",
    "customer: kenapa saya tak boleh log masuk? dah cuba banyak kali\n"
    "agent: akaun cik disekat sementara sebab terlalu banyak cubaan. saya dah buka semula\n"
    "customer: ok dah boleh masuk, terima kasih",
    "customer: 你好，我昨天买的耳机没有声音\n"
    "agent: 不好意思，请问是两边都没有声音吗？\n"
    "customer: 对，充满电了也一样\n"
    "agent: 那我们帮您安排换货，请把商品寄回，运费由我们负责",
    "customer: 请问可以开公司抬头的发票吗？\n"
    "agent: 可以的，请提供公司名称和税号\n"
    "customer: 好的，我现在发给你",
    "customer: bro, saya order dua tapi sampai satu je, 还有一个呢?\n"
    "agent: sorry ya, yang kedua dihantar berasingan, esok sampai\n"
    "customer: ok noted, thanks boss",
    "customer: sis, baju yang sampai 颜色不对 la, saya pilih biru tapi dapat hitam\n"
    "agent: alamak sorry, boleh hantar gambar? kami tukar yang betul\n"
    "customer: ok nanti saya snap 照片 hantar",
)

# Short searches as support agents type them.
QUERIES: tuple[str, ...] = (
    "refund not received",
    "parcel delayed tracking not updating",
    "reset password email not arriving",
    "duit bayaran balik belum masuk",
    "kad kredit ditolak",
    "tukar alamat penghantaran",
    "退款没收到",
    "保修期 维修",
    "优惠码无效",
    "akaun kena 锁",
    "barang sampai 碎了",
    "opening hours public holiday",
)


@dataclass(frozen=True)
class RerankProbe:
    """A query and candidate documents: the first answers it, the others are on a
    neighbouring subject and do not."""

    query: str
    documents: tuple[str, ...]


RERANK_PROBES: tuple[RerankProbe, ...] = (
    RerankProbe(
        query="how long does a refund take to reach my card?",
        documents=(
            "Refunds go back to the card you paid with within 5 to 7 working days after the returned item reaches our warehouse.",
            "To return an item, print the return label from My Orders and drop the parcel at any post office.",
            "退货时请保留原包装和发票，否则无法办理退货。",
            "Kod baucar tidak boleh digabungkan dengan promosi lain.",
        ),
    ),
    RerankProbe(
        query="bungkusan saya lewat sampai",
        documents=(
            "Jika bungkusan lewat lebih 5 hari bekerja, semak nombor penjejakan di halaman pesanan dan hubungi kami untuk kami buat tuntutan dengan kurier.",
            "Penghantaran percuma untuk pesanan melebihi RM150 di Semenanjung Malaysia.",
            "Alamat penghantaran hanya boleh ditukar sebelum pesanan dibungkus.",
            "You can change your delivery address from My Orders until the order is packed.",
            "我们的门市星期一至星期六营业，早上十点到晚上十点。",
        ),
    ),
    RerankProbe(
        query="忘记密码怎么办",
        documents=(
            "在登录页面点击“忘记密码”，输入注册邮箱，我们会发送重设密码的链接，链接三十分钟内有效。",
            "账号连续输错五次密码会被锁定三十分钟。",
            "如需修改注册手机号码，请到账户设置页面。",
            "The app supports Android 9 and iOS 15 or later.",
        ),
    ),
    RerankProbe(
        query="promo code says invalid at checkout",
        documents=(
            "A promo code is invalid when it has expired, when the cart is below its minimum spend, or when it was already used on this account; check its terms in My Vouchers.",
            "Vouchers are sent to newsletter subscribers every first Monday of the month.",
            "支付失败时，请确认银行卡余额并联系发卡银行。",
            "Harga barang sudah termasuk cukai jualan dan perkhidmatan.",
        ),
    ),
    RerankProbe(
        query="barang sampai pecah, nak ganti",
        documents=(
            "Barang yang sampai rosak atau pecah boleh ditukar ganti dalam 7 hari: hantar gambar barang dan kotak melalui chat, dan kami hantar yang baru tanpa caj.",
            "Waranti pengeluar meliputi kerosakan mesin selama 12 bulan, tidak termasuk kerosakan fizikal.",
            "Orders can be cancelled free of charge until they are shipped.",
            "商品签收后七天内可申请无理由退货。",
        ),
    ),
    RerankProbe(
        query="my account is locked, what do i do?",
        documents=(
            "After five wrong passwords an account is locked for 30 minutes; it unlocks by itself, or reset your password to get in at once.",
            "To close your account permanently, write to us from the email address you registered with.",
            "Aplikasi kami boleh dimuat turun dari App Store dan Google Play.",
            "我们不会通过电话向您索取密码或验证码。",
            "Marketing messages can be turned off under Settings, Notifications.",
        ),
    ),
    RerankProbe(
        query="保修怎么申请",
        documents=(
            "Untuk tuntutan waranti, isi borang di laman web kami dengan nombor siri dan resit pembelian; juruteknik akan menghubungi anda dalam 3 hari bekerja.",
            "如果商品在运送途中损坏，请在签收后四十八小时内联系客服。",
            "We ship to Singapore and Brunei; delivery takes 5 to 10 working days.",
            "电子发票会在付款成功后发送到您的邮箱。",
        ),
    ),
)


def guard_texts() -> list[str]:
    """Every topic's message in every language, then WINDOWS, then QUERIES."""
    texts = [topic.text(language) for topic in TOPICS for language in LANGUAGES]
    return [*texts, *WINDOWS, *QUERIES]
