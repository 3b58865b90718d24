"""Versioned SQL migrations for the tables dwsearch owns.

Files `migrations/NNNN_name.sql` apply in order, each in its own transaction, recorded
in `dwsearch_schema_migrations`. Each of those transactions takes a transaction-scoped
advisory lock and checks again what is applied, so two pods starting together apply each
migration once and both succeed, also through pgbouncer in transaction mode (a session
lock would stay on whichever server connection took it).

The migrations run as the role that owns dwsearch's tables (not a superuser), so the
`vector` extension, which only a superuser can create, must exist first: a run that
needs it and cannot create it stops with the statement a DBA must run
(docs/operations/database.md, "Roles and grants").
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources

import psycopg

log = logging.getLogger(__name__)

# pg_advisory_lock key: "dwsearch" as 8 ASCII bytes.
MIGRATION_LOCK_KEY = int.from_bytes(b"dwsearch", "big")
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


class MigrationError(RuntimeError):
    pass


class MissingExtension(MigrationError):
    """The `vector` extension is absent and this role cannot create it."""


_NEEDS_VECTOR = re.compile(r"\bCREATE\s+EXTENSION\s+(IF\s+NOT\s+EXISTS\s+)?vector\b", re.IGNORECASE)


def migrations() -> list[Migration]:
    found = []
    for entry in resources.files("dwsearch.db.migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions: {versions}")
    return found


def dev_schema_sql() -> str:
    return resources.files("dwsearch.db").joinpath("dev_schema.sql").read_text(encoding="utf-8")


def _ensure_vector(conn: psycopg.Connection) -> None:
    """Create the `vector` extension if it is missing, or raise MissingExtension saying
    what a DBA must run: pgvector is not a trusted extension, so only a superuser can."""
    if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone():
        return
    row = conn.execute("SELECT current_database(), current_user").fetchone()
    assert row is not None  # a SELECT without FROM returns one row
    database, user = row
    statement = "CREATE EXTENSION IF NOT EXISTS vector;"
    if not conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone():
        raise MissingExtension(
            f"the Postgres server has no pgvector (extension `vector` is not available): install it on the "
            f"server (e.g. the postgresql-<major>-pgvector package), then as a superuser in database "
            f"{database!r} run: {statement}"
        )
    try:
        with conn.transaction():
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.errors.InsufficientPrivilege as exc:
        raise MissingExtension(
            f"extension `vector` is missing from database {database!r} and role {user!r} cannot create it "
            f"({exc.diag.message_primary}); a DBA must run, as a superuser, in database {database!r}: {statement} "
            "-- then run `dwsearch migrate` again (docs/operations/database.md)"
        ) from exc
    log.info("extension created", extra={"extension": "vector", "database": database})


def _applied(conn: psycopg.Connection) -> dict[int, str]:
    return dict(conn.execute("SELECT version, checksum FROM dwsearch_schema_migrations").fetchall())


def migrate(url: str, *, dev_schema: bool = False) -> list[str]:
    """Apply pending migrations (and the Go-owned dev tables); return what was applied."""
    applied_now: list[str] = []
    lock = "SELECT pg_advisory_xact_lock(%s)"
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        with conn.transaction():
            conn.execute(lock, (MIGRATION_LOCK_KEY,))
            conn.execute(
                """CREATE TABLE IF NOT EXISTS dwsearch_schema_migrations (
                       version    integer PRIMARY KEY,
                       name       text        NOT NULL,
                       checksum   text        NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
            done = _applied(conn)
        pending = [m for m in migrations() if m.version not in done]
        if any(_NEEDS_VECTOR.search(m.sql) for m in pending):
            _ensure_vector(conn)
        for m in migrations():
            if m.version in done:
                if done[m.version] != m.checksum:
                    log.warning(
                        "applied migration differs from its file",
                        extra={"version": m.version, "migration": m.name},
                    )
                continue
            with conn.transaction():
                conn.execute(lock, (MIGRATION_LOCK_KEY,))
                if m.version in _applied(conn):
                    continue  # another process applied it while we waited
                conn.execute(m.sql)  # a trusted file of several statements
                conn.execute(
                    "INSERT INTO dwsearch_schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (m.version, m.name, m.checksum),
                )
            applied_now.append(f"{m.version:04d}_{m.name}")
            log.info("migration applied", extra={"version": m.version, "migration": m.name})
        if dev_schema:
            with conn.transaction():
                conn.execute(lock, (MIGRATION_LOCK_KEY,))
                conn.execute(dev_schema_sql())
    return applied_now
