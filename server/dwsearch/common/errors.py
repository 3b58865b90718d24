"""Domain errors. Each carries the gRPC status it maps to; the interceptor in
dwsearch.common.interceptor is the one place where they become statuses."""

from __future__ import annotations

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
