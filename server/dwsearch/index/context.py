"""Agent context (docs/design.md, "Agent context"): for one customer message, similar resolved
tickets, knowledge articles and high-trust responses of one app.

The message is redacted once and embedded once (dense + sparse); every query reuses the
vectors. Without rerank: the three sections' filtered queries in parallel. With rerank:
dense top 30 + sparse top 30 among the app's documents that belong to any section,
deduplicated by id, reordered by the RerankerService, top 10, split by section. When
the reranker is not configured, fails or times out, the answer is exactly the one
without rerank, marked degraded with the reason.

Filters are built as ASTs, so an app id is always a bound parameter, whatever quotes
it contains.

With knowledge gaps configured (dwsearch.index.gaps), the message is observed once the
answer is built: recorded in the background when its org opted in and its best knowledge
score is under the threshold, never delaying or failing the answer.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TypeVar

from dwsearch.clients.breaker import CircuitBreaker
from dwsearch.clients.reranker import RerankerClient
from dwsearch.common import metrics
from dwsearch.common.errors import DwsearchError, InvalidArgument, Unavailable
from dwsearch.db.readpool import read_retrying
from dwsearch.index.base import QueryVectors
from dwsearch.index.document_index import DocumentIndex
from dwsearch.index.documents import (
    MAX_ID_BYTES,
    Fusion,
    Hit,
    Include,
    check_known_names,
    check_namespace,
    check_query_text,
    check_text,
)
from dwsearch.index.filter import And, Compare, Node, Or, evaluate
from dwsearch.index.gaps import KnowledgeGaps
from dwsearch.retrieval import candidates as candidate_policy
from dwsearch.retrieval import stages
from dwsearch.retrieval.degradation import Degradation
from dwsearch.retrieval.pipeline import at_once, rerank_pool
from dwsearch.retrieval.queries import degrades, left_out
from dwsearch.retrieval.rerank import Reranking

T = TypeVar("T")

MIN_TRUST_SCORE = Decimal("0.85")
"""A response is offered to the agent only above this trustScore (docs/design.md,
"Agent context")."""
RERANK_CANDIDATES_PER_SOURCE = 30
"""Candidates each source gives a reranked agent context (the seed's "dense 30 + sparse 30,
dedupe, rerank to 10"): the candidate policy's floor for it (dwsearch.retrieval.candidates)."""
RERANK_TOP_N = 10
MAX_APP_ID_BYTES = MAX_ID_BYTES
CONTEXT_INCLUDE = Include(data=True, metadata=True)


class Section(enum.Enum):
    SIMILAR_TICKETS = "similar_tickets"
    KNOWLEDGE = "knowledge"
    GOOD_RESPONSES = "good_responses"


def _field(name: str, op: str, value: str | Decimal) -> Compare:
    return Compare((name,), op, value)


# What belongs in each section besides the app id, and how many of it.
SECTION_CONDITIONS: dict[Section, tuple[Node, ...]] = {
    Section.SIMILAR_TICKETS: (_field("type", "=", "conversation"), _field("resolution", "!=", "escalated")),
    Section.KNOWLEDGE: (_field("type", "=", "knowledge"),),
    Section.GOOD_RESPONSES: (_field("type", "=", "response"), _field("trustScore", ">", MIN_TRUST_SCORE)),
}
SECTION_TOP_K = {Section.SIMILAR_TICKETS: 3, Section.KNOWLEDGE: 5, Section.GOOD_RESPONSES: 3}


def section_filter(app_id: str, section: Section) -> Node:
    """E.g. appId = <app_id> AND type = 'knowledge'."""
    return And((_field("appId", "=", app_id), *SECTION_CONDITIONS[section]))


def candidate_filter(app_id: str) -> Node:
    """The app's documents that belong to some section: what the reranker may choose from
    (an escalated ticket or a low-trust response could only take a top-10 place from a
    document that can be shown)."""
    return And((_field("appId", "=", app_id), Or(tuple(And(c) for c in SECTION_CONDITIONS.values()))))


def split_by_section(hits: Sequence[Hit]) -> dict[Section, list[Hit]]:
    """Hits in order, each into the section it belongs to, each section cut to its size."""
    sections: dict[Section, list[Hit]] = {section: [] for section in Section}
    for hit in hits:
        found = hit.document.metadata or {}
        for section, conditions in SECTION_CONDITIONS.items():
            if evaluate(And(conditions), found):
                if len(sections[section]) < SECTION_TOP_K[section]:
                    sections[section].append(hit)
                break
    return sections


def dedupe(hits: Sequence[Hit]) -> list[Hit]:
    """First occurrence of each id."""
    seen: set[str] = set()
    unique = []
    for hit in hits:
        if hit.document.id not in seen:
            seen.add(hit.document.id)
            unique.append(hit)
    return unique


@dataclass
class AgentContext:
    sections: dict[Section, list[Hit]]
    reranked: bool = False
    degradations: list[tuple[Degradation, str]] = field(default_factory=list)


class AgentContextBuilder:
    def __init__(
        self,
        index: DocumentIndex,
        reranker: RerankerClient | None,
        *,
        rerank_timeout: float,
        reranker_breaker: CircuitBreaker | None = None,
        gaps: KnowledgeGaps | None = None,
    ) -> None:
        self.index = index
        # The retrieval core's reranking, timed as agent context's stages are.
        self.reranking = Reranking(reranker, timeout=rerank_timeout, breaker=reranker_breaker, stage=_timed)
        # Knowledge gaps recorded from the messages (None: not recorded).
        self.gaps = gaps

    async def build(
        self,
        namespace: str,
        message: str,
        app_id: str,
        *,
        rerank: bool = False,
        known_names: Sequence[str] = (),
    ) -> AgentContext:
        context = await self._build(namespace, message, app_id, rerank=rerank, known_names=known_names)
        for reason, _ in context.degradations:
            metrics.AGENT_CONTEXT_DEGRADED.labels(reason.value).inc()
        return context

    async def _build(
        self, namespace: str, message: str, app_id: str, *, rerank: bool, known_names: Sequence[str]
    ) -> AgentContext:
        check_namespace(namespace)
        check_query_text(message, "message")
        if not app_id:
            raise InvalidArgument("app_id: required")
        check_text(app_id, "app_id", max_bytes=MAX_APP_ID_BYTES)
        check_known_names(known_names)
        try:
            vectors = await _timed("embed", self.index.embed_query(message, known_names=known_names))
        except DwsearchError as exc:
            if not degrades(exc):
                raise
            # The embedder late or failing: each section gets what the legs that need no
            # embedder find (a BM25 space's sparse side), and the answer says why, at the
            # embedding's deadline; where every leg needs the embedding, UNAVAILABLE then,
            # as the index's Query is.
            without = await self.index.without_embedder(message, known_names)
            if without is None:
                raise Unavailable(
                    f"agent context needs the embedder, which did not answer in time or failed: {exc}"
                ) from exc
            if without.sparse is None:  # not one term in the message
                return AgentContext({s: [] for s in Section}, degradations=[left_out(exc)])
            context = await read_retrying(
                self.index.read_pool, lambda: self._context(namespace, without, app_id, rerank=rerank)
            )
            context.degradations.insert(0, left_out(exc))
            return context
        # Its reads on the replica when there is one, again on the primary if it fails them.
        context = await read_retrying(
            self.index.read_pool, lambda: self._context(namespace, vectors, app_id, rerank=rerank)
        )
        if self.gaps is not None:  # in the background: it never delays nor fails the answer
            knowledge = section_filter(app_id, Section.KNOWLEDGE)
            self.gaps.observe(namespace, app_id, vectors, knowledge, known_names=known_names)
        return context

    async def _context(
        self, namespace: str, vectors: QueryVectors, app_id: str, *, rerank: bool
    ) -> AgentContext:
        degradations: list[tuple[Degradation, str]] = []
        if rerank:
            ranked, problem = await self._reranked(namespace, vectors, app_id)
            if problem is None:
                return AgentContext(split_by_section(ranked), reranked=True)
            degradations.append(problem)
        sections = await _timed("retrieve", self._parallel(namespace, vectors, app_id))
        return AgentContext(sections, degradations=degradations)

    async def _reranked(
        self, namespace: str, vectors: QueryVectors, app_id: str
    ) -> tuple[list[Hit], tuple[Degradation, str] | None]:
        """Every section's candidates reranked together (the reranker's RERANK_TOP_N best,
        scored by it, best first), or why not."""
        if self.reranking.reranker is None:
            return [], (Degradation.RERANKER_NOT_CONFIGURED, "no reranker is configured")
        dense, sparse = await _timed(
            "retrieve",
            self.index.nearest(
                namespace,
                vectors,
                candidate_policy.per_leg(RERANK_TOP_N, at_least=RERANK_CANDIDATES_PER_SOURCE),
                candidate_filter(app_id),
                CONTEXT_INCLUDE,
            ),
        )
        candidates = dedupe([*dense, *sparse])
        if not candidates:
            return [], None
        reordered = await rerank_pool(
            self.reranking,
            vectors.text,
            candidates,
            text=lambda c: c.document.data or "",
            place=lambda c, _rank, score: Hit(c.document, score),
            top_n=RERANK_TOP_N,
            kept="agent context not reranked",
        )
        return (reordered.hits, None) if reordered.reranked else ([], reordered.problem)

    async def _parallel(self, namespace: str, vectors: QueryVectors, app_id: str) -> dict[Section, list[Hit]]:
        """The three sections' queries, in parallel."""
        results = await at_once(
            [
                self.index.by_vectors(
                    namespace,
                    vectors,
                    SECTION_TOP_K[s],
                    section_filter(app_id, s),
                    Fusion.RRF,
                    CONTEXT_INCLUDE,
                )
                for s in Section
            ]
        )
        return dict(zip(Section, results, strict=True))


def _timed(stage: str, work: Awaitable[T]) -> Awaitable[T]:
    """`work` as the retrieval core times a stage, in dwsearch_agent_context_stage_seconds."""
    return stages.timed(stage, work, histogram=metrics.AGENT_CONTEXT_STAGE_SECONDS)
