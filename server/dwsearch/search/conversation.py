"""Similar's conversations, pure functions: the open session around a message, the text
an open conversation is embedded as, and one query vector for a conversation of several
windows.

What a conversation is, is the sweep's rule (dwsearch.sweep.window: sessions end at a
30-minute gap; a message is one line of chunk text). The features do not import each
other, so the two pieces Similar needs are restated here and tests/search/test_similar.py
holds them equal to the sweep's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

import numpy as np
from pgvector import HalfVector, SparseVector

from dwsearch.search.rows import ContextRow

# The sweep's SESSION_GAP: a conversation ends where two messages are this far apart.
SESSION_GAP = timedelta(minutes=30)
# A message no window holds yet stands for its session: at most this many messages either
# side of it (two windows' worth, MAX_WINDOW_MESSAGES being 15).
OPEN_SESSION_REACH = 15
# The most messages of a conversation (the latest) embedded on the fly; the embedder
# truncates the text further to the model's input limit.
OPEN_CONVERSATION_MESSAGES = 30


def session_around(
    before: Sequence[ContextRow],
    anchor: ContextRow,
    after: Sequence[ContextRow],
    gap: timedelta = SESSION_GAP,
) -> list[ContextRow]:
    """The anchor's session among its neighbours (`before` and `after` oldest first, as
    store.context_messages returns them): the messages around it with no two in a row
    `gap` or more apart, oldest first."""
    earlier: list[ContextRow] = []
    for message in reversed(before):
        if (earlier[-1] if earlier else anchor).created_at - message.created_at >= gap:
            break
        earlier.append(message)
    run = [*reversed(earlier), anchor]
    for message in after:
        if message.created_at - run[-1].created_at >= gap:
            break
        run.append(message)
    return run


def chunk_line(text: str) -> str:
    """A message as one line of chunk text, as the sweep writes it: each run of line
    breaks (the ones str.splitlines splits on) one space, surrounding whitespace stripped."""
    return " ".join(part for part in text.splitlines() if part).strip()


def conversation_text(messages: Sequence[ContextRow], redact: Callable[[str], str]) -> str:
    """The text an open conversation is embedded as: a window's chunk text (one redacted
    line per message, oldest first)."""
    return "\n".join(redact(chunk_line(m.text)) for m in messages)


def mean_vectors(
    windows: Sequence[tuple[HalfVector, SparseVector | None]],
) -> tuple[HalfVector, SparseVector | None]:
    """A conversation of one or more embedded windows as one query: the mean of their dense
    vectors at unit length (stored vectors are unit length, so inner product keeps ranking
    like cosine), and the mean of their sparse weights (None when no window has any)."""
    dense = np.mean([d.to_numpy().astype(np.float32) for d, _ in windows], axis=0)
    norm = float(np.linalg.norm(dense))
    if norm > 0:
        dense = dense / norm
    sparse = [s for _, s in windows if s is not None]
    if not sparse:
        return HalfVector(dense), None
    weights: dict[int, float] = {}
    for vector in sparse:
        for index, value in zip(vector.indices(), vector.values(), strict=True):
            weights[int(index)] = weights.get(int(index), 0.0) + float(value) / len(sparse)
    return HalfVector(dense), SparseVector(weights, sparse[0].dimensions())
