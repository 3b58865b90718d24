"""Test doubles served over real gRPC. Tests only: nothing in the product imports this."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np

from dwsearch.common.errors import InvalidArgument
from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc

FAKE_MODEL = "fake/deterministic-v1"
# Sparse keys are 3-byte hashes of words.
FAKE_SPARSE_DIMENSION = 1 << 24


def fake_vector(text: str, dimension: int) -> np.ndarray:
    """A unit vector that depends only on the text."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(dimension).astype(np.float32)
    return v / np.linalg.norm(v)


def fake_tokens(text: str) -> list[str]:
    return text.split()


def fake_sparse(text: str) -> dict[int, float]:
    """Lexical weights: one entry per distinct lower-cased word."""
    weights: dict[int, float] = {}
    for word in fake_tokens(text.lower()):
        key = int.from_bytes(hashlib.sha256(word.encode()).digest()[:3], "little")
        weights[key] = max(weights.get(key, 0.0), 0.1 + (len(word) % 7) / 10)
    return weights


@dataclass
class Failure:
    code: grpc.StatusCode
    message: str = "injected failure"


@dataclass
class FakeEmbedder(pb_grpc.EmbedderServiceServicer):
    """Deterministic vectors keyed by text. Records every input it is sent, and the
    priority of every Embed call; failures and delays can be injected per call."""

    dimension: int = 32
    model_id: str = FAKE_MODEL
    max_input_tokens: int = 512
    sparse_supported: bool = True
    delay: float = 0.0
    info_delay: float = 0.0  # seconds each Info call waits (a frozen embedder answers nothing)
    received: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    fail_texts: dict[str, Failure] = field(default_factory=dict)
    calls: int = 0
    # Embed calls only (`calls` also counts CountTokens), the lane and the number of
    # inputs of each.
    embed_calls: int = 0
    priorities: list[str] = field(default_factory=list)
    embed_sizes: list[int] = field(default_factory=list)
    # What Info reports about the engine.
    runtime: str = "fake"
    query_latency_ms: float = 0.0
    # Failures Info answers with, one per call (Info is otherwise never failed).
    info_failures: list[Failure] = field(default_factory=list)
    port: int = 0
    # text, dimension -> unit vector; benchmarks swap in vectors with topic structure.
    vector_fn: Callable[[str, int], np.ndarray] = fake_vector
    # Further models served besides model_id (DWSEARCH_EMBED_MODELS), chosen by the
    # request's model; each has its own vector space (the text salted with the model's
    # name). With any, a model not served is refused FAILED_PRECONDITION; without, the
    # request's model is ignored and model_id answers (an embedder of one model, which the
    # client's model check refuses).
    models: tuple[str, ...] = ()
    # The model of every request (Embed, CountTokens, Info), in order.
    requested_models: list[str] = field(default_factory=list)
    _host: GrpcHost | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, address: str = "127.0.0.1:0") -> None:
        self._host = GrpcHost(
            address,
            [
                Service(
                    "dwsearch.v1.EmbedderService",
                    lambda s: pb_grpc.add_EmbedderServiceServicer_to_server(self, s),
                )
            ],
        )
        self.port = await self._host.start()
        await self._host.set_serving(True)

    async def stop(self) -> None:
        if self._host is not None:
            await self._host.stop(0)

    async def _model(self, request, context) -> str:
        """The model that answers `request`."""
        self.requested_models.append(request.model)
        if not request.model or request.model == self.model_id or not self.models:
            return self.model_id
        if request.model not in self.models:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"model {request.model!r} is not served here; served: {', '.join((self.model_id, *self.models))}",
            )
        return request.model

    def _vector(self, model: str, text: str) -> np.ndarray:
        return self.vector_fn(text if model == self.model_id else f"{model}\n{text}", self.dimension)

    def count(self, text: str) -> int:
        return len(fake_tokens(text)) + 2  # like a real tokenizer: CLS and SEP

    async def _maybe_fail(self, texts: Sequence[str]) -> None:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        failure = self.failures.pop(0) if self.failures else None
        failure = failure or next((self.fail_texts[t] for t in texts if t in self.fail_texts), None)
        if failure is not None:
            raise _RpcFailure(failure)

    async def Embed(self, request, context):
        model = await self._model(request, context)
        self.embed_calls += 1
        self.priorities.append(pb.Priority.Name(request.priority))
        self.embed_sizes.append(len(request.inputs))
        try:
            await self._maybe_fail(request.inputs)
        except _RpcFailure as f:
            await context.abort(f.failure.code, f.failure.message)
        if not request.inputs:
            raise InvalidArgument("no inputs")
        out = []
        for text in request.inputs:
            n = self.count(text)
            truncated = n > self.max_input_tokens
            if truncated and not request.truncate:
                raise InvalidArgument(f"input has {n} tokens, over the limit of {self.max_input_tokens}")
            if truncated:
                text = " ".join(fake_tokens(text)[: self.max_input_tokens - 2])
            self.received.append(text)
            e = pb.Embedding(token_count=min(n, self.max_input_tokens), truncated=truncated)
            if not request.HasField("dense") or request.dense:
                e.dense.extend(self._vector(model, text).tolist())
            if request.sparse:
                sp = sorted(fake_sparse(text).items())
                e.sparse.indices.extend(k for k, _ in sp)
                e.sparse.values.extend(v for _, v in sp)
            out.append(e)
        return pb.EmbedResponse(embeddings=out, model_id=model, dimension=self.dimension)

    async def CountTokens(self, request, context):
        await self._model(request, context)
        try:
            await self._maybe_fail(request.inputs)
        except _RpcFailure as f:
            await context.abort(f.failure.code, f.failure.message)
        return pb.CountTokensResponse(
            token_counts=[self.count(t) for t in request.inputs], max_input_tokens=self.max_input_tokens
        )

    async def Info(self, request, context):
        if self.info_delay:
            await asyncio.sleep(self.info_delay)
        if self.info_failures:
            failure = self.info_failures.pop(0)
            await context.abort(failure.code, failure.message)
        model = await self._model(request, context)
        return pb.EmbedderServiceInfoResponse(
            model_id=model,
            served_models=[self.model_id, *self.models],
            backend="fake",
            dimension=self.dimension,
            max_input_tokens=self.max_input_tokens,
            sparse_supported=self.sparse_supported,
            sparse_dimension=FAKE_SPARSE_DIMENSION if self.sparse_supported else 0,
            device="cpu",
            dtype="float32",
            runtime=self.runtime,
            query_latency_ms=self.query_latency_ms,
        )


class _RpcFailure(Exception):
    def __init__(self, failure: Failure) -> None:
        self.failure = failure


@dataclass
class FakeReranker:
    """Scores a document by the share of query words it contains (raw score = that share
    times 10 - 5, sigmoid otherwise). Failures and delays can be injected."""

    delay: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    calls: int = 0
    # The lane each Rerank call asked for.
    priorities: list[str] = field(default_factory=list)
    port: int = 0
    _host: GrpcHost | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        from dwsearch.v1 import reranker_pb2_grpc

        servicer = _FakeRerankerServicer(self)
        self._host = GrpcHost(
            "127.0.0.1:0",
            [
                Service(
                    "dwsearch.v1.RerankerService",
                    lambda s: reranker_pb2_grpc.add_RerankerServiceServicer_to_server(servicer, s),
                )
            ],
        )
        self.port = await self._host.start()
        await self._host.set_serving(True)

    async def stop(self) -> None:
        if self._host is not None:
            await self._host.stop(0)

    @staticmethod
    def raw_score(query: str, document: str) -> float:
        words = set(query.lower().split())
        found = set(document.lower().split())
        return 10 * len(words & found) / max(1, len(words)) - 5


class _FakeRerankerServicer:
    def __init__(self, fake: FakeReranker) -> None:
        self.fake = fake

    async def Rerank(self, request, context):
        from dwsearch.v1 import reranker_pb2

        self.fake.calls += 1
        self.fake.priorities.append(pb.Priority.Name(request.priority))
        if self.fake.delay:
            await asyncio.sleep(self.fake.delay)
        if self.fake.failures:
            failure = self.fake.failures.pop(0)
            await context.abort(failure.code, failure.message)
        scores = [FakeReranker.raw_score(request.query, d) for d in request.documents]
        if not request.raw_scores:
            scores = [float(1 / (1 + np.exp(-s))) for s in scores]
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        if request.top_n:
            order = order[: request.top_n]
        return reranker_pb2.RerankResponse(
            results=[reranker_pb2.RerankResult(index=i, score=scores[i]) for i in order],
            model_id="fake/reranker",
        )

    async def Info(self, request, context):
        from dwsearch.v1 import reranker_pb2

        return reranker_pb2.RerankerServiceInfoResponse(model_id="fake/reranker", max_length=512)
