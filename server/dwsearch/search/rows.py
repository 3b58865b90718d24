"""The rows chat search's SQL returns and fusion ranks (plain types): a full-text match, an
embedded window, a message around a hit."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple


class MessageRow(NamedTuple):
    """An FTS match: one eligible dw_chat_events row. (Rows are named tuples, not frozen
    dataclasses: a search builds ~100 of them, and a frozen dataclass costs several times
    as much to construct.)"""

    id: str
    provider: str
    external_channel_id: str
    created_at: datetime
    text: str
    score: float = 0.0  # ts_rank_cd


class WindowRow(NamedTuple):
    """An embedded window; score is the source's similarity (higher is better)."""

    id: str
    provider: str
    external_channel_id: str
    window_start: datetime
    window_end: datetime
    content: str
    source_message_ids: tuple[str, ...]
    score: float = 0.0


@dataclass(frozen=True)
class ContextRow:
    """A message around a hit (SearchRequest.context_messages)."""

    id: str
    created_at: datetime
    text: str
