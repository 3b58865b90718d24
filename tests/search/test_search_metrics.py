"""Search metrics: each stage's time, degraded answers by reason, and the full-text plan."""

import pytest
from prometheus_client import REGISTRY

from dwsearch.flags import MODULE_FLAG
from dwsearch.search.query import SearchQuery
from dwsearch_testkit.seed import set_org_flag


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Delta:
    """Counts recorded since it was made, for the samples asked of it."""

    def __init__(self, *keys: tuple[str, dict]) -> None:
        self.keys = keys
        self.before = [sample(name, **labels) for name, labels in keys]

    def __call__(self) -> list[float]:
        return [sample(name, **labels) - b for (name, labels), b in zip(self.keys, self.before, strict=True)]


def stage(name: str) -> tuple[str, dict]:
    return "dwsearch_search_stage_seconds_count", {"stage": name}


def degraded(reason: str) -> tuple[str, dict]:
    return "dwsearch_search_degraded_total", {"reason": reason}


def plan(name: str) -> tuple[str, dict]:
    return "dwsearch_search_fts_queries_total", {"plan": name}


async def test_a_hybrid_search_times_each_stage(corpus, make_searcher, fake_reranker):
    corpus.window("org-a", "c1", ["refund please"])
    delta = Delta(stage("fts"), stage("embed"), stage("dense"), stage("rerank"), plan("org_first"))
    result = await make_searcher(reranker=fake_reranker.address).search(
        SearchQuery("org-a", "refund", rerank=True)
    )
    assert result.reranked and not result.degradations
    assert delta() == [1, 1, 1, 1, 1]


async def test_a_stage_that_times_out_is_timed_and_the_degradation_counted(
    corpus, make_searcher, fake_embedder
):
    corpus.window("org-a", "c1", ["refund please"])
    searcher = make_searcher(embed_timeout=0.2)
    await searcher.search(SearchQuery("org-a", "warm up"))  # caches the model info
    fake_embedder.delay = 1.0
    within_100ms = "dwsearch_search_stage_seconds_bucket", {"stage": "embed", "le": "0.1"}
    delta = Delta(stage("embed"), within_100ms, stage("dense"), degraded("embedder_timeout"))
    result = await searcher.search(SearchQuery("org-a", "refund"))
    assert result.hits  # full text still answered
    # This search's own observations: one embed time, above 100 ms (the cumulative bucket did
    # not grow), no dense stage, one timeout.
    assert delta() == [1, 0, 0, 1]


async def test_embedder_down_counts_once(corpus, make_searcher):
    corpus.window("org-a", "c1", ["refund please"])
    delta = Delta(degraded("embedder_unavailable"), stage("dense"))
    result = await make_searcher(embedder="127.0.0.1:9").search(SearchQuery("org-a", "refund"))
    assert result.hits and delta() == [1, 0]


@pytest.mark.parametrize("threshold,expected", [(0, "gin"), (1, "gin"), (1000, "org_first")])
async def test_the_full_text_plan_is_counted(corpus, make_searcher, threshold, expected):
    corpus.messages("org-a", "c1", ["refund please", "refund again"])
    delta = Delta(plan(expected))
    await make_searcher(fts_org_first_max_events=threshold).search(SearchQuery("org-a", "refund"))
    assert delta() == [1]


async def test_flag_off_counts_as_semantic_disabled(corpus, make_searcher):
    corpus.messages("org-a", "c1", ["refund please"])
    set_org_flag(corpus.url, "org-a", MODULE_FLAG, False)
    delta = Delta(degraded("semantic_disabled"), stage("embed"))
    await make_searcher().search(SearchQuery("org-a", "refund"))
    assert delta() == [1, 0]
