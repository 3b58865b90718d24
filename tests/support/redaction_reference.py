"""The redaction engine as it was before RE2 (Python `re`, with lookarounds and a
backreference): the reference the RE2 rules are checked against on random texts
(tests/test_redaction.py). It backtracks badly on long adversarial texts; use it on
short ones only."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date

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

# Numbers may touch CJK text ("手机13800138000"), which has no spaces, but not Latin
# letters, digits or '+': those make them part of a code or a longer number.
_B = r"(?<![A-Za-z0-9_+])"
_E = r"(?![A-Za-z0-9_])"
_EMAIL_RE = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"
    + _E
)
# Digits joined by at most one space or dash, not part of a decimal number.
_CARD_RE = re.compile(
    r"(?<![A-Za-z0-9_+.,])\d(?:[ -]?\d)"
    + f"{{{CARD_MIN_DIGITS - 1},{CARD_MAX_DIGITS - 1}}}"
    + r"(?![A-Za-z0-9_]|[.,]\d)"
)
_NRIC_RE = re.compile(r"(?<![A-Za-z0-9_+-])(\d{2})(\d{2})(\d{2})(-?)(\d{2})\4(\d{4})(?![A-Za-z0-9_-])")
_PHONE_RES = tuple(
    re.compile(_B + body + end)
    for body, end in (
        # International: + country code, then groups of digits (a group may be parenthesised).
        (r"\+\d{1,3}(?:[ .-]?(?:\(\d{1,4}\)|\d{1,4})){1,6}", _E),
        # Malaysia mobile 01x-xxx xxxx / 011-xxxx xxxx.
        (r"01\d[ -]?\d{3,4}[ -]?\d{4}", _E),
        # Malaysia landline 03-xxxx xxxx, 082-xxx xxxx: the dash after the area code is required.
        (r"0[3-9]\d?-\d{3,4}[ -]?\d{4}", _E),
        # Singapore 6xxx xxxx / 8xxx xxxx / 9xxx xxxx, grouped 4+4.
        (r"[689]\d{3}[ -]\d{4}", r"(?![A-Za-z0-9_-])"),
        # China mobile 1[3-9]x xxxx xxxx.
        (r"1[3-9]\d[ -]?\d{4}[ -]?\d{4}", _E),
        # US (xxx) xxx-xxxx and xxx-xxx-xxxx.
        (r"(?:\(\d{3}\) ?|\d{3}[-.])\d{3}[-.]\d{4}", _E),
    )
)
# Scripts written without spaces between words: a name there has no word boundary.
_UNSPACED_SCRIPT = re.compile(
    r"[\u0e00-\u0e7f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]"
)


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


def _is_card(match: re.Match[str]) -> bool:
    digits = _digits(match.group(0))
    return digits[0] in CARD_INDUSTRY_DIGITS and luhn_valid(digits)


def _real_date(yy: str, mm: str, dd: str) -> bool:
    for century in (1900, 2000):
        try:
            date(century + int(yy), int(mm), int(dd))
            return True
        except ValueError:
            continue
    return False


def _is_nric(match: re.Match[str]) -> bool:
    yy, mm, dd, _, place, _ = match.groups()
    return place in NRIC_BIRTHPLACE_CODES and _real_date(yy, mm, dd)


def _is_phone(match: re.Match[str]) -> bool:
    return PHONE_MIN_DIGITS <= len(_digits(match.group(0))) <= PHONE_MAX_DIGITS


def _name_pattern(names: Iterable[str]) -> re.Pattern[str] | None:
    alternatives = []
    # Longest first, so "Ahmad bin Ali" wins over "Ahmad".
    for name in sorted({" ".join(n.split()) for n in names}, key=lambda n: (-len(n), n)):
        if len(name) < MIN_NAME_CHARS:
            continue
        body = r"\s+".join(re.escape(part) for part in name.split(" "))
        left = r"(?<!\w)" if _bounded(name[0]) else ""
        right = r"(?!\w)" if _bounded(name[-1]) else ""
        alternatives.append(left + body + right)
    return re.compile("|".join(alternatives), re.IGNORECASE) if alternatives else None


def _bounded(edge: str) -> bool:
    return bool(re.match(r"\w", edge)) and not _UNSPACED_SCRIPT.match(edge)


@dataclass(frozen=True)
class _Rule:
    placeholder: str
    pattern: re.Pattern[str]
    valid: Callable[[re.Match[str]], bool] | None = None

    def apply(self, text: str) -> str:
        if self.valid is None:
            return self.pattern.sub(self.placeholder, text)
        valid = self.valid
        return self.pattern.sub(lambda m: self.placeholder if valid(m) else m.group(0), text)


_BUILTIN_RULES = (
    _Rule(EMAIL, _EMAIL_RE),
    _Rule(CARD, _CARD_RE, _is_card),
    _Rule(NRIC, _NRIC_RE, _is_nric),
    *(_Rule(PHONE, p, _is_phone) for p in _PHONE_RES),
)


class Redactor:
    """Replaces emails, card numbers, NRICs, phone numbers and the given names with
    placeholders. Immutable and thread-safe; build one per set of known names."""

    def __init__(self, known_names: Iterable[str] = ()) -> None:
        names = _name_pattern(known_names)
        self._rules = _BUILTIN_RULES + ((_Rule(NAME, names),) if names is not None else ())

    def redact(self, text: str) -> str:
        for rule in self._rules:
            text = rule.apply(text)
        return text

    __call__ = redact


@functools.lru_cache(maxsize=64)
def _redactor(known_names: tuple[str, ...]) -> Redactor:
    return Redactor(known_names)


def redact(text: str, known_names: Iterable[str] = ()) -> str:
    """`text` with PII replaced by placeholders such as [EMAIL] and [PHONE]."""
    return _redactor(tuple(known_names)).redact(text)
