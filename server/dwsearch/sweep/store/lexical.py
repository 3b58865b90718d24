"""The lexical leg's side of what a sweep writes (migration 0014): each embedded window's BM25
weights (dwsearch.retrieval.bm25 over the text it embedded) in dw_message_embeddings.lexical,
and the document frequencies per org and model in dw_lexical_terms, which chat search's
lexical leg reads for its query terms' IDF (dwsearch.search.store.knn.lexical_knn). The
leg scans the weights' projection in dw_lexical_windows (migration 0016), which project()
writes in the transaction that writes the weights; a window's projection goes with it (ON
DELETE CASCADE).

The counts are uncounted from what a DELETE ... RETURNING really deleted (delete_windows),
so they follow what was really deleted: two transactions deleting one window uncount it once (the second deletes nothing),
and a delete that waited for a backfill uncounts the weights the backfill wrote. Every
writer locks window rows before term rows, and the term rows in (org, model, term) order:
sweepers, purges, drops and the backfill wait for each other and never deadlock. Term TOTAL
counts the windows that have lexical weights at all (a window of no words included).

Windows embedded before the lexical leg existed have none; backfill() gives them theirs
from the content they were embedded from, a batch per org and model at a time. Each
window's row records which term extraction weighed it (lexical_terms, migration 0021;
LEXICAL_TERMS): backfill() also weighs again, the same way, the windows weighed by an older
one, uncounting their old terms as a delete uncounts a window's. That is how windows get
new weights when the terms change (0021: Simplified and Traditional Chinese folded to one
form), with nothing paused and nothing rewritten by a migration."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from pgvector import SparseVector
from psycopg import AsyncConnection, AsyncCursor, sql

from dwsearch.common import offload
from dwsearch.retrieval import bm25

TOTAL = bm25.TOTAL_TERM
"""dw_lexical_terms.term of the org's count of windows with lexical weights."""

LEXICAL_TERMS = 1
"""The term extraction this release weighs windows by, stored with every window's weights
(dw_message_embeddings.lexical_terms, migration 0021): 1, dwsearch.retrieval.bm25 with
Simplified and Traditional Chinese folded to one form (window_lexical). NULL is the
extraction before it (migrations 0014 to 0020).

Bump it whenever how a window's terms or weights are made changes (window_lexical, bm25's
tokens or weights, the fold's table), with a migration that builds the partial index of the
new STALE (its version the new constant) and drops the one before: the sweep's backfill
then weighs every window of a lower version again, a batch at a time, while searches go on.

During a rolling upgrade a sweep of the release before writes its windows with its own,
lower version, or with none (NULL: a release before 0021, which does not know the column):
this release's backfill weighs those again too, so nothing needs pausing. A sweep of the
release before never takes a window of this version: it weighs again only lower ones."""

STALE = sql.SQL("lexical IS NOT NULL AND coalesce(lexical_terms, 0) < {version}").format(
    version=sql.Literal(LEXICAL_TERMS)
)
"""The windows whose weights are of an older term extraction: the predicate of the partial
index dw_message_embeddings_lexical_stale_idx (migration 0021), spelled the same so that the
planner takes it, the version a constant (an index predicate must be immutable)."""

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


PROJECT = """INSERT INTO dw_lexical_windows (id, org_id, model, provider, external_channel_id, window_start,
                                            window_end, lexical)
             SELECT id, %(org)s::varchar, model, provider, external_channel_id, window_start, window_end,
                    lexical::text::sparsevec
             FROM dw_message_embeddings
             WHERE org_id = %(org)s AND id = ANY(%(windows)s::uuid[]) AND lexical IS NOT NULL"""
"""The projection (dw_lexical_windows) of `%(org)s`'s windows `%(windows)s`, from their rows'
weights as this transaction wrote them (what the lexical leg scans: migration 0016). The org
a parameter, as every insert's: one partition by the statement alone (tests/db/
test_single_partition.py). On a cluster each side is one shard and the rows pass through the
coordinator (Citus pushes an INSERT ... SELECT down whole only when the distribution column
is passed through): a window's one row, or a backfill batch's.

The weights are copied as a new value (through their text, which is exact): beside a dense
vector of 1024 dimensions the window's row passes the toast threshold and its weights are
stored compressed, and a compressed value copied as it is stays compressed in the narrow
row too, where every scan of the leg decompressed it again (migration 0018). A window of more
than about 235 distinct terms passes the threshold in the narrow row as well, and is
compressed there all the same."""


async def project(conn: AsyncConnection, org_id: str, windows: Sequence[object]) -> None:
    """Project the weights of the org's `windows`, written in this transaction, into
    dw_lexical_windows (one statement; in a pipeline, it waits for none)."""
    await conn.execute(PROJECT, {"org": org_id, "windows": list(windows)})


def window_lexical(text: str) -> tuple[SparseVector, list[int]]:
    """A window's lexical weights, and the terms to count for it (TOTAL included), by term
    extraction LEXICAL_TERMS (a change here bumps it). Simplified and Traditional Chinese
    fold to one form (dwsearch.retrieval.chinese), as the leg's query terms do
    (dwsearch.search.store.knn.lexical_knn); backfill() weighs the windows weighed before
    the fold again here."""
    weights = bm25.document_vector(text, fold=True)
    return SparseVector(weights, bm25.DIMENSION), [TOTAL, *sorted(weights)]


COUNT = """INSERT INTO dw_lexical_terms AS t (org_id, model, term, windows)
           SELECT %(org)s::varchar, %(model)s::varchar, term, sum(n)::integer
           FROM unnest(%(terms)s::bigint[], %(deltas)s::integer[]) AS d (term, n)
           GROUP BY term HAVING sum(n) <> 0
           ORDER BY term
           ON CONFLICT (org_id, model, term) DO UPDATE SET windows = t.windows + excluded.windows"""
"""The counts of `%(org)s` and `%(model)s` changed by `%(deltas)s` (one per term of
`%(terms)s`, a term given twice summed), in term order: concurrent writers of one org's
counts wait for each other and never deadlock. A plain INSERT ... SELECT of its parameters:
on a cluster, one shard (the same upsert inside a CTE reached every worker)."""

Counts = dict[tuple[str, str], dict[int, int]]
"""Term deltas per (org, model)."""


def deleted_statement(removed: sql.Composable) -> sql.Composed:
    """The dw_message_embeddings rows AS e that `removed` selects deleted, and, as rows
    (org_id, model, term, windows), how many of the deleted rows have each term (TOTAL
    included); last a row (NULL, NULL, NULL, how many rows it deleted). The delete returns
    what it really deleted: a row another transaction deleted first is not counted again,
    and one whose weights a backfill wrote while the delete waited counts those weights."""
    return sql.SQL(
        """WITH gone AS (DELETE FROM dw_message_embeddings AS e WHERE {removed}
                         RETURNING e.org_id, e.model, e.lexical)
           SELECT g.org_id, g.model, terms.term, count(*) FROM gone AS g, {row_terms}
           WHERE g.lexical IS NOT NULL GROUP BY 1, 2, 3
           UNION ALL
           SELECT NULL, NULL, NULL, count(*) FROM gone"""
    ).format(removed=removed, row_terms=_ROW_TERMS)


async def delete_windows(
    conn: AsyncConnection,
    removed: sql.Composable,
    params: Mapping[str, object],
    *,
    added: Counts | None = None,
) -> int:
    """Delete the dw_message_embeddings rows AS e that `removed` selects, then uncount
    their terms (with `added`, counted as well, in the same upserts); returns how many rows
    were deleted. Window rows are locked before term rows, as every writer of them does."""
    cur = await conn.execute(deleted_statement(removed), params)
    deltas: Counts = {key: dict(terms) for key, terms in (added or {}).items()}
    deleted = 0
    rows = []
    for row in await cur.fetchall():
        if row[2] is None:
            deleted = int(row[3])
        else:
            rows.append(row)
    uncount(deltas, rows)
    await count(conn, deltas)
    return deleted


def uncount(deltas: Counts, rows: Sequence[tuple[str, str, int, int]]) -> None:
    """Take from `deltas` the rows (org_id, model, term, windows) of windows' terms as
    _ROW_TERMS reads them from the windows' weights: those a delete returned, or those of
    windows weighed again (WEIGHED_TERMS)."""
    for org, model, term, n in rows:
        counts = deltas.setdefault((org, model), {})
        counts[int(term)] = counts.get(int(term), 0) - int(n)


async def count(conn: AsyncConnection, deltas: Counts) -> None:
    """Each (org, model)'s term deltas upserted, one statement each, in (org, model) order."""
    for (org, model), terms in sorted(deltas.items()):
        changed = sorted((term, n) for term, n in terms.items() if n)
        if changed:
            await conn.execute(
                COUNT,
                {
                    "org": org,
                    "model": model,
                    "terms": [t for t, _ in changed],
                    "deltas": [n for _, n in changed],
                },
            )


def added(org: str, model: str, terms: Sequence[int]) -> Counts:
    """+1 for each of a written window's terms (TOTAL included)."""
    return {(org, model): dict.fromkeys(terms, 1)}


# Windows without weights, and windows weighed by an older term extraction: one probe of
# each partial index (migrations 0014 and 0021).
_TO_WEIGH = sql.SQL(
    """SELECT EXISTS (SELECT 1 FROM dw_message_embeddings
                      WHERE org_id = %(org)s AND model = %(model)s AND lexical IS NULL),
              EXISTS (SELECT 1 FROM dw_message_embeddings
                      WHERE org_id = %(org)s AND model = %(model)s AND {stale})"""
).format(stale=STALE)

# The org's projections against its count of windows with weights (TOTAL, kept exact with
# them): one index range of the narrow table and one key probe.
_UNPROJECTED = sql.SQL(
    """SELECT (SELECT count(*) FROM dw_lexical_windows WHERE org_id = %(org)s AND model = %(model)s)
              <> coalesce((SELECT windows FROM dw_lexical_terms
                           WHERE org_id = %(org)s AND model = %(model)s AND term = {total}), 0)"""
).format(total=sql.Literal(TOTAL))


@dataclass(frozen=True)
class Pending:
    """An org and model with lexical work: windows still without weights (`unweighed`),
    windows weighed by an older term extraction than LEXICAL_TERMS (`stale`), or windows
    with weights and no projection (`unprojected`)."""

    org_id: str
    model: str
    unweighed: bool
    unprojected: bool
    stale: bool = False


async def backfill_pending(
    conn: AsyncConnection, orgs: Sequence[str], models: Sequence[str], *, recount: Collection[str] = ()
) -> list[Pending]:
    """The orgs of `orgs` and models of `models` with lexical work, each statement naming
    its org (one shard on a cluster): windows still without weights, or weighed by an older
    term extraction, by one probe of each partial index (dw_message_embeddings_lexical_
    backfill_idx and _lexical_stale_idx: they hold only those); and, for the orgs in
    `recount` (the sweep's full check), windows with weights and no projection, the org's
    projections counted against its windows with weights (TOTAL). Those a sweep of the
    release before 0016 wrote while 0016 ran have none."""
    pairs = [(org, model) for org in orgs for model in models]
    found = []
    async with conn.pipeline():
        cursors = [
            (
                await conn.execute(_TO_WEIGH, {"org": org, "model": model}),
                await conn.execute(_UNPROJECTED, {"org": org, "model": model}) if org in recount else None,
            )
            for org, model in pairs
        ]
    for (org, model), (to_weigh, unprojected) in zip(pairs, cursors, strict=True):
        unweighed, stale = await to_weigh.fetchone() or (False, False)
        pending = Pending(org, model, bool(unweighed), await _true(unprojected), bool(stale))
        if pending.unweighed or pending.stale or pending.unprojected:
            found.append(pending)
    return found


async def _true(cur: AsyncCursor[tuple[bool]] | None) -> bool:
    row = await cur.fetchone() if cur is not None else None
    return bool(row and row[0])


# As PROJECT, the weights copied as a new value.
REPROJECT = """INSERT INTO dw_lexical_windows (id, org_id, model, provider, external_channel_id, window_start,
                                              window_end, lexical)
               SELECT e.id, %(org)s::varchar, e.model, e.provider, e.external_channel_id, e.window_start,
                      e.window_end, e.lexical::text::sparsevec
               FROM dw_message_embeddings AS e
               WHERE e.org_id = %(org)s AND e.model = %(model)s AND e.lexical IS NOT NULL
                 AND NOT EXISTS (SELECT 1 FROM dw_lexical_windows AS l WHERE l.org_id = %(org)s AND l.id = e.id)
               ON CONFLICT DO NOTHING"""


async def reproject(conn: AsyncConnection, org_id: str, model: str) -> int:
    """Project the org's windows of `model` that have weights and no projection (one read of
    its windows); returns how many. A window another sweep projects meanwhile is left as
    that sweep wrote it; one deleted meanwhile fails the statement (a foreign key
    violation), and the next full check projects the others."""
    async with conn.transaction():
        cur = await conn.execute(REPROJECT, {"org": org_id, "model": model})
        return cur.rowcount


# Up to %(limit)s of the org's windows of %(model)s to weigh, locked (others' locked rows
# skipped), with their weights as they are: through each one's partial index, those without
# weights (migration 0014) and those weighed by an older term extraction (0021).
_TAKE = sql.SQL(
    """SELECT id, content, lexical::text FROM dw_message_embeddings
       WHERE org_id = %(org)s AND model = %(model)s AND {which}
       LIMIT %(limit)s FOR UPDATE SKIP LOCKED"""
)
TAKE_UNWEIGHED = _TAKE.format(which=sql.SQL("lexical IS NULL"))
TAKE_STALE = _TAKE.format(which=STALE)

WEIGHED_TERMS = sql.SQL(
    """SELECT g.org_id, g.model, terms.term, count(*) FROM dw_message_embeddings AS g, {row_terms}
       WHERE g.org_id = %(org)s AND g.id = ANY(%(windows)s::uuid[]) AND g.lexical IS NOT NULL
       GROUP BY 1, 2, 3"""
).format(row_terms=_ROW_TERMS)
"""As rows (org_id, model, term, windows), how many of the org's `%(windows)s` have each
term in the weights they have now (TOTAL included): read by _ROW_TERMS, as a delete reads
the windows it uncounts (deleted_statement), so that a window weighed again is uncounted
exactly as its delete would have uncounted it."""


@dataclass(frozen=True)
class _Weighed:
    window_id: object
    weights: SparseVector
    terms: list[int]
    same: bool
    """The weights the window has are these already (the new extraction changes nothing of
    its text): only its version is written."""


def _same(stored: str | None, weights: SparseVector) -> bool:
    """Whether `stored` (a sparsevec's text, '{i:v,...}/dim', 1-based; None: no weights)
    holds `weights` as Postgres stores them (float4)."""
    if stored is None:
        return False
    body, _, dimension = stored.partition("/")
    pairs = [p.split(":") for p in body.strip("{}").split(",") if p]
    indices = [int(i) - 1 for i, _ in pairs]
    values = np.array([float(v) for _, v in pairs], dtype=np.float32)
    return (
        int(dimension) == weights.dimensions()
        and indices == list(weights.indices())
        and bool(np.array_equal(values, np.array(weights.values(), dtype=np.float32)))
    )


def _weights(rows: Sequence[tuple[object, str, str | None]]) -> list[_Weighed]:
    out = []
    for window_id, content, stored in rows:
        weights, terms = window_lexical(content)
        out.append(_Weighed(window_id, weights, terms, _same(stored, weights)))
    return out


async def backfill(conn: AsyncConnection, org_id: str, model: str, limit: int = BACKFILL_BATCH) -> int:
    """Lexical weights for up to `limit` of the org's windows of `model` that have none
    (embedded before migration 0014), then of those weighed by an older term extraction
    than LEXICAL_TERMS (before 0021, or by a sweep of the release before during a rolling
    upgrade), from their content, with this version; returns how many it took (fewer than
    `limit`: no more, or the others locked by another backfill). One transaction each."""
    weighed = await _weigh(conn, org_id, model, limit, TAKE_UNWEIGHED)
    if weighed < limit:
        weighed += await _weigh(conn, org_id, model, limit - weighed, TAKE_STALE)
    return weighed


async def _weigh(conn: AsyncConnection, org_id: str, model: str, limit: int, take: sql.Composed) -> int:
    """Weigh up to `limit` of the org's windows of `model` that `take` selects, in one
    transaction, as every writer of the weights does: the window rows locked first (others'
    locked rows skipped), then their projections, then the terms (in term order: count).
    A window weighed before has its old terms uncounted (WEIGHED_TERMS, read before its
    weights change) and its new ones counted in the same upserts; one whose weights come
    out the same keeps them, its projection and its counts, and gets this version. The text
    is tokenised off the event loop."""
    async with conn.transaction():
        cur = await conn.execute(take, {"org": org_id, "model": model, "limit": limit})
        rows = await cur.fetchall()
        if not rows:
            return 0
        weighed = await offload.run(_weights, rows, refuse=False)
        same = [w.window_id for w in weighed if w.same]
        changed = [w for w in weighed if not w.same]
        windows = [w.window_id for w in changed]
        deltas: Counts = {}
        if windows and any(stored is not None for _, _, stored in rows):
            cur = await conn.execute(WEIGHED_TERMS, {"org": org_id, "windows": windows})
            uncount(deltas, await cur.fetchall())
        version = {"version": LEXICAL_TERMS, "org": org_id}
        if same:
            await conn.execute(
                """UPDATE dw_message_embeddings SET lexical_terms = %(version)s
                   WHERE org_id = %(org)s AND id = ANY(%(windows)s::uuid[])""",
                {**version, "windows": same},
            )
        if changed:
            async with conn.cursor() as cursor:
                await cursor.executemany(
                    """UPDATE dw_message_embeddings SET lexical = %(lexical)s, lexical_terms = %(version)s
                       WHERE org_id = %(org)s AND id = %(id)s""",
                    [{**version, "lexical": w.weights, "id": w.window_id} for w in changed],
                )
            # The old weights' projection, or one left without weights behind it by a
            # hand-made repair, replaced.
            await conn.execute(
                "DELETE FROM dw_lexical_windows WHERE org_id = %s AND id = ANY(%s::uuid[])", (org_id, windows)
            )
            await project(conn, org_id, windows)
            # One window's terms are distinct; several windows' repeat: summed here.
            counts = deltas.setdefault((org_id, model), {})
            for w in changed:
                for term in w.terms:
                    counts[term] = counts.get(term, 0) + 1
        await count(conn, deltas)
    return len(rows)
