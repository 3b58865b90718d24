import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SweepRequest(_message.Message):
    __slots__ = ("org_id", "max_windows", "max_duration")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    MAX_DURATION_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    max_windows: int
    max_duration: _duration_pb2.Duration
    def __init__(self, org_id: _Optional[str] = ..., max_windows: _Optional[int] = ..., max_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class StalledKey(_message.Message):
    __slots__ = ("org_id", "provider", "external_channel_id", "error", "model")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_CHANNEL_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    provider: str
    external_channel_id: str
    error: str
    model: str
    def __init__(self, org_id: _Optional[str] = ..., provider: _Optional[str] = ..., external_channel_id: _Optional[str] = ..., error: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class SweepResponse(_message.Message):
    __slots__ = ("windows_embedded", "windows_skipped", "windows_poisoned", "keys_total", "keys_done", "keys_stalled", "keys_locked", "events_pending", "events_processed", "budget_exhausted", "model", "elapsed", "stalled", "done", "windows_dropped", "orgs_skipped", "models")
    WINDOWS_EMBEDDED_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_POISONED_FIELD_NUMBER: _ClassVar[int]
    KEYS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KEYS_DONE_FIELD_NUMBER: _ClassVar[int]
    KEYS_STALLED_FIELD_NUMBER: _ClassVar[int]
    KEYS_LOCKED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_PENDING_FIELD_NUMBER: _ClassVar[int]
    EVENTS_PROCESSED_FIELD_NUMBER: _ClassVar[int]
    BUDGET_EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_FIELD_NUMBER: _ClassVar[int]
    STALLED_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    ORGS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    windows_embedded: int
    windows_skipped: int
    windows_poisoned: int
    keys_total: int
    keys_done: int
    keys_stalled: int
    keys_locked: int
    events_pending: int
    events_processed: int
    budget_exhausted: bool
    model: str
    elapsed: _duration_pb2.Duration
    stalled: _containers.RepeatedCompositeFieldContainer[StalledKey]
    done: bool
    windows_dropped: int
    orgs_skipped: _containers.RepeatedCompositeFieldContainer[SkippedOrg]
    models: _containers.RepeatedCompositeFieldContainer[ModelSweep]
    def __init__(self, windows_embedded: _Optional[int] = ..., windows_skipped: _Optional[int] = ..., windows_poisoned: _Optional[int] = ..., keys_total: _Optional[int] = ..., keys_done: _Optional[int] = ..., keys_stalled: _Optional[int] = ..., keys_locked: _Optional[int] = ..., events_pending: _Optional[int] = ..., events_processed: _Optional[int] = ..., budget_exhausted: _Optional[bool] = ..., model: _Optional[str] = ..., elapsed: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., stalled: _Optional[_Iterable[_Union[StalledKey, _Mapping]]] = ..., done: _Optional[bool] = ..., windows_dropped: _Optional[int] = ..., orgs_skipped: _Optional[_Iterable[_Union[SkippedOrg, _Mapping]]] = ..., models: _Optional[_Iterable[_Union[ModelSweep, _Mapping]]] = ...) -> None: ...

class ModelSweep(_message.Message):
    __slots__ = ("model", "windows_embedded", "windows_skipped", "windows_poisoned", "keys_total", "keys_done", "keys_stalled", "keys_locked", "events_pending", "events_processed", "error")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_EMBEDDED_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_POISONED_FIELD_NUMBER: _ClassVar[int]
    KEYS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KEYS_DONE_FIELD_NUMBER: _ClassVar[int]
    KEYS_STALLED_FIELD_NUMBER: _ClassVar[int]
    KEYS_LOCKED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_PENDING_FIELD_NUMBER: _ClassVar[int]
    EVENTS_PROCESSED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    model: str
    windows_embedded: int
    windows_skipped: int
    windows_poisoned: int
    keys_total: int
    keys_done: int
    keys_stalled: int
    keys_locked: int
    events_pending: int
    events_processed: int
    error: str
    def __init__(self, model: _Optional[str] = ..., windows_embedded: _Optional[int] = ..., windows_skipped: _Optional[int] = ..., windows_poisoned: _Optional[int] = ..., keys_total: _Optional[int] = ..., keys_done: _Optional[int] = ..., keys_stalled: _Optional[int] = ..., keys_locked: _Optional[int] = ..., events_pending: _Optional[int] = ..., events_processed: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class SkippedOrg(_message.Message):
    __slots__ = ("org_id", "reason")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    reason: str
    def __init__(self, org_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("org_id", "model")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    model: str
    def __init__(self, org_id: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class Watermark(_message.Message):
    __slots__ = ("org_id", "provider", "external_channel_id", "model", "last_event_time", "last_event_id", "updated_at", "pending_events", "lag", "consecutive_failures", "last_error")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_CHANNEL_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LAST_EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    PENDING_EVENTS_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    provider: str
    external_channel_id: str
    model: str
    last_event_time: _timestamp_pb2.Timestamp
    last_event_id: str
    updated_at: _timestamp_pb2.Timestamp
    pending_events: int
    lag: _duration_pb2.Duration
    consecutive_failures: int
    last_error: str
    def __init__(self, org_id: _Optional[str] = ..., provider: _Optional[str] = ..., external_channel_id: _Optional[str] = ..., model: _Optional[str] = ..., last_event_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_event_id: _Optional[str] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pending_events: _Optional[int] = ..., lag: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., consecutive_failures: _Optional[int] = ..., last_error: _Optional[str] = ...) -> None: ...

class PoisonWindow(_message.Message):
    __slots__ = ("id", "org_id", "provider", "external_channel_id", "model", "window_start", "window_end", "source_message_ids", "error", "attempts", "created_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_CHANNEL_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_FIELD_NUMBER: _ClassVar[int]
    WINDOW_END_FIELD_NUMBER: _ClassVar[int]
    SOURCE_MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    org_id: str
    provider: str
    external_channel_id: str
    model: str
    window_start: _timestamp_pb2.Timestamp
    window_end: _timestamp_pb2.Timestamp
    source_message_ids: _containers.RepeatedScalarFieldContainer[str]
    error: str
    attempts: int
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., org_id: _Optional[str] = ..., provider: _Optional[str] = ..., external_channel_id: _Optional[str] = ..., model: _Optional[str] = ..., window_start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., window_end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., source_message_ids: _Optional[_Iterable[str]] = ..., error: _Optional[str] = ..., attempts: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("model", "watermarks", "poison_windows", "embedded_windows", "pending_events", "unswept_events", "unswept_lag")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WATERMARKS_FIELD_NUMBER: _ClassVar[int]
    POISON_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDED_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    PENDING_EVENTS_FIELD_NUMBER: _ClassVar[int]
    UNSWEPT_EVENTS_FIELD_NUMBER: _ClassVar[int]
    UNSWEPT_LAG_FIELD_NUMBER: _ClassVar[int]
    model: str
    watermarks: _containers.RepeatedCompositeFieldContainer[Watermark]
    poison_windows: _containers.RepeatedCompositeFieldContainer[PoisonWindow]
    embedded_windows: int
    pending_events: int
    unswept_events: int
    unswept_lag: _duration_pb2.Duration
    def __init__(self, model: _Optional[str] = ..., watermarks: _Optional[_Iterable[_Union[Watermark, _Mapping]]] = ..., poison_windows: _Optional[_Iterable[_Union[PoisonWindow, _Mapping]]] = ..., embedded_windows: _Optional[int] = ..., pending_events: _Optional[int] = ..., unswept_events: _Optional[int] = ..., unswept_lag: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class PurgeRequest(_message.Message):
    __slots__ = ("org_id", "cutoff")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    CUTOFF_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    cutoff: _timestamp_pb2.Timestamp
    def __init__(self, org_id: _Optional[str] = ..., cutoff: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PurgeResponse(_message.Message):
    __slots__ = ("embeddings_deleted", "poison_windows_deleted")
    EMBEDDINGS_DELETED_FIELD_NUMBER: _ClassVar[int]
    POISON_WINDOWS_DELETED_FIELD_NUMBER: _ClassVar[int]
    embeddings_deleted: int
    poison_windows_deleted: int
    def __init__(self, embeddings_deleted: _Optional[int] = ..., poison_windows_deleted: _Optional[int] = ...) -> None: ...

class ForgetRequest(_message.Message):
    __slots__ = ("org_id", "message_ids")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, org_id: _Optional[str] = ..., message_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ForgetResponse(_message.Message):
    __slots__ = ("windows_dropped",)
    WINDOWS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    windows_dropped: int
    def __init__(self, windows_dropped: _Optional[int] = ...) -> None: ...

class RetryPoisonRequest(_message.Message):
    __slots__ = ("org_id", "ids")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, org_id: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RetryPoisonResponse(_message.Message):
    __slots__ = ("windows_released",)
    WINDOWS_RELEASED_FIELD_NUMBER: _ClassVar[int]
    windows_released: int
    def __init__(self, windows_released: _Optional[int] = ...) -> None: ...
