"""TtlCache: reuse within the TTL, expiry after it, bounded size in entries and bytes."""

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
    cache.put(1, 10)  # replacing an entry never evicts, and makes it the newest
    assert len(cache) == 3 and cache.get(1) == 10
    cache.put(3, 3)  # a new key at the bound evicts the oldest put
    assert len(cache) == 3 and cache.get(3) == 3 and cache.get(0) is None and cache.get(2) == 2


def test_bytes_are_bounded_whatever_the_keys():
    """200 distinct 2 MiB org ids (a caller's choice before org ids had a length limit)
    left 409-442 MiB resident in the flag and event-count caches: now they keep at most
    max_bytes, whatever the keys."""
    cache: TtlCache[str, bool] = TtlCache(60.0, max_bytes=8 * 2**20)
    for i in range(200):
        cache.put(f"{i:04d}" + "x" * (2 * 2**20), True)
        assert cache.bytes <= 8 * 2**20
    assert 1 <= len(cache) <= 4
    assert cache.get(f"{199:04d}" + "x" * (2 * 2**20)) is True  # the newest stay
    huge = "y" * (9 * 2**20)
    cache.put(huge, True)  # larger than the whole cache: not kept, and evicts nothing
    assert cache.get(huge) is None and len(cache) >= 1


def test_entries_are_charged_their_size_and_give_it_back():
    clock = Clock()
    cache: TtlCache[str, int] = TtlCache(5.0, clock=clock, size=lambda key, value: 100)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 3)
    assert cache.bytes == 200
    clock.now += 5
    assert cache.get("a") is None  # an expired entry is dropped when met
    assert cache.bytes == 100


def test_the_search_caches_are_bounded_in_bytes():
    from dwsearch.common.ttlcache import DEFAULT_MAX_BYTES
    from dwsearch.search.ftsplan import FtsPlanner

    planner = FtsPlanner()
    assert planner._org_events.max_bytes == DEFAULT_MAX_BYTES
    assert DEFAULT_MAX_BYTES <= 8 * 2**20


def test_a_named_cache_counts_its_hits_and_misses():
    from dwsearch.common import metrics

    def count(result: str) -> float:
        return metrics.CACHE_LOOKUPS.labels("test_cache", result)._value.get()

    clock = Clock()
    cache: TtlCache[str, int] = TtlCache(10, clock=clock, name="test_cache")
    hits, misses = count("hit"), count("miss")
    assert cache.get("org-a") is None
    cache.put("org-a", 1)
    assert cache.get("org-a") == 1
    clock.now += 11
    assert cache.get("org-a") is None  # expired: a miss
    assert (count("hit") - hits, count("miss") - misses) == (1, 2)
    unnamed: TtlCache[str, int] = TtlCache(10, clock=clock)
    assert unnamed.get("org-a") is None  # not counted anywhere
    assert (count("hit") - hits, count("miss") - misses) == (1, 2)
