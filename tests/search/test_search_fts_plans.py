"""The two full-text plans (GIN index first, or the org's own rows first) return the same
rows in the same order, and the searcher picks org-first only for small orgs."""

from datetime import timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from dwsearch.search.ftsplan import FTS_ORG_FIRST_MAX_EVENTS
from dwsearch.search.query import Mode, SearchQuery
from dwsearch.search.store import fulltext
from dwsearch.search.store.scope import ChatScope
from dwsearch_testkit.seed import T0, insert_events, insert_window

WORDS = ["refund", "parcel", "退款", "bayar", "order", "late", "tolong"]
CHANNELS = ["c1", "c2"]
PROVIDERS = ["whatsapp", "telegram"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(["org-a", "org-b"]),
            st.sampled_from(PROVIDERS),
            st.sampled_from(CHANNELS),
            st.lists(st.sampled_from(WORDS), min_size=1, max_size=4),
            st.integers(0, 20),  # minutes after T0; equal times exercise the id tie-break
            st.sampled_from(["received", "processed", "denied"]),
        ),
        min_size=1,
        max_size=25,
    ),
    words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=2),
    provider=st.sampled_from(["", *PROVIDERS]),
    channel=st.sampled_from(["", *CHANNELS]),
    start=st.sampled_from([None, 5]),
    end=st.sampled_from([None, 15]),
    limit=st.integers(1, 8),
    recent_first=st.booleans(),
)
async def test_both_plans_return_the_same_rows(
    db_url, pool, events, words, provider, channel, start, end, limit, recent_first
):
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("TRUNCATE dw_chat_events")
    for decision in ("received", "processed", "denied"):
        rows = [
            (o, p, c, " ".join(t), T0 + timedelta(minutes=m)) for o, p, c, t, m, d in events if d == decision
        ]
        insert_events(db_url, rows, decision=decision)
    scope = ChatScope(
        "org-a",
        provider,
        channel,
        None if start is None else T0 + timedelta(minutes=start),
        None if end is None else T0 + timedelta(minutes=end),
    )
    query = " ".join(words)
    async with pool.connection() as conn:
        gin = await fulltext.full_text(conn, scope, query, limit, recent_first=recent_first, org_first=False)
        org_first = await fulltext.full_text(
            conn, scope, query, limit, recent_first=recent_first, org_first=True
        )
        # Hybrid search's one-statement leg: the same matches in rank order, either plan.
        with_windows = [
            (await fulltext.full_text_with_windows(conn, scope, query, "m", limit, org_first=plan))[0]
            for plan in (False, True)
        ]
    assert org_first == gin
    if not recent_first:
        assert with_windows == [gin, gin]


@pytest.mark.parametrize("org_first", [False, True])
async def test_the_windows_of_the_matches_come_back_once_each(db_url, pool, org_first):
    rows = [
        ("org-a", "wa", "c1", text, T0 + timedelta(minutes=i))
        for i, text in enumerate(["refund please", "refund again", "unrelated"])
    ]
    rows.append(("org-a", "wa", "c1", "refund later", T0 + timedelta(days=1)))
    a, b, c, d = insert_events(db_url, rows)
    (other,) = insert_events(db_url, [("org-b", "wa", "c1", "refund elsewhere", T0)])

    def window(org, ids, model="m", start=T0):
        return insert_window(
            db_url,
            org=org,
            model=model,
            provider="wa",
            channel="c1",
            message_ids=ids,
            content="\n".join(ids),
            start=start,
            end=start,
            dense=[1.0] * 4,
        )

    both = window("org-a", [a, b, c])  # two matches in it
    window("org-a", [a, b, c], model="another")  # the same messages, another model
    window("org-b", [other])  # another org
    late = window("org-a", [d], start=T0 + timedelta(days=1))  # outside a time filter
    scope = ChatScope("org-a")
    async with pool.connection() as conn:
        messages, windows = await fulltext.full_text_with_windows(
            conn, scope, "refund", "m", 10, org_first=org_first
        )
        assert sorted(m.id for m in messages) == sorted([a, b, d])
        assert sorted(w.id for w in windows) == sorted([both, late])
        assert next(w for w in windows if w.id == both).source_message_ids == (a, b, c)
        early = ChatScope("org-a", end=T0 + timedelta(hours=1))
        messages, windows = await fulltext.full_text_with_windows(
            conn, early, "refund", "m", 10, org_first=org_first
        )
        assert [w.id for w in windows] == [both] and sorted(m.id for m in messages) == sorted([a, b])


def test_org_first_never_reads_the_gin_index(db_url):
    """With a rare word, the planner left alone starts from the GIN index; the org-first
    statement reads the org's own rows even then."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO dw_chat_events (org_id, provider, external_channel_id, event_type, decision, message_text)
               SELECT 'org-' || (i % 2), 'wa', 'c1', 'message', 'received', 'common words ' || i
               FROM generate_series(1, 4000) AS i"""
        )
        conn.execute(
            "INSERT INTO dw_chat_events (org_id, provider, external_channel_id, event_type, decision,"
            " message_text) VALUES ('org-1', 'wa', 'c1', 'message', 'received', 'rare refund')"
        )
        conn.execute("ANALYZE dw_chat_events")
        scope = ChatScope("org-1")
        params = {**scope.params(), "query": "refund", "limit": 5}

        def plan(org_first: bool) -> str:
            statement = fulltext.full_text_statement(scope, recent_first=False, org_first=org_first)
            return "\n".join(r[0] for r in conn.execute(sql.SQL("EXPLAIN {}").format(statement), params))

        assert "dw_chat_events_search_tsv_idx" in plan(False)
        assert "search_tsv_idx" not in plan(True)


@pytest.fixture
def spy_plans(monkeypatch):
    """Records the org_first choice of every full-text query the searcher runs."""
    calls: list[tuple[str, bool]] = []
    real, real_with_windows = fulltext.full_text, fulltext.full_text_with_windows

    async def spy(conn, scope, query, limit, *, recent_first, org_first=False):
        calls.append((scope.org_id, org_first))
        return await real(conn, scope, query, limit, recent_first=recent_first, org_first=org_first)

    async def spy_with_windows(conn, scope, query, model, limit, *, org_first=False):
        calls.append((scope.org_id, org_first))
        return await real_with_windows(conn, scope, query, model, limit, org_first=org_first)

    monkeypatch.setattr(fulltext, "full_text", spy)
    monkeypatch.setattr(fulltext, "full_text_with_windows", spy_with_windows)
    return calls


@pytest.mark.parametrize("mode", [Mode.FTS, Mode.HYBRID])
async def test_small_orgs_are_searched_org_first(corpus, make_searcher, spy_plans, mode):
    corpus.messages("org-a", "c1", ["refund please", "ok"])
    corpus.messages("org-b", "c1", [f"refund {i}" for i in range(4)])
    searcher = make_searcher(fts_org_first_max_events=3)
    for org in ("org-a", "org-b", "org-a"):
        result = await searcher.search(SearchQuery(org, "refund", mode=mode))
        assert result.hits
    assert spy_plans == [("org-a", True), ("org-b", False), ("org-a", True)]


async def test_zero_turns_org_first_off(corpus, make_searcher, spy_plans):
    corpus.messages("org-a", "c1", ["refund please"])
    await make_searcher(fts_org_first_max_events=0).search(SearchQuery("org-a", "refund", mode=Mode.FTS))
    assert spy_plans == [("org-a", False)]


async def test_org_size_is_counted_no_further_than_the_cap(db_url, pool):
    insert_events(db_url, [("org-a", "wa", "c1", f"m{i}", T0) for i in range(5)])
    async with pool.connection() as conn:
        assert await fulltext.org_events_at_most(conn, "org-a", 3) == 4
        assert await fulltext.org_events_at_most(conn, "org-a", FTS_ORG_FIRST_MAX_EVENTS) == 5
        assert await fulltext.org_events_at_most(conn, "nobody", 3) == 0
