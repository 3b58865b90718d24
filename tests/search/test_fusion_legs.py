"""Search's fusion of legs (full text, each model's dense and sparse KNN): RRF and the
weighted score fusion, per-source weights, and the properties every method keeps."""

import itertools

import pytest
from fusion_legs import legs_strategy, msg, win
from hypothesis import given, settings
from hypothesis import strategies as st

from dwsearch.retrieval.fusion import RRF_K, minmax
from dwsearch.search.fusion import DEFAULT_WEIGHTS, METHODS, Leg, fuse, parse_weights, weight_of
from dwsearch.search.rows import WindowRow


def ids(candidates) -> list[str]:
    return [c.id for c in candidates]


# --- the new interface ----------------------------------------------------------------


def test_rrf_of_legs_is_the_sum_of_weighted_reciprocal_ranks():
    a, b = win("a", ("1",)), win("b", ("2",))
    out = fuse([Leg("dense:use", [a, b]), Leg("dense:e5", [b, a])], method="rrf", weights={"dense:e5": 2.0})
    fused = {c.id: c.fused for c in out}
    assert fused["a"] == pytest.approx(1 / (RRF_K + 1) + 2 / (RRF_K + 2))
    assert fused["b"] == pytest.approx(1 / (RRF_K + 2) + 2 / (RRF_K + 1))
    assert ids(out) == ["b", "a"]


def test_windows_of_two_models_over_the_same_messages_are_one_candidate():
    use, e5 = win("w-use", ("m1", "m2"), 0.8), win("w-e5", ("m1", "m2"), 0.9)
    (c,) = fuse([Leg("dense:use", [use]), Leg("dense:e5", [e5])])
    assert c.id == "w-use"  # the first leg's window names it
    assert c.sources["dense:use"].rank == 1 and c.sources["dense:e5"].score == pytest.approx(0.9)
    # The bare kind is the first leg of that kind: the active model's.
    assert c.sources["dense"] is c.sources["dense:use"]


def test_bare_kind_is_zero_when_the_first_model_missed_the_candidate():
    out = fuse([Leg("dense:use", [win("a", ("1",))]), Leg("dense:e5", [win("b", ("2",))])])
    b = next(c for c in out if c.id == "b")
    assert b.sources["dense"].rank == 0 and b.sources["dense:e5"].rank == 1


def test_full_text_match_joins_the_window_of_any_model():
    w = win("w", ("m1", "m2"))
    out = fuse([Leg("fts", [msg("m2")], windows=[w]), Leg("dense:use", [w])])
    (c,) = out
    assert c.kind == "window" and c.matched_message_ids == ["m2"]
    assert c.sources["fts"].rank == 1 and c.sources["dense"].rank == 1


def test_a_match_joins_full_texts_own_window_whatever_other_legs_ran():
    # Another model's window also holds m0 and its leg comes first: m0 still joins the
    # window full text brought (the first model's), so a leg's presence (or a weight of 0)
    # never moves a match to another candidate. Found by the weight-0 property.
    own, other = win("use/1", ("m0",)), win("e5/1", ("m0", "m1"))
    fts = Leg("fts", [msg("m0")], windows=[own, other])
    for legs in (
        [Leg("dense:e5", [other]), fts],
        [fts],
        [Leg("dense:e5", [other]), fts, Leg("dense:use", [own])],
    ):
        (holder,) = [c for c in fuse(legs) if c.matched_message_ids]
        assert holder.message_ids == ("m0",) and holder.matched_message_ids == ["m0"]


def test_full_text_window_without_a_match_is_not_a_candidate():
    out = fuse([Leg("fts", [msg("m9")], windows=[win("w", ("m1",))])])
    assert [(c.kind, c.id) for c in out] == [("message", "m9")]


def test_message_not_swept_stands_alone_and_full_text_ranks_it():
    out = fuse([Leg("fts", [msg("new")]), Leg("dense:use", [win("w", ("m1",))])], weights={"dense": 0.5})
    assert [(c.kind, c.id) for c in out] == [("message", "new"), ("window", "w")]


def test_weighted_normalises_each_leg_min_max():
    assert minmax([3.0, 2.0, 1.0]) == [1.0, 0.5, 0.0]
    assert minmax([0.4]) == [1.0] and minmax([2.0, 2.0]) == [1.0, 1.0] and minmax([]) == []
    a, b, c = win("a", ("1",), 0.9), win("b", ("2",), 0.6), win("c", ("3",), 0.5)
    out = fuse(
        [Leg("fts", [msg("3", score=0.2)], windows=[c]), Leg("dense:use", [a, b, c])],
        method="weighted",
        weights={"fts": 0.5, "dense": 1.0},
    )
    fused = {x.id: x.fused for x in out}
    assert fused == pytest.approx({"a": 1.0, "b": 0.25, "c": 0.5})
    assert ids(out) == ["a", "c", "b"]


def test_weighted_keeps_the_margin_rrf_discards():
    # Dense: a far ahead of b. Full text: b only, a low-weight leg.
    a, b, z = win("a", ("1",), 0.9), win("b", ("2",), 0.3), win("z", ("3",), 0.2)
    legs = [Leg("fts", [msg("2")], windows=[b]), Leg("dense:use", [a, b, z])]
    assert ids(fuse(legs, method="rrf"))[0] == "b"
    assert ids(fuse(legs, method="weighted", weights={"fts": 0.5}))[0] == "a"


def test_weights_default_by_kind_and_exact_source_wins():
    assert weight_of("dense:use", None) == DEFAULT_WEIGHTS["dense"]
    assert weight_of("dense:use", {"dense": 0.3}) == 0.3
    assert weight_of("dense:use", {"dense": 0.3, "dense:use": 2.0}) == 2.0
    assert weight_of("sparse:bge", {"fts": 0}) == DEFAULT_WEIGHTS["sparse"]


def test_parse_weights():
    assert parse_weights("fts=0.5, dense=1,dense:use-multilingual-v3=1.2") == {
        "fts": 0.5,
        "dense": 1.0,
        "dense:use-multilingual-v3": 1.2,
    }
    assert parse_weights("") == {}
    for bad in ("fts", "bm25=1", "fts=x", "fts=-1", "dense=nan", "dense:=1", "=1"):
        with pytest.raises(ValueError):
            parse_weights(bad)


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="fusion method"):
        fuse([Leg("fts", [msg("a")])], method="borda")


def test_no_legs_no_candidates():
    assert fuse([]) == [] and fuse([Leg("fts", [])]) == []


def test_legs_are_the_one_call():
    """fuse takes legs only: the older positional call (rows, dense, sparse, windows) is gone."""
    import pytest

    w = win("w1", ("m1", "m2"))
    with pytest.raises(TypeError):
        fuse([msg("m2")], [w], (), [w], method="rrf")  # type: ignore[misc]  # the removed call
    (c,) = fuse(
        [Leg("fts", [msg("m2")], (w,)), Leg("dense", [w]), Leg("sparse", [])],
        method="rrf",
        weights={"fts": 1.0},
    )
    assert c.fused == 2 / (RRF_K + 1) and c.sources["fts"].rank == 1 and c.sources["sparse"].rank == 0


# --- properties -----------------------------------------------------------------------


def _key(c) -> tuple[str, ...]:
    return (c.kind, *c.message_ids) if c.kind == "window" else ("message", c.id)


@settings(max_examples=300, deadline=None)
@given(legs_strategy(), st.sampled_from(METHODS), st.dictionaries(
    st.sampled_from(["fts", "dense", "sparse", "dense:use", "dense:e5"]), st.floats(0, 3), max_size=3
))  # fmt: skip
def test_fusion_never_drops_a_candidate_and_is_deterministic(legs, method, weights):
    out = fuse(legs, method=method, weights=weights)
    keys = [_key(c) for c in out]
    assert len(set(keys)) == len(out)
    # Every window any leg ranked is a candidate (windows over the same messages are one).
    ranked_windows = {
        ("window", *w.source_message_ids) for leg in legs for w in leg.rows if isinstance(w, WindowRow)
    }
    assert ranked_windows <= set(keys)
    # Every full-text match is in exactly one candidate, which lists it as matched.
    fts = next(leg for leg in legs if leg.kind == "fts")
    for m in fts.rows:
        (holder,) = [c for c in out if m.id in c.matched_message_ids]
        assert m.id in holder.message_ids and holder.sources["fts"].rank > 0
    # Nothing else: every candidate was ranked by some leg.
    assert all(any(s.rank for s in c.sources.values()) for c in out)
    assert all(a.fused >= b.fused for a, b in itertools.pairwise(out))
    # The same input, weights given in another order: the same order out.
    again = fuse(list(legs), method=method, weights=dict(reversed(list(weights.items()))))
    assert ids(again) == ids(out)


@settings(max_examples=300, deadline=None)
@given(legs_strategy(), st.sampled_from(METHODS), st.data())
def test_a_weight_of_zero_removes_the_legs_influence(legs, method, data):
    gone = data.draw(st.sampled_from([leg.source for leg in legs]))
    if gone == "fts":  # full text decides which windows a message joins: keep its rows, weigh 0
        return
    zero = fuse(legs, method=method, weights={gone: 0.0})
    without = fuse([leg for leg in legs if leg.source != gone], method=method)
    kept = {_key(c) for c in without}
    assert [_key(c) for c in zero if _key(c) in kept] == [_key(c) for c in without]
    # Candidates only the zero-weight leg returned come last, with a fused score of 0.
    extra = [c for c in zero if _key(c) not in kept]
    assert zero[len(without) :] == extra and all(c.fused == 0 for c in extra)


@settings(max_examples=300, deadline=None)
@given(legs_strategy(), st.sampled_from(METHODS))
def test_one_leg_fusion_is_that_legs_order(legs, method):
    for leg in legs:
        if leg.kind == "fts":
            continue
        out = fuse([leg], method=method)
        assert [c.id for c in out] == [w.id for w in leg.rows]


def test_ties_are_deterministic_by_best_rank_then_recency_then_id():
    # Two legs, each with one window at rank 1: equal scores, newest first, then id.
    out = fuse(
        [Leg("dense:use", [win("old", ("1",), minute=0)]), Leg("dense:e5", [win("new", ("2",), minute=5)])]
    )
    assert ids(out) == ["new", "old"]
    out = fuse([Leg("dense:use", [win("b", ("1",))]), Leg("dense:e5", [win("a", ("2",))])])
    assert ids(out) == ["a", "b"]
    # Equal normalised scores within one leg: the leg's order.
    out = fuse(
        [Leg("dense:use", [win("x", ("1",), 0.5), win("y", ("2",), 0.5, minute=9)])], method="weighted"
    )
    assert ids(out) == ["x", "y"]


@settings(max_examples=200, deadline=None)
@given(legs_strategy(), st.sampled_from(METHODS), st.integers(0, 12))
def test_keep_is_the_head_of_the_whole_fusion(legs, method, keep):
    whole = fuse(legs, method=method)
    head = fuse(legs, method=method, keep=keep)
    assert [(_key(c), c.fused, c.sources, c.matched_message_ids) for c in head] == [
        (_key(c), c.fused, c.sources, c.matched_message_ids) for c in whole[:keep]
    ]
