"""Domain errors, and the one classification of any error a caller may see.

Each domain error carries the gRPC status it maps to. `classify` turns any exception a
request raised (a domain error, a timeout, the database's errors) into what the caller
sees: the gRPC status, its HTTP status (HTTP_STATUS) and the message. The gRPC
interceptor (dwsearch.common.interceptor) and the REST app (dwsearch.rest.app) both answer
with it, so a Postgres outage is UNAVAILABLE on gRPC and 503 on REST alike."""

from __future__ import annotations

from dataclasses import dataclass

import grpc


class DwsearchError(Exception):
    """Base of every error a caller may see; `code` is its gRPC status."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgument(DwsearchError):
    """The request is malformed; retrying it unchanged fails again."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(DwsearchError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(DwsearchError):
    """The system is not in a state to do this (e.g. the embedder serves another model)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(DwsearchError):
    """Overloaded (a full queue); retry later."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(DwsearchError):
    """A dependency (database, embedder, reranker) cannot be reached; transient."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(DwsearchError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unauthenticated(DwsearchError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(DwsearchError):
    """A valid token whose scope does not include the method."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Internal(DwsearchError):
    """A bug or a broken model output (e.g. NaN); logged with its cause."""

    code = grpc.StatusCode.INTERNAL


class Cancelled(DwsearchError):
    code = grpc.StatusCode.CANCELLED


class StartupError(DwsearchError):
    """The service cannot start: its model cannot be found or loaded, or its settings
    contradict each other."""


HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
"""Each gRPC status as HTTP (google.rpc's mapping); anything else is 500."""

INTERNAL_MESSAGE = "internal error"
"""What a caller sees of an unexpected error (the cause is logged, never sent: no SQL, no
paths); the REST API says it for every internal one."""


@dataclass(frozen=True)
class Classified:
    """What the caller of a failed request sees."""

    code: grpc.StatusCode
    message: str

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

    @property
    def internal(self) -> bool:
        """A server fault (logged with its cause), not the caller's or a dependency's."""
        return self.http_status >= 500 and self.code not in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.UNIMPLEMENTED,
        )


def classify(exc: BaseException) -> Classified:
    """The status and message a request that raised `exc` answers with."""
    if isinstance(exc, DwsearchError):  # our own words: no SQL, no paths
        return Classified(exc.code, str(exc) or type(exc).__name__)
    if isinstance(exc, TimeoutError):
        return Classified(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc) or "deadline exceeded")
    if isinstance(exc, UnicodeEncodeError):
        # JSON's "\ud800" escapes decode to text no database (nor UTF-8) can hold.
        return Classified(grpc.StatusCode.INVALID_ARGUMENT, "text holds an unpaired surrogate (not UTF-8)")
    try:  # the server extra is optional for the model processes
        import psycopg
        import psycopg.errors

        if isinstance(exc, psycopg.errors.QueryCanceled):  # statement_timeout (store.bounded)
            return Classified(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "the query ran past the statement timeout; narrow its filter",
            )
        if isinstance(exc, psycopg.OperationalError):
            return Classified(grpc.StatusCode.UNAVAILABLE, f"database unavailable: {exc}".strip())
        # SQLSTATE class 22: a value the database cannot take (a NUL in text, out of
        # range); it came with the request, so retrying it unchanged fails again.
        if isinstance(exc, psycopg.DataError):
            return Classified(grpc.StatusCode.INVALID_ARGUMENT, f"invalid value: {exc}".strip())
    except ImportError:  # pragma: no cover
        pass
    return Classified(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
