"""Hybrid fusion (RRF, DBSF), without a database."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dwsearch.index.documents import Hit, StoredDocument
from dwsearch.index.reads import fuse_hits
from dwsearch.retrieval.fusion import DBSF_DEGENERATE_SCORE, RRF_K, Fusion, dbsf, dbsf_normalize, rrf


def test_rrf_uses_search_constant():
    assert rrf([[("a", 0.9)]]) == [("a", 1 / (RRF_K + 1))]


def test_rrf_sums_reciprocal_ranks_over_sources():
    dense = [("a", 0.9), ("b", 0.8), ("c", 0.1)]
    sparse = [("c", 12.0), ("a", 3.0)]
    fused = dict(rrf([dense, sparse]))
    assert fused["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert fused["b"] == pytest.approx(1 / 62)
    assert fused["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert [doc_id for doc_id, _ in rrf([dense, sparse])] == ["a", "c", "b"]


def test_rrf_from_rank_0_scores_a_first_place_in_both_sources_2_over_60():
    # Upstash's RRF, which the Index uses: its SDK suites expect 0.033333335 and
    # 0.032795697 (first in both; first in one and third in the other)
    dense, sparse = [("a", 0.9), ("b", 0.8), ("c", 0.1)], [("a", 5.0), ("c", 1.0)]
    assert dict(rrf([dense, sparse], first_rank=0)) == pytest.approx(
        {"a": 2 / 60, "c": 1 / 62 + 1 / 61, "b": 1 / 61}
    )
    assert fuse_hits_scores(dense, [("c", 2.0), ("x", 1.0), ("a", 0.5)]) == pytest.approx(
        {"c": 1 / 62 + 1 / 60, "a": 1 / 60 + 1 / 62, "b": 1 / 61, "x": 1 / 61}
    )


def fuse_hits_scores(dense, sparse):
    def hits(source):
        return [Hit(StoredDocument(doc_id), score) for doc_id, score in source]

    return {h.document.id: h.score for h in fuse_hits(hits(dense), hits(sparse), Fusion.RRF)}


def test_rrf_ignores_scores_and_breaks_ties_by_id():
    assert rrf([[("b", 100.0)], [("a", 0.001)]]) == [("a", 1 / 61), ("b", 1 / 61)]


def test_rrf_counts_a_repeated_id_once_at_its_best_rank():
    assert rrf([[("a", 1.0), ("b", 0.5), ("a", 0.1)]]) == [("a", 1 / 61), ("b", 1 / 62)]


def test_dbsf_normalizes_by_mean_plus_minus_three_sigma():
    scores = [1.0, 2.0, 3.0]  # mean 2, sigma sqrt(2/3)
    sigma = math.sqrt(2 / 3)
    low, high = 2 - 3 * sigma, 2 + 3 * sigma
    assert dbsf_normalize(scores) == pytest.approx([(s - low) / (high - low) for s in scores])
    assert dbsf_normalize(scores)[1] == pytest.approx(0.5)


def test_dbsf_clips_outliers_to_the_unit_interval():
    normalized = dbsf_normalize([0.0] * 20 + [100.0, -100.0])
    assert normalized[-2] == 1.0 and normalized[-1] == 0.0
    assert all(0.0 <= n <= 1.0 for n in normalized)


def test_dbsf_degenerate_source_scores_the_middle():
    assert dbsf_normalize([0.7]) == [DBSF_DEGENERATE_SCORE]
    assert dbsf_normalize([2.0, 2.0]) == [DBSF_DEGENERATE_SCORE] * 2
    assert dbsf_normalize([]) == []


def test_dbsf_sums_each_sources_normalized_scores():
    dense = [("a", 0.81), ("b", 0.80), ("c", 0.79)]
    sparse = [("c", 9.0), ("a", 1.0), ("d", 0.9)]
    fused = dict(dbsf([dense, sparse]))
    assert fused == pytest.approx(
        {
            "a": dbsf_normalize([0.81, 0.80, 0.79])[0] + dbsf_normalize([9.0, 1.0, 0.9])[1],
            "b": dbsf_normalize([0.81, 0.80, 0.79])[1],
            "c": dbsf_normalize([0.81, 0.80, 0.79])[2] + dbsf_normalize([9.0, 1.0, 0.9])[0],
            "d": dbsf_normalize([9.0, 1.0, 0.9])[2],
        }
    )
    assert [doc_id for doc_id, _ in dbsf([dense, sparse])] == ["a", "c", "b", "d"]


def test_dbsf_keeps_margins_that_rrf_discards():
    # Sparse puts c far ahead of a crowd; dense barely prefers a over c. RRF sees two
    # first places and ties a with c; DBSF lets sparse's margin decide.
    dense = [("a", 0.80), ("c", 0.79), *((f"x{i}", 0.2) for i in range(8))]
    sparse = [("c", 30.0), ("a", 1.1), *((f"y{i}", 1.0) for i in range(8))]
    assert rrf([dense, sparse])[0][1] == rrf([dense, sparse])[1][1]
    assert dbsf([dense, sparse])[0][0] == "c"


def test_dbsf_counts_a_repeated_id_once_at_its_best_score():
    assert dict(dbsf([[("a", 3.0), ("b", 1.0), ("a", 0.0)]])) == dict(dbsf([[("a", 3.0), ("b", 1.0)]]))


ranked_lists = st.lists(
    st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(-10, 10)), max_size=8), max_size=3
)


@given(ranked_lists)
def test_fusions_return_every_id_once_best_first(sources):
    ids = {doc_id for source in sources for doc_id, _ in source}
    for fused in (rrf(sources), dbsf(sources)):
        assert sorted(doc_id for doc_id, _ in fused) == sorted(ids)
        scores = [score for _, score in fused]
        assert scores == sorted(scores, reverse=True)
    assert all(0.0 <= score <= len(sources) for _, score in dbsf(sources))
