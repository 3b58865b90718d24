"""The sweep's Embed calls: the bulk lane, a deadline that a model service's connection
ageing cannot cut short, and calls sized to finish well within it."""

from __future__ import annotations

import asyncio

import pytest
from sweep_harness import Harness

from dwsearch.clients.embedder import ModelInfo
from dwsearch.common.config import ModelServiceConfig
from dwsearch.common.errors import DeadlineExceeded
from dwsearch.common.grpchost import MAX_CONNECTION_AGE_GRACE_MS
from dwsearch.sweep import keyrun, sweeper
from dwsearch.sweep.embedqueue import CallSizer, EmbedQueue


def info(query_latency_ms: float) -> ModelInfo:
    return ModelInfo(
        "m", "r", "fake", 32, 512, True, 1 << 24, "cpu", "float32", query_latency_ms=query_latency_ms
    )


def test_the_embed_deadline_ends_before_a_connection_closed_for_age_cuts_the_call():
    """A call sent just before its connection's GOAWAY has the grace left, no more; the
    embedder's default connection age only adds to that."""
    grace_s = MAX_CONNECTION_AGE_GRACE_MS / 1000
    age_s = ModelServiceConfig().max_connection_age_seconds
    assert keyrun.EMBED_TIMEOUT_S < grace_s <= age_s + grace_s
    assert sweeper.EMBED_CALL_TARGET_S < keyrun.EMBED_TIMEOUT_S


@pytest.mark.parametrize(
    "latency_ms, window_s, expected",
    [
        # bge-m3 at full size on 2 CPU cores: a 191 ms query, 0.47 s a window in batches.
        (191, 0.47, 4),
        (76, 0.29, 10),  # ONNX Runtime int8
        (1030, 1.5, 1),  # torch with a noisy neighbour
        (8, 0.02, 32),  # a GPU, or the small offline model
    ],
)
def test_first_calls_fit_the_deadline_at_the_measured_speed(latency_ms, window_s, expected):
    """The worst case: every call in flight waits on one embedder pod."""
    batch = sweeper.call_sizer(info(latency_ms)).batch
    assert batch == expected
    assert sweeper.EMBED_CALLS_IN_FLIGHT * batch * window_s < keyrun.EMBED_TIMEOUT_S


def test_without_a_measured_latency_calls_start_full():
    assert sweeper.call_sizer(info(0)).batch == sweeper.EMBED_BATCH_WINDOWS


def test_the_sizer_follows_the_time_calls_take():
    sizer = CallSizer(target_s=10, max_batch=32)
    assert sizer.batch == 32
    for _ in range(10):
        sizer.observe(sizer.batch, sizer.batch * 2.0)  # 2 s a window
    assert sizer.batch == 5
    for _ in range(20):
        sizer.observe(sizer.batch, sizer.batch * 0.1)  # faster again
    assert sizer.batch == 32


def test_a_timeout_halves_the_calls_until_one_succeeds():
    sizer = CallSizer(target_s=10, max_batch=32)
    sizer.timed_out(32)
    assert sizer.batch == 16
    sizer.timed_out(16)
    sizer.timed_out(8)
    assert sizer.batch == 4
    sizer.timed_out(1)
    assert sizer.batch == 1
    sizer.observe(1, 0.01)  # fast: room to grow, doubling at most
    assert sizer.batch == 2


async def test_the_queue_cuts_calls_to_the_sizer():
    calls: list[int] = []

    async def embed(windows: list[str]) -> list[str]:
        calls.append(len(windows))
        await asyncio.sleep(0.01 * len(windows))  # 10 ms a window
        return windows

    sizer = CallSizer(target_s=0.05, max_batch=32)
    queue = EmbedQueue(embed, batch=32, in_flight=1, sizer=sizer)
    assert await queue.embed([str(i) for i in range(60)]) == [str(i) for i in range(60)]
    assert calls[0] == 32 and max(calls[2:]) <= 7  # about 0.05 s / 0.01 s once measured


async def test_a_call_that_timed_out_makes_the_next_ones_smaller():
    calls: list[int] = []

    async def embed(windows: list[str]) -> list[str]:
        calls.append(len(windows))
        if len(calls) == 1:
            raise DeadlineExceeded("embedder: deadline exceeded")
        return windows

    queue = EmbedQueue(embed, batch=32, in_flight=1, sizer=CallSizer(target_s=10, max_batch=32))
    first = await queue.embed([str(i) for i in range(32)])
    assert all(not isinstance(o, str) for o in first)
    await queue.embed([str(i) for i in range(32)])
    assert calls == [32, 16, 16]


async def test_the_sweep_embeds_in_the_bulk_lane_in_calls_sized_by_the_reported_latency(harness: Harness):
    harness.fake.query_latency_ms = 191.0
    for c in range(12):
        harness.insert(f"c{c}", [(0, f"message about invoice {c} and its refund")])
    progress = await harness.sweep()
    assert progress.windows_embedded == 12
    assert set(harness.fake.priorities) == {"PRIORITY_BULK"}
    assert max(harness.fake.embed_sizes[: sweeper.EMBED_CALLS_IN_FLIGHT]) <= 4
