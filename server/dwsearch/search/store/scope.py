"""What every chat statement is limited to (ChatScope: one org, narrowed by provider, channel
and time), the window columns and row, and a conversation's windows (Similar leaves them
out of its KNN)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql

from dwsearch.db.events import ELIGIBLE_EVENTS
from dwsearch.search.rows import WindowRow

WINDOW_COLUMNS = sql.SQL(
    "id::text, provider, external_channel_id, window_start, window_end, content, source_message_ids"
)
WINDOW_COLUMNS_QUALIFIED = sql.SQL(
    "dw_message_embeddings.id::text, dw_message_embeddings.provider, dw_message_embeddings.external_channel_id,"
    " window_start, window_end, content, dw_message_embeddings.source_message_ids"
)


@dataclass(frozen=True)
class ChatScope:
    """What every chat query is limited to: one org's eligible events and embedded windows,
    narrowed by provider, channel and time. (The Index's NamespaceScope is a namespace in
    one model's vector space; rpcpolicy.Scope is what a bearer token may call.)"""

    org_id: str
    provider: str = ""
    external_channel_id: str = ""
    start: datetime | None = None
    end: datetime | None = None

    def shape(self) -> ChatScope:
        """A stand-in with the same optional filters present, and no values: the text of
        every statement depends on this alone, so statements are built once per shape
        (_knn_sql, _full_text_sql, _full_text_with_windows_sql), not on every search."""
        return ChatScope(
            "",
            "-" if self.provider else "",
            "-" if self.external_channel_id else "",
            _SHAPE_TIME if self.start is not None else None,
            _SHAPE_TIME if self.end is not None else None,
        )

    def params(self) -> dict[str, object]:
        return {
            "org": self.org_id,
            "provider": self.provider,
            "channel": self.external_channel_id,
            "start": self.start,
            "end": self.end,
        }

    def event_filters(self) -> sql.Composable:
        parts = [sql.SQL("org_id = %(org)s"), ELIGIBLE_EVENTS]
        if self.provider:
            parts.append(sql.SQL("provider = %(provider)s"))
        if self.external_channel_id:
            parts.append(sql.SQL("external_channel_id = %(channel)s"))
        if self.start is not None:
            parts.append(sql.SQL("created_at >= %(start)s"))
        if self.end is not None:
            parts.append(sql.SQL("created_at <= %(end)s"))
        return sql.SQL(" AND ").join(parts)

    def window_filters(self, table: str = "") -> sql.Composable:
        """A window matches a time range when it overlaps it."""
        prefix = sql.SQL("{}.").format(sql.Identifier(table)) if table else sql.SQL("")
        conditions = [("org_id", "=", "org"), ("model", "=", "model")]
        if self.provider:
            conditions.append(("provider", "=", "provider"))
        if self.external_channel_id:
            conditions.append(("external_channel_id", "=", "channel"))
        if self.start is not None:
            conditions.append(("window_end", ">=", "start"))
        if self.end is not None:
            conditions.append(("window_start", "<=", "end"))
        return sql.SQL(" AND ").join(
            sql.SQL("{}{} {} {}").format(prefix, sql.Identifier(column), sql.SQL(op), sql.Placeholder(param))
            for column, op, param in conditions
        )


_SHAPE_TIME = datetime(2000, 1, 1)


def window_row(row: tuple[Any, ...]) -> WindowRow:
    return WindowRow(
        id=row[0],
        provider=row[1],
        external_channel_id=row[2],
        window_start=row[3],
        window_end=row[4],
        content=row[5],
        source_message_ids=tuple(row[6]),
        score=float(row[7]) if len(row) > 7 else 0.0,
    )


# --- Similar: a conversation, its messages and its windows -------------------------------

# A conversation's windows: its channel's windows that overlap its time span (parameters:
# conversation_params). Similar reads their vectors, and leaves them out of its KNN.
CONVERSATION_WINDOWS = sql.SQL(
    "provider = %(c_provider)s AND external_channel_id = %(c_channel)s"
    " AND window_end >= %(c_start)s AND window_start <= %(c_end)s"
)


def conversation_params(conversation: ChatScope) -> dict[str, object]:
    """CONVERSATION_WINDOWS' parameters: `conversation` names a provider, a channel and
    both ends of its time span."""
    return {
        "c_provider": conversation.provider,
        "c_channel": conversation.external_channel_id,
        "c_start": conversation.start,
        "c_end": conversation.end,
    }


def exclusion(exclude: bool) -> sql.Composable:
    return sql.SQL(" AND NOT ({})").format(CONVERSATION_WINDOWS) if exclude else sql.SQL("")
