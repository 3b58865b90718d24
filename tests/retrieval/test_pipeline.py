"""The retrieval core's orchestration (dwsearch.retrieval.pipeline): legs at once, the first
failure standing for them all, and a pool reranked or kept with its reason — what chat search
and agent context both run through."""

import asyncio
import logging

import pytest

from dwsearch.clients.reranker import RerankerClient
from dwsearch.common.errors import DeadlineExceeded, Unavailable
from dwsearch.retrieval.degradation import Degradation
from dwsearch.retrieval.pipeline import at_once, both, first_error, legs_at_once, rerank_pool
from dwsearch.retrieval.rerank import Reranking


class FakeReranker:
    """Scores each document by its length (longest first), or fails as told."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.calls: list[tuple[str, list[str], int]] = []

    async def rerank(self, query, documents, *, top_n=0, priority="", timeout=None):
        self.calls.append((query, list(documents), top_n))
        if self.error is not None:
            raise self.error
        ranked = sorted(enumerate(documents), key=lambda item: -len(item[1]))
        ranked = ranked[:top_n] if top_n else ranked
        return [(index, float(len(text))) for index, text in ranked]


def reranking(reranker: FakeReranker | None) -> Reranking:
    client: RerankerClient | None = reranker  # type: ignore[assignment]
    return Reranking(client, timeout=1.0)


def test_first_error_is_the_first_behind_nested_groups():
    inner = ValueError("the database")
    group = BaseExceptionGroup("legs", [BaseExceptionGroup("model", [inner, KeyError("x")]), OSError()])
    assert first_error(group) is inner
    plain = RuntimeError("alone")
    assert first_error(plain) is plain


async def test_at_once_runs_every_leg_concurrently_and_keeps_their_order():
    started: list[str] = []
    release = asyncio.Event()

    async def leg(name: str, delay: float) -> str:
        started.append(name)
        if len(started) == 3:
            release.set()
        await release.wait()  # every leg must have started before any finishes
        await asyncio.sleep(delay)
        return name

    assert await at_once([leg("a", 0.02), leg("b", 0.0), leg("c", 0.01)]) == ["a", "b", "c"]


async def test_both_returns_two_kinds_of_result():
    async def rows() -> list[int]:
        return [1, 2]

    async def text() -> str:
        return "t"

    assert await both(rows(), text()) == ([1, 2], "t")


async def test_a_failing_leg_cancels_the_others_and_the_call_fails_with_its_error():
    cancelled = asyncio.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def failing() -> None:
        await asyncio.sleep(0)
        raise Unavailable("the database is down")

    with pytest.raises(Unavailable, match="the database is down"):
        await at_once([slow(), failing()])
    assert cancelled.is_set()


async def test_legs_at_once_raises_the_first_error_not_a_group():
    async def failing(message: str) -> None:
        raise DeadlineExceeded(message)

    with pytest.raises(DeadlineExceeded):
        async with legs_at_once() as legs:
            legs.create_task(failing("one"))
            legs.create_task(failing("two"))


def place(hit: str, rank: int, score: float) -> tuple[str, int, float]:
    return hit, rank, score


async def test_rerank_pool_places_each_hit_by_the_rerankers_order():
    reranker = FakeReranker()
    pool = ["bb", "a", "cccc"]
    reordered = await rerank_pool(
        reranking(reranker), "q", pool, text=lambda h: h, place=place, top_n=2, kept="kept"
    )
    assert reordered.reranked and reordered.problem is None
    assert reordered.hits == [("cccc", 1, 4.0), ("bb", 2, 2.0)]
    assert reranker.calls == [("q", ["bb", "a", "cccc"], 2)]


async def test_without_a_reranker_the_pool_is_kept_with_the_reason_and_nothing_is_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="dwsearch.retrieval.pipeline"):
        reordered = await rerank_pool(reranking(None), "q", ["a", "b"], text=str, place=place, kept="kept")
    assert reordered.hits == ["a", "b"] and not reordered.reranked
    assert reordered.problem is not None and reordered.problem[0] is Degradation.RERANKER_NOT_CONFIGURED
    assert not caplog.records


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (DeadlineExceeded("slow"), Degradation.RERANKER_TIMEOUT),
        (Unavailable("down"), Degradation.RERANKER_UNAVAILABLE),
    ],
)
async def test_a_failing_reranker_keeps_the_pool_with_the_reason_logged(caplog, error, reason):
    with caplog.at_level(logging.WARNING, logger="dwsearch.retrieval.pipeline"):
        reordered = await rerank_pool(
            reranking(FakeReranker(error)), "q", ["a", "b"], text=str, place=place, kept="fused order kept"
        )
    assert reordered.hits == ["a", "b"] and not reordered.reranked
    assert reordered.problem == (reason, str(error))
    assert [r.getMessage() for r in caplog.records] == ["fused order kept"]
    assert caplog.records[0].reason == reason.value
