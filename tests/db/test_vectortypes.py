"""pgvector's types on pooled connections (dwsearch.db.vectortypes): every new connection
reads and writes vector, halfvec and sparsevec as pgvector's own registration makes it,
and reconnecting (a database restart, pg_terminate_backend) leaves psycopg's process-wide
map of adapter classes as it was, where pgvector's register_vector_async adds two classes
per type on every connection (serve's RSS grew 0.23 MiB per reconnect of its pool)."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
from db_workload import scratch_database, with_params
from pgvector import HalfVector, SparseVector, Vector
from pgvector.psycopg import register_vector_async
from psycopg.adapt import AdaptersMap

from dwsearch.db.pool import open_pool
from dwsearch.db.vectortypes import register_vector_types

RECONNECTS = 12


async def _adapter_classes_after_reconnects(url: str, register) -> int:
    """How many adapter classes psycopg's process-wide map gained over RECONNECTS new
    connections, each registered with `register` (after one to warm the map)."""

    async def connect_once() -> None:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        try:
            await register(conn)
        finally:
            await conn.close()

    await connect_once()
    before = len(AdaptersMap._optimised)
    for _ in range(RECONNECTS):
        await connect_once()
    return len(AdaptersMap._optimised) - before


async def test_reconnecting_adds_no_adapter_classes(empty_db_url):
    assert await _adapter_classes_after_reconnects(empty_db_url, register_vector_types) == 0
    # The measure sees what it is for: pgvector's registration adds classes every time.
    grown = await _adapter_classes_after_reconnects(empty_db_url, register_vector_async)
    assert grown >= 2 * RECONNECTS


async def test_a_pool_reconnecting_after_terminated_sessions_reads_and_writes_vectors(empty_db_url):
    pool = await open_pool(empty_db_url, min_size=2, max_size=2)
    try:
        for _ in range(3):
            async with pool.connection() as conn:
                for binary in (False, True):
                    cur = conn.cursor(binary=binary)
                    await cur.execute(
                        "SELECT %s::vector, %s::halfvec, %s::sparsevec, %s",
                        (Vector([1, 2, 3]), HalfVector([0.5, 1.5]), SparseVector({0: 1.0, 7: 2.5}, 9),
                         np.array([4.0, 5.0], dtype=np.float32)),
                    )  # fmt: skip
                    vector, half, sparse, dumped = await cur.fetchone()
                    assert np.allclose(vector.to_numpy(), [1, 2, 3])
                    assert np.allclose(half.to_numpy(), [0.5, 1.5])
                    assert sparse.indices() == [0, 7] and np.allclose(sparse.values(), [1.0, 2.5])
                    assert np.allclose(dumped.to_numpy(), [4.0, 5.0])
                pid = (await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0]
            with psycopg.connect(empty_db_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = %s", (pid,))
            await pool.check()  # the pool drops the terminated session and connects again
    finally:
        await pool.close()


async def test_a_database_without_pgvector_fails_as_pgvector_says(server_url):
    with scratch_database(server_url, "novector") as name:
        conn = await psycopg.AsyncConnection.connect(with_params(server_url, dbname=name), autocommit=True)
        try:
            with pytest.raises(psycopg.ProgrammingError, match="vector type not found"):
                await register_vector_types(conn)
        finally:
            await conn.close()
