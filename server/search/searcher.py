"""The search pipeline: FTS and query embedding in parallel, dense and sparse KNN, window-
level fusion, optional reranking — degrading to what still works, and saying why."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from pgvector import HalfVector, SparseVector
from psycopg_pool import AsyncConnectionPool

from dwsearch.clients.breaker import CircuitBreaker
from dwsearch.clients.embedder import EmbedderClient, Embedding, ModelInfo, ModelMismatch
from dwsearch.clients.querycache import QueryCache
from dwsearch.clients.reranker import RerankerClient
from dwsearch.common import metrics
from dwsearch.common.errors import DeadlineExceeded, DwsearchError, InvalidArgument
from dwsearch.common.retrieval import MODEL_INFO_TTL_S, Degradation
from dwsearch.common.ttlcache import TtlCache
from dwsearch.flags import semantic_search_enabled
from dwsearch.search import store
from dwsearch.search.deadline import EmbedDeadlineCheck
from dwsearch.search.ftsplan import FTS_ORG_FIRST_MAX_EVENTS, FtsPlanner, query_lexemes
from dwsearch.search.fusion import DEFAULT_METHOD, Candidate, SourceRank, fuse
from dwsearch.search.highlight import pattern as highlight_pattern
from dwsearch.search.highlight import spans as highlight_spans
from dwsearch.search.typos import (
    VOCABULARY_EVENTS,
    VOCABULARY_TTL_S,
    Expansion,
    alternatives,
    correctable,
    expand,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")

DEFAULT_LIMIT = 10
MAX_LIMIT = 100
MAX_QUERY_BYTES = 8 * 1024
# Messages before and after each hit a request may ask for (context_messages).
MAX_CONTEXT_MESSAGES = 20
# Candidates each source contributes, and the pool the reranker reorders (seed 003,
# phase 2: "retrieve top ~50 → rerank → top 5-10"); both grow to the request's limit
# (at most MAX_LIMIT, well under the reranker's 512 documents per call), so a limit up
# to MAX_LIMIT holds with and without reranking.
CANDIDATES_PER_SOURCE = 50
RERANK_POOL = 50
# How long after the query embedding is requested hybrid search starts its full-text leg
# (at once if the embedding fails first). Started in the same instant, the full-text
# query's backend and the embed request compete for the CPUs: on a 2-core host running
# everything (`python -m bench.search`; a small self-hosted node) the request reached the
# embedder 2.75 ms after it was sent instead of 0.86 ms, and hybrid p50 was 1 ms slower than
# with this stagger. It costs about this much (the event loop's timer rounds up to the next
# millisecond), and only when full text is the slower leg.
FTS_STAGGER_S = 0.001
# How long an org's feature-flag answer is reused: saves a round trip per search; a flag
# flip takes effect within this time.
FLAG_CACHE_TTL_S = 5.0


class Mode(enum.Enum):
    HYBRID = "hybrid"
    FTS = "fts"
    SEMANTIC = "semantic"


class Sort(enum.Enum):
    RELEVANCE = "relevance"
    # The same hits as RELEVANCE, newest first (by end time, then score).
    NEWEST = "newest"


@dataclass(frozen=True)
class SearchQuery:
    org_id: str
    text: str
    limit: int = 0
    provider: str = ""
    external_channel_id: str = ""
    start: datetime | None = None
    end: datetime | None = None
    mode: Mode = Mode.HYBRID
    rerank: bool | None = None
    context_messages: int = 0
    sort: Sort = Sort.RELEVANCE
    # Fusion method ("rrf" | "weighted") and per-leg weights over the server's; None = the server's.
    fusion: str | None = None
    fusion_weights: Mapping[str, float] | None = None


@dataclass
class SearchResult:
    hits: list[Candidate]
    mode: Mode
    model: str = ""
    reranked: bool = False
    # The fusion method that ranked the hits; empty when nothing was fused (FTS).
    fusion: str = ""
    degradations: list[tuple[Degradation, str]] = field(default_factory=list)
    # Query words full text did not find, widened to the org's words one edit away
    # (dwsearch.search.typos); empty when full text matched as asked.
    typo_corrections: list[Expansion] = field(default_factory=list)


def validate(query: SearchQuery) -> int:
    """Raise InvalidArgument for a bad request; return the effective limit."""
    if not query.org_id.strip():
        raise InvalidArgument("org_id is required")
    for name, value in (
        ("org_id", query.org_id),
        ("query", query.text),
        ("provider", query.provider),
        ("external_channel_id", query.external_channel_id),
    ):
        if "\x00" in value:  # Postgres text cannot hold NUL
            raise InvalidArgument(f"{name}: NUL character")
    if not query.text.strip():
        raise InvalidArgument("query is empty")
    size = len(query.text.encode("utf-8"))
    if size > MAX_QUERY_BYTES:
        raise InvalidArgument(f"query is {size} bytes; the limit is {MAX_QUERY_BYTES}")
    if query.limit < 0 or query.limit > MAX_LIMIT:
        raise InvalidArgument(f"limit must be between 1 and {MAX_LIMIT} (0 means {DEFAULT_LIMIT})")
    if query.start is not None and query.end is not None and query.start > query.end:
        raise InvalidArgument("start_time is after end_time")
    if query.context_messages < 0 or query.context_messages > MAX_CONTEXT_MESSAGES:
        raise InvalidArgument(f"context_messages must be between 0 and {MAX_CONTEXT_MESSAGES}")
    return query.limit or DEFAULT_LIMIT


class Searcher:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        embedder: EmbedderClient,
        reranker: RerankerClient | None,
        *,
        model: str,
        embed_timeout: float,
        rerank_timeout: float,
        rerank_by_default: bool = False,
        redact: Callable[[str], str] | None = None,
        hnsw: bool = False,
        fts_org_first_max_events: int = FTS_ORG_FIRST_MAX_EVENTS,
        embedder_breaker: CircuitBreaker | None = None,
        reranker_breaker: CircuitBreaker | None = None,
        query_cache: QueryCache | None = None,
        deadline_check: EmbedDeadlineCheck | None = None,
        fusion: str = DEFAULT_METHOD,
        fusion_weights: Mapping[str, float] | None = None,
    ) -> None:
        self.pool = pool
        self.fusion = fusion
        self.fusion_weights = dict(fusion_weights or {})
        # The embedder asked for search's model: the client checks that every Info and Embed
        # answer names it (ModelMismatch), and search degrades to full text when one does not.
        self.embedder = embedder.for_model(model)
        self.reranker = reranker
        self.model = model
        self.embed_timeout = embed_timeout
        self.rerank_timeout = rerank_timeout
        self.rerank_by_default = rerank_by_default
        self.redact = redact or (lambda text: text)
        self.hnsw = hnsw
        self._info: ModelInfo | None = None
        self._info_at = 0.0
        self._flags: TtlCache[str, bool] = TtlCache(FLAG_CACHE_TTL_S)
        self._fts_plans = FtsPlanner(fts_org_first_max_events)
        # Each org's recent words, for typo tolerance (a few hundred KiB per org at most).
        self._vocabularies: TtlCache[str, dict[str, int]] = TtlCache(VOCABULARY_TTL_S, max_entries=64)
        # An embedder that keeps failing is not called for a while: searches answer with
        # full text at once instead of each waiting out embed_timeout.
        self._embedder_breaker = embedder_breaker or CircuitBreaker("embedder")
        self._reranker_breaker = reranker_breaker or CircuitBreaker("reranker")
        # Query embeddings already computed (shared with the index in `serve`); off by default.
        self._queries = query_cache if query_cache is not None else QueryCache(0)
        self._deadline_check = deadline_check or EmbedDeadlineCheck(embed_timeout)

    async def check_embedder(self, *, timeout: float) -> None:
        """Ask the embedder for its model now (serve's start-up): a wrong model or a query
        latency above embed_timeout is logged at once, not at the first search. Never
        raises: an embedder that is down at start is asked again by the first search."""
        try:
            await self._model_info(timeout=timeout)
        except ModelMismatch as exc:
            log.warning(
                "the embedder serves another model than DWSEARCH_EMBED_MODEL: searches degrade to full text until "
                "they agree",
                extra={"error": str(exc)},
            )
        except DwsearchError as exc:
            log.warning(
                "embedder not checked at start; searches will ask it again", extra={"error": str(exc)}
            )

    async def search(self, query: SearchQuery) -> SearchResult:
        limit = validate(query)
        scope = store.ChatScope(
            query.org_id, query.provider, query.external_channel_id, query.start, query.end
        )
        result = SearchResult(hits=[], mode=query.mode)
        if query.mode is not Mode.FTS:
            if not await self._semantic_enabled(query.org_id):
                result.degradations.append(
                    (Degradation.SEMANTIC_DISABLED, "semantic search is off for this org")
                )
                result.mode = Mode.FTS

        if result.mode is Mode.FTS:
            async with self.pool.connection() as conn:
                org_first = await self._fts_org_first(conn, query.org_id, query.text)
                rows = await timed(
                    "fts",
                    store.full_text(conn, scope, query.text, limit, recent_first=True, org_first=org_first),
                )
                if not rows:
                    widened = await self._typo_alternatives(conn, query.org_id, query.text, result)
                    if widened:
                        rows = await timed(
                            "fts",
                            store.full_text(
                                conn, scope, query.text, limit, recent_first=True, org_first=org_first,
                                alternatives=widened,
                            ),
                        )  # fmt: skip
            candidates = fuse(rows)
            candidates.sort(key=lambda c: c.sources["fts"].rank)  # keep the Go module's order
        else:
            result.fusion = query.fusion or self.fusion
            candidates = await self._hybrid(query, scope, result, max(CANDIDATES_PER_SOURCE, limit))
            result.model = self.model

        rerank = self.rerank_by_default if query.rerank is None else query.rerank
        if rerank and candidates:
            candidates = await self._rerank(query, candidates[: max(RERANK_POOL, limit)], result)
        hits = candidates[:limit]
        if query.sort is Sort.NEWEST:
            hits.sort(key=lambda c: (-c.end.timestamp(), -c.score, c.id))
        compiled = highlight_pattern(
            " ".join([query.text, *(w for e in result.typo_corrections for w in e.alternatives)])
        )
        for hit in hits:
            hit.highlights = highlight_spans(compiled, hit.text)
        if query.context_messages and hits:
            await self._add_context(query, hits)
        result.hits = hits
        for reason, _ in result.degradations:
            metrics.SEARCH_DEGRADED.labels(reason.value).inc()
        return result

    async def _add_context(self, query: SearchQuery, hits: list[Candidate]) -> None:
        anchored = [h for h in hits if h.message_ids]
        bounds = [(h.message_ids[0], h.message_ids[-1]) for h in anchored]
        async with self.pool.connection() as conn:
            found = await timed(
                "context", store.context_messages(conn, query.org_id, bounds, query.context_messages)
            )
        for hit, (before, after) in zip(anchored, found, strict=True):
            hit.context_before, hit.context_after = before, after

    async def _semantic_enabled(self, org_id: str) -> bool:
        enabled = self._flags.get(org_id)
        if enabled is None:
            async with self.pool.connection() as conn:
                enabled = await semantic_search_enabled(conn, org_id)
            self._flags.put(org_id, enabled)
        return enabled

    async def _fts_org_first(self, conn, org_id: str, text: str) -> bool:  # type: ignore[no-untyped-def]
        """The full-text plan for this query (dwsearch.search.ftsplan), counted."""
        org_first = await self._fts_plans.org_first(conn, org_id, text)
        metrics.SEARCH_FTS_PLAN.labels("org_first" if org_first else "gin").inc()
        return org_first

    async def _hybrid(
        self, query: SearchQuery, scope: store.ChatScope, result: SearchResult, per_source: int
    ) -> list[Candidate]:
        """Candidates of every source (up to `per_source` each), fused."""
        semantic = asyncio.ensure_future(self._semantic(scope, query.text, per_source))
        fts_task: asyncio.Future | None = None
        try:
            if result.mode is Mode.HYBRID:
                # The full-text leg waits FTS_STAGGER_S for the embed request to get out
                # (no longer if the embedding fails first).
                await asyncio.wait({semantic}, timeout=FTS_STAGGER_S)
                fts_task = asyncio.ensure_future(
                    self._fts_with_windows(scope, query.text, per_source, result)
                )
                # A failing full-text leg (the database) fails the search at once, not
                # after the embedding.
                await asyncio.wait({semantic, fts_task}, return_when=asyncio.FIRST_EXCEPTION)
                if fts_task.done():
                    fts_task.result()
            try:
                dense, sparse = await semantic
            except DwsearchError as exc:
                reason = (
                    Degradation.EMBEDDER_TIMEOUT
                    if isinstance(exc, DeadlineExceeded)
                    else Degradation.EMBEDDER_UNAVAILABLE
                )
                log.warning("search degraded to full-text", extra={"reason": reason.value, "error": str(exc)})
                result.degradations.append((reason, str(exc)))
                dense, sparse = [], []
                if fts_task is None:  # semantic mode: full-text search still answers
                    fts_task = asyncio.ensure_future(
                        self._fts_with_windows(scope, query.text, per_source, result)
                    )
            fts_rows, fts_windows = await fts_task if fts_task is not None else ([], [])
        except BaseException:
            for task in (semantic, fts_task):
                if task is None:
                    continue
                if not task.done():
                    task.cancel()
                elif not task.cancelled():
                    task.exception()  # retrieved: the error raised here is the one reported
            raise
        weights = {**self.fusion_weights, **(query.fusion_weights or {})}
        return fuse(fts_rows, dense, sparse, fts_windows, method=result.fusion, weights=weights)

    async def _fts_with_windows(self, scope: store.ChatScope, text: str, k: int, result: SearchResult):  # type: ignore[no-untyped-def]
        async with self.pool.connection() as conn:
            org_first = await self._fts_org_first(conn, scope.org_id, text)
            found = await timed(
                "fts",
                store.full_text_with_windows(conn, scope, text, self.model, k, org_first=org_first),
            )
            if not found[0]:
                widened = await self._typo_alternatives(conn, scope.org_id, text, result)
                if widened:
                    found = await timed(
                        "fts",
                        store.full_text_with_windows(
                            conn, scope, text, self.model, k, org_first=org_first, alternatives=widened
                        ),
                    )
            return found

    async def _typo_alternatives(  # type: ignore[no-untyped-def]
        self, conn, org_id: str, text: str, result: SearchResult
    ) -> list[tuple[str, ...]] | None:
        """Full text found nothing: the query with its unknown latin-script words widened
        to the org's words one edit away (dwsearch.search.typos), or None when no word
        has a correction. Recorded in result.typo_corrections."""
        if not any(correctable(word) for word in query_lexemes(text)):
            return None  # e.g. a CJK or order-number query: no vocabulary read
        vocabulary = self._vocabularies.get(org_id)
        if vocabulary is None:
            vocabulary = await timed("typos", store.vocabulary(conn, org_id, VOCABULARY_EVENTS))
            self._vocabularies.put(org_id, vocabulary)
        expansions = expand(text, vocabulary)
        if not expansions:
            return None
        result.typo_corrections = expansions
        metrics.SEARCH_TYPO_CORRECTED.inc()
        return alternatives(text, expansions)

    def _fresh_info(self) -> ModelInfo | None:
        if self._info is None or time.monotonic() - self._info_at > MODEL_INFO_TTL_S:
            return None
        return self._info

    async def _model_info(self, *, timeout: float | None = None) -> ModelInfo:
        info = self._fresh_info()
        if info is None:
            now = time.monotonic()
            try:
                info = await self.embedder.info(timeout=timeout or self.embed_timeout)
            except ModelMismatch:
                self._info = None
                raise
            self._info, self._info_at = info, now
            self._deadline_check.observe(info)
        return info

    async def _query_embedding(self, text: str) -> tuple[ModelInfo, Embedding]:
        """The query's embedding (interactive lane), from the query cache when it is there:
        a cached query needs no embedder, even while the embedder's circuit is open."""
        redacted = self.redact(text)
        known = self._fresh_info()
        if known is not None:
            found = self._queries.get(known.model_id, redacted, sparse=known.sparse_supported)
            if found is not None:
                return known, found

        async def embed() -> tuple[ModelInfo, Embedding]:
            info = await self._model_info()
            if info is not known:  # refreshed just now: not looked up under this model yet
                found = self._queries.get(info.model_id, redacted, sparse=info.sparse_supported)
                if found is not None:
                    return info, found
            (embedding,) = await timed(
                "embed",
                self.embedder.embed(
                    [redacted],
                    input_type="query",
                    sparse=info.sparse_supported,
                    truncate=True,
                    priority="interactive",
                    timeout=self.embed_timeout,
                ),
            )
            self._queries.put(info.model_id, redacted, embedding, sparse=info.sparse_supported)
            return info, embedding

        return await self._embedder_breaker.call(embed)

    async def _semantic(self, scope: store.ChatScope, text: str, k: int):  # type: ignore[no-untyped-def]
        info, embedding = await self._query_embedding(text)

        async def dense():  # type: ignore[no-untyped-def]
            async with self.pool.connection() as conn:
                return await timed(
                    "dense",
                    store.dense_knn(conn, scope, self.model, HalfVector(embedding.dense), k, hnsw=self.hnsw),
                )

        async def sparse():  # type: ignore[no-untyped-def]
            if not embedding.sparse:
                return []
            vector = SparseVector(embedding.sparse, info.sparse_dimension)
            async with self.pool.connection() as conn:
                return await timed("sparse", store.sparse_knn(conn, scope, self.model, vector, k))

        return await asyncio.gather(dense(), sparse())

    async def _rerank(
        self, query: SearchQuery, pool: list[Candidate], result: SearchResult
    ) -> list[Candidate]:
        """`pool` (the fused order's top max(RERANK_POOL, limit)) reordered by the reranker."""
        if self.reranker is None:
            result.degradations.append((Degradation.RERANKER_NOT_CONFIGURED, "no reranker is configured"))
            return pool
        try:
            reranker = self.reranker
            ranked = await self._reranker_breaker.call(
                lambda: timed(
                    "rerank",
                    reranker.rerank(
                        self.redact(query.text),
                        [c.text for c in pool],
                        priority="interactive",
                        timeout=self.rerank_timeout,
                    ),
                )
            )
        except DwsearchError as exc:
            reason = (
                Degradation.RERANKER_TIMEOUT
                if isinstance(exc, DeadlineExceeded)
                else Degradation.RERANKER_UNAVAILABLE
            )
            log.warning("search returned fused order", extra={"reason": reason.value, "error": str(exc)})
            result.degradations.append((reason, str(exc)))
            return pool
        reordered = []
        for rank, (index, score) in enumerate(ranked, start=1):
            candidate = pool[index]
            candidate.rerank = SourceRank(rank, score)
            reordered.append(candidate)
        result.reranked = True
        return reordered


def timed(stage: str, work: Awaitable[_T]) -> Awaitable[_T]:
    """`work`, timed in dwsearch_search_stage_seconds under `stage`."""
    return metrics.timed(metrics.SEARCH_STAGE_SECONDS, stage, work)
