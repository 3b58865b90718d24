"""Writes of one index applied in the order they arrived.

A client that sends an upsert and, before its answer, a delete of the same id expects the
delete to win, as Upstash gives it (the TypeScript SDK's own suite does exactly this). Each
write of a DocumentIndex takes a turn the moment it is called, before its first await;
its checks, redaction and embedding run concurrently with the other writes', and only its
transaction waits for the writes that arrived before it to finish (committed, failed or
cancelled). Reads never wait.

This orders one process's writes; between processes (serve replicas) the store takes row
locks in id order (store.upsert, store.delete_ids), so concurrent writes never deadlock.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class WriteOrder:
    """A FIFO of turns: each turn's `ready()` returns once every earlier turn has ended."""

    def __init__(self) -> None:
        self._tail: asyncio.Future[None] | None = None

    def turn(self) -> Turn:
        """The next turn, taken now (call it before the write's first await)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        previous, self._tail = self._tail, done
        return Turn(previous, done)


class Turn:
    """`async with order.turn() as turn: ...; await turn.ready(); <transaction>`; the turn
    ends when the block does, however it ends."""

    def __init__(self, previous: asyncio.Future[None] | None, done: asyncio.Future[None]) -> None:
        self._previous = previous
        self._done = done

    async def ready(self) -> None:
        """Returns once the writes that arrived earlier have ended."""
        if self._previous is not None and not self._previous.done():
            await asyncio.shield(self._previous)
        self._previous = None

    def end(self) -> None:
        """Lets later writes go; a turn that ends (cancelled, failed) before the earlier
        writes have ended passes them its place, so later writes still wait for those."""
        if self._done.done():
            return
        previous = self._previous
        if previous is None or previous.done():
            self._end_now()
        else:
            previous.add_done_callback(self._end_now)

    def _end_now(self, _: object = None) -> None:
        if not self._done.done():
            self._done.set_result(None)

    async def __aenter__(self) -> Turn:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.end()
