"""The demo's sample chat history: one org's customer conversations in English, Malay,
Chinese and code-switched rojak, and queries that show where full-text search falls
short (Chinese has no spaces to split on; a question in one language whose answer is in
another)."""

from __future__ import annotations

from dataclasses import dataclass

DEMO_ORG = "demo-org"


@dataclass(frozen=True)
class Conversation:
    provider: str
    channel: str
    messages: tuple[str, ...]


CONVERSATIONS: tuple[Conversation, ...] = (
    Conversation(
        "whatsapp",
        "cust-0101",
        (
            "Hi, my order A1029 hasn't arrived yet, it's been 10 days",
            "Sorry about that! Let me check the tracking for you",
            "The courier says it is stuck at the Shah Alam hub",
            "Can I get a refund instead?",
            "Done, the refund is processed and reaches your bank in 3-5 working days",
        ),
    ),
    Conversation(
        "whatsapp",
        "cust-0102",
        (
            "Saya nak tukar alamat penghantaran untuk pesanan saya",
            "Boleh, alamat baru di mana?",
            "No 12 Jalan Ampang, Kuala Lumpur",
            "Alamat sudah dikemaskini, terima kasih",
        ),
    ),
    Conversation(
        "wechat",
        "cust-0103",
        (
            "我的信用卡被扣了两次钱",
            "非常抱歉，请提供您的订单号",
            "订单号是 B7781",
            "已经为您退回重复扣款，三到五个工作日到账",
        ),
    ),
    Conversation(
        "whatsapp",
        "cust-0104",
        (
            "Boss, barang sampai dah rosak lah, the screen cracked 了",
            "Alamak sorry! Can send photo?",
            "ok sent already, 怎么办?",
            "We send a replacement tomorrow, no need to return the broken one",
        ),
    ),
    Conversation(
        "wechat",
        "cust-0105",
        (
            "可以用 Touch 'n Go 电子钱包付款吗？",
            "可以的，我们支持 Touch 'n Go 和 GrabPay",
        ),
    ),
    Conversation(
        "telegram",
        "cust-0106",
        (
            "Bila promosi 11.11 tamat?",
            "Promosi tamat 12 November jam 11:59 malam",
        ),
    ),
    Conversation(
        "telegram",
        "cust-0107",
        (
            "How do I reset my password? The reset email never comes",
            "Please check your spam folder, or I can resend it",
            "Found it in spam, thanks!",
        ),
    ),
    Conversation(
        "whatsapp",
        "cust-0108",
        (
            "Can cancel order or not ah? 我不要了",
            "Boleh, order dah cancel. Duit akan masuk balik dalam 3 hari",
        ),
    ),
    Conversation(
        "wechat",
        "cust-0109",
        (
            "送货员说找不到我家的地址",
            "请确认您的门牌号和楼层",
            "B座 15楼 3号，谢谢",
        ),
    ),
    Conversation(
        "whatsapp",
        "cust-0110",
        (
            "Is the warranty for the blender 1 year?",
            "Ya, waranti 1 tahun untuk semua perkakas dapur",
        ),
    ),
)


@dataclass(frozen=True)
class DemoQuery:
    text: str
    note: str


QUERIES: tuple[DemoQuery, ...] = (
    DemoQuery("charged twice on my credit card", "English question, Chinese conversation"),
    DemoQuery("退款", "Chinese query: full-text search cannot split Chinese"),
    DemoQuery("tukar alamat penghantaran", "same-language Malay: both find it"),
    DemoQuery("item arrived damaged, send replacement", "English question, rojak conversation"),
    DemoQuery("怎么付款", "Chinese question about payment methods"),
    DemoQuery("the courier could not find my house", "English question, Chinese conversation"),
    DemoQuery("password reset email", "same-language English: both find it"),
)
