"""IndexService latency (issue 6): agent context's three section queries as filtered
hybrid queries through gRPC, BuildAgentContext without rerank, and, measured in the same
run as baselines, the raw SQL of one filtered hybrid query and one query embedding.

    python -m bench.index [--quick]

Data: DOCUMENTS documents (1024-d halfvec with topic structure + bge-m3-like sparse word
weights from the fake embedder) across APPS appIds, loaded with COPY, with the support
index's metadata: conversations (resolution, category, sentiment...), knowledge articles
(source, title...) and responses (trustScore, usageCount...). The fake embedder, `dwsearch
serve` and this client run as separate processes, as in production.

The same documents are loaded a second time into a HYBRID index of the Upstash-compatible
REST API (`serve --rest-port`, dense_model and sparse_model "default"), and the same
queries go through the official upstash-vector SDK: rest_query_p50_ms,
rest_vs_grpc_query_ratio (REST / gRPC filtered hybrid query p50) and
rest_agent_context_p50_ms (buildAgentContext: its three queries in parallel).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import psycopg
from pgvector import HalfVector, SparseVector
from pgvector.psycopg import register_vector
from psycopg.types.json import Jsonb

from bench import report
from bench.fake_embedder import topic_vector, topic_vectors
from bench.search import make_url, wait_serving
from dwsearch_testkit.fakes import FAKE_SPARSE_DIMENSION, fake_sparse
from dwsearch_testkit.text import MIXED_CHAT_WORDS, chat_text

DIM = 1024
MODEL = "fake/deterministic-v1"
APPS = 20
# Share of each document type in an app's index: most of it is resolved conversations.
TYPE_MIX = {"conversation": 0.6, "knowledge": 0.25, "response": 0.15}
RESOLUTIONS = ["refund", "transfer", "info", "escalated"]
RESOLUTION_WEIGHTS = [0.35, 0.2, 0.3, 0.15]
CATEGORIES = ["billing", "shipping", "account", "product", "other"]
SENTIMENTS = ["positive", "neutral", "negative"]
SOURCES = ["docs", "faq", "policy", "canned-response"]
T0 = datetime(2026, 1, 1, tzinfo=UTC)

EMBEDDER_PORT = 50162
SERVER_PORT = 50161
REST_PORT = 50163
REST_INDEX = "bench"
REST_TOKEN = "bench-token"
# The REST index's documents: namespace "" of index REST_INDEX, as dwsearch.rest stores it.
REST_NAMESPACE = REST_INDEX + "\x1f"
REST_INDEXES = f"""
[[index]]
name = "{REST_INDEX}"
token = "{REST_TOKEN}"
type = "HYBRID"
dense_model = "default"
sparse_model = "default"
"""


def sentence(rng: random.Random, low: int = 6, high: int = 20) -> str:
    return chat_text(rng, low, high, MIXED_CHAT_WORDS)


def metadata(rng: random.Random, app: str, doc_type: str, i: int) -> dict:
    day = (T0 + timedelta(days=rng.randint(0, 300))).date().isoformat()
    if doc_type == "conversation":
        return {
            "type": doc_type,
            "appId": app,
            "category": rng.choice(CATEGORIES),
            "resolution": rng.choices(RESOLUTIONS, RESOLUTION_WEIGHTS)[0],
            "customerSentiment": rng.choice(SENTIMENTS),
            "touchCount": rng.randint(1, 12),
            "resolvedAt": day,
        }
    if doc_type == "knowledge":
        return {
            "type": doc_type,
            "appId": app,
            "source": rng.choice(SOURCES),
            "title": sentence(rng, 3, 6),
            "lastUpdated": day,
        }
    return {
        "type": doc_type,
        "appId": app,
        "trustScore": round(rng.uniform(0.5, 1.0), 3),
        "usageCount": rng.randint(0, 500),
        "conversationId": f"{app}-c{rng.randint(0, i)}",
    }


def load(conn: psycopg.Connection, documents: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    vectors = topic_vectors(np.random.default_rng(seed), documents, DIM)
    types = list(TYPE_MIX)
    with (
        conn.cursor() as cur,
        cur.copy(
            "COPY dw_index_documents (namespace, id, data, metadata, model, embedding, sparse)"
            " FROM STDIN WITH (FORMAT BINARY)"
        ) as copy,
    ):
        copy.set_types(["varchar", "varchar", "text", "jsonb", "varchar", "halfvec", "sparsevec"])
        for i in range(documents):
            app = f"app-{i % APPS:02d}"
            doc_type = rng.choices(types, list(TYPE_MIX.values()))[0]
            text = sentence(rng)
            row = (
                f"{doc_type}-{i:07d}",
                text,
                Jsonb(metadata(rng, app, doc_type, i)),
                MODEL,
                HalfVector(vectors[i]),
                SparseVector(fake_sparse(text), FAKE_SPARSE_DIMENSION),
            )
            for namespace in ("", REST_NAMESPACE):  # the gRPC index's and the REST index's
                copy.write_row((namespace, *row))
    conn.commit()
    # Steady state: autovacuum has set hint bits and the visibility map, and has statistics.
    conn.autocommit = True
    conn.execute("VACUUM ANALYZE dw_index_documents")


def seed_filters(app: str) -> list[str]:
    """Agent context's three section filters, the app id as a quoted literal."""
    quoted = "'" + app.replace("'", "''") + "'"
    return [
        f"appId = {quoted} AND type = 'conversation' AND resolution != 'escalated'",
        f"appId = {quoted} AND type = 'knowledge'",
        f"appId = {quoted} AND type = 'response' AND trustScore > 0.85",
    ]


SEED_TOP_K = [3, 5, 3]


def start_processes(url: str, indexes: Path) -> list[subprocess.Popen]:
    env = {
        **os.environ,
        "DWSEARCH_DATABASE_URL": url,
        "GRPC_VERBOSITY": "ERROR",
        "DWSEARCH_REST_INDEXES": str(indexes),
        "DWSEARCH_REST_HOST": "127.0.0.1",
    }
    embedder = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.fake_embedder",
            "--port",
            str(EMBEDDER_PORT),
            "--dimension",
            str(DIM),
            "--topics",
            "--sparse",
        ],
        env=env,
    )
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dwsearch.cli",
            "serve",
            "--listen-addr",
            f"127.0.0.1:{SERVER_PORT}",
            "--embedder-addr",
            f"127.0.0.1:{EMBEDDER_PORT}",
            "--embed-model",
            MODEL,
            "--log-level",
            "warning",
            # Every query pays its embedding, as the figures have always measured: no query cache.
            "--query-cache-bytes",
            "0",
            "--rest-port",
            str(REST_PORT),
        ],
        env=env,
    )
    wait_serving(f"127.0.0.1:{SERVER_PORT}", server)
    return [server, embedder]


async def measure(url: str, queries: int) -> dict:
    import grpc
    from upstash_vector import AsyncIndex
    from upstash_vector.types import QueryMode

    from dwsearch.clients.embedder import EmbedderClient
    from dwsearch.db.pool import open_pool
    from dwsearch.index import store
    from dwsearch.index.documents import Include
    from dwsearch.index.filter import parse_filter
    from dwsearch.retrieval.candidates import CANDIDATES_PER_LEG
    from dwsearch.v1 import index_pb2 as pb
    from dwsearch.v1 import index_pb2_grpc

    indexes = Path(tempfile.mkdtemp(prefix="dwsearch-bench-rest-")) / "indexes.toml"
    indexes.write_text(REST_INDEXES)
    processes = start_processes(url, indexes)
    rest = AsyncIndex(url=f"http://127.0.0.1:{REST_PORT}", token=REST_TOKEN, retries=0)
    pool = await open_pool(url, min_size=1, max_size=2)
    embedder = EmbedderClient(f"127.0.0.1:{EMBEDDER_PORT}")
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{SERVER_PORT}")
    stub = index_pb2_grpc.IndexServiceStub(channel)
    rng = random.Random(7)
    include = Include(data=True, metadata=True)

    async def hybrid(app: str, text: str, which: int) -> float:
        request = pb.QueryRequest(
            data=text,
            filter=seed_filters(app)[which],
            top_k=SEED_TOP_K[which],
            mode=pb.QUERY_MODE_HYBRID,
            include_data=True,
            include_metadata=True,
        )
        start = time.perf_counter()
        response = await stub.Query(request, timeout=10)
        elapsed = (time.perf_counter() - start) * 1000
        assert response.results, (app, which)
        return elapsed

    async def raw_sql(app: str, text: str, which: int) -> float:
        """The statement Query runs for this filter, with the query vectors given."""
        dense = HalfVector(topic_vector(text, DIM))
        sparse = SparseVector(fake_sparse(text), FAKE_SPARSE_DIMENSION)
        node = parse_filter(seed_filters(app)[which])
        async with pool.connection() as conn:
            start = time.perf_counter()
            found = await store.nearest(
                conn,
                store.NamespaceScope("", MODEL),
                node,
                CANDIDATES_PER_LEG,
                include,
                dense=dense,
                sparse=sparse,
            )
            elapsed = (time.perf_counter() - start) * 1000
        assert found[0]
        return elapsed

    async def embed(text: str) -> float:
        start = time.perf_counter()
        await embedder.embed([text], input_type="query", sparse=True)
        return (time.perf_counter() - start) * 1000

    async def rest_query(app: str, text: str, which: int) -> float:
        """The same query as `hybrid`, through the REST API and the upstash-vector SDK."""
        start = time.perf_counter()
        results = await rest.query(
            data=text,
            filter=seed_filters(app)[which],
            top_k=SEED_TOP_K[which],
            query_mode=QueryMode.HYBRID,
            include_data=True,
            include_metadata=True,
        )
        elapsed = (time.perf_counter() - start) * 1000
        assert results, (app, which)
        return elapsed

    async def rest_agent_context(app: str, text: str) -> float:
        """buildAgentContext over the SDK: its three queries in parallel."""
        start = time.perf_counter()
        sections = await asyncio.gather(*(
            rest.query(data=text, filter=seed_filters(app)[which], top_k=SEED_TOP_K[which],
                       include_data=True, include_metadata=True)
            for which in range(3)
        ))  # fmt: skip
        elapsed = (time.perf_counter() - start) * 1000
        assert all(sections)
        return elapsed

    async def agent_context(app: str, text: str) -> float:
        start = time.perf_counter()
        response = await stub.BuildAgentContext(
            pb.BuildAgentContextRequest(message=text, app_id=app), timeout=10
        )
        elapsed = (time.perf_counter() - start) * 1000
        assert response.similar_tickets and response.knowledge and response.good_responses
        return elapsed

    apps = [f"app-{i:02d}" for i in range(APPS)]
    texts = [sentence(rng, 5, 15) for _ in range(queries)]
    for text in texts[:20]:  # warm connections, caches and prepared statements
        app = rng.choice(apps)
        for which in range(3):
            await hybrid(app, text, which)
            await rest_query(app, text, which)
            await raw_sql(app, text, which)
        await agent_context(app, text)
        await rest_agent_context(app, text)
        await embed(text)
    hybrid_ms, raw_ms, embed_ms, context_ms, rest_ms, rest_context_ms = [], [], [], [], [], []
    per_query: list[list[float]] = [[], [], []]
    for text in texts:  # interleaved so every figure sees the same machine state
        app = rng.choice(apps)
        for which in range(3):
            elapsed = await hybrid(app, text, which)
            hybrid_ms.append(elapsed)
            per_query[which].append(elapsed)
            rest_ms.append(await rest_query(app, text, which))
            # Another app and text: the service's query must not warm the baseline's pages.
            raw_ms.append(await raw_sql(rng.choice(apps), sentence(rng, 5, 15), which))
        embed_ms.append(await embed(text))
        context_ms.append(await agent_context(app, text))
        rest_context_ms.append(await rest_agent_context(app, text))
    figures = {
        "filtered_hybrid_p50_ms": report.percentile(hybrid_ms, 50),
        "filtered_hybrid_p99_ms": report.percentile(hybrid_ms, 99),
        "agent_context_p50_ms": report.percentile(context_ms, 50),
        "agent_context_p99_ms": report.percentile(context_ms, 99),
        "similar_tickets_p50_ms": report.percentile(per_query[0], 50),
        "knowledge_p50_ms": report.percentile(per_query[1], 50),
        "good_responses_p50_ms": report.percentile(per_query[2], 50),
        "raw_hybrid_sql_p50_ms": report.percentile(raw_ms, 50),
        "raw_hybrid_sql_p99_ms": report.percentile(raw_ms, 99),
        "query_embed_p50_ms": report.percentile(embed_ms, 50),
    }
    figures["service_vs_raw_sql_ratio"] = figures["filtered_hybrid_p50_ms"] / figures["raw_hybrid_sql_p50_ms"]
    figures["rest_query_p50_ms"] = report.percentile(rest_ms, 50)
    figures["rest_query_p99_ms"] = report.percentile(rest_ms, 99)
    figures["rest_vs_grpc_query_ratio"] = figures["rest_query_p50_ms"] / figures["filtered_hybrid_p50_ms"]
    figures["rest_agent_context_p50_ms"] = report.percentile(rest_context_ms, 50)
    await channel.close()
    await rest._client.aclose()  # the SDK has no close()
    await embedder.close()
    await pool.close()
    for proc in processes:
        proc.terminate()
        proc.wait(timeout=30)
    return figures


def main() -> None:
    args = report.parser(__doc__.splitlines()[0]).parse_args()
    documents, queries = (10_000, 100) if args.quick else (100_000, 500)
    with tempfile.TemporaryDirectory(prefix="dwsearch-bench-") as tmp:
        Path(tmp).chmod(0o755)
        url = make_url(tmp)
        start = time.perf_counter()
        with psycopg.connect(url) as conn:
            register_vector(conn)
            load(conn, documents)
        load_s = time.perf_counter() - start
        print(f"loaded {documents} documents across {APPS} apps in {load_s:.0f}s")
        figures = asyncio.run(measure(url, queries))
    params = {
        "documents": documents,
        "apps": APPS,
        "type_mix": TYPE_MIX,
        "dimension": DIM,
        "queries": queries,
        "load_s": round(load_s, 1),
    }
    report.write("index", figures, params=params)


if __name__ == "__main__":
    main()
