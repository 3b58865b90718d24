"""Versioned SQL migrations for the tables dwsearch owns.

Files `migrations/NNNN_name.sql` apply in order, each in its own transaction, recorded
in `dwsearch_schema_migrations`. The whole run holds a Postgres advisory lock, so two
pods starting together apply each migration once and both succeed.
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


def migrate(url: str, *, dev_schema: bool = False) -> list[str]:
    """Apply pending migrations (and the Go-owned dev tables); return what was applied."""
    applied_now: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            conn.execute(
                """CREATE TABLE IF NOT EXISTS dwsearch_schema_migrations (
                       version    integer PRIMARY KEY,
                       name       text        NOT NULL,
                       checksum   text        NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
            done = dict(conn.execute("SELECT version, checksum FROM dwsearch_schema_migrations").fetchall())
            for m in migrations():
                if m.version in done:
                    if done[m.version] != m.checksum:
                        log.warning(
                            "applied migration differs from its file",
                            extra={"version": m.version, "migration": m.name},
                        )
                    continue
                with conn.transaction():
                    conn.execute(m.sql)  # type: ignore[arg-type]  # trusted file, several statements
                    conn.execute(
                        "INSERT INTO dwsearch_schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                        (m.version, m.name, m.checksum),
                    )
                applied_now.append(f"{m.version:04d}_{m.name}")
                log.info("migration applied", extra={"version": m.version, "migration": m.name})
            if dev_schema:
                with conn.transaction():
                    conn.execute(dev_schema_sql())  # type: ignore[arg-type]
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    return applied_now
