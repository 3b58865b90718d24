"""highlight.pattern groups the latin-script words, and spans() keeps their matches only when
whole words: the same spans as one alternation of every word, longest first, each latin word
between its own word guards in the regular expression. A
CJK run of the query is looked for as its bigrams: a longer run asked for lights up the
part of it a hit holds."""

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from dwsearch.search import highlight
from dwsearch.search.ftsplan import query_lexemes

ALPHABET = "abcAB12 _-.取消订单退款éдßａカ한ΣσİKι\u0345"


def reference(query: str) -> re.Pattern[str] | None:
    words = sorted(set(highlight.words(query)), key=lambda w: (-len(w), w))[: highlight.MAX_WORDS]
    if not words:
        return None
    cjk = highlight._SEGMENTED
    parts = [
        re.escape(w) if highlight._CJK.search(w) else rf"(?<![^\W_{cjk}]){re.escape(w)}(?![^\W_{cjk}])"
        for w in words
    ]
    return re.compile("|".join(parts), re.IGNORECASE)


@settings(max_examples=1000, deadline=None)
@given(st.text(ALPHABET, max_size=24), st.text(ALPHABET, max_size=60))
def test_grouped_guards_give_the_reference_spans(query, text):
    assert highlight.spans(highlight.pattern(query), text) == highlight.spans(reference(query), text)


def test_a_shorter_word_is_tried_where_a_longer_one_is_no_whole_word():
    """IGNORECASE matches U+0345 (a combining iota subscript, no word character) to ι: "aι"
    matches "a\u0345" but is followed by a letter; "a" there is a whole word."""
    assert highlight.spans(highlight.pattern("a aι"), "a\u0345x") == highlight.spans(
        reference("a aι"), "a\u0345x"
    )
    assert highlight.spans(highlight.pattern("a aι"), "a\u0345x") == [(0, 1)]


def test_examples():
    compiled = highlight.pattern("order 取消 ab")
    assert highlight.spans(compiled, "my order: 取消订单, orders ab_c ab") == [
        (3, 8),
        (10, 12),
        (23, 25),
        (28, 30),
    ]
    assert highlight.pattern("  ...  ") is None


def test_chinese_runs_are_looked_for_as_bigrams():
    """A run of Chinese asked for is no word a hit holds whole: its bigrams are looked for."""
    assert highlight.words("物流信息 order") == ["物流", "流信", "信息", "order"]
    assert highlight.words("取消") == ["取消"] and highlight.words("单") == ["单"]
    text = "👍 你好，我的订单还没有到，请帮我查一下物流"
    (span,) = highlight.spans(highlight.pattern("物流信息"), text)
    assert text[span[0] : span[1]] == "物流"
    # Overlapping bigrams merge into one span; a latin word beside Chinese is whole.
    assert highlight.spans(highlight.pattern("订单还没有"), "订单还没有到") == [(0, 5)]
    text = "the courier说物流 tomorrow"
    found = [text[a:b] for a, b in highlight.spans(highlight.pattern("courier物流"), text)]
    assert found == ["courier", "物流"]
    assert query_lexemes("courier物流") == ["courier物流"]  # one lexeme, two scripts


def test_a_querys_pattern_holds_no_large_character_class():
    """The word guards' class (every letter and digit of no segmented script) is compiled once
    at import, not into each query's pattern: compiling it took 6.9 ms of CPU a query."""
    compiled = highlight.pattern("refund order 取消 late")
    assert compiled is not None and highlight._SEGMENTED not in compiled.pattern
    assert len(compiled.pattern) < 100
