"""Property: for random event streams (late inserts included) and random injected
embedder failures, once the failures stop and poison is released, the finished windows
are exactly those the pure windowing function computes over the events — each once."""

from datetime import timedelta

import grpc
import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sweep_harness import LATER, T0, Harness, words

from dwsearch.sweep.substance import is_substantial
from dwsearch_testkit.fakes import Failure

CODES = [
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.INVALID_ARGUMENT,
]
# Gaps around the 30-minute session boundary, ties (0) and long silences.
GAPS = [0, 1, 2, 10, 29, 30, 31, 95]
DECISIONS = ["received", "received", "processed", "denied"]
MAX_FINAL_SWEEPS = 8

stream = st.lists(
    st.tuples(st.integers(0, 1), st.sampled_from(GAPS), st.integers(0, 14), st.sampled_from(DECISIONS)),
    min_size=8,
    max_size=30,
)
# Inserted after the first sweeps, mostly at times those sweeps have passed.
late = st.lists(
    st.tuples(st.integers(0, 1), st.floats(0, 400), st.integers(0, 14), st.sampled_from(DECISIONS)),
    min_size=1,
    max_size=6,
)
sweeps = st.lists(
    st.tuples(st.floats(0, 900), st.lists(st.sampled_from(CODES), max_size=3)), min_size=1, max_size=3
)


def reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """TRUNCATE dw_chat_events, dw_message_embeddings, dw_sweep_watermarks, dw_sweep_windows,
                        dw_sweep_window_events, dw_sweep_retention, dw_lexical_windows, dw_lexical_terms"""
        )


def insert(harness: Harness, rows: list[tuple[int, float, int, str]]) -> None:
    for channel, minute, n, decision in rows:
        harness.insert(f"c{channel}", [(minute, words(n, f"c{channel}m{int(minute)}x"))], decision=decision)


async def sweep_with(harness: Harness, plan: list[tuple[float, list[grpc.StatusCode]]]) -> None:
    for minute, codes in plan:
        harness.clock.now = T0 + timedelta(minutes=minute)
        harness.fake.failures[:] = [Failure(code) for code in codes]
        await harness.sweep()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    first=stream,
    later=late,
    sweeps_before=sweeps,
    sweeps_after=sweeps,
    max_tokens=st.sampled_from([12, 40, 512]),
)
async def test_sweeps_converge_to_the_pure_windows(
    harness, first, later, sweeps_before, sweeps_after, max_tokens
):
    reset(harness.url)
    harness.fake.max_input_tokens = max_tokens
    harness.fake.fail_count_tokens = True
    clock = [0.0, 0.0]
    rows = []
    for channel, gap, n, decision in first:
        clock[channel] += gap
        rows.append((channel, clock[channel], n, decision))
    insert(harness, rows)
    await sweep_with(harness, sweeps_before)
    insert(harness, later)  # many of them before their key's watermark
    await sweep_with(harness, sweeps_after)

    harness.fake.failures.clear()
    harness.clock.now = LATER
    await harness.admin().retry_poison()
    for _ in range(MAX_FINAL_SWEEPS):
        progress = await harness.sweep()
        if progress.keys_total == 0:
            break
    else:
        raise AssertionError(f"the sweep did not settle: {progress}")

    expected = await harness.expected()
    finished = harness.finished()
    assert set(finished) == expected
    texts = dict(
        (tuple(ids), content)
        for ids, content in harness.query("SELECT source_message_ids, content FROM dw_message_embeddings")
    )
    assert set(texts) == {w for w, status in finished.items() if status == "embedded"}
    assert all(is_substantial(content) for content in texts.values())
    assert all(status == "skipped" for w, status in finished.items() if w not in texts)
    assert len(texts) == len(harness.embedded())  # one row per window
