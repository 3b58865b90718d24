"""Chat search's lexical leg ("lexical": BM25 over the windows, dwsearch.retrieval.bm25's
words and Chinese bigrams, IDF from the org's own windows): it reads Chinese where full
text cannot, weighs a rare identifier above common words, answers while the embedder is
down, and is explained and weighted like the other legs."""

from datetime import timedelta

import grpc
import pytest

from dwsearch.retrieval import bm25
from dwsearch.retrieval.degradation import Degradation
from dwsearch.search.fusion import parse_weights
from dwsearch.search.query import Mode, SearchQuery
from dwsearch.v1 import search_pb2 as pb
from dwsearch_testkit.fakes import FAKE_MODEL, Failure
from dwsearch_testkit.seed import T0, insert_window


def hit_ids(result) -> list[str]:
    return [h.id for h in result.hits]


async def test_a_chinese_query_finds_its_window_by_the_lexical_leg(corpus, make_searcher):
    wanted, _ = corpus.window("org-a", "c1", ["你好，我要退款", "订单还没有到"])
    corpus.window("org-a", "c2", ["请问营业时间是几点"], start=T0 + timedelta(hours=1))
    corpus.window("org-a", "c3", ["the courier was late"], start=T0 + timedelta(hours=2))
    searcher = make_searcher(lexical=True)
    assert (await searcher.search(SearchQuery("org-a", "退款", mode=Mode.FTS))).hits == []
    result = await searcher.search(SearchQuery("org-a", "退款"))
    (found,) = [h for h in result.hits if h.sources["lexical"].rank]
    assert found.id == wanted and found.sources["lexical"].rank == 1 and found.sources["lexical"].score > 0
    # Semantic mode has no lexical leg (its hits are the dense leg's alone).
    semantic = await searcher.search(SearchQuery("org-a", "退款", mode=Mode.SEMANTIC))
    assert not any(h.sources["lexical"].rank for h in semantic.hits)


async def test_a_rare_identifier_outweighs_common_words(corpus, make_searcher):
    for i in range(6):
        corpus.window(
            "org-a", f"c{i}", [f"refund request please, refund it {i}"], start=T0 + timedelta(hours=i)
        )
    order, _ = corpus.window("org-a", "order", ["order SO-5521 refund"], start=T0 + timedelta(hours=9))
    result = await make_searcher(lexical=True).search(SearchQuery("org-a", "refund refund SO-5521", limit=10))
    lexical = sorted(
        (h for h in result.hits if h.sources["lexical"].rank), key=lambda h: h.sources["lexical"].rank
    )
    assert lexical[0].id == order and len(lexical) == 7  # every window shares a term


async def test_the_lexical_leg_answers_while_the_embedder_is_down(corpus, make_searcher, fake_embedder):
    wanted, _ = corpus.window("org-a", "c1", ["快递什么时候到", "明天"])
    corpus.window("org-a", "c2", ["营业时间"], start=T0 + timedelta(hours=1))
    searcher = make_searcher(lexical=True)
    for mode in (Mode.HYBRID, Mode.SEMANTIC):
        fake_embedder.failures.append(Failure(grpc.StatusCode.INTERNAL, "model crashed"))
        result = await searcher.search(SearchQuery("org-a", "快递", mode=mode))
        assert result.degradations[0][0] is Degradation.EMBEDDER_UNAVAILABLE
        assert hit_ids(result) == [wanted] and result.hits[0].sources["lexical"].rank == 1


async def test_windows_without_weights_are_left_to_the_other_legs(corpus, make_searcher, db_url):
    corpus.window("org-a", "c1", ["没有词权重的窗口"])
    ids = corpus.messages("org-a", "c2", ["退款窗口"], start=T0 + timedelta(hours=1))
    old = insert_window(
        db_url, org="org-a", model=FAKE_MODEL, provider="whatsapp", channel="c2", message_ids=ids,
        content="退款窗口", start=T0 + timedelta(hours=1), end=T0 + timedelta(hours=1), dense=[1.0] * 32,
        lexical=False,
    )  # fmt: skip
    result = await make_searcher(lexical=True).search(SearchQuery("org-a", "退款"))
    assert not any(h.sources["lexical"].rank for h in result.hits if h.id == old)
    # A query of no words and no Chinese has no lexical leg to run.
    punctuation = await make_searcher(lexical=True).search(SearchQuery("org-a", "?!", explain=True))
    assert not any(h.sources["lexical"].rank for h in punctuation.hits)


async def test_the_lexical_leg_is_explained_weighted_and_timed(corpus, make_searcher, serve_search):
    corpus.window("org-a", "c1", ["我要退款"])
    off = await (await serve_search(make_searcher())).stub.Search(
        pb.SearchRequest(org_id="org-a", query="退款")
    )
    assert not any("lexical" in h.sources for h in off.hits)  # off by default (DWSEARCH_LEXICAL_LEG)
    search_stub = (await serve_search(make_searcher(lexical=True))).stub
    response = await search_stub.Search(
        pb.SearchRequest(org_id="org-a", query="退款", explain=True, fusion_weights={"lexical": 2}), timeout=5
    )
    (hit,) = response.hits
    legs = {p.leg: p for p in hit.explanation.legs}
    assert legs["lexical"].rank == 1 and legs["lexical"].weight == 2.0
    assert hit.sources["lexical"].rank == 1
    assert "lexical" in {s.stage for s in response.stage_times}
    assert parse_weights("lexical=0.25") == {"lexical": 0.25}
    with pytest.raises(ValueError, match="fts, lexical, dense or sparse"):
        parse_weights("lexicon=1")


async def test_a_score_is_the_share_of_the_query_a_window_holds(corpus, make_searcher):
    """The lexical leg's score is BM25 over the query's IDF mass: a window with every term
    scores near 1, one sharing a stray bigram of a long query near 0 (fused as it is)."""
    whole, _ = corpus.window("org-a", "c1", ["电饭锅保修多久"])
    stray, _ = corpus.window("org-a", "c2", ["保修卡在盒子里"], start=T0 + timedelta(hours=1))
    corpus.window("org-a", "c3", ["the courier was late"], start=T0 + timedelta(hours=2))
    result = await make_searcher(lexical=True).search(SearchQuery("org-a", "电饭锅保修多久"))
    scores = {h.id: h.sources["lexical"].score for h in result.hits if h.sources["lexical"].rank}
    assert set(scores) == {whole, stray}
    assert 0.8 < scores[whole] <= bm25.K1 + 1 and scores[stray] < 0.3 * scores[whole]  # short: above 1


async def test_the_lexical_leg_keeps_to_the_searchs_channel_and_time(corpus, make_searcher):
    """The leg scans the weights' projection (dw_lexical_windows, migration 0016), which
    carries the columns a search narrows windows by: provider, channel and time."""
    first, _ = corpus.window("org-a", "c1", ["我要退款"])
    other, _ = corpus.window("org-a", "c2", ["我要退款 please"], start=T0 + timedelta(hours=1))
    later, _ = corpus.window("org-a", "c1", ["退款到了吗"], start=T0 + timedelta(days=2))
    searcher = make_searcher(lexical=True)

    async def lexical(**narrowed) -> list[str]:
        result = await searcher.search(SearchQuery("org-a", "退款", **narrowed))
        hits = [h for h in result.hits if h.sources["lexical"].rank]
        return [h.id for h in sorted(hits, key=lambda h: h.sources["lexical"].rank)]

    assert sorted(await lexical()) == sorted([first, other, later])
    assert sorted(await lexical(external_channel_id="c1")) == sorted([first, later])
    assert await lexical(external_channel_id="c1", end=T0 + timedelta(days=1)) == [first]
    assert await lexical(start=T0 + timedelta(minutes=30), end=T0 + timedelta(days=1)) == [other]
    assert await lexical(provider="telegram") == []


async def test_reading_by_term_ranks_as_the_scan_does(corpus, make_searcher, monkeypatch):
    """Where the counts say the query's terms are in few of the org's windows, the leg
    reads those through migration 0019's index of the org's terms; the windows, ranks and
    scores are the scan's, rare and common terms alike, narrowed or not."""
    from dwsearch.search.store import knn

    corpus.window("org-b", "c1", ["order SO-5521 refund 退款"])  # another org's: never found
    for i in range(10):
        corpus.window("org-a", f"c{i % 3}", [f"refund please {i}, 我要退款"], start=T0 + timedelta(hours=i))
    corpus.window("org-a", "c1", ["order SO-5521 快递 late"], start=T0 + timedelta(hours=20))
    corpus.window("org-a", "c2", ["SO-5521 again, 快递 still late"], start=T0 + timedelta(hours=21))
    searcher = make_searcher(lexical=True)

    async def lexical(share: int, text: str, **narrowed) -> list[tuple[str, int, float]]:
        monkeypatch.setattr(knn, "BY_TERM_SHARE", share)
        result = await searcher.search(SearchQuery("org-a", text, limit=20, **narrowed))
        return sorted(
            (h.id, h.sources["lexical"].rank, round(h.sources["lexical"].score, 6))
            for h in result.hits
            if h.sources["lexical"].rank
        )

    for text, narrowed in [
        ("SO-5521", {}),
        ("快递", {}),
        ("SO-5521 refund", {}),
        ("退款", {}),
        ("SO-5521", {"external_channel_id": "c2"}),
        ("快递 late", {"start": T0 + timedelta(hours=20, minutes=30)}),
    ]:
        scanned = await lexical(10**9, text, **narrowed)  # never by term
        assert scanned and await lexical(0, text, **narrowed) == scanned, (text, narrowed)


def test_the_by_term_statement_reads_the_terms_index(db_url):
    """The by-term statement asks migration 0019's index of the org's terms, with every
    other plan open to the planner, on orgs of a few thousand windows (where, with the
    keys costed as a few operators, it read the org's rows and computed each one's keys:
    30 times slower than the scan). In a transaction rolled back: nothing stays."""
    import psycopg

    from dwsearch.search.store import knn
    from dwsearch.search.store.scope import ChatScope

    windows = """INSERT INTO dw_message_embeddings (org_id, model, provider, external_channel_id, window_start,
                     window_end, embedding, lexical, content, source_message_ids)
                 SELECT 'org-' || n % 4, 'm', 'whatsapp', 'c1', now(), now(), '[1,0]'::halfvec,
                        format('{%s:1,%s:0.5,%s:0.25}/1000000000', n % 7 + 1, n % 101 + 10, n + 1000)::sparsevec,
                        'x', '{}'
                 FROM generate_series(1, 12000) AS n"""
    projected = """INSERT INTO dw_lexical_windows (id, org_id, model, provider, external_channel_id, window_start,
                       window_end, lexical)
                   SELECT id, org_id, model, provider, external_channel_id, window_start, window_end, lexical
                   FROM dw_message_embeddings"""
    statement = knn._knn_sql(ChatScope("org-1").shape(), "lexical", False, True)
    rare = {"org": "org-1", "model": "m", "vector": "{2001:1}/1000000000", "k": 10, "terms": [2001]}
    with psycopg.connect(db_url) as conn:
        conn.execute(windows)
        conn.execute(projected)
        conn.execute("ANALYZE dw_lexical_windows")
        plan = "\n".join(line for (line,) in conn.execute(b"EXPLAIN " + statement, rare).fetchall())
        rows = conn.execute(statement, rare).fetchall()
        conn.rollback()
    assert "dw_lexical_windows_term_keys_idx" in plan, plan
    assert len(rows) == 1  # the one window of org-1 holding that term (n = 1001)


async def test_simplified_and_traditional_chinese_find_each_other(corpus, make_searcher):
    """The leg's terms fold Traditional Chinese to Simplified, in the windows the sweep
    weighs and in the query (dwsearch.retrieval.chinese): 频道 finds 頻道 and the reverse,
    with the same scores, and the highlight lights up the window's own characters."""
    traditional, _ = corpus.window("org-a", "c1", ["請問這個頻道的會員怎麼退貨"])
    simplified, _ = corpus.window("org-a", "c2", ["频道会员退货要多久"], start=T0 + timedelta(hours=1))
    corpus.window("org-a", "c3", ["the courier was late"], start=T0 + timedelta(hours=2))
    searcher = make_searcher(lexical=True)

    async def lexical(text: str) -> dict[str, tuple[float, list[str]]]:
        result = await searcher.search(SearchQuery("org-a", text))
        return {
            h.id: (round(h.sources["lexical"].score, 6), [h.text[a:b] for a, b in h.highlights])
            for h in result.hits
            if h.sources["lexical"].rank
        }

    from_simplified, from_traditional = await lexical("频道会员"), await lexical("頻道會員")
    assert set(from_simplified) == {traditional, simplified}
    assert from_simplified == from_traditional
    assert from_simplified[traditional][1] == ["頻道", "會員"]
    assert from_simplified[simplified][1] == ["频道会员"]
    assert set(await lexical("退貨")) == set(await lexical("退货")) == {traditional, simplified}
