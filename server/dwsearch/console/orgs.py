"""The orgs that have chat, for the console's org picker: flags.orgs_with_events, a loose
index scan of dw_chat_events' (org_id, …) index, one probe per org, never a scan of the
events (on a Citus cluster, each shard's distinct orgs)."""

from __future__ import annotations

from psycopg_pool import AsyncConnectionPool

from dwsearch.flags import orgs_with_events

MAX_ORGS = 500
"""The most orgs the picker lists; any other org can still be typed."""


async def with_chat(pool: AsyncConnectionPool, limit: int = MAX_ORGS) -> list[str]:
    async with pool.connection() as conn:
        return await orgs_with_events(conn, limit)
