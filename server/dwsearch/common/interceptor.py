"""The RPC interceptor of the three processes (serve, embedder, reranker): scoped bearer
tokens and a cap on calls in flight, checked before a request's message is read; a
request size limit per method, checked before it is parsed; a large message parsed in the
CPU pool, in pieces; a servicer's pre-serialized response sent as it is; exception ->
status mapping, request metrics and logs of each call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError, Message

from dwsearch.common import metrics, offload
from dwsearch.common.errors import (
    DwsearchError,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    classify,
)
from dwsearch.common.grpcstatus import GRPC_STATUS
from dwsearch.common.rpcpolicy import DEFAULT_POLICY, MethodPolicy, Tokens

log = logging.getLogger(__name__)


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
    """Map an exception raised by a servicer to the status the client sees: the one
    classification (dwsearch.common.errors.classify, which the REST API answers with too),
    its kind as gRPC's table has it (dwsearch.common.grpcstatus)."""
    classified = classify(exc)
    return GRPC_STATUS[classified.kind], classified.message


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
