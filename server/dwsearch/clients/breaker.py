"""A circuit breaker for calls whose failure has a fallback (search embeds its query,
and answers with full text when it cannot).

With the embedder down, each call would wait out its deadline: connection refused is
retried with backoff until the deadline passes, so every search paid the whole embed
timeout (300 ms) before answering with full text. After THRESHOLD failures in a row the
breaker opens: calls fail at once for COOLDOWN_S, then one trial call is let through
(half-open); its success closes the breaker, its failure opens it again.

Only transport failures count (unavailable, deadline exceeded): an error the service
returns on purpose says nothing about its health. "In a row" means one after another:
a failure counts only when its call started after the last counted failure was seen.
Concurrent calls caught by one stall (a slow batch on a busy embedder) are one piece of
evidence, not many: without this, three searches timing out together opened the
breaker and degraded every search for the whole cooldown while the embedder was fine.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from dwsearch.common import metrics
from dwsearch.common.errors import DeadlineExceeded, Unavailable

T = TypeVar("T")

THRESHOLD = 3
COOLDOWN_S = 5.0


class State(enum.IntEnum):
    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


class CircuitOpen(Unavailable):
    """The breaker is open: the call was not made."""


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        *,
        threshold: int = THRESHOLD,
        cooldown_s: float = COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._failures = 0
        self._last_failure_at = float("-inf")  # when the last counted failure was seen
        self._opened_at = 0.0
        self._trial_running = False
        self._last_error = ""
        self.state = State.CLOSED
        self._set(State.CLOSED)

    def _set(self, state: State) -> None:
        self.state = state
        metrics.CIRCUIT_STATE.labels(self.name).set(int(state))

    async def call(self, work: Callable[[], Awaitable[T]]) -> T:
        if self.state is State.OPEN and self._clock() - self._opened_at >= self.cooldown_s:
            self._set(State.HALF_OPEN)
        if self.state is State.OPEN or (self.state is State.HALF_OPEN and self._trial_running):
            wait = max(0.0, self.cooldown_s - (self._clock() - self._opened_at))
            raise CircuitOpen(
                f"{self.name}: not called after {self.threshold} failures in a row "
                f"(last: {self._last_error}); next try in {wait:.1f}s"
            )
        trial = self.state is State.HALF_OPEN
        self._trial_running = trial
        started = self._clock()
        try:
            result = await work()
        except (Unavailable, DeadlineExceeded) as exc:
            if trial or started >= self._last_failure_at:
                self._failed(str(exc))
            raise
        finally:
            if trial:
                self._trial_running = False
        self._failures = 0
        if self.state is not State.CLOSED:
            self._set(State.CLOSED)
        return result

    def _failed(self, error: str) -> None:
        self._failures += 1
        self._last_failure_at = self._clock()
        self._last_error = error
        if self.state is State.HALF_OPEN or self._failures >= self.threshold:
            self._opened_at = self._clock()
            metrics.CIRCUIT_OPENED.labels(self.name).inc()
            self._set(State.OPEN)
