"""Nearest-neighbour SQL for both corpora: chat windows (dw_message_embeddings and its
lexical projection, dw_lexical_windows) and the Index's documents (dw_index_documents).

Every comparison of vectors (pgvector's `<#>`, `<=>`, `<->`) is written here, and so is
every shape of a nearest-neighbour statement: an exact ranking with late materialization
(ranked_late: the scan ranks (id, score) pairs, the winners' columns are read by key:
chat's windows), an exact ranking that carries its columns (ranked: the Index's sources,
joined by union), and a scan of an HNSW index (hnsw_ranked, with hnsw_settings). The
callers bring what differs: their table, the scope's conditions, the columns a hit needs, and the
placeholders of their parameters (chat's are named, `%(vector)s`; the Index's positional,
`%s`, as its filter fragments are). The HNSW indexes' DDL is dwsearch.retrieval.store.hnsw.
"""

from __future__ import annotations

from psycopg import sql

METRICS = ("ip", "cosine", "l2")
"""The dense comparisons: inner product (unit vectors: the cosine's ranking), cosine, and
squared L2 distance."""

_SIMILARITY = {
    "ip": "-({column} <#> {query})",
    "cosine": "1 - ({column} <=> {query})",
    "l2": "-(({column} <-> {query}) ^ 2)",
}


def similarity(column: sql.Composable, query: sql.Composable, metric: str = "ip") -> sql.Composed:
    """A score, higher is better, of `column` against the query vector `query` (a
    placeholder, or a typed one): the inner product (pgvector's `<#>` is its negative),
    the cosine similarity, or minus the squared L2 distance."""
    return sql.SQL(_SIMILARITY[metric]).format(column=column, query=query)


def distance(column: sql.Composable, query: sql.Composable) -> sql.Composed:
    """The negative inner product, the order an HNSW index (halfvec_ip_ops) scans in."""
    return sql.SQL("{} <#> {}").format(column, query)


def overlaps(column: sql.Composable, query: sql.Composable) -> sql.Composed:
    """A sparse vector whose inner product with the query is positive: it shares a term
    with it (sparse weights are never negative)."""
    return sql.SQL("({} <#> {}) < 0").format(column, query)


def shares_a_term(column: sql.Composable, query: sql.Composable) -> sql.Composed:
    """A sparse vector sharing a term with the query, whatever the sign of the product
    (the query is a one-hot probe of the term: a document frequency)."""
    return sql.SQL("({} <#> {}) <> 0").format(column, query)


def ranked_late(
    *,
    columns: sql.Composable,
    score: sql.Composable,
    table: str,
    where: sql.Composable,
    limit: sql.Composable,
    materialize: str,
    materialize_where: sql.Composable,
    min_score: float | None = None,
) -> sql.Composed:
    """The rows of highest `score` among `table`'s rows matching `where`, at most `limit`,
    with `columns` of `materialize` (the table or one it projects, joined by id; its own
    condition `materialize_where`, e.g. the org, so that a distributed join stays on one
    shard). The output's last column is the score.

    Late materialization: the scan ranks (id, score) pairs only, and the other columns are
    fetched for the winners by primary key. Carrying every scanned row's content through
    the top-k sort cost a fifth of the query (`python -m bench.search`). The score is
    computed once per row; ties break on id so results are stable. With `min_score`,
    winners scoring no more than it are dropped after the top k are chosen: the same rows
    as filtering first, since they rank below every row that passes."""
    condition = (
        sql.SQL("TRUE") if min_score is None else sql.SQL("nearest.score > {}").format(sql.Literal(min_score))
    )
    return sql.SQL(
        """SELECT {columns}, nearest.score
           FROM (SELECT id, {score} AS score FROM {table}
                 WHERE {where}
                 ORDER BY score DESC, id LIMIT {limit}) AS nearest
           JOIN {materialize} USING (id)
           WHERE {materialize_where} AND {condition}
           ORDER BY nearest.score DESC, nearest.id"""
    ).format(
        columns=columns,
        score=score,
        table=sql.Identifier(table),
        where=where,
        limit=limit,
        materialize=sql.Identifier(materialize),
        materialize_where=materialize_where,
        condition=condition,
    )


def ranked(
    *,
    label: sql.Composable,
    columns: sql.Composable,
    score: sql.Composable,
    table: sql.Composable,
    where: sql.Composable,
    limit: sql.Composable,
) -> sql.Composed:
    """The rows of highest `score` among `table`'s rows matching `where`, at most `limit`,
    each with its `columns`, its source `label` and the score, ordered by the output
    column (so the distance is computed once per row), ties on id. Parenthesized: one
    source of a union (union). The columns ride through the top-k sort: cheaper than
    reading them again by key where a row's wide values are toasted (the Index's text and
    metadata: 1.6 ms against 2.0 ms p50 for 20 candidates a source on 100,000 documents)."""
    return sql.SQL(
        """(SELECT {label} AS source, {score} AS score, {columns}
            FROM {table}
            WHERE {where}
            ORDER BY score DESC, id LIMIT {limit})"""
    ).format(label=label, score=score, columns=columns, table=table, where=where, limit=limit)


def union(sources: list[sql.Composable]) -> sql.Composed:
    """Several `ranked` sources in one statement, by source, best first, ties on id."""
    return sql.SQL("SELECT * FROM ({}) AS nearest ORDER BY source, score DESC, id").format(
        sql.SQL(" UNION ALL ").join(sources)
    )


def hnsw_ranked(
    *,
    columns: sql.Composable,
    column: str,
    dimension: int,
    query: sql.Composable,
    table: str,
    where: sql.Composable,
    limit: sql.Composable,
    tie_on_id: bool = False,
) -> sql.Composed:
    """The nearest rows by inner product through an HNSW index on `column` cast to
    halfvec(`dimension`) (dwsearch.retrieval.store.hnsw): the scan orders by the index's
    distance, in relaxed order (hnsw_settings), and the outer query re-sorts by score,
    best first (`tie_on_id`: ties on id)."""
    typed = sql.SQL("halfvec({})").format(sql.Literal(int(dimension)))
    cast = sql.SQL("({}::{})").format(sql.Identifier(column), typed)
    query_typed = sql.SQL("{}::{}").format(query, typed)
    return sql.SQL(
        """SELECT * FROM (
               SELECT {columns}, {score} AS score
               FROM {table} WHERE {where}
               ORDER BY {distance} LIMIT {limit}
           ) AS nearest ORDER BY score DESC{tie}"""
    ).format(
        columns=columns,
        score=similarity(cast, query_typed),
        table=sql.Identifier(table),
        where=where,
        distance=distance(cast, query_typed),
        limit=limit,
        tie=sql.SQL(", id") if tie_on_id else sql.SQL(""),
    )


def hnsw_settings(ef_search: int) -> sql.Composed:
    """The HNSW scan's settings for the transaction, in one round trip (several statements,
    no parameters: the simple query protocol). On a Citus coordinator a SET LOCAL stays on
    the coordinator unless citus.propagate_set_commands is 'local', and the index scans run
    on the workers; on one node that setting is an unused placeholder."""
    return sql.SQL(
        "SET LOCAL citus.propagate_set_commands = 'local'; "
        "SET LOCAL hnsw.iterative_scan = relaxed_order; SET LOCAL hnsw.ef_search = {}"
    ).format(sql.Literal(int(ef_search)))
