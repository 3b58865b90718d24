"""One gRPC bootstrap for the three processes (serve, embedder, reranker): an aio server
on a real socket (plaintext, or TLS / mutual TLS), standard health (NOT_SERVING until the
process is ready), reflection, the RPC interceptor (auth, error mapping, metrics, logs)
and graceful shutdown on SIGTERM.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dwsearch.common import metrics
from dwsearch.common.errors import DwsearchError
from dwsearch.common.tls import ServerTls

log = logging.getLogger(__name__)

# RPCs a client may call without credentials: Kubernetes' native gRPC probes send no
# metadata, and reflection only describes the API.
UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# How long calls in flight on an aged-out connection may take to finish.
MAX_CONNECTION_AGE_GRACE_MS = 30_000


@dataclass(frozen=True)
class Service:
    """A servicer to host: its full proto name and the generated add_*_to_server call."""

    name: str
    register: Callable[[grpc.aio.Server], None]


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
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


class RpcInterceptor(grpc.aio.ServerInterceptor):
    """Auth, exception → status mapping, request metrics and access logs for our own
    services (health and reflection pass through untouched)."""

    def __init__(self, auth_token: str = "") -> None:
        self._token = f"Bearer {auth_token}".encode() if auth_token else b""

    async def intercept_service(self, continuation, details):  # type: ignore[no-untyped-def]
        handler = await continuation(details)
        method = details.method
        if handler is None or not method.startswith("/dwsearch."):
            return handler
        authorized = self._authorized(details)
        service, _, name = method[1:].partition("/")

        async def finish(context: grpc.aio.ServicerContext, exc: BaseException | None, start: float) -> None:
            code, message = (grpc.StatusCode.OK, "") if exc is None else status_for(exc)
            metrics.observe_rpc(service, name, code.name, time.perf_counter() - start)
            if exc is not None:
                if code is grpc.StatusCode.INTERNAL:
                    log.error("rpc failed", exc_info=exc, extra={"method": method})
                await context.abort(code, message)

        if handler.unary_unary:
            inner_uu = handler.unary_unary

            async def unary_unary(request, context):  # type: ignore[no-untyped-def]
                start = time.perf_counter()
                try:
                    self._check(authorized)
                    response = await inner_uu(request, context)
                except (grpc.aio.AbortError, asyncio.CancelledError):
                    raise
                except Exception as exc:  # noqa: BLE001 - the one choke point
                    await finish(context, exc, start)
                    raise  # unreachable: abort raises
                await finish(context, None, start)
                return response

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream:
            inner_us = handler.unary_stream

            async def unary_stream(request, context):  # type: ignore[no-untyped-def]
                start = time.perf_counter()
                try:
                    self._check(authorized)
                    async for item in inner_us(request, context):
                        yield item
                except (grpc.aio.AbortError, asyncio.CancelledError):
                    raise
                except Exception as exc:  # noqa: BLE001
                    await finish(context, exc, start)
                    raise
                await finish(context, None, start)

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, handler.request_deserializer, handler.response_serializer
            )
        return handler

    def _authorized(self, details: grpc.HandlerCallDetails) -> bool:
        if not self._token:
            return True
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                got = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(got, self._token)
        return False

    @staticmethod
    def _check(authorized: bool) -> None:
        if not authorized:
            from dwsearch.common.errors import Unauthenticated

            raise Unauthenticated("missing or invalid bearer token")


class GrpcHost:
    """An aio gRPC server with health and reflection for `services`."""

    def __init__(
        self,
        address: str,
        services: Iterable[Service],
        *,
        auth_token: str = "",
        max_connection_age_s: float = 0.0,
        tls: ServerTls | None = None,
        health_port: int = 0,
        max_receive_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        """`max_receive_bytes` caps one request message: gRPC refuses a larger one with
        RESOURCE_EXHAUSTED before it is parsed. `max_connection_age_s` > 0 closes each client connection (GOAWAY, in-flight
        calls finish) after that long, so round-robin clients re-resolve DNS and spread
        over pods that started after they connected. `tls` None listens in plaintext.
        `health_port` > 0 also answers grpc.health.v1, and nothing else, in plaintext on
        that port of the same host (every interface for a unix: address): the kubelet's
        gRPC probes cannot speak TLS."""
        self.address = address
        self.services = list(services)
        self.tls = tls
        self.health_port = health_port
        self.health_server: grpc.aio.Server | None = None
        options: list[tuple[str, int]] = [
            ("grpc.max_receive_message_length", max_receive_bytes),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ]
        if max_connection_age_s > 0:
            options += [
                ("grpc.max_connection_age_ms", int(max_connection_age_s * 1000)),
                ("grpc.max_connection_age_grace_ms", MAX_CONNECTION_AGE_GRACE_MS),
            ]
        self.server = grpc.aio.server(interceptors=[RpcInterceptor(auth_token)], options=options)
        self.health = health.aio.HealthServicer()
        self.port = 0

    async def start(self) -> int:
        """Bind and start serving with health NOT_SERVING; return the bound port."""
        for service in self.services:
            service.register(self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [s.name for s in self.services]
        reflection.enable_server_reflection(
            [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
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
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
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
        port = server.add_insecure_port(address) if tls is None else server.add_secure_port(address, tls.credentials())
    except RuntimeError:  # grpcio raises, or returns 0, depending on the failure
        port = 0
    if port == 0:
        raise SystemExit(f"cannot listen on {address} ({what})")
    return port


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
