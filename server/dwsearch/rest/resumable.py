"""Resumable queries (Upstash's resumable-query, -next and -end): each open query's
request kept in memory, re-run for top_k = what it returned + additionalK on each next,
so a page never repeats a result. Bounded in number and idle time per index, and in bytes
per index and per process: an open query keeps only the fields a query reads (QUERY_FIELDS;
unknown ones are dropped), its vectors packed as float64 arrays, and counts what it keeps
(`kept_bytes`) against both budgets."""

from __future__ import annotations

import time
import uuid
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from dwsearch.common.errors import InvalidArgument, NotFound, ResourceExhausted
from dwsearch.index.documents import MAX_TOP_K

DEFAULT_IDLE_S = 3600
MAX_IDLE_S = 86400
MAX_OPEN = 10_000
"""Open resumable queries per index."""
MAX_BYTES_PER_INDEX = 32 * 1024 * 1024
"""What one index's open queries keep, in total (kept_bytes)."""
MAX_BYTES = 128 * 1024 * 1024
"""What every index's open queries keep, in total, in one process (ResumableBudget)."""
OPEN_QUERY_BYTES = 512
"""An open query's own cost besides its fields: its state, uuid and dict entries."""

QUERY_FIELDS = frozenset({
    "vector", "sparseVector", "data", "filter", "topK", "includeVectors", "includeMetadata",
    "includeData", "queryMode", "fusionAlgorithm", "weightingStrategy", "similarTo", "explain",
})  # fmt: skip
"""The request fields a query reads: an open query keeps these alone."""

NOT_FOUND = "Resumable query not found (ended, or idle past its maxIdle)"

Run = Callable[[str, dict[str, Any]], Awaitable[list[dict[str, Any]]]]
"""Runs a query (namespace, request body) and returns its results, best first."""


@dataclass
class ResumableBudget:
    """The bytes every index's open queries keep, shared by the process's ResumableQueries."""

    limit: int = MAX_BYTES
    used: int = 0
    members: list[ResumableQueries] = field(default_factory=list, repr=False)

    def reclaim(self) -> None:
        """Every member's queries idle past their maxIdle ended, their bytes given back."""
        for member in self.members:
            member.expire()


@dataclass
class _Open:
    namespace: str
    body: dict[str, Any]
    returned: int
    max_idle: float
    used: float
    size: int = field(default=0)


def kept(body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """What an open query keeps of a checked request (the query fields, vectors packed) and
    its cost in bytes. The request has run once, so its fields have the shapes a query
    accepts."""
    fields = {name: value for name, value in body.items() if name in QUERY_FIELDS}
    size = OPEN_QUERY_BYTES
    if isinstance(fields.get("vector"), list):
        fields["vector"] = array("d", fields["vector"])
        size += 8 * len(fields["vector"])
    sparse = fields.get("sparseVector")
    if isinstance(sparse, dict):
        indices, values = array("q", sparse["indices"]), array("d", sparse["values"])
        fields["sparseVector"] = (indices, values)
        size += 16 * len(indices)
    for name in ("data", "filter"):
        if isinstance(fields.get(name), str):
            size += len(fields[name].encode("utf-8", "surrogatepass"))
    return fields, size


def request(fields: dict[str, Any]) -> dict[str, Any]:
    """The request an open query runs again (the inverse of `kept`)."""
    body = dict(fields)
    if isinstance(body.get("vector"), array):
        body["vector"] = body["vector"].tolist()
    if isinstance(body.get("sparseVector"), tuple):
        indices, values = body["sparseVector"]
        body["sparseVector"] = {"indices": indices.tolist(), "values": values.tolist()}
    return body


class ResumableQueries:
    def __init__(
        self,
        run: Run,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int = MAX_BYTES_PER_INDEX,
        budget: ResumableBudget | None = None,
    ) -> None:
        self._run = run
        self._clock = clock
        self._open: dict[str, _Open] = {}
        self._max_bytes = max_bytes
        self._budget = budget if budget is not None else ResumableBudget()
        self._budget.members.append(self)
        self.kept_bytes = 0

    async def start(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        max_idle = body.get("maxIdle", DEFAULT_IDLE_S)
        if (
            not isinstance(max_idle, (int, float))
            or isinstance(max_idle, bool)
            or not 0 < max_idle <= MAX_IDLE_S
        ):
            raise InvalidArgument(f"maxIdle: 1 to {MAX_IDLE_S} seconds")
        scores = await self._run(namespace, body)
        self.expire()
        if len(self._open) >= MAX_OPEN:
            raise ResourceExhausted(f"{MAX_OPEN} resumable queries are open; end some")
        fields, size = kept(body)
        if self.kept_bytes + size > self._max_bytes:
            raise ResourceExhausted(
                f"this index's open resumable queries keep {self.kept_bytes} bytes (at most"
                f" {self._max_bytes}); end some"
            )
        if self._budget.used + size > self._budget.limit:
            self._budget.reclaim()
        if self._budget.used + size > self._budget.limit:
            raise ResourceExhausted(f"open resumable queries keep {self._budget.used} bytes; end some")
        uid = str(uuid.uuid4())
        self._open[uid] = _Open(namespace, fields, len(scores), float(max_idle), self._clock(), size)
        self.kept_bytes += size
        self._budget.used += size
        return {"uuid": uid, "scores": scores}

    async def next(self, uid: str, additional: int) -> list[dict[str, Any]]:
        self.expire()
        state = self._open.get(uid)
        if state is None:
            raise NotFound(NOT_FOUND)
        if additional < 1:
            raise InvalidArgument("additionalK: at least 1")
        top_k = min(MAX_TOP_K, state.returned + additional)
        scores = (
            await self._run(state.namespace, {**request(state.body), "topK": top_k})
            if top_k > state.returned
            else []
        )
        page = scores[state.returned :]
        state.returned += len(page)
        state.used = self._clock()
        return page

    def end(self, uid: str) -> None:
        if uid not in self._open:
            raise NotFound(NOT_FOUND)
        self._close(uid)

    def _close(self, uid: str) -> None:
        state = self._open.pop(uid)
        self.kept_bytes -= state.size
        self._budget.used -= state.size

    def expire(self) -> None:
        now = self._clock()
        for uid in [u for u, state in self._open.items() if now - state.used > state.max_idle]:
            self._close(uid)
