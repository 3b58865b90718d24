"""Status reads: watermarks with their pending events and lag, keys no sweep has
reached yet, poison windows and embedded window counts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg import AsyncConnection, sql

from dwsearch.sweep.keyplan import Position
from dwsearch.sweep.store import discovery
from dwsearch.sweep.store.keys import ELIGIBLE, WITHIN_ORG_RETENTION, WITHIN_RETENTION, Key
from dwsearch.sweep.store.writes import POISON


@dataclass(frozen=True)
class WatermarkRow:
    key: Key
    model: str
    position: Position | None
    updated_at: datetime
    pending: int
    oldest_pending: datetime | None
    consecutive_failures: int
    last_error: str


@dataclass(frozen=True)
class PoisonRow:
    id: str
    key: Key
    model: str
    window_start: datetime
    window_end: datetime
    source_message_ids: tuple[str, ...]
    error: str
    attempts: int
    created_at: datetime


async def watermarks(conn: AsyncConnection, model: str, org_id: str = "") -> list[WatermarkRow]:
    org_filter = sql.SQL("AND w.org_id = %(org)s") if org_id else sql.SQL("")
    # One org's: its events and cutoff named by its id (one partition, docs/scaling.md).
    event_org = sql.SQL("%(org)s") if org_id else sql.SQL("w.org_id")
    retention = WITHIN_ORG_RETENTION if org_id else WITHIN_RETENTION
    query = sql.SQL(
        """SELECT w.org_id, w.provider, w.external_channel_id, w.model, w.last_event_time, w.last_event_id::text,
                  w.updated_at, p.pending, p.oldest, w.consecutive_failures, coalesce(w.last_error, '')
           FROM dw_sweep_watermarks w
           CROSS JOIN LATERAL (
               SELECT count(*) AS pending, min(e.created_at) AS oldest
               FROM dw_chat_events e
               WHERE e.org_id = {event_org} AND e.provider = w.provider AND e.external_channel_id = w.external_channel_id
                 AND {eligible} AND {retention}
                 -- A row comparison the scope index answers (an OR with IS NULL would read
                 -- every event of the key): no position is before every event.
                 AND (e.created_at, e.id) > (coalesce(w.last_event_time, '-infinity'),
                                             coalesce(w.last_event_id, '00000000-0000-0000-0000-000000000000'))
           ) p
           WHERE w.model = %(model)s {org_filter}
           ORDER BY w.org_id, w.provider, w.external_channel_id"""
    ).format(eligible=ELIGIBLE, retention=retention, org_filter=org_filter, event_org=event_org)
    cur = await conn.execute(query, {"model": model, "org": org_id})
    return [
        WatermarkRow(
            key=Key(org, provider, channel),
            model=m,
            position=Position(time, event_id) if time is not None else None,
            updated_at=updated,
            pending=pending,
            oldest_pending=oldest,
            consecutive_failures=failures,
            last_error=error,
        )
        for org, provider, channel, m, time, event_id, updated, pending, oldest, failures, error in await cur.fetchall()
    ]


async def unwatermarked_pending(
    conn: AsyncConnection, model: str, orgs: list[str]
) -> tuple[int, datetime | None]:
    """Eligible events of `orgs`' keys that have no watermark for `model` yet: how many,
    and when the oldest was created."""
    if not orgs:
        return 0, None
    # One org's: named by its id in every table read (one partition, docs/scaling.md).
    one = len(orgs) == 1
    org = sql.SQL("%(org)s") if one else sql.SQL("e.org_id")
    query = sql.SQL(
        """SELECT count(*), min(e.created_at) FROM dw_chat_events e
           WHERE {orgs} AND {eligible} AND {retention}
             AND NOT EXISTS (SELECT 1 FROM dw_sweep_watermarks w
                             WHERE w.org_id = {org} AND w.provider = e.provider
                               AND w.external_channel_id = e.external_channel_id AND w.model = %(model)s)"""
    ).format(
        orgs=sql.SQL("e.org_id = %(org)s" if one else "e.org_id = ANY(%(orgs)s)"),
        eligible=ELIGIBLE,
        retention=WITHIN_ORG_RETENTION if one else WITHIN_RETENTION,
        org=org,
    )
    if not one:
        # Every org's: the unswept keys by a skip scan of the scope index, then their
        # events; not every event of every org (dwsearch.sweep.store.discovery).
        query = sql.SQL(
            # MATERIALIZED: the keys first, then only their events.
            """WITH k AS MATERIALIZED ({unswept})
               SELECT count(*), min(e.created_at)
               FROM k
               JOIN dw_chat_events e
                 ON e.org_id = k.org_id AND e.provider = k.provider AND e.external_channel_id = k.external_channel_id
               WHERE {eligible} AND {retention}"""
        ).format(eligible=ELIGIBLE, retention=WITHIN_RETENTION, unswept=await discovery.unswept_keys(conn))
    cur = await conn.execute(query, {"orgs": orgs, "org": orgs[0], "model": model})
    row = await cur.fetchone()
    return (int(row[0]), row[1]) if row else (0, None)


async def poison_windows(conn: AsyncConnection, model: str, org_id: str = "") -> list[PoisonRow]:
    org_filter = sql.SQL("AND org_id = %(org)s") if org_id else sql.SQL("")
    query = sql.SQL(
        """SELECT id::text, org_id, provider, external_channel_id, model, window_start, window_end,
                  source_message_ids::text[], coalesce(error, ''), attempts, created_at
           FROM dw_sweep_windows WHERE status = %(poison)s AND model = %(model)s {org_filter}
           ORDER BY org_id, window_start"""
    ).format(org_filter=org_filter)
    cur = await conn.execute(query, {"model": model, "org": org_id, "poison": POISON})
    return [
        PoisonRow(wid, Key(org, provider, channel), m, start, end, tuple(ids), error, attempts, created)
        for wid, org, provider, channel, m, start, end, ids, error, attempts, created in await cur.fetchall()
    ]


async def embedded_windows(conn: AsyncConnection, model: str, org_id: str = "") -> int:
    org_filter = sql.SQL("AND org_id = %(org)s") if org_id else sql.SQL("")
    query = sql.SQL("SELECT count(*) FROM dw_message_embeddings WHERE model = %(model)s {org_filter}").format(
        org_filter=org_filter
    )
    cur = await conn.execute(query, {"model": model, "org": org_id})
    row = await cur.fetchone()
    return int(row[0]) if row else 0
