"""A small time-bounded cache for per-org answers that change slowly (feature flags, an
org's size) and would otherwise cost a database round trip on every request."""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from dwsearch.common import metrics

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# What one entry costs besides its key and value: the dict slot, the (value, time) tuple
# and the float.
ENTRY_OVERHEAD_BYTES = 160
# About 30,000 orgs with 36-character ids (273 bytes each), 15,000 at the longest org id.
DEFAULT_MAX_BYTES = 8 * 1024 * 1024


def entry_bytes(key: object, value: object) -> int:
    """An entry's size as charged: its key's and value's own sizes (a str key is charged
    its characters) plus the entry's overhead. Values are small here (a bool, an int, or
    one statistics object in a cache of one entry)."""
    return sys.getsizeof(key) + sys.getsizeof(value) + ENTRY_OVERHEAD_BYTES


class TtlCache(Generic[K, V]):
    """Values are reused for `ttl` seconds. Bounded in bytes, since requests may name any
    key (an org id is at most 256 bytes, but there are many): when an entry would take
    the cache past `max_bytes` (or `max_entries`), the oldest entries go first."""

    def __init__(
        self,
        ttl: float,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
        size: Callable[[object, object], int] = entry_bytes,
        name: str = "",
    ) -> None:
        """`name`: count lookups in dwsearch_cache_lookups_total{cache=name}."""
        self.ttl = ttl
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.bytes = 0
        self._clock = clock
        self._size = size
        # Oldest put first: a put moves its key to the end.
        self._entries: OrderedDict[K, tuple[V, float, int]] = OrderedDict()
        self._hits = metrics.CACHE_LOOKUPS.labels(name, "hit") if name else None
        self._misses = metrics.CACHE_LOOKUPS.labels(name, "miss") if name else None

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is not None and self._clock() - entry[1] >= self.ttl:
            self._drop(key)
            entry = None
        counter = self._misses if entry is None else self._hits
        if counter is not None:
            counter.inc()
        return None if entry is None else entry[0]

    def put(self, key: K, value: V) -> None:
        size = self._size(key, value)
        self._drop(key)
        if size > self.max_bytes:
            return  # larger than the whole cache: not kept
        while self._entries and (
            self.bytes + size > self.max_bytes or len(self._entries) >= self.max_entries
        ):
            _, (_, _, evicted) = self._entries.popitem(last=False)
            self.bytes -= evicted
        self._entries[key] = (value, self._clock(), size)
        self.bytes += size

    def _drop(self, key: K) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes -= entry[2]

    def __len__(self) -> int:
        return len(self._entries)
