"""The circuit breaker: opens after THRESHOLD transport failures in a row, fails calls at
once while open, lets one trial through after the cooldown."""

import asyncio

import pytest
from prometheus_client import REGISTRY

from dwsearch.clients.breaker import CircuitBreaker, CircuitOpen, State
from dwsearch.common.errors import DeadlineExceeded, InvalidArgument, Unavailable


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Target:
    def __init__(self) -> None:
        self.calls = 0
        self.error: Exception | None = None
        self.gate: asyncio.Event | None = None

    async def __call__(self) -> str:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return "ok"


async def fail(breaker: CircuitBreaker, target: Target, n: int) -> None:
    for _ in range(n):
        with pytest.raises((Unavailable, DeadlineExceeded)):
            await breaker.call(target)


async def test_opens_after_consecutive_transport_failures_and_fails_fast():
    clock, target = Clock(), Target()
    breaker = CircuitBreaker("test-a", threshold=3, cooldown_s=5, clock=clock)
    target.error = Unavailable("refused")
    await fail(breaker, target, 2)
    target.error = None
    assert await breaker.call(target) == "ok"  # a success resets the count
    target.error = DeadlineExceeded("slow")
    await fail(breaker, target, 3)
    assert breaker.state is State.OPEN and target.calls == 6
    with pytest.raises(CircuitOpen, match=r"not called after 3 failures in a row .*slow.*next try in 5\.0s"):
        await breaker.call(target)
    assert target.calls == 6  # not called
    assert REGISTRY.get_sample_value("dwsearch_circuit_state", {"target": "test-a"}) == State.OPEN


async def test_errors_the_service_returns_on_purpose_do_not_count():
    target = Target()
    breaker = CircuitBreaker("test-b", threshold=2)
    target.error = InvalidArgument("bad input")
    for _ in range(5):
        with pytest.raises(InvalidArgument):
            await breaker.call(target)
    assert breaker.state is State.CLOSED


async def test_half_open_lets_one_trial_through():
    clock, target = Clock(), Target()
    breaker = CircuitBreaker("test-c", threshold=1, cooldown_s=5, clock=clock)
    target.error = Unavailable("refused")
    await fail(breaker, target, 1)
    clock.now = 5.0
    await fail(breaker, target, 1)  # the trial fails: open again, for a new cooldown
    assert breaker.state is State.OPEN
    clock.now = 9.9
    with pytest.raises(CircuitOpen):
        await breaker.call(target)
    clock.now = 10.0
    target.error, target.gate = None, asyncio.Event()
    calls = target.calls
    trial = asyncio.ensure_future(breaker.call(target))
    await asyncio.sleep(0)  # let the trial start: it waits at the gate
    assert target.calls == calls + 1
    with pytest.raises(CircuitOpen):  # one trial at a time
        await breaker.call(target)
    target.gate.set()
    assert await trial == "ok"
    assert breaker.state is State.CLOSED and await breaker.call(target) == "ok"
    opened = REGISTRY.get_sample_value("dwsearch_circuit_opened_total", {"target": "test-c"})
    assert opened == 2


async def test_calls_failing_together_in_one_stall_count_as_one_failure():
    clock, target = Clock(), Target()
    breaker = CircuitBreaker("test-stall", threshold=3, cooldown_s=5, clock=clock)
    target.gate = asyncio.Event()
    target.error = DeadlineExceeded("slow batch")
    together = [asyncio.ensure_future(breaker.call(target)) for _ in range(5)]
    await asyncio.sleep(0)  # all five are in flight
    clock.now = 0.3
    target.gate.set()
    results = await asyncio.gather(*together, return_exceptions=True)
    assert all(isinstance(r, DeadlineExceeded) for r in results)
    assert breaker.state is State.CLOSED  # one stall, one piece of evidence
    target.gate = None
    clock.now = 0.6
    await fail(breaker, target, 1)
    clock.now = 0.9
    await fail(breaker, target, 1)  # three failures one after another
    assert breaker.state is State.OPEN
