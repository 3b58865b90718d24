"""The benchmarks' chat-like text: support-chat words in English and Malay (CHAT_WORDS),
the same with Chinese in another order (MIXED_CHAT_WORDS), and `chat_text`, a line of
them at a random length. Drawn from a seeded `random.Random`, a benchmark's texts are the
same on every run, so its figures compare across runs.

Each benchmark keeps the words and lengths its figures were measured with: bench.embedder
and bench.sweep (CHAT_WORDS, bench.sweep's with "ok" and "can"), bench.onnx (the first 26
of CHAT_WORDS, cycled, not drawn), bench.search and bench.index (MIXED_CHAT_WORDS),
bench.tenancypop and bench.tenancy (MIXED_CHAT_WORDS and more of the same).

`ZipfChat` is text with a vocabulary as large and as skewed as real chat's (bench.search's
second set of orgs): a few dozen words carry most of a chat, most words are rare, and Chinese
runs are written without spaces. With the words above every word is in about a sixth of the
messages, so any lexical search matches nearly all of an org's windows."""

from __future__ import annotations

import itertools
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


class ZipfChat:
    """Chat lines over generated words whose frequencies follow Zipf's law (exponent
    ZIPF_EXPONENT): LATIN_WORDS pseudo-words of two or three syllables (English and Malay
    alike to a tokenizer) and HAN_WORDS words of two Han characters. A line is latin-script
    words (60 %), a run of Chinese words without spaces (25 %), or both mixed (15 %, the
    code-switched "rojak"). The vocabulary is the same on every run; lines draw from `rng`."""

    LATIN_WORDS = 20_000
    HAN_WORDS = 5_000
    ZIPF_EXPONENT = 1.07

    def __init__(self) -> None:
        syllables = ["".join(p) for p in itertools.product("bcdfghjklmnprstw", "aeiou")]
        vocabulary = random.Random(0)
        latin: dict[str, None] = {}
        while len(latin) < self.LATIN_WORDS:
            latin["".join(vocabulary.choices(syllables, k=vocabulary.randint(2, 3)))] = None
        han: dict[str, None] = {}
        while len(han) < self.HAN_WORDS:
            han[chr(0x4E00 + vocabulary.randrange(2500)) + chr(0x4E00 + vocabulary.randrange(2500))] = None
        self.latin, self.han = list(latin), list(han)
        self._latin_cum = list(
            itertools.accumulate(r**-self.ZIPF_EXPONENT for r in range(1, len(self.latin) + 1))
        )
        self._han_cum = list(
            itertools.accumulate(r**-self.ZIPF_EXPONENT for r in range(1, len(self.han) + 1))
        )

    def words(self, rng: random.Random, han: bool, n: int) -> list[str]:
        if han:
            return rng.choices(self.han, cum_weights=self._han_cum, k=n)
        return rng.choices(self.latin, cum_weights=self._latin_cum, k=n)

    def line(self, rng: random.Random, low: int = 3, high: int = 12) -> str:
        n = rng.randint(low, high)
        kind = rng.random()
        if kind < 0.6:
            return " ".join(self.words(rng, False, n))
        if kind < 0.85:
            return "".join(self.words(rng, True, n))
        half = max(1, n // 2)
        return " ".join([*self.words(rng, False, half), "".join(self.words(rng, True, n - half))])

    def query(self, rng: random.Random, line: str) -> str:
        """What a user remembers of `line` and types: one to three of its words in a row
        (latin words), or one or two of its Chinese words."""
        words = line.split(" ")
        start = rng.randrange(len(words))
        picked = words[start : start + rng.randint(1, 3)]
        return " ".join(w if w.isascii() else self._han_part(rng, w) for w in picked)

    @staticmethod
    def _han_part(rng: random.Random, run: str) -> str:
        start = 2 * rng.randrange(len(run) // 2)
        return run[start : start + 2 * rng.randint(1, 2)]
