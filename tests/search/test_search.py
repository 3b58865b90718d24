"""SearchService over a real Postgres and real gRPC, fake embedder and reranker."""

import asyncio
import time
from datetime import timedelta

import grpc
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dwsearch.flags import MODULE_FLAG
from dwsearch.retrieval.degradation import Degradation
from dwsearch.search import searcher as searcher_module
from dwsearch.search.query import MAX_QUERY_BYTES, Mode, SearchQuery
from dwsearch.search.store import fulltext, knn
from dwsearch.v1 import search_pb2 as pb
from dwsearch_testkit.fakes import Failure
from dwsearch_testkit.seed import T0, set_org_flag


def hit_ids(result):
    return [h.id for h in result.hits]


async def test_hybrid_merges_fts_and_dense_at_window_level(corpus, make_searcher):
    window_id, ids = corpus.window("org-a", "c1", ["where is my parcel", "order 5521 tracking please"])
    [loose] = corpus.messages("org-a", "c2", ["parcel arrived damaged"], start=T0 + timedelta(hours=5))
    result = await make_searcher().search(SearchQuery("org-a", "parcel"))
    assert sorted(hit_ids(result)) == sorted([window_id, loose])
    window = next(h for h in result.hits if h.id == window_id)
    assert window.kind == "window" and window.message_ids == tuple(ids)
    assert window.matched_message_ids == [ids[0]]
    assert window.sources["fts"].rank > 0 and window.sources["dense"].rank > 0
    standalone = next(h for h in result.hits if h.id == loose)
    assert standalone.kind == "message" and standalone.sources["dense"].rank == 0
    assert result.degradations == [] and result.model


async def test_a_window_with_several_matches_is_one_hit(corpus, make_searcher):
    window_id, ids = corpus.window("org-a", "c1", ["refund please", "still no refund", "refund now"])
    # The same messages in another model's window: never joined, never returned.
    corpus.window(
        "org-a", "c1", ["refund please", "still no refund", "refund now"], model="another/model", ids=ids
    )
    result = await make_searcher().search(SearchQuery("org-a", "refund"))
    assert hit_ids(result) == [window_id]
    assert sorted(result.hits[0].matched_message_ids) == sorted(ids)
    assert result.hits[0].text == "refund please\nstill no refund\nrefund now"


@pytest.fixture
def fts_starts(monkeypatch):
    """The time of each start of hybrid search's full-text leg."""
    starts: list[float] = []
    real = fulltext.full_text_with_windows

    async def spy(*args, **kwargs):
        starts.append(time.monotonic())
        return await real(*args, **kwargs)

    monkeypatch.setattr(fulltext, "full_text_with_windows", spy)
    return starts


async def test_full_text_runs_while_the_embedding_is_in_flight(
    corpus, make_searcher, fake_embedder, fts_starts
):
    """The full-text leg waits FTS_STAGGER_S for the embed request to get out (best
    effort: not asserted), never for the embedding."""
    window_id, _ = corpus.window("org-a", "c1", ["refund please"])
    searcher = make_searcher()
    await searcher.search(SearchQuery("org-a", "warm up"))  # model info cached
    fts_starts.clear()
    fake_embedder.delay = 2.0
    began = time.monotonic()
    result = await searcher.search(SearchQuery("org-a", "refund"))
    assert hit_ids(result) == [window_id] and result.degradations == []
    [started] = fts_starts
    # Full text started before the embedding could answer (the fake answers after its delay).
    assert started - began < fake_embedder.delay


async def test_full_text_waits_the_stagger_unless_the_embedding_fails_first(
    corpus, make_searcher, fake_embedder, fts_starts, monkeypatch
):
    monkeypatch.setattr(searcher_module, "FTS_STAGGER_S", 0.3)
    corpus.window("org-a", "c1", ["refund please"])
    searcher = make_searcher()
    await searcher.search(SearchQuery("org-a", "warm up"))  # model info cached
    fts_starts.clear()
    fake_embedder.delay = 2.0
    began = time.monotonic()
    await searcher.search(SearchQuery("org-a", "refund"))
    # After the stagger, before the embedding's answer.
    assert 0.3 <= fts_starts[-1] - began < fake_embedder.delay
    # An embedding that fails ends the wait at once: a stagger of 5 s is not waited out.
    monkeypatch.setattr(searcher_module, "FTS_STAGGER_S", 5.0)
    fake_embedder.delay = 0
    fake_embedder.failures.append(Failure(grpc.StatusCode.INTERNAL, "model crashed"))  # not retried
    began = time.monotonic()
    result = await searcher.search(SearchQuery("org-a", "refund"))
    assert result.degradations[0][0] is Degradation.EMBEDDER_UNAVAILABLE
    assert fts_starts[-1] - began < 2.5


async def test_a_failing_full_text_leg_fails_the_search_at_once(
    corpus, make_searcher, fake_embedder, monkeypatch
):
    corpus.window("org-a", "c1", ["refund please"])
    searcher = make_searcher()
    await searcher.search(SearchQuery("org-a", "warm up"))

    async def database_down(*args, **kwargs):
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(fulltext, "full_text_with_windows", database_down)
    fake_embedder.delay = 5
    began = time.monotonic()
    with pytest.raises(psycopg.OperationalError):
        await searcher.search(SearchQuery("org-a", "refund"))
    assert time.monotonic() - began < 2  # not after the embedding's 5 s


async def test_legs_failing_together_fail_the_search_with_the_first_error(corpus, make_searcher, monkeypatch):
    """A database restart fails every leg at once: the search raises the database's error
    (which serve maps to UNAVAILABLE), not a group of them."""
    corpus.window("org-a", "c1", ["refund please"])
    searcher = make_searcher()
    await searcher.search(SearchQuery("org-a", "warm up"))

    async def database_down(*args, **kwargs):
        raise psycopg.OperationalError("the database system is shutting down")

    for module, name in ((knn, "dense_knn"), (knn, "sparse_knn"), (fulltext, "full_text_with_windows")):
        monkeypatch.setattr(module, name, database_down)
    for mode in (Mode.HYBRID, Mode.SEMANTIC):
        with pytest.raises(psycopg.OperationalError, match="shutting down"):
            await searcher.search(SearchQuery("org-a", "refund", mode=mode))


async def test_cancelled_search_cancels_every_leg(corpus, make_searcher, fake_embedder, monkeypatch, pool):
    corpus.window("org-a", "c1", ["refund please"])
    fake_embedder.delay = 5
    started = {"fts": asyncio.Event(), "lexical": asyncio.Event()}

    def slow(leg: str):
        async def waits(*args, **kwargs):
            started[leg].set()
            await asyncio.sleep(5)

        return waits

    monkeypatch.setattr(fulltext, "full_text_with_windows", slow("fts"))
    monkeypatch.setattr(knn, "lexical_knn", slow("lexical"))
    names = (searcher_module.MODEL_LEG_TASK, searcher_module.FTS_LEG_TASK, searcher_module.LEXICAL_LEG_TASK)

    def legs() -> list[asyncio.Task]:
        return [t for t in asyncio.all_tasks() if t.get_name() in names and not t.done()]

    search = asyncio.ensure_future(make_searcher(lexical=True).search(SearchQuery("org-a", "refund")))
    for event in started.values():
        await event.wait()
    running = legs()
    assert sorted(t.get_name() for t in running) == sorted(names)  # found by name: not vacuous
    search.cancel()
    with pytest.raises(asyncio.CancelledError):
        await search
    assert all(t.done() for t in running) and legs() == []  # no leg is left running
    stats = pool.get_stats()
    assert stats.get("pool_size", 0) == stats.get("pool_available", 0)  # every connection came back


async def test_dense_path_finds_a_window_fts_cannot(corpus, make_searcher):
    text = ["我想取消订单", "好的"]
    window_id, _ = corpus.window("org-a", "c1", text)
    searcher = make_searcher()
    fts = await searcher.search(SearchQuery("org-a", "取消订单 please", mode=Mode.FTS))
    assert fts.hits == []
    # The fake embedder maps equal text to equal vectors: the window text is its nearest.
    result = await searcher.search(SearchQuery("org-a", "\n".join(text), mode=Mode.SEMANTIC))
    assert hit_ids(result)[0] == window_id
    assert result.hits[0].sources["dense"].rank == 1


async def test_results_are_deduplicated_and_limited(corpus, make_searcher):
    for i in range(8):
        corpus.window(
            "org-a", f"c{i}", [f"refund request number {i}", "refund approved"], start=T0 + timedelta(hours=i)
        )
    result = await make_searcher().search(SearchQuery("org-a", "refund", limit=5))
    assert len(result.hits) == 5
    assert len(set(hit_ids(result))) == 5


async def test_other_models_rows_are_never_returned(corpus, make_searcher):
    other, _ = corpus.window("org-a", "c1", ["refund please"], model="another/model")
    mine, _ = corpus.window("org-a", "c2", ["refund please"])
    result = await make_searcher().search(SearchQuery("org-a", "refund please", mode=Mode.SEMANTIC))
    assert hit_ids(result) == [mine]
    hybrid = await make_searcher().search(SearchQuery("org-a", "refund please"))
    assert other not in hit_ids(hybrid)


async def test_embedder_down_degrades_to_fts(corpus, make_searcher):
    corpus.window("org-a", "c1", ["refund please"])
    searcher = make_searcher(embedder="127.0.0.1:9")  # nothing listens on the discard port
    result = await searcher.search(SearchQuery("org-a", "refund"))
    assert [r for r, _ in result.degradations] == [Degradation.EMBEDDER_UNAVAILABLE]
    assert len(result.hits) == 1 and result.hits[0].sources["dense"].rank == 0


async def test_embedder_timeout_degrades_to_fts(corpus, make_searcher, fake_embedder):
    corpus.window("org-a", "c1", ["refund please"])
    searcher = make_searcher(embed_timeout=0.2)
    await searcher.search(SearchQuery("org-a", "warm up"))  # caches the model info
    fake_embedder.delay = 1.0
    result = await searcher.search(SearchQuery("org-a", "refund"))
    assert [r for r, _ in result.degradations] == [Degradation.EMBEDDER_TIMEOUT]
    assert len(result.hits) == 1


async def test_embedder_error_in_semantic_mode_still_answers_with_fts(corpus, make_searcher, fake_embedder):
    corpus.window("org-a", "c1", ["refund please"])
    fake_embedder.failures.append(Failure(grpc.StatusCode.INTERNAL, "model produced NaN"))
    result = await make_searcher().search(SearchQuery("org-a", "refund", mode=Mode.SEMANTIC))
    assert result.degradations[0][0] is Degradation.EMBEDDER_UNAVAILABLE
    assert len(result.hits) == 1


async def test_embedder_serving_another_model_is_not_used(corpus, make_searcher, fake_embedder):
    corpus.window("org-a", "c1", ["refund please"])
    fake_embedder.model_id = "someone/else"
    result = await make_searcher().search(SearchQuery("org-a", "refund please"))
    ((reason, detail),) = result.degradations
    assert reason is Degradation.EMBEDDER_UNAVAILABLE and "someone/else" in detail
    assert all(h.sources["dense"].rank == 0 for h in result.hits)


async def test_flag_off_is_fts_only(corpus, make_searcher, fake_embedder):
    corpus.window("org-a", "c1", ["refund please"])
    set_org_flag(corpus.url, "org-a", MODULE_FLAG, False)
    result = await make_searcher().search(SearchQuery("org-a", "refund"))
    assert result.mode is Mode.FTS and result.model == ""
    assert [r for r, _ in result.degradations] == [Degradation.SEMANTIC_DISABLED]
    assert [h.kind for h in result.hits] == ["message"]
    assert fake_embedder.calls == 0


async def test_reranker_reorders(corpus, make_searcher, fake_reranker):
    a, _ = corpus.window("org-a", "c1", ["refund"], start=T0 + timedelta(hours=2))
    b, _ = corpus.window("org-a", "c2", ["refund for my broken blender please"])
    searcher = make_searcher(reranker=fake_reranker.address)
    plain = await searcher.search(SearchQuery("org-a", "refund broken blender", rerank=False))
    reranked = await searcher.search(SearchQuery("org-a", "refund broken blender", rerank=True))
    assert reranked.reranked and not plain.reranked
    assert hit_ids(reranked)[0] == b
    assert reranked.hits[0].rerank.rank == 1 and reranked.hits[0].score == reranked.hits[0].rerank.score
    assert set(hit_ids(reranked)) == set(hit_ids(plain)) == {a, b}


async def test_reranker_down_returns_fused_order(corpus, make_searcher, fake_reranker):
    corpus.window("org-a", "c1", ["refund please"])
    fake_reranker.failures.append(Failure(grpc.StatusCode.UNAVAILABLE, "gone"))
    fake_reranker.failures.extend([Failure(grpc.StatusCode.UNAVAILABLE, "gone")] * 4)  # outlast the retries
    result = await make_searcher(reranker=fake_reranker.address).search(
        SearchQuery("org-a", "refund", rerank=True)
    )
    assert [r for r, _ in result.degradations] == [Degradation.RERANKER_UNAVAILABLE]
    assert not result.reranked and len(result.hits) == 1


async def test_reranker_timeout_and_not_configured(corpus, make_searcher, fake_reranker):
    corpus.window("org-a", "c1", ["refund please"])
    fake_reranker.delay = 1.0
    slow = await make_searcher(reranker=fake_reranker.address, rerank_timeout=0.2).search(
        SearchQuery("org-a", "refund", rerank=True)
    )
    assert [r for r, _ in slow.degradations] == [Degradation.RERANKER_TIMEOUT]
    none = await make_searcher().search(SearchQuery("org-a", "refund", rerank=True))
    assert [r for r, _ in none.degradations] == [Degradation.RERANKER_NOT_CONFIGURED]


async def test_filters_by_provider_channel_and_time(corpus, make_searcher):
    w1, _ = corpus.window("org-a", "c1", ["refund please"], provider="whatsapp")
    w2, _ = corpus.window("org-a", "c2", ["refund please"], provider="telegram", start=T0 + timedelta(days=2))
    searcher = make_searcher()
    assert hit_ids(await searcher.search(SearchQuery("org-a", "refund", provider="telegram"))) == [w2]
    assert hit_ids(await searcher.search(SearchQuery("org-a", "refund", external_channel_id="c1"))) == [w1]
    late = await searcher.search(SearchQuery("org-a", "refund", start=T0 + timedelta(days=1)))
    assert hit_ids(late) == [w2]


GO_MODULE_QUERY = """
SELECT id::text FROM dw_chat_events
WHERE org_id = %s AND event_type = 'message' AND decision IN ('received', 'processed')
  AND search_tsv @@ plainto_tsquery('simple', %s)
ORDER BY created_at DESC, id DESC LIMIT %s
"""


async def test_fts_mode_returns_what_the_go_module_returns(corpus, make_searcher):
    import psycopg

    texts = ["refund please", "no refund yet", "Refund!!", "where is the refund", "thanks", "refund refund"]
    corpus.messages("org-a", "c1", texts)
    corpus.messages("org-a", "c2", ["refund status"], start=T0 + timedelta(hours=3))
    corpus.messages("org-b", "c1", ["refund for b"])
    with psycopg.connect(corpus.url) as conn:
        expected = [r for (r,) in conn.execute(GO_MODULE_QUERY, ("org-a", "refund", 4))]
    result = await make_searcher().search(SearchQuery("org-a", "refund", limit=4, mode=Mode.FTS))
    assert hit_ids(result) == expected and len(expected) == 4


async def test_ineligible_events_are_not_searched(corpus, make_searcher):
    from dwsearch_testkit.seed import insert_events

    insert_events(corpus.url, [("org-a", "wa", "c1", "refund denied", T0)], decision="denied")
    insert_events(corpus.url, [("org-a", "wa", "c1", "refund code 1234", T0)], event_type="verification")
    result = await make_searcher().search(SearchQuery("org-a", "refund"))
    assert result.hits == []


# --- the gRPC surface ------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_kwargs,needle",
    [
        ({"org_id": "", "query": "refund"}, "org_id"),
        ({"org_id": "org-a", "query": ""}, "empty"),
        ({"org_id": "org-a", "query": " \t\n "}, "empty"),
        ({"org_id": "org-a", "query": "x" * (MAX_QUERY_BYTES + 1)}, "bytes"),
        ({"org_id": "org-a", "query": "退" * 3000}, "bytes"),  # 9,000 bytes of UTF-8
        ({"org_id": "org-a", "query": "refund", "limit": 101}, "limit"),
        ({"org_id": "org-a", "query": "refund", "mode": 42}, "mode"),
    ],
)
async def test_bad_requests_are_invalid_argument(search_stub, corpus, request_kwargs, needle):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await search_stub.Search(pb.SearchRequest(**request_kwargs), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in info.value.details()


async def test_inverted_time_range_is_invalid(search_stub, corpus):
    request = pb.SearchRequest(org_id="org-a", query="refund")
    request.start_time.FromDatetime(T0 + timedelta(days=1))
    request.end_time.FromDatetime(T0)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await search_stub.Search(request, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_unknown_org_is_empty(search_stub, corpus):
    corpus.window("org-a", "c1", ["refund please"])
    response = await search_stub.Search(pb.SearchRequest(org_id="nobody", query="refund"), timeout=5)
    assert list(response.hits) == []


async def test_grpc_response_maps_hits_back_to_messages(search_stub, corpus):
    window_id, ids = corpus.window("org-a", "c1", ["refund please", "ok"])
    response = await search_stub.Search(pb.SearchRequest(org_id="org-a", query="refund", limit=3), timeout=5)
    (hit,) = response.hits
    assert hit.kind == pb.HIT_KIND_WINDOW and hit.id == window_id
    assert list(hit.message_ids) == ids and list(hit.matched_message_ids) == [ids[0]]
    assert hit.text == "refund please\nok" and hit.provider == "whatsapp" and hit.external_channel_id == "c1"
    assert hit.start_time.ToDatetime().replace(tzinfo=T0.tzinfo) == T0
    assert hit.fts.rank == 1 and hit.score > 0
    assert response.mode == pb.SEARCH_MODE_HYBRID and not response.degraded


# --- tenancy ---------------------------------------------------------------------------

ORGS = ["org-a", "org-b", "org-c"]
WORDS = ["refund", "parcel", "退款", "bayar", "order", "late"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.lists(
        st.tuples(
            st.sampled_from(ORGS), st.lists(st.sampled_from(WORDS), min_size=1, max_size=3), st.booleans()
        ),
        min_size=1,
        max_size=8,
    ),
    query_org=st.sampled_from(ORGS),
    words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=2),
    mode=st.sampled_from(list(Mode)),
)
async def test_no_result_crosses_an_org(corpus, make_searcher, data, query_org, words, mode):
    import psycopg

    with psycopg.connect(corpus.url, autocommit=True) as conn:
        conn.execute("TRUNCATE dw_chat_events, dw_message_embeddings, dw_lexical_windows, dw_lexical_terms")
    owner: dict[str, str] = {}
    for i, (org, text_words, embedded) in enumerate(data):
        text = " ".join(text_words)
        if embedded:
            wid, ids = corpus.window(org, f"c{i}", [text], start=T0 + timedelta(hours=i))
            owner[wid] = org
        else:
            ids = corpus.messages(org, f"c{i}", [text], start=T0 + timedelta(hours=i))
        for mid in ids:
            owner[mid] = org
    result = await make_searcher().search(SearchQuery(query_org, " ".join(words), limit=100, mode=mode))
    for hit in result.hits:
        assert owner[hit.id] == query_org
        assert {owner[m] for m in hit.message_ids} == {query_org}


async def test_an_embedder_that_keeps_failing_is_skipped_until_it_recovers(
    corpus, make_searcher, fake_embedder
):
    from dwsearch.clients.breaker import THRESHOLD, CircuitBreaker

    corpus.window("org-a", "c1", ["refund please"])
    now = [0.0]
    searcher = make_searcher(
        embed_timeout=0.2, embedder_breaker=CircuitBreaker("embedder-test", clock=lambda: now[0])
    )
    await searcher.search(SearchQuery("org-a", "warm up"))  # caches the model info
    fake_embedder.delay = 1.0
    for _ in range(THRESHOLD):  # each waits out the embed timeout
        result = await searcher.search(SearchQuery("org-a", "refund"))
        assert [r for r, _ in result.degradations] == [Degradation.EMBEDDER_TIMEOUT]
    calls = fake_embedder.calls
    result = await searcher.search(SearchQuery("org-a", "refund"))
    # Full text at once: the embedder not called, so no embed timeout waited out.
    ((reason, detail),) = result.degradations
    assert reason is Degradation.EMBEDDER_UNAVAILABLE and "not called" in detail
    assert len(result.hits) == 1 and fake_embedder.calls == calls
    fake_embedder.delay = 0.0
    now[0] += 60  # past the cooldown: one trial call, which succeeds
    result = await searcher.search(SearchQuery("org-a", "refund"))
    assert result.degradations == [] and result.hits[0].sources["dense"].rank > 0


async def test_a_reranker_that_keeps_failing_is_skipped(corpus, make_searcher, fake_reranker):
    from dwsearch.clients.breaker import THRESHOLD, CircuitBreaker

    corpus.window("org-a", "c1", ["refund please"])
    breaker = CircuitBreaker("reranker-test")
    searcher = make_searcher(reranker=fake_reranker.address, rerank_timeout=0.2, reranker_breaker=breaker)
    fake_reranker.delay = 1.0
    for _ in range(THRESHOLD):
        result = await searcher.search(SearchQuery("org-a", "refund", rerank=True))
        assert [r for r, _ in result.degradations] == [Degradation.RERANKER_TIMEOUT]
    calls = fake_reranker.calls
    result = await searcher.search(SearchQuery("org-a", "refund", rerank=True))
    ((reason, detail),) = result.degradations
    assert reason is Degradation.RERANKER_UNAVAILABLE and "not called" in detail and len(result.hits) == 1
    assert fake_reranker.calls == calls
