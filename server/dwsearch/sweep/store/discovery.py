"""How a sweep finds its keys with work without reading every event of every org.

Two kinds of work, found two ways:
- New events, after a key's watermark, and keys no sweep has reached yet: found every
  sweep, for every org, from the indexes alone. keys_with_new_events probes the Go
  module's scope index (org, provider, channel, created_at, id) once per watermark for
  an eligible event past it, and walks the same index's distinct keys (a skip scan, one
  probe per key) for keys without a watermark: about 100,000 probes at 100,000 keys,
  whatever the number of events (`python -m bench.tenancy`).
- Events at or before a watermark that no finished window covers (inserted late, or left
  uncovered by a Purge, Forget, RetryPoison or dropped window), and finished windows
  holding events since deleted, edited or made ineligible: these need every event of an
  org read against the ledger. That is the full check (keys.pending_keys and
  retention.drop_stale_windows over a batch of orgs), and it runs over the orgs least
  recently checked first (dw_sweep_org_checks), batch after batch, until the sweep's
  full-check budget is spent. A deployment whose every org fits the budget checks every
  org every sweep, as before; a larger one checks each org every few sweeps, and the
  metric dwsearch_sweep_full_check_oldest_seconds says how long ago the least recently
  checked org was. Purge, Forget and RetryPoison delete their org's row, so it is
  checked first by the next sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from psycopg import AsyncConnection, sql

from dwsearch.db.distributed import is_distributed
from dwsearch.sweep.store.keys import ELIGIBLE, WITHIN_ORG_RETENTION, WITHIN_RETENTION, Key

# Seconds a sweep spends on its full check, at least one batch of orgs.
FULL_CHECK_BUDGET_S = 2.0
# Orgs a full-check batch reads at once (one statement each for the stale windows and
# for each model's backlog). Their events lie all over the events table (rows are written
# in time order, every org interleaved): a batch holding a 50,000-window org reads most of
# it, about 4 s at 10,000 orgs (`python -m bench.tenancy`).
FULL_CHECK_BATCH_ORGS = 50


# Keys of %(orgs)s with events and no watermark for %(model)s: the distinct keys of the
# scope index by a skip scan (one probe per key), those without a watermark kept.
UNSWEPT_KEYS = sql.SQL(
    """SELECT k.org_id, k.provider, k.external_channel_id FROM (
           WITH RECURSIVE k (org_id, provider, external_channel_id) AS (
               (SELECT org_id, provider, external_channel_id FROM dw_chat_events
                ORDER BY org_id, provider, external_channel_id LIMIT 1)
               UNION ALL
               SELECT n.org_id, n.provider, n.external_channel_id
               FROM k CROSS JOIN LATERAL (
                   SELECT e.org_id, e.provider, e.external_channel_id FROM dw_chat_events AS e
                   WHERE (e.org_id, e.provider, e.external_channel_id)
                         > (k.org_id, k.provider, k.external_channel_id)
                   ORDER BY e.org_id, e.provider, e.external_channel_id LIMIT 1) AS n
           )
           SELECT * FROM k
       ) AS k
       WHERE k.org_id = ANY(%(orgs)s::varchar[])
         AND NOT EXISTS (SELECT 1 FROM dw_sweep_watermarks AS w
                         WHERE w.org_id = k.org_id AND w.provider = k.provider
                           AND w.external_channel_id = k.external_channel_id AND w.model = %(model)s)"""
)
# The same on a Citus cluster (dwsearch.db.distributed), which plans no recursive CTE over
# many shards: each shard's distinct keys of %(orgs)s, read on its worker.
UNSWEPT_KEYS_DISTRIBUTED = sql.SQL(
    """SELECT k.org_id, k.provider, k.external_channel_id FROM (
           SELECT DISTINCT org_id, provider, external_channel_id FROM dw_chat_events
           WHERE org_id = ANY(%(orgs)s::varchar[])
       ) AS k
       WHERE NOT EXISTS (SELECT 1 FROM dw_sweep_watermarks AS w
                         WHERE w.org_id = k.org_id AND w.provider = k.provider
                           AND w.external_channel_id = k.external_channel_id AND w.model = %(model)s)"""
)


async def unswept_keys(conn: AsyncConnection) -> sql.Composable:
    """UNSWEPT_KEYS, or its Citus form on a cluster."""
    return UNSWEPT_KEYS_DISTRIBUTED if await is_distributed(conn) else UNSWEPT_KEYS


async def keys_with_new_events(conn: AsyncConnection, orgs: Sequence[str], model: str) -> list[Key]:
    """Keys of `orgs` with an eligible event (within retention) after their watermark for
    `model`, and keys with events but no watermark for it (whose events
    keys.pending_keys then judges)."""
    if not orgs:
        return []
    if len(orgs) == 1:
        # One org, named by its id for every table the statement reads, the events'
        # subquery too: one shard on a cluster, whatever the other workers do.
        query = sql.SQL(
            """SELECT w.org_id, w.provider, w.external_channel_id
               FROM dw_sweep_watermarks AS w
               WHERE w.model = %(model)s AND w.org_id = %(org)s
                 AND (w.last_event_time IS NULL
                      OR EXISTS (SELECT 1 FROM dw_chat_events AS e
                                 WHERE e.org_id = %(org)s AND e.provider = w.provider
                                   AND e.external_channel_id = w.external_channel_id
                                   AND (e.created_at, e.id) > (w.last_event_time, w.last_event_id)
                                   AND {eligible} AND {retention}))
               UNION ALL
               SELECT k.org_id, k.provider, k.external_channel_id FROM (
                   SELECT DISTINCT org_id, provider, external_channel_id FROM dw_chat_events WHERE org_id = %(org)s
               ) AS k
               WHERE NOT EXISTS (SELECT 1 FROM dw_sweep_watermarks AS w
                                 WHERE w.org_id = %(org)s AND w.provider = k.provider
                                   AND w.external_channel_id = k.external_channel_id AND w.model = %(model)s)"""
        ).format(eligible=ELIGIBLE, retention=WITHIN_ORG_RETENTION)
        cur = await conn.execute(query, {"org": orgs[0], "model": model})
        return [Key(*row) for row in await cur.fetchall()]
    query = sql.SQL(
        """SELECT w.org_id, w.provider, w.external_channel_id
           FROM dw_sweep_watermarks AS w
           WHERE w.model = %(model)s AND w.org_id = ANY(%(orgs)s::varchar[])
             AND (w.last_event_time IS NULL
                  OR EXISTS (SELECT 1 FROM dw_chat_events AS e
                             WHERE e.org_id = w.org_id AND e.provider = w.provider
                               AND e.external_channel_id = w.external_channel_id
                               AND (e.created_at, e.id) > (w.last_event_time, w.last_event_id)
                               AND {eligible} AND {retention}))
           UNION ALL
           SELECT k.org_id, k.provider, k.external_channel_id FROM ({unswept}) AS k"""
    ).format(eligible=ELIGIBLE, retention=WITHIN_RETENTION, unswept=await unswept_keys(conn))
    cur = await conn.execute(query, {"orgs": list(orgs), "model": model})
    return [Key(*row) for row in await cur.fetchall()]


# The orgs with windows: a skip scan of the windows' org index, one probe per org (on a
# Citus cluster, each shard's distinct orgs).
WINDOWED_ORGS = sql.SQL(
    """RECURSIVE windowed (org_id) AS (
           (SELECT org_id FROM dw_sweep_windows ORDER BY org_id LIMIT 1)
           UNION ALL
           SELECT (SELECT w.org_id FROM dw_sweep_windows AS w WHERE w.org_id > windowed.org_id
                   ORDER BY w.org_id LIMIT 1)
           FROM windowed WHERE windowed.org_id IS NOT NULL
       )"""
)
WINDOWED_ORGS_DISTRIBUTED = sql.SQL("windowed (org_id) AS (SELECT DISTINCT org_id FROM dw_sweep_windows)")


async def check_order(conn: AsyncConnection, orgs: Sequence[str]) -> list[str]:
    """`orgs` and every org with finished windows, in full-check order: never checked
    (or asked to be checked again) first, then the least recently checked."""
    windowed = WINDOWED_ORGS_DISTRIBUTED if await is_distributed(conn) else WINDOWED_ORGS
    cur = await conn.execute(
        sql.SQL(
            """WITH {windowed},
               candidates AS (
                   SELECT org_id FROM windowed WHERE org_id IS NOT NULL
                   UNION
                   SELECT unnest(%(orgs)s::varchar[])
               )
               SELECT c.org_id FROM candidates AS c
               LEFT JOIN dw_sweep_org_checks AS k ON k.org_id = c.org_id
               ORDER BY k.checked_at NULLS FIRST, c.org_id"""
        ).format(windowed=windowed),
        {"orgs": list(orgs)},
    )
    return [org for (org,) in await cur.fetchall()]


async def check_order_among(conn: AsyncConnection, orgs: Sequence[str]) -> list[str]:
    """`orgs` alone in full-check order (check_order without the other orgs with windows),
    read from their own shards only: the order of a sweep that leaves out the orgs of an
    unreachable worker (dwsearch.db.distributed.unreachable_orgs)."""
    if not orgs:
        return []
    cur = await conn.execute(
        "SELECT org_id, checked_at FROM dw_sweep_org_checks WHERE org_id = ANY(%(orgs)s::varchar[])",
        {"orgs": list(orgs)},
    )
    checked: dict[str, datetime] = dict(await cur.fetchall())
    return sorted(set(orgs), key=lambda org: (org in checked, checked.get(org) or datetime.min, org))


async def mark_checked(conn: AsyncConnection, orgs: Sequence[str]) -> None:
    """Record that `orgs` were checked just now (the database's clock, so that the order
    is the order of the checks, whichever sweeper made them)."""
    if not orgs:
        return
    await conn.execute(
        """INSERT INTO dw_sweep_org_checks (org_id, checked_at) SELECT unnest(%(orgs)s::varchar[]), clock_timestamp()
           ON CONFLICT (org_id) DO UPDATE SET checked_at = excluded.checked_at""",
        {"orgs": list(orgs)},
    )


async def check_again(conn: AsyncConnection, org_id: str = "") -> None:
    """Have the next sweep check the org (every org when empty) first: something left
    events behind its keys' watermarks uncovered."""
    if org_id:
        await conn.execute("DELETE FROM dw_sweep_org_checks WHERE org_id = %s", (org_id,))
    else:
        await conn.execute("DELETE FROM dw_sweep_org_checks")


async def oldest_check(conn: AsyncConnection, orgs: Sequence[str]) -> datetime | None:
    """When the least recently checked of `orgs` was checked; None when one never was."""
    if not orgs:
        return None
    if len(orgs) == 1:  # by its id: one shard on a cluster, whatever other workers do
        cur = await conn.execute("SELECT checked_at FROM dw_sweep_org_checks WHERE org_id = %s", (orgs[0],))
        found = await cur.fetchone()
        return found[0] if found else None
    # Filtered on the org ids themselves, so that a cluster reads only their shards.
    cur = await conn.execute(
        "SELECT count(*), min(checked_at) FROM dw_sweep_org_checks WHERE org_id = ANY(%(orgs)s::varchar[])",
        {"orgs": list(set(orgs))},
    )
    row = await cur.fetchone()
    if row is None or row[0] < len(set(orgs)):
        return None
    oldest: datetime | None = row[1]
    return oldest
