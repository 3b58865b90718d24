"""A small time-bounded cache for per-org answers that change slowly (feature flags, an
org's size) and would otherwise cost a database round trip on every request."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """Values are reused for `ttl` seconds. Bounded: requests may name any key, so when
    `max_entries` is reached the cache starts over rather than grow."""

    def __init__(self, ttl: float, *, max_entries: int = 100_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[K, tuple[V, float]] = {}

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None or self._clock() - entry[1] >= self.ttl:
            return None
        return entry[0]

    def put(self, key: K, value: V) -> None:
        if len(self._entries) >= self.max_entries and key not in self._entries:
            self._entries.clear()
        self._entries[key] = (value, self._clock())

    def __len__(self) -> int:
        return len(self._entries)
