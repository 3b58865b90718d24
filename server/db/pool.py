"""The server's async connection pool; pgvector types registered on every connection."""

from __future__ import annotations

from pgvector.psycopg import register_vector_async
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool


async def _configure(conn: AsyncConnection) -> None:
    await register_vector_async(conn)
    await conn.commit()


# No per-checkout health check: it would cost a round trip on every query. A connection
# broken by a database restart fails its query (UNAVAILABLE to that caller) and the pool
# discards it; the next checkout reconnects.
async def open_pool(url: str, *, min_size: int = 1, max_size: int = 10, timeout: float = 10.0) -> AsyncConnectionPool:
    pool = AsyncConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        configure=_configure,
        open=False,
        timeout=timeout,
        kwargs={"autocommit": True},
    )
    await pool.open(wait=True, timeout=timeout)
    return pool
