"""Dynamic batching for the model services (embedder and reranker).

Requests from the event loop are queued as items, each with a token length, in one of
two lanes (Lane): interactive (a person waits) and bulk (the sweep, index upserts). One
worker thread owns the model. It serves the interactive lane first, so a query waits at
most for the batch already running — or, with an interactive worker (on a CPU), a second
thread runs queries beside the bulk batch in flight and a query waits for none; bulk work is taken in rounds, sorted longest first
and cut into batches whose padded size — longest item × items — stays within a token
budget, like TEI's max-batch-tokens, and whose estimated run time stays within the bulk
latency budget, which bounds a query's wait. Within the budgets the cut points weigh
padding against per-batch overhead to run the round in the least estimated time
(plan_batches, BatchCost). A round is finished before newer bulk items are looked at, and
bulk work held back too long by queries gets the next batch, so nothing starves. The
queue is bounded (ResourceExhausted when full); a cancelled request leaves the queue at
once, and a request whose deadline passes before its batch runs is failed, never run.

Several models in one process (an embedder serving several) have a batcher each, all
sharing one `bulk_lock`: one bulk batch runs at a time over the shared cores, each with the
process's whole thread count, while each model's queries still run beside it. The batch
series are labelled by model; the queue size is the process's (every model's inputs
waiting), which is what an autoscaler reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
from prometheus_client import Gauge, Histogram

from dwsearch.common import tracing
from dwsearch.common.errors import DeadlineExceeded, ResourceExhausted, Unavailable

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext

P = TypeVar("P")
R = TypeVar("R")

# A batch's outcome, one entry per item: the result or the error that fails its request.
RunBatch = Callable[[Sequence[P]], Sequence[R | Exception]]

_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


@dataclass(frozen=True)
class BatchMetrics:
    """Prometheus series of one service's batchers, named dwsearch_<service>_*: the queue
    size summed over the service's batchers (one per model), the rest per model."""

    queue_size: Gauge
    batch_size: Histogram
    batch_tokens: Histogram
    queue_seconds: Histogram
    inference_seconds: Histogram
    _queued: dict[int, int] = field(default_factory=dict)  # id(batcher) → inputs waiting
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def set_queued(self, batcher: object, count: int) -> None:
        with self._lock:
            self._queued[id(batcher)] = count
            self.queue_size.set(sum(self._queued.values()))

    def forget(self, batcher: object) -> None:
        with self._lock:
            self._queued.pop(id(batcher), None)
            self.queue_size.set(sum(self._queued.values()))

    @staticmethod
    @functools.cache  # one registration per service per process, however many batchers
    def for_service(service: str) -> BatchMetrics:
        prefix = f"dwsearch_{service}"
        return BatchMetrics(
            queue_size=Gauge(f"{prefix}_queue_size", "Inputs waiting for inference"),
            batch_size=Histogram(
                f"{prefix}_batch_size", "Inputs per inference batch", ["model"], buckets=_SIZE_BUCKETS
            ),
            batch_tokens=Histogram(
                f"{prefix}_batch_tokens",
                "Padded tokens per inference batch",
                ["model"],
                buckets=_TOKEN_BUCKETS,
            ),
            queue_seconds=Histogram(
                f"{prefix}_queue_wait_seconds",
                "Time an input waited before its batch ran, per lane (interactive, bulk)",
                ["lane", "model"],
                buckets=_SECONDS_BUCKETS,
            ),
            inference_seconds=Histogram(
                f"{prefix}_inference_seconds", "Time to run one batch", ["model"], buckets=_SECONDS_BUCKETS
            ),
        )


# Estimates of a batch's fixed cost in padded tokens, used until a batcher has measured its
# own: on a CPU a batch costs little beyond its tokens (30–100 tokens measured best for
# all-MiniLM-L6-v2 on two cores), on a GPU kernel launches cost thousands of tokens' time.
CPU_OVERHEAD_TOKENS = 64.0
GPU_OVERHEAD_TOKENS = 4096.0


def prior_overhead_tokens(device: str) -> float:
    return CPU_OVERHEAD_TOKENS if device == "cpu" else GPU_OVERHEAD_TOKENS


class BatchCost:
    """A batch's run time, estimated as overhead + per_token × padded tokens from the
    batches that ran. What matters is the overhead expressed in tokens: on a GPU it is
    large, and one long batch beats several short ones even with padding; on a CPU a padded
    token costs about what a real one does, and tight batches of similar lengths win.

    The fit is Theil–Sen (median of pairwise slopes) over the latest WINDOW batches, so the
    slow first runs of new shapes and a noisy neighbour do not skew it. Until MIN_BATCHES of
    different sizes have run, the prior applies."""

    WINDOW = 32
    MIN_BATCHES = 8

    def __init__(self, prior_overhead_tokens: float) -> None:
        self.prior = prior_overhead_tokens
        self._lock = threading.Lock()  # two workers may observe while another thread plans
        self._tokens: deque[float] = deque(maxlen=self.WINDOW)
        self._seconds: deque[float] = deque(maxlen=self.WINDOW)

    def observe(self, padded_tokens: int, seconds: float) -> None:
        with self._lock:
            self._tokens.append(padded_tokens)
            self._seconds.append(seconds)

    def _samples(self) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            return np.asarray(self._tokens, dtype=np.float64), np.asarray(self._seconds, dtype=np.float64)

    def seconds_per_token(self) -> float | None:
        """Seconds per padded token, the overhead counted as tokens; None before any batch ran."""
        x, y = self._samples()
        if not len(x):
            return None
        return float(np.median(y / (x + self.overhead_tokens)))

    def seconds(self, padded_tokens: int) -> float | None:
        per_token = self.seconds_per_token()
        return None if per_token is None else per_token * (self.overhead_tokens + padded_tokens)

    @property
    def overhead_tokens(self) -> float:
        x, y = self._samples()
        if len(x) < self.MIN_BATCHES:
            return self.prior
        dx = x[:, None] - x[None, :]
        dy = y[:, None] - y[None, :]
        pairs = dx > 0
        if pairs.sum() < self.MIN_BATCHES:  # batches all alike: no slope to fit
            return self.prior
        per_token = float(np.median(dy[pairs] / dx[pairs]))
        if per_token <= 0:
            return self.prior
        overhead = float(np.median(y - per_token * x))
        return max(0.0, overhead) / per_token


def plan_batches(
    lengths: Sequence[int], *, overhead_tokens: float, max_batch_tokens: int, max_batch_inputs: int
) -> list[int]:
    """Sizes of the consecutive batches that run `lengths` (sorted longest first) at the
    least estimated cost, a batch costing overhead_tokens + its first length × its size.
    Every batch keeps within max_batch_inputs and, unless it is a single input, within
    max_batch_tokens. Dynamic programming over the cut points, vectorized per end point."""
    count = len(lengths)
    padded_length = np.asarray(lengths, dtype=np.float64)
    best = np.full(count + 1, np.inf)
    best[0] = 0.0
    start_of = np.zeros(count + 1, dtype=np.int64)
    for end in range(1, count + 1):
        first = max(0, end - max_batch_inputs)
        sizes = end - np.arange(first, end)
        padded = padded_length[first:end] * sizes
        costs = best[first:end] + overhead_tokens + padded
        costs[(padded > max_batch_tokens) & (sizes > 1)] = np.inf
        choice = int(np.argmin(costs))
        best[end] = costs[choice]
        start_of[end] = first + choice
    sizes_backwards = []
    end = count
    while end > 0:
        sizes_backwards.append(end - int(start_of[end]))
        end = int(start_of[end])
    return sizes_backwards[::-1]


class Lane(enum.Enum):
    """Which queue a request waits in (EmbedRequest / RerankRequest priority)."""

    INTERACTIVE = "interactive"  # a person is waiting: searches, agent context, index queries
    BULK = "bulk"  # throughput work: the sweep, index upserts


@dataclass(eq=False)
class _Request(Generic[R]):
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[R]]
    results: list[R | None]
    remaining: int
    deadline: float | None  # time.monotonic()
    lane: Lane
    finished: bool = False  # resolved, failed or abandoned; guarded by the batcher's lock
    # When tracing: the submitting call's span (the queue wait's parent, the batch's link)
    # and when it was queued (time.time_ns()).
    trace: SpanContext | None = None
    queued_ns: int = 0


@dataclass(eq=False)
class _Item(Generic[P, R]):
    request: _Request[R]
    index: int
    payload: P
    length: int
    enqueued: float = field(default_factory=time.monotonic)


def _settle(future: asyncio.Future[Any], result: object = None, error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _notify(request: _Request[R], result: object = None, error: BaseException | None = None) -> None:
    """Hand an outcome to the request's event loop (from the worker thread)."""
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
        request.loop.call_soon_threadsafe(_settle, request.future, result, error)


# Bulk work is starving when interactive batches have kept it from running, since its last
# batch finished, for this many times the longer of the bulk budget and that batch's run
# time (or BULK_STARVE_MIN_S, whichever is longer): then one bulk batch runs next. So under
# any stream of queries bulk keeps about a fifth of the model's time, and queries at least
# four fifths, even when one bulk input alone takes longer than the budget.
BULK_STARVE_BUDGETS = 4
BULK_STARVE_MIN_S = 0.2


# With an interactive worker, the bulk worker runs at this nice value (threads it starts
# inherit it): the kernel then gives a query's thread most of the CPU while both compute
# (CFS weights 1024 against 110), and bulk work all of it otherwise.
BULK_NICE = 10


def lower_thread_priority(nice: int) -> None:
    """Raise the calling thread's nice value by `nice` (Linux: per thread; raising needs
    no privilege)."""
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + nice))
    except (AttributeError, OSError):  # not Linux, or not allowed: run at the normal priority
        pass


class Batcher(Generic[P, R]):
    """Runs `run` on batches of queued payloads in one worker thread.

    Two lanes. The next batch is cut from the interactive lane whenever it holds anything,
    so an interactive request waits at most for the batch already running. Bulk batches
    are cut so that their estimated run time stays within `bulk_batch_seconds` (from the
    fitted BatchCost), which bounds that wait. Bulk work is taken in rounds (a round is
    finished before newer bulk items are looked at, so no bulk request starves another),
    and when interactive work has kept the bulk lane waiting too long, one bulk batch runs
    next, so neither lane starves the other."""

    def __init__(
        self,
        service: str,
        run: RunBatch[P, R],
        *,
        max_batch_tokens: int,
        max_batch_inputs: int,
        max_queue: int,
        prior_overhead_tokens: float,
        bulk_batch_seconds: float = 0.0,
        interactive_worker: bool = False,
        model: str = "",
        bulk_lock: threading.Lock | None = None,
    ) -> None:
        """`prior_overhead_tokens`: the per-batch overhead assumed until measured (see
        BatchCost and prior_overhead_tokens()). `bulk_batch_seconds` > 0 caps a bulk
        batch's estimated run time (a single input over it still runs, alone).
        `interactive_worker`: a second thread runs interactive batches alongside the
        running bulk batch, so a query does not wait for it at all (on a CPU the two share
        the cores; the run function must be safe to call from two threads at once).
        `model` labels the batch series. `bulk_lock`, shared by the batchers of the models
        on the same cores, is held while a bulk batch runs, so one runs at a time."""
        if min(max_batch_tokens, max_batch_inputs, max_queue) < 1:
            raise ValueError("max_batch_tokens, max_batch_inputs and max_queue must be positive")
        if bulk_batch_seconds < 0:
            raise ValueError("bulk_batch_seconds must be 0 (no cap) or positive")
        self.service = service
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_inputs = max_batch_inputs
        self.max_queue = max_queue
        self.bulk_batch_seconds = bulk_batch_seconds
        self._run = run
        self.model = model
        self._bulk_lock = bulk_lock
        self._cost = BatchCost(prior_overhead_tokens)
        self._metrics = BatchMetrics.for_service(service)
        lock = threading.RLock()  # over every queue
        self._cond = threading.Condition(lock)  # the main worker waits on it
        # The interactive worker waits on its own condition, so bulk arrivals do not wake it.
        self._interactive_ready = threading.Condition(lock)
        self._interactive: list[_Item[P, R]] = []
        self._pending: list[_Item[P, R]] = []  # bulk, arrived since the current round began
        self._round: deque[_Item[P, R]] = deque()  # bulk, longest first
        self._plan: deque[int] = deque()  # sizes of the round's next batches; empty = to plan
        self._bulk_progress = (
            time.monotonic()
        )  # last bulk batch finished, or bulk work arrived to an empty lane
        self._bulk_batch_s = 0.0  # how long the last bulk batch ran
        self._closing = False
        self._threads = [threading.Thread(target=self._work, name=f"{service}-inference", daemon=True)]
        self.interactive_worker = interactive_worker
        if interactive_worker:
            self._threads.append(
                threading.Thread(target=self._work_interactive, name=f"{service}-interactive", daemon=True)
            )

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    async def close(self) -> None:
        """Refuse new work, finish what is queued, and stop the worker."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            self._interactive_ready.notify_all()
        for thread in self._threads:
            if thread.is_alive():
                await asyncio.get_running_loop().run_in_executor(None, thread.join)
        self._metrics.forget(self)

    @property
    def queued(self) -> int:
        with self._cond:
            return self._queued_locked()

    def queued_by_lane(self) -> tuple[int, int]:
        """Inputs waiting: (interactive, bulk)."""
        with self._cond:
            return len(self._interactive), len(self._pending) + len(self._round)

    def estimate_seconds(self, padded_tokens: int) -> float | None:
        """A batch's estimated run time from the batches that ran; None before any ran."""
        return self._cost.seconds(padded_tokens)

    async def submit(
        self,
        payloads: Sequence[P],
        lengths: Sequence[int],
        *,
        deadline: float | None = None,
        lane: Lane = Lane.BULK,
    ) -> list[R]:
        """Results for `payloads` in order, once every one has run. Raises ResourceExhausted
        when the queue cannot take them all, DeadlineExceeded when `deadline` (monotonic)
        passes first, or the error the run produced for any of them."""
        if not payloads:
            return []
        loop = asyncio.get_running_loop()
        request: _Request[R] = _Request(
            loop, loop.create_future(), [None] * len(payloads), len(payloads), deadline, lane
        )
        if tracing.ENABLED:
            request.trace, request.queued_ns = tracing.current_context(), time.time_ns()
        with self._cond:
            if self._closing:
                raise Unavailable(f"{self.service} is shutting down")
            waiting = self._queued_locked()
            if waiting + len(payloads) > self.max_queue:
                raise ResourceExhausted(
                    f"{self.service} queue is full ({waiting} inputs waiting, limit {self.max_queue}); retry later"
                )
            items = [
                _Item(request, i, payload, length)
                for i, (payload, length) in enumerate(zip(payloads, lengths, strict=True))
            ]
            if lane is Lane.INTERACTIVE:
                self._interactive.extend(items)
            else:
                if not self._pending and not self._round:
                    self._bulk_progress = time.monotonic()
                self._pending.extend(items)
            self._metrics.set_queued(self, waiting + len(payloads))
            if lane is Lane.INTERACTIVE and self.interactive_worker:
                self._interactive_ready.notify()
            else:
                self._cond.notify()
        try:
            if deadline is None:
                return await request.future
            async with asyncio.timeout_at(deadline):  # the loop's clock is time.monotonic()
                return await request.future
        except TimeoutError:
            with self._cond:
                self._abandon_locked(request)
            raise DeadlineExceeded(f"{self.service}: deadline passed while queued") from None
        except asyncio.CancelledError:
            with self._cond:
                self._abandon_locked(request)
            raise

    # --- worker thread -----------------------------------------------------------------

    def _work(self) -> None:
        if self.interactive_worker:
            lower_thread_priority(BULK_NICE)
        while (batch := self._take_batch()) is not None:
            self._run_batch(batch)

    def _work_interactive(self) -> None:
        """The interactive worker: interactive batches only, alongside the main worker."""
        while True:
            with self._cond:
                while not self._interactive and not self._closing:
                    self._interactive_ready.wait()
                self._expire_locked(time.monotonic())
                if not self._interactive:
                    if self._closing:
                        return
                    continue
                batch = self._cut_interactive_locked()
                self._metrics.set_queued(self, self._queued_locked())
            self._run_batch(batch)

    def _take_batch(self) -> list[_Item[P, R]] | None:
        """The next batch, or None once closing and drained."""
        with self._cond:
            while True:
                now = time.monotonic()
                self._expire_locked(now)
                if not self._round and self._pending:
                    self._round = deque(sorted(self._pending, key=lambda item: item.length, reverse=True))
                    self._pending = []
                    self._plan.clear()
                # With an interactive worker, this one runs bulk work only.
                serves_queries = not self.interactive_worker
                if serves_queries and self._interactive and not (self._round and self._bulk_starving(now)):
                    batch = self._cut_interactive_locked()
                elif self._round:
                    batch = self._cut_bulk_locked()
                elif self._closing:
                    return None
                else:
                    self._cond.wait()
                    continue
                self._metrics.set_queued(self, self._queued_locked())
                return batch

    def _bulk_starving(self, now: float) -> bool:
        turn = max(self.bulk_batch_seconds, self._bulk_batch_s)
        return now - self._bulk_progress > max(BULK_STARVE_MIN_S, BULK_STARVE_BUDGETS * turn)

    def _bulk_token_cap(self) -> int:
        """Padded tokens a bulk batch may hold: the budget, and its time in tokens."""
        cap = self.max_batch_tokens
        per_token = self._cost.seconds_per_token()
        if self.bulk_batch_seconds > 0 and per_token:
            in_time = self.bulk_batch_seconds / per_token - self._cost.overhead_tokens
            cap = min(cap, max(1, int(in_time)))
        return cap

    def _cut_interactive_locked(self) -> list[_Item[P, R]]:
        """The first batch of the interactive lane's plan (longest first)."""
        self._interactive.sort(key=lambda item: item.length, reverse=True)
        sizes = plan_batches(
            [item.length for item in self._interactive],
            overhead_tokens=self._cost.overhead_tokens,
            max_batch_tokens=self.max_batch_tokens,
            max_batch_inputs=self.max_batch_inputs,
        )
        batch, self._interactive = self._interactive[: sizes[0]], self._interactive[sizes[0] :]
        return batch

    def _cut_bulk_locked(self) -> list[_Item[P, R]]:
        if not self._plan:
            self._plan = deque(
                plan_batches(
                    [item.length for item in self._round],
                    overhead_tokens=self._cost.overhead_tokens,
                    max_batch_tokens=self._bulk_token_cap(),
                    max_batch_inputs=self.max_batch_inputs,
                )
            )
        return [self._round.popleft() for _ in range(self._plan.popleft())]

    def _expire_locked(self, now: float) -> None:
        expired = {
            id(item.request): item.request
            for item in (*self._interactive, *self._pending, *self._round)
            if item.request.deadline is not None and now >= item.request.deadline
        }
        for request in expired.values():
            self._fail_locked(request, DeadlineExceeded(f"{self.service}: deadline passed while queued"))

    def _run_batch(self, batch: list[_Item[P, R]]) -> None:
        with self._cond:  # a request cancelled or expired since the cut never reaches the model
            now = time.monotonic()
            for item in batch:
                deadline = item.request.deadline
                if deadline is not None and now >= deadline:
                    self._fail_locked(
                        item.request, DeadlineExceeded(f"{self.service}: deadline passed while queued")
                    )
            batch = [item for item in batch if not item.request.finished]
        if not batch:
            return
        bulk = any(item.request.lane is Lane.BULK for item in batch)
        model = self.model
        with self._bulk_lock if bulk and self._bulk_lock is not None else contextlib.nullcontext():
            start = time.monotonic()
            for item in batch:
                self._metrics.queue_seconds.labels(item.request.lane.value, model).observe(
                    start - item.enqueued
                )
            self._metrics.batch_size.labels(model).observe(len(batch))
            padded = max(item.length for item in batch) * len(batch)
            self._metrics.batch_tokens.labels(model).observe(padded)
            start_ns = time.time_ns() if tracing.ENABLED else 0
            failed = False
            try:
                outcomes: Sequence[R | Exception] = self._run([item.payload for item in batch])
                if len(outcomes) != len(batch):
                    raise RuntimeError(f"batch of {len(batch)} produced {len(outcomes)} results")
                self._cost.observe(padded, time.monotonic() - start)
            except Exception as exc:
                outcomes, failed = [exc] * len(batch), True
            finished = time.monotonic()
            if tracing.ENABLED:
                self._trace_batch(batch, start_ns, time.time_ns(), padded=padded, failed=failed)
        self._metrics.inference_seconds.labels(model).observe(finished - start)
        with self._cond:
            if bulk:
                self._bulk_progress, self._bulk_batch_s = finished, finished - start
            for item, outcome in zip(batch, outcomes, strict=True):
                request = item.request
                if request.finished:
                    continue
                if isinstance(outcome, Exception):
                    self._fail_locked(request, outcome)
                    continue
                request.results[item.index] = outcome
                request.remaining -= 1
                if request.remaining == 0:
                    request.finished = True
                    _notify(request, request.results)

    def _trace_batch(
        self, batch: list[_Item[P, R]], start_ns: int, end_ns: int, *, padded: int, failed: bool
    ) -> None:
        """The batch's spans (tracing): each request's queue wait under its call's span;
        the batch under the first request's call, linked to every request it carried; the
        forward pass under the batch."""
        requests = list({id(item.request): item.request for item in batch}.values())
        for request in requests:
            if request.trace is not None and request.queued_ns:
                tracing.record_span(
                    f"{self.service} queue wait",
                    start_ns=min(request.queued_ns, start_ns),
                    end_ns=start_ns,
                    parent=request.trace,
                    lane=request.lane.value,
                    model=self.model,
                )
        traces = [r.trace for r in requests if r.trace is not None]
        bulk = any(r.lane is Lane.BULK for r in requests)
        parent = tracing.record_span(
            f"{self.service} batch",
            start_ns=start_ns,
            end_ns=end_ns,
            parent=traces[0] if traces else None,
            links=traces,
            model=self.model,
            lane=(Lane.BULK if bulk else Lane.INTERACTIVE).value,
            inputs=len(batch),
            requests=len(requests),
            padded_tokens=padded,
            failed=failed,
        )
        tracing.record_span(
            f"{self.service} forward",
            start_ns=start_ns,
            end_ns=end_ns,
            parent=parent,
            model=self.model,
            inputs=len(batch),
            padded_tokens=padded,
        )

    # --- shared, under the lock -----------------------------------------------------------

    def _queued_locked(self) -> int:
        return len(self._interactive) + len(self._pending) + len(self._round)

    def _abandon_locked(self, request: _Request[R]) -> None:
        """Drop a request's queued items; it is finished, successfully or not."""
        request.finished = True
        if request.lane is Lane.INTERACTIVE:
            self._interactive = [item for item in self._interactive if item.request is not request]
        else:
            self._pending = [item for item in self._pending if item.request is not request]
            if any(item.request is request for item in self._round):
                self._round = deque(item for item in self._round if item.request is not request)
                self._plan.clear()
        self._metrics.set_queued(self, self._queued_locked())

    def _fail_locked(self, request: _Request[R], error: Exception) -> None:
        if request.finished:
            return
        self._abandon_locked(request)
        _notify(request, error=error)
