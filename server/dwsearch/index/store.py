"""SQL for dw_index_documents. Every statement is limited to one namespace; reads also
to the active model. Deletes are not: a deleted document must not come back when an
older model is switched back on. Parameterized throughout; filters come from
dwsearch.index.filter, whose fragments use positional placeholders, so this module does
too."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pgvector import HalfVector, SparseVector, Vector
from psycopg import AsyncConnection, AsyncCursor, sql
from psycopg.adapt import Buffer, Loader
from psycopg.pq import Format
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from dwsearch.common import offload
from dwsearch.index.documents import Hit, Include, StoredDocument
from dwsearch.index.filter import Node, compile_filter
from dwsearch.retrieval.store import nearest as nn

TABLE = sql.Identifier("dw_index_documents")


@dataclass(frozen=True)
class NamespaceScope:
    """What every statement is limited to: one namespace's documents in one model's vector
    space."""

    namespace: str
    model: str


@dataclass(frozen=True)
class Row:
    """A document as written."""

    id: str
    data: str
    metadata: dict[str, Any]
    embedding: HalfVector
    sparse: SparseVector | None
    metadata_json: bytes | None = None
    """`metadata` serialized already (off the event loop); None: serialized when sent."""
    vector32: Vector | np.ndarray | None = None
    """A float32 space's vector as sent (`embedding` then holds the placeholder); an array
    (float32) is made a Vector only as its row is sent, so that a large upsert's rows never
    hold a second copy of their vectors."""


DENSE_SIMILARITY: dict[str | None, tuple[str, str]] = {
    None: ("embedding", "ip"),  # halfvec, inner product
    "ip": ("vector32", "ip"),
    "cosine": ("vector32", "cosine"),
    "l2": ("vector32", "l2"),
}
"""The dense similarity (higher is better) by the space's comparison, as the column it
reads and its nearest.similarity metric: halfvec inner product, or a float32 space's inner
product, cosine or minus the squared L2 distance."""


def _columns(include: Include) -> sql.Composable:
    names = ["id"]
    if include.data:
        names.append("data")
    if include.metadata:
        names.append("metadata")
    if include.vectors:
        names += ["embedding", "vector32", "sparse"]
    return sql.SQL(", ").join(map(sql.Identifier, names))


class _JsonbText(Loader):
    """jsonb (binary: a version byte, then the JSON text) kept as its text: parsed by
    _document, in the CPU pool when the rows are large."""

    format = Format.BINARY

    def load(self, data: Buffer) -> bytes:
        return bytes(data[1:])


LOAD_BATCH_ROWS = 64
"""Rows loaded per step by _rows, the event loop let run between steps."""


async def _rows(cur: AsyncCursor[Any]) -> list[Any]:
    """Every row of the cursor's result, LOAD_BATCH_ROWS at a time: loading is CPU work on
    the event loop (1,000 rows of 47 KiB metadata copy 47 MB, one fetchall 0.1-0.2 s on a
    busy machine), and nothing else runs until a fetch call returns."""
    rows: list[Any] = []
    while batch := await cur.fetchmany(LOAD_BATCH_ROWS):
        rows.extend(batch)
        if len(batch) < LOAD_BATCH_ROWS:
            break
        await asyncio.sleep(0)
    return rows


def _reading(cur: AsyncCursor[Any]) -> AsyncCursor[Any]:
    """A cursor for documents: binary results (pgvector's binary loaders take 1.4 ms for
    1,000 1024-d vectors, its text loader 270 ms) and jsonb left unparsed (1,000 documents
    of 48 KiB metadata: 0.5 s of json.loads), both converted off the event loop."""
    cur.adapters.register_loader("jsonb", _JsonbText)
    return cur


async def _documents(rows: Sequence[dict[str, Any]]) -> list[StoredDocument]:
    """Rows as documents: their JSON parsed and vectors listed, in the CPU pool when
    there is much of either (offload.INLINE_MAX_SIZE; a vector counts as 4 characters a
    dimension)."""
    size = sum(
        len(row.get("metadata") or b"")
        + (4 * row["embedding"].dimensions() if row.get("embedding") is not None else 0)
        + (4 * row["vector32"].dimensions() if row.get("vector32") is not None else 0)
        for row in rows
    )
    return await offload.run(_convert, rows, size=size)


def _convert(rows: Sequence[dict[str, Any]]) -> list[StoredDocument]:
    return [_document(row) for row in rows]


def _document(row: dict[str, Any]) -> StoredDocument:
    embedding: HalfVector | Vector | None = row.get("vector32")
    if embedding is None:
        embedding = row.get("embedding")
    sparse: SparseVector | None = row.get("sparse")
    metadata = row.get("metadata")
    return StoredDocument(
        id=row["id"],
        data=row.get("data"),
        metadata=json.loads(metadata) if isinstance(metadata, bytes) else metadata,
        vector=embedding.to_list() if embedding is not None else None,
        sparse_vector=dict(zip(sparse.indices(), sparse.values(), strict=True))
        if sparse is not None
        else None,
    )


def _jsonb(row: Row) -> Jsonb:
    serialized = row.metadata_json
    return Jsonb(row.metadata) if serialized is None else Jsonb(row.metadata, dumps=lambda _: serialized)


async def upsert(
    conn: AsyncConnection, scope: NamespaceScope, rows: Sequence[Row], *, first_place: int | None = None
) -> None:
    """Insert or replace by (namespace, id); created_at survives a replace, and so does seq
    (the place in insertion order, migration 0007), which new rows take in `rows`' order:
    from `first_place` on (the places take_places reserved in the namespace), else from
    the table's sequence (drawn first, in one round trip). The rows are written in id
    order (the column's "C" collation is code point order, as Python sorts str), so two
    upserts naming the same ids lock them in the same order and never deadlock."""
    if not rows:
        return
    if first_place is not None:
        seqs = list(range(first_place, first_place + len(rows)))
    else:
        cur = await conn.execute(
            "SELECT nextval(pg_get_serial_sequence('dw_index_documents', 'seq')) FROM generate_series(1, %s)",
            [len(rows)],
        )
        seqs = sorted(int(row[0]) for row in await cur.fetchall())
    by_id = sorted(zip(rows, seqs, strict=True), key=lambda pair: pair[0].id)
    statement = sql.SQL(
        """INSERT INTO {table} (namespace, id, data, metadata, model, embedding, sparse, vector32, seq)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
           ON CONFLICT (namespace, id) DO UPDATE SET
               data = excluded.data, metadata = excluded.metadata, model = excluded.model,
               embedding = excluded.embedding, sparse = excluded.sparse, vector32 = excluded.vector32,
               updated_at = excluded.updated_at"""
    ).format(table=TABLE)
    async with conn.cursor() as cur:  # executemany pipelines the rows: one round trip
        # The parameters made row by row as executemany sends them (a generator): a row's
        # Vector and its encoding live while it is sent, not the whole upsert's at once.
        await cur.executemany(
            statement,
            (
                (
                    scope.namespace,
                    r.id,
                    r.data,
                    _jsonb(r),
                    scope.model,
                    r.embedding,
                    r.sparse,
                    Vector(r.vector32) if isinstance(r.vector32, np.ndarray) else r.vector32,
                    seq,
                )
                for r, seq in by_id
            ),
        )


async def carry_over_float32(
    conn: AsyncConnection, model: str, namespace_prefix: str, dimension: int | None
) -> int:
    """A float32 space's rows (in the namespaces under `namespace_prefix`) written before it
    kept float32 (migration 0006): their halfvec values as vector32, the first `dimension`
    of them (a EUCLIDEAN index stored |x|² after; None: all). Returns the rows carried over."""
    length = sql.SQL("%s") if dimension is not None else sql.SQL("vector_dims(embedding)")
    cur = await conn.execute(
        sql.SQL(
            "UPDATE {table} SET vector32 = subvector(embedding, 1, {length})::vector"
            " WHERE model = %s AND vector32 IS NULL AND vector_dims(embedding) >= {length}"
            " AND starts_with(namespace, %s)"
        ).format(table=TABLE, length=length),
        [*([dimension] if dimension is not None else []), model, *([dimension] if dimension is not None else []),
         namespace_prefix],
    )  # fmt: skip
    return cur.rowcount


def nearest_statement(
    scope: NamespaceScope,
    node: Node | None,
    k: int,
    include: Include,
    *,
    dense: HalfVector | Vector | None = None,
    sparse: SparseVector | None = None,
    dense_similarity: str | None = None,
) -> tuple[sql.Composed, list[Any]]:
    """The statement `nearest` runs, and its parameters (`dense_similarity`: a key of
    DENSE_SIMILARITY)."""
    filter_sql, filter_params = compile_filter(node)
    columns = _columns(include)
    parts: list[sql.Composable] = []
    params: list[Any] = []
    vector = sql.Placeholder()
    for source, query in (("dense", dense), ("sparse", sparse)):
        if query is None:
            continue
        if source == "dense":
            column, metric = DENSE_SIMILARITY[dense_similarity]
            score = nn.similarity(sql.Identifier(column), vector, metric)
            where = sql.SQL("namespace = %s AND model = %s AND {}").format(filter_sql)
        else:
            score = nn.similarity(sql.Identifier("sparse"), vector)
            where = sql.SQL("namespace = %s AND model = %s AND {} AND {}").format(
                filter_sql, nn.overlaps(sql.Identifier("sparse"), vector)
            )
        parts.append(
            nn.ranked(
                label=sql.Literal(source), columns=columns, score=score, table=TABLE, where=where,
                limit=sql.Placeholder(),
            )
        )  # fmt: skip
        params += [query, scope.namespace, scope.model, *filter_params]
        params += [query] if source == "sparse" else []
        params.append(k)
    return nn.union(parts), params


STATEMENT_TIMEOUT_MS = 5000
"""How long a statement a caller shapes (a KNN with a filter, a delete by filter) may run
before Postgres cancels it (DEADLINE_EXCEEDED, HTTP 504), so that no request holds a pool
connection longer."""


@contextlib.asynccontextmanager
async def bounded(conn: AsyncConnection, timeout_ms: int) -> AsyncIterator[None]:
    """A transaction whose statements Postgres cancels after `timeout_ms` (SET LOCAL, so
    the pooled connection keeps its own setting, behind pgbouncer too)."""
    async with conn.transaction():
        await conn.execute("SELECT set_config('statement_timeout', %s, true)", [str(int(timeout_ms))])
        yield


async def nearest(
    conn: AsyncConnection,
    scope: NamespaceScope,
    node: Node | None,
    k: int,
    include: Include,
    *,
    dense: HalfVector | Vector | None = None,
    sparse: SparseVector | None = None,
    dense_similarity: str | None = None,
) -> tuple[list[Hit], list[Hit]]:
    """Exact KNN by inner product (score = inner product, best first; ties by id) among
    the documents the filter matches: dense and / or sparse, in one statement. Sparse
    keeps only documents that share a term with the query (positive overlap)."""
    statement, params = nearest_statement(
        scope, node, k, include, dense=dense, sparse=sparse, dense_similarity=dense_similarity
    )
    found: dict[str, list[Hit]] = {"dense": [], "sparse": []}
    async with conn.cursor(row_factory=dict_row, binary=True) as cur:
        await _reading(cur).execute(statement, params)
        rows = await _rows(cur)
    for row, document in zip(rows, await _documents(rows), strict=True):
        found[row["source"]].append(Hit(document, float(row["score"])))
    return found["dense"], found["sparse"]


async def fetch(
    conn: AsyncConnection, scope: NamespaceScope, ids: Sequence[str], include: Include
) -> dict[str, StoredDocument]:
    statement = sql.SQL(
        "SELECT {columns} FROM {table} WHERE namespace = %s AND model = %s AND id = ANY(%s)"
    ).format(columns=_columns(include), table=TABLE)
    async with conn.cursor(row_factory=dict_row, binary=True) as cur:
        await _reading(cur).execute(statement, [scope.namespace, scope.model, list(ids)])
        rows = await _rows(cur)
    return {document.id: document for document in await _documents(rows)}


async def range_page(
    conn: AsyncConnection,
    scope: NamespaceScope,
    *,
    after: str,
    prefix: str,
    prefix_bound: str | None,
    limit: int,
    include: Include,
) -> list[StoredDocument]:
    """Up to `limit` documents in id order, with ids > after ('' = from the start) and
    prefix <= id < prefix_bound (a key range on the primary key)."""
    conditions = [sql.SQL("namespace = %s AND model = %s AND id > %s AND id >= %s")]
    params: list[Any] = [scope.namespace, scope.model, after, prefix]
    if prefix_bound is not None:
        conditions.append(sql.SQL("id < %s"))
        params.append(prefix_bound)
    statement = sql.SQL("SELECT {columns} FROM {table} WHERE {conditions} ORDER BY id LIMIT %s").format(
        columns=_columns(include), table=TABLE, conditions=sql.SQL(" AND ").join(conditions)
    )
    async with conn.cursor(row_factory=dict_row, binary=True) as cur:
        await _reading(cur).execute(statement, [*params, limit])
        rows = await _rows(cur)
    return await _documents(rows)


async def range_page_inserted(
    conn: AsyncConnection,
    scope: NamespaceScope,
    *,
    first: int,
    prefix: str,
    prefix_bound: str | None,
    limit: int,
    include: Include,
) -> tuple[list[StoredDocument], list[int]]:
    """Up to `limit` documents in insertion order (`seq`, migration 0007) from the place
    `first` on (0 = from the start), with prefix <= id < prefix_bound; and their places."""
    conditions = [sql.SQL("namespace = %s AND model = %s AND seq >= %s AND id >= %s")]
    params: list[Any] = [scope.namespace, scope.model, first, prefix]
    if prefix_bound is not None:
        conditions.append(sql.SQL("id < %s"))
        params.append(prefix_bound)
    statement = sql.SQL("SELECT seq, {columns} FROM {table} WHERE {conditions} ORDER BY seq LIMIT %s").format(
        columns=_columns(include), table=TABLE, conditions=sql.SQL(" AND ").join(conditions)
    )
    async with conn.cursor(row_factory=dict_row, binary=True) as cur:
        await _reading(cur).execute(statement, [*params, limit])
        rows = await _rows(cur)
    return await _documents(rows), [int(row["seq"]) for row in rows]


async def _delete_in_id_order(conn: AsyncConnection, where: sql.Composable, params: Sequence[Any]) -> int:
    """Deletes the namespace's rows `where` selects, locking them in id order first (as
    upsert writes them), so a delete and an upsert of the same ids never deadlock. `params`
    start with the namespace, which the DELETE names too (one partition: docs/scaling.md)."""
    statement = sql.SQL(
        "DELETE FROM {table} WHERE namespace = %s AND id IN"
        " (SELECT id FROM {table} WHERE namespace = %s AND {where} ORDER BY id FOR UPDATE)"
    ).format(table=TABLE, where=where)
    cur = await conn.execute(statement, [params[0], *params])
    return cur.rowcount


async def delete_ids(conn: AsyncConnection, namespace: str, ids: Sequence[str]) -> int:
    return await _delete_in_id_order(conn, sql.SQL("id = ANY(%s)"), [namespace, list(ids)])


async def delete_prefix(conn: AsyncConnection, namespace: str, prefix: str, prefix_bound: str | None) -> int:
    bound = sql.SQL(" AND id < %s") if prefix_bound is not None else sql.SQL("")
    params = [namespace, prefix] + ([prefix_bound] if prefix_bound is not None else [])
    return await _delete_in_id_order(conn, sql.SQL("id >= %s{bound}").format(bound=bound), params)


async def delete_namespace(conn: AsyncConnection, namespace: str) -> int:
    """Every document of the namespace, of every model."""
    return await _delete_in_id_order(conn, sql.SQL("true"), [namespace])


async def delete_matching(conn: AsyncConnection, namespace: str, node: Node) -> int:
    filter_sql, filter_params = compile_filter(node)
    return await _delete_in_id_order(conn, filter_sql, [namespace, *filter_params])


async def lock_metadata(conn: AsyncConnection, scope: NamespaceScope, doc_id: str) -> dict[str, Any] | None:
    """The document's metadata, row-locked until the transaction ends; None if absent."""
    statement = sql.SQL(
        "SELECT metadata FROM {table} WHERE namespace = %s AND model = %s AND id = %s FOR UPDATE"
    ).format(table=TABLE)
    cur = await conn.execute(statement, [scope.namespace, scope.model, doc_id])
    row = await cur.fetchone()
    return None if row is None else row[0]


@dataclass(frozen=True)
class Changes:
    """What an update replaces besides the metadata: None keeps a column as it is; the
    sparse column is replaced (NULL included) only with replace_sparse."""

    data: str | None = None
    embedding: HalfVector | None = None
    sparse: SparseVector | None = None
    replace_sparse: bool = False
    vector32: Vector | None = None


async def update(
    conn: AsyncConnection,
    scope: NamespaceScope,
    doc_id: str,
    metadata: dict[str, Any],
    changes: Changes | None = None,
) -> None:
    """Set the metadata and what `changes` replaces (the redacted data, the vectors)."""
    changes = changes or Changes()
    assignments: list[sql.Composable] = [sql.SQL("metadata = %s, updated_at = now()")]
    params: list[Any] = [Jsonb(metadata)]
    for column, value, given in (
        ("data", changes.data, changes.data is not None),
        ("embedding", changes.embedding, changes.embedding is not None),
        ("sparse", changes.sparse, changes.replace_sparse),
        ("vector32", changes.vector32, changes.vector32 is not None),
    ):
        if given:
            assignments.append(sql.SQL("{} = %s").format(sql.Identifier(column)))
            params.append(value)
    statement = sql.SQL(
        "UPDATE {table} SET {assignments} WHERE namespace = %s AND model = %s AND id = %s"
    ).format(table=TABLE, assignments=sql.SQL(", ").join(assignments))
    await conn.execute(statement, [*params, scope.namespace, scope.model, doc_id])


DOCUMENT_FREQUENCY_TERMS = 256
"""Terms counted per statement (one aggregate each, over one scan of the namespace)."""


async def document_frequencies(
    conn: AsyncConnection, scope: NamespaceScope, terms: Sequence[int], dimension: int
) -> tuple[int, dict[int, int]]:
    """The scope's document count and, per sparse term, how many of its documents have
    the term (a non-zero weight at that index)."""
    total, found = 0, dict[int, int]()
    for start in range(0, max(len(terms), 1), DOCUMENT_FREQUENCY_TERMS):
        chunk = list(terms[start : start + DOCUMENT_FREQUENCY_TERMS])
        counters = [sql.SQL("count(*)")] + [
            sql.SQL("count(*) FILTER (WHERE {})").format(
                nn.shares_a_term(sql.Identifier("sparse"), sql.Placeholder())
            )
            for _ in chunk
        ]
        statement = sql.SQL("SELECT {counters} FROM {table} WHERE namespace = %s AND model = %s").format(
            counters=sql.SQL(", ").join(counters), table=TABLE
        )
        params: list[Any] = [SparseVector({term: 1.0}, dimension) for term in chunk]
        cur = await conn.execute(statement, [*params, scope.namespace, scope.model])
        row = await cur.fetchone()
        assert row is not None
        total = row[0]
        found.update(zip(chunk, row[1:], strict=True))
    return total, found


NAMESPACES = sql.Identifier("dw_index_namespaces")


async def take_places(conn: AsyncConnection, scope: NamespaceScope, count: int) -> int:
    """Registers the namespace (a REST index's exists from its first upsert on: migration
    0008) and reserves `count` places in its insertion order for an upsert's rows; returns
    the first. Each namespace counts its own places from 0 (migration 0020's next_seq),
    and a row keeps its place for good: a Range cursor is the next record's place, "5"
    after the first five, as Upstash's. The namespace's row stays locked until the
    transaction ends, so upserts into one namespace take their places one after another
    (from several replicas too) and no two rows share one. A namespace registered before
    0020 (next_seq NULL) goes on after its last row, so that the cursors given out before
    (rows' places from the table's sequence) still mark the same places."""
    cur = await conn.execute(
        sql.SQL(
            "INSERT INTO {table} (model, namespace, next_seq) VALUES (%s, %s, %s)"
            " ON CONFLICT (model, namespace) DO UPDATE SET next_seq = {table}.next_seq + excluded.next_seq"
            " RETURNING next_seq"
        ).format(table=NAMESPACES),
        [scope.model, scope.namespace, count],
    )
    row = await cur.fetchone()
    assert row is not None
    if row[0] is not None:
        return int(row[0]) - count
    cur = await conn.execute(
        sql.SQL("SELECT max(seq) FROM {table} WHERE namespace = %s AND model = %s").format(table=TABLE),
        [scope.namespace, scope.model],
    )
    last = await cur.fetchone()
    first = 0 if last is None or last[0] is None else int(last[0]) + 1
    await conn.execute(
        sql.SQL("UPDATE {table} SET next_seq = %s WHERE model = %s AND namespace = %s").format(
            table=NAMESPACES
        ),
        [first + count, scope.model, scope.namespace],
    )
    return first


async def restart_places(conn: AsyncConnection, scope: NamespaceScope) -> None:
    """A namespace emptied by reset counts its places from 0 again (take_places), its row
    locked as an upsert locks it: run before the rows are deleted, in the same transaction,
    so that every upsert into the namespace commits before the delete or starts after it.
    A cursor given before the reset names a place among rows that are all gone; what it
    skips of the new ones came in after it was given."""
    await conn.execute(
        sql.SQL("UPDATE {table} SET next_seq = 0 WHERE model = %s AND namespace = %s").format(
            table=NAMESPACES
        ),
        [scope.model, scope.namespace],
    )


async def forget_namespace(conn: AsyncConnection, scope: NamespaceScope) -> None:
    await conn.execute(
        sql.SQL("DELETE FROM {table} WHERE model = %s AND namespace = %s").format(table=NAMESPACES),
        [scope.model, scope.namespace],
    )


async def registered_namespaces(conn: AsyncConnection, model: str) -> list[str]:
    cur = await conn.execute(
        sql.SQL("SELECT namespace FROM {table} WHERE model = %s ORDER BY namespace").format(table=NAMESPACES),
        [model],
    )
    return [namespace for (namespace,) in await cur.fetchall()]


async def counts(conn: AsyncConnection, model: str) -> dict[str, int]:
    """Documents of the model per namespace."""
    statement = sql.SQL(
        "SELECT namespace, count(*) FROM {table} WHERE model = %s GROUP BY namespace ORDER BY namespace"
    ).format(table=TABLE)
    cur = await conn.execute(statement, [model])
    return {namespace: count for namespace, count in await cur.fetchall()}


async def recent_documents(
    conn: AsyncConnection, namespace: str, model: str, *, limit: int, snippet: int
) -> list[tuple[Any, ...]]:
    """The namespace's `limit` most recently updated documents of `model` (by updated_at,
    then id), each as (id, its metadata's "type" or "", updated_at, the first `snippet`
    characters of its text, its dense vector: a pgvector HalfVector)."""
    statement = sql.SQL(
        """SELECT id, coalesce(metadata ->> 'type', ''), updated_at, left(data, %s), embedding
           FROM {table}
           WHERE namespace = %s AND model = %s
           ORDER BY updated_at DESC, id DESC
           LIMIT %s"""
    ).format(table=TABLE)
    cur = await conn.execute(statement, [snippet, namespace, model, limit])
    return await cur.fetchall()
