"""bench/quality.py's scoring and its labelled set: fast, no processes (the benchmark itself
runs the real stack: `python -m bench.quality`)."""

from __future__ import annotations

import pytest

from bench import quality
from bench.data import make_chat_quality

Q1 = {"id": "q1", "text": "refund", "language": "en", "relevant": ["c01.2", "c01.3"], "subsets": []}
Q2 = {
    "id": "q2",
    "text": "退款",
    "language": "zh",
    "relevant": ["c02.1", "c05.4"],
    "subsets": ["cross_lingual"],
}


def test_a_hit_counts_when_it_holds_a_labelled_message_and_an_answer_counts_once():
    groups = quality.answers(Q1["relevant"])
    assert groups == {"c01": {"c01.2", "c01.3"}}
    hits = [["c09.1", "c09.2"], ["c01.1", "c01.2"], ["c01.3"], ["c04.1"]]
    assert quality.judge(hits, groups) == ["hit:1", "ans:c01", "hit:3", "hit:4"]


def test_metrics_of_known_rankings():
    ranked = {
        "q1": ["hit:1", "ans:c01"],  # first answer at rank 2
        "q2": ["ans:c05", "hit:2", "hit:3", "ans:c02"],  # both answers, at 1 and 4
    }
    values = quality.per_query_metrics([Q1, Q2], ranked)
    assert values["q1"]["hit@1"] == 0 and values["q1"]["hit@3"] == 1 and values["q1"]["mrr"] == 0.5
    assert values["q1"]["ndcg@10"] == pytest.approx(1 / 1.5849625, rel=1e-5)  # 1/log2(3)
    assert values["q2"]["hit@1"] == 1 and values["q2"]["mrr"] == 1
    ideal = 1 + 1 / 1.5849625
    assert values["q2"]["ndcg@10"] == pytest.approx((1 + 1 / 2.321928) / ideal, rel=1e-5)  # ranks 1 and 4


def test_a_query_without_hits_scores_zero_and_stays_in_the_mean():
    values = quality.per_query_metrics([Q1, Q2], {"q1": ["ans:c01"], "q2": []})
    assert values["q2"] == dict.fromkeys(quality.METRICS, 0.0)
    groups = quality.aggregate([Q1, Q2], values)
    assert groups["all"]["hit@1"] == 0.5 and groups["all"]["queries"] == 2
    assert groups["lang_zh"]["mrr"] == 0 and groups["cross_lingual"]["queries"] == 1
    assert groups["lang_en"]["ndcg@10"] == 1


def test_the_committed_set_is_the_generators_output_and_well_formed():
    data = quality.load_set()
    assert data == make_chat_quality.build()  # regenerate: python -m bench.data.make_chat_quality
    messages = {m["id"] for c in data["conversations"] for m in c["messages"]}
    assert len(data["queries"]) >= 150
    assert len({q["text"] for q in data["queries"]}) == len(data["queries"])
    for q in data["queries"]:
        assert q["language"] in quality.LANGUAGES
        assert set(q["subsets"]) <= set(quality.SUBSETS)
        assert q["relevant"] and set(q["relevant"]) <= messages
    for lang in quality.LANGUAGES:
        assert sum(q["language"] == lang for q in data["queries"]) >= 20
    for subset in quality.SUBSETS:
        assert sum(subset in q["subsets"] for q in data["queries"]) >= 20
    # Each conversation is one sweep window: at most 15 messages.
    assert all(len(c["messages"]) <= 15 for c in data["conversations"])
    # Distractors: conversations no query points at.
    answered = {r.split(".")[0] for q in data["queries"] for r in q["relevant"]}
    assert len({c["id"] for c in data["conversations"]} - answered) >= 5
