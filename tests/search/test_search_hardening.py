"""Search hardening (issue 14): `limit` up to 100 holds with rerank (it stopped at the
rerank pool of 50), and a query embedding answered by another model is never compared."""

from datetime import timedelta

from dwsearch.retrieval.degradation import Degradation
from dwsearch.search.query import MAX_LIMIT, SearchQuery
from dwsearch_testkit.fakes import FAKE_MODEL
from dwsearch_testkit.seed import T0


async def test_limit_up_to_100_holds_with_and_without_rerank(corpus, make_searcher, fake_reranker):
    for i in range(110):
        corpus.window("org-a", f"c{i % 10}", [f"refund request number {i}", "refund approved"],
                      start=T0 + timedelta(hours=i))  # fmt: skip
    searcher = make_searcher(reranker=fake_reranker.address)
    for limit in (10, 50, 51, 80, MAX_LIMIT):
        reranked = await searcher.search(SearchQuery("org-a", "refund approved", limit=limit, rerank=True))
        plain = await searcher.search(SearchQuery("org-a", "refund approved", limit=limit, rerank=False))
        assert reranked.reranked and not reranked.degradations
        assert len(reranked.hits) == len(plain.hits) == limit, (limit, len(reranked.hits), len(plain.hits))
        assert len({h.id for h in reranked.hits}) == limit
        assert [h.rerank.rank for h in reranked.hits] == list(range(1, limit + 1))


async def test_a_query_embedding_of_another_model_degrades_the_search(corpus, make_searcher, fake_embedder):
    """Info (asked once a minute) names the configured model; the Embed response another
    one, as a pod of the other model behind round robin would."""
    corpus.window("org-a", "c1", ["refund please", "sure"])
    searcher = make_searcher()
    first = await searcher.search(SearchQuery("org-a", "refund"))
    assert not first.degradations
    fake_embedder.model_id = "fake/other-model-v2"  # Info is not asked again within the minute
    second = await searcher.search(SearchQuery("org-a", "refund please"))
    assert [reason for reason, _ in second.degradations] == [Degradation.EMBEDDER_UNAVAILABLE]
    assert "answered with model 'fake/other-model-v2'" in second.degradations[0][1]
    assert second.hits  # full text still answers
    # With the right pod answering again, the query is embedded and used.
    fake_embedder.model_id = FAKE_MODEL
    calls = fake_embedder.embed_calls
    third = await searcher.search(SearchQuery("org-a", "refund please"))
    assert not third.degradations and fake_embedder.embed_calls == calls + 1
