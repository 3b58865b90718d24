"""Fixtures of the sweep tests; the harness itself is tests/support/sweep_harness.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from psycopg_pool import AsyncConnectionPool
from sweep_harness import ORG, Harness, SweepFakeEmbedder

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.db.pool import open_pool
from dwsearch_testkit.seed import enable_semantic_search


@pytest.fixture
async def fake_embedder() -> AsyncIterator[SweepFakeEmbedder]:
    fake = SweepFakeEmbedder()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    pool = await open_pool(db_url, min_size=1, max_size=8)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
async def embedder_client(fake_embedder: SweepFakeEmbedder) -> AsyncIterator[EmbedderClient]:
    client = EmbedderClient(fake_embedder.address, timeout=10)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def harness(
    db_url: str, pool: AsyncConnectionPool, embedder_client: EmbedderClient, fake_embedder: SweepFakeEmbedder
) -> Harness:
    enable_semantic_search(db_url, ORG)
    return Harness(db_url, pool, embedder_client, fake_embedder)
