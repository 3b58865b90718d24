"""Whether a connection's database is a Citus coordinator (docs/scaling.md, "Past one
node"), for the few statements that are written two ways.

On one node dwsearch walks an index's distinct keys by a skip scan (a recursive CTE, one
index probe per key). Citus plans a recursive CTE only inside one shard (a filter on the
distribution column), so on a cluster the same statements read the distinct keys with
DISTINCT instead: every shard's index read in parallel on its worker, the coordinator
merging what comes back. Everything else is one statement for both."""

from __future__ import annotations

import weakref

from psycopg import AsyncConnection, Connection

_KNOWN: weakref.WeakKeyDictionary[AsyncConnection | Connection, bool] = weakref.WeakKeyDictionary()

QUERY = "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"


async def is_distributed(conn: AsyncConnection) -> bool:
    """Whether `conn`'s database has the citus extension (asked once per connection)."""
    known = _KNOWN.get(conn)
    if known is None:
        cur = await conn.execute(QUERY)
        row = await cur.fetchone()
        known = _KNOWN[conn] = bool(row and row[0])
    return known


def known_distributed(conn: AsyncConnection) -> bool:
    """What is_distributed answered for `conn`, without a statement (False if never asked):
    for a connection that has since broken."""
    return _KNOWN.get(conn, False)


def is_distributed_sync(conn: Connection) -> bool:
    known = _KNOWN.get(conn)
    if known is None:
        row = conn.execute(QUERY).fetchone()
        known = _KNOWN[conn] = bool(row and row[0])
    return known
