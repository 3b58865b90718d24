"""The sweep's state as the console reads it (dwsearch.sweep.overview), on a database: the
orgs that have chat, a page of orgs with their figures, an org's flags, an org's most
recent windows."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import psycopg
from pgvector import HalfVector
from pgvector.psycopg import register_vector
from psycopg_pool import AsyncConnectionPool

from dwsearch.flags import MODULE_FLAG, SEMANTIC_SEARCH_FLAG
from dwsearch.sweep import overview
from dwsearch_testkit.seed import enable_semantic_search, insert_events, set_org_flag

T0 = datetime(2026, 11, 1, 9, tzinfo=UTC)


async def test_org_figures_page_filter_and_count(db_url: str, pool: AsyncConnectionPool) -> None:
    enable_semantic_search(db_url, "acme", "beta")
    insert_events(db_url, [("acme", "web", "c1", f"hello {i}", T0 + timedelta(minutes=i)) for i in range(4)])
    insert_events(db_url, [("beta", "web", "c1", "hi", T0), ("gamma", "web", "c9", "hey", T0)])
    with psycopg.connect(db_url, autocommit=True) as conn:
        # acme's key swept up to its second event, its first two in an embedded window; one
        # stalled key, one poison window, two gaps.
        first, second = (
            row[0]
            for row in conn.execute(
                "SELECT id FROM dw_chat_events WHERE org_id = 'acme' ORDER BY created_at LIMIT 2"
            ).fetchall()
        )
        (window,) = conn.execute(
            """INSERT INTO dw_sweep_windows (org_id, provider, external_channel_id, model, status, window_start,
                   window_end, source_message_ids) VALUES ('acme', 'web', 'c1', 'm', 'embedded', %s, %s, '{}')
               RETURNING id""",
            (T0, T0),
        ).fetchone()
        conn.execute(
            """INSERT INTO dw_sweep_window_events (org_id, model, event_id, window_id)
               VALUES ('acme', 'm', %s, %s), ('acme', 'm', %s, %s)""",
            (first, window, second, window),
        )
        conn.execute(
            """INSERT INTO dw_sweep_watermarks (org_id, provider, external_channel_id, model, last_event_time,
                   last_event_id, consecutive_failures)
               VALUES ('acme', 'web', 'c1', 'm', %s, %s, 2)""",
            (T0 + timedelta(minutes=1), second),
        )
        conn.execute(
            """INSERT INTO dw_sweep_windows (org_id, provider, external_channel_id, model, status, window_start,
                   window_end, source_message_ids) VALUES ('acme', 'web', 'c1', 'm', 'poison', %s, %s, '{}')""",
            (T0, T0),
        )
        conn.execute("INSERT INTO dw_knowledge_gaps (org_id, query) VALUES ('acme', 'a'), ('acme', 'b')")
    page, after = await overview.org_figures(pool, "m", limit=2)
    assert [o.org_id for o in page] == ["acme", "beta"] and after == "beta"
    acme = page[0]
    assert (acme.semantic_search, acme.events, acme.searchable_events, acme.pending_events) == (True, 4, 2, 2)
    assert acme.oldest_pending == T0 + timedelta(minutes=2)
    assert (acme.stalled_keys, acme.poison_windows, acme.knowledge_gaps) == (1, 1, 2)
    rest, after = await overview.org_figures(pool, "m", after="beta", limit=2)
    assert [o.org_id for o in rest] == ["gamma"] and after is None
    gamma = rest[0]
    assert (gamma.semantic_search, gamma.events, gamma.searchable_events, gamma.pending_events) == (
        False,
        1,
        0,
        1,
    )
    found, _ = await overview.org_figures(pool, "m", query="ET", limit=20)  # part of the id, any case
    assert [o.org_id for o in found] == ["beta"]
    assert await overview.org_figures(pool, "m", query="nobody", limit=20) == ([], None)
    other, _ = await overview.org_figures(pool, "other", limit=1)  # another model's: nothing swept yet
    assert (other[0].searchable_events, other[0].pending_events, other[0].stalled_keys) == (0, 4, 0)


async def test_org_figures_page_through_ten_thousand_orgs(db_url: str, pool: AsyncConnectionPool) -> None:
    """10,000 orgs: a page, a later page and a filter each answer from a skip scan that stops
    once the page is full, in well under a second on a laptop (5 s allowed on a busy CI)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO dw_chat_events (org_id, provider, external_channel_id, event_type, decision,
                   message_text, created_at)
               SELECT 'org-' || lpad(i::text, 5, '0'), 'web', 'c', 'message', 'received', 'hi', now()
               FROM generate_series(1, 10000) AS i"""
        )
        conn.execute("ANALYZE dw_chat_events")
    started = time.perf_counter()
    first, after = await overview.org_figures(pool, "m", limit=20)
    assert [o.org_id for o in first][:2] == ["org-00001", "org-00002"] and after == "org-00020"
    later, after = await overview.org_figures(pool, "m", after="org-09990", limit=20)
    assert [o.org_id for o in later] == [f"org-{i:05d}" for i in range(9991, 10001)] and after is None
    found, after = await overview.org_figures(pool, "m", query="9999", limit=20)
    assert [o.org_id for o in found] == ["org-09999"] and after is None
    assert all(o.events == 1 and o.pending_events == 1 for o in first + later + found)
    assert time.perf_counter() - started < 5.0


async def test_orgs_with_chat_and_an_orgs_flags(db_url: str, pool: AsyncConnectionPool) -> None:
    insert_events(db_url, [(org, "web", "c1", "hi", T0) for org in ("o3", "o1", "o2")])
    assert await overview.orgs_with_chat(pool, 500) == ["o1", "o2", "o3"]
    assert await overview.orgs_with_chat(pool, 2) == ["o1", "o2"]
    enable_semantic_search(db_url, "o1")
    assert await overview.disabled_reason(pool, "o1") == ""
    set_org_flag(db_url, "o1", MODULE_FLAG, False)
    assert await overview.disabled_reason(pool, "o1") == f"org flag {MODULE_FLAG} is off"
    # An org the flag tables do not name: every flag off, as the sweep reads it.
    reason = await overview.disabled_reason(pool, "nobody")
    assert MODULE_FLAG in reason and f"org flag {SEMANTIC_SEARCH_FLAG} is off" in reason


async def test_org_windows_the_most_recent_first(db_url: str, pool: AsyncConnectionPool) -> None:
    """The org's windows of the model, the most recent first, at most `limit`, each with its
    channel, its time, its text's start and its vector; another org's and another model's
    are left out."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        register_vector(conn)
        for org, model, n in (("acme", "m", 4), ("beta", "m", 2), ("acme", "other", 1)):
            for i in range(n):
                conn.execute(
                    """INSERT INTO dw_message_embeddings (org_id, model, provider, external_channel_id,
                           window_start, window_end, embedding, content, source_message_ids)
                       VALUES (%s, %s, 'web', %s, %s, %s, %s, %s, '{}')""",
                    (
                        org,
                        model,
                        f"c{i % 2}",
                        T0,
                        T0 + timedelta(minutes=i),
                        HalfVector([float(i), 1.0, 0.0, 0.0]),
                        f"{org} {model} {i} window",
                    ),
                )
    rows = await overview.org_windows(pool, "acme", "m", limit=3, snippet=8)
    assert [(channel, end, text) for _, channel, end, text, _ in rows] == [
        ("web/c1", T0 + timedelta(minutes=3), "acme m 3"),
        ("web/c0", T0 + timedelta(minutes=2), "acme m 2"),
        ("web/c1", T0 + timedelta(minutes=1), "acme m 1"),
    ]
    assert all(isinstance(row[0], str) for row in rows)
    assert rows[0][4].to_list() == [3.0, 1.0, 0.0, 0.0]
    assert len(await overview.org_windows(pool, "acme", "m", limit=10, snippet=8)) == 4
    assert await overview.org_windows(pool, "nobody", "m", limit=10, snippet=8) == []
