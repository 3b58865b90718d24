"""TtlCache: reuse within the TTL, expiry after it, bounded size."""

from dwsearch.common.ttlcache import TtlCache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_values_expire_after_the_ttl():
    clock = Clock()
    cache: TtlCache[str, bool] = TtlCache(5.0, clock=clock)
    assert cache.get("org-a") is None
    cache.put("org-a", False)
    clock.now += 4.9
    assert cache.get("org-a") is False  # a falsy value is still a hit
    clock.now += 0.1
    assert cache.get("org-a") is None


def test_put_refreshes_the_entry():
    clock = Clock()
    cache: TtlCache[str, int] = TtlCache(5.0, clock=clock)
    cache.put("k", 1)
    clock.now += 4
    cache.put("k", 2)
    clock.now += 4
    assert cache.get("k") == 2


def test_size_is_bounded():
    cache: TtlCache[int, int] = TtlCache(60.0, max_entries=3)
    for key in range(3):
        cache.put(key, key)
    cache.put(1, 10)  # replacing an entry never resets
    assert len(cache) == 3 and cache.get(1) == 10
    cache.put(3, 3)  # a new key at the bound starts over
    assert len(cache) == 1 and cache.get(3) == 3 and cache.get(0) is None
