"""Each error kind as an HTTP status: the one table of every HTTP port (the REST API in
dwsearch.rest.app, the console in dwsearch.console.app, the model servers' HTTP ports in
dwsearch.modelserver.http). It imports no gRPC: an HTTP answer does not go through a
gRPC status on its way."""

from __future__ import annotations

from dwsearch.common.errors import Kind

HTTP_STATUS: dict[Kind, int] = {
    Kind.INVALID_ARGUMENT: 400,
    Kind.FAILED_PRECONDITION: 400,
    Kind.OUT_OF_RANGE: 400,
    Kind.UNAUTHENTICATED: 401,
    Kind.PERMISSION_DENIED: 403,
    Kind.NOT_FOUND: 404,
    Kind.ALREADY_EXISTS: 409,
    Kind.ABORTED: 409,
    Kind.RESOURCE_EXHAUSTED: 429,
    Kind.CANCELLED: 499,
    Kind.UNIMPLEMENTED: 501,
    Kind.UNAVAILABLE: 503,
    Kind.DEADLINE_EXCEEDED: 504,
}
"""Each kind as HTTP (google.rpc's mapping); any other kind is 500."""


def http_status(kind: Kind) -> int:
    return HTTP_STATUS.get(kind, 500)
