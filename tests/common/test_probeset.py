"""The shipped probe set: its shape, and that each topic's four versions match only for a
model that reads each language (no topic word shared across them)."""

from __future__ import annotations

import re

from dwsearch.modelserver import probeset

# Filler English that rojak keeps while the topic's words are Malay or Chinese.
FILLER = {"still", "already"}


def test_topics_are_distinct_and_written_in_every_language():
    assert len(probeset.TOPICS) >= 12
    assert len({t.name for t in probeset.TOPICS}) == len(probeset.TOPICS)
    assert probeset.LANGUAGES == ("en", "ms", "zh", "rojak")
    for topic in probeset.TOPICS:
        texts = [topic.text(language) for language in probeset.LANGUAGES]
        assert all(t.strip() for t in texts) and len(set(texts)) == 4, topic.name
        assert re.search(r"[\u4e00-\u9fff]", topic.zh), topic.name
        assert re.search(r"[\u4e00-\u9fff]", topic.rojak) and re.search(r"[a-z]", topic.rojak), topic.name
    for language in probeset.LANGUAGES:
        texts = [t.text(language) for t in probeset.TOPICS]
        assert len(set(texts)) == len(texts), language


def test_no_topic_word_is_shared_with_the_english_version():
    """A model that only matches words (an English-only one) must not pass on them."""
    for topic in probeset.TOPICS:
        english = set(re.findall(r"[a-z]{3,}", topic.en))
        for language in ("ms", "zh", "rojak"):
            shared = english & set(re.findall(r"[a-z]{3,}", topic.text(language))) - FILLER
            assert not shared, (topic.name, language, shared)


def test_windows_queries_and_rerank_probes():
    assert len(probeset.WINDOWS) >= 6
    for window in probeset.WINDOWS:
        lines = window.split("\n")
        assert len(lines) >= 3 and all(line.startswith(("customer: ", "agent: ")) for line in lines)
    scripts = {bool(re.search(r"[\u4e00-\u9fff]", w)) for w in probeset.WINDOWS}
    assert scripts == {True, False}
    assert len(probeset.QUERIES) >= 8 and all(len(q) <= 60 for q in probeset.QUERIES)
    assert len(probeset.RERANK_PROBES) >= 6
    for probe in probeset.RERANK_PROBES:
        assert 4 <= len(probe.documents) <= 6 and len(set(probe.documents)) == len(probe.documents)
    documents = [d for p in probeset.RERANK_PROBES for d in p.documents]
    assert any(re.search(r"[\u4e00-\u9fff]", d) for d in documents)


def test_guard_texts_are_every_message_then_windows_then_queries():
    texts = probeset.guard_texts()
    n = len(probeset.TOPICS) * len(probeset.LANGUAGES)
    assert texts[:4] == [probeset.TOPICS[0].text(language) for language in probeset.LANGUAGES]
    assert set(texts[:n]) == {t.text(language) for t in probeset.TOPICS for language in probeset.LANGUAGES}
    assert texts[n:] == [*probeset.WINDOWS, *probeset.QUERIES]
