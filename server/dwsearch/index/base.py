"""The Index's parts its reads and writes share (IndexBase): the pools and the vector space,
the model's Info, PII redaction, and embedding (a query once, documents in bulk calls)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from pgvector import HalfVector, SparseVector, Vector
from psycopg_pool import AsyncConnectionPool

from dwsearch.clients.embedder import (
    BULK_CALL_TIMEOUT_S,
    EmbedderClient,
    Embedding,
    ModelInfo,
    bulk_call_size,
)
from dwsearch.clients.querycache import QueryCache
from dwsearch.clients.queryembedder import QueryEmbedder, check_embedding
from dwsearch.common import offload
from dwsearch.common.errors import FailedPrecondition, Internal
from dwsearch.db.readpool import ReadPool
from dwsearch.index import store
from dwsearch.index.documents import (
    QueryMode,
)
from dwsearch.index.filter import Node, parse_filter, precompile_filter
from dwsearch.index.space import PLACEHOLDER_DENSE, SPARSE_DIMENSION, SparseEncoder, VectorSpace
from dwsearch.index.writeorder import WriteOrder
from dwsearch.redaction import REDACTION_ON, Redaction
from dwsearch.retrieval import bm25
from dwsearch.retrieval.queries import QueryEmbedders

INFO_TIMEOUT_S = 2.0
"""How long a write waits for the embedder's Info (asked fresh before each write): a write
that needs the embedder fails cleanly when it is down, with nothing written. Info is
answered from the embedder's memory, beside its model's work, so a healthy embedder
answers it in milliseconds however busy; a frozen one held every write for 10 s here, the
first ones before the breaker opened (the soak, bench.soak)."""
EMBED_BATCH_INPUTS = 128
"""Texts per Embed call at most: under the embedder's default per-request cap (256); fewer
when the embedder is slow (bulk_call_size), so that a call fits its deadline."""
EMBED_CALLS_IN_FLIGHT = 2
"""Embed calls of one upsert in flight: they spread a large upsert over the embedder pods."""
FILTER_INLINE_MAX = 256
"""Characters of a filter parsed inline; a longer one (up to MAX_FILTER_LENGTH) is parsed
and compiled in the CPU pool."""


@dataclass(frozen=True)
class QueryVectors:
    """A query embedded once, reusable for any number of searches."""

    text: str  # as embedded (redacted)
    dense: HalfVector | Vector | None  # Vector: a float32 space's
    sparse: SparseVector | None


async def read_filter(text: str) -> Node | None:
    """parse_filter; a long filter is parsed, compiled and rendered to SQL in the CPU pool
    (about 5, 20 and 20 ms at MAX_FILTER_LENGTH)."""
    if len(text) <= FILTER_INLINE_MAX:
        return parse_filter(text)
    return await offload.run(parsed_and_compiled, text)


def parsed_and_compiled(text: str) -> Node | None:
    node = parse_filter(text)
    if node is not None:
        precompile_filter(node)
    return node


def halfvec_of(e: Embedding) -> HalfVector:
    if e.dense is None:  # asked for, so _check_embedding has refused this already
        raise Internal("embedder returned no dense vector")
    return HalfVector(e.dense)


class IndexBase:
    """One index's pools, space, model, redaction and embedding; DocumentIndex is this
    with its writes (dwsearch.index.writes) and reads (dwsearch.index.reads)."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        embedder: EmbedderClient | None,
        *,
        model: str = "",
        space: VectorSpace | None = None,
        redaction: Redaction = REDACTION_ON,
        query_cache: QueryCache | None = None,
        on_model_info: Callable[[ModelInfo], object] | None = None,
        statement_timeout_ms: int = store.STATEMENT_TIMEOUT_MS,
        query_slots: asyncio.Semaphore | None = None,
        read_pool: ReadPool | AsyncConnectionPool | None = None,
        queries: QueryEmbedder | None = None,
    ) -> None:
        """`space` (dwsearch.index.space), or `model` alone: the embedding model's own
        space, dense and sparse from the embedder, scores as the store computes them.
        Statements a caller shapes (KNN with a filter, delete by filter) are cancelled
        after `statement_timeout_ms`, and at most `query_slots` of them (shared by the
        indexes of one pool, so that they never take every connection from the others)
        run at once; None: as many as the pool has connections. Queries, fetches, ranges
        and info read from `read_pool` (dwsearch.db.readpool: a read replica, degrading to
        the primary) when given; every write, and every read a write depends on, takes
        `pool`."""
        self.pool = pool
        self.read_pool: ReadPool | AsyncConnectionPool = read_pool if read_pool is not None else pool
        self.statement_timeout_ms = statement_timeout_ms
        self._slots = query_slots
        self.space = space if space is not None else VectorSpace(model)
        if model and model != self.space.model:
            raise ValueError(f"model {model!r} is not the space's {self.space.model!r}")
        if self.space.needs_embedder and embedder is None and queries is None:
            raise ValueError(f"the space of {self.space.model!r} embeds with the embedder; none given")
        # The embedder asked for the index's model: the client checks that every Info and
        # Embed answer names it (ModelMismatch, FAILED_PRECONDITION). A fixed space has
        # none: its dense vectors come with the requests.
        # Query embeddings as Search gets them, from the same QueryEmbedder when serve hands
        # it (`queries`: dwsearch.retrieval.queries, the process's one per model): the
        # query-embedding deadline and the model's circuit breaker, its Info with its
        # lifetime, told to on_model_info (serve's check of its query latency), and the
        # query cache. Made here over `embedder` when not given.
        if self.space.needs_embedder and embedder is not None and queries is None:
            queries = QueryEmbedders(
                embedder, cache=query_cache, first_model=self.space.model, on_first_info=on_model_info
            ).for_model(self.space.model)
        self._queries = queries if self.space.needs_embedder else None
        self.model = self.space.model
        self.redaction = redaction
        # Writes apply in the order they arrived: each takes its turn when called, and
        # only its transaction waits for the earlier ones (dwsearch.index.writeorder).
        self._writes = WriteOrder()
        # A fixed space's dimensions are its own.
        self._fixed = ModelInfo(
            model_id=self.model, revision="", backend="", dimension=self.space.stored_dimension,
            max_input_tokens=0, sparse_supported=self.space.sparse is not SparseEncoder.NONE,
            sparse_dimension=SPARSE_DIMENSION if self.space.sparse is not SparseEncoder.NONE else 0,
            device="", dtype="float16",
        ) if self.space.fixed else None  # fmt: skip

    @property
    def queries(self) -> QueryEmbedder:
        if self._queries is None:
            raise Internal(f"the index {self.model!r} has no embedder: its vectors come with the requests")
        return self._queries

    @property
    def embedder(self) -> EmbedderClient:
        return self.queries.embedder

    async def model_info(self, *, fresh: bool = False) -> ModelInfo:
        """The embedder's model, which must be the configured one (the client raises
        ModelMismatch, FAILED_PRECONDITION, otherwise: its vectors live in another space).
        Writes ask fresh; reads reuse an answer for MODEL_INFO_TTL_S. A fixed space's is its
        own; a BM25 space's sparse side is BM25's."""
        if self._fixed is not None:
            info = self._fixed
        elif fresh:  # a write's: the client's own deadline (a write has no fallback to degrade
            # to), behind the model's breaker: UNAVAILABLE at once while it is open
            info = await self.queries.guarded(lambda: self.queries.info(fresh=True, timeout=INFO_TIMEOUT_S))
        else:  # a read's: the query's deadline, behind the model's breaker
            info = await self.queries.query_info()
        if self.space.sparse is SparseEncoder.BM25:
            info = dataclasses.replace(info, sparse_supported=True, sparse_dimension=bm25.DIMENSION)
        return info

    async def redacted(self, texts: Sequence[str], known_names: Sequence[str] = ()) -> list[str]:
        """`texts` PII-redacted as the index redacts (its Redaction), with `known_names`."""
        return await self.redaction.texts(texts, known_names)

    async def _embed_documents(
        self, texts: Sequence[str], info: ModelInfo, *, sparse: bool
    ) -> list[Embedding]:
        """Document texts (upserts, updates) turned into the space's vectors: dense from the
        embedder's bulk lane (a fixed space: PLACEHOLDER_DENSE), sparse from the embedder,
        or from BM25."""
        if not texts:
            return []
        bm25_sparse = self.space.sparse is SparseEncoder.BM25
        if not self.space.dense_from_embedder:
            placeholder = np.asarray(PLACEHOLDER_DENSE, dtype=np.float32)
            embeddings = [Embedding(placeholder, None, 0, False) for _ in texts]
        else:
            embeddings = await self._embed_in_bulk(texts, info, sparse=sparse and not bm25_sparse)
        if bm25_sparse:
            embeddings = [
                Embedding(e.dense, bm25.document_vector(text), e.token_count, e.truncated)
                for e, text in zip(embeddings, texts, strict=True)
            ]
        return embeddings

    async def _embed_in_bulk(self, texts: Sequence[str], info: ModelInfo, *, sparse: bool) -> list[Embedding]:
        """Document texts embedded by the embedder, in its bulk lane."""
        # A bulk call's deadline (BULK_CALL_TIMEOUT_S, below the grace of a connection
        # closed for age), not search's 300 ms query deadline: document batches on a CPU
        # embedder take seconds, and the index has no FTS to fall back on. Calls are sized
        # from the embedder's measured speed so that each fits it.
        size = bulk_call_size(
            info.query_latency_ms, calls_in_flight=EMBED_CALLS_IN_FLIGHT, most=EMBED_BATCH_INPUTS
        )
        size = size or EMBED_BATCH_INPUTS
        batches = [texts[i : i + size] for i in range(0, len(texts), size)]
        in_flight = asyncio.Semaphore(EMBED_CALLS_IN_FLIGHT)

        async def embed(batch: Sequence[str]) -> list[Embedding]:
            async with in_flight:
                return await self.queries.guarded(lambda: self.embedder.embed(
                    batch, input_type="document", sparse=sparse, truncate=True, priority="bulk",
                    timeout=BULK_CALL_TIMEOUT_S,
                ))  # fmt: skip

        results = await asyncio.gather(*(embed(batch) for batch in batches))
        embeddings = [e for batch in results for e in batch]
        if len(embeddings) != len(texts):
            raise Internal(f"embedder returned {len(embeddings)} embeddings for {len(texts)} texts")
        for e in embeddings:
            check_embedding(e, info, dense=True, sparse=sparse)
        return embeddings

    async def embed_query(
        self,
        text: str,
        *,
        known_names: Sequence[str] = (),
        mode: QueryMode | None = None,
        info: ModelInfo | None = None,
    ) -> QueryVectors:
        """Redact and embed a query text once: the vectors `mode` needs (None: dense, and
        sparse where the space has it). `info`: the model info the caller already holds.
        A BM25 query with no term has no sparse vector."""
        info = info if info is not None else await self.model_info()
        if mode in (QueryMode.SPARSE, QueryMode.HYBRID) and not info.sparse_supported:
            raise FailedPrecondition(f"mode {mode.value}: the model {self.model!r} has no sparse vectors")
        (redacted,) = await self.redacted([text], known_names)
        bm25_sparse = self.space.sparse is SparseEncoder.BM25
        dense = mode is not QueryMode.SPARSE and self.space.dense_from_embedder
        sparse = mode is not QueryMode.DENSE and info.sparse_supported and not bm25_sparse
        dense_vector_: HalfVector | Vector | None = None
        sparse_vector_: SparseVector | None = None
        if dense or sparse:
            # The interactive lane, and the query cache: a repeated query costs no embedding.
            model, embedding = await self.queries.embed(redacted, dense=dense, sparse=sparse)
            if dense:
                halfvec = halfvec_of(embedding)  # checks there is one
                if self.space.float32:  # the embedder's float32, whole
                    assert embedding.dense is not None
                    dense_vector_ = Vector(embedding.dense)
                else:
                    dense_vector_ = halfvec
            if sparse and embedding.sparse is not None:
                sparse_vector_ = SparseVector(embedding.sparse, model.sparse_dimension)
        if bm25_sparse and mode is not QueryMode.DENSE:
            weights = bm25.query_vector(redacted)
            sparse_vector_ = SparseVector(weights, bm25.DIMENSION) if weights else None
        return QueryVectors(text=redacted, dense=dense_vector_, sparse=sparse_vector_)

    def _slot(self) -> contextlib.AbstractAsyncContextManager[object]:
        """A place among the caller-shaped statements that may hold connections at once."""
        return self._slots if self._slots is not None else contextlib.nullcontext()

    def _scope(self, namespace: str) -> store.NamespaceScope:
        return store.NamespaceScope(namespace, self.model)
