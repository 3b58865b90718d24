"""Writes bench/data/chat_quality.json, the labelled set `python -m bench.quality` measures:
support and engineering chat of a Malaysian online shop in English (en), Malay (ms),
Chinese (zh) and code-switched rojak, and queries written as an agent or engineer would
type them into search, each labelled with the messages that answer it.

    python -m bench.data.make_chat_quality

Deterministic: the conversations and queries are written out below by hand; only the
timestamps come from a seeded generator. Conversations sit in channels (some channels
hold several sessions hours apart), with messages 20 s to 4 min apart, so the real sweep
cuts each conversation into its own window (30-minute gap, at most 15 messages).

Labels: a query's `relevant` lists message ids ("c01.3" = message 3 of conversation c01,
1-based); a search hit counts when it contains any of them. Relevant messages of one
conversation form one answer, so a query with relevant messages in two conversations has
two answers (nDCG@10's ideal). Subsets:
- cross_lingual: the query's language differs from every answering conversation's
  (rojak counts as a language of its own);
- identifier: the query hinges on an exact identifier: order number, error code, ticket,
  version, person's name;
- typo: the query has a misspelling a user would make;
- traditional: Chinese in Traditional script (the set's Chinese conversations are in
  Simplified), as users in Taiwan and Hong Kong type it.
Conversations no query points at are distractors on neighbouring topics (another order's
late delivery, another 5xx error, another app crash)."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

OUT = Path(__file__).resolve().parent / "chat_quality.json"
START = datetime(2026, 10, 1, 1, 0, tzinfo=UTC)

# (id, provider, channel, language, messages). Every conversation is one session.
CONVERSATIONS: list[tuple[str, str, str, str, list[str]]] = [
    (
        "c01",
        "whatsapp",
        "cust-0101",
        "en",
        [
            "Hi, my order A10293 hasn't arrived, it's been 9 days already",
            "Sorry about that! Let me check the tracking for you",
            "J&T shows it stuck at the Shah Alam hub since Tuesday",
            "That's ridiculous, I paid for express shipping",
            "I have escalated it to J&T, they promise delivery within 2 days",
            "ok please update me tomorrow",
        ],
    ),
    (
        "c02",
        "whatsapp",
        "cust-0102",
        "en",
        [
            "Order A10871 still not delivered, tracking says out for delivery since morning",
            "Hi! Ninja Van riders usually finish by 9pm, please give them until tonight",
            "ok noted",
            "Got it just now, thanks",
        ],
    ),
    (
        "c03",
        "whatsapp",
        "cust-0103",
        "ms",
        [
            "Salam, saya nak tanya pasal refund untuk pesanan K55120",
            "Dah 10 hari tapi duit RM249 belum masuk akaun Maybank saya",
            "Maaf atas kesulitan. Refund telah diluluskan pada 3 Oktober",
            "Bank biasanya ambil 3 hingga 5 hari bekerja untuk kreditkan",
            "Saya akan semak semula dengan pihak kewangan dan maklumkan esok",
            "Ok terima kasih",
        ],
    ),
    (
        "c04",
        "wechat",
        "wx-7781",
        "zh",
        [
            "你好，我的信用卡被扣了两次钱",
            "非常抱歉，请提供您的订单号和扣款截图",
            "订单号是 B7781，两笔都是 RM89.90",
            "已经为您退回重复扣款，三到五个工作日到账",
            "好的，谢谢",
        ],
    ),
    (
        "c05",
        "whatsapp",
        "cust-0105",
        "rojak",
        [
            "Boss, air fryer sampai dah rosak lah, the glass door cracked 了",
            "Alamak sorry! Can send photo of the item and the box?",
            "ok sent already, 怎么办?",
            "We send a replacement unit tomorrow, no need to return the broken one",
            "Wah ok thanks boss",
        ],
    ),
    (
        "c06",
        "whatsapp",
        "cust-0106",
        "ms",
        [
            "Saya nak tukar alamat penghantaran untuk pesanan M20455",
            "Boleh, alamat baru di mana?",
            "No 8, Jalan Teknokrat 3, Cyberjaya",
            "Alamat sudah dikemaskini, rider akan telefon sebelum hantar",
        ],
    ),
    (
        "c07",
        "wechat",
        "wx-1507",
        "zh",
        [
            "送货员说找不到我家的地址",
            "请确认您的门牌号和楼层",
            "B座 15楼 3号，楼下有保安亭",
            "已经更新地址备注，送货员会再送一次",
        ],
    ),
    (
        "c08",
        "telegram",
        "tg-2208",
        "en",
        [
            "How do I reset my password? The reset email never comes",
            "Please check your spam or promotions folder, or I can resend it",
            "Found it in spam, thanks!",
            "Great, the link is valid for 30 minutes",
        ],
    ),
    (
        "c09",
        "whatsapp",
        "cust-0109",
        "ms",
        [
            "Tak boleh login, OTP tak sampai ke telefon saya",
            "Nombor telefon dalam akaun masih nombor lama ke?",
            "Ya, saya dah tukar nombor bulan lepas",
            "Sila kemas kini nombor di Profil > Keselamatan selepas log masuk dengan emel",
        ],
    ),
    (
        "c10",
        "wechat",
        "wx-3310",
        "zh",
        [
            "优惠券 RAYA20 怎么用不了？",
            "这个优惠券需要满 RM150 才可以使用",
            "我的购物车只有 RM120",
            "再加一件就可以用了，优惠券到月底有效",
        ],
    ),
    (
        "c11",
        "telegram",
        "tg-1111",
        "rojak",
        [
            "11.11 sale got free shipping or not if I buy two?",
            "Ya, free shipping for orders above RM60 in Semenanjung",
            "Sabah pun boleh ke? 我在亚庇",
            "For Sabah and Sarawak free shipping min spend is RM100",
        ],
    ),
    (
        "c12",
        "whatsapp",
        "cust-0112",
        "en",
        [
            "My rice cooker stopped heating after 5 months, is it still under warranty?",
            "Yes, all kitchen appliances have 12 months warranty",
            "Please bring the unit and the receipt to our Penang service centre at Bayan Lepas",
            "Can you arrange pickup instead? I work weekdays",
            "Sure, GDex will collect it on Saturday",
        ],
    ),
    (
        "c13",
        "whatsapp",
        "cust-0113",
        "ms",
        [
            "Blender saya rosak selepas 3 bulan, motor berbunyi kuat",
            "Ada waranti 1 tahun, boleh hantar video bunyi tu?",
            "Dah hantar video",
            "Terima kasih, kami akan hantar blender baru minggu ni",
        ],
    ),
    (
        "c14",
        "wechat",
        "wx-3018",
        "zh",
        [
            "订单 D33018 可以取消吗？我买错尺码了",
            "可以，订单还没发货，已为您取消",
            "款项会在三个工作日内退回原支付方式",
        ],
    ),
    (
        "c15",
        "telegram",
        "tg-1515",
        "en",
        [
            "Do you accept cash on delivery in Kuching?",
            "Yes, COD is available in Kuching for orders below RM500",
            "Is there any extra charge for COD?",
            "A RM3 handling fee is added at checkout",
        ],
    ),
    (
        "c16",
        "whatsapp",
        "cust-0116",
        "rojak",
        [
            "Nak beli laptop ni, boleh bayar ansuran tak? Installment 0% ada?",
            "Ya boleh, 0% installment 6 bulan with Maybank, CIMB and Public Bank credit cards",
            "Debit card tak boleh ke?",
            "Sorry, installment only for credit cards",
        ],
    ),
    (
        "c17",
        "whatsapp",
        "cust-0117",
        "en",
        [
            "The running shoes are too small, can I exchange size 42 for 43?",
            "Sure, please keep the shoes unworn with the tags on",
            "We will send a Pos Laju return label to your email",
            "The size 43 pair ships once we receive the return",
        ],
    ),
    (
        "c18",
        "wechat",
        "wx-1818",
        "zh",
        [
            "退款可以退到 Touch 'n Go 电子钱包吗？不要退到信用卡",
            "可以的，退款到 Touch 'n Go 审核后即时到账",
            "已经为您批准退款 RM56",
            "收到了，谢谢",
        ],
    ),
    (
        "c19",
        "telegram",
        "tg-1919",
        "en",
        [
            "Hi, this is Tan Wei Ming from Syarikat Tan Trading",
            "I need a proper tax invoice with our SST number for order A22817",
            "Sure Mr Tan, please send the company name and SST registration number",
            "SST W10-1808-32000123, company Syarikat Tan Trading Sdn Bhd",
            "The e-invoice will be emailed within 1 working day",
        ],
    ),
    (
        "c20",
        "whatsapp",
        "cust-0120",
        "ms",
        [
            "Pemandu Pos Laju kata tiada orang di rumah, padahal saya ada",
            "Maaf, kami akan minta penghantaran semula esok",
            "Boleh hantar lepas pukul 6 petang?",
            "Nota sudah ditambah: hantar selepas 6 petang",
        ],
    ),
    (
        "c21",
        "whatsapp",
        "cust-0121",
        "rojak",
        [
            "ShopeePay dah deduct RM75 tapi order still shows unpaid",
            "Reference number TXN-88213904, screenshot attached",
            "Sorry ya, payment gateway delay. We have matched the payment manually",
            "Order now confirmed, will ship tomorrow",
        ],
    ),
    (
        "c22",
        "telegram",
        "tg-2222",
        "en",
        [
            "Payment keeps failing at checkout, my card is declined every time",
            "Sorry, our payment gateway had a short outage this morning",
            "Please try again now, it should go through",
            "Worked, thanks",
        ],
    ),
    (
        "c23",
        "wechat",
        "wx-2323",
        "zh",
        [
            "蓝牙耳机什么时候补货？一直显示缺货",
            "下一批预计 10 月 20 日到货",
            "可以先预订吗？",
            "可以，预订后到货第一时间发货",
        ],
    ),
    (
        "c24",
        "whatsapp",
        "cust-0124",
        "ms",
        [
            "Baju kurung saiz M warna biru ada stok lagi?",
            "Saiz M biru dah habis, tinggal saiz L dan XL",
            "Bila stok baru masuk?",
            "Minggu depan, kami akan maklumkan",
        ],
    ),
    # Engineering chat.
    (
        "c25",
        "telegram",
        "eng-deploy",
        "en",
        [
            "Deploy of checkout-web is failing, health checks get ERR_CONN_RESET from payments-api",
            "Started right after payments-api v2.15.0 went out",
            "Rolling payments-api back to v2.14.3",
            "Rollback done, checkout is healthy again",
            "I'll open a postmortem, looks like the new keepalive setting",
        ],
    ),
    (
        "c26",
        "telegram",
        "eng-backend",
        "en",
        [
            "order-service logs are full of 'deadlock detected' SQLSTATE 40P01",
            "It happens when two workers update the same order and inventory rows in different order",
            "Fix: always lock inventory rows before the order row, PR #4790",
            "Merged, no deadlocks in the last hour",
        ],
    ),
    (
        "c27",
        "telegram",
        "eng-infra",
        "rojak",
        [
            "Staging down lah, semua request dapat 502 Bad Gateway dari nginx",
            "Pod api-staging kena OOMKilled, memory limit 512Mi je",
            "Naikkan limit ke 1Gi dulu, nanti kita profile",
            "Dah naik, staging ok balik",
        ],
    ),
    (
        "c28",
        "wechat",
        "eng-cn",
        "zh",
        [
            "Redis 连接超时，订单服务大量报错",
            "连接池最大只有 50，高峰期不够用",
            "已经把连接池调到 200，工单 OPS-1423",
            "观察了半小时，超时没有再出现",
        ],
    ),
    (
        "c29",
        "telegram",
        "eng-infra",
        "ms",
        [
            "Sijil SSL untuk api.kedaiku.my tamat tempoh malam ni",
            "Kenapa certbot tak auto renew?",
            "Cron job certbot terhenti selepas server dipindahkan",
            "Saya dah renew manual dan pasang semula cron",
        ],
    ),
    (
        "c30",
        "telegram",
        "eng-backend",
        "en",
        [
            "test_checkout_total keeps failing on CI but passes locally",
            "It only fails after 4pm, the test assumes the local date equals the UTC date",
            "Set TZ=UTC in the CI job and use a fixed clock in the test, PR #4812",
            "Green now",
        ],
    ),
    (
        "c31",
        "whatsapp",
        "eng-payments",
        "rojak",
        [
            "Aisyah, Billplz webhook semua reject sebab signature mismatch",
            "Yes I saw, the X-Signature check uses the old API key",
            "Key dah rotate semalam tapi config prod tak update",
            "Updated the secret, webhooks pass now. Aisyah will replay the failed ones",
        ],
    ),
    (
        "c32",
        "telegram",
        "eng-infra",
        "en",
        [
            "Report export times out with 504 Gateway Timeout for big date ranges",
            "The query scans the whole orders table, no index on created_at",
            "Moving the export to a background job that emails a CSV",
        ],
    ),
    (
        "c33",
        "wechat",
        "eng-cn",
        "zh",
        [
            "Kafka 消费者积压很严重，lag 已经超过 20 万",
            "order-events 只有 3 个分区，消费者加了也没用",
            "把分区增加到 12，消费者扩到 12 个",
            "lag 在下降了",
        ],
    ),
    (
        "c34",
        "telegram",
        "eng-oncall",
        "en",
        [
            "On-call handover from Farid: INC-2291, disk full on db-replica-2",
            "WAL files piled up because the replication slot of the old analytics job was never dropped",
            "Dropped the slot and cleaned up, disk back to 40%",
            "Added an alert on replication slot lag",
        ],
    ),
    (
        "c35",
        "telegram",
        "eng-backend",
        "ms",
        [
            "Migrasi 0042_add_orders_index gagal di production, lock timeout",
            "Jadual orders terlalu sibuk waktu siang",
            "Kita jalankan semula malam ni pukul 2 pagi dengan CREATE INDEX CONCURRENTLY",
            "Migrasi berjaya malam tadi",
        ],
    ),
    (
        "c36",
        "whatsapp",
        "eng-mobile",
        "rojak",
        [
            "App crash on Android 14 after update 3.8.1, banyak complaint dari customer",
            "Crashlytics tunjuk NullPointerException dalam CartFragment",
            "Cart kosong bila app restore dari background, adapter null",
            "Hotfix 3.8.2 dah submit ke Play Store",
        ],
    ),
    (
        "c37",
        "whatsapp",
        "eng-mobile",
        "en",
        [
            "iOS users say push notifications stopped after 3.8.1",
            "The APNs certificate expired yesterday",
            "Renewed the certificate, pushes are going out again",
        ],
    ),
    (
        "c38",
        "wechat",
        "eng-cn",
        "zh",
        [
            "日志里大量出现 ERR_TOKEN_EXPIRED，用户被强制登出",
            "access token 只有 15 分钟，前端没有用 refresh token 刷新",
            "前端修复已经发布，现在会自动刷新",
        ],
    ),
    (
        "c39",
        "telegram",
        "eng-integrations",
        "en",
        [
            "Shopee partner API returns 429 Too Many Requests during the stock sync",
            "We sync all 8,000 SKUs every 5 minutes, way over their limit",
            "Switching to only changed SKUs with exponential backoff on 429",
            "Sync runs clean now",
        ],
    ),
    # Distractors on neighbouring topics and everyday noise.
    (
        "c40",
        "telegram",
        "eng-general",
        "ms",
        [
            "Peringatan: mesyuarat sprint planning hari Khamis pukul 10 pagi",
            "Boleh anjak ke pukul 11? Saya ada demo dengan pelanggan",
            "Ok, pukul 11 pagi Khamis",
        ],
    ),
    (
        "c41",
        "wechat",
        "wx-4141",
        "zh",
        [
            "寄到东马的运费是多少？",
            "沙巴和砂拉越运费 RM12，满 RM100 免运费",
            "好的明白了",
        ],
    ),
    (
        "c42",
        "whatsapp",
        "cust-0142",
        "rojak",
        [
            "Refund untuk order K55871 dah masuk ke belum? Check for me pls",
            "Dah credit semalam, RM32 ke akaun CIMB you",
            "Ok dah nampak, thanks",
        ],
    ),
    (
        "c43",
        "whatsapp",
        "cust-0101",
        "en",
        [
            "Hi again, can I add a second item to my next order to save shipping?",
            "Sure, orders placed within the same day can be combined",
            "ok great",
        ],
    ),
    (
        "c44",
        "telegram",
        "eng-deploy",
        "en",
        [
            "Deploy of search-api v1.9.0 is stuck on the database migration step",
            "Another migration held the lock, I killed the stale session",
            "Deploy finished",
        ],
    ),
    (
        "c45",
        "whatsapp",
        "cust-0145",
        "ms",
        [
            "Barang saya dah sampai tapi warna salah, saya order hitam dapat putih",
            "Maaf, sila pulangkan dan kami hantar warna hitam",
            "Baik",
        ],
    ),
    (
        "c46",
        "wechat",
        "wx-4646",
        "zh",
        [
            "电饭锅的内胆有划痕，可以换吗？",
            "请拍照给我们，我们会尽快为您换货",
            "照片已发送",
        ],
    ),
]

# (query, language, relevant message ids, subsets) as users type them.
Q = tuple[str, str, list[str], list[str]]
QUERIES: list[Q] = [
    # c01 late delivery A10293 (J&T, Shah Alam)
    ("order A10293 not arrived", "en", ["c01.1", "c01.3", "c01.5"], ["identifier"]),
    ("parcel stuck at shah alam hub", "en", ["c01.3"], []),
    ("pesanan A10293 lambat sampai", "ms", ["c01.1", "c01.5"], ["identifier", "cross_lingual"]),
    ("快递卡在转运中心", "zh", ["c01.3"], ["cross_lingual"]),
    ("customer paid express but still waiting 9 days", "en", ["c01.1", "c01.4"], []),
    ("J&T escalate delivery", "en", ["c01.5"], []),
    ("parcel tak sampai lagi J&T stuck", "rojak", ["c01.3", "c01.5"], ["cross_lingual"]),
    ("A10239 late", "en", ["c01.1"], ["identifier", "typo"]),
    # c02 A10871 Ninja Van out for delivery
    ("A10871 out for delivery", "en", ["c02.1"], ["identifier"]),
    ("ninja van rider out for delivery since morning", "en", ["c02.1", "c02.2"], []),
    ("barang keluar untuk penghantaran tapi belum sampai", "ms", ["c02.1", "c02.2"], ["cross_lingual"]),
    # c03 refund K55120 RM249 Maybank
    ("refund K55120", "en", ["c03.1", "c03.3"], ["identifier", "cross_lingual"]),
    ("refund belum masuk akaun maybank", "ms", ["c03.2", "c03.4"], []),
    ("refund not in bank account after 10 days", "en", ["c03.2", "c03.4"], ["cross_lingual"]),
    ("退款还没到银行账户", "zh", ["c03.2", "c03.4"], ["cross_lingual"]),
    ("refnd RM249 maybank", "en", ["c03.2"], ["identifier", "typo", "cross_lingual"]),
    ("duit refund lambat masuk", "ms", ["c03.2", "c03.4"], []),
    # c04 double charge B7781
    ("charged twice on credit card", "en", ["c04.1", "c04.4"], ["cross_lingual"]),
    ("信用卡重复扣款", "zh", ["c04.1", "c04.4"], []),
    ("B7781", "en", ["c04.3"], ["identifier", "cross_lingual"]),
    ("kad kredit kena caj dua kali", "ms", ["c04.1", "c04.4"], ["cross_lingual"]),
    ("duplicate charge RM89.90 reversed", "en", ["c04.3", "c04.4"], ["identifier", "cross_lingual"]),
    ("charge twice credit crad", "en", ["c04.1"], ["typo", "cross_lingual"]),
    # c05 air fryer broken, replacement
    ("air fryer arrived broken", "en", ["c05.1", "c05.4"], ["cross_lingual"]),
    ("barang rosak hantar ganti", "ms", ["c05.1", "c05.4"], ["cross_lingual"]),
    ("收到的空气炸锅坏了", "zh", ["c05.1"], ["cross_lingual"]),
    ("replacement no need return broken item", "en", ["c05.4"], ["cross_lingual"]),
    ("air fryer glass door crack", "rojak", ["c05.1"], []),
    ("air fyrer damaged replacment", "en", ["c05.1", "c05.4"], ["typo", "cross_lingual"]),
    # c06 change address M20455 Cyberjaya
    ("change delivery address", "en", ["c06.1", "c06.4"], ["cross_lingual"]),
    ("tukar alamat penghantaran", "ms", ["c06.1"], []),
    ("M20455 address", "en", ["c06.1", "c06.3"], ["identifier", "cross_lingual"]),
    ("修改送货地址", "zh", ["c06.1", "c06.4"], ["cross_lingual"]),
    ("new address Jalan Teknokrat Cyberjaya", "en", ["c06.3"], ["identifier", "cross_lingual"]),
    ("tukar almat pesanan", "ms", ["c06.1"], ["typo"]),
    # c07 courier cannot find address (zh)
    ("courier could not find my house", "en", ["c07.1"], ["cross_lingual"]),
    ("送货员找不到地址", "zh", ["c07.1", "c07.4"], []),
    ("rider tak jumpa rumah", "ms", ["c07.1"], ["cross_lingual"]),
    ("which unit and floor for redelivery", "en", ["c07.2", "c07.3"], ["cross_lingual"]),
    ("B座 15楼", "zh", ["c07.3"], ["identifier"]),
    # c08 password reset email in spam
    ("password reset email not received", "en", ["c08.1", "c08.2"], []),
    ("emel reset kata laluan tak sampai", "ms", ["c08.1", "c08.2"], ["cross_lingual"]),
    ("重置密码邮件收不到", "zh", ["c08.1", "c08.2"], ["cross_lingual"]),
    ("pasword reset emial spam", "en", ["c08.1", "c08.3"], ["typo"]),
    ("how long is the reset link valid", "en", ["c08.4"], []),
    # c09 OTP not arriving, changed phone number
    ("OTP not received cannot login", "en", ["c09.1"], ["cross_lingual"]),
    ("OTP tak sampai", "ms", ["c09.1"], []),
    ("收不到验证码 换了手机号", "zh", ["c09.1", "c09.3"], ["cross_lingual"]),
    ("update phone number in profile security", "en", ["c09.4"], ["cross_lingual"]),
    ("tak boleh log masuk nombor lama", "ms", ["c09.1", "c09.2"], []),
    # c10 voucher RAYA20 min spend RM150
    ("RAYA20 voucher not working", "en", ["c10.1", "c10.2"], ["identifier", "cross_lingual"]),
    ("优惠券用不了", "zh", ["c10.1"], []),
    ("voucher minimum spend RM150", "en", ["c10.2"], ["identifier", "cross_lingual"]),
    ("baucar tak boleh guna", "ms", ["c10.1"], ["cross_lingual"]),
    ("vocher code cannot use", "en", ["c10.1"], ["typo", "cross_lingual"]),
    # c11 11.11 free shipping, Sabah
    ("free shipping 11.11 buy two", "en", ["c11.1", "c11.2"], ["cross_lingual"]),
    ("penghantaran percuma Sabah minimum", "ms", ["c11.3", "c11.4"], ["cross_lingual"]),
    ("双十一免运费吗", "zh", ["c11.1", "c11.2"], ["cross_lingual"]),
    (
        "free shipping Sabah Sarawak min spend RM100",
        "en",
        ["c11.4", "c41.2"],
        ["identifier", "cross_lingual"],
    ),
    ("11.11 sale free shiping", "en", ["c11.1"], ["typo", "cross_lingual"]),
    # c12 rice cooker warranty, Penang service centre, GDex pickup
    ("rice cooker warranty claim", "en", ["c12.1", "c12.2"], []),
    ("periuk nasi rosak ada waranti", "ms", ["c12.1", "c12.2"], ["cross_lingual"]),
    ("电饭锅保修多久", "zh", ["c12.1", "c12.2"], ["cross_lingual"]),
    ("penang service centre bayan lepas", "en", ["c12.3"], []),
    ("GDex pickup for warranty repair", "en", ["c12.5"], ["identifier"]),
    ("rice cooker warrenty not heating", "en", ["c12.1"], ["typo"]),
    # c13 blender warranty (ms)
    ("blender motor noisy after 3 months", "en", ["c13.1"], ["cross_lingual"]),
    ("blender rosak waranti", "ms", ["c13.1", "c13.2"], []),
    ("搅拌机坏了 保修", "zh", ["c13.1", "c13.2"], ["cross_lingual"]),
    ("send video of blender noise", "en", ["c13.2", "c13.3"], ["cross_lingual"]),
    # c14 cancel D33018 wrong size (zh)
    ("cancel order D33018", "en", ["c14.1", "c14.2"], ["identifier", "cross_lingual"]),
    ("取消订单 尺码买错", "zh", ["c14.1", "c14.2"], []),
    ("batal pesanan saiz salah", "ms", ["c14.1", "c14.2"], ["cross_lingual"]),
    ("wrong size order cancelled before shipping", "en", ["c14.1", "c14.2"], ["cross_lingual"]),
    ("D33108 cancel", "en", ["c14.1"], ["identifier", "typo", "cross_lingual"]),
    # c15 COD Kuching
    ("cash on delivery Kuching", "en", ["c15.1", "c15.2"], ["identifier"]),
    ("COD handling fee", "en", ["c15.3", "c15.4"], []),
    ("bayar masa barang sampai Kuching", "ms", ["c15.1", "c15.2"], ["cross_lingual"]),
    ("货到付款 古晋", "zh", ["c15.1", "c15.2"], ["cross_lingual"]),
    ("cash on delivry charge", "en", ["c15.3", "c15.4"], ["typo"]),
    # c16 0% installment laptop
    ("0% installment credit card laptop", "en", ["c16.1", "c16.2"], ["cross_lingual"]),
    ("boleh bayar ansuran", "ms", ["c16.1"], ["cross_lingual"]),
    ("分期付款 信用卡", "zh", ["c16.1", "c16.2"], ["cross_lingual"]),
    ("installment with debit card?", "en", ["c16.3", "c16.4"], ["cross_lingual"]),
    ("instalment 6 month maybank cimb", "en", ["c16.2"], ["typo", "cross_lingual"]),
    # c17 exchange shoes 42 -> 43
    ("exchange shoes size 42 to 43", "en", ["c17.1"], ["identifier"]),
    ("tukar saiz kasut", "ms", ["c17.1"], ["cross_lingual"]),
    ("鞋子太小 换尺码", "zh", ["c17.1"], ["cross_lingual"]),
    ("pos laju return label email", "en", ["c17.3"], []),
    ("running shoe exhange smaller size", "en", ["c17.1"], ["typo"]),
    # c18 refund to Touch 'n Go (zh)
    ("refund to touch n go ewallet", "en", ["c18.1", "c18.2"], ["cross_lingual"]),
    ("退款到电子钱包", "zh", ["c18.1", "c18.2"], []),
    ("refund masuk e-wallet bukan kad kredit", "ms", ["c18.1", "c18.2"], ["cross_lingual"]),
    ("TNG refund RM56 approved", "rojak", ["c18.3"], ["identifier", "cross_lingual"]),
    # c19 Tan Wei Ming, SST invoice A22817
    ("Tan Wei Ming invoice", "en", ["c19.1", "c19.2"], ["identifier"]),
    ("tax invoice with SST number", "en", ["c19.2", "c19.5"], []),
    ("A22817 e-invoice", "en", ["c19.2", "c19.5"], ["identifier"]),
    ("Syarikat Tan Trading", "ms", ["c19.1", "c19.4"], ["identifier", "cross_lingual"]),
    ("公司发票 税号", "zh", ["c19.2", "c19.3"], ["cross_lingual"]),
    ("invois cukai SST syarikat", "ms", ["c19.2", "c19.3"], ["cross_lingual"]),
    ("Mr Tan wei ming SST regstration", "en", ["c19.3", "c19.4"], ["identifier", "typo"]),
    # c20 Pos Laju said nobody home
    ("courier said no one at home but I was there", "en", ["c20.1"], ["cross_lingual"]),
    ("pos laju tiada orang di rumah", "ms", ["c20.1"], ["identifier"]),
    ("redeliver after 6pm", "en", ["c20.3", "c20.4"], ["cross_lingual"]),
    ("快递员说家里没人", "zh", ["c20.1"], ["cross_lingual"]),
    # c21 ShopeePay deducted, unpaid, TXN-88213904
    ("TXN-88213904", "en", ["c21.2"], ["identifier", "cross_lingual"]),
    ("shopeepay deducted but order unpaid", "en", ["c21.1", "c21.3"], ["cross_lingual"]),
    ("钱扣了但订单显示未付款", "zh", ["c21.1", "c21.3"], ["cross_lingual"]),
    ("duit dah tolak tapi order belum bayar", "ms", ["c21.1"], ["cross_lingual"]),
    ("shopepay paid status unpaid", "rojak", ["c21.1"], ["typo"]),
    # c22 card declined, gateway outage
    ("card declined at checkout", "en", ["c22.1", "c22.2"], []),
    ("kad ditolak masa checkout", "ms", ["c22.1", "c22.2"], ["cross_lingual"]),
    ("付款一直失败 银行卡被拒", "zh", ["c22.1", "c22.2"], ["cross_lingual"]),
    ("payment gateway outage this morning", "en", ["c22.2"], []),
    # c23 bluetooth earphones restock (zh)
    ("when will bluetooth earphones be restocked", "en", ["c23.1", "c23.2"], ["cross_lingual"]),
    ("蓝牙耳机缺货", "zh", ["c23.1"], []),
    ("earphone bluetooth bila stok masuk", "rojak", ["c23.1", "c23.2"], ["cross_lingual"]),
    ("preorder out of stock earphones", "en", ["c23.3", "c23.4"], ["cross_lingual"]),
    # c24 baju kurung size M blue
    ("baju kurung saiz M biru", "ms", ["c24.1", "c24.2"], []),
    ("blue baju kurung size M out of stock", "en", ["c24.1", "c24.2"], ["cross_lingual"]),
    ("马来装 M码 蓝色 有货吗", "zh", ["c24.1", "c24.2"], ["cross_lingual"]),
    # c25 ERR_CONN_RESET, rollback payments-api v2.14.3
    ("ERR_CONN_RESET payments-api", "en", ["c25.1"], ["identifier"]),
    ("checkout deploy failing health check", "en", ["c25.1"], []),
    ("rollback payments-api v2.14.3", "en", ["c25.3", "c25.4"], ["identifier"]),
    ("deploy gagal, rollback payments", "ms", ["c25.1", "c25.3"], ["cross_lingual"]),
    ("部署失败 回滚", "zh", ["c25.1", "c25.3"], ["cross_lingual"]),
    ("ERR_CON_RESET", "en", ["c25.1"], ["identifier", "typo"]),
    # c26 deadlock 40P01, PR #4790
    ("deadlock detected order-service", "en", ["c26.1"], ["identifier"]),
    ("40P01", "en", ["c26.1"], ["identifier"]),
    ("lock ordering inventory before order row", "en", ["c26.3"], []),
    ("数据库死锁", "zh", ["c26.1", "c26.2"], ["cross_lingual"]),
    ("deadlok postgres fix", "en", ["c26.1", "c26.3"], ["typo"]),
    ("PR 4790", "en", ["c26.3"], ["identifier"]),
    # c27 staging 502, OOMKilled
    ("staging 502 bad gateway", "en", ["c27.1"], ["identifier", "cross_lingual"]),
    ("pod OOMKilled memory limit", "en", ["c27.2", "c27.3"], ["identifier", "cross_lingual"]),
    ("staging down kena OOM", "rojak", ["c27.1", "c27.2"], []),
    ("内存不足 pod 被杀", "zh", ["c27.2"], ["cross_lingual"]),
    ("raise memory limit to 1Gi", "en", ["c27.3"], ["identifier", "cross_lingual"]),
    # c28 Redis timeout, pool 200, OPS-1423
    ("redis connection timeout", "en", ["c28.1"], ["cross_lingual"]),
    ("OPS-1423", "en", ["c28.3"], ["identifier", "cross_lingual"]),
    ("Redis 连接超时", "zh", ["c28.1"], []),
    ("connection pool too small at peak", "en", ["c28.2"], ["cross_lingual"]),
    ("sambungan redis tamat masa", "ms", ["c28.1"], ["cross_lingual"]),
    # c29 SSL cert expiry, certbot cron
    ("ssl certificate expiring api.kedaiku.my", "en", ["c29.1"], ["identifier", "cross_lingual"]),
    ("sijil SSL tamat tempoh", "ms", ["c29.1"], []),
    ("certbot not auto renewing", "en", ["c29.2", "c29.3"], ["cross_lingual"]),
    ("SSL 证书过期", "zh", ["c29.1"], ["cross_lingual"]),
    ("certbot cron stoped after migration", "en", ["c29.3"], ["typo", "cross_lingual"]),
    # c30 flaky test timezone, PR #4812
    ("flaky test_checkout_total CI", "en", ["c30.1"], ["identifier"]),
    ("test fails after 4pm timezone", "en", ["c30.2"], []),
    ("test gagal di CI tapi lulus local", "ms", ["c30.1"], ["cross_lingual"]),
    ("测试只在 CI 上失败 时区", "zh", ["c30.1", "c30.2"], ["cross_lingual"]),
    ("TZ=UTC fixed clock", "en", ["c30.3"], ["identifier"]),
    # c31 Billplz webhook signature, Aisyah
    ("Billplz webhook signature mismatch", "en", ["c31.1", "c31.2"], ["identifier", "cross_lingual"]),
    ("Aisyah replay failed webhooks", "en", ["c31.4"], ["identifier", "cross_lingual"]),
    ("webhook ditolak sebab signature", "ms", ["c31.1"], ["cross_lingual"]),
    ("X-Signature old api key", "en", ["c31.2"], ["identifier", "cross_lingual"]),
    ("webhook 签名校验失败", "zh", ["c31.1", "c31.2"], ["cross_lingual"]),
    ("billpz webook rejected", "en", ["c31.1"], ["typo", "cross_lingual"]),
    # c32 504 export
    ("report export 504 gateway timeout", "en", ["c32.1"], ["identifier"]),
    ("export CSV background job", "en", ["c32.3"], []),
    ("导出报表超时", "zh", ["c32.1"], ["cross_lingual"]),
    # c33 Kafka lag, partitions 12
    ("kafka consumer lag", "en", ["c33.1"], ["cross_lingual"]),
    ("Kafka 积压", "zh", ["c33.1"], []),
    ("increase partitions order-events", "en", ["c33.2", "c33.3"], ["identifier", "cross_lingual"]),
    ("kafka lag tinggi tambah partition", "rojak", ["c33.1", "c33.3"], ["cross_lingual"]),
    # c34 INC-2291 disk full db-replica-2, Farid
    ("INC-2291", "en", ["c34.1"], ["identifier"]),
    ("disk full on db replica", "en", ["c34.1", "c34.3"], []),
    ("Farid on-call handover", "en", ["c34.1"], ["identifier"]),
    ("replication slot WAL piling up", "en", ["c34.2"], []),
    ("cakera penuh replika pangkalan data", "ms", ["c34.1"], ["cross_lingual"]),
    ("磁盘满了 数据库副本", "zh", ["c34.1"], ["cross_lingual"]),
    # c35 migration 0042 lock timeout
    ("migration 0042 lock timeout", "en", ["c35.1"], ["identifier", "cross_lingual"]),
    ("migrasi gagal lock timeout", "ms", ["c35.1"], []),
    ("create index concurrently at night", "en", ["c35.3"], ["cross_lingual"]),
    ("数据库迁移失败", "zh", ["c35.1"], ["cross_lingual"]),
    # c36 Android crash 3.8.1, CartFragment NPE
    ("android 14 crash after 3.8.1 update", "en", ["c36.1"], ["identifier", "cross_lingual"]),
    ("NullPointerException CartFragment", "en", ["c36.2"], ["identifier", "cross_lingual"]),
    ("app crash hotfix 3.8.2", "en", ["c36.4"], ["identifier", "cross_lingual"]),
    ("安卓 应用 闪退", "zh", ["c36.1"], ["cross_lingual"]),
    ("app selalu crash android", "rojak", ["c36.1"], []),
    ("NullPointerExeption cart", "en", ["c36.2"], ["typo", "identifier", "cross_lingual"]),
    # c37 iOS push
    ("iOS push notifications stopped", "en", ["c37.1"], []),
    ("APNs certificate expired", "en", ["c37.2"], ["identifier"]),
    ("notifikasi iPhone tak masuk", "ms", ["c37.1"], ["cross_lingual"]),
    # c38 ERR_TOKEN_EXPIRED
    ("ERR_TOKEN_EXPIRED", "en", ["c38.1"], ["identifier", "cross_lingual"]),
    ("users logged out token expired refresh", "en", ["c38.1", "c38.2"], ["cross_lingual"]),
    ("用户被强制登出", "zh", ["c38.1"], []),
    ("pengguna terkeluar sendiri token tamat", "ms", ["c38.1"], ["cross_lingual"]),
    # c39 Shopee 429
    ("shopee api 429 too many requests", "en", ["c39.1"], ["identifier"]),
    ("stock sync rate limited", "en", ["c39.1", "c39.3"], []),
    ("exponential backoff changed SKUs only", "en", ["c39.3"], []),
    ("库存同步被限流", "zh", ["c39.1"], ["cross_lingual"]),
    ("shopee rate limt sync", "en", ["c39.1"], ["typo"]),
    # Rojak (code-switched) queries across the set.
    ("refund K55120 still tak masuk lagi", "rojak", ["c03.1", "c03.2"], ["identifier", "cross_lingual"]),
    ("kena charge two times for B7781 ah", "rojak", ["c04.3", "c04.4"], ["identifier", "cross_lingual"]),
    ("reset password email tak sampai", "rojak", ["c08.1", "c08.2"], ["cross_lingual"]),
    ("voucher RAYA20 tak boleh pakai why", "rojak", ["c10.1", "c10.2"], ["identifier", "cross_lingual"]),
    ("rice cooker rosak still got warrenty or not", "rojak", ["c12.1", "c12.2"], ["typo", "cross_lingual"]),
    ("COD Kuching ada extra charge ke", "rojak", ["c15.3", "c15.4"], ["cross_lingual"]),
    ("ansuran 0% pakai debit card boleh?", "rojak", ["c16.3", "c16.4"], []),
    ("TXN-88213904 payment dah masuk belum", "rojak", ["c21.2", "c21.3"], ["identifier"]),
    ("payments-api rollback dah siap ke", "rojak", ["c25.3", "c25.4"], ["identifier", "cross_lingual"]),
    ("502 staging sebab OOM", "rojak", ["c27.1", "c27.2"], ["identifier"]),
    ("Billplz webhok fail lepas rotate key", "rojak", ["c31.1", "c31.3"], ["identifier", "typo"]),
    ("Farid punya handover disk penuh", "rojak", ["c34.1"], ["identifier", "cross_lingual"]),
    ("CartFragment crash lepas update", "rojak", ["c36.2"], ["identifier"]),
    ("token expired user kena logout sendiri", "rojak", ["c38.1"], ["cross_lingual"]),
    ("SSL cert expire malam ni, certbot tak jalan", "rojak", ["c29.1", "c29.2"], ["cross_lingual"]),
    ("kasut size 42 too small nak exchange", "rojak", ["c17.1"], ["identifier", "cross_lingual"]),
    # Chinese in Traditional script, as customers in Taiwan and Hong Kong type it (issue 51);
    # the Chinese conversations above are in Simplified. Some words are their own there
    # (連線逾時 for a timeout, 資料庫 for a database, 保固 for a warranty, 憑證 for a
    # certificate, 刮花 for scratched).
    ("信用卡被重複扣款", "zh", ["c04.1", "c04.4"], ["traditional"]),
    ("送貨員找不到我家地址", "zh", ["c07.1", "c07.4"], ["traditional"]),
    ("優惠券 RAYA20 用不了", "zh", ["c10.1", "c10.2"], ["identifier", "traditional"]),
    ("訂單還沒發貨 可以取消嗎", "zh", ["c14.1", "c14.2"], ["traditional"]),
    ("退款到電子錢包", "zh", ["c18.1", "c18.2"], ["traditional"]),
    ("藍牙耳機什麼時候補貨", "zh", ["c23.1", "c23.2"], ["traditional"]),
    ("Redis 連線逾時 訂單服務報錯", "zh", ["c28.1"], ["traditional"]),
    ("Kafka 消費者積壓", "zh", ["c33.1"], ["traditional"]),
    ("用戶被強制登出", "zh", ["c38.1"], ["traditional"]),
    ("寄到東馬運費多少", "zh", ["c41.1", "c41.2"], ["traditional"]),
    ("電飯鍋內膽刮花了 可以換嗎", "zh", ["c46.1", "c46.2"], ["traditional"]),
    ("資料庫死鎖", "zh", ["c26.1", "c26.2"], ["cross_lingual", "traditional"]),
    ("快遞卡在轉運中心", "zh", ["c01.3"], ["cross_lingual", "traditional"]),
    ("退款還沒到銀行帳戶", "zh", ["c03.2", "c03.4"], ["cross_lingual", "traditional"]),
    ("收不到驗證碼 換了手機號碼", "zh", ["c09.1", "c09.3"], ["cross_lingual", "traditional"]),
    ("雙十一免運費嗎", "zh", ["c11.1", "c11.2"], ["cross_lingual", "traditional"]),
    ("電飯鍋保固多久", "zh", ["c12.1", "c12.2"], ["cross_lingual", "traditional"]),
    ("貨到付款 古晉", "zh", ["c15.1", "c15.2"], ["cross_lingual", "traditional"]),
    ("鞋子太小 換尺碼", "zh", ["c17.1"], ["cross_lingual", "traditional"]),
    ("SSL 憑證過期", "zh", ["c29.1"], ["cross_lingual", "traditional"]),
    ("部署失敗 回滾", "zh", ["c25.1", "c25.3"], ["cross_lingual", "traditional"]),
]

# Two sessions in one channel sit hours apart; conversations follow each other by hours.
GAP_HOURS = (3, 30)


def build() -> dict:
    rng = random.Random(20261001)
    at = START
    conversations = []
    for cid, provider, channel, lang, texts in CONVERSATIONS:
        at += timedelta(hours=rng.uniform(*GAP_HOURS), minutes=rng.uniform(0, 59))
        t = at
        messages = []
        for i, text in enumerate(texts, 1):
            if i > 1:
                t += timedelta(seconds=rng.uniform(20, 240))
            messages.append(
                {"id": f"{cid}.{i}", "text": text, "created_at": t.strftime("%Y-%m-%dT%H:%M:%SZ")}
            )
        conversations.append(
            {"id": cid, "provider": provider, "channel": channel, "language": lang, "messages": messages}
        )
    ids = {m["id"]: c["language"] for c in conversations for m in c["messages"]}
    queries = []
    for n, (text, lang, relevant, subsets) in enumerate(QUERIES, 1):
        unknown = [r for r in relevant if r not in ids]
        if unknown:
            raise SystemExit(f"query {text!r}: unknown message ids {unknown}")
        answer_languages = {ids[r] for r in relevant}
        cross = lang not in answer_languages
        if cross != ("cross_lingual" in subsets):
            raise SystemExit(
                f"query {text!r} ({lang}) answers in {sorted(answer_languages)}: "
                f"cross_lingual should be {cross}"
            )
        queries.append(
            {
                "id": f"q{n:03d}",
                "text": text,
                "language": lang,
                "relevant": relevant,
                "subsets": sorted(subsets),
            }
        )
    return {
        "description": (__doc__ or "").split("\n\n")[0],
        "conversations": conversations,
        "queries": queries,
    }


def main() -> None:
    data = build()
    OUT.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n")
    print(
        f"{len(data['conversations'])} conversations, "
        f"{sum(len(c['messages']) for c in data['conversations'])} messages, {len(data['queries'])} queries -> {OUT}"
    )


if __name__ == "__main__":
    main()
