"""The reranker's ONNX Runtime path against torch: the tiny XLM-R cross-encoder (as
bge-reranker-v2-m3) and a tiny BERT cross-encoder, whose tokenizer makes token_type_ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dwsearch.common.config import RerankerConfig, load
from dwsearch.export_onnx import Request, export
from dwsearch.modelserver import cpuclass
from dwsearch_reranker.backends import select_backend
from dwsearch_reranker.backends.cross_encoder import CrossEncoderBackend
from dwsearch_testkit.tiny_models import minilm_dir

QUERY = "where is my refund"
DOCUMENTS = [
    "Refunds go back to the original payment method within 5 to 10 business days.",
    "退款会在五到十个工作日内退回原支付方式",
    "Bila refund saya akan masuk?",
    "Track your parcel from Orders > Track shipment.",
    "a long document " * 400,  # cut to max_length
]


@pytest.fixture(scope="session")
def tiny_bert_cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    directory = tmp_path_factory.mktemp("tiny-bert-reranker")
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=512, num_labels=1, initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def reranker_onnx_cache(
    tmp_path_factory: pytest.TempPathFactory, tiny_cross_encoder_dir: Path, tiny_bert_cross_encoder_dir: Path
) -> Path:
    cache = tmp_path_factory.mktemp("reranker-onnx-cache")
    for model in (tiny_cross_encoder_dir, tiny_bert_cross_encoder_dir):
        for quantize in ("none", *cpuclass.INT8_VARIANTS):
            export(Request(str(model), kind="reranker", quantize=quantize, cache_dir=cache))
    return cache


def _scores(backend: CrossEncoderBackend) -> np.ndarray:
    return backend.score(backend.prepare(QUERY, DOCUMENTS))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["xlm-r", "bert"])
def test_logits_match_torch(model, tiny_cross_encoder_dir, tiny_bert_cross_encoder_dir, reranker_onnx_cache):
    path = tiny_cross_encoder_dir if model == "xlm-r" else tiny_bert_cross_encoder_dir
    reference = CrossEncoderBackend(str(path), device="cpu")
    assert reference.load().runtime == "torch"
    expected = _scores(reference)
    fp32 = CrossEncoderBackend(
        str(path), device="cpu", runtime="onnx", quantize="none", onnx_cache_dir=reranker_onnx_cache
    )
    info = fp32.load()
    assert (info.runtime, info.dtype) == ("onnx", "float32")
    assert ("token_type_ids" in fp32._onnx.input_names) is (model == "bert")
    np.testing.assert_allclose(_scores(fp32), expected, atol=1e-4)
    assert _scores(fp32).dtype == np.float32
    # One pair alone, and an order that puts the longest first.
    np.testing.assert_allclose(fp32.score(fp32.prepare(QUERY, DOCUMENTS[:1])), expected[:1], atol=1e-4)
    # Both int8 variants, wherever they run exactly ("int8" is this CPU class's: 7-bit
    # weights on AVX2, where 8-bit pairs saturate its 16-bit sums).
    for quantize in cpuclass.INT8_VARIANTS:
        int8 = CrossEncoderBackend(
            str(path), device="cpu", runtime="onnx", quantize=quantize, onnx_cache_dir=reranker_onnx_cache
        )
        info = int8.load()
        assert info.dtype == "int8"
        report = info.runtime_report
        assert report.quantization == (
            cpuclass.int8_variant(cpuclass.detect()) if quantize == "int8" else quantize
        )
        assert report.check is not None and report.check.kind == "reranker", report
        assert report.check.passed, report.check
        assert report.check.rerank_order_same == 1.0
        np.testing.assert_allclose(_scores(int8), expected, atol=0.1)
        # A pair's score does not depend on the other pairs of its batch (activations
        # quantized per row: per batch, a short pair's changed with a long one beside it).
        alone = np.concatenate([int8.score(int8.prepare(QUERY, [document])) for document in DOCUMENTS])
        np.testing.assert_allclose(alone, _scores(int8), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_session_threads_and_select_backend(tiny_cross_encoder_dir, reranker_onnx_cache):
    cfg = load(
        RerankerConfig,
        {"rerank_model": str(tiny_cross_encoder_dir), "embed_runtime": "onnx", "quantize": "int8", "threads": 2,
         "onnx_cache_dir": reranker_onnx_cache},
        environ={},
    )  # fmt: skip
    backend = select_backend(cfg)
    info = backend.load()
    assert (info.runtime, info.dtype) == ("onnx", "int8")
    options = backend._onnx.session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
