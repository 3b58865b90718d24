"""Exact dense and sparse KNN (knn.dense_knn / sparse_knn) over a real pgvector: the
top k by inner product, scoped to the org and model, stable on ties."""

from datetime import timedelta

import numpy as np
from pgvector import HalfVector, SparseVector

from dwsearch.search.store import knn
from dwsearch.search.store.scope import ChatScope
from dwsearch_testkit.seed import T0, insert_window

DIM = 8
MODEL = "test/model"


def unit(*values: float) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(values)] = values
    return v / np.linalg.norm(v)


def window(url: str, name: str, dense, *, org: str = "org-a", model: str = MODEL, sparse=None) -> str:
    return insert_window(
        url,
        org=org,
        model=model,
        provider="wa",
        channel=name,
        message_ids=[],
        content=name,
        start=T0,
        end=T0 + timedelta(minutes=1),
        dense=dense,
        sparse=sparse,
        sparse_dimension=100,
    )


async def test_dense_returns_the_top_k_by_inner_product_in_order(db_url, pool):
    ids = {name: window(db_url, name, unit(1, x)) for name, x in [("near", 0.1), ("mid", 1.0), ("far", 3.0)]}
    window(db_url, "other-org", unit(1, 0), org="org-b")
    window(db_url, "other-model", unit(1, 0), model="other/model")
    async with pool.connection() as conn:
        rows = await knn.dense_knn(conn, ChatScope("org-a"), MODEL, HalfVector(unit(1, 0)), 2)
    assert [r.id for r in rows] == [ids["near"], ids["mid"]]
    assert rows[0].content == "near" and rows[0].external_channel_id == "near"
    assert rows[0].score > rows[1].score and abs(rows[0].score - float(unit(1, 0.1)[0])) < 1e-2


async def test_dense_ties_break_on_id(db_url, pool):
    ids = sorted(window(db_url, f"same-{i}", unit(1, 1)) for i in range(5))
    async with pool.connection() as conn:
        rows = await knn.dense_knn(conn, ChatScope("org-a"), MODEL, HalfVector(unit(1, 1)), 3)
    assert [r.id for r in rows] == ids[:3]


async def test_sparse_skips_windows_without_sparse_and_non_positive_overlaps(db_url, pool):
    for i in range(5):  # would fill k if rows without a sparse vector were ranked
        window(db_url, f"dense-only-{i}", unit(1, i))
    strong = window(db_url, "strong", unit(1), sparse={3: 2.0, 7: 1.0})
    weak = window(db_url, "weak", unit(1), sparse={7: 0.5})
    window(db_url, "disjoint", unit(1), sparse={50: 4.0})
    window(db_url, "other-org", unit(1), org="org-b", sparse={3: 9.0})
    query = SparseVector({3: 1.0, 7: 1.0}, 100)
    async with pool.connection() as conn:
        rows = await knn.sparse_knn(conn, ChatScope("org-a"), MODEL, query, 3)
        top1 = await knn.sparse_knn(conn, ChatScope("org-a"), MODEL, query, 1)
    assert [r.id for r in rows] == [strong, weak]
    assert [r.score for r in rows] == [3.0, 0.5]
    assert [r.id for r in top1] == [strong]
