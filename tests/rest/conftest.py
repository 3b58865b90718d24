"""The REST API served by uvicorn on 127.0.0.1:0 in the test's event loop, over a real
Postgres; the official upstash-vector SDK as the client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from rest_api import rest_api

from dwsearch.db.pool import open_pool
from dwsearch.redaction import REDACTION_OFF, REDACTION_ON
from dwsearch.rest.indexfile import parse_indexes
from dwsearch.rest.server import RestServer

INDEXES = """
[[index]]
name = "dense"
token = ["dense-token", "dense-token-2"]
dimension = 2
metric = "COSINE"
type = "DENSE"

[[index]]
name = "dot"
token = "dot-token"
dimension = 3
metric = "DOT_PRODUCT"

[[index]]
name = "euclid"
token = "euclid-token"
dimension = 2
metric = "EUCLIDEAN"

[[index]]
name = "sparse"
token = "sparse-token"
type = "SPARSE"

[[index]]
name = "hybrid"
token = "hybrid-token"
dimension = 2
metric = "COSINE"
type = "HYBRID"
"""


@pytest.fixture
async def pool(db_url):
    pool = await open_pool(db_url, max_size=4)
    yield pool
    await pool.close()


@pytest.fixture
async def rest_url(pool) -> AsyncIterator[str]:
    server = RestServer(
        rest_api(pool, parse_indexes(INDEXES), redaction=REDACTION_OFF, max_body_bytes=256 * 1024),
        "127.0.0.1",
        0,
    )
    await server.start()
    yield f"http://127.0.0.1:{server.port}"
    await server.stop()


@pytest.fixture
def index(rest_url) -> Callable[..., object]:
    from upstash_vector import AsyncIndex

    def make(token: str = "dense-token", path: str = ""):
        return AsyncIndex(url=rest_url + path, token=token, retries=0)

    return make


EMBEDDED_INDEXES = """
[[index]]
name = "docs"
token = "docs-token"
dense_model = "default"

[[index]]
name = "bm25"
token = "bm25-token"
type = "SPARSE"
sparse_model = "BM25"

[[index]]
name = "hybrid-bm25"
token = "hybrid-bm25-token"
type = "HYBRID"
dense_model = "default"
sparse_model = "BM25"

[[index]]
name = "hybrid-model"
token = "hybrid-model-token"
type = "HYBRID"
dense_model = "default"
sparse_model = "default"
"""


@pytest.fixture
async def embedded_url(pool, fake_embedder) -> AsyncIterator[str]:
    """An index with server-side embedding (dense_model = "default") over the fake embedder."""
    from dwsearch.clients.embedder import EmbedderClient
    from dwsearch_testkit.fakes import FAKE_MODEL

    embedder = EmbedderClient(fake_embedder.address, timeout=5)
    api = rest_api(
        pool,
        parse_indexes(EMBEDDED_INDEXES),
        redaction=REDACTION_ON,
        embedder=embedder,
        embed_model=FAKE_MODEL,
    )
    server = RestServer(api, "127.0.0.1", 0)
    await server.start()
    yield f"http://127.0.0.1:{server.port}"
    await server.stop()
    await embedder.close()
