"""DocumentIndex: the index's operations over the pool and its vector space's encoders
(dwsearch.index.space: the embedder, BM25, or vectors the caller gives). Every request is
checked in full before anything is embedded or written; text is PII-redacted before it
is embedded or stored; each write is one transaction; a query's text is embedded once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
from dwsearch.common.errors import FailedPrecondition, Internal, InvalidArgument, NotFound
from dwsearch.db.readpool import ReadPool, read_operation
from dwsearch.index import bm25, store
from dwsearch.index.documents import (
    MAX_BATCH,
    MAX_DATA_BYTES,
    MAX_TOP_K,
    SCOPED_NAMESPACE_SEPARATOR,
    Document,
    Fusion,
    Hit,
    HitExplanation,
    Include,
    IndexInfo,
    MetadataMode,
    Query,
    QueryMode,
    RangePage,
    StoredDocument,
    Weighting,
    check_count,
    check_id,
    check_ids,
    check_known_names,
    check_namespace,
    check_query_text,
    check_text,
    decode_cursor,
    dense_vector,
    effective_range_limit,
    effective_top_k,
    encode_cursor,
    prefix_upper_bound,
    resolve_mode,
    sparse_vector,
)
from dwsearch.index.documents import sparse_vector as sparse_vector_check
from dwsearch.index.filter import Node, parse_filter, precompile_filter
from dwsearch.index.metadata import check_metadata, merge_patch
from dwsearch.index.space import PLACEHOLDER_DENSE, SPARSE_DIMENSION, Metric, SparseEncoder, VectorSpace
from dwsearch.index.writeorder import WriteOrder
from dwsearch.redaction import REDACTION_ON, Redaction
from dwsearch.retrieval import fusion
from dwsearch.retrieval.degradation import Degradation

EMBED_BATCH_INPUTS = 128
"""Texts per Embed call at most: under the embedder's default per-request cap (256); fewer
when the embedder is slow (bulk_call_size), so that a call fits its deadline."""
EMBED_CALLS_IN_FLIGHT = 2
"""Embed calls of one upsert in flight: they spread a large upsert over the embedder pods."""

HYBRID_OVERFETCH = 2
HYBRID_MIN_CANDIDATES = 20
"""A hybrid query takes max(HYBRID_MIN_CANDIDATES, HYBRID_OVERFETCH * top_k) from each
source, so that a document just outside one source's top_k but high in the other can
still win the fusion."""

_SIMILARITY = {Metric.COSINE: "cosine", Metric.DOT_PRODUCT: "ip", Metric.EUCLIDEAN: "l2"}
"""A float32 space's dense comparison (store.DENSE_SIMILARITY)."""

UPSTASH_FIRST_RANK = 0
"""The Index's RRF counts each source's ranks from 0, as Upstash does: a document first in
both sources scores 2/60 (fusion.rrf)."""

INDEX_FUSIONS = (Fusion.RRF, Fusion.DBSF)
"""The fusions the index offers (Upstash's)."""

UPSERT_DOCUMENT_COST = 2048
"""What checking one document's metadata and vector costs, in characters of text (the
unit of offload.INLINE_MAX_SIZE): an upsert of more than 8 small documents is checked in
the CPU pool, a few small ones inline."""
FILTER_INLINE_MAX = 256
"""Characters of a filter parsed inline; a longer one (up to MAX_FILTER_LENGTH) is parsed
and compiled in the CPU pool."""


@dataclass(frozen=True)
class UpsertResult:
    upserted: int
    embedded: int  # distinct texts sent to the embedder


@dataclass
class _Pending:
    """A document of an upsert on its way to a row: redacted text, checked metadata, and
    its vectors once known."""

    text: str
    metadata: dict[str, Any]
    metadata_json: bytes  # serialized in the CPU pool with the checks
    dense: np.ndarray | None = None
    sparse: dict[int, float] | None = None


@dataclass(frozen=True)
class QueryVectors:
    """A query embedded once, reusable for any number of searches."""

    text: str  # as embedded (redacted)
    dense: HalfVector | Vector | None  # Vector: a float32 space's
    sparse: SparseVector | None


@dataclass(frozen=True)
class QueryAnswer:
    """A query's hits, the mode served, and why it is less than the mode asked for."""

    hits: list[Hit]
    mode: QueryMode
    degradations: list[tuple[Degradation, str]]


def _no_sparse(mode: QueryMode | str, model: str) -> tuple[Degradation, str]:
    name = mode.value if isinstance(mode, QueryMode) else mode
    return (Degradation.SPARSE_UNSUPPORTED, f"{name}: the model {model!r} has no sparse vectors; dense only")


class DocumentIndex:
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
        if self.space.needs_embedder and embedder is None:
            raise ValueError(f"the space of {self.space.model!r} embeds with the embedder; none given")
        # The embedder asked for the index's model: the client checks that every Info and
        # Embed answer names it (ModelMismatch, FAILED_PRECONDITION). A fixed space has
        # none: its dense vectors come with the requests.
        # Query embeddings as Search gets them (dwsearch.clients.queryembedder): the
        # model's Info with its lifetime, told to on_model_info (serve's check of its query
        # latency), and the query cache (shared with search in `serve`; off by default).
        self._queries = (
            QueryEmbedder(embedder.for_model(self.space.model), cache=query_cache, on_info=on_model_info)
            if self.space.needs_embedder and embedder
            else None
        )
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

    # --- Model and redaction ---------------------------------------------------------

    async def model_info(self, *, fresh: bool = False) -> ModelInfo:
        """The embedder's model, which must be the configured one (the client raises
        ModelMismatch, FAILED_PRECONDITION, otherwise: its vectors live in another space).
        Writes ask fresh; reads reuse an answer for MODEL_INFO_TTL_S. A fixed space's is its
        own; a BM25 space's sparse side is BM25's."""
        info = self._fixed if self._fixed is not None else await self.queries.info(fresh=fresh)
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
                return await self.embedder.embed(
                    batch, input_type="document", sparse=sparse, truncate=True, priority="bulk",
                    timeout=BULK_CALL_TIMEOUT_S,
                )  # fmt: skip

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
                halfvec = _halfvec(embedding)  # checks there is one
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

    # --- Writes ----------------------------------------------------------------------

    async def upsert(
        self, namespace: str, documents: Sequence[Document], known_names: Sequence[str] = ()
    ) -> UpsertResult:
        """Insert or replace by id, all or nothing. A later document with the same id in
        one call wins, as if upserted after the earlier one."""
        check_namespace(namespace)
        check_count(len(documents), "documents", MAX_BATCH)
        check_known_names(known_names)
        async with self._writes.turn() as turn:
            # Everything that can be checked without the model first: a bad request is
            # INVALID_ARGUMENT even while the embedder is down. A large upsert is checked,
            # and redacted, in the CPU pool.
            size = sum(len(doc.data) + UPSERT_DOCUMENT_COST for doc in documents)
            metadata = await offload.run(_checked_metadata, documents, size=size)
            info = await self.model_info(fresh=True)
            texts = await self.redacted([doc.data for doc in documents], known_names)
            # Per document: vectors checked and converted (numpy), in the pool when many.
            pending = await offload.run(_pending, documents, metadata, texts, info, self.space, size=size)
            float32 = self.space.float32
            texts = list(dict.fromkeys(entry.text for entry in pending.values() if entry.dense is None))
            embeddings = await self._embed_documents(texts, info, sparse=info.sparse_supported)
            by_text = dict(zip(texts, embeddings, strict=True))
            rows = await offload.run(_rows, pending, by_text, info, float32, size=size)
            await turn.ready()  # writes that arrived earlier first (writeorder)
            async with self.pool.connection() as conn, conn.transaction():
                await store.upsert(conn, self._scope(namespace), rows)
                if self.space.metric is not None:  # a REST index keeps its namespaces, as Upstash
                    await store.register_namespace(conn, self._scope(namespace))
            return UpsertResult(upserted=len(rows), embedded=len(texts))

    async def namespaces(self) -> dict[str, int]:
        """Documents per namespace, with a REST index's emptied namespaces at 0 (they stay
        until drop_namespace)."""
        async with self.pool.connection() as conn:
            counts = await store.counts(conn, self.model)
            if self.space.metric is not None:
                for registered in await store.registered_namespaces(conn, self.model):
                    counts.setdefault(registered, 0)
        return counts

    async def drop_namespace(self, namespace: str) -> int:
        """Delete the namespace: its documents and (a REST index's) the namespace itself."""
        check_namespace(namespace)
        async with self._writes.turn() as turn:
            await turn.ready()
            async with self.pool.connection() as conn, conn.transaction():
                deleted = await store.delete_namespace(conn, namespace)
                await store.forget_namespace(conn, self._scope(namespace))
        return deleted

    async def update(
        self,
        namespace: str,
        doc_id: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        mode: MetadataMode = MetadataMode.PATCH,
        data: str | None = None,
        vector: Sequence[float] | None = None,
        sparse_vector: Mapping[int, float] | None = None,
        known_names: Sequence[str] = (),
    ) -> bool:
        """Patch (JSON merge patch) or overwrite a document's metadata, and / or replace its
        text (redacted, with `known_names` as upsert does) and its vectors: the text
        re-embedded when it comes alone and the space embeds text, else the vectors given
        (in the space's stored form) and the text as given. All in one transaction, the
        row locked; what is not given is kept. False when the namespace has no such
        document."""
        check_namespace(namespace)
        check_id(doc_id)
        check_known_names(known_names)
        if metadata is None and data is None and vector is None and sparse_vector is None:
            raise InvalidArgument("nothing to update: give metadata, data or vectors")
        async with self._writes.turn() as turn:
            given = check_metadata(metadata, "metadata") if metadata is not None else None
            if data is not None:
                check_text(data, "data", max_bytes=MAX_DATA_BYTES)
            changes = store.Changes()
            if data is not None and vector is None and sparse_vector is None and self.space.embeds_text:
                if not data.strip():
                    raise InvalidArgument("data: empty")
                info = await self.model_info(fresh=True)
                (redacted,) = await self.redacted([data], known_names)
                (e,) = await self._embed_documents([redacted], info, sparse=info.sparse_supported)
                sparse = SparseVector(e.sparse, info.sparse_dimension) if e.sparse is not None else None
                if self.space.float32:
                    assert e.dense is not None  # checked with the embedding
                    changes = store.Changes(
                        data=redacted, vector32=Vector(e.dense), sparse=sparse, replace_sparse=True
                    )
                else:
                    changes = store.Changes(
                        data=redacted, embedding=_halfvec(e), sparse=sparse, replace_sparse=True
                    )
            elif data is not None or vector is not None or sparse_vector is not None:
                info = await self.model_info(fresh=True)
                embedding = vector32 = None
                if vector is not None:
                    stored = dense_vector(self.space.stored(vector, "vector"), info.dimension, "vector")
                    if self.space.float32:
                        vector32 = Vector(stored)
                    else:
                        embedding = HalfVector(stored)
                sparse = None
                if sparse_vector is not None:
                    checked = sparse_vector_check(sparse_vector, info.sparse_dimension, "sparse_vector")
                    sparse = SparseVector(checked, info.sparse_dimension)
                text = (await self.redacted([data], known_names))[0] if data is not None else None
                changes = store.Changes(
                    data=text,
                    embedding=embedding,
                    sparse=sparse,
                    replace_sparse=sparse is not None,
                    vector32=vector32,
                )
            scope = self._scope(namespace)
            await turn.ready()  # writes that arrived earlier first (writeorder)
            async with self.pool.connection() as conn, conn.transaction():
                current = await store.lock_metadata(conn, scope, doc_id)
                if current is None:
                    return False
                if given is None:
                    new = current
                elif mode is MetadataMode.PATCH:
                    new = check_metadata(merge_patch(current, given), "metadata (patched)")
                else:
                    new = given
                await store.update(conn, scope, doc_id, new, changes)
            return True

    async def delete(
        self,
        namespace: str,
        *,
        ids: Sequence[str] | None = None,
        prefix: str | None = None,
        filter: str | None = None,
    ) -> int:
        """Delete by ids, id prefix or filter (exactly one); documents of every model go."""
        check_namespace(namespace)
        if sum(selector is not None for selector in (ids, prefix, filter)) != 1:
            raise InvalidArgument("give exactly one of ids, prefix or filter")
        async with self._writes.turn() as turn:
            if ids is not None:
                check_ids(ids)
                await turn.ready()
                async with self.pool.connection() as conn:
                    return await store.delete_ids(conn, namespace, ids)
            if prefix is not None:
                check_id(prefix, "prefix")
                await turn.ready()
                async with self.pool.connection() as conn:
                    return await store.delete_prefix(conn, namespace, prefix, prefix_upper_bound(prefix))
            node = await _parse_filter(filter or "")
            if node is None:
                raise InvalidArgument("filter: empty (it would delete the whole namespace)")
            await turn.ready()
            async with (
                self._slot(),
                self.pool.connection() as conn,
                store.bounded(conn, self.statement_timeout_ms),
            ):
                return await store.delete_matching(conn, namespace, node)

    async def clear(self, namespace: str) -> int:
        """Delete every document of the namespace (documents of every model go)."""
        check_namespace(namespace)
        async with self._writes.turn() as turn:
            await turn.ready()
            async with self.pool.connection() as conn:
                return await store.delete_namespace(conn, namespace)

    # --- Reads -----------------------------------------------------------------------

    async def query(self, query: Query) -> list[Hit]:
        return (await self.query_answer(query)).hits

    @read_operation
    async def query_answer(self, query: Query) -> QueryAnswer:
        """query(), with the mode served. SPARSE or HYBRID on a dense-only model degrades
        to DENSE with the reason stated (as Search does), when a dense query exists (data,
        or a vector); a sparse_vector alone on such a model is FAILED_PRECONDITION."""
        check_namespace(query.namespace)
        top_k = effective_top_k(query.top_k)
        if query.similar_to is not None:
            similar = await self._similar_query(query)
            answer = await self.query_answer(similar)
            hits = [h for h in answer.hits if h.document.id != query.similar_to][:top_k]
            return dataclasses.replace(answer, hits=hits)
        node = await _parse_filter(query.filter)
        degradations: list[tuple[Degradation, str]] = []
        squared = 0.0  # |q|² of a given dense query (a EUCLIDEAN space's score needs it)
        if query.data is not None:
            if query.vector is not None or query.sparse_vector is not None:
                raise InvalidArgument("query by data or by vector, not both")
            check_query_text(query.data, "data")
            info = await self.model_info()
            mode = query.mode
            if mode in (QueryMode.SPARSE, QueryMode.HYBRID) and not info.sparse_supported:
                degradations.append(_no_sparse(mode, self.model))
                mode = QueryMode.DENSE
            vectors = await self.embed_query(query.data, mode=mode, info=info)
            served = mode or (QueryMode.HYBRID if info.sparse_supported else QueryMode.DENSE)
            if vectors.sparse is None and self.space.sparse is SparseEncoder.BM25:
                if served is QueryMode.SPARSE:
                    return QueryAnswer([], served, degradations)  # not one term in the text
                if served is QueryMode.HYBRID:
                    served = QueryMode.DENSE
        else:
            if query.vector is not None:
                dense_vector(query.vector, None, "vector")  # finite, before asking the embedder
            info = await self.model_info()
            dense = None
            if query.vector is not None:
                stored, squared = self.space.query(query.vector, "vector")
                dense = dense_vector(stored, info.dimension, "vector")
            requested = query.mode
            if not info.sparse_supported and dense is not None:
                if query.sparse_vector is not None:
                    degradations.append(_no_sparse("sparse_vector", self.model))
                elif requested in (QueryMode.SPARSE, QueryMode.HYBRID):
                    degradations.append(_no_sparse(requested, self.model))
                if degradations:
                    requested = QueryMode.DENSE
            sparse = (
                sparse_vector(query.sparse_vector, info.sparse_dimension, "sparse_vector")
                if query.sparse_vector is not None and not degradations
                else None
            )
            if dense is None and sparse is None:
                raise InvalidArgument("query: give data, a vector or a sparse_vector")
            mode = resolve_mode(requested, dense=dense is not None, sparse=sparse is not None)
            served = mode
            vectors = QueryVectors(
                text="",
                dense=(Vector(dense) if self.space.float32 else HalfVector(dense))
                if dense is not None and mode is not QueryMode.SPARSE
                else None,
                sparse=SparseVector(sparse, info.sparse_dimension)
                if sparse is not None and mode is not QueryMode.DENSE
                else None,
            )
        idf = query.weighting is Weighting.IDF or (
            query.data is not None and self.space.sparse is SparseEncoder.BM25  # BM25's IDF is the query's
        )
        if idf and vectors.sparse is not None:
            vectors = dataclasses.replace(
                vectors, sparse=await self._idf_weighted(query.namespace, vectors.sparse)
            )
        hits = await self.search(
            query.namespace, vectors, top_k, node, query.fusion, query.include, explain=query.explain
        )
        if served is QueryMode.DENSE and self.space.metric is not None:
            hits = [dataclasses.replace(h, score=self.space.score(h.score, squared)) for h in hits]
        return QueryAnswer(
            [dataclasses.replace(h, document=self._external(h.document)) for h in hits], served, degradations
        )

    async def _similar_query(self, query: Query) -> Query:
        """Query.similar_to as a query by vectors: the stored document's own (dense as its
        clients know it, and sparse), one more hit asked for, as the document finds itself."""
        if query.data is not None or query.vector is not None or query.sparse_vector is not None:
            raise InvalidArgument("similar_to: alone, without data, a vector or a sparse_vector")
        doc_id = query.similar_to or ""
        check_id(doc_id, "similar_to")
        async with self.read_pool.connection() as conn:
            found = await store.fetch(conn, self._scope(query.namespace), [doc_id], Include(vectors=True))
        if doc_id not in found:
            raise NotFound(f"similar_to {doc_id!r}: no such document in the namespace")
        document = self._external(found[doc_id])
        return dataclasses.replace(
            query,
            similar_to=None,
            vector=document.vector if self.space.has_dense else None,
            sparse_vector=document.sparse_vector or None,
            top_k=min(MAX_TOP_K, effective_top_k(query.top_k) + 1),
        )

    async def _idf_weighted(self, namespace: str, sparse: SparseVector) -> SparseVector:
        """Each sparse query value times its term's inverse document frequency in the
        namespace, log((N - n + 0.5) / (n + 0.5) + 1), as Upstash weighs BM25 queries."""
        terms = [int(i) for i in sparse.indices()]
        async with self.read_pool.connection() as conn:
            total, frequencies = await store.document_frequencies(
                conn, self._scope(namespace), terms, sparse.dimensions()
            )
        weighted = {
            term: float(value)
            * math.log((total - frequencies.get(term, 0) + 0.5) / (frequencies.get(term, 0) + 0.5) + 1)
            for term, value in zip(terms, sparse.values(), strict=True)
        }
        return SparseVector(weighted, sparse.dimensions())

    def _external(self, document: StoredDocument) -> StoredDocument:
        """A stored document as the space's clients know it (a EUCLIDEAN space's vector
        without its appended |x|²)."""
        if document.vector is None or self.space.metric is None:
            return document
        return dataclasses.replace(document, vector=self.space.external(document.vector))

    async def search(
        self,
        namespace: str,
        vectors: QueryVectors,
        top_k: int,
        node: Node | None,
        fusion_algorithm: Fusion,
        include: Include,
        *,
        explain: bool = False,
    ) -> list[Hit]:
        """Top documents for already embedded query vectors: one source, or both fused
        (`explain`: each hit with its HitExplanation)."""
        hybrid = vectors.dense is not None and vectors.sparse is not None
        k = min(MAX_TOP_K, max(HYBRID_MIN_CANDIDATES, HYBRID_OVERFETCH * top_k)) if hybrid else top_k
        dense, sparse = await self.nearest(namespace, vectors, k, node, include)
        legs = (f"dense:{self.model}", f"sparse:{self.model}") if explain else None
        if not hybrid:
            source, leg = (dense, 0) if vectors.dense is not None else (sparse, 1)
            hits = source[:top_k]
            if legs is None:
                return hits
            return [
                dataclasses.replace(
                    h,
                    explanation=HitExplanation(
                        (fusion.LegScore(legs[leg], i, h.score, h.score, 1.0),), h.score
                    ),
                )
                for i, h in enumerate(hits, start=1)
            ]
        return fuse_hits(dense, sparse, fusion_algorithm, legs=legs)[:top_k]

    async def nearest(
        self, namespace: str, vectors: QueryVectors, k: int, node: Node | None, include: Include
    ) -> tuple[list[Hit], list[Hit]]:
        """Each source's top k, unfused."""
        metric = self.space.metric
        similarity = _SIMILARITY[metric] if metric is not None and self.space.float32 else None
        async with (
            self._slot(),
            self.read_pool.connection() as conn,
            store.bounded(conn, self.statement_timeout_ms),
        ):
            return await store.nearest(
                conn, self._scope(namespace), node, k, include, dense=vectors.dense, sparse=vectors.sparse,
                dense_similarity=similarity,
            )  # fmt: skip

    async def carry_over_float32(self, namespace_prefix: str) -> int:
        """A float32 space's rows in the namespaces starting with `namespace_prefix` (a
        REST index's: a space over the served model is shared with the gRPC index's
        namespaces, which keep halfvec) from before it kept float32, carried over (serve's
        REST start); 0 for any other space."""
        if not self.space.float32:
            return 0
        async with self.pool.connection() as conn:
            return await store.carry_over_float32(
                conn, self.model, namespace_prefix, self.space.dimension or None
            )

    @read_operation
    async def fetch(
        self, namespace: str, ids: Sequence[str], include: Include
    ) -> tuple[list[StoredDocument], list[str]]:
        """The documents found, in request order, and the ids not found."""
        check_namespace(namespace)
        check_ids(ids)
        async with self.read_pool.connection() as conn:
            found = await store.fetch(conn, self._scope(namespace), ids, include)
        return [self._external(found[i]) for i in ids if i in found], [i for i in ids if i not in found]

    @read_operation
    async def range(
        self, namespace: str, *, include: Include, cursor: str = "", limit: int = 0, prefix: str = ""
    ) -> RangePage:
        """One page in id order (a REST index: insertion order, as Upstash); next_cursor continues after it."""
        check_namespace(namespace)
        limit = effective_range_limit(limit)
        after = decode_cursor(cursor) if cursor else ""
        if prefix:
            check_id(prefix, "prefix")
        if self.space.metric is not None:  # a REST index: Upstash's insertion order
            return await self._range_inserted(namespace, after, prefix, limit, include)
        async with self.read_pool.connection() as conn:
            documents = await store.range_page(
                conn,
                self._scope(namespace),
                after=after,
                prefix=prefix,
                prefix_bound=prefix_upper_bound(prefix) if prefix else None,
                limit=limit + 1,  # one more tells whether there is a next page
                include=include,
            )
        more = len(documents) > limit
        documents = [self._external(d) for d in documents[:limit]]
        return RangePage(documents, encode_cursor(documents[-1].id) if more else "")

    async def _range_inserted(
        self, namespace: str, cursor: str, prefix: str, limit: int, include: Include
    ) -> RangePage:
        """A page in insertion order; the cursor holds the last one's place."""
        if cursor and not cursor.isdigit():
            raise InvalidArgument("cursor: not one this index gave")
        async with self.read_pool.connection() as conn:
            documents, places = await store.range_page_inserted(
                conn,
                self._scope(namespace),
                after=int(cursor or 0),
                prefix=prefix,
                prefix_bound=prefix_upper_bound(prefix) if prefix else None,
                limit=limit + 1,  # one more tells whether there is a next page
                include=include,
            )
        more = len(documents) > limit
        documents = [self._external(d) for d in documents[:limit]]
        return RangePage(documents, encode_cursor(str(places[limit - 1])) if more else "")

    @read_operation
    async def info(self) -> IndexInfo:
        model = await self.model_info()
        async with self.read_pool.connection() as conn:
            counts = await store.counts(conn, self.model)
        # The REST API's indexes may share the model's vector space: their namespaces are theirs.
        namespaces = {n: c for n, c in counts.items() if SCOPED_NAMESPACE_SEPARATOR not in n}
        return IndexInfo(
            model=self.model,
            dimension=model.dimension,
            sparse_supported=model.sparse_supported,
            namespaces=namespaces,
        )

    def _slot(self) -> contextlib.AbstractAsyncContextManager[object]:
        """A place among the caller-shaped statements that may hold connections at once."""
        return self._slots if self._slots is not None else contextlib.nullcontext()

    def _scope(self, namespace: str) -> store.NamespaceScope:
        return store.NamespaceScope(namespace, self.model)


def _checked_metadata(documents: Sequence[Document]) -> list[tuple[dict[str, Any], bytes]]:
    """Each document checked (everything but the vector's dimension, which needs the
    model); its metadata normalized, and serialized for the database (1,000 documents of
    48 KiB metadata: 0.3 s of json.dumps, which psycopg would do on the event loop)."""
    metadata = []
    for i, doc in enumerate(documents):
        where = f"documents[{i}]"
        check_id(doc.id, f"{where}.id")
        check_text(doc.data, f"{where}.data", max_bytes=MAX_DATA_BYTES)
        checked = check_metadata(doc.metadata, f"{where}.metadata")
        metadata.append((checked, json.dumps(checked, ensure_ascii=False, separators=(",", ":")).encode()))
        if doc.vector is not None:
            dense_vector(doc.vector, None, f"{where}.vector")
        elif not doc.data.strip():
            raise InvalidArgument(f"{where}: needs data or a vector")
        elif doc.sparse_vector is not None:
            raise InvalidArgument(f"{where}.sparse_vector: only with a dense vector")
    return metadata


def _pending(
    documents: Sequence[Document],
    metadata: Sequence[tuple[dict[str, Any], bytes]],
    texts: Sequence[str],
    info: ModelInfo,
    space: VectorSpace,
) -> dict[str, _Pending]:
    """An upsert's documents by id, with their given vectors in the space's stored form,
    checked against the model."""
    pending: dict[str, _Pending] = {}
    for i, (doc, (checked, serialized), text) in enumerate(zip(documents, metadata, texts, strict=True)):
        where = f"documents[{i}]"
        entry = _Pending(text, checked, serialized)
        if doc.vector is not None:
            stored = space.stored(doc.vector, f"{where}.vector")
            entry.dense = dense_vector(stored, info.dimension, f"{where}.vector")
            if doc.sparse_vector is not None:
                entry.sparse = sparse_vector(
                    doc.sparse_vector, info.sparse_dimension, f"{where}.sparse_vector"
                )
        pending.pop(doc.id, None)  # the later document takes the later position
        pending[doc.id] = entry
    return pending


def _rows(
    pending: Mapping[str, _Pending], by_text: Mapping[str, Embedding], info: ModelInfo, float32: bool = False
) -> list[store.Row]:
    """The rows to write: each document with its given vectors, or its text's embedding
    (`float32`: the dense vector as vector32, the placeholder in embedding)."""
    rows = []
    for doc_id, entry in pending.items():
        dense, sparse = entry.dense, entry.sparse
        if dense is None:
            dense, sparse = by_text[entry.text].dense, by_text[entry.text].sparse
        assert dense is not None  # _embed_documents checked every embedding
        rows.append(
            store.Row(
                doc_id,
                entry.text,
                entry.metadata,
                HalfVector(list(PLACEHOLDER_DENSE)) if float32 else HalfVector(dense),
                SparseVector(sparse, info.sparse_dimension) if sparse is not None else None,
                metadata_json=entry.metadata_json,
                vector32=Vector(dense) if float32 else None,
            )
        )
    return rows


async def _parse_filter(text: str) -> Node | None:
    """parse_filter; a long filter is parsed, compiled and rendered to SQL in the CPU pool
    (about 5, 20 and 20 ms at MAX_FILTER_LENGTH)."""
    if len(text) <= FILTER_INLINE_MAX:
        return parse_filter(text)
    return await offload.run(_parsed_and_compiled, text)


def _parsed_and_compiled(text: str) -> Node | None:
    node = parse_filter(text)
    if node is not None:
        precompile_filter(node)
    return node


def fuse_hits(
    dense: Sequence[Hit], sparse: Sequence[Hit], algorithm: Fusion, *, legs: tuple[str, str] | None = None
) -> list[Hit]:
    """Both sources' hits as one list, best first (ties on id), scored by the retrieval
    core's fusion (`fusion.fuse_legs`, by document id, ranks counted from
    UPSTASH_FIRST_RANK); `legs` (the two sources' names): each hit with its
    HitExplanation, whose legs sum, in source order, to exactly its fused score."""
    if algorithm not in INDEX_FUSIONS:
        raise InvalidArgument(f"fusion {algorithm.value}: the index fuses with rrf or dbsf")
    documents = {hit.document.id: hit.document for hit in [*sparse, *dense]}
    fused = fusion.fuse_legs(
        [
            fusion.FusionLeg(name, [(h.document.id, rank, h.score) for rank, h in enumerate(source, start=1)])
            for name, source in zip(legs or ("dense", "sparse"), (dense, sparse), strict=True)
        ],
        algorithm,
        first_rank=UPSTASH_FIRST_RANK,
        explain=legs is not None,
    )
    ranked = sorted(fused.scores.items(), key=lambda item: (-item[1], item[0]))
    if legs is None:
        return [Hit(documents[doc_id], score) for doc_id, score in ranked]
    return [
        Hit(documents[doc_id], score, HitExplanation(tuple(fused.parts[doc_id]), score))
        for doc_id, score in ranked
    ]


def _halfvec(e: Embedding) -> HalfVector:
    if e.dense is None:  # asked for, so _check_embedding has refused this already
        raise Internal("embedder returned no dense vector")
    return HalfVector(e.dense)
