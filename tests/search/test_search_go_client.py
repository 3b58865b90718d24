"""The Go stubs against a real SearchService: the Go client check program
(go/cmd/dwsearch-client-check, built by `bash go/stubs.sh check`, which CI's
deploy-checks runs first) searches over gRPC with the bearer token, and the hits and the
degradation come back through Go's generated code."""

import asyncio
import os
from pathlib import Path

import pytest

from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.search.service import SERVICE_NAME, SearchService
from dwsearch.v1 import search_pb2_grpc

GO_CLIENT = Path(__file__).resolve().parents[2] / "gen" / "go" / "bin" / "dwsearch-client-check"
TOKEN = "go-client-token"

pytestmark = pytest.mark.skipif(
    not GO_CLIENT.exists(), reason="no Go client: run `bash go/stubs.sh check` (CI's .ci/deploy-checks does)"
)


async def go_search(port: int, org: str, query: str, token: str = TOKEN, *extra: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        str(GO_CLIENT), "-addr", f"127.0.0.1:{port}", "-org", org, "-query", query, *extra,
        env={**os.environ, "DWSEARCH_AUTH_TOKEN": token},
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
        auth_token=TOKEN,
    )
    port = await host.start()
    await host.set_serving(True)
    yield port
    await host.stop(0)


async def test_go_client_searches_and_reads_the_hits(corpus, search_port):
    corpus.window("org-a", "c1", ["where is my parcel", "退款 please"])
    corpus.window("org-b", "c1", ["where is my parcel"])
    code, out = await go_search(search_port, "org-a", "parcel")
    assert code == 0, out
    assert "health dwsearch.v1.SearchService: SERVING" in out
    assert 'search "parcel" in org-a: mode SEARCH_MODE_HYBRID' in out and "1 hits" in out
    assert (
        "HIT_KIND_WINDOW c1" in out
        and "fts #1, dense #1" in out
        and "where is my parcel / 退款 please" in out
    )


async def test_go_client_sees_a_degraded_answer_and_errors(corpus, search_port):
    from dwsearch.flags import MODULE_FLAG
    from dwsearch_testkit.seed import set_org_flag

    corpus.messages("org-a", "c1", ["refund please"])
    set_org_flag(corpus.url, "org-a", MODULE_FLAG, False)
    code, out = await go_search(search_port, "org-a", "refund")
    assert code == 0, out
    assert "mode SEARCH_MODE_FTS" in out and "degraded: DEGRADATION_REASON_SEMANTIC_DISABLED" in out
    assert "HIT_KIND_MESSAGE c1" in out
    code, out = await go_search(search_port, "org-a", "   ")
    assert code == 1 and "InvalidArgument" in out and "query is empty" in out
    code, out = await go_search(search_port, "org-a", "refund", token="wrong")
    assert code == 1 and "Unauthenticated" in out


async def test_go_client_reads_highlights_context_and_sorts_newest(corpus, search_port):
    from datetime import timedelta

    from dwsearch_testkit.seed import T0

    corpus.messages("org-a", "c1", ["hi there", "😀 退款 Refund please", "ok done"])
    corpus.window("org-a", "c2", ["refund later"], start=T0 + timedelta(days=1))
    code, out = await go_search(search_port, "org-a", "refund", TOKEN, "-context", "1", "-newest")
    assert code == 0, out
    assert "2 hits" in out
    assert out.index("HIT_KIND_WINDOW c2") < out.index("HIT_KIND_MESSAGE c1")  # newest first
    assert "highlights: [Refund]" in out  # code-point offsets, read as runes
    assert "before 2026-11-01T09:00:00Z: hi there" in out and "after 2026-11-01T09:02:00Z: ok done" in out


async def test_go_client_reads_typo_corrections(corpus, search_port):
    corpus.messages("org-a", "c1", ["the refund is late"])
    code, out = await go_search(search_port, "org-a", "refnud")
    assert code == 0, out
    assert "typo: refnud -> refund" in out and "HIT_KIND_MESSAGE c1" in out
