"""Dense 2-d COSINE (and a 3-d DOT_PRODUCT) index through the official upstash-vector SDK."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from upstash_vector import Index, Vector
from upstash_vector.errors import UpstashError
from upstash_vector.types import MetadataUpdateMode

pytestmark = pytest.mark.timeout(60)


def close(a, b, tol=1e-3):
    return all(math.isclose(x, y, abs_tol=tol) for x, y in zip(a, b, strict=True))


async def test_upsert_query_fetch_with_cosine_scores(index):
    ix = index()
    assert await ix.upsert(vectors=[
        Vector(id="a", vector=[1.0, 0.0], metadata={"type": "knowledge", "n": 1}, data="alpha"),
        Vector(id="b", vector=[0.0, 1.0], metadata={"type": "response", "n": 2}),
        ("c", [-1.0, 0.0], {"type": "knowledge", "n": 3}),
    ]) == "Success"  # fmt: skip
    hits = await ix.query(vector=[2.0, 0.0], top_k=3, include_metadata=True, include_data=True)
    assert [h.id for h in hits] == ["a", "b", "c"]
    # COSINE: (1 + cos) / 2.
    assert [round(h.score, 4) for h in hits] == [1.0, 0.5, 0.0]
    assert hits[0].metadata == {"type": "knowledge", "n": 1} and hits[0].data == "alpha"
    assert hits[1].data is None
    filtered = await ix.query(vector=[1.0, 0.0], top_k=5, filter="type = 'knowledge' AND n > 1")
    assert [h.id for h in filtered] == ["c"] and filtered[0].metadata is None
    fetched = await ix.fetch(["b", "missing", "a"], include_vectors=True, include_metadata=True)
    assert fetched[1] is None
    assert (
        fetched[0].id == "b"
        and close(fetched[0].vector, [0.0, 1.0])
        and fetched[0].metadata == {"type": "response", "n": 2}
    )
    by_prefix = await ix.fetch(prefix="a")
    assert [f.id for f in by_prefix] == ["a"]


async def test_batch_query(index):
    ix = index()
    await ix.upsert(vectors=[("a", [1.0, 0.0]), ("b", [0.0, 1.0])])
    results = await ix.query_many(
        queries=[{"vector": [1.0, 0.1], "top_k": 1}, {"vector": [0.1, 1.0], "top_k": 1}]
    )
    assert [[h.id for h in r] for r in results] == [["a"], ["b"]]


async def test_namespaces_range_delete_reset(index):
    ix = index()
    await ix.upsert(vectors=[(f"id-{i:02d}", [1.0, i / 10 + 0.01]) for i in range(25)], namespace="ns")
    await ix.upsert(vectors=[("x", [1.0, 1.0])])
    assert await ix.list_namespaces() == ["", "ns"]
    info = await ix.info()
    assert info.vector_count == 26 and info.pending_vector_count == 0 and info.dimension == 2
    assert info.similarity_function == "COSINE" and info.namespaces["ns"].vector_count == 25
    # Each namespace is its own: the default one does not see ns's ids.
    assert (await ix.fetch(["id-00"]))[0] is None
    ids, cursor = [], ""
    while True:
        page = await ix.range(cursor=cursor, limit=10, namespace="ns")
        ids += [v.id for v in page.vectors]
        cursor = page.next_cursor
        if not cursor:
            break
    assert ids == [f"id-{i:02d}" for i in range(25)]
    assert [v.id for v in (await ix.range(limit=100, prefix="id-1", namespace="ns")).vectors] == [
        f"id-{i}" for i in range(10, 20)
    ]
    assert (await ix.delete(ids=["id-00", "nope"], namespace="ns")).deleted == 1
    assert (await ix.delete(prefix="id-2", namespace="ns")).deleted == 5
    await ix.update("id-01", metadata={"k": 1}, namespace="ns")
    assert (await ix.delete(filter="k = 1", namespace="ns")).deleted == 1
    assert (await ix.info()).namespaces["ns"].vector_count == 18
    await ix.reset(namespace="ns")
    # An emptied namespace stays, at 0, until it is deleted (as Upstash: the SDK suites list it).
    assert (await ix.info()).namespaces["ns"].vector_count == 0
    await ix.upsert(vectors=[("y", [1.0, 0.0])], namespace="other")
    await ix.reset(all=True)
    assert (await ix.info()).vector_count == 0
    await ix.upsert(vectors=[("y", [1.0, 0.0])], namespace="gone")
    await ix.delete_namespace("gone")
    assert await ix.list_namespaces() == ["", "ns", "other"]
    await ix.delete_namespace("ns")
    await ix.delete_namespace("other")
    assert await ix.list_namespaces() == [""]
    with pytest.raises(UpstashError):
        await ix.delete_namespace("gone")


async def test_update_metadata_vector_and_data(index):
    ix = index()
    await ix.upsert(vectors=[Vector(id="a", vector=[1.0, 0.0], metadata={"a": 1, "b": {"c": 2}}, data="old")])
    assert await ix.update(
        "a", metadata={"b": {"c": None, "d": 3}}, metadata_update_mode=MetadataUpdateMode.PATCH
    )
    (doc,) = await ix.fetch(["a"], include_metadata=True, include_data=True)
    assert doc.metadata == {"a": 1, "b": {"d": 3}} and doc.data == "old"
    assert await ix.update("a", metadata={"z": 1}, metadata_update_mode=MetadataUpdateMode.OVERWRITE)
    assert await ix.update("a", vector=[0.0, 3.0], data="new")
    (doc,) = await ix.fetch(["a"], include_metadata=True, include_data=True, include_vectors=True)
    # A COSINE index keeps the vector as sent, as Upstash does (the SDK suites read it back).
    assert doc.metadata == {"z": 1} and doc.data == "new" and doc.vector == [0.0, 3.0]
    assert not await ix.update("missing", metadata={"z": 2})


async def test_resumable_query(index):
    ix = index()
    await ix.upsert(vectors=[(f"v{i}", [1.0, i / 10]) for i in range(7)], namespace="ns")
    first, handle = await ix.resumable_query(
        vector=[1.0, 0.0], top_k=2, namespace="ns", include_metadata=True
    )
    assert [h.id for h in first] == ["v0", "v1"]
    assert [h.id for h in await handle.fetch_next(3)] == ["v2", "v3", "v4"]
    assert [h.id for h in await handle.fetch_next(5)] == ["v5", "v6"]
    assert await handle.fetch_next(1) == []
    await handle.stop()
    with pytest.raises(UpstashError, match="not found"):
        await handle.fetch_next(1)
    other, _ = await index("dot-token").resumable_query(vector=[1.0, 0.0, 0.0], top_k=1)
    assert other == []


async def test_dot_product_scores(index):
    ix = index("dot-token")
    await ix.upsert(vectors=[("a", [0.5, 0.0, 0.0]), ("b", [0.0, 0.2, 0.0])])
    hits = await ix.query(vector=[1.0, 1.0, 0.0], top_k=2, include_vectors=True)
    assert [h.id for h in hits] == ["a", "b"]
    assert [round(h.score, 3) for h in hits] == [0.75, 0.6]  # (1 + dot) / 2
    assert close(hits[0].vector, [0.5, 0.0, 0.0])


async def test_euclidean_scores_and_vectors(index):
    ix = index("euclid-token")
    await ix.upsert(vectors=[("near", [1.0, 1.0]), ("far", [3.0, -1.0]), ("origin", [0.0, 0.0])])
    hits = await ix.query(vector=[1.0, 2.0], top_k=3, include_vectors=True)
    assert [h.id for h in hits] == ["near", "origin", "far"]
    # 1 / (1 + squared distance): 1, 5 and 13.
    assert [round(h.score, 3) for h in hits] == [0.5, round(1 / 6, 3), round(1 / 14, 3)]
    assert close(hits[0].vector, [1.0, 1.0]) and close(hits[2].vector, [3.0, -1.0])
    assert await ix.update("origin", vector=[1.0, 2.0])
    (best,) = await ix.query(vector=[1.0, 2.0], top_k=1)
    assert best.id == "origin" and best.score == pytest.approx(1.0, abs=1e-3)
    assert (await ix.info()).similarity_function == "EUCLIDEAN" and (await ix.info()).dimension == 2


async def test_indexes_are_separate_and_served_by_name(index):
    dense, dot = index(), index("dot-token")
    await dense.upsert(vectors=[("same", [1.0, 0.0])])
    await dot.upsert(vectors=[("same", [0.0, 0.0, 1.0])])
    assert (await dense.info()).vector_count == 1 and (await dot.info()).vector_count == 1
    named = index("dense-token-2", path="/dense")  # the second token, and the /{name}/… form
    (doc,) = await named.fetch(["same"], include_vectors=True)
    assert close(doc.vector, [1.0, 0.0])
    with pytest.raises(UpstashError, match="Not found"):  # as for a name no index has
        await index("dot-token", path="/dense").info()


async def test_errors_and_statuses(index, rest_url):
    ix = index()
    with pytest.raises(UpstashError, match="Invalid vector dimension: 3, expected: 2"):
        await ix.upsert(vectors=[("a", [1.0, 0.0, 0.0])])
    with pytest.raises(UpstashError, match="dimension"):
        await ix.query(vector=[1.0], top_k=1)
    with pytest.raises(UpstashError, match="sparse"):
        await ix.upsert(vectors=[Vector(id="s", sparse_vector=([1], [0.5]))])
    with pytest.raises(UpstashError, match="embedding model"):
        await ix.upsert(vectors=[("d", "some text")])
    with pytest.raises(UpstashError, match=r"position|filter"):
        await ix.query(vector=[1.0, 0.0], filter="type = ")
    with pytest.raises(UpstashError, match="Unauthorized"):
        await index("wrong").info()
    async with httpx.AsyncClient(base_url=rest_url) as http:
        auth = {"Authorization": "Bearer dense-token", "Upstash-Telemetry-Sdk": "x"}
        r = await http.post("/info", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401 and "error" in r.json()
        r = await http.post("/query", headers=auth, content=b"{not json")
        assert r.status_code == 400 and "error" in r.json()
        r = await http.post("/nope", headers=auth)
        assert r.status_code == 404
        r = await http.post("/upsert", headers=auth, content=b"[" + b" " * 300_000 + b"]")
        assert r.status_code == 413
        deep: object = 1
        for _ in range(100):
            deep = {"a": deep}
        r = await http.post("/upsert", headers=auth, json=[{"id": "d", "vector": [1, 0], "metadata": deep}])
        assert r.status_code == 400 and "metadata" in r.json()["error"], r.text
        r = await http.post("/fetch", headers=auth, json={"ids": ["x" * 600]})
        assert r.status_code == 400 and "SELECT" not in r.text
        r = await http.post("/info", headers=auth)
        assert r.status_code == 200 and r.json()["result"]["pendingVectorCount"] == 0


async def test_sync_sdk(rest_url):
    def calls():
        ix = Index(url=rest_url, token="dense-token", retries=0)
        ix.upsert(vectors=[("a", [1.0, 0.0])])
        return [h.id for h in ix.query(vector=[1.0, 0.0], top_k=1)]

    assert await asyncio.to_thread(calls) == ["a"]


async def test_concurrent_updates_of_one_document_lose_nothing(index):
    """An update with a vector is one transaction with the row locked: a dozen at once,
    each with a new vector and one more metadata key, keep every key (a read of the
    document and a write back would lose some)."""
    import asyncio

    ix = index()
    await ix.upsert(vectors=[("doc", [1.0, 0.0], {"n": 0})])
    updates = [
        ix.update(
            "doc",
            vector=[1.0, float(i)],
            metadata={f"k{i}": i},
            metadata_update_mode=MetadataUpdateMode.PATCH,
        )
        for i in range(12)
    ]
    assert all(await asyncio.gather(*updates))
    [doc] = await ix.fetch(ids=["doc"], include_metadata=True, include_vectors=True)
    assert doc.metadata == {"n": 0, **{f"k{i}": i for i in range(12)}}
    assert doc.vector[0] > 0 and len(doc.vector) == 2


async def test_vectors_are_checked_against_float32_s_range_which_they_are_stored_in(index, rest_url):
    ix = index()
    # Beyond half precision, within float32: stored as sent, and a cosine ignores the scale.
    await ix.upsert(vectors=[("big", [65505.0, 0.0]), ("small", [0.0, 1.0])])
    hits = await ix.query(vector=[1e30, 0.0], top_k=2)
    assert [h.id for h in hits] == ["big", "small"] and round(hits[0].score, 4) == 1.0
    (doc,) = await ix.fetch(["big"], include_vectors=True)
    assert doc.vector == [65505.0, 0.0]
    async with httpx.AsyncClient(base_url=rest_url) as http:
        auth = {"Authorization": "Bearer dense-token"}
        r = await http.post("/upsert", headers=auth, json=[{"id": "x", "vector": [1e39, 0.0]}])
        assert r.status_code == 400 and "float32" in r.json()["error"], r.text
        # Within float32, but its squared length is not: no float32 cosine could compare it.
        r = await http.post("/upsert", headers=auth, json=[{"id": "x", "vector": [1e20, 0.0]}])
        assert r.status_code == 400 and "squared length" in r.json()["error"], r.text
        r = await http.post("/query", headers=auth, json={"vector": [-1e39, 0.0], "topK": 1})
        assert r.status_code == 400 and "float32" in r.json()["error"], r.text
