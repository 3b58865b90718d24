"""An HTTP port's connections (serve's REST API, the model servers' HTTP APIs): a cap on
how many are open at once, and deadlines on the client's part of each request, so idle,
slowloris and slow-body clients cannot hold the process's file descriptors (and with them
the gRPC port of the same process).

`ConnectionGate.protocol()` is the uvicorn HTTP protocol (h11) of one RestServer:

- the cap counts a connection from its accept (before its TLS handshake) to its close;
  one beyond it is answered 503 (plaintext; a TLS one is just closed) and closed at once.
- the header deadline: from the connection's start (again after each response) to the end
  of the next request's head, whether no byte came or the head trickles in (slowloris);
  the TLS handshake has the same deadline. A connection that sent nothing is closed, one
  that sent part of a head is answered 408 and closed.
- the body deadline: from the end of the head to the end of the body; 408 (when no response
  has started) and close.
- TLS: the port accepts plain TCP and the gate starts TLS itself (`loop.start_tls` with the
  header deadline), so a handshake that never ends holds no fd past it and counts in the cap.

`raise_fd_limit` raises the soft RLIMIT_NOFILE to the hard limit and refuses a cap that
leaves the rest of the process fewer than FD_HEADROOM descriptors."""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from dwsearch.common.errors import StartupError

log = logging.getLogger(__name__)

# Connections asyncio accepts per wake-up of the listening socket (uvicorn's backlog, and so
# the listen queue): those beyond the cap hold an fd for the few loop turns until they are
# refused, so a flood overshoots the cap by at most about this many.
ACCEPT_BURST = 128
# Descriptors kept for the rest of serve beyond the cap: the gRPC ports, Postgres, files,
# and a few accept bursts of connections refused at the cap.
FD_HEADROOM = 4 * ACCEPT_BURST
# How long a connection closed at a deadline may take to go (TLS close_notify) before abort.
CLOSE_GRACE_SECONDS = 1.0
# The refusals beyond the cap are logged at most this often.
REFUSED_LOG_SECONDS = 10.0


def _response(status: str, body: bytes, *headers: str) -> bytes:
    """A whole HTTP/1.1 response that closes its connection, written without h11."""
    head = [f"HTTP/1.1 {status}", "content-type: text/plain; charset=utf-8", f"content-length: {len(body)}"]
    head += [*headers, "connection: close", "", ""]
    return "\r\n".join(head).encode("ascii") + body


_REFUSED = _response("503 Service Unavailable", b"too many open connections", "retry-after: 1")
_TIMEOUT = _response("408 Request Timeout", b"Request Timeout")


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 512
    header_timeout: float = 10.0
    body_timeout: float = 30.0


class ConnectionGate:
    """One port's open connections and their limits; TLS started here when `tls` is set."""

    def __init__(self, limits: ConnectionLimits, tls: ssl.SSLContext | None = None) -> None:
        self.limits = limits
        self.tls = tls
        self.open: set[GuardedH11Protocol] = set()
        self.refused = 0
        self._refused_logged_at: float | None = None

    def protocol(self) -> type[GuardedH11Protocol]:
        """The HTTP protocol class (uvicorn.Config's `http`) whose connections this gate counts."""

        class GatedH11Protocol(GuardedH11Protocol):
            pass

        GatedH11Protocol.gate = self
        return GatedH11Protocol

    def admit(self, connection: GuardedH11Protocol, transport: asyncio.Transport) -> bool:
        if len(self.open) < self.limits.max_connections:
            self.open.add(connection)
            return True
        self.refused += 1
        if self.tls is None:
            transport.write(_REFUSED)
            transport.close()
        else:
            transport.abort()
        now = asyncio.get_running_loop().time()
        if self._refused_logged_at is None or now - self._refused_logged_at >= REFUSED_LOG_SECONDS:
            self._refused_logged_at = now
            log.warning(
                "REST connection refused: DWSEARCH_REST_MAX_CONNECTIONS are open",
                extra={
                    "component": "rest",
                    "max_connections": self.limits.max_connections,
                    "refused": self.refused,
                },
            )
        return False

    def close_all(self) -> None:
        """Abort what is still open (handshakes, TLS closes) once the server has stopped."""
        for connection in list(self.open):
            connection.abort()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol under a ConnectionGate's cap and deadlines."""

    gate: ClassVar[ConnectionGate]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._admitted = False
        self._http = False  # uvicorn's connection_made ran (after the TLS handshake)
        self._lost = False
        self._raw: asyncio.Transport | None = None
        self._handshake: asyncio.Task[None] | None = None
        self._early: list[bytes] = []  # TLS data that came with the handshake's end
        self._phase: str | None = None  # "head", "body", "closing" or None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if not self.gate.admit(self, transport):
            return
        self._admitted = True
        self._raw = transport
        if self.gate.tls is None:
            self._start_http(transport)
            return
        transport.pause_reading()
        self._handshake = self.loop.create_task(self._start_tls(transport, self.gate.tls))

    async def _start_tls(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
        tls: asyncio.Transport | None = None
        try:
            tls = await self.loop.start_tls(
                raw, self, context, server_side=True, ssl_handshake_timeout=self.gate.limits.header_timeout
            )
        except Exception as exc:  # a failed or timed-out handshake: start_tls closed the socket
            log.debug("REST TLS handshake failed", extra={"component": "rest", "error": repr(exc)})
        finally:
            if tls is None:
                self._release()
        if tls is not None and not self._lost:
            self._start_http(tls)

    def _start_http(self, transport: asyncio.Transport) -> None:
        self._http = True
        super().connection_made(transport)
        early, self._early = self._early, []
        for data in early:
            super().data_received(data)
        self._watch()

    def data_received(self, data: bytes) -> None:
        if not self._http:
            self._early.append(data)
            return
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._release()
        if self._http:
            super().connection_lost(exc)

    def abort(self) -> None:
        if self._handshake is not None and not self._handshake.done():
            self._handshake.cancel()
        transport = self.transport if self._http else self._raw
        if transport is not None:
            transport.abort()

    def _release(self) -> None:
        self._cancel_timer()
        if self._admitted:
            self._admitted = False
            self.gate.open.discard(self)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _watch(self) -> None:
        """Arm the deadline of what the connection waits for from the client: a request's
        head (h11's IDLE), its body (SEND_BODY), or nothing (the server's turn)."""
        if self._phase == "closing" or self._lost:
            return
        if self.transport.is_closing():
            self._phase = None
            self._cancel_timer()
            return
        state = self.conn.their_state
        phase = "head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if phase == self._phase:
            return
        self._cancel_timer()
        self._phase = phase
        if phase is not None:
            limits = self.gate.limits
            timeout = limits.header_timeout if phase == "head" else limits.body_timeout
            self._timer = self.loop.call_later(timeout, self._expired)

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        answer = (
            bool(self.conn.trailing_data[0])  # part of a head came
            if self._phase == "head"
            else cycle is not None and not cycle.response_started
        )
        log.debug(
            "REST request timed out", extra={"component": "rest", "phase": self._phase, "answered": answer}
        )
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive() gets http.disconnect, its send() is dropped
            cycle.message_event.set()
        self._phase = "closing"
        if answer:
            self.transport.write(_TIMEOUT)
        self.transport.close()
        self._timer = self.loop.call_later(CLOSE_GRACE_SECONDS, self.transport.abort)


def raise_fd_limit(max_connections: int) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit and return it; StartupError when
    `max_connections` leaves the rest of the process fewer than FD_HEADROOM descriptors."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            log.info("raised the open-files limit", extra={"component": "rest", "from": soft, "to": want})
            soft = want
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit", extra={"component": "rest", "error": str(exc)})
    if soft != resource.RLIM_INFINITY and max_connections + FD_HEADROOM > soft:
        raise StartupError(
            f"DWSEARCH_REST_MAX_CONNECTIONS ({max_connections}) leaves too few file descriptors: the open-files "
            f"limit is {soft} (ulimit -n) and serve keeps {FD_HEADROOM} for the rest; set it to at most "
            f"{max(soft - FD_HEADROOM, 0)} or raise the limit"
        )
    return int(soft)


def tls_context(cert: str, key: str, client_ca: str) -> ssl.SSLContext | None:
    """An HTTP port's TLS context (none without a certificate); mutual with a client CA."""
    if not cert:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key or None)
    if client_ca:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
