"""Client channels to the model services: client-side round robin over every address a
DNS name resolves to, retries on UNAVAILABLE for the cheap calls only (gRPC's own retry
policy, with exponential backoff), a deadline on every call, and one error type per
failure kind."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import grpc

from dwsearch.common import errors, tracing
from dwsearch.common.grpcstatus import GRPC_STATUS
from dwsearch.common.tls import ClientTls

# Retry only what is safe and transient. An UNAVAILABLE does not prove that the call
# never reached a servicer: a call still running when its connection is closed under it
# (the model service's max connection age plus grace, a pod killed mid-call) also ends
# UNAVAILABLE, and gRPC's retryPolicy would send it again: the model would run the same
# inputs twice. So the policy covers only the calls that cost next to nothing and change
# nothing (Info, CountTokens). Embed and Rerank get no retryPolicy: gRPC still retries
# them transparently when they never left the client (a stream refused, a GOAWAY before
# the call was sent), and a call that failed after that is the caller's to handle:
# search degrades to full text, the sweep stalls the key until its next run, an Index
# caller sees UNAVAILABLE.
RETRY_POLICY = {
    "maxAttempts": 4,
    "initialBackoff": "0.05s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
RETRIED_METHODS = ("Info", "CountTokens")


def service_config(service_names: list[str]) -> str:
    return json.dumps(
        {
            "loadBalancingConfig": [{"round_robin": {}}],
            "methodConfig": [
                {
                    "name": [
                        {"service": name, "method": method}
                        for name in service_names
                        for method in RETRIED_METHODS
                    ],
                    "retryPolicy": RETRY_POLICY,
                }
            ],
        }
    )


def dial(
    target: str, tls: ClientTls | None = None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.aio.Channel:
    """An aio channel to another dwsearch process: TLS when `tls` is given, else plaintext;
    when tracing, each call is a client span whose traceparent goes in its metadata."""
    interceptors = tracing.grpc_client_interceptors() or None
    if tls is None:
        return grpc.aio.insecure_channel(target, options=list(options), interceptors=interceptors)
    return grpc.aio.secure_channel(
        target, tls.credentials(), options=list(options), interceptors=interceptors
    )


def open_channel(target: str, service_names: list[str], tls: ClientTls | None = None) -> grpc.aio.Channel:
    """A channel to a model service at `target` (e.g. `dns:///dwsearch-embedder:50052`,
    which resolves a headless Service to every pod; new pods join when the server's
    max-connection-age makes clients re-resolve)."""
    return dial(
        target,
        tls,
        options=[
            ("grpc.service_config", service_config(service_names)),
            ("grpc.enable_retries", 1),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.dns_min_time_between_resolutions_ms", 5_000),
            # A restarted pod is reconnected within seconds, not gRPC's default 2 minutes.
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 5_000),
        ],
    )


class ServiceUnavailable(errors.Unavailable):
    """A model service cannot be reached (down, restarting or not configured)."""


def auth_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


# The errors a model service's status is read back into, each keyed by its kind's status
# (the one gRPC table, dwsearch.common.grpcstatus); any other status is Internal.
_CODE_TO_ERROR: dict[grpc.StatusCode, type[errors.DwsearchError]] = {
    GRPC_STATUS[error.kind]: error
    for error in (
        errors.InvalidArgument,
        errors.FailedPrecondition,
        errors.ResourceExhausted,
        errors.DeadlineExceeded,
        errors.Unauthenticated,
        errors.NotFound,
        errors.Cancelled,
        ServiceUnavailable,
    )
}


def translate(exc: grpc.aio.AioRpcError, service: str) -> errors.DwsearchError:
    """The domain error for a failed call to `service`."""
    code = exc.code()
    detail = f"{service}: {exc.details() or code.name}"
    return _CODE_TO_ERROR.get(code, errors.Internal)(detail)
