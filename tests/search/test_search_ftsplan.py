"""The full-text plan choice (dwsearch.search.ftsplan): GIN for big orgs and for queries
with a rare word, org-first for small orgs searching common words; statistics read from
a real ANALYZE."""

import psycopg
import pytest

from dwsearch.search.ftsplan import (
    FTS_ORG_FIRST_MAX_EVENTS,
    FtsPlanner,
    LexemeStats,
    choose_org_first,
    query_lexemes,
)
from dwsearch.search.store import fulltext

STATS = LexemeStats({"refund": 0.2, "parcel": 0.1, "order": 0.001}, rows=1_000_000)


def test_query_lexemes_are_lower_cased_words():
    assert query_lexemes("Refund ORDER 5521, 退款!") == ["refund", "order", "5521", "退款"]
    assert query_lexemes("?? !!") == []
    assert query_lexemes("order_5521") == ["order", "5521"]


def test_rarest_postings_use_the_rarest_word_and_half_the_least_frequency_when_unlisted():
    assert STATS.rarest_postings(["refund", "parcel"]) == pytest.approx(100_000)
    assert STATS.rarest_postings(["refund", "order"]) == pytest.approx(1_000)
    assert STATS.rarest_postings(["refund", "zebra"]) == pytest.approx(500)  # 0.001 / 2
    assert STATS.rarest_postings([]) == 0
    common = LexemeStats({"refund": 0.5, "parcel": 0.4}, rows=1000)
    assert common.rarest_postings(["zebra"]) == pytest.approx(5)  # 0.5% at most, not 0.4 / 2


@pytest.mark.parametrize(
    "org_events,lexemes,expected",
    [
        (10_000, ["refund", "parcel"], True),  # common words only: the GIN plan reads 100k postings
        (10_000, ["refund", "order"], False),  # a rare word: 1,000 postings beat 10,000 rows
        (500, ["refund", "order"], True),  # ... unless the org is smaller still
        (10_000, [], False),  # nothing to match: the GIN index answers at once
        (FTS_ORG_FIRST_MAX_EVENTS + 1, ["refund", "parcel"], False),  # too big for org-first
    ],
)
def test_choice(org_events, lexemes, expected):
    assert choose_org_first(org_events, FTS_ORG_FIRST_MAX_EVENTS, STATS, lexemes) is expected


def test_without_statistics_or_with_org_first_off():
    assert choose_org_first(10, 100, None, ["zebra"]) is True
    assert choose_org_first(101, 100, None, ["zebra"]) is False
    assert choose_org_first(10, 0, STATS, ["refund"]) is False


async def test_statistics_from_analyze_drive_the_choice(db_url, pool):
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO dw_chat_events (org_id, provider, external_channel_id, event_type, decision, message_text)
               SELECT CASE WHEN i <= 40 THEN 'small' ELSE 'big' END, 'wa', 'c1', 'message', 'received',
                      'refund parcel status ' || CASE WHEN i = 7 THEN 'zebra' ELSE 'update' END
               FROM generate_series(1, 3000) AS i"""
        )
        async with pool.connection() as aconn:
            assert await fulltext.lexeme_stats(aconn) is None  # not analyzed yet
            planner = FtsPlanner()
            assert await planner.org_first(aconn, "small", "refund zebra") is True  # by size alone
            conn.execute("ANALYZE dw_chat_events")
            frequencies, rows = await fulltext.lexeme_stats(aconn)
            assert rows == 3000 and frequencies["refund"] == pytest.approx(1.0)
            planner = FtsPlanner()
            assert (
                await planner.org_first(aconn, "small", "refund parcel") is True
            )  # 3,000 postings > 40 rows
            assert await planner.org_first(aconn, "small", "Refund ZEBRA") is False  # one row holds zebra
            assert (
                await planner.org_first(aconn, "big", "refund parcel") is True
            )  # 2,960 rows < 3,000 postings
            assert await FtsPlanner(max_events=100).org_first(aconn, "big", "refund parcel") is False


async def test_counts_and_statistics_are_cached_then_refreshed(db_url, pool):
    from dwsearch.search.ftsplan import STATS_TTL_S

    now = [0.0]
    planner = FtsPlanner(max_events=100, clock=lambda: now[0])
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO dw_chat_events (org_id, provider, external_channel_id, event_type, decision, message_text)
               SELECT CASE WHEN i <= 40 THEN 'org-a' ELSE 'org-b' END, 'wa', 'c1', 'message', 'received',
                      'refund parcel ' || CASE WHEN i = 1 THEN 'zebra' ELSE 'update' END
               FROM generate_series(1, 2000) i"""
        )
        async with pool.connection() as aconn:
            assert await planner.org_first(aconn, "org-a", "refund zebra") is True  # no statistics: by size
            conn.execute("ANALYZE dw_chat_events")
            # "No statistics" is cached too, for the TTL; then they are read: the rare word
            # sends the query to the GIN index.
            assert await planner.org_first(aconn, "org-a", "refund zebra") is True
            now[0] += STATS_TTL_S
            assert await planner.org_first(aconn, "org-a", "refund zebra") is False
            # The org's count likewise: grown past the cap, it shows after the TTL.
            conn.execute(
                """INSERT INTO dw_chat_events (org_id, provider, external_channel_id, event_type, decision,
                                               message_text)
                   SELECT 'org-a', 'wa', 'c1', 'message', 'received', 'refund' FROM generate_series(1, 100)"""
            )
            assert await planner.org_first(aconn, "org-a", "refund parcel") is True
            now[0] += STATS_TTL_S
            assert await planner.org_first(aconn, "org-a", "refund parcel") is False
