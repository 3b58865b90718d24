"""serve's recent figures for the console's Overview: a bounded in-memory history, one point
every INTERVAL_S (the last POINTS kept: an hour), read from this process's own Prometheus
metrics (dwsearch.common.metrics) and the embedder's Info. Longer history is Prometheus's:
the same metrics, scraped.

Each point (and `current`, the interval under way, up to the moment asked) holds what
happened in its interval (the metrics' counters and histograms as
differences from the point before) and the gauges at its end:

- searches: Search RPCs answered, their p50 and p99 in milliseconds (as Prometheus'
  histogram_quantile estimates them from dwsearch_grpc_request_seconds' buckets; None
  when there were none);
- degraded: searches answered with less than asked, by reason (dwsearch_search_degraded_total);
- the embedder's queue: inputs waiting on its interactive and bulk lanes (its Info;
  None when it did not answer, and embedder_up False);
- sweeps: Sweep RPCs finished, by status code (OK, …), the windows they finished by
  outcome (embedded, skipped, poisoned), and the events pending when the last sweep began.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.metrics import MetricWrapperBase

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.common import metrics

log = logging.getLogger(__name__)

INTERVAL_S = 10.0
POINTS = 360
"""An hour of points, 10 s apart: a point is about 300 bytes."""
EMBEDDER_TIMEOUT_S = 2.0
"""The deadline of the embedder's Info, asked once a point."""

SEARCH_METHOD = ("dwsearch.v1.SearchService", "Search")
SWEEP_METHOD = ("dwsearch.v1.SweepService", "Sweep")


@dataclass(frozen=True)
class Totals:
    """The metrics' running totals at one moment."""

    search_buckets: Mapping[float, float] = field(default_factory=dict)  # le → cumulative count
    degraded: Mapping[str, float] = field(default_factory=dict)
    sweep_runs: Mapping[str, float] = field(default_factory=dict)
    sweep_windows: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Point:
    time: float  # Unix seconds, the interval's end
    searches: int
    search_p50_ms: float | None
    search_p99_ms: float | None
    degraded: dict[str, int]
    queued_interactive: int | None
    queued_bulk: int | None
    embedder_up: bool | None  # None: no embedder to ask
    sweep_runs: dict[str, int]
    sweep_windows: dict[str, int]
    sweep_pending: int | None


def _samples(metric: MetricWrapperBase) -> Iterable[Any]:
    for family in metric.collect():
        yield from family.samples


def read_totals() -> Totals:
    buckets: dict[float, float] = {}
    for s in _samples(metrics.RPC_SECONDS):
        if s.name.endswith("_bucket") and (s.labels.get("service"), s.labels.get("method")) == SEARCH_METHOD:
            buckets[float(s.labels["le"])] = s.value
    degraded = {
        s.labels["reason"]: s.value for s in _samples(metrics.SEARCH_DEGRADED) if s.name.endswith("_total")
    }
    runs = {
        s.labels["code"]: s.value
        for s in _samples(metrics.RPC_REQUESTS)
        if s.name.endswith("_total") and (s.labels.get("service"), s.labels.get("method")) == SWEEP_METHOD
    }
    windows: dict[str, float] = {}
    for s in _samples(metrics.SWEEP_WINDOWS):
        if s.name.endswith("_total"):
            windows[s.labels["outcome"]] = windows.get(s.labels["outcome"], 0.0) + s.value
    return Totals(buckets, degraded, runs, windows)


def sweep_pending() -> int | None:
    values = [s.value for s in _samples(metrics.SWEEP_EVENTS_PENDING)]
    return int(sum(values)) if values else None


def _delta(now: Mapping[str, float], before: Mapping[str, float]) -> dict[str, int]:
    out = {key: round(value - before.get(key, 0.0)) for key, value in now.items()}
    return {key: n for key, n in sorted(out.items()) if n > 0}


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative `buckets` (upper bound → count): the
    bucket the rank falls in, linearly interpolated; the highest finite bound when it falls
    in +Inf's; None without observations."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank and count > below:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = (bound if not math.isinf(bound) else lower), count
    return lower


def point(at: float, before: Totals, now: Totals, queues: tuple[int, int] | None, up: bool | None) -> Point:
    buckets = {le: now.search_buckets[le] - before.search_buckets.get(le, 0.0) for le in now.search_buckets}
    searches = round(buckets.get(math.inf, 0.0))
    p50, p99 = quantile(0.5, buckets), quantile(0.99, buckets)
    return Point(
        time=at,
        searches=searches,
        search_p50_ms=None if p50 is None else round(p50 * 1000, 3),
        search_p99_ms=None if p99 is None else round(p99 * 1000, 3),
        degraded=_delta(now.degraded, before.degraded),
        queued_interactive=None if queues is None else queues[0],
        queued_bulk=None if queues is None else queues[1],
        embedder_up=up,
        sweep_runs=_delta(now.sweep_runs, before.sweep_runs),
        sweep_windows=_delta(now.sweep_windows, before.sweep_windows),
        sweep_pending=sweep_pending(),
    )


class History:
    """The last `points` points, one every `interval_s` while run() runs."""

    def __init__(
        self,
        embedder: EmbedderClient | None = None,
        *,
        interval_s: float = INTERVAL_S,
        points: int = POINTS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.embedder = embedder
        self.interval_s = interval_s
        self.clock = clock
        self.points: deque[Point] = deque(maxlen=points)
        self._totals = read_totals()
        self._queues: tuple[int, int] | None = None
        self._up: bool | None = None

    async def _ask_embedder(self) -> tuple[tuple[int, int] | None, bool | None]:
        if self.embedder is None:
            return None, None
        try:
            info = await self.embedder.describe(timeout=EMBEDDER_TIMEOUT_S)
        except Exception:  # down, or refusing: drawn as a gap and "embedder down"
            return None, False
        return (info.queued_interactive, info.queued_bulk), True

    async def sample(self) -> Point:
        """Add one point: what happened since the last one."""
        self._queues, self._up = await self._ask_embedder()
        totals = read_totals()
        added = point(self.clock(), self._totals, totals, self._queues, self._up)
        self._totals = totals
        self.points.append(added)
        return added

    async def recheck_embedder(self) -> None:
        """Ask the embedder again now if it was down when last asked: a page opened just
        after serve started (the embedder still loading its model) shows it up as soon as
        it is, not at the next point."""
        if self._up is False:
            self._queues, self._up = await self._ask_embedder()

    def current(self) -> Point:
        """The interval under way: what happened since the last point, up to now (the
        embedder's queues as last asked)."""
        return point(self.clock(), self._totals, read_totals(), self._queues, self._up)

    async def run(self) -> None:
        """A point at once (the embedder's state known from the start), then one every interval."""
        while True:
            try:
                await self.sample()
            except Exception:  # a history with a gap, never a console without one
                log.exception("console history: a point could not be read", extra={"component": "console"})
            await asyncio.sleep(self.interval_s)

    def as_json(self) -> dict[str, Any]:
        return {
            "interval_s": self.interval_s,
            "points": [asdict(p) for p in self.points],
            "current": asdict(self.current()),
        }
