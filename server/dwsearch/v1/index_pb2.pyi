import datetime

from dwsearch.v1 import embedder_pb2 as _embedder_pb2
from dwsearch.v1 import search_pb2 as _search_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QueryMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUERY_MODE_UNSPECIFIED: _ClassVar[QueryMode]
    QUERY_MODE_DENSE: _ClassVar[QueryMode]
    QUERY_MODE_SPARSE: _ClassVar[QueryMode]
    QUERY_MODE_HYBRID: _ClassVar[QueryMode]

class FusionAlgorithm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FUSION_ALGORITHM_UNSPECIFIED: _ClassVar[FusionAlgorithm]
    FUSION_ALGORITHM_RRF: _ClassVar[FusionAlgorithm]
    FUSION_ALGORITHM_DBSF: _ClassVar[FusionAlgorithm]

class MetadataUpdateMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    METADATA_UPDATE_MODE_UNSPECIFIED: _ClassVar[MetadataUpdateMode]
    METADATA_UPDATE_MODE_PATCH: _ClassVar[MetadataUpdateMode]
    METADATA_UPDATE_MODE_OVERWRITE: _ClassVar[MetadataUpdateMode]
QUERY_MODE_UNSPECIFIED: QueryMode
QUERY_MODE_DENSE: QueryMode
QUERY_MODE_SPARSE: QueryMode
QUERY_MODE_HYBRID: QueryMode
FUSION_ALGORITHM_UNSPECIFIED: FusionAlgorithm
FUSION_ALGORITHM_RRF: FusionAlgorithm
FUSION_ALGORITHM_DBSF: FusionAlgorithm
METADATA_UPDATE_MODE_UNSPECIFIED: MetadataUpdateMode
METADATA_UPDATE_MODE_PATCH: MetadataUpdateMode
METADATA_UPDATE_MODE_OVERWRITE: MetadataUpdateMode

class Document(_message.Message):
    __slots__ = ("id", "data", "metadata", "vector", "sparse_vector")
    ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    VECTOR_FIELD_NUMBER: _ClassVar[int]
    SPARSE_VECTOR_FIELD_NUMBER: _ClassVar[int]
    id: str
    data: str
    metadata: _struct_pb2.Struct
    vector: _containers.RepeatedScalarFieldContainer[float]
    sparse_vector: _embedder_pb2.SparseVector
    def __init__(self, id: _Optional[str] = ..., data: _Optional[str] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., vector: _Optional[_Iterable[float]] = ..., sparse_vector: _Optional[_Union[_embedder_pb2.SparseVector, _Mapping]] = ...) -> None: ...

class UpsertRequest(_message.Message):
    __slots__ = ("namespace", "documents", "known_names")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_NAMES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    documents: _containers.RepeatedCompositeFieldContainer[Document]
    known_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., documents: _Optional[_Iterable[_Union[Document, _Mapping]]] = ..., known_names: _Optional[_Iterable[str]] = ...) -> None: ...

class UpsertResponse(_message.Message):
    __slots__ = ("upserted", "embedded")
    UPSERTED_FIELD_NUMBER: _ClassVar[int]
    EMBEDDED_FIELD_NUMBER: _ClassVar[int]
    upserted: int
    embedded: int
    def __init__(self, upserted: _Optional[int] = ..., embedded: _Optional[int] = ...) -> None: ...

class QueryRequest(_message.Message):
    __slots__ = ("namespace", "data", "vector", "similar_to_id", "sparse_vector", "top_k", "filter", "mode", "fusion", "include_data", "include_metadata", "include_vectors", "explain")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    VECTOR_FIELD_NUMBER: _ClassVar[int]
    SIMILAR_TO_ID_FIELD_NUMBER: _ClassVar[int]
    SPARSE_VECTOR_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FUSION_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DATA_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_METADATA_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_VECTORS_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    data: str
    vector: DenseVector
    similar_to_id: str
    sparse_vector: _embedder_pb2.SparseVector
    top_k: int
    filter: str
    mode: QueryMode
    fusion: FusionAlgorithm
    include_data: bool
    include_metadata: bool
    include_vectors: bool
    explain: bool
    def __init__(self, namespace: _Optional[str] = ..., data: _Optional[str] = ..., vector: _Optional[_Union[DenseVector, _Mapping]] = ..., similar_to_id: _Optional[str] = ..., sparse_vector: _Optional[_Union[_embedder_pb2.SparseVector, _Mapping]] = ..., top_k: _Optional[int] = ..., filter: _Optional[str] = ..., mode: _Optional[_Union[QueryMode, str]] = ..., fusion: _Optional[_Union[FusionAlgorithm, str]] = ..., include_data: _Optional[bool] = ..., include_metadata: _Optional[bool] = ..., include_vectors: _Optional[bool] = ..., explain: _Optional[bool] = ...) -> None: ...

class DenseVector(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class ScoredDocument(_message.Message):
    __slots__ = ("id", "score", "data", "metadata", "vector", "sparse_vector", "explanation")
    ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    VECTOR_FIELD_NUMBER: _ClassVar[int]
    SPARSE_VECTOR_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    id: str
    score: float
    data: str
    metadata: _struct_pb2.Struct
    vector: _containers.RepeatedScalarFieldContainer[float]
    sparse_vector: _embedder_pb2.SparseVector
    explanation: IndexHitExplanation
    def __init__(self, id: _Optional[str] = ..., score: _Optional[float] = ..., data: _Optional[str] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., vector: _Optional[_Iterable[float]] = ..., sparse_vector: _Optional[_Union[_embedder_pb2.SparseVector, _Mapping]] = ..., explanation: _Optional[_Union[IndexHitExplanation, _Mapping]] = ...) -> None: ...

class IndexHitExplanation(_message.Message):
    __slots__ = ("legs", "fused_score")
    LEGS_FIELD_NUMBER: _ClassVar[int]
    FUSED_SCORE_FIELD_NUMBER: _ClassVar[int]
    legs: _containers.RepeatedCompositeFieldContainer[IndexLegExplanation]
    fused_score: float
    def __init__(self, legs: _Optional[_Iterable[_Union[IndexLegExplanation, _Mapping]]] = ..., fused_score: _Optional[float] = ...) -> None: ...

class IndexLegExplanation(_message.Message):
    __slots__ = ("leg", "rank", "raw_score", "normalized_score", "weight")
    LEG_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    RAW_SCORE_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_SCORE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    leg: str
    rank: int
    raw_score: float
    normalized_score: float
    weight: float
    def __init__(self, leg: _Optional[str] = ..., rank: _Optional[int] = ..., raw_score: _Optional[float] = ..., normalized_score: _Optional[float] = ..., weight: _Optional[float] = ...) -> None: ...

class QueryResponse(_message.Message):
    __slots__ = ("results", "mode", "degraded", "degradations")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    DEGRADATIONS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ScoredDocument]
    mode: QueryMode
    degraded: bool
    degradations: _containers.RepeatedCompositeFieldContainer[_search_pb2.Degradation]
    def __init__(self, results: _Optional[_Iterable[_Union[ScoredDocument, _Mapping]]] = ..., mode: _Optional[_Union[QueryMode, str]] = ..., degraded: _Optional[bool] = ..., degradations: _Optional[_Iterable[_Union[_search_pb2.Degradation, _Mapping]]] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("namespace", "ids", "include_data", "include_metadata", "include_vectors")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DATA_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_METADATA_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_VECTORS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    include_data: bool
    include_metadata: bool
    include_vectors: bool
    def __init__(self, namespace: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ..., include_data: _Optional[bool] = ..., include_metadata: _Optional[bool] = ..., include_vectors: _Optional[bool] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("documents", "missing_ids")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    MISSING_IDS_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedCompositeFieldContainer[Document]
    missing_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, documents: _Optional[_Iterable[_Union[Document, _Mapping]]] = ..., missing_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class IdList(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("namespace", "ids", "prefix", "filter")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    ids: IdList
    prefix: str
    filter: str
    def __init__(self, namespace: _Optional[str] = ..., ids: _Optional[_Union[IdList, _Mapping]] = ..., prefix: _Optional[str] = ..., filter: _Optional[str] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...

class RangeRequest(_message.Message):
    __slots__ = ("namespace", "cursor", "limit", "prefix", "include_data", "include_metadata", "include_vectors")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DATA_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_METADATA_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_VECTORS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    cursor: str
    limit: int
    prefix: str
    include_data: bool
    include_metadata: bool
    include_vectors: bool
    def __init__(self, namespace: _Optional[str] = ..., cursor: _Optional[str] = ..., limit: _Optional[int] = ..., prefix: _Optional[str] = ..., include_data: _Optional[bool] = ..., include_metadata: _Optional[bool] = ..., include_vectors: _Optional[bool] = ...) -> None: ...

class RangeResponse(_message.Message):
    __slots__ = ("documents", "next_cursor")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedCompositeFieldContainer[Document]
    next_cursor: str
    def __init__(self, documents: _Optional[_Iterable[_Union[Document, _Mapping]]] = ..., next_cursor: _Optional[str] = ...) -> None: ...

class UpdateRequest(_message.Message):
    __slots__ = ("namespace", "id", "metadata", "metadata_mode", "data", "known_names")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    METADATA_MODE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    KNOWN_NAMES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    metadata: _struct_pb2.Struct
    metadata_mode: MetadataUpdateMode
    data: str
    known_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., metadata_mode: _Optional[_Union[MetadataUpdateMode, str]] = ..., data: _Optional[str] = ..., known_names: _Optional[_Iterable[str]] = ...) -> None: ...

class UpdateResponse(_message.Message):
    __slots__ = ("updated",)
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    updated: bool
    def __init__(self, updated: _Optional[bool] = ...) -> None: ...

class IndexServiceInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NamespaceInfo(_message.Message):
    __slots__ = ("namespace", "document_count")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    document_count: int
    def __init__(self, namespace: _Optional[str] = ..., document_count: _Optional[int] = ...) -> None: ...

class IndexServiceInfoResponse(_message.Message):
    __slots__ = ("document_count", "namespaces", "dimension", "model", "sparse_supported")
    DOCUMENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SPARSE_SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    document_count: int
    namespaces: _containers.RepeatedCompositeFieldContainer[NamespaceInfo]
    dimension: int
    model: str
    sparse_supported: bool
    def __init__(self, document_count: _Optional[int] = ..., namespaces: _Optional[_Iterable[_Union[NamespaceInfo, _Mapping]]] = ..., dimension: _Optional[int] = ..., model: _Optional[str] = ..., sparse_supported: _Optional[bool] = ...) -> None: ...

class BuildAgentContextRequest(_message.Message):
    __slots__ = ("namespace", "message", "app_id", "rerank", "known_names")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    RERANK_FIELD_NUMBER: _ClassVar[int]
    KNOWN_NAMES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    message: str
    app_id: str
    rerank: bool
    known_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., message: _Optional[str] = ..., app_id: _Optional[str] = ..., rerank: _Optional[bool] = ..., known_names: _Optional[_Iterable[str]] = ...) -> None: ...

class BuildAgentContextResponse(_message.Message):
    __slots__ = ("similar_tickets", "knowledge", "good_responses", "reranked", "degraded", "degradations")
    SIMILAR_TICKETS_FIELD_NUMBER: _ClassVar[int]
    KNOWLEDGE_FIELD_NUMBER: _ClassVar[int]
    GOOD_RESPONSES_FIELD_NUMBER: _ClassVar[int]
    RERANKED_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    DEGRADATIONS_FIELD_NUMBER: _ClassVar[int]
    similar_tickets: _containers.RepeatedCompositeFieldContainer[ScoredDocument]
    knowledge: _containers.RepeatedCompositeFieldContainer[ScoredDocument]
    good_responses: _containers.RepeatedCompositeFieldContainer[ScoredDocument]
    reranked: bool
    degraded: bool
    degradations: _containers.RepeatedCompositeFieldContainer[_search_pb2.Degradation]
    def __init__(self, similar_tickets: _Optional[_Iterable[_Union[ScoredDocument, _Mapping]]] = ..., knowledge: _Optional[_Iterable[_Union[ScoredDocument, _Mapping]]] = ..., good_responses: _Optional[_Iterable[_Union[ScoredDocument, _Mapping]]] = ..., reranked: _Optional[bool] = ..., degraded: _Optional[bool] = ..., degradations: _Optional[_Iterable[_Union[_search_pb2.Degradation, _Mapping]]] = ...) -> None: ...

class ListKnowledgeGapsRequest(_message.Message):
    __slots__ = ("org_id", "since", "limit")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    since: _timestamp_pb2.Timestamp
    limit: int
    def __init__(self, org_id: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., limit: _Optional[int] = ...) -> None: ...

class KnowledgeGapGroup(_message.Message):
    __slots__ = ("query", "count", "examples", "first_seen", "last_seen", "best_score", "candidate_ids", "gap_ids")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEEN_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    BEST_SCORE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_IDS_FIELD_NUMBER: _ClassVar[int]
    GAP_IDS_FIELD_NUMBER: _ClassVar[int]
    query: str
    count: int
    examples: _containers.RepeatedScalarFieldContainer[str]
    first_seen: _timestamp_pb2.Timestamp
    last_seen: _timestamp_pb2.Timestamp
    best_score: float
    candidate_ids: _containers.RepeatedScalarFieldContainer[str]
    gap_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, query: _Optional[str] = ..., count: _Optional[int] = ..., examples: _Optional[_Iterable[str]] = ..., first_seen: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_seen: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., best_score: _Optional[float] = ..., candidate_ids: _Optional[_Iterable[str]] = ..., gap_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ListKnowledgeGapsResponse(_message.Message):
    __slots__ = ("groups", "gaps", "truncated", "similarity")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    GAPS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[KnowledgeGapGroup]
    gaps: int
    truncated: bool
    similarity: float
    def __init__(self, groups: _Optional[_Iterable[_Union[KnowledgeGapGroup, _Mapping]]] = ..., gaps: _Optional[int] = ..., truncated: _Optional[bool] = ..., similarity: _Optional[float] = ...) -> None: ...

class ForgetKnowledgeGapsRequest(_message.Message):
    __slots__ = ("org_id", "ids", "all")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    all: bool
    def __init__(self, org_id: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ..., all: _Optional[bool] = ...) -> None: ...

class ForgetKnowledgeGapsResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...
