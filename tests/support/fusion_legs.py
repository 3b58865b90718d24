"""Search's fusion legs for tests without a database: messages and windows, and a
hypothesis strategy of random legs over them (tests/search/test_fusion_legs.py,
test_explain.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import strategies as st

from dwsearch.search.fusion import Leg
from dwsearch.search.rows import MessageRow, WindowRow

T = datetime(2026, 11, 1, tzinfo=UTC)


def msg(i: str, score: float = 0.1, minute: int = 0) -> MessageRow:
    return MessageRow(i, "wa", "c1", T + timedelta(minutes=minute), f"text {i}", score)


def win(i: str, ids: tuple[str, ...], score: float = 0.5, minute: int = 0) -> WindowRow:
    at = T + timedelta(minutes=minute)
    return WindowRow(i, "wa", "c1", at, at, f"window {i}", ids, score)


_KEYS = st.sampled_from([f"m{i}" for i in range(12)])


@st.composite
def legs_strategy(draw):
    """Up to three window legs (two models' dense, a sparse one) over windows of the same
    12 messages (two windows per message set at most), and a full-text leg."""
    windows = {}
    for i in range(draw(st.integers(1, 6))):
        size = draw(st.integers(1, 3))
        start = draw(st.integers(0, 12 - size))
        mids = tuple(f"m{j}" for j in range(start, start + size))
        windows[mids] = i
    pool = [(mids, i) for mids, i in windows.items()]
    legs = []
    for source in draw(st.lists(st.sampled_from(["dense:use", "dense:e5", "sparse:bge"]), unique=True)):
        chosen = draw(st.lists(st.sampled_from(pool), unique=True)) if pool else []
        scores = sorted((draw(st.floats(0, 1)) for _ in chosen), reverse=True)
        legs.append(
            Leg(
                source,
                [
                    win(f"{source}/{i}", mids, s, minute=i)
                    for (mids, i), s in zip(chosen, scores, strict=True)
                ],
            )
        )
    matched = draw(st.lists(_KEYS, unique=True, max_size=6))
    fts_scores = sorted((draw(st.floats(0, 1)) for _ in matched), reverse=True)
    every_window = [w for leg in legs for w in leg.rows]
    fts = Leg(
        "fts",
        [msg(m, s, minute=int(m[1:])) for m, s in zip(matched, fts_scores, strict=True)],
        windows=[w for w in every_window if set(w.source_message_ids) & set(matched)],
    )
    position = draw(st.integers(0, len(legs)))
    return [*legs[:position], fts, *legs[position:]]
