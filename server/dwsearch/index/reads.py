"""The Index's reads (IndexReads): queries (dense, sparse, hybrid fused by the retrieval
core, by a stored document's vectors, explained), fetch, range, info and namespaces; a
query's text is embedded once. And the operators' console's (dwsearch.console): a
namespace's most recent documents with their vectors (recent_documents, the Map)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pgvector import HalfVector, SparseVector, Vector
from psycopg_pool import AsyncConnectionPool

from dwsearch.common import tracing
from dwsearch.common.errors import DwsearchError, InvalidArgument, NotFound, Unavailable
from dwsearch.db.readpool import ReadPool, read_operation
from dwsearch.index import store
from dwsearch.index.base import (
    IndexBase,
    QueryVectors,
    read_filter,
)
from dwsearch.index.documents import (
    MAX_TOP_K,
    SCOPED_NAMESPACE_SEPARATOR,
    Fusion,
    Hit,
    HitExplanation,
    Include,
    IndexInfo,
    Query,
    QueryMode,
    RangePage,
    StoredDocument,
    Weighting,
    check_id,
    check_ids,
    check_namespace,
    check_query_text,
    decode_cursor,
    decode_place_cursor,
    dense_vector,
    effective_range_limit,
    effective_top_k,
    encode_cursor,
    encode_place_cursor,
    prefix_upper_bound,
    resolve_mode,
    sparse_vector,
)
from dwsearch.index.filter import Node
from dwsearch.index.space import Metric, SparseEncoder
from dwsearch.retrieval import bm25, fusion
from dwsearch.retrieval import candidates as candidate_policy
from dwsearch.retrieval.degradation import Degradation
from dwsearch.retrieval.queries import degrades, left_out

_SIMILARITY = {Metric.COSINE: "cosine", Metric.DOT_PRODUCT: "ip", Metric.EUCLIDEAN: "l2"}
"""A float32 space's dense comparison (store.DENSE_SIMILARITY)."""

UPSTASH_FIRST_RANK = 0
"""The Index's RRF counts each source's ranks from 0, as Upstash does: a document first in
both sources scores 2/60 (fusion.rrf)."""

INDEX_FUSIONS = (Fusion.RRF, Fusion.DBSF)
"""The fusions the index offers (Upstash's)."""


@dataclass(frozen=True)
class QueryAnswer:
    """A query's hits, the mode served, and why it is less than the mode asked for."""

    hits: list[Hit]
    mode: QueryMode
    degradations: list[tuple[Degradation, str]]


def _no_sparse(mode: QueryMode | str, model: str) -> tuple[Degradation, str]:
    name = mode.value if isinstance(mode, QueryMode) else mode
    return (Degradation.SPARSE_UNSUPPORTED, f"{name}: the model {model!r} has no sparse vectors; dense only")


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


class IndexReads(IndexBase):
    """DocumentIndex's reads."""

    async def namespaces(self) -> dict[str, int]:
        """Documents per namespace, with a REST index's emptied namespaces at 0 (they stay
        until drop_namespace)."""
        async with self.pool.connection() as conn:
            counts = await store.counts(conn, self.model)
            if self.space.metric is not None:
                for registered in await store.registered_namespaces(conn, self.model):
                    counts.setdefault(registered, 0)
        return counts

    async def query(self, query: Query) -> list[Hit]:
        return (await self.query_answer(query)).hits

    async def query_answer(self, query: Query) -> QueryAnswer:
        """query(), with the mode served (_query_answer), a span `index query` when tracing:
        the mode, top_k, whether a filter applies, the hits, never the query or filter text."""
        if not tracing.ENABLED:
            return await self._query_answer(query)
        with tracing.span(
            "index query",
            model=self.model,
            mode=query.mode.value if query.mode is not None else "auto",
            top_k=effective_top_k(query.top_k),
            filtered=bool(query.filter),
            by="similar" if query.similar_to is not None else "data" if query.data is not None else "vector",
        ):
            answer = await self._query_answer(query)
            tracing.annotate(
                hits=len(answer.hits),
                mode_served=answer.mode.value,
                degradations=",".join(sorted({reason.value for reason, _ in answer.degradations})) or None,
            )
            return answer

    @read_operation
    async def _query_answer(self, query: Query) -> QueryAnswer:
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
        node = await read_filter(query.filter)
        degradations: list[tuple[Degradation, str]] = []
        squared = 0.0  # |q|² of a given dense query (a EUCLIDEAN space's score needs it)
        if query.data is not None:
            if query.vector is not None or query.sparse_vector is not None:
                raise InvalidArgument("query by data or by vector, not both")
            check_query_text(query.data, "data")
            try:
                vectors, served = await self._text_vectors(query.data, query.mode, degradations)
            except DwsearchError as exc:
                if not degrades(exc):
                    raise
                vectors, served = await self._without_embedder(query.data, query.mode, exc, degradations)
            if vectors.sparse is None and self.space.sparse is SparseEncoder.BM25:
                if served is QueryMode.SPARSE:
                    return QueryAnswer([], served, degradations)  # not one term in the text
                if served is QueryMode.HYBRID:
                    served = QueryMode.DENSE
        else:
            if query.vector is not None:
                # finite, before asking the embedder
                dense_vector(query.vector, None, "vector", float32=self.space.float32)
            info = await self.model_info()
            dense = None
            if query.vector is not None:
                stored, squared = self.space.query(query.vector, "vector")
                dense = dense_vector(stored, info.dimension, "vector", float32=self.space.float32)
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
        hits = await self.by_vectors(
            query.namespace, vectors, top_k, node, query.fusion, query.include, explain=query.explain
        )
        if served is QueryMode.DENSE and self.space.metric is not None:
            dimension = vectors.dense.dimensions() if vectors.dense is not None else 0
            hits = [dataclasses.replace(h, score=self.space.score(h.score, squared, dimension)) for h in hits]
        return QueryAnswer(
            [dataclasses.replace(h, document=self._external(h.document)) for h in hits], served, degradations
        )

    async def _text_vectors(
        self, text: str, mode: QueryMode | None, degradations: list[tuple[Degradation, str]]
    ) -> tuple[QueryVectors, QueryMode]:
        """A query text's vectors and the mode they serve. A BM25 space's SPARSE query needs
        no embedder, nor its Info; every other is embedded (the query's deadline, the
        model's breaker: dwsearch.retrieval.queries)."""
        if mode is QueryMode.SPARSE and self.space.sparse is SparseEncoder.BM25:
            return await self._bm25_vectors(text), QueryMode.SPARSE
        info = await self.model_info()
        if mode in (QueryMode.SPARSE, QueryMode.HYBRID) and not info.sparse_supported:
            degradations.append(_no_sparse(mode, self.model))
            mode = QueryMode.DENSE
        vectors = await self.embed_query(text, mode=mode, info=info)
        return vectors, mode or (QueryMode.HYBRID if info.sparse_supported else QueryMode.DENSE)

    async def _without_embedder(
        self,
        text: str,
        mode: QueryMode | None,
        exc: DwsearchError,
        degradations: list[tuple[Degradation, str]],
    ) -> tuple[QueryVectors, QueryMode]:
        """The query's embedding is late or failing (`exc`): a space whose sparse side is
        BM25 answers with that leg alone, saying why (as chat search answers with full
        text); a query that needs the embedding is UNAVAILABLE, at the deadline."""
        if self.space.sparse is not SparseEncoder.BM25 or mode is QueryMode.DENSE:
            asked = mode.value if mode is not None else "text"
            raise Unavailable(
                f"the {asked} query needs the embedder, which did not answer in time or failed: {exc}"
            ) from exc
        degradations.append(left_out(exc))
        return await self._bm25_vectors(text), QueryMode.SPARSE

    async def without_embedder(self, text: str, known_names: Sequence[str] = ()) -> QueryVectors | None:
        """What a query of `text` has while its embedding is late or failing: a BM25
        space's sparse side alone; None where every leg needs the embedder."""
        return (
            await self._bm25_vectors(text, known_names) if self.space.sparse is SparseEncoder.BM25 else None
        )

    async def _bm25_vectors(self, text: str, known_names: Sequence[str] = ()) -> QueryVectors:
        """A BM25 space's query: its sparse side alone, from the redacted text."""
        (redacted,) = await self.redacted([text], known_names)
        weights = bm25.query_vector(redacted)
        return QueryVectors(redacted, None, SparseVector(weights, bm25.DIMENSION) if weights else None)

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
        namespace (bm25.idf)."""
        terms = [int(i) for i in sparse.indices()]
        async with self.read_pool.connection() as conn:
            total, frequencies = await store.document_frequencies(
                conn, self._scope(namespace), terms, sparse.dimensions()
            )
        weighted = {
            term: float(value) * bm25.idf(total, frequencies.get(term, 0))
            for term, value in zip(terms, sparse.values(), strict=True)
        }
        return SparseVector(weighted, sparse.dimensions())

    def _external(self, document: StoredDocument) -> StoredDocument:
        """A stored document as the space's clients know it (a EUCLIDEAN space's vector
        without its appended |x|²)."""
        if document.vector is None or self.space.metric is None:
            return document
        return dataclasses.replace(document, vector=self.space.external(document.vector))

    async def by_vectors(
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
        k = candidate_policy.per_leg(top_k, pooled=hybrid, most=MAX_TOP_K)
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
        if prefix:
            check_id(prefix, "prefix")
        if self.space.metric is not None:  # a REST index: Upstash's insertion order
            first = decode_place_cursor(cursor) if cursor else 0
            return await self._range_inserted(namespace, first, prefix, limit, include)
        after = decode_cursor(cursor) if cursor else ""
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
        self, namespace: str, first: int, prefix: str, limit: int, include: Include
    ) -> RangePage:
        """A page in insertion order from the place `first` on; the cursor holds the next
        one's place (a place never moves: a page never skips nor repeats a record that is
        there throughout, whatever is deleted or added between pages)."""
        async with self.read_pool.connection() as conn:
            documents, places = await store.range_page_inserted(
                conn,
                self._scope(namespace),
                first=first,
                prefix=prefix,
                prefix_bound=prefix_upper_bound(prefix) if prefix else None,
                limit=limit + 1,  # one more tells whether there is a next page
                include=include,
            )
        more = len(documents) > limit
        documents = [self._external(d) for d in documents[:limit]]
        return RangePage(documents, encode_place_cursor(places[limit - 1] + 1) if more else "")

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


async def recent_documents(
    pool: ReadPool | AsyncConnectionPool, namespace: str, model: str, *, limit: int, snippet: int
) -> list[tuple[Any, ...]]:
    """The namespace's `limit` most recently updated documents of `model`, each as (id, its
    metadata's "type" or "", updated_at, its text's first `snippet` characters, its dense
    vector). One statement that names the namespace; `pool` is the read pool. None at all:
    no such namespace, or none of its documents of `model`."""
    async with pool.connection() as conn:
        return await store.recent_documents(conn, namespace, model, limit=limit, snippet=snippet)
