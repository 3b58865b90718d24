"""Faults on a Citus cluster (docs/scaling.md, "Faults"): a worker stopped, fast and
immediate, in the middle of a sweep and under searches, then started again; and the
coordinator restarted under serve's pool. Each test has its own orgs on a cluster of its
module: one org whose shards lie on the worker that stays up, one on the worker stopped."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import grpc
import psycopg
import pytest
from sweep_harness import Harness, SweepFakeEmbedder, sweep_once

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.clients.reranker import RerankerClient
from dwsearch.common import metrics
from dwsearch.common.errors import classify
from dwsearch.common.grpcstatus import GRPC_STATUS
from dwsearch.db import citus
from dwsearch.db.migrate import migrate
from dwsearch.db.pool import open_pool
from dwsearch.search import knnindex
from dwsearch.search.knnindex import OrgKnnIndexes
from dwsearch.search.query import Mode, SearchQuery
from dwsearch.search.searcher import Searcher
from dwsearch.search.settings import SearchSettings
from dwsearch.search.store import knn
from dwsearch_testkit.cluster import CLUSTER_SETTINGS, citus_source
from dwsearch_testkit.fakes import FAKE_MODEL
from dwsearch_testkit.seed import enable_semantic_search

pytestmark = pytest.mark.slow

SOURCE = citus_source()
needs_source = pytest.mark.skipif(
    SOURCE is None, reason="no Citus source here (DWSEARCH_CITUS_SOURCE or shared/vendor)"
)
# A statement to a stopped worker fails at once (its port refuses connections): a caller
# hears of it well within this.
FAIL_WITHIN_S = 10.0
UP, DOWN = 1, 2  # the worker that stays up, the one stopped (node numbers)


@pytest.fixture(scope="module")
def cluster() -> Iterator[citus.CitusCluster]:
    if SOURCE is None:
        pytest.skip("no Citus source")
    with citus.local_cluster(workers=2, source=SOURCE, settings=CLUSTER_SETTINGS) as started:
        migrate(started.coordinator_url, dev_schema=True)
        yield started


def org_on(cluster: citus.CitusCluster, node: int, prefix: str) -> str:
    """An org id whose shards (every org table's: one co-location group) lie on `node`."""
    with psycopg.connect(cluster.coordinator_url, autocommit=True) as conn:
        for i in range(200):
            org = f"{prefix}-{i}"
            row = conn.execute(
                """SELECT n.nodeport FROM pg_dist_placement AS p JOIN pg_dist_node AS n ON n.groupid = p.groupid
                   WHERE p.shardid = get_shard_id_for_distribution_column('dw_chat_events', %s::text)""",
                (org,),
            ).fetchone()
            if row is not None and row[0] == cluster.ports[node]:
                return org
    raise AssertionError(f"no org of {prefix} on node {node}")


def chat(n: int, start: float = 0, tag: str = "m") -> list[tuple[float, str]]:
    return [(start + i, f"{tag} message number {i} about the parcel refund") for i in range(n)]


@pytest.fixture
async def harness(cluster: citus.CitusCluster) -> AsyncIterator[Harness]:
    fake = SweepFakeEmbedder()
    await fake.start()
    pool = await open_pool(cluster.coordinator_url, min_size=1, max_size=8)
    embedder = EmbedderClient(fake.address, timeout=10)
    try:
        yield Harness(cluster.coordinator_url, pool, embedder, fake)
    finally:
        await embedder.close()
        await pool.close()
        await fake.stop()
        for node in (UP, DOWN):
            if not (cluster.node_dir(node) / "postmaster.pid").exists():
                cluster.start_node(node)  # a failed test leaves the next one a whole cluster


def searcher_over(
    harness: Harness, reranker: RerankerClient, knn_indexes: OrgKnnIndexes | None = None
) -> Searcher:
    """A Searcher as serve composes it (DWSEARCH_KNN_INDEX=auto: orgs' own indexes)."""
    return Searcher(
        harness.pool,
        harness.embedder,
        reranker,
        SearchSettings(models=(FAKE_MODEL,), embed_timeout=10, rerank_timeout=2),
        knn_indexes=knn_indexes or OrgKnnIndexes(),
    )


async def search_fails_fast(searcher: Searcher, org: str) -> grpc.StatusCode:
    started = time.monotonic()
    with pytest.raises(Exception) as raised:
        await asyncio.wait_for(
            searcher.search(SearchQuery(org, "parcel refund", rerank=False)), FAIL_WITHIN_S
        )
    assert time.monotonic() - started < FAIL_WITHIN_S
    return GRPC_STATUS[classify(raised.value).kind]


@needs_source
@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_a_worker_stopped_mid_sweep_fails_only_its_orgs_and_the_next_sweeps_lose_and_duplicate_nothing(
    cluster, harness, mode
):
    prefix = uuid.uuid4().hex[:8]
    live, down = org_on(cluster, UP, f"live-{prefix}"), org_on(cluster, DOWN, f"down-{prefix}")
    enable_semantic_search(harness.url, live, down)
    for org in (live, down):
        for c in range(3):
            harness.insert(
                f"c{c}", [m for s in range(3) for m in chat(3, start=60 * s, tag=f"{org}c{c}s{s}")], org=org
            )
    embedding, stopped = asyncio.Event(), asyncio.Event()

    async def hold_until_the_worker_stopped() -> None:  # inside the sweep's embedding calls
        embedding.set()
        await stopped.wait()

    harness.fake.on_embed = hold_until_the_worker_stopped
    reranker = RerankerClient("127.0.0.1:9", timeout=1)
    try:
        sweep = asyncio.ensure_future(sweep_once(harness.sweeper()))
        await asyncio.wait_for(embedding.wait(), 30)  # the sweep has found both orgs' keys, one in flight
        await asyncio.to_thread(cluster.stop_node, DOWN, mode)
        stopped.set()
        # The sweep that found both orgs' keys: the stopped worker's keys stall, saying
        # why, and the live worker's org is swept whole, within the deadline.
        progress = await asyncio.wait_for(sweep, 60)
        assert not (cluster.node_dir(DOWN) / "postmaster.pid").exists()
        stalled = {s.key.org_id for m in progress.models for s in m.stalled}
        assert stalled == {down} and all("database" in s.error for m in progress.models for s in m.stalled)
        assert len(harness.embedded(org=live)) == 9
        # Now the org sweeps: the live worker's answers (nothing left), the other's fails at once.
        assert (await asyncio.wait_for(sweep_once(harness.sweeper(), org_id=live), 60)).keys_stalled == 0
        with pytest.raises(psycopg.OperationalError, match="connection to the remote node"):
            await asyncio.wait_for(sweep_once(harness.sweeper(), org_id=down), FAIL_WITHIN_S)
        # A sweep of every org (the CronJob's) leaves out the orgs of the stopped worker,
        # saying why, and sweeps the others: the live org's new session is embedded.
        harness.insert("c0", chat(3, start=60 * 3, tag=f"{live}c0s3"), org=live)
        progress = await asyncio.wait_for(sweep_once(harness.sweeper()), FAIL_WITHIN_S)
        skipped = dict(progress.orgs_skipped)
        assert "unreachable" in skipped[down] and f":{cluster.ports[DOWN]}" in skipped[down]
        assert live not in skipped and progress.keys_stalled == 0
        assert len(harness.embedded(org=live)) == 10
        assert metrics.SWEEP_ORGS_UNREACHABLE._value.get() >= 1
        # Searches: the live worker's org answers, the other's is UNAVAILABLE at once.
        searcher = searcher_over(harness, reranker)
        result = await asyncio.wait_for(searcher.search(SearchQuery(live, "parcel refund", rerank=False)), 10)
        assert result.hits
        assert await search_fails_fast(searcher, down) == grpc.StatusCode.UNAVAILABLE

        await asyncio.to_thread(cluster.start_node, DOWN)
        harness.fake.on_embed = None
        for _ in range(3):  # the pool's broken connections go as they fail
            try:
                await sweep_once(harness.sweeper())
                break
            except psycopg.OperationalError:
                continue
        progress = await sweep_once(harness.sweeper())
        assert progress.keys_stalled == 0 and down not in dict(progress.orgs_skipped)
        assert metrics.SWEEP_ORGS_UNREACHABLE._value.get() == 0
        for org, windows in ((live, 10), (down, 9)):
            embedded = harness.embedded(org=org)
            assert len(embedded) == len(set(embedded)) == windows  # none lost, none twice
            assert set(embedded) == await harness.expected(org=org)
        result = await searcher.search(SearchQuery(down, "parcel refund", rerank=False))
        assert result.hits
    finally:
        await reranker.close()


@needs_source
async def test_serve_s_pool_survives_a_coordinator_restart(cluster, harness):
    org = org_on(cluster, UP, f"restart-{uuid.uuid4().hex[:8]}")
    enable_semantic_search(harness.url, org)
    harness.insert("c1", chat(3))
    harness.insert("c1", chat(3, tag=org), org=org)
    await sweep_once(harness.sweeper(), org_id=org)
    reranker = RerankerClient("127.0.0.1:9", timeout=1)
    try:
        searcher = searcher_over(harness, reranker)
        assert (await searcher.search(SearchQuery(org, "parcel refund", rerank=False))).hits
        await asyncio.to_thread(cluster.stop_node, 0, "fast")
        await asyncio.to_thread(cluster.start_node, 0)
        codes = []
        for _ in range(10):  # each broken pooled connection fails one search, UNAVAILABLE
            try:
                result = await searcher.search(SearchQuery(org, "parcel refund", rerank=False))
                break
            except Exception as exc:
                codes.append(GRPC_STATUS[classify(exc).kind])
        else:
            raise AssertionError(f"no search succeeded after the restart: {codes}")
        assert result.hits
        assert set(codes) <= {grpc.StatusCode.UNAVAILABLE}
    finally:
        await reranker.close()


@needs_source
async def test_the_live_worker_s_org_searches_after_its_knn_index_copy_expires(cluster, harness, monkeypatch):
    """Search's copy of an org's dw_knn_indexes rows is read again once its ttl has passed
    (KNN_INDEX_REFRESH_S; a fake clock here): with a worker stopped, that read of the live
    worker's org is its own shard's, so SEMANTIC and HYBRID searches go on answering,
    through the org's index, and the stopped worker's org is UNAVAILABLE at once."""
    prefix = uuid.uuid4().hex[:8]
    live, down = org_on(cluster, UP, f"knn-live-{prefix}"), org_on(cluster, DOWN, f"knn-down-{prefix}")
    enable_semantic_search(harness.url, live, down)
    for org in (live, down):
        harness.insert("c0", chat(6, tag=org), org=org)
        await sweep_once(harness.sweeper(), org_id=org)
    ((dimension,),) = harness.query(
        "SELECT vector_dims(embedding) FROM dw_message_embeddings WHERE org_id = %s LIMIT 1", (live,)
    )
    async with await psycopg.AsyncConnection.connect(cluster.coordinator_url, autocommit=True) as conn:
        await knnindex.build_org_index(conn, live, FAKE_MODEL, dimension)  # the live org's own index

    used: list[tuple[str, bool]] = []  # (org, org_index) of each dense KNN
    real = knn.dense_knn

    async def spy(conn, scope, model, vector, k, **kwargs):
        used.append((scope.org_id, kwargs.get("org_index", False)))
        return await real(conn, scope, model, vector, k, **kwargs)

    monkeypatch.setattr(knn, "dense_knn", spy)
    now = [0.0]
    reranker = RerankerClient("127.0.0.1:9", timeout=1)
    try:
        searcher = searcher_over(harness, reranker, OrgKnnIndexes(ttl=60, clock=lambda: now[0]))
        modes = (Mode.SEMANTIC, Mode.HYBRID)
        for mode in modes:
            assert (await searcher.search(SearchQuery(live, "parcel refund", mode=mode, rerank=False))).hits
        assert used == [(live, True), (live, True)]
        await asyncio.to_thread(cluster.stop_node, DOWN, "fast")
        now[0] = 61  # the live org's copy has expired: the next search reads its rows again
        used.clear()
        for mode in modes:
            result = await asyncio.wait_for(
                searcher.search(SearchQuery(live, "parcel refund", mode=mode, rerank=False)), FAIL_WITHIN_S
            )
            assert result.hits
        assert used == [(live, True), (live, True)]
        assert await search_fails_fast(searcher, down) == grpc.StatusCode.UNAVAILABLE
    finally:
        await reranker.close()
        if not (cluster.node_dir(DOWN) / "postmaster.pid").exists():
            await asyncio.to_thread(cluster.start_node, DOWN)
        for _ in range(3):  # the pool's broken connections go as they fail
            try:
                async with await psycopg.AsyncConnection.connect(
                    cluster.coordinator_url, autocommit=True
                ) as conn:
                    await knnindex.drop_org_index(conn, live, FAKE_MODEL)
                break
            except psycopg.OperationalError:
                await asyncio.sleep(1)
