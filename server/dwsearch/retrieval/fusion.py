"""Fusion primitives Search (dwsearch.search.fusion: windows, messages and their legs) and
the Index (DocumentIndex: dense and sparse hits) share — pure functions over plain data.

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
from collections.abc import Sequence

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
    fused: dict[str, float] = {}
    for source in sources:
        seen: set[str] = set()
        for rank, (doc_id, _) in enumerate(source, start=first_rank):
            if doc_id not in seen:
                seen.add(doc_id)
                fused[doc_id] = fused.get(doc_id, 0.0) + rrf_term(rank, k)
    return _ordered(fused)


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
    fused: dict[str, float] = {}
    for source in sources:
        best: dict[str, float] = {}
        for doc_id, score in source:
            best[doc_id] = max(score, best.get(doc_id, -math.inf))
        for doc_id, normalized in zip(best, dbsf_normalize(list(best.values())), strict=True):
            fused[doc_id] = fused.get(doc_id, 0.0) + normalized
    return _ordered(fused)


def _ordered(fused: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))
