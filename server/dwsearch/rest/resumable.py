"""Resumable queries (Upstash's resumable-query, -next and -end): each open query's
request kept in memory, re-run for top_k = what it returned + additionalK on each next,
so a page never repeats a result. Per index, bounded in number and idle time."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from dwsearch.common.errors import InvalidArgument, NotFound, ResourceExhausted
from dwsearch.index.documents import MAX_TOP_K

DEFAULT_IDLE_S = 3600
MAX_IDLE_S = 86400
MAX_OPEN = 10_000
"""Open resumable queries per index (each holds its request, at most SMALL_BODY_BYTES)."""

NOT_FOUND = "Resumable query not found (ended, or idle past its maxIdle)"

Run = Callable[[str, dict[str, Any]], Awaitable[list[dict[str, Any]]]]
"""Runs a query (namespace, request body) and returns its results, best first."""


@dataclass
class _Open:
    namespace: str
    body: dict[str, Any]
    returned: int
    max_idle: float
    used: float


class ResumableQueries:
    def __init__(self, run: Run, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._run = run
        self._clock = clock
        self._open: dict[str, _Open] = {}

    async def start(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        max_idle = body.get("maxIdle", DEFAULT_IDLE_S)
        if (
            not isinstance(max_idle, (int, float))
            or isinstance(max_idle, bool)
            or not 0 < max_idle <= MAX_IDLE_S
        ):
            raise InvalidArgument(f"maxIdle: 1 to {MAX_IDLE_S} seconds")
        scores = await self._run(namespace, body)
        self._expire()
        if len(self._open) >= MAX_OPEN:
            raise ResourceExhausted(f"{MAX_OPEN} resumable queries are open; end some")
        uid = str(uuid.uuid4())
        self._open[uid] = _Open(namespace, dict(body), len(scores), float(max_idle), self._clock())
        return {"uuid": uid, "scores": scores}

    async def next(self, uid: str, additional: int) -> list[dict[str, Any]]:
        self._expire()
        state = self._open.get(uid)
        if state is None:
            raise NotFound(NOT_FOUND)
        if additional < 1:
            raise InvalidArgument("additionalK: at least 1")
        top_k = min(MAX_TOP_K, state.returned + additional)
        scores = (
            await self._run(state.namespace, {**state.body, "topK": top_k}) if top_k > state.returned else []
        )
        page = scores[state.returned :]
        state.returned += len(page)
        state.used = self._clock()
        return page

    def end(self, uid: str) -> None:
        if self._open.pop(uid, None) is None:
            raise NotFound(NOT_FOUND)

    def _expire(self) -> None:
        now = self._clock()
        for uid in [u for u, state in self._open.items() if now - state.used > state.max_idle]:
            del self._open[uid]
