"""Prometheus metrics shared by the three processes, served on their own port."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RPC_REQUESTS = Counter(
    "dwsearch_grpc_requests_total", "RPCs handled, by final status code", ["service", "method", "code"]
)
RPC_SECONDS = Histogram(
    "dwsearch_grpc_request_seconds",
    "RPC handling time",
    ["service", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)


# Seconds, for the stages of one request (an embed call, a KNN query, a rerank).
STAGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

# Search internals: where a search's time goes, and how often it answers with less.
SEARCH_STAGE_SECONDS = Histogram(
    "dwsearch_search_stage_seconds",
    "Time of each search stage: fts (full text and its windows), embed (the query), dense, sparse, rerank,"
    " context (messages around the hits), typos (an org's vocabulary read)",
    ["stage"],
    buckets=STAGE_BUCKETS,
)
SEARCH_DEGRADED = Counter(
    "dwsearch_search_degraded_total",
    "Searches answered with less than asked, by reason: the DegradationReason the response names, in lower case"
    " (e.g. embedder_timeout)",
    ["reason"],
)
SEARCH_TYPO_CORRECTED = Counter(
    "dwsearch_search_typo_corrected_total",
    "Searches whose full text found nothing and ran again with misspelt words widened to the org's words",
)
SEARCH_FTS_PLAN = Counter(
    "dwsearch_search_fts_queries_total",
    "Full-text queries by plan: org_first or gin (the org's size)",
    ["plan"],
)
# Whether search's query-embedding deadline can be met: the latency of one short query the
# embedder measured at its warm-up (as its Info last reported it to this server; 0 until
# known) against the deadline (DWSEARCH_EMBED_TIMEOUT_MS).
SEARCH_EMBEDDER_QUERY_LATENCY = Gauge(
    "dwsearch_search_embedder_query_latency_seconds",
    "One short query's latency as the embedder measured it at warm-up (its Info, last seen by this server)",
)
SEARCH_EMBED_DEADLINE = Gauge(
    "dwsearch_search_embed_deadline_seconds",
    "Search's deadline for embedding the query (DWSEARCH_EMBED_TIMEOUT_MS)",
)

# serve's per-org caches (dwsearch.common.ttlcache): flags, event counts, vocabularies.
CACHE_LOOKUPS = Counter(
    "dwsearch_cache_lookups_total",
    "Lookups in serve's per-org caches, by cache and result (hit or miss)",
    ["cache", "result"],
)
# The query-embedding cache of `serve` (dwsearch.clients.querycache).
QUERY_CACHE_HITS = Counter("dwsearch_query_cache_hits_total", "Query embeddings answered from the cache")
QUERY_CACHE_MISSES = Counter(
    "dwsearch_query_cache_misses_total", "Query embeddings not in the cache (an Embed call followed)"
)
QUERY_CACHE_BYTES = Gauge(
    "dwsearch_query_cache_bytes", "Bytes the query-embedding cache holds (vectors and key texts)"
)


# Agent context (IndexService.BuildAgentContext), as for search.
AGENT_CONTEXT_STAGE_SECONDS = Histogram(
    "dwsearch_agent_context_stage_seconds",
    "Time of each agent-context stage: embed (the message), retrieve (the filtered queries), rerank",
    ["stage"],
    buckets=STAGE_BUCKETS,
)
AGENT_CONTEXT_DEGRADED = Counter(
    "dwsearch_agent_context_degraded_total",
    "Agent contexts built without the rerank asked for, by reason: the DegradationReason the response names, in"
    " lower case (e.g. reranker_timeout)",
    ["reason"],
)

# Circuit breakers (dwsearch.clients.breaker) in front of calls with a fallback.
CIRCUIT_STATE = Gauge(
    "dwsearch_circuit_state",
    "Circuit breaker state: 0 closed, 1 open, 2 half-open; target: embedder (embedder:MODEL for each further"
    " model) or reranker",
    ["target"],
)
CIRCUIT_OPENED = Counter("dwsearch_circuit_opened_total", "Times a circuit breaker opened", ["target"])

# The sweep, as seen by the `serve` pod that ran it (the CronJob reaches one pod per run:
# take max / sum over pods).
SWEEP_WINDOWS = Counter(
    "dwsearch_sweep_windows_total",
    "Windows the sweep finished, by outcome: embedded, skipped (insubstantial) or poisoned",
    ["model", "outcome"],
)
SWEEP_LEXICAL_BACKFILLED = Counter(
    "dwsearch_sweep_lexical_backfilled_total",
    "Embedded windows given their lexical weights by a sweep (embedded before the lexical leg existed, or weighed by an older term extraction)",
)
SWEEP_WINDOWS_DROPPED = Counter(
    "dwsearch_sweep_windows_dropped_total",
    "Finished windows (any model) deleted because an event in them was deleted, edited or became ineligible"
    " (found by a sweep, or named in a Forget call)",
)
SWEEP_SECONDS = Histogram(
    "dwsearch_sweep_seconds",
    "Duration of finished sweeps",
    ["model"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600),
)
SWEEP_LAST_FINISHED = Gauge(
    "dwsearch_sweep_last_finished_timestamp_seconds",
    "Unix time the last sweep on this pod finished (take the max over pods)",
    ["model"],
)
SWEEP_EVENTS_PENDING = Gauge(
    "dwsearch_sweep_events_pending",
    "Eligible events not yet in a finished window, when the last sweep on this pod started: the backlog",
    ["model"],
)
SWEEP_KEYS_STALLED = Gauge(
    "dwsearch_sweep_keys_stalled",
    "Keys the last finished sweep on this pod left stalled (transient failures)",
    ["model"],
)
SWEEP_ORGS_UNREACHABLE = Gauge(
    "dwsearch_sweep_orgs_unreachable",
    "Orgs the last sweep of every org on this pod left out because the Citus worker holding their shards did not"
    " answer (named in the sweep's orgs_skipped); 0 on one node",
)
SWEEP_FULL_CHECK_ORGS = Gauge(
    "dwsearch_sweep_full_check_orgs",
    "Orgs the last sweep on this pod checked in full (every event against the ledger: late inserts, stale"
    " windows); the rest had only their new events looked for (dwsearch.sweep.store.discovery)",
)
SWEEP_FULL_CHECK_OLDEST = Gauge(
    "dwsearch_sweep_full_check_oldest_seconds",
    "How long ago the least recently checked org (semantic search on) had its full check, after the last sweep"
    " on this pod; a late insert behind a watermark waits at most about this long",
)

# The event loop of `serve` and the CPU pool that keeps heavy work off it
# (dwsearch.common.offload).
EVENT_LOOP_LAG = Histogram(
    "dwsearch_event_loop_lag_seconds",
    "How much later than asked the event loop woke from a 0.25 s sleep: every RPC and health check waits as long",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
OFFLOAD_JOBS = Gauge(
    "dwsearch_offload_jobs", "CPU jobs (redaction, large upserts) running or waiting in the pool"
)
OFFLOAD_REFUSED = Counter(
    "dwsearch_offload_refused_total", "Requests refused RESOURCE_EXHAUSTED because the CPU pool was full"
)


T = TypeVar("T")


async def timed(histogram: Histogram, label: str, work: Awaitable[T]) -> T:
    """Await `work`, observing its time under `label` — failures too: a stage that times
    out is exactly the one to see."""
    start = time.perf_counter()
    try:
        return await work
    finally:
        histogram.labels(label).observe(time.perf_counter() - start)


def observe_rpc(service: str, method: str, code: str, seconds: float) -> None:
    RPC_REQUESTS.labels(service, method, code).inc()
    RPC_SECONDS.labels(service, method).observe(seconds)


# serve's database pool (psycopg_pool), read when scraped: size (connections open),
# available (idle in the pool), waiting (requests queued for a connection), max.
DB_POOL_CONNECTIONS = Gauge(
    "dwsearch_db_pool_connections",
    "serve's database pool: size (open), available (idle), waiting (requests queued), max (DWSEARCH_DB_POOL_MAX)",
    ["state"],
)


# serve's read replica (DWSEARCH_DATABASE_READ_URL; dwsearch.db.readpool).
READ_REPLICA_UP = Gauge(
    "dwsearch_read_replica_up",
    "Whether serve's reads go to the read replica: 1 up, 0 down (the primary serves them)",
)
READ_REPLICA_FALLBACKS = Counter(
    "dwsearch_read_replica_fallbacks_total",
    "Reads the primary served in the read replica's place, by reason: down (the replica marked down),"
    " error (the replica failed the read), conflict (a recovery conflict on the standby)",
    ["reason"],
)


class PoolStats(Protocol):
    """What watch_pool reads: psycopg_pool's pools have it."""

    def get_stats(self) -> dict[str, int]: ...


def watch_pool(pool: PoolStats) -> None:
    """Report `pool` (a psycopg_pool pool; its get_stats()) as dwsearch_db_pool_connections."""
    for state, key in (
        ("size", "pool_size"),
        ("available", "pool_available"),
        ("waiting", "requests_waiting"),
        ("max", "pool_max"),
    ):
        DB_POOL_CONNECTIONS.labels(state).set_function(_pool_stat(pool, key))


def _pool_stat(pool: PoolStats, key: str) -> Callable[[], float]:
    return lambda: pool.get_stats().get(key, 0)


def serve_metrics(port: int) -> None:
    """Expose /metrics on `port` (0 = off)."""
    if port:
        start_http_server(port)
