"""The metadata filter expression language (Upstash Vector's, as agent context uses it), e.g.

    appId = 'x' AND type = 'conversation' AND resolution != 'escalated'
    trustScore > 0.85

Grammar (keywords in any case, field names case-sensitive; whitespace between tokens is free):

    filter     := [or_expr]                      empty or blank matches every document
    or_expr    := and_expr (OR and_expr)*        AND binds tighter than OR
    and_expr   := primary (AND primary)*
    primary    := '(' or_expr ')' | HAS [NOT] FIELD path | condition
    condition  := path ('=' | '!=' | '<' | '<=' | '>' | '>=') value
                | path [NOT] GLOB string
                | path [NOT] IN '(' value (',' value)* ')'
                | path [NOT] CONTAINS value
    path       := name ('.' name | '[' index ']')*
    name       := [A-Za-z_][A-Za-z0-9_]*          a top-level name may not be a keyword
    index      := digits | '#-' digits            a[0] is the first element, a[#-1] the last
    value      := string | number | TRUE | FALSE
    string     := '...' | "..."                   the quote doubled stands for itself:
                                                  'it''s'; a backslash is an ordinary character
    number     := -?digits(.digits)?([eE][+-]?digits)?

NOT exists only inside the operators above; there is no general negation.

Semantics (`evaluate` is the reference; `compile_filter` produces the same answers in SQL):
- A comparison is typed: a string literal matches only JSON strings, a number only JSON
  numbers (compared exactly, as decimals: 1 = 1.0), a boolean only JSON booleans. Strings
  order by Unicode code point, false < true. A missing field, JSON null or a value of
  another type satisfies no comparison.
- Every negated form (!=, NOT IN, NOT GLOB, NOT CONTAINS, HAS NOT FIELD) is exactly the
  complement of its positive form, so it matches documents where the field is missing or
  of another type: `resolution != 'escalated'` keeps conversations with no resolution.
- GLOB is a case-sensitive Unix glob over a string field: * ? [abc] [a-z] [^abc] ([!abc]);
  ']' first in a class is literal; no backslash escapes (write [*] for a literal *).
- CONTAINS: the field is an array with an element equal (as above) to the value.
- HAS FIELD: the path leads to a value, JSON null included.
- A path step a.b needs an object, a[i] an array; anything else makes the field missing.
"""

from __future__ import annotations

import operator
import re
import string
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from typing import Any, NamedTuple, NoReturn

from psycopg import sql

from dwsearch.common.errors import InvalidArgument

MAX_FILTER_LENGTH = 8192
"""Characters. Bounds the parser's work and the size of the generated SQL."""

MAX_NESTING_DEPTH = 64
"""Parentheses nested inside each other; keeps the recursive parser far from Python's limit."""

MAX_NUMBER_EXPONENT = 1000
"""|decimal exponent| of a number literal; far inside Postgres numeric's range."""

MAX_ARRAY_INDEX = 2**31 - 1
"""jsonpath array subscripts are 32-bit."""

MAX_GLOB_WILDCARDS = 100
"""*, ? and [...] in one GLOB pattern; Postgres rejects regexes past a complexity limit."""

KEYWORDS = frozenset({"AND", "OR", "NOT", "IN", "GLOB", "CONTAINS", "HAS", "FIELD", "TRUE", "FALSE"})

COMPARISON_OPERATORS = ("=", "!=", "<", "<=", ">", ">=")


class FilterSyntaxError(InvalidArgument):
    """A malformed filter; `position` is the 1-based character where it went wrong."""

    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position


# --- AST ---------------------------------------------------------------------------

PathStep = str | int
"""An object key, or an array index (negative counts from the end: -1 is the last)."""

Path = tuple[PathStep, ...]
Value = str | Decimal | bool


@dataclass(frozen=True)
class Compare:
    path: Path
    op: str  # one of COMPARISON_OPERATORS
    value: Value


@dataclass(frozen=True)
class Glob:
    path: Path
    pattern: str
    negated: bool = False


@dataclass(frozen=True)
class In:
    path: Path
    values: tuple[Value, ...]
    negated: bool = False


@dataclass(frozen=True)
class Contains:
    path: Path
    value: Value
    negated: bool = False


@dataclass(frozen=True)
class HasField:
    path: Path
    negated: bool = False


@dataclass(frozen=True)
class And:
    operands: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    operands: tuple[Node, ...]


Node = Compare | Glob | In | Contains | HasField | And | Or


# --- Tokenizer ---------------------------------------------------------------------


class _Token(NamedTuple):
    kind: str  # string | number | word | op | punct | end
    text: str
    offset: int  # 0-based offset into the filter (not `index`: that is a tuple method)

    @property
    def keyword(self) -> str | None:
        upper = self.text.upper()
        return upper if self.kind == "word" and upper in KEYWORDS else None

    def describe(self) -> str:
        return "the end of the filter" if self.kind == "end" else repr(self.text)


_TOKEN_RE = re.compile(
    r"""
      (?P<space>\s+)
    | (?P<string>'(?:[^']|'')*+'|"(?:[^"]|"")*+")
    | (?P<number>-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
    | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<op><=|>=|!=|=|<|>)
    | (?P<punct>[(),.\[\]\#])
    """,
    re.VERBOSE | re.ASCII,
)


def _tokenize(text: str) -> Iterator[_Token]:
    """Tokens on demand, so that a lexical error is reported only once the parser reaches it."""
    index = 0
    while index < len(text):
        match = _TOKEN_RE.match(text, index)
        if match is None:
            char = text[index]
            what = "unterminated string starting" if char in "'\"" else f"unexpected character {char!r}"
            raise _syntax_error(what, index)
        if match.lastgroup is not None and match.lastgroup != "space":
            yield _Token(match.lastgroup, match.group(), index)
        index = match.end()
    yield _Token("end", "", len(text))


# --- Parser ------------------------------------------------------------------------


def parse_filter(text: str) -> Node | None:
    """Parse a filter expression; None for an empty one (it matches every document)."""
    if len(text) > MAX_FILTER_LENGTH:
        raise FilterSyntaxError(f"filter: longer than {MAX_FILTER_LENGTH} characters")
    if "\x00" in text:  # Postgres text cannot hold NUL
        raise _syntax_error("NUL character", text.index("\x00"))
    parser = _Parser(_tokenize(text))
    return None if parser.at_end() else parser.parse()


class _Parser:
    """Recursive descent over the token stream, one method per grammar rule."""

    def __init__(self, tokens: Iterator[_Token]) -> None:
        self._tokens = tokens
        self._current = next(tokens)
        self._depth = 0

    def at_end(self) -> bool:
        return self._current.kind == "end"

    def parse(self) -> Node:
        node = self._or_expr()
        if not self.at_end():
            self._fail("AND, OR or the end of the filter")
        return node

    def _or_expr(self) -> Node:
        operands = [self._and_expr()]
        while self._accept_keyword("OR"):
            operands.append(self._and_expr())
        return operands[0] if len(operands) == 1 else Or(tuple(operands))

    def _and_expr(self) -> Node:
        operands = [self._primary()]
        while self._accept_keyword("AND"):
            operands.append(self._primary())
        return operands[0] if len(operands) == 1 else And(tuple(operands))

    def _primary(self) -> Node:
        token = self._peek()
        if token.kind == "punct" and token.text == "(":
            if self._depth == MAX_NESTING_DEPTH:
                raise _syntax_error(f"parentheses nested deeper than {MAX_NESTING_DEPTH}", token.offset)
            self._advance()
            self._depth += 1
            node = self._or_expr()
            self._expect_punct(")", "')'")
            self._depth -= 1
            return node
        if self._accept_keyword("HAS"):
            negated = self._accept_keyword("NOT")
            self._expect_keyword("FIELD")
            return HasField(self._path(), negated)
        return self._condition()

    def _condition(self) -> Node:
        path = self._path()
        token = self._peek()
        if token.kind == "op":
            self._advance()
            return Compare(path, token.text, self._value())
        negated = self._accept_keyword("NOT")
        keyword = self._peek().keyword
        if keyword == "GLOB":
            self._advance()
            return Glob(path, self._glob_pattern(), negated)
        if keyword == "IN":
            self._advance()
            return In(path, self._value_list(), negated)
        if keyword == "CONTAINS":
            self._advance()
            return Contains(path, self._value(), negated)
        if negated:
            self._fail("GLOB, IN or CONTAINS")
        self._fail(f"an operator ({' '.join(COMPARISON_OPERATORS)} GLOB IN CONTAINS NOT)")

    def _path(self) -> Path:
        token = self._peek()
        if token.kind != "word" or token.keyword:
            self._fail("a field name")
        self._advance()
        steps: list[PathStep] = [token.text]
        while self._peek().kind == "punct" and self._peek().text in ".[":
            if self._advance().text == ".":
                if self._peek().kind != "word":  # nested names may spell keywords: a.type, a.in
                    self._fail("a field name")
                steps.append(self._advance().text)
            else:
                steps.append(self._array_index())
                self._expect_punct("]", "']'")
        return tuple(steps)

    def _array_index(self) -> int:
        expected = "an array index (0, 1, ... or #-1 for the last)"
        from_end = self._accept_punct("#")
        token = self._peek()
        pattern = r"-[1-9][0-9]*" if from_end else r"[0-9]+"
        if token.kind != "number" or not re.fullmatch(pattern, token.text):
            self._fail(expected)
        index = int(token.text)
        if abs(index) > MAX_ARRAY_INDEX:
            raise _syntax_error(f"array index larger than {MAX_ARRAY_INDEX}", token.offset)
        self._advance()
        return index

    def _value(self) -> Value:
        token = self._peek()
        if token.kind == "string":
            self._advance()
            return _unquote(token.text)
        if token.kind == "number":
            number = Decimal(token.text)
            if abs(number.adjusted()) > MAX_NUMBER_EXPONENT:
                raise _syntax_error(f"number out of range (|exponent| > {MAX_NUMBER_EXPONENT})", token.offset)
            self._advance()
            return number
        if token.keyword in ("TRUE", "FALSE"):
            self._advance()
            return token.keyword == "TRUE"
        self._fail("a value")

    def _value_list(self) -> tuple[Value, ...]:
        self._expect_punct("(", "'('")
        values = [self._value()]
        while self._accept_punct(","):
            values.append(self._value())
        self._expect_punct(")", "',' or ')'")
        return tuple(values)

    def _glob_pattern(self) -> str:
        token = self._peek()
        if token.kind != "string":
            self._fail("a quoted GLOB pattern")
        pattern = _unquote(token.text)
        try:
            _glob_tokens(pattern)
        except ValueError as error:
            raise _syntax_error(f"{error} in the GLOB pattern", token.offset) from None
        self._advance()
        return pattern

    # Token plumbing.

    def _peek(self) -> _Token:
        return self._current

    def _advance(self) -> _Token:
        token = self._current
        if token.kind != "end":
            self._current = next(self._tokens)
        return token

    def _accept_keyword(self, keyword: str) -> bool:
        if self._peek().keyword == keyword:
            self._advance()
            return True
        return False

    def _accept_punct(self, text: str) -> bool:
        if self._peek().kind == "punct" and self._peek().text == text:
            self._advance()
            return True
        return False

    def _expect_keyword(self, keyword: str) -> None:
        if not self._accept_keyword(keyword):
            self._fail(keyword)

    def _expect_punct(self, text: str, expected: str) -> None:
        if not self._accept_punct(text):
            self._fail(expected)

    def _fail(self, expected: str) -> NoReturn:
        token = self._peek()
        raise _syntax_error(f"expected {expected}", token.offset, found=token.describe())


def _syntax_error(problem: str, index: int, found: str = "") -> FilterSyntaxError:
    """The error for a problem at 0-based index, e.g. 'filter: expected a value at position 14, found ...'."""
    position = index + 1
    suffix = f", found {found}" if found else ""
    return FilterSyntaxError(f"filter: {problem} at position {position}{suffix}", position)


def _unquote(literal: str) -> str:
    quote = literal[0]
    return literal[1:-1].replace(quote * 2, quote)


# --- GLOB patterns -----------------------------------------------------------------
# One parsed form feeds both the SQL regex and the Python matcher, so they cannot drift.


class _Wildcard(Enum):
    ANY_CHAR = "?"
    ANY_RUN = "*"


@dataclass(frozen=True)
class _CharClass:
    ranges: tuple[tuple[str, str], ...]  # inclusive code-point ranges; a single char is (c, c)
    negated: bool

    def matches(self, char: str) -> bool:
        return any(low <= char <= high for low, high in self.ranges) != self.negated


_GlobToken = str | _Wildcard | _CharClass


def _glob_tokens(pattern: str) -> list[_GlobToken]:
    """Parse a glob; raises ValueError naming the problem."""
    tokens: list[_GlobToken] = []
    index = 0
    while index < len(pattern):
        char = pattern[index]
        index += 1
        if char == "*":
            if not tokens or tokens[-1] is not _Wildcard.ANY_RUN:  # '**' is '*'
                tokens.append(_Wildcard.ANY_RUN)
        elif char == "?":
            tokens.append(_Wildcard.ANY_CHAR)
        elif char == "[":
            char_class, index = _char_class(pattern, index)
            tokens.append(char_class)
        else:
            tokens.append(char)
    if sum(not isinstance(token, str) for token in tokens) > MAX_GLOB_WILDCARDS:
        raise ValueError(f"more than {MAX_GLOB_WILDCARDS} wildcards")
    return tokens


def _char_class(pattern: str, index: int) -> tuple[_CharClass, int]:
    """Parse a [...] class whose '[' ends just before index; returns it and the index after ']'."""
    negated = index < len(pattern) and pattern[index] in "^!"
    if negated:
        index += 1
    ranges: list[tuple[str, str]] = []
    first = True
    while index < len(pattern):
        char = pattern[index]
        if char == "]" and not first:
            return _CharClass(tuple(ranges), negated), index + 1
        first = False
        if index + 2 < len(pattern) and pattern[index + 1] == "-" and pattern[index + 2] != "]":
            low, high = char, pattern[index + 2]
            if low > high:
                raise ValueError(f"reversed range '{low}-{high}'")
            ranges.append((low, high))
            index += 3
        else:
            ranges.append((char, char))
            index += 1
    raise ValueError("unterminated '['")


def _glob_regex(tokens: list[_GlobToken]) -> str:
    """An anchored Postgres regex (ARE). '.' and [^...] match newlines there by default, as here."""
    parts = ["^"]
    for token in tokens:
        match token:
            case _Wildcard.ANY_RUN:
                parts.append(".*")
            case _Wildcard.ANY_CHAR:
                parts.append(".")
            case _CharClass(ranges, negated):
                members = (
                    _regex_char(low) + ("" if low == high else "-" + _regex_char(high))
                    for low, high in ranges
                )
                parts.append("[" + "^" * negated + "".join(members) + "]")
            case str():
                parts.append(_regex_char(token))
    parts.append("$")
    return "".join(parts)


def _regex_char(char: str) -> str:
    # In an ARE, '\' before a non-alphanumeric character means that character, in or out of [].
    return "\\" + char if char in string.punctuation else char


def _glob_match(tokens: list[_GlobToken], text: str) -> bool:
    """Greedy match with backtracking to the last '*' only: O(len(tokens) * len(text))."""
    token_at = text_at = 0
    star_token = star_text = -1
    while text_at < len(text):
        token = tokens[token_at] if token_at < len(tokens) else None
        if token is _Wildcard.ANY_RUN:
            star_token, star_text = token_at, text_at
            token_at += 1
        elif token is not None and _glob_char_matches(token, text[text_at]):
            token_at += 1
            text_at += 1
        elif star_token >= 0:  # let the last '*' swallow one more character
            star_text += 1
            token_at, text_at = star_token + 1, star_text
        else:
            return False
    return all(token is _Wildcard.ANY_RUN for token in tokens[token_at:])


def _glob_char_matches(token: _GlobToken, char: str) -> bool:
    if isinstance(token, _CharClass):
        return token.matches(char)
    return token is _Wildcard.ANY_CHAR or token == char


# --- Python evaluation (the reference semantics) -------------------------------------

_MISSING = object()

_ORDERINGS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def evaluate(node: Node | None, metadata: Mapping[str, Any]) -> bool:
    """Whether a document's metadata (JSON-like: dict, list, str, int, float, bool, None)
    matches the filter."""
    match node:
        case None:
            return True
        case And(operands):
            return all(evaluate(operand, metadata) for operand in operands)
        case Or(operands):
            return any(evaluate(operand, metadata) for operand in operands)
        case Compare(path, "!=", value):
            return not _compare(_resolve(metadata, path), "=", value)
        case Compare(path, op, value):
            return _compare(_resolve(metadata, path), op, value)
        case In(path, values, negated):
            found = _resolve(metadata, path)
            return any(_compare(found, "=", value) for value in values) != negated
        case Glob(path, pattern, negated):
            found = _resolve(metadata, path)
            return (isinstance(found, str) and _glob_match(_glob_tokens(pattern), found)) != negated
        case Contains(path, value, negated):
            found = _resolve(metadata, path)
            return (isinstance(found, list) and any(_compare(item, "=", value) for item in found)) != negated
        case HasField(path, negated):
            return (_resolve(metadata, path) is not _MISSING) != negated
    raise TypeError(f"not a filter node: {node!r}")


def _resolve(metadata: Any, path: Path) -> Any:
    current = metadata
    for step in path:
        if isinstance(current, Mapping):
            if not isinstance(step, str) or step not in current:
                return _MISSING
            current = current[step]
        elif isinstance(current, list):
            if not isinstance(step, int) or not -len(current) <= step < len(current):
                return _MISSING
            current = current[step]
        else:
            return _MISSING
    return current


def _compare(found: Any, op: str, literal: Value) -> bool:
    comparable = _as_literal_type(found, literal)
    return comparable is not None and _ORDERINGS[op](comparable, literal)


def _as_literal_type(found: Any, literal: Value) -> Value | None:
    """found in the literal's domain, or None when the JSON types differ."""
    if isinstance(literal, bool):
        return found if isinstance(found, bool) else None
    if isinstance(literal, str):
        return found if isinstance(found, str) else None
    if isinstance(found, bool) or not isinstance(found, int | float | Decimal):
        return None
    # repr() is how json.dumps writes a float, so Postgres sees exactly this decimal.
    number = Decimal(repr(found)) if isinstance(found, float) else Decimal(found)
    return number if number.is_finite() else None


# --- SQL compilation (Postgres jsonb) -------------------------------------------------


def compile_filter(node: Node | None, column: str = "metadata") -> tuple[sql.Composable, list[Any]]:
    """A boolean SQL fragment over the jsonb `column` (optionally table-qualified, "d.metadata")
    and its positional %s parameters, in order. Values are always parameters; field names
    appear as SQL literals, which is safe because every name matched the identifier pattern,
    and lets the planner use expression indexes such as ((metadata ->> 'appId')), also in
    generic plans. The fragment is for WHERE: where it does not match it may be NULL rather
    than FALSE, so wrap it in `(...) IS TRUE` before negating it."""
    if node is None:
        return sql.SQL("TRUE"), []
    done = node.__dict__.get("_compiled")
    if done is not None and done[0] == column:
        return done[1], list(done[2])
    compiler = _SqlCompiler(sql.Identifier(*column.split(".")))
    return compiler.compile(node), compiler.params


def precompile_filter(node: Node, column: str = "metadata") -> None:
    """Compile `node` now and keep the SQL on it as plain text, for compile_filter to
    return: a long filter's compiling (about 20 ms at MAX_FILTER_LENGTH) and rendering
    (as long again, when the statement is sent) then happen where this is called — in
    serve's CPU pool, off the event loop. Rendering needs no connection: the fragment's
    only literals are field names and JSON type names, which need no escaping."""
    fragment, params = compile_filter(node, column)
    rendered = sql.SQL(fragment.as_string(None))
    object.__setattr__(
        node, "_compiled", (column, rendered, tuple(params))
    )  # not a field: eq and hash ignore it


_SQL_TYPES = {str: ("string", "text"), Decimal: ("number", "numeric"), bool: ("boolean", "boolean")}
"""Python literal type -> (jsonb_typeof name, SQL cast for the parameter)."""


class _SqlCompiler:
    """Compiles one filter; collects the parameters in placeholder order."""

    def __init__(self, column: sql.Composable) -> None:
        self._column = column
        self.params: list[Any] = []

    def compile(self, node: Node) -> sql.Composable:
        match node:
            case And(operands):
                return self._join(" AND ", operands)
            case Or(operands):
                return self._join(" OR ", operands)
            case Compare(path, "!=", value):
                return _negate(self._compare(path, "=", value))
            case Compare(path, op, value):
                return self._compare(path, op, value)
            case In(path, values, negated):
                any_equal = sql.SQL("({})").format(
                    sql.SQL(" OR ").join(self._compare(path, "=", value) for value in values)
                )
                return _negate(any_equal) if negated else any_equal
            case Glob(path, pattern, negated):
                self.params.append(_glob_regex(_glob_tokens(pattern)))
                matches = sql.SQL("(jsonb_typeof({json}) = 'string' AND {text} ~ %s)").format(
                    json=self._json(path), text=self._text(path)
                )
                return _negate(matches) if negated else matches
            case Contains(path, value, negated):
                _, cast = _SQL_TYPES[type(value)]
                self.params.append(value)
                # Array containment compares elements like jsonb '=': by type, numbers by value.
                template = "(jsonb_typeof({json}) = 'array' AND {json} @> jsonb_build_array(%s::{cast}))"
                contains = sql.SQL(template).format(json=self._json(path), cast=sql.SQL(cast))
                return _negate(contains) if negated else contains
            case HasField(path, negated):
                return sql.SQL("({} IS {}NULL)").format(self._json(path), sql.SQL("" if negated else "NOT "))
        raise TypeError(f"not a filter node: {node!r}")

    def _join(self, separator: str, operands: tuple[Node, ...]) -> sql.Composable:
        return sql.SQL("({})").format(sql.SQL(separator).join(self.compile(operand) for operand in operands))

    def _compare(self, path: Path, op: str, value: Value) -> sql.Composable:
        self.params.append(value)
        if isinstance(value, str):
            # Plain text '=' (no COLLATE) keeps ((metadata ->> 'key')) expression indexes usable;
            # equality under any deterministic collation is byte equality anyway. Ordering uses
            # "C", i.e. UTF-8 byte order, which is code-point order.
            collate = sql.SQL("") if op == "=" else sql.SQL(' COLLATE "C"')
            template = "({text}{collate} {op} %s AND jsonb_typeof({json}) = 'string')"
            return sql.SQL(template).format(
                text=self._text(path), collate=collate, op=sql.SQL(op), json=self._json(path)
            )
        # jsonb compares numbers numerically and false < true; the type guard keeps jsonb's
        # cross-type ordering (e.g. every string < every number) out of it.
        json_type, cast = _SQL_TYPES[type(value)]
        template = "(jsonb_typeof({json}) = {json_type} AND {json} {op} to_jsonb(%s::{cast}))"
        return sql.SQL(template).format(
            json=self._json(path), json_type=sql.Literal(json_type), op=sql.SQL(op), cast=sql.SQL(cast)
        )

    def _json(self, path: Path) -> sql.Composable:
        """The jsonb value at path, SQL NULL where it is missing."""
        if all(isinstance(step, str) for step in path):
            return sql.SQL("({} {})").format(self._column, _arrows(path, last="->"))
        # '->' and '#>' are lenient with array steps ('5'::jsonb -> 0 is 5, '{"0": 5}' #> '{0}' is 5);
        # strict jsonpath indexes arrays only, and silent => true makes a mismatch NULL.
        return sql.SQL("jsonb_path_query_first({}, {}::jsonpath, silent => true)").format(
            self._column, sql.Literal(_jsonpath(path))
        )

    def _text(self, path: Path) -> sql.Composable:
        """The value at path as text (a JSON string unquoted)."""
        if all(isinstance(step, str) for step in path):
            return sql.SQL("({} {})").format(self._column, _arrows(path, last="->>"))
        return sql.SQL("({} #>> '{{}}')").format(self._json(path))


def _arrows(keys: Path, *, last: str) -> sql.Composable:
    """-> 'a' -> 'b' ->> 'c': the shape expression indexes are declared in."""
    operators = ["->"] * (len(keys) - 1) + [last]
    steps = (
        sql.SQL("{} {}").format(sql.SQL(op), sql.Literal(key))
        for op, key in zip(operators, keys, strict=True)
    )
    return sql.SQL(" ").join(steps)


def _jsonpath(path: Path) -> str:
    """strict $."a"[0][last - 1]; names are identifiers, so quoting them needs no escapes."""
    steps = []
    for step in path:
        if isinstance(step, str):
            steps.append(f'."{step}"')
        elif step >= 0:
            steps.append(f"[{step}]")
        else:
            steps.append("[last]" if step == -1 else f"[last - {-step - 1}]")
    return "strict $" + "".join(steps)


def _negate(predicate: sql.Composable) -> sql.Composable:
    # IS NOT TRUE rather than NOT: a missing field makes the predicate NULL, its negation TRUE.
    return sql.SQL("({} IS NOT TRUE)").format(predicate)
