"""CPU work off the event loop, and a watch on the loop itself.

`serve` answers every RPC (health checks included) on one asyncio event loop: a request
that computes for a second on it holds every other request, and the kubelet's probes,
for that second. Work whose cost grows with the request — redaction of big texts or with
known names, metadata checks and Struct conversion of large upserts, filter parsing and
compiling, Forget's ids — runs here instead: in a small thread pool, OFFLOAD_WORKERS
threads, at most OFFLOAD_MAX_QUEUED jobs waiting beyond those running. A request whose
job finds the pool full gets RESOURCE_EXHAUSTED at once (retry shortly); background work
that bounds its own concurrency (a sweep's keys) is always admitted, and counts.

Python threads share the interpreter lock, but a thread holding it gives it up every
`sys.getswitchinterval()` (5 ms), so the loop keeps answering within milliseconds while
a job runs; RE2 (redaction) runs without the lock. A single C call holds it throughout
(an RE2 compile, building or parsing a large protobuf message), in a pool thread as on
the loop, so large ones are cut into pieces of a few milliseconds each: large request
messages (dwsearch.common.interceptor), Fetch and Range responses
(dwsearch.index.service), long name lists (dwsearch.redaction).

The pool's threads run at the process's priority. A lower one (nice 5) would let the loop
preempt GIL-free RE2 work, but when the CPUs are busy a worker holding the lock then runs
at a quarter of a core while the loop waits for it: beside two CPU hogs on two cores, a
0.16 s RE2 compile in a nice-5 worker paused the loop 1.0-2.8 s, at nice 0 0.3-0.5 s;
GIL-free redaction paused it no more at nice 0 (at most 20 ms either way), and ran twice
as fast.

Small inputs run inline: handing a job to a thread costs about 50-100 us, more than
redacting a few KiB. `size` (characters, or items) at or under INLINE_MAX_SIZE runs
inline; RE2 redacts 16 KiB in well under a millisecond.

`watch_event_loop` measures how late the loop wakes from a short sleep: the
`dwsearch_event_loop_lag_seconds` histogram (serve starts it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from dwsearch.common import metrics
from dwsearch.common.errors import ResourceExhausted

T = TypeVar("T")

OFFLOAD_WORKERS = 2
OFFLOAD_MAX_QUEUED = 32
INLINE_MAX_SIZE = 16 * 1024
"""Characters of text (or a comparable count) below which work runs inline."""
LAG_INTERVAL_S = 0.25
"""How often the loop's lag is sampled."""


class Offloader:
    """A bounded thread pool for CPU work; see the module's docstring."""

    def __init__(self, workers: int = OFFLOAD_WORKERS, max_queued: int = OFFLOAD_MAX_QUEUED) -> None:
        self.workers = workers
        self.limit = workers + max_queued
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._admitted = 0

    @property
    def admitted(self) -> int:
        """Jobs running or waiting."""
        return self._admitted

    async def run(
        self, fn: Callable[..., T], /, *args: Any, size: int | None = None, refuse: bool = True
    ) -> T:
        """fn(*args) in the pool, its result or exception returned here.
        Inline when `size` is given and at most INLINE_MAX_SIZE. With `refuse` (requests)
        a full pool raises ResourceExhausted; without (work that bounds its own
        concurrency) the job is queued anyway. Cancelling the caller drops a job that has
        not started; one already running finishes and holds its place until it does."""
        if size is not None and size <= INLINE_MAX_SIZE:
            return fn(*args)
        with self._lock:
            if refuse and self._admitted >= self.limit:
                metrics.OFFLOAD_REFUSED.inc()
                raise ResourceExhausted(
                    f"the server is busy with {self._admitted} CPU-heavy requests (redaction, large upserts); retry shortly"
                )
            self._admitted += 1
            metrics.OFFLOAD_JOBS.set(self._admitted)
        try:
            future = self._pool().submit(fn, *args)
        except BaseException:
            self._release()
            raise
        future.add_done_callback(self._release)
        return await asyncio.wrap_future(future)

    def _release(self, _future: object = None) -> None:
        with self._lock:
            self._admitted -= 1
            metrics.OFFLOAD_JOBS.set(self._admitted)

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    self.workers, thread_name_prefix="dwsearch-cpu"
                )
            return self._executor


_OFFLOADER = Offloader()


def offloader() -> Offloader:
    """The process's pool (shared by search, index and sweep)."""
    return _OFFLOADER


async def run(fn: Callable[..., T], /, *args: Any, size: int | None = None, refuse: bool = True) -> T:
    """`Offloader.run` on the process's pool."""
    return await _OFFLOADER.run(fn, *args, size=size, refuse=refuse)


async def watch_event_loop(interval: float = LAG_INTERVAL_S) -> None:
    """Forever: sleep `interval`, record how much later than that the loop woke up."""
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(interval)
        lag = max(0.0, loop.time() - started - interval)
        metrics.EVENT_LOOP_LAG.observe(lag)


def start_event_loop_watch(interval: float = LAG_INTERVAL_S) -> asyncio.Task[None]:
    """`watch_event_loop` as a task of the running loop; cancel it to stop."""
    return asyncio.get_running_loop().create_task(watch_event_loop(interval), name="event-loop-lag")
