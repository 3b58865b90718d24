"""An in-process embedder / reranker with its gRPC and HTTP ports (dwsearch.modelserver's
ModelHost, as `--http-port` runs it): one engine behind both, on real sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc

from dwsearch.common.connections import ConnectionLimits
from dwsearch.common.grpchost import Service
from dwsearch.modelserver.http import HttpHost, HttpState
from dwsearch.modelserver.runtime import ModelHost
from dwsearch.v1 import embedder_pb2_grpc, reranker_pb2_grpc
from dwsearch_embedder.backends.base import EmbeddingBackend
from dwsearch_embedder.engine import Embedder, EngineLimits
from dwsearch_embedder.http import EmbedderHttp
from dwsearch_embedder.service import SERVICE_NAME as EMBEDDER_SERVICE
from dwsearch_embedder.service import EmbedderServicer
from dwsearch_reranker.backends.base import RerankBackend
from dwsearch_reranker.engine import Reranker, RerankLimits
from dwsearch_reranker.http import RerankerHttp
from dwsearch_reranker.service import SERVICE_NAME as RERANKER_SERVICE
from dwsearch_reranker.service import RerankerServicer


@dataclass
class Served:
    engine: Embedder | Reranker
    channel: grpc.aio.Channel
    url: str  # the HTTP port's base URL
    host: ModelHost
    state: HttpState


@asynccontextmanager
async def embedder_http(
    backend: EmbeddingBackend,
    limits: EngineLimits | None = None,
    *,
    auth_token: str = "",
    serving: bool = True,
    tls: dict[str, str] | None = None,
    connections: ConnectionLimits | None = None,
) -> AsyncIterator[Served]:
    engine = Embedder(backend, limits or EngineLimits())
    await engine.start()
    servicer = EmbedderServicer(engine)
    service = Service(
        EMBEDDER_SERVICE, lambda s: embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(servicer, s)
    )
    state = HttpState(
        EMBEDDER_SERVICE, auth_token=auth_token, max_request_bytes=engine.limits.max_request_bytes
    )
    async with _hosted(
        engine, service, EmbedderHttp(engine, state).app(), state, auth_token, serving, tls, connections
    ) as served:
        yield served


@asynccontextmanager
async def reranker_http(
    backend: RerankBackend, limits: RerankLimits | None = None, *, auth_token: str = ""
) -> AsyncIterator[Served]:
    engine = Reranker(backend, limits or RerankLimits())
    await engine.start()
    servicer = RerankerServicer(engine)
    service = Service(
        RERANKER_SERVICE, lambda s: reranker_pb2_grpc.add_RerankerServiceServicer_to_server(servicer, s)
    )
    state = HttpState(
        RERANKER_SERVICE, auth_token=auth_token, max_request_bytes=engine.limits.max_request_bytes
    )
    async with _hosted(
        engine, service, RerankerHttp(engine, state).app(), state, auth_token, True, None, None
    ) as served:
        yield served


@asynccontextmanager
async def _hosted(
    engine, service, app, state, auth_token, serving, tls, connections
) -> AsyncIterator[Served]:
    """`tls`: HttpHost's tls_cert / tls_key / tls_client_ca (the HTTP port's; gRPC stays
    plaintext); `connections`: the HTTP port's cap and deadlines."""
    http = HttpHost(app, state, "127.0.0.1", 0, **(tls or {}), limits=connections)
    host = ModelHost("127.0.0.1:0", [service], http=http, auth_token=auth_token)
    port = await host.start()
    if serving:
        await host.set_serving(True)
    metadata = (("authorization", f"Bearer {auth_token}"),) if auth_token else None
    interceptors = [_Metadata(metadata)] if metadata else None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", interceptors=interceptors) as channel:
            scheme = "https" if tls else "http"
            yield Served(engine, channel, f"{scheme}://127.0.0.1:{http.port}", host, state)
    finally:
        await host.stop(0)
        await engine.stop()


class _Metadata(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, metadata) -> None:
        self.metadata = metadata

    async def intercept_unary_unary(self, continuation, details, request):
        details = details._replace(metadata=self.metadata)
        return await continuation(details, request)
