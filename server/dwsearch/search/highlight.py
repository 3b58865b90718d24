"""Highlight spans: where a query's words occur in a hit's text (pure functions).

Offsets are Python string indices, i.e. Unicode code points, half-open [start, end).
Words are split as full-text search splits them (ftsplan.query_lexemes: runs of letters
and digits), then each word's CJK runs (Han, kana, Hangul) apart from the rest. CJK text
has no spaces, so a run of it is no word: "物流信息" asked for must light up 物流 in
"我的物流到了吗", as chat search's lexical leg finds it (dwsearch.retrieval.bm25). A CJK run
is looked for as overlapping character bigrams (a lone character as itself), each a
substring, their matches merged; any other part matches whole words only (a CJK character
beside it is a boundary: "courier" in "courier说"), case-insensitively.

Simplified and Traditional Chinese are one, as in the lexical leg's terms
(dwsearch.retrieval.chinese): a query's words are folded to Simplified, and each folded
character is looked for as any character that folds to it (频道 as [频頻]道), in the text as
it is stored. No hit's text is converted: a span points at the stored characters, 頻道 in a
window written in Traditional Chinese."""

from __future__ import annotations

import functools
import re

from dwsearch.retrieval import chinese
from dwsearch.search.ftsplan import query_lexemes

# Han, Hiragana, Katakana, Hangul (syllables and jamo), CJK punctuation and fullwidth forms.
_CJK = re.compile(
    r"[\u1100-\u11ff\u3000-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]"
)
# The scripts segmented into bigrams (as dwsearch.retrieval.bm25 segments them).
_SEGMENTED = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af\u1100-\u11ff\u3130-\u318f"
_RUN = re.compile(rf"[{_SEGMENTED}]+|[^{_SEGMENTED}]+")
_IS_SEGMENTED = re.compile(rf"[{_SEGMENTED}]")
# At most this many distinct query words are looked for (a query is at most 8 KiB).
MAX_WORDS = 32


def words(query: str) -> list[str]:
    """The query's words to look for: latin-script words whole, CJK runs as bigrams;
    Chinese folded to Simplified."""
    out: list[str] = []
    for lexeme in query_lexemes(chinese.fold(query)):
        for run in _RUN.findall(lexeme):
            if _IS_SEGMENTED.match(run) and len(run) > 2:
                out += [run[i : i + 2] for i in range(len(run) - 1)]
            else:
                out.append(run)
    return out


def pattern(query: str) -> re.Pattern[str] | None:
    """One regular expression for all the query's words, longest first; None when the
    query has no words."""
    found = sorted(set(words(query)), key=lambda w: (-len(w), w))[:MAX_WORDS]
    return _compiled(tuple(found)) if found else None


# A latin-script word character: a letter or digit of no segmented script. A latin word
# matches only with none right before or after it (a whole word). Its class is large:
# compiled once here, checked by spans(), never compiled into a query's pattern (it took
# 6.9 ms of CPU a query there: a search's largest cost, paid by every new query).
_LATIN_WORD_CHAR = re.compile(rf"[^\W_{_SEGMENTED}]", re.IGNORECASE)
# The group of a pattern that holds its latin-script words, whose matches must be whole words.
_LATIN = "latin"


@functools.lru_cache(maxsize=256)
def _compiled(words: tuple[str, ...]) -> re.Pattern[str]:
    """The CJK words as substrings, then the latin-script words in one group (_LATIN), whose
    matches spans() keeps only when whole words, trying the shorter latin words at the same
    place when the longest is not. The same matches as one alternation of all words longest
    first, each latin word between word guards: a CJK word and a latin one can only both
    match where one is a prefix of the other, and then the CJK one is the longer (a latin
    word holds no CJK character), so it is tried first either way."""
    cjk = [chinese.pattern(w) for w in words if _CJK.search(w)]
    latin = [chinese.pattern(w) for w in words if not _CJK.search(w)]
    if latin:
        cjk.append(rf"(?P<{_LATIN}>{'|'.join(latin)})")
    return re.compile("|".join(cjk), re.IGNORECASE)


def _whole_word(text: str, start: int, end: int) -> bool:
    """No latin-script word character right before `start` nor at `end`."""
    return not (start > 0 and _LATIN_WORD_CHAR.match(text, start - 1)) and not (
        end < len(text) and _LATIN_WORD_CHAR.match(text, end)
    )


def spans(compiled: re.Pattern[str] | None, text: str) -> list[tuple[int, int]]:
    """Sorted, non-overlapping (start, end) code-point spans of the words in `text`,
    adjacent or overlapping matches merged."""
    if compiled is None:
        return []
    found: list[tuple[int, int]] = []
    # A match at every position, not only after the last one ends: a CJK run's bigrams
    # overlap (订单还没有: 订单 单还 还没 没有), and each must light up its characters.
    at = 0
    while (m := compiled.search(text, at)) is not None:
        start = m.start()
        at = start + 1
        # A latin word that is no whole word here: the next shorter one that matches here
        # may be (almost always it is followed by a letter of the longer; U+0345, which
        # IGNORECASE matches to an iota, is no word character).
        while m is not None and m.lastgroup == _LATIN and not _whole_word(text, start, m.end()):
            m = compiled.match(text, start, m.end() - 1) if m.end() - 1 > start else None
        if m is None or m.end() == start:
            continue
        end = m.end()
        if found and start <= found[-1][1]:
            found[-1] = (found[-1][0], max(found[-1][1], end))
        else:
            found.append((start, end))
    return found
