"""Fusion, the retrieval core's: the one implementation chat search (dwsearch.search.fusion:
windows and messages, keyed so that a message joins its window) and the Index
(DocumentIndex: dense and sparse hits, keyed by document id) both fuse through
(`fuse_legs`) — pure functions over plain data. Each caller builds its keys and orders its
candidates; the methods, their terms, the weights and the explanation are here.

One enum names every method and one constant serves every RRF:
- RRF (reciprocal rank fusion, Cormack et al. 2009): the sum over sources of
  weight / (RRF_K + rank). Search counts ranks from 1 (Cormack's base); the Index counts
  them from 0, as Upstash does (a first place in both sources scores 2/60, the value the
  Upstash SDKs' own suites expect). Uses ranks only, so sources with incomparable score scales
  (inner products of dense unit vectors, sparse lexical weights, ts_rank_cd) need no
  calibration.
- WEIGHTED (Search): weight × each source's scores min-max normalised over its own list
  (best → 1, worst → 0). Keeps how far ahead a result is, which RRF discards.
- DBSF (distribution-based score fusion, the Index): each source's scores mapped through
  its own mean ± 3 standard deviations onto [0, 1] (clipped), then summed.

Ranked lists are (id, score) pairs, best first, higher scores better; the list-level
functions return (id, fused score) pairs, best first, ties broken on id.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

RRF_K = 60
"""The constant from Cormack et al. (2009); it damps the weight of the very top ranks so
that no single source dominates."""


class Fusion(enum.StrEnum):
    RRF = "rrf"
    WEIGHTED = "weighted"
    DBSF = "dbsf"


def rrf_term(rank: int, k: int = RRF_K) -> float:
    """One source's RRF contribution for a result at `rank` (1 = the source's best)."""
    return 1.0 / (k + rank)


def minmax(scores: Sequence[float]) -> list[float]:
    """Scores mapped best → 1, worst → 0; all equal (or one) → 1 each."""
    if not scores:
        return []
    low, high = min(scores), max(scores)
    if high == low:
        return [1.0] * len(scores)
    return [(s - low) / (high - low) for s in scores]


Ranked = Sequence[tuple[str, float]]
"""One source's results: (id, score), best first."""

DBSF_SPREAD = 3.0
"""Standard deviations either side of the mean that map onto [0, 1]."""

DBSF_DEGENERATE_SCORE = 0.5
"""A source whose scores do not vary (one result, or all equal) says nothing about how
they compare: each gets the middle of the range."""


def rrf(sources: Sequence[Ranked], *, k: int = RRF_K, first_rank: int = 1) -> list[tuple[str, float]]:
    """Reciprocal rank fusion, each source's best at `first_rank`; an id a source lists
    twice counts at its best rank."""
    return _ordered(fuse_legs(_legs(sources), Fusion.RRF, k=k, first_rank=first_rank).scores)


def dbsf_normalize(scores: Sequence[float]) -> list[float]:
    """Scores mapped so that mean - 3σ → 0 and mean + 3σ → 1, clipped to [0, 1]
    (σ: the population standard deviation of these scores)."""
    if not scores:
        return []
    mean = math.fsum(scores) / len(scores)
    sigma = math.sqrt(math.fsum((s - mean) ** 2 for s in scores) / len(scores))
    if sigma == 0:
        return [DBSF_DEGENERATE_SCORE] * len(scores)
    low, span = mean - DBSF_SPREAD * sigma, 2 * DBSF_SPREAD * sigma
    return [min(1.0, max(0.0, (s - low) / span)) for s in scores]


def dbsf(sources: Sequence[Ranked]) -> list[tuple[str, float]]:
    """Distribution-based score fusion; an id a source lists twice counts at its best score."""
    return _ordered(fuse_legs(_legs(sources), Fusion.DBSF).scores)


def _legs(sources: Sequence[Ranked]) -> list[FusionLeg[str]]:
    return [
        FusionLeg(str(i), [(doc_id, rank, score) for rank, (doc_id, score) in enumerate(source, start=1)])
        for i, source in enumerate(sources)
    ]


def _ordered(fused: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))


# --- Legs fused by key: what both hit types go through -----------------------------------

K = TypeVar("K", bound=Hashable)


class LegScore(NamedTuple):
    """One leg's part in a candidate's fused score (explain): the fused score is the sum
    over the candidate's legs, in leg order, of weight × normalized. (A tuple: built for
    every fused row of an explained call.)"""

    source: str  # the leg: "fts", "dense:<model>", "sparse:<model>"
    rank: int  # 1-based, in the leg's own list (the candidate's first place there)
    score: float  # the leg's raw score (its best for the candidate)
    normalized: float  # the method's term: 1 / (k + rank - 1 + first_rank), min-max or DBSF
    weight: float


@dataclass(frozen=True)
class FusionLeg(Generic[K]):
    """One leg: `entries` are (key, rank, score), best first, ranks 1-based (a caller may
    leave gaps: a chat leg's rank is its row's place); a key listed again counts once, at
    its first rank and its best score. `weight` 0 keeps the leg's candidates, adding
    nothing to their scores."""

    source: str
    entries: Sequence[tuple[K, int, float]]
    weight: float = 1.0
    absolute_power: float | None = None
    """Set when the leg's scores are already a fraction of what the query could score (chat
    search's lexical leg): WEIGHTED takes each clipped to [0, 1] and raised to this power,
    instead of min-max over the leg's own list, so a leg whose best match is weak stays weak
    (a power above 1 weakens partial matches further)."""


@dataclass(frozen=True)
class Fused(Generic[K]):
    """Each key's fused score (in the order the legs first listed them) and, explained,
    its legs' parts in leg order."""

    scores: dict[K, float]
    parts: dict[K, list[LegScore]]


def leg_terms(
    method: Fusion,
    ranks: Sequence[int],
    scores: Sequence[float],
    *,
    k: int = RRF_K,
    first_rank: int = 1,
    absolute_power: float | None = None,
) -> list[float]:
    """One leg's terms, one per (rank, score): RRF from the ranks (the leg's best counted
    at `first_rank`: 1 as Cormack et al. count, 0 as Upstash does); WEIGHTED min-max (with
    `absolute_power`, each score clipped to [0, 1] and raised to it) and DBSF from the
    scores."""
    if method == Fusion.RRF:
        base = first_rank - 1
        return [rrf_term(rank + base, k) for rank in ranks]
    if method == Fusion.WEIGHTED:
        if absolute_power is not None:
            return [min(1.0, max(0.0, s)) ** absolute_power for s in scores]
        return minmax(scores)
    if method == Fusion.DBSF:
        return dbsf_normalize(scores)
    raise ValueError(f"fusion method {method!r}: one of {', '.join(Fusion)}")


def fuse_legs(
    legs: Sequence[FusionLeg[K]],
    method: Fusion,
    *,
    k: int = RRF_K,
    first_rank: int = 1,
    explain: bool = False,
) -> Fused[K]:
    """Every leg's keys with their summed weight × term; with `explain`, each key's
    parts."""
    scores: dict[K, float] = {}
    parts: dict[K, list[LegScore]] = {}
    for leg in legs:
        first: dict[K, tuple[int, float]] = {}
        for key, rank, score in leg.entries:
            seen = first.get(key)
            if seen is None:
                first[key] = (rank, score)
            elif score > seen[1]:
                first[key] = (seen[0], score)
        views = list(first.values())
        terms = leg_terms(
            method,
            [r for r, _ in views],
            [s for _, s in views],
            k=k,
            first_rank=first_rank,
            absolute_power=leg.absolute_power,
        )
        weight = leg.weight
        for key, term in zip(first, terms, strict=True):
            scores[key] = scores.get(key, 0.0) + weight * term
        if explain:
            for (key, (rank, score)), term in zip(first.items(), terms, strict=True):
                parts.setdefault(key, []).append(LegScore(leg.source, rank, score, term, weight))
    return Fused(scores, parts)
