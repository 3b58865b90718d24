"""One uvicorn server in the process's running event loop, beside its gRPC server: serve's
REST API and console, the model servers' HTTP APIs. uvicorn's own signal handlers are left
out: the process's run_until_signalled owns SIGTERM and stops each host in its turn. When the
process traces (dwsearch.common.tracing), each request is a span, the caller's traceparent
honoured."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Collection, Iterator

import uvicorn

from dwsearch.common import tracing
from dwsearch.common.errors import StartupError


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn calls sys.exit when it cannot bind; in a task that SystemExit would leave
        # the event loop at once, past serve's own shutdown. It has logged why; the serve
        # task ends instead and UvicornHost.start says which port did not start.
        try:
            await super().startup(sockets)
        except SystemExit:
            self.should_exit = True


class UvicornHost:
    def __init__(self, config: uvicorn.Config, what: str, *, routes: Collection[str] = ()) -> None:
        """`what` names the port in the StartupError of a server that cannot start;
        `routes`: the path segments a request's span may name (tracing.http_route)."""
        if tracing.ENABLED and callable(config.app):
            config.app = tracing.asgi(config.app, what, routes)
        self.server = _QuietServer(config)
        self.what = what
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Serving; returns the port (a 0 in the config: the one the system chose)."""
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            if self.task.done():
                config = self.server.config
                self.task.result()  # raises what stopped it
                self.task = None
                raise StartupError(f"{self.what} did not start: cannot listen on {config.host}:{config.port}")
            await asyncio.sleep(0.01)
        return self.port

    @property
    def port(self) -> int:
        port: int = self.server.servers[0].sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        """Stops serving (uvicorn's graceful shutdown of the connections open); a no-op
        when not started."""
        if self.task is None:
            return
        self.server.should_exit = True
        with contextlib.suppress(Exception):
            await self.task
        self.task = None
