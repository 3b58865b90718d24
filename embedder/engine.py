"""The embedder's domain object: validates requests, tokenizes them on one tokenizer
thread, and runs them through the batcher's single inference thread.

Lifecycle: `start` loads the model and runs a warm-up batch through the same path as a
request (the process reports SERVING only after it); `stop` finishes queued work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from dwsearch.common.batching import Batcher, prior_overhead_tokens
from dwsearch.common.errors import FailedPrecondition, Internal, InvalidArgument, Unavailable
from dwsearch.embedder.backends.base import BackendInfo, EmbeddingBackend, Encoded, InputType, PreparedInput
from dwsearch.embedder.runtime import StartupError
from dwsearch.v1 import embedder_pb2 as pb

log = logging.getLogger(__name__)
T = TypeVar("T")

WARM_UP_TEXT = "warm-up: a short sentence to run the model once before serving."


@dataclass(frozen=True)
class EngineLimits:
    max_batch_tokens: int = 16384
    max_batch_inputs: int = 256
    max_queue: int = 1024
    max_inputs_per_request: int = 256
    max_input_tokens: int = 0  # 0 = the model's own limit


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
        # Fast tokenizers are not thread-safe: one thread owns the tokenizer.
        self._tokenizer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder-tokenizer")
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
        )
        self._batcher.start()
        self._info = info
        await self.embed([WARM_UP_TEXT], sparse=info.sparse_supported, truncate=True)
        log.info(
            "model ready",
            extra={
                "model_id": info.model_id,
                "revision": info.revision,
                "backend": info.backend,
                "device": info.device,
                "dtype": info.dtype,
                "max_input_tokens": self._max_tokens,
            },
        )

    async def stop(self) -> None:
        if self._batcher is not None:
            await self._batcher.close()
        self._tokenizer_thread.shutdown(wait=False)

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
    ) -> EmbedResult:
        """Vectors for `texts`, in order. `deadline` is a time.monotonic() instant after
        which queued inputs are dropped instead of run."""
        info = self.info
        self._check_inputs(texts)
        if not dense and not sparse:
            raise InvalidArgument("nothing to return: dense and sparse are both false")
        if sparse and not info.sparse_supported:
            raise FailedPrecondition(f"{info.model_id} has no sparse head; ask for dense vectors only")
        prepared = await self._on_tokenizer(self.backend.prepare, texts, input_type, self._max_tokens)
        if not truncate:
            for index, item in enumerate(prepared):
                if item.truncated:
                    raise InvalidArgument(
                        f"input {index} has {item.token_count} tokens, over the model's limit of "
                        f"{self._max_tokens}; shorten it or set truncate"
                    )
        jobs = [_Job(item, sparse, normalize) for item in prepared]
        assert self._batcher is not None  # made before the model is reported loaded
        encoded = await self._batcher.submit(jobs, [item.length for item in prepared], deadline=deadline)
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

    async def count_tokens(self, texts: Sequence[str], *, input_type: InputType = InputType.DOCUMENT) -> list[int]:
        """Tokens per text, uncut, exactly as `embed` counts them."""
        if self._info is None:
            raise Unavailable("the embedder is still loading its model")
        self._check_inputs(texts)
        return await self._on_tokenizer(self.backend.count, texts, input_type)

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

    async def _on_tokenizer(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_thread, fn, *args)

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
