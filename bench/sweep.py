"""Sweep throughput (issue 4): a backfill of MESSAGES eligible messages over CHANNELS
channels, against the fake embedder (bge-m3's shape: 1024-d dense + sparse) in its own
process; then the same sweep against a real all-MiniLM-L6-v2 `dwsearch embedder` process
on a subset, against embedding the same chunks directly through that embedder.

    python -m bench.sweep [--quick] [--skip-minilm]

Figures:
- windows_per_s, messages_per_s: the fake-embedder backfill, end to end (the sweep's
  backlog query, planning with CountTokens, Embed calls, one transaction per window).
- database_share / embedder_share: of the time the sweep's keys spent waiting, the part
  on Postgres and the part on the embedder (CountTokens + Embed), summed over keys.
- noop_sweep_s: a second sweep with nothing left to do (the backlog query over every event).
- drop_pass_s: of that, the check for windows holding deleted, edited or ineligible events,
  alone.
- sweep_vs_direct_embed_ratio (target <= 1.25): MiniLM backfill wall time over the time
  to embed the very chunks it stored straight through the same embedder, with the sweep's
  Embed batch size and calls in flight; rounds alternate which runs first and the median ratio is
  reported (the machine is shared: single rounds vary by a third).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from bench import report
from bench.embedder import wait_serving
from dwsearch.clients.embedder import EmbedderClient
from dwsearch.db.embedded import start_embedded
from dwsearch.db.migrate import migrate
from dwsearch.db.pool import open_pool
from dwsearch.redaction import REDACTION_ON
from dwsearch.sweep.sweeper import (
    EMBED_BATCH_WINDOWS,
    EMBED_CALLS_IN_FLIGHT,
    KEY_CONCURRENCY,
    Sweeper,
    SweepOptions,
    SweepProgress,
)
from dwsearch_testkit.fakes import FAKE_MODEL
from dwsearch_testkit.net import free_port
from dwsearch_testkit.seed import enable_semantic_search
from dwsearch_testkit.text import CHAT_WORDS, chat_text

MESSAGES, CHANNELS = 100_000, 200
MINILM_MESSAGES, MINILM_CHANNELS, MINILM_ROUNDS = 1_500, 15, 5
QUICK = {"messages": 5_000, "channels": 20, "minilm_messages": 600, "minilm_channels": 10, "rounds": 2}
ORG = "bench-org"
# Chat rhythm: replies a few minutes apart, and a new session after a pause now and then.
SESSION_BREAK_P = 1 / 7
DENIED_SHARE = 0.05  # ineligible traffic mixed in, never embedded
T0 = datetime(2026, 10, 1, tzinfo=UTC)
LATER = T0 + timedelta(days=365)
# The chat words of bench.embedder, and two more.
WORDS = (*CHAT_WORDS, "ok", "can")


def load_events(url: str, messages: int, channels: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    per_channel = messages // channels
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(
            """TRUNCATE dw_chat_events, dw_message_embeddings, dw_sweep_watermarks, dw_sweep_windows,
                        dw_sweep_window_events, dw_sweep_retention, dw_lexical_windows, dw_lexical_terms"""
        )
        with cur.copy(
            "COPY dw_chat_events (org_id, provider, external_channel_id, event_type, decision, message_text,"
            " created_at) FROM STDIN"
        ) as copy:
            for c in range(channels):
                at = T0
                written = 0
                while written < per_channel:
                    at += timedelta(
                        minutes=rng.uniform(31, 240)
                        if rng.random() < SESSION_BREAK_P
                        else rng.uniform(0.2, 4)
                    )
                    text = chat_text(rng, 1, 25, WORDS)
                    decision = (
                        "denied" if rng.random() < DENIED_SHARE else rng.choice(("received", "processed"))
                    )
                    copy.write_row((ORG, "whatsapp", f"ch-{c:04d}", "message", decision, text, at))
                    written += decision != "denied"
        cur.execute("ANALYZE dw_chat_events")
    enable_semantic_search(url, ORG)


async def sweep(url: str, embedder_addr: str, model: str) -> tuple[SweepProgress, float]:
    pool = await open_pool(url, min_size=1, max_size=KEY_CONCURRENCY + 2)
    embedder = EmbedderClient(embedder_addr, timeout=300)
    try:
        sweeper = Sweeper(pool, embedder, model=model, redaction=REDACTION_ON, clock=lambda: LATER)
        started = time.perf_counter()
        summary = None
        async for progress in sweeper.sweep(SweepOptions()):
            summary = progress
        assert summary is not None and summary.keys_stalled == 0, summary
        return summary, time.perf_counter() - started
    finally:
        await embedder.close()
        await pool.close()


async def embed_directly(embedder_addr: str, chunks: list[str]) -> float:
    """The chunks through Embed as the sweep's embed queue sends them: EMBED_BATCH_WINDOWS
    per call, EMBED_CALLS_IN_FLIGHT calls at once."""
    embedder = EmbedderClient(embedder_addr, timeout=300)
    batches = [chunks[i : i + EMBED_BATCH_WINDOWS] for i in range(0, len(chunks), EMBED_BATCH_WINDOWS)]

    async def caller() -> None:
        while batches:
            await embedder.embed(batches.pop(), truncate=True)

    try:
        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(EMBED_CALLS_IN_FLIGHT)))
        return time.perf_counter() - started
    finally:
        await embedder.close()


def stored_chunks(url: str, model: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [
            c for (c,) in conn.execute("SELECT content FROM dw_message_embeddings WHERE model = %s", (model,))
        ]


@contextmanager
def serving(proc: subprocess.Popen, port: int) -> Iterator[str]:
    """The address of an embedder process once it is SERVING; stopped on exit."""
    try:
        wait_serving(port, proc)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


async def drop_pass(url: str) -> float:
    """Seconds of the check each sweep starts with (windows of deleted events), alone."""
    from dwsearch.sweep.store import retention

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        dropped = await retention.drop_stale_windows(conn)
        elapsed = time.perf_counter() - started
    assert dropped == 0
    return elapsed


def fake_backfill(url: str, messages: int, channels: int) -> dict[str, float]:
    port = free_port()
    fake = subprocess.Popen(
        [sys.executable, "-m", "bench.fake_embedder", "--port", str(port), "--dimension", "1024", "--sparse"]
    )
    load_events(url, messages, channels)
    with serving(fake, port) as address:
        progress, elapsed = asyncio.run(sweep(url, address, FAKE_MODEL))
        _, noop = asyncio.run(sweep(url, address, FAKE_MODEL))
    drop = asyncio.run(drop_pass(url))
    waited = progress.database_seconds + progress.embedder_seconds
    return {
        "windows_per_s": progress.windows_finished / elapsed,
        "messages_per_s": progress.events_processed / elapsed,
        "database_share": progress.database_seconds / waited,
        "embedder_share": progress.embedder_seconds / waited,
        "sweep_s": elapsed,
        "windows_embedded": progress.windows_embedded,
        "windows_skipped": progress.windows_skipped,
        "messages_per_window": progress.events_processed / progress.windows_finished,
        "database_ms_per_window": progress.database_seconds / progress.windows_finished * 1000,
        "embedder_ms_per_window": progress.embedder_seconds / progress.windows_finished * 1000,
        "noop_sweep_s": noop,
        "drop_pass_s": drop,
    }


def minilm_ratio(url: str, messages: int, channels: int, rounds: int) -> dict[str, object]:
    from bench.embedder import MODEL_ID, start_embedder

    port = free_port()
    with serving(start_embedder(port), port) as address:
        asyncio.run(embed_directly(address, ["warm up the model and its batches"] * 64))
        ratios, sweeps, directs = [], [], []
        chunks: list[str] = []
        for r in range(rounds):
            # The machine is shared and noisy: alternate which of the two runs first.
            direct_first = r % 2 == 1
            if direct_first:
                direct = asyncio.run(embed_directly(address, chunks))
            load_events(url, messages, channels)
            progress, swept = asyncio.run(sweep(url, address, MODEL_ID))
            chunks = stored_chunks(url, MODEL_ID)  # the same texts every round: the data is seeded
            if not direct_first:
                direct = asyncio.run(embed_directly(address, chunks))
            ratios.append(swept / direct)
            sweeps.append(swept)
            directs.append(direct)
    return {
        "sweep_vs_direct_embed_ratio": median(ratios),
        "minilm_sweep_s": median(sweeps),
        "minilm_direct_embed_s": median(directs),
        "minilm_windows_embedded": progress.windows_embedded,
        "minilm_windows_per_s": progress.windows_embedded / median(sweeps),
        "minilm_ratios_by_round": [round(x, 3) for x in ratios],
    }


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    p = report.parser(__doc__.splitlines()[0])
    p.add_argument("--skip-minilm", action="store_true", help="only the fake-embedder backfill")
    args = p.parse_args()
    sizes = (
        QUICK
        if args.quick
        else {
            "messages": MESSAGES,
            "channels": CHANNELS,
            "minilm_messages": MINILM_MESSAGES,
            "minilm_channels": MINILM_CHANNELS,
            "rounds": MINILM_ROUNDS,
        }
    )
    # As root the embedded server runs as the `pgserver` user: it must reach the dir.
    data_dir = Path(tempfile.mkdtemp(prefix="dwsearch-bench-sweep-"))
    data_dir.chmod(0o755)
    url = start_embedded(data_dir, delete_on_exit=True)
    migrate(url, dev_schema=True)
    figures = fake_backfill(url, sizes["messages"], sizes["channels"])
    if not args.skip_minilm:
        figures |= minilm_ratio(url, sizes["minilm_messages"], sizes["minilm_channels"], sizes["rounds"])
    report.write(
        "sweep",
        figures,
        params={
            **sizes,
            "key_concurrency": KEY_CONCURRENCY,
            "embed_batch_windows": EMBED_BATCH_WINDOWS,
            "embed_calls_in_flight": EMBED_CALLS_IN_FLIGHT,
            "fake_embedder": "bench.fake_embedder, 1024-d dense + sparse, own process",
            "minilm": "sentence-transformers/all-MiniLM-L6-v2 via `dwsearch embedder` on CPU",
            "cpus": os.cpu_count(),
            "load_average_1m": os.getloadavg()[0],
        },
    )


if __name__ == "__main__":
    main()
