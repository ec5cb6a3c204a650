"""The ThreadState store: one Redis hash per thread, written only by Lua scripts.

Every write is one atomic script and one round trip, bumps the version and
refreshes the TTL of every key of the thread.  Redis failures surface as
``StoreUnavailable`` (never with Redis's text in what a person sees), so callers
can degrade: reads give the empty state, commits are logged and skipped.

Memory-changing scripts are never retried blindly: they run on a connection pool
without retries (``redis_client.without_retries``).  When the reply of a commit or
of a compaction's compare-and-set is lost after the command was sent (a timeout,
a closed connection), the outcome is settled by reading the thread back (is the
commit's assistant message id stored?  did ``gen`` move on with this fold's
``lastCompactedAt``?  is the forgotten turn in ``fgt``?  do the pins read as written?) before it is
reported; when the read-back fails too, the call raises ``OutcomeUnknown`` (a ``StoreUnavailable``: the
write may have happened; docs/contract.md: the done frame's ``"saved": "unknown"``, HTTP "outcome unknown").
Only a read-back that finds the write absent reports it as not written.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import redis
from marshmallow import ValidationError

from app.memory import migration
from app.memory.cache import bytes_cached
from app.memory.compaction.policy import hard_cap_messages
from app.memory.final_turn import FinalTurn, prepare_final_turn
from app.memory.schemas import MESSAGE_SCHEMA, stored_state_schema
from app.memory.limits import MemoryLimits
from app.memory.record import Record
from app.memory.state import PINNED_BY_PERSON, Pin, ThreadMessage, ThreadState
from app.store.compaction_outcome import Outcome, Reason, reason_of
from app.store.keys import HEALTH_PROBE_KEY, ThreadKeys
from app.store.redis_client import StoreClient, is_cluster, run_script_and_wait, without_retries

log = logging.getLogger(__name__)
LUA_DIR = Path(__file__).with_name("lua")


class StoreUnavailable(RuntimeError):
    """The store could not be reached or answered with an error.  Its text is for logs only."""


class OutcomeUnknown(StoreUnavailable):
    """A memory-changing script was sent, its reply was lost and reading the thread back failed too: it may
    or may not have been applied (never "not written").  Its text is for logs only."""


class CorruptState(RuntimeError):
    """The stored hash does not satisfy the stored-state schema (or is not a hash).  Its text is for logs only.

    Readers treat the thread as empty and unreadable (docs/contract.md: ``memory_unreadable``);
    ``ThreadStore.clear`` always repairs it.
    """


@dataclass(frozen=True)
class CommitResult:
    """What a commit did.

    Attributes:
        appended: False when nothing was written (a duplicate, or a refusal).
        version: the thread's version after the call.
        message_count: messages stored after the call.
        messages: the two messages appended (also set for a duplicate).
        refused: why nothing was written, or None (a duplicate is no refusal): ``cleared`` (the
            thread was cleared after the turn started), ``forgotten`` (a turn of the thread was forgotten
            after the turn started: docs/contract.md, Forget and provenance), ``id_conflict`` (the user message id is
            stored with a different text), ``full`` (the pair would pass the hard cap on stored
            messages; ``lua/commit_turn.lua``).
        settled: True when the reply was lost and the outcome was read back.
    """

    appended: bool
    version: int
    message_count: int
    messages: tuple[ThreadMessage, ThreadMessage]
    refused: str | None = None
    settled: bool = False

    @property
    def cleared(self) -> bool:
        """True when nothing was written because the thread was cleared after the turn started."""
        return self.refused == "cleared"


@dataclass(frozen=True)
class CompactionCommit:
    """Outcome of ``apply_compaction`` or ``apply_refinement``: ``outcome`` is ``applied`` or ``stale``;
    ``detail`` says why stale; ``unrefined_folds`` counts the applied folds since the last refinement
    (``uf``) and ``folded_turns`` the person turns folded so far (``ft``), after an applied fold (0 when not
    known: a settled reply)."""

    outcome: Outcome
    version: int = 0
    detail: Reason | str = ""
    unrefined_folds: int = 0
    folded_turns: int = 0
    settled: bool = False
    dropped_turns: tuple[int, int] | None = None
    """``(first, last)`` turn numbers the archive's cap dropped in this fold (None: none, or not known)."""


@dataclass(frozen=True)
class ForgetCommit:
    """Outcome of ``ThreadStore.forget_turn``: ``applied`` False when the generation moved on (nothing written);
    else how many recent messages and archive members (turns) were removed, and the forget counter after."""

    applied: bool
    version: int = 0
    recent_removed: int = 0
    archive_removed: int = 0
    forgets: int = 0
    settled: bool = False
    """True when the reply was lost and the outcome was read back (``archive_removed`` is then not known: 0)."""


@dataclass(frozen=True)
class RefineStatus:
    """What the refinement step reads besides the thread (``ThreadStore.refine_status``).

    Attributes:
        refined_turns: person turns the model's part covered so far (``rf``).
        unrefined_folds: applied folds since the last refinement (``uf``).
        activity: ``streaming`` while a turn of the thread streams, ``idle`` within
            ``COMPACTION_IDLE_SECONDS`` after a turn, None when quiet.
        activity_ms: milliseconds the activity key still lives (0 when absent).
    """

    refined_turns: int = 0
    unrefined_folds: int = 0
    activity: str | None = None
    activity_ms: int = 0


def _never_sent(exc: BaseException) -> bool:
    """True when ``exc`` (a redis-py connection error) came from making the connection (refused, unreachable,
    name not resolved): the command was never written, so its outcome is known (not run)."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, (ConnectionRefusedError, socket.gaierror)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class Unsettled(redis.ConnectionError):
    """The reply of a memory-changing script was lost after it was sent (internal to the store)."""


# A counter field (``v``, ``gen``, ``clr``): a non-negative decimal integer, as HINCRBY writes it.
_COUNTER_RE = re.compile(r"\A[0-9]{1,12}\Z")


def _counter(raw: dict, name: str) -> int:
    """The counter ``name`` of a stored hash (0 when absent).

    Raises:
        ValueError: the field is not a non-negative integer of at most 12 digits (as ``lua/clear_thread.lua``).
    """
    value = raw.get(name)
    if value is None:
        return 0
    if not isinstance(value, str) or not _COUNTER_RE.match(value):
        raise ValueError(f"{name} is not a counter")
    return int(value)


def _forgotten_turns(value) -> tuple[int, ...]:
    """The ``fgt`` field: a JSON array of positive turn numbers (absent: none), ascending.

    Raises:
        ValueError: not that shape.
    """
    if value is None:
        return ()
    turns = json.loads(value)
    if not isinstance(turns, list) or any(type(t) is not int or t < 1 for t in turns):
        raise ValueError("fgt is not a list of turn numbers")
    return tuple(sorted(set(turns)))


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _guard(fn):
    """Turn any Redis failure of a ``ThreadStore`` method into ``StoreUnavailable``, telling ``on_error`` first."""
    @functools.wraps(fn)
    def wrapper(self: "ThreadStore", *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except redis.RedisError as exc:
            self._report_error(fn.__name__)
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
    return wrapper


_MESSAGE_FIELDS = frozenset(("id", "role", "text", "createdAt"))


def _checked_message(data) -> ThreadMessage:
    """A stored message checked with ``MessageSchema`` (exactly four fields; docs/contract.md: ThreadState)."""
    if not isinstance(data, dict) or data.keys() != _MESSAGE_FIELDS:
        raise ValueError("a stored message must have exactly id, role, text and createdAt")
    return _checked_message_values(data["id"], data["role"], data["text"], data["createdAt"])


@bytes_cached(32 * 1024 * 1024, 128 * 1024)  # README: Performance (each process's memory)
def _checked_message_values(id_, role, text, created_at) -> ThreadMessage:
    MESSAGE_SCHEMA.load({"id": id_, "role": role, "text": text, "createdAt": created_at})
    return ThreadMessage(id_, role, text, created_at)


@bytes_cached(16 * 1024 * 1024, 256 * 1024)
def _checked_meta(limits: MemoryLimits, summary: str, pins_json: str, notes_json: str, last: str | None):
    """Record, pins, notes and ``lastCompactedAt`` checked with the stored-state schema (its limits).

    The schema's ``summary`` is the record as this version wrote it, rendered (``Record.render``); a summary an
    earlier version stored (``migration.TEXT_FORMAT``) is checked as it is stored, so that reading it in
    today's shape never makes a thread that was valid unreadable.
    """
    meta = _meta(limits, summary, pins_json, notes_json, last)
    checked = summary if migration.stored_format(summary) == migration.TEXT_FORMAT else meta[0].render()
    stored_state_schema(limits).load({"messages": [], "summary": checked, "pins": json.loads(pins_json),
                                      "notes": json.loads(notes_json), "lastCompactedAt": last})
    return meta


def _meta(limits: MemoryLimits, summary: str, pins_json: str, notes_json: str, last: str | None):
    """``(record, pins, notes, lastCompactedAt)`` of a stored hash, without the schema's checks.

    The record is read by ``app.memory.migration`` (any stored shape).  Pins a model wrote before notes
    existed (``by="model"``) are returned as notes, after the stored notes, within ``limits.notes_max``.

    Raises:
        ValueError: the record is not of a shape any version wrote, or of a newer one
            (``migration.read_record``).
    """
    pins, notes = json.loads(pins_json), json.loads(notes_json)
    person = tuple(Pin(p["text"], p["by"]) for p in pins if p["by"] == PINNED_BY_PERSON)
    legacy = [p["text"] for p in pins if p["by"] != PINNED_BY_PERSON]
    record = migration.read_record(summary)
    return record, person, tuple([*notes, *legacy][-limits.notes_max:]) if legacy else tuple(notes), last


class ThreadStore:
    """Reads and writes ThreadState in Redis.

    Args:
        client: a ``redis.Redis`` with ``decode_responses=True``.
        limits: memory limits (the stored-state schema's bounds).
        ttl_seconds: sliding expiry of a thread's keys (``MEMORY_TTL_SECONDS``).
        validate_reads: check every loaded state against the stored-state schema.
        on_error: called with the operation's name (``"load"``, ``"commit_messages"``, ...) on every
            Redis failure, before ``StoreUnavailable`` is raised (the metrics count them); what it
            raises is logged and dropped.  Also called with ``"wait_replicas"`` when a memory write
            was acknowledged by fewer replicas than ``wait_replicas`` in time.
        wait_replicas: after each memory write (commit, clear, compaction, pins), ``WAIT`` until this
            many replicas have it (``MEMORY_WAIT_REPLICAS``; 0: do not wait).  The write stands either
            way: fewer replicas in time is logged and reported to ``on_error``, not raised.
        wait_timeout_ms: the longest that wait, milliseconds (``MEMORY_WAIT_TIMEOUT_MS``).

    With a ``ClusterClient`` (``REDIS_CLUSTER=1``) every call goes to the master of the thread's
    slot, and events are published with ``SPUBLISH`` (sharded pub/sub; README: Scale-out).
    """

    def __init__(self, client: StoreClient, limits: MemoryLimits, ttl_seconds: int, *, validate_reads: bool = True,
                 on_error: Callable[[str], None] | None = None, wait_replicas: int = 0, wait_timeout_ms: int = 100):
        self.redis = client
        self.limits = limits
        self.ttl = ttl_seconds
        self.validate_reads = validate_reads
        self.on_error = on_error
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.sharded_events = is_cluster(client)
        self._commit = client.register_script((LUA_DIR / "commit_turn.lua").read_text())
        self._clear = client.register_script((LUA_DIR / "clear_thread.lua").read_text())
        self._apply = client.register_script((LUA_DIR / "apply_compaction.lua").read_text())
        self._set_pins = client.register_script((LUA_DIR / "set_pins.lua").read_text())
        self._set_notes = client.register_script((LUA_DIR / "set_notes.lua").read_text())
        self._release = client.register_script((LUA_DIR / "release_marker.lua").read_text())
        self._record = client.register_script((LUA_DIR / "record_compaction.lua").read_text())
        self._hold = client.register_script((LUA_DIR / "hold_marker.lua").read_text())

        self._refine = client.register_script((LUA_DIR / "apply_refinement.lua").read_text())
        self._forget = client.register_script((LUA_DIR / "forget_turn.lua").read_text())

        self._socket = client.register_script((LUA_DIR / "claim_socket.lua").read_text())
        self.writer = without_retries(client)
        """The client memory-changing scripts run on: no retry after a command was sent."""

    def _write(self, script, keys: list[str], args: list):
        """Run a memory-writing script once (never retried); with ``wait_replicas``, also ``WAIT`` on the
        same connection.

        Raises:
            Unsettled: the connection closed or timed out after the script may have been sent.
            redis.RedisError: any other failure.
        """
        try:
            if not self.wait_replicas:
                return script(keys=keys, args=args, client=self.writer)
            answer, acknowledged = run_script_and_wait(self.writer, script, keys, args,
                                                       replicas=self.wait_replicas, timeout_ms=self.wait_timeout_ms)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if _never_sent(exc):
                raise  # the connection could not be made: Redis never saw the script
            raise Unsettled(f"{type(exc).__name__}: {exc}") from exc
        if acknowledged < self.wait_replicas:
            log.warning("memory write acknowledged by %d of %d replicas within %d ms", acknowledged,
                        self.wait_replicas, self.wait_timeout_ms)
            self._report_error("wait_replicas")
        return answer

    def _report_error(self, operation: str) -> None:
        if self.on_error is None:
            return
        try:
            self.on_error(operation)
        except Exception:  # observability never changes what the store does
            log.debug("store error not reported", exc_info=True)

    # -- reading -----------------------------------------------------------------------------

    def parse(self, raw: dict) -> ThreadState:
        """Build a ThreadState from an HGETALL answer (``{}`` gives the empty state).

        Every part is checked with the stored-state schema; a part already checked in this
        process (a message, or the summary with the pins) is not checked again, so a turn
        validates only what changed since the last read.  The counters ``v``, ``gen`` and
        ``clr`` must be non-negative integers, and ``messages`` a JSON list, whatever
        ``validate_reads`` says.

        Raises:
            CorruptState: the hash does not satisfy the stored-state schema.
        """
        if not raw:
            return ThreadState()
        try:
            version, gen, cleared = _counter(raw, "v"), _counter(raw, "gen"), _counter(raw, "clr")
            folded = _counter(raw, "ft")
            forgets = _counter(raw, "fg")
            forgotten = _forgotten_turns(raw.get("fgt"))
            messages = json.loads(raw.get("messages") or "[]")
            if not isinstance(messages, list):
                raise ValueError("messages is not a list")
            meta = (self.limits, raw.get("summary", ""), raw.get("pins") or "[]", raw.get("notes") or "[]",
                    raw.get("lastCompactedAt"))
            if self.validate_reads:
                parsed = tuple(_checked_message(m) for m in messages)
                record, pins, notes, last = _checked_meta(*meta)
            else:
                parsed = tuple(ThreadMessage.from_dict(m) for m in messages)
                record, pins, notes, last = _meta(*meta)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError, ValidationError) as exc:
            raise CorruptState(f"{type(exc).__name__}: {exc}"[:300]) from None
        return ThreadState(messages=parsed, record=record, pins=pins, last_compacted_at=last,
                           version=version, gen=gen, notes=notes, cleared=cleared,
                           folded_turns=folded, forgets=forgets, forgotten_turns=forgotten)

    @_guard
    def load(self, thread_id: str) -> ThreadState:
        """Return the thread's state (the empty state for an unknown thread).

        A corrupt thread is logged at ERROR (the head of the thread id and which check failed).

        Raises:
            StoreUnavailable: Redis failed.
            CorruptState: the stored hash is invalid, holds bytes that are not UTF-8, or the key is not a hash.
        """
        try:
            raw = self.redis.hgetall(ThreadKeys(thread_id).state)
            return self.parse(raw)
        except UnicodeDecodeError:
            exc = CorruptState("a field is not UTF-8")
        except redis.ResponseError as error:
            if not str(error).startswith("WRONGTYPE"):
                raise
            exc = CorruptState("the state key is not a hash")
        except CorruptState as error:
            exc = error
        log.error("thread %s is corrupt: %s", thread_id[:13], exc)
        raise exc

    # -- writing -----------------------------------------------------------------------------

    @_guard
    def commit_messages(self, thread_id: str, user: ThreadMessage, assistant: ThreadMessage,
                        *, dedupe_by_text: bool, expected_cleared: int | None = None,
                        expected_forgets: int | None = None) -> CommitResult:
        """Append one turn atomically unless it is a duplicate or refused (one Lua call, one round trip).

        ``expected_cleared`` is the thread's clear counter (``ThreadState.cleared``) when the turn
        started; when the thread was cleared since, nothing is written and the result says
        ``cleared``.  None skips that check.  Likewise ``expected_forgets`` (``ThreadState.forgets`` when the turn
        started): when a turn was forgotten since, nothing is written (``forgotten``).  A user message id stored
        with another text is refused
        (``id_conflict``); a pair that would pass the hard cap on stored messages
        (``policy.hard_cap_messages``) is refused (``full``).  A lost reply is settled by reading back.

        Raises:
            OutcomeUnknown: the reply was lost and the read-back failed too (the turn may be stored).
            StoreUnavailable: Redis failed before the script ran, or the read-back found the turn not written.
        """
        keys = ThreadKeys(thread_id)
        try:
            answer = self._write(
                self._commit, keys.ttl_keys(),
                [_dumps(user.to_dict()), _dumps(assistant.to_dict()), user.id, assistant.id,
                 user.text, assistant.text, "1" if dedupe_by_text else "0", self.ttl,
                 "" if expected_cleared is None else str(expected_cleared), hard_cap_messages(self.limits),
                 "" if expected_forgets is None else str(expected_forgets)],
            )
        except Unsettled as exc:
            return self._settle_commit(thread_id, user, assistant, exc)
        appended, version, count = answer[:3]
        return CommitResult(bool(appended), int(version), int(count), (user, assistant),
                            refused=str(answer[3]) if len(answer) > 3 else None)

    def _settle_commit(self, thread_id: str, user: ThreadMessage, assistant: ThreadMessage,
                       lost: Unsettled) -> CommitResult:
        """A commit whose reply was lost: stored when its assistant message id is in the thread (ids are
        new for every turn), a duplicate when only the user id is; else nothing was written."""
        try:
            raw = self.redis.hmget(ThreadKeys(thread_id).state, "messages", "v")
            messages = json.loads(raw[0] or "[]")
            ids = {m.get("id") for m in messages if isinstance(m, dict)}
        except (redis.RedisError, ValueError, TypeError) as exc:
            self._report_error("commit_messages")
            raise OutcomeUnknown(f"lost reply not settled: {lost}; {type(exc).__name__}") from exc
        version = int(raw[1] or 0)
        if assistant.id in ids or user.id in ids:
            log.warning("commit on %s settled by reading back: %s", thread_id[:13],
                        "written" if assistant.id in ids else "a duplicate")
            return CommitResult(assistant.id in ids, version, len(messages), (user, assistant), settled=True)
        self._report_error("commit_messages")
        raise StoreUnavailable(f"lost reply settled by reading back: not written ({lost})")

    def commit_final_turn(self, thread_id: str, turn: FinalTurn, *, expected_cleared: int | None = None,
                          expected_forgets: int | None = None) -> CommitResult:
        """Write a finished turn through the final-turn adapter.

        A turn without ids is deduplicated by text against the last stored pair.  With
        ``expected_cleared`` (the clear counter read when the turn started), a turn whose thread
        was cleared meanwhile writes nothing (``CommitResult.cleared``); with ``expected_forgets`` (the forget
        counter read then), a turn of a thread where a turn was forgotten meanwhile writes nothing (``forgotten``).

        Raises:
            TurnRejected: the turn is not written (status, source or text; README: The boundary).
            StoreUnavailable: Redis failed.
        """
        user, assistant = prepare_final_turn(turn, delivery_max_chars=self.limits.delivery_final_max_chars)
        by_text = turn.user_id is None and turn.assistant_id is None
        return self.commit_messages(thread_id, user, assistant, dedupe_by_text=by_text,
                                    expected_cleared=expected_cleared, expected_forgets=expected_forgets)

    @_guard
    def clear(self, thread_id: str) -> int:
        """Empty the thread atomically and move its generation and clear counter on; return the new version.

        A compaction, pin change or turn that read the thread before cannot write afterwards.
        Succeeds on a corrupt thread too (``CorruptState`` on read): it is replaced by a valid
        empty one, logged at WARNING.

        A lost reply is settled by reading back: the clear counter moved past what it was before (read
        before the script; a thread that did not exist reads 0).

        Raises:
            OutcomeUnknown: the reply was lost and the read-back failed too (the thread may be cleared).
            StoreUnavailable: Redis failed or refused the write; nothing was changed.
        """
        keys = ThreadKeys(thread_id)
        try:
            before = self.redis.hget(keys.state, "clr")
        except redis.ResponseError:  # not a hash: corrupt, the script replaces it
            before = None
        try:
            version, repaired = self._write(self._clear, keys.ttl_keys() + keys.markers(), [self.ttl])
        except Unsettled as exc:
            return self._settle_clear(thread_id, before if isinstance(before, str) or before is None else str(before), exc)
        if repaired:
            log.warning("clear repaired the corrupt thread %s", thread_id[:13])
        return int(version)

    def _settle_clear(self, thread_id: str, before: str | None, lost: Unsettled) -> int:
        """A clear whose reply was lost: cleared when ``clr`` is no longer ``before`` (the script moves it on,
        ``lua/clear_thread.lua``); the version read back is returned."""
        try:
            cleared, version = self.redis.hmget(ThreadKeys(thread_id).state, "clr", "v")
        except redis.RedisError as exc:
            self._report_error("clear")
            raise OutcomeUnknown(f"lost reply not settled: {lost}; {type(exc).__name__}") from exc
        if cleared is not None and cleared != before:
            log.warning("clear of %s settled by reading back: cleared", thread_id[:13])
            return int(version or 0)
        self._report_error("clear")
        raise StoreUnavailable(f"lost reply settled by reading back: not cleared ({lost})")

    @_guard
    def apply_compaction(self, thread_id: str, *, expected_gen: int, folded_ids: list[str], record: Record,
                         notes: list[str], compacted_at: str) -> CompactionCommit:
        """Compare-and-set a compaction result (see ``lua/apply_compaction.lua``).

        Writes the record (as ``summary``, in its stored form: ``Record.to_stored``), the notes and
        ``lastCompactedAt``, removes the folded messages and
        puts every folded turn in the thread's archive (``app.store.archive``; capped by
        ``limits.archive_max_turns`` and ``limits.archive_max_bytes``, oldest out); the person's
        pins are never written by a compaction.

        Returns ``applied`` when the generation is unchanged and ``folded_ids`` are still
        the oldest messages in order; otherwise ``stale`` and nothing is written.
        """
        keys = ThreadKeys(thread_id)
        try:
            result = self._write(
                self._apply, keys.ttl_keys(),
                [str(expected_gen), _dumps(list(folded_ids)), record.to_stored(), _dumps(list(notes)), compacted_at,
                 self.ttl,
                 self.limits.archive_max_turns, self.limits.archive_max_bytes],
            )
        except Unsettled as exc:
            return self._settle_cas(thread_id, expected_gen, "lastCompactedAt", compacted_at, exc)
        if result[0] == Outcome.APPLIED:
            dropped = (int(result[7]), int(result[8])) if len(result) > 8 and int(result[7]) else None
            return CompactionCommit(Outcome.APPLIED, int(result[1]), unrefined_folds=int(result[5]),
                                    folded_turns=int(result[6]), dropped_turns=dropped)
        return CompactionCommit(Outcome.STALE, detail=reason_of(str(result[1])))

    @_guard
    def apply_refinement(self, thread_id: str, *, expected_gen: int, refined_turns: int, record: Record,
                         notes: list[str]) -> CompactionCommit:
        """Compare-and-set the model's part of a compaction (``lua/apply_refinement.lua``): the record (as
        ``summary``, ``Record.to_stored``), notes and ``rf`` = ``refined_turns`` when the generation is still
        ``expected_gen``; else ``stale``.

        Raises:
            StoreUnavailable: Redis failed, or the reply was lost and the read-back failed too.
        """
        keys = ThreadKeys(thread_id)
        summary = record.to_stored()
        try:
            result = self._write(self._refine, keys.ttl_keys(),
                                 [str(expected_gen), int(refined_turns), summary, _dumps(list(notes)), self.ttl])
        except Unsettled as exc:
            return self._settle_cas(thread_id, expected_gen, "summary", summary, exc)
        if result[0] == Outcome.APPLIED:
            return CompactionCommit(Outcome.APPLIED, int(result[1]))
        return CompactionCommit(Outcome.STALE, detail=reason_of(str(result[1])))

    @_guard
    def forget_turn(self, thread_id: str, *, expected_gen: int, turns: Sequence[int], message_ids: list[str],
                    record: Record | None, notes: list[str], entries: Sequence[dict], max_entries: int,
                    turn_message_ids: Sequence[str] = ()) -> ForgetCommit:
        """Forget ``turns`` in one script (``lua/forget_turn.lua``, one write however many turns) when the
        generation is still ``expected_gen``: remove the messages ``message_ids`` and the turns' archive members,
        write ``record`` (None: unchanged) and ``notes``, add ``turns`` to the forgotten turns, move ``fg`` on by the
        turns new there, ``gen`` and ``v`` by one, and push ``entries`` (numbers and categories only; one a turn)
        on the history capped at ``max_entries``; the feedback on ``turn_message_ids`` (every message of the turns,
        recent or archived) goes too.

        A lost reply is settled by reading back (``_settle_forget``): applied when every one of ``turns`` is among
        the forgotten turns (``fgt``) and the generation moved on; else not applied (the caller reads the thread
        again; a forget is idempotent).

        Raises:
            OutcomeUnknown: the reply was lost and the read-back failed too (the turn may be forgotten).
            StoreUnavailable: Redis failed before the script ran.
        """
        keys = ThreadKeys(thread_id)
        try:
            result = self._write(self._forget, keys.ttl_keys(),
                                 [str(expected_gen), _dumps([int(t) for t in turns]), _dumps(list(message_ids)),
                                  "0" if record is None else "1", "" if record is None else record.to_stored(),
                                  _dumps(list(notes)), _dumps([json.dumps(e, separators=(",", ":")) for e in entries]),
                                  int(max_entries), self.ttl, _dumps(list(turn_message_ids))])
        except Unsettled as exc:
            return self._settle_forget(thread_id, expected_gen, list(turns), len(message_ids), exc)
        if not int(result[0]):
            return ForgetCommit(False)
        return ForgetCommit(True, int(result[1]), int(result[2]), int(result[3]), int(result[4]))

    def _settle_forget(self, thread_id: str, expected_gen: int, turns: Sequence[int], recent: int,
                       lost: Unsettled) -> ForgetCommit:
        """A forget whose reply was lost: applied when every one of ``turns`` is in ``fgt`` and ``gen`` is past
        ``expected_gen`` (the ``recent`` messages it removed, read under that generation, went with it)."""
        try:
            gen, forgotten, version = self.redis.hmget(ThreadKeys(thread_id).state, "gen", "fgt", "v")
            forgotten_turns = _forgotten_turns(forgotten)
        except (redis.RedisError, ValueError, TypeError) as exc:
            self._report_error("forget_turn")
            raise OutcomeUnknown(f"lost reply not settled: {lost}; {type(exc).__name__}") from exc
        applied = set(turns) <= set(forgotten_turns) and int(gen or 0) > expected_gen
        log.warning("forget on %s settled by reading back: %s", thread_id[:13], "applied" if applied else "not applied")
        if applied:
            return ForgetCommit(True, int(version or 0), recent_removed=recent, settled=True)
        return ForgetCommit(False, settled=True)

    def _settle_cas(self, thread_id: str, expected_gen: int, field_name: str, written: str,
                    lost: Unsettled) -> CompactionCommit:
        """A compare-and-set whose reply was lost: applied when ``gen`` moved on by one and ``field_name`` holds
        what it wrote; stale (``generation``) otherwise."""
        try:
            gen, value, version = self.redis.hmget(ThreadKeys(thread_id).state, "gen", field_name, "v")
        except redis.RedisError as exc:
            self._report_error("apply_compaction")
            raise OutcomeUnknown(f"lost reply not settled: {lost}; {type(exc).__name__}") from exc
        applied = str(gen or "0") == str(expected_gen + 1) and value == written
        log.warning("compare-and-set on %s settled by reading back: %s", thread_id[:13],
                    "applied" if applied else "not applied")
        if applied:
            return CompactionCommit(Outcome.APPLIED, int(version or 0), settled=True)
        return CompactionCommit(Outcome.STALE, detail=Reason.GENERATION, settled=True)

    @_guard
    def refine_status(self, thread_id: str) -> RefineStatus:
        """``rf``, ``uf`` and the thread's activity key with its remaining life, in one round trip."""
        keys = ThreadKeys(thread_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(keys.state, "rf", "uf")
        pipe.get(keys.active)
        pipe.pttl(keys.active)
        (refined, unrefined), activity, left = pipe.execute()
        return RefineStatus(int(refined or 0), int(unrefined or 0), activity, max(int(left or 0), 0))

    @_guard
    def mark_activity(self, thread_id: str, activity: str, seconds: float) -> None:
        """Set the thread's activity key (``streaming`` or ``idle``) for ``seconds``."""
        self.redis.set(ThreadKeys(thread_id).active, activity, px=max(int(seconds * 1000), 1))

    @_guard
    def set_pins(self, thread_id: str, *, expected_gen: int, pins: list[Pin]) -> bool:
        """Replace the pins if the generation is still ``expected_gen``; False when stale.  A lost reply is
        settled by reading back (``_settle_pins``).

        Raises:
            OutcomeUnknown: the reply was lost and the read-back failed too.
            StoreUnavailable: Redis failed before the script ran.
        """
        keys = ThreadKeys(thread_id)
        pins_json = _dumps([p.to_dict() for p in pins])
        try:
            result = self._write(self._set_pins, keys.ttl_keys(), [str(expected_gen), pins_json, self.ttl])
        except Unsettled as exc:
            return self._settle_pins(thread_id, expected_gen, {"pins": pins_json}, exc)
        return bool(result[0])

    def _settle_pins(self, thread_id: str, expected_gen: int, written: dict[str, str], lost: Unsettled) -> bool:
        """A pins (and notes) write whose reply was lost: applied when ``gen`` is past ``expected_gen`` and
        every field of ``written`` holds what it wrote; else False, as a stale write (the caller reads again)."""
        names = list(written)
        try:
            gen, *values = self.redis.hmget(ThreadKeys(thread_id).state, "gen", *names)
        except redis.RedisError as exc:
            self._report_error("set_pins")
            raise OutcomeUnknown(f"lost reply not settled: {lost}; {type(exc).__name__}") from exc
        applied = int(gen or 0) > expected_gen and values == [written[name] for name in names]
        log.warning("pins of %s settled by reading back: %s", thread_id[:13], "applied" if applied else "not applied")
        return applied

    @_guard
    def set_pins_and_notes(self, thread_id: str, *, expected_gen: int, pins: list[Pin], notes: list[str]) -> bool:
        """Replace the person's pins and the model's notes together if the generation is still
        ``expected_gen`` (``lua/set_notes.lua``); False when stale or the thread does not exist.

        A lost reply is settled by reading back (``_settle_pins``).

        Raises:
            OutcomeUnknown: the reply was lost and the read-back failed too.
            StoreUnavailable: Redis failed before the script ran; nothing was written.
        """
        keys = ThreadKeys(thread_id)
        pins_json, notes_json = _dumps([p.to_dict() for p in pins]), _dumps(list(notes))
        try:
            result = self._write(self._set_notes, keys.ttl_keys(), [str(expected_gen), pins_json, notes_json, self.ttl])
        except Unsettled as exc:
            return self._settle_pins(thread_id, expected_gen, {"pins": pins_json, "notes": notes_json}, exc)
        return bool(result[0])

    # -- compaction marker ---------------------------------------------------------------------

    @_guard
    def mark_compaction_pending(self, thread_id: str, version: int, ttl_seconds: int, *,
                                refine: bool = False) -> bool:
        """Set the one-pending marker (SET NX EX) of the fold, or with ``refine`` of the refinement; False when
        one is already pending (or the thread's folds are blocked: ``block_compactions``)."""
        keys = ThreadKeys(thread_id)
        return bool(self.redis.set(keys.refining if refine else keys.compacting, str(version), nx=True,
                                   ex=ttl_seconds))

    @_guard
    def release_compaction_marker(self, thread_id: str, version: int, *, refine: bool = False) -> bool:
        """Remove the pending marker if it still holds ``version`` (``lua/release_marker.lua``)."""
        keys = ThreadKeys(thread_id)
        return bool(self._release(keys=[keys.refining if refine else keys.compacting], args=[str(version)]))

    @_guard
    def block_compactions(self, thread_id: str, reason: str, seconds: int) -> None:
        """Mark the thread's folds as failing for a reason a retry will not fix: the marker holds
        ``blocked:<reason>`` for ``seconds`` (a clear removes it), so turns do not ask again meanwhile."""
        self.redis.set(ThreadKeys(thread_id).compacting, f"blocked:{reason}", ex=int(seconds))

    @_guard
    def compactions_blocked(self, thread_id: str) -> str | None:
        """The reason the thread's folds are blocked (``block_compactions``), or None."""
        value = self.redis.get(ThreadKeys(thread_id).compacting)
        return value[8:] if isinstance(value, str) and value.startswith("blocked:") else None

    # -- compaction history and events ---------------------------------------------------------

    @_guard
    def record_compaction(self, thread_id: str, entry: dict, max_entries: int, *, cleared: int | None = None) -> bool:
        """Push one history entry (numbers and categories only) on the thread's capped history list.

        Nothing is recorded for a thread that does not exist, nor, with ``cleared`` (the clear counter the work
        read), for a thread cleared since (``lua/record_compaction.lua``).
        """
        keys = ThreadKeys(thread_id)
        return bool(self._record(keys=[keys.state, keys.compactions],
                                 args=[json.dumps(entry, separators=(",", ":")), max_entries, self.ttl,
                                       "" if cleared is None else str(int(cleared))]))

    @_guard
    def publish_event(self, thread_id: str, frame: dict) -> None:
        """Publish a ``memory`` frame on the thread's events channel (open sockets relay it).

        The one place events are published: ``PUBLISH`` on one Redis, ``SPUBLISH`` (to the
        master of the thread's slot only) on a cluster, as ``app.chat.events`` subscribes.
        """
        channel, data = ThreadKeys(thread_id).events, json.dumps(frame, separators=(",", ":"))
        if self.sharded_events:
            self.redis.spublish(channel, data)
        else:
            self.redis.publish(channel, data)

    @_guard
    def ping(self) -> bool:
        """True when Redis answers PING."""
        return bool(self.redis.ping())

    @_guard
    def hold_compaction_marker(self, thread_id: str, version: int, ttl_seconds: int, *, refine: bool = False) -> bool:
        """Give the pending-compaction marker a new expiry (seconds) for the task of ``version``.

        Sets it when it holds ``version`` or is gone; a marker of another version is left alone
        and False is returned (``lua/hold_marker.lua``).

        Raises:
            StoreUnavailable: Redis failed.
        """
        keys = ThreadKeys(thread_id)
        return bool(self._hold(keys=[keys.refining if refine else keys.compacting],
                               args=[str(version), int(ttl_seconds)]))

    def probe_write(self) -> bool:
        """True when Redis takes a write: ``SET health:{probe} <ms> EX 60`` (one small key, overwritten).

        False when Redis answers but refuses it (``maxmemory`` with ``noeviction``, a read-only
        replica, a refused command).  Used by ``/healthz`` (cached there).

        Raises:
            StoreUnavailable: Redis did not answer (connection or timeout).
        """
        try:
            self.redis.set(HEALTH_PROBE_KEY, "1", ex=60)
            return True
        except redis.ResponseError:
            return False
        except redis.RedisError as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc

    # -- websocket leases (WS_MAX_PER_SESSION; never memory) -------------------------------------

    @_guard
    def claim_socket(self, thread_id: str, socket_id: str, *, most: int, lease_seconds: float) -> bool:
        """Take a place for one open websocket of the session; False when ``most`` are open
        (``lua/claim_socket.lua``; a lease not renewed within ``lease_seconds`` frees its place)."""
        return bool(self._socket(keys=[ThreadKeys(thread_id).sockets],
                                 args=["claim", socket_id, int(lease_seconds * 1000), most]))

    @_guard
    def renew_socket(self, thread_id: str, socket_id: str, *, lease_seconds: float) -> None:
        """Extend a websocket's lease by ``lease_seconds`` from now."""
        self._socket(keys=[ThreadKeys(thread_id).sockets], args=["renew", socket_id, int(lease_seconds * 1000), 0])

    @_guard
    def release_socket(self, thread_id: str, socket_id: str) -> None:
        """Give a closed websocket's place back."""
        self._socket(keys=[ThreadKeys(thread_id).sockets], args=["release", socket_id, 0, 0])
