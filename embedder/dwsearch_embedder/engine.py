"""The embedder's domain object: what is its own in the shared model-server runtime
(dwsearch.modelserver.runtime): the request methods (Embed, CountTokens), the inference run
and its finiteness check, and the warm-up.

Warm-up: one batch through the same path as a request, then one short query's latency
(reported by Info and a metric; the default bulk batch budget is derived from it).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import Gauge

from dwsearch.common.embedding import Embedding
from dwsearch.common.errors import FailedPrecondition, InvalidArgument, StartupError, Unavailable
from dwsearch.modelserver.admission import OverLimit, precut
from dwsearch.modelserver.batching import Lane
from dwsearch.modelserver.runtime import ModelEngine, ModelLimits, Shared
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch_embedder.backends.base import (
    BackendInfo,
    EmbeddingBackend,
    Encoded,
    InputType,
    PreparedInput,
    Token,
)

WARM_UP_TEXT = "warm-up: a short sentence to run the model once before serving."
# The one-query latency reported by Info: the median of a few runs of a short query.
LATENCY_PROBE_TEXT = "where is my parcel, the tracking number does not work"
LATENCY_PROBE_RUNS = 3
# Default bulk batch budget: this many one-query latencies (DWSEARCH_BULK_BATCH_MS=0).
BULK_BUDGET_QUERIES = 2.0  # on a device where one thread serves both lanes

_QUERY_LATENCY = Gauge(
    "dwsearch_embedder_query_latency_seconds",
    "One short query's latency through the engine, measured at warm-up",
    ["model"],
)


@dataclass(frozen=True)
class EngineLimits(ModelLimits):
    max_inputs_per_request: int = 256
    max_input_tokens: int = 0  # 0 = the model's own limit
    # bulk_batch_ms 0 = BULK_BUDGET_QUERIES × the measured one-query latency (on a GPU)


def embedding_pb(e: Embedding) -> pb.Embedding:
    out = pb.Embedding(token_count=e.token_count, truncated=e.truncated)
    if e.dense is not None:
        out.dense.extend(e.dense.tolist())
    if e.sparse is not None:
        indices = sorted(e.sparse)
        out.sparse.indices.extend(indices)
        out.sparse.values.extend(e.sparse[i] for i in indices)
    return out


@dataclass(frozen=True)
class EmbedResult:
    embeddings: list[Embedding]
    model_id: str
    dimension: int

    def to_pb(self) -> pb.EmbedResponse:
        return pb.EmbedResponse(
            embeddings=[embedding_pb(e) for e in self.embeddings],
            model_id=self.model_id,
            dimension=self.dimension,
            total_tokens=sum(e.token_count for e in self.embeddings),
        )


@dataclass(frozen=True)
class _Job:
    """One input as the inference thread sees it."""

    prepared: PreparedInput
    sparse: bool
    normalize: bool


class Embedder(ModelEngine[BackendInfo, _Job, Encoded]):
    service = "embedder"

    def __init__(
        self,
        backend: EmbeddingBackend,
        limits: EngineLimits = EngineLimits(),
        *,
        name: str = "",
        shared: Shared | None = None,
    ) -> None:
        """`name`: the model as configured, which requests may name it by besides its model
        id. `shared`: what the engines of a process serving several models share."""
        super().__init__(
            limits,
            per_request=("max_inputs_per_request", limits.max_inputs_per_request),
            name=name,
            shared=shared,
        )
        self.backend = backend
        self.limits: EngineLimits = limits
        self._max_tokens = 0
        self.query_latency_s = 0.0  # measured at warm-up

    @property
    def max_input_tokens(self) -> int:
        return self._max_tokens

    def _load(self) -> BackendInfo:
        return self.backend.load()

    def _check_loaded(self, info: BackendInfo) -> None:
        model_limit = info.max_input_tokens
        if self.limits.max_input_tokens > model_limit:
            raise StartupError(
                f"max_input_tokens {self.limits.max_input_tokens} is over {info.model_id}'s limit of {model_limit}"
            )
        self._max_tokens = self.limits.max_input_tokens or model_limit

    async def _warm_up(self) -> dict[str, Any]:
        info = self.info
        await self.embed([WARM_UP_TEXT], sparse=info.sparse_supported, truncate=True)
        self.query_latency_s = await self._measure_query_latency()
        _QUERY_LATENCY.labels(info.model_id).set(self.query_latency_s)
        batcher = self.batcher
        if not self.limits.bulk_batch_ms and not batcher.interactive_worker:
            # One thread serves both lanes (a GPU): a query may wait for the bulk batch in
            # flight, so keep bulk batches short. With an interactive worker queries never
            # wait for one, and bulk batches stay as large as the token budget allows.
            batcher.bulk_batch_seconds = BULK_BUDGET_QUERIES * self.query_latency_s
        return {
            "backend": info.backend,
            "max_input_tokens": self._max_tokens,
            "query_latency_ms": round(self.query_latency_s * 1000, 1),
            "bulk_batch_ms": round(batcher.bulk_batch_seconds * 1000, 1),
        }

    async def _measure_query_latency(self) -> float:
        """Median latency of a short query through the whole engine, as a client sees it
        minus the network."""
        runs = []
        for _ in range(LATENCY_PROBE_RUNS):
            start = time.perf_counter()
            await self.embed(
                [LATENCY_PROBE_TEXT], input_type=InputType.QUERY, sparse=self.info.sparse_supported
            )
            runs.append(time.perf_counter() - start)
        return statistics.median(runs)

    async def embed(
        self,
        texts: Sequence[str],
        *,
        input_type: InputType = InputType.DOCUMENT,
        dense: bool = True,
        sparse: bool = False,
        normalize: bool = True,
        truncate: bool = False,
        deadline: float | None = None,
        lane: Lane | None = None,
    ) -> EmbedResult:
        """Vectors for `texts`, in order. `deadline` is a time.monotonic() instant after
        which queued inputs are dropped instead of run. `lane` defaults from the input
        type: queries are interactive, documents bulk."""
        info = self.info
        self._check_inputs(texts)
        if not dense and not sparse:
            raise InvalidArgument("nothing to return: dense and sparse are both false")
        if sparse and not info.sparse_supported:
            raise FailedPrecondition(f"{info.model_id} has no sparse head; ask for dense vectors only")
        if lane is None:
            lane = Lane.INTERACTIVE if input_type is InputType.QUERY else Lane.BULK
        max_tokens = self._max_tokens
        with self._admission.admit(texts, max_tokens_each=max_tokens if truncate else None) as reservation:
            if truncate:
                texts = [precut(text, max_tokens) for text in texts]
            prepared = await self._tokenize(
                texts,
                lambda part: self.backend.prepare(part, input_type, max_tokens),
                lane=lane,
                deadline=deadline,
            )
            if not truncate:
                for index, item in enumerate(prepared):
                    if item.truncated:
                        raise OverLimit(
                            f"input {index} has {item.token_count} tokens, over the model's limit of "
                            f"{max_tokens}; shorten it or set truncate"
                        )
            reservation.settle(sum(item.length for item in prepared))
            jobs = [_Job(item, sparse, normalize) for item in prepared]
            encoded = await self.batcher.submit(
                jobs, [item.length for item in prepared], deadline=deadline, lane=lane
            )
        return EmbedResult(
            embeddings=[
                Embedding(
                    dense=e.dense if dense else None,
                    sparse=e.sparse if sparse else None,
                    token_count=item.length,
                    truncated=item.truncated,
                )
                for e, item in zip(encoded, prepared, strict=True)
            ],
            model_id=info.model_id,
            dimension=info.dimension,
        )

    async def count_tokens(
        self,
        texts: Sequence[str],
        *,
        input_type: InputType = InputType.DOCUMENT,
        deadline: float | None = None,
    ) -> list[int]:
        """Tokens per text, uncut, exactly as `embed` counts them. Tokenizing is the whole
        cost, so the request is admitted by its size like an Embed call."""
        if not self.loaded:
            raise Unavailable("the embedder is still loading its model")
        self._check_inputs(texts)
        lane = Lane.INTERACTIVE if input_type is InputType.QUERY else Lane.BULK
        with self._admission.admit(texts, max_tokens_each=None):
            return await self._tokenize(
                texts, lambda part: self.backend.count(part, input_type), lane=lane, deadline=deadline
            )

    async def tokenize(
        self, texts: Sequence[str], *, add_special_tokens: bool = True, lane: Lane = Lane.INTERACTIVE
    ) -> list[list[Token]]:
        """Each text's tokens (ids, text, offsets), uncut, on the tokenizer thread; admitted
        by its size like CountTokens."""
        if not self.loaded:
            raise Unavailable("the embedder is still loading its model")
        self._check_inputs(texts)
        with self._admission.admit(texts, max_tokens_each=None):
            return await self._tokenize(
                texts,
                lambda part: self.backend.tokenize(part, add_special_tokens=add_special_tokens),
                lane=lane,
                deadline=None,
            )

    async def decode(
        self, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool = True, lane: Lane = Lane.INTERACTIVE
    ) -> list[str]:
        """Each list of token ids as text (TEI's /decode), on the tokenizer thread."""
        if not self.loaded:
            raise Unavailable("the embedder is still loading its model")
        if not ids:
            raise InvalidArgument("ids is empty")
        if len(ids) > self.limits.max_inputs_per_request:
            raise OverLimit(
                f"{len(ids)} inputs, over the limit of {self.limits.max_inputs_per_request} per request"
            )
        decode = functools.partial(self.backend.decode, ids, skip_special_tokens=skip_special_tokens)
        texts: list[str] = await self._tokenizer.run(decode, lane=lane, deadline=None)
        return texts

    def _check_inputs(self, texts: Sequence[str]) -> None:
        if not texts:
            raise InvalidArgument("inputs is empty")
        if len(texts) > self.limits.max_inputs_per_request:
            raise OverLimit(
                f"{len(texts)} inputs, over the limit of {self.limits.max_inputs_per_request} per request"
            )
        for index, text in enumerate(texts):
            if not text:
                raise InvalidArgument(f"input {index} is empty")

    def _run(self, jobs: Sequence[_Job]) -> list[Encoded | Exception]:
        """The inference thread's work: one forward pass, then a finiteness check per input."""
        encoded = self.backend.encode(
            [job.prepared for job in jobs],
            sparse=[job.sparse for job in jobs],
            normalize=[job.normalize for job in jobs],
        )
        return [self._checked(e, job) for e, job in zip(encoded, jobs, strict=True)]

    def _checked(self, encoded: Encoded, job: _Job) -> Encoded | Exception:
        finite = bool(np.isfinite(encoded.dense).all())
        if encoded.sparse is not None:
            finite = finite and bool(np.isfinite(list(encoded.sparse.values())).all())
        return encoded if finite else self._non_finite("value for an input", job.prepared.length)
