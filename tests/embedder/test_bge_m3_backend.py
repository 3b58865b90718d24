"""bge-m3 backend on a tiny random XLM-RoBERTa with the real XLM-R tokenizer: parity with
FlagEmbedding's BGEM3FlagModel, batch invariance, truncation and token counts."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from model_servers import embedder_server

from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc
from dwsearch_embedder.backends.base import InputType
from dwsearch_testkit.tiny_models import MAX_TOKENS

TEXTS = [
    "where is my refund?",
    "退款什么时候到账",
    "Bila refund saya akan masuk?",
    "boss, parcel dah sampai ke belum? 我等了三天了 lah",
    "<s> literal special tokens </s> and <unk> in the text",
    "refund refund refund: repeated tokens keep their largest weight",
    "a long message " * 300,  # over the 512-token limit: cut, as FlagEmbedding cuts it
]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


async def test_matches_flagembedding(tiny_bge_m3, tiny_bge_m3_dir):
    from FlagEmbedding import BGEM3FlagModel

    reference = BGEM3FlagModel(str(tiny_bge_m3_dir), use_fp16=False, devices="cpu").encode(
        TEXTS, max_length=MAX_TOKENS, return_dense=True, return_sparse=True
    )
    async with embedder_server(tiny_bge_m3) as (engine, _):
        result = await engine.embed(TEXTS, sparse=True, truncate=True)
    for ours, dense, weights in zip(
        result.embeddings, reference["dense_vecs"], reference["lexical_weights"], strict=True
    ):
        assert cosine(ours.dense, dense) >= 0.9999
        np.testing.assert_allclose(ours.dense, dense, atol=1e-5)
        expected = {int(k): float(v) for k, v in weights.items()}
        assert ours.sparse.keys() == expected.keys()
        for token, value in expected.items():
            assert ours.sparse[token] == pytest.approx(value, abs=1e-4)
    assert result.embeddings[-1].truncated and result.embeddings[-1].token_count == MAX_TOKENS
    # The checkpoint's sparse head is positive on special tokens too: they were dropped on purpose.
    specials = {0, 1, 2, 3}
    assert all(not specials & e.sparse.keys() for e in result.embeddings)


def test_a_text_gets_the_same_vectors_alone_and_in_a_mixed_batch(tiny_bge_m3):
    rng = np.random.default_rng(7)
    words = [
        "refund",
        "parcel",
        "order",
        "bayar",
        "barang",
        "退款",
        "订单",
        "快递",
        "sampai",
        "belum",
        "thanks",
        "lah",
    ]
    others = [" ".join(rng.choice(words, size=int(rng.integers(1, 120)))) for _ in range(63)]
    target = "boss, parcel dah sampai ke belum?"
    mixed = tiny_bge_m3.prepare([*others[:31], target, *others[31:]], InputType.DOCUMENT, MAX_TOKENS)
    assert len({item.length for item in mixed}) > 10  # one batch, padded to its longest input
    in_batch = tiny_bge_m3.encode(mixed, sparse=[True] * 64, normalize=[True] * 64)[31]
    (alone,) = tiny_bge_m3.encode(
        tiny_bge_m3.prepare([target], InputType.DOCUMENT, MAX_TOKENS), sparse=[True], normalize=[True]
    )
    assert cosine(alone.dense, in_batch.dense) >= 0.9999
    np.testing.assert_allclose(alone.dense, in_batch.dense, atol=1e-5)
    assert alone.sparse.keys() == in_batch.sparse.keys()
    np.testing.assert_allclose(
        [alone.sparse[k] for k in alone.sparse], [in_batch.sparse[k] for k in alone.sparse], atol=1e-5
    )


async def test_over_long_input_needs_truncate(tiny_bge_m3):
    long_text = " ".join(["word"] * 600)
    async with embedder_server(tiny_bge_m3) as (_, channel):
        stub = pb_grpc.EmbedderServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Embed(pb.EmbedRequest(inputs=["short", long_text]), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "input 1 has 602 tokens" in info.value.details() and "512" in info.value.details()

        response = await stub.Embed(pb.EmbedRequest(inputs=["short", long_text], truncate=True), timeout=30)
    short, cut = response.embeddings
    assert not short.truncated and short.token_count == 3
    assert cut.truncated and cut.token_count == MAX_TOKENS
    assert response.total_tokens == 3 + MAX_TOKENS


async def test_count_tokens_uses_the_model_tokenizer(tiny_bge_m3, tiny_bge_m3_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_bge_m3_dir)
    async with embedder_server(tiny_bge_m3) as (_, channel):
        response = await pb_grpc.EmbedderServiceStub(channel).CountTokens(
            pb.CountTokensRequest(inputs=TEXTS), timeout=30
        )
    assert list(response.token_counts) == [len(tokenizer(t)["input_ids"]) for t in TEXTS]
    assert response.token_counts[-1] > MAX_TOKENS  # counted before any cut
    assert response.max_input_tokens == MAX_TOKENS


async def test_info_and_what_is_returned(tiny_bge_m3, tiny_bge_m3_dir):
    async with embedder_server(tiny_bge_m3) as (_, channel):
        stub = pb_grpc.EmbedderServiceStub(channel)
        info = await stub.Info(pb.EmbedderServiceInfoRequest(), timeout=30)
        dense_only = await stub.Embed(pb.EmbedRequest(inputs=["hello"]), timeout=30)
        sparse_only = await stub.Embed(
            pb.EmbedRequest(inputs=["hello"], dense=False, sparse=True), timeout=30
        )
        raw = await stub.Embed(pb.EmbedRequest(inputs=["hello"], normalize=False), timeout=30)
    assert info.model_id == tiny_bge_m3_dir.name
    assert info.backend == "bge-m3" and info.sparse_supported and info.dimension == 32
    assert info.sparse_dimension == 250_002  # the XLM-R vocabulary
    assert info.revision.startswith("sha256:") and info.device == "cpu" and info.dtype == "float32"
    assert info.max_input_tokens == MAX_TOKENS and info.max_inputs_per_request == 256
    assert dense_only.model_id == info.model_id and dense_only.dimension == 32
    assert len(dense_only.embeddings[0].dense) == 32 and not dense_only.embeddings[0].HasField("sparse")
    assert np.linalg.norm(dense_only.embeddings[0].dense) == pytest.approx(1, abs=1e-5)
    assert not sparse_only.embeddings[0].dense and sparse_only.embeddings[0].sparse.indices
    indices = list(sparse_only.embeddings[0].sparse.indices)
    assert indices == sorted(set(indices))
    assert np.linalg.norm(raw.embeddings[0].dense) != pytest.approx(1, abs=1e-3)
