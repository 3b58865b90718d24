"""Per-org HNSW indexes (dwsearch.search.knnindex): which orgs get one, how it is built,
recorded and dropped, the per-org statement that uses it, and search with knn_index = auto
(an org's own index where it has a valid one, exact KNN everywhere else)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import timedelta

import numpy as np
import psycopg
import pytest
from partition_check import Recorder, Statement, explain, install, task_counts
from pgvector import HalfVector
from pgvector.psycopg import register_vector
from psycopg import AsyncConnection, sql

from dwsearch.search import knnindex
from dwsearch.search.knnindex import Action, OrgKnnIndexes, org_index_name
from dwsearch.search.query import Mode, SearchQuery
from dwsearch.search.store import knn
from dwsearch.search.store.scope import ChatScope
from dwsearch_testkit.cluster import ON_CLUSTER, one_node_only
from dwsearch_testkit.fakes import FAKE_MODEL, fake_vector
from dwsearch_testkit.seed import T0, enable_semantic_search

DIM = 32
MIN = 400  # the lowered threshold: org-big has 600 windows, org-a 30
BIG, SMALL = "org-big", "org-a"


def centroids(seed: int = 1, n: int = 12) -> np.ndarray:
    c = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return c / np.linalg.norm(c, axis=1, keepdims=True)


def clustered(n: int, seed: int) -> np.ndarray:
    """Unit vectors around a few well-separated topics: an easy set, where HNSW is exact."""
    rng = np.random.default_rng(seed)
    c = centroids()
    x = c[rng.integers(0, len(c), n)] + 0.15 * rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def load(url: str, org: str, vectors, *, model: str = FAKE_MODEL, contents: list[str] | None = None) -> None:
    """Embedded windows written straight into dw_message_embeddings (COPY)."""
    with psycopg.connect(url, autocommit=True) as conn:
        register_vector(conn)
        with (
            conn.cursor() as cur,
            cur.copy(
                "COPY dw_message_embeddings (org_id, model, provider, external_channel_id, window_start,"
                " window_end, embedding, content, source_message_ids) FROM STDIN WITH (FORMAT BINARY)"
            ) as copy,
        ):
            copy.set_types(
                [
                    "varchar",
                    "varchar",
                    "varchar",
                    "varchar",
                    "timestamptz",
                    "timestamptz",
                    "halfvec",
                    "text",
                    "text[]",
                ]
            )
            for i, v in enumerate(vectors):
                start = T0 + timedelta(minutes=i)
                content = contents[i] if contents else f"{org} window {i}"
                copy.write_row([org, model, "wa", f"c{i % 7}", start, start, HalfVector(v), content, []])
        conn.execute("ANALYZE dw_message_embeddings")


@pytest.fixture
def orgs(db_url):
    load(db_url, BIG, clustered(600, seed=2))
    load(db_url, SMALL, clustered(30, seed=3))
    return db_url


async def autocommit(url: str) -> AsyncConnection:
    return await AsyncConnection.connect(url, autocommit=True)


def recorded(url: str) -> list[tuple[str, str, int, str, int]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT org_id, model, dimension, index_name, windows_at_build FROM dw_knn_indexes ORDER BY org_id"
        ).fetchall()


def validity(url: str, name: str) -> list[bool]:
    with psycopg.connect(url) as conn:
        return [
            v
            for (v,) in conn.execute(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (name,)
            )
        ]


async def build_big(url: str) -> None:
    async with await autocommit(url) as conn:
        await knnindex.apply_plan(conn, await knnindex.plan_indexes(conn, MIN))


def steer(conn: psycopg.Connection) -> None:
    """600 windows of 32 dimensions cost the planner about as much to scan and sort as to
    walk a graph (at 10k windows of 1024 dimensions it picks the index by itself, measured):
    the scan-and-sort plans are priced out, so that only whether the index can be used at
    all decides."""
    conn.execute("SET enable_seqscan = off")
    conn.execute("SET enable_sort = off")
    if not conn.autocommit:  # a cluster's workers plan the shards: they take SET LOCAL only
        conn.execute("SET LOCAL citus.propagate_set_commands = 'local'")
        conn.execute("SET LOCAL enable_seqscan = off")
        conn.execute("SET LOCAL enable_sort = off")


def plan_text(url: str, org: str, vector) -> str:
    scope = ChatScope(org)
    statement = knn.org_index_statement(scope, FAKE_MODEL, DIM)
    params = {**scope.params(), "model": FAKE_MODEL, "vector": HalfVector(vector), "k": 5}
    with psycopg.connect(url) as conn:
        register_vector(conn)
        conn.execute("SET hnsw.iterative_scan = relaxed_order")
        steer(conn)
        return "\n".join(r[0] for r in conn.execute(sql.SQL("EXPLAIN {}").format(statement), params))


def test_index_names_are_hashed_identifiers():
    name = org_index_name("org-" + "x" * 300, "BAAI/bge-m3")
    assert name.startswith("dw_message_embeddings_knn_") and len(name) <= 63
    assert name.replace("_", "").isalnum()
    assert org_index_name("a", "m") != org_index_name("a", "n") != org_index_name("b", "m")


async def test_the_plan_builds_for_the_big_org_only(orgs):
    async with await autocommit(orgs) as conn:
        plan = await knnindex.plan_indexes(conn, MIN)
    assert [(p.org_id, p.model, p.action, p.windows, p.dimension) for p in plan] == [
        (BIG, FAKE_MODEL, Action.BUILD, 600, DIM)
    ]
    assert plan[0].index_name == org_index_name(BIG, FAKE_MODEL)
    assert recorded(orgs) == []  # planning changes nothing


async def test_a_build_records_its_index_once_valid_and_is_idempotent(orgs):
    await build_big(orgs)
    name = org_index_name(BIG, FAKE_MODEL)
    assert validity(orgs, name) == [True]
    assert recorded(orgs) == [(BIG, FAKE_MODEL, DIM, name, 600)]
    async with await autocommit(orgs) as conn:
        plan = await knnindex.plan_indexes(conn, MIN)
        assert [(p.org_id, p.action) for p in plan] == [(BIG, Action.KEEP)]
        await knnindex.apply_plan(conn, plan)
    assert validity(orgs, name) == [True] and recorded(orgs) == [(BIG, FAKE_MODEL, DIM, name, 600)]


async def test_a_failed_build_records_nothing(orgs):
    async with await autocommit(orgs) as conn:
        with pytest.raises(psycopg.Error):  # org-big's vectors have 32 dimensions, not 16
            await knnindex.build_org_index(conn, BIG, FAKE_MODEL, 16)
    assert recorded(orgs) == []
    # CONCURRENTLY leaves the failed build's invalid index behind; the next run rebuilds it.
    name = org_index_name(BIG, FAKE_MODEL)
    assert validity(orgs, name) == [False]
    await build_big(orgs)
    assert validity(orgs, name) == [True] and [r[0] for r in recorded(orgs)] == [BIG]


async def test_an_invalid_leftover_index_is_rebuilt(orgs):
    await build_big(orgs)
    name = org_index_name(BIG, FAKE_MODEL)
    with psycopg.connect(orgs, autocommit=True) as conn:  # as an interrupted CONCURRENTLY build leaves it
        conn.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass(%s)", (name,))
    assert validity(orgs, name) == [False]
    async with await autocommit(orgs) as conn:
        plan = await knnindex.plan_indexes(conn, MIN)
        assert [(p.org_id, p.action, p.reason) for p in plan] == [
            (BIG, Action.BUILD, "its index is missing or invalid")
        ]
        await knnindex.apply_plan(conn, plan)
    assert validity(orgs, name) == [True]


async def test_an_index_recorded_for_another_dimension_is_rebuilt(orgs):
    await build_big(orgs)
    with psycopg.connect(orgs, autocommit=True) as conn:  # as if the model's vectors had changed size
        conn.execute("UPDATE dw_knn_indexes SET dimension = 16")
    async with await autocommit(orgs) as conn:
        plan = await knnindex.plan_indexes(conn, MIN)
        assert [(p.action, p.dimension, p.reason) for p in plan] == [
            (Action.BUILD, DIM, f"dimension 16 recorded, the windows have {DIM}")
        ]
        await knnindex.apply_plan(conn, plan)
    assert [r[2] for r in recorded(orgs)] == [DIM]
    assert validity(orgs, org_index_name(BIG, FAKE_MODEL)) == [True]


async def test_an_index_is_dropped_only_below_half_the_threshold(orgs):
    await build_big(orgs)
    name = org_index_name(BIG, FAKE_MODEL)
    with psycopg.connect(orgs, autocommit=True) as conn:  # retention: 600 -> 250, still >= 200
        conn.execute(
            """DELETE FROM dw_message_embeddings WHERE id IN (
                   SELECT id FROM dw_message_embeddings WHERE org_id = %s ORDER BY window_start LIMIT 350)""",
            (BIG,),
        )
    async with await autocommit(orgs) as conn:
        assert [(p.action, p.windows) for p in await knnindex.plan_indexes(conn, MIN)] == [(Action.KEEP, 250)]
    with psycopg.connect(orgs, autocommit=True) as conn:  # 250 -> 150, under half of 400
        conn.execute(
            """DELETE FROM dw_message_embeddings WHERE id IN (
                   SELECT id FROM dw_message_embeddings WHERE org_id = %s ORDER BY window_start LIMIT 100)""",
            (BIG,),
        )
    async with await autocommit(orgs) as conn:
        plan = await knnindex.plan_indexes(conn, MIN)
        assert [(p.org_id, p.action) for p in plan] == [(BIG, Action.DROP)]
        await knnindex.apply_plan(conn, plan)
        assert await knnindex.plan_indexes(conn, MIN) == []
    assert recorded(orgs) == [] and validity(orgs, name) == []


async def test_the_per_org_statement_uses_the_partial_index_and_a_small_org_does_not(orgs):
    await build_big(orgs)
    name = org_index_name(BIG, FAKE_MODEL)
    query = clustered(1, seed=9)[0]
    assert name in plan_text(orgs, BIG, query)
    assert name not in plan_text(orgs, SMALL, query)


@one_node_only("a generic plan is the coordinator's; each worker plans its shard's statement, literals in it")
async def test_the_per_org_statement_uses_the_index_under_a_generic_plan(orgs):
    """psycopg prepares a statement it has run five times, and Postgres may then plan it
    once for any parameters; that generic plan still proves the index's predicate, since
    the org and the model are literals."""
    await build_big(orgs)
    name = org_index_name(BIG, FAKE_MODEL)
    scope = ChatScope(BIG)
    statement = knn.org_index_statement(scope, FAKE_MODEL, DIM)
    params = {**scope.params(), "model": FAKE_MODEL, "vector": HalfVector(clustered(1, seed=9)[0]), "k": 5}
    with psycopg.connect(orgs, autocommit=True) as conn:
        register_vector(conn)
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("SET hnsw.iterative_scan = relaxed_order")
        steer(conn)

        def index_scans() -> int:
            conn.execute("SELECT pg_stat_force_next_flush()")
            row = conn.execute(
                "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelid = to_regclass(%s)", (name,)
            ).fetchone()
            return int(row[0]) if row else 0

        before = index_scans()
        for _ in range(3):
            assert len(conn.execute(statement, params, prepare=True).fetchall()) == 5
        (generic,) = conn.execute(
            "SELECT sum(generic_plans) FROM pg_prepared_statements WHERE statement LIKE '%org-big%'"
        ).fetchone()
        assert generic >= 2
        assert index_scans() - before >= 2


async def test_the_big_orgs_results_equal_exact_knn(orgs, pool):
    await build_big(orgs)
    scope = ChatScope(BIG)
    async with pool.connection() as conn:
        for query in clustered(10, seed=11):
            vector = HalfVector(query)
            exact = await knn.dense_knn(conn, scope, FAKE_MODEL, vector, 5)
            indexed = await knn.dense_knn(conn, scope, FAKE_MODEL, vector, 5, org_index=True)
            assert [r.id for r in indexed] == [r.id for r in exact]
            assert [r.score for r in indexed] == pytest.approx([r.score for r in exact], abs=1e-3)


async def test_the_per_org_statement_honours_the_scope_and_exclude(orgs, pool):
    await build_big(orgs)
    vector = HalfVector(clustered(1, seed=12)[0])
    scoped = ChatScope(BIG, provider="wa", external_channel_id="c3", start=T0 + timedelta(minutes=100))
    conversation = ChatScope(BIG, "wa", "c3", T0 + timedelta(minutes=100), T0 + timedelta(minutes=300))
    async with pool.connection() as conn:
        for kwargs in ({}, {"exclude": conversation}):
            exact = await knn.dense_knn(conn, scoped, FAKE_MODEL, vector, 5, **kwargs)
            indexed = await knn.dense_knn(conn, scoped, FAKE_MODEL, vector, 5, org_index=True, **kwargs)
            assert [r.id for r in indexed] == [r.id for r in exact] and len(exact) == 5
            assert all(r.external_channel_id == "c3" and r.window_end >= scoped.start for r in indexed)
            if kwargs:
                assert all(
                    not (r.window_start <= conversation.end and r.window_end >= conversation.start)
                    for r in indexed
                )


async def test_the_cache_names_valid_recorded_indexes_and_refreshes(orgs, pool):
    now = [0.0]
    indexes = OrgKnnIndexes(ttl=60, clock=lambda: now[0])
    async with pool.connection() as conn:
        assert not await indexes.has_index(conn, BIG, FAKE_MODEL, DIM)
        await build_big(orgs)
        assert not await indexes.has_index(conn, BIG, FAKE_MODEL, DIM)  # until the copy is 60 s old
        now[0] = 61
        assert await indexes.has_index(conn, BIG, FAKE_MODEL, DIM)
        assert not await indexes.has_index(conn, BIG, FAKE_MODEL, 1024)  # another dimension
        assert not await indexes.has_index(conn, SMALL, FAKE_MODEL, DIM)
        assert not await indexes.has_index(conn, BIG, "other/model", DIM)
        await conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(org_index_name(BIG, FAKE_MODEL))))
        now[0] = 122
        assert not await indexes.has_index(conn, BIG, FAKE_MODEL, DIM)  # the row alone is not enough


async def test_each_org_s_copy_is_its_own_with_its_own_ttl(orgs, pool):
    """An org's view is read with its own rows and expires on its own: one org's index
    built meanwhile is seen by an org read later, not by one read earlier, until its ttl."""
    now = [0.0]
    indexes = OrgKnnIndexes(ttl=60, clock=lambda: now[0])
    async with pool.connection() as conn:
        assert not await indexes.has_index(conn, BIG, FAKE_MODEL, DIM)  # BIG's copy, at 0
        await build_big(orgs)
        now[0] = 30
        assert not await indexes.has_index(conn, BIG, FAKE_MODEL, DIM)  # still BIG's copy of 0
        assert not await indexes.has_index(conn, SMALL, FAKE_MODEL, DIM)  # SMALL's, at 30
        now[0] = 61
        assert await indexes.has_index(conn, BIG, FAKE_MODEL, DIM)  # BIG's copy expired: read again


async def test_the_cache_of_many_orgs_is_bounded(db_url, pool):
    indexes = OrgKnnIndexes(ttl=60, max_bytes=20_000)
    async with pool.connection() as conn:
        for i in range(200):
            assert not await indexes.has_index(conn, f"org-{i}", FAKE_MODEL, DIM)
    assert 0 < len(indexes._cache) < 200 and indexes._cache.bytes <= 20_000


async def test_concurrent_searches_of_an_org_read_its_rows_once(orgs, pool, monkeypatch):
    await build_big(orgs)
    recorder = Recorder()
    install(monkeypatch, recorder)
    indexes = OrgKnnIndexes()

    async def ask(org: str) -> bool:
        async with pool.connection() as conn:
            return await indexes.has_index(conn, org, FAKE_MODEL, DIM)

    with recorder.recording():
        found = await asyncio.gather(*(ask(org) for org in (BIG, BIG, BIG, SMALL, SMALL)))
    assert found == [True, True, True, False, False]
    reads = [s.params for s in recorder.statements if "dw_knn_indexes" in s.text]
    assert sorted(reads) == [(SMALL,), (BIG,)]  # org-a, org-big
    assert indexes._locks == {}  # no lock left behind


async def test_the_request_path_reads_only_the_searched_orgs_rows(searchable, make_searcher, monkeypatch):
    """A search (knn_index = auto, as serve runs it) reads dw_knn_indexes by its org alone:
    `WHERE org_id = %s` with the searched org, on a Citus cluster one shard's task (a
    statement over every shard would touch every worker, and fail the org's searches when
    any worker is down)."""
    await build_big(searchable)
    recorder = Recorder()
    install(monkeypatch, recorder)
    searcher = make_searcher(knn_indexes=OrgKnnIndexes())
    with recorder.recording():
        for org in (BIG, SMALL):
            for mode in (Mode.SEMANTIC, Mode.HYBRID):
                assert (await searcher.search(SearchQuery(org, "refund", mode=mode))).hits
    reads = [s for s in recorder.statements if "dw_knn_indexes" in s.text]
    assert [s.params for s in reads] == [(BIG,), (SMALL,)]  # once per org: then its copy answers
    for statement in reads:
        assert " ".join(statement.text.split()).endswith("FROM dw_knn_indexes WHERE org_id = %s")
    if ON_CLUSTER:
        with psycopg.connect(searchable, autocommit=True) as conn:
            for statement in reads:
                literal = Statement(
                    psycopg.ClientCursor(conn).mogrify(statement.text, statement.params), None
                )
                assert task_counts(explain(conn, literal)) == [1]


@pytest.fixture
def spy_knn(monkeypatch):
    """Records (org, org_index, ids) of every dense KNN the searcher runs."""
    calls: list[tuple[str, bool, list[str]]] = []
    real = knn.dense_knn

    async def spy(conn, scope, model, vector, k, **kwargs):
        rows = await real(conn, scope, model, vector, k, **kwargs)
        calls.append((scope.org_id, kwargs.get("org_index", False), [r.id for r in rows]))
        return rows

    monkeypatch.setattr(knn, "dense_knn", spy)
    return calls


@pytest.fixture
def searchable(db_url):
    """org-big with 600 windows and org-a with 30, one of each holding "refund" exactly."""
    enable_semantic_search(db_url, BIG, SMALL)
    for org, n, seed in ((BIG, 600, 2), (SMALL, 30, 3)):
        vectors = clustered(n, seed=seed)
        vectors[n // 2] = fake_vector("refund", DIM)
        load(
            db_url,
            org,
            vectors,
            contents=[f"{org} {'refund' if i == n // 2 else 'other'} {i}" for i in range(n)],
        )
    return db_url


async def test_auto_uses_the_big_orgs_index_and_exact_for_others(searchable, make_searcher, spy_knn):
    await build_big(searchable)
    searcher = make_searcher(knn_indexes=OrgKnnIndexes())
    big = await searcher.search(SearchQuery(BIG, "refund", mode=Mode.SEMANTIC))
    small = await searcher.search(SearchQuery(SMALL, "refund", mode=Mode.SEMANTIC))
    assert [(org, used) for org, used, _ in spy_knn] == [(BIG, True), (SMALL, False)]
    assert big.hits[0].text == f"{BIG} refund 300"
    assert small.hits[0].text == f"{SMALL} refund 15"


async def test_an_index_dropped_by_hand_falls_back_to_exact(searchable, make_searcher, spy_knn, pool):
    await build_big(searchable)
    searcher = make_searcher(knn_indexes=OrgKnnIndexes())
    await searcher.search(SearchQuery(BIG, "refund", mode=Mode.SEMANTIC))  # the copy names the index
    with psycopg.connect(searchable, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(org_index_name(BIG, FAKE_MODEL))))
    assert [r[0] for r in recorded(searchable)] == [BIG]  # the row is still there
    # The cached copy still names it: the same statement runs as an exact scan.
    result = await searcher.search(SearchQuery(BIG, "refund", mode=Mode.SEMANTIC))
    assert result.hits[0].text == f"{BIG} refund 300"
    # A fresh copy (as after KNN_INDEX_REFRESH_S) leaves the org on exact KNN.
    fresh = make_searcher(knn_indexes=OrgKnnIndexes())
    again = await fresh.search(SearchQuery(BIG, "refund", mode=Mode.SEMANTIC))
    assert [used for _, used, _ in spy_knn] == [True, True, False]
    assert again.hits[0].text == f"{BIG} refund 300"
    async with pool.connection() as conn:
        exact = await knn.dense_knn(
            conn, ChatScope(BIG), FAKE_MODEL, HalfVector(fake_vector("refund", DIM)), len(spy_knn[1][2])
        )
    assert spy_knn[1][2] == [r.id for r in exact] == spy_knn[2][2]


def test_knn_indexes_dry_run_prints_the_plan_and_changes_nothing(orgs):
    def run(*flags: str) -> str:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "dwsearch.cli",
                "knn-indexes",
                "--database-url",
                orgs,
                "--min-windows",
                str(MIN),
                *flags,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    dry = run("--dry-run")
    assert dry.splitlines() == [
        f"build org={BIG} model={FAKE_MODEL} windows=600: 600 windows, at least {MIN}"
        f" ({org_index_name(BIG, FAKE_MODEL)})"
    ]
    assert recorded(orgs) == []
    assert run().splitlines()[-1] == "done: 1 change(s)"
    assert [r[0] for r in recorded(orgs)] == [BIG]
    assert run().splitlines() == [
        f"keep org={BIG} model={FAKE_MODEL} windows=600: 600 windows ({org_index_name(BIG, FAKE_MODEL)})",
        "done: 0 change(s)",
    ]
