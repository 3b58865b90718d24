"""The model servers' HTTP port (DWSEARCH_HTTP_PORT): JSON APIs the ecosystem already
calls (the embedder's OpenAI and TEI routes, the reranker's Cohere-style and TEI routes)
on the same engines as gRPC, so on the same lanes, admission and batcher.

What every route shares lives here: the bearer tokens (DWSEARCH_AUTH_TOKEN, as gRPC), the
request body's size cap (dwsearch.common.httpbody, read before it is parsed), a JSON body
of objects, each API's error shape (`Dialect`: OpenAI's `{"error": {"message", "type",
"code"}}`, TEI's `{"error", "error_type"}`, Cohere's `{"message"}`) and status (a request
no wait lets in and a body over the cap 413, a full queue 429 with Retry-After), the request metrics gRPC calls have
(dwsearch_grpc_requests_total and its histogram, method "HTTP <path>"), readiness (503 while the models load and while
draining) and the drain on SIGTERM (`HttpHost.drain`: new requests 503, those in flight
finish). Each service's module (dwsearch_embedder.http, dwsearch_reranker.http) adds its
routes as `Route`s of handlers that take the parsed body and return JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dwsearch.common import metrics
from dwsearch.common.connections import (
    ACCEPT_BURST,
    ConnectionGate,
    ConnectionLimits,
    raise_fd_limit,
    tls_context,
)
from dwsearch.common.errors import (
    DwsearchError,
    InvalidArgument,
    Kind,
    Unauthenticated,
    Unavailable,
    classify,
)
from dwsearch.common.grpcstatus import GRPC_STATUS
from dwsearch.common.httpbody import BodyTooLarge, read_capped
from dwsearch.common.httpstatus import http_status
from dwsearch.common.rpcpolicy import Tokens
from dwsearch.common.uvicornhost import UvicornHost
from dwsearch.modelserver.admission import OverLimit, RequestTooLarge
from dwsearch.modelserver.batching import Lane

log = logging.getLogger(__name__)

# A 429 says when to retry: the queue drains in about a batch's time.
RETRY_AFTER_S = 1
# A body is the texts plus JSON's framing and escapes (a few bytes per input, up to six
# per character escaped as \\uXXXX): the text cap times this, plus a little.
BODY_SLACK_FACTOR = 2
BODY_SLACK_BYTES = 256 * 1024
# A body larger than this is parsed off the event loop.
LARGE_BODY_BYTES = 1024 * 1024

Json = Any
Handler = Callable[[Json], Awaitable[Json]]
"""A route's work: the parsed body (None for a GET) to the answer's JSON."""


class Dialect(enum.Enum):
    """Whose error shape a route answers with."""

    OPENAI = "openai"
    TEI = "tei"
    COHERE = "cohere"


class HttpError(DwsearchError):
    """An error a handler raises with its HTTP status, its kind (the request metrics'
    status) and the API's own type and code (e.g. OpenAI's `model_not_found`); other
    errors are classified (`error_body`)."""

    def __init__(
        self, status: int, message: str, *, kind: Kind, error_type: str = "", error_code: str = ""
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.error_type = error_type
        self.error_code = error_code


def bad_request(message: str, *, error_code: str = "") -> HttpError:
    return HttpError(400, message, kind=Kind.INVALID_ARGUMENT, error_code=error_code)


@dataclass(frozen=True)
class Failure:
    """What the caller of a failed HTTP request sees, before the dialect shapes it."""

    status: int
    message: str
    kind: Kind
    error_type: str = ""  # the dialect's error type, when the raiser named one
    error_code: str = ""


def failure_of(exc: BaseException) -> Failure:
    """The HTTP status of an exception a route raised: the one classification gRPC and the
    REST API use (dwsearch.common.errors.classify), its kind as every HTTP port's table has
    it (dwsearch.common.httpstatus), except that a request no wait would let in
    (RequestTooLarge, OverLimit), and a body over the cap (BodyTooLarge), is 413, not 429
    or 400."""
    if isinstance(exc, HttpError):
        return Failure(exc.status, str(exc), exc.kind, exc.error_type, exc.error_code)
    classified = classify(exc)
    status = http_status(classified.kind)
    if isinstance(exc, RequestTooLarge | OverLimit | BodyTooLarge):
        status = 413
    return Failure(status, classified.message, classified.kind)


_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_exceeded"}  # fmt: skip
_OPENAI_CODES = {401: "invalid_api_key", 413: "request_too_large", 429: "rate_limit_exceeded",
                 503: "service_unavailable", 504: "timeout"}  # fmt: skip
# TEI's error types (text-embeddings-inference's router: Validation, Empty, Overloaded, Unhealthy,
# Backend), by status; the 400 / 422 split is ours (a bad value / a body that is not a JSON object).
_TEI_TYPES = {400: "Validation", 401: "Unauthorized", 403: "Unauthorized", 404: "Validation",
              413: "Validation", 422: "Validation", 429: "Overloaded", 503: "Unhealthy"}  # fmt: skip


def error_body(dialect: Dialect, failure: Failure) -> Json:
    if dialect is Dialect.OPENAI:
        error_type = failure.error_type or _OPENAI_TYPES.get(failure.status, "server_error")
        code = failure.error_code or _OPENAI_CODES.get(failure.status) or failure.kind.name.lower()
        return {"error": {"message": failure.message, "type": error_type, "param": None, "code": code}}
    if dialect is Dialect.TEI:
        return {
            "error": failure.message,
            "error_type": failure.error_type or _TEI_TYPES.get(failure.status, "Backend"),
        }
    return {"message": failure.message}


def error_response(dialect: Dialect, exc: BaseException) -> tuple[Response, Failure]:
    failure = failure_of(exc)
    status = failure.status
    if dialect is Dialect.TEI and status == 500:
        status = 424  # TEI's "Backend" (the model failed)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status in (429, 503) else None
    return JSONResponse(error_body(dialect, failure), status_code=status, headers=headers), failure


class HttpState:
    """What every route checks before it runs: the tokens, readiness (the models loaded,
    not draining), the cap on a body, and the requests in flight (the drain waits for them)."""

    def __init__(
        self, service: str, *, auth_token: str = "", max_request_bytes: int = 8 * 1024 * 1024
    ) -> None:
        """`service`: the gRPC service's full name, which labels the request metrics."""
        self.service = service
        self.tokens = Tokens.single(auth_token)
        self.max_body_bytes = max_request_bytes * BODY_SLACK_FACTOR + BODY_SLACK_BYTES
        self.serving = False
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def ready(self) -> bool:
        return self.serving and not self.draining

    def authorize(self, request: Request) -> None:
        if not self.tokens:
            return
        header = request.headers.get("authorization")
        if self.tokens.scope_of(None if header is None else header.encode()) is None:
            raise Unauthenticated("missing or invalid bearer token")

    @contextlib.contextmanager
    def counted(self) -> Iterator[None]:
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self._idle.set()

    async def drained(self, timeout: float) -> bool:
        """Wait (up to `timeout` seconds) for the requests in flight; whether they finished."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True


async def read_json(request: Request, limit: int) -> Json:
    """The body as a JSON object, refused unread past `limit` bytes (BodyTooLarge: by its
    Content-Length, else as it streams in)."""
    body = await read_capped(request, limit)
    if not body:
        raise HttpError(422, "the request has no body; send a JSON object", kind=Kind.INVALID_ARGUMENT)
    try:
        parsed = (
            json.loads(body) if len(body) <= LARGE_BODY_BYTES else await asyncio.to_thread(json.loads, body)
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise HttpError(422, f"the body is not JSON: {exc}", kind=Kind.INVALID_ARGUMENT) from None
    if not isinstance(parsed, dict):
        raise HttpError(422, "the body must be a JSON object", kind=Kind.INVALID_ARGUMENT)
    return parsed


def route(
    state: HttpState,
    path: str,
    handler: Handler,
    *,
    dialect: Dialect,
    method: str = "POST",
) -> Route:
    """`handler` behind the tokens, readiness and body checks, its answer as JSON, its
    errors in `dialect`'s shape, each request counted in the RPC metrics."""
    label = f"HTTP {path}"

    async def endpoint(request: Request) -> Response:
        start = time.perf_counter()
        code = grpc.StatusCode.OK
        with state.counted():
            try:
                state.authorize(request)
                if not state.ready:
                    raise Unavailable(
                        "draining: this server is shutting down"
                        if state.draining
                        else "the model is still loading"
                    )
                body = await read_json(request, state.max_body_bytes) if method == "POST" else None
                answer = await handler(body)
                response: Response = JSONResponse(answer)
            except Exception as exc:
                response, failure = error_response(dialect, exc)
                code = GRPC_STATUS[failure.kind]  # labelled as a gRPC call's status
                if failure.status >= 500 and failure.kind is Kind.INTERNAL:
                    log.error("http request failed", exc_info=exc, extra={"path": path})
        metrics.observe_rpc(state.service, label, code.name, time.perf_counter() - start)
        return response

    return Route(path, endpoint, methods=[method])


HEALTH_PATHS = ("/health", "/ping", "/")
"""TEI's health (/health), SageMaker's (/ping), and GET / as TEI answers it."""


def health_routes(state: HttpState) -> list[Route]:
    """TEI's /health (and SageMaker's /ping, and GET /): 200 once every model is warm, 503
    while loading or draining; no token (as gRPC health), so probes need none."""

    async def endpoint(request: Request) -> Response:
        return Response(status_code=200 if state.ready else 503)

    return [Route(path, endpoint, methods=["GET"]) for path in HEALTH_PATHS]


def http_app(state: HttpState, routes: Sequence[Route]) -> Starlette:
    return Starlette(routes=[*health_routes(state), *routes])


def hf_parameters(body: Json) -> Json:
    """A body as Hugging Face's inference clients send it to TEI's `POST /` (and SageMaker's
    `/invocations`): `{"inputs": ..., "parameters": {...}}`, the parameters beside inputs
    as TEI's own routes take them. A parameter given both ways is refused."""
    parameters = body.get("parameters")
    if parameters is None:
        return body
    if not isinstance(parameters, dict):
        raise InvalidArgument("parameters must be an object")
    both = sorted(set(parameters) & (set(body) - {"parameters"}))
    if both:
        raise InvalidArgument(f"{', '.join(both)}: given in the body and in parameters; give it once")
    merged = {k: v for k, v in body.items() if k != "parameters"}
    merged.update({k: v for k, v in parameters.items() if v is not None})
    return merged


# --- body fields --------------------------------------------------------------------


def texts_field(body: Json, name: str, *, required: bool = True) -> list[str]:
    """A string or a list of strings (OpenAI's `input`, TEI's `inputs`)."""
    value = body.get(name)
    if value is None:
        if required:
            raise InvalidArgument(f"{name} is required: a string or a list of strings")
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    if isinstance(value, list) and value and all(isinstance(item, int | list) for item in value):
        raise InvalidArgument(f"{name} holds token ids; this server takes text only")
    raise InvalidArgument(f"{name} must be a string or a list of strings")


def bool_field(body: Json, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be true or false")
    return value


def int_field(body: Json, name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an integer")
    return value


def str_field(body: Json, name: str, default: str = "") -> str:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a string")
    return value


def lane_field(body: Json) -> Lane:
    """`priority`: interactive (the default on HTTP) or bulk."""
    value = str_field(body, "priority", "interactive")
    try:
        return Lane(value)
    except ValueError:
        raise InvalidArgument(f"priority must be interactive or bulk, not {value!r}") from None


# --- the host -------------------------------------------------------------------------


class HttpHost:
    """The HTTP port on uvicorn, in the model server's event loop beside gRPC."""

    def __init__(
        self,
        app: Starlette,
        state: HttpState,
        host: str,
        port: int,
        *,
        tls_cert: str = "",
        tls_key: str = "",
        tls_client_ca: str = "",
        limits: ConnectionLimits | None = None,
    ) -> None:
        """`port` 0: any free port (tests; the setting's 0 is off and makes no host). TLS
        as the gRPC port has it (DWSEARCH_TLS_CERT / _KEY; _CLIENT_CA: mutual TLS), started
        by the ConnectionGate, which also caps the open connections and puts deadlines on
        each request's head and body (dwsearch.common.connections, as serve's REST port)."""
        self.state = state
        self.limits = limits or ConnectionLimits()
        self.gate = ConnectionGate(self.limits, tls_context(tls_cert, tls_key, tls_client_ca))
        config = uvicorn.Config(
            app, host=host, port=port, lifespan="off", log_config=None, access_log=False,
            server_header=False, timeout_graceful_shutdown=5, http=self.gate.protocol(),
            ws="none",  # an upgrade would hand the socket to a protocol the gate does not count
            backlog=ACCEPT_BURST,
        )  # fmt: skip
        self.host = UvicornHost(config, "the HTTP port")

    async def start(self) -> int:
        raise_fd_limit(self.limits.max_connections)
        return await self.host.start()

    @property
    def port(self) -> int:
        return self.host.port

    async def drain(self, grace: float) -> None:
        """Refuse new requests (503), let those in flight finish for up to `grace` seconds, stop."""
        self.state.draining = True
        if not await self.state.drained(grace):
            log.warning(
                "http requests still in flight after the grace period",
                extra={"in_flight": self.state.in_flight},
            )
        await self.stop()

    async def stop(self) -> None:
        await self.host.stop()
        self.gate.close_all()


def http_host_of(listen_addr: str) -> str:
    """The HTTP port's interface: the gRPC listen address's host ("[::]:50052" → "::")."""
    if listen_addr.startswith(("unix:", "unix-abstract:")) or ":" not in listen_addr:
        return "::"
    return listen_addr.rpartition(":")[0].strip("[]") or "::"
