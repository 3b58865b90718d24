"""The BM25 sparse encoder (a REST index's sparse_model = "BM25", and chat search's lexical
leg): text to sparse vectors computed by dwsearch itself, no model service.

- Tokens: the text NFKC-normalised and case-folded (for chat search's lexical leg,
  `fold=True`, Traditional Chinese folded to Simplified: dwsearch.retrieval.chinese); runs
  of letters and digits are words;
  runs of CJK characters (Han, kana, Hangul), which have no spaces, are segmented into
  overlapping character bigrams (a lone character is its own token), so 退款 matches inside
  我要退款吗. Mixed text ("rojak": English, Malay, Chinese) is handled token by token.
- Term ids: a 64-bit BLAKE2b hash of the token modulo DIMENSION.
- A document's weight per term is BM25's saturated term frequency,
  tf·(k1 + 1) / (tf + k1·(1 − b + b·dl / AVERAGE_DOCUMENT_TOKENS)), with a fixed average
  length (no corpus statistics to keep current).
- A query is each distinct term at weight 1; the IDF, which needs the corpus, is applied
  at query time over the namespace searched (DocumentIndex, Weighting.IDF).
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections import Counter

from dwsearch.retrieval import chinese

DIMENSION = 1_000_000_000
"""pgvector's largest sparsevec dimension."""
K1 = 1.2
B = 0.75
AVERAGE_DOCUMENT_TOKENS = 64.0
MODEL_NAME = "BM25"
TOTAL_TERM = -1
"""Where a store of document frequencies keeps its count of documents: no term id (they
are >= 0) is negative."""

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af\u1100-\u11ff\u3130-\u318f"
_TOKEN = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+")
_IS_CJK = re.compile(rf"[{_CJK}]")


def tokens(text: str, *, fold: bool = False) -> list[str]:
    """The text's tokens; `fold`: Simplified and Traditional Chinese as one (chat search's
    lexical leg, its windows and its queries alike). A REST index's "BM25" does not fold:
    its stored vectors have no path to be weighed again."""
    normalized = unicodedata.normalize("NFKC", text).casefold()
    if fold:
        normalized = chinese.fold(normalized)
    out: list[str] = []
    for run in _TOKEN.findall(normalized):
        if _IS_CJK.match(run):
            out += [run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)]
        else:
            out.append(run)
    return out


def term_id(token: str) -> int:
    return int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "little") % DIMENSION


def document_vector(text: str, *, fold: bool = False) -> dict[int, float]:
    words = tokens(text, fold=fold)
    if not words:
        return {}
    norm = K1 * (1 - B + B * len(words) / AVERAGE_DOCUMENT_TOKENS)
    weights: dict[int, float] = {}
    for token, tf in Counter(words).items():
        term = term_id(token)
        weights[term] = weights.get(term, 0.0) + tf * (K1 + 1) / (tf + norm)
    return weights


def query_vector(text: str) -> dict[int, float]:
    return {term_id(token): 1.0 for token in set(tokens(text))}


def idf(total: int, frequency: int) -> float:
    """A term's inverse document frequency among `total` documents, `frequency` of which
    have it: log((N - n + 0.5) / (n + 0.5) + 1), as Upstash weighs BM25 queries."""
    return math.log((total - frequency + 0.5) / (frequency + 0.5) + 1)
