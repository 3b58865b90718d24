"""Status reads: watermarks with their pending events and lag, keys no sweep has
reached yet, poison windows and embedded window counts; and the console's (through
dwsearch.sweep.overview): a page of orgs with their figures, an org's most recent windows.

org_figures: one page of orgs (keyset: the orgs after `after`, whose id holds `query`) with
each one's figures for a model, in one statement: a skip scan of dw_chat_events' (org_id,
…) index, stopped as soon as the page is full (on a Citus cluster, each shard's distinct
orgs), then each figure grouped over the page's orgs alone. Paging through 10,000 orgs
reads 10,000 index probes in all, never every org's rows at once; a page's figures read
its orgs' events once (the backlog needs each event against its key's watermark)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, sql

from dwsearch.db.distributed import is_distributed
from dwsearch.flags import MODULE_FLAG, SEMANTIC_SEARCH_FLAG
from dwsearch.sweep.keyplan import Position
from dwsearch.sweep.store import discovery
from dwsearch.sweep.store.keys import ELIGIBLE, WITHIN_ORG_RETENTION, WITHIN_RETENTION, Key
from dwsearch.sweep.store.writes import EMBEDDED, POISON


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


@dataclass(frozen=True)
class OrgFigures:
    org_id: str
    semantic_search: bool  # the org's flags let the sweep embed it (dwsearch.flags)
    windows_embedded: int
    events: int  # eligible events within the org's retention
    searchable_events: int  # of those, in an embedded window (the ledger): found by meaning
    pending_events: int  # of those, not in a finished window yet (the backlog)
    oldest_pending: datetime | None
    stalled_keys: int  # keys whose last sweeps failed (consecutive_failures > 0)
    poison_windows: int
    knowledge_gaps: int


# The page: the orgs after %(after)s holding %(query)s, at most %(limit)s. A recursive skip
# scan that the page's LIMIT stops (a WITH query is read only as far as it is fetched).
_PAGE_SKIP_SCAN = """
seen(org_id) AS (
    (SELECT org_id FROM dw_chat_events WHERE org_id > %(after)s ORDER BY org_id LIMIT 1)
    UNION ALL
    SELECT (SELECT e.org_id FROM dw_chat_events e WHERE e.org_id > seen.org_id ORDER BY e.org_id LIMIT 1)
    FROM seen WHERE seen.org_id IS NOT NULL
),
page AS MATERIALIZED (
    SELECT org_id FROM seen
    WHERE org_id IS NOT NULL AND strpos(lower(org_id), %(query)s) > 0
    LIMIT %(limit)s
)"""
# On a Citus cluster (no recursive CTE over shards): each shard's distinct orgs.
_PAGE_DISTINCT = """
page AS MATERIALIZED (
    SELECT DISTINCT org_id FROM dw_chat_events
    WHERE org_id > %(after)s AND strpos(lower(org_id), %(query)s) > 0
    ORDER BY org_id LIMIT %(limit)s
)"""

_FIGURES = """
WITH {recursive} {page},
embedded AS (
    SELECT org_id, count(*) AS n FROM dw_message_embeddings
    WHERE model = %(model)s AND org_id IN (SELECT org_id FROM page) GROUP BY org_id
),
events AS (
    SELECT e.org_id, count(*) AS n, count(*) FILTER (WHERE sw.status = %(embedded)s) AS searchable,
           count(*) FILTER (WHERE {pending}) AS pending, min(e.created_at) FILTER (WHERE {pending}) AS oldest
    FROM dw_chat_events e
    LEFT JOIN dw_sweep_watermarks w
      ON w.org_id = e.org_id AND w.provider = e.provider AND w.external_channel_id = e.external_channel_id
     AND w.model = %(model)s
    -- The ledger: the finished window that holds the event, if any (skipped, poison or embedded).
    LEFT JOIN dw_sweep_window_events l ON l.org_id = e.org_id AND l.model = %(model)s AND l.event_id = e.id
    LEFT JOIN dw_sweep_windows sw ON sw.org_id = l.org_id AND sw.id = l.window_id
    WHERE e.org_id IN (SELECT org_id FROM page) AND {eligible} AND {retention}
    GROUP BY e.org_id
),
stalled AS (
    SELECT org_id, count(*) AS n FROM dw_sweep_watermarks
    WHERE model = %(model)s AND consecutive_failures > 0 AND org_id IN (SELECT org_id FROM page) GROUP BY org_id
),
poison AS (
    SELECT org_id, count(*) AS n FROM dw_sweep_windows
    WHERE status = %(poison)s AND model = %(model)s AND org_id IN (SELECT org_id FROM page) GROUP BY org_id
),
gaps AS (
    SELECT org_id, count(*) AS n FROM dw_knowledge_gaps WHERE org_id IN (SELECT org_id FROM page) GROUP BY org_id
),
flags AS (
    SELECT m.org_id FROM org_feature_flags m
    JOIN org_feature_flags s ON s.org_id = m.org_id AND s.flag_key = %(semantic)s AND s.enabled
    JOIN admin_feature_flags a ON a.flag_key = %(semantic)s AND a.enabled
    WHERE m.flag_key = %(module)s AND m.enabled AND m.org_id IN (SELECT org_id FROM page)
)
SELECT p.org_id, f.org_id IS NOT NULL, coalesce(embedded.n, 0), coalesce(events.n, 0),
       coalesce(events.searchable, 0), coalesce(events.pending, 0), events.oldest, coalesce(stalled.n, 0), coalesce(poison.n, 0),
       coalesce(gaps.n, 0)
FROM page p
LEFT JOIN flags f ON f.org_id = p.org_id
LEFT JOIN embedded ON embedded.org_id = p.org_id
LEFT JOIN events ON events.org_id = p.org_id
LEFT JOIN stalled ON stalled.org_id = p.org_id
LEFT JOIN poison ON poison.org_id = p.org_id
LEFT JOIN gaps ON gaps.org_id = p.org_id
ORDER BY p.org_id"""

# An event after its key's watermark, or of a key with none: not in a finished window.
_PENDING = """(w.org_id IS NULL OR (e.created_at, e.id) > (coalesce(w.last_event_time, '-infinity'),
               coalesce(w.last_event_id, '00000000-0000-0000-0000-000000000000')))"""


async def org_figures(
    conn: AsyncConnection, model: str, *, query: str, after: str, limit: int
) -> list[OrgFigures]:
    """The first `limit` orgs with chat after `after` (in org id order) whose id holds
    `query` in any case, each with its figures for `model`."""
    distributed = await is_distributed(conn)
    statement = sql.SQL(_FIGURES).format(
        recursive=sql.SQL("" if distributed else "RECURSIVE"),
        page=sql.SQL(_PAGE_DISTINCT if distributed else _PAGE_SKIP_SCAN),
        pending=sql.SQL(_PENDING),
        eligible=ELIGIBLE,
        retention=WITHIN_RETENTION,
    )
    cur = await conn.execute(
        statement,
        {
            "after": after,
            "query": query.lower(),
            "limit": limit,
            "model": model,
            "poison": POISON,
            "embedded": EMBEDDED,
            "semantic": SEMANTIC_SEARCH_FLAG,
            "module": MODULE_FLAG,
        },
    )
    return [OrgFigures(*row) for row in await cur.fetchall()]


# One org's (one shard's on a Citus cluster): its windows of the model, the most recent first.
_ORG_WINDOWS = """
SELECT id::text, provider || '/' || external_channel_id, window_end, left(content, %(snippet)s), embedding
FROM dw_message_embeddings
WHERE org_id = %(org)s AND model = %(model)s
ORDER BY window_end DESC, id DESC
LIMIT %(limit)s
"""


async def recent_windows(
    conn: AsyncConnection, org_id: str, model: str, *, limit: int, snippet: int
) -> list[tuple[Any, ...]]:
    """The org's `limit` most recent windows of `model` (by window_end, then id), each as
    (id, provider/channel, window_end, the first `snippet` characters of its text, its
    dense vector: a pgvector HalfVector)."""
    cur = await conn.execute(
        _ORG_WINDOWS, {"org": org_id, "model": model, "snippet": snippet, "limit": limit}
    )
    return await cur.fetchall()
