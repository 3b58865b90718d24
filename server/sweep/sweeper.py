"""One sweep over the keys with work to do: the domain behind SweepService.

Per sweep: check that the embedder serves the configured model (anything else would
pollute the vector space), drop the finished windows holding an event since deleted, edited or
no longer eligible (their text must not outlive it), list the orgs whose flags are on, find
their keys with events
past the watermark or uncovered before it, and work through them — KEY_CONCURRENCY at a
time, each under its key lock so that concurrent sweepers split the keys. Per key: plan
(dwsearch.sweep.keyplan) a batch of windows, hand it to the sweep's embed queue (which
merges the keys' windows into Embed calls), plan the next batch meanwhile, and commit each
finished window together with its watermark advance.

Failures. Embedder outages (UNAVAILABLE, RESOURCE_EXHAUSTED, CANCELLED) and database
errors stall the key: its watermark waits for the next sweep, the other keys go on. A
window the embedder rejects (INVALID_ARGUMENT) is recorded as poison at once; one it
fails on otherwise (INTERNAL, DEADLINE_EXCEEDED: the input may be what breaks or stalls
the model) stalls the key and becomes poison on the POISON_AFTER_FAILURES-th sweep in a
row. Poison is skipped: the watermark moves past it until RetryPoison releases it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TypeGuard, TypeVar
from uuid import UUID

import numpy as np
import psycopg
from psycopg_pool import AsyncConnectionPool

from dwsearch.clients.embedder import (
    BULK_CALL_TARGET_S,
    BULK_CALL_TIMEOUT_S,
    DOCUMENT_COST_PER_QUERY,
    EmbedderClient,
    ModelInfo,
)
from dwsearch.common import metrics, offload
from dwsearch.common.errors import (
    DeadlineExceeded,
    DwsearchError,
    FailedPrecondition,
    Internal,
    InvalidArgument,
)
from dwsearch.flags import disabled_reasons, enabled_orgs, orgs_with_events
from dwsearch.sweep import store
from dwsearch.sweep.embedqueue import CallSizer, EmbedQueue, Failed
from dwsearch.sweep.forget import parse_message_ids
from dwsearch.sweep.keyplan import Advance, Finish, KeyEvent, Position, Step, plan_key
from dwsearch.sweep.store import Backlog, Key, PoisonRow, Vectors, WatermarkRow, WriteConflict
from dwsearch.sweep.substance import is_substantial
from dwsearch.sweep.window import Message, Window, chunk_line

log = logging.getLogger(__name__)
T = TypeVar("T")

POISON_AFTER_FAILURES = 3
# Keys swept at once by one sweep; each holds a pooled connection (its key lock) while
# it waits on the embedder, so keep it well under the pool size search shares.
KEY_CONCURRENCY = 4
# Windows per Embed call (at most), and Embed calls in flight per sweep: enough queued
# work for the embedder to fill its token-budget batches (one call per window would
# starve it).
EMBED_BATCH_WINDOWS = 32
EMBED_CALLS_IN_FLIGHT = 4
# The deadline of one Embed call, below the grace of a connection closed for age (see
# BULK_CALL_TIMEOUT_S). A call cut off by a closed connection is not retried
# (dwsearch.clients.channel): the key stalls until the next sweep; a call that times out
# instead is dropped by the embedder.
EMBED_TIMEOUT_S = BULK_CALL_TIMEOUT_S
# Each Embed call is sized (dwsearch.sweep.embedqueue.CallSizer) to take about this long
# at the speed calls have been taking, waiting behind the other calls in flight included.
EMBED_CALL_TARGET_S = BULK_CALL_TARGET_S
COUNT_TIMEOUT_S = 30.0
FORGET_ID_COST = 32
"""Forget's ids in characters of text (the unit of offload.INLINE_MAX_SIZE): up to 512
ids are parsed inline."""
PROGRESS_INTERVAL_S = 0.5

# Failures a window is blamed for; the rest are the embedder's state and only stall.
_PERMANENT_ERRORS = (InvalidArgument,)
_SUSPECT_ERRORS = (Internal, DeadlineExceeded)


@dataclass(frozen=True)
class SweepOptions:
    # Only this org; empty = every org whose flags are on.
    org_id: str = ""
    # Stop after this many finished windows; 0 = no limit.
    max_windows: int = 0
    # Stop starting windows after this many seconds; None = no limit.
    max_duration: float | None = None


@dataclass(frozen=True)
class StalledKey:
    key: Key
    error: str


@dataclass
class SweepProgress:
    """Cumulative counts of one sweep (see SweepResponse in sweep.proto)."""

    model: str
    windows_embedded: int = 0
    windows_skipped: int = 0
    windows_poisoned: int = 0
    # Finished windows deleted because an event in them was deleted, edited or became ineligible.
    windows_dropped: int = 0
    keys_total: int = 0
    keys_done: int = 0
    keys_stalled: int = 0
    keys_locked: int = 0
    events_pending: int = 0
    events_processed: int = 0
    budget_exhausted: bool = False
    elapsed: float = 0.0
    stalled: list[StalledKey] = field(default_factory=list)
    done: bool = False
    # (org, the flags that are off) of orgs with events left out because semantic search
    # is off for them (see SweepResponse.orgs_skipped).
    orgs_skipped: list[tuple[str, str]] = field(default_factory=list)
    # Time spent waiting on the embedder and on the database, summed over keys.
    embedder_seconds: float = 0.0
    database_seconds: float = 0.0

    @property
    def windows_finished(self) -> int:
        return self.windows_embedded + self.windows_skipped + self.windows_poisoned


@dataclass(frozen=True)
class SweepStatus:
    model: str
    watermarks: list[WatermarkRow]
    poison: list[PoisonRow]
    embedded_windows: int
    pending_events: int
    unswept_events: int = 0
    unswept_oldest: datetime | None = None


class _Budget:
    """max_windows / max_duration, shared by the keys of one sweep."""

    def __init__(self, options: SweepOptions) -> None:
        self._left = options.max_windows or None
        self._deadline = time.monotonic() + options.max_duration if options.max_duration else None
        self.exhausted = False

    def take(self) -> bool:
        if (self._left is not None and self._left <= 0) or (
            self._deadline is not None and time.monotonic() >= self._deadline
        ):
            self.exhausted = True
            return False
        if self._left is not None:
            self._left -= 1
        return True

    def give_back(self, n: int) -> None:
        if self._left is not None:
            self._left += n


# A batch's embedding outcomes, by id() of its steps.
_Embedded = dict[int, Vectors | Failed]


class _Stall(Exception):
    """Stop this key for this sweep; its watermark stays where it is."""


class _PlanningFailed(_Stall):
    """CountTokens failed: no window is planned yet to blame, so the key only stalls."""

    def __init__(self, error: DwsearchError) -> None:
        super().__init__(f"{error.code.name}: {error}")
        self.error = error


@dataclass
class _SweepRun:
    """What the keys of one sweep share."""

    info: ModelInfo
    budget: _Budget
    progress: SweepProgress
    # One Embed call for these windows; the queue merges the keys' windows into such calls.
    embed: Callable[[list[Window]], Awaitable[list[Vectors]]]
    queue: EmbedQueue[Window, Vectors]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Sweeper:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        embedder: EmbedderClient,
        *,
        model: str,
        redact: Callable[[str], str] | None = None,
        concurrency: int = KEY_CONCURRENCY,
        clock: Callable[[], datetime] = _utcnow,
        max_connections: int | None = None,
    ) -> None:
        """`max_connections`: pooled connections all sweeps of this Sweeper hold at once
        (each swept key holds one for its lock); None = no limit beyond the pool's."""
        self.pool = pool
        self.embedder = embedder
        self.model = model
        self.redact = redact
        self.concurrency = concurrency
        self.clock = clock
        self._slots = asyncio.Semaphore(max_connections) if max_connections else None

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        """A pooled connection for sweep work, within max_connections. A task never holds
        two, so sweeps waiting on each other cannot deadlock."""
        async with contextlib.AsyncExitStack() as stack:
            if self._slots is not None:
                await stack.enter_async_context(self._slots)
            yield await stack.enter_async_context(self.pool.connection())

    # --- Sweep -------------------------------------------------------------------------

    async def sweep(self, options: SweepOptions) -> AsyncIterator[SweepProgress]:
        """Run one sweep, yielding cumulative progress; the last item has done=True."""
        started = time.monotonic()
        # First, so that the events left uncovered are windowed again in this sweep; and
        # before the embedder is asked anything, so that stale text goes even while it is
        # down. Every org's windows (or the one asked for), flags on or off: this only
        # deletes.
        dropped = await self._drop_stale_windows(options.org_id)
        info = await self._model_info()
        async with self._connection() as conn:
            orgs = await enabled_orgs(conn)
            if options.org_id:
                orgs = [org for org in orgs if org == options.org_id]
                skipped = await disabled_reasons(conn, [options.org_id] if not orgs else [])
            else:
                skipped = await disabled_reasons(conn, await orgs_with_events(conn))
            backlog = await store.pending_keys(conn, orgs, self.model)
        if skipped:
            log.info("sweep leaves out orgs whose semantic search is off", extra={"orgs_skipped": skipped})
        progress = SweepProgress(
            model=self.model,
            orgs_skipped=sorted(skipped.items()),
            windows_dropped=dropped,
            keys_total=len(backlog),
            events_pending=sum(b.pending + b.uncovered for b in backlog),
        )
        metrics.SWEEP_EVENTS_PENDING.labels(self.model).set(progress.events_pending)
        yield replace(progress, elapsed=time.monotonic() - started)  # the backlog, before any work
        budget = _Budget(options)

        async def embed(windows: list[Window]) -> list[Vectors]:
            return await self._embed(info, progress, windows)

        embed_queue = EmbedQueue(
            embed, batch=EMBED_BATCH_WINDOWS, in_flight=EMBED_CALLS_IN_FLIGHT, sizer=call_sizer(info)
        )
        run = _SweepRun(info, budget, progress, embed, embed_queue)
        keys = deque(backlog)
        workers = [
            asyncio.create_task(self._work(keys, run)) for _ in range(min(self.concurrency, len(backlog)))
        ]
        try:
            running = set(workers)
            while running:
                finished, running = await asyncio.wait(
                    running, timeout=PROGRESS_INTERVAL_S, return_when=asyncio.FIRST_EXCEPTION
                )
                for task in finished:
                    task.result()  # a bug: fail the sweep, the finally stops the others
                if running:
                    yield replace(
                        progress, elapsed=time.monotonic() - started, stalled=list(progress.stalled)
                    )
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            await embed_queue.close()
        progress.budget_exhausted = budget.exhausted
        progress.elapsed = time.monotonic() - started
        progress.done = True
        metrics.SWEEP_SECONDS.labels(self.model).observe(progress.elapsed)
        metrics.SWEEP_KEYS_STALLED.labels(self.model).set(progress.keys_stalled)
        metrics.SWEEP_LAST_FINISHED.labels(self.model).set_to_current_time()
        log.info(
            "sweep finished",
            extra={
                "model": self.model,
                "windows_embedded": progress.windows_embedded,
                "windows_skipped": progress.windows_skipped,
                "windows_poisoned": progress.windows_poisoned,
                "windows_dropped": progress.windows_dropped,
                "keys_total": progress.keys_total,
                "keys_done": progress.keys_done,
                "keys_stalled": progress.keys_stalled,
                "keys_locked": progress.keys_locked,
                "budget_exhausted": progress.budget_exhausted,
                "elapsed_s": round(progress.elapsed, 3),
                "embedder_s": round(progress.embedder_seconds, 3),
                "database_s": round(progress.database_seconds, 3),
            },
        )
        yield progress

    async def _drop_stale_windows(self, org_id: str) -> int:
        try:
            async with self._connection() as conn:
                dropped = await store.drop_stale_windows(conn, org_id)
        except psycopg.errors.TransactionRollback as exc:  # a deadlock or serialization loser
            log.warning("dropping stale windows failed; the next sweep retries", extra={"error": str(exc)})
            return 0
        if dropped:
            metrics.SWEEP_WINDOWS_DROPPED.inc(dropped)
            log.info("dropped windows of deleted, edited or ineligible events", extra={"windows": dropped})
        return dropped

    async def _model_info(self) -> ModelInfo:
        info = await self.embedder.info()
        if info.model_id != self.model:
            raise FailedPrecondition(
                f"the embedder at {self.embedder.target} serves {info.model_id!r}, but the configured model "
                f"(DWSEARCH_EMBED_MODEL) is {self.model!r}; refusing to write vectors of another model's space"
            )
        return info

    async def _embed(self, info: ModelInfo, progress: SweepProgress, windows: list[Window]) -> list[Vectors]:
        sparse = info.sparse_supported and info.sparse_dimension > 0
        started = time.perf_counter()
        try:
            embeddings = await self.embedder.embed(
                [w.text for w in windows],
                input_type="document",
                sparse=sparse,
                truncate=any(w.over_limit for w in windows),
                priority="bulk",
                timeout=EMBED_TIMEOUT_S,
                # Every response, not only the sweep's first Info: with round robin
                # mid-rollout a call can reach a pod of another model. The key stalls.
                expected_model=self.model,
            )
        finally:
            progress.embedder_seconds += time.perf_counter() - started
        vectors = []
        for e in embeddings:
            # Never store what cannot be searched; blamed on the window like a model error.
            if e.dense is None or not np.isfinite(e.dense).all():
                raise Internal("embedder: a dense vector is missing or not finite")
            vectors.append(Vectors(e.dense, e.sparse))
        return vectors

    async def _work(self, keys: deque[Backlog], run: _SweepRun) -> None:
        while keys and not run.budget.exhausted:
            backlog = keys.popleft()
            try:
                await self._sweep_key(backlog, run)
            except (_Stall, psycopg.Error) as exc:
                error = str(exc) if isinstance(exc, _Stall) else f"database: {exc}"
                run.progress.keys_stalled += 1
                run.progress.stalled.append(StalledKey(backlog.key, error))
                log.warning(
                    "key stalled", extra={"key": backlog.key.__dict__, "model": self.model, "error": error}
                )

    async def _sweep_key(self, backlog: Backlog, run: _SweepRun) -> None:
        async with self._connection() as conn:
            if not await store.try_lock_key(conn, backlog.key, self.model):
                run.progress.keys_locked += 1
                return
            try:
                if await _KeyRun(self, conn, backlog, run).run():
                    run.progress.keys_done += 1
            finally:
                try:
                    await store.unlock_key(conn, backlog.key, self.model)
                except psycopg.Error:
                    # A session lock must not stay on a pooled connection: drop it.
                    await conn.close()

    def line(self, text: str) -> str:
        line = chunk_line(text)
        return self.redact(line) if self.redact is not None else line

    # --- Status, Purge, RetryPoison ------------------------------------------------------

    async def status(self, org_id: str = "", model: str = "") -> SweepStatus:
        model = model or self.model
        async with self.pool.connection() as conn:
            marks = await store.watermarks(conn, model, org_id)
            orgs = [org for org in await enabled_orgs(conn) if not org_id or org == org_id]
            unswept, unswept_oldest = await store.unwatermarked_pending(conn, model, orgs)
            poison = await store.poison_windows(conn, model, org_id)
            embedded = await store.embedded_windows(conn, model, org_id)
        return SweepStatus(
            model=model,
            watermarks=marks,
            poison=poison,
            embedded_windows=embedded,
            pending_events=sum(m.pending for m in marks) + unswept,
            unswept_events=unswept,
            unswept_oldest=unswept_oldest,
        )

    async def purge(self, org_id: str, cutoff: datetime) -> tuple[int, int]:
        """Delete the org's embeddings (every model) whose window includes an event before
        `cutoff`, and keep later sweeps from embedding such events."""
        if not org_id.strip():
            raise InvalidArgument("org_id is required")
        if cutoff > self.clock():
            raise InvalidArgument(f"cutoff {cutoff.isoformat()} is in the future")
        async with self.pool.connection() as conn:
            return await store.purge(conn, org_id, cutoff)

    async def forget(self, org_id: str, message_ids: Sequence[str]) -> int:
        """Drop the org's windows (every model) holding any of the messages, now."""
        if not org_id.strip():
            raise InvalidArgument("org_id is required")
        # About 2 us an id: thousands are parsed off the event loop.
        ids = await offload.run(parse_message_ids, message_ids, size=FORGET_ID_COST * len(message_ids))
        async with self.pool.connection() as conn:
            dropped = await store.drop_windows_holding(conn, org_id, ids)
        if dropped:
            metrics.SWEEP_WINDOWS_DROPPED.inc(dropped)
            log.info("forgot windows", extra={"org_id": org_id, "windows": dropped})
        return dropped

    async def retry_poison(self, org_id: str = "", ids: Sequence[str] = ()) -> int:
        try:
            uuids = [UUID(i) for i in ids]
        except ValueError:
            raise InvalidArgument("ids must be poison window ids (UUIDs)") from None
        async with self.pool.connection() as conn:
            return await store.release_poison(conn, org_id, uuids)


class _KeyRun:
    """Sweeping one key, on the connection that holds its lock."""

    def __init__(
        self, sweeper: Sweeper, conn: psycopg.AsyncConnection, backlog: Backlog, run: _SweepRun
    ) -> None:
        self.sweeper = sweeper
        self.conn = conn
        self.key = backlog.key
        self.backlog = backlog
        self.sweep = run
        self.budget = run.budget
        self.progress = run.progress
        self.model = sweeper.model
        self.watermark: Position | None = None
        self.failures = 0
        self.stopped_by_budget = False

    async def run(self) -> bool:
        """True when the key is caught up; False when the budget stopped it. Raises _Stall
        (or a database error) when the key stalls."""
        started = time.perf_counter()
        state = await store.load_key_state(self.conn, self.key, self.model)
        self.watermark, self.failures = state.watermark, state.consecutive_failures
        # A rewind may reach anywhere before the watermark: then load the whole key.
        after = None if self.backlog.uncovered or self.backlog.reopening else state.watermark
        rows = await store.load_events(self.conn, self.key, self.model, after=after)
        self.progress.database_seconds += time.perf_counter() - started
        # Chunk lines and redaction: in the CPU pool for more than a few KiB of text. Always
        # admitted: the sweep bounds its own concurrency (keys in flight).
        events = await offload.run(self._events, rows, size=sum(len(r.text) for r in rows), refuse=False)
        steps = plan_key(
            events,
            watermark=state.watermark,
            now=self.sweeper.clock(),
            max_tokens=self.sweep.info.max_input_tokens,
            count_tokens=self._count_tokens,
        )
        batches = self._batches(steps)
        embedding: asyncio.Future[_Embedded] | None = None
        try:
            batch = await anext(batches, None)
            if batch is not None:
                embedding = asyncio.ensure_future(self._embed_batch(batch))
            while batch is not None and embedding is not None:
                # Keep the embedder busy: plan the next batch while this one is embedded,
                # and queue it before committing this one.
                try:
                    following = await anext(batches, None)
                except _Stall:
                    await self._commit_batch(batch, await embedding)
                    raise
                following_embedding = (
                    asyncio.ensure_future(self._embed_batch(following)) if following else None
                )
                try:
                    await self._commit_batch(batch, await embedding)
                except BaseException:
                    if following_embedding is not None:
                        following_embedding.cancel()
                    self._give_back(following or [])
                    raise
                batch, embedding = following, following_embedding
        except _PlanningFailed as exc:
            await self._record_failure(exc.error, counts=False)  # after the batch before it committed
            raise
        finally:
            if embedding is not None and not embedding.done():
                embedding.cancel()
            await batches.aclose()
            await steps.aclose()
        return not self.stopped_by_budget

    def _events(self, rows: Sequence[store.EventRow]) -> list[KeyEvent]:
        line = self.sweeper.line
        return [
            KeyEvent(Message(r.id, r.created_at, line(r.text), r.digest or ""), r.window_id, r.window_size)
            for r in rows
        ]

    async def _batches(self, steps: AsyncIterator[Step]) -> AsyncIterator[list[Step]]:
        """The plan's steps cut into batches of EMBED_BATCH_WINDOWS windows to embed,
        each window's budget taken as it is planned."""
        batch: list[Step] = []
        embeds = 0
        async for step in steps:
            if isinstance(step, Finish) and not self.budget.take():
                self.stopped_by_budget = True
                break
            batch.append(step)
            embeds += _needs_embedding(step)
            if embeds == EMBED_BATCH_WINDOWS:
                yield batch
                batch, embeds = [], 0
        if batch:
            yield batch

    def _give_back(self, steps: list[Step]) -> None:
        self.budget.give_back(sum(1 for s in steps if isinstance(s, Finish)))

    async def _count_tokens(self, texts: Sequence[str]) -> list[int]:
        started = time.perf_counter()
        try:
            counts, _ = await self.sweeper.embedder.count_tokens(texts, timeout=COUNT_TIMEOUT_S)
        except DwsearchError as exc:
            raise _PlanningFailed(exc) from exc
        finally:
            self.progress.embedder_seconds += time.perf_counter() - started
        return counts

    async def _embed_batch(self, batch: list[Step]) -> _Embedded:
        """Vectors (or the failed call's error) for the batch's substantial windows, by step."""
        to_embed = [s for s in batch if _needs_embedding(s)]
        if not to_embed:
            return {}
        outcomes = await self.sweep.queue.embed([s.window for s in to_embed])
        return dict(zip(map(id, to_embed), outcomes, strict=True))

    async def _commit_batch(self, batch: list[Step], embedded: _Embedded) -> None:
        """Commit the batch's steps in order; on a failure the rest is given back to the budget."""
        for n, step in enumerate(batch):
            try:
                await self._commit(step, embedded)
            except BaseException:
                self._give_back(batch[n:])
                raise

    async def _commit(self, step: Step, embedded: _Embedded) -> None:
        if isinstance(step, Advance):
            await self._write(
                store.advance(
                    self.conn, self.key, self.model, expected=self.watermark, position=step.position
                )
            )
            self.watermark = step.position
            return
        if not _needs_embedding(step):
            await self._finish(step, store.SKIPPED)
            self.progress.windows_skipped += 1
            metrics.SWEEP_WINDOWS.labels(self.model, "skipped").inc()
            return
        outcome = embedded[id(step)]
        if isinstance(outcome, Failed) and outcome.shared_by > 1 and not _is_outage(outcome.error):
            # The call failed on one of its windows: ask for this one alone to know.
            try:
                (outcome,) = await self.sweep.embed([step.window])
            except DwsearchError as exc:
                outcome = Failed(exc, 1)
        if not isinstance(outcome, Failed):
            await self._finish(step, store.EMBEDDED, vectors=outcome)
            self.progress.windows_embedded += 1
            metrics.SWEEP_WINDOWS.labels(self.model, "embedded").inc()
            return
        error = outcome.error
        counts = isinstance(error, _PERMANENT_ERRORS + _SUSPECT_ERRORS)
        attempts = await self._record_failure(error, counts=counts)
        if isinstance(error, _PERMANENT_ERRORS) or (counts and attempts >= POISON_AFTER_FAILURES):
            await self._finish(
                step, store.POISON, error=f"{error.code.name}: {error}", attempts=max(attempts, 1)
            )
            self.progress.windows_poisoned += 1
            metrics.SWEEP_WINDOWS.labels(self.model, "poisoned").inc()
            log.warning(
                "window poisoned",
                extra={
                    "key": self.key.__dict__,
                    "model": self.model,
                    "ids": list(step.window.ids),
                    "error": str(error),
                },
            )
            return
        raise _Stall(f"{error.code.name}: {error}")

    async def _finish(
        self,
        step: Finish,
        status: str,
        *,
        vectors: Vectors | None = None,
        error: str | None = None,
        attempts: int = 0,
    ) -> None:
        await self._write(
            store.finish_window(
                self.conn,
                key=self.key,
                model=self.model,
                expected=self.watermark,
                window=step.window,
                status=status,
                replaces=step.replaces,
                vectors=vectors,
                sparse_dimension=self.sweep.info.sparse_dimension,
                error=error,
                attempts=attempts,
            )
        )
        self.watermark = step.position
        self.failures = 0
        self.progress.events_processed += len(step.window.messages)

    async def _write(self, write: Awaitable[T]) -> T:
        started = time.perf_counter()
        try:
            return await write
        except WriteConflict as exc:
            raise _Stall(str(exc)) from exc
        finally:
            self.progress.database_seconds += time.perf_counter() - started

    async def _record_failure(self, error: DwsearchError, *, counts: bool) -> int:
        """The run of failures on the key's next window, this one included."""
        message = f"{error.code.name}: {error}"
        try:
            self.failures = await store.record_failure(
                self.conn, self.key, self.model, message, counts=counts
            )
        except psycopg.Error:
            # The stall is reported either way; the counter waits for a reachable database.
            log.warning("could not record a failure", extra={"key": self.key.__dict__}, exc_info=True)
            self.failures += int(counts)
        return self.failures


def call_sizer(info: ModelInfo) -> CallSizer:
    """How many windows each Embed call of a sweep carries: EMBED_BATCH_WINDOWS at most,
    fewer when the embedder is slow, so that a call fits EMBED_CALL_TARGET_S. The first
    calls go by the query latency the embedder reports (all EMBED_CALLS_IN_FLIGHT calls
    wait on one pod in the worst case); later ones by how long calls took."""
    estimate = None
    if info.query_latency_ms > 0:
        estimate = EMBED_CALLS_IN_FLIGHT * DOCUMENT_COST_PER_QUERY * info.query_latency_ms / 1000
    return CallSizer(target_s=EMBED_CALL_TARGET_S, max_batch=EMBED_BATCH_WINDOWS, initial_window_s=estimate)


def _needs_embedding(step: Step) -> TypeGuard[Finish]:
    return isinstance(step, Finish) and is_substantial(step.window.text)


def _is_outage(error: DwsearchError) -> bool:
    return not isinstance(error, _PERMANENT_ERRORS + _SUSPECT_ERRORS)
