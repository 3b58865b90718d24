"""The search pipeline: full text and, per active model, the query embedding then dense and
sparse KNN, all concurrent; window-level fusion of every leg; optional reranking —
degrading to what still works, and saying why. And Similar: one conversation's vectors per
model (its windows', or embedded now while it is open) through the same KNN legs, fusion
and context.

search() picks the mode and assembles the SearchResult once from what each stage
returns: _full_text (FTS mode) or _retrieve (hybrid and semantic: its legs run in an
asyncio.TaskGroup), then _rerank and _add_context. A model whose query embedding fails
returns no legs and a degradation instead of raising; any other failure of a leg (the
database) cancels its siblings and fails the search. similar() resolves the conversation
(_conversation), runs _similar_legs per model, fuses and adds context. With `explain`
each stage's time is recorded (timed, explained) and fusion explains every hit."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pgvector import HalfVector, SparseVector
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from dwsearch.clients.breaker import CircuitBreaker
from dwsearch.clients.embedder import EmbedderClient, Embedding, ModelInfo
from dwsearch.clients.querycache import QueryCache
from dwsearch.clients.queryembedder import QueryEmbedder, check_embedding
from dwsearch.clients.reranker import RerankerClient
from dwsearch.common import metrics
from dwsearch.common.errors import (
    DeadlineExceeded,
    DwsearchError,
    FailedPrecondition,
    Internal,
    NotFound,
    Unavailable,
)
from dwsearch.common.ttlcache import TtlCache
from dwsearch.db.readpool import ReadPool, read_retrying
from dwsearch.flags import disabled_reasons, semantic_search_enabled
from dwsearch.retrieval.degradation import Degradation
from dwsearch.retrieval.stages import StageTimes, explained, explaining, record, timed
from dwsearch.search.conversation import (
    OPEN_CONVERSATION_MESSAGES,
    OPEN_SESSION_REACH,
    conversation_text,
    mean_vectors,
    session_around,
)
from dwsearch.search.deadline import EmbedDeadlineCheck
from dwsearch.search.ftsplan import FTS_ORG_FIRST_MAX_EVENTS, FtsPlanner, query_lexemes
from dwsearch.search.fusion import DEFAULT_METHOD, Candidate, Leg, SourceRank, fuse
from dwsearch.search.highlight import pattern as highlight_pattern
from dwsearch.search.highlight import spans as highlight_spans
from dwsearch.search.knnindex import OrgKnnIndexes
from dwsearch.search.query import (
    Mode,
    SearchQuery,
    SearchResult,
    SimilarQuery,
    SimilarResult,
    Sort,
    _uuid,
    validate,
    validate_similar,
)
from dwsearch.search.rows import ContextRow, MessageRow, WindowRow
from dwsearch.search.store import conversations, fulltext, knn
from dwsearch.search.store.scope import ChatScope
from dwsearch.search.typos import (
    VOCABULARY_EVENTS,
    VOCABULARY_TTL_S,
    Expansion,
    alternatives,
    correctable,
    expand,
)

log = logging.getLogger(__name__)
# Candidates each source contributes, and the pool the reranker reorders (docs/design.md,
# "Reranking": retrieve top ~50 → rerank → top 5-10); both grow to the request's limit
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


@dataclass(frozen=True)
class _FullText:
    """What the full-text leg found: messages in rank order, the embedded windows that
    hold any of them, and the query words widened for typos (empty when none were)."""

    rows: list[MessageRow]
    windows: list[WindowRow] = field(default_factory=list)
    corrections: list[Expansion] = field(default_factory=list)


@dataclass(frozen=True)
class _ModelLegs:
    """One model's legs (dense, plus sparse where it has them), or none and why; `embedded`:
    Similar embedded the conversation for it."""

    legs: list[Leg]
    degradation: tuple[Degradation, str] | None = None
    embedded: bool = False


@dataclass(frozen=True)
class _Conversation:
    """Similar's conversation: its org, provider, channel and time span (its windows are
    the channel's that overlap the span), and its messages when already read."""

    scope: ChatScope
    messages: list[ContextRow] | None = None


@dataclass(frozen=True)
class _Retrieved:
    """Fused candidates, best first, and what was left out on the way."""

    candidates: list[Candidate]
    degradations: list[tuple[Degradation, str]]
    corrections: list[Expansion]


@dataclass(frozen=True)
class _Model:
    """An active model: its name and its query embeddings (a client that asks for it and
    checks every answer names it, its Info, its circuit breaker, the query cache)."""

    name: str
    queries: QueryEmbedder


class Searcher:
    """`model` / `models`: the active models (ServerConfig.models; `models` wins when
    given), the first the Index's and the sweep's default. Hybrid and semantic search run a
    dense leg per model, and a sparse leg where the model has sparse vectors, through one
    client per model over `embedder`'s channel."""

    def __init__(
        self,
        pool: AsyncConnectionPool | ReadPool,
        embedder: EmbedderClient,
        reranker: RerankerClient | None,
        *,
        model: str = "",
        models: Sequence[str] = (),
        embed_timeout: float,
        rerank_timeout: float,
        rerank_by_default: bool = False,
        redact: Callable[[str], str] | None = None,
        hnsw: bool = False,
        knn_indexes: OrgKnnIndexes | None = None,
        fts_org_first_max_events: int = FTS_ORG_FIRST_MAX_EVENTS,
        embedder_breaker: CircuitBreaker | None = None,
        reranker_breaker: CircuitBreaker | None = None,
        query_cache: QueryCache | None = None,
        deadline_check: EmbedDeadlineCheck | None = None,
        fusion: str = DEFAULT_METHOD,
        fusion_weights: Mapping[str, float] | None = None,
    ) -> None:
        names = tuple(models) or (model,)
        if not all(names) or len(set(names)) != len(names):
            raise ValueError(f"search needs distinct, non-empty model names; got {names!r}")
        self.pool = pool
        self.reranker = reranker
        self.models = names
        self.model = names[0]
        self.fusion = fusion
        self.fusion_weights = dict(fusion_weights or {})
        self.embed_timeout = embed_timeout
        self.rerank_timeout = rerank_timeout
        self.rerank_by_default = rerank_by_default
        self.redact = redact or (lambda text: text)
        self.hnsw = hnsw
        # knn_index = auto: orgs with an index of their own (knnindex) use it, others exact.
        self.knn_indexes = knn_indexes
        # One client per model over the embedder's channel: each asks for its model and
        # checks that every Info and Embed answer names it (ModelMismatch); a model whose
        # answer does not is left out with a degradation. Each model has its own circuit
        # breaker: an embedder that keeps failing is not called for a while (searches
        # answer with the other legs at once instead of each waiting out embed_timeout),
        # and one slow or missing model does not open the others' circuits.
        # Query embeddings already computed (shared with the index in `serve`), keyed by
        # model; off by default.
        cache = query_cache if query_cache is not None else QueryCache(0)
        self._deadline_check = deadline_check or EmbedDeadlineCheck(embed_timeout)
        self._models = [
            _Model(
                name,
                QueryEmbedder(
                    embedder.for_model(name),
                    cache=cache,
                    breaker=(embedder_breaker if i == 0 else None) or CircuitBreaker(_breaker_name(name, i)),
                    timeout=embed_timeout,
                    # The deadline check follows the first model.
                    on_info=self._deadline_check.observe if i == 0 else None,
                    on_embed_seconds=metrics.SEARCH_STAGE_SECONDS.labels("embed").observe,
                ),
            )
            for i, name in enumerate(names)
        ]
        self.embedder = self._models[0].queries.embedder
        self._flags: TtlCache[str, bool] = TtlCache(FLAG_CACHE_TTL_S, name="search_flags")
        self._fts_plans = FtsPlanner(fts_org_first_max_events)
        # Each org's recent words, for typo tolerance (a few hundred KiB per org at most).
        self._vocabularies: TtlCache[str, dict[str, int]] = TtlCache(
            VOCABULARY_TTL_S, max_entries=64, name="vocabularies"
        )
        self._reranker_breaker = reranker_breaker or CircuitBreaker("reranker")

    async def check_embedder(self, *, timeout: float) -> None:
        """Ask the embedder for every active model now (serve's start-up): a model it does
        not serve or a query latency above embed_timeout is logged at once, not at the
        first search. Never raises: an embedder that is down at start is asked again by
        the first search."""

        async def check(model: _Model) -> None:
            try:
                await self._model_info(model, timeout=timeout)
            except FailedPrecondition as exc:  # ModelMismatch, or a model the embedder does not serve
                log.warning(
                    "the embedder serves another model than DWSEARCH_EMBED_MODEL(S) names, or not this one: "
                    "searches leave this model's legs out (full text when it is the only one) until they agree",
                    extra={"model": model.name, "error": str(exc)},
                )
            except DwsearchError as exc:
                log.warning(
                    "embedder not checked at start; searches will ask it again",
                    extra={"model": model.name, "error": str(exc)},
                )

        async with asyncio.TaskGroup() as checks:
            for model in self._models:
                checks.create_task(check(model))

    async def search(self, query: SearchQuery) -> SearchResult:
        limit = validate(query)
        with explaining(query.explain) as stages:

            async def attempt() -> SearchResult:
                stages.clear()  # a run again on the primary explains itself alone
                return await self._search(query, limit, stages)

            # On the read replica when there is one, again on the primary if it fails there.
            return await read_retrying(self.pool, attempt)

    async def _search(self, query: SearchQuery, limit: int, stages: StageTimes) -> SearchResult:
        scope = ChatScope(query.org_id, query.provider, query.external_channel_id, query.start, query.end)
        degradations: list[tuple[Degradation, str]] = []
        mode = query.mode
        if mode is not Mode.FTS and not await self._semantic_enabled(query.org_id):
            degradations.append((Degradation.SEMANTIC_DISABLED, "semantic search is off for this org"))
            mode = Mode.FTS

        rerank = self.rerank_by_default if query.rerank is None else query.rerank
        if mode is Mode.FTS:
            found = await self._full_text(scope, query.text, limit, query.explain)
            model = fusion = ""
        else:
            fusion, weights = self._fusion(query.fusion, query.fusion_weights)
            # Only the candidates the answer can use are built: the reranker's pool, or the hits.
            keep = max(RERANK_POOL, limit) if rerank else limit
            found = await self._retrieve(
                scope,
                query.text,
                mode,
                max(CANDIDATES_PER_SOURCE, limit),
                _Fusion(fusion, weights, keep, query.explain),
            )
            model = ",".join(self.models)
        degradations += found.degradations

        candidates, reranked = found.candidates, False
        if rerank and candidates:
            candidates, reranked, problem = await self._rerank(
                query.text, candidates[: max(RERANK_POOL, limit)]
            )
            if problem is not None:
                degradations.append(problem)
        hits = candidates[:limit]
        if query.sort is Sort.NEWEST:
            hits.sort(key=lambda c: (-c.end.timestamp(), -c.score, c.id))
        compiled = highlight_pattern(
            " ".join([query.text, *(w for e in found.corrections for w in e.alternatives)])
        )
        for hit in hits:
            hit.highlights = highlight_spans(compiled, hit.text)
        await self._add_context(query.org_id, hits, query.context_messages)
        for reason, _ in degradations:
            metrics.SEARCH_DEGRADED.labels(reason.value).inc()
        return SearchResult(
            hits=hits,
            mode=mode,
            model=model,
            reranked=reranked,
            fusion=fusion,
            degradations=degradations,
            typo_corrections=found.corrections,
            explain=query.explain,
            stage_times=stages,
        )

    def _fusion(
        self, method: str | None, weights: Mapping[str, float] | None
    ) -> tuple[str, dict[str, float]]:
        """A request's fusion method and weights over the server's."""
        return method or self.fusion, {**self.fusion_weights, **(weights or {})}

    async def _add_context(self, org_id: str, hits: list[Candidate], n: int) -> None:
        """Each hit's `n` messages before and after it (context_messages), in place."""
        anchored = [h for h in hits if h.message_ids]
        if not n or not anchored:
            return
        bounds = [(h.message_ids[0], h.message_ids[-1]) for h in anchored]
        async with self.pool.connection() as conn:
            around = await timed("context", conversations.context_messages(conn, org_id, bounds, n))
        for hit, (before, after) in zip(anchored, around, strict=True):
            hit.context_before, hit.context_after = before, after

    async def similar(self, query: SimilarQuery) -> SimilarResult:
        """The org's embedded windows most like the conversation, its own windows left out:
        each model's dense (and sparse) KNN from the conversation's vectors, fused."""
        return await read_retrying(self.pool, lambda: self._similar(query))

    async def _similar(self, query: SimilarQuery) -> SimilarResult:
        limit = validate_similar(query)
        if not await self._semantic_enabled(query.org_id):
            async with self.pool.connection() as conn:
                why = (await disabled_reasons(conn, [query.org_id])).get(query.org_id, "")
            raise FailedPrecondition(f"semantic search is off for org {query.org_id!r}: {why}".rstrip(": "))
        with explaining(query.explain) as stages:
            conversation, windows = await explained("conversation", self._conversation(query))
            per_source = max(CANDIDATES_PER_SOURCE, limit)
            try:
                async with asyncio.TaskGroup() as legs:
                    per_model = [
                        legs.create_task(
                            self._similar_legs(m, conversation, windows.get(m.name, []), per_source),
                            name=MODEL_LEG_TASK,
                        )
                        for m in self._models
                    ]
            except BaseExceptionGroup as group:
                raise _first_error(group) from None
            answers = [task.result() for task in per_model]
            problems = [a.degradation for a in answers if a.degradation is not None]
            if problems and len(problems) == len(answers):
                details = "; ".join(detail for _, detail in problems)
                timeouts = all(reason is Degradation.EMBEDDER_TIMEOUT for reason, _ in problems)
                error = DeadlineExceeded if timeouts else Unavailable
                raise error(f"no model could embed the open conversation: {details}")
            fusion, weights = self._fusion(query.fusion, query.fusion_weights)
            hits = self._fused(
                [leg for a in answers for leg in a.legs], _Fusion(fusion, weights, limit, query.explain)
            )[:limit]
            await self._add_context(query.org_id, hits, query.context_messages)
        for reason, _ in problems:
            metrics.SEARCH_DEGRADED.labels(reason.value).inc()
        return SimilarResult(
            hits=hits,
            conversation=conversation.scope,
            model=",".join(self.models),
            fusion=fusion,
            degradations=problems,
            embedded_models=[m.name for m, a in zip(self._models, answers, strict=True) if a.embedded],
            explain=query.explain,
            stage_times=stages,
        )

    async def _conversation(
        self, query: SimilarQuery
    ) -> tuple[_Conversation, dict[str, list[tuple[HalfVector, SparseVector | None]]]]:
        """The conversation Similar matches, and each model's embedded windows of it; its
        messages are read too when a model has no window of it (they are embedded then).
        NotFound for a message or window the org does not have, or a conversation without
        an eligible message or window."""
        org = query.org_id
        async with self.pool.connection() as conn:
            conversation = await self._anchor(conn, query)
            windows = await conversations.conversation_windows(conn, conversation.scope, self.models)
            if conversation.messages is None and len(windows) < len(self.models):
                messages = await conversations.conversation_messages(
                    conn, conversation.scope, OPEN_CONVERSATION_MESSAGES
                )
                conversation = _Conversation(conversation.scope, messages)
        if not windows and not conversation.messages:
            raise NotFound(f"org {org!r} has no eligible message in that conversation")
        return conversation, windows

    async def _anchor(self, conn: AsyncConnection[Any], query: SimilarQuery) -> _Conversation:
        """The request's conversation: a window's channel and span; a message's windows'
        span, or while none holds it its open session; or the conversation given."""
        org = query.org_id
        if query.window_id:
            scope = await conversations.window_conversation(
                conn, org, _uuid(query.window_id, "window_id", "window")
            )
            if scope is None:
                raise NotFound(f"org {org!r} has no window {query.window_id!r}")
            return _Conversation(scope)
        if query.message_id:
            message_id = _uuid(query.message_id, "message_id", "dw_chat_events")
            anchor = await conversations.message_anchor(conn, org, message_id, self.models)
            if anchor is None:
                raise NotFound(f"org {org!r} has no eligible message {query.message_id!r}")
            channel = (org, anchor.provider, anchor.external_channel_id)
            if anchor.windows_start is not None:
                return _Conversation(ChatScope(*channel, anchor.windows_start, anchor.windows_end))
            # No window holds it yet: its session, as far as it goes.
            [(before, after)] = await conversations.context_messages(
                conn, org, [(message_id, message_id)], OPEN_SESSION_REACH
            )
            session = session_around(before, anchor.message, after)
            return _Conversation(
                ChatScope(*channel, session[0].created_at, session[-1].created_at),
                session[-OPEN_CONVERSATION_MESSAGES:],
            )
        c = query.conversation
        assert c is not None  # validate_similar: exactly one is given
        return _Conversation(ChatScope(org, c.provider, c.external_channel_id, c.start, c.end))

    async def _similar_legs(
        self,
        model: _Model,
        conversation: _Conversation,
        windows: list[tuple[HalfVector, SparseVector | None]],
        k: int,
    ) -> _ModelLegs:
        """`model`'s KNN legs from the conversation's windows (their mean), or, when the
        model has none of it, from its messages embedded now; its own windows left out."""
        embedded = not windows
        if windows:
            dense, sparse = mean_vectors(windows)
        elif not conversation.messages:
            return _ModelLegs([])  # windows of other models only, and no message left to embed
        else:
            text = conversation_text(conversation.messages, self.redact)
            try:
                info, embedding = await explained(
                    f"embed:{model.name}", self._document_embedding(model, text)
                )
            except DwsearchError as exc:
                return _ModelLegs([], self._left_out(model, exc))
            dense, sparse = _vectors(model, info, embedding)
        scope = ChatScope(conversation.scope.org_id)
        legs = await self._knn_legs(model, scope, dense, sparse, k, exclude=conversation.scope)
        return _ModelLegs(legs, embedded=embedded)

    async def _document_embedding(self, model: _Model, text: str) -> tuple[ModelInfo, Embedding]:
        """`text` embedded by `model` as the sweep embeds a window (a document, dense and,
        where the model has them, sparse), in the interactive lane, through the model's
        breaker, never cached nor stored. A conversation is a document-sized input, so its
        deadline is the reranker's (DWSEARCH_RERANK_TIMEOUT_MS) rather than a query's."""
        queries = model.queries
        info = await queries.info()

        async def embed() -> Embedding:
            (embedding,) = await queries.embedder.embed(
                [text], sparse=info.sparse_supported, truncate=True, priority="interactive",
                timeout=self.rerank_timeout, expected_model=info.model_id,
            )  # fmt: skip
            return embedding

        embedding = await (embed() if queries.breaker is None else queries.breaker.call(embed))
        check_embedding(embedding, info, dense=True, sparse=info.sparse_supported)
        return info, embedding

    async def _semantic_enabled(self, org_id: str) -> bool:
        enabled = self._flags.get(org_id)
        if enabled is None:
            async with self.pool.connection() as conn:
                enabled = await semantic_search_enabled(conn, org_id)
            self._flags.put(org_id, enabled)
        return enabled

    async def _fts_org_first(self, conn: AsyncConnection[Any], org_id: str, text: str) -> bool:
        """The full-text plan for this query (dwsearch.search.ftsplan), counted."""
        org_first = await self._fts_plans.org_first(conn, org_id, text)
        metrics.SEARCH_FTS_PLAN.labels("org_first" if org_first else "gin").inc()
        return org_first

    async def _full_text(self, scope: ChatScope, text: str, limit: int, explain: bool) -> _Retrieved:
        """FTS mode: full-text matches only, newest first (the Go module's order)."""
        async with self.pool.connection() as conn:
            org_first = await self._fts_org_first(conn, scope.org_id, text)
            rows = await timed(
                "fts", fulltext.full_text(conn, scope, text, limit, recent_first=True, org_first=org_first)
            )
            corrections: list[Expansion] = []
            if not rows:
                widened = await self._typo_alternatives(conn, scope.org_id, text)
                if widened is not None:
                    corrections, alternatives = widened
                    rows = await timed(
                        "fts",
                        fulltext.full_text(
                            conn, scope, text, limit, recent_first=True, org_first=org_first,
                            alternatives=alternatives,
                        ),
                    )  # fmt: skip
        candidates = fuse([Leg("fts", rows)], explain=explain)
        candidates.sort(key=lambda c: c.sources["fts"].rank)  # keep the Go module's order
        return _Retrieved(candidates, [], corrections)

    async def _retrieve(
        self, scope: ChatScope, text: str, mode: Mode, per_source: int, fusion: _Fusion
    ) -> _Retrieved:
        """Hybrid and semantic modes: every model's legs (up to `per_source` candidates
        each) and, in hybrid, full text, run concurrently and fused. A model whose query
        embedding fails is left out with a degradation; when every model is, semantic mode
        answers with full text. A failing leg otherwise (the database) cancels the others
        and fails the search at once."""
        redacted = self.redact(text)
        full_text: asyncio.Task[_FullText] | None = None
        try:
            async with asyncio.TaskGroup() as legs:
                per_model = [
                    legs.create_task(self._model_legs(m, scope, redacted, per_source), name=MODEL_LEG_TASK)
                    for m in self._models
                ]
                if mode is Mode.HYBRID:
                    # The full-text leg waits FTS_STAGGER_S for the embed requests to get
                    # out (no longer if every model has answered or failed first).
                    await asyncio.wait(per_model, timeout=FTS_STAGGER_S)
                    full_text = legs.create_task(
                        self._fts_with_windows(scope, text, per_source), name=FTS_LEG_TASK
                    )
        except BaseExceptionGroup as group:
            raise _first_error(group) from None
        answers = [task.result() for task in per_model]
        problems = [a.degradation for a in answers if a.degradation is not None]
        if problems:
            reasons = ", ".join(reason.value for reason, _ in problems)
            message = (
                "search degraded to full-text"
                if len(problems) == len(answers)
                else "search degraded: a model's legs were left out, the other legs answer"
            )
            log.warning(message, extra={"reason": reasons, "error": problems[0][1]})
        if full_text is not None:
            found = full_text.result()
        elif len(problems) == len(answers):  # semantic mode: full-text search still answers
            found = await self._fts_with_windows(scope, text, per_source)
        else:
            found = _FullText([])
        fused = [leg for a in answers for leg in a.legs]
        if full_text is not None or found.rows:
            fused.append(Leg("fts", found.rows, found.windows))
        return _Retrieved(self._fused(fused, fusion), problems, found.corrections)

    def _fused(self, legs: list[Leg], fusion: _Fusion) -> list[Candidate]:
        started = time.perf_counter()
        candidates = fuse(
            legs, method=fusion.method, weights=fusion.weights, keep=fusion.keep, explain=fusion.explain
        )
        record("fuse", started)
        return candidates

    async def _fts_with_windows(self, scope: ChatScope, text: str, k: int) -> _FullText:
        """Full-text matches and the first model's windows that hold them (a match inside
        one joins it in fusion); run again widened for typos when nothing matched."""
        async with self.pool.connection() as conn:
            org_first = await self._fts_org_first(conn, scope.org_id, text)
            rows, windows = await timed(
                "fts",
                fulltext.full_text_with_windows(conn, scope, text, self.model, k, org_first=org_first),
            )
            if rows:
                return _FullText(rows, windows)
            widened = await self._typo_alternatives(conn, scope.org_id, text)
            if widened is None:
                return _FullText(rows, windows)
            corrections, alternatives = widened
            rows, windows = await timed(
                "fts",
                fulltext.full_text_with_windows(
                    conn, scope, text, self.model, k, org_first=org_first, alternatives=alternatives
                ),
            )
            return _FullText(rows, windows, corrections)

    async def _typo_alternatives(
        self, conn: AsyncConnection[Any], org_id: str, text: str
    ) -> tuple[list[Expansion], list[tuple[str, ...]]] | None:
        """Full text found nothing: the query's unknown latin-script words and their
        corrections (the org's words one edit away, dwsearch.search.typos), with the query
        widened to them; None when no word has a correction."""
        if not any(correctable(word) for word in query_lexemes(text)):
            return None  # e.g. a CJK or order-number query: no vocabulary read
        vocabulary = self._vocabularies.get(org_id)
        if vocabulary is None:
            vocabulary = await timed("typos", fulltext.vocabulary(conn, org_id, VOCABULARY_EVENTS))
            self._vocabularies.put(org_id, vocabulary)
        expansions = expand(text, vocabulary)
        if not expansions:
            return None
        metrics.SEARCH_TYPO_CORRECTED.inc()
        return expansions, alternatives(text, expansions)

    async def _model_info(self, model: _Model, *, timeout: float | None = None) -> ModelInfo:
        return await model.queries.info(timeout=timeout)

    async def _query_embedding(self, model: _Model, redacted: str) -> tuple[ModelInfo, Embedding]:
        """The query's embedding by `model` (interactive lane), from the query cache when it
        is there: a cached query needs no embedder, even while the model's circuit is open."""
        return await model.queries.embed(redacted)

    async def _model_legs(self, model: _Model, scope: ChatScope, redacted: str, k: int) -> _ModelLegs:
        """`model`'s dense KNN leg, and its sparse one where the query has sparse weights;
        no legs and the reason when the query embedding fails."""
        try:
            info, embedding = await explained(f"embed:{model.name}", self._query_embedding(model, redacted))
        except DwsearchError as exc:
            return _ModelLegs([], self._left_out(model, exc))
        dense, sparse = _vectors(model, info, embedding)
        return _ModelLegs(await self._knn_legs(model, scope, dense, sparse, k))

    def _left_out(self, model: _Model, exc: DwsearchError) -> tuple[Degradation, str]:
        """Why a model's legs are left out: its embedding failed or timed out."""
        reason = (
            Degradation.EMBEDDER_TIMEOUT
            if isinstance(exc, DeadlineExceeded)
            else Degradation.EMBEDDER_UNAVAILABLE
        )
        return reason, str(exc) if len(self._models) == 1 else f"model {model.name!r}: {exc}"

    async def _knn_legs(
        self,
        model: _Model,
        scope: ChatScope,
        dense_vector: HalfVector,
        sparse_vector: SparseVector | None,
        k: int,
        *,
        exclude: ChatScope | None = None,
    ) -> list[Leg]:
        """`model`'s dense KNN leg, and its sparse one when there is a sparse vector, at once;
        `exclude`: a conversation whose windows are left out."""

        async def dense() -> list[WindowRow]:
            async with self.pool.connection() as conn:
                org_index = self.knn_indexes is not None and await self.knn_indexes.has_index(
                    conn, scope.org_id, model.name, dense_vector.dimensions()
                )
                return await timed(
                    "dense",
                    knn.dense_knn(
                        conn,
                        scope,
                        model.name,
                        dense_vector,
                        k,
                        hnsw=self.hnsw,
                        org_index=org_index,
                        exclude=exclude,
                    ),
                    leg=f"dense:{model.name}",
                )

        if sparse_vector is None:  # no sparse leg: no second task either
            return [Leg(f"dense:{model.name}", await dense())]

        async def sparse() -> list[WindowRow]:
            async with self.pool.connection() as conn:
                return await timed(
                    "sparse",
                    knn.sparse_knn(conn, scope, model.name, sparse_vector, k, exclude=exclude),
                    leg=f"sparse:{model.name}",
                )

        async with asyncio.TaskGroup() as both:
            dense_rows = both.create_task(dense())
            sparse_rows = both.create_task(sparse())
        return [
            Leg(f"dense:{model.name}", dense_rows.result()),
            Leg(f"sparse:{model.name}", sparse_rows.result()),
        ]

    async def _rerank(
        self, text: str, pool: list[Candidate]
    ) -> tuple[list[Candidate], bool, tuple[Degradation, str] | None]:
        """`pool` (the fused order's top max(RERANK_POOL, limit)) reordered by the reranker,
        whether it was, and why not."""
        if self.reranker is None:
            return pool, False, (Degradation.RERANKER_NOT_CONFIGURED, "no reranker is configured")
        try:
            reranker = self.reranker
            ranked = await self._reranker_breaker.call(
                lambda: timed(
                    "rerank",
                    reranker.rerank(
                        self.redact(text),
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
            return pool, False, (reason, str(exc))
        reordered = []
        for rank, (index, score) in enumerate(ranked, start=1):
            candidate = pool[index]
            candidate.rerank = SourceRank(rank, score)
            reordered.append(candidate)
        return reordered, True, None


@dataclass(frozen=True)
class _Fusion:
    """How a call fuses its legs: method, weights, the candidates to build, explained."""

    method: str
    weights: Mapping[str, float]
    keep: int
    explain: bool = False


def _vectors(model: _Model, info: ModelInfo, embedding: Embedding) -> tuple[HalfVector, SparseVector | None]:
    """An embedding as KNN's query vectors: dense, and sparse where it has weights."""
    if embedding.dense is None:
        raise Internal(f"embedder: no dense vector for model {model.name!r}")
    sparse = SparseVector(embedding.sparse, info.sparse_dimension) if embedding.sparse else None
    return HalfVector(embedding.dense), sparse


# The names of search's concurrent legs (asyncio task names).
MODEL_LEG_TASK = "search:model-legs"
FTS_LEG_TASK = "search:full-text"


def _breaker_name(model: str, index: int) -> str:
    """The first model's embedder circuit keeps its old name ("embedder")."""
    return "embedder" if index == 0 else f"embedder:{model}"


def _first_error(error: BaseException) -> BaseException:
    """A task group's failure as the first error behind it (the database's, say), which
    callers and the gRPC layer map to a status as they would one leg's. Several legs
    usually fail for one cause (a database restart fails the dense, sparse and full-text
    queries together); the first to fail stands for them, as it did with gather."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
