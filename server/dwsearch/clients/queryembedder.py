"""One model's query embeddings, the one way Search, the Index and the REST API get them.

A QueryEmbedder holds, for one model (a client bound to it, which checks that every
answer names it):
- the model's Info, reused for MODEL_INFO_TTL_S (a ModelMismatch forgets it, so the next
  query asks again), and told to `on_info` whenever it is asked (serve's check of the
  embedder's query latency against the search deadline);
- the byte-bounded query cache (dwsearch.clients.querycache): a cached query needs no
  embedder, even while the breaker is open;
- the interactive lane with the caller's deadline, behind an optional circuit breaker,
  which the index's writes go through too (`guarded`);
- the embedding's checks: the dimension the model reports, finite values, sparse indices
  inside its sparse dimension (the embedder is another process: a malformed vector must
  not reach the store).
Text arrives redacted: redaction is the caller's (search and the index redact differently:
the index with per-request names)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import numpy as np

from dwsearch.clients.breaker import CircuitBreaker
from dwsearch.clients.embedder import EmbedderClient, Embedding, ModelInfo, ModelMismatch
from dwsearch.clients.querycache import QueryCache
from dwsearch.common.errors import Internal

T = TypeVar("T")

# How long a successful embedder Info is trusted before it is asked again (a redeploy
# with another model must be noticed).
MODEL_INFO_TTL_S = 60.0


class QueryEmbedder:
    def __init__(
        self,
        embedder: EmbedderClient,
        *,
        cache: QueryCache | None = None,
        breaker: CircuitBreaker | None = None,
        timeout: float | None = None,
        on_info: Callable[[ModelInfo], object] | None = None,
        on_embed_seconds: Callable[[float], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.embedder = embedder
        self.cache = cache if cache is not None else QueryCache(0)
        self.breaker = breaker
        self.timeout = timeout
        self._on_info = on_info
        self._on_embed_seconds = on_embed_seconds
        self._clock = clock
        self._info: ModelInfo | None = None
        self._info_at = 0.0

    def fresh_info(self) -> ModelInfo | None:
        """The model's Info when it was asked within MODEL_INFO_TTL_S; None otherwise."""
        if self._info is None or self._clock() - self._info_at > MODEL_INFO_TTL_S:
            return None
        return self._info

    async def info(self, *, fresh: bool = False, timeout: float | None = None) -> ModelInfo:
        """The model's Info: reused within MODEL_INFO_TTL_S unless `fresh` (writes ask
        fresh). ModelMismatch (FAILED_PRECONDITION) when the embedder serves another model."""
        info = None if fresh else self.fresh_info()
        if info is not None:
            return info
        now = self._clock()
        try:
            info = await self.embedder.info(timeout=timeout or self.timeout)
        except ModelMismatch:
            self._info = None  # the next query asks again, not trust the old answer
            raise
        self._info, self._info_at = info, now
        if self._on_info is not None:
            self._on_info(info)
        return info

    async def query_info(self) -> ModelInfo:
        """The Info a query needs: reused within MODEL_INFO_TTL_S, else asked with the
        query's deadline behind the breaker, as an embedding is (a query never waits longer
        for the Info than for its vector, and an open circuit answers at once)."""
        info = self.fresh_info()
        if info is not None:
            return info
        if self.breaker is None:
            return await self.info()
        return await self.breaker.call(self.info)

    async def guarded(self, work: Callable[[], Awaitable[T]]) -> T:
        """A call to the embedder that has no fallback (an index write's Info and document
        embeddings) behind the same breaker as the queries: while the model's circuit is
        open it fails at once (CircuitOpen, UNAVAILABLE) instead of waiting out its own
        deadline on an embedder known to be down or frozen, and its own transport failures
        count as the queries' do."""
        if self.breaker is None:
            return await work()
        return await self.breaker.call(work)

    async def embed(
        self, redacted: str, *, dense: bool = True, sparse: bool | None = None
    ) -> tuple[ModelInfo, Embedding]:
        """`redacted` embedded as a query (dense and / or sparse; sparse None: where the
        model has it), with the Info it was checked against."""
        known = self.fresh_info()
        if known is not None:
            found = self.cache.get(known.model_id, redacted, dense=dense, sparse=_sparse(sparse, known))
            if found is not None:
                return known, found
        if self.breaker is None:
            return await self._embed(redacted, known, dense=dense, sparse=sparse)
        return await self.breaker.call(lambda: self._embed(redacted, known, dense=dense, sparse=sparse))

    async def _embed(
        self, redacted: str, known: ModelInfo | None, *, dense: bool, sparse: bool | None
    ) -> tuple[ModelInfo, Embedding]:
        info = await self.info()
        wants_sparse = _sparse(sparse, info)
        if info is not known:  # asked just now: not looked up under this model yet
            found = self.cache.get(info.model_id, redacted, dense=dense, sparse=wants_sparse)
            if found is not None:
                return info, found
        started = time.perf_counter()
        try:
            (embedding,) = await self.embedder.embed(
                [redacted],
                input_type="query",
                dense=dense,
                sparse=wants_sparse,
                truncate=True,
                priority="interactive",
                timeout=self.timeout,
                expected_model=info.model_id,  # never cache another model's vector under this one
            )
        finally:
            if self._on_embed_seconds is not None:
                self._on_embed_seconds(time.perf_counter() - started)
        check_embedding(embedding, info, dense=dense, sparse=wants_sparse)
        self.cache.put(info.model_id, redacted, embedding, dense=dense, sparse=wants_sparse)
        return info, embedding


def _sparse(asked: bool | None, info: ModelInfo) -> bool:
    return info.sparse_supported if asked is None else asked and info.sparse_supported


def check_embedding(e: Embedding, info: ModelInfo, *, dense: bool, sparse: bool) -> None:
    """The embedder is another process: a wrong-sized or NaN vector must not be stored or searched."""
    if dense and (e.dense is None or e.dense.shape != (info.dimension,) or not np.isfinite(e.dense).all()):
        raise Internal(
            f"embedder returned a malformed dense vector (expected {info.dimension} finite values)"
        )
    if sparse and (
        e.sparse is None
        or any(not 0 <= i < info.sparse_dimension or not np.isfinite(v) for i, v in e.sparse.items())
    ):
        raise Internal("embedder returned a malformed sparse vector")
