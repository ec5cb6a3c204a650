"""A per-process cache bounded in bytes (docs/benchmarks.md: Performance, Each process's memory).

``ByteCache`` is a thread-safe least-recently-used mapping whose entries each carry a size in
bytes, measured by the caller before the entry is made (``text_bytes`` for a text: the memory
Python holds for it, read in O(1)).  The cache holds at most ``max_bytes`` bytes in total; an
entry larger than ``max_entry_bytes`` (or than ``max_bytes``) is never kept.

An ``OrderedDict`` under a lock rather than ``cachetools.LRUCache(getsizeof=...)``: a token count is
looked up dozens of times a turn, and a lookup costs about 0.6 µs here against 2.6 µs through
cachetools' layers (measured on this machine).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections import OrderedDict
from typing import Any, Callable, Generic, Hashable, Protocol, TypeVar, cast, overload

V = TypeVar("V")
D = TypeVar("D")
_MISSING = object()


def text_bytes(text: str) -> int:
    """Bytes Python holds for ``text`` (header and 1, 2 or 4 bytes a character); O(1), never raises."""
    return sys.getsizeof(text)


class ByteCache(Generic[V]):
    """LRU cache bounded in bytes.

    Args:
        max_bytes: the most bytes all entries may take together (0: nothing is cached).
        max_entry_bytes: the most bytes one entry may take (None: ``max_bytes``).
    """

    def __init__(self, max_bytes: int, max_entry_bytes: int | None = None):
        self._lock = threading.Lock()
        self._data: OrderedDict = OrderedDict()  # key -> (value, bytes), least recently used first
        self._size = 0
        self._bounds(max_bytes, max_entry_bytes)

    def _bounds(self, max_bytes: int, max_entry_bytes: int | None) -> None:
        self.max_bytes = max(int(max_bytes), 0)
        self.max_entry_bytes = self.max_bytes if max_entry_bytes is None else min(self.max_bytes, max_entry_bytes)

    def resize(self, max_bytes: int, max_entry_bytes: int | None = None) -> None:
        """Set new bounds (least recently used entries out until the rest fits)."""
        with self._lock:
            self._bounds(max_bytes, max_entry_bytes)
            for key in [k for k, (_, n) in self._data.items() if n > self.max_entry_bytes]:
                self._size -= self._data.pop(key)[1]
            self._evict()

    @overload
    def get(self, key: Hashable) -> V | None: ...

    @overload
    def get(self, key: Hashable, default: D) -> V | D: ...

    def get(self, key: Hashable, default: object = None) -> object:
        """The value kept for ``key`` (now the most recently used), or ``default``."""
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                return default
            self._data.move_to_end(key)
            return entry[0]

    def put(self, key: Hashable, value: V, nbytes: int) -> bool:
        """Keep ``value`` for ``key`` as ``nbytes`` bytes (least recently used entries out to make room).

        Returns:
            False (and nothing kept, an older entry for ``key`` dropped) when ``nbytes`` passes
            ``max_entry_bytes``.
        """
        nbytes = max(int(nbytes), 0)
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._size -= old[1]
            if nbytes > self.max_entry_bytes or self.max_bytes <= 0:
                return False
            self._data[key] = (value, nbytes)
            self._size += nbytes
            self._evict()
            return True

    def _evict(self) -> None:
        while self._size > self.max_bytes and self._data:
            self._size -= self._data.popitem(last=False)[1][1]

    def pop(self, key: Hashable) -> None:
        """Forget ``key`` (nothing when it is not kept)."""
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._size -= old[1]

    def discard_where(self, predicate: Callable[[Any], bool]) -> int:
        """Forget every entry whose key satisfies ``predicate(key)``; return how many went."""
        with self._lock:
            gone = [k for k in self._data if predicate(k)]
            for key in gone:
                self._size -= self._data.pop(key)[1]
            return len(gone)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._data.clear()
            self._size = 0

    def keys(self) -> list:
        """The keys kept now, least recently used first (a copy; their order of use is not changed)."""
        with self._lock:
            return list(self._data)

    @property
    def currsize(self) -> int:
        """Bytes the entries take now."""
        return self._size

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._data


class BytesCached(Protocol):
    """What ``bytes_cached`` makes of a function: the function, plus its ``cache`` and ``cache_clear()``."""

    cache: ByteCache
    cache_clear: Callable[[], None]

    def __call__(self, *args: Any) -> Any: ...


def bytes_cached(max_bytes: int, max_entry_bytes: int | None = None,
                 overhead: int = 300) -> Callable[[Callable[..., Any]], BytesCached]:
    """Decorator: cache a pure function's results by its (hashable) arguments in a ``ByteCache``.

    An entry's size is its text arguments' bytes (``text_bytes``; the result is assumed to hold the same
    texts, as a parsed message does) plus ``overhead``.  An exception is never cached.  The wrapper has
    ``.cache`` (the ``ByteCache``) and ``.cache_clear()``.
    """

    def decorate(fn: Callable[..., Any]) -> BytesCached:
        cache: ByteCache = ByteCache(max_bytes, max_entry_bytes)

        def wrapper(*args: Hashable) -> Any:
            found = cache.get(args, _MISSING)
            if found is not _MISSING:
                return found
            result = fn(*args)
            size = overhead + sum(text_bytes(a) for a in args if isinstance(a, str))
            cache.put(args, result, size)
            return result

        # update_wrapper: __name__, __doc__, __wrapped__ of ``fn``; a BytesCached once the two lines below ran
        cached = cast(BytesCached, functools.update_wrapper(wrapper, fn))
        cached.cache = cache
        cached.cache_clear = cache.clear
        return cached

    return decorate
