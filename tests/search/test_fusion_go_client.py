"""The Go client sets SearchRequest.fusion and fusion_weights and reads
SearchResponse.fusion and each hit's legs (SearchHit.sources) through Go's generated code
(go/cmd/dwsearch-client-check, built by `bash go/stubs.sh check`)."""

import asyncio
import os
from pathlib import Path

import pytest

from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.search.service import SERVICE_NAME, SearchService
from dwsearch.v1 import search_pb2_grpc
from dwsearch_testkit.fakes import FAKE_MODEL

GO_CLIENT = Path(__file__).resolve().parents[2] / "gen" / "go" / "bin" / "dwsearch-client-check"

pytestmark = pytest.mark.skipif(
    not GO_CLIENT.exists(), reason="no Go client: run `bash go/stubs.sh check` (CI's .ci/deploy-checks does)"
)


async def go_search(port: int, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        str(GO_CLIENT), "-addr", f"127.0.0.1:{port}", "-org", "org-a", *args,
        env={k: v for k, v in os.environ.items() if k != "DWSEARCH_AUTH_TOKEN"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode or 0, out.decode()


@pytest.fixture
async def search_port(make_searcher):
    service = SearchService(make_searcher())
    host = GrpcHost(
        "127.0.0.1:0",
        [Service(SERVICE_NAME, lambda s: search_pb2_grpc.add_SearchServiceServicer_to_server(service, s))],
    )
    port = await host.start()
    await host.set_serving(True)
    yield port
    await host.stop(0)


async def test_go_client_chooses_the_fusion_and_reads_the_legs(corpus, search_port):
    corpus.window("org-a", "c1", ["where is my parcel", "it has not arrived"])
    corpus.messages("org-a", "c2", ["order ORD-5521 refund approved"])
    code, out = await go_search(search_port, "-query", "refund ORD-5521")
    assert code == 0, out
    assert "fusion SEARCH_FUSION_WEIGHTED, 2 hits" in out  # the server's default
    assert f"legs: dense:{FAKE_MODEL} #1" in out and "legs: fts #1" in out
    code, out = await go_search(search_port, "-query", "refund ORD-5521", "-fusion", "rrf")
    assert code == 0 and "fusion SEARCH_FUSION_RRF, 2 hits" in out, out

    code, out = await go_search(
        search_port, "-query", "refund ORD-5521", "-fusion", "weighted", "-weights", "fts=1,dense=0"
    )
    assert code == 0, out
    assert "fusion SEARCH_FUSION_WEIGHTED, 2 hits" in out
    assert "1. HIT_KIND_MESSAGE c2 score 1.0000" in out and "2. HIT_KIND_WINDOW c1 score 0.0000" in out


async def test_go_client_sees_bad_weights_refused(search_port):
    code, out = await go_search(search_port, "-query", "refund", "-weights", "bm25=1")
    assert code == 1 and "InvalidArgument" in out and "fusion weight 'bm25'" in out
    code, out = await go_search(search_port, "-query", "refund", "-fusion", "borda")
    assert code == 2 and '-fusion "borda": rrf or weighted' in out
