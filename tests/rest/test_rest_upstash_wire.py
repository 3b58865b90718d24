"""The wire as the official SDKs' own suites expect it (upstash/vector-py and
upstash/vector-js, run against this API): what they showed, pinned here."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from upstash_vector.types import QueryMode, SparseVector, Vector

from dwsearch.redaction import REDACTION_OFF

pytestmark = pytest.mark.timeout(60)


async def post(rest_url: str, token: str, path: str, body: object) -> httpx.Response:
    """A raw call (the server runs in this test's event loop: an async client)."""
    async with httpx.AsyncClient(base_url=rest_url) as http:
        return await http.post(path, headers={"Authorization": f"Bearer {token}"}, json=body)


async def result(rest_url: str, token: str, path: str, body: object) -> Any:
    response = await post(rest_url, token, path, body)
    assert response.status_code == 200, response.text
    return response.json()["result"]


async def test_metadata_is_absent_when_the_document_has_none(index):
    ix = index()
    await ix.upsert(vectors=[("a", [0.1, 0.2]), ("b", [0.3, 0.4], {"k": "v"})])
    a, b = await ix.fetch(ids=["a", "b"], include_metadata=True)
    assert a.metadata is None and b.metadata == {"k": "v"}
    [hit] = await ix.query(vector=[0.1, 0.2], top_k=1, include_metadata=True)
    assert hit.id == "a" and hit.metadata is None


async def test_numeric_ids_and_a_numeric_cursor_are_taken_as_upstash_takes_them(rest_url):
    vectors = [{"id": 1, "vector": [0.1, 0.2]}, {"id": "2", "vector": [0.2, 0.1]}]
    assert await result(rest_url, "dense-token", "/upsert", vectors) == "Success"
    fetched = await result(rest_url, "dense-token", "/fetch", {"ids": [1, "2"]})
    assert [d["id"] for d in fetched] == ["1", "2"]
    page = await result(rest_url, "dense-token", "/range", {"cursor": 0, "limit": 10})
    assert [d["id"] for d in page["vectors"]] == ["1", "2"]
    assert await result(rest_url, "dense-token", "/update", {"id": 1, "metadata": {"x": 1}}) == {"updated": 1}
    beyond = await post(rest_url, "dense-token", "/fetch", {"ids": [10**30]})  # beyond 64 bits
    assert beyond.status_code == 400


async def test_one_selector_only_with_upstash_s_words(rest_url):
    both = await post(rest_url, "dense-token", "/fetch", {"ids": ["a"], "prefix": "a"})
    assert both.status_code == 400 and both.json() == {"error": "Only one of ids or prefix must be provided."}
    two = await post(rest_url, "dense-token", "/delete", {"ids": ["a"], "filter": "x = 1"})
    assert two.status_code == 400
    assert two.json() == {"error": "Only and only one of the ids, prefix, or filter must be provided."}


async def test_a_hybrid_index_queried_with_a_sparse_vector_alone_searches_its_sparse_side(index):
    ix = index("hybrid-token")
    await ix.upsert(
        vectors=[
            Vector(id="id0", vector=[0.1, 0.2], sparse_vector=SparseVector([0, 1], [0.1, 0.2])),
            Vector(id="id1", vector=[0.2, 0.3], sparse_vector=SparseVector([1, 2], [0.2, 0.3])),
        ]
    )
    [hit] = await ix.query(sparse_vector=SparseVector([2], [0.5]), top_k=1)
    assert hit.id == "id1" and hit.score == pytest.approx(0.15)
    [hit] = await ix.query(vector=[0.2, 0.3], top_k=1, query_mode=QueryMode.DENSE)
    assert hit.id == "id1" and hit.score == 1  # identical vectors: exactly 1


async def test_float32_values_are_written_in_their_shortest_form(rest_url):
    vectors = [{"id": "s", "sparseVector": {"indices": [3, 7], "values": [0.6, 0.1]}}]
    assert await result(rest_url, "sparse-token", "/upsert", vectors) == "Success"
    raw = (await post(rest_url, "sparse-token", "/fetch", {"ids": ["s"], "includeVectors": True})).text
    assert '"values":[0.6,0.1]' in raw and "0.6000000238418579" not in raw
    query = {"sparseVector": {"indices": [3], "values": [1.0]}, "topK": 1}
    assert await result(rest_url, "sparse-token", "/query", query) == [{"id": "s", "score": 0.6}]


async def test_a_sparse_index_given_twice_counts_once_with_its_values_summed(rest_url):
    """The Python SDK's range tests draw random indices, which collide: Upstash takes them."""
    vectors = [{"id": "d", "sparseVector": {"indices": [4, 2, 4], "values": [0.25, 0.5, 0.5]}}]
    assert await result(rest_url, "sparse-token", "/upsert", vectors) == "Success"
    [doc] = await result(rest_url, "sparse-token", "/fetch", {"ids": ["d"], "includeVectors": True})
    assert doc["sparseVector"] == {"indices": [2, 4], "values": [0.5, 0.75]}


@pytest.mark.parametrize("token", ["dense-token", "euclid-token"])
async def test_vectors_round_trip_as_sent_and_an_identical_one_scores_exactly_1(index, token):
    """Kept in float32 as sent (Upstash's precision), compared by the metric itself: the
    SDK suites read back [0.1, 0.2] and assert score == 1."""
    ix = index(token)
    await ix.upsert(vectors=[("v1", [0.1, 0.2]), ("v2", [0.3, 0.4])])
    v1, v2 = await ix.fetch(ids=["v1", "v2"], include_vectors=True)
    assert v1.vector == [0.1, 0.2] and v2.vector == [0.3, 0.4]
    first, second = await ix.query(vector=[0.1, 0.2], top_k=2, include_vectors=True)
    assert (first.id, first.score, first.vector) == ("v1", 1, [0.1, 0.2])
    assert 0 <= second.score < 1


async def test_rows_from_before_float32_are_carried_over_at_start(pool):
    """A EUCLIDEAN index's rows written as halfvec with |x|² appended (before migration
    0006) get their float32 vector when the REST API starts, and are found again."""
    from pgvector import HalfVector
    from rest_api import rest_api

    from dwsearch.rest.encode import dumps
    from dwsearch.rest.indexfile import parse_indexes

    config = '[[index]]\nname = "old"\ntoken = "t"\ndimension = 2\nmetric = "EUCLIDEAN"\n'
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO dw_index_documents (namespace, id, data, model, embedding)"
            " VALUES (%s, 'x', '', 'upstash:old', %s)",
            ["old\x1f", HalfVector([3.0, 4.0, 25.0])],
        )
    api = rest_api(pool, parse_indexes(config), redaction=REDACTION_OFF)
    await api.prepare()
    index = api.indexes["old"]
    assert json.loads(dumps(await index.fetch("", {"ids": ["x"], "includeVectors": True}))) == [
        {"id": "x", "vector": [3.0, 4.0]}
    ]
    assert await index.query("", {"vector": [3.0, 4.0], "topK": 1}) == [{"id": "x", "score": 1.0}]
    await api.prepare()  # once only: nothing left to carry
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT vector_dims(vector32) FROM dw_index_documents WHERE id = 'x'")
        assert (await cur.fetchone()) == (2,)


async def test_range_pages_in_insertion_order(index):
    """Upstash's Range order: id-0, id-1, id-2 … as upserted (not id-0, id-1, id-10); a
    replace keeps its place; the cursor continues after the last one."""
    ix = index()
    await ix.upsert(vectors=[(f"id-{i}", [1.0, float(i)]) for i in range(12)])
    await ix.upsert(vectors=[("id-1", [2.0, 1.0])])  # replaced, not moved
    seen, cursor = [], ""
    while True:
        page = await ix.range(cursor=cursor, limit=5)
        seen += [v.id for v in page.vectors]
        if not page.next_cursor:
            break
        cursor = page.next_cursor
    assert seen == [f"id-{i}" for i in range(12)]
    assert [v.id for v in await ix.fetch(prefix="id-1")] == ["id-1", "id-10", "id-11"]


async def test_an_embedded_index_s_rows_are_carried_over_and_the_grpc_index_s_are_not(pool, fake_embedder):
    """An index over the served model shares its model column with the gRPC index: only
    the REST index's own namespaces get vector32."""
    from pgvector import HalfVector
    from rest_api import rest_api

    from dwsearch.clients.embedder import EmbedderClient
    from dwsearch.rest.indexfile import parse_indexes
    from dwsearch_testkit.fakes import FAKE_MODEL, fake_vector

    vector = HalfVector(fake_vector("carried", 32))
    async with pool.connection() as conn:
        for namespace in ("docs\x1f", "grpc-namespace"):
            await conn.execute(
                "INSERT INTO dw_index_documents (namespace, id, data, model, embedding) VALUES (%s, 'x', '', %s, %s)",
                [namespace, FAKE_MODEL, vector],
            )
    embedder = EmbedderClient(fake_embedder.address, timeout=5)
    try:
        config = '[[index]]\nname = "docs"\ntoken = "t"\ndense_model = "default"\n'
        await rest_api(
            pool, parse_indexes(config), redaction=REDACTION_OFF, embedder=embedder, embed_model=FAKE_MODEL
        ).prepare()
    finally:
        await embedder.close()
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT namespace, vector_dims(vector32) FROM dw_index_documents ORDER BY namespace"
        )
        assert await cur.fetchall() == [("docs\x1f", 32), ("grpc-namespace", None)]


async def test_only_post_writes(rest_url, index):
    """GET /delete, GET /upsert and HEAD /reset?all changed data once; now 405, and nothing
    is written. info and list-namespaces still answer GET."""
    ix = index()
    await ix.upsert(vectors=[("keep", [0.1, 0.2])])
    headers = {"Authorization": "Bearer dense-token"}
    async with httpx.AsyncClient(base_url=rest_url) as http:
        for method, path in (("GET", "/delete?ids=keep"), ("GET", "/upsert"), ("HEAD", "/reset?all")):
            response = await http.request(method, path, headers=headers)
            assert response.status_code == 405, (method, path)
        info = await http.get("/info", headers=headers)
    assert info.status_code == 200 and info.json()["result"]["vectorCount"] == 1
    assert [d.id for d in await ix.fetch(ids=["keep"]) if d is not None] == ["keep"]


@pytest.mark.parametrize(
    "raw",
    [
        '[{"id": "big", "vector": [1' + "0" * 400 + ", 0.1]}]",  # a 400-digit integer (valid JSON)
        '[{"id": "lone-\\ud800", "vector": [0.1, 0.2]}]',  # a lone surrogate, as JSON escapes it
        '[{"id": "s", "vector": [0.1, 0.2], "metadata": {"k": "\\udfff"}}]',
    ],
    ids=["huge-int", "surrogate-id", "surrogate-metadata"],
)
async def test_malformed_values_are_400_and_nothing_is_written(rest_url, raw):
    headers = {"Authorization": "Bearer dense-token", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=rest_url) as http:
        response = await http.post("/upsert", headers=headers, content=raw.encode())
    assert response.status_code == 400, response.text
    assert (await result(rest_url, "dense-token", "/info", None))["vectorCount"] == 0
    mode = await post(rest_url, "hybrid-token", "/query", {"vector": [0.1, 0.2], "queryMode": []})
    assert mode.status_code == 400 and "queryMode" in mode.json()["error"]
