"""The server's async connection pool; pgvector types registered on every connection.

Behind pgbouncer in transaction mode (`transaction_pooling=True`, from
DWSEARCH_DB_TRANSACTION_POOLING) each transaction may run on another server connection,
so nothing may rely on session state: the connections prepare no statements on the
server (psycopg's prepare_threshold=None; pgbouncer before 1.21, or with
max_prepared_statements = 0, does not carry them), and the sweep takes its key locks as
leases in a table (dwsearch.sweep.store) rather than as session advisory locks. Every
other lock dwsearch takes is transaction-scoped (pg_advisory_xact_lock*)."""

from __future__ import annotations

import weakref
from typing import Any

from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from dwsearch.db.vectortypes import register_vector_types

# Connections of pools opened with transaction_pooling=True.
_TRANSACTION_POOLED: weakref.WeakSet[AsyncConnection] = weakref.WeakSet()


def transaction_pooled(conn: AsyncConnection) -> bool:
    """Whether conn may run each transaction on a different server session."""
    return conn in _TRANSACTION_POOLED


async def _configure(conn: AsyncConnection) -> None:
    await register_vector_types(conn)
    await conn.commit()


async def _configure_transaction_pooled(conn: AsyncConnection) -> None:
    conn.prepare_threshold = None
    _TRANSACTION_POOLED.add(conn)
    await _configure(conn)


# No per-checkout health check: it would cost a round trip on every query. A connection
# broken by a database restart fails its query (UNAVAILABLE to that caller) and the pool
# discards it; the next checkout reconnects.
async def open_pool(
    url: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    timeout: float = 10.0,
    transaction_pooling: bool = False,
    wait: bool = True,
    application_name: str | None = None,
) -> AsyncConnectionPool:
    """`wait=False`: return at once, the connections made in the background (a read
    replica's pool: serve starts while the replica is down). `application_name`: what
    pg_stat_activity shows for the pool's connections, unless the URL names one."""
    if application_name is not None:
        params: dict[str, Any] = conninfo_to_dict(url)
        params.setdefault("application_name", application_name)
        url = make_conninfo(**params)
    pool = AsyncConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        configure=_configure_transaction_pooled if transaction_pooling else _configure,
        open=False,
        timeout=timeout,
        kwargs={"autocommit": True},
    )
    await pool.open(wait=wait, timeout=timeout)
    return pool
