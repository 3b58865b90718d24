"""The substance filter (docs/design.md, "Substance filter"): judged on the whole
window, never per message —
a trivial "ok" inside a window is often the answer to the question before it. A window
with fewer than SUBSTANCE_MIN_CHARS meaningful characters is skipped (not embedded);
the watermark still moves past it.

Meaningful characters are letters and digits of any script (Unicode categories L* and
N*), so each CJK character counts; whitespace, punctuation, emoji and other symbols do
not, nor do combining marks (they ride on a letter already counted). The filter reads the
chunk text as it would be embedded, redaction placeholders included.
"""

from __future__ import annotations

import unicodedata

SUBSTANCE_MIN_CHARS = 20


def meaningful_chars(text: str) -> int:
    return sum(1 for ch in text if unicodedata.category(ch)[0] in "LN")


def is_substantial(text: str) -> bool:
    return meaningful_chars(text) >= SUBSTANCE_MIN_CHARS
