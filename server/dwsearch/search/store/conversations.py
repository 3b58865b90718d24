"""Messages around hits and Similar's conversations: the context messages of each hit, a
window's span, a message and the span of the windows holding it, a conversation's windows
and latest messages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pgvector import HalfVector, SparseVector
from psycopg import AsyncConnection, sql

from dwsearch.db.events import ELIGIBLE_EVENTS, eligible
from dwsearch.search.rows import ContextRow
from dwsearch.search.store.scope import CONVERSATION_WINDOWS, ChatScope, conversation_params


async def context_messages(
    conn: AsyncConnection, org_id: str, bounds: list[tuple[str, str]], n: int
) -> list[tuple[list[ContextRow], list[ContextRow]]]:
    """For each (first message id, last message id) of a hit: up to `n` eligible messages
    before the first and after the last, in the same org, provider and channel, each list
    oldest first. One round trip; every row is filtered by the org, the anchors too (an id
    of another org finds nothing). Uses the scope index (org, provider, channel,
    created_at, id)."""
    if not bounds or n <= 0:
        return [([], []) for _ in bounds]
    cur = await conn.execute(
        sql.SQL(
            """WITH h AS (
                   SELECT * FROM unnest(%(first)s::uuid[], %(last)s::uuid[]) WITH ORDINALITY AS h(first_id, last_id, n)
               )
               SELECT h.n, 0 AS side, b.id::text, b.created_at, b.message_text
               FROM h JOIN dw_chat_events AS f ON f.id = h.first_id AND f.org_id = %(org)s
               CROSS JOIN LATERAL (
                   SELECT id, created_at, message_text FROM dw_chat_events
                   WHERE org_id = %(org)s AND provider = f.provider AND external_channel_id = f.external_channel_id
                     AND {eligible} AND (created_at, id) < (f.created_at, f.id)
                   ORDER BY created_at DESC, id DESC LIMIT %(limit)s
               ) AS b
               UNION ALL
               SELECT h.n, 1, a.id::text, a.created_at, a.message_text
               FROM h JOIN dw_chat_events AS l ON l.id = h.last_id AND l.org_id = %(org)s
               CROSS JOIN LATERAL (
                   SELECT id, created_at, message_text FROM dw_chat_events
                   WHERE org_id = %(org)s AND provider = l.provider AND external_channel_id = l.external_channel_id
                     AND {eligible} AND (created_at, id) > (l.created_at, l.id)
                   ORDER BY created_at, id LIMIT %(limit)s
               ) AS a"""
        ).format(eligible=ELIGIBLE_EVENTS),
        {"org": org_id, "first": [b[0] for b in bounds], "last": [b[1] for b in bounds], "limit": n},
    )
    out: list[tuple[list[ContextRow], list[ContextRow]]] = [([], []) for _ in bounds]
    for index, side, mid, created_at, text in await cur.fetchall():
        out[index - 1][side].append(ContextRow(mid, created_at, text))
    for before, after in out:
        before.sort(key=lambda r: (r.created_at, r.id))
        after.sort(key=lambda r: (r.created_at, r.id))
    return out


async def window_conversation(conn: AsyncConnection, org_id: str, window_id: str) -> ChatScope | None:
    """The org's embedded window `window_id` (a UUID) as a conversation: its channel over
    its time span; None when the org has no such window."""
    cur = await conn.execute(
        """SELECT provider, external_channel_id, window_start, window_end FROM dw_message_embeddings
           WHERE id = %(window)s::uuid AND org_id = %(org)s""",
        {"window": window_id, "org": org_id},
    )
    row = await cur.fetchone()
    return None if row is None else ChatScope(org_id, row[0], row[1], row[2], row[3])


@dataclass(frozen=True)
class MessageAnchor:
    """An eligible message Similar starts from, and the time span of the finished windows
    (of the given models, any status) that hold it; None when none does yet."""

    message: ContextRow
    provider: str
    external_channel_id: str
    windows_start: datetime | None
    windows_end: datetime | None


async def message_anchor(
    conn: AsyncConnection, org_id: str, message_id: str, models: Sequence[str]
) -> MessageAnchor | None:
    """The org's eligible message `message_id` (a UUID) and the span of `models`' windows
    holding it, through the sweep's ledger; None when the org has no such message."""
    cur = await conn.execute(
        sql.SQL(
            """SELECT e.id::text, e.created_at, e.message_text, e.provider, e.external_channel_id,
                      min(w.window_start), max(w.window_end)
               FROM dw_chat_events AS e
               LEFT JOIN dw_sweep_window_events AS ledger
                      ON ledger.org_id = e.org_id AND ledger.event_id = e.id AND ledger.model = ANY(%(models)s)
               LEFT JOIN dw_sweep_windows AS w ON w.id = ledger.window_id AND w.org_id = e.org_id
               WHERE e.id = %(message)s::uuid AND e.org_id = %(org)s AND {eligible}
               GROUP BY e.id, e.created_at, e.message_text, e.provider, e.external_channel_id"""
        ).format(eligible=eligible("e")),
        {"message": message_id, "org": org_id, "models": list(models)},
    )
    row = await cur.fetchone()
    if row is None:
        return None
    return MessageAnchor(ContextRow(row[0], row[1], row[2]), row[3], row[4], row[5], row[6])


async def conversation_windows(
    conn: AsyncConnection, conversation: ChatScope, models: Sequence[str]
) -> dict[str, list[tuple[HalfVector, SparseVector | None]]]:
    """Each of `models`' embedded windows of the conversation (CONVERSATION_WINDOWS in its
    org): their dense and sparse vectors, by model; a model with none is absent."""
    cur = await conn.execute(
        sql.SQL(
            """SELECT model, embedding, sparse FROM dw_message_embeddings
               WHERE org_id = %(org)s AND model = ANY(%(models)s) AND {windows}
               ORDER BY window_start, id"""
        ).format(windows=CONVERSATION_WINDOWS),
        {"org": conversation.org_id, "models": list(models), **conversation_params(conversation)},
    )
    found: dict[str, list[tuple[HalfVector, SparseVector | None]]] = {}
    for model, dense, sparse in await cur.fetchall():
        found.setdefault(model, []).append((dense, sparse))
    return found


async def conversation_messages(
    conn: AsyncConnection, conversation: ChatScope, limit: int
) -> list[ContextRow]:
    """The conversation's `limit` latest eligible messages (its org, provider and channel
    within its time range), oldest first."""
    cur = await conn.execute(
        sql.SQL(
            """SELECT id::text, created_at, message_text FROM dw_chat_events
               WHERE {filters} ORDER BY created_at DESC, id DESC LIMIT %(limit)s"""
        ).format(filters=conversation.event_filters()),
        {**conversation.params(), "limit": limit},
    )
    return [ContextRow(*row) for row in reversed(await cur.fetchall())]
