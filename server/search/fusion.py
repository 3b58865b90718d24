"""Reciprocal rank fusion at window level — pure functions over plain data.

Full-text search finds messages; KNN finds embedded windows. A message that lies inside
an embedded window joins that window (the window takes the message's best FTS rank);
a message not embedded yet stands alone. Each candidate's fused score is the sum over
sources of 1 / (RRF_K + rank).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from dwsearch.common.retrieval import RRF_K

SOURCES = ("fts", "dense", "sparse")


@dataclass(frozen=True)
class MessageRow:
    """An FTS match: one eligible dw_chat_events row."""

    id: str
    provider: str
    external_channel_id: str
    created_at: datetime
    text: str
    score: float = 0.0  # ts_rank_cd


@dataclass(frozen=True)
class WindowRow:
    """An embedded window; score is the source's similarity (higher is better)."""

    id: str
    provider: str
    external_channel_id: str
    window_start: datetime
    window_end: datetime
    content: str
    source_message_ids: tuple[str, ...]
    score: float = 0.0


@dataclass
class SourceRank:
    rank: int = 0  # 1-based; 0 = the source did not return the candidate
    score: float = 0.0


@dataclass
class Candidate:
    kind: str  # "window" | "message"
    id: str
    provider: str
    external_channel_id: str
    start: datetime
    end: datetime
    text: str
    message_ids: tuple[str, ...]
    matched_message_ids: list[str] = field(default_factory=list)
    sources: dict[str, SourceRank] = field(default_factory=lambda: {s: SourceRank() for s in SOURCES})
    fused: float = 0.0
    rerank: SourceRank = field(default_factory=SourceRank)
    # Filled in for the returned hits only (Searcher): the query's words in `text` as
    # code-point spans, and the messages around the hit (context_messages).
    highlights: list[tuple[int, int]] = field(default_factory=list)
    context_before: list = field(default_factory=list)
    context_after: list = field(default_factory=list)

    @property
    def score(self) -> float:
        return self.rerank.score if self.rerank.rank else self.fused


def _window_candidate(w: WindowRow) -> Candidate:
    return Candidate(
        kind="window",
        id=w.id,
        provider=w.provider,
        external_channel_id=w.external_channel_id,
        start=w.window_start,
        end=w.window_end,
        text=w.content,
        message_ids=w.source_message_ids,
    )


def _message_candidate(m: MessageRow) -> Candidate:
    return Candidate(
        kind="message",
        id=m.id,
        provider=m.provider,
        external_channel_id=m.external_channel_id,
        start=m.created_at,
        end=m.created_at,
        text=m.text,
        message_ids=(m.id,),
    )


def fuse(
    fts: Sequence[MessageRow],
    dense: Sequence[WindowRow] = (),
    sparse: Sequence[WindowRow] = (),
    fts_windows: Iterable[WindowRow] = (),
    *,
    k: int = RRF_K,
) -> list[Candidate]:
    """Fuse ranked lists into candidates sorted best first.

    `fts` is in FTS rank order; `dense` / `sparse` in KNN order; `fts_windows` are the
    embedded windows that contain any FTS match (any order). Ties break on recency, then
    id, so the order is deterministic.
    """
    candidates: dict[str, Candidate] = {}
    window_of_message: dict[str, str] = {}
    for w in [*dense, *sparse, *fts_windows]:
        candidates.setdefault(w.id, _window_candidate(w))
        for mid in w.source_message_ids:
            window_of_message[mid] = w.id

    for source, rows in (("dense", dense), ("sparse", sparse)):
        for rank, w in enumerate(rows, start=1):
            entry = candidates[w.id].sources[source]
            if entry.rank == 0:
                entry.rank, entry.score = rank, w.score

    for rank, m in enumerate(fts, start=1):
        key = window_of_message.get(m.id)
        if key is None:
            key = m.id
            candidates.setdefault(key, _message_candidate(m))
        candidate = candidates[key]
        candidate.matched_message_ids.append(m.id)
        entry = candidate.sources["fts"]
        if entry.rank == 0:  # a window takes its best-ranked message
            entry.rank, entry.score = rank, m.score

    for candidate in candidates.values():
        candidate.fused = sum(1.0 / (k + s.rank) for s in candidate.sources.values() if s.rank)
    ordered = [c for c in candidates.values() if c.fused > 0]
    ordered.sort(key=lambda c: (-c.fused, -c.end.timestamp(), c.id))
    return ordered
