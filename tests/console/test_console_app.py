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
from dwsearch.console.server import console_server, loopback_target
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
        "sweep-status": Scope.ADMIN,
        "retry-poison": Scope.ADMIN,
    }


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


def test_console_server_settings():
    assert console_server(ServerConfig(), None, Tokens()) is None  # type: ignore[arg-type]
    with pytest.raises(StartupError, match="fixed port"):
        console_server(ServerConfig(console_port=8090, listen_addr="127.0.0.1:0"), None, Tokens())  # type: ignore[arg-type]
    with pytest.raises(StartupError, match="TLS"):
        console_server(ServerConfig(console_port=8090, tls_cert="c.pem"), None, Tokens())  # type: ignore[arg-type]


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
