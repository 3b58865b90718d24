"""Typo tolerance for full text: when a query's full-text leg finds nothing, each latin-
script query word the org's recent messages do not hold is widened to the words they do
hold one edit away (a letter deleted, inserted, replaced, or two neighbours swapped), and
full text runs once more with `word OR correction...` for each such word.

Bounded and cheap: no index (pg_trgm is not available everywhere); the vocabulary is the
distinct words of the org's VOCABULARY_EVENTS most recent eligible messages, read once per
org and VOCABULARY_TTL_S, and a word's candidates are its edit-1 variants (about 70 per
letter) looked up in it. Pure-digit words (order numbers) and short words are never
corrected: a near-miss there is another order, not a typo."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from dwsearch.search.ftsplan import query_lexemes

VOCABULARY_EVENTS = 5_000
VOCABULARY_TTL_S = 300.0
# Words shorter than this are never corrected (too many neighbours one edit away).
MIN_WORD_LENGTH = 4
MAX_WORD_LENGTH = 40
# At most this many query words are widened, each with at most this many corrections
# (the most frequent in the vocabulary first).
MAX_CORRECTED_WORDS = 8
MAX_CORRECTIONS = 3

# Latin script: ASCII letters and digits, Latin-1 Supplement and Latin Extended-A/B letters.
_LATIN_WORD = re.compile(r"[0-9a-z\u00df-\u00f6\u00f8-\u00ff\u0100-\u024f]+")
_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


@dataclass(frozen=True)
class Expansion:
    """A query word full text did not find, and the vocabulary's words one edit away."""

    term: str
    alternatives: tuple[str, ...]


def correctable(word: str) -> bool:
    return (
        MIN_WORD_LENGTH <= len(word) <= MAX_WORD_LENGTH
        and _LATIN_WORD.fullmatch(word) is not None
        and not word.isdigit()
    )


def edits1(word: str) -> set[str]:
    """Every string one deletion, transposition, replacement or insertion from `word`,
    over ASCII letters and digits plus the word's own letters."""
    letters = set(_ALPHABET) | set(word)
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    out = {a + b[1:] for a, b in splits if b}
    out |= {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1}
    out |= {a + c + b[1:] for a, b in splits if b for c in letters}
    out |= {a + c + b for a, b in splits for c in letters}
    out.discard(word)
    return out


def expand(query: str, vocabulary: Mapping[str, int]) -> list[Expansion]:
    """The query's correctable words absent from `vocabulary` (word -> messages holding
    it) that have corrections there, in query order."""
    expansions: list[Expansion] = []
    seen: set[str] = set()
    for word in query_lexemes(query):
        if word in seen or word in vocabulary or not correctable(word):
            continue
        seen.add(word)
        found = [w for w in edits1(word) if w in vocabulary and correctable(w)]
        if found:
            found.sort(key=lambda w: (-vocabulary[w], w))
            expansions.append(Expansion(word, tuple(found[:MAX_CORRECTIONS])))
            if len(expansions) == MAX_CORRECTED_WORDS:
                break
    return expansions


def alternatives(query: str, expansions: list[Expansion]) -> list[tuple[str, ...]]:
    """The query as a conjunction of alternatives: each word, or-ed with its corrections."""
    widened = {e.term: e.alternatives for e in expansions}
    out: list[tuple[str, ...]] = []
    seen: set[str] = set()
    for word in query_lexemes(query):
        if word not in seen:
            seen.add(word)
            out.append((word, *widened.get(word, ())))
    return out
