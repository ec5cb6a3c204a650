"""The ThreadState store: one Redis hash per thread, written only by Lua scripts.

Every write is one atomic script and one round trip, bumps the version and
refreshes the TTL of every key of the thread.  Redis failures surface as
``StoreUnavailable`` (never with Redis's text in what a person sees), so callers
can degrade: reads give the empty state, commits are logged and skipped.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import redis
from marshmallow import ValidationError

from app.memory.final_turn import FinalTurn, prepare_final_turn
from app.memory.schemas import MESSAGE_SCHEMA, stored_state_schema
from app.memory.state import Pin, ThreadMessage, ThreadState
from app.settings import MemoryLimits
from app.store.keys import ThreadKeys

log = logging.getLogger(__name__)
LUA_DIR = Path(__file__).with_name("lua")


class StoreUnavailable(RuntimeError):
    """The store could not be reached or answered with an error.  Its text is for logs only."""


class CorruptState(RuntimeError):
    """The stored hash does not satisfy the stored-state schema."""


@dataclass(frozen=True)
class CommitResult:
    """What a commit did.

    Attributes:
        appended: False when the turn was a duplicate (nothing written).
        version: the thread's version after the call.
        message_count: messages stored after the call.
        messages: the two messages appended (also set for a duplicate).
    """

    appended: bool
    version: int
    message_count: int
    messages: tuple[ThreadMessage, ThreadMessage]


@dataclass(frozen=True)
class CompactionCommit:
    """Outcome of ``apply_compaction``: ``outcome`` is ``applied`` or ``stale``; ``detail`` says why stale."""

    outcome: str
    version: int = 0
    detail: str = ""


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _count_store_error(operation: str) -> None:
    """Count a store error in the metrics (issue 7); never raises."""
    try:
        from app.observability.metrics import count_store_error
        count_store_error(operation)
    except Exception:  # observability never changes what the store does
        log.debug("store error not counted", exc_info=True)


def _guard(fn):
    """Turn any Redis failure into ``StoreUnavailable``."""
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except redis.RedisError as exc:
            _count_store_error(fn.__name__)
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


_MESSAGE_FIELDS = frozenset(("id", "role", "text", "createdAt"))


def _checked_message(data) -> ThreadMessage:
    """A stored message checked with ``MessageSchema`` (exactly four fields; acceptance P4)."""
    if not isinstance(data, dict) or data.keys() != _MESSAGE_FIELDS:
        raise ValueError("a stored message must have exactly id, role, text and createdAt")
    return _checked_message_values(data["id"], data["role"], data["text"], data["createdAt"])


@lru_cache(maxsize=8192)
def _checked_message_values(id_, role, text, created_at) -> ThreadMessage:
    MESSAGE_SCHEMA.load({"id": id_, "role": role, "text": text, "createdAt": created_at})
    return ThreadMessage(id_, role, text, created_at)


@lru_cache(maxsize=2048)
def _checked_meta(limits: MemoryLimits, summary: str, pins_json: str, last: str | None):
    """Summary, pins and ``lastCompactedAt`` checked with the stored-state schema (its limits)."""
    pins = json.loads(pins_json)
    stored_state_schema(limits).load({"messages": [], "summary": summary, "pins": pins, "lastCompactedAt": last})
    return summary, tuple(Pin(p["text"], p["by"]) for p in pins), last


class ThreadStore:
    """Reads and writes ThreadState in Redis.

    Args:
        client: a ``redis.Redis`` with ``decode_responses=True``.
        limits: memory limits (the stored-state schema's bounds).
        ttl_seconds: sliding expiry of a thread's keys (``MEMORY_TTL_SECONDS``).
        validate_reads: check every loaded state against the stored-state schema.
    """

    def __init__(self, client: redis.Redis, limits: MemoryLimits, ttl_seconds: int, *, validate_reads: bool = True):
        self.redis = client
        self.limits = limits
        self.ttl = ttl_seconds
        self.validate_reads = validate_reads
        self._commit = client.register_script((LUA_DIR / "commit_turn.lua").read_text())
        self._clear = client.register_script((LUA_DIR / "clear_thread.lua").read_text())
        self._apply = client.register_script((LUA_DIR / "apply_compaction.lua").read_text())
        self._set_pins = client.register_script((LUA_DIR / "set_pins.lua").read_text())

    # -- reading -----------------------------------------------------------------------------

    def parse(self, raw: dict) -> ThreadState:
        """Build a ThreadState from an HGETALL answer (``{}`` gives the empty state).

        Every part is checked with the stored-state schema; a part already checked in this
        process (a message, or the summary with the pins) is not checked again, so a turn
        validates only what changed since the last read.

        Raises:
            CorruptState: the hash does not satisfy the stored-state schema.
        """
        if not raw:
            return ThreadState()
        try:
            messages = json.loads(raw.get("messages") or "[]")
            if not isinstance(messages, list):
                raise ValueError("messages is not a list")
            if self.validate_reads:
                parsed = tuple(_checked_message(m) for m in messages)
                summary, pins, last = _checked_meta(self.limits, raw.get("summary", ""), raw.get("pins") or "[]",
                                                    raw.get("lastCompactedAt"))
            else:
                parsed = tuple(ThreadMessage.from_dict(m) for m in messages)
                summary, last = raw.get("summary", ""), raw.get("lastCompactedAt")
                pins = tuple(Pin(p["text"], p["by"]) for p in json.loads(raw.get("pins") or "[]"))
        except (ValueError, TypeError, KeyError, ValidationError) as exc:
            raise CorruptState(str(exc)) from None
        return ThreadState(messages=parsed, summary=summary, pins=pins, last_compacted_at=last,
                           version=int(raw.get("v", 0)), gen=int(raw.get("gen", 0)))

    @_guard
    def load(self, thread_id: str) -> ThreadState:
        """Return the thread's state (the empty state for an unknown thread).

        Raises:
            StoreUnavailable: Redis failed.
            CorruptState: the stored hash is invalid.
        """
        return self.parse(self.redis.hgetall(ThreadKeys(thread_id).state))

    # -- writing -----------------------------------------------------------------------------

    @_guard
    def commit_messages(self, thread_id: str, user: ThreadMessage, assistant: ThreadMessage,
                        *, dedupe_by_text: bool) -> CommitResult:
        """Append one turn atomically unless it is a duplicate (one Lua call, one round trip).

        Raises:
            StoreUnavailable: Redis failed; nothing was written.
        """
        keys = ThreadKeys(thread_id)
        appended, version, count = self._commit(
            keys=keys.ttl_keys(),
            args=[_dumps(user.to_dict()), _dumps(assistant.to_dict()), user.id, assistant.id,
                  user.text, assistant.text, "1" if dedupe_by_text else "0", self.ttl],
        )
        return CommitResult(bool(appended), int(version), int(count), (user, assistant))

    def commit_final_turn(self, thread_id: str, turn: FinalTurn) -> CommitResult:
        """Write a finished turn through the final-turn adapter.

        A turn without ids is deduplicated by text against the last stored pair.

        Raises:
            TurnRejected: the turn is not written (status, source or text; acceptance P10, P11).
            StoreUnavailable: Redis failed.
        """
        user, assistant = prepare_final_turn(turn, delivery_max_chars=self.limits.delivery_final_max_chars)
        by_text = turn.user_id is None and turn.assistant_id is None
        return self.commit_messages(thread_id, user, assistant, dedupe_by_text=by_text)

    @_guard
    def clear(self, thread_id: str) -> int:
        """Empty the thread atomically and move its generation on; return the new version.

        A compaction that read the thread before cannot apply afterwards.
        """
        keys = ThreadKeys(thread_id)
        return int(self._clear(keys=keys.ttl_keys(), args=[self.ttl]))

    @_guard
    def apply_compaction(self, thread_id: str, *, expected_gen: int, folded_ids: list[str], summary: str,
                         pins: list[Pin], compacted_at: str) -> CompactionCommit:
        """Compare-and-set a compaction result (see ``lua/apply_compaction.lua``).

        Returns ``applied`` when the generation is unchanged and ``folded_ids`` are still
        the oldest messages in order; otherwise ``stale`` and nothing is written.
        """
        keys = ThreadKeys(thread_id)
        result = self._apply(
            keys=keys.ttl_keys(),
            args=[str(expected_gen), _dumps(list(folded_ids)), summary, _dumps([p.to_dict() for p in pins]),
                  compacted_at, self.ttl],
        )
        if result[0] == "applied":
            return CompactionCommit("applied", int(result[1]))
        return CompactionCommit("stale", detail=str(result[1]))

    @_guard
    def set_pins(self, thread_id: str, *, expected_gen: int, pins: list[Pin]) -> bool:
        """Replace the pins if the generation is still ``expected_gen``; False when stale."""
        keys = ThreadKeys(thread_id)
        result = self._set_pins(keys=keys.ttl_keys(),
                                args=[str(expected_gen), _dumps([p.to_dict() for p in pins]), self.ttl])
        return bool(result[0])

    # -- compaction marker ---------------------------------------------------------------------

    @_guard
    def mark_compaction_pending(self, thread_id: str, version: int, ttl_seconds: int) -> bool:
        """Set the one-pending-compaction marker (SET NX EX); False when one is already pending."""
        return bool(self.redis.set(ThreadKeys(thread_id).compacting, str(version), nx=True, ex=ttl_seconds))

    @_guard
    def release_compaction_marker(self, thread_id: str) -> None:
        """Remove the pending-compaction marker."""
        self.redis.delete(ThreadKeys(thread_id).compacting)

    @_guard
    def ping(self) -> bool:
        """True when Redis answers PING."""
        return bool(self.redis.ping())
