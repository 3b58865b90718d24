"""SQL for search: full-text search over dw_chat_events and exact KNN over
dw_message_embeddings, and Similar's conversations (a window, a message and the windows
holding it, a channel's messages and windows over a time span). Every statement filters
by org; KNN also by the active model.
Parameterized throughout; optional filters are fixed fragments chosen by which
parameters are present, never text from the request."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgvector import HalfVector, SparseVector
from psycopg import AsyncConnection, sql

from dwsearch.db.events import ELIGIBLE_EVENTS, eligible
from dwsearch.search.fusion import MessageRow, WindowRow

# Order of the digitalworker module's history search today (recency), kept for FTS mode
# so that it returns exactly what the Go module returns; hybrid mode ranks FTS matches
# by cover density instead, a better relevance signal for fusion.
FTS_ORDER_RECENT = sql.SQL("created_at DESC, id DESC")
FTS_ORDER_RANK = sql.SQL("score DESC, created_at DESC, id DESC")

_WINDOW_COLUMNS = sql.SQL(
    "id::text, provider, external_channel_id, window_start, window_end, content, source_message_ids"
)
_WINDOW_COLUMNS_QUALIFIED = sql.SQL(
    "dw_message_embeddings.id::text, dw_message_embeddings.provider, dw_message_embeddings.external_channel_id,"
    " window_start, window_end, content, dw_message_embeddings.source_message_ids"
)


@dataclass(frozen=True)
class ChatScope:
    """What every chat query is limited to: one org's eligible events and embedded windows,
    narrowed by provider, channel and time. (The Index's NamespaceScope is a namespace in
    one model's vector space; rpcpolicy.Scope is what a bearer token may call.)"""

    org_id: str
    provider: str = ""
    external_channel_id: str = ""
    start: datetime | None = None
    end: datetime | None = None

    def shape(self) -> ChatScope:
        """A stand-in with the same optional filters present, and no values: the text of
        every statement depends on this alone, so statements are built once per shape
        (_knn_sql, _full_text_sql, _full_text_with_windows_sql), not on every search."""
        return ChatScope(
            "",
            "-" if self.provider else "",
            "-" if self.external_channel_id else "",
            _SHAPE_TIME if self.start is not None else None,
            _SHAPE_TIME if self.end is not None else None,
        )

    def params(self) -> dict[str, object]:
        return {
            "org": self.org_id,
            "provider": self.provider,
            "channel": self.external_channel_id,
            "start": self.start,
            "end": self.end,
        }

    def event_filters(self) -> sql.Composable:
        parts = [sql.SQL("org_id = %(org)s"), ELIGIBLE_EVENTS]
        if self.provider:
            parts.append(sql.SQL("provider = %(provider)s"))
        if self.external_channel_id:
            parts.append(sql.SQL("external_channel_id = %(channel)s"))
        if self.start is not None:
            parts.append(sql.SQL("created_at >= %(start)s"))
        if self.end is not None:
            parts.append(sql.SQL("created_at <= %(end)s"))
        return sql.SQL(" AND ").join(parts)

    def window_filters(self, table: str = "") -> sql.Composable:
        """A window matches a time range when it overlaps it."""
        prefix = sql.SQL("{}.").format(sql.Identifier(table)) if table else sql.SQL("")
        conditions = [("org_id", "=", "org"), ("model", "=", "model")]
        if self.provider:
            conditions.append(("provider", "=", "provider"))
        if self.external_channel_id:
            conditions.append(("external_channel_id", "=", "channel"))
        if self.start is not None:
            conditions.append(("window_end", ">=", "start"))
        if self.end is not None:
            conditions.append(("window_start", "<=", "end"))
        return sql.SQL(" AND ").join(
            sql.SQL("{}{} {} {}").format(prefix, sql.Identifier(column), sql.SQL(op), sql.Placeholder(param))
            for column, op, param in conditions
        )


_SHAPE_TIME = datetime(2000, 1, 1)


def _window(row: tuple[Any, ...]) -> WindowRow:
    return WindowRow(
        id=row[0],
        provider=row[1],
        external_channel_id=row[2],
        window_start=row[3],
        window_end=row[4],
        content=row[5],
        source_message_ids=tuple(row[6]),
        score=float(row[7]) if len(row) > 7 else 0.0,
    )


# The full-text statements' FROM item that defines the tsquery `q`.
PLAIN_TSQUERY = sql.SQL("plainto_tsquery('simple', %(query)s) AS q")


def alternatives_tsquery(alternatives: list[tuple[str, ...]]) -> sql.Composable:
    """A FROM item defining the tsquery `q` that matches every group, a group by any of
    its words (typo tolerance): (w1 | w1') & w2 & ... . Each word goes through plainto_tsquery as a literal, so no
    request text becomes tsquery syntax."""
    groups = [
        sql.SQL("({})").format(
            sql.SQL(" || ").join(
                sql.SQL("plainto_tsquery('simple', {})").format(sql.Literal(w)) for w in group
            )
        )
        for group in alternatives
    ]
    return sql.SQL("(SELECT {} AS q) AS widened").format(sql.SQL(" && ").join(groups))


async def full_text(
    conn: AsyncConnection,
    scope: ChatScope,
    query: str,
    limit: int,
    *,
    recent_first: bool,
    org_first: bool = False,
    alternatives: list[tuple[str, ...]] | None = None,
) -> list[MessageRow]:
    """Eligible messages matching plainto_tsquery('simple', query), or with
    `alternatives`, alternatives_tsquery(alternatives)."""
    statement = (
        _full_text_sql(scope.shape(), recent_first, org_first)
        if alternatives is None
        else full_text_statement(
            scope, recent_first=recent_first, org_first=org_first, tsquery=alternatives_tsquery(alternatives)
        )
    )
    cur = await conn.execute(statement, {**scope.params(), "query": query, "limit": limit})
    return [MessageRow(r[0], r[1], r[2], r[3], r[4], float(r[5])) for r in await cur.fetchall()]


@functools.lru_cache(maxsize=128)
def _full_text_sql(shape: ChatScope, recent_first: bool, org_first: bool) -> bytes:
    return full_text_statement(shape, recent_first=recent_first, org_first=org_first).as_bytes(None)


def full_text_statement(
    scope: ChatScope, *, recent_first: bool, org_first: bool, tsquery: sql.Composable = PLAIN_TSQUERY
) -> sql.Composed:
    """The full-text query (parameters: the scope's, `query`, `limit`).

    Two plans, the same rows. By default Postgres is free to start from the Go module's
    GIN index on search_tsv, which holds every org's postings: its cost grows with the
    whole table. With `org_first` the org's own rows are read through the scope index
    (org_id, provider, channel, created_at, id) and the query is matched on each, a cost
    that grows with the org alone — much cheaper for the many orgs that are small next
    to the table. The match is then written as ts_match_vq(), the function behind the
    tsvector @@ tsquery operator: the same test, but not one the planner can answer
    from the GIN index."""
    match = sql.SQL("ts_match_vq(search_tsv, q)" if org_first else "search_tsv @@ q")
    return sql.SQL(
        """SELECT id::text, provider, external_channel_id, created_at, message_text,
                  ts_rank_cd(search_tsv, q) AS score
           FROM dw_chat_events, {tsquery}
           WHERE {filters} AND {match}
           ORDER BY {order} LIMIT %(limit)s"""
    ).format(
        tsquery=tsquery,
        filters=scope.event_filters(),
        match=match,
        order=FTS_ORDER_RECENT if recent_first else FTS_ORDER_RANK,
    )


async def org_events_at_most(conn: AsyncConnection, org_id: str, cap: int) -> int:
    """The org's event count, counted no further than `cap` + 1: an index-only scan of at
    most that many entries, whatever the org's size."""
    cur = await conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM dw_chat_events WHERE org_id = %(org)s LIMIT %(cap)s) AS s",
        {"org": org_id, "cap": cap + 1},
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def lexeme_stats(conn: AsyncConnection) -> tuple[dict[str, float], float] | None:
    """search_tsv's most common lexemes with their frequencies (share of rows), and the
    table's estimated rows, from the statistics ANALYZE keeps (for the dw_chat_events the
    search path resolves to); None when the column has none yet."""
    cur = await conn.execute(
        """SELECT s.most_common_elems::text::text[], s.most_common_elem_freqs, c.reltuples
           FROM pg_class AS c
           JOIN pg_namespace AS n ON n.oid = c.relnamespace
           JOIN pg_stats AS s ON s.schemaname = n.nspname AND s.tablename = c.relname
           WHERE c.oid = 'dw_chat_events'::regclass AND s.attname = 'search_tsv'"""
    )
    row = await cur.fetchone()
    if row is None or not row[0] or row[2] <= 0:
        return None
    lexemes, freqs, rows = row
    # The frequencies list holds one per lexeme, then the smallest and the largest.
    return dict(zip(lexemes, freqs[: len(lexemes)], strict=True)), float(rows)


async def full_text_with_windows(
    conn: AsyncConnection,
    scope: ChatScope,
    query: str,
    model: str,
    limit: int,
    *,
    org_first: bool = False,
    alternatives: list[tuple[str, ...]] | None = None,
) -> tuple[list[MessageRow], list[WindowRow]]:
    """Hybrid search's full-text leg in one round trip: the `limit` best-ranked matches
    (full_text, rank order) and the model's embedded windows that contain any of them,
    each window once, found through the sweep's ledger (event -> window)."""
    statement = (
        _full_text_with_windows_sql(scope.shape(), org_first)
        if alternatives is None
        else full_text_with_windows_statement(
            scope, org_first=org_first, tsquery=alternatives_tsquery(alternatives)
        )
    )
    cur = await conn.execute(statement, {**scope.params(), "query": query, "model": model, "limit": limit})
    messages: list[MessageRow] = []
    windows: list[WindowRow] = []
    for r in await cur.fetchall():
        if r[0] == 1:
            messages.append(MessageRow(r[1], r[2], r[3], r[4], r[6], float(r[8])))
        else:
            windows.append(WindowRow(r[1], r[2], r[3], r[4], r[5], r[6], tuple(r[7])))
    return messages, windows


@functools.lru_cache(maxsize=128)
def _full_text_with_windows_sql(shape: ChatScope, org_first: bool) -> bytes:
    return full_text_with_windows_statement(shape, org_first=org_first).as_bytes(None)


def full_text_with_windows_statement(
    scope: ChatScope, *, org_first: bool, tsquery: sql.Composable = PLAIN_TSQUERY
) -> sql.Composed:
    """full_text_statement's matches (rank order), then their windows, as one result:
    part 1 rows are messages (id, provider, channel, created_at, NULL, text, NULL, score),
    part 2 rows windows (id, provider, channel, start, end, content, message ids, 0)."""
    match = sql.SQL("ts_match_vq(search_tsv, q)" if org_first else "search_tsv @@ q")
    return sql.SQL(
        """WITH hits AS MATERIALIZED (
               SELECT id, provider, external_channel_id, created_at, message_text,
                      ts_rank_cd(search_tsv, q) AS score
               FROM dw_chat_events, {tsquery}
               WHERE {filters} AND {match}
               ORDER BY {order} LIMIT %(limit)s
           ), ranked AS (
               SELECT hits.*, row_number() OVER (ORDER BY {order}) AS position FROM hits
           )
           SELECT 1 AS part, id::text, provider, external_channel_id, created_at, NULL::timestamptz,
                  message_text, NULL::text[], score, position
           FROM ranked
           UNION ALL
           SELECT 2, {columns}, 0::real, 0
           FROM (SELECT DISTINCT ledger.window_id FROM hits
                 JOIN dw_sweep_window_events AS ledger
                   ON ledger.org_id = %(org)s AND ledger.model = %(model)s AND ledger.event_id = hits.id
                ) AS found
           JOIN dw_message_embeddings ON dw_message_embeddings.id = found.window_id
           WHERE {window_filters}
           ORDER BY part, position"""
    ).format(
        tsquery=tsquery,
        filters=scope.event_filters(),
        match=match,
        order=FTS_ORDER_RANK,
        columns=_WINDOW_COLUMNS_QUALIFIED,
        window_filters=scope.window_filters(table="dw_message_embeddings"),
    )


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
    return [_window(r) for r in await cur.fetchall()]


def _knn_params(
    scope: ChatScope, model: str, vector: HalfVector | SparseVector, k: int, exclude: ChatScope | None
) -> dict[str, object]:
    params = {**scope.params(), "model": model, "vector": vector, "k": k}
    return params if exclude is None else {**params, **conversation_params(exclude)}


@functools.lru_cache(maxsize=128)
def _knn_sql(shape: ChatScope, vector_column: str, exclude: bool = False) -> bytes:
    """Dense ("embedding": inner product) or sparse ("sparse": positive overlaps only) KNN."""
    if vector_column == "embedding":
        statement = _nearest(
            shape, sql.SQL("-(embedding <#> %(vector)s)"), vector_column="embedding", exclude=exclude
        )
    else:
        statement = _nearest(
            shape, sql.SQL("-(sparse <#> %(vector)s)"), vector_column="sparse", min_score=0, exclude=exclude
        )
    return statement.as_bytes(None)


def _nearest(
    scope: ChatScope,
    score: sql.Composable,
    *,
    vector_column: str,
    min_score: float | None = None,
    exclude: bool = False,
) -> sql.Composed:
    """The k windows of highest `score` (parameters: the scope's, `model`, `vector`, `k`,
    and with `exclude` conversation_params': that conversation's windows are left out).

    Late materialization: the scan ranks (id, score) pairs only, and the other columns
    are fetched for the k winners by primary key. Carrying every scanned row's content
    through the top-k sort cost a fifth of the query (`python -m bench.search`). The
    score is computed once per row; ties break on id so results are stable. With
    `min_score`, winners scoring no more than it are dropped after the top k are chosen:
    the same rows as filtering first, since they rank below every row that passes."""
    condition = (
        sql.SQL("TRUE") if min_score is None else sql.SQL("nearest.score > {}").format(sql.Literal(min_score))
    )
    return sql.SQL(
        """SELECT {columns}, nearest.score
           FROM (SELECT id, {score} AS score FROM dw_message_embeddings
                 WHERE {filters} AND {column} IS NOT NULL{exclusion} ORDER BY score DESC, id LIMIT %(k)s) AS nearest
           JOIN dw_message_embeddings USING (id)
           WHERE dw_message_embeddings.org_id = %(org)s AND {condition}
           ORDER BY nearest.score DESC, nearest.id"""
    ).format(
        columns=_WINDOW_COLUMNS,
        score=score,
        filters=scope.window_filters(),
        column=sql.Identifier(vector_column),
        exclusion=_exclusion(exclude),
        condition=condition,
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
    cur = await conn.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (name,))
    row = await cur.fetchone()
    if row is not None and not row[0]:
        await conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))
    await conn.execute(
        sql.SQL(
            """CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON dw_message_embeddings
               USING hnsw ((embedding::halfvec({dim})) halfvec_ip_ops) WITH (m = {m}, ef_construction = {efc})
               WHERE model = {model}"""
        ).format(
            name=sql.Identifier(name),
            dim=sql.Literal(int(dimension)),
            m=sql.Literal(HNSW_M),
            efc=sql.Literal(HNSW_EF_CONSTRUCTION),
            model=sql.Literal(model),
        )
    )
    return name


async def _dense_knn_hnsw(
    conn: AsyncConnection, scope: ChatScope, model: str, vector: HalfVector, k: int, exclude: ChatScope | None
) -> list[WindowRow]:
    typed = sql.SQL("halfvec({})").format(sql.Literal(len(vector.to_list())))
    statement = sql.SQL(
        """SELECT * FROM (
               SELECT {columns}, -((embedding::{typed}) <#> %(vector)s::{typed}) AS score
               FROM dw_message_embeddings WHERE {filters}{exclusion}
               ORDER BY (embedding::{typed}) <#> %(vector)s::{typed} LIMIT %(k)s
           ) AS nearest ORDER BY score DESC"""
    ).format(
        columns=_WINDOW_COLUMNS,
        filters=scope.window_filters(),
        exclusion=_exclusion(exclude is not None),
        typed=typed,
    )
    async with conn.transaction():
        await conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        await conn.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(sql.Literal(HNSW_EF_SEARCH)))
        cur = await conn.execute(statement, _knn_params(scope, model, vector, k, exclude))
        return [_window(r) for r in await cur.fetchall()]


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
    typed = sql.SQL("halfvec({})").format(sql.Literal(int(dimension)))
    return sql.SQL(
        """SELECT * FROM (
               SELECT {columns}, -((embedding::{typed}) <#> %(vector)s::{typed}) AS score
               FROM dw_message_embeddings WHERE org_id = {org} AND model = {model} AND {filters}{exclusion}
               ORDER BY (embedding::{typed}) <#> %(vector)s::{typed} LIMIT %(k)s
           ) AS nearest ORDER BY score DESC, id"""
    ).format(
        columns=_WINDOW_COLUMNS,
        org=sql.Literal(scope.org_id),
        model=sql.Literal(model),
        filters=scope.window_filters(),
        exclusion=_exclusion(exclude),
        typed=typed,
    )


async def _dense_knn_org_index(
    conn: AsyncConnection, scope: ChatScope, model: str, vector: HalfVector, k: int, exclude: ChatScope | None
) -> list[WindowRow]:
    """Without the index (dropped since search last read dw_knn_indexes), the same
    statement is an exact scan over the (org_id, model) btree: slower, never wrong."""
    statement = org_index_statement(scope, model, vector.dimensions(), exclude is not None)
    async with conn.transaction():
        await conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        await conn.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(sql.Literal(ORG_HNSW_EF_SEARCH)))
        cur = await conn.execute(statement, _knn_params(scope, model, vector, k, exclude))
        return [_window(r) for r in await cur.fetchall()]


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
    return [_window(r) for r in await cur.fetchall()]


@dataclass(frozen=True)
class ContextRow:
    """A message around a hit (SearchRequest.context_messages)."""

    id: str
    created_at: datetime
    text: str


async def context_messages(
    conn: AsyncConnection, org_id: str, bounds: list[tuple[str, str]], n: int
) -> list[tuple[list[ContextRow], list[ContextRow]]]:
    """For each (first message id, last message id) of a hit: up to `n` eligible messages
    before the first and after the last, in the same org, provider and channel, each list
    oldest first. One round trip; every row is filtered by the org, the anchors too (an id
    of another org finds nothing). Uses the scope index (org, provider, channel,
    created_at, id)."""
    if not bounds or n <= 0:
        return [([], []) for _ in bounds]
    cur = await conn.execute(
        sql.SQL(
            """WITH h AS (
                   SELECT * FROM unnest(%(first)s::uuid[], %(last)s::uuid[]) WITH ORDINALITY AS h(first_id, last_id, n)
               )
               SELECT h.n, 0 AS side, b.id::text, b.created_at, b.message_text
               FROM h JOIN dw_chat_events AS f ON f.id = h.first_id AND f.org_id = %(org)s
               CROSS JOIN LATERAL (
                   SELECT id, created_at, message_text FROM dw_chat_events
                   WHERE org_id = %(org)s AND provider = f.provider AND external_channel_id = f.external_channel_id
                     AND {eligible} AND (created_at, id) < (f.created_at, f.id)
                   ORDER BY created_at DESC, id DESC LIMIT %(limit)s
               ) AS b
               UNION ALL
               SELECT h.n, 1, a.id::text, a.created_at, a.message_text
               FROM h JOIN dw_chat_events AS l ON l.id = h.last_id AND l.org_id = %(org)s
               CROSS JOIN LATERAL (
                   SELECT id, created_at, message_text FROM dw_chat_events
                   WHERE org_id = %(org)s AND provider = l.provider AND external_channel_id = l.external_channel_id
                     AND {eligible} AND (created_at, id) > (l.created_at, l.id)
                   ORDER BY created_at, id LIMIT %(limit)s
               ) AS a"""
        ).format(eligible=ELIGIBLE_EVENTS),
        {"org": org_id, "first": [b[0] for b in bounds], "last": [b[1] for b in bounds], "limit": n},
    )
    out: list[tuple[list[ContextRow], list[ContextRow]]] = [([], []) for _ in bounds]
    for index, side, mid, created_at, text in await cur.fetchall():
        out[index - 1][side].append(ContextRow(mid, created_at, text))
    for before, after in out:
        before.sort(key=lambda r: (r.created_at, r.id))
        after.sort(key=lambda r: (r.created_at, r.id))
    return out


async def vocabulary(conn: AsyncConnection, org_id: str, events: int) -> dict[str, int]:
    """The words (search_tsv lexemes) of the org's `events` most recent eligible messages,
    each with the number of those messages holding it (typo tolerance).

    Counted by Postgres' ts_stat, which walks the tsvectors in C: a third of the time of
    unnesting them into rows and grouping those (6 against 12-18 ms for 5,000 messages,
    measured on the bench.search data). This read is on the search's critical path the
    first time an org's query finds nothing. ts_stat takes its query as text, so the org id
    and the limit are quoted into it as literals."""
    recent = sql.SQL(
        "SELECT search_tsv FROM dw_chat_events WHERE org_id = {org} AND {eligible}"
        " ORDER BY created_at DESC LIMIT {events}"
    ).format(org=sql.Literal(org_id), eligible=ELIGIBLE_EVENTS, events=sql.Literal(int(events)))
    cur = await conn.execute("SELECT word, ndoc FROM ts_stat(%(recent)s)", {"recent": recent.as_string(conn)})
    return {word: int(n) for word, n in await cur.fetchall()}


# --- Similar: a conversation, its messages and its windows -------------------------------

# A conversation's windows: its channel's windows that overlap its time span (parameters:
# conversation_params). Similar reads their vectors, and leaves them out of its KNN.
CONVERSATION_WINDOWS = sql.SQL(
    "provider = %(c_provider)s AND external_channel_id = %(c_channel)s"
    " AND window_end >= %(c_start)s AND window_start <= %(c_end)s"
)


def conversation_params(conversation: ChatScope) -> dict[str, object]:
    """CONVERSATION_WINDOWS' parameters: `conversation` names a provider, a channel and
    both ends of its time span."""
    return {
        "c_provider": conversation.provider,
        "c_channel": conversation.external_channel_id,
        "c_start": conversation.start,
        "c_end": conversation.end,
    }


def _exclusion(exclude: bool) -> sql.Composable:
    return sql.SQL(" AND NOT ({})").format(CONVERSATION_WINDOWS) if exclude else sql.SQL("")


async def window_conversation(conn: AsyncConnection, org_id: str, window_id: str) -> ChatScope | None:
    """The org's embedded window `window_id` (a UUID) as a conversation: its channel over
    its time span; None when the org has no such window."""
    cur = await conn.execute(
        """SELECT provider, external_channel_id, window_start, window_end FROM dw_message_embeddings
           WHERE id = %(window)s::uuid AND org_id = %(org)s""",
        {"window": window_id, "org": org_id},
    )
    row = await cur.fetchone()
    return None if row is None else ChatScope(org_id, row[0], row[1], row[2], row[3])


@dataclass(frozen=True)
class MessageAnchor:
    """An eligible message Similar starts from, and the time span of the finished windows
    (of the given models, any status) that hold it; None when none does yet."""

    message: ContextRow
    provider: str
    external_channel_id: str
    windows_start: datetime | None
    windows_end: datetime | None


async def message_anchor(
    conn: AsyncConnection, org_id: str, message_id: str, models: Sequence[str]
) -> MessageAnchor | None:
    """The org's eligible message `message_id` (a UUID) and the span of `models`' windows
    holding it, through the sweep's ledger; None when the org has no such message."""
    cur = await conn.execute(
        sql.SQL(
            """SELECT e.id::text, e.created_at, e.message_text, e.provider, e.external_channel_id,
                      min(w.window_start), max(w.window_end)
               FROM dw_chat_events AS e
               LEFT JOIN dw_sweep_window_events AS ledger
                      ON ledger.org_id = e.org_id AND ledger.event_id = e.id AND ledger.model = ANY(%(models)s)
               LEFT JOIN dw_sweep_windows AS w ON w.id = ledger.window_id AND w.org_id = e.org_id
               WHERE e.id = %(message)s::uuid AND e.org_id = %(org)s AND {eligible}
               GROUP BY e.id, e.created_at, e.message_text, e.provider, e.external_channel_id"""
        ).format(eligible=eligible("e")),
        {"message": message_id, "org": org_id, "models": list(models)},
    )
    row = await cur.fetchone()
    if row is None:
        return None
    return MessageAnchor(ContextRow(row[0], row[1], row[2]), row[3], row[4], row[5], row[6])


async def conversation_windows(
    conn: AsyncConnection, conversation: ChatScope, models: Sequence[str]
) -> dict[str, list[tuple[HalfVector, SparseVector | None]]]:
    """Each of `models`' embedded windows of the conversation (CONVERSATION_WINDOWS in its
    org): their dense and sparse vectors, by model; a model with none is absent."""
    cur = await conn.execute(
        sql.SQL(
            """SELECT model, embedding, sparse FROM dw_message_embeddings
               WHERE org_id = %(org)s AND model = ANY(%(models)s) AND {windows}
               ORDER BY window_start, id"""
        ).format(windows=CONVERSATION_WINDOWS),
        {"org": conversation.org_id, "models": list(models), **conversation_params(conversation)},
    )
    found: dict[str, list[tuple[HalfVector, SparseVector | None]]] = {}
    for model, dense, sparse in await cur.fetchall():
        found.setdefault(model, []).append((dense, sparse))
    return found


async def conversation_messages(
    conn: AsyncConnection, conversation: ChatScope, limit: int
) -> list[ContextRow]:
    """The conversation's `limit` latest eligible messages (its org, provider and channel
    within its time range), oldest first."""
    cur = await conn.execute(
        sql.SQL(
            """SELECT id::text, created_at, message_text FROM dw_chat_events
               WHERE {filters} ORDER BY created_at DESC, id DESC LIMIT %(limit)s"""
        ).format(filters=conversation.event_filters()),
        {**conversation.params(), "limit": limit},
    )
    return [ContextRow(*row) for row in reversed(await cur.fetchall())]
