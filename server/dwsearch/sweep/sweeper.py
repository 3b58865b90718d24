"""One sweep over the keys with work to do: the domain behind SweepService's Sweep.

Per sweep: drop the finished windows holding an event since deleted, edited or no
longer eligible (their text must not outlive it); for each model (DWSEARCH_EMBED_MODELS,
each its own vector space, watermarks and poison records) ask the embedder for it
through a client of that model, whose model check refuses an embedder that serves
another (anything else would pollute the vector space); list the orgs whose flags are
on; find each model's keys with events past the watermark or uncovered before it; and
work through them — KEY_CONCURRENCY at a time, the models' keys interleaved, each under
its key lock so that concurrent sweepers split the keys. Each key is a KeyRun
(dwsearch.sweep.keyrun), which returns what it did.

A model the embedder cannot serve (its Info fails, e.g. FAILED_PRECONDITION) is left
out of the sweep with the reason in its progress; the other models are swept. When no
model can be swept, the sweep fails with the first model's error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from itertools import chain, zip_longest

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from dwsearch.clients.embedder import BULK_CALL_TARGET_S, DOCUMENT_COST_PER_QUERY, EmbedderClient, ModelInfo
from dwsearch.common import metrics
from dwsearch.common.errors import DwsearchError
from dwsearch.db.distributed import unreachable_orgs
from dwsearch.flags import disabled_reasons, enabled_orgs, orgs_with_events
from dwsearch.redaction import REDACTION_OFF, Redaction
from dwsearch.sweep.embedqueue import CallSizer, EmbedQueue
from dwsearch.sweep.keyrun import EMBED_BATCH_WINDOWS, Budget, KeyResult, KeyRun, ModelPass, embed_windows
from dwsearch.sweep.store import discovery, keys, lexical, retention
from dwsearch.sweep.store.keys import Backlog, Key
from dwsearch.sweep.store.writes import Vectors
from dwsearch.sweep.window import Window, chunk_line

__all__ = [
    "EMBED_BATCH_WINDOWS",
    "EMBED_CALLS_IN_FLIGHT",
    "KEY_CONCURRENCY",
    "ModelProgress",
    "StalledKey",
    "SweepOptions",
    "SweepProgress",
    "Sweeper",
    "call_sizer",
]

log = logging.getLogger(__name__)

# Keys swept at once by one sweep (over every model); each holds a pooled connection (its
# key lock) while it waits on the embedder, so keep it well under the pool size search
# shares.
KEY_CONCURRENCY = 4
# Embed calls in flight per sweep and model: with EMBED_BATCH_WINDOWS windows a call,
# enough queued work for the embedder to fill its token-budget batches (one call per
# window would starve it).
EMBED_CALLS_IN_FLIGHT = 4
# Each Embed call is sized (dwsearch.sweep.embedqueue.CallSizer) to take about this long
# at the speed calls have been taking, waiting behind the other calls in flight included.
EMBED_CALL_TARGET_S = BULK_CALL_TARGET_S
PROGRESS_INTERVAL_S = 0.5


@dataclass(frozen=True)
class SweepOptions:
    # Only this org; empty = every org whose flags are on.
    org_id: str = ""
    # Stop after this many finished windows (over every model); 0 = no limit.
    max_windows: int = 0
    # Stop starting windows after this many seconds; None = no limit.
    max_duration: float | None = None


@dataclass(frozen=True)
class StalledKey:
    key: Key
    error: str
    model: str = ""


@dataclass
class ModelProgress:
    """Cumulative counts of one model's pass (see ModelSweep in sweep.proto)."""

    model: str
    windows_embedded: int = 0
    windows_skipped: int = 0
    windows_poisoned: int = 0
    keys_total: int = 0
    keys_done: int = 0
    keys_stalled: int = 0
    keys_locked: int = 0
    events_pending: int = 0
    events_processed: int = 0
    stalled: list[StalledKey] = field(default_factory=list)
    # Time spent waiting on the embedder and on the database, summed over keys.
    embedder_seconds: float = 0.0
    database_seconds: float = 0.0
    # Why the model was not swept ("FAILED_PRECONDITION: ..."); empty when it was.
    error: str = ""

    @property
    def windows_finished(self) -> int:
        return self.windows_embedded + self.windows_skipped + self.windows_poisoned

    def add(self, result: KeyResult) -> None:
        """Count what a key run did (so far)."""
        self.windows_embedded += result.windows_embedded
        self.windows_skipped += result.windows_skipped
        self.windows_poisoned += result.windows_poisoned
        self.events_processed += result.events_processed
        self.embedder_seconds += result.embedder_seconds
        self.database_seconds += result.database_seconds


@dataclass
class SweepProgress:
    """Cumulative counts of one sweep (see SweepResponse in sweep.proto): per model, and
    summed over the models."""

    # The default model (the first).
    model: str
    models: list[ModelProgress]
    # Finished windows deleted because an event in them was deleted, edited or became ineligible.
    windows_dropped: int = 0
    budget_exhausted: bool = False
    elapsed: float = 0.0
    done: bool = False
    # (org, the flags that are off) of orgs with events left out because semantic search
    # is off for them (see SweepResponse.orgs_skipped).
    orgs_skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def windows_embedded(self) -> int:
        return sum(m.windows_embedded for m in self.models)

    @property
    def windows_skipped(self) -> int:
        return sum(m.windows_skipped for m in self.models)

    @property
    def windows_poisoned(self) -> int:
        return sum(m.windows_poisoned for m in self.models)

    @property
    def windows_finished(self) -> int:
        return sum(m.windows_finished for m in self.models)

    @property
    def keys_total(self) -> int:
        return sum(m.keys_total for m in self.models)

    @property
    def keys_done(self) -> int:
        return sum(m.keys_done for m in self.models)

    @property
    def keys_stalled(self) -> int:
        return sum(m.keys_stalled for m in self.models)

    @property
    def keys_locked(self) -> int:
        return sum(m.keys_locked for m in self.models)

    @property
    def events_pending(self) -> int:
        return sum(m.events_pending for m in self.models)

    @property
    def events_processed(self) -> int:
        return sum(m.events_processed for m in self.models)

    @property
    def embedder_seconds(self) -> float:
        return sum(m.embedder_seconds for m in self.models)

    @property
    def database_seconds(self) -> float:
        return sum(m.database_seconds for m in self.models)

    @property
    def stalled(self) -> list[StalledKey]:
        return list(chain.from_iterable(m.stalled for m in self.models))


@dataclass
class _Pass:
    """A model's pass in one sweep: what its keys share, its counts of the keys finished,
    and the key runs in flight."""

    shared: ModelPass
    progress: ModelProgress
    running: set[KeyRun] = field(default_factory=set)

    def snapshot(self) -> ModelProgress:
        progress = replace(self.progress, stalled=list(self.progress.stalled))
        for run in self.running:
            progress.add(run.result)
        return progress

    def finish(self, result: KeyResult) -> None:
        progress = self.progress
        progress.add(result)
        if result.stalled:
            progress.keys_stalled += 1
            progress.stalled.append(StalledKey(result.key, result.stalled, progress.model))
            log.warning(
                "key stalled",
                extra={"key": result.key.__dict__, "model": progress.model, "error": result.stalled},
            )
        elif result.done:
            progress.keys_done += 1


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Sweeper:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        embedder: EmbedderClient,
        *,
        model: str = "",
        models: Sequence[str] = (),
        redaction: Redaction = REDACTION_OFF,
        concurrency: int = KEY_CONCURRENCY,
        clock: Callable[[], datetime] = _utcnow,
        max_connections: int | None = None,
        full_check_budget: float = discovery.FULL_CHECK_BUDGET_S,
    ) -> None:
        """`model`: the model to sweep; `models`: several instead (DWSEARCH_EMBED_MODELS),
        the first the default. Each is asked for through `embedder.for_model`, over
        `embedder`'s channel. `max_connections`: pooled connections all sweeps of this
        Sweeper hold at once (each swept key holds one for its lock); None = no limit
        beyond the pool's."""
        self.models = tuple(models) or (model,)
        if not all(self.models):
            raise ValueError("a sweep needs its model(s) named")
        self.model = self.models[0]
        self.pool = pool
        self.embedder = embedder
        self.redaction = redaction
        self.concurrency = concurrency
        self.clock = clock
        self._slots = asyncio.Semaphore(max_connections) if max_connections else None
        self.full_check_budget = full_check_budget

    @contextlib.asynccontextmanager
    async def _connection(self, *, unprepared: bool = False) -> AsyncIterator[psycopg.AsyncConnection]:
        """A pooled connection for sweep work, within max_connections. A task never holds
        two, so sweeps waiting on each other cannot deadlock. `unprepared`: its statements
        are planned for their parameters each time (no prepared statements), so that a
        cluster reads only the shards of the orgs they name (a generic plan of
        `org_id = ANY($1)` reads every shard)."""
        async with contextlib.AsyncExitStack() as stack:
            if self._slots is not None:
                await stack.enter_async_context(self._slots)
            conn = await stack.enter_async_context(self.pool.connection())
            if not unprepared:
                yield conn
                return
            threshold, conn.prepare_threshold = conn.prepare_threshold, None
            try:
                yield conn
            finally:
                conn.prepare_threshold = threshold

    def line(self, text: str) -> str:
        line = chunk_line(text)
        return self.redaction.text(line)

    async def sweep(self, options: SweepOptions) -> AsyncIterator[SweepProgress]:
        """Run one sweep, yielding cumulative progress; the last item has done=True."""
        started = time.monotonic()
        clients = {model: self.embedder.for_model(model) for model in self.models}
        async with self._connection() as conn:
            try:  # leases a broken connection or a stopped worker left held (keys.release_lease)
                await keys.release_lost_leases(conn)
            except psycopg.Error as exc:
                log.warning(
                    "releasing leases left held failed; the next sweep retries", extra={"error": str(exc)}
                )
            orgs = await enabled_orgs(conn)
            unreachable: dict[str, str] = {}
            if options.org_id:
                orgs = [org for org in orgs if org == options.org_id]
                skipped = await disabled_reasons(conn, [options.org_id] if not orgs else [])
                order = [options.org_id]  # the one org asked for: always checked in full
            elif unreachable := await unreachable_orgs(conn, orgs):
                # A worker of the cluster is down: the other orgs are swept, reading only
                # their own shards (the statements over every shard would fail).
                orgs = [org for org in orgs if org not in unreachable]
                skipped = {}
                async with self._connection(unprepared=True) as own_shards:
                    order = await discovery.check_order_among(own_shards, orgs)
                log.warning(
                    "sweep leaves out orgs whose worker is unreachable",
                    extra={
                        "orgs_unreachable": len(unreachable),
                        "reasons": sorted(set(unreachable.values())),
                    },
                )
            else:
                skipped = await disabled_reasons(conn, await orgs_with_events(conn))
                order = await discovery.check_order(conn, orgs)
        metrics.SWEEP_ORGS_UNREACHABLE.set(len(unreachable))
        pruned = bool(unreachable)
        try:
            infos = await self._model_infos(clients)
        except BaseException:
            # Stale text goes even while the embedder is down.
            await self._full_check(order, orgs, [], whole=bool(options.org_id), unprepared=pruned)
            raise
        served = {model: info for model, info in infos.items() if isinstance(info, ModelInfo)}
        checked, dropped, backlogs = await self._full_check(
            order, orgs, list(served), whole=bool(options.org_id), unprepared=pruned
        )
        if not pruned:  # (a worker down: its statements over every shard would fail)
            await self._backfill_lexical(orgs, checked)
        unchecked = [org for org in orgs if org not in checked]
        metrics.SWEEP_FULL_CHECK_ORGS.set(len(checked))
        async with self._connection(unprepared=pruned) as conn:
            oldest = await discovery.oldest_check(conn, orgs) if served and orgs else None
            metrics.SWEEP_FULL_CHECK_OLDEST.set(
                (datetime.now(UTC) - oldest).total_seconds() if oldest is not None else 0
            )
            for model in served:
                if not pruned:
                    found = await discovery.keys_with_new_events(conn, unchecked, model)
                    backlogs[model].extend(
                        await keys.pending_keys(conn, sorted({k.org_id for k in found}), model, only=found)
                    )
                    continue
                for org in unchecked:  # org by org: each statement reads one shard (discovery)
                    if found := await discovery.keys_with_new_events(conn, [org], model):
                        backlogs[model].extend(await keys.pending_keys(conn, [org], model, only=found))
        for backlog in backlogs.values():
            backlog.sort(key=_waiting_order)
        if skipped:
            log.info("sweep leaves out orgs whose semantic search is off", extra={"orgs_skipped": skipped})
        models = []
        for model, info in infos.items():
            if isinstance(info, str):
                models.append(ModelProgress(model=model, error=info))
                continue
            backlog = backlogs[model]
            models.append(
                ModelProgress(
                    model=model,
                    keys_total=len(backlog),
                    events_pending=sum(b.pending + b.uncovered for b in backlog),
                )
            )
            metrics.SWEEP_EVENTS_PENDING.labels(model).set(models[-1].events_pending)
        summary = SweepProgress(
            model=self.model,
            models=models,
            orgs_skipped=sorted({**skipped, **unreachable}.items()),
            windows_dropped=dropped,
        )
        passes: list[_Pass] = []

        def snapshot() -> SweepProgress:
            by_model = {p.progress.model: p.snapshot() for p in passes}
            return replace(
                summary,
                models=[by_model.get(m.model) or replace(m, stalled=list(m.stalled)) for m in summary.models],
                elapsed=time.monotonic() - started,
            )

        yield snapshot()  # the backlog, before any work
        budget = Budget(options.max_windows, options.max_duration)
        passes.extend(
            _Pass(self._model_pass(clients[m.model], served[m.model], m, budget), m)
            for m in models
            if not m.error
        )
        # The models' keys interleaved, each model's longest-waiting first.
        work: deque[tuple[_Pass, Backlog]] = deque(
            item
            for row in zip_longest(*([(p, b) for b in backlogs[p.progress.model]] for p in passes))
            for item in row
            if item is not None
        )
        workers = [
            asyncio.create_task(self._work(work, budget)) for _ in range(min(self.concurrency, len(work)))
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
                    yield snapshot()
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            for p in passes:
                await p.shared.queue.close()
        summary.budget_exhausted = budget.exhausted
        summary.elapsed = time.monotonic() - started
        summary.done = True
        for m in summary.models:
            if not m.error:
                metrics.SWEEP_SECONDS.labels(m.model).observe(summary.elapsed)
                metrics.SWEEP_KEYS_STALLED.labels(m.model).set(m.keys_stalled)
                metrics.SWEEP_LAST_FINISHED.labels(m.model).set_to_current_time()
            log.info(
                "sweep finished",
                extra={
                    "model": m.model,
                    "error": m.error,
                    "windows_embedded": m.windows_embedded,
                    "windows_skipped": m.windows_skipped,
                    "windows_poisoned": m.windows_poisoned,
                    "windows_dropped": summary.windows_dropped,
                    "keys_total": m.keys_total,
                    "keys_done": m.keys_done,
                    "keys_stalled": m.keys_stalled,
                    "keys_locked": m.keys_locked,
                    "budget_exhausted": summary.budget_exhausted,
                    "elapsed_s": round(summary.elapsed, 3),
                    "embedder_s": round(m.embedder_seconds, 3),
                    "database_s": round(m.database_seconds, 3),
                },
            )
        yield summary

    async def _full_check(
        self,
        order: Sequence[str],
        orgs: Sequence[str],
        models: Sequence[str],
        *,
        whole: bool,
        unprepared: bool = False,
    ) -> tuple[set[str], int, dict[str, list[Backlog]]]:
        """The full check (dwsearch.sweep.store.discovery) over orgs in `order`, batch by
        batch, until the full-check budget is spent (`whole`: every org of `order`): drop
        the finished windows holding events since deleted, edited or made ineligible (of
        every org with windows, flags on or off: this only deletes), then read the backlog
        of `models` for the batch's orgs of `orgs` (those with semantic search on).
        Returns the orgs checked, the windows dropped and each model's backlog."""
        enabled = set(orgs)
        backlogs: dict[str, list[Backlog]] = {model: [] for model in models}
        checked: set[str] = set()
        dropped = 0
        started = time.monotonic()
        # (`unprepared`, a worker down: org by org, each statement reading one shard)
        size = 1 if unprepared else discovery.FULL_CHECK_BATCH_ORGS
        for lo in range(0, len(order), size):
            if lo and not whole and time.monotonic() - started >= self.full_check_budget:
                break
            batch = list(order[lo : lo + size])
            async with self._connection(unprepared=unprepared) as conn:
                dropped += await self._drop_stale_windows(conn, batch)
                swept = [org for org in batch if org in enabled]
                for model in models:
                    backlogs[model].extend(await keys.pending_keys(conn, swept, model))
                # The orgs' events were read for the models: a check. (A sweep of one org
                # records nothing for an org that is off or unknown.)
                checked_now = batch if not whole else swept
                if models and checked_now:
                    await discovery.mark_checked(conn, checked_now)
            checked.update(batch)
        if dropped:
            metrics.SWEEP_WINDOWS_DROPPED.inc(dropped)
            log.info("dropped windows of deleted, edited or ineligible events", extra={"windows": dropped})
        return checked, dropped, backlogs

    async def _backfill_lexical(self, orgs: Sequence[str], checked: Collection[str]) -> None:
        """Lexical weights for windows embedded before the lexical leg existed (migration
        0014), and again for windows weighed by an older term extraction (migration 0021:
        before Simplified and Traditional Chinese were folded, or by a sweep of the release
        before during a rolling upgrade), batch after batch per org and model, within the
        full check's time budget: a large backfill spreads over several sweeps, and
        search's lexical leg finds each window by its new terms once it has them. The orgs
        of this sweep's full check (`checked`) also get the projections their windows with
        weights lack (migration 0016)."""
        done, projected, started = 0, 0, time.monotonic()

        def spent() -> bool:
            return time.monotonic() - started >= self.full_check_budget

        try:
            async with self._connection() as conn:
                for pending in await lexical.backfill_pending(conn, list(orgs), self.models, recount=checked):
                    if pending.unprojected:
                        projected += await lexical.reproject(conn, pending.org_id, pending.model)
                    while (pending.unweighed or pending.stale) and not spent():
                        weighed = await lexical.backfill(conn, pending.org_id, pending.model)
                        done += weighed
                        if weighed < lexical.BACKFILL_BATCH:
                            break
                    if spent():
                        break
        except (psycopg.errors.TransactionRollback, psycopg.errors.ForeignKeyViolation) as exc:
            # A deadlock, or a window deleted under a projection being written.
            log.warning("lexical backfill failed; the next sweep goes on", extra={"error": str(exc)})
        if done:
            metrics.SWEEP_LEXICAL_BACKFILLED.inc(done)
            log.info("lexical weights backfilled", extra={"windows": done})
        if projected:
            log.info("lexical projections written for windows that had none", extra={"windows": projected})

    async def _drop_stale_windows(self, conn: psycopg.AsyncConnection, orgs: list[str]) -> int:
        try:
            if len(orgs) == 1:  # named by its id: one shard on a cluster (keys.pending_keys)
                return await retention.drop_stale_windows(conn, orgs[0])
            return await retention.drop_stale_windows(conn, orgs=orgs)
        except psycopg.errors.TransactionRollback as exc:  # a deadlock or serialization loser
            log.warning("dropping stale windows failed; the next sweep retries", extra={"error": str(exc)})
            return 0

    async def _model_infos(self, clients: dict[str, EmbedderClient]) -> dict[str, ModelInfo | str]:
        """Each model's Info, or why it cannot be swept. The client refuses an embedder
        that describes another model (ModelMismatch). Raises the first model's error
        when no model can be swept."""
        outcomes = await asyncio.gather(*(c.info() for c in clients.values()), return_exceptions=True)
        infos: dict[str, ModelInfo | str] = {}
        for model, outcome in zip(clients, outcomes, strict=True):
            if isinstance(outcome, DwsearchError):
                infos[model] = f"{outcome.kind.name}: {outcome}"
                log.warning("sweep leaves out a model", extra={"model": model, "error": infos[model]})
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                infos[model] = outcome
        if not any(isinstance(i, ModelInfo) for i in infos.values()):
            first = outcomes[0]
            assert isinstance(first, BaseException)
            raise first
        return infos

    def _model_pass(
        self, embedder: EmbedderClient, info: ModelInfo, progress: ModelProgress, budget: Budget
    ) -> ModelPass:
        async def embed(windows: list[Window]) -> list[Vectors]:
            started = time.perf_counter()
            try:
                return await embed_windows(embedder, info, windows)
            finally:
                progress.embedder_seconds += time.perf_counter() - started

        queue = EmbedQueue(
            embed, batch=EMBED_BATCH_WINDOWS, in_flight=EMBED_CALLS_IN_FLIGHT, sizer=call_sizer(info)
        )
        return ModelPass(
            model=progress.model,
            embedder=embedder,
            info=info,
            queue=queue,
            embed=embed,
            budget=budget,
            clock=self.clock,
            line=self.line,
        )

    async def _work(self, work: deque[tuple[_Pass, Backlog]], budget: Budget) -> None:
        while work and not budget.exhausted:
            model_pass, backlog = work.popleft()
            try:
                result = await self._sweep_key(model_pass, backlog)
            except psycopg.Error as exc:  # no connection, or the key lock
                result = KeyResult(backlog.key, stalled=f"database: {exc}")
            if result is not None:
                model_pass.finish(result)

    async def _sweep_key(self, model_pass: _Pass, backlog: Backlog) -> KeyResult | None:
        """What sweeping the key did; None when another sweeper holds it."""
        model = model_pass.progress.model
        lost: psycopg.AsyncConnection | None = None
        try:
            async with self._connection() as conn:
                if not await keys.try_lock_key(conn, backlog.key, model):
                    model_pass.progress.keys_locked += 1
                    return None
                run = KeyRun(conn, backlog, model_pass.shared)
                model_pass.running.add(run)
                try:
                    return await run.run()
                finally:
                    model_pass.running.discard(run)
                    try:
                        await keys.unlock_key(conn, backlog.key, model)
                    except psycopg.Error:
                        # A session lock must not stay on a pooled connection: drop it.
                        await conn.close()
                        lost = conn
        finally:
            if lost is not None and keys.leased(lost):
                # A lease outlives its broken connection: released through another (after
                # this one went back: a task never holds two).
                with contextlib.suppress(psycopg.Error, PoolTimeout):
                    async with self._connection() as conn:
                        await keys.release_lease(conn, backlog.key, model, held_by=lost)


def _waiting_order(backlog: Backlog) -> tuple[datetime, str, str, str]:
    """The longest-waiting keys first."""
    key = backlog.key
    return (
        backlog.oldest or datetime.max.replace(tzinfo=UTC),
        key.org_id,
        key.provider,
        key.external_channel_id,
    )


def call_sizer(info: ModelInfo) -> CallSizer:
    """How many windows each Embed call of a sweep carries: EMBED_BATCH_WINDOWS at most,
    fewer when the embedder is slow, so that a call fits EMBED_CALL_TARGET_S. The first
    calls go by the query latency the embedder reports (all EMBED_CALLS_IN_FLIGHT calls
    wait on one pod in the worst case); later ones by how long calls took."""
    estimate = None
    if info.query_latency_ms > 0:
        estimate = EMBED_CALLS_IN_FLIGHT * DOCUMENT_COST_PER_QUERY * info.query_latency_ms / 1000
    return CallSizer(target_s=EMBED_CALL_TARGET_S, max_batch=EMBED_BATCH_WINDOWS, initial_window_s=estimate)
