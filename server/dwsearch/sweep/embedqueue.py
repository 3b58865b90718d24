"""One queue of windows to embed for a whole sweep: keys put their windows in, and the
queue sends them to the embedder up to `batch` per Embed call with at most `in_flight`
calls at once. While calls are out, windows from every key pile up and leave together,
so the embedder gets full batches even when each key has only a few windows — which is
most of them once a backfill is done.

A call that fails fails every window in it; each learns the error and how many windows
shared the call, so the sweep can find out which window it was by asking alone.

With a CallSizer, `batch` is only the most a call carries: each call is sized to finish
well within its deadline at the speed calls have actually been taking (queueing at the
embedder included), so a slow CPU embedder gets smaller calls instead of timed-out ones.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from dwsearch.common.errors import DeadlineExceeded, DwsearchError

W = TypeVar("W")
V = TypeVar("V")


@dataclass(frozen=True)
class Failed:
    error: DwsearchError
    # Windows the failed call carried: more than one means the culprit is unknown.
    shared_by: int


class CallSizer:
    """Windows per call, so that a call takes about `target_s`: `target_s` over the
    seconds a window has been costing a call (a moving average of each successful call's
    time over its windows; with several calls in flight that includes waiting behind the
    others), between 1 and `max_batch`. Before any call: from `initial_window_s` (an
    estimate), or `max_batch` without one. A call that timed out halves the size."""

    # Weight of the newest call in the moving average.
    ALPHA = 0.3

    def __init__(self, *, target_s: float, max_batch: int, initial_window_s: float | None = None) -> None:
        self.target_s = target_s
        self.max_batch = max_batch
        self.window_s = initial_window_s if initial_window_s and initial_window_s > 0 else None
        self._cap = max_batch  # lowered by timeouts, raised again by calls that finish

    @property
    def batch(self) -> int:
        size = self.max_batch if self.window_s is None else math.floor(self.target_s / self.window_s)
        return max(1, min(size, self._cap))

    def observe(self, windows: int, seconds: float) -> None:
        """A call of `windows` windows succeeded in `seconds`."""
        if windows <= 0:
            return
        cost = seconds / windows
        self.window_s = (
            cost if self.window_s is None else self.ALPHA * cost + (1 - self.ALPHA) * self.window_s
        )
        self._cap = min(self.max_batch, max(self._cap, 2 * windows))

    def timed_out(self, windows: int) -> None:
        """A call of `windows` windows ran out of its deadline."""
        self._cap = max(1, min(self._cap, windows) // 2)


class EmbedQueue(Generic[W, V]):
    def __init__(
        self,
        embed: Callable[[list[W]], Awaitable[list[V]]],
        *,
        batch: int,
        in_flight: int,
        sizer: CallSizer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._embed = embed
        self._batch = batch
        self._in_flight = in_flight
        self.sizer = sizer
        self._clock = clock
        self._waiting: list[tuple[W, asyncio.Future[V | Failed]]] = []
        # Calls in flight and the waiters each carries.
        self._calls: dict[asyncio.Future[None], list[asyncio.Future[V | Failed]]] = {}

    @property
    def queued(self) -> int:
        """Windows waiting for a call (their callers still waiting too)."""
        return sum(not f.done() for _, f in self._waiting)

    async def embed(self, windows: Sequence[W]) -> list[V | Failed]:
        """Vectors for `windows`, in order, or the failure of the call that carried each."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[V | Failed]] = [loop.create_future() for _ in windows]
        self._waiting.extend(zip(windows, futures, strict=True))
        self._send()
        try:
            return list(await asyncio.gather(*futures))
        finally:
            for f in futures:  # when the caller is gone: those not sent yet never will be
                f.cancel()

    def _send(self) -> None:
        while self._waiting and len(self._calls) < self._in_flight:
            self._waiting = [(w, f) for w, f in self._waiting if not f.done()]
            batch = min(self._batch, self.sizer.batch) if self.sizer is not None else self._batch
            taken, self._waiting = self._waiting[:batch], self._waiting[batch:]
            if not taken:
                return
            call = asyncio.ensure_future(self._call(taken))
            self._calls[call] = [f for _, f in taken]
            call.add_done_callback(self._done)

    def _done(self, call: asyncio.Future[None]) -> None:
        for waiter in self._calls.pop(call):
            waiter.cancel()  # only those the call left unanswered: it was cancelled, maybe before it began
        self._send()

    async def _call(self, taken: list[tuple[W, asyncio.Future[V | Failed]]]) -> None:
        outcomes: Sequence[V | Failed]
        started = self._clock()
        try:
            outcomes = await self._embed([w for w, _ in taken])
        except DwsearchError as exc:
            if self.sizer is not None and isinstance(exc, DeadlineExceeded):
                self.sizer.timed_out(len(taken))
            outcomes = [Failed(exc, len(taken))] * len(taken)
        except Exception as exc:  # a bug: every waiter raises it
            for _, f in taken:
                if not f.done():
                    f.set_exception(exc)
            return
        else:
            if self.sizer is not None:
                self.sizer.observe(len(taken), self._clock() - started)
        for (_, f), outcome in zip(taken, outcomes, strict=True):
            if not f.done():
                f.set_result(outcome)

    async def close(self) -> None:
        for call in list(self._calls):
            call.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)
