"""Scores as Upstash gives them: a vector queried against itself scores exactly 1 on every
metric (dwsearch.index.space.VectorSpace.score), non-trivial vectors included (random
384-d ones, unnormalised for COSINE and EUCLIDEAN as the TypeScript suite's random
integers are, unit length for DOT_PRODUCT), and the hits keep the metric's order."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest
from rest_api import rest_api

from dwsearch.redaction import REDACTION_OFF
from dwsearch.rest.indexfile import parse_indexes
from dwsearch.rest.server import RestServer

pytestmark = pytest.mark.timeout(120)

DIMENSION = 384
METRICS = ("COSINE", "DOT_PRODUCT", "EUCLIDEAN")
INDEXES = "".join(
    f'[[index]]\nname = "{m.lower()}"\ntoken = "{m.lower()}-token"\ndimension = {DIMENSION}\nmetric = "{m}"\n\n'
    for m in METRICS
)


@pytest.fixture
async def scores_url(pool) -> AsyncIterator[str]:
    server = RestServer(rest_api(pool, parse_indexes(INDEXES), redaction=REDACTION_OFF), "127.0.0.1", 0)
    await server.start()
    yield f"http://127.0.0.1:{server.port}"
    await server.stop()


async def call(url: str, metric: str, path: str, body: object) -> Any:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        response = await http.post(
            path, headers={"Authorization": f"Bearer {metric.lower()}-token"}, json=body
        )
    assert response.status_code == 200, response.text
    return response.json()["result"]


def vectors(metric: str) -> list[list[float]]:
    """40 vectors whose float32 arithmetic does not come out round: random integers from
    0 to 384 (the TypeScript suite's), normals at scales from 1e-3 to 1e6, and for
    DOT_PRODUCT normals at unit length (normalised in float64, as a client does)."""
    rng = np.random.default_rng(384)
    if metric == "DOT_PRODUCT":
        normals = rng.normal(size=(40, DIMENSION))
        return (normals / np.linalg.norm(normals, axis=1, keepdims=True)).tolist()
    integers = rng.integers(0, DIMENSION + 1, size=(20, DIMENSION)).astype(float)
    scales = 10.0 ** rng.integers(-3, 7, size=(20, 1))
    return [*integers.tolist(), *(rng.normal(size=(20, DIMENSION)) * scales).tolist()]


@pytest.mark.parametrize("metric", METRICS)
async def test_a_vector_queried_against_itself_scores_exactly_1(scores_url, metric):
    given = vectors(metric)
    upserted = [{"id": f"v{i}", "vector": v} for i, v in enumerate(given)]
    assert await call(scores_url, metric, "/upsert", upserted) == "Success"
    answers = await call(scores_url, metric, "/query", [{"vector": v, "topK": 1} for v in given])
    assert [[(hit["id"], hit["score"]) for hit in hits] for hits in answers] == [
        [(f"v{i}", 1.0)] for i in range(len(given))
    ]


@pytest.mark.parametrize("metric", METRICS)
async def test_the_hits_keep_the_metric_s_order_below_the_top(scores_url, metric):
    """A query none of the vectors equals: the order the metric gives them in float64,
    their scores non-increasing and below 1."""
    given = vectors(metric)
    await call(scores_url, metric, "/upsert", [{"id": f"v{i}", "vector": v} for i, v in enumerate(given)])
    rng = np.random.default_rng(1)
    query = rng.normal(size=DIMENSION)
    if metric != "COSINE":
        query /= np.linalg.norm(query)
    stored = np.asarray(given, dtype=np.float32).astype(np.float64)
    if metric == "COSINE":
        similarity = stored @ query / np.linalg.norm(stored, axis=1) / np.linalg.norm(query)
    elif metric == "DOT_PRODUCT":
        similarity = stored @ query
    else:
        similarity = -np.sum((stored - query.astype(np.float32)) ** 2, axis=1)
    hits = await call(scores_url, metric, "/query", {"vector": query.tolist(), "topK": 10})
    assert [h["id"] for h in hits] == [f"v{i}" for i in np.argsort(-similarity, kind="stable")[:10]]
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True) and scores[0] < 1.0
