from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_UNSPECIFIED: _ClassVar[Priority]
    PRIORITY_INTERACTIVE: _ClassVar[Priority]
    PRIORITY_BULK: _ClassVar[Priority]

class InputType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INPUT_TYPE_UNSPECIFIED: _ClassVar[InputType]
    INPUT_TYPE_QUERY: _ClassVar[InputType]
    INPUT_TYPE_DOCUMENT: _ClassVar[InputType]
PRIORITY_UNSPECIFIED: Priority
PRIORITY_INTERACTIVE: Priority
PRIORITY_BULK: Priority
INPUT_TYPE_UNSPECIFIED: InputType
INPUT_TYPE_QUERY: InputType
INPUT_TYPE_DOCUMENT: InputType

class EmbedRequest(_message.Message):
    __slots__ = ("inputs", "input_type", "dense", "sparse", "normalize", "truncate", "priority", "model")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    INPUT_TYPE_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    input_type: InputType
    dense: bool
    sparse: bool
    normalize: bool
    truncate: bool
    priority: Priority
    model: str
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., input_type: _Optional[_Union[InputType, str]] = ..., dense: _Optional[bool] = ..., sparse: _Optional[bool] = ..., normalize: _Optional[bool] = ..., truncate: _Optional[bool] = ..., priority: _Optional[_Union[Priority, str]] = ..., model: _Optional[str] = ...) -> None: ...

class SparseVector(_message.Message):
    __slots__ = ("indices", "values")
    INDICES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, indices: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("dense", "sparse", "token_count", "truncated")
    DENSE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    dense: _containers.RepeatedScalarFieldContainer[float]
    sparse: SparseVector
    token_count: int
    truncated: bool
    def __init__(self, dense: _Optional[_Iterable[float]] = ..., sparse: _Optional[_Union[SparseVector, _Mapping]] = ..., token_count: _Optional[int] = ..., truncated: _Optional[bool] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "model_id", "dimension", "total_tokens")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[Embedding]
    model_id: str
    dimension: int
    total_tokens: int
    def __init__(self, embeddings: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ..., model_id: _Optional[str] = ..., dimension: _Optional[int] = ..., total_tokens: _Optional[int] = ...) -> None: ...

class CountTokensRequest(_message.Message):
    __slots__ = ("inputs", "input_type", "model")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    INPUT_TYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    input_type: InputType
    model: str
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., input_type: _Optional[_Union[InputType, str]] = ..., model: _Optional[str] = ...) -> None: ...

class CountTokensResponse(_message.Message):
    __slots__ = ("token_counts", "max_input_tokens")
    TOKEN_COUNTS_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    token_counts: _containers.RepeatedScalarFieldContainer[int]
    max_input_tokens: int
    def __init__(self, token_counts: _Optional[_Iterable[int]] = ..., max_input_tokens: _Optional[int] = ...) -> None: ...

class EmbedderServiceInfoRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class EmbedderServiceInfoResponse(_message.Message):
    __slots__ = ("model_id", "revision", "backend", "dimension", "max_input_tokens", "sparse_supported", "device", "dtype", "max_batch_tokens", "max_inputs_per_request", "sparse_dimension", "runtime", "query_latency_ms", "served_models", "runtime_report", "queued_interactive", "queued_bulk")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPARSE_SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUTS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    SPARSE_DIMENSION_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    QUERY_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    SERVED_MODELS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_REPORT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_INTERACTIVE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_BULK_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    revision: str
    backend: str
    dimension: int
    max_input_tokens: int
    sparse_supported: bool
    device: str
    dtype: str
    max_batch_tokens: int
    max_inputs_per_request: int
    sparse_dimension: int
    runtime: str
    query_latency_ms: float
    served_models: _containers.RepeatedScalarFieldContainer[str]
    runtime_report: ModelRuntimeReport
    queued_interactive: int
    queued_bulk: int
    def __init__(self, model_id: _Optional[str] = ..., revision: _Optional[str] = ..., backend: _Optional[str] = ..., dimension: _Optional[int] = ..., max_input_tokens: _Optional[int] = ..., sparse_supported: _Optional[bool] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., max_batch_tokens: _Optional[int] = ..., max_inputs_per_request: _Optional[int] = ..., sparse_dimension: _Optional[int] = ..., runtime: _Optional[str] = ..., query_latency_ms: _Optional[float] = ..., served_models: _Optional[_Iterable[str]] = ..., runtime_report: _Optional[_Union[ModelRuntimeReport, _Mapping]] = ..., queued_interactive: _Optional[int] = ..., queued_bulk: _Optional[int] = ...) -> None: ...

class ModelRuntimeReport(_message.Message):
    __slots__ = ("cpu_class", "quantization", "quantization_check", "note")
    CPU_CLASS_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_CHECK_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    cpu_class: str
    quantization: str
    quantization_check: QuantizationCheck
    note: str
    def __init__(self, cpu_class: _Optional[str] = ..., quantization: _Optional[str] = ..., quantization_check: _Optional[_Union[QuantizationCheck, _Mapping]] = ..., note: _Optional[str] = ...) -> None: ...

class QuantizationCheck(_message.Message):
    __slots__ = ("passed", "cpu_class", "probes", "dense_cosine_mean", "dense_cosine_min", "sparse_top_terms_same", "rerank_order_same", "rerank_logit_max_diff", "failure")
    PASSED_FIELD_NUMBER: _ClassVar[int]
    CPU_CLASS_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    DENSE_COSINE_MEAN_FIELD_NUMBER: _ClassVar[int]
    DENSE_COSINE_MIN_FIELD_NUMBER: _ClassVar[int]
    SPARSE_TOP_TERMS_SAME_FIELD_NUMBER: _ClassVar[int]
    RERANK_ORDER_SAME_FIELD_NUMBER: _ClassVar[int]
    RERANK_LOGIT_MAX_DIFF_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    passed: bool
    cpu_class: str
    probes: int
    dense_cosine_mean: float
    dense_cosine_min: float
    sparse_top_terms_same: float
    rerank_order_same: float
    rerank_logit_max_diff: float
    failure: str
    def __init__(self, passed: _Optional[bool] = ..., cpu_class: _Optional[str] = ..., probes: _Optional[int] = ..., dense_cosine_mean: _Optional[float] = ..., dense_cosine_min: _Optional[float] = ..., sparse_top_terms_same: _Optional[float] = ..., rerank_order_same: _Optional[float] = ..., rerank_logit_max_diff: _Optional[float] = ..., failure: _Optional[str] = ...) -> None: ...
