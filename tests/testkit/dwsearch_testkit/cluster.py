"""Running the suites on a Citus cluster: with DWSEARCH_TEST_CITUS_WORKERS=N the session's
Postgres (tests/conftest.py's server_url) is the coordinator of a local cluster of N
workers (dwsearch.db.citus), so every test that takes db_url runs on it unchanged.

A few tests inspect what only one node has (its pg_locks, a prepared statement's
generic plan, its index statistics): `one_node_only` skips them on the cluster, saying
which cluster test covers the same ground."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CLUSTER_ENV = "DWSEARCH_TEST_CITUS_WORKERS"
CLUSTER_WORKERS = int(os.environ.get(CLUSTER_ENV) or 0)
ON_CLUSTER = CLUSTER_WORKERS > 0
# Each test migrates a fresh schema, distributing a dozen tables: 4 shards a table, not 32.
CLUSTER_SETTINGS = {"citus.shard_count": "4"}


def one_node_only(why: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(ON_CLUSTER, reason=f"one node only: {why}")


# Statements waiting on a lock another transaction holds: on a cluster the waits happen on
# the workers, and citus_lock_waits gathers them (pg_locks is one node's).
LOCK_WAITS = (
    "SELECT count(*) FROM citus_lock_waits"
    if ON_CLUSTER
    else "SELECT count(*) FROM pg_locks WHERE NOT granted"
)
# A statement LIKE %s waiting on a lock (whatever node it waits on).
WAITING_STATEMENT = (
    "SELECT 1 FROM citus_lock_waits WHERE blocked_statement LIKE %s"
    if ON_CLUSTER
    else "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s"
)

# The workers' server URLs, once tests/conftest.py has started the cluster.
WORKER_URLS: list[str] = []


def through_a_worker(url: str, worker: int = 0) -> str:
    """`url` (a test's schema on the session's server) on a worker instead of the
    coordinator: Citus lets clients query distributed tables from any node. On one node,
    `url` itself."""
    if not ON_CLUSTER:
        return url
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    node = conninfo_to_dict(WORKER_URLS[worker])
    return make_conninfo(url, host=node["host"], port=node["port"])


def citus_source() -> Path | None:
    """The Citus source tarball to build a cluster from (dwsearch.db.citus.find_source),
    or None where there is none; under CI its absence is an error, never a skip."""
    from dwsearch.db import citus

    try:
        return citus.find_source(os.environ.get(citus.SOURCE_ENV, ""))
    except citus.CitusUnavailable:
        if os.environ.get("CI"):
            raise
        return None
