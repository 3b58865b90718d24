"""The retrieval core's orchestration, whatever the hit: a call's legs run at once (the
first to fail stands for them all), and a fused pool reordered by the reranker (or kept, with
the reason). Chat search's legs (Searcher, SimilarSearch, ChatLegs) and agent context's
sections run at once through these, and Search and agent context rerank through rerank_pool;
fusion is dwsearch.retrieval.fusion's, stage times dwsearch.retrieval.stages'.

A call goes: legs at once (`legs_at_once`, `at_once`, `both`) -> fusion (`fusion.fuse_legs`, by the
caller's keys) -> `rerank_pool` -> the answer, explained by `fusion.LegScore` parts and
`stages` times."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from dwsearch.retrieval.degradation import Degradation
from dwsearch.retrieval.rerank import Reranking

log = logging.getLogger(__name__)

T = TypeVar("T")
U = TypeVar("U")
H = TypeVar("H")


def first_error(error: BaseException) -> BaseException:
    """A task group's failure as the first error behind it (the database's, say), which
    callers and the gRPC layer map to a status as they would one leg's. Several legs
    usually fail for one cause (a database restart fails the dense, sparse and full-text
    queries together); the first to fail stands for them, as it did with gather."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


@contextlib.asynccontextmanager
async def legs_at_once() -> AsyncIterator[asyncio.TaskGroup]:
    """A task group for a call's legs: a leg that fails cancels the others, and the call
    fails with the first error (first_error), not an exception group."""
    try:
        async with asyncio.TaskGroup() as legs:
            yield legs
    except BaseExceptionGroup as group:
        raise first_error(group) from None


async def at_once(work: Sequence[Awaitable[T]]) -> list[T]:
    """Every awaitable of `work` at once, their results in its order (legs_at_once)."""
    async with legs_at_once() as legs:
        tasks = [legs.create_task(_awaited(w)) for w in work]
    return [task.result() for task in tasks]


async def both(first: Awaitable[T], second: Awaitable[U]) -> tuple[T, U]:
    """Two legs of different kinds at once, their results (legs_at_once)."""
    async with legs_at_once() as legs:
        one = legs.create_task(_awaited(first))
        two = legs.create_task(_awaited(second))
    return one.result(), two.result()


async def _awaited(work: Awaitable[T]) -> T:
    return await work


@dataclass(frozen=True)
class Reordered(Generic[H]):
    """A pool after reranking: reordered by the reranker (`reranked`), or as it was given
    with the reason it is not (`problem`)."""

    hits: list[H]
    reranked: bool
    problem: tuple[Degradation, str] | None


async def rerank_pool(
    reranking: Reranking,
    query: str,
    pool: Sequence[H],
    *,
    text: Callable[[H], str],
    place: Callable[[H, int, float], H],
    top_n: int = 0,
    kept: str,
) -> Reordered[H]:
    """`pool` reordered by the reranker for `query` (its `top_n` best; 0: all): each hit
    given to `place` with its rank (1 = best) and the reranker's score, which returns it as
    the answer holds it. Without a reranker, or when it fails or times out, the pool as
    given, with the reason; a failure is logged as `kept` ("search returned fused order")."""
    ranked, problem = await reranking.rerank(query, [text(hit) for hit in pool], top_n=top_n)
    if ranked is None:
        if problem is not None and problem[0] is not Degradation.RERANKER_NOT_CONFIGURED:
            log.warning(kept, extra={"reason": problem[0].value, "error": problem[1]})
        return Reordered(list(pool), False, problem)
    return Reordered(
        [place(pool[index], rank, score) for rank, (index, score) in enumerate(ranked, start=1)], True, None
    )
