"""What one sweep does for one key, as a pure plan over the key's events and the
finished windows covering them: where to start, which windows to finish, and which
finished windows each one replaces.

Event order and late inserts. The watermark is a position in (created_at, id) order —
the events' own time, so windows follow the conversation as it happened. An event can
still arrive after its key was swept past its created_at (delayed ingest, a producer's
clock behind). So every finished window (embedded, skipped or poison) records the events
it covers in a ledger, one row per (model, event), and an eligible event at or before the
watermark without a ledger row is *uncovered*. Likewise an event after the watermark but
less than SESSION_GAP after the last finished window's end *reopens* that window, unless
its message cap closed it: the clock had closed it before the event arrived. The plan then
rewinds to the start of the uncovered event's session (of the reopened window) — windows depend on each other only within a session — and re-plans from
there: a planned window identical to a finished one is confirmed (the watermark moves,
nothing is embedded); one that differs is finished and replaces the finished windows it
overlaps, in one transaction, so search keeps the old text until the new row commits.
At the end of that session the plan jumps to the next session holding an uncovered event,
or back to the old watermark. A released poison window, a window a retention purge cut and
a window dropped because one of its events was deleted (store.drop_stale_windows)
leave uncovered events behind and are repaired the same way; the result is always what
`plan_windows` computes over the key's current events.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from dwsearch.sweep.window import (
    MAX_WINDOW_MESSAGES,
    SESSION_GAP,
    Message,
    TokenCounter,
    Window,
    plan_windows,
    session_start,
)


@dataclass(frozen=True)
class Position:
    """A point in a key's event order: the last event of a finished window."""

    created_at: datetime
    id: str

    def sort_key(self) -> tuple[datetime, UUID]:
        # Postgres orders uuid bytewise, as UUID.int does.
        return self.created_at, UUID(self.id)


@dataclass(frozen=True)
class KeyEvent:
    """An eligible event and the finished window (of this model) covering it, if any."""

    message: Message
    window_id: str | None = None
    window_size: int = 0

    @property
    def position(self) -> Position:
        return Position(self.message.created_at, self.message.id)


@dataclass(frozen=True)
class Finish:
    """Finish `window` (embed, skip or poison it), deleting the finished windows it replaces."""

    window: Window
    replaces: tuple[str, ...]

    @property
    def position(self) -> Position:
        last = self.window.messages[-1]
        return Position(last.created_at, last.id)


@dataclass(frozen=True)
class Advance:
    """Move the watermark without writing a window: a confirmed window or a jump over
    intact ones (forward), or back to the last window still finished after a rewind."""

    position: Position | None


Step = Finish | Advance


async def plan_key(
    events: Sequence[KeyEvent],
    *,
    watermark: Position | None,
    now: datetime,
    max_tokens: int,
    count_tokens: TokenCounter,
) -> AsyncGenerator[Step, None]:
    """Steps that bring the key up to date, in order; each is committed before the next.

    `events` are the key's eligible events in (created_at, id) order: those after the
    watermark, or all of them (within retention) when some may be uncovered.
    """
    messages = [e.message for e in events]
    done = _after(events, watermark)  # events[:done] are at or before the watermark
    replaced: set[str] = set()

    def replan_from(i: int) -> int:
        """From session start i, the first index to re-plan: the session of the next
        uncovered event before the watermark, else the reopened last window, else the
        watermark; the finished windows in between are intact."""
        nxt = next(
            (j for j in range(i, done) if events[j].window_id is None or events[j].window_id in replaced),
            None,
        )
        if nxt is not None:
            return session_start(messages, nxt)
        if reopens(events, done):
            last_window = events[done - 1].window_id
            return next(j for j in range(i, done) if events[j].window_id == last_window)
        return done

    start = replan_from(0)
    position = events[start - 1].position if start else (watermark if start == done else None)
    written = watermark
    i = start
    while i < len(events):
        resume = None
        async for window in plan_windows(
            messages[i:], now=now, max_tokens=max_tokens, count_tokens=count_tokens
        ):
            first = i
            i += len(window.messages)
            owner = events[first].window_id
            unchanged = (
                owner is not None
                and owner not in replaced
                and events[first].window_size == len(window.messages)
                and all(events[j].window_id == owner for j in range(first, i))
            )
            if unchanged:
                step: Step = Advance(events[i - 1].position)
            else:
                covering = {events[j].window_id for j in range(first, i)}
                old = tuple(sorted(w for w in covering if w is not None and w not in replaced))
                replaced.update(old)
                step = Finish(window, old)
            yield step
            position = written = step.position
            if window.ends_session and i < done:
                jump = replan_from(i)
                if jump > i:
                    position = written = events[jump - 1].position
                    yield Advance(position)
                    resume = jump
                    break
        if resume is None:
            break
        i = resume
    if position != written:
        yield Advance(position)


def reopens(events: Sequence[KeyEvent], done: int) -> bool:
    """Whether the first event after the watermark joins the session of the last finished
    window, which its cap did not close: that window was closed by its session ending
    (a later message or the clock) before this event arrived, and is re-planned."""
    if not 0 < done < len(events):
        return False
    last, first = events[done - 1], events[done]
    return (
        first.message.created_at - last.message.created_at < SESSION_GAP
        and 0 < last.window_size < MAX_WINDOW_MESSAGES
    )


def _after(events: Sequence[KeyEvent], watermark: Position | None) -> int:
    """Index of the first event after the watermark."""
    if watermark is None:
        return 0
    mark = watermark.sort_key()
    for i, e in enumerate(events):
        if e.position.sort_key() > mark:
            return i
    return len(events)
