"""Typo tolerance (issue 16): full text that finds nothing runs again with misspelt
latin-script words widened to the org's words one edit away."""

from datetime import timedelta

import pytest

from dwsearch.search.query import Mode, SearchQuery
from dwsearch.search.typos import MAX_CORRECTIONS, alternatives, correctable, edits1, expand
from dwsearch.v1 import search_pb2 as pb


@pytest.mark.parametrize(
    ("typo", "word"),
    [
        ("refnud", "refund"),
        ("refun", "refund"),
        ("reffund", "refund"),
        ("refumd", "refund"),
        ("timout", "timeout"),
    ],
)
def test_edits1_covers_swap_delete_insert_replace(typo, word):
    assert word in edits1(typo)


def test_only_latin_words_of_four_or_more_not_all_digits_are_corrected():
    assert correctable("ordr") and correctable("inv2093x") and correctable("caf\u00e9s")
    assert not correctable("ord") and not correctable("55211") and not correctable("退款退款")
    vocabulary = {"55221": 3, "order": 1}
    assert expand("55211 ordre", vocabulary)[0].term == "ordre"
    assert [e.term for e in expand("55211 ordre", vocabulary)] == ["ordre"]


def test_known_words_are_left_alone_and_corrections_are_bounded_by_frequency():
    vocabulary = {"cart": 1, "card": 9, "care": 5, "cars": 2, "carb": 7}
    [e] = expand("cark card", vocabulary)
    assert e.term == "cark" and e.alternatives == ("card", "carb", "care")[:MAX_CORRECTIONS]
    assert alternatives("cark card", [e]) == [("cark", "card", "carb", "care"), ("card",)]


async def test_fts_mode_finds_a_misspelt_word_and_says_so(corpus, make_searcher):
    [mid] = corpus.messages("org-a", "c1", ["the refund for order 5521 is late"])
    result = await make_searcher().search(SearchQuery("org-a", "refnud late", mode=Mode.FTS))
    assert [h.id for h in result.hits] == [mid]
    assert [(e.term, e.alternatives) for e in result.typo_corrections] == [("refnud", ("refund",))]
    assert [result.hits[0].text[a:b] for a, b in result.hits[0].highlights] == ["refund", "late"]


async def test_hybrid_full_text_leg_is_widened_too(corpus, make_searcher):
    window_id, ids = corpus.window("org-a", "c1", ["ERR_TIMEOUT on checkout", "retrying"])
    result = await make_searcher().search(SearchQuery("org-a", "timout"))
    assert result.typo_corrections and result.typo_corrections[0].alternatives == ("timeout",)
    [hit] = [h for h in result.hits if h.id == window_id]
    assert hit.sources["fts"].rank == 1 and hit.matched_message_ids == [ids[0]]


async def test_exact_matches_never_trigger_corrections(corpus, make_searcher):
    corpus.messages("org-a", "c1", ["refund please", "refunds please"])
    result = await make_searcher().search(SearchQuery("org-a", "refund", mode=Mode.FTS))
    assert len(result.hits) == 1 and result.typo_corrections == []


async def test_order_numbers_are_not_corrected(corpus, make_searcher):
    corpus.messages("org-a", "c1", ["order 55221 shipped"])
    result = await make_searcher().search(SearchQuery("org-a", "55211", mode=Mode.FTS))
    assert result.hits == [] and result.typo_corrections == []


async def test_corrections_come_from_the_org_own_words_only(corpus, make_searcher):
    corpus.messages("org-b", "c1", ["the refund is late"])
    corpus.messages("org-a", "c1", ["nothing relevant here"])
    result = await make_searcher().search(SearchQuery("org-a", "refnud", mode=Mode.FTS))
    assert result.hits == [] and result.typo_corrections == []


async def test_grpc_reports_typo_corrections(corpus, search_stub):
    corpus.messages("org-a", "c1", ["invoice INV2093X overdue"])
    resp = await search_stub.Search(
        pb.SearchRequest(org_id="org-a", query="inv2039x", mode=pb.SEARCH_MODE_FTS)
    )
    assert len(resp.hits) == 1
    assert [(c.term, list(c.corrections)) for c in resp.typo_corrections] == [("inv2039x", ["inv2093x"])]


async def test_a_query_without_correctable_words_reads_no_vocabulary(corpus, make_searcher, monkeypatch):
    from dwsearch.search.store import fulltext

    calls = []
    real = fulltext.vocabulary

    async def spy(*args, **kwargs):
        calls.append(args[1])
        return await real(*args, **kwargs)

    monkeypatch.setattr(fulltext, "vocabulary", spy)
    corpus.messages("org-a", "c1", ["nothing relevant here"])
    searcher = make_searcher()
    for text in ("退款", "5521", "abc"):
        assert (await searcher.search(SearchQuery("org-a", text, mode=Mode.FTS))).hits == []
    assert calls == []
    await searcher.search(SearchQuery("org-a", "relevnt", mode=Mode.FTS))
    await searcher.search(SearchQuery("org-a", "nothng", mode=Mode.FTS))
    assert calls == ["org-a"]  # read once, then cached


async def test_vocabulary_counts_messages_of_the_orgs_recent_eligible_chat(corpus, pool, db_url):
    """Each word with the number of messages holding it (twice in one message counts
    once), over the org's `events` newest eligible messages only; an org id that needs
    quoting is read as itself."""
    import psycopg

    from dwsearch.search.store import fulltext
    from dwsearch_testkit.seed import T0

    odd = "org-'; DROP TABLE dw_chat_events; --"
    corpus.messages(odd, "c1", ["oldest word", "refund refund please", "refund parcel"])
    corpus.messages("org-b", "c1", ["parcel elsewhere"])
    with psycopg.connect(db_url) as conn:  # denied traffic is never read
        conn.execute(
            "INSERT INTO dw_chat_events (org_id, provider, external_channel_id, event_type, decision,"
            " message_text, created_at) VALUES (%s, 'whatsapp', 'c1', 'message', 'denied', 'secretword', %s)",
            (odd, T0 + timedelta(hours=1)),
        )
    async with pool.connection() as conn:
        assert await fulltext.vocabulary(conn, odd, 2) == {"refund": 2, "please": 1, "parcel": 1}
        assert (await fulltext.vocabulary(conn, odd, 10))["oldest"] == 1
        assert await fulltext.vocabulary(conn, "org-none", 10) == {}
