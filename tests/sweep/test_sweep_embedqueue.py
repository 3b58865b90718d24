"""The sweep's embed queue: windows of many keys merged into few Embed calls."""

import asyncio

import pytest
from polling import until

from dwsearch.common.errors import Internal, InvalidArgument
from dwsearch.sweep.embedqueue import EmbedQueue, Failed


class Embedder:
    def __init__(self, *, fail: Exception | None = None) -> None:
        self.calls: list[list[str]] = []
        self.running = 0
        self.most_running = 0
        self.fail = fail
        self.gate = asyncio.Event()

    async def __call__(self, texts: list[str]) -> list[str]:
        self.calls.append(list(texts))
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await self.gate.wait()
            if self.fail is not None:
                raise self.fail
            return [t.upper() for t in texts]
        finally:
            self.running -= 1


async def test_windows_of_many_callers_leave_together():
    embedder = Embedder()
    queue = EmbedQueue(embedder, batch=4, in_flight=1)
    first = asyncio.ensure_future(queue.embed(["a", "b"]))
    await until(lambda: embedder.calls == [["a", "b"]], what='"a b" out')  # the rest piles up behind it
    rest = [asyncio.ensure_future(queue.embed([c])) for c in "cdefgh"]
    await until(lambda: queue.queued == 6, what="the rest queued")
    embedder.gate.set()
    assert await first == ["A", "B"]
    assert [await r for r in rest] == [[c.upper()] for c in "cdefgh"]
    assert embedder.calls == [["a", "b"], ["c", "d", "e", "f"], ["g", "h"]]
    assert embedder.most_running == 1


async def test_calls_in_flight_are_capped():
    embedder = Embedder()
    queue = EmbedQueue(embedder, batch=1, in_flight=3)
    tasks = [asyncio.ensure_future(queue.embed([str(i)])) for i in range(10)]
    await until(lambda: queue.queued == 7, what="every window queued")
    assert embedder.running == 3
    embedder.gate.set()
    await asyncio.gather(*tasks)
    assert embedder.most_running == 3 and len(embedder.calls) == 10


async def test_a_failed_call_fails_each_of_its_windows_and_says_how_many_shared_it():
    embedder = Embedder(fail=InvalidArgument("input 1 is bad"))
    embedder.gate.set()
    queue = EmbedQueue(embedder, batch=8, in_flight=1)
    outcomes = await queue.embed(["a", "b", "c"])
    assert all(isinstance(o, Failed) and o.shared_by == 3 and "input 1" in str(o.error) for o in outcomes)


async def test_a_bug_reaches_the_callers():
    embedder = Embedder(fail=ZeroDivisionError("bug"))
    embedder.gate.set()
    queue = EmbedQueue(embedder, batch=8, in_flight=1)
    with pytest.raises(ZeroDivisionError):
        await queue.embed(["a"])


async def test_windows_of_a_cancelled_caller_are_never_sent():
    embedder = Embedder()
    queue = EmbedQueue(embedder, batch=1, in_flight=1)
    busy = asyncio.ensure_future(queue.embed(["first"]))
    gone = asyncio.ensure_future(queue.embed(["never"]))
    await until(lambda: embedder.calls == [["first"]] and queue.queued == 1, what='"never" queued')
    gone.cancel()
    await asyncio.wait([gone])
    embedder.gate.set()
    assert await busy == ["FIRST"]
    # One call at a time, in order: had "never" been sent, it would have gone before this.
    assert await queue.embed(["after"]) == ["AFTER"]
    assert embedder.calls == [["first"], ["after"]]
    await queue.close()


async def test_close_cancels_calls_in_flight():
    embedder = Embedder(fail=Internal("unused"))
    queue = EmbedQueue(embedder, batch=1, in_flight=1)
    waiting = asyncio.ensure_future(queue.embed(["a"]))
    await until(lambda: embedder.running == 1, what="the call in flight")
    await queue.close()
    with pytest.raises(asyncio.CancelledError):
        await waiting
