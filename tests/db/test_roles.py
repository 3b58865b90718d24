"""The database role split of docs/operations/database.md ("Roles and grants"), run as written there: the
DBA's statements as a superuser, `dwsearch migrate` as the owner role (no superuser), the
owner's grants, then serve's start-up check and a sweep, search and index upsert as the
app role. And the error when the `vector` extension is missing and the owner cannot
create it."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from db_workload import run_workload, scratch_database, with_params
from sweep_harness import SweepFakeEmbedder

from dwsearch.db.migrate import MissingExtension, dev_schema_sql, migrate
from dwsearch.db.pool import open_pool
from dwsearch.db.schema import check_schema, missing_schema

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations" / "database.md"
OWNER, APP = "dwsearch_owner", "dwsearch_app"


def docs_sql(step: str) -> str:
    """The SQL block between <!-- db-roles:STEP --> and <!-- /db-roles:STEP -->."""
    text = DOCS.read_text()
    match = re.search(rf"<!-- db-roles:{step} -->\s*```sql\n(.*?)```\s*<!-- /db-roles:{step} -->", text, re.S)
    assert match, f"docs/operations/database.md has no db-roles:{step} block"
    return match.group(1)


def drop_roles(server_url: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        for role in (OWNER, APP):
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                conn.execute(f"DROP OWNED BY {role} CASCADE")  # in database `postgres` (default privileges)
                conn.execute(f"DROP ROLE {role}")


@pytest.fixture
def split(server_url: str) -> Iterator[dict[str, str]]:
    """A database like the Go module's (its tables, created by a superuser, no vector
    extension), and the URLs of the superuser, the owner role and the app role into it.
    The roles do not exist yet: the test runs the DBA's step."""
    drop_roles(server_url)
    with scratch_database(server_url, "dws_roles") as name:
        admin = with_params(server_url, dbname=name)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(dev_schema_sql())  # the Go module's tables
        try:
            yield {
                "admin": admin,
                "owner": with_params(admin, user=OWNER),
                "app": with_params(admin, user=APP),
            }
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                for role in (OWNER, APP):
                    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                        conn.execute(f"DROP OWNED BY {role} CASCADE")
    drop_roles(server_url)


@pytest.fixture
async def fake() -> AsyncIterator[SweepFakeEmbedder]:
    fake = SweepFakeEmbedder()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


def run_dba_step(admin: str, *, with_extension: bool = True) -> None:
    statements = docs_sql("dba")
    if not with_extension:
        statements = statements.replace("CREATE EXTENSION IF NOT EXISTS vector;", "")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(statements)


def test_migrate_as_an_owner_without_the_extension_names_the_statement_to_run(split):
    run_dba_step(split["admin"], with_extension=False)
    database = psycopg.conninfo.conninfo_to_dict(split["admin"])["dbname"]
    with pytest.raises(MissingExtension) as caught:
        migrate(split["owner"])
    message = str(caught.value)
    assert "CREATE EXTENSION IF NOT EXISTS vector;" in message
    assert f"database {database!r}" in message and "superuser" in message and repr(OWNER) in message
    with psycopg.connect(split["admin"]) as conn:  # nothing was applied
        assert conn.execute("SELECT count(*) FROM dwsearch_schema_migrations").fetchone() == (0,)
        assert conn.execute("SELECT to_regclass('dw_message_embeddings')").fetchone() == (None,)
    # The command says the same, in one line, and exits non-zero.
    cmd = [sys.executable, "-m", "dwsearch.cli", "migrate", "--database-url", split["owner"]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "CREATE EXTENSION IF NOT EXISTS vector;" in proc.stderr and "Traceback" not in proc.stderr, (
        proc.stderr
    )
    # Once the DBA has created it, the same owner migrates.
    with psycopg.connect(split["admin"], autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    assert len(migrate(split["owner"])) > 0


async def test_the_documented_role_split_runs_serve_as_the_app_role(split, fake):
    run_dba_step(split["admin"])
    with psycopg.connect(split["owner"]) as conn:
        assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() == (
            False,
        )
    applied = migrate(split["owner"])
    assert applied and migrate(split["owner"]) == []
    with psycopg.connect(split["owner"], autocommit=True) as conn:
        conn.execute(docs_sql("owner"))
    with psycopg.connect(split["admin"]) as conn:
        owners = dict(
            conn.execute(
                "SELECT tablename, tableowner FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'dw%'"
            ).fetchall()
        )
    assert {t for t, o in owners.items() if o == OWNER} >= {
        "dw_message_embeddings",
        "dw_index_documents",
        "dwsearch_schema_migrations",
        "dw_sweep_key_leases",
    }

    # serve's start-up check passes as the app role.
    check_schema(split["app"])
    with psycopg.connect(split["app"]) as conn:
        assert missing_schema(conn) == []

    # A sweep, a purge, searches and index upserts, as the app role.
    pool = await open_pool(split["app"], min_size=1, max_size=4)
    try:
        await run_workload(split["admin"], pool, fake)
    finally:
        await pool.close()

    # And nothing more: no DDL, no writes to the Go module's tables or the migrations' record.
    denied = [
        "CREATE TABLE dw_app_made (x int)",
        "INSERT INTO dw_chat_events (org_id, provider, external_channel_id, event_type, decision) "
        "VALUES ('o', 'p', 'c', 'message', 'received')",
        "UPDATE org_feature_flags SET enabled = false",
        "DELETE FROM dwsearch_schema_migrations",
        "ALTER TABLE dw_index_documents ADD COLUMN x int",
        "DROP TABLE dw_sweep_key_leases",
    ]
    for statement in denied:
        with psycopg.connect(split["app"]) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)
    # A later migration's table is the app's by the default privileges alone.
    with psycopg.connect(split["owner"], autocommit=True) as conn:
        conn.execute("CREATE TABLE dw_future (x int)")
    with psycopg.connect(split["app"], autocommit=True) as conn:
        conn.execute("INSERT INTO dw_future VALUES (1)")
        assert conn.execute("SELECT x FROM dw_future").fetchall() == [(1,)]
