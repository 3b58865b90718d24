"""Timestamps and durations from requests: out of their documented range is
INVALID_ARGUMENT, never an OverflowError or ValueError (INTERNAL)."""

from datetime import UTC, datetime

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from dwsearch.common.errors import InvalidArgument
from dwsearch.common.wire import MAX_TIMESTAMP_SECONDS, MIN_TIMESTAMP_SECONDS, to_datetime, to_seconds


def test_timestamps_in_range_convert_to_aware_utc():
    assert to_datetime(Timestamp(seconds=0, nanos=500_000_000), "t") == datetime(
        1970, 1, 1, 0, 0, 0, 500_000, tzinfo=UTC
    )
    assert to_datetime(Timestamp(seconds=MIN_TIMESTAMP_SECONDS), "t").year == 1
    assert to_datetime(Timestamp(seconds=MAX_TIMESTAMP_SECONDS, nanos=999_999_999), "t").year == 9999


@pytest.mark.parametrize(
    "seconds, nanos",
    [
        (MIN_TIMESTAMP_SECONDS - 1, 0),
        (MAX_TIMESTAMP_SECONDS + 1, 0),
        (2**62, 0),
        (-(2**62), 0),
        (0, 10**9),
        (0, -1),
    ],
)
def test_timestamps_out_of_range_are_invalid_arguments_naming_the_field(seconds, nanos):
    with pytest.raises(InvalidArgument, match=r"^start_time: "):
        to_datetime(Timestamp(seconds=seconds, nanos=nanos), "start_time")


def test_durations():
    assert to_seconds(Duration(seconds=90, nanos=500_000_000), "d") == 90.5
    assert to_seconds(Duration(seconds=-1, nanos=-500_000_000), "d") == -1.5
    assert to_seconds(Duration(seconds=315_576_000_000), "d") == 315_576_000_000


@pytest.mark.parametrize(
    "seconds, nanos",
    [(2**62, 0), (-(2**62), 0), (315_576_000_001, 0), (1, 10**9), (0, -(10**9)), (1, -1), (-1, 1)],
)
def test_durations_out_of_range_or_of_mixed_signs_are_invalid_arguments(seconds, nanos):
    with pytest.raises(InvalidArgument, match=r"^max_duration: "):
        to_seconds(Duration(seconds=seconds, nanos=nanos), "max_duration")
