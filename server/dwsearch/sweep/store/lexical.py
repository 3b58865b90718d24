"""The lexical leg's side of what a sweep writes (migration 0014): each embedded window's BM25
weights (dwsearch.retrieval.bm25 over the text it embedded) in dw_message_embeddings.lexical,
and the document frequencies per org and model in dw_lexical_terms, which chat search's
lexical leg reads for its query terms' IDF (dwsearch.search.store.lexical).

The counts change in the transaction that writes or deletes the windows, in one statement
whose rows are taken in (org, model, term) order: two sweepers of one org adding windows
with common terms wait for each other and never deadlock. Term TOTAL counts the windows
that have lexical weights at all (a window of no words included).

Windows embedded before the lexical leg existed have none; backfill() gives them theirs
from the content they were embedded from, a batch per org and model at a time."""

from __future__ import annotations

from collections.abc import Mapping

from pgvector import SparseVector
from psycopg import AsyncConnection, sql

from dwsearch.retrieval import bm25

TOTAL = bm25.TOTAL_TERM
"""dw_lexical_terms.term of the org's count of windows with lexical weights."""

BACKFILL_BATCH = 500

# A stored sparsevec's terms, and TOTAL: its text form is '{i:v,...}/dim' with 1-based
# indices; bm25's term ids are 0-based. A window without words ('{}/dim') has TOTAL only.
_ROW_TERMS = sql.SQL(
    """LATERAL (SELECT {total}::bigint AS term
                UNION ALL
                SELECT split_part(p, ':', 1)::bigint - 1
                FROM unnest(string_to_array(btrim(split_part(e.lexical::text, '/', 1), '{{}}'), ',')) AS p
               ) AS terms"""
).format(total=sql.Literal(TOTAL))


def window_lexical(text: str) -> tuple[SparseVector, list[int]]:
    """A window's lexical weights, and the terms to count for it (TOTAL included)."""
    weights = bm25.document_vector(text)
    return SparseVector(weights, bm25.DIMENSION), [TOTAL, *sorted(weights)]


def count_statement(removed: sql.Composable | None) -> sql.Composed:
    """The counts' change: +1 for each of `%(added)s` (a window of `%(org)s` and
    `%(model)s` written), -1 for each term of every dw_message_embeddings row AS e that
    `removed` selects (windows about to be deleted; None: none), in one ordered upsert.
    Run before the rows are deleted."""
    gone = (
        sql.SQL(
            """UNION ALL
               SELECT e.org_id, e.model, terms.term, -1 FROM dw_message_embeddings AS e, {row_terms}
               WHERE e.lexical IS NOT NULL AND {removed}"""
        ).format(row_terms=_ROW_TERMS, removed=removed)
        if removed is not None
        else sql.SQL("")
    )
    return sql.SQL(
        """INSERT INTO dw_lexical_terms AS t (org_id, model, term, windows)
           SELECT org_id, model, term, sum(n)::integer FROM (
               SELECT %(org)s::varchar AS org_id, %(model)s::varchar AS model, a AS term, 1 AS n
               FROM unnest(%(added)s::bigint[]) AS a
               {gone}
           ) AS delta
           GROUP BY org_id, model, term HAVING sum(n) <> 0
           ORDER BY org_id, model, term
           ON CONFLICT (org_id, model, term) DO UPDATE SET windows = t.windows + excluded.windows"""
    ).format(gone=gone)


async def uncount(conn: AsyncConnection, removed: sql.Composable, params: Mapping[str, object]) -> None:
    """-1 for every term of the windows `removed` selects (e: dw_message_embeddings),
    before they are deleted in the same transaction."""
    await conn.execute(count_statement(removed), {"org": "", "model": "", "added": [], **params})


async def backfill_pending(conn: AsyncConnection, orgs: list[str]) -> list[tuple[str, str]]:
    """The (org, model) pairs of `orgs` with windows still without lexical weights (the
    partial index dw_message_embeddings_lexical_backfill_idx holds only those)."""
    if not orgs:
        return []
    cur = await conn.execute(
        """SELECT DISTINCT org_id, model FROM dw_message_embeddings
           WHERE lexical IS NULL AND org_id = ANY(%s::varchar[]) ORDER BY org_id, model""",
        (orgs,),
    )
    return [(row[0], row[1]) for row in await cur.fetchall()]


async def backfill(conn: AsyncConnection, org_id: str, model: str, limit: int = BACKFILL_BATCH) -> int:
    """Lexical weights for up to `limit` of the org's windows of `model` that have none
    (embedded before migration 0014), from their content, counted; returns how many."""
    async with conn.transaction():
        cur = await conn.execute(
            """SELECT id, content FROM dw_message_embeddings
               WHERE org_id = %s AND model = %s AND lexical IS NULL
               ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED""",
            (org_id, model, limit),
        )
        rows = await cur.fetchall()
        if not rows:
            return 0
        added: list[int] = []
        updates = []
        for window_id, content in rows:
            vector, terms = window_lexical(content)
            added += terms
            updates.append((vector, org_id, window_id))
        async with conn.cursor() as cursor:
            await cursor.executemany(
                "UPDATE dw_message_embeddings SET lexical = %s WHERE org_id = %s AND id = %s", updates
            )
        # One window's terms are distinct; several windows' repeat: the statement sums them.
        await conn.execute(count_statement(None), {"org": org_id, "model": model, "added": added})
    return len(rows)
