"""The semantic-search master switch (docs/design.md, "Feature flags"): the org's
`digital_worker` module flag AND the admin flag `digital_worker_semantic_search` AND the
org's own flag of that name. Off → the sweep is a no-op for the org and search answers
with FTS only.

And one opt-in of an org's own: `digital_worker_knowledge_gaps` (dwsearch.index.gaps),
off unless the org's row says on."""

from __future__ import annotations

from psycopg import AsyncConnection

from dwsearch.db.distributed import is_distributed

MODULE_FLAG = "digital_worker"
SEMANTIC_SEARCH_FLAG = "digital_worker_semantic_search"
KNOWLEDGE_GAPS_FLAG = "digital_worker_knowledge_gaps"

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


async def knowledge_gaps_enabled(conn: AsyncConnection, org_id: str) -> bool:
    """Whether the org opted in to knowledge-gap recording (its own flag; no admin tier)."""
    cur = await conn.execute(
        "SELECT 1 FROM org_feature_flags WHERE org_id = %s AND flag_key = %s AND enabled",
        (org_id, KNOWLEDGE_GAPS_FLAG),
    )
    return await cur.fetchone() is not None


async def enabled_orgs(conn: AsyncConnection) -> list[str]:
    """Every org with semantic search on, sorted."""
    cur = await conn.execute(
        _ENABLED_ORGS_SQL + " ORDER BY m.org_id", {"semantic": SEMANTIC_SEARCH_FLAG, "module": MODULE_FLAG}
    )
    return [org for (org,) in await cur.fetchall()]


# How many orgs a sweep of every org names as skipped (dwsearch.sweep: orgs_skipped).
MAX_REPORTED_ORGS = 100


async def disabled_reasons(conn: AsyncConnection, org_ids: list[str]) -> dict[str, str]:
    """For each org of `org_ids` with semantic search off, the flags that are off, as one
    line ("org flag digital_worker is off; admin flag ... is off"); orgs that are on are
    left out."""
    if not org_ids:
        return {}
    cur = await conn.execute(
        """SELECT o.org_id,
                  coalesce((SELECT enabled FROM org_feature_flags WHERE org_id = o.org_id AND flag_key = %(module)s), false),
                  coalesce((SELECT enabled FROM admin_feature_flags WHERE flag_key = %(semantic)s), false),
                  coalesce((SELECT enabled FROM org_feature_flags WHERE org_id = o.org_id AND flag_key = %(semantic)s), false)
           FROM unnest(%(orgs)s::text[]) AS o(org_id)""",
        {"orgs": org_ids, "module": MODULE_FLAG, "semantic": SEMANTIC_SEARCH_FLAG},
    )
    reasons: dict[str, str] = {}
    for org, module, admin, semantic in await cur.fetchall():
        off = []
        if not module:
            off.append(f"org flag {MODULE_FLAG} is off")
        if not admin:
            off.append(f"admin flag {SEMANTIC_SEARCH_FLAG} is off")
        if not semantic:
            off.append(f"org flag {SEMANTIC_SEARCH_FLAG} is off")
        if off:
            reasons[org] = "; ".join(off)
    return reasons


async def orgs_with_events(conn: AsyncConnection, limit: int = MAX_REPORTED_ORGS) -> list[str]:
    """The first `limit` distinct org_ids of dw_chat_events, sorted: a skip scan of the
    scope index (one index probe per org, whatever the table's size). On a Citus cluster
    (dwsearch.db.distributed), which plans no recursive CTE over many shards, each shard's
    distinct orgs are read on its worker and the coordinator keeps the first `limit`."""
    if await is_distributed(conn):
        query = "SELECT DISTINCT org_id FROM dw_chat_events ORDER BY org_id LIMIT %(limit)s"
    else:
        query = """WITH RECURSIVE orgs(org_id, n) AS (
               (SELECT org_id, 1 FROM dw_chat_events ORDER BY org_id LIMIT 1)
               UNION ALL
               SELECT (SELECT e.org_id FROM dw_chat_events AS e WHERE e.org_id > orgs.org_id ORDER BY e.org_id LIMIT 1),
                      n + 1
               FROM orgs WHERE orgs.org_id IS NOT NULL AND n < %(limit)s
           )
           SELECT org_id FROM orgs WHERE org_id IS NOT NULL"""
    cur = await conn.execute(query, {"limit": limit})
    return [org for (org,) in await cur.fetchall()]
