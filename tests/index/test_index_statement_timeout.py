"""A filter has a time limit: statements a caller shapes are cancelled after the statement
timeout (DEADLINE_EXCEEDED, HTTP 504), and they never take every pool connection from the
other callers (real Postgres)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from dwsearch.common.errors import classify
from dwsearch.common.grpcstatus import GRPC_STATUS
from dwsearch.common.httpstatus import http_status
from dwsearch.db.pool import open_pool
from dwsearch.index.document_index import DocumentIndex
from dwsearch.index.documents import Document, Include, Query
from dwsearch.index.space import Metric, SparseEncoder, VectorSpace
from dwsearch.redaction import REDACTION_OFF

SPACE = VectorSpace(
    "rest:slow", dense_from_embedder=False, sparse=SparseEncoder.NONE, dimension=2, metric=Metric.COSINE
)
SLOW_FILTER = " OR ".join(
    f"arr CONTAINS {7000 + i}" for i in range(390)
)  # matches nothing, reads every array


@pytest.fixture
async def pool(db_url):
    pool = await open_pool(db_url, max_size=3)
    yield pool
    await pool.close()


@pytest.fixture
async def slow_namespace(pool):
    index = DocumentIndex(pool, None, space=SPACE, redaction=REDACTION_OFF)
    docs = [
        Document(id=f"d{i}", vector=[1.0, i / 60], metadata={"arr": list(range(6000))}) for i in range(60)
    ]
    for start in range(0, 60, 20):
        await index.upsert("slow", docs[start : start + 20])
    yield
    await index.clear("slow")


async def test_a_filter_past_the_statement_timeout_answers_deadline_exceeded_and_deletes_nothing(
    pool, slow_namespace
):
    index = DocumentIndex(pool, None, space=SPACE, redaction=REDACTION_OFF, statement_timeout_ms=100)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(Exception) as raised:
        await index.query(Query(namespace="slow", vector=[1.0, 0.0], top_k=5, filter=SLOW_FILTER))
    assert loop.time() - started < 2
    assert GRPC_STATUS[classify(raised.value).kind] is grpc.StatusCode.DEADLINE_EXCEEDED
    assert http_status(classify(raised.value).kind) == 504
    with pytest.raises(Exception) as raised:
        await index.delete(
            "slow", filter=SLOW_FILTER.rsplit(" OR ", 1)[0] + " OR arr CONTAINS 1"
        )  # matches all
    assert GRPC_STATUS[classify(raised.value).kind] is grpc.StatusCode.DEADLINE_EXCEEDED
    assert (await index.info()).namespaces["slow"] == 60
    # the connection went back to the pool with its own setting: a quick query still answers
    (hit,) = await index.query(Query(namespace="slow", vector=[1.0, 0.0], top_k=1, filter="arr CONTAINS 5"))
    assert hit.document.id == "d0"


async def test_slow_filters_never_take_every_connection_from_other_callers(pool, slow_namespace):
    index = DocumentIndex(
        pool,
        None,
        space=SPACE,
        redaction=REDACTION_OFF,
        query_slots=asyncio.Semaphore(1),
        statement_timeout_ms=800,
    )
    slow = [
        asyncio.ensure_future(
            index.query(Query(namespace="slow", vector=[1.0, 0.0], top_k=5, filter=SLOW_FILTER))
        )
        for _ in range(3)  # more than the pool's 3 connections less the one slot
    ]
    await asyncio.sleep(0.05)
    found, _ = await asyncio.wait_for(index.fetch("slow", ["d1"], Include()), 5)
    assert [d.id for d in found] == ["d1"]
    assert not any(task.done() for task in slow)  # answered while every slow filter still ran or waited
    for outcome in await asyncio.gather(*slow, return_exceptions=True):
        assert (
            isinstance(outcome, list)
            or GRPC_STATUS[classify(outcome).kind] is grpc.StatusCode.DEADLINE_EXCEEDED
        )
