"""The semantic-search master switch (seed 003 #11): the org's `digital_worker` module
flag AND the admin flag `digital_worker_semantic_search` AND the org's own flag of that
name. Off → the sweep is a no-op for the org and search answers with FTS only."""

from __future__ import annotations

from psycopg import AsyncConnection

MODULE_FLAG = "digital_worker"
SEMANTIC_SEARCH_FLAG = "digital_worker_semantic_search"

_ENABLED_ORGS_SQL = """
SELECT m.org_id
FROM org_feature_flags m
JOIN org_feature_flags s ON s.org_id = m.org_id AND s.flag_key = %(semantic)s AND s.enabled
JOIN admin_feature_flags a ON a.flag_key = %(semantic)s AND a.enabled
WHERE m.flag_key = %(module)s AND m.enabled
"""


async def semantic_search_enabled(conn: AsyncConnection, org_id: str) -> bool:
    cur = await conn.execute(
        _ENABLED_ORGS_SQL + " AND m.org_id = %(org)s",
        {"semantic": SEMANTIC_SEARCH_FLAG, "module": MODULE_FLAG, "org": org_id},
    )
    return await cur.fetchone() is not None


async def enabled_orgs(conn: AsyncConnection) -> list[str]:
    """Every org with semantic search on, sorted."""
    cur = await conn.execute(
        _ENABLED_ORGS_SQL + " ORDER BY m.org_id", {"semantic": SEMANTIC_SEARCH_FLAG, "module": MODULE_FLAG}
    )
    return [org for (org,) in await cur.fetchall()]
