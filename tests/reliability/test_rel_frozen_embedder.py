"""A frozen embedder (SIGSTOP: its connections stay open and nothing answers) under a real
`dwsearch serve` with the REST API: the support app's queries answer within the query
embedding's deadline, as chat search does, never after a client's default of seconds.

- REST `query-data` on a HYBRID index whose sparse side is BM25: 200 with the BM25 leg's
  hits and the Dwsearch-Degraded header; the seed's three parallel filtered queries too.
- REST `query-data` on a dense-only index: 503 with Retry-After.
- gRPC IndexService Query and BuildAgentContext on the served model's space (every leg
  needs the embedder): UNAVAILABLE, at the deadline. (An agent context over a BM25 space
  answers with that leg's sections, degraded: tests/index/test_index_degraded.py.)
- Chat Search over the same query embedder: full text, degraded, within the deadline.
- The embedder thawed: answers are whole again.

Each bound is the deadline (DWSEARCH_EMBED_TIMEOUT_MS) plus BOUND_SLACK_S."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from dwsearch.v1 import index_pb2, index_pb2_grpc, search_pb2, search_pb2_grpc
from dwsearch_testkit.net import free_port
from dwsearch_testkit.procs import FakeModel, Serve, running, wait_until
from dwsearch_testkit.reldb import seed_sessions

pytestmark = pytest.mark.slow

EMBED_TIMEOUT_MS = 300  # production's default
BOUND_SLACK_S = 0.5
BOUND_S = EMBED_TIMEOUT_MS / 1000 + BOUND_SLACK_S
CLIENT_TIMEOUT_S = 60.0  # long enough that a hang is measured, not cut short
INDEXES = """
[[index]]
name = "support"
token = "tok-hybrid"
type = "HYBRID"
dense_model = "default"
sparse_model = "BM25"

[[index]]
name = "dense"
token = "tok-dense"
type = "DENSE"
dense_model = "default"
"""
DOCUMENTS = [
    {"id": "kb-1", "data": "How to request a refund for a damaged parcel", "metadata": {"appId": "a", "type": "knowledge"}},
    {"id": "kb-2", "data": "Tukar alamat pesanan sebelum penghantaran", "metadata": {"appId": "a", "type": "knowledge"}},
    {"id": "t-1", "data": "Customer asked for a refund, parcel arrived damaged", "metadata": {"appId": "a", "type": "conversation", "resolution": "resolved"}},
    {"id": "r-1", "data": "Sorry about the damaged parcel, your refund is on its way", "metadata": {"appId": "a", "type": "trusted_response", "trustScore": 0.9}},
]  # fmt: skip
SEED_FILTERS = (
    "appId = 'a' AND type = 'conversation' AND resolution != 'escalated'",
    "appId = 'a' AND type = 'knowledge'",
    "appId = 'a' AND type = 'trusted_response' AND trustScore > 0.85",
)


def rest(port: int, index: str, token: str, endpoint: str, body: Any) -> tuple[int, dict[str, str], Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/{index}/{endpoint}",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=CLIENT_TIMEOUT_S) as response:
            return (
                response.status,
                {k.lower(): v for k, v in response.headers.items()},
                json.loads(response.read()),
            )
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, json.loads(exc.read() or b"null")


def timed(call: Any) -> tuple[float, Any]:
    started = time.monotonic()
    result = call()
    return time.monotonic() - started, result


def grpc_call(serve: Serve, method: str, request: Any) -> Any:
    with grpc.insecure_channel(serve.address) as channel:
        return getattr(index_pb2_grpc.IndexServiceStub(channel), method)(request, timeout=CLIENT_TIMEOUT_S)


def chat_search(serve: Serve, text: str) -> search_pb2.SearchResponse:
    with grpc.insecure_channel(serve.address) as channel:
        return search_pb2_grpc.SearchServiceStub(channel).Search(
            search_pb2.SearchRequest(org_id="org-a", query=text), timeout=CLIENT_TIMEOUT_S
        )


def test_a_frozen_embedder_degrades_the_support_apps_queries_within_the_deadline(db_url, tmp_path):
    seed_sessions(db_url, ["org-a"], channels=1, sessions=2, messages=3)  # chat, for Search
    indexes = tmp_path / "indexes.toml"
    indexes.write_text(INDEXES)
    rest_port = free_port()
    embedder = FakeModel("embedder")
    serve = Serve(
        db_url,
        embedder.address,
        tmp_path / "serve.log",
        env={
            "DWSEARCH_EMBED_TIMEOUT_MS": str(EMBED_TIMEOUT_MS),
            "DWSEARCH_REST_INDEXES": str(indexes),
            "DWSEARCH_REST_HOST": "127.0.0.1",
        },
        args=("--rest-port", str(rest_port)),
    )
    with running(embedder, serve):
        embedder.start()
        serve.start()
        wait_until(
            lambda: rest(rest_port, "support", "tok-hybrid", "info", {})[0] == 200, 60, "the REST port", 0.2
        )
        for index, token in (("support", "tok-hybrid"), ("dense", "tok-dense")):
            status, _, body = rest(rest_port, index, token, "upsert-data", DOCUMENTS)
            assert status == 200, body
        grpc_call(serve, "Upsert", index_pb2.UpsertRequest(
            namespace="grpc", documents=[index_pb2.Document(id=d["id"], data=d["data"]) for d in DOCUMENTS]
        ))  # fmt: skip
        status, headers, body = rest(
            rest_port, "support", "tok-hybrid", "query-data", {"data": "refund", "topK": 2}
        )
        assert status == 200 and "dwsearch-degraded" not in headers and body["result"], body

        embedder.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            # HYBRID with a BM25 sparse side: the BM25 leg's hits, degraded, said in the header.
            for attempt in range(5):  # the deadline first, then the breaker, open, at once
                elapsed, (status, headers, body) = timed(
                    lambda: rest(rest_port, "support", "tok-hybrid", "query-data",
                                 {"data": "damaged parcel refund", "topK": 3, "includeMetadata": True})
                )  # fmt: skip
                print(f"frozen embedder, HYBRID query-data #{attempt}: {status} in {elapsed * 1000:.0f} ms")
                assert status == 200, body
                assert elapsed < BOUND_S
                assert headers.get("dwsearch-degraded") in ("embedder_timeout", "embedder_unavailable")
                assert {hit["id"] for hit in body["result"]} <= {"kb-1", "t-1", "r-1"}
                assert body["result"][0]["id"] in ("kb-1", "t-1", "r-1")

            # The seed's agent context: three filtered queries at once, each degraded, none hung.
            def seed_query(filter_: str) -> tuple[float, tuple[int, dict[str, str], Any]]:
                return timed(lambda: rest(rest_port, "support", "tok-hybrid", "query-data",
                                          {"data": "parcel arrived damaged, refund?", "topK": 3, "filter": filter_}))  # fmt: skip

            with ThreadPoolExecutor(3) as pool:
                answers = list(pool.map(seed_query, SEED_FILTERS))
            for elapsed, (status, headers, body) in answers:
                assert status == 200 and elapsed < BOUND_S and headers.get("dwsearch-degraded"), (
                    elapsed,
                    body,
                )
            assert [[hit["id"] for hit in body["result"]] for _, (_, _, body) in answers] == [
                ["t-1"],
                ["kb-1"],
                ["r-1"],
            ]

            # A query embedded before the freeze needs no embedder (the query cache)...
            status, headers, body = rest(
                rest_port, "dense", "tok-dense", "query-data", {"data": "refund", "topK": 3}
            )
            assert status == 200 and "dwsearch-degraded" not in headers and body["result"], body
            # ...a new one, dense only: nothing answers without the embedder, so 503 at the deadline.
            elapsed, (status, headers, body) = timed(
                lambda: rest(
                    rest_port, "dense", "tok-dense", "query-data", {"data": "where is my order", "topK": 3}
                )
            )
            print(f"frozen embedder, DENSE query-data: {status} in {elapsed * 1000:.0f} ms")
            assert status == 503 and elapsed < BOUND_S, body
            assert headers.get("retry-after") == "1" and "embedder" in body["error"]

            # gRPC on the served model's space: Query UNAVAILABLE, agent context degraded.
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as raised:
                grpc_call(serve, "Query", index_pb2.QueryRequest(namespace="grpc", data="refund", top_k=3))
            elapsed = time.monotonic() - started
            print(f"frozen embedder, gRPC Query: {raised.value.code().name} in {elapsed * 1000:.0f} ms")
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE and elapsed < BOUND_S
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as raised:
                grpc_call(serve, "BuildAgentContext", index_pb2.BuildAgentContextRequest(
                    namespace="grpc", message="my parcel arrived damaged", app_id="a"
                ))  # fmt: skip
            elapsed = time.monotonic() - started
            print(
                f"frozen embedder, gRPC BuildAgentContext: {raised.value.code().name} in {elapsed * 1000:.0f} ms"
            )
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE and elapsed < BOUND_S
            # Chat search, the other product, over the same query embedder: full text within
            # the deadline, degraded with the reason.
            elapsed, response = timed(lambda: chat_search(serve, "parcel refund"))
            print(f"frozen embedder, chat Search: degraded={response.degraded} in {elapsed * 1000:.0f} ms")
            assert elapsed < BOUND_S and response.degraded and response.hits
            assert next(d.reason for d in response.degradations) in (
                search_pb2.DEGRADATION_REASON_EMBEDDER_TIMEOUT,
                search_pb2.DEGRADATION_REASON_EMBEDDER_UNAVAILABLE,
            )
            # A write that needs the embedder fails cleanly: nothing of it is written.
            status, _, body = rest(rest_port, "support", "tok-hybrid", "upsert-data",
                                   [{"id": "new", "data": "written while frozen"}])  # fmt: skip
            assert status in (503, 504), body
        finally:
            embedder.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]

        def whole() -> bool:
            status, headers, _ = rest(
                rest_port, "support", "tok-hybrid", "query-data", {"data": "refund", "topK": 2}
            )
            return status == 200 and "dwsearch-degraded" not in headers

        wait_until(whole, 30, "whole answers once the embedder is thawed", 0.3)
        status, _, body = rest(rest_port, "support", "tok-hybrid", "fetch", {"ids": ["new"]})
        assert status == 200 and body["result"] == [None], body
