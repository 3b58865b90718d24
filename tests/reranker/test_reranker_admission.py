"""The reranker's door and lanes: huge requests refused before tokenizing, a search's
rerank still answered right after, priorities validated and followed."""

from __future__ import annotations

import grpc
import pytest
from model_servers import reranker_server
from prometheus_client import REGISTRY

from dwsearch.modelserver.batching import Lane
from dwsearch.v1 import embedder_pb2 as pb_embedder
from dwsearch.v1 import reranker_pb2 as pb
from dwsearch.v1 import reranker_pb2_grpc as pb_grpc
from dwsearch_reranker.engine import RerankLimits


async def test_a_huge_request_is_refused_and_a_search_rerank_gets_in_right_after(tiny_reranker):
    async with reranker_server(tiny_reranker) as (engine, channel):
        stub = pb_grpc.RerankerServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as bytes_over:
            await stub.Rerank(pb.RerankRequest(query="refund", documents=["x" * 100_000] * 512), timeout=30)
        assert bytes_over.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "bytes of text per call" in bytes_over.value.details()
        async with reranker_server(tiny_reranker, RerankLimits(max_queue_tokens=10_000)) as (_, small):
            with pytest.raises(grpc.aio.AioRpcError) as tokens_over:
                request = pb.RerankRequest(query="refund " * 50, documents=["word " * 100] * 100)
                await pb_grpc.RerankerServiceStub(small).Rerank(request, timeout=30)
        assert tokens_over.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "queue budget" in tokens_over.value.details()
        answer = await stub.Rerank(
            pb.RerankRequest(query="refund", documents=["refund issued", "hello"]), timeout=30
        )
        assert len(answer.results) == 2
        assert engine._admission.reserved == 0


@pytest.mark.parametrize(
    "priority,lane",
    [
        (pb_embedder.PRIORITY_UNSPECIFIED, Lane.INTERACTIVE),
        (pb_embedder.PRIORITY_INTERACTIVE, Lane.INTERACTIVE),
        (pb_embedder.PRIORITY_BULK, Lane.BULK),
    ],
)
async def test_priority_picks_the_lane(tiny_reranker, priority, lane):
    async with reranker_server(tiny_reranker) as (engine, channel):
        # Batches that ran in each lane, read from this model's queue-wait series.
        labels = {"model": engine.info.model_id}
        count = "dwsearch_reranker_queue_wait_seconds_count"
        before = {
            each: REGISTRY.get_sample_value(count, {**labels, "lane": each.value}) or 0.0 for each in Lane
        }
        request = pb.RerankRequest(query="q", documents=["d"], priority=priority)
        await pb_grpc.RerankerServiceStub(channel).Rerank(request, timeout=30)
        after = {
            each: REGISTRY.get_sample_value(count, {**labels, "lane": each.value}) or 0.0 for each in Lane
        }
    assert {each: after[each] - before[each] for each in Lane} == {each: float(each is lane) for each in Lane}


async def test_an_unknown_priority_is_an_invalid_argument(tiny_reranker):
    async with reranker_server(tiny_reranker) as (_, channel):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await pb_grpc.RerankerServiceStub(channel).Rerank(
                pb.RerankRequest(query="q", documents=["d"], priority=5), timeout=10
            )
    assert (
        error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        and "unknown priority 5" in error.value.details()
    )
