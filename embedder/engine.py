"""The embedder's domain object: admits requests by a cheap size bound, tokenizes them on
one tokenizer thread, and runs them through the batcher's single inference thread, each
stage in two lanes (interactive before bulk; dwsearch.common.admission, .batching).

Lifecycle: `start` loads the model, runs a warm-up batch through the same path as a
request, then measures one short query's latency (reported by Info and a metric; the
default bulk batch budget is derived from it); the process reports SERVING only after.
`stop` finishes queued work.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from prometheus_client import Gauge

from dwsearch.common.admission import Admission, LaneExecutor, chunks, precut
from dwsearch.common.batching import Batcher, Lane, prior_overhead_tokens
from dwsearch.common.errors import FailedPrecondition, Internal, InvalidArgument, Unavailable
from dwsearch.embedder.backends.base import BackendInfo, EmbeddingBackend, Encoded, InputType, PreparedInput
from dwsearch.embedder.runtime import StartupError
from dwsearch.v1 import embedder_pb2 as pb

log = logging.getLogger(__name__)

WARM_UP_TEXT = "warm-up: a short sentence to run the model once before serving."
# The one-query latency reported by Info: the median of a few runs of a short query.
LATENCY_PROBE_TEXT = "where is my parcel, the tracking number does not work"
LATENCY_PROBE_RUNS = 3
# Default bulk batch budget: this many one-query latencies (DWSEARCH_BULK_BATCH_MS=0).
BULK_BUDGET_QUERIES = 2.0  # on a device where one thread serves both lanes

_QUERY_LATENCY = Gauge(
    "dwsearch_embedder_query_latency_seconds",
    "One short query's latency through the engine, measured at warm-up",
)


@dataclass(frozen=True)
class EngineLimits:
    max_batch_tokens: int = 16384
    max_batch_inputs: int = 256
    max_queue: int = 1024
    max_inputs_per_request: int = 256
    max_input_tokens: int = 0  # 0 = the model's own limit
    max_queue_tokens: int = 262_144
    max_request_bytes: int = 8 * 1024 * 1024
    bulk_batch_ms: float = 0.0  # 0 = BULK_BUDGET_QUERIES × the measured one-query latency


@dataclass(frozen=True)
class Embedding:
    dense: np.ndarray | None
    sparse: dict[int, float] | None
    token_count: int
    truncated: bool

    def to_pb(self) -> pb.Embedding:
        out = pb.Embedding(token_count=self.token_count, truncated=self.truncated)
        if self.dense is not None:
            out.dense.extend(self.dense.tolist())
        if self.sparse is not None:
            indices = sorted(self.sparse)
            out.sparse.indices.extend(indices)
            out.sparse.values.extend(self.sparse[i] for i in indices)
        return out


@dataclass(frozen=True)
class EmbedResult:
    embeddings: list[Embedding]
    model_id: str
    dimension: int

    def to_pb(self) -> pb.EmbedResponse:
        return pb.EmbedResponse(
            embeddings=[e.to_pb() for e in self.embeddings],
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


class Embedder:
    def __init__(self, backend: EmbeddingBackend, limits: EngineLimits = EngineLimits()) -> None:
        if limits.max_inputs_per_request > limits.max_queue:
            raise StartupError(
                f"max_inputs_per_request ({limits.max_inputs_per_request}) exceeds max_queue ({limits.max_queue})"
            )
        self.backend = backend
        self.limits = limits
        self._info: BackendInfo | None = None
        self._max_tokens = 0
        self.query_latency_s = 0.0  # measured at warm-up
        self._admission = Admission(
            "embedder", max_queue_tokens=limits.max_queue_tokens, max_request_bytes=limits.max_request_bytes
        )
        # Fast tokenizers are not thread-safe: one thread owns the tokenizer.
        self._tokenizer = LaneExecutor("embedder-tokenizer")
        self._batcher: Batcher[_Job, Encoded] | None = None  # made once the device is known

    @property
    def info(self) -> BackendInfo:
        if self._info is None:
            raise Unavailable("the embedder is still loading its model")
        return self._info

    @property
    def max_input_tokens(self) -> int:
        return self._max_tokens

    async def start(self) -> None:
        """Load the model and run one warm-up batch."""
        info = await asyncio.to_thread(self.backend.load)
        model_limit = info.max_input_tokens
        if self.limits.max_input_tokens > model_limit:
            raise StartupError(
                f"max_input_tokens {self.limits.max_input_tokens} is over {info.model_id}'s limit of {model_limit}"
            )
        self._max_tokens = self.limits.max_input_tokens or model_limit
        self._batcher = Batcher(
            "embedder",
            self._run,
            max_batch_tokens=self.limits.max_batch_tokens,
            max_batch_inputs=self.limits.max_batch_inputs,
            max_queue=self.limits.max_queue,
            prior_overhead_tokens=prior_overhead_tokens(info.device),
            bulk_batch_seconds=self.limits.bulk_batch_ms / 1000,
            # On a CPU a query runs beside the bulk batch in flight, sharing the cores,
            # instead of waiting for it: one long bulk input (a chat window on a full-size
            # model) takes several query times. A GPU runs one batch at a time anyway.
            interactive_worker=info.device == "cpu",
        )
        self._batcher.start()
        self._info = info
        await self.embed([WARM_UP_TEXT], sparse=info.sparse_supported, truncate=True)
        self.query_latency_s = await self._measure_query_latency()
        _QUERY_LATENCY.set(self.query_latency_s)
        if not self.limits.bulk_batch_ms and not self._batcher.interactive_worker:
            # One thread serves both lanes (a GPU): a query may wait for the bulk batch in
            # flight, so keep bulk batches short. With an interactive worker queries never
            # wait for one, and bulk batches stay as large as the token budget allows.
            self._batcher.bulk_batch_seconds = BULK_BUDGET_QUERIES * self.query_latency_s
        log.info(
            "model ready",
            extra={
                "model_id": info.model_id,
                "revision": info.revision,
                "backend": info.backend,
                "device": info.device,
                "dtype": info.dtype,
                "max_input_tokens": self._max_tokens,
                "query_latency_ms": round(self.query_latency_s * 1000, 1),
                "bulk_batch_ms": round(self._batcher.bulk_batch_seconds * 1000, 1),
            },
        )

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

    async def stop(self) -> None:
        if self._batcher is not None:
            await self._batcher.close()
        self._tokenizer.shutdown()

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
        with self._admission.admit(
            texts, max_tokens_each=self._max_tokens if truncate else None
        ) as reservation:
            if truncate:
                texts = [precut(text, self._max_tokens) for text in texts]
            prepared: list[PreparedInput] = []
            for part in chunks(texts):
                prepared += await self._tokenizer.run(
                    lambda part=part: self.backend.prepare(texts[part], input_type, self._max_tokens),
                    lane=lane,
                    deadline=deadline,
                )
            if not truncate:
                for index, item in enumerate(prepared):
                    if item.truncated:
                        raise InvalidArgument(
                            f"input {index} has {item.token_count} tokens, over the model's limit of "
                            f"{self._max_tokens}; shorten it or set truncate"
                        )
            reservation.settle(sum(item.length for item in prepared))
            jobs = [_Job(item, sparse, normalize) for item in prepared]
            assert self._batcher is not None  # made before the model is reported loaded
            encoded = await self._batcher.submit(
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
        if self._info is None:
            raise Unavailable("the embedder is still loading its model")
        self._check_inputs(texts)
        lane = Lane.INTERACTIVE if input_type is InputType.QUERY else Lane.BULK
        counts: list[int] = []
        with self._admission.admit(texts, max_tokens_each=None):
            for part in chunks(texts):
                counts += await self._tokenizer.run(
                    lambda part=part: self.backend.count(texts[part], input_type),
                    lane=lane,
                    deadline=deadline,
                )
        return counts

    def _check_inputs(self, texts: Sequence[str]) -> None:
        if not texts:
            raise InvalidArgument("inputs is empty")
        if len(texts) > self.limits.max_inputs_per_request:
            raise InvalidArgument(
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
        if finite:
            return encoded
        # The text is never logged: it may hold personal data.
        log.error(
            "model produced a non-finite vector",
            extra={"model_id": self.info.model_id, "tokens": job.prepared.length},
        )
        return Internal("the model produced a non-finite value for an input")
