"""The search pipeline: full text and, per active model, the query embedding then dense and
sparse KNN, all concurrent; window-level fusion of every leg; optional reranking —
degrading to what still works, and saying why.

search() picks the mode and assembles the SearchResult once from what each stage
returns: full text (FTS mode) or _retrieve (hybrid and semantic: its legs run in an
asyncio.TaskGroup), then _rerank and the context. A model whose query embedding fails
returns no legs and a degradation instead of raising; any other failure of a leg (the
database) cancels its siblings and fails the search. The legs are dwsearch.search.legs';
Similar (dwsearch.search.similar) shares them. With `explain` each stage's time is
recorded and fusion explains every hit."""

from __future__ import annotations

import asyncio
import logging

from psycopg_pool import AsyncConnectionPool

from dwsearch.clients.breaker import CircuitBreaker
from dwsearch.clients.embedder import EmbedderClient
from dwsearch.clients.querycache import QueryCache
from dwsearch.clients.reranker import RerankerClient
from dwsearch.common import metrics, tracing
from dwsearch.db.readpool import ReadPool, read_retrying
from dwsearch.retrieval import candidates as candidate_policy
from dwsearch.retrieval.degradation import Degradation
from dwsearch.retrieval.pipeline import both, legs_at_once, rerank_pool
from dwsearch.retrieval.queries import QueryEmbedders
from dwsearch.retrieval.rerank import Reranking
from dwsearch.retrieval.stages import StageTimes, explaining, timed
from dwsearch.search.deadline import EmbedDeadlineCheck
from dwsearch.search.fusion import Candidate, Leg, SourceRank
from dwsearch.search.highlight import pattern as highlight_pattern
from dwsearch.search.highlight import spans as highlight_spans
from dwsearch.search.knnindex import OrgKnnIndexes
from dwsearch.search.legs import (
    FTS_LEG_TASK,
    LEXICAL_LEG_TASK,
    MODEL_LEG_TASK,
    ChatLegs,
    FullText,
    FusionPlan,
    Retrieved,
)
from dwsearch.search.query import Mode, SearchQuery, SearchResult, SimilarQuery, SimilarResult, Sort, validate
from dwsearch.search.rows import WindowRow
from dwsearch.search.settings import SearchSettings
from dwsearch.search.similar import SimilarSearch
from dwsearch.search.store.scope import ChatScope

log = logging.getLogger(__name__)

# The pool the reranker reorders (docs/design.md, "Reranking": retrieve top ~50 → rerank
# → top 5-10); grows to the request's limit (at most MAX_LIMIT, well under the reranker's
# 512 documents per call), so a limit up to MAX_LIMIT holds with and without reranking.
RERANK_POOL = 50

# How long after the query embedding is requested hybrid search starts its full-text leg
# (at once if the embedding fails first). Started in the same instant, the full-text
# query's backend and the embed request compete for the CPUs: on a 2-core host running
# everything (`python -m bench.search`; a small self-hosted node) the request reached the
# embedder 2.75 ms after it was sent instead of 0.86 ms, and hybrid p50 was 1 ms slower than
# with this stagger. It costs about this much (the event loop's timer rounds up to the next
# millisecond), and only when full text is the slower leg.
FTS_STAGGER_S = 0.001


class Searcher:
    """Search (and Similar, SimilarSearch over the same legs) of the org's chat: `pool`
    (the read replica's when there is one), one client per active model over `embedder`'s
    channel, the reranker when there is one, and the settings."""

    def __init__(
        self,
        pool: AsyncConnectionPool | ReadPool,
        embedder: EmbedderClient,
        reranker: RerankerClient | None,
        settings: SearchSettings,
        *,
        query_cache: QueryCache | None = None,
        deadline_check: EmbedDeadlineCheck | None = None,
        embedder_breaker: CircuitBreaker | None = None,
        reranker_breaker: CircuitBreaker | None = None,
        knn_indexes: OrgKnnIndexes | None = None,
        queries: QueryEmbedders | None = None,
    ) -> None:
        """`queries`: the process's query embedders (serve's, shared with every index);
        made over `embedder` with `query_cache`, `deadline_check` and `embedder_breaker`
        when None."""
        self.legs = ChatLegs(
            pool,
            embedder,
            settings,
            query_cache=query_cache,
            deadline_check=deadline_check,
            embedder_breaker=embedder_breaker,
            knn_indexes=knn_indexes,
            queries=queries,
        )
        self.models = settings.models
        self.rerank_by_default = settings.rerank_by_default
        # The retrieval core's reranking, timed as search's stages are.
        self.reranking = Reranking(
            reranker, timeout=settings.rerank_timeout, breaker=reranker_breaker, stage=timed
        )
        self._similar = SimilarSearch(self.legs, document_timeout=settings.rerank_timeout)

    async def check_embedder(self, *, timeout: float) -> None:
        """Ask the embedder for every active model now (serve's start-up): a model it does
        not serve or a query latency above embed_timeout is logged at once. Never raises."""
        await self.legs.check_embedder(timeout=timeout)

    async def similar(self, query: SimilarQuery) -> SimilarResult:
        """The org's embedded windows most like the conversation (dwsearch.search.similar)."""
        return await self._similar(query)

    async def search(self, query: SearchQuery) -> SearchResult:
        limit = validate(query)
        with explaining(query.explain) as stages:

            async def attempt() -> SearchResult:
                stages.clear()  # a run again on the primary explains itself alone
                return await self._search(query, limit, stages)

            # On the read replica when there is one, again on the primary if it fails there.
            return await read_retrying(self.legs.pool, attempt)

    async def _search(self, query: SearchQuery, limit: int, stages: StageTimes) -> SearchResult:
        scope = ChatScope(query.org_id, query.provider, query.external_channel_id, query.start, query.end)
        degradations: list[tuple[Degradation, str]] = []
        mode = query.mode
        tracing.annotate(org_id=query.org_id, mode=mode.value, limit=limit, explain=query.explain)
        if mode is not Mode.FTS and not await tracing.traced(
            "stage flags", self.legs.semantic_enabled(query.org_id), stage="flags"
        ):
            degradations.append((Degradation.SEMANTIC_DISABLED, "semantic search is off for this org"))
            mode = Mode.FTS

        rerank = self.rerank_by_default if query.rerank is None else query.rerank
        if mode is Mode.FTS:
            found = await self.legs.full_text(scope, query.text, limit, query.explain)
            model = fusion = profile = ""
        else:
            # Only the candidates the answer can use are built: the reranker's pool, or the hits.
            keep = max(RERANK_POOL, limit) if rerank else limit
            plan = self.legs.fusion_for(query.fusion, query.fusion_weights, keep, query.explain)
            fusion, profile = plan.method, self.legs.settings.profile.name
            found = await self._retrieve(scope, query.text, mode, candidate_policy.per_leg(limit), plan)
            model = ",".join(self.legs.models)
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
        await self.legs.add_context(query.org_id, hits, query.context_messages)
        for reason, _ in degradations:
            metrics.SEARCH_DEGRADED.labels(reason.value).inc()
        tracing.annotate(
            mode_used=mode.value,
            hits=len(hits),
            reranked=reranked,
            degradations=",".join(sorted({reason.value for reason, _ in degradations})) or None,
        )
        return SearchResult(
            hits=hits,
            mode=mode,
            model=model,
            reranked=reranked,
            fusion=fusion,
            fusion_profile=profile,
            degradations=degradations,
            typo_corrections=found.corrections,
            explain=query.explain,
            stage_times=stages,
        )

    async def _retrieve(
        self, scope: ChatScope, text: str, mode: Mode, per_source: int, fusion: FusionPlan
    ) -> Retrieved:
        """Hybrid and semantic modes: every model's legs (up to `per_source` candidates
        each) and, in hybrid, full text and the lexical leg, run concurrently and fused. A
        model whose query embedding fails is left out with a degradation; when every model
        is, semantic mode answers with full text and the lexical leg (neither needs the
        embedder). A failing leg otherwise (the database) cancels the others
        and fails the search at once."""
        redacted = self.legs.redaction.text(text)
        full_text: asyncio.Task[FullText] | None = None
        lexical: asyncio.Task[list[WindowRow]] | None = None
        async with legs_at_once() as legs:
            per_model = [
                legs.create_task(self.legs.model_legs(m, scope, redacted, per_source), name=MODEL_LEG_TASK)
                for m in self.legs.active
            ]
            if mode is Mode.HYBRID:
                # The full-text leg waits FTS_STAGGER_S for the embed requests to get
                # out (no longer if every model has answered or failed first).
                await asyncio.wait(per_model, timeout=FTS_STAGGER_S)
                full_text = legs.create_task(
                    self.legs.fts_with_windows(scope, text, per_source), name=FTS_LEG_TASK
                )
                if self.legs.settings.lexical:
                    lexical = legs.create_task(
                        self.legs.lexical(scope, redacted, per_source), name=LEXICAL_LEG_TASK
                    )
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
        lexical_rows = lexical.result() if lexical is not None else None
        if full_text is not None:
            found = full_text.result()
        elif len(problems) == len(answers):  # semantic mode: the lexical legs still answer
            if not self.legs.settings.lexical:
                found = await self.legs.fts_with_windows(scope, text, per_source)
            else:
                found, lexical_rows = await both(
                    self.legs.fts_with_windows(scope, text, per_source),
                    self.legs.lexical(scope, redacted, per_source),
                )
        else:
            found = FullText([])
        fused = [leg for a in answers for leg in a.legs]
        if lexical_rows is not None:
            fused.append(Leg("lexical", lexical_rows))
        if full_text is not None or found.rows:
            fused.append(Leg("fts", found.rows, found.windows))
        return Retrieved(self.legs.fused(fused, fusion), problems, found.corrections)

    async def _rerank(
        self, text: str, pool: list[Candidate]
    ) -> tuple[list[Candidate], bool, tuple[Degradation, str] | None]:
        """`pool` (the fused order's top max(RERANK_POOL, limit)) reordered by the reranker,
        whether it was, and why not."""
        reordered = await rerank_pool(
            self.reranking,
            self.legs.redaction.text(text),
            pool,
            text=lambda c: c.text,
            place=_reranked,
            kept="search returned fused order",
        )
        return reordered.hits, reordered.reranked, reordered.problem


def _reranked(candidate: Candidate, rank: int, score: float) -> Candidate:
    candidate.rerank = SourceRank(rank, score)
    return candidate
