"""Highlight spans: where a query's words occur in a hit's text (pure functions).

Offsets are Python string indices, i.e. Unicode code points, half-open [start, end).
Words are split as full-text search splits them (ftsplan.query_lexemes: runs of letters
and digits). A word holding a CJK character matches as a substring (CJK text has no
spaces, so full text's whole-word rule would rarely match); any other word matches whole
words only, case-insensitively."""

from __future__ import annotations

import functools
import re

from dwsearch.search.ftsplan import query_lexemes

# Han, Hiragana, Katakana, Hangul (syllables and jamo), CJK punctuation and fullwidth forms.
_CJK = re.compile(
    r"[\u1100-\u11ff\u3000-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]"
)
# At most this many distinct query words are looked for (a query is at most 8 KiB).
MAX_WORDS = 32


def pattern(query: str) -> re.Pattern[str] | None:
    """One regular expression for all the query's words, longest first; None when the
    query has no words."""
    words = sorted(set(query_lexemes(query)), key=lambda w: (-len(w), w))[:MAX_WORDS]
    return _compiled(tuple(words)) if words else None


@functools.lru_cache(maxsize=256)
def _compiled(words: tuple[str, ...]) -> re.Pattern[str]:
    """The CJK words as substrings, then the latin-script words as whole words under one
    pair of guards (compiled on every search, a third faster than a pair per word). The
    same matches as one alternation of all words longest first: a CJK word and a latin one
    can only both match where one is a prefix of the other, and then the CJK one is the
    longer (a latin word holds no CJK character), so it is tried first either way."""
    cjk = [re.escape(w) for w in words if _CJK.search(w)]
    latin = [re.escape(w) for w in words if not _CJK.search(w)]
    if latin:
        cjk.append(rf"(?<![^\W_])(?:{'|'.join(latin)})(?![^\W_])")
    return re.compile("|".join(cjk), re.IGNORECASE)


def spans(compiled: re.Pattern[str] | None, text: str) -> list[tuple[int, int]]:
    """Sorted, non-overlapping (start, end) code-point spans of the words in `text`,
    adjacent or overlapping matches merged."""
    if compiled is None:
        return []
    found: list[tuple[int, int]] = []
    for m in compiled.finditer(text):
        start, end = m.span()
        if end == start:
            continue
        if found and start <= found[-1][1]:
            found[-1] = (found[-1][0], max(found[-1][1], end))
        else:
            found.append((start, end))
    return found
