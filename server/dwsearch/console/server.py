"""The console on uvicorn, in serve's process and event loop beside the gRPC server, and
the history its Overview draws (dwsearch.console.history), sampled while it serves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

import uvicorn
from psycopg_pool import AsyncConnectionPool

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.clients.reranker import RerankerClient
from dwsearch.common.config import ServerConfig
from dwsearch.common.errors import StartupError
from dwsearch.common.rpcpolicy import Tokens
from dwsearch.common.uvicornhost import UvicornHost
from dwsearch.console.app import Console
from dwsearch.db.readpool import ReadPool


class ConsoleServer:
    def __init__(self, console: Console, host: str, port: int) -> None:
        config = uvicorn.Config(
            console.app(), host=host, port=port, lifespan="off", log_config=None, access_log=False,
            server_header=False, timeout_graceful_shutdown=5, ws="none",
        )  # fmt: skip
        self.console = console
        self.host = UvicornHost(config, "the console")
        self._history: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.host.start()
        self._history = asyncio.create_task(self.console.history.run(), name="console history")

    @property
    def port(self) -> int:
        return self.host.port

    async def stop(self) -> None:
        if self._history is not None:
            self._history.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._history
        await self.host.stop()
        await self.console.close()


def loopback_target(listen_addr: str) -> str:
    """The address this process's own gRPC server answers on, from its listen address
    (`[::]:50051` → `127.0.0.1:50051`; a unix: address as it is)."""
    if listen_addr.startswith("unix:"):
        return listen_addr
    host, _, port = listen_addr.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        raise StartupError(
            f"DWSEARCH_CONSOLE_PORT is set: the console calls serve's gRPC port, so DWSEARCH_LISTEN_ADDR "
            f"needs a fixed port (got {listen_addr!r})"
        )
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        return f"127.0.0.1:{port}"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def console_app(
    config: ServerConfig,
    pool: AsyncConnectionPool,
    tokens: Tokens,
    embedder: EmbedderClient | None = None,
    reranker: RerankerClient | None = None,
    read_pool: ReadPool | AsyncConnectionPool | None = None,
    *,
    fusion: Mapping[str, object] | None = None,
) -> Console | None:
    """serve's console, or None when DWSEARCH_CONSOLE_PORT is unset: built by the
    composition root (dwsearch.serve.build_application). `fusion`: Search's fusion
    (SearchSettings.describe_fusion), for the Models page."""
    if not config.console_port:
        return None
    if config.tls_cert:
        # The console's loopback channel speaks plaintext; a TLS port (mutual above all)
        # would need the console to hold a client certificate of its own.
        raise StartupError("DWSEARCH_CONSOLE_PORT is set: the console does not support serve's TLS yet")
    return Console(
        pool,
        tokens,
        loopback_target(config.listen_addr),
        embedder=embedder,
        reranker_addr=config.reranker_addr,
        reranker=reranker,
        embed_deadline_ms=config.embed_timeout_ms,
        model=config.models[0],  # the sweep's model (Sweeper.model), the Index's too
        read_pool=read_pool,  # the Map's reads (the replica's while it is up)
        fusion=fusion,
    )


def console_server(config: ServerConfig, console: Console) -> ConsoleServer:
    """The console's transport: uvicorn on DWSEARCH_CONSOLE_HOST:DWSEARCH_CONSOLE_PORT."""
    return ConsoleServer(console, config.console_host, config.console_port)
