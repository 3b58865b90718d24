"""The lexical leg's side of what a sweep writes (migration 0014): each embedded window's BM25
weights (dwsearch.retrieval.bm25 over the text it embedded) in dw_message_embeddings.lexical,
and the document frequencies per org and model in dw_lexical_terms, which chat search's
lexical leg reads for its query terms' IDF (dwsearch.search.store.knn.lexical_knn).

The counts change in the statement that deletes the windows they count (count_statement:
a DELETE ... RETURNING whose returned rows are uncounted), so they follow what was really
deleted: two transactions deleting one window uncount it once (the second deletes nothing),
and a delete that waited for a backfill uncounts the weights the backfill wrote. Every
writer locks window rows before term rows, and the term rows in (org, model, term) order:
sweepers, purges, drops and the backfill wait for each other and never deadlock. Term TOTAL
counts the windows that have lexical weights at all (a window of no words included).

Windows embedded before the lexical leg existed have none; backfill() gives them theirs
from the content they were embedded from, a batch per org and model at a time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pgvector import SparseVector
from psycopg import AsyncConnection, sql

from dwsearch.common import offload
from dwsearch.retrieval import bm25

TOTAL = bm25.TOTAL_TERM
"""dw_lexical_terms.term of the org's count of windows with lexical weights."""

BACKFILL_BATCH = 500

# A deleted window's terms, and TOTAL: a sparsevec's text form is '{i:v,...}/dim' with
# 1-based indices; bm25's term ids are 0-based. A window without words ('{}/dim') has TOTAL only.
_ROW_TERMS = sql.SQL(
    """LATERAL (SELECT {total}::bigint AS term
                UNION ALL
                SELECT split_part(p, ':', 1)::bigint - 1
                FROM unnest(string_to_array(btrim(split_part(g.lexical::text, '/', 1), '{{}}'), ',')) AS p
               ) AS terms"""
).format(total=sql.Literal(TOTAL))


def window_lexical(text: str) -> tuple[SparseVector, list[int]]:
    """A window's lexical weights, and the terms to count for it (TOTAL included)."""
    weights = bm25.document_vector(text)
    return SparseVector(weights, bm25.DIMENSION), [TOTAL, *sorted(weights)]


def count_statement(removed: sql.Composable | None) -> sql.Composed:
    """One statement: the dw_message_embeddings rows AS e that `removed` selects deleted
    (None: none), and the counts changed by +1 for each of `%(added)s` (terms of a window of
    `%(org)s` and `%(model)s` being written) and -1 for each term of every row deleted, in
    one ordered upsert. Returns one row: how many rows it deleted."""
    gone = (
        sql.SQL(
            "DELETE FROM dw_message_embeddings AS e WHERE {} RETURNING e.org_id, e.model, e.lexical"
        ).format(removed)
        if removed is not None
        else sql.SQL(
            "SELECT NULL::varchar AS org_id, NULL::varchar AS model, NULL::sparsevec AS lexical WHERE false"
        )
    )
    return sql.SQL(
        """WITH gone AS ({gone}),
           counted AS (
               INSERT INTO dw_lexical_terms AS t (org_id, model, term, windows)
               SELECT org_id, model, term, sum(n)::integer FROM (
                   SELECT %(org)s::varchar AS org_id, %(model)s::varchar AS model, a AS term, 1 AS n
                   FROM unnest(%(added)s::bigint[]) AS a
                   UNION ALL
                   SELECT g.org_id, g.model, terms.term, -1 FROM gone AS g, {row_terms}
                   WHERE g.lexical IS NOT NULL
               ) AS delta
               GROUP BY org_id, model, term HAVING sum(n) <> 0
               ORDER BY org_id, model, term
               ON CONFLICT (org_id, model, term) DO UPDATE SET windows = t.windows + excluded.windows
           )
           SELECT count(*) FROM gone"""
    ).format(gone=gone, row_terms=_ROW_TERMS)


async def delete_windows(conn: AsyncConnection, removed: sql.Composable, params: Mapping[str, object]) -> int:
    """Delete the dw_message_embeddings rows AS e that `removed` selects, their terms
    uncounted in the same statement; returns how many were deleted."""
    cur = await conn.execute(count_statement(removed), {"org": "", "model": "", "added": [], **params})
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def backfill_pending(
    conn: AsyncConnection, orgs: Sequence[str], models: Sequence[str]
) -> list[tuple[str, str]]:
    """The (org, model) pairs of `orgs` and `models` with windows still without lexical
    weights: one probe of the partial index dw_message_embeddings_lexical_backfill_idx
    each (it holds only those windows), each naming its org (one shard on a cluster)."""
    pairs = [(org, model) for org in orgs for model in models]
    found = []
    async with conn.pipeline():
        cursors = [
            await conn.execute(
                """SELECT EXISTS (SELECT 1 FROM dw_message_embeddings
                                  WHERE org_id = %s AND model = %s AND lexical IS NULL)""",
                pair,
            )
            for pair in pairs
        ]
    for pair, cur in zip(pairs, cursors, strict=True):
        row = await cur.fetchone()
        if row and row[0]:
            found.append(pair)
    return found


def _weights(rows: Sequence[tuple[object, str]]) -> list[tuple[object, SparseVector, list[int]]]:
    return [(window_id, *window_lexical(content)) for window_id, content in rows]


async def backfill(conn: AsyncConnection, org_id: str, model: str, limit: int = BACKFILL_BATCH) -> int:
    """Lexical weights for up to `limit` of the org's windows of `model` that have none
    (embedded before migration 0014), from their content, counted; returns how many. The
    rows are locked first (others' locked rows skipped), then the terms, as every writer
    of them does; the text is tokenised off the event loop."""
    async with conn.transaction():
        cur = await conn.execute(
            """SELECT id, content FROM dw_message_embeddings
               WHERE org_id = %s AND model = %s AND lexical IS NULL
               LIMIT %s FOR UPDATE SKIP LOCKED""",
            (org_id, model, limit),
        )
        rows = await cur.fetchall()
        if not rows:
            return 0
        weighed = await offload.run(_weights, rows, refuse=False)
        async with conn.cursor() as cursor:
            await cursor.executemany(
                "UPDATE dw_message_embeddings SET lexical = %s WHERE org_id = %s AND id = %s",
                [(vector, org_id, window_id) for window_id, vector, _ in weighed],
            )
        # One window's terms are distinct; several windows' repeat: the statement sums them.
        added = [term for _, _, terms in weighed for term in terms]
        await conn.execute(count_statement(None), {"org": org_id, "model": model, "added": added})
    return len(rows)
