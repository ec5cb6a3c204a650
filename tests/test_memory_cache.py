"""The per-process cache bounded in bytes (app/memory/cache.py; docs/benchmarks.md: Performance)."""

from __future__ import annotations

from app.memory.cache import ByteCache, bytes_cached, text_bytes


def test_least_recently_used_entries_leave_to_keep_the_byte_bound():
    cache = ByteCache(100)
    cache.put("a", 1, 40)
    cache.put("b", 2, 40)
    assert cache.get("a") == 1  # "b" is now the least recently used
    cache.put("c", 3, 40)
    assert ("a" in cache, "b" in cache, "c" in cache) == (True, False, True)
    assert cache.currsize == 80 and len(cache) == 2


def test_an_entry_over_the_entry_bound_is_not_kept_and_drops_an_older_one():
    cache = ByteCache(1000, max_entry_bytes=100)
    cache.put("a", 1, 50)
    assert cache.put("a", 2, 101) is False
    assert "a" not in cache and cache.currsize == 0
    assert ByteCache(0).put("x", 1, 1) is False


def test_resizing_keeps_what_fits():
    cache = ByteCache(300)
    for key in "abc":
        cache.put(key, key, 100)
    cache.resize(150)
    assert list(k for k in "abc" if k in cache) == ["c"] and cache.currsize == 100
    cache.pop("c")
    cache.clear()
    assert cache.currsize == 0 and len(cache) == 0


def test_a_cached_function_keeps_results_within_bytes_and_never_an_exception():
    calls = []

    @bytes_cached(10_000, 2_000)
    def parse(text):
        calls.append(text)
        if text == "bad":
            raise ValueError(text)
        return text.upper()

    assert parse("x") == parse("x") == "X" and calls == ["x"]
    big = "y" * 5000
    assert parse(big) == parse(big).upper() and calls.count(big) == 2  # larger than an entry: not kept
    for _ in range(2):
        try:
            parse("bad")
        except ValueError:
            pass
    assert calls.count("bad") == 2
    assert parse.cache.currsize <= 10_000
    assert text_bytes("") < text_bytes("a") < text_bytes("好")
