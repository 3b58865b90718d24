"""PII redaction: what is replaced before any text reaches an embedding model.

The chat-history sweep and the support-app index both call it, so embedded vectors and
the stored `content` never carry these values. `redact(text)` uses a shared default
`Redactor`; build a `Redactor(known_names)` once when names are known (its patterns are
compiled at construction; `redactor(names)` keeps recent ones, bounded in bytes).

Rules, applied in this order (an earlier, more specific rule wins over a later one):

1. EMAIL  `local@domain.tld` with a letter-only top-level domain of 2+ letters.
2. CARD   13-19 digits, optionally grouped by single spaces or dashes, redacted only
          when the Luhn checksum holds and the first digit is a payment-card industry
          identifier (2-6), so order and tracking numbers stay readable.
3. NRIC   Malaysian MyKad number YYMMDD-PB-###G, with both dashes or none. YYMMDD must be
          a real calendar date (any century) and PB a place-of-birth code the National
          Registration Department issues. Other 12-digit numbers stay.
4. PHONE  international (+ country code, 8-15 digits, spaces / dots / dashes /
          parentheses); Malaysia 01x-xxx xxxx / 011-xxxx xxxx mobiles and 0x-xxxx xxxx
          landlines (dash after the area code); Singapore 8-digit numbers starting 6/8/9
          written 4+4 with a space or dash; China 1[3-9]x xxxx xxxx mobiles; US
          (xxx) xxx-xxxx and xxx-xxx-xxxx. Bare 8-digit runs stay (too often order
          numbers).
5. NAME   known names, case-insensitive, inner whitespace flexible, longest first;
          bounded by non-word characters except at a CJK / kana / Thai edge, since those
          scripts do not separate words with spaces.

Numbers (rules 2-4) must stand alone: no Latin letter, digit or '+' glued to either end
(that makes them part of a code or a longer number), though CJK text may touch them.
Digits are any Unicode decimal digits (full-width ones included), word characters and
whitespace are Python's (`str.isalnum()` and '_', `str.isspace()`).

Linear time. Every rule runs on RE2 (google-re2), an automaton engine that never
backtracks: the time of a rule is linear in the text, whatever the text (Python's `re`
took 3-5 s per 128 KiB on '+' and 16 digits followed by 'x ', which the international
phone rule backtracked on; 1,000 known names cost a try of every name at every
position). RE2 has no lookaround, so each rule is written as

    (one character the lookbehind allows, or the start) (the match) (one character the
    lookahead allows, or the end)

and scanned by hand: the next search starts at the last character of the previous match,
so that character can be the next match's left context, exactly as a lookbehind sees the
text. RE2's leftmost-first matching picks the match Python's backtracking would pick.
The names rule uses leftmost-longest matching instead, which is what "longest first"
means for names (two names matching at one position are prefixes of each other), and
frames the text with one space so that every match has exactly one context character on
each side.
"""

from __future__ import annotations

import array
import functools
import itertools
import re
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import date

import re2

from dwsearch.common import offload
from dwsearch.common.lru import ByteLru

EMAIL = "[EMAIL]"
CARD = "[CARD]"
NRIC = "[NRIC]"
PHONE = "[PHONE]"
NAME = "[NAME]"

CARD_MIN_DIGITS = 13
CARD_MAX_DIGITS = 19
# ISO/IEC 7812 major industry identifiers of payment cards (2-5 banking/financial incl.
# Mastercard 2-series, Amex, Visa, Mastercard; 6 Discover / UnionPay / RuPay).
CARD_INDUSTRY_DIGITS = frozenset("23456")
PHONE_MIN_DIGITS = 8
PHONE_MAX_DIGITS = 15  # E.164
# Shorter names would redact ordinary words.
MIN_NAME_CHARS = 2

# MyKad place-of-birth codes: 01-16 and 21-59 Malaysian states, 60-68, 71-72, 74-79,
# 82-93 foreign countries, 98 stateless, 99 unspecified. Unissued: 00, 17-20, 69-70, 73,
# 80-81, 94-97.
NRIC_BIRTHPLACE_CODES = frozenset(
    f"{n:02d}" for n in [*range(1, 17), *range(21, 69), 71, 72, *range(74, 80), *range(82, 94), 98, 99]
)

REDACTOR_CACHE_BYTES = 32 * 1024 * 1024
"""What `redactor(names)` keeps of recently used name lists, each charged its RE2 memory
budget (`redactor_bytes`): distinct name lists cannot grow the process past it."""
NAMES_MAX_MEM_MIN = 16 * 1024 * 1024
NAMES_MAX_MEM_MAX = 32 * 1024 * 1024
NAMES_MAX_MEM_PER_NAME_BYTE = 64
"""RE2's memory budget (program and DFA cache, its `max_mem`) for a names pattern: 64
bytes per byte of names, within 16-32 MiB (an upper bound: a few names take a few MiB).
With too small a budget RE2's DFA gives up and a slower (still linear) automaton runs:
1,000 names sharing a prefix ran 13x slower at 8 MiB."""

NAMES_PART_BYTES = 48 * 1024
"""Names (UTF-8 bytes) per RE2 pattern of the names rule. RE2 compiles holding the
interpreter lock, so one compile pauses every other thread, serve's event loop included:
1,000 names of 256 bytes in one pattern took 0.16 s, and 0.3-0.5 s beside two CPU hogs
on two cores; a part of 48 KiB about 30 ms. Searching several patterns costs a pass of
the text each (GIL-free)."""
NAMES_PART_MAX_MEM_MIN = 2 * 1024 * 1024
"""The least RE2 memory budget of one part: a pattern of one short name is a program of
2,700 instructions (the `\\w` class at its edges), which a 4 KiB budget cannot compile."""

_UNANCHORED = re2._re2.RE2.Anchor.UNANCHORED

# Python's \d (str patterns) is any Unicode decimal digit.
_D = r"\p{Nd}"


def _before(excluded: str) -> str:
    """The character before a match: not one of `excluded` (a class body), or the start."""
    return rf"(?:\A|[^{excluded}])"


def _after(excluded: str) -> str:
    """The character after a match: not one of `excluded`, or the end."""
    return rf"(?:[^{excluded}]|\z)"


# Numbers may touch CJK text ("手机13800138000"), which has no spaces, but not Latin
# letters, digits or '+': those make them part of a code or a longer number.
_B = _before("A-Za-z0-9_+")
_E = _after("A-Za-z0-9_")
_EMAIL = (
    _before("A-Za-z0-9._%+-"),
    r"[A-Za-z0-9._%+-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    _E,
)
# Digits joined by at most one space or dash, not part of a decimal number.
_CARD = (
    _before("A-Za-z0-9_+.,"),
    rf"{_D}(?:[ -]?{_D}){{{CARD_MIN_DIGITS - 1},{CARD_MAX_DIGITS - 1}}}",
    # Not a word character, nor '.' or ',' followed by a digit.
    r"(?:[^A-Za-z0-9_.,]|[.,](?:\P{Nd}|\z)|\z)",
)
# YYMMDD-PB-###G with both dashes or none.
_NRIC = (_before("A-Za-z0-9_+-"), rf"{_D}{{6}}(?:-{_D}{{2}}-|{_D}{{2}}){_D}{{4}}", _after("A-Za-z0-9_-"))
_PHONES = (
    # International: + country code, then groups of digits (a group may be parenthesised).
    (_B, rf"\+{_D}{{1,3}}(?:[ .-]?(?:\({_D}{{1,4}}\)|{_D}{{1,4}})){{1,6}}", _E),
    # Malaysia mobile 01x-xxx xxxx / 011-xxxx xxxx.
    (_B, rf"01{_D}[ -]?{_D}{{3,4}}[ -]?{_D}{{4}}", _E),
    # Malaysia landline 03-xxxx xxxx, 082-xxx xxxx: the dash after the area code is required.
    (_B, rf"0[3-9]{_D}?-{_D}{{3,4}}[ -]?{_D}{{4}}", _E),
    # Singapore 6xxx xxxx / 8xxx xxxx / 9xxx xxxx, grouped 4+4.
    (_B, rf"[689]{_D}{{3}}[ -]{_D}{{4}}", _after("A-Za-z0-9_-")),
    # China mobile 1[3-9]x xxxx xxxx.
    (_B, rf"1[3-9]{_D}[ -]?{_D}{{4}}[ -]?{_D}{{4}}", _E),
    # US (xxx) xxx-xxxx and xxx-xxx-xxxx.
    (_B, rf"(?:\({_D}{{3}}\) ?|{_D}{{3}}[-.]){_D}{{3}}[-.]{_D}{{4}}", _E),
)
# Scripts written without spaces between words: a name there has no word boundary.
_UNSPACED_SCRIPT = re.compile(
    r"[\u0e00-\u0e7f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]"
)


def _options(*, longest: bool = False, max_mem: int | None = None) -> re2.Options:
    options = re2.Options()
    options.log_errors = False
    options.longest_match = longest
    if max_mem is not None:
        options.max_mem = max_mem
    return options


def _compile(pattern: str, options: re2.Options) -> re2._re2.RE2:
    """An RE2 program over UTF-8 bytes (the C++ object: no per-call re-encoding of the
    text, no module-level cache keeping every pattern ever compiled)."""
    compiled = re2._re2.RE2(pattern.encode(), options)
    if not compiled.ok():
        raise ValueError(f"redaction pattern does not compile: {compiled.error()}")
    return compiled


def _char_before(text: bytes, end: int) -> int:
    """Where the UTF-8 character ending at byte `end` starts."""
    start = end - 1
    while start > 0 and 0x80 <= text[start] < 0xC0:
        start -= 1
    return start


def _encode(text: str) -> bytes:
    # Lone surrogates cannot come from protobuf or Postgres, but must not crash a caller.
    return text.encode("utf-8", "surrogatepass")


def _decode(text: bytes) -> str:
    return text.decode("utf-8", "surrogatepass")


def _every_code_point() -> str:
    codec = "utf-32-le" if sys.byteorder == "little" else "utf-32-be"
    return array.array("I", range(0x110000)).tobytes().decode(codec, "surrogatepass")


@functools.cache
def _python_class(escape: str) -> str:
    """Python's `\\w` or `\\s` (str patterns) as the body of an RE2 character class:
    every code point it matches, as ranges. Built once, when names are first used (about
    50 ms)."""
    every = _every_code_point()
    parts = []
    for run in re.finditer(escape + "+", every):
        first, last = run.start(), run.end() - 1
        parts.append(rf"\x{{{first:x}}}" if first == last else rf"\x{{{first:x}}}-\x{{{last:x}}}")
    return "".join(parts)


@functools.cache
def _spaces_as_blanks() -> dict[int, str]:
    """str.translate table: every character Python's `\\s` matches becomes as many ASCII
    spaces as it has UTF-8 bytes, so that the names rule needs only ' +' between a name's
    words (a Unicode class at every gap made 1,000 long names a 900,000-instruction
    program) and byte offsets stay those of the text."""
    every = _every_code_point()
    return {ord(ch): " " * len(_encode(ch)) for ch in re.findall(r"\s", every) if ch != " "}


def luhn_valid(digits: str) -> bool:
    """The Luhn (mod 10) checksum every payment card number carries."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _digits(text: str) -> str:
    return "".join(ch for ch in text if ch.isdigit())


def _is_card(match: str) -> bool:
    digits = _digits(match)
    return digits[0] in CARD_INDUSTRY_DIGITS and luhn_valid(digits)


def _real_date(yy: str, mm: str, dd: str) -> bool:
    for century in (1900, 2000):
        try:
            date(century + int(yy), int(mm), int(dd))
            return True
        except ValueError:
            continue
    return False


def _is_nric(match: str) -> bool:
    digits = match.replace("-", "")
    yy, mm, dd, place = digits[0:2], digits[2:4], digits[4:6], digits[6:8]
    return place in NRIC_BIRTHPLACE_CODES and _real_date(yy, mm, dd)


def _is_phone(match: str) -> bool:
    return PHONE_MIN_DIGITS <= len(_digits(match)) <= PHONE_MAX_DIGITS


class _Rule:
    """One pattern with its one-character left and right context (see the module's
    docstring); replaces each match `valid` accepts (every match without it)."""

    def __init__(
        self, placeholder: str, parts: tuple[str, str, str], valid: Callable[[str], bool] | None = None
    ) -> None:
        before, body, after = parts
        self.placeholder = placeholder.encode()
        self.pattern = _compile(f"(?s){before}({body}){after}", _options())
        self.valid = valid

    def apply(self, text: bytes) -> bytes:
        out: list[bytes] = []
        last = pos = 0
        end = len(text)
        match = self.pattern.Match
        while True:
            spans = match(_UNANCHORED, text, pos, end)
            start, stop = spans[1]
            if start < 0:
                break
            if self.valid is None or self.valid(_decode(text[start:stop])):
                out.append(text[last:start])
                out.append(self.placeholder)
                last = stop
            # The match's last character may be the next match's left context.
            pos = max(_char_before(text, stop), start + _char_len(text[start]))
        if not out:
            return text
        out.append(text[last:])
        return b"".join(out)


class _NameRule:
    """Known names as RE2 patterns, leftmost-longest, over the text framed by one space
    on each side: every match is one context character, the name, one context character,
    so no capture groups are needed. The names are factored into a trie (RE2 does not
    factor an alternation of case-insensitive names with gaps): after a shared prefix
    such as "Customer Name Number " one path stays alive, not one per name, which keeps
    RE2's automaton small and fast (1,000 unfactored names sharing a prefix needed 32 MiB
    for its DFA and ran 400x slower without it).

    Up to NAMES_PART_BYTES of names make one pattern; more make several, and each search
    takes the leftmost of their matches, the longest of those at one start: what one
    pattern of all the names, leftmost-longest, finds."""

    def __init__(self, names: list[str]) -> None:
        parts = _name_parts(names)
        budgets = _part_budgets(parts)
        self.max_mem = sum(budgets)
        # One compile per part: RE2 compiles holding the interpreter lock.
        self.patterns = [
            _compile(_names_pattern(part), _options(longest=True, max_mem=budget))
            for part, budget in zip(parts, budgets, strict=True)
        ]
        self.placeholder = NAME.encode()

    def apply(self, text: bytes) -> bytes:
        framed = b" " + text + b" "
        # Searched with every whitespace character as spaces of its byte length (same
        # offsets); the output is cut from the text itself.
        searched = b" " + _encode(_decode(text).translate(_spaces_as_blanks())) + b" "
        out: list[bytes] = []
        last, pos = 1, 0  # the output leaves the frame out; the search starts on it
        end = len(framed)
        searches = [pattern.Match for pattern in self.patterns]
        # Each pattern's next match from `pos` on, kept while it starts at or after `pos`
        # (the patterns have no anchors: a match does not depend on where the search began).
        found = [(-1, -1)] * len(searches)
        stale = list(range(len(searches)))
        while True:
            for i in stale:
                (found[i],) = searches[i](_UNANCHORED, searched, pos, end)
            start, stop = min(((s, e) for s, e in found if s >= 0), key=_leftmost_longest, default=(-1, -1))
            if start < 0:
                break
            # Drop the context character on each side (one UTF-8 character each).
            start += _char_len(framed[start])
            stop = _char_before(framed, stop)
            out.append(framed[last:start])
            out.append(self.placeholder)
            last = stop
            pos = max(_char_before(framed, stop), start + _char_len(framed[start]))
            stale = [i for i, (s, _) in enumerate(found) if 0 <= s < pos]
        if not out:
            return text
        out.append(framed[last:-1])
        return b"".join(out)


def _leftmost_longest(span: tuple[int, int]) -> tuple[int, int]:
    return span[0], -span[1]


def _names_pattern(names: list[str]) -> str:
    """One RE2 pattern of `names` (see _NameRule)."""
    word = _python_class(r"\w")
    not_word = f"[^{word}]"
    # One trie per kind of edges (bounded left, bounded right): each kind's context
    # classes appear once. Splitting is free: leftmost-longest ignores order.
    kinds: dict[tuple[bool, bool], list[list[tuple[str, str]]]] = {}
    for name in names:
        kinds.setdefault((_bounded(name[0]), _bounded(name[-1])), []).append(_name_tokens(name))
    branches = [
        (not_word if left else ".")
        + f"(?i:{_trie(sorted(tokens, key=_keys), 0)})"
        + (not_word if right else ".")
        for (left, right), tokens in kinds.items()
    ]
    return "(?s)" + "|".join(branches)


def _name_parts(names: list[str]) -> list[list[str]]:
    """`names` in parts of up to NAMES_PART_BYTES (UTF-8), in case-folded order so that
    names sharing a prefix share a part, and its trie."""
    parts: list[list[str]] = [[]]
    size = 0
    for name in sorted(names, key=lambda n: [_fold(ch) for ch in n]):
        length = len(_encode(name))
        if parts[-1] and size + length > NAMES_PART_BYTES:
            parts.append([])
            size = 0
        parts[-1].append(name)
        size += length
    return parts


def _name_tokens(name: str) -> list[tuple[str, str]]:
    """A name as (key, RE2 syntax) tokens: its characters (keyed case-folded, so names
    that differ in case share a path), ' +' between its words (the text's whitespace is
    searched as ASCII spaces: apply), and an empty end token (a name may end where another
    goes on)."""
    tokens: list[tuple[str, str]] = []
    for i, part in enumerate(name.split(" ")):
        if i:
            tokens.append((" ", " +"))
        tokens.extend((_fold(ch), _escape(ch)) for ch in part)
    tokens.append(("", ""))
    return tokens


def _keys(tokens: list[tuple[str, str]]) -> list[str]:
    return [key for key, _ in tokens]


def _fold(ch: str) -> str:
    lower = ch.lower()
    return lower if len(lower) == 1 else ch


def _escape(ch: str) -> str:
    """One character as an RE2 literal."""
    return ch if ch.isalnum() or not ch.isascii() else f"\\x{{{ord(ch):x}}}"


def _trie(names: list[list[tuple[str, str]]], depth: int) -> str:
    """Sorted token lists sharing their first `depth` keys, as RE2 syntax factored like a
    trie: a path alone is a plain concatenation, a branch an alternation (in any order:
    matching is leftmost-longest)."""
    alternatives = []
    for _, group in itertools.groupby(names, key=lambda tokens: tokens[depth][0]):
        members = list(group)
        first = members[0]
        if len(members) == 1 or depth + 1 == len(first):  # alone, or ended (a duplicate)
            alternatives.append("".join(syntax for _, syntax in first[depth:]))
        else:
            alternatives.append(first[depth][1] + _trie(members, depth + 1))
    return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"


def _names_budget(names: list[str]) -> int:
    size = sum(len(_encode(name)) for name in names)
    return min(NAMES_MAX_MEM_MAX, max(NAMES_MAX_MEM_MIN, NAMES_MAX_MEM_PER_NAME_BYTE * size))


def _part_budgets(parts: list[list[str]]) -> list[int]:
    """The budget of one pattern of all the names, shared by the parts by their size, each
    at least NAMES_PART_MAX_MEM_MIN."""
    total = _names_budget([name for part in parts for name in part])
    sizes = [sum(len(_encode(name)) for name in part) for part in parts]
    return [max(NAMES_PART_MAX_MEM_MIN, total * size // sum(sizes)) for size in sizes]


def _char_len(lead: int) -> int:
    """Bytes of the UTF-8 character starting with byte `lead`."""
    return 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


def _normalized_names(names: Iterable[str]) -> list[str]:
    """Distinct names with inner whitespace collapsed, too-short ones left out, longest
    first (the order is for readers of the pattern: matching is leftmost-longest)."""
    distinct = {" ".join(n.split()) for n in names}
    return sorted((n for n in distinct if len(n) >= MIN_NAME_CHARS), key=lambda n: (-len(n), n))


def _bounded(edge: str) -> bool:
    return bool(re.match(r"\w", edge)) and not _UNSPACED_SCRIPT.match(edge)


_BUILTIN_RULES = (
    _Rule(EMAIL, _EMAIL),
    _Rule(CARD, _CARD, _is_card),
    _Rule(NRIC, _NRIC, _is_nric),
    *(_Rule(PHONE, p, _is_phone) for p in _PHONES),
)


class Redactor:
    """Replaces emails, card numbers, NRICs, phone numbers and the given names with
    placeholders. Immutable and thread-safe; build one per set of known names."""

    def __init__(self, known_names: Iterable[str] = ()) -> None:
        names = _normalized_names(known_names)
        self._names = _NameRule(names) if names else None
        self._rules: tuple[_Rule | _NameRule, ...] = _BUILTIN_RULES + ((self._names,) if self._names else ())

    def redact(self, text: str) -> str:
        data = _encode(text)
        for rule in self._rules:
            data = rule.apply(data)
        return _decode(data)

    __call__ = redact


_DEFAULT = Redactor()
# Name lists as callers send them -> their Redactor, least recently used out. Worker
# threads share it (redaction runs off the event loop): every use holds the lock.
_REDACTORS: ByteLru[tuple[str, ...], Redactor] = ByteLru(REDACTOR_CACHE_BYTES)
_REDACTORS_LOCK = threading.Lock()


def redactor_bytes(known_names: Iterable[str]) -> int:
    """What a Redactor for these names is charged in the cache: its names pattern's RE2
    memory budget (an upper bound of what RE2 may allocate for it), and the names."""
    names = _normalized_names(known_names)
    if not names:
        return 0
    return sum(_part_budgets(_name_parts(names))) + sum(len(_encode(name)) for name in known_names)


def cached_redactor(known_names: Iterable[str] = ()) -> Redactor | None:
    """The Redactor for these names if it is built already (no compiling)."""
    key = tuple(known_names)
    if not key:
        return _DEFAULT
    with _REDACTORS_LOCK:
        found = _REDACTORS.get(key)
    return found if found is not None or _normalized_names(key) else _DEFAULT


def _redactor(known_names: tuple[str, ...]) -> Redactor:
    if not known_names:
        return _DEFAULT
    with _REDACTORS_LOCK:
        found = _REDACTORS.get(known_names)
    if found is None:
        cost = redactor_bytes(known_names)
        if not cost:  # every name too short: nothing to compile
            return _DEFAULT
        found = Redactor(known_names)
        with _REDACTORS_LOCK:
            _REDACTORS.put(known_names, found, cost)
    return found


def redactor(known_names: Iterable[str] = ()) -> Redactor:
    """The Redactor for these names: from the cache, or compiled (tens of milliseconds for
    1,000 names: run it off the event loop)."""
    return _redactor(tuple(known_names))


def prepare_names() -> None:
    """Build the Unicode tables the names rule uses (Python's \\w and \\s as RE2 classes,
    about 0.1 s in a few single C calls, each holding the interpreter lock): a server calls
    it as it starts, so that the first request with names does not pause the others."""
    _python_class(r"\w")
    _spaces_as_blanks()


def redact(text: str, known_names: Iterable[str] = ()) -> str:
    """`text` with PII replaced by placeholders such as [EMAIL] and [PHONE]."""
    return redactor(known_names).redact(text)


def _redact_all(texts: Sequence[str], known_names: tuple[str, ...]) -> list[str]:
    ready = redactor(known_names)
    return [ready.redact(text) for text in texts]


@dataclass(frozen=True)
class Redaction:
    """How a component redacts: the one type every part of serve that embeds or stores text
    is given (built once from DWSEARCH_REDACT by the composition root). Off, text passes
    unchanged; on, as `redact` with the request's known names."""

    enabled: bool = True

    def text(self, text: str) -> str:
        """`text` redacted with no known names, inline (the default Redactor is compiled)."""
        return _DEFAULT.redact(text) if self.enabled else text

    async def texts(self, texts: Sequence[str], known_names: Sequence[str] = ()) -> list[str]:
        """`texts` redacted with `known_names`: inline when they are small and the names'
        pattern is compiled already, otherwise in the CPU pool (off the event loop;
        RESOURCE_EXHAUSTED when it is full)."""
        if not self.enabled:
            return list(texts)
        size = sum(len(text) for text in texts)
        ready = cached_redactor(known_names)
        if ready is not None and size <= offload.INLINE_MAX_SIZE:
            return [ready.redact(text) for text in texts]
        return await offload.run(_redact_all, texts, tuple(known_names))


REDACTION_OFF = Redaction(enabled=False)
REDACTION_ON = Redaction(enabled=True)
