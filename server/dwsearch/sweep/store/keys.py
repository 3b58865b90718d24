"""What a sweep reads of its keys (org, provider, channel) for one model, and the key
locks it holds: the backlog, a key's watermark and its events.

Locks:
- Key locks: one per (org, provider, channel, model), held by the connection that sweeps
  the key; a concurrent sweeper that cannot take it leaves the key. On one Postgres, a
  session advisory lock (KEY_LOCK, a namespace apart from the migration lock). Behind
  pgbouncer in transaction mode (dwsearch.db.pool.transaction_pooled), or on a Citus
  cluster (dwsearch.db.distributed), where an advisory lock is one node's and clients
  may connect to any node, a lease row in dw_sweep_key_leases instead, in the key's org's
  shard, held by the connection for KEY_LEASE and deleted when the key is done (a crashed
  sweeper's lease expires).
- Retention locks: one per org, a row lock on the org's dw_sweep_retention row (lock_org
  inserts it when the org has none, with cutoff -infinity: no cutoff), so that it holds
  on a Citus cluster from whichever node a client connects to: the row lies in the org's
  shard. Window writes (dwsearch.sweep.store.writes) take it FOR SHARE, Purge and Forget
  (dwsearch.sweep.store.retention) FOR UPDATE, so a window of events older than a cutoff
  can never commit after the Purge that set it, nor one of a message deleted or edited
  before a Forget naming it after that Forget.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import uuid4

from psycopg import AsyncConnection, sql

from dwsearch.db.distributed import is_distributed, known_distributed
from dwsearch.db.events import eligible
from dwsearch.db.pool import transaction_pooled
from dwsearch.sweep.keyplan import Position
from dwsearch.sweep.window import MAX_WINDOW_MESSAGES, SESSION_GAP

KEY_LOCK = int.from_bytes(b"dwsw", "big", signed=True)

# The eligibility predicate (dwsearch.db.events; docs/design.md, "Eligible events"),
# over dw_chat_events AS e.
# Denied and verification traffic is never embedded.
ELIGIBLE = eligible("e")
WITHIN_RETENTION = sql.SQL(
    "e.created_at >= coalesce((SELECT cutoff FROM dw_sweep_retention r WHERE r.org_id = e.org_id), '-infinity')"
)
# The same for a statement on one org, %(org)s: its cutoff is looked up by the org's id, not
# correlated with each event, so the statement names the org for every table it reads.
WITHIN_ORG_RETENTION = sql.SQL(
    "e.created_at >= coalesce((SELECT cutoff FROM dw_sweep_retention r WHERE r.org_id = %(org)s), '-infinity')"
)


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
    # When the oldest of the pending and uncovered events was created: the sweep takes
    # the longest-waiting keys first.
    oldest: datetime | None = None


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


def lock_id(*parts: str) -> int:
    """A stable signed 32-bit id for an advisory lock (collisions only cost a skip)."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


def key_params(key: Key, model: str) -> dict[str, object]:
    return {"org": key.org_id, "provider": key.provider, "channel": key.external_channel_id, "model": model}


async def pending_keys(
    conn: AsyncConnection, orgs: list[str], model: str, *, only: Sequence[Key] | None = None
) -> list[Backlog]:
    """Keys of `orgs` with eligible events past their watermark or uncovered before it,
    the longest-waiting first: every event of the orgs is read. `only`: just these keys
    (of `orgs`), which dwsearch.sweep.store.discovery found with new events."""
    if not orgs or (only is not None and not only):
        return []
    restrict = (
        sql.SQL(
            """AND (e.org_id, e.provider, e.external_channel_id) IN
                   (SELECT * FROM unnest(%(only_orgs)s::varchar[], %(only_providers)s::varchar[],
                                         %(only_channels)s::varchar[]))"""
        )
        if only is not None
        else sql.SQL("")
    )
    # One org's (a sweep of one org, or a batch of one): named by its id, not as an array,
    # so that Citus routes the statements to its shard alone with their parameters bound
    # (it prunes no shard by `= ANY($1)`), and an org whose worker is up is swept while
    # another worker is down.
    one = len(orgs) == 1

    def among(column: str) -> sql.Composable:
        return sql.SQL("{} = %(org)s" if one else "{} = ANY(%(orgs)s)").format(sql.SQL(column))

    # Each watermark with the size of its last window: a probe per key, by itself, so
    # that the backlog statement below can be held to hash joins.
    cur = await conn.execute(
        sql.SQL(
            """SELECT w.org_id, w.provider, w.external_channel_id, w.last_event_time, w.last_event_id,
                  cardinality(last_window.source_message_ids)
           FROM dw_sweep_watermarks w
           LEFT JOIN dw_sweep_window_events last_event
                  ON last_event.org_id = w.org_id AND last_event.model = %(model)s
                 AND last_event.event_id = w.last_event_id
           LEFT JOIN dw_sweep_windows last_window
                  ON last_window.org_id = w.org_id AND last_window.id = last_event.window_id
           WHERE w.model = %(model)s AND {orgs}"""
        ).format(orgs=among("w.org_id")),
        {"orgs": orgs, "org": orgs[0], "model": model},
    )
    marks = await cur.fetchall()
    query = sql.SQL(
        # The orgs are named on every table read, not only through the joins: the planner
        # reads just their ledger rows (the ledger's key leads with org_id) instead of the
        # whole ledger (`python -m bench.tenancy`: 15 s -> under 1 s for 200 orgs of 10,000).
        """WITH marks AS (
               SELECT * FROM unnest(%(m_orgs)s::varchar[], %(m_providers)s::varchar[], %(m_channels)s::varchar[],
                                    %(m_times)s::timestamptz[], %(m_ids)s::uuid[], %(m_sizes)s::integer[])
                   AS m (org_id, provider, external_channel_id, last_event_time, last_event_id, last_window_size)
           ),
           ev AS (
               SELECT e.org_id, e.provider, e.external_channel_id, e.created_at,
                      w.last_event_time IS NULL
                          OR (e.created_at, e.id) > (w.last_event_time, w.last_event_id) AS after_watermark,
                      l.event_id IS NULL AS unledgered,
                      e.created_at < w.last_event_time + %(session_gap)s
                          AND w.last_window_size < %(max_messages)s AS near_last_window
               FROM dw_chat_events e
               LEFT JOIN marks w
                      ON w.org_id = e.org_id AND w.provider = e.provider
                     AND w.external_channel_id = e.external_channel_id
               LEFT JOIN dw_sweep_window_events l
                      ON l.org_id = e.org_id AND l.model = %(model)s AND l.event_id = e.id
                     AND {l_orgs}
               WHERE {e_orgs} AND {eligible} AND {retention} {restrict}
           )
           SELECT org_id, provider, external_channel_id,
                  count(*) FILTER (WHERE after_watermark) AS pending,
                  count(*) FILTER (WHERE NOT after_watermark AND unledgered) AS uncovered,
                  count(*) FILTER (WHERE after_watermark AND near_last_window) AS reopening,
                  min(created_at) FILTER (WHERE after_watermark OR unledgered) AS oldest
           FROM ev
           GROUP BY org_id, provider, external_channel_id
           HAVING bool_or(after_watermark OR unledgered)
           ORDER BY min(created_at) FILTER (WHERE after_watermark OR unledgered),
                    org_id, provider, external_channel_id"""
    ).format(
        eligible=ELIGIBLE,
        retention=WITHIN_ORG_RETENTION if one else WITHIN_RETENTION,
        restrict=restrict,
        l_orgs=among("l.org_id"),
        e_orgs=among("e.org_id"),
    )
    params = {
        "orgs": orgs,
        "org": orgs[0],
        "model": model,
        "session_gap": SESSION_GAP,
        "max_messages": MAX_WINDOW_MESSAGES,
        "only_orgs": [k.org_id for k in only or ()],
        "only_providers": [k.provider for k in only or ()],
        "only_channels": [k.external_channel_id for k in only or ()],
        **{
            name: [m[n] for m in marks]
            for n, name in enumerate(("m_orgs", "m_providers", "m_channels", "m_times", "m_ids", "m_sizes"))
        },
    }
    async with conn.transaction():
        # Hash joins only, over the orgs' own rows: linear in the orgs' events whatever
        # the statistics say. A merge join matched the events with the watermarks on
        # org_id alone, comparing every event with every channel's watermark of its org
        # (2x slower at 10,000 orgs); and with statistics older than a large backfill, a
        # nested loop rescanned the ledger for every event (a no-op sweep of 100,000
        # events took 296 s in `python -m bench.sweep`).
        await conn.execute("SET LOCAL enable_mergejoin = off")
        if only is None:
            # (`only` keys are few, their events found key by key through the scope
            # index: a nested loop is the plan there.)
            await conn.execute("SET LOCAL enable_nestloop = off")
        cur = await conn.execute(query, params)
        rows = await cur.fetchall()
    return [Backlog(Key(org, provider, channel), *counts) for org, provider, channel, *counts in rows]


# How long a key lease lasts: longer than any one key's run (a sweep's keys end within
# its budget); a key whose sweeper died stays locked this long.
KEY_LEASE = timedelta(minutes=15)
# Holder ids: this process, then the connection (it holds at most one key at a time).
_PROCESS = uuid4().hex


def _holder(conn: AsyncConnection) -> str:
    return f"{_PROCESS}:{id(conn)}"


async def _leased(conn: AsyncConnection) -> bool:
    """Whether key locks are lease rows on this connection (else session advisory locks)."""
    return transaction_pooled(conn) or await is_distributed(conn)


# The org's retention lock (see above), in the caller's transaction: the row first, then
# its lock. Two statements, no round trip of their own inside a pipeline.
_RETENTION_ROW = """INSERT INTO dw_sweep_retention (org_id, cutoff) VALUES (%(org)s, '-infinity')
                    ON CONFLICT (org_id) DO NOTHING"""


async def lock_org(conn: AsyncConnection, org_id: str, *, exclusive: bool) -> None:
    """Take the org's retention lock until the transaction ends: shared (FOR SHARE) by a
    window write, exclusive (FOR UPDATE) by Purge and Forget."""
    await conn.execute(_RETENTION_ROW, {"org": org_id})
    await conn.execute(
        sql.SQL("SELECT 1 FROM dw_sweep_retention WHERE org_id = %(org)s FOR {}").format(
            sql.SQL("UPDATE" if exclusive else "SHARE")
        ),
        {"org": org_id},
    )


async def try_lock_key(conn: AsyncConnection, key: Key, model: str) -> bool:
    if await _leased(conn):
        # An expired lease (its sweeper died) goes first, then the lease is taken unless
        # another holds it: two statements in one round trip. Two sweepers racing for an
        # expired lease both delete it (the second waits, then finds it gone) and one
        # inserts; the other's insert meets its row and takes nothing. (Not
        # one upsert replacing an expired row: Citus takes no function but an IMMUTABLE
        # one in its WHERE, and "expires_at < now()" is not.)
        params = {**key_params(key, model), "holder": _holder(conn), "lease": KEY_LEASE}
        async with conn.pipeline():
            await conn.execute(
                """DELETE FROM dw_sweep_key_leases
                   WHERE org_id = %(org)s AND provider = %(provider)s AND external_channel_id = %(channel)s
                     AND model = %(model)s AND expires_at < now()""",
                params,
            )
            cur = await conn.execute(
                """INSERT INTO dw_sweep_key_leases (org_id, provider, external_channel_id, model, holder, expires_at)
                   VALUES (%(org)s, %(provider)s, %(channel)s, %(model)s, %(holder)s, now() + %(lease)s)
                   ON CONFLICT (org_id, provider, external_channel_id, model) DO NOTHING
                   RETURNING holder""",
                params,
            )
        return await cur.fetchone() is not None
    cur = await conn.execute(
        "SELECT pg_try_advisory_lock(%s, %s)",
        (KEY_LOCK, lock_id(model, key.org_id, key.provider, key.external_channel_id)),
    )
    row = await cur.fetchone()
    return bool(row and row[0])


async def unlock_key(conn: AsyncConnection, key: Key, model: str) -> None:
    if await _leased(conn):
        await conn.execute(
            """DELETE FROM dw_sweep_key_leases
               WHERE org_id = %(org)s AND provider = %(provider)s AND external_channel_id = %(channel)s
                 AND model = %(model)s AND holder = %(holder)s""",
            {**key_params(key, model), "holder": _holder(conn)},
        )
        return
    await conn.execute(
        "SELECT pg_advisory_unlock(%s, %s)",
        (KEY_LOCK, lock_id(model, key.org_id, key.provider, key.external_channel_id)),
    )


def leased(conn: AsyncConnection) -> bool:
    """Whether `conn` took its key locks as leases (as try_lock_key found), asking nothing
    of it: for a connection that has broken."""
    return transaction_pooled(conn) or known_distributed(conn)


# Leases this process took and could not release yet: (key, model, holder).
_LOST: set[tuple[Key, str, str]] = set()


async def release_lease(conn: AsyncConnection, key: Key, model: str, *, held_by: AsyncConnection) -> None:
    """Release, through `conn`, the lease `held_by` took on the key: its connection broke,
    and a lease (unlike a session lock) outlives its session until KEY_LEASE passes. When
    that fails too (on a cluster, the org's worker is down), the next sweep of this
    process releases it first (release_lost_leases)."""
    _LOST.add((key, model, _holder(held_by)))
    await release_lost_leases(conn)


async def release_lost_leases(conn: AsyncConnection) -> None:
    """Release the leases this process could not (release_lease): each that succeeds is
    forgotten; a failure raises, leaving it and the rest for the next call."""
    for key, model, holder in sorted(_LOST, key=lambda lost: (lost[0].org_id, lost[2])):
        await conn.execute(
            """DELETE FROM dw_sweep_key_leases
               WHERE org_id = %(org)s AND provider = %(provider)s AND external_channel_id = %(channel)s
                 AND model = %(model)s AND holder = %(holder)s""",
            {**key_params(key, model), "holder": holder},
        )
        _LOST.discard((key, model, holder))


async def load_key_state(conn: AsyncConnection, key: Key, model: str) -> KeyState:
    cur = await conn.execute(
        """SELECT last_event_time, last_event_id::text, consecutive_failures FROM dw_sweep_watermarks
           WHERE org_id = %(org)s AND provider = %(provider)s AND external_channel_id = %(channel)s
             AND model = %(model)s""",
        key_params(key, model),
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
        """SELECT e.id::text, e.created_at, e.message_text, l.window_id::text, coalesce(l.size, 0),
                  md5(e.message_text)
           FROM dw_chat_events e
           -- One primary-key probe of the ledger (and of the window) per event; LIMIT 1
           -- keeps the planner from flattening it into a join that hashes the org's whole
           -- ledger, every key of a large org reading all of it (`python -m bench.sweep`:
           -- 535 -> 235 windows/s).
           LEFT JOIN LATERAL (
               SELECT l.window_id, cardinality(w.source_message_ids) AS size
               FROM dw_sweep_window_events l
               JOIN dw_sweep_windows w ON w.org_id = %(org)s AND w.id = l.window_id
               WHERE l.org_id = %(org)s AND l.model = %(model)s AND l.event_id = e.id LIMIT 1
           ) l ON true
           WHERE e.org_id = %(org)s AND e.provider = %(provider)s AND e.external_channel_id = %(channel)s
             AND {eligible} AND {retention} {after}
           ORDER BY e.created_at, e.id"""
    ).format(eligible=ELIGIBLE, retention=WITHIN_ORG_RETENTION, after=after_filter)
    params = {**key_params(key, model)}
    if after is not None:
        params.update(after_time=after.created_at, after_id=after.id)
    cur = await conn.execute(query, params)
    return [EventRow(*row) for row in await cur.fetchall()]
