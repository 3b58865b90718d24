"""Reads on a hot standby (DWSEARCH_DATABASE_READ_URL), degrading to the primary.

`ReadPool` is where serve's reads go: Search and Similar, and IndexService's Query, Fetch,
Range, Info and BuildAgentContext (and the REST API's reads). Everything that writes, or
must see its own writes, takes the primary pool itself: the sweep, Purge and Forget, the
index's writes, knowledge gaps.

A search never fails because the replica went away:

- A read asks for a replica connection only while the replica is up. A replica that fails
  (a connection-class error: psycopg.OperationalError but a statement timeout, connection
  refused, admin shutdown, SQLSTATE 57P0x; no connection within `checkout_timeout`) is
  marked down for `backoff` seconds, its reads served by the primary, and then probed in
  the background (one connection, `SELECT 1`, the pool's idle connections checked): up
  again when the probe passes. Each transition logs once.
- An operation run under `retrying` (a whole search, an index query) whose replica
  connection failed mid-way runs once more, on the primary. A standby's recovery conflict
  (SQLSTATE 40001, "canceling statement due to conflict with recovery") is retried on the
  primary too, without marking the replica down.
- The replica's pool opens without waiting: serve starts while the replica is down.

The replica lags the primary by its replay delay: a window swept, or a document upserted,
a moment ago may not be found yet by a read (docs/operations/database.md, "Read replica").

Metrics: dwsearch_read_replica_up (1 up, 0 down) and dwsearch_read_replica_fallbacks_total
(reads the primary served instead, by reason)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import psycopg
import psycopg.errors
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from dwsearch.common import metrics
from dwsearch.common.errors import StartupError
from dwsearch.db.pool import open_pool

log = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

APPLICATION_NAME = "dwsearch-read"
"""The replica connections' application_name (pg_stat_activity), unless the URL names one."""

BACKOFF_S = 5.0
"""How long a failed replica stays down before it is probed again."""

CHECKOUT_TIMEOUT_S = 2.0
"""How long a read waits for a replica connection before the primary serves it."""

PROBE_TIMEOUT_S = 2.0
"""The probe's connect_timeout (also the replica pool's, unless the URL sets one)."""


@dataclass
class _Attempt:
    """One run of an operation under `retrying`: on the primary, and whether a replica
    connection failed during it (its tasks share this object)."""

    primary: bool = False
    failed: bool = False


_ATTEMPT: ContextVar[_Attempt | None] = ContextVar("dwsearch_read_attempt", default=None)


def replica_failure(exc: BaseException) -> str | None:
    """Why `exc`, raised on a replica connection, sends the read to the primary:
    "error" (the replica is unreachable or going away), "conflict" (a recovery conflict),
    or None (the read's own failure: the primary would fail it as well)."""
    if isinstance(exc, psycopg.errors.SerializationFailure):  # 40001: conflict with recovery
        return "conflict"
    if isinstance(exc, psycopg.errors.QueryCanceled):  # statement_timeout: the query, not the server
        return None
    if isinstance(exc, psycopg.OperationalError):  # class 08, 57P0x, PoolTimeout, a closed connection
        return "error"
    return None


def replica_conninfo(url: str) -> str:
    """`url` with application_name and connect_timeout, unless it sets them; StartupError
    (not naming the URL, which may hold a password) when it is not a Postgres URL."""
    try:
        params: dict[str, Any] = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        raise StartupError(
            "DWSEARCH_DATABASE_READ_URL is neither a postgresql:// URL nor a key=value connection string"
        ) from None
    params.setdefault("application_name", APPLICATION_NAME)
    params.setdefault("connect_timeout", str(int(PROBE_TIMEOUT_S)))
    return make_conninfo(**params)


class ReadPool:
    """The replica's pool over `replica_url`, with `primary` for everything it cannot
    serve; without a replica URL, the primary alone."""

    def __init__(
        self,
        primary: AsyncConnectionPool,
        replica_url: str = "",
        *,
        min_size: int = 1,
        max_size: int = 10,
        transaction_pooling: bool = False,
        backoff: float = BACKOFF_S,
        checkout_timeout: float = CHECKOUT_TIMEOUT_S,
    ) -> None:
        self.primary = primary
        self.replica: AsyncConnectionPool | None = None
        self.backoff = backoff
        self.checkout_timeout = checkout_timeout
        self._conninfo = replica_conninfo(replica_url) if replica_url else ""
        self._sizes = (min_size, max_size)
        self._transaction_pooling = transaction_pooling
        self._state = "unknown"  # "up", "down"; "unknown" until the first probe
        self._retry_at = 0.0  # time.monotonic() when a down replica may be probed again
        self._probe: asyncio.Task[bool] | None = None

    @property
    def configured(self) -> bool:
        return bool(self._conninfo)

    @property
    def replica_up(self) -> bool:
        return self._state == "up"

    async def open(self) -> None:
        """Open the replica's pool without waiting for it, and probe it in the background."""
        if not self._conninfo or self.replica is not None:
            return
        self.replica = await open_pool(
            self._conninfo,
            min_size=self._sizes[0],
            max_size=self._sizes[1],
            transaction_pooling=self._transaction_pooling,
            wait=False,
        )
        metrics.READ_REPLICA_UP.set(0)
        self._start_probe()

    async def close(self) -> None:
        """Close the replica's pool (the primary is its owner's to close)."""
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        if self.replica is not None:
            await self.replica.close()
            self.replica = None

    async def probe(self) -> bool:
        """Try the replica now: one fresh connection, then the pool's idle ones (those an
        outage broke are replaced). Up when it passes; down for `backoff` otherwise."""
        if self.replica is None:
            return False
        try:
            conn = await AsyncConnection.connect(self._conninfo, autocommit=True)
            async with conn:
                await conn.execute("SELECT 1")
            await asyncio.wait_for(self.replica.check(), PROBE_TIMEOUT_S + self.checkout_timeout)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            self._down(exc)
            return False
        self._up()
        return True

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection for reading: the replica's while it is up, the primary's otherwise
        (or when it fails to give one); a failure on the replica's marks it down."""
        attempt = _ATTEMPT.get()
        replica = self.replica
        if replica is None or (attempt is not None and attempt.primary):
            async with self.primary.connection() as conn:
                yield conn
            return
        if not self._usable():
            metrics.READ_REPLICA_FALLBACKS.labels("down").inc()
            async with self.primary.connection() as conn:
                yield conn
            return
        checkout = replica.connection(timeout=self.checkout_timeout)
        try:
            conn = await checkout.__aenter__()
        except psycopg.OperationalError as exc:  # unreachable, PoolTimeout
            self._down(exc)
            metrics.READ_REPLICA_FALLBACKS.labels("error").inc()
            async with self.primary.connection() as conn:
                yield conn
            return
        try:
            yield conn
        except BaseException as exc:
            reason = replica_failure(exc)
            if reason is not None:
                if reason == "error":
                    self._down(exc)
                if attempt is not None and not attempt.failed:
                    attempt.failed = True
                    metrics.READ_REPLICA_FALLBACKS.labels(reason).inc()
            if not await checkout.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            await checkout.__aexit__(None, None, None)

    async def retrying(self, op: Callable[[], Awaitable[T]]) -> T:
        """`op()`, run once more on the primary when a replica connection failed during it
        (an operation inside another one is retried by the outer one)."""
        if self.replica is None or _ATTEMPT.get() is not None:
            return await op()
        attempt = _Attempt()
        token = _ATTEMPT.set(attempt)
        try:
            return await op()
        except Exception:
            if not attempt.failed:
                raise
            log.debug("read failed on the replica; retried on the primary", exc_info=True)
        finally:
            _ATTEMPT.reset(token)
        token = _ATTEMPT.set(_Attempt(primary=True))
        try:
            return await op()
        finally:
            _ATTEMPT.reset(token)

    # --- state ---------------------------------------------------------------------------

    def _usable(self) -> bool:
        """Whether the replica may serve a read now; a probe starts when one is due."""
        if self._state == "up":
            return True
        if time.monotonic() >= self._retry_at:
            self._start_probe()
        return False

    def _start_probe(self) -> None:
        if self._probe is None or self._probe.done():
            self._retry_at = time.monotonic() + self.backoff  # one probe per back-off
            self._probe = asyncio.ensure_future(self.probe())

    def _down(self, exc: BaseException) -> None:
        self._retry_at = time.monotonic() + self.backoff
        if self._state != "down":
            log.warning(
                "read replica unavailable: reads go to the primary, the replica is tried again in %g s",
                self.backoff,
                extra={"component": "readpool", "error": str(exc).strip() or type(exc).__name__},
            )
        self._state = "down"
        metrics.READ_REPLICA_UP.set(0)

    def _up(self) -> None:
        if self._state != "up":
            log.warning("read replica up: reads go to it again", extra={"component": "readpool"})
        self._state = "up"
        metrics.READ_REPLICA_UP.set(1)


async def read_retrying(pool: ReadPool | AsyncConnectionPool, op: Callable[[], Awaitable[T]]) -> T:
    """ReadPool.retrying, for a pool that may be a ReadPool or the primary itself."""
    if isinstance(pool, ReadPool):
        return await pool.retrying(op)
    return await op()


class ReadsFrom(Protocol):
    """An object whose reads take `read_pool` (a ReadPool, or the primary itself)."""

    @property
    def read_pool(self) -> ReadPool | AsyncConnectionPool: ...


S = TypeVar("S", bound=ReadsFrom)


def read_operation(
    method: Callable[Concatenate[S, P], Awaitable[T]],
) -> Callable[Concatenate[S, P], Awaitable[T]]:
    """A read method run under its object's read_pool.retrying: on the replica, and once
    more on the primary when the replica fails it."""

    @functools.wraps(method)
    async def run(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await read_retrying(self.read_pool, lambda: method(self, *args, **kwargs))

    return run
