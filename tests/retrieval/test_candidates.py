"""The one candidate policy (dwsearch.retrieval.candidates) of chat search, Similar, the
Index's queries and agent context."""

from __future__ import annotations

from dwsearch.retrieval.candidates import CANDIDATES_PER_LEG, per_leg


def test_a_pooled_leg_takes_the_floor_or_the_limit_whichever_is_more() -> None:
    assert CANDIDATES_PER_LEG == 50
    assert per_leg(10) == 50
    assert per_leg(80) == 80
    assert per_leg(10, most=20) == 20  # the store's cap
    assert per_leg(900, most=1000) == 900


def test_a_leg_that_answers_alone_takes_its_limit() -> None:
    assert per_leg(10, pooled=False) == 10
    assert per_leg(10, pooled=False, most=5) == 5


def test_a_callers_own_floor() -> None:
    """Agent context's, which the seed fixes: dense 30 + sparse 30, reranked to 10."""
    assert per_leg(10, at_least=30) == 30
