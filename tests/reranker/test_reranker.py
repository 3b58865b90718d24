"""RerankerService on a tiny one-logit XLM-RoBERTa cross-encoder: FlagReranker parity,
sigmoid vs raw scores, ordering, top_n and validation."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from model_servers import reranker_server

from dwsearch.v1 import reranker_pb2 as pb
from dwsearch.v1 import reranker_pb2_grpc as pb_grpc
from dwsearch_reranker.engine import RerankLimits

QUERY = "where is my refund"
DOCUMENTS = [
    "your refund was sent yesterday",
    "退款已经在路上了",
    "",
    "Saya suka makan nasi lemak",
    "refund " * 700,  # cut to max_length, only the document side
]


async def test_scores_match_flag_reranker(tiny_reranker, tiny_cross_encoder_dir):
    from FlagEmbedding import FlagReranker

    reference = FlagReranker(str(tiny_cross_encoder_dir), use_fp16=False, devices="cpu")
    pairs = [[QUERY, d] for d in DOCUMENTS]
    long_query_pairs = [["why " * 600, d] for d in DOCUMENTS[:2]]  # the query is cut to 3/4 of max_length
    async with reranker_server(tiny_reranker) as (engine, _):
        for query, batch in ((QUERY, pairs), ("why " * 600, long_query_pairs)):
            docs = [d for _, d in batch]
            raw = dict((await engine.rerank(query, docs, raw_scores=True)).ranked)
            normalized = dict((await engine.rerank(query, docs)).ranked)
            expected_raw = reference.compute_score(batch)
            expected_normalized = reference.compute_score(batch, normalize=True)
            for i in range(len(docs)):
                assert raw[i] == pytest.approx(expected_raw[i], abs=1e-5)
                assert normalized[i] == pytest.approx(expected_normalized[i], abs=1e-6)


async def test_sigmoid_scores_equal_sentence_transformers_cross_encoder(
    tiny_reranker, tiny_cross_encoder_dir
):
    from sentence_transformers import CrossEncoder

    expected = CrossEncoder(str(tiny_cross_encoder_dir), device="cpu").predict(
        [(QUERY, d) for d in DOCUMENTS[:4]]
    )
    async with reranker_server(tiny_reranker) as (engine, _):
        scores = dict((await engine.rerank(QUERY, DOCUMENTS[:4])).ranked)
    np.testing.assert_allclose([scores[i] for i in range(4)], expected, atol=1e-5)


async def test_best_first_top_n_and_raw_scores_over_grpc(tiny_reranker):
    async with reranker_server(tiny_reranker) as (_, channel):
        stub = pb_grpc.RerankerServiceStub(channel)
        full = await stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCUMENTS), timeout=30)
        raw = await stub.Rerank(
            pb.RerankRequest(query=QUERY, documents=DOCUMENTS, raw_scores=True), timeout=30
        )
        top = await stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCUMENTS, top_n=2), timeout=30)
        ties = await stub.Rerank(
            pb.RerankRequest(query=QUERY, documents=["same", "other", "same"]), timeout=30
        )
    scores = [r.score for r in full.results]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    assert sorted(r.index for r in full.results) == list(range(len(DOCUMENTS)))
    by_index = {r.index: r.score for r in raw.results}
    for r in full.results:
        assert r.score == pytest.approx(1 / (1 + np.exp(-by_index[r.index])), abs=1e-6)
    assert all(abs(by_index[r.index] - r.score) > 1e-3 for r in full.results)  # logits, not probabilities
    assert [r.index for r in top.results] == [r.index for r in full.results[:2]]
    same = [r.index for r in ties.results if r.index in (0, 2)]
    assert same == [0, 2]  # equal scores keep request order
    assert full.model_id == top.model_id != ""


@pytest.mark.parametrize(
    "request_,message",
    [
        (pb.RerankRequest(documents=["x"]), "query is empty"),
        (pb.RerankRequest(query="q"), "documents is empty"),
        (pb.RerankRequest(query="q", documents=["x"] * 5), "5 documents, over the limit of 4"),
    ],
)
async def test_bad_requests_are_rejected(tiny_reranker, request_, message):
    async with reranker_server(tiny_reranker, RerankLimits(max_documents_per_request=4)) as (_, channel):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await pb_grpc.RerankerServiceStub(channel).Rerank(request_, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in info.value.details()


async def test_info(tiny_reranker, tiny_cross_encoder_dir):
    async with reranker_server(tiny_reranker) as (_, channel):
        info = await pb_grpc.RerankerServiceStub(channel).Info(pb.RerankerServiceInfoRequest(), timeout=30)
    assert info.model_id == tiny_cross_encoder_dir.name and info.revision.startswith("sha256:")
    assert info.max_length == 512 and info.device == "cpu" and info.dtype == "float32"
    assert info.max_batch_tokens == 16384 and info.max_documents_per_request == 512
