"""What tracing costs a search (issue 52): hybrid searches through gRPC, without rerank,
against four `dwsearch serve` processes on one database and one embedder, timed in a
random alternation in the same run:

- base: serve at BASE_REV, the commit before tracing came in (a git worktree of it);
- off: serve at this tree with no OTEL_* variable (tracing unset: no SDK, no exporter
  thread: the process's thread count is reported beside base's);
- sampled-1pct: OTEL_EXPORTER_OTLP_ENDPOINT set, OTEL_TRACES_SAMPLER=parentbased_traceidratio
  at 0.01 (a deployment's sampling);
- sampled-100pct: the same at 1.0 (every search a trace: its stages, the embedder call and
  each SQL statement as spans).

The traced serves export to an OTLP/gRPC receiver in this process that counts what it
receives and keeps nothing (a collector elsewhere costs serve no more than that). Each
query text is searched once on each serve, in a shuffled order, on a random org, after a
warm-up of every serve; the data: ORGS orgs of WINDOWS embedded windows and EVENTS chat
events each, as bench.search loads them (fake topic vectors, halfvec(1024)).

Figures: each serve's p50 / p99, off over base (≤ 1.0 within noise: tracing unset costs
nothing), 1% over off (≤ 1.03) and 100% over off (reported), and the spans received.

    python -m bench.tracing [--quick] [--base REV]
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

import grpc
import psycopg
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from pgvector.psycopg import register_vector

from bench import report
from bench.search import EMBEDDER_PORT, MODEL, load_org, make_url, sentence, wait_serving
from dwsearch_testkit.net import free_port
from dwsearch_testkit.seed import enable_semantic_search

ROOT = Path(__file__).resolve().parents[1]
BASE_REV = "9317835"  # the commit before 57e233b, which brought tracing in
SOURCE_DIRS = ("server", "embedder", "reranker", "tests/testkit", ".")
VARIANTS = ("base", "off", "sampled-1pct", "sampled-100pct")
SAMPLING = {"sampled-1pct": "0.01", "sampled-100pct": "1.0"}


class _Counting(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans = 0
        self.requests = 0

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest, context: object) -> object:
        self.requests += 1
        self.spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        return trace_service_pb2.ExportTraceServiceResponse()


class CountingReceiver:
    """An OTLP/gRPC TraceService on 127.0.0.1 that counts spans and keeps none."""

    def __init__(self) -> None:
        self.service = _Counting()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self.service, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def __enter__(self) -> CountingReceiver:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(0)

    def env(self, ratio: str) -> dict[str, str]:
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.port}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": ratio,
        }


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any DWSEARCH_* or OTEL_* setting, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DWSEARCH_", "OTEL_"))}
    return {**env, "GRPC_VERBOSITY": "ERROR", **extra}


def source_path(tree: Path) -> str:
    return os.pathsep.join(str(tree / d) for d in SOURCE_DIRS)


def start_serve(url: str, port: int, tree: Path, env: dict[str, str]) -> subprocess.Popen:
    """`dwsearch serve` from the sources in `tree` (this one, or the base's worktree)."""
    return subprocess.Popen(
        [
            sys.executable, "-m", "dwsearch.cli", "serve",
            "--listen-addr", f"127.0.0.1:{port}", "--embedder-addr", f"127.0.0.1:{EMBEDDER_PORT}",
            "--embed-model", MODEL, "--log-level", "warning",
            "--query-cache-bytes", "0",  # every search pays its embedding, as bench.search measures
        ],
        env=clean_env(DWSEARCH_DATABASE_URL=url, PYTHONPATH=source_path(tree), **env),
        cwd=tree,
    )  # fmt: skip


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


async def measure(
    ports: dict[str, int], orgs: list[str], texts: list[str], warm_up: int
) -> dict[str, list[float]]:
    from dwsearch.v1 import search_pb2 as pb
    from dwsearch.v1 import search_pb2_grpc

    channels = {name: grpc.aio.insecure_channel(f"127.0.0.1:{port}") for name, port in ports.items()}
    stubs = {name: search_pb2_grpc.SearchServiceStub(channel) for name, channel in channels.items()}
    rng = random.Random(11)

    async def search(name: str, org: str, text: str) -> float:
        started = time.perf_counter()
        response = await stubs[name].Search(
            pb.SearchRequest(org_id=org, query=text, limit=10, mode=pb.SEARCH_MODE_HYBRID), timeout=10
        )
        elapsed = (time.perf_counter() - started) * 1000
        assert response.hits and not response.degraded, response.degradations
        return elapsed

    try:
        for text in texts[:warm_up]:
            for name in ports:
                await search(name, rng.choice(orgs), text)
        latencies: dict[str, list[float]] = {name: [] for name in ports}
        for text in texts[warm_up:]:
            org = rng.choice(orgs)
            order = list(ports)
            rng.shuffle(order)
            for name in order:
                latencies[name].append(await search(name, org, text))
        return latencies
    finally:
        for channel in channels.values():
            await channel.close()


def base_worktree(rev: str, parent: Path) -> Path:
    tree = parent / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev], check=True,
                   capture_output=True)  # fmt: skip
    return tree


def main() -> None:
    parser = report.parser(__doc__.splitlines()[0])
    parser.add_argument("--base", default=BASE_REV, help="the commit before tracing (default %(default)s)")
    args = parser.parse_args()
    n_orgs, windows, events, queries, warm_up = (
        (3, 500, 1000, 120, 20) if args.quick else (10, 2000, 4000, 1500, 100)
    )
    rng = random.Random(5)
    texts = [sentence(rng) for _ in range(queries + warm_up)]
    with tempfile.TemporaryDirectory(prefix="dwsearch-bench-") as tmp:
        Path(tmp).chmod(0o755)
        base = base_worktree(args.base, Path(tmp))
        procs: list[subprocess.Popen] = []
        try:
            url = make_url(tmp)
            orgs = [f"org-{i:02d}" for i in range(n_orgs)]
            with psycopg.connect(url) as conn:
                register_vector(conn)
                for i, org in enumerate(orgs):
                    load_org(conn, org, windows, events, seed=i)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE")
            enable_semantic_search(url, *orgs)
            receivers = {name: CountingReceiver().__enter__() for name in SAMPLING}
            try:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "bench.fake_embedder",
                            "--port",
                            str(EMBEDDER_PORT),
                            "--topics",
                        ],
                        env=clean_env(),
                    )
                )
                ports = {name: free_port() for name in VARIANTS}
                serves = {}
                for name in VARIANTS:
                    env = receivers[name].env(SAMPLING[name]) if name in SAMPLING else {}
                    serves[name] = start_serve(url, ports[name], base if name == "base" else ROOT, env)
                    procs.append(serves[name])
                for name in VARIANTS:
                    wait_serving(f"127.0.0.1:{ports[name]}", serves[name])
                thread_counts = {name: threads(serves[name].pid) for name in VARIANTS}
                latencies = asyncio.run(measure(ports, orgs, texts, warm_up))
                time.sleep(6)  # the batch processors' last exports (every 5 s)
                spans = {name: r.service.spans for name, r in receivers.items()}
            finally:
                for r in receivers.values():
                    r.__exit__()
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(30)
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    figures: dict[str, float] = {}
    for name in VARIANTS:
        key = name.replace("-", "_")
        figures[f"{key}_p50_ms"] = report.percentile(latencies[name], 50)
        figures[f"{key}_p99_ms"] = report.percentile(latencies[name], 99)
    p50 = {name: figures[f"{name.replace('-', '_')}_p50_ms"] for name in VARIANTS}
    figures |= {
        "off_over_base_p50": p50["off"] / p50["base"],
        "sampled_1pct_over_off_p50": p50["sampled-1pct"] / p50["off"],
        "sampled_100pct_over_off_p50": p50["sampled-100pct"] / p50["off"],
        "spans_per_search_at_1pct": spans["sampled-1pct"] / (queries + warm_up),
        "spans_per_search_at_100pct": spans["sampled-100pct"] / (queries + warm_up),
    }
    params = {
        "base_rev": args.base,
        "orgs": n_orgs,
        "windows_per_org": windows,
        "events_per_org": events,
        "searches_per_serve": queries,
        "warm_up_per_serve": warm_up,
        "threads_at_start": thread_counts,
        "spans_received": spans,
    }
    if args.quick:
        print(figures, params)
        return
    report.write("tracing", figures, params=params)
    print(f"off / base p50: {figures['off_over_base_p50']:.3f} (tracing unset: 1.0 within noise)")
    print(f"1% / off p50: {figures['sampled_1pct_over_off_p50']:.3f} (target <= 1.03)")
    print(f"100% / off p50: {figures['sampled_100pct_over_off_p50']:.3f} (reported)")


if __name__ == "__main__":
    main()
