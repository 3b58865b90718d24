"""KNN SQL over dw_message_embeddings: exact dense, sparse and lexical KNN (late
materialization), the opt-in HNSW index per model, and KNN over an org's own HNSW index
(dwsearch.search.knnindex). Every statement filters by org and by model."""

from __future__ import annotations

import functools
import hashlib
import math

from pgvector import HalfVector, SparseVector
from psycopg import AsyncConnection, sql

from dwsearch.retrieval import bm25
from dwsearch.retrieval.store import hnsw as hnsw_ddl
from dwsearch.retrieval.store import nearest
from dwsearch.search.rows import WindowRow
from dwsearch.search.store.scope import WINDOW_COLUMNS, ChatScope, conversation_params, exclusion, window_row


async def dense_knn(
    conn: AsyncConnection,
    scope: ChatScope,
    model: str,
    vector: HalfVector,
    k: int,
    *,
    hnsw: bool = False,
    org_index: bool = False,
    exclude: ChatScope | None = None,
) -> list[WindowRow]:
    """Exact KNN by inner product; stored and query vectors are unit length, so this
    ranks like cosine. Score = inner product. With hnsw=True, the query is shaped for the
    opt-in HNSW index (see create_hnsw_index); Postgres still picks exact search when the
    org is small enough for the btree to win. With org_index=True, for the org's own
    index (dwsearch.search.knnindex; _dense_knn_org_index). `exclude`: a conversation
    whose windows (conversation_windows_filter) are left out (Similar)."""
    if org_index:
        return await _dense_knn_org_index(conn, scope, model, vector, k, exclude)
    if hnsw:
        return await _dense_knn_hnsw(conn, scope, model, vector, k, exclude)
    statement = _knn_sql(scope.shape(), "embedding", exclude is not None)
    cur = await conn.execute(statement, _knn_params(scope, model, vector, k, exclude))
    return [window_row(r) for r in await cur.fetchall()]


def _knn_params(
    scope: ChatScope, model: str, vector: HalfVector | SparseVector, k: int, exclude: ChatScope | None
) -> dict[str, object]:
    params = {**scope.params(), "model": model, "vector": vector, "k": k}
    return params if exclude is None else {**params, **conversation_params(exclude)}


@functools.lru_cache(maxsize=128)
def _knn_sql(shape: ChatScope, vector_column: str, exclude: bool = False, by_term: bool = False) -> bytes:
    """Dense ("embedding": inner product), sparse or lexical ("sparse", "lexical": positive
    overlaps only) KNN. `by_term` (lexical): only the windows holding a query term, found
    through migration 0019's index (parameter `terms`), rather than a scan of the org's."""
    vector = sql.Placeholder("vector")
    if vector_column == "embedding":
        statement = _nearest(
            shape,
            nearest.similarity(sql.Identifier("embedding"), vector),
            vector_column="embedding",
            exclude=exclude,
        )
    else:  # "sparse" or "lexical"
        statement = _nearest(
            shape,
            nearest.similarity(sql.Identifier(vector_column), vector),
            vector_column=vector_column,
            min_score=0,
            exclude=exclude,
            # The lexical leg reads the weights' narrow projection (migration 0016).
            table="dw_lexical_windows" if vector_column == "lexical" else "dw_message_embeddings",
            prefilter=_SHARES_A_TERM if by_term else _NO_CONDITION,
        )
    return statement.as_bytes(None)


_NO_CONDITION = sql.SQL("")
# A projection's terms, each qualified by its org: the function migration 0019's GIN index
# is on (costly, declared so: the planner asks the index rather than computing it per row).
_TERM_KEYS = sql.SQL("dw_lexical_term_keys(org_id, lexical)")
# The windows holding one of the query's terms (`terms`: a sparsevec's 1-based indices),
# through that index.
_SHARES_A_TERM = sql.SQL(
    " AND {keys} && (SELECT array_agg(hashtext(%(org)s) || ':' || t) FROM unnest(%(terms)s::int4[]) AS t)"
).format(keys=_TERM_KEYS)


def _nearest(
    scope: ChatScope,
    score: sql.Composable,
    *,
    vector_column: str,
    min_score: float | None = None,
    exclude: bool = False,
    table: str = "dw_message_embeddings",
    prefilter: sql.Composable = _NO_CONDITION,
) -> sql.Composed:
    """The k windows of highest `score` (parameters: the scope's, `model`, `vector`, `k`,
    and with `exclude` conversation_params': that conversation's windows are left out),
    ranked in `table`: dw_message_embeddings, or a projection of it with the scope's
    columns and `vector_column` (dw_lexical_windows). `prefilter`: more conditions on the
    scanned rows (" AND ..."), implied by a score above `min_score`. Late materialization
    (nearest.ranked_late): the winners' columns are read from dw_message_embeddings, in
    the org (one shard on Citus)."""
    return nearest.ranked_late(
        columns=WINDOW_COLUMNS,
        score=score,
        table=table,
        where=sql.SQL("{filters} AND {column} IS NOT NULL{prefilter}{exclusion}").format(
            filters=scope.window_filters(),
            column=sql.Identifier(vector_column),
            prefilter=prefilter,
            exclusion=exclusion(exclude),
        ),
        limit=sql.Placeholder("k"),
        materialize="dw_message_embeddings",
        materialize_where=sql.SQL("dw_message_embeddings.org_id = %(org)s"),
        min_score=min_score,
    )


# Above ~50k windows per org (docs/design.md, "Storage and KNN": HNSW only near
# ~50-100k live vectors), an HNSW index per model trades exactness for speed. pgvector >= 0.8's iterative scan
# keeps scanning the graph until enough rows pass the org filter, so filtered queries do
# not under-return; relaxed order is re-sorted by the outer query.
HNSW_EF_SEARCH = 100
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64


def hnsw_index_name(model: str) -> str:
    return "dw_message_embeddings_hnsw_" + hashlib.sha256(model.encode()).hexdigest()[:12]


async def create_hnsw_index(conn: AsyncConnection, model: str, dimension: int) -> str:
    """Build (if missing) the HNSW index over one model's vectors; return its name.

    CONCURRENTLY, so sweeps and searches go on while it builds (conn must be in
    autocommit). A build that failed or was interrupted leaves an invalid index behind,
    which IF NOT EXISTS would keep: it is dropped and built again."""
    name = hnsw_index_name(model)
    if await hnsw_ddl.valid(conn, name) is False:
        await hnsw_ddl.drop(conn, name)
    await conn.execute(
        hnsw_ddl.create_statement(
            name,
            table="dw_message_embeddings",
            column="embedding",
            dimension=dimension,
            where=sql.SQL("model = {}").format(sql.Literal(model)),
            m=HNSW_M,
            ef_construction=HNSW_EF_CONSTRUCTION,
        )
    )
    return name


async def _dense_knn_hnsw(
    conn: AsyncConnection, scope: ChatScope, model: str, vector: HalfVector, k: int, exclude: ChatScope | None
) -> list[WindowRow]:
    statement = nearest.hnsw_ranked(
        columns=WINDOW_COLUMNS,
        column="embedding",
        dimension=vector.dimensions(),
        query=sql.Placeholder("vector"),
        table="dw_message_embeddings",
        where=sql.SQL("{}{}").format(scope.window_filters(), exclusion(exclude is not None)),
        limit=sql.Placeholder("k"),
    )
    async with conn.transaction():
        await conn.execute(nearest.hnsw_settings(HNSW_EF_SEARCH))
        cur = await conn.execute(statement, _knn_params(scope, model, vector, k, exclude))
        return [window_row(r) for r in await cur.fetchall()]


# An org's own index (dwsearch.search.knnindex, built with m = 16, ef_construction = 128):
# ef_search 200 measured recall@10 >= 0.98 on 50k 1024-d windows even with weak topics
# (1.0 with clear ones) at 1.5-3 ms p50; 100 gave 0.977 on the weak ones.
ORG_HNSW_EF_SEARCH = 200


def org_index_statement(scope: ChatScope, model: str, dimension: int, exclude: bool = False) -> sql.Composed:
    """KNN over an org's own partial HNSW index (knnindex.build_org_index: `WHERE model =
    <model> AND org_id = <org>`). The org and the model are SQL literals here, besides
    the scope's parameters: only a predicate on constants proves the index's, and with
    `org_id = $1` a generic plan (psycopg prepares a statement it has run five times)
    could never use a partial index. The other filters and `exclude` are the exact
    statement's parameters (_knn_params). Relaxed order, re-sorted by the outer query."""
    return nearest.hnsw_ranked(
        columns=WINDOW_COLUMNS,
        column="embedding",
        dimension=dimension,
        query=sql.Placeholder("vector"),
        table="dw_message_embeddings",
        where=sql.SQL("org_id = {org} AND model = {model} AND {filters}{exclusion}").format(
            org=sql.Literal(scope.org_id),
            model=sql.Literal(model),
            filters=scope.window_filters(),
            exclusion=exclusion(exclude),
        ),
        limit=sql.Placeholder("k"),
        tie_on_id=True,
    )


async def _dense_knn_org_index(
    conn: AsyncConnection, scope: ChatScope, model: str, vector: HalfVector, k: int, exclude: ChatScope | None
) -> list[WindowRow]:
    """Without the index (dropped since search last read dw_knn_indexes), the same
    statement is an exact scan over the (org_id, model) btree: slower, never wrong."""
    statement = org_index_statement(scope, model, vector.dimensions(), exclude is not None)
    async with conn.transaction():
        await conn.execute(nearest.hnsw_settings(ORG_HNSW_EF_SEARCH))
        cur = await conn.execute(statement, _knn_params(scope, model, vector, k, exclude))
        return [window_row(r) for r in await cur.fetchall()]


async def sparse_knn(
    conn: AsyncConnection,
    scope: ChatScope,
    model: str,
    vector: SparseVector,
    k: int,
    *,
    exclude: ChatScope | None = None,
) -> list[WindowRow]:
    """Windows by lexical-weight inner product (bge-m3 sparse); only positive overlaps.
    `exclude`: as dense_knn's."""
    statement = _knn_sql(scope.shape(), "sparse", exclude is not None)
    cur = await conn.execute(statement, _knn_params(scope, model, vector, k, exclude))
    return [window_row(r) for r in await cur.fetchall()]


# A query's terms read for their IDF at most (a pasted paragraph is a long query): the
# first ones in the text.
LEXICAL_QUERY_TERMS = 64
# The lexical leg reads the windows holding its terms through their index when those are at
# most 1/BY_TERM_SHARE of the org's (by the counts: the sum of the terms' window counts),
# and scans the org's windows otherwise. (See docs/design.md, "The lexical leg".)
BY_TERM_SHARE = 2


async def lexical_knn(
    conn: AsyncConnection,
    scope: ChatScope,
    model: str,
    text: str,
    k: int,
    *,
    exclude: ChatScope | None = None,
) -> list[WindowRow]:
    """Windows of `model` by BM25 (dwsearch.retrieval.bm25): each window's saturated term
    frequencies, written by the sweep (scanned in their projection, dw_lexical_windows), against the query's terms weighted by their IDF
    among the org's windows (dw_lexical_terms, one index probe per term); only windows
    sharing a term. No terms, or none in any window: no rows, and no scan.

    A score is BM25 as a fraction of the query's IDF mass (every query term's IDF, the
    terms no window has included): a window holding each term once at the average length
    scores about 1, one matching a single common term of a long query near 0. Fusion
    takes it as it is (FusionLeg.absolute): a Chinese query whose answer is in English
    shares a stray bigram or two with some window, and that must not count as a match."""
    # Simplified and Traditional Chinese folded to one form, as the sweep weighs windows
    # (dwsearch.sweep.store.lexical.window_lexical): 频道 finds 頻道 and the reverse.
    tokens = bm25.tokens(text, fold=True)
    terms = list(dict.fromkeys(bm25.term_id(token) for token in tokens))[:LEXICAL_QUERY_TERMS]
    if not terms:
        return []
    cur = await conn.execute(
        """SELECT term, windows FROM dw_lexical_terms
           WHERE org_id = %s AND model = %s AND term = ANY(%s::bigint[])""",
        (scope.org_id, model, [bm25.TOTAL_TERM, *terms]),
    )
    # Counts are exact (dwsearch.sweep.store.lexical); clamped all the same, so that no
    # count a repair left behind can take a logarithm out of its domain.
    frequencies = {int(term): max(0, int(windows)) for term, windows in await cur.fetchall()}
    total = max(frequencies.pop(bm25.TOTAL_TERM, 0), *frequencies.values(), 0)
    if not any(frequencies.values()):
        return []
    mass = math.fsum(bm25.idf(total, frequencies.get(term, 0)) for term in terms)
    if mass <= 0:
        return []
    weights = {term: bm25.idf(total, n) / mass for term, n in frequencies.items() if n > 0}
    # Where the query's terms are in few of the org's windows (at most the sum of their
    # counts), those windows are read through the index of the org's terms; else the org's
    # windows are scanned. The same windows score above 0 either way.
    by_term = sum(frequencies.values()) * BY_TERM_SHARE <= total
    statement = _knn_sql(scope.shape(), "lexical", exclude is not None, by_term)
    vector = SparseVector(weights, bm25.DIMENSION)
    params = _knn_params(scope, model, vector, k, exclude)
    if by_term:
        params["terms"] = [term + 1 for term in weights]  # a sparsevec's 1-based indices
    cur = await conn.execute(statement, params)
    return [window_row(r) for r in await cur.fetchall()]
