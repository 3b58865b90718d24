"""The REST port's limits against abuse: the largest dimension the config accepts is stored,
bodies cost a bounded multiple of their size (a large upsert's too), vector checks run off the event loop, and a
token never learns which other index names exist."""

from __future__ import annotations

import json
import random
import threading
import tracemalloc

import httpx
import numpy as np
import pytest
from rest_api import rest_api

from dwsearch.redaction import REDACTION_OFF
from dwsearch.rest import jsonbody, upstash
from dwsearch.rest.indexfile import MAX_DIMENSION, parse_indexes
from dwsearch.rest.server import RestServer

WIDE = f"""
[[index]]
name = "cosine"
token = "t-cosine"
dimension = {MAX_DIMENSION}

[[index]]
name = "dot"
token = "t-dot"
dimension = {MAX_DIMENSION}
metric = "DOT_PRODUCT"

[[index]]
name = "euclid"
token = "t-euclid"
dimension = {MAX_DIMENSION}
metric = "EUCLIDEAN"

[[index]]
name = "hybrid"
token = "t-hybrid"
dimension = {MAX_DIMENSION}
type = "HYBRID"
"""


@pytest.fixture
async def wide(pool):
    server = RestServer(rest_api(pool, parse_indexes(WIDE), redaction=REDACTION_OFF), "127.0.0.1", 0)
    await server.start()
    yield f"http://127.0.0.1:{server.port}"
    await server.stop()


async def test_vectors_of_the_largest_dimension_the_config_accepts_are_stored_and_found(wide):
    rng = random.Random(3)
    async with httpx.AsyncClient(base_url=wide, timeout=30) as http:
        for name in ("cosine", "dot", "euclid", "hybrid"):
            auth = {"Authorization": f"Bearer t-{name}"}
            vector = [rng.uniform(-0.01, 0.01) for _ in range(MAX_DIMENSION)]
            item = {"id": "wide", "vector": vector, "metadata": {"note": "x" * 2000}}
            query = {"vector": vector, "topK": 1, "includeVectors": True}
            if name == "hybrid":
                item["sparseVector"] = query["sparseVector"] = {"indices": [3], "values": [1.0]}
            r = await http.post("/upsert", headers=auth, json=[item])
            assert r.status_code == 200, (name, r.text)  # was 500: "row is too big" above ~4,070
            (hit,) = (await http.post("/query", headers=auth, json=query)).json()["result"]
            assert hit["id"] == "wide", name
            assert hit["vector"] == [float(str(np.float32(v))) for v in vector], (
                name
            )  # float32, shortest form
            await http.post("/reset", headers=auth)


async def test_a_body_of_millions_of_empty_objects_is_refused_before_it_is_parsed(wide):
    body = b"[" + b"{}," * (3 * 1024 * 1024) + b"{}]"  # 9 MiB, 3 million objects
    async with httpx.AsyncClient(base_url=wide, timeout=60) as http:
        tracemalloc.start()
        try:
            r = await http.post("/query", headers={"Authorization": "Bearer t-cosine"}, content=body)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert r.status_code == 400 and "JSON objects and arrays" in r.json()["error"], r.text
    assert peak < 4 * len(body)  # parsed, they cost 26 times the body (240 MiB here)


async def test_a_large_upsert_peaks_at_a_small_multiple_of_its_body(wide):
    """Its vectors never become Python floats (32 bytes a number, 4 times the JSON's 8
    characters): they are read as float64 arrays as the body is parsed (dwsearch.rest.jsonbody),
    stored as float32, and each row's Vector made only as it is sent. This 7 MB body peaked
    at 6.7 times its size before (traced; bench.rest's 82 MB one at 10 times in RSS), 2.2 now."""
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((60, MAX_DIMENSION)).round(3)
    body = json.dumps(
        [{"id": f"w{i}", "vector": v.tolist(), "metadata": {"i": i}} for i, v in enumerate(vectors)]
    ).encode()
    async with httpx.AsyncClient(base_url=wide, timeout=120) as http:
        auth = {"Authorization": "Bearer t-cosine", "Content-Type": "application/json"}
        tracemalloc.start()
        try:
            r = await http.post("/upsert", headers=auth, content=body)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert r.status_code == 200, r.text
        fetched = await http.post("/fetch", headers=auth, json={"ids": ["w0", "w59"], "includeVectors": True})
        await http.post("/reset", headers=auth)
    stored = [hit["vector"] for hit in fetched.json()["result"]]
    assert stored == [[float(str(np.float32(v))) for v in vectors[i]] for i in (0, 59)]
    assert peak < 3 * len(body), (peak / len(body), len(body))


async def test_an_upserts_vector_checks_run_in_the_cpu_pool_not_on_the_event_loop(pool, monkeypatch):
    threads: set[str] = set()
    checked, vectors, numbers = upstash.RestIndex._checked, upstash.RestIndex.vectors, jsonbody.numbers

    def spy(values, where, dimension):
        threads.add(threading.current_thread().name)
        return checked(values, where, dimension)

    def vectors_spy(self, item, where, dimension):
        threads.add(threading.current_thread().name)
        return vectors(self, item, where, dimension)

    def numbers_spy(values):
        threads.add(threading.current_thread().name)
        return numbers(values)

    monkeypatch.setattr(upstash.RestIndex, "_checked", staticmethod(spy))
    # An upsert's vectors are read as arrays as the body is parsed (jsonbody), then checked.
    monkeypatch.setattr(upstash.RestIndex, "vectors", vectors_spy)
    monkeypatch.setattr(jsonbody, "numbers", numbers_spy)
    indexes = parse_indexes('[[index]]\nname = "big"\ntoken = "t-big"\ndimension = 4000\n')
    server = RestServer(rest_api(pool, indexes, redaction=REDACTION_OFF), "127.0.0.1", 0)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=30) as http:
            auth = {"Authorization": "Bearer t-big"}
            items = [{"id": f"v{i}", "vector": [0.001 * (i + 1)] * 4000} for i in range(20)]
            assert (await http.post("/upsert", headers=auth, json=items)).status_code == 200
            assert threads and threading.main_thread().name not in threads, threads
            threads.clear()  # one query's vector (4,000 numbers, about a millisecond) is checked inline
            assert (
                await http.post("/query", headers=auth, json={"vector": [0.5] * 4000, "topK": 1})
            ).status_code == 200
            assert threads == {threading.main_thread().name}
            await http.post("/reset", headers=auth)
    finally:
        await server.stop()


async def test_a_token_cannot_tell_another_index_from_no_index(rest_url):
    async with httpx.AsyncClient(base_url=rest_url) as http:
        auth = {"Authorization": "Bearer dense-token"}
        other = await http.post("/sparse/info", headers=auth)  # an index that exists
        none = await http.post("/no-such-index/info", headers=auth)
        assert other.status_code == none.status_code == 404
        assert other.json()["error"].replace("sparse", "X") == none.json()["error"].replace(
            "no-such-index", "X"
        )
        own = await http.post("/dense/info", headers=auth)
        assert own.status_code == 200
