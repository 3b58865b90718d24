"""The console in a real browser against a real `dwsearch serve` and a real embedder
process: `dwsearch embedder` serving the offline multilingual model (USE multilingual v3,
int8 ONNX, the dev default), the chat swept by it. A Chinese question that shares no word
with the conversation (full text cannot split Chinese anyway) finds the Chinese
conversation by meaning, and the explanation names the real model's dense leg."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta

import grpc
import httpx
import pytest

from dwsearch.v1 import sweep_pb2, sweep_pb2_grpc
from dwsearch_testkit.seed import T0, enable_semantic_search, insert_events

from .test_console_browser import (
    ADMIN_TOKEN,
    BROWSER_ARGS,
    CHROMIUM,
    SEARCH_TOKEN,
    Watched,
    console_db,  # noqa: F401  (the module's schema fixture)
    free_port,
    open_page,
    require_browser,
    search,
    submit,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MODEL = "use-multilingual-v3"
ORG = "org-real"
CONVERSATIONS = {
    "c-zh": ["你好，我的包裹三天前就发货了", "可是到现在还没有收到，快递到底在哪里？"],
    "c-en": ["I forgot my password and cannot log in", "the reset email never arrives"],
    "c-ms": ["saya nak minta bayaran balik", "barang yang sampai rosak dan tak boleh guna"],
}


def _wait(what: str, ready, proc: subprocess.Popen[str], log, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{what} did not come up; its log:\n{log.read_text()[-4000:]}")
        time.sleep(0.3)


def _serving(address: str) -> bool:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        with grpc.insecure_channel(address) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
            return response.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


@pytest.fixture(scope="module")
def real_stack(console_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:  # noqa: F811
    require_browser()
    for n, (channel, lines) in enumerate(CONVERSATIONS.items()):
        insert_events(
            console_db,
            [
                (ORG, "whatsapp", channel, line, T0 + timedelta(hours=n, minutes=i))
                for i, line in enumerate(lines)
            ],
        )
    enable_semantic_search(console_db, ORG)
    tmp = tmp_path_factory.mktemp("console-real")
    embedder_port, grpc_port, console_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "DWSEARCH_AUTH_TOKEN"}
    env |= {"DWSEARCH_DATABASE_URL": console_db, "HF_HUB_OFFLINE": "1", "DWSEARCH_THREADS": "1",
            "DWSEARCH_HEALTH_PORT": "0", "DWSEARCH_METRICS_PORT": "0"}  # fmt: skip
    cli = [sys.executable, "-m", "dwsearch.cli"]
    embedder_log, serve_log = tmp / "embedder.log", tmp / "serve.log"
    with embedder_log.open("w") as out:
        embedder = subprocess.Popen(
            [*cli, "embedder", "--embed-backend", "use", "--embed-model", MODEL,
             "--listen-addr", f"127.0.0.1:{embedder_port}"],
            env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    serve = None
    try:
        _wait("the embedder", lambda: _serving(f"127.0.0.1:{embedder_port}"), embedder, embedder_log)
        with serve_log.open("w") as out:
            serve = subprocess.Popen(
                [*cli, "serve", "--log-format", "text"],
                env=env | {
                    "DWSEARCH_LISTEN_ADDR": f"127.0.0.1:{grpc_port}",
                    "DWSEARCH_EMBEDDER_ADDR": f"127.0.0.1:{embedder_port}",
                    "DWSEARCH_EMBED_MODEL": MODEL,
                    "DWSEARCH_CONSOLE_PORT": str(console_port),
                    "DWSEARCH_SEARCH_TOKENS": SEARCH_TOKEN,
                    "DWSEARCH_ADMIN_TOKENS": ADMIN_TOKEN,
                },
                stdout=out, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
        url = f"http://127.0.0.1:{console_port}"

        def console_up() -> bool:
            try:
                return httpx.get(f"{url}/search", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        _wait("serve --console-port", console_up, serve, serve_log)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            progress = list(
                sweep_pb2_grpc.SweepServiceStub(channel).Sweep(
                    sweep_pb2.SweepRequest(org_id=ORG),
                    metadata=[("authorization", f"Bearer {ADMIN_TOKEN}")],
                    timeout=120,
                )
            )
        last = progress[-1] if progress else None
        assert last is not None and last.windows_embedded == len(CONVERSATIONS), last
        yield url
    finally:
        for proc in (serve, embedder):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()


@pytest.fixture(scope="module")
def real_browser(real_stack: str) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def test_a_chinese_question_finds_the_chinese_conversation_by_the_real_model(
    real_stack, real_browser, tmp_path
):
    context = real_browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    watched = Watched(context.new_page())
    watched.page.on("pageerror", lambda error: watched.errors.append(str(error)))

    class Stack:  # what open_page reads of a ConsoleStack
        url = real_stack

    try:
        page = open_page(watched, Stack, "search", SEARCH_TOKEN)  # type: ignore[arg-type]
        search(page, ORG, "我的快递什么时候能送到")
        assert not page.is_visible("#error"), page.text_content("#error")
        assert not page.is_visible("#banner") or not page.text_content("#banner"), page.text_content(
            "#banner"
        )
        first = page.locator(".hit").first
        assert "包裹" in (first.locator(".text").text_content() or "")
        first.locator("details.explanation summary").click()
        legs = [
            row.locator("td").all_text_contents()[0] for row in first.locator("table.legs tbody tr").all()
        ]
        assert f"dense:{MODEL}" in legs, legs
        page.screenshot(path=str(tmp_path / "search-real-model.png"), full_page=True)
        assert not watched.errors
    finally:
        context.close()


def test_the_models_page_shows_the_real_embedders_runtime_cpu_class_and_deadline(real_stack, real_browser):
    context = real_browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    watched = Watched(context.new_page())

    class Stack:
        url = real_stack

    try:
        page = open_page(watched, Stack, "models", SEARCH_TOKEN)  # type: ignore[arg-type]
        submit(page, "#models-form")
        rows = dict(
            row.locator("td").all_text_contents()
            for row in page.locator("section.model").first.locator("tbody tr").all()
        )
        assert rows["model_id"] == MODEL
        assert rows["cpu_class"] and rows["quantization"] and rows["runtime"], rows
        assert rows["embed_deadline_ms"], rows  # serve's deadline, beside the measured query latency
        assert rows["queued_interactive"] == rows["queued_bulk"] == "0", rows  # each lane's queue
    finally:
        context.close()
