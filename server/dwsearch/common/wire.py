"""Well-known protobuf types from a request, checked before use: a Timestamp or Duration
outside its documented range is INVALID_ARGUMENT, never an OverflowError or ValueError
(INTERNAL) from the conversion; and a datetime as a Timestamp for a response."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from dwsearch.common.errors import InvalidArgument

# google/protobuf/timestamp.proto: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999999Z.
MIN_TIMESTAMP_SECONDS = -62_135_596_800
MAX_TIMESTAMP_SECONDS = 253_402_300_799
# google/protobuf/duration.proto: about ±10,000 years.
MAX_DURATION_SECONDS = 315_576_000_000
NANOS_PER_SECOND = 1_000_000_000


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_timestamp(value: datetime) -> Timestamp:
    """`value` as a Timestamp (a naive datetime is UTC): what Timestamp.FromDatetime gives,
    built by its constructor in integer arithmetic (FromDatetime costs twice as much, and a
    search response carries two per hit and one per context message)."""
    delta = (value if value.tzinfo is not None else value.replace(tzinfo=UTC)) - _EPOCH
    return Timestamp(seconds=delta.days * 86_400 + delta.seconds, nanos=delta.microseconds * 1000)


def to_datetime(value: Timestamp, name: str) -> datetime:
    """A request's Timestamp as an aware UTC datetime."""
    if not MIN_TIMESTAMP_SECONDS <= value.seconds <= MAX_TIMESTAMP_SECONDS:
        raise InvalidArgument(f"{name}: seconds {value.seconds} is outside years 1 to 9999")
    if not 0 <= value.nanos < NANOS_PER_SECOND:
        raise InvalidArgument(f"{name}: nanos {value.nanos} is outside 0 to 999999999")
    return value.ToDatetime(tzinfo=UTC)


def to_seconds(value: Duration, name: str) -> float:
    """A request's Duration in seconds (negative allowed: the caller decides)."""
    if abs(value.seconds) > MAX_DURATION_SECONDS:
        raise InvalidArgument(
            f"{name}: {value.seconds} seconds is beyond ±{MAX_DURATION_SECONDS} (10,000 years)"
        )
    mixed_signs = value.seconds and value.nanos and (value.seconds > 0) != (value.nanos > 0)
    if abs(value.nanos) >= NANOS_PER_SECOND or mixed_signs:
        raise InvalidArgument(f"{name}: nanos {value.nanos} is out of range or of the wrong sign")
    return value.seconds + value.nanos / NANOS_PER_SECOND
