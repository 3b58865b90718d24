"""One queue of windows to embed for a whole sweep: keys put their windows in, and the
queue sends them to the embedder up to `batch` per Embed call with at most `in_flight`
calls at once. While calls are out, windows from every key pile up and leave together,
so the embedder gets full batches even when each key has only a few windows — which is
most of them once a backfill is done.

A call that fails fails every window in it; each learns the error and how many windows
shared the call, so the sweep can find out which window it was by asking alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from dwsearch.common.errors import DwsearchError

W = TypeVar("W")
V = TypeVar("V")


@dataclass(frozen=True)
class Failed:
    error: DwsearchError
    # Windows the failed call carried: more than one means the culprit is unknown.
    shared_by: int


class EmbedQueue(Generic[W, V]):
    def __init__(self, embed: Callable[[list[W]], Awaitable[list[V]]], *, batch: int, in_flight: int) -> None:
        self._embed = embed
        self._batch = batch
        self._in_flight = in_flight
        self._waiting: list[tuple[W, asyncio.Future[V | Failed]]] = []
        # Calls in flight and the waiters each carries.
        self._calls: dict[asyncio.Future[None], list[asyncio.Future[V | Failed]]] = {}

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
            taken, self._waiting = self._waiting[: self._batch], self._waiting[self._batch :]
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
        try:
            outcomes = await self._embed([w for w, _ in taken])
        except DwsearchError as exc:
            outcomes = [Failed(exc, len(taken))] * len(taken)
        except Exception as exc:  # a bug: every waiter raises it
            for _, f in taken:
                if not f.done():
                    f.set_exception(exc)
            return
        for (_, f), outcome in zip(taken, outcomes, strict=True):
            if not f.done():
                f.set_result(outcome)

    async def close(self) -> None:
        for call in list(self._calls):
            call.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)
