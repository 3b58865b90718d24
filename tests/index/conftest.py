"""IndexService over a real Postgres and real gRPC (127.0.0.1:0), fake embedder and reranker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc
import psycopg
import pytest

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.clients.querycache import QueryCache
from dwsearch.clients.reranker import RerankerClient
from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.db.pool import open_pool
from dwsearch.index.context import AgentContextBuilder
from dwsearch.index.document_index import DocumentIndex
from dwsearch.index.service import SERVICE_NAME, IndexService
from dwsearch.v1 import index_pb2_grpc
from dwsearch_testkit.fakes import FAKE_MODEL, FakeReranker


@pytest.fixture
async def pool(db_url):
    pool = await open_pool(db_url, max_size=6)
    yield pool
    await pool.close()


@pytest.fixture
async def fake_reranker() -> AsyncIterator[FakeReranker]:
    fake = FakeReranker()
    await fake.start()
    yield fake
    await fake.stop()


StubFactory = Callable[..., index_pb2_grpc.IndexServiceStub]


@pytest.fixture
async def make_stub(pool, fake_embedder) -> AsyncIterator[StubFactory]:
    """make(reranker=address | None, embedder=address | None, query_cache=QueryCache |
    None) -> a stub of an IndexService on a real socket."""
    hosts: list[GrpcHost] = []
    closers = []

    async def make(
        *,
        reranker: str | None = None,
        embedder: str | None = None,
        rerank_timeout: float = 2.0,
        query_cache: QueryCache | None = None,
    ):
        embedder_client = EmbedderClient(embedder or fake_embedder.address, timeout=5)
        reranker_client = RerankerClient(reranker, timeout=5) if reranker else None
        index = DocumentIndex(pool, embedder_client, model=FAKE_MODEL, query_cache=query_cache)
        service = IndexService(
            index, AgentContextBuilder(index, reranker_client, rerank_timeout=rerank_timeout)
        )
        host = GrpcHost(
            "127.0.0.1:0",
            [Service(SERVICE_NAME, lambda s: index_pb2_grpc.add_IndexServiceServicer_to_server(service, s))],
        )
        port = await host.start()
        await host.set_serving(True)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        hosts.append(host)
        closers.extend(c.close for c in (embedder_client, reranker_client, channel) if c is not None)
        return index_pb2_grpc.IndexServiceStub(channel)

    yield make
    for close in closers:
        await close()
    for host in hosts:
        await host.stop(0)


@pytest.fixture
async def stub(make_stub) -> index_pb2_grpc.IndexServiceStub:
    return await make_stub()


@pytest.fixture
def snapshot(db_url) -> Callable[[], list[tuple]]:
    """Everything stored, in a stable order: the state a failed call must leave as it was."""

    def rows() -> list[tuple]:
        with psycopg.connect(db_url) as conn:
            return conn.execute(
                "SELECT namespace, id, data, metadata::text, model, embedding::text, sparse::text, created_at,"
                " updated_at FROM dw_index_documents ORDER BY namespace, id"
            ).fetchall()

    return rows
