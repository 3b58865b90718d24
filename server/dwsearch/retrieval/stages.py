"""Stage times of an explained call: each stage's wall-clock seconds, in the order the stages
ended, on the call's own list (a context variable, so the tasks a call starts share it);
every stage also timed in dwsearch_search_stage_seconds and, when the process traces, a
span `stage <name>` (dwsearch.common.tracing)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Iterator
from contextvars import ContextVar
from typing import TypeVar

from prometheus_client import Histogram

from dwsearch.common import metrics, tracing

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
    """`work`, its time recorded under `stage` when the call is explained (and a span of
    it when tracing)."""
    return _explained(stage, tracing.traced(f"stage {stage}", work, stage=stage))


def _explained(stage: str, work: Awaitable[_T]) -> Awaitable[_T]:
    return work if _STAGES.get() is None else _recorded(stage, work)


def stage_span(stage: str) -> contextlib.AbstractContextManager[object]:
    """A span `stage <stage>` around a stage that runs on the loop without awaiting
    (fusion), when tracing; a no-op otherwise."""
    return tracing.span(f"stage {stage}", stage=stage)


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
    name = leg or stage
    traced = tracing.traced(
        f"stage {name}", metrics.timed(histogram, stage, work), stage=stage, leg=leg or None
    )
    return _explained(name, traced)
