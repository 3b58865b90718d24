"""Admission before cost and the query lane, end to end through the EmbedderService:
huge requests are refused before tokenizing, a query gets in right after them, work of
cancelled or expired requests never reaches the model, and priorities pick the lane."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Sequence

import grpc
import numpy as np
import pytest
from model_servers import GatedEmbedding, LoadedEmbedding, embedder_server
from prometheus_client import REGISTRY

from dwsearch.common.errors import DeadlineExceeded
from dwsearch.modelserver.admission import PRECUT_CHARS_PER_TOKEN
from dwsearch.modelserver.batching import Lane
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc
from dwsearch_embedder.backends.base import BackendInfo, EmbeddingBackend, Encoded, InputType, PreparedInput
from dwsearch_embedder.engine import EngineLimits


class CountingBackend(EmbeddingBackend):
    """A whitespace 'model' that counts what reaches each stage; `prepare` can be held."""

    name = "counting"

    def __init__(self) -> None:
        self.prepared: list[list[str]] = []
        self.encoded: list[list[str]] = []
        self.prepare_gate = threading.Event()
        self.prepare_gate.set()
        self.preparing = threading.Event()

    def load(self) -> BackendInfo:
        return BackendInfo("counting", "", self.name, 4, 512, False, 0, "cpu", "float32", "torch")

    def count(self, texts: Sequence[str], input_type: InputType) -> list[int]:
        return [len(text.split()) + 2 for text in texts]

    def prepare(self, texts: Sequence[str], input_type: InputType, max_tokens: int) -> list[PreparedInput]:
        self.preparing.set()
        assert self.prepare_gate.wait(30), "test never opened the gate"
        self.prepared.append(list(texts))
        return [
            PreparedInput(n, min(n, max_tokens), text)
            for n, text in zip(self.count(texts, input_type), texts, strict=True)
        ]

    def encode(
        self, inputs: Sequence[PreparedInput], *, sparse: Sequence[bool], normalize: Sequence[bool]
    ) -> list[Encoded]:
        self.encoded.append([item.payload for item in inputs])
        return [Encoded(dense=np.ones(4, dtype=np.float32) / 2, sparse=None) for _ in inputs]


async def test_a_huge_request_is_refused_fast_and_a_query_gets_in_right_after(e5):
    async with embedder_server(e5) as (_, channel):
        stub = pb_grpc.EmbedderServiceStub(channel)
        query = pb.EmbedRequest(inputs=["refund"], input_type=pb.INPUT_TYPE_QUERY)

        async def query_seconds() -> float:
            start = time.monotonic()
            assert len((await stub.Embed(query, timeout=30)).embeddings) == 1
            return time.monotonic() - start

        huge = pb.EmbedRequest(inputs=["x" * 250_000] * 256, truncate=True)  # 64 MB, the gRPC limit
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Embed(huge, timeout=30)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "bytes of text per call" in refused.value.details()
        assert await query_seconds() < 2
        # Under the byte cap but over the token budget: 16 clients × 256 inputs of ~30k bytes each.
        wide = pb.EmbedRequest(inputs=["word " * 6_000] * 256)
        errors = await asyncio.gather(
            *(stub.Embed(wide, timeout=30) for _ in range(16)), return_exceptions=True
        )
        assert all(isinstance(e, grpc.aio.AioRpcError) for e in errors)
        assert {e.code() for e in errors} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert "over the embedder's queue budget" in errors[0].details()
        assert await query_seconds() < 2


async def test_the_queue_budget_is_held_until_answered_then_given_back(e5):
    backend = GatedEmbedding(e5)
    async with embedder_server(backend, EngineLimits(max_queue_tokens=2_000)) as (engine, channel):
        stub = pb_grpc.EmbedderServiceStub(channel)
        backend.hold()
        running = asyncio.ensure_future(stub.Embed(pb.EmbedRequest(inputs=["word " * 300]), timeout=30))
        assert await asyncio.to_thread(backend.started.wait, 10)
        with pytest.raises(grpc.aio.AioRpcError) as busy:
            await stub.Embed(pb.EmbedRequest(inputs=["word " * 190] * 2), timeout=30)  # bound 1,932 tokens
        assert busy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "busy" in busy.value.details()
        backend.gate.set()
        await running
        assert engine._admission.reserved == 0
        await stub.Embed(pb.EmbedRequest(inputs=["word " * 190] * 2), timeout=30)


class PreparedLengths(LoadedEmbedding):
    """Records the length of every text that reaches the tokenizer (`prepare`)."""

    def __init__(self, loaded: LoadedEmbedding) -> None:
        self.inner, self.name, self.loaded = loaded.inner, loaded.name, loaded.loaded
        self.lengths: list[int] = []

    def prepare(self, texts: Sequence[str], input_type: InputType, max_tokens: int) -> list[PreparedInput]:
        self.lengths += [len(text) for text in texts]
        return super().prepare(texts, input_type, max_tokens)


async def test_a_truncated_huge_input_is_cut_before_tokenizing_and_embeds_like_its_prefix(e5):
    backend = PreparedLengths(e5)
    async with embedder_server(backend) as (engine, _):
        text = "the parcel arrived damaged and I would like a refund please " * 20_000  # 1.2 MB
        backend.lengths.clear()
        whole = await engine.embed([text], truncate=True)
        # The tokenizer saw a prefix of a few tokens' worth of characters each, not 1.2 MB.
        assert backend.lengths == [512 * PRECUT_CHARS_PER_TOKEN] and len(text) > 60 * backend.lengths[0]
        prefix = await engine.embed([text[:20_000]], truncate=True)
    assert whole.embeddings[0].truncated and whole.embeddings[0].token_count == 512
    np.testing.assert_allclose(whole.embeddings[0].dense, prefix.embeddings[0].dense, atol=1e-6)


async def test_work_of_a_request_cancelled_while_tokenizing_never_reaches_the_model():
    backend = CountingBackend()
    async with embedder_server(backend) as (engine, _):
        backend.prepared.clear()
        backend.encoded.clear()
        backend.prepare_gate.clear()
        backend.preparing.clear()
        texts = [f"message {i} " + "word " * 400 for i in range(80)]  # several tokenizer chunks
        request = asyncio.ensure_future(engine.embed(texts))
        assert await asyncio.to_thread(backend.preparing.wait, 10)
        request.cancel()
        backend.prepare_gate.set()
        with pytest.raises(asyncio.CancelledError):
            await request
        await engine.embed(["after"])  # the tokenizer thread has moved on
    assert len(backend.prepared) == 2  # the chunk in progress, then "after"; no later chunk
    assert backend.encoded == [["after"]]
    assert engine._admission.reserved == 0


async def test_an_expired_request_is_not_tokenized():
    backend = CountingBackend()
    async with embedder_server(backend) as (engine, _):
        backend.prepared.clear()
        backend.prepare_gate.clear()
        backend.preparing.clear()
        first = asyncio.ensure_future(engine.embed(["holding the tokenizer"]))
        assert await asyncio.to_thread(backend.preparing.wait, 10)
        late = asyncio.ensure_future(engine.embed(["too late"], deadline=time.monotonic() + 0.05))
        await asyncio.sleep(0.1)  # let the deadline pass while the tokenizer is busy
        backend.prepare_gate.set()
        await first
        with pytest.raises(DeadlineExceeded):
            await late
    assert ["too late"] not in backend.prepared and ["too late"] not in backend.encoded


async def test_a_query_is_tokenized_before_the_rest_of_a_bulk_request():
    backend = CountingBackend()
    async with embedder_server(backend) as (engine, _):
        backend.prepared.clear()
        backend.prepare_gate.clear()
        backend.preparing.clear()
        bulk = asyncio.ensure_future(engine.embed([f"doc {i} " + "word " * 400 for i in range(80)]))
        assert await asyncio.to_thread(backend.preparing.wait, 10)
        query = asyncio.ensure_future(engine.embed(["where is my parcel"], input_type=InputType.QUERY))
        deadline = time.monotonic() + 10
        while not engine._tokenizer._lanes[Lane.INTERACTIVE]:  # the query reaches the tokenizer's queue
            assert time.monotonic() < deadline, "the query never reached the tokenizer"
            await asyncio.sleep(0.001)
        backend.prepare_gate.set()
        await asyncio.gather(bulk, query)
    assert len(backend.prepared) > 3
    assert backend.prepared[1] == ["where is my parcel"]  # right after the chunk in progress


@pytest.mark.parametrize(
    "priority,input_type,lane",
    [
        (pb.PRIORITY_UNSPECIFIED, pb.INPUT_TYPE_QUERY, Lane.INTERACTIVE),
        (pb.PRIORITY_UNSPECIFIED, pb.INPUT_TYPE_DOCUMENT, Lane.BULK),
        (pb.PRIORITY_UNSPECIFIED, pb.INPUT_TYPE_UNSPECIFIED, Lane.BULK),
        (pb.PRIORITY_INTERACTIVE, pb.INPUT_TYPE_DOCUMENT, Lane.INTERACTIVE),
        (pb.PRIORITY_BULK, pb.INPUT_TYPE_QUERY, Lane.BULK),
    ],
)
async def test_priority_picks_the_lane(e5, priority, input_type, lane):
    def waits() -> dict[Lane, float]:  # inputs that waited in each lane, this model's series
        return {
            each: REGISTRY.get_sample_value(
                "dwsearch_embedder_queue_wait_seconds_count",
                {"lane": each.value, "model": e5.loaded.model_id},
            )
            or 0.0
            for each in Lane
        }

    async with embedder_server(e5) as (_, channel):
        before = waits()  # after the warm-up
        request = pb.EmbedRequest(inputs=["hello"], input_type=input_type, priority=priority)
        await pb_grpc.EmbedderServiceStub(channel).Embed(request, timeout=30)
        after = waits()
    assert {each: after[each] - before[each] for each in Lane} == {each: float(each is lane) for each in Lane}


@pytest.mark.parametrize(
    "request_,message",
    [
        (pb.EmbedRequest(inputs=["x"], priority=7), "unknown priority 7"),
        (pb.EmbedRequest(inputs=["x"], input_type=9), "unknown input_type 9"),
    ],
)
async def test_unknown_enum_values_are_invalid_arguments(e5, request_, message):
    async with embedder_server(e5) as (_, channel):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await pb_grpc.EmbedderServiceStub(channel).Embed(request_, timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in error.value.details()


async def test_info_reports_the_runtime_and_the_query_latency_measured_at_warm_up(e5):
    async with embedder_server(e5) as (engine, channel):
        info = await pb_grpc.EmbedderServiceStub(channel).Info(pb.EmbedderServiceInfoRequest(), timeout=10)
    assert info.runtime == e5.loaded.runtime
    assert 0 < info.query_latency_ms < 10_000
    assert info.query_latency_ms == pytest.approx(engine.query_latency_s * 1000, rel=1e-3)
    assert engine.batcher.interactive_worker  # a CPU: queries never wait for a bulk batch,
    assert engine.batcher.bulk_batch_seconds == 0  # so bulk batches are not cut short


async def test_where_one_thread_serves_both_lanes_bulk_batches_get_twice_the_query_latency(e5):

    class OnAGpu(GatedEmbedding):
        def load(self) -> BackendInfo:
            return dataclasses.replace(self.loaded, device="cuda")

    async with embedder_server(OnAGpu(e5)) as (engine, _):
        assert not engine.batcher.interactive_worker
        assert engine.batcher.bulk_batch_seconds == pytest.approx(2 * engine.query_latency_s)
