"""Full-text SQL over dw_chat_events (the Go module's search_tsv): matches in recency or rank
order under two plans, the matches with the embedded windows holding them, the org's
event count and lexeme statistics (ftsplan), and an org's recent words (typo tolerance)."""

from __future__ import annotations

import functools
import json

from psycopg import AsyncConnection, sql

from dwsearch.db.distributed import is_distributed
from dwsearch.db.events import ELIGIBLE_EVENTS
from dwsearch.search.rows import MessageRow, WindowRow
from dwsearch.search.store.scope import WINDOW_COLUMNS_QUALIFIED, ChatScope

# Order of the digitalworker module's history search today (recency), kept for FTS mode
# so that it returns exactly what the Go module returns; hybrid mode ranks FTS matches
# by cover density instead, a better relevance signal for fusion.
FTS_ORDER_RECENT = sql.SQL("created_at DESC, id DESC")
FTS_ORDER_RANK = sql.SQL("score DESC, created_at DESC, id DESC")


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


_LEXEME_STATS = sql.SQL(
    """SELECT s.most_common_elems::text::text[], s.most_common_elem_freqs, c.reltuples
       FROM pg_class AS c
       JOIN pg_namespace AS n ON n.oid = c.relnamespace
       JOIN pg_stats AS s ON s.schemaname = n.nspname AND s.tablename = c.relname
       WHERE c.oid = {table}::regclass AND s.attname = 'search_tsv'"""
)


async def _shard_lexeme_stats(conn: AsyncConnection) -> tuple[dict[str, float], float] | None:
    """lexeme_stats on a Citus cluster, where ANALYZE keeps the statistics on the workers,
    one set per shard: each shard's read there (run_command_on_shards), a lexeme's
    frequency their row-weighted mean (0 in a shard that does not list it), the rows
    their sum."""
    on_shard = sql.SQL("SELECT json_build_array(e, f, r) FROM ({stats}) AS x (e, f, r)").format(
        stats=_LEXEME_STATS.format(table=sql.SQL("'%s'"))
    )
    cur = await conn.execute(
        "SELECT result FROM run_command_on_shards('dw_chat_events'::regclass, %s) WHERE success AND result <> ''",
        (on_shard.as_string(conn),),
    )
    shards = [json.loads(result) for (result,) in await cur.fetchall()]
    shards = [(lexemes, freqs, rows) for lexemes, freqs, rows in shards if lexemes and rows > 0]
    if not shards:
        return None
    total = float(sum(rows for _, _, rows in shards))
    weighted: dict[str, float] = {}
    for lexemes, freqs, rows in shards:
        for lexeme, freq in zip(lexemes, freqs[: len(lexemes)], strict=True):
            weighted[lexeme] = weighted.get(lexeme, 0.0) + freq * rows
    return {lexeme: share / total for lexeme, share in weighted.items()}, total


async def lexeme_stats(conn: AsyncConnection) -> tuple[dict[str, float], float] | None:
    """search_tsv's most common lexemes with their frequencies (share of rows), and the
    table's estimated rows, from the statistics ANALYZE keeps (for the dw_chat_events the
    search path resolves to); None when the column has none yet."""
    if await is_distributed(conn):
        return await _shard_lexeme_stats(conn)
    cur = await conn.execute(_LEXEME_STATS.format(table=sql.Literal("dw_chat_events")))
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
        columns=WINDOW_COLUMNS_QUALIFIED,
        window_filters=scope.window_filters(table="dw_message_embeddings"),
    )


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
