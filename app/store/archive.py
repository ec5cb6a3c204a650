"""Reads of a thread's archive of folded turns (README: Recall; docs/contract.md: Model context for a turn).

The archive is a sorted set per thread (``ThreadKeys.archive``, in the thread's hash
slot, with the thread's TTL, deleted by a clear), written only by
``lua/apply_compaction.lua``: every folded turn as ``{"n": number, "m": [messages]}``,
scored by its turn number, capped by ``MEMORY_ARCHIVE_MAX_TURNS`` turns and
``MEMORY_ARCHIVE_MAX_BYTES`` bytes, oldest out.

``load_turn_memory`` is the turn path's read: the thread hash and what the archive
gained since this process last read it, in **one round trip** (a pipeline of one
thread's keys, so one node on a cluster, without MULTI).  Each process keeps the
tokenised archives of its most recently used threads (``ArchiveIndex``) within
``ARCHIVE_CACHE_MAX_BYTES`` bytes (each index's ``nbytes``; least recently used out; an
index larger than the whole bound is used for its turn and not kept), so a turn reads and
tokenises only the turns folded since its last read.  A copy is valid for the thread's creation stamp (the hash's
``born``, set by its first commit), clear counter and forget counter (``ThreadState.cleared``,
``ThreadState.forgets``): after a clear, a forget or the thread's expiry every process builds a new one from the
archive, so a forgotten turn never comes back from a cache and a new conversation is never served an old one's
archive.  ``drop_thread`` is the one place that drops a thread from every cache of this process.  The tokenising may run elsewhere than
the caller's greenlet (``load_turn_memory``'s ``run``): the reads stay with the caller.  A second
round trip happens only when that copy cannot be brought up to date from the answer
(the thread was cleared and compacted again, or expired and came back).

``archived_turns`` is hydration's read: the newest ``HYDRATION_TURNS`` archived turns.
"""

from __future__ import annotations

import json
import logging
from typing import Callable, Iterable

import redis

from app.memory.cache import ByteCache
from app.memory.recall import ArchivedTurn, ArchiveIndex
from app.memory.state import ThreadState
from app.store.keys import ThreadKeys
from app.store.thread_store import CorruptState, StoreUnavailable, ThreadStore

log = logging.getLogger(__name__)

CACHE_MAX_BYTES = 64 * 1024 * 1024
"""Default bound of the process's cache of tokenised archives, in bytes (``ARCHIVE_CACHE_MAX_BYTES``; a full
archive of the default 2,000,000 bytes takes about 30 MB tokenised)."""
HYDRATION_TURNS = 200
"""Most archived turns hydration returns (the newest)."""

_cache: ByteCache[ArchiveIndex] = ByteCache(CACHE_MAX_BYTES)


def parse_member(member: str) -> ArchivedTurn | None:
    """An archive member as an ``ArchivedTurn``; None (logged) when it is not one."""
    try:
        return ArchivedTurn.from_dict(json.loads(member))
    except (ValueError, TypeError, KeyError):
        log.warning("archive member skipped: not a turn")
        return None


def _turns(members) -> list[ArchivedTurn]:
    return [t for t in (parse_member(m) for m in members) if t is not None]


def _cached(thread_id: str) -> ArchiveIndex | None:
    return _cache.get(thread_id)


def _remember(thread_id: str, index: ArchiveIndex) -> None:
    _cache.put(thread_id, index, index.nbytes)  # not kept when larger than the whole bound


def forget(thread_id: str | None = None) -> None:
    """Drop this process's copy of one thread's archive (all threads with None)."""
    if thread_id is None:
        _cache.clear()
    else:
        _cache.pop(thread_id)


def drop_thread(thread_id: str, texts: Iterable[str] = (), *, keep: ArchiveIndex | None = None) -> None:
    """Drop what this process keeps of one thread (after a forget): its archive index (replaced by ``keep``, an
    index valid for the thread as it is now, when given), the parsed messages holding ``texts``, parsed records and
    notes, split sentences and facts (each rebuilt on its next use).  The one place every such cache is named."""
    from app.memory.compaction import facts, record
    from app.store import thread_store

    if keep is None:
        _cache.pop(thread_id)
    else:
        _remember(thread_id, keep)
    gone = set(texts)
    if gone:
        thread_store._checked_message_values.cache.discard_where(lambda key: len(key) > 2 and key[2] in gone)
    thread_store._checked_meta.cache_clear()
    facts._cache.clear()
    record._split_cache.clear()


def set_cache_bytes(max_bytes: int) -> None:
    """Bound this process's cache of tokenised archives to ``max_bytes`` bytes (``ARCHIVE_CACHE_MAX_BYTES``)."""
    _cache.resize(max_bytes)


def cached_bytes() -> int:
    """Bytes this process's cache of tokenised archives holds now (about; ``ArchiveIndex.nbytes``)."""
    return _cache.currsize


def _direct(work: Callable[[], None]) -> None:
    work()


def load_turn_memory(store: ThreadStore, thread_id: str, *,
                     run: Callable[[Callable[[], None]], None] = _direct) -> tuple[ThreadState, ArchiveIndex]:
    """The thread's state and its archive index, in one round trip (see the module docstring).

    Args:
        store: the thread store.
        thread_id: the thread.
        run: calls its argument (tokenising archived turns into the index: CPU only, no store call) and
            returns when it is done; e.g. in a thread pool, so that a long tokenising never holds up the
            caller's event loop.  By default, right here.

    Returns:
        ``(state, index)``; ``index`` holds every archived turn (empty for a thread never compacted).

    Raises:
        StoreUnavailable: Redis failed (the store's ``on_error`` is told ``"load"``).
        CorruptState: the stored hash is invalid (``ThreadStore.parse``).
    """
    keys = ThreadKeys(thread_id)
    index = _cached(thread_id)
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
            store._report_error("load")
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
        corrupt = CorruptState("the state or archive key has the wrong type")
    except redis.RedisError as exc:
        store._report_error("load")
        raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
    else:
        _remember(thread_id, index)
        return state, index
    log.error("thread %s is corrupt: %s", thread_id[:13], corrupt)
    raise corrupt


def archived_turn(store: ThreadStore, thread_id: str, turn: int) -> ArchivedTurn | None:
    """Turn ``turn`` as the archive holds it, or None (one ZRANGEBYSCORE).

    Raises:
        StoreUnavailable: Redis failed.
    """
    try:
        members = store.redis.zrangebyscore(ThreadKeys(thread_id).archive, turn, turn)
    except redis.RedisError as exc:
        store._report_error("archive")
        raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
    found = _turns(members)
    return found[0] if found else None


def all_archived_turns(store: ThreadStore, thread_id: str) -> list[ArchivedTurn]:
    """Every archived turn of the thread, oldest first (one ZRANGE; the export reads it).

    Raises:
        StoreUnavailable: Redis failed.
    """
    return archived_turns(store, thread_id, newest=0)


def earliest_kept_turn(store: ThreadStore, thread_id: str, state: ThreadState) -> int | None:
    """The number of the earliest turn memory still holds word for word: the archive's oldest, else the first
    recent turn's, else None (a thread without turns).

    Raises:
        StoreUnavailable: Redis failed.
    """
    if state.folded_turns:
        try:
            oldest = store.redis.zrange(ThreadKeys(thread_id).archive, 0, 0, withscores=True)
        except redis.RedisError as exc:
            store._report_error("archive")
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
        if oldest:
            return int(oldest[0][1])
    numbers = [n for n, turn in zip(state.turn_numbers(), state.turns()) if turn[0].role == "user"]
    return numbers[0] if numbers else None


def archived_turns(store: ThreadStore, thread_id: str, *, newest: int = HYDRATION_TURNS) -> list[ArchivedTurn]:
    """The newest ``newest`` archived turns of the thread (0: all), oldest first (one ZRANGE).

    Raises:
        StoreUnavailable: Redis failed.
    """
    try:
        members = store.redis.zrange(ThreadKeys(thread_id).archive, -newest if newest else 0, -1)
    except redis.RedisError as exc:
        store._report_error("archive")
        raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
    return _turns(members)
