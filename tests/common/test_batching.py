"""The dynamic batcher on its own: packing by padded tokens, order, failures, draining."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from dwsearch.common.errors import Internal, ResourceExhausted, Unavailable
from dwsearch.modelserver.batching import BatchCost, Batcher, plan_batches


class Recorder:
    """A run function: doubles each payload, records each batch, fails on request."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __call__(self, payloads: Sequence[int]) -> list[int | Exception]:
        if -1 in payloads:
            raise RuntimeError("the whole batch broke")
        self.batches.append(list(payloads))
        return [Internal("bad input") if p == 13 else p * 2 for p in payloads]


def make(
    run: Recorder, *, max_batch_tokens: int, max_batch_inputs: int = 64, max_queue: int = 100
) -> Batcher:
    """A batcher that only ever cuts for the budget and the input cap (padding is free)."""
    return Batcher(
        "test",
        run,
        max_batch_tokens=max_batch_tokens,
        max_batch_inputs=max_batch_inputs,
        max_queue=max_queue,
        prior_overhead_tokens=1e9,
    )


async def queue_then_start(batcher: Batcher, requests: list[list[int]]) -> list:
    """Queue every request before the worker starts, so they form one round."""
    tasks = [asyncio.ensure_future(batcher.submit(r, r)) for r in requests]  # a payload is its length
    await asyncio.sleep(0)
    batcher.start()
    try:
        return await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await batcher.close()


async def test_batches_are_cut_by_padded_tokens_longest_first():
    run = Recorder()
    batcher = make(run, max_batch_tokens=100, max_batch_inputs=64, max_queue=100)
    results = await queue_then_start(batcher, [[10, 30], [20, 5, 5], [50]])
    assert results == [[20, 60], [40, 10, 10], [100]]
    assert run.batches == [[50, 30], [20, 10, 5, 5]]  # 50×3 = 150 would be over; 20×4 = 80 is not
    for batch in run.batches:
        assert max(batch) * len(batch) <= 100


async def test_an_input_over_the_budget_runs_alone_and_inputs_per_batch_are_capped():
    run = Recorder()
    batcher = make(run, max_batch_tokens=100, max_batch_inputs=2, max_queue=100)
    await queue_then_start(batcher, [[500], [1, 1, 1]])
    assert sorted(map(len, run.batches)) == [1, 1, 2] and run.batches[0] == [500]


@pytest.mark.parametrize(
    "overhead,sizes",
    [
        (0, [2, 1, 3]),  # padding is all that costs: no batch pads at all
        (15, [3, 3]),  # padding 60 → 50 costs less than another batch; 50 → 20 does not
        (1000, [6]),  # a batch costs more than any padding: one batch, within the budget
    ],
)
def test_plans_trade_padding_against_batches(overhead, sizes):
    lengths = [60, 60, 50, 20, 20, 20]
    assert (
        plan_batches(lengths, overhead_tokens=overhead, max_batch_tokens=1000, max_batch_inputs=64) == sizes
    )


def test_plans_respect_the_budget_and_the_input_cap():
    assert plan_batches([90, 10, 10, 10], overhead_tokens=1e9, max_batch_tokens=100, max_batch_inputs=64) == [
        1,
        3,
    ]
    assert plan_batches([500, 5], overhead_tokens=1e9, max_batch_tokens=100, max_batch_inputs=64) == [1, 1]
    assert sorted(plan_batches([5] * 5, overhead_tokens=1e9, max_batch_tokens=100, max_batch_inputs=2)) == [
        1,
        2,
        2,
    ]


def test_batch_cost_learns_the_overhead_in_tokens():
    cost = BatchCost(prior_overhead_tokens=500)
    assert cost.overhead_tokens == 500
    for tokens in [100, 400, 50, 800, 200, 1600, 300, 700, 900]:
        cost.observe(tokens, 0.020 + 0.0005 * tokens)  # 20 ms per batch, 0.5 ms per token
    assert cost.overhead_tokens == pytest.approx(40)
    same = BatchCost(prior_overhead_tokens=500)
    for _ in range(20):
        same.observe(256, 0.1)  # no spread: nothing to fit
    assert same.overhead_tokens == 500


async def test_a_failed_input_fails_only_its_request_and_a_broken_batch_all_of_its():
    run = Recorder()
    batcher = make(run, max_batch_tokens=1000, max_batch_inputs=64, max_queue=100)
    good, bad = await queue_then_start(batcher, [[7], [13, 8]])
    assert good == [14] and isinstance(bad, Internal)

    batcher = make(run, max_batch_tokens=1000, max_batch_inputs=64, max_queue=100)
    broken = await queue_then_start(batcher, [[3], [-1]])
    assert all(isinstance(r, RuntimeError) for r in broken)


async def test_full_queue_is_refused():
    batcher = make(Recorder(), max_batch_tokens=1000, max_batch_inputs=64, max_queue=3)
    first = asyncio.ensure_future(batcher.submit([1, 2], [1, 2]))
    await asyncio.sleep(0)
    with pytest.raises(ResourceExhausted, match="2 inputs waiting, limit 3"):
        await batcher.submit([3, 4], [3, 4])
    batcher.start()
    assert await first == [2, 4]
    await batcher.close()


async def test_close_finishes_queued_work_then_refuses_more():
    batcher = make(Recorder(), max_batch_tokens=1000, max_batch_inputs=64, max_queue=10)
    queued = asyncio.ensure_future(batcher.submit([1], [1]))
    await asyncio.sleep(0)
    batcher.start()
    await batcher.close()
    assert await queued == [2]
    with pytest.raises(Unavailable, match="shutting down"):
        await batcher.submit([1], [1])
