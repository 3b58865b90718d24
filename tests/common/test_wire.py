"""Timestamps and durations from requests: out of their documented range is
INVALID_ARGUMENT, never an OverflowError or ValueError (INTERNAL); and responses'
timestamps."""

from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from dwsearch.common.errors import InvalidArgument
from dwsearch.common.wire import (
    MAX_TIMESTAMP_SECONDS,
    MIN_TIMESTAMP_SECONDS,
    to_datetime,
    to_seconds,
    to_timestamp,
)


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


@given(
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    st.one_of(st.none(), st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))),
)
def test_to_timestamp_is_from_datetime(value, zone):
    """Responses' timestamps as FromDatetime builds them, naive (UTC) or aware in any zone."""
    value = value if zone is None else value.replace(tzinfo=zone)
    expected = Timestamp()
    expected.FromDatetime(value)
    assert to_timestamp(value) == expected
