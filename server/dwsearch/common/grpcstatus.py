"""Each error kind as a gRPC status: the gRPC transport's one table.

The interceptor answers a servicer's error with it (dwsearch.common.interceptor), the
model servers' HTTP ports label their request metrics with it as gRPC calls are labelled
(dwsearch.modelserver.http), and what reads another process's status reads it back
through it: the clients into a domain error (dwsearch.clients.channel), the console into
an HTTP status (dwsearch.console.app)."""

from __future__ import annotations

import grpc

from dwsearch.common.errors import Kind

GRPC_STATUS: dict[Kind, grpc.StatusCode] = {
    Kind.CANCELLED: grpc.StatusCode.CANCELLED,
    Kind.UNKNOWN: grpc.StatusCode.UNKNOWN,
    Kind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Kind.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    Kind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Kind.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Kind.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    Kind.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Kind.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Kind.ABORTED: grpc.StatusCode.ABORTED,
    Kind.OUT_OF_RANGE: grpc.StatusCode.OUT_OF_RANGE,
    Kind.UNIMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
    Kind.INTERNAL: grpc.StatusCode.INTERNAL,
    Kind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Kind.DATA_LOSS: grpc.StatusCode.DATA_LOSS,
    Kind.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
}
"""Every kind's gRPC status: the code of the same name (gRPC's codes are google.rpc's)."""

_KIND_OF = {status: kind for kind, status in GRPC_STATUS.items()}


def kind_of(status: grpc.StatusCode) -> Kind:
    """The kind of a status another process answered (GRPC_STATUS read backwards); OK,
    which no failure has, is UNKNOWN."""
    return _KIND_OF.get(status, Kind.UNKNOWN)
