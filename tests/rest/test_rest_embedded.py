"""An index with server-side embedding (dense_model) through the official SDK: upsert-data,
query-data (single, batch, resumable), update of data; the fake embedder's 32-d vectors."""

from __future__ import annotations

import pytest
from rest_api import rest_api
from upstash_vector import AsyncIndex
from upstash_vector.errors import UpstashError
from upstash_vector.types import Data

from dwsearch.common.errors import StartupError
from dwsearch.rest.indexfile import parse_indexes
from dwsearch_testkit.fakes import FAKE_MODEL, fake_vector

pytestmark = pytest.mark.timeout(60)


async def test_upsert_data_and_query_data(embedded_url, fake_embedder):
    ix = AsyncIndex(url=embedded_url, token="docs-token", retries=0)
    await ix.upsert(vectors=[
        Data(id="k1", data="reset your password in settings", metadata={"type": "knowledge"}),
        Data(id="k2", data="refunds take five days", metadata={"type": "knowledge"}),
        Data(id="r1", data="mail me at jane@example.com", metadata={"type": "response"}),
    ], namespace="ns")  # fmt: skip
    info = await ix.info()
    assert info.dimension == 32 and info.namespaces["ns"].vector_count == 3 and info.pending_vector_count == 0
    assert info.dense_index.embedding_model == FAKE_MODEL
    hits = await ix.query(data="refunds take five days", top_k=3, include_data=True, namespace="ns")
    assert hits[0].id == "k2" and hits[0].score == pytest.approx(1.0, abs=1e-3)  # the same text: cos 1
    filtered = await ix.query(
        data="anything", top_k=5, filter="type = 'response'", include_data=True, namespace="ns"
    )
    # Text is PII-redacted before it is embedded or stored, as on the gRPC index.
    assert [h.id for h in filtered] == ["r1"] and "jane@example.com" not in filtered[0].data
    many = await ix.query_many(
        queries=[
            {"data": "reset your password in settings", "top_k": 1},
            {"data": "refunds take five days", "top_k": 1},
        ],
        namespace="ns",
    )
    assert [[h.id for h in r] for r in many] == [["k1"], ["k2"]]
    first, handle = await ix.resumable_query(data="refunds take five days", top_k=1, namespace="ns")
    assert [h.id for h in first] == ["k2"] and len(await handle.fetch_next(5)) == 2
    await handle.stop()
    # A client-side vector of the model's dimension is accepted too.
    await ix.upsert(vectors=[("v", fake_vector("vector doc", 32).tolist())], namespace="ns")
    assert (await ix.query(vector=fake_vector("vector doc", 32).tolist(), top_k=1, namespace="ns"))[
        0
    ].id == "v"
    with pytest.raises(UpstashError, match="dimension"):
        await ix.upsert(vectors=[("w", [1.0, 0.0])], namespace="ns")
    # New data is re-embedded.
    assert await ix.update("k1", data="completely different words", namespace="ns")
    (best,) = await ix.query(data="completely different words", top_k=1, namespace="ns")
    assert best.id == "k1" and best.score == pytest.approx(1.0, abs=1e-3)


async def test_data_endpoints_on_an_index_without_a_model(rest_url):
    ix = AsyncIndex(url=rest_url, token="dense-token", retries=0)
    with pytest.raises(UpstashError, match="embedding model"):
        await ix.query(data="text", top_k=1)


async def test_a_dense_model_other_than_the_served_one_is_refused(pool):
    config = parse_indexes('[[index]]\nname = "x"\ntoken = "t"\ndense_model = "other/model"\n')
    with pytest.raises(StartupError, match="other/model"):
        rest_api(pool, config, embedder=object(), embed_model=FAKE_MODEL)


async def test_grpc_info_leaves_out_the_rest_indexes_namespaces(embedded_url, pool, fake_embedder):
    from dwsearch.clients.embedder import EmbedderClient
    from dwsearch.index.document_index import DocumentIndex

    ix = AsyncIndex(url=embedded_url, token="docs-token", retries=0)
    await ix.upsert(vectors=[Data(id="a", data="some text")], namespace="ns")
    embedder = EmbedderClient(fake_embedder.address, timeout=5)
    try:
        info = await DocumentIndex(pool, embedder, model=FAKE_MODEL).info()
    finally:
        await embedder.close()
    assert info.namespaces == {} and (await ix.info()).vector_count == 1


@pytest.mark.parametrize("token", ["hybrid-bm25-token", "hybrid-model-token"])
async def test_a_hybrid_query_data_enters_the_index_once_and_embeds_once(
    embedded_url, fake_embedder, monkeypatch, token
):
    """query-data on a HYBRID index (sparse from BM25 with its IDF, or from the model): one
    DocumentIndex query, one model info, one query embedding, one Embed call."""
    from collections import Counter

    from dwsearch.index.document_index import DocumentIndex

    ix = AsyncIndex(url=embedded_url, token=token, retries=0)
    await ix.upsert(
        vectors=[Data(id="a", data="refund not received yet"), Data(id="b", data="parcel is late")],
        namespace="ns",
    )
    calls: Counter[str] = Counter()
    for name in ("query_answer", "embed_query", "model_info", "by_vectors"):
        real = getattr(DocumentIndex, name)

        def spy(self, *args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(DocumentIndex, name, spy)
    before = fake_embedder.embed_calls
    hits = await ix.query(data="refund not received yet", top_k=2, namespace="ns")
    assert hits[0].id == "a"
    assert calls == {"query_answer": 1, "embed_query": 1, "model_info": 1, "by_vectors": 1}
    assert fake_embedder.embed_calls - before == 1


async def test_with_the_use_model_a_text_queried_against_itself_scores_1(pool):
    """What upstash/vector-py's "query data" tests expect of a hosted model: a text upserted
    among others and queried alone scores 1. With `dwsearch dev`'s default model (use,
    int8) the document embedded in a batch once scored 0.9997 against itself: its
    activations were quantized per batch (now per row: tests/embedder/test_batch_invariance.py)."""
    from model_http import embedder_http
    from model_servers import LoadedEmbedding

    from dwsearch.clients.embedder import EmbedderClient
    from dwsearch.redaction import REDACTION_OFF
    from dwsearch.rest.server import RestServer
    from dwsearch_embedder.backends.use import MODEL_ID, UseBackend

    async with embedder_http(LoadedEmbedding(UseBackend("use", threads=1))) as served:
        embedder = EmbedderClient(f"127.0.0.1:{served.host.port}", timeout=10)
        api = rest_api(
            pool,
            parse_indexes(EMBEDDED_USE_INDEX),
            redaction=REDACTION_OFF,
            embedder=embedder,
            embed_model=MODEL_ID,
        )
        server = RestServer(api, "127.0.0.1", 0)
        await server.start()
        try:
            ix = AsyncIndex(url=f"http://127.0.0.1:{server.port}", token="use-token", retries=0)
            texts = {
                "a": "the refund takes five working days",
                "b": "我的订单什么时候到",
                "c": "boleh saya tukar alamat penghantaran? " * 6,
            }
            await ix.upsert(vectors=[Data(id=key, data=text) for key, text in texts.items()])
            for key, text in texts.items():
                (best,) = await ix.query(data=text, top_k=1)
                assert best.id == key and best.score == pytest.approx(1.0, abs=1e-6), (key, best.score)
        finally:
            await server.stop()
            await embedder.close()


EMBEDDED_USE_INDEX = """
[[index]]
name = "use"
token = "use-token"
dense_model = "default"
metric = "COSINE"
"""
