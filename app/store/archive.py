"""Reads of a thread's archive of folded turns (docs/memory.md: Recall; docs/contract.md: Model context for a turn).

The archive is a sorted set per thread (``ThreadKeys.archive``, in the thread's hash
slot, with the thread's TTL, deleted by a clear), written only by
``lua/apply_compaction.lua``: every folded turn as ``{"n": number, "m": [messages]}``,
scored by its turn number, capped by ``MEMORY_ARCHIVE_MAX_TURNS`` turns and
``MEMORY_ARCHIVE_MAX_BYTES`` bytes, oldest out.

``Archive`` (one per process, ``Services.archive``) reads it.  ``Archive.load_turn_memory`` is the turn path's
read: the thread hash and what the archive gained since this process last read it, in **one round trip** (a
pipeline of one thread's keys, so one node on a cluster, without MULTI).  The ``Archive`` keeps the
tokenised archives of its most recently used threads (``ArchiveIndex``) within
``ARCHIVE_CACHE_MAX_BYTES`` bytes (each index's ``nbytes``; least recently used out; an
index larger than the whole bound is used for its turn and not kept), so a turn reads and
tokenises only the turns folded since its last read.  A copy is valid for the thread's creation stamp (the hash's
``born``, set by its first commit), clear counter and forget counter (``ThreadState.cleared``,
``ThreadState.forgets``): after a clear, a forget or the thread's expiry every process builds a new one from the
archive, so a forgotten turn never comes back from a cache and a new conversation is never served an old one's
archive.  ``app.extensions.ThreadCaches.drop_thread`` drops a thread from every cache of the process, this one
among them (``Archive.drop_thread``).  The tokenising may run elsewhere than
the caller's greenlet (``load_turn_memory``'s ``run``): the reads stay with the caller.  A second
round trip happens only when that copy cannot be brought up to date from the answer
(the thread was cleared and compacted again, or expired and came back).

``Archive.newest_turns`` is hydration's read: the newest ``HYDRATION_TURNS`` archived turns.  Redis failures
go through the store's error guard (``ThreadStore.guard``): ``StoreUnavailable``, the store's error hook told
``"load"`` or ``"archive"``.
"""

from __future__ import annotations

import json
import logging
import weakref
from typing import Any, Callable, Iterable

import redis

from app.memory.cache import ByteCache
from app.memory.recall import ArchivedTurn, ArchiveIndex
from app.memory.state import ThreadState, thread_label
from app.store.errors import CorruptState
from app.store.keys import ThreadKeys
from app.store.thread_store import ThreadStore

log = logging.getLogger(__name__)

CACHE_MAX_BYTES = 64 * 1024 * 1024
"""Default bound of the process's cache of tokenised archives, in bytes (``ARCHIVE_CACHE_MAX_BYTES``; a full
archive of the default 2,000,000 bytes takes about 30 MB tokenised)."""
HYDRATION_TURNS = 200
"""Most archived turns hydration returns (the newest)."""


def parse_member(member: str) -> ArchivedTurn | None:
    """An archive member as an ``ArchivedTurn``; None (logged) when it is not one."""
    try:
        return ArchivedTurn.from_dict(json.loads(member))
    except (ValueError, TypeError, KeyError):
        log.warning("archive member skipped: not a turn")
        return None


def _turns(members: Iterable[Any]) -> list[ArchivedTurn]:
    """The turns of a ``ZRANGE`` reply's members (text: the client decodes replies; redis-py's hint of the
    reply also covers its ``WITHSCORES`` forms), unreadable members skipped."""
    return [t for t in (parse_member(m) for m in members) if t is not None]


def _direct(work: Callable[[], None]) -> None:
    work()


class Archive:
    """Reads of threads' archives, with this process's cache of their tokenised indexes (module docstring).

    Args:
        store: the thread store (its client, its reading of the thread hash, its error guard).
        cache_max_bytes: the bound of the cache of tokenised archives, bytes (``ARCHIVE_CACHE_MAX_BYTES``; an
            index larger than the whole bound is used for its turn and not kept).
    """

    def __init__(self, store: ThreadStore, *, cache_max_bytes: int = CACHE_MAX_BYTES):
        self.store = store
        self._cache: ByteCache[ArchiveIndex] = ByteCache(cache_max_bytes)

    # -- the cache -------------------------------------------------------------------------------

    def cached(self, thread_id: str) -> ArchiveIndex | None:
        """The index kept for ``thread_id`` (now the most recently used), or None."""
        return self._cache.get(thread_id)

    def _remember(self, thread_id: str, index: ArchiveIndex) -> None:
        self._cache.put(thread_id, index, index.nbytes)  # not kept when larger than the whole bound

    def drop_thread(self, thread_id: str, *, keep: ArchiveIndex | None = None) -> None:
        """Drop the index kept for ``thread_id``; with ``keep`` (an index valid for the thread as it is now, e.g.
        after a forget), keep that one instead."""
        if keep is None:
            self._cache.pop(thread_id)
        else:
            self._remember(thread_id, keep)

    def drop_all(self) -> None:
        """Drop every index kept."""
        self._cache.clear()

    def resize(self, max_bytes: int) -> None:
        """Bound the cache to ``max_bytes`` bytes (least recently used indexes out)."""
        self._cache.resize(max_bytes)

    @property
    def cached_bytes(self) -> int:
        """Bytes the kept indexes take now (about; ``ArchiveIndex.nbytes``)."""
        return self._cache.currsize

    @property
    def max_bytes(self) -> int:
        """The cache's bound, bytes."""
        return self._cache.max_bytes

    # -- reads -----------------------------------------------------------------------------------

    def load_turn_memory(self, thread_id: str, *,
                         run: Callable[[Callable[[], None]], None] = _direct) -> tuple[ThreadState, ArchiveIndex]:
        """The thread's state and its archive index, in one round trip (see the module docstring).

        Args:
            thread_id: the thread.
            run: calls its argument (tokenising archived turns into the index: CPU only, no store call) and
                returns when it is done; e.g. in a thread pool, so that a long tokenising never holds up the
                caller's event loop.  By default, right here.

        Returns:
            ``(state, index)``; ``index`` holds every archived turn (empty for a thread never compacted).

        Raises:
            StoreUnavailable: Redis failed (the store's error hook is told ``"load"``).
            CorruptState: the stored hash is invalid (``ThreadStore.parse``).
        """
        store = self.store
        keys = ThreadKeys(thread_id)
        index = self.cached(thread_id)
        since = f"({index.newest}" if index is not None and len(index) else "-inf"
        try:
            pipe = store.redis.pipeline(transaction=False)
            pipe.hgetall(keys.state)
            pipe.zrangebyscore(keys.archive, since, "+inf")
            pipe.zcard(keys.archive)
            pipe.zrange(keys.archive, 0, 0, withscores=True)
            raw, members, count, oldest = pipe.execute()
            state = store.parse(raw)
            born = raw.get("born") or ""
            if index is None or (index.born, index.cleared, index.forgets) != (born, state.cleared, state.forgets):
                stale_since = since != "-inf"
                index = ArchiveIndex(cleared=state.cleared, forgets=state.forgets, born=born)
                if stale_since and count:
                    members = store.redis.zrange(keys.archive, 0, -1)  # a clear and new folds since: read all
            if members:
                current = index  # bound now: the closure must not follow ``index`` when it is rebound below
                run(lambda: current.add(_turns(members)))
            if oldest:
                index.drop_before(int(oldest[0][1]))
            if len(index) != int(count):  # the archive expired and came back, or a member was unreadable
                index = ArchiveIndex(cleared=state.cleared, forgets=state.forgets, born=born)
                everything = store.redis.zrange(keys.archive, 0, -1)
                run(lambda: index.add(_turns(everything)))
        except UnicodeDecodeError:
            corrupt = CorruptState("a field is not UTF-8")
        except CorruptState as exc:
            corrupt = exc
        except redis.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):  # a pipeline's error says "Command # 1 (...) caused error: WRONGTYPE ..."
                raise store.guard.unavailable("load", exc) from exc
            corrupt = CorruptState("the state or archive key has the wrong type")
        except redis.RedisError as exc:
            raise store.guard.unavailable("load", exc) from exc
        else:
            self._remember(thread_id, index)
            return state, index
        log.error("thread %s is corrupt: %s", thread_label(thread_id), corrupt)
        raise corrupt

    def turn(self, thread_id: str, turn: int) -> ArchivedTurn | None:
        """Turn ``turn`` as the archive holds it, or None (one ZRANGEBYSCORE).

        Raises:
            StoreUnavailable: Redis failed.
        """
        with self.store.guard("archive"):
            members = self.store.redis.zrangebyscore(ThreadKeys(thread_id).archive, turn, turn)
        found = _turns(members)
        return found[0] if found else None

    def all_turns(self, thread_id: str) -> list[ArchivedTurn]:
        """Every archived turn of the thread, oldest first (one ZRANGE; the export reads it).

        Raises:
            StoreUnavailable: Redis failed.
        """
        return self.newest_turns(thread_id, newest=0)

    def earliest_kept_turn(self, thread_id: str, state: ThreadState) -> int | None:
        """The number of the earliest turn memory still holds word for word: the archive's oldest, else the first
        recent turn's, else None (a thread without turns).

        Raises:
            StoreUnavailable: Redis failed.
        """
        if state.folded_turns:
            with self.store.guard("archive"):
                oldest = self.store.redis.zrange(ThreadKeys(thread_id).archive, 0, 0, withscores=True)
            if oldest:
                return int(oldest[0][1])
        numbers = [n for n, turn in zip(state.turn_numbers(), state.turns(), strict=True) if turn[0].role == "user"]
        return numbers[0] if numbers else None

    def newest_turns(self, thread_id: str, *, newest: int = HYDRATION_TURNS) -> list[ArchivedTurn]:
        """The newest ``newest`` archived turns of the thread (0: all), oldest first (one ZRANGE).

        Raises:
            StoreUnavailable: Redis failed.
        """
        with self.store.guard("archive"):
            members = self.store.redis.zrange(ThreadKeys(thread_id).archive, -newest if newest else 0, -1)
        return _turns(members)


# -- for code that has a ThreadStore and no Services (the benchmarks) ------------------------------------------

_of_store: "weakref.WeakKeyDictionary[ThreadStore, Archive]" = weakref.WeakKeyDictionary()


def of_store(store: ThreadStore) -> Archive:
    """The ``Archive`` kept with ``store`` for callers without ``Services`` (built on first use, default bound;
    it lives as long as the store object).  The app reads through ``Services.archive``."""
    archive = _of_store.get(store)
    if archive is None:
        archive = _of_store[store] = Archive(store)
    return archive


def load_turn_memory(store: ThreadStore, thread_id: str, *,
                     run: Callable[[Callable[[], None]], None] = _direct) -> tuple[ThreadState, ArchiveIndex]:
    """``Archive.load_turn_memory`` on ``of_store(store)``.

    Raises:
        StoreUnavailable: Redis failed.
        CorruptState: the stored hash is invalid.
    """
    return of_store(store).load_turn_memory(thread_id, run=run)


def forget() -> None:
    """Drop every index kept by the ``Archive`` objects of ``of_store``."""
    for archive in list(_of_store.values()):
        archive.drop_all()
