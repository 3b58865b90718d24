"""Chat search's requests and answers (plain types) and their checks: a Search query and its
mode and sort, a Similar query and its conversation, the results; `validate` and
`validate_similar` raise InvalidArgument naming the field."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from dwsearch.common.errors import (
    InvalidArgument,
)
from dwsearch.retrieval.degradation import Degradation
from dwsearch.retrieval.stages import StageTimes
from dwsearch.search.fusion import Candidate
from dwsearch.search.store.scope import ChatScope
from dwsearch.search.typos import (
    Expansion,
)

DEFAULT_LIMIT = 10
MAX_LIMIT = 100
MAX_QUERY_BYTES = 8 * 1024
# Messages before and after each hit a request may ask for (context_messages).
MAX_CONTEXT_MESSAGES = 20


class Mode(enum.Enum):
    HYBRID = "hybrid"
    FTS = "fts"
    SEMANTIC = "semantic"


class Sort(enum.Enum):
    RELEVANCE = "relevance"
    # The same hits as RELEVANCE, newest first (by end time, then score).
    NEWEST = "newest"


@dataclass(frozen=True)
class SearchQuery:
    org_id: str
    text: str
    limit: int = 0
    provider: str = ""
    external_channel_id: str = ""
    start: datetime | None = None
    end: datetime | None = None
    mode: Mode = Mode.HYBRID
    rerank: bool | None = None
    context_messages: int = 0
    sort: Sort = Sort.RELEVANCE
    # Fusion method ("rrf" | "weighted") and per-leg weights over the server's; None = the server's.
    fusion: str | None = None
    fusion_weights: Mapping[str, float] | None = None
    # Explain the ranking: each hit's legs (Candidate.explanation) and each stage's time.
    explain: bool = False


@dataclass(frozen=True)
class SearchResult:
    hits: list[Candidate]
    mode: Mode
    # The active models searched, comma-separated (the first is the Index's); empty when
    # semantic search was not used.
    model: str = ""
    reranked: bool = False
    # The fusion method that ranked the hits; empty when nothing was fused (FTS).
    fusion: str = ""
    # The server's fusion profile (dwsearch.search.profiles) the fusion started from.
    fusion_profile: str = ""
    degradations: list[tuple[Degradation, str]] = field(default_factory=list)
    # Query words full text did not find, widened to the org's words one edit away
    # (dwsearch.search.typos); empty when full text matched as asked.
    typo_corrections: list[Expansion] = field(default_factory=list)
    explain: bool = False
    stage_times: StageTimes = field(default_factory=list)


@dataclass(frozen=True)
class Conversation:
    """A channel over a time range (SimilarQuery.conversation); both times are required."""

    provider: str
    external_channel_id: str
    start: datetime | None = None
    end: datetime | None = None


@dataclass(frozen=True)
class SimilarQuery:
    """The org's windows most like one conversation, given by exactly one of `message_id`
    (a dw_chat_events id), `window_id` (a dw_message_embeddings id) or `conversation`."""

    org_id: str
    message_id: str = ""
    window_id: str = ""
    conversation: Conversation | None = None
    limit: int = 0
    context_messages: int = 0
    fusion: str | None = None
    fusion_weights: Mapping[str, float] | None = None
    explain: bool = False


@dataclass(frozen=True)
class SimilarResult:
    hits: list[Candidate]
    # The conversation matched (its org, provider, channel and time span): its windows
    # were left out.
    conversation: ChatScope
    model: str
    fusion: str
    fusion_profile: str = ""
    degradations: list[tuple[Degradation, str]] = field(default_factory=list)
    # The models that embedded the (open) conversation for this call.
    embedded_models: list[str] = field(default_factory=list)
    explain: bool = False
    stage_times: StageTimes = field(default_factory=list)


def validate(query: SearchQuery) -> int:
    """Raise InvalidArgument for a bad request; return the effective limit."""
    _check_text_fields(
        query.org_id, query=query.text, provider=query.provider, external_channel_id=query.external_channel_id
    )
    if not query.text.strip():
        raise InvalidArgument("query is empty")
    size = len(query.text.encode("utf-8"))
    if size > MAX_QUERY_BYTES:
        raise InvalidArgument(f"query is {size} bytes; the limit is {MAX_QUERY_BYTES}")
    if query.start is not None and query.end is not None and query.start > query.end:
        raise InvalidArgument("start_time is after end_time")
    return _answer_size(query.limit, query.context_messages)


def validate_similar(query: SimilarQuery) -> int:
    """Raise InvalidArgument for a bad Similar request; return the effective limit."""
    c = query.conversation
    conversation_fields = (
        {}
        if c is None
        else {"conversation.provider": c.provider, "conversation.external_channel_id": c.external_channel_id}
    )
    _check_text_fields(
        query.org_id, message_id=query.message_id, window_id=query.window_id, **conversation_fields
    )
    given = [
        name
        for name, present in (
            ("message_id", bool(query.message_id)),
            ("window_id", bool(query.window_id)),
            ("conversation", c is not None),
        )
        if present
    ]
    if len(given) != 1:
        got = f"; got {' and '.join(given)}" if given else ""
        raise InvalidArgument(f"give exactly one of message_id, window_id or conversation{got}")
    if query.message_id:
        canonical_uuid(query.message_id, "message_id", "dw_chat_events")
    if query.window_id:
        canonical_uuid(query.window_id, "window_id", "window (dw_message_embeddings)")
    if c is not None:
        for name, value in conversation_fields.items():
            if not value.strip():
                raise InvalidArgument(f"{name} is required")
        if c.start is None or c.end is None:
            raise InvalidArgument("conversation.start_time and conversation.end_time are required")
        if c.start > c.end:
            raise InvalidArgument("conversation.start_time is after conversation.end_time")
    return _answer_size(query.limit, query.context_messages)


def _check_text_fields(org_id: str, **fields: str) -> None:
    """org_id is required; no field holds NUL (Postgres text cannot)."""
    if not org_id.strip():
        raise InvalidArgument("org_id is required")
    for name, value in (("org_id", org_id), *fields.items()):
        if "\x00" in value:
            raise InvalidArgument(f"{name}: NUL character")


def _answer_size(limit: int, context_messages: int) -> int:
    """The effective limit; InvalidArgument when it or context_messages is out of range."""
    if limit < 0 or limit > MAX_LIMIT:
        raise InvalidArgument(f"limit must be between 1 and {MAX_LIMIT} (0 means {DEFAULT_LIMIT})")
    if context_messages < 0 or context_messages > MAX_CONTEXT_MESSAGES:
        raise InvalidArgument(f"context_messages must be between 0 and {MAX_CONTEXT_MESSAGES}")
    return limit or DEFAULT_LIMIT


def canonical_uuid(text: str, name: str, what: str) -> str:
    """`text` as a UUID's canonical spelling; InvalidArgument naming the field otherwise."""
    try:
        return str(UUID(text))
    except ValueError:
        raise InvalidArgument(f"{name} = {text[:64]!r} is not a {what} id (UUID)") from None
