import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SearchMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEARCH_MODE_UNSPECIFIED: _ClassVar[SearchMode]
    SEARCH_MODE_HYBRID: _ClassVar[SearchMode]
    SEARCH_MODE_FTS: _ClassVar[SearchMode]
    SEARCH_MODE_SEMANTIC: _ClassVar[SearchMode]

class SearchFusion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEARCH_FUSION_UNSPECIFIED: _ClassVar[SearchFusion]
    SEARCH_FUSION_RRF: _ClassVar[SearchFusion]
    SEARCH_FUSION_WEIGHTED: _ClassVar[SearchFusion]

class SearchSort(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEARCH_SORT_UNSPECIFIED: _ClassVar[SearchSort]
    SEARCH_SORT_RELEVANCE: _ClassVar[SearchSort]
    SEARCH_SORT_NEWEST: _ClassVar[SearchSort]

class DegradationReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEGRADATION_REASON_UNSPECIFIED: _ClassVar[DegradationReason]
    DEGRADATION_REASON_SEMANTIC_DISABLED: _ClassVar[DegradationReason]
    DEGRADATION_REASON_EMBEDDER_UNAVAILABLE: _ClassVar[DegradationReason]
    DEGRADATION_REASON_EMBEDDER_TIMEOUT: _ClassVar[DegradationReason]
    DEGRADATION_REASON_RERANKER_UNAVAILABLE: _ClassVar[DegradationReason]
    DEGRADATION_REASON_RERANKER_TIMEOUT: _ClassVar[DegradationReason]
    DEGRADATION_REASON_RERANKER_NOT_CONFIGURED: _ClassVar[DegradationReason]
    DEGRADATION_REASON_SPARSE_UNSUPPORTED: _ClassVar[DegradationReason]

class HitKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HIT_KIND_UNSPECIFIED: _ClassVar[HitKind]
    HIT_KIND_WINDOW: _ClassVar[HitKind]
    HIT_KIND_MESSAGE: _ClassVar[HitKind]
SEARCH_MODE_UNSPECIFIED: SearchMode
SEARCH_MODE_HYBRID: SearchMode
SEARCH_MODE_FTS: SearchMode
SEARCH_MODE_SEMANTIC: SearchMode
SEARCH_FUSION_UNSPECIFIED: SearchFusion
SEARCH_FUSION_RRF: SearchFusion
SEARCH_FUSION_WEIGHTED: SearchFusion
SEARCH_SORT_UNSPECIFIED: SearchSort
SEARCH_SORT_RELEVANCE: SearchSort
SEARCH_SORT_NEWEST: SearchSort
DEGRADATION_REASON_UNSPECIFIED: DegradationReason
DEGRADATION_REASON_SEMANTIC_DISABLED: DegradationReason
DEGRADATION_REASON_EMBEDDER_UNAVAILABLE: DegradationReason
DEGRADATION_REASON_EMBEDDER_TIMEOUT: DegradationReason
DEGRADATION_REASON_RERANKER_UNAVAILABLE: DegradationReason
DEGRADATION_REASON_RERANKER_TIMEOUT: DegradationReason
DEGRADATION_REASON_RERANKER_NOT_CONFIGURED: DegradationReason
DEGRADATION_REASON_SPARSE_UNSUPPORTED: DegradationReason
HIT_KIND_UNSPECIFIED: HitKind
HIT_KIND_WINDOW: HitKind
HIT_KIND_MESSAGE: HitKind

class SearchRequest(_message.Message):
    __slots__ = ("org_id", "query", "limit", "provider", "external_channel_id", "start_time", "end_time", "mode", "rerank", "context_messages", "sort", "fusion", "fusion_weights", "explain")
    class FusionWeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_CHANNEL_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    RERANK_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SORT_FIELD_NUMBER: _ClassVar[int]
    FUSION_FIELD_NUMBER: _ClassVar[int]
    FUSION_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    query: str
    limit: int
    provider: str
    external_channel_id: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    mode: SearchMode
    rerank: bool
    context_messages: int
    sort: SearchSort
    fusion: SearchFusion
    fusion_weights: _containers.ScalarMap[str, float]
    explain: bool
    def __init__(self, org_id: _Optional[str] = ..., query: _Optional[str] = ..., limit: _Optional[int] = ..., provider: _Optional[str] = ..., external_channel_id: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., mode: _Optional[_Union[SearchMode, str]] = ..., rerank: _Optional[bool] = ..., context_messages: _Optional[int] = ..., sort: _Optional[_Union[SearchSort, str]] = ..., fusion: _Optional[_Union[SearchFusion, str]] = ..., fusion_weights: _Optional[_Mapping[str, float]] = ..., explain: _Optional[bool] = ...) -> None: ...

class SimilarRequest(_message.Message):
    __slots__ = ("org_id", "message_id", "window_id", "conversation", "limit", "context_messages", "fusion", "fusion_weights", "explain")
    class FusionWeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    WINDOW_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    FUSION_FIELD_NUMBER: _ClassVar[int]
    FUSION_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    message_id: str
    window_id: str
    conversation: Conversation
    limit: int
    context_messages: int
    fusion: SearchFusion
    fusion_weights: _containers.ScalarMap[str, float]
    explain: bool
    def __init__(self, org_id: _Optional[str] = ..., message_id: _Optional[str] = ..., window_id: _Optional[str] = ..., conversation: _Optional[_Union[Conversation, _Mapping]] = ..., limit: _Optional[int] = ..., context_messages: _Optional[int] = ..., fusion: _Optional[_Union[SearchFusion, str]] = ..., fusion_weights: _Optional[_Mapping[str, float]] = ..., explain: _Optional[bool] = ...) -> None: ...

class Conversation(_message.Message):
    __slots__ = ("provider", "external_channel_id", "start_time", "end_time")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_CHANNEL_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    provider: str
    external_channel_id: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    def __init__(self, provider: _Optional[str] = ..., external_channel_id: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Degradation(_message.Message):
    __slots__ = ("reason", "detail")
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    reason: DegradationReason
    detail: str
    def __init__(self, reason: _Optional[_Union[DegradationReason, str]] = ..., detail: _Optional[str] = ...) -> None: ...

class SourceScore(_message.Message):
    __slots__ = ("rank", "score")
    RANK_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    rank: int
    score: float
    def __init__(self, rank: _Optional[int] = ..., score: _Optional[float] = ...) -> None: ...

class SearchHit(_message.Message):
    __slots__ = ("kind", "id", "message_ids", "matched_message_ids", "provider", "external_channel_id", "start_time", "end_time", "text", "score", "fts", "dense", "sparse", "rerank", "highlights", "context_before", "context_after", "sources", "explanation")
    class SourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: SourceScore
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[SourceScore, _Mapping]] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    MATCHED_MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_CHANNEL_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    FTS_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    RERANK_FIELD_NUMBER: _ClassVar[int]
    HIGHLIGHTS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_AFTER_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    kind: HitKind
    id: str
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    matched_message_ids: _containers.RepeatedScalarFieldContainer[str]
    provider: str
    external_channel_id: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    text: str
    score: float
    fts: SourceScore
    dense: SourceScore
    sparse: SourceScore
    rerank: SourceScore
    highlights: _containers.RepeatedCompositeFieldContainer[TextSpan]
    context_before: _containers.RepeatedCompositeFieldContainer[ContextMessage]
    context_after: _containers.RepeatedCompositeFieldContainer[ContextMessage]
    sources: _containers.MessageMap[str, SourceScore]
    explanation: SearchHitExplanation
    def __init__(self, kind: _Optional[_Union[HitKind, str]] = ..., id: _Optional[str] = ..., message_ids: _Optional[_Iterable[str]] = ..., matched_message_ids: _Optional[_Iterable[str]] = ..., provider: _Optional[str] = ..., external_channel_id: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., text: _Optional[str] = ..., score: _Optional[float] = ..., fts: _Optional[_Union[SourceScore, _Mapping]] = ..., dense: _Optional[_Union[SourceScore, _Mapping]] = ..., sparse: _Optional[_Union[SourceScore, _Mapping]] = ..., rerank: _Optional[_Union[SourceScore, _Mapping]] = ..., highlights: _Optional[_Iterable[_Union[TextSpan, _Mapping]]] = ..., context_before: _Optional[_Iterable[_Union[ContextMessage, _Mapping]]] = ..., context_after: _Optional[_Iterable[_Union[ContextMessage, _Mapping]]] = ..., sources: _Optional[_Mapping[str, SourceScore]] = ..., explanation: _Optional[_Union[SearchHitExplanation, _Mapping]] = ...) -> None: ...

class SearchHitExplanation(_message.Message):
    __slots__ = ("legs", "fused_score", "rerank_score")
    LEGS_FIELD_NUMBER: _ClassVar[int]
    FUSED_SCORE_FIELD_NUMBER: _ClassVar[int]
    RERANK_SCORE_FIELD_NUMBER: _ClassVar[int]
    legs: _containers.RepeatedCompositeFieldContainer[SearchLegExplanation]
    fused_score: float
    rerank_score: float
    def __init__(self, legs: _Optional[_Iterable[_Union[SearchLegExplanation, _Mapping]]] = ..., fused_score: _Optional[float] = ..., rerank_score: _Optional[float] = ...) -> None: ...

class SearchLegExplanation(_message.Message):
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

class SearchStageTime(_message.Message):
    __slots__ = ("stage", "duration")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    stage: str
    duration: _duration_pb2.Duration
    def __init__(self, stage: _Optional[str] = ..., duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class TextSpan(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class ContextMessage(_message.Message):
    __slots__ = ("id", "created_at", "text")
    ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    id: str
    created_at: _timestamp_pb2.Timestamp
    text: str
    def __init__(self, id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., text: _Optional[str] = ...) -> None: ...

class SearchResponse(_message.Message):
    __slots__ = ("hits", "degraded", "degradations", "model", "mode", "reranked", "typo_corrections", "fusion", "stage_times", "fusion_profile")
    HITS_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    DEGRADATIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    RERANKED_FIELD_NUMBER: _ClassVar[int]
    TYPO_CORRECTIONS_FIELD_NUMBER: _ClassVar[int]
    FUSION_FIELD_NUMBER: _ClassVar[int]
    STAGE_TIMES_FIELD_NUMBER: _ClassVar[int]
    FUSION_PROFILE_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[SearchHit]
    degraded: bool
    degradations: _containers.RepeatedCompositeFieldContainer[Degradation]
    model: str
    mode: SearchMode
    reranked: bool
    typo_corrections: _containers.RepeatedCompositeFieldContainer[TypoCorrection]
    fusion: SearchFusion
    stage_times: _containers.RepeatedCompositeFieldContainer[SearchStageTime]
    fusion_profile: str
    def __init__(self, hits: _Optional[_Iterable[_Union[SearchHit, _Mapping]]] = ..., degraded: _Optional[bool] = ..., degradations: _Optional[_Iterable[_Union[Degradation, _Mapping]]] = ..., model: _Optional[str] = ..., mode: _Optional[_Union[SearchMode, str]] = ..., reranked: _Optional[bool] = ..., typo_corrections: _Optional[_Iterable[_Union[TypoCorrection, _Mapping]]] = ..., fusion: _Optional[_Union[SearchFusion, str]] = ..., stage_times: _Optional[_Iterable[_Union[SearchStageTime, _Mapping]]] = ..., fusion_profile: _Optional[str] = ...) -> None: ...

class SimilarResponse(_message.Message):
    __slots__ = ("hits", "degraded", "degradations", "model", "fusion", "conversation", "embedded_models", "stage_times", "fusion_profile")
    HITS_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    DEGRADATIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    FUSION_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    EMBEDDED_MODELS_FIELD_NUMBER: _ClassVar[int]
    STAGE_TIMES_FIELD_NUMBER: _ClassVar[int]
    FUSION_PROFILE_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[SearchHit]
    degraded: bool
    degradations: _containers.RepeatedCompositeFieldContainer[Degradation]
    model: str
    fusion: SearchFusion
    conversation: Conversation
    embedded_models: _containers.RepeatedScalarFieldContainer[str]
    stage_times: _containers.RepeatedCompositeFieldContainer[SearchStageTime]
    fusion_profile: str
    def __init__(self, hits: _Optional[_Iterable[_Union[SearchHit, _Mapping]]] = ..., degraded: _Optional[bool] = ..., degradations: _Optional[_Iterable[_Union[Degradation, _Mapping]]] = ..., model: _Optional[str] = ..., fusion: _Optional[_Union[SearchFusion, str]] = ..., conversation: _Optional[_Union[Conversation, _Mapping]] = ..., embedded_models: _Optional[_Iterable[str]] = ..., stage_times: _Optional[_Iterable[_Union[SearchStageTime, _Mapping]]] = ..., fusion_profile: _Optional[str] = ...) -> None: ...

class TypoCorrection(_message.Message):
    __slots__ = ("term", "corrections")
    TERM_FIELD_NUMBER: _ClassVar[int]
    CORRECTIONS_FIELD_NUMBER: _ClassVar[int]
    term: str
    corrections: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, term: _Optional[str] = ..., corrections: _Optional[_Iterable[str]] = ...) -> None: ...
