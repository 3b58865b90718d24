"""One gRPC bootstrap for the three processes (serve, embedder, reranker): an aio server
on a real socket (plaintext, or TLS / mutual TLS), standard health (NOT_SERVING until the
process is ready), reflection when asked, the RPC interceptor (scoped bearer tokens, a
cap on calls in flight, request size limits per method, error mapping, metrics, logs) and
graceful shutdown on SIGTERM.
"""

from __future__ import annotations

import asyncio
import enum
import hmac
import ipaddress
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection as grpc_reflection

from dwsearch.common import metrics, offload
from dwsearch.common.errors import (
    DwsearchError,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
)
from dwsearch.common.tls import ServerTls

log = logging.getLogger(__name__)

# RPCs a client may call without credentials: Kubernetes' native gRPC probes send no
# metadata, and reflection only describes the API.
UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# gRPC's own cap on calls is DWSEARCH_MAX_CONCURRENT_RPCS plus this: room for health
# probes and reflection, which the interceptor does not count.
UNCOUNTED_RPCS = 32
# How long calls in flight on an aged-out connection may take to finish.
MAX_CONNECTION_AGE_GRACE_MS = 30_000


@dataclass(frozen=True)
class Service:
    """A servicer to host: its full proto name and the generated add_*_to_server call."""

    name: str
    register: Callable[[grpc.aio.Server], None]


# A grpc.aio handler's behaviours (one of them is set): grpc-stubs types RpcMethodHandler's
# fields as the synchronous server's callables, but under grpc.aio they are a coroutine
# function (unary responses) or an async generator function (streamed responses).
_AioUnary = Callable[[Any, "grpc.aio.ServicerContext[Any, Any]"], Awaitable[object]]
_AioStreaming = Callable[[Any, "grpc.aio.ServicerContext[Any, Any]"], AsyncIterator[object]]


def deadline_of(context: grpc.aio.ServicerContext[Any, Any]) -> float | None:
    """The call's deadline as a time.monotonic() instant, if the client set one."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """Map an exception raised by a servicer to the status the client sees."""
    if isinstance(exc, DwsearchError):
        return exc.code, str(exc) or type(exc).__name__
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, str(exc) or "deadline exceeded"
    try:  # the server extra is optional for the model processes
        import psycopg

        if isinstance(exc, psycopg.OperationalError):
            return grpc.StatusCode.UNAVAILABLE, f"database unavailable: {exc}".strip()
        # SQLSTATE class 22: a value the database cannot take (a NUL in text, out of
        # range); it came with the request, so retrying it unchanged fails again.
        if isinstance(exc, psycopg.DataError):
            return grpc.StatusCode.INVALID_ARGUMENT, f"invalid value: {exc}".strip()
    except ImportError:  # pragma: no cover
        pass
    return grpc.StatusCode.INTERNAL, "internal error"


class _Undecodable:
    """A request whose bytes did not parse (nested past protobuf's depth limit of 100,
    e.g. metadata 49 objects deep, or malformed). gRPC would answer UNKNOWN
    "Unexpected DecodeError"; the interceptor answers INVALID_ARGUMENT, after auth."""

    def __init__(self, error: DecodeError) -> None:
        self.error = error


def _tolerant(deserialize: Callable[[bytes], object] | None) -> Callable[[bytes], object] | None:
    if deserialize is None:
        return None

    def parse(raw: bytes) -> object:
        try:
            return deserialize(raw)
        except DecodeError as exc:
            return _Undecodable(exc)

    return parse


def _check_decoded(request: object) -> None:
    if isinstance(request, _Undecodable):
        raise InvalidArgument(
            f"the request could not be parsed (nested too deeply, or malformed): {request.error}"
        )


class Scope(enum.IntEnum):
    """What a bearer token may call. Each scope includes the ones below it: an admin token
    may do everything, an index-write token may also search."""

    SEARCH = 1  # Search; IndexService reads and queries; BuildAgentContext
    INDEX = 2  # + IndexService writes (Upsert, Update, Delete)
    ADMIN = 3  # + SweepService (Sweep, Status, Purge, Forget, RetryPoison)


@dataclass(frozen=True)
class MethodPolicy:
    """What a method of our services requires: the scope of the caller's token, and the
    largest request message it takes (None: only the server-wide receive limit)."""

    scope: Scope = Scope.ADMIN
    max_request_bytes: int | None = None


# A method without a policy of its own: the narrowest door (an admin token), no limit of
# its own. The model services (embedder, reranker) have one token, which is an admin one.
DEFAULT_POLICY = MethodPolicy()


def parse_tokens(text: str) -> tuple[str, ...]:
    """Comma-separated tokens, blanks dropped."""
    return tuple(token.strip() for token in text.split(",") if token.strip())


class Tokens:
    """The bearer tokens a server accepts and the scope each grants. Several per scope at
    once, so a token can be rotated without downtime (add the new one, move the callers,
    remove the old one). A token listed under two scopes grants the wider one."""

    def __init__(self, scoped: Iterable[tuple[str, Scope]] = ()) -> None:
        granted: dict[bytes, Scope] = {}
        for token, scope in scoped:
            if token:
                header = f"Bearer {token}".encode()
                granted[header] = max(scope, granted.get(header, scope))
        self._entries = tuple(granted.items())

    @classmethod
    def single(cls, token: str) -> Tokens:
        """One token for everything (DWSEARCH_AUTH_TOKEN); empty = no auth."""
        return cls([(token, Scope.ADMIN)])

    @classmethod
    def from_settings(
        cls, *, all_scopes: str = "", search: str = "", index: str = "", admin: str = ""
    ) -> Tokens:
        """DWSEARCH_AUTH_TOKEN (one token, every scope) and the comma-separated
        DWSEARCH_SEARCH_TOKENS / _INDEX_TOKENS / _ADMIN_TOKENS."""
        scoped = [(all_scopes, Scope.ADMIN)]
        for text, scope in ((search, Scope.SEARCH), (index, Scope.INDEX), (admin, Scope.ADMIN)):
            scoped += [(token, scope) for token in parse_tokens(text)]
        return cls(scoped)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def scope_of(self, header: bytes | None) -> Scope | None:
        """The scope an `authorization` value grants, None when it is no token of ours.
        It is compared with every token, each in constant time (hmac.compare_digest),
        whichever matches."""
        if header is None:
            return None
        granted: Scope | None = None
        for token, scope in self._entries:
            if hmac.compare_digest(header, token) and (granted is None or scope > granted):
                granted = scope
        return granted


LARGE_REQUEST_BYTES = 1024 * 1024
"""A request message larger than this is parsed in the CPU pool (offload), in pieces of
about PARSE_PIECE_BYTES, not on the event loop: parsed whole, a 47 MB Upsert is one C call
of 20-50 ms holding the interpreter lock, and with gRPC's copy of the message before it
that step of the loop took 0.6-0.7 s beside two CPU hogs on two cores."""
PARSE_PIECE_BYTES = 256 * 1024


class _Unparsed:
    """A large request message, read but not parsed yet (see LARGE_REQUEST_BYTES)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The protobuf varint at `pos`, and the position after it."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def message_pieces(data: bytes, piece_bytes: int = PARSE_PIECE_BYTES) -> Iterator[bytes]:
    """`data` (a serialized message) cut between its top-level fields into pieces of at
    least `piece_bytes` (the last may be shorter). A message's pieces merged in order
    (MergeFromString) make the message that parsing it whole makes: protobuf defines
    parsing a concatenation as merging its parts. Where the framing cannot be followed
    (a group, a truncated field) the rest is one piece, whose parse then fails as the
    whole message's would."""
    start = pos = 0
    end = len(data)
    try:
        while pos < end:
            key, pos = _read_varint(data, pos)
            wire_type = key & 7
            if wire_type == 0:
                _, pos = _read_varint(data, pos)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 2:
                length, pos = _read_varint(data, pos)
                pos += length
            elif wire_type == 5:
                pos += 4
            else:
                break
            if pos >= end:
                break
            if pos - start >= piece_bytes:
                yield data[start:pos]
                start = pos
    except IndexError:  # a varint runs past the end
        pass
    yield data[start:]


def _parse_in_pieces(deserialize: Callable[[bytes], object], raw: bytes) -> object:
    """`deserialize(raw)`, merged piece by piece (message_pieces): each piece holds the
    interpreter lock for about a millisecond (5 ms at most measured), so the event loop
    gets it between pieces. A message that does not parse becomes an _Undecodable."""
    message_type = getattr(deserialize, "__self__", None)  # a message class's FromString
    try:
        if not (isinstance(message_type, type) and issubclass(message_type, Message)):
            return deserialize(raw)  # not a protobuf message's: one piece
        message = message_type()
        for piece in message_pieces(raw):
            message.MergeFromString(piece)
        return message
    except DecodeError as exc:
        return _Undecodable(exc)


class Serialized:
    """A response message serialized already, sent as it is: a servicer returns one for a
    large response, serialized in the CPU pool in pieces (serializing a 48 MB
    FetchResponse, which gRPC does on the event loop, held the loop 0.11-0.16 s)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def _passing_serialized(serialize: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """The method's serializer, but a Serialized response goes out as it is."""
    if serialize is None:
        return None

    def write(response: object) -> bytes:
        return response.data if isinstance(response, Serialized) else serialize(response)

    return write


class _Oversized:
    """A request message over its method's limit: its size, never parsed."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit


_NO_MESSAGE = object()


def _limited(
    deserialize: Callable[[bytes], object] | None, limit: int | None, *, defer_large: bool = False
) -> Callable[[bytes], object]:
    """The method's deserializer behind a size check: a message over `limit` is not parsed.
    With `defer_large`, a message over LARGE_REQUEST_BYTES is left unparsed (_Unparsed)
    for _read_one to parse in the CPU pool."""
    parse = _tolerant(deserialize)

    def read(raw: bytes) -> object:
        if limit is not None and len(raw) > limit:
            return _Oversized(len(raw), limit)
        if parse is None:
            return raw
        if defer_large and len(raw) > LARGE_REQUEST_BYTES:
            return _Unparsed(raw)
        return parse(raw)

    return read


async def _read_one(
    requests: AsyncIterator[object], method: str, deserialize: Callable[[bytes], object] | None = None
) -> object:
    """The one request message of a unary call, read now (not before); one left unparsed
    (_Unparsed) is parsed with `deserialize` in the CPU pool."""
    messages = aiter(requests)
    try:
        request = await anext(messages, _NO_MESSAGE)
    finally:
        close = getattr(messages, "aclose", None)
        if close is not None:
            await close()
    if request is _NO_MESSAGE:
        # The call ended before its message arrived: gRPC refused it (over the receive
        # limit: RESOURCE_EXHAUSTED, already sent) or the client cancelled. As gRPC's own
        # unary path does, answer nothing more.
        raise asyncio.CancelledError(f"{method}: the call ended before its request message arrived")
    if isinstance(request, _Oversized):
        raise ResourceExhausted(
            f"request message of {request.size} bytes; {method} takes at most {request.limit}"
        )
    if isinstance(request, _Unparsed):
        assert deserialize is not None  # only a method with a deserializer defers its parse
        request = await offload.run(_parse_in_pieces, deserialize, request.raw)
    _check_decoded(request)
    return request


class RpcInterceptor(grpc.aio.ServerInterceptor):
    """Auth (bearer tokens and their scopes), admission (a cap on calls in flight, a
    request size limit per method), exception → status mapping, request metrics and
    access logs for our own services (health and reflection pass through untouched).

    Every call of our services is served as a client-streaming one, so gRPC reads the
    request message only when the handler asks for it, and the handler asks only after
    the token, its scope and the cap on calls in flight have let the call in. A refused
    call's message is never read: a flood of large requests without a valid token costs
    the HTTP/2 flow-control window of each stream (kilobytes), not the message. A message
    over its method's limit is measured, then dropped unparsed."""

    def __init__(
        self,
        auth_token: str = "",
        *,
        tokens: Tokens | None = None,
        policies: Mapping[str, MethodPolicy] | None = None,
        max_concurrent_rpcs: int = 0,
    ) -> None:
        self._tokens = tokens if tokens is not None else Tokens.single(auth_token)
        self._policies = dict(policies or {})
        self.max_concurrent_rpcs = max_concurrent_rpcs
        self.in_flight = 0

    # Handlers of any message types: the interceptor wraps every method.
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        method = details.method
        if handler is None or not method.startswith("/dwsearch."):
            return handler
        policy = self._policies.get(method, DEFAULT_POLICY)
        refusal = self._refusal(details, method, policy)
        service, _, name = method[1:].partition("/")

        async def finish(
            context: grpc.aio.ServicerContext[Any, Any], exc: BaseException | None, start: float
        ) -> None:
            code, message = (grpc.StatusCode.OK, "") if exc is None else status_for(exc)
            metrics.observe_rpc(service, name, code.name, time.perf_counter() - start)
            if exc is not None:
                if code is grpc.StatusCode.INTERNAL:
                    log.error("rpc failed", exc_info=exc, extra={"method": method})
                await context.abort(code, message)

        def admit() -> None:
            """Let the call in (count it) or raise why not; its message is unread so far."""
            if refusal is not None:
                raise refusal
            if self.max_concurrent_rpcs and self.in_flight >= self.max_concurrent_rpcs:
                raise ResourceExhausted(
                    f"{self.in_flight} calls in flight, the most this server takes "
                    f"(DWSEARCH_MAX_CONCURRENT_RPCS={self.max_concurrent_rpcs}); retry with backoff"
                )
            self.in_flight += 1

        async def request_of(requests: AsyncIterator[object]) -> object:
            if handler.request_streaming:
                return requests
            return await _read_one(requests, method, handler.request_deserializer)

        # A streamed request's messages reach the method as gRPC parses them, on the loop:
        # only a unary request's parse can wait for the pool.
        deserializer = _limited(
            handler.request_deserializer,
            policy.max_request_bytes,
            defer_large=not handler.request_streaming,
        )
        serializer = _passing_serialized(handler.response_serializer)
        if handler.response_streaming:
            inner_stream = cast(_AioStreaming, handler.unary_stream or handler.stream_stream)

            async def streaming(
                requests: AsyncIterator[object], context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[object]:
                start = time.perf_counter()
                admitted = False
                try:
                    admit()
                    admitted = True
                    request = await request_of(requests)
                    async for item in inner_stream(request, context):
                        yield item
                except (grpc.aio.AbortError, asyncio.CancelledError):
                    raise
                except Exception as exc:
                    await finish(context, exc, start)
                    raise  # unreachable: abort raises
                finally:
                    if admitted:
                        self.in_flight -= 1
                await finish(context, None, start)

            return grpc.stream_stream_rpc_method_handler(streaming, deserializer, serializer)

        inner_unary = cast(_AioUnary, handler.unary_unary or handler.stream_unary)

        async def unary(
            requests: AsyncIterator[object], context: grpc.aio.ServicerContext[Any, Any]
        ) -> object:
            start = time.perf_counter()
            admitted = False
            try:
                admit()
                admitted = True
                request = await request_of(requests)
                response = await inner_unary(request, context)
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise
            except Exception as exc:
                await finish(context, exc, start)
                raise  # unreachable: abort raises
            finally:
                if admitted:
                    self.in_flight -= 1
            await finish(context, None, start)
            return response

        return grpc.stream_unary_rpc_method_handler(unary, deserializer, serializer)

    def _refusal(
        self, details: grpc.HandlerCallDetails, method: str, policy: MethodPolicy
    ) -> DwsearchError | None:
        """Why the caller may not call `method` (None: it may), from its metadata alone."""
        if not self._tokens:
            return None
        header = None
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                header = value.encode() if isinstance(value, str) else value
                break
        scope = self._tokens.scope_of(header)
        if scope is None:
            return Unauthenticated("missing or invalid bearer token")
        if scope < policy.scope:
            return PermissionDenied(
                f"{method} needs a token of the {policy.scope.name.lower()} scope; this one is of the "
                f"{scope.name.lower()} scope"
            )
        return None


class GrpcHost:
    """An aio gRPC server with health (and, when asked, reflection) for `services`."""

    def __init__(
        self,
        address: str,
        services: Iterable[Service],
        *,
        auth_token: str = "",
        tokens: Tokens | None = None,
        policies: Mapping[str, MethodPolicy] | None = None,
        max_concurrent_rpcs: int = 0,
        reflection: bool = False,
        max_connection_age_s: float = 0.0,
        max_connection_age_grace_s: float | None = None,
        tls: ServerTls | None = None,
        health_port: int = 0,
        max_receive_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        """`max_receive_bytes` caps one request message: gRPC refuses a larger one with
        RESOURCE_EXHAUSTED before it is parsed; `policies` may set a smaller limit per
        method, and the scope of token each method needs. `tokens` (default: `auth_token`
        for every scope; none = no auth) are checked before a request's message is read.
        `max_concurrent_rpcs` > 0 caps our services' calls in flight (more answer
        RESOURCE_EXHAUSTED, unread); gRPC's own cap, a little above it, also bounds health
        and reflection calls. `reflection` serves the reflection service (off by default:
        it describes the API to anyone). `max_connection_age_s` > 0 closes each client
        connection (GOAWAY, in-flight calls finish) after that long, so round-robin
        clients re-resolve DNS and spread over pods that started after they connected;
        calls in flight then have `max_connection_age_grace_s` (default
        MAX_CONNECTION_AGE_GRACE_MS) to finish before the connection closes.
        `tls` None listens in plaintext. `health_port` > 0 also answers grpc.health.v1,
        and nothing else, in plaintext on that port of the same host (every interface for
        a unix: address): the kubelet's gRPC probes cannot speak TLS."""
        self.address = address
        self.services = list(services)
        self.tls = tls
        self.health_port = health_port
        self.health_server: grpc.aio.Server | None = None
        self.reflection = reflection
        self.interceptor = RpcInterceptor(
            auth_token, tokens=tokens, policies=policies, max_concurrent_rpcs=max_concurrent_rpcs
        )
        options: list[tuple[str, int]] = [
            ("grpc.max_receive_message_length", max_receive_bytes),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ]
        if max_connection_age_s > 0:
            options += [
                ("grpc.max_connection_age_ms", int(max_connection_age_s * 1000)),
                (
                    "grpc.max_connection_age_grace_ms",
                    MAX_CONNECTION_AGE_GRACE_MS
                    if max_connection_age_grace_s is None
                    else int(max_connection_age_grace_s * 1000),
                ),
            ]
        grpc_cap = None
        if max_concurrent_rpcs > 0:
            # gRPC's cap counts every call, health and reflection included, and answers
            # RESOURCE_EXHAUSTED before any interceptor reads anything. Ours (above)
            # counts only our services, so health probes still get in when they are full.
            grpc_cap = max_concurrent_rpcs + UNCOUNTED_RPCS
            options.append(("grpc.max_concurrent_streams", grpc_cap))
        self.server = grpc.aio.server(
            interceptors=[self.interceptor], options=options, maximum_concurrent_rpcs=grpc_cap
        )
        self.health = health.aio.HealthServicer()
        self.port = 0

    async def start(self) -> int:
        """Bind and start serving with health NOT_SERVING; return the bound port."""
        for service in self.services:
            service.register(self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if self.reflection:
            names = [s.name for s in self.services]
            grpc_reflection.enable_server_reflection(
                [
                    *names,
                    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                    grpc_reflection.SERVICE_NAME,
                ],
                self.server,
            )
        self.port = _bind(self.server, self.address, self.tls)
        if self.health_port:
            self.health_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self.health_server)
            host = "[::]" if self.address.startswith("unix:") else self.address.rpartition(":")[0]
            health_address = f"{host}:{self.health_port}"
            _bind(self.health_server, health_address, None, what="health port")
        await self.set_serving(False)
        await self.server.start()
        if self.health_server is not None:
            await self.health_server.start()
        return self.port

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ["", *(s.name for s in self.services)]:
            await self.health.set(name, status)

    async def stop(self, grace: float | None) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        if self.health_server is not None:
            await self.health_server.stop(0)


def _bind(server: grpc.aio.Server, address: str, tls: ServerTls | None, what: str = "listen address") -> int:
    """Add the listening port; exit naming the address when it cannot be bound."""
    try:
        port = (
            server.add_insecure_port(address)
            if tls is None
            else server.add_secure_port(address, tls.credentials())
        )
    except RuntimeError:  # grpcio raises, or returns 0, depending on the failure
        port = 0
    if port == 0:
        raise SystemExit(f"cannot listen on {address} ({what})")
    return port


def is_loopback(address: str) -> bool:
    """Whether a listen address is reachable only from this host (a unix socket, localhost,
    127.0.0.0/8, ::1); "[::]:50051" and "0.0.0.0:50051" listen on every interface."""
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    host = address.rpartition(":")[0].strip("[]") if ":" in address else address
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


async def run_until_signalled(
    host: GrpcHost,
    *,
    ready: Callable[[], Awaitable[None]] | None = None,
    cleanup: Callable[[], Awaitable[None]] | None = None,
    grace: float = 20.0,
    process: str = "dwsearch",
) -> None:
    """Serve until SIGTERM / SIGINT: start (NOT_SERVING), await `ready` (load a model,
    warm up, open the pool), turn SERVING; on the signal go NOT_SERVING, drain in-flight
    RPCs for up to `grace` seconds, then `cleanup`."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    port = await host.start()
    tls = "off" if host.tls is None else ("mutual" if host.tls.client_ca else "on")
    log.info("listening", extra={"component": process, "address": host.address, "port": port, "tls": tls})
    try:
        if ready is not None:
            ready_task = asyncio.ensure_future(ready())
            stop_task = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({ready_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
            if ready_task not in done:
                ready_task.cancel()
            else:
                stop_task.cancel()
                ready_task.result()
        if not stop.is_set():
            await host.set_serving(True)
            log.info("serving", extra={"component": process, "port": port})
            await stop.wait()
        log.info("draining", extra={"component": process, "grace_s": grace})
    finally:
        await host.stop(grace)
        if cleanup is not None:
            await cleanup()
        log.info("stopped", extra={"component": process})
