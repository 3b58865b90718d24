"""A long filter is parsed and compiled off the event loop, its SQL rendered there without
a connection (dwsearch.index.base.read_filter): the text is exactly what Postgres'
connection would render, and the statement selects the same documents."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

from dwsearch.index.filter import compile_filter, parse_filter, precompile_filter

FILTERS = [
    "appId = 'x' AND type = 'conversation' AND resolution != 'escalated'",
    "trustScore > 0.85 OR usageCount >= 3",
    "nested.level.deep = 'yes' AND scores[0] = 1 AND scores[#-1] < 0",
    "title GLOB '*[Rr]efund*' AND tags NOT CONTAINS 'vip' AND title NOT GLOB 'x?'",
    "appId IN ('app1', 'it''s', \"q\") AND HAS FIELD nested.level AND HAS NOT FIELD gone",
    "verified = true AND flags CONTAINS true AND n NOT IN (1, 2.5, -3e2)",
    " OR ".join(f"n = {i}" for i in range(300)),
]
DOCS = [{"appId": "x", "type": "conversation"}, {"trustScore": 0.9}, {"n": 7}, {"n": 1},
        {"nested": {"level": {"deep": "yes"}}, "scores": [1, 2, -3]}, {"title": "Refund policy", "tags": []},
        {"appId": "it's", "nested": {"level": 1}}, {"verified": True, "flags": [True], "n": 4}]  # fmt: skip


@pytest.mark.parametrize("text", FILTERS)
def test_precompiled_sql_is_what_the_connection_renders_and_selects_the_same(db_url, text):
    fresh = parse_filter(text)
    kept = parse_filter(text)
    precompile_filter(kept)
    assert kept == fresh  # the kept SQL is not part of the node's value
    (fresh_sql, fresh_params), (kept_sql, kept_params) = compile_filter(fresh), compile_filter(kept)
    assert kept_params == fresh_params
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert kept_sql.as_string(conn) == fresh_sql.as_string(conn)
        conn.execute("CREATE TEMP TABLE docs (i int, metadata jsonb)")
        for i, doc in enumerate(DOCS):
            conn.execute("INSERT INTO docs VALUES (%s, %s)", (i, Jsonb(doc)))
        selected = []
        for fragment, params in ((fresh_sql, fresh_params), (kept_sql, kept_params)):
            statement = psycopg.sql.SQL("SELECT i FROM docs WHERE {} ORDER BY i").format(fragment)
            selected.append([row[0] for row in conn.execute(statement, params)])
        assert selected[0] == selected[1]
