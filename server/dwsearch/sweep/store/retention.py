"""Retention: the windows (every model) that must go with the events they hold — older
than a Purge's cutoff, deleted, edited or no longer eligible (each sweep's first step),
or named by a Forget — with their embeddings; and a Purge's org's knowledge gaps
(dw_knowledge_gaps, dwsearch.index.gaps) recorded before its cutoff. Purge and Forget take
the org's retention lock exclusive (see dwsearch.sweep.store.keys)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from psycopg import AsyncConnection, sql

from dwsearch.sweep.store import lexical
from dwsearch.sweep.store.keys import ELIGIBLE, lock_org
from dwsearch.sweep.store.writes import POISON


async def purge(conn: AsyncConnection, org_id: str, cutoff: datetime) -> tuple[int, int]:
    """Delete the org's windows (every model) that include an event before `cutoff`, and
    its knowledge gaps recorded before it, and remember the cutoff (the latest one given
    wins: a retention promise is never relaxed). Returns (embeddings deleted, poison
    windows deleted)."""
    async with conn.transaction():
        await lock_org(conn, org_id, exclusive=True)
        cur = await conn.execute(
            """INSERT INTO dw_sweep_retention AS r (org_id, cutoff, updated_at) VALUES (%s, %s, now())
               ON CONFLICT (org_id) DO UPDATE SET cutoff = greatest(r.cutoff, excluded.cutoff),
                                                  updated_at = excluded.updated_at
               RETURNING cutoff""",
            (org_id, cutoff),
        )
        (effective,) = await cur.fetchone() or (cutoff,)
        embeddings = await lexical.delete_windows(
            conn,
            sql.SQL("e.org_id = %(org)s AND e.window_start < %(cutoff)s"),
            {"org": org_id, "cutoff": effective},
        )
        cur = await conn.execute(
            """WITH gone AS (DELETE FROM dw_sweep_windows WHERE org_id = %s AND window_start < %s RETURNING status)
               SELECT count(*) FILTER (WHERE status = %s) FROM gone""",
            (org_id, effective, POISON),
        )
        row = await cur.fetchone()
        await conn.execute(
            "DELETE FROM dw_knowledge_gaps WHERE org_id = %s AND created_at < %s", (org_id, effective)
        )
    return embeddings, int(row[0]) if row else 0


async def drop_stale_windows(conn: AsyncConnection, org_id: str = "", *, orgs: Sequence[str] = ()) -> int:
    """Delete the finished windows (every model; embedded, skipped or poison) holding an
    event that has since been deleted, edited (its message_text no longer has the md5 the
    ledger recorded) or made ineligible, with their embeddings: embedded text never
    outlives the message it came from. The windows' events are left uncovered, so the
    sweep windows them again. Only `org_id`'s windows when given, or those of `orgs`
    (the sweep's full check, dwsearch.sweep.store.discovery). Returns how many windows
    were dropped."""
    if org_id:
        org_filter = sql.SQL("AND w.org_id = %(org)s")
    elif orgs:
        # Named on the ledger too: the planner then reads only these orgs' ledger rows.
        org_filter = sql.SQL(
            "AND w.org_id = ANY(%(orgs)s::varchar[]) AND l.org_id = ANY(%(orgs)s::varchar[])"
        )
    else:
        org_filter = sql.SQL("")
    find = sql.SQL(
        """SELECT DISTINCT w.id, w.org_id
           FROM dw_sweep_windows AS w
           JOIN dw_sweep_window_events AS l ON l.org_id = w.org_id AND l.window_id = w.id
           WHERE NOT EXISTS (SELECT 1 FROM dw_chat_events AS e
                             WHERE e.id = l.event_id AND e.org_id = w.org_id AND {eligible}
                               AND (l.text_md5 IS NULL OR l.text_md5 = md5(e.message_text)::uuid))
                 {org_filter}"""
    ).format(eligible=ELIGIBLE, org_filter=org_filter)
    cur = await conn.execute(find, {"org": org_id, "orgs": list(orgs)})
    by_org: dict[str, list[UUID]] = {}
    for window_id, org in await cur.fetchall():
        by_org.setdefault(org, []).append(window_id)
    # Org by org: each deletion names its org (one partition, docs/scaling.md).
    return sum([await _drop_windows(conn, ids, org) for org, ids in by_org.items()])


async def drop_windows_holding(conn: AsyncConnection, org_id: str, event_ids: list[UUID]) -> int:
    """Delete the org's finished windows (every model) holding any of the events, with
    their embeddings; their events that still exist are left uncovered for the sweep.
    Returns how many windows were dropped."""
    async with conn.transaction():
        # Exclusive: a window write of the org in flight commits first (and is found
        # here); a later one sees the deletion or edit and refuses (finish_window).
        await lock_org(conn, org_id, exclusive=True)
        cur = await conn.execute(
            # Every model that wrote a window of the org has a watermark there: naming
            # them lets the ledger's primary key (org_id, model, event_id) find the rows.
            """SELECT DISTINCT w.id FROM dw_sweep_window_events AS l
               JOIN dw_sweep_windows AS w ON w.org_id = l.org_id AND w.id = l.window_id
               WHERE l.org_id = %(org)s
                 AND l.model = ANY(ARRAY(SELECT DISTINCT model FROM dw_sweep_watermarks WHERE org_id = %(org)s))
                 AND l.event_id = ANY(%(ids)s) AND w.org_id = %(org)s""",
            {"org": org_id, "ids": event_ids},
        )
        return await _drop_windows(conn, [row[0] for row in await cur.fetchall()], org_id)


async def _drop_windows(conn: AsyncConnection, window_ids: list[UUID], org_id: str = "") -> int:
    """Delete the windows and their embeddings; naming their org (when they are all of
    one) keeps the statements to its partition (docs/scaling.md)."""
    if not window_ids:
        return 0
    org_filter = sql.SQL("AND org_id = %(org)s") if org_id else sql.SQL("")
    params = {"ids": window_ids, "org": org_id}
    # Embeddings first, then windows (the ledger cascades): the order Purge and
    # finish_window lock them in, so none of them can deadlock with another.
    async with conn.transaction():
        removed = sql.SQL("e.id = ANY(%(ids)s::uuid[]) {}").format(
            sql.SQL("AND e.org_id = %(org)s") if org_id else sql.SQL("")
        )
        await lexical.delete_windows(conn, removed, params)  # with their lexical counts
        cur = await conn.execute(
            sql.SQL("DELETE FROM dw_sweep_windows WHERE id = ANY(%(ids)s) {}").format(org_filter), params
        )
    return cur.rowcount
