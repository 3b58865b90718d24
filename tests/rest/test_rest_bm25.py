"""The BM25 sparse model, and HYBRID indexes embedding data server-side (dense from the
EmbedderService; sparse from BM25 or from the model), through the official SDK."""

from __future__ import annotations

import pytest
from upstash_vector import AsyncIndex
from upstash_vector.types import Data, QueryMode

from dwsearch.retrieval import bm25

pytestmark = pytest.mark.timeout(60)

DOCS = [
    Data(id="zh", data="我要退款，订单还没到", metadata={"lang": "zh"}),
    Data(id="ms", data="Saya nak refund sebab barang rosak", metadata={"lang": "ms"}),
    Data(id="en", data="How do I reset my password", metadata={"lang": "en"}),
    Data(id="en2", data="password password reset link expired", metadata={"lang": "en"}),
]


def test_tokenizer_segments_cjk_and_words():
    assert bm25.tokens("Saya nak REFUND 我要退款吗!") == [
        "saya",
        "nak",
        "refund",
        "我要",
        "要退",
        "退款",
        "款吗",
    ]
    assert bm25.tokens("ｒｅｆｕｎｄ 款") == ["refund", "款"]  # NFKC, a lone CJK character
    assert bm25.query_vector("refund refund") == {bm25.term_id("refund"): 1.0}
    short, long = bm25.document_vector("refund"), bm25.document_vector("refund " + "x " * 200)
    assert short[bm25.term_id("refund")] > long[bm25.term_id("refund")]  # length normalisation


async def test_bm25_sparse_index(embedded_url):
    ix = AsyncIndex(url=embedded_url, token="bm25-token", retries=0)
    await ix.upsert(vectors=DOCS)
    hits = await ix.query(data="退款", top_k=3, include_metadata=True)
    assert [h.id for h in hits] == ["zh"]
    hits = await ix.query(data="refund", top_k=3)
    assert [h.id for h in hits] == ["ms"]
    # IDF at query time: "password" is in two documents, "expired" in one.
    hits = await ix.query(data="password expired", top_k=3)
    assert [h.id for h in hits] == ["en2", "en"] and hits[0].score > hits[1].score > 0
    assert await ix.query(data="!!!", top_k=3) == []
    info = await ix.info()
    assert info.sparse_index.embedding_model == "BM25" and info.dense_index is None


async def test_hybrid_dense_model_with_bm25(embedded_url, fake_embedder):
    ix = AsyncIndex(url=embedded_url, token="hybrid-bm25-token", retries=0)
    await ix.upsert(vectors=DOCS, namespace="n")
    hybrid = await ix.query(data="Saya nak refund sebab barang rosak", top_k=2, namespace="n")
    assert hybrid[0].id == "ms"  # first in both lists
    sparse = await ix.query(
        data="退款", top_k=2, namespace="n", query_mode=QueryMode.SPARSE, include_vectors=True
    )
    assert (
        [h.id for h in sparse] == ["zh"]
        and sparse[0].vector is not None
        and sparse[0].sparse_vector is not None
    )
    dense = await ix.query(
        data="How do I reset my password", top_k=1, namespace="n", query_mode=QueryMode.DENSE
    )
    assert dense[0].id == "en" and dense[0].score == pytest.approx(1.0, abs=1e-3)
    # Only dense vectors were asked of the embedder.
    info = await ix.info()
    assert info.sparse_index.embedding_model == "BM25" and info.dense_index.dimension == 32


async def test_hybrid_with_the_model_sparse_output(embedded_url):
    ix = AsyncIndex(url=embedded_url, token="hybrid-model-token", retries=0)
    await ix.upsert(vectors=DOCS)
    hits = await ix.query(data="password reset link expired", top_k=2, query_mode=QueryMode.SPARSE)
    assert hits[0].id == "en2"
    hybrid = await ix.query(data="How do I reset my password", top_k=1)
    assert hybrid[0].id == "en"
