"""The domain errors' kinds and each transport's table of them: gRPC's
(dwsearch.common.grpcstatus) and every HTTP port's (dwsearch.common.httpstatus). The
statuses are the API's: a change here changes what every client sees."""

from __future__ import annotations

import grpc
import psycopg
import pytest

from dwsearch.clients.channel import ServiceUnavailable, translate
from dwsearch.common import errors
from dwsearch.common.errors import Kind, classify
from dwsearch.common.grpcstatus import GRPC_STATUS, kind_of
from dwsearch.common.httpstatus import HTTP_STATUS, http_status

# Each domain error, the gRPC status and the HTTP status a caller sees of it.
STATUSES = [
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT, 400),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND, 404),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION, 400),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE, 503),
    (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED, 504),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED, 401),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED, 403),
    (errors.Internal, grpc.StatusCode.INTERNAL, 500),
    (errors.Cancelled, grpc.StatusCode.CANCELLED, 499),
    (errors.StartupError, grpc.StatusCode.INTERNAL, 500),
    (errors.DwsearchError, grpc.StatusCode.INTERNAL, 500),
    (ServiceUnavailable, grpc.StatusCode.UNAVAILABLE, 503),
]


@pytest.mark.parametrize(("error", "code", "status"), STATUSES, ids=lambda v: getattr(v, "__name__", v))
def test_each_domain_error_answers_its_status_on_each_transport(error, code, status):
    classified = classify(error("what went wrong"))
    assert classified.message == "what went wrong"
    assert GRPC_STATUS[classified.kind] is code
    assert http_status(classified.kind) == status
    assert classified.internal == (code is grpc.StatusCode.INTERNAL)


def test_every_grpc_status_but_ok_is_one_kind_of_the_same_name():
    assert sorted(GRPC_STATUS.values(), key=lambda c: c.name) == sorted(
        (c for c in grpc.StatusCode if c is not grpc.StatusCode.OK), key=lambda c: c.name
    )
    for kind, code in GRPC_STATUS.items():
        assert code.name == kind.name
        assert kind_of(code) is kind
    assert kind_of(grpc.StatusCode.OK) is Kind.UNKNOWN


def test_the_http_statuses_are_google_rpcs_mapping():
    assert {kind.name: status for kind, status in HTTP_STATUS.items()} == {
        "INVALID_ARGUMENT": 400,
        "FAILED_PRECONDITION": 400,
        "OUT_OF_RANGE": 400,
        "UNAUTHENTICATED": 401,
        "PERMISSION_DENIED": 403,
        "NOT_FOUND": 404,
        "ALREADY_EXISTS": 409,
        "ABORTED": 409,
        "RESOURCE_EXHAUSTED": 429,
        "CANCELLED": 499,
        "UNIMPLEMENTED": 501,
        "UNAVAILABLE": 503,
        "DEADLINE_EXCEEDED": 504,
    }
    assert [http_status(k) for k in (Kind.INTERNAL, Kind.UNKNOWN, Kind.DATA_LOSS)] == [500, 500, 500]


@pytest.mark.parametrize(
    ("exc", "code", "status", "message"),
    [
        (TimeoutError(), grpc.StatusCode.DEADLINE_EXCEEDED, 504, "deadline exceeded"),
        (
            UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
            grpc.StatusCode.INVALID_ARGUMENT,
            400,
            "text holds an unpaired surrogate (not UTF-8)",
        ),
        (
            psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
            grpc.StatusCode.DEADLINE_EXCEEDED,
            504,
            "the query ran past the statement timeout; narrow its filter",
        ),
        (
            psycopg.OperationalError("connection refused"),
            grpc.StatusCode.UNAVAILABLE,
            503,
            "database unavailable: connection refused",
        ),
        (
            psycopg.errors.StringDataRightTruncation("value too long"),
            grpc.StatusCode.INVALID_ARGUMENT,
            400,
            "invalid value: value too long",
        ),
        (RuntimeError("/srv/secret/path exploded"), grpc.StatusCode.INTERNAL, 500, errors.INTERNAL_MESSAGE),
    ],
    ids=lambda v: type(v).__name__,
)
def test_other_exceptions_are_classified_once_for_both_transports(exc, code, status, message):
    classified = classify(exc)
    assert (GRPC_STATUS[classified.kind], http_status(classified.kind), classified.message) == (
        code,
        status,
        message,
    )
    assert classified.internal == (code is grpc.StatusCode.INTERNAL)


def test_a_model_services_status_is_read_back_into_its_domain_error():
    """The clients read a status through the same gRPC table; what they do not translate
    (a refused scope, a bug on the far side) is Internal."""
    read_back = {
        grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
        grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
        grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
        grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
        grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
        grpc.StatusCode.NOT_FOUND: errors.NotFound,
        grpc.StatusCode.CANCELLED: errors.Cancelled,
        grpc.StatusCode.UNAVAILABLE: ServiceUnavailable,
    }
    for code in grpc.StatusCode:
        if code is grpc.StatusCode.OK:
            continue
        failed = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="no")
        error = translate(failed, "embedder")
        assert type(error) is read_back.get(code, errors.Internal), code
        assert str(error) == "embedder: no"
        if code in read_back:
            assert GRPC_STATUS[error.kind] is code
