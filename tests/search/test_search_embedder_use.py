"""How search uses the embedder: the interactive lane, the query-embedding cache (a
repeated search costs no Embed call; the cache holds its byte bound), and serve's
warning when the embedder's measured query latency is over search's deadline."""

from __future__ import annotations

import logging

import grpc
import pytest
from prometheus_client import REGISTRY

from dwsearch.clients.breaker import THRESHOLD, CircuitBreaker
from dwsearch.clients.embedder import EmbedderClient
from dwsearch.clients.querycache import QueryCache, entry_bytes
from dwsearch.common.config import ServerConfig
from dwsearch.redaction import REDACTION_ON, redact
from dwsearch.retrieval.degradation import Degradation
from dwsearch.search.query import SearchQuery
from dwsearch.serve import build_application
from dwsearch_testkit.fakes import FAKE_MODEL, Failure
from dwsearch_testkit.net import free_port

MiB = 1024 * 1024


def sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_query_embedding_and_rerank_take_the_interactive_lane(
    corpus, make_searcher, fake_embedder, fake_reranker
):
    corpus.window("org-a", "c1", ["refund please"])
    result = await make_searcher(reranker=fake_reranker.address).search(
        SearchQuery("org-a", "refund", rerank=True)
    )
    assert result.reranked and not result.degradations
    assert fake_embedder.priorities == ["PRIORITY_INTERACTIVE"]
    assert fake_reranker.priorities == ["PRIORITY_INTERACTIVE"]


async def test_a_repeated_search_makes_one_embed_call(corpus, make_searcher, fake_embedder):
    window_id, _ = corpus.window("org-a", "c1", ["refund please"])
    searcher = make_searcher(query_cache=QueryCache(MiB))
    hits, misses = sample("dwsearch_query_cache_hits_total"), sample("dwsearch_query_cache_misses_total")
    first = await searcher.search(SearchQuery("org-a", "refund"))
    for _ in range(3):
        again = await searcher.search(SearchQuery("org-a", "refund"))
        assert [h.id for h in again.hits] == [h.id for h in first.hits] == [window_id]
        assert again.hits[0].sources["dense"].rank > 0 and not again.degradations
    assert fake_embedder.embed_calls == 1
    assert sample("dwsearch_query_cache_hits_total") - hits == 3
    assert sample("dwsearch_query_cache_misses_total") - misses == 1
    assert sample("dwsearch_query_cache_bytes") > 0
    # Another query, or the same one in another org, is its own entry / the same entry.
    await searcher.search(SearchQuery("org-b", "refund"))
    await searcher.search(SearchQuery("org-a", "refund now"))
    assert fake_embedder.embed_calls == 2


async def test_the_cache_is_keyed_on_the_redacted_text(corpus, make_searcher, fake_embedder):
    corpus.window("org-a", "c1", ["refund please"])
    searcher = make_searcher(query_cache=QueryCache(MiB), redaction=REDACTION_ON)
    await searcher.search(SearchQuery("org-a", "refund to ali@example.com"))
    await searcher.search(SearchQuery("org-a", "refund to siti@example.org"))  # the same once redacted
    assert fake_embedder.embed_calls == 1
    assert fake_embedder.received == [redact("refund to ali@example.com")]
    assert "example" not in fake_embedder.received[0]


async def test_a_failed_embedding_is_not_cached(corpus, make_searcher, fake_embedder):
    corpus.window("org-a", "c1", ["refund please"])
    searcher = make_searcher(query_cache=QueryCache(MiB))
    fake_embedder.failures.append(Failure(grpc.StatusCode.INTERNAL, "model crashed"))
    failed = await searcher.search(SearchQuery("org-a", "refund"))
    assert [r for r, _ in failed.degradations] == [Degradation.EMBEDDER_UNAVAILABLE]
    ok = await searcher.search(SearchQuery("org-a", "refund"))
    assert not ok.degradations and fake_embedder.embed_calls == 2
    await searcher.search(SearchQuery("org-a", "refund"))
    assert fake_embedder.embed_calls == 2


async def test_without_the_cache_every_search_embeds(corpus, make_searcher, fake_embedder):
    corpus.window("org-a", "c1", ["refund please"])
    searcher = make_searcher(query_cache=QueryCache(0))
    for _ in range(3):
        await searcher.search(SearchQuery("org-a", "refund"))
    assert fake_embedder.embed_calls == 3


async def test_the_cache_keeps_its_byte_bound(corpus, make_searcher, fake_embedder):
    corpus.window("org-a", "c1", ["refund please"])
    # Room for two entries of these queries' size, not three.
    probe = QueryCache(MiB)
    searcher = make_searcher(query_cache=probe)
    await searcher.search(SearchQuery("org-a", "query 0"))
    size = probe.bytes
    assert size > 32 * 4  # the dense vector alone, plus its sparse weights and text
    cache = QueryCache(2 * size + size // 2)
    searcher = make_searcher(query_cache=cache)
    fake_embedder.embed_calls = 0
    for i in range(3):
        await searcher.search(SearchQuery("org-a", f"query {i}"))
        assert cache.bytes <= cache._lru.max_bytes
    assert len(cache) == 2 and fake_embedder.embed_calls == 3
    await searcher.search(SearchQuery("org-a", "query 2"))  # still there
    assert fake_embedder.embed_calls == 3
    await searcher.search(SearchQuery("org-a", "query 0"))  # the least recently used went
    assert fake_embedder.embed_calls == 4 and cache.bytes <= cache._lru.max_bytes


def test_an_entry_is_charged_its_vectors_and_key_text():
    import numpy as np

    from dwsearch.clients.embedder import Embedding
    from dwsearch.clients.querycache import _Key

    small = Embedding(np.zeros(4, np.float32), None, 1, False)
    big = Embedding(np.zeros(1024, np.float32), {i: 0.5 for i in range(10)}, 1, False)
    key = _Key("m", "hello", True, True, True)
    assert entry_bytes(key, big) - entry_bytes(key, small) == (1024 - 4) * 4 + 10 * 100
    assert entry_bytes(_Key("m", "hello world", True, True, True), small) - entry_bytes(key, small) == 6
    cache = QueryCache(entry_bytes(key, small) - 1)  # smaller than one entry: nothing is stored
    cache.put("m", "hello", small, sparse=True)
    assert len(cache) == 0 and cache.get("m", "hello", sparse=True) is None


async def test_a_cached_query_answers_while_the_embedder_circuit_is_open(
    corpus, make_searcher, fake_embedder
):
    corpus.window("org-a", "c1", ["refund please"])
    now = [0.0]
    searcher = make_searcher(
        embed_timeout=0.2,
        query_cache=QueryCache(MiB),
        embedder_breaker=CircuitBreaker("embedder-cache-test", clock=lambda: now[0]),
    )
    await searcher.search(SearchQuery("org-a", "refund"))
    fake_embedder.delay = 1.0
    for _ in range(THRESHOLD):
        await searcher.search(SearchQuery("org-a", "something else"))
    calls = fake_embedder.embed_calls
    cached = await searcher.search(SearchQuery("org-a", "refund"))
    assert not cached.degradations and cached.hits[0].sources["dense"].rank > 0
    opened = await searcher.search(SearchQuery("org-a", "not cached"))
    assert "not called" in opened.degradations[0][1] and fake_embedder.embed_calls == calls


# --- The embedder's measured latency against search's deadline --------------------------


async def test_a_query_latency_over_the_deadline_is_logged_and_in_the_gauges(
    make_searcher, fake_embedder, caplog
):
    fake_embedder.query_latency_ms = 912.0
    fake_embedder.runtime = "torch"
    searcher = make_searcher(embed_timeout=0.3)
    with caplog.at_level(logging.WARNING, logger="dwsearch.search.deadline"):
        await searcher.check_embedder(timeout=5)
    (record,) = [r for r in caplog.records if r.name == "dwsearch.search.deadline"]
    message = record.getMessage()
    assert record.levelno == logging.WARNING
    assert "912 ms" in message and "300 ms" in message
    for remedy in ("CPUs", "DWSEARCH_THREADS", "onnx", "int8", "GPU", "DWSEARCH_EMBED_TIMEOUT_MS"):
        assert remedy in message, remedy
    assert sample("dwsearch_search_embedder_query_latency_seconds") == pytest.approx(0.912)
    assert sample("dwsearch_search_embed_deadline_seconds") == pytest.approx(0.3)


async def test_a_query_latency_within_the_deadline_is_quiet(make_searcher, fake_embedder, caplog):
    fake_embedder.query_latency_ms = 40.0
    with caplog.at_level(logging.WARNING, logger="dwsearch.search.deadline"):
        await make_searcher(embed_timeout=0.3).check_embedder(timeout=5)
    assert not [r for r in caplog.records if r.name == "dwsearch.search.deadline"]
    assert sample("dwsearch_search_embedder_query_latency_seconds") == pytest.approx(0.04)


async def test_the_latency_is_checked_again_when_the_model_info_is_refreshed(
    corpus, make_searcher, fake_embedder, caplog, monkeypatch
):
    from dwsearch.clients import queryembedder

    corpus.window("org-a", "c1", ["refund please"])
    fake_embedder.query_latency_ms = 50.0
    searcher = make_searcher(embed_timeout=0.3)
    await searcher.search(SearchQuery("org-a", "refund"))
    fake_embedder.query_latency_ms = 700.0  # e.g. a rollout to slower pods
    monkeypatch.setattr(queryembedder, "MODEL_INFO_TTL_S", 0.0)
    with caplog.at_level(logging.WARNING, logger="dwsearch.search.deadline"):
        await searcher.search(SearchQuery("org-a", "refund"))
        await searcher.search(SearchQuery("org-a", "refund"))  # warned once, not per refresh
    assert len([r for r in caplog.records if r.name == "dwsearch.search.deadline"]) == 1
    assert sample("dwsearch_search_embedder_query_latency_seconds") == pytest.approx(0.7)


async def test_serve_checks_the_embedder_at_start(pool, fake_embedder, caplog):
    fake_embedder.query_latency_ms = 650.0
    config = ServerConfig(embed_model=FAKE_MODEL, embedder_addr=fake_embedder.address, embed_timeout_ms=250)
    embedder = EmbedderClient(fake_embedder.address, timeout=5)
    app = build_application(config=config, pool=pool, embedder=embedder, reranker=None)
    try:
        with caplog.at_level(logging.WARNING, logger="dwsearch.search.deadline"):
            await app.check_embedder_soon()
        assert any("650 ms" in r.getMessage() and "250 ms" in r.getMessage() for r in caplog.records)
        assert sample("dwsearch_search_embed_deadline_seconds") == pytest.approx(0.25)
    finally:
        await app.embedder.close()


async def test_serve_starts_with_the_embedder_down(pool, caplog):
    closed = f"127.0.0.1:{free_port()}"
    config = ServerConfig(embed_model=FAKE_MODEL, embedder_addr=closed)
    app = build_application(
        config=config, pool=pool, embedder=EmbedderClient(closed, timeout=5), reranker=None
    )
    try:
        with caplog.at_level(logging.WARNING, logger="dwsearch.search.legs"):
            await app.check_embedder_soon()  # returns: nothing raised
        assert any("not checked at start" in r.getMessage() for r in caplog.records)
    finally:
        await app.embedder.close()


async def test_a_wrong_model_is_named_at_start(make_searcher, fake_embedder, caplog):
    fake_embedder.model_id = "someone/else"
    with caplog.at_level(logging.WARNING, logger="dwsearch.search.legs"):
        await make_searcher().check_embedder(timeout=5)
    assert any(
        "another model" in r.getMessage() and "someone/else" in str(r.__dict__.get("error"))
        for r in caplog.records
    )
