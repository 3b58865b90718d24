"""The sweep's state as the operators' console (dwsearch.console) shows it: the orgs that
have chat, a page of orgs with their figures, whether an org's flags let the sweep embed
it, and an org's most recent windows with their vectors (the Map). Reads only, each one
statement on the pool it is given (SQL in dwsearch.sweep.store.status and dwsearch.flags),
so that the console, a transport, runs no SQL of its own.

orgs_with_chat is a loose index scan of dw_chat_events' (org_id, …) index, one probe per
org, never a scan of the events (flags.orgs_with_events); org_figures' page is the same
skip scan, stopped once the page is full (status.org_figures)."""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from dwsearch.db.readpool import ReadPool
from dwsearch.flags import disabled_reasons, orgs_with_events
from dwsearch.sweep.store import status
from dwsearch.sweep.store.status import OrgFigures

__all__ = ["OrgFigures", "disabled_reason", "org_figures", "org_windows", "orgs_with_chat"]


async def orgs_with_chat(pool: AsyncConnectionPool, limit: int) -> list[str]:
    """The first `limit` orgs that have chat events, sorted."""
    async with pool.connection() as conn:
        return await orgs_with_events(conn, limit)


async def org_figures(
    pool: AsyncConnectionPool, model: str, *, query: str = "", after: str = "", limit: int
) -> tuple[list[OrgFigures], str | None]:
    """A page of orgs with chat, those after `after` whose id holds `query` (any case), at
    most `limit`, with their figures for `model`; and the `after` of the next page (None:
    the last page)."""
    async with pool.connection() as conn:
        # One more than the page: whether a next page exists, in the same statement.
        rows = await status.org_figures(conn, model, query=query, after=after, limit=limit + 1)
    if len(rows) > limit:
        rows = rows[:limit]
        return rows, rows[-1].org_id
    return rows, None


async def disabled_reason(pool: AsyncConnectionPool, org_id: str) -> str:
    """Why the sweep does not embed the org: the flags that are off, in one line; "" when
    its flags let the sweep embed it (as the sweep reads them, dwsearch.flags)."""
    async with pool.connection() as conn:
        reasons = await disabled_reasons(conn, [org_id])
    return reasons.get(org_id, "")


async def org_windows(
    pool: ReadPool | AsyncConnectionPool, org_id: str, model: str, *, limit: int, snippet: int
) -> list[tuple[Any, ...]]:
    """The org's `limit` most recent windows of `model`, each as (id, provider/channel,
    window_end, its text's first `snippet` characters, its dense vector). One statement
    that names the org: on a Citus cluster one shard's; `pool` is the read pool."""
    async with pool.connection() as conn:
        return await status.recent_windows(conn, org_id, model, limit=limit, snippet=snippet)
