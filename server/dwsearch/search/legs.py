"""Chat search's legs, shared by Search (dwsearch.search.searcher) and Similar
(dwsearch.search.similar): the active models and their query embeddings, full text (two
plans, widened for typos), the lexical leg (BM25 over the windows), each model's dense and
sparse KNN, the org's flags, fusion of the legs, and the messages around hits. A model whose embedding fails returns no legs and
why (a degradation); any other failure of a leg (the database) is raised."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pgvector import HalfVector, SparseVector
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from dwsearch.clients.breaker import CircuitBreaker
from dwsearch.clients.embedder import EmbedderClient, Embedding, ModelInfo
from dwsearch.clients.querycache import QueryCache
from dwsearch.clients.queryembedder import QueryEmbedder
from dwsearch.common import metrics
from dwsearch.common.errors import DwsearchError, FailedPrecondition, Internal
from dwsearch.common.ttlcache import TtlCache
from dwsearch.db.readpool import ReadPool
from dwsearch.flags import semantic_search_enabled
from dwsearch.retrieval.degradation import Degradation
from dwsearch.retrieval.pipeline import at_once, both
from dwsearch.retrieval.queries import QueryEmbedders, left_out
from dwsearch.retrieval.stages import explained, record, stage_span, timed
from dwsearch.search.deadline import EmbedDeadlineCheck
from dwsearch.search.ftsplan import FtsPlanner, query_lexemes
from dwsearch.search.fusion import LEXICAL_POWER, Candidate, Leg, fuse
from dwsearch.search.knnindex import OrgKnnIndexes
from dwsearch.search.rows import MessageRow, WindowRow
from dwsearch.search.settings import SearchSettings
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

# How long an org's feature-flag answer is reused: saves a round trip per search; a flag
# flip takes effect within this time.
FLAG_CACHE_TTL_S = 5.0


@dataclass(frozen=True)
class FullText:
    """What the full-text leg found: messages in rank order, the embedded windows that
    hold any of them, and the query words widened for typos (empty when none were)."""

    rows: list[MessageRow]
    windows: list[WindowRow] = field(default_factory=list)
    corrections: list[Expansion] = field(default_factory=list)


@dataclass(frozen=True)
class ModelLegs:
    """One model's legs (dense, plus sparse where it has them), or none and why; `embedded`:
    Similar embedded the conversation for it."""

    legs: list[Leg]
    degradation: tuple[Degradation, str] | None = None
    embedded: bool = False


@dataclass(frozen=True)
class Retrieved:
    """Fused candidates, best first, and what was left out on the way."""

    candidates: list[Candidate]
    degradations: list[tuple[Degradation, str]]
    corrections: list[Expansion]


@dataclass(frozen=True)
class ActiveModel:
    """An active model: its name and its query embeddings (a client that asks for it and
    checks every answer names it, its Info, its circuit breaker, the query cache)."""

    name: str
    queries: QueryEmbedder


@dataclass(frozen=True)
class FusionPlan:
    """How a call fuses its legs: method, weights, the candidates to build, explained."""

    method: str
    weights: Mapping[str, float]
    keep: int
    explain: bool = False
    lexical_power: float = LEXICAL_POWER


class ChatLegs:
    """The legs of chat search over `pool` (the read replica's when there is one) and one
    client per active model over `embedder`'s channel."""

    def __init__(
        self,
        pool: AsyncConnectionPool | ReadPool,
        embedder: EmbedderClient,
        settings: SearchSettings,
        *,
        query_cache: QueryCache | None = None,
        deadline_check: EmbedDeadlineCheck | None = None,
        embedder_breaker: CircuitBreaker | None = None,
        knn_indexes: OrgKnnIndexes | None = None,
        queries: QueryEmbedders | None = None,
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.models = settings.models
        self.model = settings.models[0]
        self.redaction = settings.redaction
        # knn_index = auto: orgs with an index of their own (knnindex) use it, others exact.
        self.knn_indexes = knn_indexes
        # One client per model over the embedder's channel: each asks for its model and
        # checks that every Info and Embed answer names it (ModelMismatch); a model whose
        # answer does not is left out with a degradation. Each model has its own circuit
        # breaker: an embedder that keeps failing is not called for a while (searches
        # answer with the other legs at once instead of each waiting out embed_timeout),
        # and one slow or missing model does not open the others' circuits.
        # The process's query embedders (dwsearch.retrieval.queries), shared with every index
        # in `serve`; made here over `embedder` when none is given.
        self.deadline_check = deadline_check or EmbedDeadlineCheck(settings.embed_timeout)
        self.queries = queries or QueryEmbedders(
            embedder,
            timeout=settings.embed_timeout,
            cache=query_cache,
            first_model=settings.models[0],
            first_breaker=embedder_breaker,
            # The deadline check follows the first model.
            on_first_info=self.deadline_check.observe,
            on_embed_seconds=metrics.SEARCH_STAGE_SECONDS.labels("embed").observe,
        )
        self.active = [ActiveModel(name, self.queries.for_model(name)) for name in settings.models]
        self._flags: TtlCache[str, bool] = TtlCache(FLAG_CACHE_TTL_S, name="search_flags")
        self._fts_plans = FtsPlanner(settings.fts_org_first_max_events)
        # Each org's recent words, for typo tolerance (a few hundred KiB per org at most).
        self._vocabularies: TtlCache[str, dict[str, int]] = TtlCache(
            VOCABULARY_TTL_S, max_entries=64, name="vocabularies"
        )

    async def check_embedder(self, *, timeout: float) -> None:
        """Ask the embedder for every active model now (serve's start-up): a model it does
        not serve or a query latency above embed_timeout is logged at once, not at the
        first search. Never raises: an embedder that is down at start is asked again by
        the first search."""

        async def check(model: ActiveModel) -> None:
            try:
                await self.model_info(model, timeout=timeout)
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

        await at_once([check(model) for model in self.active])

    async def semantic_enabled(self, org_id: str) -> bool:
        enabled = self._flags.get(org_id)
        if enabled is None:
            async with self.pool.connection() as conn:
                enabled = await semantic_search_enabled(conn, org_id)
            self._flags.put(org_id, enabled)
        return enabled

    async def fts_org_first(self, conn: AsyncConnection[Any], org_id: str, text: str) -> bool:
        """The full-text plan for this query (dwsearch.search.ftsplan), counted."""
        org_first = await self._fts_plans.org_first(conn, org_id, text)
        metrics.SEARCH_FTS_PLAN.labels("org_first" if org_first else "gin").inc()
        return org_first

    async def full_text(self, scope: ChatScope, text: str, limit: int, explain: bool) -> Retrieved:
        """FTS mode: full-text matches only, newest first (the Go module's order)."""
        async with self.pool.connection() as conn:
            org_first = await self.fts_org_first(conn, scope.org_id, text)
            rows = await timed(
                "fts", fulltext.full_text(conn, scope, text, limit, recent_first=True, org_first=org_first)
            )
            corrections: list[Expansion] = []
            if not rows:
                widened = await self.typo_alternatives(conn, scope.org_id, text)
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
        return Retrieved(candidates, [], corrections)

    async def fts_with_windows(self, scope: ChatScope, text: str, k: int) -> FullText:
        """Full-text matches and the first model's windows that hold them (a match inside
        one joins it in fusion); run again widened for typos when nothing matched."""
        async with self.pool.connection() as conn:
            org_first = await self.fts_org_first(conn, scope.org_id, text)
            rows, windows = await timed(
                "fts",
                fulltext.full_text_with_windows(conn, scope, text, self.model, k, org_first=org_first),
            )
            if rows:
                return FullText(rows, windows)
            widened = await self.typo_alternatives(conn, scope.org_id, text)
            if widened is None:
                return FullText(rows, windows)
            corrections, alternatives = widened
            rows, windows = await timed(
                "fts",
                fulltext.full_text_with_windows(
                    conn, scope, text, self.model, k, org_first=org_first, alternatives=alternatives
                ),
            )
            return FullText(rows, windows, corrections)

    async def typo_alternatives(
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

    async def model_info(self, model: ActiveModel, *, timeout: float | None = None) -> ModelInfo:
        return await model.queries.info(timeout=timeout)

    async def query_embedding(self, model: ActiveModel, redacted: str) -> tuple[ModelInfo, Embedding]:
        """The query's embedding by `model` (interactive lane), from the query cache when it
        is there: a cached query needs no embedder, even while the model's circuit is open."""
        return await model.queries.embed(redacted)

    async def model_legs(self, model: ActiveModel, scope: ChatScope, redacted: str, k: int) -> ModelLegs:
        """`model`'s dense KNN leg, and its sparse one where the query has sparse weights;
        no legs and the reason when the query embedding fails."""
        try:
            info, embedding = await explained(f"embed:{model.name}", self.query_embedding(model, redacted))
        except DwsearchError as exc:
            return ModelLegs([], self.left_out(model, exc))
        dense, sparse = knn_vectors(model, info, embedding)
        return ModelLegs(await self.knn_legs(model, scope, dense, sparse, k))

    def left_out(self, model: ActiveModel, exc: DwsearchError) -> tuple[Degradation, str]:
        """Why a model's legs are left out: its embedding failed or timed out."""
        return left_out(exc, "" if len(self.active) == 1 else f"model {model.name!r}")

    async def knn_legs(
        self,
        model: ActiveModel,
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
                        hnsw=self.settings.hnsw,
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

        dense_rows, sparse_rows = await both(dense(), sparse())
        return [Leg(f"dense:{model.name}", dense_rows), Leg(f"sparse:{model.name}", sparse_rows)]

    async def lexical(self, scope: ChatScope, redacted: str, k: int) -> list[WindowRow]:
        """The lexical leg: the first model's windows by BM25 over the query's words and
        Chinese bigrams (the text as embedded: redacted). Needs no embedder."""
        async with self.pool.connection() as conn:
            return await timed(
                "lexical", knn.lexical_knn(conn, scope, self.model, redacted, k), leg="lexical"
            )

    async def add_context(self, org_id: str, hits: list[Candidate], n: int) -> None:
        """Each hit's `n` messages before and after it (context_messages), in place."""
        anchored = [h for h in hits if h.message_ids]
        if not n or not anchored:
            return
        bounds = [(h.message_ids[0], h.message_ids[-1]) for h in anchored]
        async with self.pool.connection() as conn:
            around = await timed("context", conversations.context_messages(conn, org_id, bounds, n))
        for hit, (before, after) in zip(anchored, around, strict=True):
            hit.context_before, hit.context_after = before, after

    def fused(self, legs: list[Leg], fusion: FusionPlan) -> list[Candidate]:
        started = time.perf_counter()
        with stage_span("fuse"):
            candidates = fuse(
                legs,
                method=fusion.method,
                weights=fusion.weights,
                keep=fusion.keep,
                explain=fusion.explain,
                lexical_power=fusion.lexical_power,
            )
        record("fuse", started)
        return candidates

    def fusion_for(
        self, method: str | None, weights: Mapping[str, float] | None, keep: int, explain: bool
    ) -> FusionPlan:
        """A request's fusion method and weights over the server's, building the best `keep`."""
        return FusionPlan(
            method or self.settings.fusion,
            {**self.settings.fusion_weights, **(weights or {})},
            keep,
            explain,
            self.settings.lexical_power,
        )


def knn_vectors(
    model: ActiveModel, info: ModelInfo, embedding: Embedding
) -> tuple[HalfVector, SparseVector | None]:
    """An embedding as KNN's query vectors: dense, and sparse where it has weights."""
    if embedding.dense is None:
        raise Internal(f"embedder: no dense vector for model {model.name!r}")
    sparse = SparseVector(embedding.sparse, info.sparse_dimension) if embedding.sparse else None
    return HalfVector(embedding.dense), sparse


# The names of search's concurrent legs (asyncio task names).
MODEL_LEG_TASK = "search:model-legs"
FTS_LEG_TASK = "search:full-text"
LEXICAL_LEG_TASK = "search:lexical"
