"""The single-partition check (tests/db/test_single_partition.py, docs/scaling.md): record
every statement dwsearch issues, build a clone of the migrated schema whose tables are
hash-partitioned by their distribution column, as Citus would distribute them, and name
the partitions each recorded statement's plan touches there.

Statements are recorded by wrapping psycopg's cursors (execute and executemany, sync and
async), so whatever module issues a statement, through whichever connection or pool, is
seen. The clone is generated from the migrated schema's catalog (CREATE TABLE ... LIKE for
columns, defaults, generated columns and checks; pg_get_indexdef for indexes), so it follows
every future migration; a unique index that lacks its table's distribution column gets it
prepended, as a distributed table's must.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

PARTITIONS = 4

# Tables replicated to every node (Citus reference tables): small, read by every org's
# statements, never partitioned.
REFERENCE_TABLES = {
    "admin_feature_flags": "the deployment-wide tier of the feature flags",
    "org_feature_flags": "the org tier of the feature flags: tiny, and the sweep lists every enabled org",
    "dwsearch_schema_migrations": "the migrations' record, read and written only by `dwsearch migrate`",
}

# The support index's tables have no org_id: a namespace is their tenant (every read and
# write names one; a REST index's namespaces are `{index}` U+001F `{namespace}`).
NAMESPACE_TABLES = ("dw_index_documents", "dw_index_namespaces")

# Go-owned tables the clone also holds (the dev schema's definitions of them).
GO_TABLES = ("dw_chat_events", "admin_feature_flags", "org_feature_flags")


def distribution_column(table: str, columns: set[str]) -> str | None:
    """The column `table` is partitioned by; None for a reference table. A table that is
    neither a reference table nor the index's, and has no org_id, is an error: a new table
    must say how it would be distributed."""
    if table in REFERENCE_TABLES:
        return None
    if table in NAMESPACE_TABLES:
        return "namespace"
    if "org_id" in columns:
        return "org_id"
    raise AssertionError(
        f"table {table} has no org_id: add the column (docs/scaling.md), or name it in "
        "tests/support/partition_check.py as a reference table or an index table"
    )


# --- recording --------------------------------------------------------------------------------


@dataclass
class Statement:
    text: str
    params: Any

    def key(self) -> tuple[str, str]:
        return self.text, repr(self.params)


@dataclass
class Recorder:
    """Every statement executed through a psycopg cursor while `on`."""

    statements: list[Statement] = field(default_factory=list)
    on: bool = False

    def record(self, cursor: Any, query: Any, params: Any) -> None:
        if not self.on:
            return
        if isinstance(query, sql.Composable):
            text = query.as_string(cursor.connection)
        elif isinstance(query, bytes):
            text = query.decode()
        else:
            text = str(query)
        self.statements.append(Statement(text, params))

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        self.on = True
        try:
            yield
        finally:
            self.on = False

    def unique(self) -> list[Statement]:
        seen: dict[tuple[str, str], Statement] = {}
        for s in self.statements:
            seen.setdefault(s.key(), s)
        return list(seen.values())


def install(monkeypatch: Any, recorder: Recorder) -> None:
    """Wrap execute/executemany of psycopg's sync and async cursors (every cursor class
    dwsearch uses derives from them)."""
    async_execute = psycopg.AsyncCursor.execute
    async_executemany = psycopg.AsyncCursor.executemany
    sync_execute = psycopg.Cursor.execute
    sync_executemany = psycopg.Cursor.executemany

    async def a_execute(self, query, params=None, **kw):
        recorder.record(self, query, params)
        return await async_execute(self, query, params, **kw)

    async def a_executemany(self, query, params_seq, **kw):
        params_seq = list(params_seq)
        for params in params_seq:
            recorder.record(self, query, params)
        return await async_executemany(self, query, params_seq, **kw)

    def s_execute(self, query, params=None, **kw):
        recorder.record(self, query, params)
        return sync_execute(self, query, params, **kw)

    def s_executemany(self, query, params_seq, **kw):
        params_seq = list(params_seq)
        for params in params_seq:
            recorder.record(self, query, params)
        return sync_executemany(self, query, params_seq, **kw)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", a_execute)
    monkeypatch.setattr(psycopg.AsyncCursor, "executemany", a_executemany)
    monkeypatch.setattr(psycopg.Cursor, "execute", s_execute)
    monkeypatch.setattr(psycopg.Cursor, "executemany", s_executemany)


# --- the partitioned clone ---------------------------------------------------------------------

_INDEXDEF = re.compile(r"^CREATE (UNIQUE )?INDEX \S+ ON (?:ONLY )?\S+ USING (\w+) \((.*)$", re.DOTALL)


def build_partitioned_clone(conn: psycopg.Connection, source: str, target: str) -> dict[str, str | None]:
    """Create schema `target` holding each table of `source`, partitioned by hash of its
    distribution column into PARTITIONS partitions (`{table}_p{n}`), or copied whole for a
    reference table. Returns {table: distribution column or None}."""
    conn.execute("SET search_path = pg_catalog")  # pg_get_indexdef then qualifies every name
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(target)))
    tables = [
        t
        for (t,) in conn.execute(
            """SELECT c.relname FROM pg_class c
               WHERE c.relnamespace = %s::regnamespace AND c.relkind = 'r' ORDER BY 1""",
            (source,),
        )
    ]
    layout: dict[str, str | None] = {}
    for table in tables:
        columns = {
            a
            for (a,) in conn.execute(
                """SELECT attname FROM pg_attribute
                   WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped""",
                (f"{source}.{table}",),
            )
        }
        column = distribution_column(table, columns)
        layout[table] = column
        src = sql.Identifier(source, table)
        dst = sql.Identifier(target, table)
        if column is None:
            conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(dst, src))
            continue
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (LIKE {} INCLUDING ALL EXCLUDING INDEXES) PARTITION BY HASH ({})"
            ).format(dst, src, sql.Identifier(column))
        )
        for n in range(PARTITIONS):
            conn.execute(
                sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES WITH (MODULUS {}, REMAINDER {})").format(
                    sql.Identifier(target, f"{table}_p{n}"), dst, sql.Literal(PARTITIONS), sql.Literal(n)
                )
            )
        indexes = conn.execute(
            """SELECT pg_get_indexdef(i.indexrelid),
                      ARRAY(SELECT a.attname FROM unnest(i.indkey) AS k (attnum)
                            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum)
               FROM pg_index i WHERE i.indrelid = %s::regclass ORDER BY i.indexrelid""",
            (f"{source}.{table}",),
        ).fetchall()
        for definition, keys in indexes:
            match = _INDEXDEF.match(definition)
            assert match, definition
            is_unique, method, rest = match.groups()
            if is_unique and column not in keys:
                rest = f"{column}, {rest}"  # a partitioned table's unique keys include its partition key
            conn.execute(
                sql.SQL("CREATE {}INDEX ON {} USING {} (").format(
                    sql.SQL("UNIQUE " if is_unique else ""), dst, sql.SQL(method)
                )
                + sql.SQL(rest)
            )
    return layout


def partition_parents(conn: psycopg.Connection, schema: str) -> dict[str, str]:
    """{partition name: its partitioned table} in `schema`."""
    rows = conn.execute(
        """SELECT c.relname, p.relname FROM pg_inherits i
           JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
           WHERE c.relnamespace = %s::regnamespace AND c.relkind = 'r'""",
        (schema,),
    ).fetchall()
    return dict(rows)


def column_positions(conn: psycopg.Connection, schema: str) -> dict[tuple[str, str], int]:
    """{(table, column): its 0-based position among the table's attributes}."""
    rows = conn.execute(
        """SELECT c.relname, a.attname, a.attnum FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
           WHERE c.relnamespace = %s::regnamespace AND c.relkind = 'p' AND a.attnum > 0""",
        (schema,),
    ).fetchall()
    return {(t, c): n - 1 for t, c, n in rows}


# --- plans ----------------------------------------------------------------------------------------

EXPLAINABLE = re.compile(
    r"^\s*(\(\s*)*(SELECT|WITH|INSERT|UPDATE|DELETE|VALUES|TABLE|MERGE)\b", re.IGNORECASE
)
UTILITY = re.compile(r"^\s*(SET|RESET|SHOW|BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE)\b", re.IGNORECASE)
# A constant in EXPLAIN VERBOSE output: a literal (with casts) or NULL.
_CONSTANT = re.compile(r"^\(*('(?:[^']|'')*'|NULL|-?[0-9.]+)(::[\w\s\"\[\]().,]+)?\)*$")


@dataclass
class Touched:
    """What a plan reads or writes: per partitioned table, the partitions of it in the
    plan, and its INSERT targets with whether each row's partition key is one constant."""

    partitions: dict[str, set[str]] = field(default_factory=dict)
    inserts: dict[str, bool] = field(default_factory=dict)
    relations: set[str] = field(default_factory=set)

    def spread(self) -> dict[str, int]:
        """{partitioned table: partitions it may touch}, for those touching more than one."""
        wide = {t: len(p) for t, p in self.partitions.items() if len(p) > 1}
        wide.update({t: PARTITIONS for t, one in self.inserts.items() if not one})
        return wide


def explain(conn: psycopg.Connection, statement: Statement) -> list[dict[str, Any]]:
    text = "EXPLAIN (VERBOSE, FORMAT JSON) " + statement.text
    row = conn.execute(text, statement.params, prepare=False).fetchone()
    assert row is not None
    plan = row[0]
    return json.loads(plan) if isinstance(plan, str) else plan


def task_counts(plan: object) -> list[int]:
    """Every "Task Count" in a Citus plan (EXPLAIN, FORMAT JSON): its distributed query's
    and those of its subplans (a CTE or subquery planned on its own first)."""
    if isinstance(plan, dict):
        own = [int(plan["Task Count"])] if "Task Count" in plan else []
        return own + [n for value in plan.values() for n in task_counts(value)]
    if isinstance(plan, list):
        return [n for value in plan for n in task_counts(value)]
    return []


def touched(
    plans: list[dict[str, Any]],
    parents: dict[str, str],
    layout: dict[str, str | None],
    positions: dict[tuple[str, str], int],
) -> Touched:
    """The partitions a plan (EXPLAIN VERBOSE, FORMAT JSON) touches. A partition pruned at
    plan time is absent from the plan; one pruned when the executor starts is absent too,
    counted only in its Append's "Subplans Removed": either way, the partitions named in
    the plan are those the statement can touch."""
    out = Touched()

    def walk(node: dict[str, Any]) -> None:
        name = node.get("Relation Name")
        if name is not None:
            out.relations.add(name)
            if name in parents:
                out.partitions.setdefault(parents[name], set()).add(name)
            elif (
                layout.get(name)
                and node.get("Node Type") == "ModifyTable"
                and node.get("Operation") == "Insert"
            ):
                # Rows are routed to partitions as they are inserted: one partition when
                # the partition key the subplan produces is a constant.
                column = layout[name]
                assert column is not None
                source = next(p for p in node["Plans"] if p.get("Parent Relationship") == "Outer")
                output = source.get("Output", [])
                position = positions[(name, column)]
                value = output[position] if position < len(output) else ""
                out.inserts[name] = out.inserts.get(name, True) and bool(_CONSTANT.match(value))
            # (UPDATE and DELETE on a partitioned table list its unpruned partitions as
            # their targets and subplans: counted above.)
        for target in node.get("Target Tables", []):
            target_name = target.get("Relation Name")
            if target_name in parents:
                out.partitions.setdefault(parents[target_name], set()).add(target_name)
        for child in node.get("Plans", []):
            walk(child)

    for entry in plans:
        walk(entry["Plan"])
    return out
