"""The REST API under large responses and bodies: how long one fetch of many large
vectors holds the other requests on the port, and serve's peak memory over a large upsert.

    python -m bench.rest [--quick]

`dwsearch serve --rest-port` (and the fake embedder) as separate processes, over the
embedded Postgres; a COSINE index of DIM dimensions holding DOCS documents. Figures:
- rest_large_fetch_s: one fetch of every document with includeVectors (about 15 MiB of
  JSON at 1,000 x 4,000);
- rest_info_alone_p50_ms / _max_ms: /info, one request after another, nothing else on
  the port; rest_info_during_fetch_p50_ms / _max_ms: the same while the fetches run
  (the longest is how long a request waited behind the large response);
- rest_upsert_body_mb, rest_upsert_peak_rss_mb: one upsert of UPSERT_DOCS vectors of
  UPSERT_DIM dimensions, and serve's peak resident memory over its resident memory just
  before (the peak is reset through /proc/PID/clear_refs), rest_upsert_peak_vs_body;
  rest_upsert_s: how long that upsert took, sent to answered.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bench import report
from bench.search import make_url, wait_serving

DOCS, DIM = 1000, 4000
UPSERT_DOCS, UPSERT_DIM = 1000, 15_999
EMBEDDER_PORT, SERVER_PORT, REST_PORT = 29192, 29191, 29193  # below the ephemeral range
TOKEN = "bench-token"
INDEXES = f"""
[[index]]
name = "large"
token = "{TOKEN}"
dimension = {DIM}
metric = "COSINE"

[[index]]
name = "wide"
token = "{TOKEN}-wide"
dimension = {UPSERT_DIM}
metric = "COSINE"
"""


def start(url: str, indexes: Path) -> list[subprocess.Popen]:
    env = {
        **os.environ,
        "DWSEARCH_DATABASE_URL": url,
        "GRPC_VERBOSITY": "ERROR",
        "DWSEARCH_REST_INDEXES": str(indexes),
        "DWSEARCH_REST_HOST": "127.0.0.1",
        "DWSEARCH_MAX_UPSERT_BYTES": str(256 * 1024 * 1024),
        "OMP_NUM_THREADS": "1",
    }
    embedder = subprocess.Popen(
        [sys.executable, "-m", "bench.fake_embedder", "--port", str(EMBEDDER_PORT)], env=env
    )
    server = subprocess.Popen(
        [
            sys.executable, "-m", "dwsearch.cli", "serve",
            "--listen-addr", f"127.0.0.1:{SERVER_PORT}",
            "--embedder-addr", f"127.0.0.1:{EMBEDDER_PORT}",
            "--log-level", "warning",
            "--embed-model", "fake/deterministic-v1",
            "--rest-port", str(REST_PORT),
        ],
        env=env,
    )  # fmt: skip
    wait_serving(f"127.0.0.1:{SERVER_PORT}", server)
    return [server, embedder]


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5\n")  # the peak resident memory (VmHWM), reset


def _status(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def measure(server_pid: int, rounds: int) -> dict[str, float]:
    base = f"http://127.0.0.1:{REST_PORT}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    rng = np.random.default_rng(3)
    figures: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=base, timeout=120) as http:
        for lo in range(0, DOCS, 100):
            vectors = rng.standard_normal((100, DIM)).astype(np.float32)
            body = [{"id": f"d{lo + i:04d}", "vector": v.tolist()} for i, v in enumerate(vectors)]
            (await http.post("/upsert", headers=auth, json=body)).raise_for_status()
        ids = [f"d{i:04d}" for i in range(DOCS)]

        async def info_times(stop: asyncio.Event) -> list[float]:
            times = []
            while not stop.is_set():
                t = time.perf_counter()
                (await http.post("/info", headers=auth)).raise_for_status()
                times.append((time.perf_counter() - t) * 1000)
                await asyncio.sleep(0.005)
            return times

        stop = asyncio.Event()
        alone = asyncio.ensure_future(info_times(stop))
        await asyncio.sleep(3)
        stop.set()
        alone_ms = await alone
        fetch_s, during_ms = [], []
        for _ in range(rounds):
            stop = asyncio.Event()
            during = asyncio.ensure_future(info_times(stop))
            await asyncio.sleep(0.2)
            t = time.perf_counter()
            response = await http.post("/fetch", headers=auth, json={"ids": ids, "includeVectors": True})
            response.raise_for_status()
            fetch_s.append(time.perf_counter() - t)
            await asyncio.sleep(0.2)
            stop.set()
            during_ms.extend(await during)
        figures["rest_large_fetch_mb"] = len(response.content) / 2**20
        figures["rest_large_fetch_s"] = float(np.median(fetch_s))
        figures["rest_info_alone_p50_ms"] = report.percentile(alone_ms, 50)
        figures["rest_info_alone_max_ms"] = max(alone_ms)
        figures["rest_info_during_fetch_p50_ms"] = report.percentile(during_ms, 50)
        figures["rest_info_during_fetch_max_ms"] = max(during_ms)

        wide = rng.standard_normal((UPSERT_DOCS, UPSERT_DIM)).round(2)  # float64: short decimals
        body_bytes = json.dumps(
            [{"id": f"w{i}", "vector": v.tolist()} for i, v in enumerate(wide)], separators=(",", ":")
        ).encode()
        del wide
        _reset_peak(server_pid)
        before = _status(server_pid, "VmRSS")
        t = time.perf_counter()
        response = await http.post(
            "/upsert",
            headers={**auth, "Authorization": f"Bearer {TOKEN}-wide", "Content-Type": "application/json"},
            content=body_bytes,
        )
        assert response.status_code == 200, response.text[:300]
        figures["rest_upsert_s"] = time.perf_counter() - t
        figures["rest_upsert_body_mb"] = len(body_bytes) / 2**20
        figures["rest_upsert_peak_rss_mb"] = _status(server_pid, "VmHWM") - before
        figures["rest_upsert_peak_vs_body"] = (
            figures["rest_upsert_peak_rss_mb"] / figures["rest_upsert_body_mb"]
        )
    return figures


def main() -> None:
    parser = report.parser(__doc__.splitlines()[0])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dwsearch-bench-rest-") as tmp:
        url = make_url(tmp)
        indexes = Path(tmp) / "indexes.toml"
        indexes.write_text(INDEXES)
        processes = start(url, indexes)
        try:
            figures = asyncio.run(measure(processes[0].pid, 2 if args.quick else 5))
        finally:
            for proc in processes:
                proc.terminate()
            for proc in processes:
                proc.wait(timeout=30)
    report.write(
        "rest_quick" if args.quick else "rest",
        figures,
        params={"docs": DOCS, "dimension": DIM, "upsert_docs": UPSERT_DOCS, "upsert_dimension": UPSERT_DIM},
    )


if __name__ == "__main__":
    main()
