"""Sweep metrics: windows by outcome, duration, the backlog at the start, stalled keys
and when the last sweep finished."""

import time

import grpc
from prometheus_client import REGISTRY
from sweep_harness import Harness

from dwsearch_testkit.fakes import FAKE_MODEL, Failure


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"model": FAKE_MODEL, **labels}) or 0.0


def windows(outcome: str) -> float:
    return value("dwsearch_sweep_windows_total", outcome=outcome)


def chat(tag: str, start: float = 0) -> list[tuple[float, str]]:
    return [(start + i, f"{tag} message number {i} about the invoice") for i in range(2)]


async def test_a_sweep_counts_windows_by_outcome_and_records_its_run(harness: Harness):
    harness.insert("c1", [(0, "ok"), (1, "👍")])  # insubstantial: skipped
    harness.insert("c1", chat("good", start=60))
    bad = harness.insert("c2", chat("bad"))
    harness.insert("c3", chat("later"))
    harness.fake.fail_texts["\n".join(f"bad message number {i} about the invoice" for i in range(2))] = (
        Failure(grpc.StatusCode.INVALID_ARGUMENT, "cannot embed this")
    )
    before = {o: windows(o) for o in ("embedded", "skipped", "poisoned")}
    runs = value("dwsearch_sweep_seconds_count")
    started = time.time()

    progress = await harness.sweep()

    counted = {o: windows(o) - before[o] for o in before}
    assert counted == {"embedded": 2, "skipped": 1, "poisoned": 1}
    assert counted["poisoned"] == progress.windows_poisoned and len(bad) == 2
    assert value("dwsearch_sweep_seconds_count") == runs + 1
    assert value("dwsearch_sweep_events_pending") == progress.events_pending == 8
    assert value("dwsearch_sweep_keys_stalled") == 0
    assert value("dwsearch_sweep_last_finished_timestamp_seconds") >= started


async def test_stalled_keys_are_reported(harness: Harness):
    harness.insert("c1", chat("stuck"))
    harness.fake.failures.extend([Failure(grpc.StatusCode.UNAVAILABLE, "restarting")] * 20)
    progress = await harness.sweep()
    assert progress.keys_stalled == 1
    assert value("dwsearch_sweep_keys_stalled") == 1
    harness.fake.failures.clear()
    await harness.sweep()
    assert value("dwsearch_sweep_keys_stalled") == 0


async def test_dropped_windows_are_counted(harness: Harness):
    ids = harness.insert("c1", chat("gone"))
    await harness.sweep()
    before = REGISTRY.get_sample_value("dwsearch_sweep_windows_dropped_total") or 0.0
    harness.query("DELETE FROM dw_chat_events WHERE id = %s RETURNING id", (ids[0],))
    progress = await harness.sweep()
    assert progress.windows_dropped == 1
    assert REGISTRY.get_sample_value("dwsearch_sweep_windows_dropped_total") == before + 1
