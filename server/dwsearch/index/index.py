"""DocumentIndex: the index's operations over the pool and the embedder. Every request
is checked in full before anything is embedded or written; text is PII-redacted before
it is embedded or stored; each write is one transaction."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pgvector import HalfVector, SparseVector
from psycopg_pool import AsyncConnectionPool

from dwsearch import redaction
from dwsearch.clients.embedder import (
    BULK_CALL_TIMEOUT_S,
    EmbedderClient,
    Embedding,
    ModelInfo,
    ModelMismatch,
    bulk_call_size,
)
from dwsearch.clients.querycache import QueryCache
from dwsearch.common import offload
from dwsearch.common.errors import FailedPrecondition, Internal, InvalidArgument
from dwsearch.common.retrieval import MODEL_INFO_TTL_S, Degradation
from dwsearch.index import fusion, store
from dwsearch.index.documents import (
    MAX_BATCH,
    MAX_DATA_BYTES,
    MAX_TOP_K,
    SCOPED_NAMESPACE_SEPARATOR,
    Document,
    Fusion,
    Hit,
    Include,
    IndexInfo,
    MetadataMode,
    Query,
    QueryMode,
    RangePage,
    StoredDocument,
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
from dwsearch.index.filter import Node, parse_filter, precompile_filter
from dwsearch.index.metadata import check_metadata, merge_patch

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

_FUSE = {Fusion.RRF: fusion.rrf, Fusion.DBSF: fusion.dbsf}

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
    dense: HalfVector | None
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
        embedder: EmbedderClient,
        *,
        model: str,
        redact: bool = True,
        query_cache: QueryCache | None = None,
        on_model_info: Callable[[ModelInfo], object] | None = None,
    ) -> None:
        self.pool = pool
        # The embedder asked for the index's model: the client checks that every Info and
        # Embed answer names it (ModelMismatch, FAILED_PRECONDITION). The REST API's
        # fixed-space indexes have none (rest.app.FixedSpaceIndex: vectors come with requests).
        self.embedder = embedder.for_model(model) if embedder is not None else embedder
        self.model = model
        self.redact = redact
        self._info: ModelInfo | None = None
        self._info_at = 0.0
        # Query embeddings already computed (shared with search in `serve`); off by default.
        self._queries = query_cache if query_cache is not None else QueryCache(0)
        # Told each model info the embedder reports (serve's check of its query latency).
        self._on_model_info = on_model_info

    # --- Model and redaction ---------------------------------------------------------

    async def model_info(self, *, fresh: bool = False) -> ModelInfo:
        """The embedder's model, which must be the configured one (the client raises
        ModelMismatch, FAILED_PRECONDITION, otherwise: its vectors live in another space).
        Writes ask fresh; reads reuse an answer for MODEL_INFO_TTL_S."""
        now = time.monotonic()
        if not fresh and self._info is not None and now - self._info_at <= MODEL_INFO_TTL_S:
            return self._info
        try:
            info = await self.embedder.info()
        except ModelMismatch:
            self._info = None  # reads ask again, not trust the old answer
            raise
        self._info, self._info_at = info, now
        if self._on_model_info is not None:
            self._on_model_info(info)
        return info

    async def redacted(self, texts: Sequence[str], known_names: Sequence[str] = ()) -> list[str]:
        """`texts` PII-redacted, with `known_names`: inline when they are small and the
        names' pattern is compiled already, otherwise in the CPU pool (off the event loop;
        RESOURCE_EXHAUSTED when it is full)."""
        if not self.redact:
            return list(texts)
        size = sum(len(text) for text in texts)
        ready = redaction.cached_redactor(known_names)
        if ready is not None and size <= offload.INLINE_MAX_SIZE:
            return [ready.redact(text) for text in texts]
        return await offload.run(_redact_all, texts, tuple(known_names))

    async def _embed_documents(
        self, texts: Sequence[str], info: ModelInfo, *, sparse: bool
    ) -> list[Embedding]:
        """Document texts (upserts, updates) embedded in the bulk lane."""
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
            _check_embedding(e, info, dense=True, sparse=sparse)
        return embeddings

    async def embed_query(
        self, text: str, *, known_names: Sequence[str] = (), mode: QueryMode | None = None
    ) -> QueryVectors:
        """Redact and embed a query text once: the vectors `mode` needs (None: dense, and
        sparse where the model has it)."""
        info = await self.model_info()
        if mode in (QueryMode.SPARSE, QueryMode.HYBRID) and not info.sparse_supported:
            raise FailedPrecondition(f"mode {mode.value}: the model {self.model!r} has no sparse vectors")
        dense = mode is not QueryMode.SPARSE
        sparse = mode is not QueryMode.DENSE and info.sparse_supported
        (redacted,) = await self.redacted([text], known_names)
        # The interactive lane, and the query cache: a repeated query costs no embedding.
        embedding = await self._queries.embed(
            self.embedder,
            info.model_id,
            redacted,
            dense=dense,
            sparse=sparse,
            check=lambda e: _check_embedding(e, info, dense=dense, sparse=sparse),
        )
        return QueryVectors(
            text=redacted,
            dense=_halfvec(embedding) if dense else None,
            sparse=SparseVector(embedding.sparse, info.sparse_dimension)
            if sparse and embedding.sparse is not None
            else None,
        )

    # --- Writes ----------------------------------------------------------------------

    async def upsert(
        self, namespace: str, documents: Sequence[Document], known_names: Sequence[str] = ()
    ) -> UpsertResult:
        """Insert or replace by id, all or nothing. A later document with the same id in
        one call wins, as if upserted after the earlier one."""
        check_namespace(namespace)
        check_count(len(documents), "documents", MAX_BATCH)
        check_known_names(known_names)
        # Everything that can be checked without the model first: a bad request is
        # INVALID_ARGUMENT even while the embedder is down. A large upsert is checked,
        # and redacted, in the CPU pool.
        size = sum(len(doc.data) + UPSERT_DOCUMENT_COST for doc in documents)
        metadata = await offload.run(_checked_metadata, documents, size=size)
        info = await self.model_info(fresh=True)
        texts = await self.redacted([doc.data for doc in documents], known_names)
        # Per document: vectors checked and converted (numpy), in the pool when many.
        pending = await offload.run(_pending, documents, metadata, texts, info, size=size)
        texts = list(dict.fromkeys(entry.text for entry in pending.values() if entry.dense is None))
        embeddings = await self._embed_documents(texts, info, sparse=info.sparse_supported)
        by_text = dict(zip(texts, embeddings, strict=True))
        rows = await offload.run(_rows, pending, by_text, info, size=size)
        async with self.pool.connection() as conn, conn.transaction():
            await store.upsert(conn, self._scope(namespace), rows)
        return UpsertResult(upserted=len(rows), embedded=len(texts))

    async def update(
        self,
        namespace: str,
        doc_id: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        mode: MetadataMode = MetadataMode.PATCH,
        data: str | None = None,
        known_names: Sequence[str] = (),
    ) -> bool:
        """Patch (JSON merge patch) or overwrite a document's metadata and / or replace its
        text (redacted, with `known_names` as upsert does, and re-embedded). False when
        the namespace has no such document."""
        check_namespace(namespace)
        check_id(doc_id)
        check_known_names(known_names)
        if metadata is None and data is None:
            raise InvalidArgument("nothing to update: give metadata or data")
        given = check_metadata(metadata, "metadata") if metadata is not None else None
        text = None
        if data is not None:
            if not data.strip():
                raise InvalidArgument("data: empty")
            check_text(data, "data", max_bytes=MAX_DATA_BYTES)
            info = await self.model_info(fresh=True)
            (redacted,) = await self.redacted([data], known_names)
            (e,) = await self._embed_documents([redacted], info, sparse=info.sparse_supported)
            sparse = SparseVector(e.sparse, info.sparse_dimension) if e.sparse is not None else None
            text = (redacted, _halfvec(e), sparse)
        scope = self._scope(namespace)
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
            await store.update(conn, scope, doc_id, new, text)
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
        if ids is not None:
            check_ids(ids)
            async with self.pool.connection() as conn:
                return await store.delete_ids(conn, namespace, ids)
        if prefix is not None:
            check_id(prefix, "prefix")
            async with self.pool.connection() as conn:
                return await store.delete_prefix(conn, namespace, prefix, prefix_upper_bound(prefix))
        node = await _parse_filter(filter or "")
        if node is None:
            raise InvalidArgument("filter: empty (it would delete the whole namespace)")
        async with self.pool.connection() as conn:
            return await store.delete_matching(conn, namespace, node)

    async def clear(self, namespace: str) -> int:
        """Delete every document of the namespace (documents of every model go)."""
        check_namespace(namespace)
        async with self.pool.connection() as conn:
            return await store.delete_namespace(conn, namespace)

    # --- Reads -----------------------------------------------------------------------

    async def query(self, query: Query) -> list[Hit]:
        return (await self.query_answer(query)).hits

    async def query_answer(self, query: Query) -> QueryAnswer:
        """query(), with the mode served. SPARSE or HYBRID on a dense-only model degrades
        to DENSE with the reason stated (as Search does), when a dense query exists (data,
        or a vector); a sparse_vector alone on such a model is FAILED_PRECONDITION."""
        check_namespace(query.namespace)
        top_k = effective_top_k(query.top_k)
        node = await _parse_filter(query.filter)
        degradations: list[tuple[Degradation, str]] = []
        if query.data is not None:
            if query.vector is not None or query.sparse_vector is not None:
                raise InvalidArgument("query by data or by vector, not both")
            check_query_text(query.data, "data")
            info = await self.model_info()
            mode = query.mode
            if mode in (QueryMode.SPARSE, QueryMode.HYBRID) and not info.sparse_supported:
                degradations.append(_no_sparse(mode, self.model))
                mode = QueryMode.DENSE
            vectors = await self.embed_query(query.data, mode=mode)
            served = mode or (QueryMode.HYBRID if info.sparse_supported else QueryMode.DENSE)
        else:
            if query.vector is not None:
                dense_vector(query.vector, None, "vector")  # finite, before asking the embedder
            info = await self.model_info()
            dense = dense_vector(query.vector, info.dimension, "vector") if query.vector is not None else None
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
                dense=HalfVector(dense) if dense is not None and mode is not QueryMode.SPARSE else None,
                sparse=SparseVector(sparse, info.sparse_dimension)
                if sparse is not None and mode is not QueryMode.DENSE
                else None,
            )
        hits = await self.search(query.namespace, vectors, top_k, node, query.fusion, query.include)
        return QueryAnswer(hits, served, degradations)

    async def search(
        self,
        namespace: str,
        vectors: QueryVectors,
        top_k: int,
        node: Node | None,
        fusion_algorithm: Fusion,
        include: Include,
    ) -> list[Hit]:
        """Top documents for already embedded query vectors: one source, or both fused."""
        hybrid = vectors.dense is not None and vectors.sparse is not None
        k = min(MAX_TOP_K, max(HYBRID_MIN_CANDIDATES, HYBRID_OVERFETCH * top_k)) if hybrid else top_k
        dense, sparse = await self.nearest(namespace, vectors, k, node, include)
        if not hybrid:
            return (dense or sparse)[:top_k]
        return fuse(dense, sparse, fusion_algorithm)[:top_k]

    async def nearest(
        self, namespace: str, vectors: QueryVectors, k: int, node: Node | None, include: Include
    ) -> tuple[list[Hit], list[Hit]]:
        """Each source's top k, unfused."""
        async with self.pool.connection() as conn:
            return await store.nearest(
                conn, self._scope(namespace), node, k, include, dense=vectors.dense, sparse=vectors.sparse
            )

    async def document_frequencies(self, namespace: str, terms: Sequence[int]) -> tuple[int, dict[int, int]]:
        """The namespace's document count (active model) and, per sparse term, how many of
        them have it: what IDF weighting needs."""
        check_namespace(namespace)
        info = await self.model_info()
        if not info.sparse_supported:
            raise FailedPrecondition(f"the model {self.model!r} has no sparse vectors")
        sparse_vector(dict.fromkeys(terms, 1.0), info.sparse_dimension, "sparse_vector")
        async with self.pool.connection() as conn:
            return await store.document_frequencies(
                conn, self._scope(namespace), terms, info.sparse_dimension
            )

    async def fetch(
        self, namespace: str, ids: Sequence[str], include: Include
    ) -> tuple[list[StoredDocument], list[str]]:
        """The documents found, in request order, and the ids not found."""
        check_namespace(namespace)
        check_ids(ids)
        async with self.pool.connection() as conn:
            found = await store.fetch(conn, self._scope(namespace), ids, include)
        return [found[i] for i in ids if i in found], [i for i in ids if i not in found]

    async def range(
        self, namespace: str, *, include: Include, cursor: str = "", limit: int = 0, prefix: str = ""
    ) -> RangePage:
        """One page in id order; next_cursor continues after it."""
        check_namespace(namespace)
        limit = effective_range_limit(limit)
        after = decode_cursor(cursor) if cursor else ""
        if prefix:
            check_id(prefix, "prefix")
        async with self.pool.connection() as conn:
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
        documents = documents[:limit]
        return RangePage(documents, encode_cursor(documents[-1].id) if more else "")

    async def info(self) -> IndexInfo:
        model = await self.model_info()
        async with self.pool.connection() as conn:
            counts = await store.counts(conn, self.model)
        # The REST API's indexes may share the model's vector space: their namespaces are theirs.
        namespaces = {n: c for n, c in counts.items() if SCOPED_NAMESPACE_SEPARATOR not in n}
        return IndexInfo(
            model=self.model,
            dimension=model.dimension,
            sparse_supported=model.sparse_supported,
            namespaces=namespaces,
        )

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
) -> dict[str, _Pending]:
    """An upsert's documents by id, with their given vectors checked against the model."""
    pending: dict[str, _Pending] = {}
    for i, (doc, (checked, serialized), text) in enumerate(zip(documents, metadata, texts, strict=True)):
        where = f"documents[{i}]"
        entry = _Pending(text, checked, serialized)
        if doc.vector is not None:
            entry.dense = dense_vector(doc.vector, info.dimension, f"{where}.vector")
            if doc.sparse_vector is not None:
                entry.sparse = sparse_vector(
                    doc.sparse_vector, info.sparse_dimension, f"{where}.sparse_vector"
                )
        pending.pop(doc.id, None)  # the later document takes the later position
        pending[doc.id] = entry
    return pending


def _rows(
    pending: Mapping[str, _Pending], by_text: Mapping[str, Embedding], info: ModelInfo
) -> list[store.Row]:
    """The rows to write: each document with its given vectors, or its text's embedding."""
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
                HalfVector(dense),
                SparseVector(sparse, info.sparse_dimension) if sparse is not None else None,
                metadata_json=entry.metadata_json,
            )
        )
    return rows


def _redact_all(texts: Sequence[str], known_names: tuple[str, ...]) -> list[str]:
    redactor = redaction.redactor(known_names)
    return [redactor.redact(text) for text in texts]


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


def fuse(dense: Sequence[Hit], sparse: Sequence[Hit], algorithm: Fusion) -> list[Hit]:
    """Both sources' hits as one list, best first, scored by the fusion."""
    documents = {hit.document.id: hit.document for hit in [*sparse, *dense]}
    ranked = _FUSE[algorithm]([[(h.document.id, h.score) for h in source] for source in (dense, sparse)])
    return [Hit(documents[doc_id], score) for doc_id, score in ranked]


def _halfvec(e: Embedding) -> HalfVector:
    if e.dense is None:  # asked for, so _check_embedding has refused this already
        raise Internal("embedder returned no dense vector")
    return HalfVector(e.dense)


def _check_embedding(e: Embedding, info: ModelInfo, *, dense: bool, sparse: bool) -> None:
    """The embedder is another process: a wrong-sized or NaN vector must not be stored."""
    if dense and (e.dense is None or e.dense.shape != (info.dimension,) or not np.isfinite(e.dense).all()):
        raise Internal(
            f"embedder returned a malformed dense vector (expected {info.dimension} finite values)"
        )
    if sparse and (
        e.sparse is None
        or any(not 0 <= i < info.sparse_dimension or not np.isfinite(v) for i, v in e.sparse.items())
    ):
        raise Internal("embedder returned a malformed sparse vector")
