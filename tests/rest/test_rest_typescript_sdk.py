"""The official TypeScript SDK (@upstash/vector, pinned in tests/sdk-ts/package.json and
installed by `make venv` with `npm ci`) against a real `dwsearch serve --rest-port`: the
tests in tests/sdk-ts/sdk.test.mjs run under Node's own test runner."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

import pytest

from dwsearch_testkit.fakes import FAKE_MODEL
from dwsearch_testkit.net import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SDK_TESTS = Path(__file__).resolve().parents[1] / "sdk-ts"

INDEXES = """
[[index]]
name = "dense"
token = "t-dense"
dimension = 2
metric = "COSINE"

[[index]]
name = "dot"
token = "t-dot"
dimension = 3
metric = "DOT_PRODUCT"

[[index]]
name = "euclid"
token = "t-euclid"
dimension = 2
metric = "EUCLIDEAN"

[[index]]
name = "sparse"
token = "t-sparse"
type = "SPARSE"

[[index]]
name = "hybrid"
token = "t-hybrid"
dimension = 2
type = "HYBRID"

[[index]]
name = "docs"
token = "t-docs"
dense_model = "default"
"""


async def wait_listening(port: int, proc: asyncio.subprocess.Process, timeout: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if proc.returncode is not None or asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_the_official_typescript_sdk_over_every_endpoint_index_type_and_metric(
    db_url, fake_embedder, tmp_path
):
    node = shutil.which("node")
    assert node, "Node.js 20 is on every machine of this project (the TypeScript SDK's tests need it)"
    assert (SDK_TESTS / "node_modules" / "@upstash" / "vector").is_dir(), (
        "tests/sdk-ts/node_modules is missing: `make venv` installs it (npm ci)"
    )
    indexes = tmp_path / "indexes.toml"
    indexes.write_text(INDEXES)
    rest_port = free_port()
    env = {
        **os.environ,
        "DWSEARCH_DATABASE_URL": db_url,
        "DWSEARCH_LISTEN_ADDR": f"127.0.0.1:{free_port()}",
        "DWSEARCH_REST_INDEXES": str(indexes),
        "DWSEARCH_REST_HOST": "127.0.0.1",
        "DWSEARCH_EMBEDDER_ADDR": fake_embedder.address,
        "DWSEARCH_EMBED_MODEL": FAKE_MODEL,
    }
    log = (tmp_path / "serve.log").open("wb")
    serve = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dwsearch.cli", "serve", "--log-format", "text", "--rest-port", str(rest_port),
        env=env, stdout=log, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        await wait_listening(rest_port, serve)
        sdk = await asyncio.create_subprocess_exec(
            node, "--test", "--test-reporter=spec", "--test-concurrency=1", "sdk.test.mjs",
            cwd=SDK_TESTS, env={**os.environ, "DWS_REST": f"http://127.0.0.1:{rest_port}"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(sdk.communicate(), 150)
        report = out.decode(errors="replace")
        assert sdk.returncode == 0, (
            report + "\n--- serve log ---\n" + (tmp_path / "serve.log").read_text()[-4000:]
        )
        assert "ℹ fail 0" in report and "ℹ pass 13" in report, report
    finally:
        if serve.returncode is None:
            serve.terminate()
            await asyncio.wait_for(serve.wait(), 30)
        log.close()
