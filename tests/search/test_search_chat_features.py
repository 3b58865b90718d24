"""Chat-search features (issue 16): highlight spans, messages around a hit, sort by time."""

from datetime import timedelta

import grpc
import pytest

from dwsearch.common.errors import InvalidArgument
from dwsearch.search.highlight import pattern, spans
from dwsearch.search.query import MAX_CONTEXT_MESSAGES, Mode, SearchQuery, Sort
from dwsearch.v1 import search_pb2 as pb
from dwsearch_testkit.seed import T0, insert_events


def words(text: str, query: str) -> list[str]:
    return [text[a:b] for a, b in spans(pattern(query), text)]


def test_highlights_are_whole_latin_words_case_insensitive():
    text = "Refund for order 5521? refunded, not REFUND_2"
    assert words(text, "refund ORDER-5521") == ["Refund", "order", "5521", "REFUND"]


def test_highlights_are_code_point_offsets_and_cjk_matches_substrings():
    text = "😀 我要退款 please, 退款了吗"
    found = spans(pattern("退款"), text)
    assert [text[a:b] for a, b in found] == ["退款", "退款"]
    assert found[0] == (4, 6)  # code points: the emoji counts one, not 2 (UTF-16) or 4 (bytes)


def test_highlights_merge_adjacent_matches_and_ignore_queries_without_words():
    assert spans(pattern("退 款"), "退款") == [(0, 2)]
    assert spans(pattern("?!"), "anything") == []


async def test_hits_carry_highlights(corpus, make_searcher):
    corpus.window("org-a", "c1", ["where is my Parcel", "order 5521 please"])
    result = await make_searcher().search(SearchQuery("org-a", "parcel 5521"))
    [hit] = result.hits
    assert [hit.text[a:b] for a, b in hit.highlights] == ["Parcel", "5521"]


async def test_grpc_hit_highlights_and_sort_round_trip(corpus, search_stub):
    corpus.messages("org-a", "c1", ["refund please"])
    corpus.messages("org-a", "c2", ["refund now", "x"], start=T0 + timedelta(hours=3))
    resp = await search_stub.Search(
        pb.SearchRequest(org_id="org-a", query="refund", mode=pb.SEARCH_MODE_FTS, sort=pb.SEARCH_SORT_NEWEST)
    )
    assert [h.external_channel_id for h in resp.hits] == ["c2", "c1"]
    assert [(s.start, s.end) for s in resp.hits[0].highlights] == [(0, 6)]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await search_stub.Search(pb.SearchRequest(org_id="org-a", query="refund", sort=99))
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "sort" in err.value.details()


async def test_sort_newest_reorders_the_relevant_hits_by_time(corpus, make_searcher):
    old, _ = corpus.window("org-a", "c1", ["refund refund refund please"])
    new, _ = corpus.window("org-a", "c2", ["refund maybe"], start=T0 + timedelta(days=2))
    searcher = make_searcher()
    relevance = await searcher.search(SearchQuery("org-a", "refund refund refund please", limit=2))
    newest = await searcher.search(
        SearchQuery("org-a", "refund refund refund please", limit=2, sort=Sort.NEWEST)
    )
    assert [h.id for h in relevance.hits] == [old, new]
    assert [h.id for h in newest.hits] == [new, old]


async def test_context_messages_around_a_window_hit(corpus, make_searcher):
    before = corpus.messages("org-a", "c1", ["b1", "b2", "b3"], start=T0 - timedelta(hours=1))
    window_id, _ = corpus.window("org-a", "c1", ["my parcel", "is lost"])
    after = corpus.messages("org-a", "c1", ["a1", "a2", "a3"], start=T0 + timedelta(hours=1))
    # Not context: another channel, another provider, another org, an ineligible event.
    corpus.messages("org-a", "c2", ["other channel"], start=T0 - timedelta(minutes=5))
    corpus.messages("org-a", "c1", ["other provider"], start=T0 - timedelta(minutes=5), provider="telegram")
    corpus.messages("org-b", "c1", ["other org"], start=T0 - timedelta(minutes=5))
    insert_events(
        corpus.url, [("org-a", "whatsapp", "c1", "dropped", T0 + timedelta(minutes=30))], decision="dropped"
    )
    result = await make_searcher().search(SearchQuery("org-a", "parcel", context_messages=2))
    [hit] = result.hits
    assert hit.id == window_id
    assert [m.id for m in hit.context_before] == before[1:]
    assert [m.text for m in hit.context_before] == ["b2", "b3"]
    assert [m.id for m in hit.context_after] == after[:2]
    # Without context_messages, none.
    plain = await make_searcher().search(SearchQuery("org-a", "parcel"))
    assert not plain.hits[0].context_before and not plain.hits[0].context_after


async def test_context_messages_never_cross_orgs(corpus, make_searcher):
    """org-b's messages in a channel of the same name and provider, interleaved in time,
    are never org-a's context; an org-b hit gets only org-b's messages."""
    a_ids = corpus.messages("org-a", "c1", ["a before", "refund a", "a after"])
    b_ids = corpus.messages(
        "org-b", "c1", ["b before", "refund b", "b after"], start=T0 + timedelta(seconds=30)
    )
    for org, ids in (("org-a", a_ids), ("org-b", b_ids)):
        result = await make_searcher().search(SearchQuery(org, "refund", mode=Mode.FTS, context_messages=5))
        [hit] = result.hits
        assert [m.id for m in hit.context_before] == [ids[0]]
        assert [m.id for m in hit.context_after] == [ids[2]]


async def test_context_messages_over_grpc_and_its_bound(corpus, search_stub):
    ids = corpus.messages("org-a", "c1", ["hello", "refund please", "ok"])
    resp = await search_stub.Search(
        pb.SearchRequest(org_id="org-a", query="refund", mode=pb.SEARCH_MODE_FTS, context_messages=1)
    )
    [hit] = resp.hits
    assert [(m.id, m.text) for m in hit.context_before] == [(ids[0], "hello")]
    assert [(m.id, m.text) for m in hit.context_after] == [(ids[2], "ok")]
    assert hit.context_after[0].created_at.ToDatetime().replace(tzinfo=T0.tzinfo) == T0 + timedelta(minutes=2)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await search_stub.Search(
            pb.SearchRequest(org_id="org-a", query="refund", context_messages=MAX_CONTEXT_MESSAGES + 1)
        )
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "context_messages" in err.value.details()


async def test_context_bound_is_checked_before_any_query(make_searcher):
    with pytest.raises(InvalidArgument):
        await make_searcher().search(SearchQuery("org-a", "x", context_messages=21))
