"""The Upstash-Vector-compatible REST API as an ASGI (Starlette) app.

Every call is a POST of JSON to `/{endpoint}[/{namespace}]` (the index is the bearer
token's) or `/{index}/{endpoint}[/{namespace}]`, answered `{"result": …}` or
`{"error": …}`. Each index is a DocumentIndex (the gRPC IndexService's domain layer) over
its own vector space: its model column is `upstash:{name}`, and its namespaces are stored
as `{name}\\x1f{namespace}`, so no two indexes (nor the gRPC index) share a row."""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pgvector import SparseVector
from prometheus_client import Counter, Histogram
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from dwsearch.clients.embedder import EmbedderClient, Embedding, ModelInfo
from dwsearch.clients.querycache import QueryCache
from dwsearch.common import offload
from dwsearch.common.errors import (
    DeadlineExceeded,
    DwsearchError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    StartupError,
    Unauthenticated,
    Unavailable,
)
from dwsearch.index import store
from dwsearch.index.documents import (
    HALFVEC_MAX,
    MAX_BATCH,
    MAX_RANGE_LIMIT,
    MAX_TOP_K,
    SCOPED_NAMESPACE_SEPARATOR,
    Document,
    Fusion,
    Include,
    MetadataMode,
    Query,
    QueryMode,
    StoredDocument,
)
from dwsearch.index.index import DocumentIndex, QueryVectors
from dwsearch.index.metadata import merge_patch
from dwsearch.rest import bm25
from dwsearch.rest.config import RestIndexConfig

log = logging.getLogger(__name__)

REST_REQUESTS = Counter(
    "dwsearch_rest_requests_total",
    "REST API (Upstash-compatible) calls, by index, endpoint and HTTP status",
    ["index", "endpoint", "status"],
)
REST_SECONDS = Histogram(
    "dwsearch_rest_request_seconds",
    "REST API call handling time",
    ["endpoint"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)

NAMESPACE_SEPARATOR = SCOPED_NAMESPACE_SEPARATOR
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
SMALL_BODY_BYTES = 1024 * 1024
"""Every endpoint but upsert: ids, a query, a filter, one document's update."""
RESULT_ITEM_COST = 256
"""What serializing one result costs, in characters (offload.INLINE_MAX_SIZE's unit)."""
JSON_INLINE_BYTES = 64 * 1024
"""A larger body is parsed, and a larger result serialized, in the CPU pool."""

FUSIONS = {"RRF": Fusion.RRF, "DBSF": Fusion.DBSF}

_STATUS: tuple[tuple[type[DwsearchError], int], ...] = (
    (InvalidArgument, 400),
    (FailedPrecondition, 400),
    (NotFound, 404),
    (Unauthenticated, 401),
    (PermissionDenied, 403),
    (ResourceExhausted, 429),
    (Unavailable, 503),
    (DeadlineExceeded, 504),
)


class PayloadTooLarge(DwsearchError):
    pass


SPARSE_DIMENSION = 1_000_000_000
"""pgvector's largest sparsevec dimension: sparse indices are 0..999,999,999."""
PLACEHOLDER_DENSE = [0.0]
"""A SPARSE index's rows still fill the dense column (NOT NULL): one zero, never read."""


def stored_dimension(config: RestIndexConfig) -> int:
    """EUCLIDEAN stores each vector with its squared norm appended (see RestIndex.vector);
    a SPARSE index stores PLACEHOLDER_DENSE."""
    if config.type == "SPARSE":
        return len(PLACEHOLDER_DENSE)
    return config.dimension + (config.metric == "EUCLIDEAN")


class FixedSpaceIndex(DocumentIndex):
    """A DocumentIndex whose vectors come with the requests: its 'model' is the index's
    own vector space (a dimension, no embedder)."""

    def __init__(self, pool: AsyncConnectionPool, config: RestIndexConfig, *, redact: bool) -> None:
        # No embedder: model_info is the index's own, and every vector comes with its request.
        super().__init__(pool, None, model=f"upstash:{config.name}", redact=redact)  # type: ignore[arg-type]  # no embedder
        self._fixed = ModelInfo(
            model_id=self.model, revision="", backend="", dimension=stored_dimension(config), max_input_tokens=0,
            sparse_supported=config.type != "DENSE",
            sparse_dimension=SPARSE_DIMENSION if config.type != "DENSE" else 0, device="", dtype="float16",
        )  # fmt: skip

    async def model_info(self, *, fresh: bool = False) -> ModelInfo:
        return self._fixed


DEFAULT_RESUMABLE_IDLE_S = 3600
MAX_RESUMABLE_IDLE_S = 86400
MAX_RESUMABLE_QUERIES = 10_000
"""Open resumable queries per index (each holds its request, at most SMALL_BODY_BYTES)."""


@dataclass
class _Resumable:
    namespace: str
    body: dict[str, Any]
    returned: int
    max_idle: float
    used: float


class Bm25Sparse(DocumentIndex):
    """A DocumentIndex (alone, or before FixedSpaceIndex) whose sparse vectors come from
    dwsearch.rest.bm25 instead of the embedder; its dense ones from the embedder
    (dense_from_embedder) or none (a SPARSE index)."""

    dense_from_embedder = True

    async def model_info(self, *, fresh: bool = False) -> ModelInfo:
        info = await super().model_info(fresh=fresh)
        return dataclasses.replace(info, sparse_supported=True, sparse_dimension=bm25.DIMENSION)

    async def _embed_documents(
        self, texts: Sequence[str], info: ModelInfo, *, sparse: bool
    ) -> list[Embedding]:
        if self.dense_from_embedder:
            dense_only = dataclasses.replace(info, sparse_supported=False, sparse_dimension=0)
            embeddings = await super()._embed_documents(texts, dense_only, sparse=False)
        else:
            placeholder = np.asarray(PLACEHOLDER_DENSE, dtype=np.float32)
            embeddings = [Embedding(placeholder, None, 0, False) for _ in texts]
        return [
            Embedding(e.dense, bm25.document_vector(text), e.token_count, e.truncated)
            for e, text in zip(embeddings, texts, strict=True)
        ]

    async def embed_query(
        self, text: str, *, known_names: Sequence[str] = (), mode: QueryMode | None = None
    ) -> QueryVectors:
        dense = None
        if mode is not QueryMode.SPARSE and self.dense_from_embedder:
            vectors = await super().embed_query(text, known_names=known_names, mode=QueryMode.DENSE)
            redacted, dense = vectors.text, vectors.dense
        else:
            (redacted,) = await self.redacted([text], known_names)
        weights = bm25.query_vector(redacted) if mode is not QueryMode.DENSE else {}
        return QueryVectors(redacted, dense, SparseVector(weights, bm25.DIMENSION) if weights else None)


class Bm25DocumentIndex(Bm25Sparse):
    pass


class Bm25SparseIndex(Bm25Sparse, FixedSpaceIndex):
    dense_from_embedder = False


class RestIndex:
    """One [[index]]: the Upstash semantics (vector checks, score normalisation, the
    response shapes) over its DocumentIndex."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        config: RestIndexConfig,
        *,
        redact: bool,
        embedder: EmbedderClient | None = None,
        embed_model: str = "",
        query_cache: QueryCache | None = None,
    ) -> None:
        self.config = config
        self.embedded = bool(config.dense_model or config.sparse_model)
        self.bm25 = config.sparse_model == bm25.MODEL_NAME
        self.domain: DocumentIndex
        if config.dense_model:
            # The served model's vector space, shared with the gRPC index (the namespaces
            # keep the documents apart); the embedder must serve embed_model.
            assert embedder is not None
            kind = Bm25DocumentIndex if self.bm25 else DocumentIndex
            self.domain = kind(pool, embedder, model=embed_model, redact=redact, query_cache=query_cache)
        elif config.sparse_model and not self.bm25:
            # SPARSE from the served model's own sparse output.
            assert embedder is not None
            self.domain = DocumentIndex(
                pool, embedder, model=embed_model, redact=redact, query_cache=query_cache
            )
        else:
            self.domain = (Bm25SparseIndex if self.bm25 else FixedSpaceIndex)(pool, config, redact=redact)
        self._resumable: dict[str, _Resumable] = {}

    # --- namespaces and vectors ------------------------------------------------------

    def stored(self, namespace: str) -> str:
        return f"{self.config.name}{NAMESPACE_SEPARATOR}{namespace}"

    async def namespaces(self) -> dict[str, int]:
        async with self.domain.pool.connection() as conn:
            counts = await store.counts(conn, self.domain.model)
        prefix = self.stored("")
        found = {ns[len(prefix) :]: n for ns, n in counts.items() if ns.startswith(prefix)}
        return {"": 0, **found} if "" not in found else found

    async def dimension(self) -> int:
        """The index's dimension: configured, or the embedding model's (0: SPARSE)."""
        if isinstance(self.domain, FixedSpaceIndex):
            return self.config.dimension
        info = await self.domain.model_info()
        if self.config.dimension and self.config.dimension != info.dimension:
            raise FailedPrecondition(
                f"the index's dimension is {self.config.dimension}; its model {info.model_id!r} has {info.dimension}"
            )
        return info.dimension

    def vector(self, values: Any, where: str, dimension: int) -> list[float]:
        """A document's vector as stored. The store ranks by inner product, so:
        - COSINE: the unit vector (inner product = cosine);
        - DOT_PRODUCT: as given;
        - EUCLIDEAN: x with |x|² appended; the query q is sent as (2q, -1), so the inner
          product is 2q·x - |x|² = |q|² - |q - x|², which ranks by distance."""
        vector = self._checked(values, where, dimension)
        if self.config.metric == "EUCLIDEAN":
            return [*vector, self._squared_norm(vector, where)]
        return vector

    def query_vector(self, values: Any, where: str, dimension: int) -> tuple[list[float], float]:
        """The query vector as sent to the store, and |q|² (EUCLIDEAN's score needs it)."""
        vector = self._checked(values, where, dimension)
        if self.config.metric == "EUCLIDEAN":
            return [*(2 * v for v in vector), -1.0], self._squared_norm(vector, where)
        return vector, 0.0

    def external(self, stored: list[float]) -> list[float]:
        return stored[:-1] if self.config.metric == "EUCLIDEAN" else stored

    @staticmethod
    def _squared_norm(vector: Sequence[float], where: str) -> float:
        squared = math.fsum(v * v for v in vector)
        if not squared <= HALFVEC_MAX:
            raise InvalidArgument(f"{where}: |v|² is over {HALFVEC_MAX:g}, the most a EUCLIDEAN index stores")
        return squared

    def _checked(self, values: Any, where: str, dimension: int) -> list[float]:
        if not isinstance(values, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
        ):
            raise InvalidArgument(f"{where}: a list of numbers")
        if len(values) != dimension:
            raise InvalidArgument(f"Invalid vector dimension: {len(values)}, expected: {dimension}")
        if self.config.metric == "COSINE":
            norm = math.sqrt(math.fsum(float(v) * float(v) for v in values))
            if not math.isfinite(norm):
                raise InvalidArgument(f"{where}: not finite (NaN or infinity)")
            if norm == 0:
                raise InvalidArgument(f"{where}: a zero vector has no cosine similarity")
            return [float(v) / norm for v in values]
        return [float(v) for v in values]

    def score(self, inner_product: float, query_squared_norm: float) -> float:
        """Upstash's normalised score: (1 + cos) / 2, (1 + dot) / 2, 1 / (1 + |q - x|²)."""
        if self.config.metric == "EUCLIDEAN":
            return 1.0 / (1.0 + max(0.0, query_squared_norm - inner_product))
        return (1.0 + inner_product) / 2.0

    @property
    def has_dense(self) -> bool:
        return self.config.type != "SPARSE"

    @property
    def has_sparse(self) -> bool:
        return self.config.type != "DENSE"

    def reject_sparse(self, body: Mapping[str, Any]) -> None:
        if body.get("sparseVector") is not None and not self.has_sparse:
            raise InvalidArgument("This index does not support sparse vectors")

    def vectors(
        self, item: Mapping[str, Any], where: str, dimension: int
    ) -> tuple[list[float], dict[int, float] | None]:
        """A document's dense vector as stored and its sparse one: what the index's type needs."""
        self.reject_sparse(item)
        dense, sparse = item.get("vector"), item.get("sparseVector")
        if not self.has_dense and dense is not None:
            raise InvalidArgument("This index does not support dense vectors")
        if self.has_dense and dense is None:
            raise InvalidArgument("This index requires dense vectors")
        if self.has_sparse and sparse is None:
            raise InvalidArgument("This index requires sparse vectors")
        stored = (
            self.vector(dense, f"{where}.vector", dimension) if dense is not None else list(PLACEHOLDER_DENSE)
        )
        return stored, parse_sparse(sparse, f"{where}.sparseVector") if sparse is not None else None

    # --- endpoints -------------------------------------------------------------------

    async def upsert(self, namespace: str, body: Any) -> str:
        items = body if isinstance(body, list) else [body]
        documents = []
        dimension = await self.dimension()
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise InvalidArgument(f"vectors[{i}]: an object")
            dense, sparse = self.vectors(item, f"vectors[{i}]", dimension)
            documents.append(_document(item, dense, i, sparse))
        await self.domain.upsert(self.stored(namespace), documents)
        return "Success"

    async def upsert_data(self, namespace: str, body: Any) -> str:
        """Documents embedded by the EmbedderService (redacted first, as every index write)."""
        self.require_model()
        items = body if isinstance(body, list) else [body]
        documents = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise InvalidArgument(f"vectors[{i}]: an object")
            data = item.get("data")
            if not isinstance(data, str) or not data.strip():
                raise InvalidArgument(f"vectors[{i}].data: a non-empty string")
            documents.append(_document(item, None, i))
        await self.domain.upsert(self.stored(namespace), documents)
        return "Success"

    def require_model(self) -> None:
        if not self.embedded:
            raise InvalidArgument(
                "Embedding data for this index is not allowed. The index must be created with an embedding model to use it."
            )

    async def query(self, namespace: str, body: Any) -> Any:
        if isinstance(body, list):
            if not 1 <= len(body) <= MAX_BATCH:
                raise InvalidArgument(f"queries: 1 to {MAX_BATCH}")
            return [await self._query_one(namespace, q) for q in body]
        return await self._query_one(namespace, body)

    async def resumable_query(self, namespace: str, body: Any) -> dict[str, Any]:
        """A query that later calls continue (resumable-query-next): its request kept here,
        re-run for top_k = what it returned + additionalK (at most MAX_TOP_K in all)."""
        body = _object(body)
        max_idle = body.get("maxIdle", DEFAULT_RESUMABLE_IDLE_S)
        if (
            not isinstance(max_idle, (int, float))
            or isinstance(max_idle, bool)
            or not 0 < max_idle <= MAX_RESUMABLE_IDLE_S
        ):
            raise InvalidArgument(f"maxIdle: 1 to {MAX_RESUMABLE_IDLE_S} seconds")
        scores = await self._query_one(namespace, body)
        self._expire()
        if len(self._resumable) >= MAX_RESUMABLE_QUERIES:
            raise ResourceExhausted(f"{MAX_RESUMABLE_QUERIES} resumable queries are open; end some")
        uid = str(uuid.uuid4())
        self._resumable[uid] = _Resumable(
            namespace, dict(body), len(scores), float(max_idle), time.monotonic()
        )
        return {"uuid": uid, "scores": scores}

    async def resumable_next(self, body: Any) -> list[dict[str, Any]]:
        body = _object(body)
        self._expire()
        state = self._resumable.get(_str(body.get("uuid"), "uuid"))
        if state is None:
            raise NotFound("Resumable query not found (ended, or idle past its maxIdle)")
        additional = _int(body.get("additionalK"), "additionalK")
        if additional < 1:
            raise InvalidArgument("additionalK: at least 1")
        top_k = min(MAX_TOP_K, state.returned + additional)
        scores = (
            await self._query_one(state.namespace, {**state.body, "topK": top_k})
            if top_k > state.returned
            else []
        )
        page = scores[state.returned :]
        state.returned += len(page)
        state.used = time.monotonic()
        return page

    async def resumable_end(self, body: Any) -> str:
        body = _object(body)
        if self._resumable.pop(_str(body.get("uuid"), "uuid"), None) is None:
            raise NotFound("Resumable query not found (ended, or idle past its maxIdle)")
        return "Success"

    def _expire(self) -> None:
        now = time.monotonic()
        for uid in [u for u, state in self._resumable.items() if now - state.used > state.max_idle]:
            del self._resumable[uid]

    async def _query_one(self, namespace: str, body: Any) -> list[dict[str, Any]]:
        if not isinstance(body, dict):
            raise InvalidArgument("query: an object")
        self.reject_sparse(body)
        mode = self.query_mode(body.get("queryMode"))
        fusion = FUSIONS.get(str(body.get("fusionAlgorithm", "RRF")).upper())
        if fusion is None:
            raise InvalidArgument(f"fusionAlgorithm {body.get('fusionAlgorithm')}: RRF or DBSF")
        weighting = body.get("weightingStrategy")
        if weighting is not None and str(weighting).upper() != "IDF":
            raise InvalidArgument(f"weightingStrategy {weighting}: IDF")
        data = body.get("data")
        vector, squared, sparse = None, 0.0, None
        if data is not None:
            self.require_model()
            if body.get("vector") is not None or body.get("sparseVector") is not None:
                raise InvalidArgument("query by data or by vectors, not both")
            if self.has_sparse:
                # Embedded here, so that the sparse part can be IDF-weighted before the search.
                vectors = await self.domain.embed_query(_str(data, "data"), mode=mode)
                data = None
                vector = vectors.dense.to_list() if vectors.dense is not None else None
                if vectors.sparse is not None:
                    sparse = dict(zip(vectors.sparse.indices(), vectors.sparse.values(), strict=True))
                if sparse is None and mode is QueryMode.SPARSE:
                    return []  # no term in the text
                if sparse is None and mode is QueryMode.HYBRID:
                    mode = QueryMode.DENSE
                if self.bm25:
                    weighting = "IDF"  # BM25's IDF is applied at query time
        else:
            if body.get("vector") is not None:
                if not self.has_dense:
                    raise InvalidArgument("This index does not support dense vectors")
                vector, squared = self.query_vector(body["vector"], "vector", await self.dimension())
            if body.get("sparseVector") is not None:
                sparse = parse_sparse(body["sparseVector"], "sparseVector")
            if mode is not QueryMode.SPARSE and self.has_dense and vector is None:
                raise InvalidArgument("This index requires dense vectors")
            if mode is not QueryMode.DENSE and self.has_sparse and sparse is None:
                raise InvalidArgument("This index requires sparse vectors")
            if mode is QueryMode.DENSE:
                sparse = None
            elif mode is QueryMode.SPARSE:
                vector = None
        namespace = self.stored(namespace)
        if sparse is not None and weighting is not None:
            sparse = await self.idf_weighted(namespace, sparse)
        include = _include(body)
        hits = await self.domain.query(
            Query(
                namespace=namespace,
                data=_str(data, "data") if data is not None else None,
                vector=vector,
                sparse_vector=sparse,
                top_k=_int(body.get("topK", 10), "topK"),
                filter=_str(body.get("filter", ""), "filter"),
                mode=mode,
                fusion=fusion,
                include=include,
            )
        )
        # Dense scores normalised per metric; sparse (inner product) and fused ones as they are.
        dense_only = mode is QueryMode.DENSE
        return [
            self.shape(
                hit.document, include, score=self.score(hit.score, squared) if dense_only else hit.score
            )
            for hit in hits
        ]

    def query_mode(self, name: Any) -> QueryMode:
        """The mode a query runs in: the index's type decides, queryMode picks within HYBRID."""
        if not self.has_sparse:
            if name not in (None, "DENSE"):
                raise InvalidArgument(f"queryMode {name}: this index has only dense vectors")
            return QueryMode.DENSE
        if not self.has_dense:
            if name not in (None, "SPARSE"):
                raise InvalidArgument(f"queryMode {name}: this index has only sparse vectors")
            return QueryMode.SPARSE
        modes = {
            None: QueryMode.HYBRID,
            "HYBRID": QueryMode.HYBRID,
            "DENSE": QueryMode.DENSE,
            "SPARSE": QueryMode.SPARSE,
        }
        if name not in modes:
            raise InvalidArgument(f"queryMode {name}: HYBRID, DENSE or SPARSE")
        return modes[name]

    async def idf_weighted(self, namespace: str, sparse: Mapping[int, float]) -> dict[int, float]:
        """weightingStrategy IDF: each query value times the term's inverse document frequency
        in the namespace, log((N - n + 0.5) / (n + 0.5) + 1), as Upstash weighs BM25 queries."""
        total, frequencies = await self.domain.document_frequencies(namespace, list(sparse))
        return {
            term: value
            * math.log((total - frequencies.get(term, 0) + 0.5) / (frequencies.get(term, 0) + 0.5) + 1)
            for term, value in sparse.items()
        }

    def shape(
        self, document: StoredDocument, include: Include, *, score: float | None = None
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"id": document.id}
        if score is not None:
            out["score"] = score
        if include.vectors and document.vector is not None and self.has_dense:
            out["vector"] = self.external(document.vector)
        if include.vectors and document.sparse_vector is not None:
            indices = sorted(document.sparse_vector)
            out["sparseVector"] = {"indices": indices, "values": [document.sparse_vector[i] for i in indices]}
        if include.metadata:
            out["metadata"] = document.metadata or {}
        if include.data and document.data:
            out["data"] = document.data
        return out

    async def fetch(self, namespace: str, body: Any) -> list[dict[str, Any] | None]:
        body = _object(body)
        include = _include(body)
        if body.get("prefix") is not None:
            page = await self.domain.range(
                self.stored(namespace),
                include=include,
                limit=MAX_RANGE_LIMIT,
                prefix=_str(body["prefix"], "prefix"),
            )
            return [self.shape(d, include) for d in page.documents]
        ids = _ids(body.get("ids"))
        found, _ = await self.domain.fetch(self.stored(namespace), ids, include)
        by_id = {d.id: d for d in found}
        return [self.shape(by_id[i], include) if i in by_id else None for i in ids]

    async def range(self, namespace: str, body: Any) -> dict[str, Any]:
        body = _object(body)
        include = _include(body)
        cursor = _str(body.get("cursor", ""), "cursor")
        page = await self.domain.range(
            self.stored(namespace),
            include=include,
            cursor="" if cursor in ("", "0") else cursor,
            limit=_int(body.get("limit", 0), "limit"),
            prefix=_str(body.get("prefix", ""), "prefix"),
        )
        return {"nextCursor": page.next_cursor, "vectors": [self.shape(d, include) for d in page.documents]}

    async def delete(self, namespace: str, body: Any) -> dict[str, int]:
        if isinstance(body, (list, str)):
            body = {"ids": body}
        body = _object(body)
        ids = body.get("ids")
        deleted = await self.domain.delete(
            self.stored(namespace),
            ids=_ids(ids) if ids is not None else None,
            prefix=_str(body["prefix"], "prefix") if body.get("prefix") is not None else None,
            filter=_str(body["filter"], "filter") if body.get("filter") is not None else None,
        )
        return {"deleted": deleted}

    async def update(self, namespace: str, body: Any) -> dict[str, int]:
        body = _object(body)
        self.reject_sparse(body)
        doc_id = _str(body.get("id"), "id")
        mode_name = str(body.get("metadataUpdateMode", "OVERWRITE")).upper()
        if mode_name not in ("PATCH", "OVERWRITE"):
            raise InvalidArgument(f"metadataUpdateMode {mode_name}: PATCH or OVERWRITE")
        mode = MetadataMode.PATCH if mode_name == "PATCH" else MetadataMode.OVERWRITE
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidArgument("metadata: an object")
        vector, data, sparse = body.get("vector"), body.get("data"), body.get("sparseVector")
        stored = self.stored(namespace)
        if self.embedded and vector is None and sparse is None and data is not None:
            # New text: redacted, re-embedded and stored, in one transaction.
            updated = await self.domain.update(
                stored, doc_id, metadata=metadata, mode=mode, data=_str(data, "data")
            )
            return {"updated": int(updated)}
        if vector is None and sparse is None and data is None:
            if metadata is None:
                raise InvalidArgument("nothing to update: give vector, data or metadata")
            updated = await self.domain.update(stored, doc_id, metadata=metadata, mode=mode)
            return {"updated": int(updated)}
        # A new vector or text: the document read and written back whole (not atomic with
        # a concurrent update of the same id).
        if vector is not None and not self.has_dense:
            raise InvalidArgument("This index does not support dense vectors")
        new_vector = self.vector(vector, "vector", await self.dimension()) if vector is not None else None
        new_sparse = parse_sparse(sparse, "sparseVector") if sparse is not None else None
        found, _ = await self.domain.fetch(stored, [doc_id], Include(data=True, metadata=True, vectors=True))
        if not found:
            return {"updated": 0}
        current = found[0]
        new_metadata = current.metadata or {}
        if metadata is not None:
            new_metadata = merge_patch(new_metadata, metadata) if mode is MetadataMode.PATCH else metadata
        await self.domain.upsert(
            stored,
            [
                Document(
                    id=doc_id,
                    data=_str(data, "data") if data is not None else (current.data or ""),
                    metadata=new_metadata,
                    vector=new_vector if new_vector is not None else current.vector,
                    sparse_vector=new_sparse if new_sparse is not None else current.sparse_vector,
                )
            ],
        )
        return {"updated": 1}

    async def reset(self, namespace: str, *, everything: bool) -> str:
        if everything:
            for name in await self.namespaces():
                await self.domain.clear(self.stored(name))
        else:
            await self.domain.clear(self.stored(namespace))
        return "Success"

    async def info(self) -> dict[str, Any]:
        namespaces = await self.namespaces()
        metric, dimension = self.config.metric, await self.dimension()
        return {
            "vectorCount": sum(namespaces.values()),
            "pendingVectorCount": 0,
            "indexSize": 0,
            "dimension": dimension,
            "similarityFunction": metric,
            "indexType": self.config.type,
            **(
                {
                    "denseIndex": {
                        "dimension": dimension,
                        "similarityFunction": metric,
                        "embeddingModel": self.domain.model if self.embedded else "",
                    }
                }
                if self.has_dense
                else {}
            ),
            **({"sparseIndex": {"embeddingModel": self.sparse_model_name()}} if self.has_sparse else {}),
            "namespaces": {ns: {"vectorCount": n, "pendingVectorCount": 0} for ns, n in namespaces.items()},
        }

    def sparse_model_name(self) -> str:
        if self.bm25:
            return bm25.MODEL_NAME
        return self.domain.model if self.config.sparse_model else ""

    async def list_namespaces(self) -> list[str]:
        return sorted(await self.namespaces())

    async def delete_namespace(self, namespace: str) -> str:
        if namespace == "":
            raise InvalidArgument("Cannot delete the default namespace")
        if namespace not in await self.namespaces():
            raise NotFound(f"Namespace {namespace} does not exist")
        await self.domain.clear(self.stored(namespace))
        return "Success"


# --- request fields ------------------------------------------------------------------


def _object(body: Any) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise InvalidArgument("the request body: a JSON object")
    return body


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{where}: a string")
    return value


def _int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{where}: an integer")
    return value


def _ids(value: Any) -> list[str]:
    ids = [value] if isinstance(value, str) else value
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise InvalidArgument("ids: a list of strings")
    return ids


def _include(body: Mapping[str, Any]) -> Include:
    return Include(
        data=bool(body.get("includeData")),
        metadata=bool(body.get("includeMetadata")),
        vectors=bool(body.get("includeVectors")),
    )


def parse_sparse(value: Any, where: str) -> dict[int, float]:
    """Upstash's {indices, values} as {index: value}; the index's own checks (range,
    finite values, entry count) follow in DocumentIndex."""
    if not isinstance(value, dict):
        raise InvalidArgument(f"{where}: an object with indices and values")
    indices, values = value.get("indices"), value.get("values")
    if not isinstance(indices, list) or not isinstance(values, list) or len(indices) != len(values):
        raise InvalidArgument(f"{where}: indices and values, two lists of one length")
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indices):
        raise InvalidArgument(f"{where}: indices: non-negative integers")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise InvalidArgument(f"{where}: values: numbers")
    weights = {i: float(v) for i, v in zip(indices, values, strict=True)}
    if len(weights) != len(indices):
        raise InvalidArgument(f"{where}: an index given twice")
    return weights


def _document(
    item: Mapping[str, Any], vector: Sequence[float] | None, i: int, sparse: Mapping[int, float] | None = None
) -> Document:
    metadata = item.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidArgument(f"vectors[{i}].metadata: an object")
    data = item.get("data")
    return Document(
        id=_str(item.get("id"), f"vectors[{i}].id"),
        data=_str(data, f"vectors[{i}].data") if data is not None else "",
        metadata=metadata or {},
        vector=vector,
        sparse_vector=sparse,
    )


# --- the app ---------------------------------------------------------------------------


class RestApi:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        configs: Sequence[RestIndexConfig],
        *,
        redact: bool = True,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        embedder: EmbedderClient | None = None,
        embed_model: str = "",
        query_cache: QueryCache | None = None,
    ) -> None:
        for c in configs:
            for model in (c.dense_model, "" if c.sparse_model == bm25.MODEL_NAME else c.sparse_model):
                if model and model not in ("default", embed_model):
                    raise StartupError(
                        f"DWSEARCH_REST_INDEXES: index {c.name!r}: model {model!r}; the embedder serves "
                        f'{embed_model!r} (DWSEARCH_EMBED_MODEL): use that, "default" or, for sparse_model, "BM25"'
                    )
            if c.dense_model and c.dense_model not in ("default", embed_model):
                raise StartupError(
                    f"DWSEARCH_REST_INDEXES: index {c.name!r}: dense_model {c.dense_model!r}; the embedder serves "
                    f'{embed_model!r} (DWSEARCH_EMBED_MODEL): use that or "default"'
                )
            if (c.dense_model or (c.sparse_model and c.sparse_model != bm25.MODEL_NAME)) and embedder is None:
                raise StartupError(f"DWSEARCH_REST_INDEXES: index {c.name!r}: dense_model needs the embedder")
        self.indexes = {
            c.name: RestIndex(
                pool, c, redact=redact, embedder=embedder, embed_model=embed_model, query_cache=query_cache
            )
            for c in configs
        }
        self.tokens = [(token.encode(), self.indexes[c.name]) for c in configs for token in c.tokens]
        self.max_body_bytes = max_body_bytes

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self.handle, methods=["GET", "POST"])])

    def _route(self, request: Request) -> tuple[RestIndex, str, str]:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        given = token.strip().encode()
        index = None
        if scheme.lower() == "bearer":
            for candidate, owner in self.tokens:  # each compared in constant time
                if hmac.compare_digest(given, candidate):
                    index = owner
        if index is None:
            raise Unauthenticated("Unauthorized: Invalid auth token")
        segments = request.path_params["path"].split("/", 1)
        head = segments[0]
        if head in self.indexes and head not in ENDPOINTS:
            if self.indexes[head] is not index:
                raise Unauthenticated("Unauthorized: Invalid auth token")
            segments = segments[1].split("/", 1) if len(segments) > 1 else [""]
        endpoint = segments[0]
        namespace = segments[1] if len(segments) > 1 else ""
        if endpoint not in ENDPOINTS:
            raise NotFound(f"Not found: /{request.path_params['path']}")
        return index, endpoint, namespace

    async def _body(self, request: Request, limit: int) -> Any:
        size = int(request.headers.get("content-length") or 0)
        if size > limit:
            raise PayloadTooLarge(f"the request body: {size} bytes; the limit is {limit}")
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise PayloadTooLarge(f"the request body: over the limit of {limit} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw.strip():
            return None
        try:
            if len(raw) <= JSON_INLINE_BYTES:
                return json.loads(raw)
            return await offload.run(json.loads, raw, size=len(raw))
        except (ValueError, RecursionError):
            raise InvalidArgument("the request body: not JSON") from None

    async def handle(self, request: Request) -> Response:
        started = time.perf_counter()
        labels = {"index": "", "endpoint": "unknown"}  # bounded: configured names and ENDPOINTS only
        response = await self._handle(request, labels)
        REST_REQUESTS.labels(labels["index"], labels["endpoint"], str(response.status_code)).inc()
        REST_SECONDS.labels(labels["endpoint"]).observe(time.perf_counter() - started)
        return response

    async def _handle(self, request: Request, labels: dict[str, str]) -> Response:
        try:
            index, endpoint, namespace = self._route(request)
            labels.update(index=index.config.name, endpoint=endpoint)
            # Writes and batch queries may be large; everything else is ids, one query, a filter.
            large = endpoint in ("upsert", "upsert-data", "query", "query-data")
            limit = self.max_body_bytes if large else SMALL_BODY_BYTES
            body = await self._body(request, limit)
            result = await self._dispatch(index, endpoint, namespace, body, request)
            # Many documents (vectors above all) are serialized in the CPU pool.
            size = len(result) * RESULT_ITEM_COST if isinstance(result, list) else 0
            return await _json(200, {"result": result}, size=size)
        except PayloadTooLarge as e:
            return await _json(413, {"error": str(e)})
        except DwsearchError as e:
            status = next((code for kind, code in _STATUS if isinstance(e, kind)), 500)
            if status == 500:
                log.error("REST call failed", extra={"component": "rest", "error": type(e).__name__})
                return await _json(500, {"error": "internal error"})
            return await _json(status, {"error": str(e)})
        except Exception:
            log.exception("REST call failed", extra={"component": "rest"})
            return await _json(500, {"error": "internal error"})

    async def _dispatch(
        self, index: RestIndex, endpoint: str, namespace: str, body: Any, request: Request
    ) -> Any:
        if endpoint == "upsert":
            return await index.upsert(namespace, body)
        if endpoint == "query":
            _no_data(body)
            return await index.query(namespace, body)
        if endpoint == "fetch":
            return await index.fetch(namespace, body)
        if endpoint == "range":
            return await index.range(namespace, body)
        if endpoint == "delete":
            return await index.delete(namespace, body)
        if endpoint == "update":
            return await index.update(namespace, body)
        if endpoint == "reset":
            return await index.reset(namespace, everything="all" in request.query_params)
        if endpoint == "resumable-query":
            _no_data(body)
            return await index.resumable_query(namespace, body)
        if endpoint == "resumable-query-next":
            return await index.resumable_next(body)
        if endpoint == "resumable-query-end":
            return await index.resumable_end(body)
        if endpoint == "info":
            return await index.info()
        if endpoint == "list-namespaces":
            return await index.list_namespaces()
        if endpoint == "delete-namespace":
            return await index.delete_namespace(namespace)
        if endpoint == "upsert-data":
            return await index.upsert_data(namespace, body)
        if endpoint == "query-data":
            index.require_model()
            return await index.query(namespace, body)
        if endpoint == "resumable-query-data":
            index.require_model()
            return await index.resumable_query(namespace, body)
        raise InvalidArgument(f"/{endpoint}: not supported by dwsearch yet")


def _no_data(body: Any) -> None:
    for query in body if isinstance(body, list) else [body]:
        if isinstance(query, dict) and query.get("data") is not None:
            raise InvalidArgument("a query by data goes to /query-data")


ENDPOINTS = frozenset({
    "upsert", "upsert-data", "query", "query-data", "fetch", "range", "delete", "update", "reset", "info",
    "list-namespaces", "delete-namespace", "resumable-query", "resumable-query-data", "resumable-query-next",
    "resumable-query-end",
})  # fmt: skip


def _dumps(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


async def _json(status: int, payload: Any, *, size: int = 0) -> Response:
    body = await offload.run(_dumps, payload, size=size) if size else _dumps(payload)
    return Response(body, status_code=status, media_type="application/json")
