"""`dwsearch dev --rest-port` passes the port (and the stack's host) to its server process."""

from __future__ import annotations

from dwsearch import stack
from dwsearch.common.config import StackConfig


def test_dev_passes_rest_port_to_serve(monkeypatch, tmp_path):
    started: list[list[str]] = []

    class Popen:
        def __init__(self, argv, **kwargs):
            started.append(list(argv))

    monkeypatch.setattr(stack, "database_url", lambda url, data_dir: "postgresql://x")
    monkeypatch.setattr(stack, "migrate", lambda url, dev_schema: [])
    monkeypatch.setattr(stack.subprocess, "Popen", Popen)
    monkeypatch.setattr(stack.LocalStack, "_wait_until_serving", lambda self: None)
    for rest_port, expected in ((8080, ["--rest-port", "8080", "--rest-host", "127.0.0.1"]), (0, [])):
        started.clear()
        stack.LocalStack(StackConfig(data_dir=tmp_path, rest_port=rest_port)).start()
        (serve,) = [argv for argv in started if "serve" in argv]
        tail = serve[serve.index("--embed-timeout-ms") + 2 :]
        assert tail == expected
