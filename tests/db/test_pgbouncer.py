"""dwsearch behind a real pgbouncer in transaction mode (docs/operations/database.md, "pgbouncer"):
with DWSEARCH_DB_TRANSACTION_POOLING (open_pool(transaction_pooling=True)) migrations, a
sweep, a purge, searches and index upserts work, and two concurrent sweeps never embed a
window twice. pgbouncer runs 2 server connections for many clients, so consecutive
transactions of one client land on different server sessions. Skipped without the
`pgbouncer` binary (apt-get install pgbouncer)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psycopg
import pytest
from db_workload import chat, run_workload, scratch_database, with_params
from pgbouncer import pgbouncer
from sweep_harness import ORG, Harness, SweepFakeEmbedder, sweep_once

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.db.migrate import migrate, migrations
from dwsearch.db.pool import open_pool, transaction_pooled
from dwsearch.db.schema import check_schema
from dwsearch.sweep.store import keys
from dwsearch.sweep.sweeper import Sweeper
from dwsearch_testkit.fakes import FAKE_MODEL
from dwsearch_testkit.seed import enable_semantic_search


@pytest.fixture
def urls(server_url: str) -> Iterator[dict[str, str]]:
    """A fresh database migrated through pgbouncer: {"direct": ..., "bouncer": ...}."""
    with scratch_database(server_url, "dws_pgb") as name, pgbouncer(server_url, pool_size=2) as bouncer:
        direct = with_params(server_url, dbname=name)
        with psycopg.connect(direct, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        yield {"direct": direct, "bouncer": with_params(bouncer, dbname=name)}


@pytest.fixture
async def fake() -> AsyncIterator[SweepFakeEmbedder]:
    fake = SweepFakeEmbedder()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


def migrated(urls: dict[str, str]) -> None:
    # Two at once through transaction pooling: each migration under its transaction lock.
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: migrate(urls["bouncer"], dev_schema=True), range(2)))
    # Each migration is applied once, by one of them (each under its own transaction lock).
    assert sorted(v for r in results for v in r) == [f"{m.version:04d}_{m.name}" for m in migrations()]
    check_schema(urls["bouncer"])


async def test_a_serve_workload_through_pgbouncer_transaction_mode(urls, fake):
    migrated(urls)
    pool = await open_pool(urls["bouncer"], min_size=2, max_size=6, transaction_pooling=True)
    try:
        async with pool.connection() as conn:
            assert transaction_pooled(conn) and conn.prepare_threshold is None
        await run_workload(urls["direct"], pool, fake)
    finally:
        await pool.close()
    with psycopg.connect(urls["direct"]) as conn:
        assert conn.execute("SELECT count(*) FROM dw_sweep_key_leases").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone() == (0,)


async def test_two_sweeps_through_pgbouncer_never_embed_a_window_twice(urls, fake):
    migrated(urls)
    enable_semantic_search(urls["direct"], ORG)
    pools = [
        await open_pool(urls["bouncer"], min_size=1, max_size=6, transaction_pooling=True) for _ in range(2)
    ]
    client = EmbedderClient(fake.address, timeout=10)
    try:
        harness = Harness(urls["direct"], pools[0], client, fake)
        for c in range(8):
            harness.insert(f"c{c}", [m for s in range(3) for m in chat(4, start=60 * s, tag=f"c{c}s{s}")])
        fake.delay = 0.01
        other = Sweeper(
            pools[1], client, model=FAKE_MODEL, clock=harness.clock, redaction=harness.sweeper().redaction
        )
        one, two = await asyncio.gather(sweep_once(harness.sweeper()), sweep_once(other))
        assert one.keys_stalled == two.keys_stalled == 0
        assert one.windows_embedded + two.windows_embedded == 24
        assert one.keys_locked + two.keys_locked > 0 or min(one.windows_embedded, two.windows_embedded) == 0
        assert max(Counter(fake.received).values()) == 1  # no chunk embedded twice
        embedded = harness.embedded()
        assert len(embedded) == len(set(embedded)) == 24
        assert set(embedded) == await harness.expected()
        assert harness.query("SELECT count(*) FROM dw_sweep_key_leases") == [(0,)]
    finally:
        await client.close()
        for pool in pools:
            await pool.close()


async def test_a_key_lease_excludes_other_sweepers_until_released_or_expired(db_url):
    """The lease itself (no pgbouncer needed): held, refused to another connection,
    released by its holder only, and taken over once expired."""
    key = keys.Key(ORG, "whatsapp", "c1")
    pool = await open_pool(db_url, min_size=2, max_size=2, transaction_pooling=True)
    try:
        async with pool.connection() as a, pool.connection() as b:
            assert await keys.try_lock_key(a, key, FAKE_MODEL)
            assert not await keys.try_lock_key(b, key, FAKE_MODEL)
            assert await keys.try_lock_key(b, keys.Key(ORG, "whatsapp", "c2"), FAKE_MODEL)  # another key
            assert await keys.try_lock_key(b, key, "other-model")  # another model
            await keys.unlock_key(b, key, FAKE_MODEL)  # not b's: changes nothing
            assert not await keys.try_lock_key(b, key, FAKE_MODEL)
            await keys.unlock_key(a, key, FAKE_MODEL)
            assert await keys.try_lock_key(b, key, FAKE_MODEL)
            # A holder that died: its lease expires, then another takes the key.
            await a.execute("UPDATE dw_sweep_key_leases SET expires_at = now() - %s", (timedelta(seconds=1),))
            assert await keys.try_lock_key(a, key, FAKE_MODEL)
            (advisory,) = await (
                await a.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
            ).fetchone()
            assert advisory == 0
    finally:
        await pool.close()
