"""The benchmarks' chat-like text: support-chat words in English and Malay (CHAT_WORDS),
the same with Chinese in another order (MIXED_CHAT_WORDS), and `chat_text`, a line of
them at a random length. Drawn from a seeded `random.Random`, a benchmark's texts are the
same on every run, so its figures compare across runs.

Each benchmark keeps the words and lengths its figures were measured with: bench.embedder
and bench.sweep (CHAT_WORDS, bench.sweep's with "ok" and "can"), bench.onnx (the first 26
of CHAT_WORDS, cycled, not drawn), bench.search and bench.index (MIXED_CHAT_WORDS),
bench.tenancypop and bench.tenancy (MIXED_CHAT_WORDS and more of the same)."""

from __future__ import annotations

import random
from collections.abc import Sequence

CHAT_WORDS = (
    "refund",
    "parcel",
    "order",
    "delivery",
    "late",
    "cancel",
    "payment",
    "card",
    "status",
    "tracking",
    "address",
    "change",
    "invoice",
    "warranty",
    "broken",
    "return",
    "exchange",
    "voucher",
    "promo",
    "please",
    "thanks",
    "boss",
    "bayar",
    "pesanan",
    "barang",
    "sampai",
    "belum",
    "terima",
    "kasih",
    "tolong",
    "customer",
    "service",
    "agent",
    "reply",
    "tomorrow",
    "morning",
    "yesterday",
    "week",
)
"""English and Malay support-chat words (38)."""

MIXED_CHAT_WORDS = (
    "refund",
    "parcel",
    "order",
    "delivery",
    "late",
    "cancel",
    "payment",
    "card",
    "bayar",
    "pesanan",
    "barang",
    "sampai",
    "belum",
    "terima",
    "kasih",
    "tolong",
    "退款",
    "订单",
    "快递",
    "取消",
    "付款",
    "还没",
    "收到",
    "谢谢",
    "please",
    "thanks",
    "status",
    "tracking",
    "address",
    "change",
    "invoice",
    "warranty",
    "broken",
    "return",
    "exchange",
    "voucher",
    "promo",
)
"""Support-chat words in English, Malay and Chinese (37): most of CHAT_WORDS, in another
order, and eight Chinese ones; the order is part of what a seed draws."""


def chat_text(rng: random.Random, low: int, high: int, words: Sequence[str] = CHAT_WORDS) -> str:
    """`low` to `high` words (both included, the count drawn first) of `words`, each drawn
    from `rng`, joined by spaces."""
    return " ".join(rng.choice(words) for _ in range(rng.randint(low, high)))
