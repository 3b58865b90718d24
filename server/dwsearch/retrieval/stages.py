"""Stage times of an explained call: each stage's wall-clock seconds, in the order the stages
ended, on the call's own list (a context variable, so the tasks a call starts share it);
every stage also timed in dwsearch_search_stage_seconds."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Iterator
from contextvars import ContextVar
from typing import TypeVar

from prometheus_client import Histogram

from dwsearch.common import metrics

_T = TypeVar("_T")


# A stage's name and its wall-clock seconds, in the order the stages ended (explain).
StageTimes = list[tuple[str, float]]


# The stage times of the call being explained, None when it is not: set by search() and
# similar() for their call (the tasks a call starts share its list).
_STAGES: ContextVar[StageTimes | None] = ContextVar("dwsearch_search_stages", default=None)


@contextlib.contextmanager
def explaining(explain: bool) -> Iterator[StageTimes]:
    """The list this call's stage times go to (record, timed, explained) while `explain`."""
    stages: StageTimes = []
    if not explain:
        yield stages
        return
    token = _STAGES.set(stages)
    try:
        yield stages
    finally:
        _STAGES.reset(token)


def record(stage: str, started: float) -> None:
    """`stage`, begun at perf_counter() `started`, ends now: its time, when explaining."""
    stages = _STAGES.get()
    if stages is not None:
        stages.append((stage, time.perf_counter() - started))


def explained(stage: str, work: Awaitable[_T]) -> Awaitable[_T]:
    """`work`, its time recorded under `stage` when the call is explained."""
    return work if _STAGES.get() is None else _recorded(stage, work)


async def _recorded(stage: str, work: Awaitable[_T]) -> _T:
    started = time.perf_counter()
    try:
        return await work
    finally:
        record(stage, started)


def timed(
    stage: str, work: Awaitable[_T], *, leg: str = "", histogram: Histogram = metrics.SEARCH_STAGE_SECONDS
) -> Awaitable[_T]:
    """`work`, timed in `histogram` (search's dwsearch_search_stage_seconds, or agent
    context's) under `stage`, and, when the call is explained, recorded under `leg` (a
    leg's name: "dense:<model>") or `stage`."""
    return explained(leg or stage, metrics.timed(histogram, stage, work))
