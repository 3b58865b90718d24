"""SQL of the sweep: reads of the Go-owned dw_chat_events, and the sweep state tables
(migration 0002) plus dw_message_embeddings rows it writes. Parameterized throughout.

Locks (two-key advisory locks, a namespace apart from the migration lock):
- KEY_LOCK: one per (org, provider, channel, model), held at session level by the
  connection that sweeps the key; a concurrent sweeper that cannot take it leaves the key.
  Behind pgbouncer in transaction mode (dwsearch.db.pool.transaction_pooled) it is a
  lease row in dw_sweep_key_leases instead, held by the connection for KEY_LEASE and
  deleted when the key is done (a crashed sweeper's lease expires).
- RETENTION_LOCK: one per org; window writes take it shared, Purge and Forget exclusive,
  so a window of events older than a cutoff can never commit after the Purge that set it,
  nor one of a message deleted or edited before a Forget naming it after that Forget.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID, uuid4

import numpy as np
from pgvector import HalfVector, SparseVector
from psycopg import AsyncConnection, sql

from dwsearch.db.pool import transaction_pooled
from dwsearch.sweep.keyplan import Position
from dwsearch.sweep.window import MAX_WINDOW_MESSAGES, SESSION_GAP, Window

# Seed 003: the WindowAfter predicate. Denied and verification traffic is never embedded.
ELIGIBLE_EVENT_TYPE = "message"
ELIGIBLE_DECISIONS = ("received", "processed")

KEY_LOCK = int.from_bytes(b"dwsw", "big", signed=True)
RETENTION_LOCK = int.from_bytes(b"dwsr", "big", signed=True)

EMBEDDED = "embedded"
SKIPPED = "skipped"
POISON = "poison"

_ELIGIBLE = sql.SQL("e.event_type = %(event_type)s AND e.decision = ANY(%(decisions)s)")
_ELIGIBLE_PARAMS = {"event_type": ELIGIBLE_EVENT_TYPE, "decisions": list(ELIGIBLE_DECISIONS)}
_WITHIN_RETENTION = sql.SQL(
    "e.created_at >= coalesce((SELECT cutoff FROM dw_sweep_retention r WHERE r.org_id = e.org_id), '-infinity')"
)


class WriteConflict(Exception):
    """The key changed under the sweep (its watermark moved, or a purge cut the window);
    nothing was written and the next sweep re-plans."""


@dataclass(frozen=True)
class Key:
    org_id: str
    provider: str
    external_channel_id: str


@dataclass(frozen=True)
class Backlog:
    key: Key
    # Eligible events after the watermark.
    pending: int
    # Eligible events at or before the watermark that no finished window covers.
    uncovered: int
    # Eligible events after the watermark that may reopen the last finished window (see
    # keyplan.reopens): less than SESSION_GAP after it, which has room under the cap.
    reopening: int


@dataclass(frozen=True)
class KeyState:
    watermark: Position | None
    consecutive_failures: int


@dataclass(frozen=True)
class EventRow:
    id: str
    created_at: datetime
    text: str
    window_id: str | None
    window_size: int
    # md5 of message_text (hex), what the ledger keeps to notice a later edit.
    digest: str | None = None


@dataclass(frozen=True)
class Vectors:
    dense: np.ndarray
    sparse: dict[int, float] | None


@dataclass(frozen=True)
class WatermarkRow:
    key: Key
    model: str
    position: Position | None
    updated_at: datetime
    pending: int
    oldest_pending: datetime | None
    consecutive_failures: int
    last_error: str


@dataclass(frozen=True)
class PoisonRow:
    id: str
    key: Key
    model: str
    window_start: datetime
    window_end: datetime
    source_message_ids: tuple[str, ...]
    error: str
    attempts: int
    created_at: datetime


def _lock_id(*parts: str) -> int:
    """A stable signed 32-bit id for an advisory lock (collisions only cost a skip)."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


def _key_params(key: Key, model: str) -> dict[str, object]:
    return {"org": key.org_id, "provider": key.provider, "channel": key.external_channel_id, "model": model}


async def pending_keys(conn: AsyncConnection, orgs: list[str], model: str) -> list[Backlog]:
    """Keys of `orgs` with eligible events past their watermark or uncovered before it,
    the longest-waiting first."""
    if not orgs:
        return []
    query = sql.SQL(
        """WITH ev AS (
               SELECT e.org_id, e.provider, e.external_channel_id, e.created_at,
                      w.last_event_time IS NULL
                          OR (e.created_at, e.id) > (w.last_event_time, w.last_event_id) AS after_watermark,
                      l.event_id IS NULL AS unledgered,
                      e.created_at < w.last_event_time + %(session_gap)s
                          AND cardinality(last_window.source_message_ids) < %(max_messages)s AS near_last_window
               FROM dw_chat_events e
               LEFT JOIN dw_sweep_watermarks w
                      ON w.org_id = e.org_id AND w.provider = e.provider
                     AND w.external_channel_id = e.external_channel_id AND w.model = %(model)s
               LEFT JOIN dw_sweep_window_events l ON l.model = %(model)s AND l.event_id = e.id
               LEFT JOIN dw_sweep_window_events last_event
                      ON last_event.model = %(model)s AND last_event.event_id = w.last_event_id
               LEFT JOIN dw_sweep_windows last_window ON last_window.id = last_event.window_id
               WHERE e.org_id = ANY(%(orgs)s) AND {eligible} AND {retention}
           )
           SELECT org_id, provider, external_channel_id,
                  count(*) FILTER (WHERE after_watermark) AS pending,
                  count(*) FILTER (WHERE NOT after_watermark AND unledgered) AS uncovered,
                  count(*) FILTER (WHERE after_watermark AND near_last_window) AS reopening
           FROM ev
           GROUP BY org_id, provider, external_channel_id
           HAVING bool_or(after_watermark OR unledgered)
           ORDER BY min(created_at) FILTER (WHERE after_watermark OR unledgered),
                    org_id, provider, external_channel_id"""
    ).format(eligible=_ELIGIBLE, retention=_WITHIN_RETENTION)
    params = {
        "orgs": orgs,
        "model": model,
        "session_gap": SESSION_GAP,
        "max_messages": MAX_WINDOW_MESSAGES,
        **_ELIGIBLE_PARAMS,
    }
    cur = await conn.execute(query, params)
    return [
        Backlog(Key(org, provider, channel), *counts)
        for org, provider, channel, *counts in await cur.fetchall()
    ]


# How long a key lease lasts: longer than any one key's run (a sweep's keys end within
# its budget); a key whose sweeper died stays locked this long.
KEY_LEASE = timedelta(minutes=15)
# Holder ids: this process, then the connection (it holds at most one key at a time).
_PROCESS = uuid4().hex


def _holder(conn: AsyncConnection) -> str:
    return f"{_PROCESS}:{id(conn)}"


async def try_lock_key(conn: AsyncConnection, key: Key, model: str) -> bool:
    if transaction_pooled(conn):
        cur = await conn.execute(
            """INSERT INTO dw_sweep_key_leases (org_id, provider, external_channel_id, model, holder, expires_at)
               VALUES (%(org)s, %(provider)s, %(channel)s, %(model)s, %(holder)s, now() + %(lease)s)
               ON CONFLICT (org_id, provider, external_channel_id, model) DO UPDATE
                   SET holder = excluded.holder, expires_at = excluded.expires_at
                   WHERE dw_sweep_key_leases.expires_at < now()
               RETURNING holder""",
            {**_key_params(key, model), "holder": _holder(conn), "lease": KEY_LEASE},
        )
        return await cur.fetchone() is not None
    cur = await conn.execute(
        "SELECT pg_try_advisory_lock(%s, %s)",
        (KEY_LOCK, _lock_id(model, key.org_id, key.provider, key.external_channel_id)),
    )
    row = await cur.fetchone()
    return bool(row and row[0])


async def unlock_key(conn: AsyncConnection, key: Key, model: str) -> None:
    if transaction_pooled(conn):
        await conn.execute(
            """DELETE FROM dw_sweep_key_leases
               WHERE org_id = %(org)s AND provider = %(provider)s AND external_channel_id = %(channel)s
                 AND model = %(model)s AND holder = %(holder)s""",
            {**_key_params(key, model), "holder": _holder(conn)},
        )
        return
    await conn.execute(
        "SELECT pg_advisory_unlock(%s, %s)",
        (KEY_LOCK, _lock_id(model, key.org_id, key.provider, key.external_channel_id)),
    )


async def load_key_state(conn: AsyncConnection, key: Key, model: str) -> KeyState:
    cur = await conn.execute(
        """SELECT last_event_time, last_event_id::text, consecutive_failures FROM dw_sweep_watermarks
           WHERE org_id = %(org)s AND provider = %(provider)s AND external_channel_id = %(channel)s
             AND model = %(model)s""",
        _key_params(key, model),
    )
    row = await cur.fetchone()
    if row is None:
        return KeyState(None, 0)
    time, event_id, failures = row
    return KeyState(Position(time, event_id) if time is not None else None, failures)


async def load_events(
    conn: AsyncConnection, key: Key, model: str, *, after: Position | None
) -> list[EventRow]:
    """The key's eligible events within retention (after `after`, when given) in
    (created_at, id) order, each with the finished window covering it."""
    after_filter = (
        sql.SQL("AND (e.created_at, e.id) > (%(after_time)s, %(after_id)s::uuid)")
        if after is not None
        else sql.SQL("")
    )
    query = sql.SQL(
        """SELECT e.id::text, e.created_at, e.message_text, l.window_id::text,
                  coalesce(cardinality(w.source_message_ids), 0), md5(e.message_text)
           FROM dw_chat_events e
           LEFT JOIN dw_sweep_window_events l ON l.model = %(model)s AND l.event_id = e.id
           LEFT JOIN dw_sweep_windows w ON w.id = l.window_id
           WHERE e.org_id = %(org)s AND e.provider = %(provider)s AND e.external_channel_id = %(channel)s
             AND {eligible} AND {retention} {after}
           ORDER BY e.created_at, e.id"""
    ).format(eligible=_ELIGIBLE, retention=_WITHIN_RETENTION, after=after_filter)
    params = {**_key_params(key, model), **_ELIGIBLE_PARAMS}
    if after is not None:
        params.update(after_time=after.created_at, after_id=after.id)
    cur = await conn.execute(query, params)
    return [EventRow(*row) for row in await cur.fetchall()]


# Windows are a regenerable cache of dw_chat_events: a crash may lose the last few
# commits — each a window together with its watermark advance, so the next sweep redoes
# them — but never leaves the two inconsistent. Not waiting for the WAL flush per window
# makes a backfill several times faster. Purge keeps synchronous commits.
_ASYNC_COMMIT = "SET LOCAL synchronous_commit = off"

_UPSERT_WATERMARK = """
INSERT INTO dw_sweep_watermarks AS w (org_id, provider, external_channel_id, model, last_event_time, last_event_id)
VALUES (%(org)s, %(provider)s, %(channel)s, %(model)s, %(time)s, %(event_id)s::uuid)
ON CONFLICT (org_id, provider, external_channel_id, model) DO UPDATE
SET last_event_time = excluded.last_event_time, last_event_id = excluded.last_event_id,
    consecutive_failures = 0, last_error = NULL, updated_at = now()
WHERE (w.last_event_time, w.last_event_id) IS NOT DISTINCT FROM (%(expected_time)s::timestamptz, %(expected_id)s::uuid)
RETURNING 1"""


def _watermark_params(
    key: Key, model: str, expected: Position | None, position: Position | None
) -> dict[str, object]:
    return {
        **_key_params(key, model),
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
        **_ELIGIBLE_PARAMS,
    }
    async with conn.transaction(), conn.pipeline():
        await conn.execute(_ASYNC_COMMIT)
        await conn.execute(
            "SELECT pg_advisory_xact_lock_shared(%s, %s)", (RETENTION_LOCK, _lock_id(key.org_id))
        )
        if replaces:
            await conn.execute(
                "DELETE FROM dw_message_embeddings WHERE id = ANY(%(replaces)s::uuid[])", params
            )
            await conn.execute("DELETE FROM dw_sweep_windows WHERE id = ANY(%(replaces)s::uuid[])", params)
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
                      JOIN dw_chat_events AS e ON e.id = u.event_id
                      WHERE {eligible} AND (u.text_md5 IS NULL OR u.text_md5 = md5(e.message_text)::uuid)
                     ) = cardinality(%(ids)s::uuid[])
               RETURNING 1"""
            ).format(eligible=_ELIGIBLE),
            params,
        )
        await conn.execute(
            """INSERT INTO dw_sweep_window_events (model, event_id, window_id, text_md5)
               SELECT %(model)s, event_id, %(id)s, text_md5
               FROM unnest(%(ids)s::uuid[], %(digests)s::uuid[]) AS u (event_id, text_md5)
               WHERE EXISTS (SELECT 1 FROM dw_sweep_windows WHERE id = %(id)s)""",  # else WriteConflict, below
            params,
        )
        if vectors is not None:
            sparse = SparseVector(vectors.sparse, sparse_dimension) if vectors.sparse else None
            await conn.execute(
                """INSERT INTO dw_message_embeddings (id, org_id, model, provider, external_channel_id,
                       window_start, window_end, embedding, sparse, content, source_message_ids)
                   VALUES (%(id)s, %(org)s, %(model)s, %(provider)s, %(channel)s, %(start)s, %(end)s,
                           %(dense)s, %(sparse)s, %(content)s, %(ids)s::text[])""",
                {**params, "dense": HalfVector(vectors.dense), "sparse": sparse, "content": window.text},
            )
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
                                                 consecutive_failures, last_error)
           VALUES (%(org)s, %(provider)s, %(channel)s, %(model)s, %(step)s, %(error)s)
           ON CONFLICT (org_id, provider, external_channel_id, model) DO UPDATE
           SET consecutive_failures = w.consecutive_failures + %(step)s, last_error = excluded.last_error,
               updated_at = now()
           RETURNING consecutive_failures""",
        {**_key_params(key, model), "error": error, "step": 1 if counts else 0},
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def watermarks(conn: AsyncConnection, model: str, org_id: str = "") -> list[WatermarkRow]:
    org_filter = sql.SQL("AND w.org_id = %(org)s") if org_id else sql.SQL("")
    query = sql.SQL(
        """SELECT w.org_id, w.provider, w.external_channel_id, w.model, w.last_event_time, w.last_event_id::text,
                  w.updated_at, p.pending, p.oldest, w.consecutive_failures, coalesce(w.last_error, '')
           FROM dw_sweep_watermarks w
           CROSS JOIN LATERAL (
               SELECT count(*) AS pending, min(e.created_at) AS oldest
               FROM dw_chat_events e
               WHERE e.org_id = w.org_id AND e.provider = w.provider AND e.external_channel_id = w.external_channel_id
                 AND {eligible} AND {retention}
                 AND (w.last_event_time IS NULL OR (e.created_at, e.id) > (w.last_event_time, w.last_event_id))
           ) p
           WHERE w.model = %(model)s {org_filter}
           ORDER BY w.org_id, w.provider, w.external_channel_id"""
    ).format(eligible=_ELIGIBLE, retention=_WITHIN_RETENTION, org_filter=org_filter)
    cur = await conn.execute(query, {"model": model, "org": org_id, **_ELIGIBLE_PARAMS})
    return [
        WatermarkRow(
            key=Key(org, provider, channel),
            model=m,
            position=Position(time, event_id) if time is not None else None,
            updated_at=updated,
            pending=pending,
            oldest_pending=oldest,
            consecutive_failures=failures,
            last_error=error,
        )
        for org, provider, channel, m, time, event_id, updated, pending, oldest, failures, error in await cur.fetchall()
    ]


async def unwatermarked_pending(
    conn: AsyncConnection, model: str, orgs: list[str]
) -> tuple[int, datetime | None]:
    """Eligible events of `orgs`' keys that have no watermark for `model` yet: how many,
    and when the oldest was created."""
    if not orgs:
        return 0, None
    query = sql.SQL(
        """SELECT count(*), min(e.created_at) FROM dw_chat_events e
           WHERE e.org_id = ANY(%(orgs)s) AND {eligible} AND {retention}
             AND NOT EXISTS (SELECT 1 FROM dw_sweep_watermarks w
                             WHERE w.org_id = e.org_id AND w.provider = e.provider
                               AND w.external_channel_id = e.external_channel_id AND w.model = %(model)s)"""
    ).format(eligible=_ELIGIBLE, retention=_WITHIN_RETENTION)
    cur = await conn.execute(query, {"orgs": orgs, "model": model, **_ELIGIBLE_PARAMS})
    row = await cur.fetchone()
    return (int(row[0]), row[1]) if row else (0, None)


async def poison_windows(conn: AsyncConnection, model: str, org_id: str = "") -> list[PoisonRow]:
    org_filter = sql.SQL("AND org_id = %(org)s") if org_id else sql.SQL("")
    query = sql.SQL(
        """SELECT id::text, org_id, provider, external_channel_id, model, window_start, window_end,
                  source_message_ids::text[], coalesce(error, ''), attempts, created_at
           FROM dw_sweep_windows WHERE status = %(poison)s AND model = %(model)s {org_filter}
           ORDER BY org_id, window_start"""
    ).format(org_filter=org_filter)
    cur = await conn.execute(query, {"model": model, "org": org_id, "poison": POISON})
    return [
        PoisonRow(wid, Key(org, provider, channel), m, start, end, tuple(ids), error, attempts, created)
        for wid, org, provider, channel, m, start, end, ids, error, attempts, created in await cur.fetchall()
    ]


async def embedded_windows(conn: AsyncConnection, model: str, org_id: str = "") -> int:
    org_filter = sql.SQL("AND org_id = %(org)s") if org_id else sql.SQL("")
    query = sql.SQL("SELECT count(*) FROM dw_message_embeddings WHERE model = %(model)s {org_filter}").format(
        org_filter=org_filter
    )
    cur = await conn.execute(query, {"model": model, "org": org_id})
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def purge(conn: AsyncConnection, org_id: str, cutoff: datetime) -> tuple[int, int]:
    """Delete the org's windows (every model) that include an event before `cutoff` and
    remember the cutoff (the latest one given wins: a retention promise is never relaxed).
    Returns (embeddings deleted, poison windows deleted)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (RETENTION_LOCK, _lock_id(org_id)))
        cur = await conn.execute(
            """INSERT INTO dw_sweep_retention AS r (org_id, cutoff) VALUES (%s, %s)
               ON CONFLICT (org_id) DO UPDATE SET cutoff = greatest(r.cutoff, excluded.cutoff), updated_at = now()
               RETURNING cutoff""",
            (org_id, cutoff),
        )
        (effective,) = await cur.fetchone() or (cutoff,)
        cur = await conn.execute(
            "DELETE FROM dw_message_embeddings WHERE org_id = %s AND window_start < %s", (org_id, effective)
        )
        embeddings = cur.rowcount
        cur = await conn.execute(
            """WITH gone AS (DELETE FROM dw_sweep_windows WHERE org_id = %s AND window_start < %s RETURNING status)
               SELECT count(*) FILTER (WHERE status = %s) FROM gone""",
            (org_id, effective, POISON),
        )
        row = await cur.fetchone()
    return embeddings, int(row[0]) if row else 0


async def drop_stale_windows(conn: AsyncConnection, org_id: str = "") -> int:
    """Delete the finished windows (every model; embedded, skipped or poison) holding an
    event that has since been deleted, edited (its message_text no longer has the md5 the
    ledger recorded) or made ineligible, with their embeddings: embedded text never
    outlives the message it came from. The windows' events are left uncovered, so the
    sweep windows them again. Only `org_id`'s windows when given. Returns how many
    windows were dropped."""
    org_filter = sql.SQL("AND w.org_id = %(org)s") if org_id else sql.SQL("")
    find = sql.SQL(
        """SELECT DISTINCT w.id
           FROM dw_sweep_windows AS w
           JOIN dw_sweep_window_events AS l ON l.window_id = w.id
           WHERE NOT EXISTS (SELECT 1 FROM dw_chat_events AS e
                             WHERE e.id = l.event_id AND e.org_id = w.org_id AND {eligible}
                               AND (l.text_md5 IS NULL OR l.text_md5 = md5(e.message_text)::uuid))
                 {org_filter}"""
    ).format(eligible=_ELIGIBLE, org_filter=org_filter)
    cur = await conn.execute(find, {"org": org_id, **_ELIGIBLE_PARAMS})
    return await _drop_windows(conn, [row[0] for row in await cur.fetchall()])


async def drop_windows_holding(conn: AsyncConnection, org_id: str, event_ids: list[UUID]) -> int:
    """Delete the org's finished windows (every model) holding any of the events, with
    their embeddings; their events that still exist are left uncovered for the sweep.
    Returns how many windows were dropped."""
    async with conn.transaction():
        # Exclusive: a window write of the org in flight commits first (and is found
        # here); a later one sees the deletion or edit and refuses (finish_window).
        await conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (RETENTION_LOCK, _lock_id(org_id)))
        cur = await conn.execute(
            # Every model that wrote a window of the org has a watermark there: naming
            # them lets the ledger's primary key (model, event_id) find the rows.
            """SELECT DISTINCT w.id FROM dw_sweep_window_events AS l
               JOIN dw_sweep_windows AS w ON w.id = l.window_id
               WHERE l.model = ANY(ARRAY(SELECT DISTINCT model FROM dw_sweep_watermarks WHERE org_id = %(org)s))
                 AND l.event_id = ANY(%(ids)s) AND w.org_id = %(org)s""",
            {"org": org_id, "ids": event_ids},
        )
        return await _drop_windows(conn, [row[0] for row in await cur.fetchall()])


async def _drop_windows(conn: AsyncConnection, window_ids: list[UUID]) -> int:
    if not window_ids:
        return 0
    # Embeddings first, then windows (the ledger cascades): the order Purge and
    # finish_window lock them in, so none of them can deadlock with another.
    async with conn.transaction():
        await conn.execute("DELETE FROM dw_message_embeddings WHERE id = ANY(%s)", (window_ids,))
        cur = await conn.execute("DELETE FROM dw_sweep_windows WHERE id = ANY(%s)", (window_ids,))
    return cur.rowcount


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
