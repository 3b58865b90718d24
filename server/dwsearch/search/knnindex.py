"""Per-org HNSW indexes: exact KNN for small orgs, an index of its own for a large one.

Dense KNN is exact by default: the (org_id, model) btree and an ordered scan of the org's
rows, with perfect recall. Its cost grows about linearly with the org's windows, so a few
large orgs in a deployment of thousands need an index, and the small ones must not pay
for a global graph (one HNSW index over every org, filtered at query time, is slower for
a small org than its exact scan and under-returns without iterative scans). So an org with
at least KNN_INDEX_MIN_WINDOWS live windows of a model gets a partial HNSW index over just
those rows (`WHERE model = ... AND org_id = ...`), recorded in dw_knn_indexes once it is
built and valid; search (ServerConfig.knn_index = auto) uses it for that org, model and
dimension, and exact KNN for everyone else (docs/design.md, "Storage and KNN").

`dwsearch knn-indexes` runs plan_indexes and applies the plan: build (build_org_index)
where an org reached the threshold, drop (drop_org_index) where it fell below half of it.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from psycopg import AsyncConnection, sql

from dwsearch.common.ttlcache import DEFAULT_MAX_BYTES, TtlCache, entry_bytes
from dwsearch.retrieval.store import hnsw

# Exact KNN costs about 0.45-0.9 µs per 1024-d halfvec row (0.44 µs measured on 2 cores
# with the rows in shared buffers, 22 ms p50 at 50k windows; up to twice that on busier
# hosts), so an org of 10k windows answers in 5-10 ms exactly and the search's 25 ms p99
# budget for the dense leg is reached near 25k. At 10k an org gets its own index, well
# before it matters, while the thousands of orgs of a few hundred windows stay exact.
KNN_INDEX_MIN_WINDOWS = 10_000
# Hysteresis: an org's index is dropped only when its live windows fall below half the
# threshold, so an org near it (retention deleting old windows, the sweep adding new ones)
# is not rebuilt and dropped on alternate runs.
KNN_INDEX_DROP_FRACTION = 0.5
# Build parameters of an org's graph, measured at 50k 1024-d unit vectors around 200 topic
# centroids against exact top 10 (200 queries, 2 cores): with m = 16, ef_construction = 128
# and hnsw.ef_search 100 / 200, recall@10 1.0 / 1.0 at topic noise sigma 0.03 and 0.06
# (0.9-1.5 ms p50 against 22-26 ms exact), and 0.977 / 0.981 at sigma 0.1, where the
# topics barely show (2.0 / 3.0 ms). ef_construction = 64 builds in half the time (10-16 s
# against 19-29 s at 50k) and gave 0.999 at sigma 0.06. The build holds the graph in
# maintenance_work_mem: a 50k-window org's is about 150 MB, so a lower setting is raised
# to KNN_INDEX_BUILD_MEMORY for the build.
KNN_INDEX_M = 16
KNN_INDEX_EF_CONSTRUCTION = 128
KNN_INDEX_BUILD_MEMORY = "256MB"
# How long search trusts its copy of an org's rows of dw_knn_indexes: a new index is used,
# and a dropped one no longer named, within this many seconds.
KNN_INDEX_REFRESH_S = 60.0


def org_index_name(org_id: str, model: str) -> str:
    """The index of one org's windows of one model: a hash of both (an org id or a model
    name may be longer than an identifier, or hold any character)."""
    digest = hashlib.sha256(f"{org_id}\x1f{model}".encode()).hexdigest()[:16]
    return "dw_message_embeddings_knn_" + digest


class Action(StrEnum):
    BUILD = "build"
    DROP = "drop"
    KEEP = "keep"


@dataclass(frozen=True)
class PlannedIndex:
    """What `dwsearch knn-indexes` does for one org's windows of one model."""

    org_id: str
    model: str
    dimension: int
    windows: int
    action: Action
    index_name: str
    reason: str


async def _valid_indexes(conn: AsyncConnection) -> dict[str, bool]:
    """dw_message_embeddings' indexes, each with whether it is valid."""
    cur = await conn.execute(
        """SELECT c.relname, i.indisvalid FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
           WHERE i.indrelid = 'dw_message_embeddings'::regclass"""
    )
    return {name: bool(valid) for name, valid in await cur.fetchall()}


async def _dimension(conn: AsyncConnection, org_id: str, model: str) -> int:
    cur = await conn.execute(
        "SELECT vector_dims(embedding) FROM dw_message_embeddings WHERE org_id = %s AND model = %s LIMIT 1",
        (org_id, model),
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def plan_indexes(conn: AsyncConnection, min_windows: int = KNN_INDEX_MIN_WINDOWS) -> list[PlannedIndex]:
    """Which orgs' windows of which model get an index built, dropped or kept.

    Live windows are counted per (org_id, model) over the (org_id, model) btree, for the
    orgs above half the threshold only (the rest can only lose an index). Build: at least
    `min_windows` and no valid recorded index of the windows' dimension (an invalid one,
    left by an interrupted build, is rebuilt). Drop: recorded (or an index of that name
    left over) and under half of `min_windows`. Keep: recorded, valid, and at least half.
    Sorted by org and model."""
    keep_at = max(1, math.ceil(min_windows * KNN_INDEX_DROP_FRACTION))
    cur = await conn.execute(
        """SELECT org_id, model, count(*) FROM dw_message_embeddings
           GROUP BY org_id, model HAVING count(*) >= %s""",
        (keep_at,),
    )
    counts = {(org, model): int(n) for org, model, n in await cur.fetchall()}
    cur = await conn.execute("SELECT org_id, model, dimension, index_name FROM dw_knn_indexes")
    recorded = {(org, model): (int(dimension), name) for org, model, dimension, name in await cur.fetchall()}
    indexes = await _valid_indexes(conn)
    plan = []
    for org, model in sorted(counts.keys() | recorded.keys()):
        windows = counts.get((org, model), 0)
        name = org_index_name(org, model)
        row = recorded.get((org, model))
        valid = indexes.get(name)
        if windows < keep_at:
            reason = f"{windows} windows, under {keep_at}"
            plan.append(PlannedIndex(org, model, row[0] if row else 0, windows, Action.DROP, name, reason))
            continue
        dimension = await _dimension(conn, org, model)
        if row is not None and valid and row[0] == dimension:
            plan.append(PlannedIndex(org, model, dimension, windows, Action.KEEP, name, f"{windows} windows"))
        elif windows >= min_windows or row is not None:
            reason = (
                f"{windows} windows, at least {min_windows}"
                if row is None
                else "its index is missing or invalid"
                if not valid
                else f"dimension {row[0]} recorded, the windows have {dimension}"
            )
            plan.append(PlannedIndex(org, model, dimension, windows, Action.BUILD, name, reason))
        elif valid is not None:  # an unrecorded index between half and the whole threshold
            reason = f"{windows} windows, under {min_windows}, and not recorded"
            plan.append(PlannedIndex(org, model, dimension, windows, Action.DROP, name, reason))
    return plan


async def build_org_index(
    conn: AsyncConnection, org_id: str, model: str, dimension: int, *, windows: int | None = None
) -> str:
    """Build (if missing) the partial HNSW index over one org's windows of one model, then
    record it in dw_knn_indexes; return its name.

    CONCURRENTLY, so sweeps and searches go on while it builds (conn must be in
    autocommit). The org and model are SQL literals in the predicate, so that a query
    naming them as literals is proven to match it. A build that failed or was interrupted
    leaves an invalid index behind, which IF NOT EXISTS would keep: it is dropped and
    built again, as is one recorded for another dimension. The row is written only once
    the index is there and valid. maintenance_work_mem is raised for the session: run it
    on a direct connection (a pooler in transaction mode could hand the setting on)."""
    name = org_index_name(org_id, model)
    cur = await conn.execute(
        "SELECT dimension FROM dw_knn_indexes WHERE org_id = %s AND model = %s", (org_id, model)
    )
    row = await cur.fetchone()
    if row is not None and int(row[0]) != int(dimension):
        await drop_org_index(conn, org_id, model)
    elif (await _valid_indexes(conn)).get(name) is False:
        await hnsw.drop(conn, name)
    cur = await conn.execute(
        "SELECT pg_size_bytes(current_setting('maintenance_work_mem')) < pg_size_bytes(%s)",
        (KNN_INDEX_BUILD_MEMORY,),
    )
    raise_memory = bool((await cur.fetchone() or (False,))[0])
    if raise_memory:
        await conn.execute(
            sql.SQL("SET maintenance_work_mem = {}").format(sql.Literal(KNN_INDEX_BUILD_MEMORY))
        )
    try:
        await conn.execute(
            hnsw.create_statement(
                name,
                table="dw_message_embeddings",
                column="embedding",
                dimension=dimension,
                where=sql.SQL("model = {} AND org_id = {}").format(sql.Literal(model), sql.Literal(org_id)),
                m=KNN_INDEX_M,
                ef_construction=KNN_INDEX_EF_CONSTRUCTION,
            )
        )
    finally:
        if raise_memory:
            await conn.execute("RESET maintenance_work_mem")
    if not (await _valid_indexes(conn)).get(name):
        raise RuntimeError(
            f"the index {name} of org {org_id!r}, model {model!r} is not valid after its build"
        )
    if windows is None:
        cur = await conn.execute(
            "SELECT count(*) FROM dw_message_embeddings WHERE org_id = %s AND model = %s", (org_id, model)
        )
        windows = int((await cur.fetchone() or (0,))[0])
    await conn.execute(
        """INSERT INTO dw_knn_indexes (org_id, model, dimension, index_name, windows_at_build)
           VALUES (%s, %s, %s, %s, %s)
           ON CONFLICT (org_id, model) DO UPDATE SET dimension = excluded.dimension,
               index_name = excluded.index_name, windows_at_build = excluded.windows_at_build,
               created_at = excluded.created_at""",
        (org_id, model, int(dimension), name, windows),
    )
    return name


async def drop_org_index(conn: AsyncConnection, org_id: str, model: str) -> str:
    """Forget, then drop (CONCURRENTLY: conn in autocommit) one org's index of a model;
    return its name. Searches that still name it within KNN_INDEX_REFRESH_S run the same
    statement without it: an exact scan, the same answer."""
    name = org_index_name(org_id, model)
    await conn.execute("DELETE FROM dw_knn_indexes WHERE org_id = %s AND model = %s", (org_id, model))
    await hnsw.drop(conn, name)
    return name


async def apply_plan(conn: AsyncConnection, plan: list[PlannedIndex]) -> None:
    """Build and drop what `plan` says, one index at a time (conn in autocommit)."""
    for planned in plan:
        if planned.action is Action.BUILD:
            await build_org_index(
                conn, planned.org_id, planned.model, planned.dimension, windows=planned.windows
            )
        elif planned.action is Action.DROP:
            await drop_org_index(conn, planned.org_id, planned.model)


class OrgKnnIndexes:
    """Search's view of dw_knn_indexes: whether an org has a usable index of its own for a
    model and a dimension. Each org's view is read with its own rows (`WHERE org_id = %s`:
    one shard on a Citus cluster, never every worker, so an org's search depends on its own
    worker alone) and the catalog's validity of the indexes they name, and reused for `ttl`
    seconds (an org without an index too); a new index is used, and one dropped by hand no
    longer named, within `ttl`, and meanwhile the per-org statement runs without it (exact).
    At most `max_bytes` of orgs' views are kept, the oldest going first."""

    def __init__(
        self,
        *,
        ttl: float = KNN_INDEX_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self._cache: TtlCache[str, frozenset[tuple[str, int]]] = TtlCache(
            ttl, max_bytes=max_bytes, clock=clock, size=_view_bytes, name="knn_indexes"
        )
        # One read per org at a time: each org being read, its lock and how many callers
        # hold or await it (the entry goes with the last, so the dict stays small).
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    async def has_index(self, conn: AsyncConnection, org_id: str, model: str, dimension: int) -> bool:
        """Whether (org_id, model, dimension) has a valid index; `conn` reads the org's
        rows when its copy is older than the ttl (one read per org at a time)."""
        return (model, dimension) in await self._indexed(conn, org_id)

    async def _indexed(self, conn: AsyncConnection, org_id: str) -> frozenset[tuple[str, int]]:
        found = self._cache.get(org_id)
        if found is not None:
            return found
        lock, holders = self._locks.setdefault(org_id, (asyncio.Lock(), [0]))
        holders[0] += 1
        try:
            async with lock:
                found = self._cache.get(org_id)
                if found is None:
                    found = await _org_indexes(conn, org_id)
                    self._cache.put(org_id, found)
        finally:
            holders[0] -= 1
            if holders[0] == 0:
                del self._locks[org_id]
        return found


async def _org_indexes(conn: AsyncConnection, org_id: str) -> frozenset[tuple[str, int]]:
    """(model, dimension) of each of the org's recorded indexes that exists and is valid.
    Two statements, not a join: on a Citus cluster dw_knn_indexes is read on the org's
    worker, where an index bears its shard's name, and the catalog naming the index as
    built lies on the coordinator. An org without a recorded index costs one statement."""
    cur = await conn.execute(
        "SELECT model, dimension, index_name FROM dw_knn_indexes WHERE org_id = %s", (org_id,)
    )
    recorded = await cur.fetchall()
    if not recorded:
        return frozenset()
    cur = await conn.execute(
        """SELECT c.relname FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
           WHERE i.indrelid = 'dw_message_embeddings'::regclass AND i.indisvalid AND c.relname = ANY(%s)""",
        ([name for _, _, name in recorded],),
    )
    valid = {name for (name,) in await cur.fetchall()}
    return frozenset((model, int(dimension)) for model, dimension, name in recorded if name in valid)


def _view_bytes(org_id: object, view: object) -> int:
    """An org's cached view as charged: the entry's own size and each (model, dimension)."""
    models = view if isinstance(view, frozenset) else frozenset()
    return entry_bytes(org_id, view) + sum(sys.getsizeof(model) + 100 for model, _ in models)
