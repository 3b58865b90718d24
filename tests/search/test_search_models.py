"""Several active models (DWSEARCH_EMBED_MODELS): Search runs a dense leg (and a sparse one)
per model over one embedder address, fuses them with full text, and leaves out a model
whose embedding fails, saying why, while the others answer."""

import asyncio
from datetime import timedelta

from dwsearch.clients.querycache import QueryCache
from dwsearch.retrieval.degradation import Degradation
from dwsearch.search.query import Mode, SearchQuery
from dwsearch_testkit.fakes import FAKE_MODEL, FakeEmbedder, fake_sparse, fake_vector
from dwsearch_testkit.seed import T0, insert_window

SECOND = "fake/second-v1"


def second_model_window(corpus, org: str, channel: str, texts: list[str]) -> str:
    """Messages embedded by the second model only, in its own vector space (the fake
    embedder salts the text with the model's name)."""
    ids = corpus.messages(org, channel, texts)
    content = "\n".join(texts)
    return insert_window(
        corpus.url,
        org=org,
        model=SECOND,
        provider="whatsapp",
        channel=channel,
        message_ids=ids,
        content=content,
        start=T0,
        end=T0 + timedelta(minutes=len(texts) - 1),
        dense=fake_vector(f"{SECOND}\n{content}", 32),
        sparse=fake_sparse(content),
    )


async def test_a_window_only_the_second_model_embedded_is_found(corpus, make_searcher, fake_embedder):
    fake_embedder.models = (SECOND,)
    first, _ = corpus.window("org-a", "c1", ["refund please"])
    text = ["我想取消订单", "好的"]  # no full-text match: only a KNN leg can find it
    second = second_model_window(corpus, "org-a", "c2", text)
    searcher = make_searcher(models=(FAKE_MODEL, SECOND))
    result = await searcher.search(SearchQuery("org-a", "\n".join(text), mode=Mode.SEMANTIC))
    assert result.degradations == [] and result.model == f"{FAKE_MODEL},{SECOND}"
    ids = [h.id for h in result.hits]
    assert ids[0] == second and first in ids  # both models' windows are candidates
    top = result.hits[0]
    assert top.sources[f"dense:{SECOND}"].rank == 1 and top.sources[f"sparse:{SECOND}"].rank > 0
    assert top.sources.get(f"dense:{FAKE_MODEL}") is None  # the first model has no window there
    assert sorted(m for m in fake_embedder.requested_models if m) == sorted(
        [FAKE_MODEL, SECOND] * 2
    )  # Info + Embed

    hybrid = await searcher.search(SearchQuery("org-a", "\n".join(text)))
    assert hybrid.hits[0].id == second and hybrid.fusion == "weighted"  # DEFAULT_METHOD


async def test_the_same_messages_in_both_models_are_one_hit(corpus, make_searcher, fake_embedder):
    fake_embedder.models = (SECOND,)
    window, ids = corpus.window("org-a", "c1", ["refund please", "order 5521"])
    content = "refund please\norder 5521"
    insert_window(
        corpus.url, org="org-a", model=SECOND, provider="whatsapp", channel="c1", message_ids=ids,
        content=content, start=T0, end=T0 + timedelta(minutes=1),
        dense=fake_vector(f"{SECOND}\n{content}", 32), sparse=fake_sparse(content),
    )  # fmt: skip
    result = await make_searcher(models=(FAKE_MODEL, SECOND)).search(SearchQuery("org-a", "refund please"))
    [hit] = result.hits
    assert hit.id == window  # named after the first model's window
    assert {s for s, r in hit.sources.items() if r.rank and ":" in s} == {
        f"dense:{FAKE_MODEL}",
        f"sparse:{FAKE_MODEL}",
        f"dense:{SECOND}",
        f"sparse:{SECOND}",
    }
    assert hit.sources["fts"].rank == 1 and hit.matched_message_ids == [ids[0]]


async def test_a_model_the_embedder_does_not_serve_degrades_and_the_others_answer(
    corpus, make_searcher, fake_embedder
):
    fake_embedder.models = (SECOND,)  # serves FAKE_MODEL and SECOND, not "fake/missing"
    first, _ = corpus.window("org-a", "c1", ["refund please"])
    searcher = make_searcher(models=(FAKE_MODEL, "fake/missing"))
    for mode in (Mode.HYBRID, Mode.SEMANTIC):
        result = await searcher.search(SearchQuery("org-a", "refund please", mode=mode))
        ((reason, detail),) = result.degradations
        assert reason is Degradation.EMBEDDER_UNAVAILABLE and "fake/missing" in detail
        assert result.mode is mode and [h.id for h in result.hits] == [first]
        assert result.hits[0].sources[f"dense:{FAKE_MODEL}"].rank == 1


async def test_a_model_answered_by_another_degrades_and_the_others_answer(
    corpus, make_searcher, fake_embedder
):
    """An embedder of one model answers every request with it: the client's model check
    refuses the second model's answer (its vectors would be compared across spaces)."""
    first, _ = corpus.window("org-a", "c1", ["refund please"])
    result = await make_searcher(models=(FAKE_MODEL, SECOND)).search(SearchQuery("org-a", "refund please"))
    ((reason, detail),) = result.degradations
    assert reason is Degradation.EMBEDDER_UNAVAILABLE and SECOND in detail and FAKE_MODEL in detail
    assert [h.id for h in result.hits] == [first] and result.hits[0].sources[f"dense:{FAKE_MODEL}"].rank == 1


async def test_every_model_down_in_semantic_mode_answers_with_full_text(corpus, make_searcher):
    corpus.window("org-a", "c1", ["refund please"])
    searcher = make_searcher(models=(FAKE_MODEL, SECOND), embedder="127.0.0.1:9")  # nothing listens
    result = await searcher.search(SearchQuery("org-a", "refund", mode=Mode.SEMANTIC))
    assert [r for r, _ in result.degradations] == [Degradation.EMBEDDER_UNAVAILABLE] * 2
    assert len(result.hits) == 1 and result.hits[0].sources["fts"].rank == 1


async def test_the_query_cache_holds_each_models_embedding(corpus, make_searcher, fake_embedder):
    fake_embedder.models = (SECOND,)
    corpus.window("org-a", "c1", ["refund please"])
    cache = QueryCache(1 << 20)
    searcher = make_searcher(models=(FAKE_MODEL, SECOND), query_cache=cache)
    await searcher.search(SearchQuery("org-a", "refund please"))
    assert len(cache) == 2 and fake_embedder.embed_calls == 2
    again = await searcher.search(SearchQuery("org-a", "refund please"))
    assert fake_embedder.embed_calls == 2 and again.degradations == []


async def test_serve_searches_every_model_of_dwsearch_embed_models(corpus, pool, fake_embedder, caplog):
    """serve's Searcher takes ServerConfig.models (DWSEARCH_EMBED_MODELS); the start-up
    check asks for each, naming one the embedder does not serve."""
    import logging

    from dwsearch.clients.embedder import EmbedderClient
    from dwsearch.common.config import ServerConfig
    from dwsearch.serve import build_application

    fake_embedder.models = (SECOND,)
    text = ["我想取消订单", "好的"]
    second = second_model_window(corpus, "org-a", "c2", text)
    config = ServerConfig(
        embed_model=FAKE_MODEL,
        embed_models=(FAKE_MODEL, SECOND, "fake/missing"),
        embedder_addr=fake_embedder.address,
    )
    app = build_application(
        config=config, pool=pool, embedder=EmbedderClient(fake_embedder.address, timeout=5), reranker=None
    )
    try:
        assert app.searcher is not None and app.searcher.models == (FAKE_MODEL, SECOND, "fake/missing")
        with caplog.at_level(logging.WARNING, logger="dwsearch.search.legs"):
            await app.searcher.check_embedder(timeout=5)
        assert [r.__dict__.get("model") for r in caplog.records if "another model" in r.getMessage()] == [
            "fake/missing"
        ]
        result = await app.searcher.search(SearchQuery("org-a", "\n".join(text), mode=Mode.SEMANTIC))
        assert result.hits[0].id == second and result.hits[0].sources[f"dense:{SECOND}"].rank == 1
        ((reason, detail),) = result.degradations
        assert reason is Degradation.EMBEDDER_UNAVAILABLE and "fake/missing" in detail
    finally:
        await app.embedder.close()


class _PerModelEmbedder(FakeEmbedder):
    """Serves FAKE_MODEL and SECOND. `slow`: the models whose Embed calls take `delay_s`;
    `together`: Embed calls are held until this many are in flight at once (never
    released when the legs run one after another), then answered."""

    def __init__(self, *, slow: tuple[str, ...] = (), delay_s: float = 0.0, together: int = 0) -> None:
        super().__init__(models=(SECOND,))
        self.slow, self.delay_s, self.together = slow, delay_s, together
        self.in_flight = 0
        self.all_in = asyncio.Event()

    async def Embed(self, request, context):
        if request.model in self.slow:
            await asyncio.sleep(self.delay_s)  # time itself: the model is slow
        if self.together:
            self.in_flight += 1
            if self.in_flight >= self.together:
                self.all_in.set()
            await self.all_in.wait()
        return await super().Embed(request, context)


async def _serving(fake: FakeEmbedder):
    await fake.start()
    return fake


async def test_the_models_legs_run_concurrently(corpus, make_searcher):
    corpus.window("org-a", "c1", ["refund please"])
    fake = await _serving(_PerModelEmbedder(together=2))
    try:
        searcher = make_searcher(models=(FAKE_MODEL, SECOND), embedder=fake.address, embed_timeout=5.0)
        result = await searcher.search(SearchQuery("org-a", "refund please", mode=Mode.SEMANTIC))
        assert result.degradations == [] and fake.in_flight == 2  # both embeds were in flight together
    finally:
        await fake.stop()


async def test_a_slow_model_times_out_and_the_others_answer(corpus, make_searcher):
    first, _ = corpus.window("org-a", "c1", ["refund please"])
    fake = await _serving(_PerModelEmbedder(slow=(SECOND,), delay_s=1.0))
    try:
        searcher = make_searcher(models=(FAKE_MODEL, SECOND), embedder=fake.address, embed_timeout=0.3)
        await searcher.check_embedder(timeout=5)  # Info for both: only Embed is slow
        result = await searcher.search(SearchQuery("org-a", "refund please"))
        ((reason, detail),) = result.degradations
        assert reason is Degradation.EMBEDDER_TIMEOUT and SECOND in detail
        assert [h.id for h in result.hits] == [first] and result.hits[0].sources[
            f"dense:{FAKE_MODEL}"
        ].rank == 1
    finally:
        await fake.stop()
