"""SPARSE and HYBRID indexes through the official SDK: sparse vectors as {indices, values},
queryMode, fusionAlgorithm RRF / DBSF, weightingStrategy IDF."""

from __future__ import annotations

import math

import pytest
from upstash_vector import AsyncIndex, Vector
from upstash_vector.errors import UpstashError
from upstash_vector.types import FusionAlgorithm, QueryMode, SparseVector, WeightingStrategy

pytestmark = pytest.mark.timeout(60)


async def test_sparse_index(rest_url):
    ix = AsyncIndex(url=rest_url, token="sparse-token", retries=0)
    await ix.upsert(vectors=[
        Vector(id="a", sparse_vector=SparseVector([1, 7], [0.5, 1.0]), metadata={"t": "x"}),
        Vector(id="b", sparse_vector=([7, 999_999_999], [2.0, 0.1])),
        Vector(id="c", sparse_vector=([3], [1.0])),
    ])  # fmt: skip
    hits = await ix.query(sparse_vector=([7], [1.0]), top_k=5, include_vectors=True)
    # Inner product; only documents sharing a term.
    assert [(h.id, round(h.score, 3)) for h in hits] == [("b", 2.0), ("a", 1.0)]
    assert hits[0].vector is None
    assert hits[0].sparse_vector.indices == [7, 999_999_999] and hits[
        0
    ].sparse_vector.values == pytest.approx([2.0, 0.1])
    (fetched,) = await ix.fetch(["a"], include_vectors=True, include_metadata=True)
    assert (
        fetched.sparse_vector.indices == [1, 7] and fetched.metadata == {"t": "x"} and fetched.vector is None
    )
    assert await ix.update("c", sparse_vector=([7], [3.0]))
    assert (await ix.query(sparse_vector=([7], [1.0]), top_k=1))[0].id == "c"
    info = await ix.info()
    assert info.vector_count == 3 and info.dense_index is None and info.sparse_index is not None
    with pytest.raises(UpstashError, match="does not support dense"):
        await ix.upsert(vectors=[("d", [1.0, 0.0])])
    with pytest.raises(UpstashError, match="does not support dense"):
        await ix.query(vector=[1.0, 0.0], top_k=1)
    with pytest.raises(UpstashError, match="index"):
        await ix.upsert(vectors=[Vector(id="e", sparse_vector=([1_000_000_000], [1.0]))])


async def test_sparse_idf_weighting(rest_url):
    ix = AsyncIndex(url=rest_url, token="sparse-token", retries=0)
    # Term 1 is in every document, term 2 in one: with IDF the rare term decides.
    await ix.upsert(vectors=[
        Vector(id="common", sparse_vector=([1], [2.0])),
        Vector(id="rare", sparse_vector=([1, 2], [0.1, 1.0])),
        Vector(id="other", sparse_vector=([1], [0.5])),
    ], namespace="idf")  # fmt: skip
    plain = await ix.query(sparse_vector=([1, 2], [1.0, 1.0]), top_k=3, namespace="idf")
    assert plain[0].id == "common" and plain[0].score == pytest.approx(2.0, abs=1e-3)
    weighted = await ix.query(
        sparse_vector=([1, 2], [1.0, 1.0]), top_k=3, namespace="idf", weighting_strategy=WeightingStrategy.IDF
    )
    idf1 = math.log((3 - 3 + 0.5) / (3 + 0.5) + 1)
    idf2 = math.log((3 - 1 + 0.5) / (1 + 0.5) + 1)
    assert weighted[0].id == "rare"
    assert weighted[0].score == pytest.approx(0.1 * idf1 + 1.0 * idf2, rel=1e-3)


async def test_hybrid_index(rest_url):
    ix = AsyncIndex(url=rest_url, token="hybrid-token", retries=0)
    await ix.upsert(vectors=[
        Vector(id="dense-best", vector=[1.0, 0.0], sparse_vector=([5], [0.1])),
        Vector(id="sparse-best", vector=[0.0, 1.0], sparse_vector=([1], [3.0])),
        Vector(id="both", vector=[0.9, 0.1], sparse_vector=([1], [2.0])),
    ])  # fmt: skip
    query = {"vector": [1.0, 0.0], "sparse_vector": ([1], [1.0]), "top_k": 3, "include_vectors": True}
    rrf = await ix.query(**query)
    # RRF (k = 60): sparse-best is 3rd dense, 1st sparse; both is 2nd in each; dense-best
    # only in the dense list (no shared sparse term).
    assert [h.id for h in rrf] == ["sparse-best", "both", "dense-best"]
    assert [h.score for h in rrf] == pytest.approx([1 / 62 + 1 / 60, 2 / 61, 1 / 60], rel=1e-4)
    assert rrf[1].vector is not None and rrf[1].sparse_vector.indices == [1]
    dbsf = await ix.query(**query, fusion_algorithm=FusionAlgorithm.DBSF)
    assert {h.id for h in dbsf} == {"dense-best", "sparse-best", "both"}
    dense = await ix.query(**query, query_mode=QueryMode.DENSE)
    assert [h.id for h in dense][:2] == ["dense-best", "both"] and dense[0].score == pytest.approx(
        1.0, abs=1e-3
    )
    sparse = await ix.query(**query, query_mode=QueryMode.SPARSE)
    assert [h.id for h in sparse] == ["sparse-best", "both"] and sparse[0].score == pytest.approx(
        3.0, abs=1e-2
    )
    with pytest.raises(UpstashError, match="requires sparse"):
        await ix.upsert(vectors=[("x", [1.0, 0.0])])
    with pytest.raises(UpstashError, match="requires dense"):
        await ix.upsert(vectors=[Vector(id="y", sparse_vector=([1], [1.0]))])
    with pytest.raises(UpstashError, match="requires sparse"):
        await ix.query(vector=[1.0, 0.0], top_k=1)
    # DENSE mode needs only the dense vector.
    assert (await ix.query(vector=[1.0, 0.0], top_k=1, query_mode=QueryMode.DENSE))[0].id == "dense-best"
    info = await ix.info()
    assert info.dense_index.dimension == 2 and info.sparse_index is not None
