"""How many candidates each leg contributes: the one policy of chat search, Similar, the
Index's queries and agent context.

A leg whose hits are fused with another's or reranked (pooled) retrieves
CANDIDATES_PER_LEG, or the request's limit when that is more (docs/design.md,
"Reranking": retrieve top ~50 -> rerank -> top 5-10): a hit just outside one leg's top
`limit` but high in another's can still win the fusion, and the reranker sees a pool
worth reordering. A leg that answers alone, unreranked, is the answer: its top `limit`.
"""

from __future__ import annotations

CANDIDATES_PER_LEG = 50
"""Candidates a pooled leg retrieves at least."""


def per_leg(
    limit: int, *, pooled: bool = True, at_least: int = CANDIDATES_PER_LEG, most: int | None = None
) -> int:
    """The candidates a leg retrieves for a request of `limit` hits: `limit` for a leg that
    answers alone (`pooled` False); else at least `at_least` (a caller's own pool size,
    such as agent context's, which the seed fixes), and at most `most` (the store's cap)."""
    wanted = max(at_least, limit) if pooled else limit
    return wanted if most is None else min(most, wanted)
