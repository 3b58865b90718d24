import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg import sql

from dwsearch.db.migrate import migrate, migrations
from dwsearch.db.schema import check_schema, missing_schema

CATALOG = """
SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attstorage
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE c.relnamespace = current_schema()::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY 1, 2
"""
INDEXES = "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() ORDER BY 1"


def schema_of(url):
    with psycopg.connect(url) as conn:
        return conn.execute(CATALOG).fetchall(), conn.execute(INDEXES).fetchall()


def test_migrate_twice_is_idempotent(empty_db_url):
    first = migrate(empty_db_url, dev_schema=True)
    assert first == [f"{m.version:04d}_{m.name}" for m in migrations()]
    before = schema_of(empty_db_url)
    assert migrate(empty_db_url, dev_schema=True) == []
    assert schema_of(empty_db_url) == before


def test_two_concurrent_migrations_apply_each_version_once(empty_db_url):
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: migrate(empty_db_url, dev_schema=True), range(2)))
    # Each migration is applied once, by one of them (each under its own transaction lock).
    assert sorted(v for r in results for v in r) == [f"{m.version:04d}_{m.name}" for m in migrations()]
    with psycopg.connect(empty_db_url) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM dwsearch_schema_migrations ORDER BY 1")]
    assert versions == [m.version for m in migrations()]


def test_two_migrate_processes_at_once(empty_db_url):
    cmd = [sys.executable, "-m", "dwsearch.cli", "migrate", "--dev-schema", "--database-url", empty_db_url]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert missing_schema(psycopg.connect(empty_db_url)) == []


def test_embedding_column_is_stored_plain(db_url):
    columns, indexes = schema_of(db_url)
    storage = {(t, c): s for t, c, _, s in columns}
    assert storage[("dw_message_embeddings", "embedding")] == "p"
    assert any("(org_id, model)" in d for _, d in indexes)


def test_missing_go_tables_are_named(empty_db_url):
    migrate(empty_db_url)  # our tables only
    with psycopg.connect(empty_db_url) as conn:
        missing = missing_schema(conn)
    assert {"dw_chat_events", "admin_feature_flags", "org_feature_flags"} <= set(missing)


def test_missing_column_is_named(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE dw_chat_events DROP COLUMN search_tsv")
    try:
        check_schema(db_url)
    except SystemExit as exc:
        assert "dw_chat_events.search_tsv" in str(exc)
    else:
        raise AssertionError("check_schema accepted a table without search_tsv")


def test_a_column_of_the_wrong_type_is_named(empty_db_url):
    """The Go module's table with bigint ids: the server refuses to start, saying why."""
    migrate(empty_db_url, dev_schema=True)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE dw_chat_events DROP COLUMN id CASCADE")
        conn.execute(
            "ALTER TABLE dw_chat_events ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
        )
    with pytest.raises(SystemExit, match=r"dw_chat_events\.id of type bigint \(dwsearch needs uuid\)"):
        check_schema(empty_db_url)


def test_unapplied_migration_is_named(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "DELETE FROM dwsearch_schema_migrations WHERE version = (SELECT max(version) FROM dwsearch_schema_migrations)"
        )
        missing = missing_schema(conn)
    last = migrations()[-1]
    assert missing == [f"migration {last.version:04d}_{last.name}"]


def test_the_lexical_projection_starts_with_the_weights_already_written(empty_db_url, monkeypatch):
    """Migrations 0016 to 0019 on a database whose windows have weights (0014's): each
    window with weights is projected into dw_lexical_windows as it is, uncompressed, one
    without (still to backfill) is not, and the windows' deletes then take their projection with them."""
    from pgvector import HalfVector
    from pgvector.psycopg import register_vector

    from dwsearch.db import migrate as migrate_module
    from dwsearch.sweep.store.lexical import window_lexical

    every = migrations()
    monkeypatch.setattr(migrate_module, "migrations", lambda: [m for m in every if m.version < 16])
    migrate(empty_db_url, dev_schema=True)
    # A long window's weights beside a dense vector of 1,100 dimensions: the row passes the
    # toast threshold and its weights are stored compressed.
    text = " ".join(f"word{i}" for i in range(40)) + " 订单 DW-7731 late"
    weights, _ = window_lexical(text)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        register_vector(conn)
        for lexical in (weights, None):
            conn.execute(
                """INSERT INTO dw_message_embeddings (org_id, model, provider, external_channel_id, window_start,
                       window_end, embedding, lexical, content, source_message_ids)
                   VALUES ('org-a', 'm', 'whatsapp', 'c1', now(), now(), %s, %s, %s, '{}')""",
                (HalfVector([0.5] * 1100), lexical, text),
            )
        compressed = "SELECT pg_column_compression(lexical) FROM {} WHERE lexical IS NOT NULL"
        assert conn.execute(compressed.format("dw_message_embeddings")).fetchall() == [("pglz",)]
    monkeypatch.setattr(migrate_module, "migrations", lambda: [m for m in every if m.version < 20])
    assert migrate(empty_db_url, dev_schema=True) == [
        "0016_lexical_windows",
        "0017_lexical_terms_index",
        "0018_lexical_windows_uncompressed",
        "0019_lexical_term_keys",
    ]
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        projected = conn.execute(
            """SELECT l.lexical::text = e.lexical::text, l.org_id, l.model, l.provider, l.external_channel_id,
                      l.window_start = e.window_start AND l.window_end = e.window_end
               FROM dw_lexical_windows AS l JOIN dw_message_embeddings AS e ON e.org_id = l.org_id AND e.id = l.id"""
        ).fetchall()
        assert projected == [(True, "org-a", "m", "whatsapp", "c1", True)]
        # 0016 copied the compressed value; 0018 stored it anew, as the leg scans it.
        assert conn.execute(compressed.format("dw_lexical_windows")).fetchall() == [(None,)]
        conn.execute("DELETE FROM dw_message_embeddings")
        assert conn.execute("SELECT count(*) FROM dw_lexical_windows").fetchone() == (0,)


def test_the_term_extraction_version_is_added_without_rewriting_a_window(empty_db_url, monkeypatch):
    """Migration 0021 adds dw_message_embeddings.lexical_terms (nullable, no default) and
    the partial index of the windows to weigh again: a window weighed before it keeps its
    weights, with no version (NULL), and is among the windows the backfill takes again; one
    without weights (still to backfill) is not. No row is rewritten."""
    from dwsearch.db import migrate as migrate_module
    from dwsearch.sweep.store import lexical

    every = migrations()
    monkeypatch.setattr(migrate_module, "migrations", lambda: [m for m in every if m.version < 21])
    migrate(empty_db_url, dev_schema=True)
    weights, _ = lexical.window_lexical("請問這個頻道的會員怎麼退貨 DW-7731")
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        for stored in (weights.to_text(), None):
            conn.execute(
                """INSERT INTO dw_message_embeddings (org_id, model, provider, external_channel_id, window_start,
                       window_end, embedding, lexical, content, source_message_ids)
                   VALUES ('org-a', 'm', 'whatsapp', 'c1', now(), now(), '[1,0]'::halfvec, %s::sparsevec, 'x', '{}')""",
                (stored,),
            )
        rows = "SELECT ctid::text, xmin::text, lexical::text FROM dw_message_embeddings ORDER BY 1"
        before = conn.execute(rows).fetchall()
    monkeypatch.setattr(migrate_module, "migrations", lambda: every)
    assert migrate(empty_db_url, dev_schema=True) == ["0021_lexical_terms_version"]
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        assert conn.execute(rows).fetchall() == before  # no row rewritten
        column = conn.execute(
            """SELECT format_type(atttypid, atttypmod), attnotnull, atthasdef FROM pg_attribute
               WHERE attrelid = 'dw_message_embeddings'::regclass AND attname = 'lexical_terms'"""
        ).fetchone()
        stale = conn.execute(
            sql.SQL("SELECT lexical::text FROM dw_message_embeddings WHERE {}").format(lexical.STALE)
        ).fetchall()
    assert column == ("smallint", False, False)
    assert stale == [(text,) for _, _, text in before if text is not None]
