"""The Upstash Vector semantics of one REST index: its requests (Upstash's JSON) turned
into DocumentIndex calls, and their answers into Upstash's JSON.

Each index is one DocumentIndex over its own VectorSpace (dwsearch.index.space): the
served model's (dense_model / sparse_model "default"), BM25's, or its own fixed dimension
(vectors come with the requests: the model column is `upstash:{name}`). The metric, its
vector maps and score normalisation, the encoders and IDF weighting all belong to the
space; here are the Upstash request checks and response shapes. Its namespaces are stored
as `{name}\\x1f{namespace}`, so no two indexes (nor the gRPC index) share a row."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dwsearch.common import offload
from dwsearch.common.errors import FailedPrecondition, InvalidArgument, NotFound, StartupError
from dwsearch.index.document_index import DocumentIndex, IndexParts
from dwsearch.index.documents import (
    MAX_BATCH,
    MAX_RANGE_LIMIT,
    SCOPED_NAMESPACE_SEPARATOR,
    DenseValues,
    Document,
    Fusion,
    HitExplanation,
    Include,
    MetadataMode,
    Query,
    QueryMode,
    StoredDocument,
    Weighting,
)
from dwsearch.index.space import PLACEHOLDER_DENSE, Metric, SparseEncoder, VectorSpace
from dwsearch.rest.encode import Float32s
from dwsearch.rest.indexfile import RestIndexConfig
from dwsearch.rest.resumable import ResumableBudget, ResumableQueries
from dwsearch.retrieval import bm25
from dwsearch.retrieval.degradation import Degradation

NAMESPACE_SEPARATOR = SCOPED_NAMESPACE_SEPARATOR
FUSIONS = {"RRF": Fusion.RRF, "DBSF": Fusion.DBSF}


QUERY_SLOTS_RESERVE = 2
"""Pool connections the REST indexes' filtered statements never take (their query slots):
what stays for every other caller of the pool while they are busy."""


@dataclass(frozen=True)
class RestIndexes:
    """The REST API's indexes (DWSEARCH_REST_INDEXES' [[index]]s) by name, and the budget
    of open resumable queries they share."""

    by_name: dict[str, RestIndex]
    resumable_budget: ResumableBudget


DEGRADED_HEADER = "Dwsearch-Degraded"
"""The response header that says a query's answer is less than it asked for, and why: the
reasons (dwsearch.retrieval.degradation's values, e.g. embedder_timeout), comma-separated.
Upstash's JSON has no field for it, and its SDKs ignore headers they do not know."""

_degradations: contextvars.ContextVar[list[Degradation] | None] = contextvars.ContextVar(
    "rest_degradations", default=None
)


def collect_degradations() -> contextvars.Token[list[Degradation] | None]:
    """Start collecting the degradations of the request handled in this context (the REST
    app, around each request); reset with the token returned."""
    return _degradations.set([])


def degraded_header(token: contextvars.Token[list[Degradation] | None]) -> dict[str, str]:
    """The DEGRADED_HEADER of the request collected since `token` (none: no header), and
    collecting stopped."""
    reasons = _degradations.get() or []
    _degradations.reset(token)
    names = list(dict.fromkeys(reason.value for reason in reasons))
    return {DEGRADED_HEADER: ", ".join(names)} if names else {}


def _degraded(degradations: Sequence[tuple[Degradation, str]]) -> None:
    collected = _degradations.get()
    if collected is not None:
        collected.extend(reason for reason, _ in degradations)


def build_rest_indexes(
    parts: IndexParts, configs: Sequence[RestIndexConfig], *, embed_model: str = ""
) -> RestIndexes:
    """Each [[index]] as a RestIndex over a DocumentIndex of `parts` (serve's composition
    root builds them once). Their filtered statements (KNN, delete by filter) share
    query slots: all but QUERY_SLOTS_RESERVE of the pool's connections. StartupError: an
    index naming a model the embedder does not serve, or one needing an embedder without
    one."""
    for c in configs:
        for model in (c.dense_model, "" if c.sparse_model == bm25.MODEL_NAME else c.sparse_model):
            if model and model not in ("default", embed_model):
                raise StartupError(
                    f"DWSEARCH_REST_INDEXES: index {c.name!r}: model {model!r}; the embedder serves "
                    f'{embed_model!r} (DWSEARCH_EMBED_MODEL): use that, "default" or, for sparse_model, "BM25"'
                )
        if (
            c.dense_model or (c.sparse_model and c.sparse_model != bm25.MODEL_NAME)
        ) and parts.embedder is None:
            raise StartupError(f"DWSEARCH_REST_INDEXES: index {c.name!r}: dense_model needs the embedder")
    budget = ResumableBudget()
    slots = asyncio.Semaphore(max(1, parts.pool.max_size - QUERY_SLOTS_RESERVE))
    return RestIndexes(
        {
            c.name: RestIndex(
                c, parts.index(space=vector_space(c, embed_model), query_slots=slots), resumable_budget=budget
            )
            for c in configs
        },
        budget,
    )


def vector_space(config: RestIndexConfig, embed_model: str) -> VectorSpace:
    """The index's space from its [[index]] table."""
    metric = Metric(config.metric)
    if config.dense_model:
        # The served model's space, shared with the gRPC index (the namespaces keep the
        # documents apart); its sparse side the model's own, or BM25.
        sparse = SparseEncoder.BM25 if config.sparse_model == bm25.MODEL_NAME else SparseEncoder.MODEL
        return VectorSpace(embed_model, sparse=sparse, metric=metric)
    if config.sparse_model and config.sparse_model != bm25.MODEL_NAME:
        # SPARSE from the served model's own sparse output (its dense vectors stored beside).
        return VectorSpace(embed_model, metric=metric)
    sparse = (
        SparseEncoder.BM25
        if config.sparse_model == bm25.MODEL_NAME
        else SparseEncoder.NONE
        if config.type == "DENSE"
        else SparseEncoder.GIVEN
    )
    return VectorSpace(
        f"upstash:{config.name}",
        dense_from_embedder=False,
        sparse=sparse,
        dimension=config.dimension,
        has_dense=config.type != "SPARSE",
        metric=metric,
    )


UPSERT_ITEM_COST = 64
"""What checking one upserted item costs besides its vector's numbers (offload's size unit)."""


class RestIndex:
    """One [[index]]: Upstash's requests and answers over its DocumentIndex (`domain`, made
    by build_rest_indexes from serve's IndexParts over the index's VectorSpace)."""

    def __init__(
        self, config: RestIndexConfig, domain: DocumentIndex, *, resumable_budget: ResumableBudget
    ) -> None:
        """`resumable_budget`: the process's bytes for open resumable queries (every REST
        index's)."""
        self.config = config
        self.embedded = bool(config.dense_model or config.sparse_model)
        self.bm25 = config.sparse_model == bm25.MODEL_NAME
        self.domain = domain
        self.resumable = ResumableQueries(self._query_one, budget=resumable_budget)

    # --- namespaces and vectors ------------------------------------------------------

    def stored(self, namespace: str) -> str:
        return f"{self.config.name}{NAMESPACE_SEPARATOR}{namespace}"

    async def namespaces(self) -> dict[str, int]:
        counts = await self.domain.namespaces()
        prefix = self.stored("")
        found = {ns[len(prefix) :]: n for ns, n in counts.items() if ns.startswith(prefix)}
        return {"": 0, **found} if "" not in found else found

    async def dimension(self) -> int:
        """The index's dimension: configured, or the embedding model's (0: SPARSE)."""
        if self.domain.space.fixed:
            return self.config.dimension
        info = await self.domain.model_info()
        if self.config.dimension and self.config.dimension != info.dimension:
            raise FailedPrecondition(
                f"the index's dimension is {self.config.dimension}; its model {info.model_id!r} has {info.dimension}"
            )
        return info.dimension

    @staticmethod
    def _checked(values: Any, where: str, dimension: int) -> list[float]:
        """A dense vector as Upstash checks it: numbers, of the index's dimension (the
        space maps it for its metric)."""
        if not isinstance(values, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
        ):
            raise InvalidArgument(f"{where}: a list of numbers")
        if len(values) != dimension:
            raise InvalidArgument(f"Invalid vector dimension: {len(values)}, expected: {dimension}")
        return [_float(v, where) for v in values]

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
    ) -> tuple[DenseValues, dict[int, float] | None]:
        """A document's dense vector and its sparse one: what the index's type needs. An
        upsert's body holds its vectors as float64 arrays already (dwsearch.rest.jsonbody:
        numbers, each the double float() makes of it): kept so, their dimension checked."""
        self.reject_sparse(item)
        dense, sparse = item.get("vector"), item.get("sparseVector")
        if not self.has_dense and dense is not None:
            raise InvalidArgument("This index does not support dense vectors")
        if self.has_dense and dense is None:
            raise InvalidArgument("This index requires dense vectors")
        if self.has_sparse and sparse is None:
            raise InvalidArgument("This index requires sparse vectors")
        checked: DenseValues
        if dense is None:
            checked = list(PLACEHOLDER_DENSE)
        elif isinstance(dense, np.ndarray):
            if len(dense) != dimension:
                raise InvalidArgument(f"Invalid vector dimension: {len(dense)}, expected: {dimension}")
            checked = dense
        else:
            checked = self._checked(dense, f"{where}.vector", dimension)
        return checked, parse_sparse(sparse, f"{where}.sparseVector") if sparse is not None else None

    # --- endpoints -------------------------------------------------------------------

    async def upsert(self, namespace: str, body: Any) -> str:
        items = body if isinstance(body, list) else [body]
        dimension = await self.dimension()
        # Every number of every vector checked in Python: in the CPU pool when many, so
        # that 1,000 vectors of 15,999 numbers never hold the event loop (and health).
        size = len(items) * (max(dimension, 1) + UPSERT_ITEM_COST)
        documents = await offload.run(self._documents, items, dimension, size=size)
        await self.domain.upsert(self.stored(namespace), documents)
        return "Success"

    def _documents(self, items: Sequence[Any], dimension: int) -> list[Document]:
        documents = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise InvalidArgument(f"vectors[{i}]: an object")
            dense, sparse = self.vectors(item, f"vectors[{i}]", dimension)
            documents.append(_document(item, dense, i, sparse))
        return documents

    async def upsert_data(self, namespace: str, body: Any) -> str:
        """Documents embedded by the index's space (redacted first, as every index write)."""
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
        return await self.resumable.start(namespace, _object(body))

    async def resumable_next(self, body: Any) -> list[dict[str, Any]]:
        body = _object(body)
        return await self.resumable.next(
            _str(body.get("uuid"), "uuid"), _int(body.get("additionalK"), "additionalK")
        )

    async def resumable_end(self, body: Any) -> str:
        self.resumable.end(_str(_object(body).get("uuid"), "uuid"))
        return "Success"

    async def _query_one(self, namespace: str, body: Any) -> list[dict[str, Any]]:
        """One query: its request checked the Upstash way, then one domain query (which
        embeds a text once, weighs, searches and scores in the index's space)."""
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
        vector, sparse = None, None
        similar = body.get("similarTo")  # dwsearch's extension: "more like this stored document"
        if similar is not None:
            if data is not None or body.get("vector") is not None or body.get("sparseVector") is not None:
                raise InvalidArgument("similarTo: alone, without data, vector or sparseVector")
            similar = _id(similar, "similarTo")
        elif data is not None:
            self.require_model()
            if body.get("vector") is not None or body.get("sparseVector") is not None:
                raise InvalidArgument("query by data or by vectors, not both")
            data = _str(data, "data")
        else:
            if body.get("vector") is not None:
                if not self.has_dense:
                    raise InvalidArgument("This index does not support dense vectors")
                dimension = await self.dimension()
                vector = await offload.run(self._checked, body["vector"], "vector", dimension, size=dimension)
            if body.get("sparseVector") is not None:
                sparse = parse_sparse(body["sparseVector"], "sparseVector")
            if (
                mode is QueryMode.HYBRID
                and body.get("queryMode") is None
                and vector is None
                and sparse is not None
            ):
                # A sparse vector alone searches a HYBRID index's sparse side, as Upstash does
                # (the TypeScript SDK's queryMany test); a dense one alone still needs queryMode DENSE.
                mode = QueryMode.SPARSE
            if mode is not QueryMode.SPARSE and self.has_dense and vector is None:
                raise InvalidArgument("This index requires dense vectors")
            if mode is not QueryMode.DENSE and self.has_sparse and sparse is None:
                raise InvalidArgument("This index requires sparse vectors")
            if mode is QueryMode.DENSE:
                sparse = None
            elif mode is QueryMode.SPARSE:
                vector = None
        include = _include(body)
        answer = await self.domain.query_answer(
            Query(
                namespace=self.stored(namespace),
                data=data,
                vector=vector,
                sparse_vector=sparse,
                top_k=_int(body.get("topK", 10), "topK"),
                filter=_str(body.get("filter", ""), "filter"),
                mode=mode,
                fusion=fusion,
                include=include,
                weighting=Weighting.IDF if weighting is not None else None,
                similar_to=similar,
                explain=bool(body.get("explain")),
            )
        )
        _degraded(answer.degradations)
        return [
            self.shape(hit.document, include, score=hit.score, explanation=hit.explanation)
            for hit in answer.hits
        ]

    def query_mode(self, name: Any) -> QueryMode:
        """The mode a query runs in: the index's type decides, queryMode picks within HYBRID."""
        if name is not None and not isinstance(name, str):
            raise InvalidArgument("queryMode: HYBRID, DENSE or SPARSE")
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

    def shape(
        self,
        document: StoredDocument,
        include: Include,
        *,
        score: float | None = None,
        explanation: HitExplanation | None = None,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"id": document.id}
        if score is not None:
            out["score"] = f32(score)  # Upstash's scores are float32, written shortest
        if include.vectors and document.vector is not None and self.has_dense:
            # float32 values, written in their shortest form ([0.1, 0.2] as sent) when the
            # response is encoded (dwsearch.rest.encode).
            out["vector"] = Float32s(document.vector)
        if include.vectors and document.sparse_vector is not None:
            indices = sorted(document.sparse_vector)
            out["sparseVector"] = {
                "indices": indices,
                "values": [f32(document.sparse_vector[i]) for i in indices],
            }
        if include.metadata and document.metadata:  # absent when the document has none, as Upstash
            out["metadata"] = document.metadata
        if include.data and document.data:
            out["data"] = document.data
        if explanation is not None:  # dwsearch's extension ("explain": true), which the SDKs pass on
            out["explanation"] = {
                "legs": [
                    {"leg": leg.source, "rank": leg.rank, "rawScore": leg.score,
                     "normalizedScore": leg.normalized, "weight": leg.weight}
                    for leg in explanation.legs
                ],
                "fusedScore": explanation.fused_score,
            }  # fmt: skip
        return out

    async def fetch(self, namespace: str, body: Any) -> list[dict[str, Any] | None]:
        body = _object(body)
        include = _include(body)
        if body.get("prefix") is not None and body.get("ids") is not None:
            raise InvalidArgument("Only one of ids or prefix must be provided.")
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
        cursor = _id(body.get("cursor", ""), "cursor")  # the TypeScript SDK sends cursor 0
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
        if sum(body.get(selector) is not None for selector in ("ids", "prefix", "filter")) != 1:
            raise InvalidArgument("Only and only one of the ids, prefix, or filter must be provided.")
        deleted = await self.domain.delete(
            self.stored(namespace),
            ids=_ids(ids) if ids is not None else None,
            prefix=_str(body["prefix"], "prefix") if body.get("prefix") is not None else None,
            filter=_str(body["filter"], "filter") if body.get("filter") is not None else None,
        )
        return {"deleted": deleted}

    async def update(self, namespace: str, body: Any) -> dict[str, int]:
        """A document's metadata, text or vectors replaced, in one transaction (DocumentIndex.update)."""
        body = _object(body)
        self.reject_sparse(body)
        doc_id = _id(body.get("id"), "id")
        mode_name = str(body.get("metadataUpdateMode", "OVERWRITE")).upper()
        if mode_name not in ("PATCH", "OVERWRITE"):
            raise InvalidArgument(f"metadataUpdateMode {mode_name}: PATCH or OVERWRITE")
        mode = MetadataMode.PATCH if mode_name == "PATCH" else MetadataMode.OVERWRITE
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidArgument("metadata: an object")
        vector, data, sparse = body.get("vector"), body.get("data"), body.get("sparseVector")
        if vector is None and sparse is None and data is None and metadata is None:
            raise InvalidArgument("nothing to update: give vector, data or metadata")
        if vector is not None and not self.has_dense:
            raise InvalidArgument("This index does not support dense vectors")
        updated = await self.domain.update(
            self.stored(namespace),
            doc_id,
            metadata=metadata,
            mode=mode,
            data=_str(data, "data") if data is not None else None,
            vector=self._checked(vector, "vector", await self.dimension()) if vector is not None else None,
            sparse_vector=parse_sparse(sparse, "sparseVector") if sparse is not None else None,
        )
        return {"updated": int(updated)}

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
        await self.domain.drop_namespace(self.stored(namespace))
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


MAX_ID_DIGITS = 20
"""A numeric id or cursor as Upstash takes it: an integer of at most this many digits
(an unsigned 64-bit one), answered as its decimal string."""


def _id(value: Any, where: str) -> str:
    """An id as the SDKs send it: a string, or an integer (the TypeScript SDK's numeric
    ids), kept as its decimal string."""
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
        if len(text.lstrip("-")) > MAX_ID_DIGITS:
            raise InvalidArgument(f"{where}: an integer of at most {MAX_ID_DIGITS} digits")
        return text
    if not isinstance(value, str):
        raise InvalidArgument(f"{where}: a string or an integer")
    return value


def _ids(value: Any) -> list[str]:
    ids = value if isinstance(value, list) else [value]
    return [_id(i, f"ids[{n}]") for n, i in enumerate(ids)]


def _float(value: int | float, where: str) -> float:
    """A JSON number as a float; an integer beyond float range (JSON has no limit) is a 400."""
    try:
        return float(value)
    except OverflowError:
        raise InvalidArgument(f"{where}: a number beyond the float range") from None


def f32(value: float) -> float:
    """A float32 value (a stored sparse weight, a score the database computed in real)
    as its shortest decimal: 0.6, not 0.6000000238418579."""
    return float(str(np.float32(value)))  # numpy prints the shortest round-tripping digits


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
    # An index given twice counts once with its values summed (a sparse vector in coordinate
    # form, as scipy reads one); Upstash accepts such vectors (the Python SDK's range tests
    # draw random indices that collide).
    weights: dict[int, float] = {}
    for i, v in zip(indices, values, strict=True):
        weights[i] = weights.get(i, 0.0) + _float(v, where)
    return weights


def _document(
    item: Mapping[str, Any],
    vector: DenseValues | None,
    i: int,
    sparse: Mapping[int, float] | None = None,
) -> Document:
    metadata = item.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidArgument(f"vectors[{i}].metadata: an object")
    data = item.get("data")
    return Document(
        id=_id(item.get("id"), f"vectors[{i}].id"),
        data=_str(data, f"vectors[{i}].data") if data is not None else "",
        metadata=metadata or {},
        vector=vector,
        sparse_vector=sparse,
    )
