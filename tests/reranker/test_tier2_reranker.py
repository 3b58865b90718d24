"""Tier 2: real bge-reranker-v2-m3 puts the relevant passage first. Runs only when
DWSEARCH_RERANKER_PATH names the model's directory (no package here ships the weights)."""

from __future__ import annotations

import os

import pytest
from model_servers import LoadedRerank, reranker_server

from dwsearch_reranker.backends.cross_encoder import CrossEncoderBackend

RERANKER_PATH = os.environ.get("DWSEARCH_RERANKER_PATH", "")
pytestmark = [
    pytest.mark.tier2,
    pytest.mark.skipif(
        not RERANKER_PATH,
        reason="set DWSEARCH_RERANKER_PATH to a bge-reranker-v2-m3 directory to run the real-model smoke",
    ),
]


async def test_the_relevant_passage_comes_first():
    backend = LoadedRerank(CrossEncoderBackend(RERANKER_PATH))
    documents = [
        "Kami buka dari jam 9 pagi hingga 6 petang setiap hari.",
        "我们中午去吃海南鸡饭吧",
        "Refunds are credited to your original payment method within 5 to 7 working days.",
        "Parcel saya belum sampai lagi, tolong check tracking number",
    ]
    async with reranker_server(backend) as (engine, _):
        result = await engine.rerank("how long does a refund take", documents)
    assert result.ranked[0][0] == 2, result.ranked
