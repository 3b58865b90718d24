from dwsearch.v1 import embedder_pb2 as _embedder_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RerankRequest(_message.Message):
    __slots__ = ("query", "documents", "top_n", "raw_scores", "priority")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    TOP_N_FIELD_NUMBER: _ClassVar[int]
    RAW_SCORES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    query: str
    documents: _containers.RepeatedScalarFieldContainer[str]
    top_n: int
    raw_scores: bool
    priority: _embedder_pb2.Priority
    def __init__(self, query: _Optional[str] = ..., documents: _Optional[_Iterable[str]] = ..., top_n: _Optional[int] = ..., raw_scores: _Optional[bool] = ..., priority: _Optional[_Union[_embedder_pb2.Priority, str]] = ...) -> None: ...

class RerankResult(_message.Message):
    __slots__ = ("index", "score")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    index: int
    score: float
    def __init__(self, index: _Optional[int] = ..., score: _Optional[float] = ...) -> None: ...

class RerankResponse(_message.Message):
    __slots__ = ("results", "model_id")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[RerankResult]
    model_id: str
    def __init__(self, results: _Optional[_Iterable[_Union[RerankResult, _Mapping]]] = ..., model_id: _Optional[str] = ...) -> None: ...

class RerankerServiceInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RerankerServiceInfoResponse(_message.Message):
    __slots__ = ("model_id", "revision", "max_length", "device", "dtype", "max_batch_tokens", "max_documents_per_request", "runtime", "runtime_report", "queued_interactive", "queued_bulk")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    MAX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_DOCUMENTS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_REPORT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_INTERACTIVE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_BULK_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    revision: str
    max_length: int
    device: str
    dtype: str
    max_batch_tokens: int
    max_documents_per_request: int
    runtime: str
    runtime_report: _embedder_pb2.ModelRuntimeReport
    queued_interactive: int
    queued_bulk: int
    def __init__(self, model_id: _Optional[str] = ..., revision: _Optional[str] = ..., max_length: _Optional[int] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., max_batch_tokens: _Optional[int] = ..., max_documents_per_request: _Optional[int] = ..., runtime: _Optional[str] = ..., runtime_report: _Optional[_Union[_embedder_pb2.ModelRuntimeReport, _Mapping]] = ..., queued_interactive: _Optional[int] = ..., queued_bulk: _Optional[int] = ...) -> None: ...
