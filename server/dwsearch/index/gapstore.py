"""`dw_knowledge_gaps` SQL (migration 0009): record a gap, read an org's most recent ones,
delete them by id or all. SweepService.Purge deletes an org's gaps before its cutoff in
its own transaction (dwsearch.sweep.store.retention.purge)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from psycopg import AsyncConnection


@dataclass(frozen=True)
class NewGap:
    org_id: str
    query: str  # redacted
    best_score: float | None  # None: the app had no knowledge article
    candidate_ids: Sequence[str]
    created_at: datetime


@dataclass(frozen=True)
class GapRow:
    id: UUID
    query: str
    best_score: float | None
    candidate_ids: list[str]
    created_at: datetime


async def record(conn: AsyncConnection, gap: NewGap) -> None:
    await conn.execute(
        """INSERT INTO dw_knowledge_gaps (org_id, query, best_score, candidate_ids, created_at)
           VALUES (%s, %s, %s, %s, %s)""",
        (gap.org_id, gap.query, gap.best_score, list(gap.candidate_ids), gap.created_at),
    )


async def recent(conn: AsyncConnection, org_id: str, since: datetime | None, limit: int) -> list[GapRow]:
    """The org's `limit` most recent gaps (recorded at or after `since`), newest first."""
    cur = await conn.execute(
        """SELECT id, query, best_score, candidate_ids, created_at FROM dw_knowledge_gaps
           WHERE org_id = %s AND (%s::timestamptz IS NULL OR created_at >= %s::timestamptz)
           ORDER BY created_at DESC, id LIMIT %s""",
        (org_id, since, since, limit),
    )
    return [GapRow(*row) for row in await cur.fetchall()]


async def forget(conn: AsyncConnection, org_id: str, ids: Sequence[UUID] | None) -> int:
    """Delete the org's gaps with these ids (None: all of them); how many went."""
    if ids is None:
        cur = await conn.execute("DELETE FROM dw_knowledge_gaps WHERE org_id = %s", (org_id,))
    else:
        cur = await conn.execute(
            "DELETE FROM dw_knowledge_gaps WHERE org_id = %s AND id = ANY(%s)", (org_id, list(ids))
        )
    return cur.rowcount
