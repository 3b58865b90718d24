"""sentence-transformers backend on a real all-MiniLM-L6-v2 (shipped in a PyPI package)."""

from __future__ import annotations

import numpy as np
from model_servers import embedder_server

from dwsearch_testkit.tiny_models import minilm_dir


async def test_a_paraphrase_ranks_above_unrelated_text(minilm):
    query = "How do I get my money back for a broken order?"
    paraphrase = "What is the refund process when the item I bought arrived damaged?"
    unrelated = ["The weather in Penang is sunny this weekend.", "Our office party starts at seven tonight."]
    async with embedder_server(minilm) as (engine, _):
        result = await engine.embed([query, paraphrase, *unrelated])
    q, *docs = (e.dense for e in result.embeddings)
    scores = [float(q @ d) for d in docs]
    assert scores[0] > max(scores[1:]) + 0.2, scores


async def test_vectors_equal_sentence_transformers_encode(minilm):
    from sentence_transformers import SentenceTransformer

    texts = ["hello world", "a much longer sentence about refunds and shipping delays in Malaysia " * 3]
    reference = SentenceTransformer(str(minilm_dir()), device="cpu").encode(texts, normalize_embeddings=True)
    async with embedder_server(minilm) as (engine, _):
        result = await engine.embed(texts)
    for ours, theirs in zip(result.embeddings, reference, strict=True):
        assert float(ours.dense @ theirs) >= 0.9999
        np.testing.assert_allclose(ours.dense, theirs, atol=1e-5)


async def test_limit_and_identity(minilm):
    async with embedder_server(minilm) as (engine, _):
        assert engine.info.model_id == "sentence-transformers/all-MiniLM-L6-v2"
        assert engine.info.backend == "sentence-transformers" and engine.info.dimension == 384
        assert engine.max_input_tokens == 256 and not engine.info.sparse_supported
        result = await engine.embed([" ".join(["refund"] * 400)], truncate=True)
    assert result.embeddings[0].truncated and result.embeddings[0].token_count == 256
