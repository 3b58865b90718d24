"""`migrate --hnsw-index`: the index builds CONCURRENTLY (writes go on meanwhile), is
idempotent, and an invalid index left by an interrupted build is rebuilt."""

from __future__ import annotations

import asyncio

import psycopg
from psycopg import AsyncConnection

from dwsearch.search.store.knn import create_hnsw_index, hnsw_index_name

MODEL = "fake/deterministic-v1"


def validity(url: str) -> list[bool]:
    with psycopg.connect(url) as conn:
        return [
            v
            for (v,) in conn.execute(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
                (hnsw_index_name(MODEL),),
            )
        ]


async def test_the_hnsw_index_builds_concurrently_with_writes(db_url):
    holder = psycopg.connect(db_url)  # an open write transaction, as a sweep's
    holder.execute("LOCK TABLE dw_message_embeddings IN ROW EXCLUSIVE MODE")
    conn = await AsyncConnection.connect(db_url, autocommit=True)
    build = asyncio.ensure_future(create_hnsw_index(conn, MODEL, 32))
    try:
        with psycopg.connect(db_url, autocommit=True) as watch:
            for _ in range(200):  # until the build waits for the open transaction
                row = watch.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (conn.info.backend_pid,)
                ).fetchone()
                if row and row[0] == "Lock":
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the build never waited for the open transaction")
        # Another writer is not queued behind the build (a plain CREATE INDEX's SHARE lock
        # request would hold it until lock_timeout).
        with psycopg.connect(db_url) as writer:
            writer.execute("SET lock_timeout = '2s'")
            writer.execute("LOCK TABLE dw_message_embeddings IN ROW EXCLUSIVE MODE")
        assert not build.done()
    finally:
        holder.close()  # whatever happened, the build can finish
        name = await asyncio.wait_for(build, 30)
        await conn.close()
    assert name == hnsw_index_name(MODEL)
    assert validity(db_url) == [True]


async def test_an_invalid_index_is_rebuilt_and_a_valid_one_kept(db_url):
    async with await AsyncConnection.connect(db_url, autocommit=True) as conn:
        await create_hnsw_index(conn, MODEL, 32)
        (oid,) = await (
            await conn.execute("SELECT to_regclass(%s)::oid", (hnsw_index_name(MODEL),))
        ).fetchone()
        await create_hnsw_index(conn, MODEL, 32)  # idempotent: the same index
        assert await (
            await conn.execute("SELECT to_regclass(%s)::oid", (hnsw_index_name(MODEL),))
        ).fetchone() == (oid,)
        # As an interrupted CONCURRENTLY build leaves it.
        await conn.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s", (oid,))
        assert validity(db_url) == [False]
        await create_hnsw_index(conn, MODEL, 32)
    assert validity(db_url) == [True]
