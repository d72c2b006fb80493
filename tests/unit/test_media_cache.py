"""MediaCache: byte-bounded LRU, namespaces, oversize values, counters."""

from __future__ import annotations

import pytest

from trtllm_gateway.multimodal.cache import MediaCache


def test_get_put_and_namespaces() -> None:
    cache = MediaCache(100)
    cache.put("image/rgb", "h1", "pixels", 10)
    cache.put("embedding", "h1", "vector", 10)
    assert cache.get("image/rgb", "h1") == "pixels"
    assert cache.get("embedding", "h1") == "vector"
    assert cache.get("image/rgb", "h2") is None
    assert (cache.hits, cache.misses, len(cache), cache.bytes_used) == (2, 1, 2, 20)


def test_evicts_least_recently_used_by_bytes() -> None:
    cache = MediaCache(30)
    for key in "abc":
        cache.put("n", key, key, 10)
    assert cache.get("n", "a") == "a"  # a is now the most recent
    cache.put("n", "d", "d", 10)
    assert ("n", "b") not in cache
    assert [k for k in "acd" if ("n", k) in cache] == ["a", "c", "d"]
    cache.put("n", "big", "big", 25)
    assert cache.bytes_used <= 30
    assert ("n", "big") in cache
    assert cache.evictions == 4


def test_replacing_a_key_updates_its_size() -> None:
    cache = MediaCache(100)
    cache.put("n", "k", 1, 60)
    cache.put("n", "k", 2, 30)
    assert (cache.get("n", "k"), cache.bytes_used, len(cache)) == (2, 30, 1)


def test_value_larger_than_capacity_is_not_kept() -> None:
    cache = MediaCache(10)
    cache.put("n", "small", 1, 5)
    cache.put("n", "huge", 2, 11)
    assert cache.get("n", "huge") is None
    assert cache.get("n", "small") == 1


def test_zero_capacity_disables() -> None:
    cache = MediaCache(0)
    cache.put("n", "k", 1, 1)
    assert len(cache) == 0


def test_clear_and_validation() -> None:
    cache = MediaCache(10)
    cache.put("n", "k", 1, 5)
    cache.clear()
    assert (len(cache), cache.bytes_used) == (0, 0)
    with pytest.raises(ValueError, match="capacity"):
        MediaCache(-1)
    with pytest.raises(ValueError, match="nbytes"):
        cache.put("n", "k", 1, -1)
