"""bench/quality.py's similar-conversation task: hits mapped back to conversations, the
cases built from the topics (conversations alone in their topic left out, cross-lingual
ones marked), scoring, and the committed set's topics. Fast, no processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import quality
from bench.quality_topics import TOPICS

ROOT = Path(__file__).resolve().parents[2]


def conv(cid: str, language: str, messages: int = 2) -> dict:
    return {
        "id": cid,
        "language": language,
        "messages": [{"id": f"{cid}.{i}"} for i in range(1, messages + 1)],
    }


SET = [conv("c01", "en"), conv("c02", "en", 3), conv("c03", "zh"), conv("c04", "ms"), conv("c05", "en")]
TOPICS_OF_SET = {"c01": "delivery", "c02": "delivery", "c03": "refund", "c04": "refund", "c05": "invoice"}


def test_a_hit_is_the_conversation_of_most_of_its_messages():
    assert quality.hit_conversation(["c02.1", "c02.2", "c03.1"]) == "c02"
    assert quality.hit_conversation(["c03.1", "c02.1"]) == "c03"  # a tie: its first message's
    assert quality.hit_conversation(["0b6d3f1e-4c1a-4f0e-9d2b-7a1c2e3f4a5b", "c04.2"]) == "c04"
    assert quality.hit_conversation(["0b6d3f1e-4c1a-4f0e-9d2b-7a1c2e3f4a5b"]) is None
    assert quality.hit_conversation([]) is None
    hits = [["c02.1"], ["x-unknown"], ["c03.1", "c03.2"], ["c04.1"]]
    assert quality.top_conversations(hits) == ["c02", "?", "c03"]


def test_cases_leave_out_a_topic_of_one_and_mark_the_cross_lingual():
    cases, alone = quality.similar_cases(SET, TOPICS_OF_SET)
    assert alone == ["c05"]  # the only invoice: nothing to find
    by_id = {c["id"]: c for c in cases}
    assert list(by_id) == ["c01", "c02", "c03", "c04"]
    assert by_id["c01"]["relevant"] == ["c02.1", "c02.2", "c02.3"]  # the others of its topic, not itself
    assert by_id["c01"]["subsets"] == [] and by_id["c01"]["language"] == "en"
    # c03 (zh) and c04 (ms): the only refund in their language, scored against each other.
    assert by_id["c03"]["relevant"] == ["c04.1", "c04.2"] and by_id["c03"]["subsets"] == ["cross_lingual"]
    assert by_id["c04"]["subsets"] == ["cross_lingual"]
    with pytest.raises(ValueError, match="c05"):
        quality.similar_cases(SET, {k: v for k, v in TOPICS_OF_SET.items() if k != "c05"})


def test_a_conversation_scores_when_another_of_its_topic_is_in_the_top_3():
    cases, _ = quality.similar_cases(SET, TOPICS_OF_SET)
    hits = {
        "c01": [["c03.1"], ["c02.2", "c02.3"]],  # the other delivery at 2
        "c02": [["c02.1"], ["c03.1"], ["c04.1"], ["c01.1"]],  # itself (not counted), then c01 at 4
        "c03": [["c01.1"], ["c05.1"], ["c04.1", "c04.2"]],  # the other refund, in ms, at 3
        "c04": [],  # no hits: 0
    }
    groups = quality.score_similar(cases, hits)
    assert list(groups) == list(quality.SIMILAR_GROUPS)
    assert groups["all"]["hit@3"] == 0.5 and groups["all"]["conversations"] == 4
    assert groups["all"]["hit@10"] == 0.75
    assert groups["all"]["mrr"] == pytest.approx((1 / 2 + 1 / 4 + 1 / 3) / 4)
    assert groups["lang_en"]["hit@3"] == 0.5 and groups["lang_en"]["conversations"] == 2
    assert groups["lang_zh"]["hit@3"] == 1 and groups["lang_ms"]["hit@3"] == 0
    assert groups["cross_lingual"]["conversations"] == 2 and groups["cross_lingual"]["hit@3"] == 0.5
    assert groups["lang_rojak"]["conversations"] == 0


def test_each_hit_is_judged_by_its_conversation_and_each_conversation_found_once():
    case = {"id": "c01", "language": "en", "relevant": ["c02.1", "c02.2", "c03.1"], "subsets": []}
    hits = [
        ["c01.1"],  # itself
        ["c02.1"],
        ["c02.2"],  # a second window of c02: no second answer
        ["c04.1", "c04.2", "c03.1"],  # mostly c04 (another topic), one c03 message
        ["x-unknown"],
        ["c03.1"],
    ]
    assert quality.judge_similar(hits, case) == ["hit:1", "ans:c02", "hit:3", "hit:4", "hit:5", "ans:c03"]


def test_every_conversation_of_the_committed_set_has_a_topic():
    data = quality.load_set()
    ids = [c["id"] for c in data["conversations"]]
    assert sorted(TOPICS) == sorted(ids)
    cases, alone = quality.similar_cases(data["conversations"], TOPICS)
    assert len(cases) + len(alone) == len(ids)
    assert len(alone) <= 5  # topics are kinds of problem, not one conversation each
    for lang in quality.LANGUAGES:
        assert sum(c["language"] == lang for c in cases) >= 5
    assert sum("cross_lingual" in c["subsets"] for c in cases) >= 5


def test_the_committed_results_hold_the_similar_task_for_every_configuration():
    import json

    results = json.loads((ROOT / "bench" / "results" / "quality.json").read_text())
    figures = results["figures"]
    cases, alone = quality.similar_cases(quality.load_set()["conversations"], TOPICS)
    assert figures["similar_conversations.all"] == len(cases)
    assert results["params"]["similar"]["left_out"] == alone
    for config in results["params"]["runs"]:
        assert 0 <= figures[f"{config}.similar.all.hit@3"] <= 1, config
        # Every conversation matched its stored windows (none embedded for the call), none degraded.
        assert figures[f"{config}.similar.embedded_now"] == figures[f"{config}.similar.degraded"] == 0
        assert set(results["params"]["similar_top3"][config]) == set(TOPICS)
