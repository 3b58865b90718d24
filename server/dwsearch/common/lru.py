"""A least-recently-used cache bounded in bytes: each entry is charged the size its
caller gives (its key's and value's bytes), and the least recently used entries go when
the total would pass the bound. Not thread-safe: one event loop's tasks share it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ByteLru(Generic[K, V]):
    """At most `max_bytes` of entries; 0 = off (nothing is stored)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: K, value: V, size: int) -> bool:
        """Store `value` as `size` bytes, evicting the least recently used entries to make
        room. An entry larger than the whole bound is not stored (False), and leaves the
        others in place."""
        if size > self.max_bytes:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        while self._entries and self.bytes + size > self.max_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.bytes -= evicted
        self._entries[key] = (value, size)
        self.bytes += size
        return True

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries
