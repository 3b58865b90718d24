"""`dwsearch serve`: one process hosting SearchService, SweepService and IndexService over
one database pool and the clients of the model services."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from psycopg_pool import AsyncConnectionPool

from dwsearch.clients.breaker import CircuitBreaker
from dwsearch.clients.embedder import EmbedderClient
from dwsearch.clients.querycache import QueryCache
from dwsearch.clients.reranker import RerankerClient
from dwsearch.common import metrics
from dwsearch.common.config import ServerConfig
from dwsearch.common.errors import StartupError
from dwsearch.common.grpchost import GrpcHost, Service, is_loopback, run_until_signalled
from dwsearch.common.metrics import serve_metrics, watch_pool
from dwsearch.common.offload import start_event_loop_watch
from dwsearch.common.rpcpolicy import MethodPolicy, Scope, Tokens
from dwsearch.common.tls import ServerTls, client_tls, server_tls
from dwsearch.db.embedded import database_url
from dwsearch.db.pool import open_pool
from dwsearch.db.readpool import ReadPool
from dwsearch.db.schema import check_schema
from dwsearch.index.context import AgentContextBuilder
from dwsearch.index.document_index import DocumentIndex, IndexParts
from dwsearch.index.gaps import KnowledgeGaps
from dwsearch.index.service import SERVICE_NAME as INDEX_SERVICE
from dwsearch.index.service import IndexService
from dwsearch.redaction import Redaction, prepare_names
from dwsearch.retrieval.queries import QueryEmbedders
from dwsearch.search.deadline import EmbedDeadlineCheck
from dwsearch.search.fusion import parse_weights
from dwsearch.search.knnindex import OrgKnnIndexes
from dwsearch.search.searcher import Searcher
from dwsearch.search.service import SERVICE_NAME as SEARCH_SERVICE
from dwsearch.search.service import SearchService
from dwsearch.search.settings import SearchSettings
from dwsearch.sweep.admin import SweepAdmin
from dwsearch.sweep.service import SERVICE_NAME as SWEEP_SERVICE
from dwsearch.sweep.service import SweepService
from dwsearch.sweep.sweeper import Sweeper
from dwsearch.v1 import index_pb2_grpc, search_pb2_grpc, sweep_pb2_grpc

if TYPE_CHECKING:  # imported when configured: the REST API and the console bring their web stack
    from dwsearch.console.app import Console
    from dwsearch.console.server import ConsoleServer
    from dwsearch.rest.app import RestApi
    from dwsearch.rest.server import RestServer

log = logging.getLogger(__name__)

APPLICATION_NAME = "dwsearch-serve"
"""The primary pool's application_name (pg_stat_activity), unless the database URL names one."""

# How long serve's start-up check of the embedder (its model, and its query latency
# against DWSEARCH_EMBED_TIMEOUT_MS) may take. It runs beside start-up, never holds it.
STARTUP_EMBEDDER_CHECK_S = 10.0

KIB = 1024
MIB = 1024 * KIB
# The largest request message each method takes, from the limits its fields are checked
# against, with room to spare; gRPC's own receive limit is Upsert's (the largest), and a
# message over its method's limit is dropped unparsed (RESOURCE_EXHAUSTED):
# - 64 KiB: a few short fields (org, provider, channel, namespace, id, cursor: 256 to 512
#   bytes each) and at most an 8 KiB text (a search query).
# - 1 MiB: lists and documents: 1,000 ids of 512 bytes (Fetch, Delete); 10,000 message or
#   poison window or knowledge gap ids of about 40 bytes (Forget, RetryPoison,
#   ForgetKnowledgeGaps); a 32 KiB query text with a
#   16,000-entry sparse vector (about 150 KiB) and a dense one; a 128 KiB text with 48 KiB
#   of metadata (at most about 6x that as a protobuf Struct: Update); a 32 KiB message
#   with 1,000 known names of 256 bytes (BuildAgentContext).
# - Upsert: DWSEARCH_MAX_UPSERT_BYTES (64 MiB by default). A batch of the most documents
#   (1,000) each of the largest text (128 KiB) does not fit: a client splits its batches
#   by size as well as by count.
SMALL_REQUEST_BYTES = 64 * KIB
LIST_REQUEST_BYTES = 1 * MIB


def method_policies(config: ServerConfig) -> dict[str, MethodPolicy]:
    """The token scope and request size limit of every method serve hosts."""
    small, lists = SMALL_REQUEST_BYTES, LIST_REQUEST_BYTES
    table = {
        (SEARCH_SERVICE, "Search"): (Scope.SEARCH, small),
        (SEARCH_SERVICE, "Similar"): (Scope.SEARCH, small),
        (INDEX_SERVICE, "Query"): (Scope.SEARCH, lists),
        (INDEX_SERVICE, "Fetch"): (Scope.SEARCH, lists),
        (INDEX_SERVICE, "Range"): (Scope.SEARCH, small),
        (INDEX_SERVICE, "Info"): (Scope.SEARCH, small),
        (INDEX_SERVICE, "BuildAgentContext"): (Scope.SEARCH, lists),
        (INDEX_SERVICE, "Upsert"): (Scope.INDEX, max(config.max_upsert_bytes, lists)),
        (INDEX_SERVICE, "Update"): (Scope.INDEX, lists),
        (INDEX_SERVICE, "Delete"): (Scope.INDEX, lists),
        (INDEX_SERVICE, "ListKnowledgeGaps"): (Scope.ADMIN, small),
        (INDEX_SERVICE, "ForgetKnowledgeGaps"): (Scope.ADMIN, lists),
        (SWEEP_SERVICE, "Sweep"): (Scope.ADMIN, small),
        (SWEEP_SERVICE, "Status"): (Scope.ADMIN, small),
        (SWEEP_SERVICE, "Purge"): (Scope.ADMIN, small),
        (SWEEP_SERVICE, "Forget"): (Scope.ADMIN, lists),
        (SWEEP_SERVICE, "RetryPoison"): (Scope.ADMIN, lists),
    }
    return {
        f"/{service}/{method}": MethodPolicy(scope, limit)
        for (service, method), (scope, limit) in table.items()
    }


def server_tokens(config: ServerConfig) -> Tokens:
    return Tokens.from_settings(
        all_scopes=config.auth_token,
        search=config.search_tokens,
        index=config.index_tokens,
        admin=config.admin_tokens,
    )


# How long a call in flight on a connection past DWSEARCH_MAX_CONNECTION_AGE_SECONDS may
# still run before the connection is closed: longer than any Sweep (the CronJob's CLI
# deadline is 540 s), so a connection's age never cuts a sweep short.
SERVE_CONNECTION_AGE_GRACE_S = 900.0


def grpc_host(
    config: ServerConfig, services_: list[Service], *, address: str = "", tls: ServerTls | None = None
) -> GrpcHost:
    """serve's gRPC server: scoped tokens, each method's scope and size limit, the cap on
    calls in flight, gRPC's receive limit at Upsert's."""
    return GrpcHost(
        address or config.listen_addr,
        services_,
        tokens=server_tokens(config),
        policies=method_policies(config),
        max_concurrent_rpcs=config.max_concurrent_rpcs,
        max_receive_bytes=max(config.max_upsert_bytes, LIST_REQUEST_BYTES),
        reflection=config.reflection,
        tls=tls,
        health_port=config.health_port,
        max_connection_age_s=config.max_connection_age_seconds,
        # A Sweep stream runs up to the CLI's deadline (540 s in the CronJob): in-flight
        # calls finish on the old connection for that long after its GOAWAY.
        max_connection_age_grace_s=SERVE_CONNECTION_AGE_GRACE_S,
    )


def model_token(config: ServerConfig) -> str:
    """The one token of the embedder and reranker, which serve sends them."""
    return config.model_auth_token or config.auth_token


GAPS_DRAIN_S = 5.0
"""How long serve's stop waits for knowledge gaps still being recorded."""


@dataclass(frozen=True, kw_only=True)
class Application:
    """serve, put together once (build_application) and never changed after: what it
    opened (the pools, the model services' clients) and what it built over them (the
    engine: search, the index and its knowledge gaps, the sweep, the REST API's indexes;
    the gRPC services, the REST API and the console, each served by its transport)."""

    config: ServerConfig
    pool: AsyncConnectionPool
    # The read replica's pool (DWSEARCH_DATABASE_READ_URL), None: every read on `pool`.
    reads: ReadPool | None
    embedder: EmbedderClient
    reranker: RerankerClient | None
    redaction: Redaction
    # One query-embedding cache for search, index queries, agent context and REST queries.
    query_cache: QueryCache
    searcher: Searcher
    documents: DocumentIndex
    gaps: KnowledgeGaps
    services: tuple[Service, ...]
    # The REST API (DWSEARCH_REST_PORT) over its own indexes, None when it is off.
    rest: RestApi | None = None
    # The console (DWSEARCH_CONSOLE_PORT), None when it is off.
    console: Console | None = None

    @property
    def read_pool(self) -> ReadPool | AsyncConnectionPool:
        """Where searches and index reads go (dwsearch.db.readpool); writes take `pool`."""
        return self.reads if self.reads is not None else self.pool

    def service(self, name: str) -> Service:
        """The hosted service of that name (SearchService, IndexService, SweepService)."""
        (found,) = (s for s in self.services if s.name == name)
        return found

    def check_embedder_soon(self) -> asyncio.Task[None]:
        """Ask the embedder for its model in the background (dwsearch.search.deadline): a
        wrong model or a query latency above the search deadline is logged at start. An
        embedder that is down at start does not stop serve: searches ask it again."""
        return asyncio.ensure_future(self.searcher.check_embedder(timeout=STARTUP_EMBEDDER_CHECK_S))

    async def close(self) -> None:
        try:  # knowledge gaps still being recorded, before the pool goes
            await asyncio.wait_for(self.gaps.drain(), GAPS_DRAIN_S)
        except TimeoutError:
            log.warning("knowledge gaps left unrecorded at stop", extra={"component": "serve"})
        await self.embedder.close()
        if self.reranker is not None:
            await self.reranker.close()
        if self.reads is not None:
            await self.reads.close()
        await self.pool.close()


def build_application(
    config: ServerConfig,
    pool: AsyncConnectionPool,
    embedder: EmbedderClient,
    reranker: RerankerClient | None,
    *,
    reads: ReadPool | None = None,
) -> Application:
    """serve's composition root, top to bottom: the settings, the shared parts (redaction,
    circuit breaker, query cache, deadline check, the indexes' parts), the engine (search,
    the index, knowledge gaps, agent context, sweep), the gRPC services, the REST API over
    its indexes and the console (each when its port is set). `pool` and the clients are
    open; nothing here listens yet (transports)."""
    read_pool = reads if reads is not None else pool  # searches and index reads
    redaction = Redaction(enabled=config.redact)  # before any text reaches a model
    # One breaker per model service, shared by everything in this process that calls it.
    reranker_breaker = CircuitBreaker("reranker")
    query_cache = QueryCache(config.query_cache_bytes)
    deadline_check = EmbedDeadlineCheck(config.embed_timeout_ms / 1000)
    # One query embedder per served model (dwsearch.retrieval.queries), for chat search and
    # every index: the same deadline, breaker, Info and cache whoever embeds a query.
    queries = QueryEmbedders(
        embedder,
        timeout=config.embed_timeout_ms / 1000,
        cache=query_cache,
        first_model=config.models[0],
        on_first_info=deadline_check.observe,  # the deadline check follows the first model
        on_embed_seconds=metrics.SEARCH_STAGE_SECONDS.labels("embed").observe,
    )
    settings = SearchSettings.from_config(config, fusion_weights=fusion_weights(config), redaction=redaction)
    # The models' fusion profile (dwsearch.search.profiles) under DWSEARCH_FUSION(_WEIGHTS).
    log.info("fusion", extra={"component": "serve", "fusion": settings.describe_fusion()})
    searcher = Searcher(
        read_pool,
        embedder,
        reranker,
        settings,
        query_cache=query_cache,
        deadline_check=deadline_check,
        reranker_breaker=reranker_breaker,
        knn_indexes=OrgKnnIndexes() if config.knn_index == "auto" else None,  # orgs' own indexes
        queries=queries,
    )
    # Every DocumentIndex's shared parts: the Index's here, the REST API's below.
    parts = IndexParts(
        pool, embedder, read_pool=read_pool, redaction=redaction, query_cache=query_cache, queries=queries
    )
    # The first active model is the Index's.
    documents = parts.index(model=config.models[0])
    gaps = KnowledgeGaps(documents, threshold=config.knowledge_gap_threshold)
    context = AgentContextBuilder(
        documents,
        reranker,
        rerank_timeout=config.rerank_timeout_ms / 1000,
        reranker_breaker=reranker_breaker,
        gaps=gaps,
    )
    sweeper = Sweeper(
        pool,
        embedder,
        models=config.models,
        redaction=redaction,
        # At most half the pool for sweeps, however many run: the rest stays Search's.
        max_connections=max(1, config.db_pool_max // 2),
    )
    search = SearchService(searcher)
    index = IndexService(documents, context, gaps)
    sweep = SweepService(
        sweeper, SweepAdmin(pool, model=sweeper.model), max_concurrent=config.max_concurrent_sweeps
    )
    services = (
        Service(SEARCH_SERVICE, lambda s: search_pb2_grpc.add_SearchServiceServicer_to_server(search, s)),
        Service(INDEX_SERVICE, lambda s: index_pb2_grpc.add_IndexServiceServicer_to_server(index, s)),
        Service(SWEEP_SERVICE, lambda s: sweep_pb2_grpc.add_SweepServiceServicer_to_server(sweep, s)),
    )
    rest = console = None
    if config.rest_port:
        from dwsearch.rest.server import rest_api

        rest = rest_api(config, parts)
    if config.console_port:
        from dwsearch.console.server import console_app

        console = console_app(
            config,
            pool,
            server_tokens(config),
            embedder,
            reranker,
            read_pool,
            fusion=settings.describe_fusion(),
        )
    return Application(
        config=config,
        pool=pool,
        reads=reads,
        embedder=embedder,
        reranker=reranker,
        redaction=redaction,
        query_cache=query_cache,
        searcher=searcher,
        documents=documents,
        gaps=gaps,
        services=services,
        rest=rest,
        console=console,
    )


async def open_application(config: ServerConfig, url: str) -> Application:
    """The pools and the model services' clients opened, then the application built."""
    tls = client_tls(config.tls_ca, config.tls_client_cert, config.tls_client_key)
    pool = await open_pool(
        url,
        min_size=config.db_pool_min,
        max_size=config.db_pool_max,
        transaction_pooling=config.db_transaction_pooling,
        application_name=APPLICATION_NAME,
    )
    reads = None
    if config.database_read_url:  # opened without waiting: a replica down at start does not stop serve
        reads = ReadPool(
            pool,
            config.database_read_url,
            min_size=config.db_pool_min,
            max_size=config.db_pool_max,
            transaction_pooling=config.db_transaction_pooling,
        )
        await reads.open()
    embedder = EmbedderClient(config.embedder_addr, auth_token=model_token(config), tls=tls)
    reranker = (
        RerankerClient(config.reranker_addr, auth_token=model_token(config), tls=tls)
        if config.reranker_addr
        else None
    )
    return build_application(config, pool, embedder, reranker, reads=reads)


def transports(
    app: Application, tls: ServerTls | None
) -> tuple[GrpcHost, RestServer | None, ConsoleServer | None]:
    """What serves the application, last of all: the gRPC host of its services, and the REST
    API's and the console's HTTP servers when it has them. None listens before started."""
    host = grpc_host(app.config, list(app.services), tls=tls)
    rest = console = None
    if app.rest is not None:
        from dwsearch.rest.server import rest_server

        rest = rest_server(app.config, app.rest)
    if app.console is not None:
        from dwsearch.console.server import console_server

        console = console_server(app.config, app.console)
    return host, rest, console


def fusion_weights(config: ServerConfig) -> dict[str, float]:
    """DWSEARCH_FUSION_WEIGHTS parsed; StartupError naming a bad entry."""
    try:
        return parse_weights(config.fusion_weights)
    except ValueError as exc:
        raise StartupError(f"invalid DWSEARCH_FUSION_WEIGHTS (--fusion-weights): {exc}") from None


async def run_serve(config: ServerConfig) -> None:
    log.info("starting", extra={"component": "serve", "config": config.describe()})
    fusion_weights(config)  # a bad entry stops us before anything starts
    tls = server_tls(config.tls_cert, config.tls_key, config.tls_client_ca)  # a bad file stops us first
    serve_metrics(config.metrics_port)
    url = database_url(config.database_url, config.data_dir)
    check_schema(url)
    prepare_names()
    app = await open_application(config, url)
    watch_pool(app.pool)
    tokens = server_tokens(config)
    if not tokens and not config.tls_client_ca and not is_loopback(config.listen_addr):
        log.warning(
            "listening on a non-loopback address without auth: whoever reaches it may search, write the index, "
            "sweep and purge; set DWSEARCH_AUTH_TOKEN or DWSEARCH_SEARCH_TOKENS / _INDEX_TOKENS / _ADMIN_TOKENS",
            extra={"component": "serve", "address": config.listen_addr},
        )
    host, rest, console = transports(app, tls)

    async def start_transports() -> None:
        # After the gRPC port is bound: a console or REST API that answers has its gRPC
        # server (the console's sweeps and searches go through it) already accepting.
        if rest is not None:
            await rest.start()
            log.info("REST API listening", extra={"component": "serve", "port": config.rest_port})
        if console is not None:
            await console.start()
            log.info(
                "console listening",
                extra={
                    "component": "serve",
                    "address": f"http://{config.console_host}:{config.console_port}/",
                },
            )

    check = app.check_embedder_soon()

    async def cleanup() -> None:
        check.cancel()
        if console is not None:
            await console.stop()
        if rest is not None:
            await rest.stop()
        await app.close()

    # dwsearch_event_loop_lag_seconds: how long every RPC and health check waits for the loop.
    watch = start_event_loop_watch()
    try:
        await run_until_signalled(
            host, ready=start_transports, cleanup=cleanup, grace=config.grace_seconds, process="serve"
        )
    finally:
        watch.cancel()
