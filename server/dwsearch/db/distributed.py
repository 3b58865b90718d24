"""Whether a connection's database is a Citus coordinator (docs/scaling.md, "Past one
node"), for the few statements that are written two ways.

On one node dwsearch walks an index's distinct keys by a skip scan (a recursive CTE, one
index probe per key). Citus plans a recursive CTE only inside one shard (a filter on the
distribution column), so on a cluster the same statements read the distinct keys with
DISTINCT instead: every shard's index read in parallel on its worker, the coordinator
merging what comes back. Everything else is one statement for both.

When a worker is down, a statement that reads every shard fails; unreachable_orgs says
which orgs' shards are out of reach, so that a sweep of every org sweeps the others
(dwsearch.sweep.sweeper)."""

from __future__ import annotations

import weakref
from collections.abc import Sequence

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


async def unreachable_orgs(conn: AsyncConnection, orgs: Sequence[str]) -> dict[str, str]:
    """On a cluster, the orgs of `orgs` whose shards lie on a worker the coordinator cannot
    reach now, each with why in one line; {} on one node, and when every worker answers
    (one connection check per worker, citus_check_connection_to_node: an address that
    refuses answers at once, one that drops packets after citus.node_connection_timeout).
    Every org table is in one co-location group, so an org's shards share one worker."""
    if not orgs or not await is_distributed(conn):
        return {}
    cur = await conn.execute(
        """SELECT groupid, nodename, nodeport FROM pg_dist_node
           WHERE isactive AND noderole = 'primary' AND shouldhaveshards
             AND NOT citus_check_connection_to_node(nodename, nodeport)"""
    )
    down = {group: f"{name}:{port}" for group, name, port in await cur.fetchall()}
    if not down:
        return {}
    cur = await conn.execute(
        """SELECT o.org_id, p.groupid FROM unnest(%(orgs)s::text[]) AS o (org_id)
           JOIN pg_dist_placement AS p
             ON p.shardid = get_shard_id_for_distribution_column('dw_sweep_watermarks', o.org_id)""",
        {"orgs": list(orgs)},
    )
    return {
        org: f"the worker holding its shards ({down[group]}) is unreachable"
        for org, group in await cur.fetchall()
        if group in down
    }
