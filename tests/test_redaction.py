"""PII redaction rules, table-driven: what is replaced, and what must stay (false positives)."""

import pytest

from dwsearch.redaction import CARD, EMAIL, NAME, NRIC, PHONE, Redactor, luhn_valid, redact

REDACTED = [
    # Emails
    ("mail ahmad.ali+test@example.com.my please", f"mail {EMAIL} please"),
    ("陈伟的邮箱是 chen_wei@qq.com 谢谢", f"陈伟的邮箱是 {EMAIL} 谢谢"),
    ("<a.b@sub.example.org>", f"<{EMAIL}>"),
    ("邮箱chen@qq.com", f"邮箱{EMAIL}"),
    # Cards: 13-19 digits, Luhn-valid, issuer digit 2-6
    ("card 4111 1111 1111 1111 exp 12/29", f"card {CARD} exp 12/29"),
    ("4111-1111-1111-1111", CARD),
    ("5555555555554444", CARD),
    ("amex 3782 822463 10005", f"amex {CARD}"),
    ("unionpay 6212345678901265", f"unionpay {CARD}"),
    ("visa13 4222222222222", f"visa13 {CARD}"),
    # Malaysian NRIC
    ("IC saya 900101-14-5678", f"IC saya {NRIC}"),
    ("ic 900101145678 ok", f"ic {NRIC} ok"),
    ("born 000229-01-1234", f"born {NRIC}"),  # 2000 was a leap year
    ("foreign-born 851231-71-5555", f"foreign-born {NRIC}"),
    # Phones: international
    ("call +60 12-345 6789 now", f"call {PHONE} now"),
    ("+60123456789", PHONE),
    ("+65 9123 4567", PHONE),
    ("+86 138 0013 8000", PHONE),
    ("+1 (212) 555-0123", PHONE),
    ("+44 20 7946 0958", PHONE),
    # Malaysia local
    ("012-345 6789", PHONE),
    ("0123456789", PHONE),
    ("011-2345 6789", PHONE),
    ("office 03-2345 6789", f"office {PHONE}"),
    # Singapore local, 4+4
    ("hp 9123 4567", f"hp {PHONE}"),
    ("6123-4567", PHONE),
    # China mobile
    ("手机13800138000", f"手机{PHONE}"),
    ("138 0013 8000", PHONE),
    # US
    ("(212) 555-0123", PHONE),
    ("212-555-0123", PHONE),
]

KEPT = [
    "order 4111 1111 1111 1112",  # Luhn-invalid: an order number
    "Order #1234567890123",
    "tracking 1234567812345670",  # Luhn-valid but issuer digit 1: not a payment card
    "pi 3.14159265358979323846",
    "901301-14-5678",  # month 13
    "900230-14-5678",  # 30 February
    "900101-00-5678",  # place of birth 00 is never issued
    "900101-17-5678",  # nor 17
    "900101-145678",  # mixed separators
    "123456789012",  # 12 digits, not a date
    "invoice 202401150001",  # YYYYMMDD-style 12 digits
    "ticket 12345678",  # bare 8 digits
    "2024-01-15",
    "10:30-11:00",
    "RM 1,234.56",
    "total RM12,345,678.90",
    "v1.2.3",
    "192.168.1.10",
    "user@localhost",  # no top-level domain
    "@channel please check",
    "year 2026 q3",
    "SKU13800138000",  # glued to letters: a code, not a phone
    "ref A900101145678",
]


@pytest.mark.parametrize(("text", "expected"), REDACTED)
def test_redacts(text, expected):
    assert redact(text) == expected


@pytest.mark.parametrize("text", KEPT)
def test_keeps_what_is_not_pii(text):
    assert redact(text) == text


NAMES = ["Ahmad bin Ali", "Ahmad", "陈伟", "O'Brien", "Tan"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hi AHMAD BIN  ALI!", f"Hi {NAME}!"),  # case-insensitive, longest first, inner whitespace flexible
        ("ahmad said", f"{NAME} said"),
        ("我是陈伟的朋友", f"我是{NAME}的朋友"),  # no word boundaries in CJK text
        ("ask o'brien", f"ask {NAME}"),  # regex-escaped
        ("Tan, tan and TAN", f"{NAME}, {NAME} and {NAME}"),
        ("Tanaka and Ahmadi and stand", "Tanaka and Ahmadi and stand"),  # whole words only
    ],
)
def test_known_names(text, expected):
    assert Redactor(NAMES).redact(text) == expected
    assert redact(text, NAMES) == expected


def test_blank_and_one_letter_names_are_ignored():
    assert Redactor(["", "  ", "a"]).redact("a cat sat") == "a cat sat"


def test_names_are_not_special_characters():
    assert Redactor(["a.b"]).redact("axb a.b") == f"axb {NAME}"


def test_several_kinds_in_one_message():
    text = "Ahmad (900101-14-5678) at ahmad@example.com or +60 12-345 6789, card 4111111111111111"
    assert Redactor(["Ahmad"]).redact(text) == f"{NAME} ({NRIC}) at {EMAIL} or {PHONE}, card {CARD}"


@pytest.mark.parametrize(
    ("digits", "valid"), [("4111111111111111", True), ("4111111111111112", False), ("79927398713", True)]
)
def test_luhn(digits, valid):
    assert luhn_valid(digits) is valid
