"""The orgs that have chat, for the console's org picker and its Overview.

with_chat: flags.orgs_with_events, a loose index scan of dw_chat_events' (org_id, …)
index, one probe per org, never a scan of the events (on a Citus cluster, each shard's
distinct orgs).

figures: one page of orgs (keyset: the orgs after `after`, whose id holds `query`) with
each one's figures for the sweep's model, in one statement: the same skip scan, stopped
as soon as the page is full, then each figure grouped over the page's orgs alone. Paging
through 10,000 orgs reads 10,000 index probes in all, never every org's rows at once; a
page's figures read its orgs' events once (the backlog needs each event against its
key's watermark)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from dwsearch.db.distributed import is_distributed
from dwsearch.flags import MODULE_FLAG, SEMANTIC_SEARCH_FLAG, orgs_with_events
from dwsearch.sweep.store.keys import ELIGIBLE, WITHIN_RETENTION
from dwsearch.sweep.store.writes import EMBEDDED, POISON

MAX_ORGS = 500
"""The most orgs the picker lists; any other org can still be typed."""
PAGE = 20
"""Orgs on a page of figures, unless asked otherwise."""
MAX_PAGE = 100
MAX_QUERY = 256
"""The longest org id filter (as long as an org id)."""


async def with_chat(pool: AsyncConnectionPool, limit: int = MAX_ORGS) -> list[str]:
    async with pool.connection() as conn:
        return await orgs_with_events(conn, limit)


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

    def as_json(self, now: datetime) -> dict[str, Any]:
        searchable = self.searchable_events / self.events if self.events else None
        lag = (now - self.oldest_pending).total_seconds() if self.oldest_pending else 0.0
        return {
            "org_id": self.org_id,
            "semantic_search": self.semantic_search,
            "windows_embedded": self.windows_embedded,
            "events": self.events,
            "pending_events": self.pending_events,
            "searchable_share": searchable if self.semantic_search else 0.0 if self.events else None,
            "lag_s": max(0.0, lag) if self.semantic_search else None,
            "stalled_keys": self.stalled_keys,
            "poison_windows": self.poison_windows,
            "knowledge_gaps": self.knowledge_gaps,
        }


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


async def figures(
    pool: AsyncConnectionPool, model: str, *, query: str = "", after: str = "", limit: int = PAGE
) -> tuple[list[OrgFigures], str | None]:
    """The page's orgs with their figures, and the `after` of the next page (None: the
    last page)."""
    async with pool.connection() as conn:
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
                "limit": limit + 1,  # one more: whether a next page exists
                "model": model,
                "poison": POISON,
                "embedded": EMBEDDED,
                "semantic": SEMANTIC_SEARCH_FLAG,
                "module": MODULE_FLAG,
            },
        )
        rows = [OrgFigures(*row) for row in await cur.fetchall()]
    if len(rows) > limit:
        rows = rows[:limit]
        return rows, rows[-1].org_id
    return rows, None


def now() -> datetime:
    return datetime.now(UTC)
