"""The reranker's HTTP port (dwsearch_reranker.http): the official Cohere SDK against
/v1/rerank (and /v2/rerank), TEI's /rerank JSON, each answer compared with gRPC's Rerank
of the same input on the same engine; errors in each API's shape."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import cohere
import grpc
import httpx
import pytest
from model_http import reranker_http

from dwsearch.v1 import embedder_pb2 as pb_embedder
from dwsearch.v1 import reranker_pb2 as pb
from dwsearch.v1 import reranker_pb2_grpc as pb_grpc
from dwsearch_reranker.engine import RerankLimits
from dwsearch_testkit.net import free_port

QUERY = "where is my parcel"
DOCUMENTS = [
    "the parcel was delivered to the wrong address",
    "boleh saya tukar alamat penghantaran?",
    "我的订单什么时候到",
    "the refund still belum masuk lah",
    "how do I reset my password",
]


async def grpc_rerank(served, query, documents, **fields) -> pb.RerankResponse:
    request = pb.RerankRequest(
        query=query, documents=documents, priority=pb_embedder.PRIORITY_INTERACTIVE, **fields
    )
    return await pb_grpc.RerankerServiceStub(served.channel).Rerank(request, timeout=30)


def pairs(response: pb.RerankResponse) -> list[tuple[int, float]]:
    return [(r.index, r.score) for r in response.results]


def f32(value: float) -> float:
    """A score as gRPC carries it (a proto float)."""
    return pb.RerankResult(score=value).score


async def test_cohere_sdk_rerank_matches_grpc(tiny_reranker):
    async with reranker_http(tiny_reranker) as served:
        model = served.engine.info.model_id
        client = cohere.AsyncClient(api_key="unused", base_url=served.url)
        answer = await client.rerank(
            model=model, query=QUERY, documents=DOCUMENTS, top_n=3, return_documents=True
        )
        everything = await client.rerank(model=model, query=QUERY, documents=DOCUMENTS)
        v2 = await cohere.AsyncClientV2(api_key="unused", base_url=served.url).rerank(
            model=model, query=QUERY, documents=DOCUMENTS, top_n=2
        )
        expected = await grpc_rerank(served, QUERY, DOCUMENTS, top_n=3)
        expected_all = await grpc_rerank(served, QUERY, DOCUMENTS)
    assert [(r.index, f32(r.relevance_score)) for r in answer.results] == pairs(expected)
    assert [r.document.text for r in answer.results] == [DOCUMENTS[i] for i, _ in pairs(expected)]
    assert [(r.index, f32(r.relevance_score)) for r in everything.results] == pairs(expected_all)
    assert all(r.document is None for r in everything.results)
    assert [(r.index, f32(r.relevance_score)) for r in v2.results] == pairs(expected)[:2]


async def test_cohere_documents_may_be_objects_with_text(tiny_reranker):
    async with reranker_http(tiny_reranker) as served, httpx.AsyncClient(base_url=served.url) as client:
        answer = await client.post(
            "/v1/rerank",
            json={"query": QUERY, "documents": [{"text": d} for d in DOCUMENTS], "return_documents": True},
        )
        expected = await grpc_rerank(served, QUERY, DOCUMENTS)
    assert answer.status_code == 200
    results = answer.json()["results"]
    assert [(r["index"], f32(r["relevance_score"])) for r in results] == pairs(expected)
    assert results[0]["document"] == {"text": DOCUMENTS[results[0]["index"]]}


async def test_tei_rerank_matches_grpc(tiny_reranker):
    async with reranker_http(tiny_reranker) as served, httpx.AsyncClient(base_url=served.url) as client:
        scored = await client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "return_text": True})
        raw = await client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "raw_scores": True})
        expected = await grpc_rerank(served, QUERY, DOCUMENTS)
        expected_raw = await grpc_rerank(served, QUERY, DOCUMENTS, raw_scores=True)
        info = (await client.get("/info")).json()
    assert scored.status_code == 200 and raw.status_code == 200
    assert [(r["index"], f32(r["score"])) for r in scored.json()] == pairs(expected)
    assert [r["text"] for r in scored.json()] == [DOCUMENTS[i] for i, _ in pairs(expected)]
    assert [(r["index"], f32(r["score"])) for r in raw.json()] == pairs(expected_raw)
    assert "text" not in raw.json()[0]
    assert info["model_id"] == served.engine.info.model_id and "reranker" in info["model_type"]


@pytest.mark.parametrize(
    "path,body,status,message",
    [
        ("/v1/rerank", {"query": "", "documents": ["a"]}, 400, "query is empty"),
        ("/v1/rerank", {"query": "q", "documents": "a"}, 400, "documents is required"),
        ("/v1/rerank", {"query": "q", "documents": [{"title": "a"}]}, 400, "documents[0]"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, 400, "top_n"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "model": "rerank-v3.5"}, 404, "does not serve"),
        ("/v1/rerank", {"query": "q", "documents": ["a"] * 5}, 413, "5 documents, over the limit of 4"),
    ],
)
async def test_cohere_errors(tiny_reranker, path, body, status, message):
    async with (
        reranker_http(tiny_reranker, RerankLimits(max_documents_per_request=4)) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        answer = await client.post(path, json=body)
    assert answer.status_code == status and message in answer.json()["message"]


async def test_cohere_sdk_sees_errors_as_its_own_exceptions(tiny_reranker):
    async with reranker_http(tiny_reranker, auth_token="s3cret") as served:
        with pytest.raises(cohere.UnauthorizedError):
            await cohere.AsyncClient(api_key="wrong", base_url=served.url).rerank(
                query=QUERY, documents=DOCUMENTS
            )
        with pytest.raises(cohere.BadRequestError):
            await cohere.AsyncClient(api_key="s3cret", base_url=served.url).rerank(
                query="", documents=DOCUMENTS
            )
        ok = await cohere.AsyncClient(api_key="s3cret", base_url=served.url).rerank(
            query=QUERY, documents=DOCUMENTS
        )
    assert len(ok.results) == len(DOCUMENTS)


async def test_tei_rerank_errors(tiny_reranker):
    async with reranker_http(tiny_reranker) as served, httpx.AsyncClient(base_url=served.url) as client:
        empty = await client.post("/rerank", json={"query": "q", "texts": []})
        wrong = await client.post("/rerank", json={"query": "q", "texts": "a"})
        health = await client.get("/health")
    assert (empty.status_code, empty.json()["error_type"]) == (400, "Empty")
    assert wrong.status_code == 400 and "texts is required" in wrong.json()["error"]
    assert health.status_code == 200


def test_dwsearch_reranker_serves_its_http_port_beside_grpc(tiny_cross_encoder_dir):
    """`dwsearch reranker --http-port` as a real process: the Cohere SDK's answer is gRPC's,
    /health turns 200 once warm, SIGTERM drains and exits 0."""
    port, http_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dwsearch.cli", "reranker", "--listen-addr", f"127.0.0.1:{port}",
         "--rerank-model", str(tiny_cross_encoder_dir), "--device", "cpu", "--http-port", str(http_port),
         "--log-format", "text"],
        env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:  # polling another process's start-up, with a deadline
            assert proc.poll() is None and time.monotonic() < deadline, (
                proc.stderr.read() if proc.stderr else ""
            )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=2) as health:
                    if health.status == 200:
                        break
            except OSError:  # refused, reset, or no answer within the timeout while it starts
                pass
            time.sleep(0.2)
        answer = cohere.Client(api_key="unused", base_url=f"http://127.0.0.1:{http_port}").rerank(
            query=QUERY, documents=DOCUMENTS, top_n=3
        )
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            expected = pb_grpc.RerankerServiceStub(channel).Rerank(
                pb.RerankRequest(query=QUERY, documents=DOCUMENTS, top_n=3), timeout=30
            )
        assert [(r.index, f32(r.relevance_score)) for r in answer.results] == pairs(expected)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_tei_s_other_names_for_rerank_answer_as_rerank(tiny_reranker):
    async with reranker_http(tiny_reranker) as served, httpx.AsyncClient(base_url=served.url) as client:
        expected = await grpc_rerank(served, QUERY, DOCUMENTS)
        root = await client.post("/", json={"query": QUERY, "texts": DOCUMENTS})
        nested = await client.post(
            "/invocations", json={"query": QUERY, "texts": DOCUMENTS, "parameters": {}}
        )
        health = [(await client.get(path)).status_code for path in ("/health", "/ping", "/")]
    for answer in (root, nested):
        assert answer.status_code == 200
        assert [(r["index"], f32(r["score"])) for r in answer.json()] == pairs(expected)
    assert health == [200, 200, 200]
