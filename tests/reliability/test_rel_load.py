"""A bounded load test over loopback: CLIENTS concurrent clients call Search on a real
`dwsearch serve` (the fake embedder as a process, windows embedded by a real sweep) for
DURATION_S seconds. No call may fail; latency percentiles are printed; the server's
resident memory after the run must be within RSS_TOLERANCE of what it was after warm-up.

    .venv/bin/python -m pytest -q -s tests/reliability/test_rel_load.py
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from dwsearch.v1 import search_pb2, search_pb2_grpc
from dwsearch_testkit.procs import FakeModel, Serve, run_dwsearch, running
from dwsearch_testkit.reldb import seed_sessions

pytestmark = pytest.mark.slow

CLIENTS = 8
DURATION_S = 10.0
WARM_UP_S = 2.0
# Growth allowed between the RSS after warm-up and after the run: allocator slack and
# gRPC buffers, far below what a per-request leak would add over thousands of calls.
RSS_TOLERANCE_BYTES = 16 * 1024 * 1024
ORGS = ["org-a", "org-b", "org-c"]
QUERIES = [
    "parcel refund",
    "refund",
    "session 3 message",
    "message 2 about the parcel",
    "ch7 refund",
    "退款",
    "bayar",
]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def _client(
    stub, until: float, latencies: list[float], errors: list[str], degraded: list[int], seed: int
):
    rng = random.Random(seed)
    while time.monotonic() < until:
        request = search_pb2.SearchRequest(org_id=rng.choice(ORGS), query=rng.choice(QUERIES), limit=10)
        started = time.perf_counter()
        try:
            response = await stub.Search(request, timeout=10)
        except grpc.aio.AioRpcError as exc:
            errors.append(f"{exc.code().name}: {exc.details()}")
            continue
        latencies.append(time.perf_counter() - started)
        if response.degraded:
            degraded.append(1)


async def _load(address: str, seconds: float) -> tuple[list[float], list[str], list[int]]:
    latencies: list[float] = []
    errors: list[str] = []
    degraded: list[int] = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = search_pb2_grpc.SearchServiceStub(channel)
        until = time.monotonic() + seconds
        await asyncio.gather(*(_client(stub, until, latencies, errors, degraded, i) for i in range(CLIENTS)))
    return latencies, errors, degraded


def test_search_under_load_has_no_errors_and_flat_memory(db_url, tmp_path):
    # 3 orgs x 10 channels x 5 sessions of 3 messages: 150 windows, 450 messages.
    seed_sessions(db_url, ORGS, channels=10, sessions=5, messages=3)
    embedder = FakeModel("embedder")
    serve = Serve(db_url, embedder.address, tmp_path / "serve.log",
                  env={"DWSEARCH_EMBED_TIMEOUT_MS": "5000", "DWSEARCH_LOG_LEVEL": "warning"})  # fmt: skip
    with running(embedder, serve):
        embedder.start()
        serve.start()
        swept = run_dwsearch("sweep", "--server-addr", serve.address)
        assert swept.returncode == 0 and "150 windows embedded" in swept.stdout, swept.stdout + swept.stderr
        assert serve.proc is not None

        _, warm_errors, _ = asyncio.run(_load(serve.address, WARM_UP_S))
        assert warm_errors == []
        rss_before = rss_bytes(serve.proc.pid)
        latencies, errors, degraded = asyncio.run(_load(serve.address, DURATION_S))
        rss_after = rss_bytes(serve.proc.pid)

    ms = np.array(latencies) * 1000
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    print(
        f"\nload: {CLIENTS} clients x {DURATION_S:.0f} s, {len(latencies)} searches ({len(latencies) / DURATION_S:.0f}/s), "
        f"{len(errors)} errors, {len(degraded)} degraded; latency p50 {p50:.1f} ms, p95 {p95:.1f} ms, "
        f"p99 {p99:.1f} ms, max {ms.max():.1f} ms; serve RSS {rss_before / 2**20:.1f} MiB -> "
        f"{rss_after / 2**20:.1f} MiB ({(rss_after - rss_before) / 2**20:+.1f} MiB)"
    )
    assert errors == []
    assert degraded == []  # the embedder always answered within its 5 s deadline
    assert len(latencies) > CLIENTS * 10  # the run did real work
    assert rss_after - rss_before < RSS_TOLERANCE_BYTES
