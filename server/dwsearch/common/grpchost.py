"""One gRPC bootstrap for the three processes (serve, embedder, reranker): an aio server
on a real socket (plaintext, or TLS / mutual TLS), standard health (NOT_SERVING until the
process is ready), reflection when asked, the RPC interceptor
(dwsearch.common.interceptor) in front of every call, and graceful shutdown on SIGTERM.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection as grpc_reflection

from dwsearch.common import tracing
from dwsearch.common.interceptor import RpcInterceptor
from dwsearch.common.rpcpolicy import MAX_MESSAGE_BYTES, MethodPolicy, Tokens
from dwsearch.common.tls import ServerTls

log = logging.getLogger(__name__)

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
        # When tracing, its span (the caller's traceparent) encloses the RPC interceptor's work.
        self.server = grpc.aio.server(
            interceptors=[*tracing.grpc_server_interceptors(), self.interceptor],
            options=options,
            maximum_concurrent_rpcs=grpc_cap,
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
