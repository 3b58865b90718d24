"""`dwsearch serve --rest-port`: the REST API beside gRPC in one process; SIGTERM stops both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from upstash_vector import Index

from dwsearch_testkit.net import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_serve_rest_port_with_the_sdk(db_url, tmp_path):
    indexes = tmp_path / "indexes.toml"
    indexes.write_text('[[index]]\nname = "support"\ntoken = "t1"\ndimension = 2\n')
    rest_port = free_port()
    env = {
        **os.environ,
        "DWSEARCH_DATABASE_URL": db_url,
        "DWSEARCH_LISTEN_ADDR": f"127.0.0.1:{free_port()}",
        "DWSEARCH_REST_INDEXES": str(indexes),
        "DWSEARCH_REST_HOST": "127.0.0.1",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "dwsearch.cli", "serve", "--log-format", "text", "--rest-port", str(rest_port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        index = Index(url=f"http://127.0.0.1:{rest_port}/support", token="t1", retries=0)
        deadline = time.monotonic() + 60
        while True:
            try:
                assert index.info().vector_count == 0
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        index.upsert(vectors=[("a", [0.6, 0.8], {"k": "v"})])
        (hit,) = index.query(vector=[0.6, 0.8], top_k=1, include_metadata=True)
        assert hit.id == "a" and hit.metadata == {"k": "v"} and hit.score == pytest.approx(1.0, abs=1e-3)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_rest_port_without_indexes_says_what_to_set(db_url):
    env = {**os.environ, "DWSEARCH_DATABASE_URL": db_url, "DWSEARCH_LISTEN_ADDR": f"127.0.0.1:{free_port()}"}
    env.pop("DWSEARCH_REST_INDEXES", None)
    proc = subprocess.run(
        [sys.executable, "-m", "dwsearch.cli", "serve", "--rest-port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0 and "DWSEARCH_REST_INDEXES" in proc.stderr
