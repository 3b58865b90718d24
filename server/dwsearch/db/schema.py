"""Start-up check of the tables the Go module owns: `serve` refuses to start, naming
what is missing, rather than failing on the first query."""

from __future__ import annotations

import psycopg

from dwsearch.db.migrate import migrations

# Columns dwsearch reads from Go-owned tables.
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "dw_chat_events": (
        "id",
        "org_id",
        "provider",
        "external_channel_id",
        "event_type",
        "decision",
        "message_text",
        "created_at",
        "search_tsv",
    ),
    "admin_feature_flags": ("flag_key", "enabled"),
    "org_feature_flags": ("org_id", "flag_key", "enabled"),
}


# Go-owned columns whose type dwsearch relies on: event ids are stored in uuid columns
# (the sweep's ledger, windows' source ids) and ordered as uuids; full-text search
# matches search_tsv with @@.
REQUIRED_TYPES: dict[tuple[str, str], str] = {
    ("dw_chat_events", "id"): "uuid",
    ("dw_chat_events", "search_tsv"): "tsvector",
}


def missing_schema(conn: psycopg.Connection) -> list[str]:
    """Every required table or column that does not exist, as 'table' or 'table.column',
    every column of the wrong type, as 'table.column of type T (dwsearch needs U)', and
    every dwsearch migration not applied, as 'migration NNNN_name'."""
    rows = conn.execute(
        """SELECT table_name, column_name, data_type FROM information_schema.columns
           WHERE table_schema = current_schema() AND table_name = ANY(%s)""",
        ([*REQUIRED_COLUMNS, "dwsearch_schema_migrations"],),
    ).fetchall()
    present: dict[str, dict[str, str]] = {}
    for table, column, data_type in rows:
        present.setdefault(table, {})[column] = data_type
    missing = []
    for table, columns in REQUIRED_COLUMNS.items():
        if table not in present:
            missing.append(table)
            continue
        for c in columns:
            if c not in present[table]:
                missing.append(f"{table}.{c}")
            elif (needed := REQUIRED_TYPES.get((table, c))) and present[table][c] != needed:
                missing.append(f"{table}.{c} of type {present[table][c]} (dwsearch needs {needed})")
    applied: set[int] = set()
    if "dwsearch_schema_migrations" in present:
        applied = {v for (v,) in conn.execute("SELECT version FROM dwsearch_schema_migrations")}
    missing.extend(f"migration {m.version:04d}_{m.name}" for m in migrations() if m.version not in applied)
    return missing


def check_schema(url: str) -> None:
    """Raise SystemExit naming the missing tables / columns."""
    with psycopg.connect(url) as conn:
        missing = missing_schema(conn)
    if missing:
        raise SystemExit(
            "database schema is incomplete or of the wrong types; missing or wrong: "
            + ", ".join(missing)
            + " (run `dwsearch migrate`; in development `dwsearch migrate --dev-schema` creates the Go-owned tables)"
        )
