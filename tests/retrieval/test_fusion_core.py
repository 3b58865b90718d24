"""The retrieval core's fusion (dwsearch.retrieval.fusion.fuse_legs): the one RRF, min-max
and DBSF both chat search and the Index fuse through; each caller keys and orders."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dwsearch.retrieval.fusion import (
    RRF_K,
    Fusion,
    FusionLeg,
    dbsf_normalize,
    fuse_legs,
    leg_terms,
    minmax,
    rrf_term,
)


def test_rrf_counts_the_best_rank_at_the_base_given():
    leg = FusionLeg("dense", [("a", 1, 0.9), ("b", 2, 0.5)])
    cormack = fuse_legs([leg], Fusion.RRF).scores
    upstash = fuse_legs([leg], Fusion.RRF, first_rank=0).scores
    assert cormack == {"a": 1 / (RRF_K + 1), "b": 1 / (RRF_K + 2)}
    assert upstash == {"a": 1 / RRF_K, "b": 1 / (RRF_K + 1)}


def test_a_key_listed_again_counts_once_at_its_first_rank_and_best_score():
    leg = FusionLeg("fts", [("a", 1, 0.2), ("b", 2, 0.5), ("a", 3, 0.9)])
    fused = fuse_legs([leg], Fusion.DBSF, explain=True)
    (part,) = fused.parts["a"]
    assert (part.rank, part.score) == (1, 0.9)
    assert fuse_legs([leg], Fusion.RRF).scores["a"] == rrf_term(1)


def test_ranks_may_leave_gaps_and_rrf_uses_them_as_given():
    leg = FusionLeg("fts", [("a", 1, 1.0), ("b", 4, 0.5)])
    assert fuse_legs([leg], Fusion.RRF).scores["b"] == rrf_term(4)


def test_a_leg_of_weight_zero_keeps_its_keys_and_adds_nothing():
    dense = FusionLeg("dense", [("a", 1, 0.9)])
    fts = FusionLeg("fts", [("b", 1, 3.0), ("a", 2, 1.0)], weight=0.0)
    fused = fuse_legs([dense, fts], Fusion.WEIGHTED)
    assert fused.scores == {"a": 1.0, "b": 0.0}


def test_leg_terms_are_the_methods_primitives():
    ranks, scores = [1, 2, 5], [3.0, 2.0, -1.0]
    assert leg_terms(Fusion.RRF, ranks, scores) == [rrf_term(r) for r in ranks]
    assert leg_terms(Fusion.WEIGHTED, ranks, scores) == minmax(scores)
    assert leg_terms(Fusion.DBSF, ranks, scores) == dbsf_normalize(scores)
    with pytest.raises(ValueError, match="fusion method"):
        leg_terms("nope", ranks, scores)  # type: ignore[arg-type]


legs_strategy = st.lists(
    st.lists(st.tuples(st.sampled_from("abcdef"), st.floats(-10, 10)), max_size=6).map(
        lambda rows: [(key, rank, score) for rank, (key, score) in enumerate(rows, start=1)]
    ),
    max_size=3,
)


@given(legs_strategy, st.sampled_from(list(Fusion)), st.lists(st.floats(0, 3), min_size=3, max_size=3))
def test_explained_parts_sum_to_each_fused_score(entries, method, weights):
    legs = [FusionLeg(f"leg{i}", rows, weights[i]) for i, rows in enumerate(entries)]
    fused = fuse_legs(legs, method, explain=True)
    assert set(fused.scores) == {key for rows in entries for key, _, _ in rows}
    for key, score in fused.scores.items():
        total = 0.0
        for part in fused.parts[key]:
            total += part.weight * part.normalized
        assert total == score  # the same sum in the same order: exact


def test_an_absolute_leg_keeps_a_weak_best_match_weak():
    """WEIGHTED min-max lifts any leg's best to 1; a leg whose scores are already a share of
    what the query could score (chat search's lexical leg) is taken as it is, clipped to
    [0, 1] and raised to its power."""
    weak = [("a", 1, 0.3), ("b", 2, 0.1)]
    relative = fuse_legs([FusionLeg("lexical", weak)], Fusion.WEIGHTED).scores
    assert relative == {"a": 1.0, "b": 0.0}
    taken = fuse_legs(
        [FusionLeg("lexical", [*weak, ("c", 3, 1.7)], absolute_power=1.0)], Fusion.WEIGHTED
    ).scores
    assert taken == pytest.approx({"a": 0.3, "b": 0.1, "c": 1.0})
    squared = fuse_legs(
        [FusionLeg("lexical", weak, weight=0.5, absolute_power=2.0)], Fusion.WEIGHTED, explain=True
    )
    assert squared.scores == pytest.approx({"a": 0.5 * 0.09, "b": 0.5 * 0.01})
    assert squared.parts["a"][0].normalized == pytest.approx(0.09)
    # RRF uses ranks alone, whatever the leg's scores.
    ranks = fuse_legs([FusionLeg("lexical", weak, absolute_power=2.0)], Fusion.RRF).scores
    assert ranks == pytest.approx({"a": 1 / 61, "b": 1 / 62})
