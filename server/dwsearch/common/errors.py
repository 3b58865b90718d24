"""Domain errors, and the one classification of any error a caller may see.

Each domain error has a kind (`Kind`, google.rpc's canonical codes) and no transport's
type: each transport maps a kind with its one table, gRPC's status in
dwsearch.common.grpcstatus and the HTTP status of every HTTP port in
dwsearch.common.httpstatus. `classify` turns any exception a request raised (a domain
error, a timeout, the database's errors) into its kind and the message the caller sees.
The gRPC interceptor (dwsearch.common.interceptor), the REST app (dwsearch.rest.app) and
the model servers' HTTP ports (dwsearch.modelserver.http) all answer with it, so a
Postgres outage is UNAVAILABLE on gRPC and 503 on REST alike."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.Enum):
    """What went wrong, in google.rpc's canonical codes (google/rpc/code.proto, whose
    numbers these are): the one vocabulary both gRPC's status codes and HTTP's statuses
    are mapped from. The domain raises some (one per error class below); the others are
    here so that whatever status another process answers has a kind (e.g. UNIMPLEMENTED,
    from a service a process does not host)."""

    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


SERVER_FAULTS = frozenset({Kind.INTERNAL, Kind.UNKNOWN, Kind.DATA_LOSS})
"""The kinds that are a server's fault (a bug, a broken model), not the caller's or a
dependency's: logged with their cause, and said to a caller as INTERNAL_MESSAGE only."""


class DwsearchError(Exception):
    """Base of every error a caller may see; `kind` is what went wrong."""

    kind: Kind = Kind.INTERNAL


class InvalidArgument(DwsearchError):
    """The request is malformed; retrying it unchanged fails again."""

    kind = Kind.INVALID_ARGUMENT


class NotFound(DwsearchError):
    kind = Kind.NOT_FOUND


class FailedPrecondition(DwsearchError):
    """The system is not in a state to do this (e.g. the embedder serves another model)."""

    kind = Kind.FAILED_PRECONDITION


class ResourceExhausted(DwsearchError):
    """Overloaded (a full queue); retry later."""

    kind = Kind.RESOURCE_EXHAUSTED


class Unavailable(DwsearchError):
    """A dependency (database, embedder, reranker) cannot be reached; transient."""

    kind = Kind.UNAVAILABLE


class DeadlineExceeded(DwsearchError):
    kind = Kind.DEADLINE_EXCEEDED


class Unauthenticated(DwsearchError):
    kind = Kind.UNAUTHENTICATED


class PermissionDenied(DwsearchError):
    """A valid token whose scope does not include the method."""

    kind = Kind.PERMISSION_DENIED


class Internal(DwsearchError):
    """A bug or a broken model output (e.g. NaN); logged with its cause."""

    kind = Kind.INTERNAL


class Cancelled(DwsearchError):
    kind = Kind.CANCELLED


class StartupError(DwsearchError):
    """The service cannot start: its model cannot be found or loaded, or its settings
    contradict each other."""


INTERNAL_MESSAGE = "internal error"
"""What a caller sees of an unexpected error (the cause is logged, never sent: no SQL, no
paths); the REST API says it for every internal one."""


@dataclass(frozen=True)
class Classified:
    """What the caller of a failed request sees: its kind (each transport's table gives
    the status) and the message."""

    kind: Kind
    message: str

    @property
    def internal(self) -> bool:
        """A server fault (logged with its cause), not the caller's or a dependency's."""
        return self.kind in SERVER_FAULTS


def classify(exc: BaseException) -> Classified:
    """The kind and message a request that raised `exc` answers with."""
    if isinstance(exc, DwsearchError):  # our own words: no SQL, no paths
        return Classified(exc.kind, str(exc) or type(exc).__name__)
    if isinstance(exc, TimeoutError):
        return Classified(Kind.DEADLINE_EXCEEDED, str(exc) or "deadline exceeded")
    if isinstance(exc, UnicodeEncodeError):
        # JSON's "\ud800" escapes decode to text no database (nor UTF-8) can hold.
        return Classified(Kind.INVALID_ARGUMENT, "text holds an unpaired surrogate (not UTF-8)")
    try:  # the server extra is optional for the model processes
        import psycopg
        import psycopg.errors

        if isinstance(exc, psycopg.errors.QueryCanceled):  # statement_timeout (store.bounded)
            return Classified(
                Kind.DEADLINE_EXCEEDED,
                "the query ran past the statement timeout; narrow its filter",
            )
        if isinstance(exc, psycopg.OperationalError):
            return Classified(Kind.UNAVAILABLE, f"database unavailable: {exc}".strip())
        # SQLSTATE class 22: a value the database cannot take (a NUL in text, out of
        # range); it came with the request, so retrying it unchanged fails again.
        if isinstance(exc, psycopg.DataError):
            return Classified(Kind.INVALID_ARGUMENT, f"invalid value: {exc}".strip())
    except ImportError:  # pragma: no cover
        pass
    return Classified(Kind.INTERNAL, INTERNAL_MESSAGE)
