"""The filter expression language without a database: parsing, errors, the SQL it
generates (parameters only), and the reference evaluator."""

from __future__ import annotations

from decimal import Decimal

import pytest

from dwsearch.common.errors import InvalidArgument
from dwsearch.index.filter import (
    MAX_FILTER_LENGTH,
    MAX_GLOB_WILDCARDS,
    MAX_NESTING_DEPTH,
    And,
    Compare,
    Contains,
    FilterSyntaxError,
    Glob,
    HasField,
    In,
    Or,
    compile_filter,
    evaluate,
    parse_filter,
)

A = ("a",)


def eq(name: str, value) -> Compare:
    return Compare((name,), "=", value)


PARSES = [
    # comparisons and value types
    ("a = 'x'", eq("a", "x")),
    ('a = "x"', eq("a", "x")),
    ("a != 1", Compare(A, "!=", Decimal(1))),
    ("a < -1.5", Compare(A, "<", Decimal("-1.5"))),
    ("a <= 2e3", Compare(A, "<=", Decimal("2e3"))),
    ("a > 1E-2", Compare(A, ">", Decimal("1E-2"))),
    ("a >= 0", Compare(A, ">=", Decimal(0))),
    ("a = true", eq("a", True)),
    ("a = FALSE", eq("a", False)),
    ("a = True", eq("a", True)),
    ("a = ''", eq("a", "")),
    ("a = '东西 rojak'", eq("a", "东西 rojak")),
    # quotes: the quote character doubled stands for itself; backslash is ordinary
    ("a = 'it''s'", eq("a", "it's")),
    ('a = "say ""hi"""', eq("a", 'say "hi"')),
    ('a = "it\'s"', eq("a", "it's")),
    ("a = 'C:\\dir\\'", eq("a", "C:\\dir\\")),
    ("a = ''''", eq("a", "'")),
    # GLOB, IN, CONTAINS, HAS FIELD and their NOT forms
    ("a GLOB 'x*'", Glob(A, "x*")),
    ("a NOT GLOB '?[^a]'", Glob(A, "?[^a]", negated=True)),
    ("a IN ('x', 1, true)", In(A, ("x", Decimal(1), True))),
    ("a NOT IN (2)", In(A, (Decimal(2),), negated=True)),
    ("a CONTAINS 'x'", Contains(A, "x")),
    ("a NOT CONTAINS 3", Contains(A, Decimal(3), negated=True)),
    ("HAS FIELD a.b", HasField(("a", "b"))),
    ("HAS NOT FIELD a", HasField(A, negated=True)),
    # keywords in any case
    (
        "a glob 'x' Or a not in (1) aNd HAS not field b",
        Or((Glob(A, "x"), And((In(A, (Decimal(1),), True), HasField(("b",), True))))),
    ),
    # paths
    ("a.b.c = 1", Compare(("a", "b", "c"), "=", Decimal(1))),
    ("a[0] = 1", Compare(("a", 0), "=", Decimal(1))),
    ("a[#-1] = 1", Compare(("a", -1), "=", Decimal(1))),
    ("a[2].b[#-3].c = 1", Compare(("a", 2, "b", -3, "c"), "=", Decimal(1))),
    ("a[0][1] = 1", Compare(("a", 0, 1), "=", Decimal(1))),
    ("_x9.in = 1", Compare(("_x9", "in"), "=", Decimal(1))),  # nested names may spell keywords
    ("meta.field = 'x'", Compare(("meta", "field"), "=", "x")),
    # precedence, grouping, spacing
    ("a = 1 OR b = 2 AND c = 3", Or((eq("a", Decimal(1)), And((eq("b", Decimal(2)), eq("c", Decimal(3))))))),
    (
        "(a = 1 OR b = 2) AND c = 3",
        And((Or((eq("a", Decimal(1)), eq("b", Decimal(2)))), eq("c", Decimal(3)))),
    ),
    ("a = 1 AND b = 2 AND c = 3", And((eq("a", Decimal(1)), eq("b", Decimal(2)), eq("c", Decimal(3))))),
    ("((a = 1))", eq("a", Decimal(1))),
    ("a='x'AND(b>=2)", And((eq("a", "x"), Compare(("b",), ">=", Decimal(2))))),
    ("\n\ta\t=\n'x'  ", eq("a", "x")),
]


@pytest.mark.parametrize(("text", "expected"), PARSES, ids=[text for text, _ in PARSES])
def test_parses(text, expected):
    node = parse_filter(text)
    assert node == expected
    # Node equality conflates True with 1; the value's type is what the SQL depends on.
    assert repr(node) == repr(expected)


@pytest.mark.parametrize("text", ["", "   ", "\n\t "])
def test_empty_filter_matches_everything(text):
    assert parse_filter(text) is None
    assert evaluate(None, {"a": 1})
    fragment, params = compile_filter(None)
    assert fragment.as_string(None) == "TRUE" and params == []


ERRORS = [
    ("a = 'x", "unterminated string starting at position 5"),
    ("a = 'it''s", "unterminated string starting at position 5"),
    ("appId = ", "expected a value at position 9, found the end of the filter"),
    ("a = AND b = 1", "expected a value at position 5, found 'AND'"),
    ("a == 1", "expected a value at position 4, found '='"),
    ("a = -x", "unexpected character '-' at position 5"),
    ("a LIKE 'x'", "expected an operator (= != < <= > >= GLOB IN CONTAINS NOT) at position 3, found 'LIKE'"),
    ("a ~ 'x'", "unexpected character '~' at position 3"),
    ("a <> 1", "expected a value at position 4, found '>'"),
    ("a NOT = 1", "expected GLOB, IN or CONTAINS at position 7, found '='"),
    ("NOT a = 1", "expected a field name at position 1, found 'NOT'"),
    ("a = 1 b = 2", "expected AND, OR or the end of the filter at position 7, found 'b'"),
    ("a = 1 AND", "expected a field name at position 10, found the end of the filter"),
    ("(a = 1", "expected ')' at position 7, found the end of the filter"),
    ("a = 1)", "expected AND, OR or the end of the filter at position 6, found ')'"),
    ("()", "expected a field name at position 2, found ')'"),
    ("a IN ()", "expected a value at position 7, found ')'"),
    ("a IN (1,)", "expected a value at position 9, found ')'"),
    ("a IN 1", "expected '(' at position 6, found '1'"),
    ("a IN (1 2)", "expected ',' or ')' at position 9, found '2'"),
    ("a GLOB 1", "expected a quoted GLOB pattern at position 8, found '1'"),
    ("a GLOB '[abc'", "unterminated '[' in the GLOB pattern at position 8"),
    ("a GLOB 'x[z-a]'", "reversed range 'z-a' in the GLOB pattern at position 8"),
    ("a GLOB '" + "?" * (MAX_GLOB_WILDCARDS + 1) + "'", f"more than {MAX_GLOB_WILDCARDS} wildcards"),
    ("a[-1] = 1", "expected an array index (0, 1, ... or #-1 for the last) at position 3, found '-1'"),
    ("a[1.5] = 1", "expected an array index (0, 1, ... or #-1 for the last) at position 3"),
    ("a[#1] = 1", "expected an array index (0, 1, ... or #-1 for the last) at position 4, found '1'"),
    ("a[#-0] = 1", "expected an array index (0, 1, ... or #-1 for the last) at position 4"),
    ("a[0 = 1", "expected ']' at position 5, found '='"),
    ("a[99999999999] = 1", "array index larger than 2147483647 at position 3"),
    ("a. = 1", "expected a field name at position 4, found '='"),
    ("a.5 = 1", "expected a field name at position 3, found '5'"),
    ("'a' = 1", "expected a field name at position 1, found \"'a'\""),
    ("HAS a", "expected FIELD at position 5, found 'a'"),
    ("HAS FIELD", "expected a field name at position 10, found the end of the filter"),
    ("a = 1e5000", "number out of range (|exponent| > 1000) at position 5"),
    ("a = 'x\x00'", "NUL character at position 7"),
    # SQL injection attempts are syntax errors
    ("appId = 'x' OR 1=1 --", "expected a field name at position 16, found '1'"),
    ("appId = 'x' --", "unexpected character '-' at position 13"),
    ("appId = 'x'; DROP TABLE t", "unexpected character ';' at position 12"),
    ("appId = 'x' /* */", "unexpected character '/' at position 13"),
    ("\"appId\" = 'x'", "expected a field name at position 1"),
    ("app\"Id = 'x'", "unterminated string starting at position 4"),
]


@pytest.mark.parametrize(("text", "message"), ERRORS, ids=[text for text, _ in ERRORS])
def test_syntax_errors_name_the_position(text, message):
    with pytest.raises(FilterSyntaxError) as raised:
        parse_filter(text)
    assert str(raised.value).startswith("filter: ")
    assert message in str(raised.value)
    assert isinstance(raised.value, InvalidArgument)
    if raised.value.position is not None:
        assert f"at position {raised.value.position}" in str(raised.value)


def test_length_is_capped():
    parse_filter("a = '" + "x" * (MAX_FILTER_LENGTH - 6) + "'")
    with pytest.raises(FilterSyntaxError, match=f"longer than {MAX_FILTER_LENGTH} characters"):
        parse_filter("a = '" + "x" * (MAX_FILTER_LENGTH - 5) + "'")


def test_nesting_is_capped():
    def nested(depth: int) -> str:
        return "(" * depth + "a = 1" + ")" * depth

    assert parse_filter(nested(MAX_NESTING_DEPTH)) == eq("a", Decimal(1))
    with pytest.raises(FilterSyntaxError, match=f"nested deeper than {MAX_NESTING_DEPTH} at position 65"):
        parse_filter(nested(MAX_NESTING_DEPTH + 1))


def test_a_quoted_injection_stays_a_parameter():
    value = "x'; DROP TABLE t; --"
    node = parse_filter("appId = 'x''; DROP TABLE t; --'")
    assert node == eq("appId", value)
    fragment, params = compile_filter(node)
    assert params == [value]
    assert "DROP" not in fragment.as_string(None)


def test_values_are_parameters_and_names_are_quoted_literals():
    node = parse_filter("appId = 'app1' AND trustScore > 0.85 AND tags CONTAINS 'vip' AND title GLOB 'How*'")
    fragment, params = compile_filter(node)
    text = fragment.as_string(None)
    assert params == ["app1", Decimal("0.85"), "vip", "^How.*$"]
    assert text.count("%s") == len(params)
    for value in ("app1", "0.85", "vip", "How"):
        assert value not in text
    # The shape a btree expression index ((metadata ->> 'appId')) matches.
    assert """("metadata" ->> 'appId') = %s""" in text


def test_strings_order_by_code_point_whatever_the_database_collation():
    fragment, _ = compile_filter(parse_filter("title < 'I'"))
    assert """("metadata" ->> 'title') COLLATE "C" < %s""" in fragment.as_string(None)


def test_column_may_be_table_qualified():
    fragment, _ = compile_filter(parse_filter("a = 1"), column="d.metadata")
    assert '"d"."metadata" -> \'a\'' in fragment.as_string(None)


def test_array_steps_compile_to_strict_jsonpath():
    fragment, _ = compile_filter(parse_filter("a.b[0][#-1][#-3] = 1"))
    assert """'strict $."a"."b"[0][last][last - 2]'::jsonpath""" in fragment.as_string(None)


# The reference semantics: the SQL tests check Postgres against these.

EVALUATIONS = [
    ("resolution != 'escalated'", {}, True),  # a missing field satisfies every negated form
    ("a NOT IN (1)", {}, True),
    ("a NOT GLOB '*'", {}, True),
    ("a NOT CONTAINS 1", {}, True),
    ("a = 1", {"a": "1"}, False),  # typed: a string is never a number
    ("a = '1'", {"a": 1}, False),
    ("a = 1", {"a": True}, False),  # nor is a boolean
    ("a CONTAINS 1", {"a": [True]}, False),
    ("a = 1", {"a": 1.0}, True),
    ("a = 0.1", {"a": 0.1}, True),  # the float as JSON writes it, compared as a decimal
    ("a < 0.30000000000000004", {"a": 0.1 + 0.2}, False),
    ("a > 'Z'", {"a": "é"}, True),  # code-point order
    ("a < 'b'", {"a": "B"}, True),
    ("a < true", {"a": False}, True),
    ("HAS FIELD a", {"a": None}, True),  # JSON null is present
    ("a != 1", {"a": None}, True),
    ("a < 1", {"a": None}, False),
    ("a.b = 1", {"a": [{"b": 1}]}, False),  # a name step needs an object
    ("a[0] = 1", {"a": {"0": 1}}, False),  # an index step needs an array
    ("a[0] = 1", {"a": 1}, False),
    ("a[#-2] = 1", {"a": [1, 2]}, True),
    ("a[#-3] = 1", {"a": [1, 2]}, False),
    ("a GLOB 'a?c'", {"a": "a\nc"}, True),
    ("a GLOB '*'", {"a": 1}, False),
    ("a GLOB 'A*'", {"a": "abc"}, False),  # case-sensitive
]


@pytest.mark.parametrize(
    ("text", "metadata", "expected"), EVALUATIONS, ids=[text for text, *_ in EVALUATIONS]
)
def test_evaluate(text, metadata, expected):
    assert evaluate(parse_filter(text), metadata) is expected


GLOBS = [
    ("*", "", True),
    ("?", "", False),
    ("a*b*c", "aXbYbZc", True),
    ("a*b*c", "aXbYbZ", False),
    ("*a*a*a*b", "a" * 50, False),
    ("[abc]", "b", True),
    ("[^abc]", "b", False),
    ("[!abc]", "d", True),
    ("[a-c]x", "bx", True),
    ("[]]", "]", True),
    ("[^]]", "a", True),
    ("[-a]", "-", True),
    ("[a-]", "-", True),
    ("[*]", "*", True),
    ("[*]", "x", False),
    ("[[]x", "[x", True),
    ("a]", "a]", True),
    ("\\*", "\\anything", True),  # a backslash is an ordinary character
    ("**", "abc", True),
    ("*.pdf", "report.pdf", True),
    ("*.pdf", "report_pdf", False),
    ("[à-ê]", "é", True),
    ("$^(.)|+{}", "$^(.)|+{}", True),
]


@pytest.mark.parametrize(("pattern", "text", "expected"), GLOBS)
def test_glob(pattern, text, expected):
    assert evaluate(Glob(A, pattern), {"a": text}) is expected
