"""The console without a browser: its pages and headers, its API's refusals before any
call, the RPCs it may forward (each one serve polices), its wiring into serve and dev."""

from __future__ import annotations

import re

import pytest
from starlette.testclient import TestClient

from dwsearch import stack
from dwsearch.common.config import ServerConfig, StackConfig
from dwsearch.common.errors import StartupError
from dwsearch.common.rpcpolicy import Scope, Tokens
from dwsearch.console.app import CALLS, CSP, Console
from dwsearch.console.pages import PAGES, render
from dwsearch.console.server import console_app, loopback_target
from dwsearch.serve import method_policies


@pytest.fixture
def client():
    console = Console(pool=None, tokens=Tokens.from_settings(search="s1", admin="a1"), target="127.0.0.1:1")  # type: ignore[arg-type]
    with TestClient(console.app()) as c:
        yield c


@pytest.mark.parametrize("name", sorted(PAGES))
def test_pages_hold_no_inline_script_or_style(client, name):
    response = client.get(f"/{name}")
    assert response.status_code == 200
    assert response.headers["content-security-policy"] == CSP
    html = response.text
    # Scripts only by src, from this origin; no style attributes or elements; no handlers.
    assert re.findall(r"<script[^>]*>", html) == ['<script type="module" src="/static/console.js">']
    assert "<style" not in html and "style=" not in html and not re.search(r"\son\w+=", html)
    assert "http://" not in html and "https://" not in html  # no third-party assets


def test_csp_forbids_inline_and_foreign_sources():
    directives = dict(d.strip().split(" ", 1) for d in CSP.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["connect-src"] == "'self'" and directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in CSP


def test_static_files_and_their_headers(client):
    for path, kind in (("/static/console.js", "javascript"), ("/static/console.css", "css")):
        response = client.get(path)
        assert response.status_code == 200 and kind in response.headers["content-type"]
        assert response.headers["content-security-policy"] == CSP
        assert response.headers["x-content-type-options"] == "nosniff"


def test_the_models_call_names_searchs_fusion_profile():
    fusion = {"profile": "use-multilingual-v3", "method": "weighted", "lexical_leg": "on"}
    console = Console(
        pool=None, tokens=Tokens.from_settings(search="s1"), target="127.0.0.1:1", fusion=fusion
    )  # type: ignore[arg-type]
    with TestClient(console.app()) as c:
        answer = c.post("/api/models", headers={"Authorization": "Bearer s1"})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["fusion"] == fusion and body["embedder"] == {"error": "no embedder configured"}


def test_api_refusals_before_any_call(client):
    assert client.post("/api/orgs").status_code == 401
    assert client.post("/api/models").status_code == 401
    assert client.post("/api/orgs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    unknown = client.post("/api/purge", headers={"Authorization": "Bearer a1"}, content=b"{}")
    assert unknown.status_code == 404 and "no such call" in unknown.json()["error"]
    bad = client.post("/api/search", headers={"Authorization": "Bearer a1"}, content=b"{not json")
    assert bad.status_code == 400
    wrong_field = client.post("/api/search", json={"no_such_field": 1})
    assert wrong_field.status_code == 400 and "no_such_field" in wrong_field.json()["error"]
    assert client.get("/api/search").status_code == 405
    # a body over the cap: 413 by its Content-Length, unread, with the HTTP ports' one message
    from dwsearch.console.app import MAX_BODY_BYTES

    large = client.post(
        "/api/search", headers={"Authorization": "Bearer a1"}, content=b" " * (MAX_BODY_BYTES + 1)
    )
    assert large.status_code == 413 and f"the limit is {MAX_BODY_BYTES}" in large.json()["error"]
    # an org's flags: admin scope, a well-formed org id (no database reached here)
    assert client.post("/api/flags", json={"org_id": "o"}).status_code == 401
    refused = client.post("/api/flags", headers={"Authorization": "Bearer s1"}, json={"org_id": "o"})
    assert refused.status_code == 403 and "admin scope" in refused.json()["error"]
    for body in ({}, {"org_id": ""}, {"org_id": 5}, {"org_id": "x" * 257}):
        bad_org = client.post("/api/flags", headers={"Authorization": "Bearer a1"}, json=body)
        assert bad_org.status_code == 400 and "org_id" in bad_org.json()["error"], body


def test_every_forwarded_call_is_a_policed_method():
    policies = method_policies(ServerConfig())
    scopes = {name: policies[call.method].scope for name, call in CALLS.items()}
    assert scopes == {
        "search": Scope.SEARCH,
        "index-query": Scope.SEARCH,
        "agent-context": Scope.SEARCH,
        "index-info": Scope.SEARCH,
        "sweep-status": Scope.ADMIN,
        "retry-poison": Scope.ADMIN,
        "list-gaps": Scope.ADMIN,
        "forget-gaps": Scope.ADMIN,
    }


def test_the_console_opens_on_the_overview(client):
    response = client.get("/", follow_redirects=False)
    assert response.status_code in (302, 307) and response.headers["location"] == "/overview"
    assert next(iter(PAGES)) == "overview"
    assert 'aria-current="page">Overview</a>' in client.get("/overview").text


def test_auth_says_the_scope_of_the_token_sent(client):
    """/api/auth answers 200 whatever the token: a page asks only for what it may read."""
    assert client.post("/api/auth").json() == {"required": True, "scope": None}
    assert client.post("/api/auth", headers={"Authorization": "Bearer wrong"}).json()["scope"] is None
    assert client.post("/api/auth", headers={"Authorization": "Bearer s1"}).json()["scope"] == "search"
    assert client.post("/api/auth", headers={"Authorization": "Bearer a1"}).json()["scope"] == "admin"
    open_console = Console(pool=None, tokens=Tokens(), target="127.0.0.1:1")  # type: ignore[arg-type]
    with TestClient(open_console.app()) as c:
        assert c.post("/api/auth").json() == {"required": False, "scope": "admin"}


def test_overview_and_org_figures_refusals(client):
    assert client.post("/api/overview").status_code == 401
    assert client.post("/api/org-figures").status_code == 401
    refused = client.post("/api/org-figures", headers={"Authorization": "Bearer s1"}, json={})
    assert refused.status_code == 403 and "admin scope" in refused.json()["error"]
    admin = {"Authorization": "Bearer a1"}
    for body in (
        {"limit": 0},
        {"limit": 101},
        {"limit": "5"},
        {"limit": True},
        {"query": 5},
        {"after": "x" * 257},
    ):
        bad = client.post("/api/org-figures", headers=admin, json=body)
        assert bad.status_code == 400, body
    assert client.post("/api/org-figures", headers=admin, content=b"[1]").status_code == 400
    assert client.post("/api/org-figures", headers=admin, content=b"{no").status_code == 400


def test_overview_answers_serves_recent_figures(client):
    """A search scope token reads the history: its points, and the interval under way."""
    from dwsearch.common import metrics

    metrics.observe_rpc("dwsearch.v1.SearchService", "Search", "OK", 0.004)
    response = client.post("/api/overview", headers={"Authorization": "Bearer s1"})
    assert response.status_code == 200
    body = response.json()
    assert body["interval_s"] == 10.0 and body["points"] == []
    assert body["current"]["searches"] >= 1 and body["current"]["search_p50_ms"] > 0


def test_render_escapes_what_it_is_given():
    page = PAGES["search"]
    hostile = type(page)(name="x", title="<script>alert(1)</script>", form="")
    assert "<script>alert(1)" not in render(hostile) and "&lt;script&gt;" in render(hostile)


@pytest.mark.parametrize(
    ("listen", "target"),
    [
        ("[::]:50051", "127.0.0.1:50051"),
        ("0.0.0.0:7", "127.0.0.1:7"),
        ("127.0.0.1:9", "127.0.0.1:9"),
        ("[::1]:9", "[::1]:9"),
        ("unix:/tmp/s.sock", "unix:/tmp/s.sock"),
    ],
)
def test_loopback_target(listen, target):
    assert loopback_target(listen) == target


def test_console_app_settings():
    assert console_app(ServerConfig(), None, Tokens()) is None  # type: ignore[arg-type]
    with pytest.raises(StartupError, match="fixed port"):
        console_app(ServerConfig(console_port=8090, listen_addr="127.0.0.1:0"), None, Tokens())  # type: ignore[arg-type]
    with pytest.raises(StartupError, match="TLS"):
        console_app(ServerConfig(console_port=8090, tls_cert="c.pem"), None, Tokens())  # type: ignore[arg-type]


def test_dev_serves_the_console_and_prints_its_address(monkeypatch, tmp_path, capsys):
    started: list[list[str]] = []

    class Popen:
        def __init__(self, argv, **kwargs):
            started.append(list(argv))

        def poll(self):
            return None

    monkeypatch.setattr(stack, "database_url", lambda url, data_dir: "postgresql://x")
    monkeypatch.setattr(stack, "migrate", lambda url, dev_schema: [])
    monkeypatch.setattr(stack.subprocess, "Popen", Popen)
    monkeypatch.setattr(stack.LocalStack, "_wait_until_serving", lambda self: None)
    monkeypatch.setattr(stack.Process, "health", lambda self, timeout=1.0: "SERVING")
    monkeypatch.setattr(stack.LocalStack, "wait", lambda self: 0)
    assert stack.run_dev(StackConfig(data_dir=tmp_path)) == 0
    (serve,) = [argv for argv in started if "serve" in argv]
    at = serve.index("--console-port")
    assert serve[at : at + 4] == [
        "--console-port",
        str(stack.DEV_CONSOLE_PORT),
        "--console-host",
        "127.0.0.1",
    ]
    assert f"console    http://127.0.0.1:{stack.DEV_CONSOLE_PORT}/" in capsys.readouterr().out

    started.clear()  # a stack other than dev's (demo) leaves it off unless asked
    stack.LocalStack(StackConfig(data_dir=tmp_path)).start()
    (serve,) = [argv for argv in started if "serve" in argv]
    assert "--console-port" not in serve


def test_the_wheel_ships_the_static_files(tmp_path):
    """The console's script and style are package data: the image's install has them."""
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    build = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)],
        cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"dwsearch/console/static/console.js", "dwsearch/console/static/console.css"} <= names


def test_dev_and_a_kept_demo_serve_the_console_on_8090_or_a_free_port():
    import socket

    from dwsearch.common.config import StackConfig
    from dwsearch.stack import DEV_CONSOLE_PORT, with_console

    assert with_console(StackConfig(console_port=9123)).console_port == 9123
    ours = False
    with socket.socket() as taken:
        try:
            taken.bind(("127.0.0.1", DEV_CONSOLE_PORT))
            taken.listen()
            ours = True
        except OSError:
            pass  # another process has it already: the same case
        port = with_console(StackConfig(host="127.0.0.1")).console_port
        assert port not in (0, DEV_CONSOLE_PORT)
    if ours:
        assert with_console(StackConfig(host="127.0.0.1")).console_port == DEV_CONSOLE_PORT


# --- the Overview's history (dwsearch.console.history) ---


def test_quantile_is_prometheus_histogram_quantile():
    import math

    from dwsearch.console.history import quantile

    buckets = {0.01: 50.0, 0.1: 90.0, 1.0: 100.0, math.inf: 100.0}
    assert quantile(0.5, buckets) == pytest.approx(0.01)  # rank 50: the first bucket's top
    assert quantile(0.7, buckets) == pytest.approx(0.01 + 0.09 * 20 / 40)
    assert quantile(0.99, buckets) == pytest.approx(0.1 + 0.9 * 9 / 10)
    assert quantile(0.99, {0.5: 1.0, math.inf: 10.0}) == 0.5  # in +Inf's bucket: the highest bound
    assert quantile(0.5, {0.5: 0.0, math.inf: 0.0}) is None and quantile(0.5, {}) is None


async def test_history_points_are_what_happened_in_their_interval():
    from dwsearch.common import metrics
    from dwsearch.console.history import History

    now = [1000.0]
    history = History(points=3, clock=lambda: now[0])
    for seconds in (0.002, 0.004, 0.004, 0.2):
        metrics.observe_rpc("dwsearch.v1.SearchService", "Search", "OK", seconds)
    metrics.SEARCH_DEGRADED.labels("embedder_timeout").inc(2)
    metrics.observe_rpc("dwsearch.v1.SweepService", "Sweep", "OK", 3.0)
    metrics.SWEEP_WINDOWS.labels("m", "embedded").inc(5)
    first = await history.sample()
    assert first.time == 1000.0 and first.searches == 4
    assert first.search_p50_ms is not None and 2.5 <= first.search_p50_ms <= 5.0
    assert first.search_p99_ms is not None and 100 <= first.search_p99_ms <= 250
    assert first.degraded == {"embedder_timeout": 2}
    assert first.sweep_runs == {"OK": 1} and first.sweep_windows == {"embedded": 5}
    assert first.embedder_up is None and first.queued_bulk is None  # no embedder to ask
    now[0] = 1010.0
    second = await history.sample()  # nothing since: an empty interval, no latency
    assert second.searches == 0 and second.search_p50_ms is None and second.degraded == {}
    for t in (1020.0, 1030.0, 1040.0):
        now[0] = t
        await history.sample()
    assert [p.time for p in history.points] == [1020.0, 1030.0, 1040.0]  # bounded
    metrics.observe_rpc("dwsearch.v1.SearchService", "Search", "OK", 0.01)
    assert history.as_json()["current"]["searches"] == 1  # the interval under way


async def test_history_asks_the_embedder_for_its_queues(fake_embedder):
    from dwsearch.clients.embedder import EmbedderClient
    from dwsearch.console.history import History

    client = EmbedderClient(fake_embedder.address, timeout=5)
    try:
        point = await History(client).sample()
        assert point.embedder_up is True and point.queued_interactive == 0 and point.queued_bulk == 0
        await fake_embedder.stop()
        down = await History(client).sample()
        assert down.embedder_up is False and down.queued_interactive is None
    finally:
        await client.close()


async def test_an_embedder_down_when_last_asked_is_asked_again_when_a_page_opens(monkeypatch):
    """serve's first point is taken while the embedder still loads its model: the Overview
    opened next must not say "down" for the rest of the interval once it answers."""
    from dwsearch.console.history import History

    answers = iter([(None, False), ((0, 0), True)])
    history = History(object())  # type: ignore[arg-type]  # the embedder is asked through _ask_embedder

    async def ask():
        return next(answers)

    monkeypatch.setattr(history, "_ask_embedder", ask)
    assert (await history.sample()).embedder_up is False
    await history.recheck_embedder()
    assert history.current().embedder_up is True
    await history.recheck_embedder()  # up: not asked again (the next point asks)
    assert history.current().embedder_up is True


# --- the Overview's org figures (dwsearch.console.orgs; read by dwsearch.sweep.overview) ---


def test_org_figures_as_the_overview_shows_them():
    """The share of an org's events found by meaning and its lag: its pending events'
    oldest age, none while the sweep does not embed it (its flags are off)."""
    from datetime import UTC, datetime, timedelta

    from dwsearch.console import orgs
    from dwsearch.sweep.overview import OrgFigures

    t0 = datetime(2026, 11, 1, 9, tzinfo=UTC)
    acme = OrgFigures("acme", True, 1, 4, 2, 2, t0 + timedelta(minutes=2), 1, 1, 2)
    shown = orgs.as_json(acme, t0 + timedelta(minutes=12))
    assert shown == {
        "org_id": "acme",
        "semantic_search": True,
        "windows_embedded": 1,
        "events": 4,
        "pending_events": 2,
        "searchable_share": 0.5,
        "lag_s": 600.0,
        "stalled_keys": 1,
        "poison_windows": 1,
        "knowledge_gaps": 2,
    }
    assert orgs.as_json(acme, t0)["lag_s"] == 0.0  # a clock behind the events: no lag
    gamma = orgs.as_json(OrgFigures("gamma", False, 0, 1, 0, 1, t0, 0, 0, 0), t0)
    assert gamma["semantic_search"] is False and gamma["lag_s"] is None and gamma["searchable_share"] == 0.0
    empty = orgs.as_json(OrgFigures("new", True, 0, 0, 0, 0, None, 0, 0, 0), t0)
    assert empty["searchable_share"] is None and empty["lag_s"] == 0.0


# --- the Map (dwsearch.console.projection) ---


def test_project_is_pca_deterministic_and_bounded():
    import numpy as np

    from dwsearch.console.projection import project

    rng = np.random.default_rng(7)
    # Two clusters apart along one direction, a little spread along another.
    direction, other = np.zeros(32), np.zeros(32)
    direction[3], other[9] = 1.0, 1.0
    a = 5 * direction + 0.3 * rng.standard_normal((20, 1)) * other + 0.01 * rng.standard_normal((20, 32))
    b = -5 * direction + 0.3 * rng.standard_normal((20, 1)) * other + 0.01 * rng.standard_normal((20, 32))
    vectors = np.vstack([a, b]).astype(np.float32)
    coordinates, explained = project(vectors)
    assert coordinates.shape == (40, 2) and np.abs(coordinates).max() == pytest.approx(1.0)
    # The first axis parts the clusters; it holds most of the variance.
    assert (coordinates[:20, 0] > 0.5).all() and (coordinates[20:, 0] < -0.5).all()
    assert explained[0] > 0.9 and 0 < explained[1] < explained[0]
    again, _ = project(vectors.copy())
    assert np.array_equal(coordinates, again)  # the same rows, the same map
    flipped, _ = project(-vectors)  # a component's sign is fixed by its own coordinates
    assert np.allclose(flipped, -coordinates, atol=1e-6)
    for n in (0, 1):
        few, shares = project(vectors[:n])
        assert few.shape == (n, 2) and not few.any() and shares == [0.0, 0.0]
    same, _ = project(np.ones((5, 32), dtype=np.float32))  # no spread: every point at 0
    assert not same.any()


def test_map_refusals(client):
    assert client.post("/api/map", json={"org_id": "o"}).status_code == 401
    search = {"Authorization": "Bearer s1"}
    for body in (
        {},
        {"org_id": ""},
        {"org_id": 5},
        {"org_id": "x" * 257},
        {"org_id": "o", "limit": 0},
        {"org_id": "o", "limit": 2001},
        {"org_id": "o", "limit": "9"},
        {"namespace": 5},
        {"namespace": "n" * 513},
    ):
        bad = client.post("/api/map", headers=search, json=body)
        assert bad.status_code == 400 and "error" in bad.json(), body
    assert client.post("/api/map", headers=search, content=b"[]").status_code == 400
    # A REST index's namespace is no namespace of the gRPC Index's.
    scoped = client.post("/api/map", headers=search, json={"namespace": "idx\x1fns"})
    assert scoped.status_code == 404


async def test_map_of_an_org_and_of_a_namespace(db_url):
    """An org's windows and a namespace's documents on the read pool: points {id, x, y,
    text, channel, time}, the most recent first, bounded, the same each time, the org's
    alone; an unknown namespace is a 404."""
    from datetime import UTC, datetime, timedelta

    import httpx
    import psycopg
    from pgvector import HalfVector
    from pgvector.psycopg import register_vector

    from dwsearch.console import projection
    from dwsearch.db.pool import open_pool

    t0 = datetime(2026, 11, 1, 9, tzinfo=UTC)

    def vector(i: int) -> HalfVector:
        return HalfVector([float((i * 7 + d) % 5) - 2.0 for d in range(16)])

    with psycopg.connect(db_url, autocommit=True) as conn:
        register_vector(conn)
        for org, n in (("acme", 6), ("beta", 3)):
            for i in range(n):
                conn.execute(
                    """INSERT INTO dw_message_embeddings (org_id, model, provider, external_channel_id,
                           window_start, window_end, embedding, content, source_message_ids)
                       VALUES (%s, 'm', 'web', %s, %s, %s, %s, %s, '{}')""",
                    (
                        org,
                        f"c{i % 2}",
                        t0,
                        t0 + timedelta(minutes=i),
                        vector(i),
                        f"{org} window {i} " + "x" * 400,
                    ),
                )
        conn.execute(  # another model's window: not on the map
            """INSERT INTO dw_message_embeddings (org_id, model, provider, external_channel_id, window_start,
                   window_end, embedding, content, source_message_ids)
               VALUES ('acme', 'other', 'web', 'c0', %s, %s, %s, 'other model', '{}')""",
            (t0, t0 + timedelta(hours=1), vector(9)),
        )
        for i in range(4):
            conn.execute(
                """INSERT INTO dw_index_documents (namespace, id, data, metadata, model, embedding, updated_at)
                   VALUES ('faq', %s, %s, '{"type": "knowledge"}', 'm', %s, %s)""",
                (f"d{i}", f"article {i}", vector(i + 3), t0 + timedelta(minutes=i)),
            )
    pool = await open_pool(db_url, min_size=1, max_size=2)
    console = Console(
        pool=pool, tokens=Tokens.from_settings(search="s1", admin="a1"), target="127.0.0.1:1", model="m"
    )
    transport = httpx.ASGITransport(app=console.app())
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as c:
            search = {"Authorization": "Bearer s1"}
            whole = await c.post("/api/map", headers=search, json={"org_id": "acme"})
            assert whole.status_code == 200, whole.text
            body = whole.json()
            assert body["org_id"] == "acme" and body["model"] == "m" and body["truncated"] is False
            points = body["points"]
            assert [p["text"].split(" x")[0] for p in points] == [
                f"acme window {i}" for i in range(5, -1, -1)
            ]
            assert all(set(p) == {"id", "x", "y", "text", "channel", "time"} for p in points)
            assert all(-1 <= p["x"] <= 1 and -1 <= p["y"] <= 1 for p in points)
            assert len(points[0]["text"]) == projection.SNIPPET_CHARS and points[0]["channel"] == "web/c1"
            assert points[0]["time"].startswith("2026-11-01T09:05")
            assert (await c.post("/api/map", headers=search, json={"org_id": "acme"})).json() == body
            cut = (await c.post("/api/map", headers=search, json={"org_id": "acme", "limit": 4})).json()
            assert cut["truncated"] is True and [p["id"] for p in cut["points"]] == [
                p["id"] for p in points[:4]
            ]
            beta = (await c.post("/api/map", headers=search, json={"org_id": "beta"})).json()["points"]
            assert len(beta) == 3 and not {p["id"] for p in beta} & {p["id"] for p in points}
            assert all(p["text"].startswith("beta") for p in beta)
            nobody = await c.post("/api/map", headers=search, json={"org_id": "nobody"})
            assert nobody.status_code == 200 and nobody.json()["points"] == []
            faq = (await c.post("/api/map", headers=search, json={"namespace": "faq"})).json()
            assert [p["id"] for p in faq["points"]] == ["d3", "d2", "d1", "d0"]
            assert faq["namespace"] == "faq" and faq["points"][0]["channel"] == "knowledge"
            unknown = await c.post("/api/map", headers=search, json={"namespace": "nope"})
            assert unknown.status_code == 404 and "no such namespace" in unknown.json()["error"]
            assert (await c.post("/api/map", json={"org_id": "acme"})).status_code == 401
    finally:
        await pool.close()
