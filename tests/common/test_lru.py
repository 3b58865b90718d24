"""The byte-bounded LRU (dwsearch.common.lru)."""

from __future__ import annotations

import pytest

from dwsearch.common.lru import ByteLru


def test_hit_and_miss():
    lru: ByteLru[str, int] = ByteLru(100)
    assert lru.get("a") is None
    assert lru.put("a", 1, 10)
    assert lru.get("a") == 1 and len(lru) == 1 and lru.bytes == 10


def test_evicts_least_recently_used_by_bytes():
    lru: ByteLru[str, int] = ByteLru(100)
    lru.put("a", 1, 40)
    lru.put("b", 2, 40)
    assert lru.get("a") == 1  # "b" is now the least recently used
    lru.put("c", 3, 40)
    assert "b" not in lru and lru.get("a") == 1 and lru.get("c") == 3
    assert lru.bytes == 80 <= lru.max_bytes
    lru.put("d", 4, 90)  # needs both gone
    assert len(lru) == 1 and lru.get("d") == 4 and lru.bytes == 90


def test_an_entry_bigger_than_the_bound_is_not_stored():
    lru: ByteLru[str, int] = ByteLru(100)
    lru.put("a", 1, 60)
    assert not lru.put("huge", 2, 101)
    assert "huge" not in lru and lru.get("a") == 1 and lru.bytes == 60


def test_replacing_a_key_recharges_it():
    lru: ByteLru[str, int] = ByteLru(100)
    lru.put("a", 1, 60)
    lru.put("a", 2, 30)
    assert lru.get("a") == 2 and lru.bytes == 30 and len(lru) == 1


def test_zero_bytes_is_off():
    lru: ByteLru[str, int] = ByteLru(0)
    assert not lru.put("a", 1, 1) and lru.get("a") is None
    with pytest.raises(ValueError):
        ByteLru(-1)
