"""Resumable queries keep only what a query reads, bounded in bytes per index and per process."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from rest_api import rest_api

from dwsearch.common.errors import ResourceExhausted
from dwsearch.redaction import REDACTION_OFF
from dwsearch.rest.indexfile import parse_indexes
from dwsearch.rest.resumable import OPEN_QUERY_BYTES, ResumableBudget, ResumableQueries
from dwsearch.rest.server import RestServer

from .conftest import INDEXES


class Recorder:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, namespace: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        self.bodies.append(body)
        return [{"id": str(i), "score": 1 - i / 100} for i in range(min(int(body.get("topK", 10)), 50))]


async def test_an_open_query_keeps_the_query_fields_alone_with_its_vectors_packed():
    run = Recorder()
    queries = ResumableQueries(run)
    body = {
        "vector": [0.25] * 1000,
        "sparseVector": {"indices": [1, 7], "values": [0.5, 2.0]},
        "topK": 2,
        "includeMetadata": True,
        "filter": "a = 1",
        "junk": "x" * 900_000,  # unknown fields are not kept
        "maxIdle": 60,
    }
    started = await queries.start("ns", body)
    assert queries.kept_bytes == OPEN_QUERY_BYTES + 8 * 1000 + 16 * 2 + len("a = 1")
    page = await queries.next(started["uuid"], 3)
    assert [hit["id"] for hit in page] == ["2", "3", "4"]
    again = run.bodies[-1]
    assert again == {
        "vector": [0.25] * 1000, "sparseVector": {"indices": [1, 7], "values": [0.5, 2.0]}, "topK": 5,
        "includeMetadata": True, "filter": "a = 1",
    }  # fmt: skip
    queries.end(started["uuid"])
    assert queries.kept_bytes == 0


async def test_bytes_are_bounded_per_index_and_per_process_and_given_back_on_end_and_expiry():
    now = [0.0]
    budget = ResumableBudget(limit=3 * (OPEN_QUERY_BYTES + 8000))
    one = ResumableQueries(
        Recorder(), max_bytes=2 * (OPEN_QUERY_BYTES + 8000), budget=budget, clock=lambda: now[0]
    )
    two = ResumableQueries(Recorder(), budget=budget, clock=lambda: now[0])
    body = {"vector": [1.0] * 1000, "topK": 1, "maxIdle": 10}
    a = await one.start("", body)
    await one.start("", body)
    with pytest.raises(ResourceExhausted, match="this index"):
        await one.start("", body)  # the index's bound
    await two.start("", body)
    with pytest.raises(ResourceExhausted, match="keep"):
        await two.start("", body)  # the process's budget, shared with the other index
    one.end(a["uuid"])
    await two.start("", body)  # its bytes given back
    assert budget.used == 3 * (OPEN_QUERY_BYTES + 8000)
    now[0] = 11.0  # idle past maxIdle: expired, bytes given back (the other index's too)
    await one.start("", body)
    await one.start("", body)
    assert one.kept_bytes == 2 * (OPEN_QUERY_BYTES + 8000) and two.kept_bytes == 0


async def test_the_rest_port_keeps_a_megabyte_query_body_in_a_few_kilobytes(pool):
    api = rest_api(pool, parse_indexes(INDEXES), redaction=REDACTION_OFF)
    server = RestServer(api, "127.0.0.1", 0)
    await server.start()
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{server.port}", headers={"Authorization": "Bearer dense-token"}
        ) as client:
            await client.post("/upsert", json=[{"id": "a", "vector": [0.6, 0.8]}])
            body = {"vector": [0.6, 0.8], "topK": 1, "maxIdle": 600, "padding": "x" * 1_000_000}
            started = (await client.post("/resumable-query", json=body)).json()["result"]
            assert [hit["id"] for hit in started["scores"]] == ["a"]
            assert api.resumable_budget.used == OPEN_QUERY_BYTES + 16  # was the whole request
            end = await client.post("/resumable-query-end", json={"uuid": started["uuid"]})
            assert end.status_code == 200 and api.resumable_budget.used == 0
            await client.post("/reset")
    finally:
        await server.stop()
