"""The orgs that have chat, for the console's org picker: a loose index scan of
dw_chat_events' (org_id, …) index, one probe per org, never a scan of the events."""

from __future__ import annotations

from psycopg_pool import AsyncConnectionPool

MAX_ORGS = 500
"""The most orgs the picker lists; any other org can still be typed."""

_ORGS_SQL = """
WITH RECURSIVE orgs AS (
    (SELECT org_id FROM dw_chat_events ORDER BY org_id LIMIT 1)
    UNION ALL
    SELECT (SELECT e.org_id FROM dw_chat_events e WHERE e.org_id > orgs.org_id ORDER BY e.org_id LIMIT 1)
    FROM orgs WHERE orgs.org_id IS NOT NULL
)
SELECT org_id FROM orgs WHERE org_id IS NOT NULL LIMIT %s
"""


async def with_chat(pool: AsyncConnectionPool, limit: int = MAX_ORGS) -> list[str]:
    async with pool.connection() as conn:
        cursor = await conn.execute(_ORGS_SQL, (limit,))
        return [str(row[0]) for row in await cursor.fetchall()]
