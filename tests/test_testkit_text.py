"""dwsearch_testkit.text.ZipfChat, the text of bench.search's second set of orgs: the same
vocabulary on every run, skewed as Zipf's law says, and queries made of a line's own words."""

import random
from collections import Counter

from dwsearch.retrieval import bm25
from dwsearch_testkit.text import ZipfChat


def test_vocabulary_is_the_same_on_every_run_and_lines_repeat_by_seed():
    a, b = ZipfChat(), ZipfChat()
    assert a.latin == b.latin and a.han == b.han
    assert len(set(a.latin)) == ZipfChat.LATIN_WORDS and len(set(a.han)) == ZipfChat.HAN_WORDS
    assert all(w.isascii() and w.isalpha() for w in a.latin)
    assert all(len(w) == 2 and all("\u4e00" <= c <= "\u9fff" for c in w) for w in a.han)
    assert [a.line(random.Random(3)) for _ in range(5)] == [b.line(random.Random(3)) for _ in range(5)]


def test_a_few_words_carry_much_of_the_text_and_most_words_are_rare():
    chat, rng = ZipfChat(), random.Random(1)
    counts = Counter(w for _ in range(2000) for w in chat.words(rng, False, 10))
    total = sum(counts.values())
    top = counts.most_common(1)[0][1] / total
    assert 0.05 < top < 0.2  # the first rank's share under exponent 1.07 over 20,000 words: 0.13
    assert sum(1 for c in counts.values() if c == 1) > len(counts) / 3  # hapaxes


def test_lines_are_latin_chinese_or_both_and_chinese_has_no_spaces():
    chat, rng = ZipfChat(), random.Random(2)
    kinds = Counter()
    for _ in range(1000):
        line = chat.line(rng)
        parts = line.split(" ")
        han = [p for p in parts if not p.isascii()]
        kinds["han" if han and len(parts) == 1 else "mixed" if han else "latin"] += 1
        assert all(len(p) % 2 == 0 for p in han)  # whole two-character words, run together
    assert kinds["latin"] > kinds["han"] > kinds["mixed"] > 50


def test_a_query_is_some_of_its_lines_words_and_finds_their_terms():
    chat, rng = ZipfChat(), random.Random(4)
    for _ in range(300):
        line = chat.line(rng)
        query = chat.query(rng, line)
        assert query and all(word in line for word in query.split(" "))
        terms = {bm25.term_id(t) for t in bm25.tokens(query)}
        assert terms <= {bm25.term_id(t) for t in bm25.tokens(line)}
