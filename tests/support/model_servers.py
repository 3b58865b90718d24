"""In-process EmbedderService / RerankerService for tests: real engines and backends on
real sockets. A backend is loaded once per session and wrapped, so each test gets a fresh
engine (queue, threads, limits) without reloading weights; subclasses of the wrappers can
hold a batch at a gate or record what ran."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.v1 import embedder_pb2_grpc, reranker_pb2_grpc
from dwsearch_embedder.backends.base import BackendInfo, EmbeddingBackend, Encoded, InputType, PreparedInput
from dwsearch_embedder.engine import Embedder, EngineLimits
from dwsearch_embedder.service import SERVICE_NAME as EMBEDDER_SERVICE
from dwsearch_embedder.service import EmbedderServicer
from dwsearch_reranker.backends.base import PreparedPair, RerankBackend, RerankerInfo
from dwsearch_reranker.engine import Reranker, RerankLimits
from dwsearch_reranker.service import SERVICE_NAME as RERANKER_SERVICE
from dwsearch_reranker.service import RerankerServicer


class LoadedEmbedding(EmbeddingBackend):
    """A backend loaded once; `load` returns the cached description."""

    def __init__(self, inner: EmbeddingBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.loaded = inner.load()

    def load(self) -> BackendInfo:
        return self.loaded

    def count(self, texts: Sequence[str], input_type: InputType) -> list[int]:
        return self.inner.count(texts, input_type)

    def prepare(self, texts: Sequence[str], input_type: InputType, max_tokens: int) -> list[PreparedInput]:
        return self.inner.prepare(texts, input_type, max_tokens)

    def encode(self, inputs, *, sparse, normalize) -> list[Encoded]:
        return self.inner.encode(inputs, sparse=sparse, normalize=normalize)

    def tokenize(self, texts, *, add_special_tokens=True):
        return self.inner.tokenize(texts, add_special_tokens=add_special_tokens)

    def decode(self, ids, *, skip_special_tokens=True):
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


class GatedEmbedding(LoadedEmbedding):
    """After `hold()`, every batch waits for `gate` (setting `started` as it arrives);
    records the lengths of the inputs of each batch that ran."""

    def __init__(self, loaded: LoadedEmbedding) -> None:
        self.inner = loaded.inner
        self.name = loaded.name
        self.loaded = loaded.loaded
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.batches: list[list[int]] = []

    def hold(self) -> None:
        self.batches.clear()
        self.started.clear()
        self.gate.clear()

    def encode(self, inputs, *, sparse, normalize) -> list[Encoded]:
        self.started.set()
        assert self.gate.wait(30), "test never opened the gate"
        self.batches.append([item.length for item in inputs])
        return super().encode(inputs, sparse=sparse, normalize=normalize)


class LoadedRerank(RerankBackend):
    def __init__(self, inner: RerankBackend) -> None:
        self.inner = inner
        self.loaded = inner.load()

    def load(self) -> RerankerInfo:
        return self.loaded

    def prepare(self, query: str, documents: Sequence[str]) -> list[PreparedPair]:
        return self.inner.prepare(query, documents)

    def score(self, pairs: Sequence[PreparedPair]):
        return self.inner.score(pairs)


@asynccontextmanager
async def embedder_server(
    backend: EmbeddingBackend, limits: EngineLimits | None = None
) -> AsyncIterator[tuple[Embedder, grpc.aio.Channel]]:
    """A started engine behind a SERVING EmbedderService, and a channel to it."""
    engine = Embedder(backend, limits or EngineLimits())
    await engine.start()
    servicer = EmbedderServicer(engine)
    host = GrpcHost(
        "127.0.0.1:0",
        [
            Service(
                EMBEDDER_SERVICE,
                lambda s: embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(servicer, s),
            )
        ],
    )
    port = await host.start()
    await host.set_serving(True)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield engine, channel
    finally:
        await host.stop(0)
        await engine.stop()


@asynccontextmanager
async def reranker_server(
    backend: RerankBackend, limits: RerankLimits | None = None
) -> AsyncIterator[tuple[Reranker, grpc.aio.Channel]]:
    engine = Reranker(backend, limits or RerankLimits())
    await engine.start()
    servicer = RerankerServicer(engine)
    host = GrpcHost(
        "127.0.0.1:0",
        [
            Service(
                RERANKER_SERVICE,
                lambda s: reranker_pb2_grpc.add_RerankerServiceServicer_to_server(servicer, s),
            )
        ],
    )
    port = await host.start()
    await host.set_serving(True)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield engine, channel
    finally:
        await host.stop(0)
        await engine.stop()


async def until_serving(channel: grpc.aio.Channel, service: str, timeout: float = 30) -> None:
    """Wait for the health service to report `service` SERVING, by watching it (no polling)."""
    watch = health_pb2_grpc.HealthStub(channel).Watch(
        health_pb2.HealthCheckRequest(service=service), timeout=timeout
    )
    async for update in watch:
        if update.status == health_pb2.HealthCheckResponse.SERVING:
            watch.cancel()
            return
    raise AssertionError(f"{service} never became SERVING")
