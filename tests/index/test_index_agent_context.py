"""BuildAgentContext over real gRPC and Postgres: the three section queries, the reranked
variant, and the stated fallback when the reranker is down, slow or not configured."""

from __future__ import annotations

import math

import grpc
import pytest
from prometheus_client import REGISTRY

from dwsearch.index.service import from_struct, to_struct
from dwsearch.v1 import index_pb2 as pb
from dwsearch.v1 import search_pb2
from dwsearch_testkit.fakes import Failure, FakeReranker

MESSAGE = "refund for broken blender"


def doc(doc_id: str, data: str, **metadata) -> pb.Document:
    return pb.Document(id=doc_id, data=data, metadata=to_struct(metadata))


SHOP = [
    doc("t1", "refund for broken blender", type="conversation", appId="shop", resolution="refund"),
    doc("t2", "blender broken refund please", type="conversation", appId="shop", resolution="escalated"),
    doc("t3", "where is my parcel", type="conversation", appId="shop"),
    doc("t4", "refund approved for the blender", type="conversation", appId="shop", resolution="info"),
    doc("t5", "blender arrived broken", type="conversation", appId="shop", resolution="transfer"),
    *(
        doc(f"k{i}", f"knowledge article {i} about blender care", type="knowledge", appId="shop")
        for i in range(6)
    ),
    doc("r1", "we refunded your blender", type="response", appId="shop", trustScore=0.9),
    doc("r2", "refund blender", type="response", appId="shop", trustScore=0.85),
    doc("r3", "your parcel is on the way", type="response", appId="shop", trustScore=0.95),
    doc("r4", "sorry about the broken item", type="response", appId="shop", trustScore=0.99),
    doc("r5", "thanks for waiting", type="response", appId="shop", trustScore=1),
    doc("r6", "a response without a score", type="response", appId="shop"),
    # Another app's perfect matches must never appear.
    doc("o1", MESSAGE, type="conversation", appId="other", resolution="refund"),
    doc("o2", MESSAGE, type="knowledge", appId="other"),
    doc("o3", MESSAGE, type="response", appId="other", trustScore=1),
]
ELIGIBLE = {
    "similar_tickets": {"t1", "t3", "t4", "t5"},
    "knowledge": {f"k{i}" for i in range(6)},
    "good_responses": {"r1", "r3", "r4", "r5"},
}
SECTIONS = tuple(ELIGIBLE)


@pytest.fixture
async def shop(stub, fake_embedder):
    await stub.Upsert(pb.UpsertRequest(documents=SHOP))
    fake_embedder.received.clear()
    fake_embedder.calls = 0
    return stub


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def stage_counts() -> dict[str, float]:
    return {
        s: sample("dwsearch_agent_context_stage_seconds_count", stage=s)
        for s in ("embed", "retrieve", "rerank")
    }


def section_ids(response: pb.BuildAgentContextResponse) -> dict[str, list[str]]:
    return {name: [d.id for d in getattr(response, name)] for name in SECTIONS}


def scored(response: pb.BuildAgentContextResponse) -> dict[str, list[tuple[str, float]]]:
    return {name: [(d.id, d.score) for d in getattr(response, name)] for name in SECTIONS}


async def test_three_sections_of_the_app(shop, fake_embedder):
    response = await shop.BuildAgentContext(pb.BuildAgentContextRequest(message=MESSAGE, app_id="shop"))
    found = section_ids(response)
    assert [len(found[name]) for name in SECTIONS] == [3, 5, 3]
    for name in SECTIONS:
        assert set(found[name]) <= ELIGIBLE[name], name
    assert found["similar_tickets"][0] == "t1"  # the same text: first in dense and in sparse
    assert not response.reranked and not response.degraded
    ticket = response.similar_tickets[0]
    assert ticket.data == "refund for broken blender"
    assert from_struct(ticket.metadata) == {"type": "conversation", "appId": "shop", "resolution": "refund"}
    assert ticket.score == pytest.approx(2 / 60)  # RRF (ranks from 0, as Upstash), first in both sources
    # One embedding, dense and sparse, for all three queries.
    assert fake_embedder.calls == 1 and fake_embedder.received == [MESSAGE]


async def test_app_ids_with_quotes_are_plain_values(stub):
    await stub.Upsert(
        pb.UpsertRequest(
            documents=[
                doc("a", "blender", type="knowledge", appId="it's"),
                doc("b", "blender", type="knowledge", appId="x' OR appId != 'y"),
            ]
        )
    )
    for app_id, expected in [("it's", ["a"]), ("x' OR appId != 'y", ["b"]), ("x' OR 1=1 --", [])]:
        response = await stub.BuildAgentContext(pb.BuildAgentContextRequest(message="blender", app_id=app_id))
        assert [d.id for d in response.knowledge] == expected


async def test_an_app_without_documents_has_empty_sections(shop):
    for rerank in (False, True):
        response = await shop.BuildAgentContext(
            pb.BuildAgentContextRequest(message=MESSAGE, app_id="nobody", rerank=rerank)
        )
        assert section_ids(response) == {name: [] for name in SECTIONS}


async def test_rerank_orders_by_the_reranker_and_splits_its_top_ten(
    shop, make_stub, fake_reranker, fake_embedder
):
    stub = await make_stub(reranker=fake_reranker.address)
    before = stage_counts()
    response = await stub.BuildAgentContext(
        pb.BuildAgentContextRequest(message=MESSAGE, app_id="shop", rerank=True)
    )
    assert response.reranked and not response.degraded
    assert fake_reranker.calls == 1 and fake_embedder.calls == 1
    assert {k: v - before[k] for k, v in stage_counts().items()} == {"embed": 1, "retrieve": 1, "rerank": 1}
    by_id = {d.id: d.data for d in SHOP}
    everything = []
    for name in SECTIONS:
        results = getattr(response, name)
        assert {d.id for d in results} <= ELIGIBLE[name]
        for d in results:  # the reranker's score (sigmoid of its raw score)
            assert d.score == pytest.approx(
                1 / (1 + math.exp(-FakeReranker.raw_score(MESSAGE, by_id[d.id]))), rel=1e-5
            )
        assert [d.score for d in results] == sorted((d.score for d in results), reverse=True)
        everything += results
    # The ten best of all eligible documents by the reranker's score, then split.
    ranked = sorted(
        (FakeReranker.raw_score(MESSAGE, by_id[i]) for s in ELIGIBLE.values() for i in s), reverse=True
    )
    assert len(everything) <= 10
    assert min(FakeReranker.raw_score(MESSAGE, by_id[d.id]) for d in everything) >= ranked[9]
    assert response.similar_tickets[0].id == "t1"


async def test_rerank_top_ten_can_leave_sections_short(stub, make_stub, fake_reranker):
    documents = [
        doc(f"k{i:02d}", f"refund broken blender guide {i}", type="knowledge", appId="x") for i in range(12)
    ]
    documents += [
        doc(f"t{i}", f"parcel tracking number {i}", type="conversation", appId="x") for i in range(3)
    ]
    documents += [
        doc(f"r{i}", f"thanks for waiting {i}", type="response", appId="x", trustScore=0.9) for i in range(3)
    ]
    await stub.Upsert(pb.UpsertRequest(documents=documents))
    plain = await stub.BuildAgentContext(
        pb.BuildAgentContextRequest(message="refund broken blender", app_id="x")
    )
    assert [len(v) for v in section_ids(plain).values()] == [3, 5, 3]
    reranking = await make_stub(reranker=fake_reranker.address)
    reranked = await reranking.BuildAgentContext(
        pb.BuildAgentContextRequest(message="refund broken blender", app_id="x", rerank=True)
    )
    # The reranker's ten best are all knowledge articles: five are shown, nothing else.
    assert [len(v) for v in section_ids(reranked).values()] == [0, 5, 0]


@pytest.mark.parametrize(
    "failure, reason",
    [
        (
            Failure(grpc.StatusCode.UNAVAILABLE, "reranker pod gone"),
            search_pb2.DEGRADATION_REASON_RERANKER_UNAVAILABLE,
        ),
        (
            Failure(grpc.StatusCode.INTERNAL, "model produced NaN"),
            search_pb2.DEGRADATION_REASON_RERANKER_UNAVAILABLE,
        ),
        (None, search_pb2.DEGRADATION_REASON_RERANKER_TIMEOUT),
    ],
)
async def test_reranker_failure_falls_back_to_the_unreranked_context(
    shop, make_stub, fake_reranker, fake_embedder, failure, reason
):
    plain = await shop.BuildAgentContext(pb.BuildAgentContextRequest(message=MESSAGE, app_id="shop"))
    if failure is None:
        fake_reranker.delay = 1.0
    else:  # UNAVAILABLE is retried by the client: fail every attempt
        fake_reranker.failures.extend([failure] * 4)
    stub = await make_stub(reranker=fake_reranker.address, rerank_timeout=0.2 if failure is None else 5.0)
    fake_embedder.calls = 0
    label = search_pb2.DegradationReason.Name(reason).removeprefix("DEGRADATION_REASON_").lower()
    degraded_before, stages_before = (
        sample("dwsearch_agent_context_degraded_total", reason=label),
        stage_counts(),
    )
    response = await stub.BuildAgentContext(
        pb.BuildAgentContextRequest(message=MESSAGE, app_id="shop", rerank=True)
    )
    assert scored(response) == scored(plain)
    assert not response.reranked and response.degraded
    assert [d.reason for d in response.degradations] == [reason]
    assert fake_embedder.calls == 1  # the fallback reuses the embedding
    assert sample("dwsearch_agent_context_degraded_total", reason=label) == degraded_before + 1
    # embed once; retrieve for the candidates and again for the fallback; the failed rerank timed
    assert {k: v - stages_before[k] for k, v in stage_counts().items()} == {
        "embed": 1,
        "retrieve": 2,
        "rerank": 1,
    }


async def test_rerank_without_a_reranker_is_the_unreranked_context(shop):
    plain = await shop.BuildAgentContext(pb.BuildAgentContextRequest(message=MESSAGE, app_id="shop"))
    response = await shop.BuildAgentContext(
        pb.BuildAgentContextRequest(message=MESSAGE, app_id="shop", rerank=True)
    )
    assert scored(response) == scored(plain)
    assert response.degraded and not response.reranked
    (degradation,) = response.degradations
    assert degradation.reason == search_pb2.DEGRADATION_REASON_RERANKER_NOT_CONFIGURED


async def test_dense_only_model_still_builds_context(shop, make_stub, fake_embedder):
    fake_embedder.sparse_supported = False
    stub = await make_stub()
    response = await stub.BuildAgentContext(pb.BuildAgentContextRequest(message=MESSAGE, app_id="shop"))
    assert section_ids(response)["similar_tickets"][0] == "t1"
    assert response.similar_tickets[0].score == pytest.approx(1.0, abs=1e-2)  # inner product, not fused


async def test_embedder_down_is_unavailable(shop, make_stub):
    stub = await make_stub(embedder="127.0.0.1:9")
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.BuildAgentContext(pb.BuildAgentContextRequest(message=MESSAGE, app_id="shop"))
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
