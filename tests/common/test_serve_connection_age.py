"""serve closes client connections after DWSEARCH_MAX_CONNECTION_AGE_SECONDS (so Go clients
balancing with dns:/// + round_robin reach new pods) without cutting a Sweep short, and
reports its database pool as dwsearch_db_pool_connections."""

from __future__ import annotations

import grpc
from prometheus_client import REGISTRY

from dwsearch import serve
from dwsearch.common.config import ServerConfig
from dwsearch.common.metrics import watch_pool


def _options(monkeypatch, config: ServerConfig) -> dict[str, int]:
    seen: dict[str, int] = {}
    real = grpc.aio.server

    def spy(*args, options=(), **kwargs):
        seen.update(dict(options))
        return real(*args, options=options, **kwargs)

    monkeypatch.setattr(grpc.aio, "server", spy)
    serve.grpc_host(config, [], address="127.0.0.1:0")
    return seen


async def test_serve_sets_a_max_connection_age_with_a_grace_longer_than_a_sweep(
    monkeypatch,
):  # a loop for grpc.aio
    options = _options(monkeypatch, ServerConfig())
    assert options["grpc.max_connection_age_ms"] == 300_000
    # The sweep CronJob's CLI deadline is 540 s: a connection's age must never end a Sweep.
    assert options["grpc.max_connection_age_grace_ms"] >= 540_000


async def test_max_connection_age_zero_turns_it_off(monkeypatch):
    options = _options(monkeypatch, ServerConfig(max_connection_age_seconds=0))
    assert "grpc.max_connection_age_ms" not in options


def test_pool_gauges_read_the_pool_when_scraped():
    class Pool:
        def __init__(self) -> None:
            self.stats = {"pool_size": 4, "pool_available": 1, "requests_waiting": 2, "pool_max": 10}

        def get_stats(self) -> dict[str, int]:
            return dict(self.stats)

    pool = Pool()
    watch_pool(pool)

    def value(state: str) -> float | None:
        return REGISTRY.get_sample_value("dwsearch_db_pool_connections", {"state": state})

    assert [value(s) for s in ("size", "available", "waiting", "max")] == [4, 1, 2, 10]
    pool.stats["requests_waiting"] = 0
    assert value("waiting") == 0
