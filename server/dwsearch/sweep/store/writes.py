"""What a sweep writes: finished windows (embedded, skipped or poison) with their
embedding rows and ledger, watermark advances and failures, all under the key's lock
(dwsearch.sweep.store.keys); and RetryPoison's release of poison windows."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID, uuid4

import numpy as np
from pgvector import HalfVector, SparseVector
from psycopg import AsyncConnection, sql

from dwsearch.sweep.keyplan import Position
from dwsearch.sweep.store import lexical as lexical_store
from dwsearch.sweep.store.keys import ELIGIBLE, Key, key_params, lock_org
from dwsearch.sweep.window import Window

# A finished window's status (dw_sweep_windows.status).
EMBEDDED = "embedded"
SKIPPED = "skipped"
POISON = "poison"


class WriteConflict(Exception):
    """The key changed under the sweep (its watermark moved, or a purge cut the window);
    nothing was written and the next sweep re-plans."""


@dataclass(frozen=True)
class Vectors:
    dense: np.ndarray
    sparse: dict[int, float] | None


# An upsert's DO UPDATE takes its times from the row it tried to insert (excluded.*), not
# from now(): Citus refuses a function that is not IMMUTABLE there (on one node it is the
# same value, the transaction's start).

# Windows are a regenerable cache of dw_chat_events: a crash may lose the last few
# commits — each a window together with its watermark advance, so the next sweep redoes
# them — but never leaves the two inconsistent. Not waiting for the WAL flush per window
# makes a backfill several times faster. Purge keeps synchronous commits.
_ASYNC_COMMIT = "SET LOCAL synchronous_commit = off"

# The windows a finished window replaces, as lexical.delete_windows' `removed` (their org's).
_REPLACED = sql.SQL("e.org_id = %(org)s AND e.id = ANY(%(replaces)s::uuid[])")

_UPSERT_WATERMARK = """
INSERT INTO dw_sweep_watermarks AS w (org_id, provider, external_channel_id, model, last_event_time, last_event_id,
                                      updated_at)
VALUES (%(org)s, %(provider)s, %(channel)s, %(model)s, %(time)s, %(event_id)s::uuid, now())
ON CONFLICT (org_id, provider, external_channel_id, model) DO UPDATE
SET last_event_time = excluded.last_event_time, last_event_id = excluded.last_event_id,
    consecutive_failures = 0, last_error = NULL, updated_at = excluded.updated_at
WHERE (w.last_event_time, w.last_event_id) IS NOT DISTINCT FROM (%(expected_time)s::timestamptz, %(expected_id)s::uuid)
RETURNING 1"""


def _watermark_params(
    key: Key, model: str, expected: Position | None, position: Position | None
) -> dict[str, object]:
    return {
        **key_params(key, model),
        "time": position.created_at if position else None,
        "event_id": position.id if position else None,
        "expected_time": expected.created_at if expected else None,
        "expected_id": expected.id if expected else None,
    }


async def finish_window(
    conn: AsyncConnection,
    *,
    key: Key,
    model: str,
    expected: Position | None,
    window: Window,
    status: str,
    replaces: tuple[str, ...] = (),
    vectors: Vectors | None = None,
    sparse_dimension: int = 0,
    error: str | None = None,
    attempts: int = 0,
) -> str:
    """Record a finished window, its embedding row (when embedded), the events it covers
    and the watermark advance past it, deleting the windows it replaces — all in one
    transaction. Raises WriteConflict (nothing written) when the watermark is no longer
    `expected`, the org's retention cutoff now falls after the window's start, or one of
    its events was deleted, edited or made ineligible since it was read."""
    window_id = str(uuid4())
    last = window.messages[-1]
    params = {
        **_watermark_params(key, model, expected, Position(last.created_at, last.id)),
        "id": window_id,
        "status": status,
        "start": window.start,
        "end": window.end,
        "ids": list(window.ids),
        "digests": [m.digest or None for m in window.messages],
        "replaces": list(replaces),
        "error": error,
        "attempts": attempts,
    }
    lexical, terms = lexical_store.window_lexical(window.text) if vectors is not None else (None, [])
    async with conn.transaction(), conn.pipeline():
        await conn.execute(_ASYNC_COMMIT)
        await lock_org(conn, key.org_id, exclusive=False)
        # The replaced windows' embeddings deleted and uncounted, this window's terms counted.
        counts = lexical_store.added(key.org_id, model, terms) if terms else {}
        if replaces:
            await lexical_store.delete_windows(conn, _REPLACED, params, added=counts)
        else:
            await lexical_store.count(conn, counts)
        if replaces:
            await conn.execute(
                "DELETE FROM dw_sweep_windows WHERE org_id = %(org)s AND id = ANY(%(replaces)s::uuid[])",
                params,
            )
        inserted = await conn.execute(
            sql.SQL(
                """INSERT INTO dw_sweep_windows (id, org_id, provider, external_channel_id, model, status,
                                              window_start, window_end, source_message_ids, error, attempts)
               SELECT %(id)s::uuid, %(org)s::varchar, %(provider)s::varchar, %(channel)s::varchar,
                      %(model)s::varchar, %(status)s::varchar, %(start)s::timestamptz, %(end)s::timestamptz,
                      %(ids)s::uuid[], %(error)s::text, %(attempts)s::integer
               WHERE NOT EXISTS (SELECT 1 FROM dw_sweep_retention WHERE org_id = %(org)s AND cutoff > %(start)s)
                 AND (SELECT count(*)
                      FROM unnest(%(ids)s::uuid[], %(digests)s::uuid[]) AS u (event_id, text_md5)
                      JOIN dw_chat_events AS e ON e.org_id = %(org)s::varchar AND e.id = u.event_id
                      WHERE {eligible} AND (u.text_md5 IS NULL OR u.text_md5 = md5(e.message_text)::uuid)
                     ) = cardinality(%(ids)s::uuid[])
               RETURNING 1"""
            ).format(eligible=ELIGIBLE),
            params,
        )
        await conn.execute(
            """INSERT INTO dw_sweep_window_events (org_id, model, event_id, window_id, text_md5)
               SELECT %(org)s::varchar, %(model)s, event_id, %(id)s, text_md5
               FROM unnest(%(ids)s::uuid[], %(digests)s::uuid[]) AS u (event_id, text_md5)
               -- The window's start too: whichever index the planner takes (the primary
               -- key, or (org_id, window_start) when statistics predate a backfill) finds
               -- it in one probe, not by reading the org's every window
               -- (`python -m bench.sweep`: 445 -> 575 windows/s).
               WHERE EXISTS (SELECT 1 FROM dw_sweep_windows
                             WHERE org_id = %(org)s::varchar AND window_start = %(start)s::timestamptz
                               AND id = %(id)s)""",  # else WriteConflict, below
            params,
        )
        if vectors is not None:
            sparse = SparseVector(vectors.sparse, sparse_dimension) if vectors.sparse else None
            await conn.execute(
                # The weights with the term extraction that made them (lexical_terms,
                # migration 0021): a window written by a sweep of a release before has an
                # older one, or none, and the backfill weighs it again.
                """INSERT INTO dw_message_embeddings (id, org_id, model, provider, external_channel_id,
                       window_start, window_end, embedding, sparse, lexical, lexical_terms, content,
                       source_message_ids)
                   VALUES (%(id)s, %(org)s, %(model)s, %(provider)s, %(channel)s, %(start)s, %(end)s,
                           %(dense)s, %(sparse)s, %(lexical)s, %(lexical_terms)s, %(content)s, %(ids)s::text[])""",
                {
                    **params,
                    "dense": HalfVector(vectors.dense),
                    "sparse": sparse,
                    "lexical": lexical,
                    "lexical_terms": lexical_store.LEXICAL_TERMS,
                    "content": window.text,
                },
            )
            await lexical_store.project(conn, key.org_id, [window_id])
        advanced = await conn.execute(_UPSERT_WATERMARK, params)
        if await inserted.fetchone() is None:
            raise WriteConflict(
                "the window's events changed under the sweep (a retention purge, a deletion or an edit)"
            )
        if await advanced.fetchone() is None:
            raise WriteConflict("the watermark moved under the sweep")
    return window_id


async def advance(
    conn: AsyncConnection, key: Key, model: str, *, expected: Position | None, position: Position | None
) -> None:
    """Move the watermark without writing a window."""
    async with conn.transaction():
        cur = await conn.execute(_UPSERT_WATERMARK, _watermark_params(key, model, expected, position))
        if await cur.fetchone() is None:
            raise WriteConflict("the watermark moved under the sweep")


async def record_failure(conn: AsyncConnection, key: Key, model: str, error: str, *, counts: bool) -> int:
    """Note a failure on the key's next window; `counts` adds it to the run of failures
    that ends in poison. Returns that run's length."""
    cur = await conn.execute(
        """INSERT INTO dw_sweep_watermarks AS w (org_id, provider, external_channel_id, model,
                                                 consecutive_failures, last_error, updated_at)
           VALUES (%(org)s, %(provider)s, %(channel)s, %(model)s, %(step)s, %(error)s, now())
           ON CONFLICT (org_id, provider, external_channel_id, model) DO UPDATE
           SET consecutive_failures = w.consecutive_failures + %(step)s, last_error = excluded.last_error,
               updated_at = excluded.updated_at
           RETURNING consecutive_failures""",
        {**key_params(key, model), "error": error, "step": 1 if counts else 0},
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def release_poison(conn: AsyncConnection, org_id: str = "", ids: list[UUID] | None = None) -> int:
    """Delete poison windows so their events are uncovered and swept again."""
    filters = [sql.SQL("status = %(poison)s")]
    if org_id:
        filters.append(sql.SQL("org_id = %(org)s"))
    if ids:
        filters.append(sql.SQL("id = ANY(%(ids)s)"))
    query = sql.SQL("DELETE FROM dw_sweep_windows WHERE {}").format(sql.SQL(" AND ").join(filters))
    cur = await conn.execute(query, {"poison": POISON, "org": org_id, "ids": ids or []})
    return cur.rowcount
