"""The batcher's two lanes: queries before bulk work, bulk batches cut to a time budget,
and neither lane starving the other."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Sequence

import pytest
from polling import until

from dwsearch.common.errors import DeadlineExceeded
from dwsearch.modelserver.batching import Batcher, Lane


class Model:
    """A run function that records each batch; the first batch can be held at a gate, and
    every batch can take `seconds` (the model's cost)."""

    def __init__(self, *, hold_first: bool = False, seconds: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        if not hold_first:
            self.gate.set()
        self.entered = threading.Event()
        self.seconds = seconds

    def __call__(self, payloads: Sequence[int]) -> list[int]:
        self.entered.set()
        assert self.gate.wait(30), "test never opened the gate"
        if self.seconds:
            time.sleep(self.seconds)  # the model's work, not synchronisation
        self.batches.append(list(payloads))
        return [p for p in payloads]


def batcher(
    model: Model, *, max_batch_inputs: int = 8, bulk_batch_seconds: float = 0.0, max_queue: int = 4096
) -> Batcher:
    return Batcher(
        "lanes",
        model,
        max_batch_tokens=10_000,
        max_batch_inputs=max_batch_inputs,
        max_queue=max_queue,
        prior_overhead_tokens=0.0,
        bulk_batch_seconds=bulk_batch_seconds,
    )


async def test_an_interactive_request_runs_right_after_the_running_batch_not_after_1000_bulk_inputs():
    model = Model(hold_first=True)
    b = batcher(model, max_batch_inputs=8)
    b.start()
    try:
        bulk = [
            asyncio.ensure_future(b.submit(list(range(i * 100, i * 100 + 100)), [10] * 100))
            for i in range(10)
        ]
        assert await asyncio.to_thread(model.entered.wait, 10)  # one bulk batch is in the model
        await until(lambda: b.queued == 1000 - 8)
        query = asyncio.ensure_future(b.submit([-1], [5], lane=Lane.INTERACTIVE))
        await until(lambda: b.queued == 1000 - 8 + 1)
        model.gate.set()
        assert await query == [-1]
        await asyncio.gather(*bulk)
    finally:
        await b.close()
    assert model.batches[1] == [-1]  # the batch after the running one
    assert sum(len(batch) for batch in model.batches) == 1001


async def test_bulk_still_drains_under_a_continuous_stream_of_queries():
    model = Model(seconds=0.002)
    b = batcher(model, max_batch_inputs=4, bulk_batch_seconds=0.01)
    b.start()
    stop = asyncio.Event()
    answered = 0

    async def user(n: int) -> None:
        nonlocal answered
        while not stop.is_set():
            await b.submit([n], [5], lane=Lane.INTERACTIVE)
            answered += 1

    users = [asyncio.ensure_future(user(-1 - n)) for n in range(4)]  # keeps the interactive lane non-empty
    try:
        await until(lambda: answered >= 20)
        bulk = await asyncio.wait_for(b.submit(list(range(40)), [10] * 40), timeout=20)
        assert bulk == list(range(40))
        before = answered
        await until(lambda: answered > before + 20)  # and queries still flow
    finally:
        stop.set()
        await asyncio.gather(*users)
        await b.close()


async def test_bulk_batches_are_cut_to_the_time_budget_from_the_fitted_cost():
    model = Model()
    b = batcher(model, max_batch_inputs=64, bulk_batch_seconds=0.05)
    b._cost.observe(100, 0.1)  # 1 ms per padded token, no overhead
    assert b.estimate_seconds(50) == pytest.approx(0.05)
    b.start()
    try:
        await b.submit(list(range(20)), [10] * 20)
        await b.submit([7, 8], [10, 10], lane=Lane.INTERACTIVE)  # queries are not cut by the budget
    finally:
        await b.close()
    assert [len(batch) for batch in model.batches] == [5, 5, 5, 5, 2]


async def test_a_request_that_expires_or_is_cancelled_while_the_model_is_busy_never_reaches_it():
    model = Model(hold_first=True)
    b = batcher(model, max_batch_inputs=1)
    b.start()
    try:
        running = asyncio.ensure_future(b.submit([1], [10]))
        assert await asyncio.to_thread(model.entered.wait, 10)
        expiring = asyncio.ensure_future(b.submit([2], [10], deadline=time.monotonic() + 0.05))
        cancelled = asyncio.ensure_future(b.submit([3], [10], lane=Lane.INTERACTIVE))
        await until(lambda: b.queued == 2)
        cancelled.cancel()
        with pytest.raises(DeadlineExceeded):
            await expiring
        model.gate.set()
        assert await running == [1]
        with pytest.raises(asyncio.CancelledError):
            await cancelled
    finally:
        await b.close()
    assert model.batches == [[1]]


async def test_queries_keep_most_of_the_model_when_one_bulk_input_outlasts_the_budget():
    """Bulk inputs of 60 ms against a 5 ms budget: bulk may not run back to back while
    queries wait; each bulk turn is followed by about four turns' worth of queries."""
    model = Model(seconds=0.0)
    slow = {99}
    b = batcher(model, max_batch_inputs=1, bulk_batch_seconds=0.005)
    original = model.__call__

    def run(payloads: Sequence[int]) -> list[int]:
        time.sleep(0.06 if payloads[0] in slow else 0.005)  # the model's cost
        return original(payloads)

    b._run = run
    b.start()
    stop = asyncio.Event()

    async def user() -> None:
        while not stop.is_set():
            await b.submit([1], [5], lane=Lane.INTERACTIVE)

    users = [asyncio.ensure_future(user()) for _ in range(3)]
    try:
        await until(lambda: len(model.batches) >= 5)
        bulk = asyncio.ensure_future(b.submit([99] * 12, [50] * 12))
        await asyncio.wait_for(bulk, timeout=30)  # bulk drains
    finally:
        stop.set()
        await asyncio.gather(*users)
        await b.close()
    order = [batch[0] for batch in model.batches]
    first, last = order.index(99), len(order) - 1 - order[::-1].index(99)
    between = order[first : last + 1]
    assert between.count(99) == 12
    assert between.count(1) >= 3 * 11  # queries ran between every two bulk inputs
    assert all(not (a == 99 and b_ == 99) for a, b_ in itertools.pairwise(between))  # never back to back


async def test_with_an_interactive_worker_a_query_runs_while_a_bulk_batch_is_still_running():
    bulk_gate, bulk_running = threading.Event(), threading.Event()
    ran: list[list[int]] = []

    def run(payloads: Sequence[int]) -> list[int]:
        if payloads[0] >= 0:  # bulk work: held until the test lets it go
            bulk_running.set()
            assert bulk_gate.wait(30), "test never opened the gate"
        ran.append(list(payloads))
        return list(payloads)

    b = Batcher(
        "lanes-concurrent",
        run,
        max_batch_tokens=10_000,
        max_batch_inputs=4,
        max_queue=4096,
        prior_overhead_tokens=0.0,
        interactive_worker=True,
    )
    b.start()
    try:
        bulk = asyncio.ensure_future(b.submit(list(range(40)), [10] * 40))
        assert await asyncio.to_thread(bulk_running.wait, 10)
        assert await asyncio.wait_for(b.submit([-1, -2], [5, 5], lane=Lane.INTERACTIVE), 10) == [-1, -2]
        assert ran == [[-1, -2]]  # answered while the bulk batch is still in the model
        bulk_gate.set()
        assert await bulk == list(range(40))
    finally:
        await b.close()
    assert sum(len(batch) for batch in ran) == 42


async def test_the_bulk_worker_runs_at_a_lower_cpu_priority_than_the_interactive_one():
    import os

    from dwsearch.modelserver.batching import BULK_NICE

    b = Batcher(
        "lanes-nice",
        lambda payloads: list(payloads),
        max_batch_tokens=100,
        max_batch_inputs=4,
        max_queue=100,
        prior_overhead_tokens=0.0,
        interactive_worker=True,
    )
    b.start()
    try:
        await b.submit([1], [1])  # the bulk worker has started and set its priority
        bulk, interactive = b._threads
        base = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, bulk.native_id) == min(19, base + BULK_NICE)
        assert os.getpriority(os.PRIO_PROCESS, interactive.native_id) == base
    finally:
        await b.close()
