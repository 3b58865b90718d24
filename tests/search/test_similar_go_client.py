"""The Go stubs against a real SearchService: the Go client check program
(go/cmd/dwsearch-client-check, built by `bash go/stubs.sh check`) calls Similar with the
bearer token and reads the hits, the conversation and the explanation through Go's
generated code."""

import asyncio
import os
from datetime import timedelta
from pathlib import Path

import pytest

from dwsearch.flags import MODULE_FLAG
from dwsearch_testkit.fakes import FAKE_MODEL
from dwsearch_testkit.seed import T0, set_org_flag

GO_CLIENT = Path(__file__).resolve().parents[2] / "gen" / "go" / "bin" / "dwsearch-client-check"
TOKEN = "go-similar-token"

pytestmark = pytest.mark.skipif(
    not GO_CLIENT.exists(), reason="no Go client: run `bash go/stubs.sh check` (CI's .ci/deploy-checks does)"
)


async def go_client(port: int, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        str(GO_CLIENT), "-addr", f"127.0.0.1:{port}", "-org", "org-a", *args,
        env={**os.environ, "DWSEARCH_AUTH_TOKEN": TOKEN},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode or 0, out.decode()


@pytest.fixture
async def port(make_searcher, serve_search):
    return (await serve_search(make_searcher(), auth_token=TOKEN)).port


async def test_go_client_calls_similar_and_reads_the_hits(corpus, port):
    anchor, _ = corpus.window("org-a", "c1", ["where is my parcel", "order 5521"])
    corpus.window("org-a", "c2", ["where is my parcel", "order 5521"], start=T0 + timedelta(days=1))
    code, out = await go_client(port, "-similar-window", anchor, "-explain")
    assert code == 0, out
    assert "Search Similar" in out  # the service's RPCs, from the Go descriptor
    assert "similar in org-a: conversation whatsapp c1 2026-11-01T09:00:00Z..2026-11-01T09:01:00Z" in out
    assert f'model "{FAKE_MODEL}"' in out and "1 hits" in out
    assert "1. HIT_KIND_WINDOW c2" in out and "where is my parcel / order 5521" in out
    assert f"explain: fused 2.000000 = dense:{FAKE_MODEL} #1" in out
    assert "stage conversation:" in out and f"stage dense:{FAKE_MODEL}:" in out

    [live] = corpus.messages("org-a", "live", ["where is my parcel"], start=T0 + timedelta(days=2))
    code, out = await go_client(port, "-similar-message", live)
    assert code == 0, out
    assert f"embedded now [{FAKE_MODEL}]" in out and "2 hits" in out and "explain:" not in out

    code, out = await go_client(port, "-similar-message", "not-a-uuid")
    assert code == 1 and "InvalidArgument" in out and "not a dw_chat_events id" in out
    code, out = await go_client(port, "-similar-window", "00000000-0000-4000-8000-000000000000")
    assert code == 1 and "NotFound" in out


async def test_go_client_sees_similar_refused_when_the_flags_are_off(corpus, port):
    anchor, _ = corpus.window("org-a", "c1", ["where is my parcel"])
    set_org_flag(corpus.url, "org-a", MODULE_FLAG, False)
    code, out = await go_client(port, "-similar-window", anchor)
    assert code == 1 and "FailedPrecondition" in out and "org flag digital_worker is off" in out
