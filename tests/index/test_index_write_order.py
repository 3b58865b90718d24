"""Writes of one index apply in the order they arrived, and concurrent writes of the same ids
from several processes never deadlock (real Postgres)."""

from __future__ import annotations

import asyncio
import random

import pytest

from dwsearch.db.pool import open_pool
from dwsearch.index.document_index import DocumentIndex
from dwsearch.index.documents import Document, Include
from dwsearch.index.space import Metric, SparseEncoder, VectorSpace
from dwsearch.index.writeorder import WriteOrder
from dwsearch.redaction import REDACTION_OFF

SPACE = VectorSpace(
    "rest:order", dense_from_embedder=False, sparse=SparseEncoder.NONE, dimension=2, metric=Metric.COSINE
)


@pytest.fixture
async def pool(db_url):
    pool = await open_pool(db_url, max_size=8)
    yield pool
    await pool.close()


@pytest.fixture
async def index(pool):
    ix = DocumentIndex(pool, None, space=SPACE, redaction=REDACTION_OFF)
    yield ix
    await ix.clear("order")


def doc(doc_id: str, **metadata) -> Document:
    return Document(id=doc_id, vector=[0.1, 0.2], metadata=metadata)


async def test_a_delete_sent_before_the_upsert_is_answered_deletes_what_it_wrote(index):
    # The TypeScript SDK's own suite: `index.upsert(...)` not awaited, then a delete.
    for round_ in range(20):
        upsert = asyncio.ensure_future(index.upsert("order", [doc(f"d{round_}")]))
        await asyncio.sleep(0)  # the upsert has been called: it has its turn
        assert await index.delete("order", ids=[f"d{round_}"]) == 1
        assert (await upsert).upserted == 1
    assert (await index.fetch("order", [f"d{i}" for i in range(20)], Include()))[0] == []


async def test_updates_apply_in_the_order_they_arrived_and_keep_every_key(index):
    await index.upsert("order", [doc("u")])
    await asyncio.gather(*(index.update("order", "u", metadata={f"k{i}": i}) for i in range(40)))
    (stored,), _ = await index.fetch("order", ["u"], Include(metadata=True))
    assert stored.metadata == {f"k{i}": i for i in range(40)}
    # a delete racing an update: the later one wins, every round
    for _ in range(10):
        await index.upsert("order", [doc("r", v=0)])
        update = asyncio.ensure_future(index.update("order", "r", metadata={"v": 1}, vector=[0.3, 0.4]))
        await asyncio.sleep(0)
        assert await index.delete("order", ids=["r"]) == 1
        assert await update is True
        assert (await index.fetch("order", ["r"], Include()))[0] == []


async def test_a_failed_or_cancelled_write_lets_later_writes_go_in_order(index):
    bad = asyncio.ensure_future(index.upsert("order", [Document(id="x", vector=[0.1])]))  # wrong dimension
    good = asyncio.ensure_future(index.upsert("order", [doc("x")]))
    with pytest.raises(Exception, match=r"dimension|2"):
        await bad
    assert (await good).upserted == 1

    order = WriteOrder()
    first, second, third = order.turn(), order.turn(), order.turn()
    await first.ready()
    second.end()  # cancelled while the first still runs: the third still waits for the first
    waiting = asyncio.ensure_future(third.ready())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    first.end()
    await asyncio.wait_for(waiting, 1)


async def test_concurrent_upserts_and_deletes_of_the_same_ids_in_other_orders_never_deadlock(pool):
    # Two DocumentIndex objects over one database are two serve replicas: their writes
    # are not ordered by one process, only by the store's row locks in id order.
    replicas = [DocumentIndex(pool, None, space=SPACE, redaction=REDACTION_OFF) for _ in range(2)]
    ids = [f"id{i:03d}" for i in range(60)]
    rng = random.Random(7)
    try:
        for _ in range(15):
            writes = []
            for replica in replicas:
                for _ in range(3):
                    shuffled = rng.sample(ids, len(ids))
                    writes.append(replica.upsert("order", [doc(i) for i in shuffled]))
                writes.append(replica.delete("order", ids=rng.sample(ids, 30)))
            results = await asyncio.gather(*writes, return_exceptions=True)
            assert [r for r in results if isinstance(r, BaseException)] == []
    finally:
        await replicas[0].clear("order")
