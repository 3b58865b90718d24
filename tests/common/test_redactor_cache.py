"""Redactors built for known-name lists are cached in bytes, not entries: each distinct list
of 1,000 names kept about 3.3 MB (in functools' cache of 64 lists, and again in `re`'s own
module cache of 512 patterns), so callers sending distinct lists could grow serve without
bound. Now each is charged its names pattern's memory budget and the cache holds at most
REDACTOR_CACHE_BYTES of them."""

from __future__ import annotations

import gc
import re
from pathlib import Path

from dwsearch import redaction
from dwsearch.common.lru import ByteLru

MIB = 2**20


def names(seed: int, count: int = 1000, length: int = 200) -> tuple[str, ...]:
    return tuple(f"N{seed:04d}x{i:04d} " + "a" * (length - 12) for i in range(count))


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_distinct_name_lists_keep_at_most_the_cache_bound(monkeypatch):
    per_list = redaction.redactor_bytes(names(1, count=200))
    assert per_list > 0
    cache: ByteLru = ByteLru(3 * per_list)  # the real bound is REDACTOR_CACHE_BYTES (32 MiB)
    monkeypatch.setattr(redaction, "_REDACTORS", cache)
    for seed in range(1, 8):
        listed = names(seed, count=200)
        assert redaction.redact(f"hello {listed[3]}", listed) == f"hello {redaction.NAME}"
        assert cache.bytes <= cache.max_bytes
    assert len(cache) == 3  # the oldest lists went
    assert names(1, count=200) not in cache and names(7, count=200) in cache
    # A list used again is found again, not rebuilt.
    listed = names(7, count=200)
    assert redaction.redactor(listed) is redaction.redactor(listed)
    # Python's own regex cache holds no names pattern.
    patterns = [str(key[1]) for key in getattr(re, "_cache", {}) if isinstance(key, tuple) and len(key) > 1]
    assert not [p for p in patterns if "N0001x" in p]


def test_forty_distinct_thousand_name_lists_leave_resident_memory_bounded():
    """40 lists of 1,000 names of 200 bytes each: about 130 MB kept before; now RSS grows by
    at most the cache bound plus 32 MiB of allocator slack."""
    gc.collect()
    before = rss_bytes()
    for seed in range(100, 140):
        listed = names(seed)
        assert redaction.redact(f"hi {listed[0]}", listed) == f"hi {redaction.NAME}"
    gc.collect()
    growth = rss_bytes() - before
    assert redaction._REDACTORS.bytes <= redaction.REDACTOR_CACHE_BYTES
    assert growth <= redaction.REDACTOR_CACHE_BYTES + 32 * MIB, growth / MIB
