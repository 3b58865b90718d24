"""Explained hits (SearchRequest.explain, SimilarRequest.explain): every leg that found a
hit with its rank, raw and normalised score and weight, the fused score, the reranker's
score, and each stage's time. The explanation recomputes the fused scores and the hit
order exactly (a property over random legs, against dwsearch.search.fusion); off by
default, and then nothing of it is sent."""

from datetime import timedelta

import pytest
from fusion_legs import legs_strategy
from hypothesis import given, settings
from hypothesis import strategies as st

from dwsearch.retrieval.fusion import RRF_K, Fusion, minmax
from dwsearch.search.fusion import METHODS, fuse, weight_of
from dwsearch.v1 import search_pb2 as pb
from dwsearch_testkit.fakes import FAKE_MODEL
from dwsearch_testkit.seed import T0

DENSE, SPARSE = f"dense:{FAKE_MODEL}", f"sparse:{FAKE_MODEL}"
WEIGHTS = st.dictionaries(
    st.sampled_from(["fts", "dense", "sparse", "dense:use", "dense:e5", "sparse:bge"]),
    st.floats(0, 3),
    max_size=3,
)


def order_key(fused: float, legs, end: float, ident: str) -> tuple:
    """A hit's place from its explanation alone (fusion's documented order): best fused
    score, then the best rank among the legs of weight > 0 (hits only weight-0 legs found
    after every other, by their best rank), then the newest, then id."""
    weighted = [leg.rank for leg in legs if leg.weight > 0]
    if weighted:
        return (-fused, 0, min(weighted), -end, ident)
    return (-fused, 1, min(leg.rank for leg in legs), -end, ident)


@settings(max_examples=300, deadline=None)
@given(legs_strategy(), st.sampled_from(METHODS), WEIGHTS)
def test_the_explanation_recomputes_the_fused_scores_and_the_order(legs, method, weights):
    out = fuse(legs, method=method, weights=weights, explain=True)
    plain = fuse(legs, method=method, weights=weights)
    assert [(c.id, c.fused) for c in out] == [(c.id, c.fused) for c in plain]  # explaining changes nothing
    assert all(c.explanation == () for c in plain)
    leg_order = [leg.source for leg in legs]
    for c in out:
        parts = c.explanation
        assert parts, c.id  # every candidate was found by some leg
        # Each leg that found it once, in leg order; rank and raw score as in its sources.
        sources = [p.source for p in parts]
        assert sources == sorted(set(sources), key=leg_order.index)
        for p in parts:
            assert (p.rank, p.score) == tuple(c.sources[p.source]) and p.rank > 0
            assert p.weight == weight_of(p.source, weights)
            if method == Fusion.RRF:
                assert p.normalized == 1 / (RRF_K + p.rank)
        # The fused score is the weighted sum, exactly (the same additions, in leg order).
        assert c.fused == sum(p.weight * p.normalized for p in parts)
    if method == Fusion.WEIGHTED:
        # Min-max over each leg's list: recomputed from the raw scores of what it found.
        for source in leg_order:
            found = [p for c in out for p in c.explanation if p.source == source]
            assert [p.normalized for p in found] == minmax([p.score for p in found])
    keys = [order_key(c.fused, c.explanation, c.end.timestamp(), c.id) for c in out]
    assert keys == sorted(keys)


@settings(max_examples=100, deadline=None)
@given(legs_strategy(), st.sampled_from(METHODS), WEIGHTS, st.integers(0, 12))
def test_kept_candidates_carry_the_whole_fusions_explanation(legs, method, weights, keep):
    whole = fuse(legs, method=method, weights=weights, explain=True)
    head = fuse(legs, method=method, weights=weights, explain=True, keep=keep)
    assert [(c.id, c.explanation) for c in head] == [(c.id, c.explanation) for c in whole[:keep]]


# --- over gRPC --------------------------------------------------------------------------------


def stages(response) -> list[str]:
    return [s.stage for s in response.stage_times]


def assert_explained(response):
    """Each hit's explanation recomputes its fused score and the response's order."""
    keys = []
    for hit in response.hits:
        e = hit.explanation
        assert e.legs and e.fused_score == pytest.approx(
            sum(p.weight * p.normalized_score for p in e.legs), abs=0
        )
        for p in e.legs:
            assert p.rank == hit.sources[p.leg].rank and p.raw_score == pytest.approx(
                hit.sources[p.leg].score
            )
        if not e.HasField("rerank_score"):
            assert hit.score == pytest.approx(e.fused_score)
        keys.append(order_key(e.fused_score, e.legs, hit.end_time.ToDatetime(T0.tzinfo).timestamp(), hit.id))
    return keys


async def test_search_explains_every_leg_of_every_hit(corpus, search_stub):
    both, _ = corpus.window("org-a", "c1", ["where is my parcel", "order 5521"])
    corpus.window("org-a", "c2", ["parcel delivered late"], start=T0 + timedelta(hours=1))
    corpus.window("org-a", "c3", ["nothing alike"], start=T0 + timedelta(hours=2))
    corpus.messages("org-a", "c4", ["where is my parcel now"], start=T0 + timedelta(hours=3))
    response = await search_stub.Search(
        pb.SearchRequest(org_id="org-a", query="where is my parcel", explain=True, context_messages=1),
        timeout=5,
    )
    keys = assert_explained(response)
    assert keys == sorted(keys)
    top = response.hits[0]
    assert top.id == both and [p.leg for p in top.explanation.legs] == [DENSE, SPARSE, "fts"]
    fts = next(p for p in top.explanation.legs if p.leg == "fts")
    assert fts.weight == 0.5 and fts.normalized_score == 1.0  # DEFAULT_WEIGHTS, its best match
    message = next(h for h in response.hits if h.kind == pb.HIT_KIND_MESSAGE)
    assert [p.leg for p in message.explanation.legs] == ["fts"]
    assert {f"embed:{FAKE_MODEL}", DENSE, SPARSE, "fts", "fuse", "context"} <= set(stages(response))
    assert all(s.duration.ToNanoseconds() > 0 for s in response.stage_times)


async def test_rrf_explains_reciprocal_ranks(corpus, search_stub):
    corpus.window("org-a", "c1", ["refund please"])
    corpus.window("org-a", "c2", ["refund now"], start=T0 + timedelta(hours=1))
    response = await search_stub.Search(
        pb.SearchRequest(
            org_id="org-a",
            query="refund",
            explain=True,
            fusion=pb.SEARCH_FUSION_RRF,
            fusion_weights={"dense": 2},
        ),
        timeout=5,
    )
    keys = assert_explained(response)
    assert keys == sorted(keys)
    for hit in response.hits:
        for p in hit.explanation.legs:
            assert p.normalized_score == 1 / (RRF_K + p.rank)
            assert p.weight == {"dense": 2.0, "sparse": 1.0, "fts": 0.5}[p.leg.split(":")[0]]


async def test_explain_is_off_by_default(corpus, search_stub):
    anchor, _ = corpus.window("org-a", "c1", ["refund please"])
    corpus.window("org-a", "c2", ["refund now"], start=T0 + timedelta(hours=1))
    response = await search_stub.Search(pb.SearchRequest(org_id="org-a", query="refund"), timeout=5)
    assert len(response.hits) == 2 and not any(h.HasField("explanation") for h in response.hits)
    assert list(response.stage_times) == []
    similar = await search_stub.Similar(pb.SimilarRequest(org_id="org-a", window_id=anchor), timeout=5)
    assert len(similar.hits) == 1 and not similar.hits[0].HasField("explanation")
    assert list(similar.stage_times) == []


async def test_a_reranked_hit_carries_the_rerankers_score(corpus, make_searcher, serve_search, fake_reranker):
    corpus.window("org-a", "c1", ["refund"], start=T0 + timedelta(hours=2))
    corpus.window("org-a", "c2", ["refund for my broken blender please"])
    stub = (await serve_search(make_searcher(reranker=fake_reranker.address))).stub
    response = await stub.Search(
        pb.SearchRequest(org_id="org-a", query="refund broken blender", rerank=True, explain=True), timeout=5
    )
    assert response.reranked and "rerank" in stages(response)
    assert_explained(response)
    for hit in response.hits:
        assert hit.explanation.HasField("rerank_score") and hit.score == pytest.approx(
            hit.explanation.rerank_score
        )
        assert hit.explanation.fused_score > 0


async def test_full_text_mode_explains_its_one_leg(corpus, search_stub):
    corpus.messages("org-a", "c1", ["refund please", "refund refund"])
    response = await search_stub.Search(
        pb.SearchRequest(org_id="org-a", query="refund", mode=pb.SEARCH_MODE_FTS, explain=True), timeout=5
    )
    assert len(response.hits) == 2
    assert all([p.leg for p in h.explanation.legs] == ["fts"] for h in response.hits)
    assert stages(response) == ["fts"]


async def test_similar_explains_its_legs_and_stages(corpus, search_stub):
    anchor, _ = corpus.window("org-a", "c1", ["refund please", "order 5521"])
    corpus.window("org-a", "c2", ["refund please"], start=T0 + timedelta(hours=1))
    corpus.window("org-a", "c3", ["order 5521 refund"], start=T0 + timedelta(hours=2))
    stored = await search_stub.Similar(
        pb.SimilarRequest(org_id="org-a", window_id=anchor, explain=True), timeout=5
    )
    keys = assert_explained(stored)
    assert keys == sorted(keys) and len(stored.hits) == 2
    assert {p.leg for h in stored.hits for p in h.explanation.legs} == {DENSE, SPARSE}
    assert set(stages(stored)) == {"conversation", DENSE, SPARSE, "fuse"}

    [open_id] = corpus.messages("org-a", "live", ["refund please"], start=T0 + timedelta(days=1))
    embedded = await search_stub.Similar(
        pb.SimilarRequest(org_id="org-a", message_id=open_id, explain=True), timeout=5
    )
    assert f"embed:{FAKE_MODEL}" in stages(embedded) and list(embedded.embedded_models) == [FAKE_MODEL]
    assert_explained(embedded)
