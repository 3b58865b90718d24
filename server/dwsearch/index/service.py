"""IndexService servicer: protobuf in, DocumentIndex / AgentContextBuilder / KnowledgeGaps,
protobuf out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.struct_pb2 import Struct, Value

from dwsearch.common import offload
from dwsearch.common.errors import FailedPrecondition, InvalidArgument
from dwsearch.common.interceptor import Serialized
from dwsearch.common.wire import to_datetime, to_timestamp
from dwsearch.index.context import AgentContext, AgentContextBuilder, Section
from dwsearch.index.document_index import DocumentIndex
from dwsearch.index.documents import (
    MAX_BATCH,
    SCOPED_NAMESPACE_SEPARATOR,
    Document,
    Fusion,
    Hit,
    Include,
    MetadataMode,
    Query,
    QueryMode,
    StoredDocument,
    check_count,
    check_known_names,
    check_namespace,
)
from dwsearch.index.gaps import GapGroup, GapListing, KnowledgeGaps
from dwsearch.index.reads import QueryAnswer
from dwsearch.index.writes import UPSERT_DOCUMENT_COST
from dwsearch.retrieval.degradation import Degradation
from dwsearch.v1 import embedder_pb2, search_pb2
from dwsearch.v1 import index_pb2 as pb
from dwsearch.v1 import index_pb2_grpc as pb_grpc

SERVICE_NAME = "dwsearch.v1.IndexService"

_MODES: dict[int, QueryMode | None] = {
    pb.QUERY_MODE_UNSPECIFIED: None,
    pb.QUERY_MODE_DENSE: QueryMode.DENSE,
    pb.QUERY_MODE_SPARSE: QueryMode.SPARSE,
    pb.QUERY_MODE_HYBRID: QueryMode.HYBRID,
}
_FUSIONS = {
    pb.FUSION_ALGORITHM_UNSPECIFIED: Fusion.RRF,
    pb.FUSION_ALGORITHM_RRF: Fusion.RRF,
    pb.FUSION_ALGORITHM_DBSF: Fusion.DBSF,
}
_METADATA_MODES = {
    pb.METADATA_UPDATE_MODE_UNSPECIFIED: MetadataMode.PATCH,
    pb.METADATA_UPDATE_MODE_PATCH: MetadataMode.PATCH,
    pb.METADATA_UPDATE_MODE_OVERWRITE: MetadataMode.OVERWRITE,
}


_V = TypeVar("_V")


def _enum(table: Mapping[Any, _V], value: int, what: str) -> _V:
    if value not in table:
        raise InvalidArgument(f"{what}: unknown value {value}")
    return table[value]


# --- protobuf -> plain data ----------------------------------------------------------


def from_value(value: Value) -> Any:
    """A Struct Value as plain JSON-like Python (numbers are floats; the index checks them)."""
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return from_struct(value.struct_value)
    if kind == "list_value":
        return [from_value(item) for item in value.list_value.values]
    if kind in (None, "null_value"):
        return None
    return getattr(value, kind)


def from_struct(struct: Struct) -> dict[str, Any]:
    return {key: from_value(value) for key, value in struct.fields.items()}


def from_sparse(vector: embedder_pb2.SparseVector, where: str) -> dict[int, float]:
    if len(vector.indices) != len(vector.values):
        raise InvalidArgument(f"{where}: {len(vector.indices)} indices but {len(vector.values)} values")
    weights = dict(zip(vector.indices, vector.values, strict=True))
    if len(weights) != len(vector.indices):
        raise InvalidArgument(f"{where}: repeated index")
    return weights


def to_document(doc: pb.Document, where: str) -> Document:
    return Document(
        id=doc.id,
        data=doc.data,
        metadata=from_struct(doc.metadata),
        vector=list(doc.vector) if doc.vector else None,
        sparse_vector=(
            from_sparse(doc.sparse_vector, f"{where}.sparse_vector")
            if doc.HasField("sparse_vector")
            else None
        ),
    )


def to_documents(documents: Sequence[pb.Document]) -> list[Document]:
    return [to_document(d, f"documents[{i}]") for i, d in enumerate(documents)]


def to_query(request: pb.QueryRequest) -> Query:
    which = request.WhichOneof("query")
    return Query(
        namespace=client_namespace(request.namespace),
        data=request.data if which == "data" else None,
        vector=list(request.vector.values) if which == "vector" else None,
        sparse_vector=(
            from_sparse(request.sparse_vector, "sparse_vector") if request.HasField("sparse_vector") else None
        ),
        top_k=request.top_k,
        filter=request.filter,
        mode=_enum(_MODES, request.mode, "mode"),
        fusion=_enum(_FUSIONS, request.fusion, "fusion"),
        include=Include(request.include_data, request.include_metadata, request.include_vectors),
        similar_to=request.similar_to_id if which == "similar_to_id" else None,
        explain=request.explain,
    )


# --- plain data -> protobuf ----------------------------------------------------------


def to_struct(value: Mapping[str, Any]) -> Struct:
    struct = Struct()
    struct.update(value)
    return struct


def _sparse_pb(weights: Mapping[int, float]) -> embedder_pb2.SparseVector:
    indices = sorted(weights)
    return embedder_pb2.SparseVector(indices=indices, values=[weights[i] for i in indices])


def _fields(doc: StoredDocument) -> dict[str, Any]:
    """The fields that were read, as protobuf constructor arguments."""
    fields: dict[str, Any] = {"id": doc.id}
    if doc.data is not None:
        fields["data"] = doc.data
    if doc.metadata is not None:
        fields["metadata"] = to_struct(doc.metadata)
    if doc.vector is not None:
        fields["vector"] = doc.vector
    if doc.sparse_vector is not None:
        fields["sparse_vector"] = _sparse_pb(doc.sparse_vector)
    return fields


def to_document_pb(doc: StoredDocument) -> pb.Document:
    return pb.Document(**_fields(doc))


def to_scored(hit: Hit) -> pb.ScoredDocument:
    scored = pb.ScoredDocument(score=hit.score, **_fields(hit.document))
    if hit.explanation is not None:
        scored.explanation.fused_score = hit.explanation.fused_score
        scored.explanation.legs.extend(
            pb.IndexLegExplanation(
                leg=leg.source, rank=leg.rank, raw_score=leg.score,
                normalized_score=leg.normalized, weight=leg.weight,
            )
            for leg in hit.explanation.legs
        )  # fmt: skip
    return scored


def conversion_size(documents: Iterable[StoredDocument]) -> int:
    """What converting documents to protobuf costs, in characters of text (the unit of
    offload.INLINE_MAX_SIZE; metadata counts as dwsearch.index.writes.UPSERT_DOCUMENT_COST):
    more than a few documents with metadata are converted in the CPU pool."""
    return sum(
        len(doc.data or "")
        + (UPSERT_DOCUMENT_COST if doc.metadata is not None else 0)
        + 4 * len(doc.vector if doc.vector is not None else ())
        for doc in documents
    )


def _degradation(reason: Degradation, detail: str) -> search_pb2.Degradation:
    # Degradation members are named after the proto's DEGRADATION_REASON_* values.
    return search_pb2.Degradation(reason=f"DEGRADATION_REASON_{reason.name}", detail=detail)


def to_context_response(context: AgentContext) -> pb.BuildAgentContextResponse:
    return pb.BuildAgentContextResponse(
        similar_tickets=[to_scored(h) for h in context.sections[Section.SIMILAR_TICKETS]],
        knowledge=[to_scored(h) for h in context.sections[Section.KNOWLEDGE]],
        good_responses=[to_scored(h) for h in context.sections[Section.GOOD_RESPONSES]],
        reranked=context.reranked,
        degraded=bool(context.degradations),
        degradations=[_degradation(reason, detail) for reason, detail in context.degradations],
    )


_MODES_PB = {
    QueryMode.DENSE: pb.QUERY_MODE_DENSE,
    QueryMode.SPARSE: pb.QUERY_MODE_SPARSE,
    QueryMode.HYBRID: pb.QUERY_MODE_HYBRID,
}


def _query_response(answer: QueryAnswer) -> pb.QueryResponse:
    return pb.QueryResponse(
        results=[to_scored(h) for h in answer.hits],
        mode=_MODES_PB[answer.mode],
        degraded=bool(answer.degradations),
        degradations=[_degradation(reason, detail) for reason, detail in answer.degradations],
    )


SERIALIZE_PIECE_DOCUMENTS = 16
"""Documents built and serialized per piece of a Fetch or Range response, each piece a
C call holding the interpreter lock for about 1 ms (16 documents of 47 KiB metadata):
building 1,000 at once was one call of 80 ms, and gRPC then serialized the response on
the event loop (0.11-0.16 s for 48 MB)."""

_M = TypeVar("_M", pb.FetchResponse, pb.RangeResponse)


def _serialized(message: type[_M], documents: Sequence[StoredDocument], **fields: Any) -> Serialized:
    """`message(documents=..., **fields)` serialized, its documents SERIALIZE_PIECE_DOCUMENTS
    at a time: serialized messages concatenated parse as the message of all their fields
    (repeated ones appended), the same bytes as one message serialized whole."""
    pieces = [
        message(
            documents=[to_document_pb(d) for d in documents[i : i + SERIALIZE_PIECE_DOCUMENTS]]
        ).SerializeToString()
        for i in range(0, len(documents), SERIALIZE_PIECE_DOCUMENTS)
    ]
    pieces.append(message(**fields).SerializeToString())
    return Serialized(b"".join(pieces))


def _fetch_response(found: Sequence[StoredDocument], missing: Sequence[str]) -> Serialized:
    return _serialized(pb.FetchResponse, found, missing_ids=missing)


def _range_response(documents: Sequence[StoredDocument], next_cursor: str) -> Serialized:
    return _serialized(pb.RangeResponse, documents, next_cursor=next_cursor)


async def _metadata(request: pb.UpdateRequest) -> dict[str, Any] | None:
    """Update's metadata as a dict; a large Struct is converted in the CPU pool."""
    if not request.HasField("metadata"):
        return None
    return await offload.run(from_struct, request.metadata, size=request.metadata.ByteSize())


def to_gap_group(group: GapGroup) -> pb.KnowledgeGapGroup:
    return pb.KnowledgeGapGroup(
        query=group.query,
        count=group.count,
        examples=group.examples,
        first_seen=to_timestamp(group.first_seen),
        last_seen=to_timestamp(group.last_seen),
        best_score=group.best_score,
        candidate_ids=group.candidate_ids,
        gap_ids=group.gap_ids,
    )


def to_gaps_response(listing: GapListing) -> pb.ListKnowledgeGapsResponse:
    return pb.ListKnowledgeGapsResponse(
        groups=[to_gap_group(g) for g in listing.groups],
        gaps=listing.gaps,
        truncated=listing.truncated,
        similarity=listing.similarity,
    )


def client_namespace(namespace: str) -> str:
    """A namespace as a gRPC caller names it. The separator that scopes the REST API's
    indexes (`{index}` + U+001F + `{namespace}`) is refused, so a gRPC caller can never
    name a REST index's namespace."""
    if SCOPED_NAMESPACE_SEPARATOR in namespace:
        raise InvalidArgument("namespace: must not contain the control character U+001F")
    check_namespace(namespace)
    return namespace


class IndexService(pb_grpc.IndexServiceServicer):
    def __init__(
        self, index: DocumentIndex, agent_context: AgentContextBuilder, gaps: KnowledgeGaps | None = None
    ) -> None:
        self.index = index
        self.agent_context = agent_context
        # Knowledge gaps: knowledge queries observed, and the admin RPCs (None: not served).
        self.gaps = gaps

    def _gaps(self) -> KnowledgeGaps:
        if self.gaps is None:
            raise FailedPrecondition("knowledge gaps are not served by this server")
        return self.gaps

    async def Upsert(
        self, request: pb.UpsertRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.UpsertResponse:
        # Counts and names before the documents are converted (their metadata is the costly part).
        client_namespace(request.namespace)
        check_count(len(request.documents), "documents", MAX_BATCH)
        check_known_names(request.known_names)
        # Struct to dict, document by document, in the CPU pool (measuring the request
        # first would cost as much: ByteSize() of a 60 MB request takes 0.1 s).
        documents = await offload.run(to_documents, request.documents)
        result = await self.index.upsert(
            client_namespace(request.namespace), documents, list(request.known_names)
        )
        return pb.UpsertResponse(upserted=result.upserted, embedded=result.embedded)

    async def Query(
        self, request: pb.QueryRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.QueryResponse:
        query = to_query(request)
        answer = await self.index.query_answer(query)
        if self.gaps is not None:  # a knowledge query may be a gap: in the background
            self.gaps.observe_query(query)
        return await offload.run(
            _query_response, answer, size=conversion_size(h.document for h in answer.hits)
        )

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Serialized:
        # A FetchResponse, serialized here (in the CPU pool when large), not by gRPC on the loop.
        include = Include(request.include_data, request.include_metadata, request.include_vectors)
        found, missing = await self.index.fetch(
            client_namespace(request.namespace), list(request.ids), include
        )
        return await offload.run(_fetch_response, found, missing, size=conversion_size(found))

    async def Delete(
        self, request: pb.DeleteRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DeleteResponse:
        which = request.WhichOneof("selector")
        deleted = await self.index.delete(
            client_namespace(request.namespace),
            ids=list(request.ids.ids) if which == "ids" else None,
            prefix=request.prefix if which == "prefix" else None,
            filter=request.filter if which == "filter" else None,
        )
        return pb.DeleteResponse(deleted=deleted)

    async def Range(
        self, request: pb.RangeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Serialized:
        # A RangeResponse, serialized as Fetch's is.
        page = await self.index.range(
            client_namespace(request.namespace),
            cursor=request.cursor,
            limit=request.limit,
            prefix=request.prefix,
            include=Include(request.include_data, request.include_metadata, request.include_vectors),
        )
        return await offload.run(
            _range_response, page.documents, page.next_cursor, size=conversion_size(page.documents)
        )

    async def Update(
        self, request: pb.UpdateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.UpdateResponse:
        updated = await self.index.update(
            client_namespace(request.namespace),
            request.id,
            metadata=await _metadata(request),
            mode=_enum(_METADATA_MODES, request.metadata_mode, "metadata_mode"),
            data=request.data if request.HasField("data") else None,
            known_names=list(request.known_names),
        )
        return pb.UpdateResponse(updated=updated)

    async def Info(
        self, request: pb.IndexServiceInfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.IndexServiceInfoResponse:
        info = await self.index.info()
        return pb.IndexServiceInfoResponse(
            document_count=info.document_count,
            namespaces=[pb.NamespaceInfo(namespace=n, document_count=c) for n, c in info.namespaces.items()],
            dimension=info.dimension,
            model=info.model,
            sparse_supported=info.sparse_supported,
        )

    async def BuildAgentContext(
        self, request: pb.BuildAgentContextRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.BuildAgentContextResponse:
        result = await self.agent_context.build(
            client_namespace(request.namespace),
            request.message,
            request.app_id,
            rerank=request.rerank,
            known_names=list(request.known_names),
        )
        return to_context_response(result)

    async def ListKnowledgeGaps(
        self, request: pb.ListKnowledgeGapsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListKnowledgeGapsResponse:
        since = to_datetime(request.since, "since") if request.HasField("since") else None
        listing = await self._gaps().list_gaps(request.org_id, since=since, limit=request.limit)
        return to_gaps_response(listing)

    async def ForgetKnowledgeGaps(
        self, request: pb.ForgetKnowledgeGapsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ForgetKnowledgeGapsResponse:
        deleted = await self._gaps().forget(request.org_id, list(request.ids), all_gaps=request.all)
        return pb.ForgetKnowledgeGapsResponse(deleted=deleted)
