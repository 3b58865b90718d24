"""Sweeping one key for one model, on the connection that holds its key lock: plan
(dwsearch.sweep.keyplan) a batch of windows, hand it to the model's embed queue (which
merges the keys' windows into Embed calls), plan the next batch meanwhile, and commit
each finished window together with its watermark advance.

Everything a key run needs comes in (the connection, the key's backlog, the model's
pass); what it did comes back as a KeyResult, which it keeps current while it runs so
that the sweep can report progress. It never calls back into the Sweeper.

Failures. Embedder outages (UNAVAILABLE, RESOURCE_EXHAUSTED, CANCELLED, and a
FAILED_PRECONDITION such as an answer of another model) and database errors stall the
key: its watermark waits for the next sweep. A window the embedder rejects
(INVALID_ARGUMENT) is recorded as poison at once; one it fails on otherwise (INTERNAL,
DEADLINE_EXCEEDED: the input may be what breaks or stalls the model) stalls the key and
becomes poison on the POISON_AFTER_FAILURES-th sweep in a row. Poison is skipped: the
watermark moves past it until RetryPoison releases it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeGuard, TypeVar

import numpy as np
import psycopg

from dwsearch.clients.embedder import BULK_CALL_TIMEOUT_S, EmbedderClient, ModelInfo
from dwsearch.common import metrics, offload, tracing
from dwsearch.common.errors import DeadlineExceeded, DwsearchError, Internal, InvalidArgument
from dwsearch.sweep.embedqueue import EmbedQueue, Failed
from dwsearch.sweep.keyplan import Advance, Finish, KeyEvent, Position, Step, plan_key
from dwsearch.sweep.store import keys, writes
from dwsearch.sweep.store.keys import Backlog, Key
from dwsearch.sweep.store.writes import Vectors, WriteConflict
from dwsearch.sweep.substance import is_substantial
from dwsearch.sweep.window import Message, Window

log = logging.getLogger(__name__)
T = TypeVar("T")

POISON_AFTER_FAILURES = 3
# Windows per Embed call (at most): a key's plan is cut into batches of this many
# windows to embed, and the embed queue sends up to this many per call.
EMBED_BATCH_WINDOWS = 32
# The deadline of one Embed call, below the grace of a connection closed for age (see
# BULK_CALL_TIMEOUT_S). A call cut off by a closed connection is not retried
# (dwsearch.clients.channel): the key stalls until the next sweep; a call that times out
# instead is dropped by the embedder.
EMBED_TIMEOUT_S = BULK_CALL_TIMEOUT_S
COUNT_TIMEOUT_S = 30.0

# Failures a window is blamed for; the rest are the embedder's state and only stall.
_PERMANENT_ERRORS = (InvalidArgument,)
_SUSPECT_ERRORS = (Internal, DeadlineExceeded)


class Budget:
    """max_windows / max_duration, shared by the keys (of every model) of one sweep."""

    def __init__(self, max_windows: int = 0, max_duration: float | None = None) -> None:
        self._left = max_windows or None
        self._deadline = time.monotonic() + max_duration if max_duration else None
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


@dataclass(frozen=True)
class ModelPass:
    """What the keys of one model's pass share; the Sweeper builds it per sweep."""

    model: str
    # Asks for `model` on every request and checks every answer is of it (ModelMismatch).
    embedder: EmbedderClient
    info: ModelInfo
    # The sweep's windows of this model, merged into Embed calls.
    queue: EmbedQueue[Window, Vectors]
    # One Embed call of its own, for a window whose shared call failed.
    embed: Callable[[list[Window]], Awaitable[list[Vectors]]]
    budget: Budget
    # Now, as each key is planned (which windows are closed: dwsearch.sweep.window).
    clock: Callable[[], datetime]
    # An event's chunk line (redacted when the sweep redacts).
    line: Callable[[str], str]


@dataclass
class KeyResult:
    """What sweeping one key did: current while the run goes on, final when it returns."""

    key: Key
    windows_embedded: int = 0
    windows_skipped: int = 0
    windows_poisoned: int = 0
    events_processed: int = 0
    # Time spent waiting on the embedder (CountTokens; Embed is timed per call by the
    # sweep) and on the database.
    embedder_seconds: float = 0.0
    database_seconds: float = 0.0
    # Caught up to its last closed window (False when the budget or a stall stopped it).
    done: bool = False
    # Why the key stalled; empty when it did not.
    stalled: str = ""


async def embed_windows(embedder: EmbedderClient, info: ModelInfo, windows: list[Window]) -> list[Vectors]:
    """One Embed call of a sweep for `windows` (the client checks the answer's model)."""
    sparse = info.sparse_supported and info.sparse_dimension > 0
    embeddings = await embedder.embed(
        [w.text for w in windows],
        input_type="document",
        sparse=sparse,
        truncate=any(w.over_limit for w in windows),
        priority="bulk",
        timeout=EMBED_TIMEOUT_S,
    )
    vectors = []
    for e in embeddings:
        # Never store what cannot be searched; blamed on the window like a model error.
        if e.dense is None or not np.isfinite(e.dense).all():
            raise Internal("embedder: a dense vector is missing or not finite")
        vectors.append(Vectors(e.dense, e.sparse))
    return vectors


# A batch's embedding outcomes, by id() of its steps.
_Embedded = dict[int, Vectors | Failed]


class _Stall(Exception):
    """Stop this key for this sweep; its watermark stays where it is."""


class _PlanningFailed(_Stall):
    """CountTokens failed: no window is planned yet to blame, so the key only stalls."""

    def __init__(self, error: DwsearchError) -> None:
        super().__init__(f"{error.kind.name}: {error}")
        self.error = error


class KeyRun:
    """Sweeping one key for one model, on the connection that holds its lock."""

    def __init__(self, conn: psycopg.AsyncConnection, backlog: Backlog, shared: ModelPass) -> None:
        self.conn = conn
        self.key = backlog.key
        self.backlog = backlog
        self.shared = shared
        self.model = shared.model
        self.result = KeyResult(backlog.key)
        self.watermark: Position | None = None
        self.failures = 0
        self.stopped_by_budget = False

    async def run(self) -> KeyResult:
        """Sweep the key: caught up (done), stopped by the budget, or stalled with the
        reason (a database error included); the watermark is where the last commit left it."""
        with tracing.span("sweep key", org_id=self.key.org_id, model=self.model):
            try:
                await self._run()
            except (_Stall, psycopg.Error) as exc:
                self.result.stalled = str(exc) if isinstance(exc, _Stall) else f"database: {exc}"
            else:
                self.result.done = not self.stopped_by_budget
            result = self.result
            tracing.annotate(  # counts and the outcome only: never the key's channel or a stall's text
                windows_embedded=result.windows_embedded,
                windows_skipped=result.windows_skipped,
                windows_poisoned=result.windows_poisoned,
                events=result.events_processed,
                done=result.done,
                stalled=bool(result.stalled),
            )
        return self.result

    async def _run(self) -> None:
        started = time.perf_counter()
        state = await keys.load_key_state(self.conn, self.key, self.model)
        self.watermark, self.failures = state.watermark, state.consecutive_failures
        # A rewind may reach anywhere before the watermark: then load the whole key.
        after = None if self.backlog.uncovered or self.backlog.reopening else state.watermark
        rows = await keys.load_events(self.conn, self.key, self.model, after=after)
        self.result.database_seconds += time.perf_counter() - started
        # Chunk lines and redaction: in the CPU pool for more than a few KiB of text. Always
        # admitted: the sweep bounds its own concurrency (keys in flight).
        events = await offload.run(self._events, rows, size=sum(len(r.text) for r in rows), refuse=False)
        steps = plan_key(
            events,
            watermark=state.watermark,
            now=self.shared.clock(),
            max_tokens=self.shared.info.max_input_tokens,
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

    def _events(self, rows: Sequence[keys.EventRow]) -> list[KeyEvent]:
        line = self.shared.line
        return [
            KeyEvent(Message(r.id, r.created_at, line(r.text), r.digest or ""), r.window_id, r.window_size)
            for r in rows
        ]

    async def _batches(self, steps: AsyncGenerator[Step, None]) -> AsyncGenerator[list[Step], None]:
        """The plan's steps cut into batches of EMBED_BATCH_WINDOWS windows to embed,
        each window's budget taken as it is planned."""
        batch: list[Step] = []
        embeds = 0
        async for step in steps:
            if isinstance(step, Finish) and not self.shared.budget.take():
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
        self.shared.budget.give_back(sum(1 for s in steps if isinstance(s, Finish)))

    async def _count_tokens(self, texts: Sequence[str]) -> list[int]:
        started = time.perf_counter()
        try:
            counts, _ = await self.shared.embedder.count_tokens(texts, timeout=COUNT_TIMEOUT_S)
        except DwsearchError as exc:
            raise _PlanningFailed(exc) from exc
        finally:
            self.result.embedder_seconds += time.perf_counter() - started
        return counts

    async def _embed_batch(self, batch: list[Step]) -> _Embedded:
        """Vectors (or the failed call's error) for the batch's substantial windows, by step."""
        to_embed = [s for s in batch if _needs_embedding(s)]
        if not to_embed:
            return {}
        outcomes = await tracing.traced(
            "sweep embed batch",
            self.shared.queue.embed([s.window for s in to_embed]),
            model=self.model,
            windows=len(to_embed),
        )
        return dict(zip(map(id, to_embed), outcomes, strict=True))

    async def _commit_batch(self, batch: list[Step], embedded: _Embedded) -> None:
        """Commit the batch's steps in order; on a failure the rest is given back to the budget."""
        with tracing.span("sweep commit batch", model=self.model, steps=len(batch)):
            for n, step in enumerate(batch):
                try:
                    await self._commit(step, embedded)
                except BaseException:
                    self._give_back(batch[n:])
                    raise

    async def _commit(self, step: Step, embedded: _Embedded) -> None:
        if isinstance(step, Advance):
            await self._write(
                writes.advance(
                    self.conn, self.key, self.model, expected=self.watermark, position=step.position
                )
            )
            self.watermark = step.position
            return
        if not _needs_embedding(step):
            await self._finish(step, writes.SKIPPED)
            self.result.windows_skipped += 1
            metrics.SWEEP_WINDOWS.labels(self.model, "skipped").inc()
            return
        outcome = embedded[id(step)]
        if isinstance(outcome, Failed) and outcome.shared_by > 1 and not _is_outage(outcome.error):
            # The call failed on one of its windows: ask for this one alone to know.
            try:
                (outcome,) = await self.shared.embed([step.window])
            except DwsearchError as exc:
                outcome = Failed(exc, 1)
        if not isinstance(outcome, Failed):
            await self._finish(step, writes.EMBEDDED, vectors=outcome)
            self.result.windows_embedded += 1
            metrics.SWEEP_WINDOWS.labels(self.model, "embedded").inc()
            return
        error = outcome.error
        counts = isinstance(error, _PERMANENT_ERRORS + _SUSPECT_ERRORS)
        attempts = await self._record_failure(error, counts=counts)
        if isinstance(error, _PERMANENT_ERRORS) or (counts and attempts >= POISON_AFTER_FAILURES):
            await self._finish(
                step, writes.POISON, error=f"{error.kind.name}: {error}", attempts=max(attempts, 1)
            )
            self.result.windows_poisoned += 1
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
        raise _Stall(f"{error.kind.name}: {error}")

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
            writes.finish_window(
                self.conn,
                key=self.key,
                model=self.model,
                expected=self.watermark,
                window=step.window,
                status=status,
                replaces=step.replaces,
                vectors=vectors,
                sparse_dimension=self.shared.info.sparse_dimension,
                error=error,
                attempts=attempts,
            )
        )
        self.watermark = step.position
        self.failures = 0
        self.result.events_processed += len(step.window.messages)

    async def _write(self, write: Awaitable[T]) -> T:
        started = time.perf_counter()
        try:
            return await write
        except WriteConflict as exc:
            raise _Stall(str(exc)) from exc
        finally:
            self.result.database_seconds += time.perf_counter() - started

    async def _record_failure(self, error: DwsearchError, *, counts: bool) -> int:
        """The run of failures on the key's next window, this one included."""
        message = f"{error.kind.name}: {error}"
        try:
            self.failures = await writes.record_failure(
                self.conn, self.key, self.model, message, counts=counts
            )
        except psycopg.Error:
            # The stall is reported either way; the counter waits for a reachable database.
            log.warning("could not record a failure", extra={"key": self.key.__dict__}, exc_info=True)
            self.failures += int(counts)
        return self.failures


def _needs_embedding(step: Step) -> TypeGuard[Finish]:
    return isinstance(step, Finish) and is_substantial(step.window.text)


def _is_outage(error: DwsearchError) -> bool:
    return not isinstance(error, _PERMANENT_ERRORS + _SUSPECT_ERRORS)
