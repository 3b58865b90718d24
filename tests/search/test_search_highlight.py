"""highlight.pattern groups the latin-script words under one pair of word guards: the same
spans as one alternation of every word, longest first, each latin word guarded alone."""

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from dwsearch.search import highlight
from dwsearch.search.ftsplan import query_lexemes

ALPHABET = "abcAB12 _-.取消订单退款é"


def reference(query: str) -> re.Pattern[str] | None:
    words = sorted(set(query_lexemes(query)), key=lambda w: (-len(w), w))[: highlight.MAX_WORDS]
    if not words:
        return None
    parts = [
        re.escape(w) if highlight._CJK.search(w) else rf"(?<![^\W_]){re.escape(w)}(?![^\W_])" for w in words
    ]
    return re.compile("|".join(parts), re.IGNORECASE)


@settings(max_examples=400, deadline=None)
@given(st.text(ALPHABET, max_size=24), st.text(ALPHABET, max_size=60))
def test_grouped_guards_give_the_reference_spans(query, text):
    assert highlight.spans(highlight.pattern(query), text) == highlight.spans(reference(query), text)


def test_examples():
    compiled = highlight.pattern("order 取消 ab")
    assert highlight.spans(compiled, "my order: 取消订单, orders ab_c ab") == [
        (3, 8),
        (10, 12),
        (23, 25),
        (28, 30),
    ]
    assert highlight.pattern("  ...  ") is None
