"""The filter language compiled to SQL and run on a real Postgres: each filter selects
exactly the expected documents, the same ones `evaluate` selects, also for random
filters over random documents; and the planner uses expression indexes."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from decimal import Decimal

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from dwsearch.index.filter import (
    And,
    Compare,
    Contains,
    Glob,
    HasField,
    In,
    Node,
    Or,
    Value,
    compile_filter,
    evaluate,
    parse_filter,
)

DOCS = {
    "c1": {
        "type": "conversation",
        "appId": "app1",
        "category": "billing",
        "resolution": "refund",
        "touchCount": 3,
        "resolvedAt": "2026-01-05",
        "tags": ["refund", "vip"],
    },
    "c2": {
        "type": "conversation",
        "appId": "app1",
        "resolution": "escalated",
        "touchCount": 7,
        "tags": ["escalation"],
    },
    "c3": {"type": "conversation", "appId": "app1", "category": "shipping", "touchCount": 1},
    "c4": {"type": "conversation", "appId": "app2", "resolution": "info", "touchCount": 2.5, "tags": []},
    "k1": {
        "type": "knowledge",
        "appId": "app1",
        "source": "faq",
        "title": "How do I reset my password?",
        "lastUpdated": "2025-12-01",
    },
    "k2": {
        "type": "knowledge",
        "appId": "app1",
        "source": "policy",
        "title": "Refund policy [2026]",
        "lastUpdated": "2026-02-01",
    },
    "k3": {"type": "knowledge", "appId": "app2", "source": "docs", "title": "Bayar balik — 退款 policy"},
    "r1": {"type": "response", "appId": "app1", "trustScore": 0.9, "usageCount": 12, "conversationId": "c1"},
    "r2": {"type": "response", "appId": "app1", "trustScore": 0.85, "usageCount": 0},
    "r3": {"type": "response", "appId": "app1", "trustScore": "0.99"},
    "r4": {"type": "response", "appId": "app2", "trustScore": 1, "verified": True, "flags": [True]},
    "x1": {
        "type": "conversation",
        "appId": "APP1",
        "verified": False,
        "scores": [1, 2.5, -3],
        "nested": {"level": {"deep": "yes", "n": 10}},
    },
    "x2": {
        "appId": "app1",
        "type": None,
        "nested": {"level": [{"deep": "array"}]},
        "tags": ["a", ["b"], {"c": 1}, True, 1],
    },
    "x3": {"appId": 5, "type": "conversation", "nested": {"0": "object key"}, "scores": {"0": 1}},
    "x4": {"appId": "it's", "quote": 'say "hi"', "path": "C:\\dir\\*", "multi": "line1\nline2"},
    "x5": {},
}
ALL = set(DOCS)

CASES = [
    # Agent context's three section queries (docs/design.md, "Agent context").
    ("appId = 'app1' AND type = 'conversation' AND resolution != 'escalated'", {"c1", "c3"}),
    ("appId = 'app1' AND type = 'knowledge'", {"k1", "k2"}),
    ("appId = 'app1' AND type = 'response' AND trustScore > 0.85", {"r1"}),
    # Numbers: typed, exact.
    ("trustScore >= 0.85", {"r1", "r2", "r4"}),
    ("trustScore = 1.0", {"r4"}),
    ("trustScore = '0.99'", {"r3"}),
    ("trustScore < 1", {"r1", "r2"}),
    ("touchCount <= 2.5", {"c3", "c4"}),
    ("touchCount > 2", {"c1", "c2", "c4"}),
    ("touchCount != 3", ALL - {"c1"}),
    ("touchCount IN (1, 2.5, 3)", {"c1", "c3", "c4"}),
    ("usageCount = 0", {"r2"}),
    ("appId = 5", {"x3"}),
    ("appId = '5'", set()),
    # Strings: case-sensitive, code-point order, quotes.
    ("appId = 'APP1'", {"x1"}),
    ("APPID = 'app1'", set()),
    ("appId IN ('app2', 5)", {"c4", "k3", "r4", "x3"}),
    ("appId NOT IN ('app1', 'app2')", {"x1", "x3", "x4", "x5"}),
    ("appId = 'it''s'", {"x4"}),
    ('quote = "say ""hi"""', {"x4"}),
    ("type != 'conversation'", {"k1", "k2", "k3", "r1", "r2", "r3", "r4", "x2", "x4", "x5"}),
    ("title < 'I'", {"k1", "k3"}),
    ("lastUpdated >= '2026-01-01'", {"k2"}),
    ("resolvedAt < '2026-02'", {"c1"}),
    # Booleans.
    ("verified = true", {"r4"}),
    ("verified = FALSE", {"x1"}),
    ("verified != true", ALL - {"r4"}),
    ("verified IN (true, 'x')", {"r4"}),
    ("verified > false", {"r4"}),
    # GLOB.
    ("title GLOB '*policy*'", {"k2", "k3"}),
    ("title GLOB 'How*'", {"k1"}),
    ("title GLOB '*[[]2026]'", {"k2"}),
    ("title GLOB '*?'", {"k1", "k2", "k3"}),
    ("title NOT GLOB '*policy*'", ALL - {"k2", "k3"}),
    ("title GLOB '*退款*'", {"k3"}),
    ("title GLOB '*password[?]'", {"k1"}),
    ("source GLOB '[df]*'", {"k1", "k3"}),
    ("source GLOB '[^df]*'", {"k2"}),
    ("resolution GLOB 're?und'", {"c1"}),
    ("resolution GLOB 'Refund'", set()),
    ("path GLOB 'C:\\*'", {"x4"}),
    ("path GLOB '*\\[*]'", {"x4"}),
    ("multi GLOB 'line1?line2'", {"x4"}),
    ("touchCount GLOB '*'", set()),
    # CONTAINS: arrays only, typed elements, no nested arrays.
    ("tags CONTAINS 'vip'", {"c1"}),
    ("tags CONTAINS 'b'", set()),
    ("tags CONTAINS true", {"x2"}),
    ("flags CONTAINS 1", set()),
    ("scores CONTAINS 1.0", {"x1"}),
    ("scores CONTAINS -3", {"x1"}),
    ("tags NOT CONTAINS 'refund'", ALL - {"c1"}),
    ("title CONTAINS 'policy'", set()),
    # HAS FIELD: JSON null counts as present.
    ("HAS FIELD resolution", {"c1", "c2", "c4"}),
    ("HAS NOT FIELD resolution", ALL - {"c1", "c2", "c4"}),
    ("HAS FIELD type", ALL - {"x4", "x5"}),
    ("HAS FIELD nested.level.deep", {"x1"}),
    # Precedence and grouping.
    (
        "type = 'conversation' OR type = 'knowledge' AND source = 'faq'",
        {"c1", "c2", "c3", "c4", "x1", "x3", "k1"},
    ),
    ("(type = 'conversation' OR type = 'knowledge') AND appId = 'app2'", {"c4", "k3"}),
    # Nested keys and array elements; a step of the wrong kind finds nothing.
    ("nested.level.deep = 'yes'", {"x1"}),
    ("nested.level.n > 5", {"x1"}),
    ("nested.level[0].deep = 'array'", {"x2"}),
    ("nested.level[#-1].deep GLOB 'arr*'", {"x2"}),
    ("nested[0] = 'object key'", set()),
    ("scores[0] = 1", {"x1"}),
    ("scores[#-1] = -3", {"x1"}),
    ("scores[#-3] = 1", {"x1"}),
    ("scores[#-4] = 1", set()),
    ("scores[3] = 1", set()),
    ("scores[2147483647] = 1", set()),
    ("scores[#-2147483647] = 1", set()),
    ("appId[0] = 'app1'", set()),
    ("appId[#-1] = 'app1'", set()),
    ("tags[1][0] = 'b'", {"x2"}),
    ("tags[2].c = 1", {"x2"}),
    ("tags[#-2] CONTAINS 'x' OR tags[#-1] = true", set()),
    ("type.x = 1", set()),
    # Injection stays data.
    ("appId = 'x''; DROP TABLE docs; --'", set()),
    ("", ALL),
]


@pytest.fixture(scope="module")
def conn(server_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE docs (id text PRIMARY KEY, metadata jsonb NOT NULL)")
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO docs VALUES (%s, %s)", [(id_, Jsonb(doc)) for id_, doc in DOCS.items()]
            )
        yield conn


def select_ids(conn: psycopg.Connection, text: str) -> set[str]:
    fragment, params = compile_filter(parse_filter(text))
    query = sql.SQL("SELECT id FROM docs WHERE {}").format(fragment)
    return {row[0] for row in conn.execute(query, params)}


@pytest.mark.parametrize(("text", "expected"), CASES, ids=[text for text, _ in CASES])
def test_filter_selects_expected_documents(conn, text, expected):
    node = parse_filter(text)
    assert {id_ for id_, doc in DOCS.items() if evaluate(node, doc)} == expected
    assert select_ids(conn, text) == expected


def test_injection_left_the_table_alone(conn):
    select_ids(conn, "appId = 'x''; DROP TABLE docs; --'")
    assert conn.execute("SELECT count(*) FROM docs").fetchone()[0] == len(DOCS)


def test_generic_plans_use_expression_indexes(server_url):
    """Why names are SQL literals: a generic plan (psycopg prepares a query after 5
    executions) can match ((metadata ->> 'appId')) only if the key is a constant."""
    with psycopg.connect(server_url) as conn:  # the temp table goes with the connection
        conn.execute("CREATE TEMP TABLE indexed (id int, metadata jsonb)")
        conn.execute(
            "INSERT INTO indexed SELECT i, jsonb_build_object('appId', 'app' || i % 100,"
            " 'type', 'conversation', 'resolution', 'info') FROM generate_series(1, 5000) i"
        )
        conn.execute("CREATE INDEX ON indexed ((metadata ->> 'appId'))")
        conn.execute("ANALYZE indexed")
        fragment, _ = compile_filter(
            parse_filter("appId = 'app7' AND type = 'conversation' AND resolution != 'escalated'")
        )
        numbers = itertools.count(1)
        where = re.sub("%s", lambda _: f"${next(numbers)}", fragment.as_string(conn))
        plan = [
            row[0] for row in conn.execute(f"EXPLAIN (GENERIC_PLAN) SELECT id FROM indexed WHERE {where}")
        ]
        assert any("Index Cond: ((metadata ->> 'appId'::text) = $1)" in line for line in plan), plan


# --- Random filters over random documents ---------------------------------------------

NAMES = ["a", "b", "tags", "n"]
NESTED_PATHS = [("a", "b"), ("n", "a"), ("tags", 0), ("tags", 1), ("tags", -1), ("a", 0, "b"), ("n", -2)]
STRINGS = [
    "",
    "a",
    "b",
    "A",
    "ab",
    "ba",
    "a*b",
    "it's",
    'say "hi"',
    "[x]",
    "é",
    "东西",
    "a\nb",
    "\\",
    "-",
    "Z",
]
NUMBERS = [0, 1, -1, 2, 0.5, -1.5, 2.0, 1e20, 0.1, 1e-7]
# Units that concatenate into valid globs: wildcards, classes and literals, specials included.
GLOB_UNITS = [
    "a",
    "b",
    "é",
    "*",
    "?",
    "[ab]",
    "[^a]",
    "[!b]",
    "[a-c]",
    "[]]",
    "[*]",
    "[-a]",
    "\n",
    "\\",
    "-",
    "]",
    ".",
]

paths = st.sampled_from(NAMES).map(lambda name: (name,)) | st.sampled_from(NESTED_PATHS)
numbers = st.sampled_from(NUMBERS) | st.integers(-3, 3) | st.floats(allow_nan=False, allow_infinity=False)
values: st.SearchStrategy[Value] = st.one_of(
    st.sampled_from(STRINGS),
    st.text(alphabet="ab'\"é*", max_size=3),
    st.booleans(),
    numbers.map(lambda number: Decimal(repr(number))),
)
conditions: st.SearchStrategy[Node] = st.one_of(
    st.builds(Compare, paths, st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), values),
    st.builds(Glob, paths, st.lists(st.sampled_from(GLOB_UNITS), max_size=5).map("".join), st.booleans()),
    st.builds(In, paths, st.lists(values, min_size=1, max_size=3).map(tuple), st.booleans()),
    st.builds(Contains, paths, values, st.booleans()),
    st.builds(HasField, paths, st.booleans()),
)
filters = st.recursive(
    conditions,
    lambda children: (
        st.builds(And, st.lists(children, min_size=2, max_size=3).map(tuple))
        | st.builds(Or, st.lists(children, min_size=2, max_size=3).map(tuple))
    ),
    max_leaves=4,
)
scalars = st.one_of(st.none(), st.booleans(), st.sampled_from(STRINGS), numbers)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(NAMES), children, max_size=3)
    ),
    max_leaves=6,
)
# Each name mostly holds one kind of value, so that random filters often find something.
documents = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "a": st.sampled_from(STRINGS) | json_values,
            "b": numbers | st.booleans() | json_values,
            "tags": st.lists(scalars, max_size=4) | json_values,
            "n": st.dictionaries(st.sampled_from(NAMES), json_values, max_size=3) | json_values,
        },
    ),
    min_size=4,
    max_size=8,
)


def render(node: Node) -> str:
    """Filter text that parses back to node."""
    match node:
        case And(operands):
            return " AND ".join(f"({render(operand)})" for operand in operands)
        case Or(operands):
            return " OR ".join(f"({render(operand)})" for operand in operands)
        case Compare(path, op, value):
            return f"{render_path(path)} {op} {render_value(value)}"
        case Glob(path, pattern, negated):
            return f"{render_path(path)} {'NOT ' * negated}GLOB {render_value(pattern)}"
        case In(path, values, negated):
            return f"{render_path(path)} {'NOT ' * negated}IN ({', '.join(map(render_value, values))})"
        case Contains(path, value, negated):
            return f"{render_path(path)} {'NOT ' * negated}CONTAINS {render_value(value)}"
        case HasField(path, negated):
            return f"HAS {'NOT ' * negated}FIELD {render_path(path)}"
    raise TypeError(node)


def render_path(path) -> str:
    steps = [path[0]]
    for step in path[1:]:
        if isinstance(step, str):
            steps.append(f".{step}")
        else:
            steps.append(f"[{step}]" if step >= 0 else f"[#{step}]")
    return "".join(steps)


def render_value(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


@given(filters)
def test_render_parse_round_trip(node):
    assert parse_filter(render(node)) == node


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(node=filters, docs=documents)
def test_sql_agrees_with_evaluate(conn, node, docs):
    fragment, params = compile_filter(parse_filter(render(node)))
    query = sql.SQL(
        "SELECT ordinality - 1 FROM jsonb_array_elements(%s) WITH ORDINALITY AS docs(metadata, ordinality) WHERE {}"
    ).format(fragment)
    from_sql = {row[0] for row in conn.execute(query, [Jsonb(docs), *params])}
    assert from_sql == {index for index, doc in enumerate(docs) if evaluate(node, doc)}
