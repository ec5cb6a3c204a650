"""A per-process cache bounded in bytes (README: Performance, Each process's memory).

``ByteCache`` is a thread-safe least-recently-used mapping whose entries each carry a size in
bytes, measured by the caller before the entry is made (``text_bytes`` for a text: the memory
Python holds for it, read in O(1)).  The cache holds at most ``max_bytes`` bytes in total; an
entry larger than ``max_entry_bytes`` (or than ``max_bytes``) is never kept.  Built on
``cachetools.LRUCache`` (its ``getsizeof`` bounds the total).
"""

from __future__ import annotations

import sys
import threading
from typing import Generic, Hashable, TypeVar

from cachetools import LRUCache

V = TypeVar("V")
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
        self._configure(max_bytes, max_entry_bytes)

    def _configure(self, max_bytes: int, max_entry_bytes: int | None) -> None:
        self.max_bytes = max(int(max_bytes), 0)
        self.max_entry_bytes = min(self.max_bytes, self.max_bytes if max_entry_bytes is None else max_entry_bytes)
        self._data: LRUCache = LRUCache(max(self.max_bytes, 1), getsizeof=lambda entry: entry[1])

    def resize(self, max_bytes: int, max_entry_bytes: int | None = None) -> None:
        """Set new bounds (entries are kept while they fit, least recently used out)."""
        with self._lock:
            if max_bytes == self.max_bytes and max_entry_bytes in (None, self.max_entry_bytes):
                return
            old = list(self._data.items())
            self._configure(max_bytes, max_entry_bytes)
            for key, entry in old:
                self._put(key, *entry)

    def get(self, key: Hashable, default=None):
        """The value kept for ``key`` (now the most recently used), or ``default``."""
        with self._lock:
            entry = self._data.get(key, _MISSING)
        return default if entry is _MISSING else entry[0]

    def put(self, key: Hashable, value: V, nbytes: int) -> bool:
        """Keep ``value`` for ``key`` as ``nbytes`` bytes (least recently used entries out to make room).

        Returns:
            False (and nothing kept, an older entry for ``key`` dropped) when ``nbytes`` passes
            ``max_entry_bytes``.
        """
        with self._lock:
            return self._put(key, value, nbytes)

    def _put(self, key: Hashable, value: V, nbytes: int) -> bool:
        if nbytes > self.max_entry_bytes or self.max_bytes <= 0:
            self._data.pop(key, None)
            return False
        self._data[key] = (value, max(int(nbytes), 0))
        return True

    def pop(self, key: Hashable) -> None:
        """Forget ``key`` (nothing when it is not kept)."""
        with self._lock:
            self._data.pop(key, None)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._data.clear()

    @property
    def currsize(self) -> int:
        """Bytes the entries take now."""
        return int(self._data.currsize)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._data


def bytes_cached(max_bytes: int, max_entry_bytes: int | None = None, overhead: int = 300):
    """Decorator: cache a pure function's results by its (hashable) arguments in a ``ByteCache``.

    An entry's size is its text arguments' bytes (``text_bytes``; the result is assumed to hold the same
    texts, as a parsed message does) plus ``overhead``.  An exception is never cached.  The wrapper has
    ``.cache`` (the ``ByteCache``) and ``.cache_clear()``.
    """

    def decorate(fn):
        cache: ByteCache = ByteCache(max_bytes, max_entry_bytes)

        def wrapper(*args):
            found = cache.get(args, _MISSING)
            if found is not _MISSING:
                return found
            result = fn(*args)
            size = overhead + sum(text_bytes(a) for a in args if isinstance(a, str))
            cache.put(args, result, size)
            return result

        wrapper.cache = cache
        wrapper.cache_clear = cache.clear
        wrapper.__wrapped__ = fn
        wrapper.__name__ = fn.__name__
        wrapper.__doc__ = fn.__doc__
        return wrapper

    return decorate
