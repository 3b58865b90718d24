"""The clients the server uses for the model services: retries only on UNAVAILABLE, a
deadline on every call, one error type when the service is down, round robin."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from dwsearch.clients.channel import ServiceUnavailable
from dwsearch.clients.embedder import EmbedderClient
from dwsearch.clients.reranker import RerankerClient
from dwsearch.common import errors, grpchost
from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc
from dwsearch.v1 import reranker_pb2 as rpb
from dwsearch.v1 import reranker_pb2_grpc as rpb_grpc
from dwsearch_testkit.fakes import Failure, FakeEmbedder, FakeReranker
from dwsearch_testkit.net import free_port


async def test_unavailable_is_retried_for_info_and_count_tokens_only():
    """Info and CountTokens cost nothing: retried. Embed and Rerank are not, since an
    UNAVAILABLE may come after the model did the work."""
    fake = FakeEmbedder(
        info_failures=[Failure(grpc.StatusCode.UNAVAILABLE, "pod going away")],
        failures=[Failure(grpc.StatusCode.UNAVAILABLE, "pod going away")],
    )
    await fake.start()
    client = EmbedderClient(fake.address, timeout=5)
    try:
        assert (await client.info()).model_id == fake.model_id  # the first try failed
        assert (await client.count_tokens(["hello"]))[0] == [3] and fake.calls == 2  # so did this one's
        fake.failures.append(Failure(grpc.StatusCode.UNAVAILABLE, "pod going away"))
        with pytest.raises(ServiceUnavailable, match="pod going away"):
            await client.embed(["hello"])
        assert fake.embed_calls == 1
    finally:
        await client.close()
        await fake.stop()
    reranker = FakeReranker(failures=[Failure(grpc.StatusCode.UNAVAILABLE, "pod going away")])
    await reranker.start()
    rerank_client = RerankerClient(reranker.address, timeout=5)
    try:
        with pytest.raises(ServiceUnavailable, match="pod going away"):
            await rerank_client.rerank("q", ["d"])
        assert reranker.calls == 1
    finally:
        await rerank_client.close()
        await reranker.stop()


async def test_a_call_cut_off_by_the_connection_age_is_not_sent_again(monkeypatch):
    """The model service closes an aged-out connection after its grace even with a call
    still running: the call fails UNAVAILABLE, and the model must not get it twice."""
    monkeypatch.setattr(grpchost, "MAX_CONNECTION_AGE_GRACE_MS", 200)
    fake = FakeEmbedder(delay=1.5)
    host = GrpcHost(
        "127.0.0.1:0",
        [
            Service(
                "dwsearch.v1.EmbedderService",
                lambda s: pb_grpc.add_EmbedderServiceServicer_to_server(fake, s),
            )
        ],
        max_connection_age_s=0.2,
    )
    port = await host.start()
    client = EmbedderClient(f"127.0.0.1:{port}", timeout=10)
    try:
        with pytest.raises(ServiceUnavailable):
            await client.embed(["hello"])
        await asyncio.sleep(1.0)  # a retry would have arrived by now
        assert fake.embed_calls == 1
    finally:
        await client.close()
        await host.stop(0)


async def test_priorities_reach_the_model_services(fake_embedder):
    client = EmbedderClient(fake_embedder.address, timeout=5)
    reranker = FakeReranker()
    await reranker.start()
    rerank_client = RerankerClient(reranker.address, timeout=5)
    try:
        await client.embed(["q"], input_type="query")
        await client.embed(["d"])
        await client.embed(["q"], input_type="query", priority="bulk")
        await client.embed(["d"], priority="interactive")
        await rerank_client.rerank("q", ["d"])
        await rerank_client.rerank("q", ["d"], priority="bulk")
    finally:
        await client.close()
        await rerank_client.close()
        await reranker.stop()
    assert fake_embedder.priorities == [
        "PRIORITY_INTERACTIVE",
        "PRIORITY_BULK",
        "PRIORITY_BULK",
        "PRIORITY_INTERACTIVE",
    ]
    assert reranker.priorities == ["PRIORITY_INTERACTIVE", "PRIORITY_BULK"]


async def test_info_carries_runtime_and_query_latency(fake_embedder):
    fake_embedder.runtime, fake_embedder.query_latency_ms = "onnx", 187.5
    client = EmbedderClient(fake_embedder.address, timeout=5)
    try:
        info = await client.info()
    finally:
        await client.close()
    assert info.runtime == "onnx" and info.query_latency_ms == pytest.approx(187.5)


@pytest.mark.parametrize(
    "code,error",
    [
        (grpc.StatusCode.INTERNAL, errors.Internal),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.ResourceExhausted),
        (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument),
        (grpc.StatusCode.DEADLINE_EXCEEDED, errors.DeadlineExceeded),
    ],
)
async def test_other_failures_are_not_retried(code, error):
    fake = FakeEmbedder(failures=[Failure(code, "no")])
    await fake.start()
    client = EmbedderClient(fake.address, timeout=5)
    try:
        with pytest.raises(error, match="embedder: no"):
            await client.embed(["hello"])
        assert fake.calls == 1
    finally:
        await client.close()
        await fake.stop()


class DeadlineRecorder(pb_grpc.EmbedderServiceServicer):
    """Records the deadline each call arrived with."""

    def __init__(self) -> None:
        self.remaining: dict[str, float | None] = {}

    async def Embed(self, request, context):
        self.remaining["Embed"] = context.time_remaining()
        return pb.EmbedResponse(embeddings=[pb.Embedding(dense=[1.0])], dimension=1)

    async def CountTokens(self, request, context):
        self.remaining["CountTokens"] = context.time_remaining()
        return pb.CountTokensResponse(token_counts=[1], max_input_tokens=8)

    async def Info(self, request, context):
        self.remaining["Info"] = context.time_remaining()
        await asyncio.sleep(5)  # far slower than the caller's deadline
        return pb.EmbedderServiceInfoResponse()


async def test_every_call_has_a_deadline():
    servicer = DeadlineRecorder()
    host = GrpcHost(
        "127.0.0.1:0",
        [
            Service(
                "dwsearch.v1.EmbedderService",
                lambda s: pb_grpc.add_EmbedderServiceServicer_to_server(servicer, s),
            )
        ],
    )
    port = await host.start()
    client = EmbedderClient(f"127.0.0.1:{port}", timeout=2)
    try:
        await client.embed(["x"])
        await client.count_tokens(["x"])
        started = time.monotonic()
        with pytest.raises(errors.DeadlineExceeded):
            await client.info(timeout=0.2)
        assert time.monotonic() - started < 4  # the deadline, not the servicer's answer, ended it
    finally:
        await client.close()
        await host.stop(0)
    assert 1 < servicer.remaining["Embed"] < 2.1 and 1 < servicer.remaining["CountTokens"] < 2.1
    assert servicer.remaining["Info"] < 0.3


async def test_a_service_that_is_down_raises_service_unavailable_quickly():
    embedder = EmbedderClient(f"127.0.0.1:{free_port()}", timeout=5)
    reranker = RerankerClient(f"127.0.0.1:{free_port()}", timeout=5)
    started = time.monotonic()
    try:
        with pytest.raises(ServiceUnavailable, match="embedder"):
            await embedder.embed(["hello"])
        with pytest.raises(ServiceUnavailable, match="reranker"):
            await reranker.rerank("q", ["d"])
    finally:
        await embedder.close()
        await reranker.close()
    assert time.monotonic() - started < 4
    with pytest.raises(ServiceUnavailable, match="no address configured"):
        EmbedderClient("")


async def test_round_robin_spreads_calls_over_every_address():
    fakes = [FakeEmbedder(), FakeEmbedder()]
    for fake in fakes:
        await fake.start()
    client = EmbedderClient(f"ipv4:{fakes[0].address},{fakes[1].address}", timeout=5)
    try:
        for _ in range(20):
            await client.embed(["hello"])
    finally:
        await client.close()
        for fake in fakes:
            await fake.stop()
    assert fakes[0].calls >= 5 and fakes[1].calls >= 5


async def test_calls_survive_the_server_ageing_out_connections():
    fake = FakeEmbedder()
    host = GrpcHost(
        "127.0.0.1:0",
        [
            Service(
                "dwsearch.v1.EmbedderService",
                lambda s: pb_grpc.add_EmbedderServiceServicer_to_server(fake, s),
            )
        ],
        max_connection_age_s=0.2,
    )
    port = await host.start()
    client = EmbedderClient(f"127.0.0.1:{port}", timeout=5)
    try:
        deadline = time.monotonic() + 1.5  # several connection lifetimes
        while time.monotonic() < deadline:
            await client.embed(["hello"])
            await asyncio.sleep(0.01)
    finally:
        await client.close()
        await host.stop(0)
    assert fake.calls > 20


class FixedReranker(rpb_grpc.RerankerServiceServicer):
    def __init__(self) -> None:
        self.requests: list[rpb.RerankRequest] = []

    async def Rerank(self, request, context):
        self.requests.append(request)
        if request.query == "fail":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
        return rpb.RerankResponse(
            results=[rpb.RerankResult(index=1, score=0.9), rpb.RerankResult(index=0, score=0.1)]
        )


async def test_reranker_client_returns_pairs_and_maps_errors():
    servicer = FixedReranker()
    host = GrpcHost(
        "127.0.0.1:0",
        [
            Service(
                "dwsearch.v1.RerankerService",
                lambda s: rpb_grpc.add_RerankerServiceServicer_to_server(servicer, s),
            )
        ],
    )
    port = await host.start()
    client = RerankerClient(f"127.0.0.1:{port}", timeout=5)
    try:
        ranked = await client.rerank("q", ["a", "b"], top_n=2, raw_scores=True)
        assert ranked == [(1, pytest.approx(0.9)), (0, pytest.approx(0.1))]
        assert servicer.requests[0].top_n == 2 and servicer.requests[0].raw_scores
        with pytest.raises(errors.ResourceExhausted, match="reranker: queue full"):
            await client.rerank("fail", ["a"])
    finally:
        await client.close()
        await host.stop(0)
