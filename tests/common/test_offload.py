"""The CPU pool that keeps heavy work off serve's event loop, and the loop-lag watch."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from polling import until

from dwsearch.common import metrics
from dwsearch.common.errors import ResourceExhausted
from dwsearch.common.offload import INLINE_MAX_SIZE, Offloader, watch_event_loop


def _thread() -> int:
    return threading.get_ident()


async def test_small_work_runs_inline_and_large_work_in_a_pool_thread():
    pool = Offloader(workers=1, max_queued=1)
    assert await pool.run(_thread, size=INLINE_MAX_SIZE) == threading.get_ident()
    assert await pool.run(_thread, size=INLINE_MAX_SIZE + 1) != threading.get_ident()
    assert await pool.run(_thread) != threading.get_ident()  # no size: always the pool
    assert pool.admitted == 0


async def test_errors_come_back_to_the_caller():
    def fail() -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        await Offloader().run(fail)


async def test_the_loop_keeps_running_while_a_job_computes():
    def spin(seconds: float) -> int:
        end = time.perf_counter() + seconds
        n = 0
        while time.perf_counter() < end:  # pure Python: holds the interpreter lock in turns
            n += 1
        return n

    job = asyncio.ensure_future(Offloader().run(spin, 0.5))
    worst, last = 0.0, time.perf_counter()
    while not job.done():
        await asyncio.sleep(0.01)
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    await job
    # Within half the job's 0.5 s, with room for a loaded two-core machine: the loop ran
    # while the job did, not after it (it wakes every few ms on a quiet one).
    assert worst < 0.25, f"the loop waited {worst:.3f}s between wake-ups"


async def test_a_full_pool_refuses_requests_but_admits_background_work():
    pool = Offloader(workers=1, max_queued=1)
    gate = threading.Event()
    running = [asyncio.ensure_future(pool.run(gate.wait, 10)) for _ in range(2)]  # one runs, one waits
    await until(lambda: pool.admitted == 2, what="both jobs admitted")
    refused = metrics.OFFLOAD_REFUSED._value.get()
    with pytest.raises(ResourceExhausted, match="retry"):
        await pool.run(_thread)
    assert metrics.OFFLOAD_REFUSED._value.get() == refused + 1
    background = asyncio.ensure_future(pool.run(_thread, refuse=False))  # a sweep's work: queued anyway
    await until(lambda: pool.admitted == 3, what="the background job admitted beyond the bound")
    gate.set()
    await asyncio.gather(*running, background)
    assert pool.admitted == 0
    await pool.run(_thread)  # room again


async def test_a_cancelled_caller_drops_its_queued_job_and_its_place():
    pool = Offloader(workers=1, max_queued=1)
    gate = threading.Event()
    ran = threading.Event()
    busy = asyncio.ensure_future(pool.run(gate.wait, 10))
    queued = asyncio.ensure_future(pool.run(ran.set))
    await until(lambda: pool.admitted == 2, what="the second job queued")
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert pool.admitted == 1  # only the running job holds a place
    gate.set()
    await busy
    assert not ran.is_set()
    assert pool.admitted == 0


def _lag_seconds() -> tuple[float, float]:
    (family,) = metrics.EVENT_LOOP_LAG.collect()
    values = {s.name: s.value for s in family.samples}
    return values["dwsearch_event_loop_lag_seconds_count"], values["dwsearch_event_loop_lag_seconds_sum"]


async def test_the_lag_watch_measures_a_blocked_loop():
    count, total = _lag_seconds()
    watch = asyncio.ensure_future(watch_event_loop(interval=0.05))
    await until(lambda: _lag_seconds()[0] >= count + 2, what="two ticks of the watch")
    time.sleep(0.3)  # noqa: ASYNC251  # the loop blocked: what the watch must measure
    await until(lambda: _lag_seconds()[0] >= count + 3, what="the tick after the block")
    watch.cancel()
    new_count, new_total = _lag_seconds()
    assert new_count >= count + 3
    assert 0.2 < new_total - total < 1.0
