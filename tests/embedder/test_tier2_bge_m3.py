"""Tier 2: the cross-lingual smoke with real bge-m3 weights. Validates the model,
not the code; a rollout-checklist item. Runs only when DWSEARCH_BGE_M3_PATH names a
bge-m3 directory (no package here ships the weights)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from model_servers import LoadedEmbedding, embedder_server

from dwsearch_embedder.backends.base import InputType
from dwsearch_embedder.backends.bge_m3 import BgeM3Backend

BGE_M3_PATH = os.environ.get("DWSEARCH_BGE_M3_PATH", "")
pytestmark = [
    pytest.mark.tier2,
    pytest.mark.skipif(
        not BGE_M3_PATH, reason="set DWSEARCH_BGE_M3_PATH to a bge-m3 directory to run the real-model smoke"
    ),
]

MESSAGES = {
    "refund_zh": "我的退款什么时候会到账？已经等了一个星期了",
    "refund_ms": "Bila duit refund saya akan masuk? Dah seminggu tunggu",
    "refund_rojak": "boss, refund I punya bila masuk ah? dah one week already lah",
    "parcel_ms": "Parcel saya belum sampai lagi, tolong check tracking number",
    "lunch_zh": "我们中午去吃海南鸡饭吧",
    "weather_en": "It has been raining in Penang all afternoon",
}
QUERIES = {
    "when will I get my money back": {"refund_zh", "refund_ms", "refund_rojak"},
    "my package has not been delivered yet": {"parcel_ms"},
}


@pytest.fixture(scope="module")
def bge_m3() -> LoadedEmbedding:
    return LoadedEmbedding(BgeM3Backend(BGE_M3_PATH))


async def test_an_english_query_retrieves_the_matching_non_english_messages(bge_m3):
    names = list(MESSAGES)
    async with embedder_server(bge_m3) as (engine, _):
        assert engine.info.dimension == 1024 and engine.max_input_tokens == 8192
        docs = await engine.embed([MESSAGES[n] for n in names], sparse=True)
        for query, relevant in QUERIES.items():
            q = (await engine.embed([query], input_type=InputType.QUERY)).embeddings[0].dense
            ranked = [names[i] for i in np.argsort([-(q @ d.dense) for d in docs.embeddings])]
            assert set(ranked[: len(relevant)]) == relevant, (query, ranked)
    assert all(d.sparse for d in docs.embeddings)


async def test_real_weights_match_flagembedding(bge_m3):
    from FlagEmbedding import BGEM3FlagModel

    texts = list(MESSAGES.values())
    reference = BGEM3FlagModel(BGE_M3_PATH, use_fp16=False, devices="cpu").encode(
        texts, max_length=8192, return_dense=True, return_sparse=True
    )
    async with embedder_server(bge_m3) as (engine, _):
        result = await engine.embed(texts, sparse=True)
    for ours, dense, weights in zip(
        result.embeddings, reference["dense_vecs"], reference["lexical_weights"], strict=True
    ):
        assert float(ours.dense @ dense) >= 0.9999
        assert ours.sparse.keys() == {int(k) for k in weights}
        assert max(abs(ours.sparse[int(k)] - float(v)) for k, v in weights.items()) <= 1e-4
