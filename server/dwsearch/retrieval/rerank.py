"""Reranking, the retrieval core's: the reranker behind its circuit breaker and deadline,
the one way chat search (Searcher) and agent context (AgentContextBuilder) rerank, and how
both degrade: no reranker, a timeout or a failure keeps the order they had, with the
reason (docs/design.md, "Reranking")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from dwsearch.clients.breaker import CircuitBreaker
from dwsearch.clients.reranker import RerankerClient
from dwsearch.common.errors import DeadlineExceeded, DwsearchError
from dwsearch.retrieval.degradation import Degradation

T = TypeVar("T")

Ranked = list[tuple[int, float]]
"""(document index, reranker score), best first."""


def _untimed(stage: str, work: Awaitable[T]) -> Awaitable[T]:
    return work


class Reranking:
    """`reranker` (None: not configured) called in the interactive lane within `timeout`,
    through `breaker` (one per process: a reranker that keeps failing is not called for a
    while). `stage(name, work)` times the call the way its caller times its stages."""

    def __init__(
        self,
        reranker: RerankerClient | None,
        *,
        timeout: float,
        breaker: CircuitBreaker | None = None,
        stage: Callable[[str, Awaitable[Ranked]], Awaitable[Ranked]] = _untimed,
    ) -> None:
        self.reranker = reranker
        self.timeout = timeout
        self.breaker = breaker or CircuitBreaker("reranker")
        self._stage = stage

    async def rerank(
        self, query: str, documents: Sequence[str], *, top_n: int = 0
    ) -> tuple[Ranked | None, tuple[Degradation, str] | None]:
        """The reranker's order of `documents` for `query` (the best `top_n`; 0: all), or
        None and why not."""
        reranker = self.reranker
        if reranker is None:
            return None, (Degradation.RERANKER_NOT_CONFIGURED, "no reranker is configured")
        try:
            ranked = await self.breaker.call(
                lambda: self._stage(
                    "rerank",
                    reranker.rerank(
                        query, list(documents), top_n=top_n, priority="interactive", timeout=self.timeout
                    ),
                )
            )
        except DwsearchError as exc:
            reason = (
                Degradation.RERANKER_TIMEOUT
                if isinstance(exc, DeadlineExceeded)
                else Degradation.RERANKER_UNAVAILABLE
            )
            return None, (reason, str(exc))
        return ranked, None
