"""Reads of a thread's archive of folded turns (README: Recall; docs/contract.md: Model context for a turn).

The archive is a sorted set per thread (``ThreadKeys.archive``, in the thread's hash
slot, with the thread's TTL, deleted by a clear), written only by
``lua/apply_compaction.lua``: every folded turn as ``{"n": number, "m": [messages]}``,
scored by its turn number, capped by ``MEMORY_ARCHIVE_MAX_TURNS`` turns and
``MEMORY_ARCHIVE_MAX_BYTES`` bytes, oldest out.

``load_turn_memory`` is the turn path's read: the thread hash and what the archive
gained since this process last read it, in **one round trip** (a pipeline of one
thread's keys, so one node on a cluster, without MULTI).  Each process keeps the
tokenised archive of its ``CACHED_THREADS`` most recent threads (``ArchiveIndex``),
so a turn reads and tokenises only the turns folded since its last read.  A second
round trip happens only when that copy cannot be brought up to date from the answer
(the thread was cleared and compacted again, or expired and came back).

``archived_turns`` is hydration's read: the newest ``HYDRATION_TURNS`` archived turns.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict

import redis

from app.memory.recall import ArchivedTurn, ArchiveIndex
from app.memory.state import ThreadState
from app.store.keys import ThreadKeys
from app.store.thread_store import CorruptState, StoreUnavailable, ThreadStore

log = logging.getLogger(__name__)

CACHED_THREADS = 32
"""Threads whose tokenised archive a process keeps (least recently used out)."""
HYDRATION_TURNS = 200
"""Most archived turns hydration returns (the newest)."""

_cache: "OrderedDict[str, ArchiveIndex]" = OrderedDict()
_lock = threading.Lock()


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
    with _lock:
        index = _cache.get(thread_id)
        if index is not None:
            _cache.move_to_end(thread_id)
        return index


def _remember(thread_id: str, index: ArchiveIndex) -> None:
    with _lock:
        _cache[thread_id] = index
        _cache.move_to_end(thread_id)
        while len(_cache) > CACHED_THREADS:
            _cache.popitem(last=False)


def forget(thread_id: str | None = None) -> None:
    """Drop this process's copy of one thread's archive (all threads with None)."""
    with _lock:
        if thread_id is None:
            _cache.clear()
        else:
            _cache.pop(thread_id, None)


def load_turn_memory(store: ThreadStore, thread_id: str) -> tuple[ThreadState, ArchiveIndex]:
    """The thread's state and its archive index, in one round trip (see the module docstring).

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
        if index is None or index.cleared != state.cleared:
            stale_since = since != "-inf"
            index = ArchiveIndex(cleared=state.cleared)
            if stale_since and count:
                members = store.redis.zrange(keys.archive, 0, -1)  # a clear and new folds since: read all
        index.add(_turns(members))
        if oldest:
            index.drop_before(int(oldest[0][1]))
        if len(index) != int(count):  # the archive expired and came back, or a member was unreadable
            index = ArchiveIndex(cleared=state.cleared)
            index.add(_turns(store.redis.zrange(keys.archive, 0, -1)))
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


def archived_turns(store: ThreadStore, thread_id: str, *, newest: int = HYDRATION_TURNS) -> list[ArchivedTurn]:
    """The newest ``newest`` archived turns of the thread, oldest first (one ZRANGE).

    Raises:
        StoreUnavailable: Redis failed.
    """
    try:
        members = store.redis.zrange(ThreadKeys(thread_id).archive, -newest, -1)
    except redis.RedisError as exc:
        store._report_error("archive")
        raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
    return _turns(members)
