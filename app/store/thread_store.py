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

The store is split by what each part owns:

- ``ThreadStore`` (here): the thread's state, its commit, clear and compare-and-sets, and its events channel;
- ``app.store.stored_state``: reading the stored hash into a ``ThreadState`` (and the caches of checked parts);
- ``app.store.compaction_markers`` (``ThreadStore.markers``): the pending-compaction markers and the activity key,
  as typed values;
- ``app.store.compaction_history`` (``ThreadStore.history``): the capped compaction history, ``HISTORY_MAX``;
- ``app.store.socket_leases``: websocket leases, for the session's and the address's limits alike;
- ``app.store.health``: the ``/healthz`` probes;
- ``app.store.errors``: the errors above and ``ErrorGuard`` (``ThreadStore.guard``), through which every part maps
  Redis failures.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import redis
from redis.commands.core import Script

from app.memory.compaction.policy import hard_cap_messages
from app.memory.final_turn import FinalTurn, prepare_final_turn
from app.memory.limits import MemoryLimits
from app.memory.record import Record
from app.memory.state import Pin, ThreadMessage, ThreadState, thread_label
from app.store.compaction_history import CompactionHistory, encode_entry
from app.store.compaction_markers import CompactionMarkers, RefineStatus
from app.store.compaction_outcome import Outcome, Reason, reason_of
from app.store.errors import CorruptState, ErrorGuard, OutcomeUnknown, StoreUnavailable, Unsettled, guarded, never_sent
from app.store.keys import ThreadKeys
from app.store.redis_client import StoreClient, is_cluster, run_script_and_wait, without_retries
from app.store.scripts import lua_script
from app.store.stored_state import dumps as _dumps, forgotten_turns as _forgotten_turns, parse_state

__all__ = ["CommitResult", "CompactionCommit", "CorruptState", "ForgetCommit", "OutcomeUnknown", "RefineStatus",
           "StoreUnavailable", "ThreadStore"]

log = logging.getLogger(__name__)


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


class ThreadStore:
    """Reads and writes ThreadState in Redis; holds the thread's compaction ``markers`` and ``history``.

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
    slot, and events are published with ``SPUBLISH`` (sharded pub/sub; docs/scale-out.md).
    """

    def __init__(self, client: StoreClient, limits: MemoryLimits, ttl_seconds: int, *, validate_reads: bool = True,
                 on_error: Callable[[str], None] | None = None, wait_replicas: int = 0, wait_timeout_ms: int = 100):
        self.redis = client
        self.limits = limits
        self.ttl = ttl_seconds
        self.validate_reads = validate_reads
        self.guard = ErrorGuard(on_error)
        """The store's error guard: every reader of the store's keys maps Redis errors through it."""
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.sharded_events = is_cluster(client)
        self.markers = CompactionMarkers(client, self.guard)
        """The thread's pending-compaction markers and activity key (``app.store.compaction_markers``)."""
        self.history = CompactionHistory(client, self.guard, ttl_seconds)
        """The thread's compaction history (``app.store.compaction_history``)."""
        self._commit = lua_script(client, "commit_turn.lua")
        self._clear = lua_script(client, "clear_thread.lua")
        self._apply = lua_script(client, "apply_compaction.lua")
        self._set_pins = lua_script(client, "set_pins.lua")
        self._set_notes = lua_script(client, "set_notes.lua")
        self._refine = lua_script(client, "apply_refinement.lua")
        self._forget = lua_script(client, "forget_turn.lua")
        self.writer = without_retries(client)
        """The client memory-changing scripts run on: no retry after a command was sent."""

    @property
    def on_error(self) -> Callable[[str], None] | None:
        """The error hook (``guard.on_error``)."""
        return self.guard.on_error

    def _write(self, script: Script, keys: list[str], args: list) -> Any:
        """Run a memory-writing script once (never retried); with ``wait_replicas``, also ``WAIT`` on the
        same connection.

        Raises:
            Unsettled: the connection closed or timed out after the script may have been sent.
            redis.RedisError: any other failure.
        """
        try:
            if not self.wait_replicas:
                # redis-py hints its own two client classes; a ClusterClient serves what Script calls.
                return script(keys=keys, args=args, client=self.writer)  # type: ignore[arg-type]
            answer, acknowledged = run_script_and_wait(self.writer, script, keys, args,
                                                       replicas=self.wait_replicas, timeout_ms=self.wait_timeout_ms)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if never_sent(exc):
                raise  # the connection could not be made: Redis never saw the script
            raise Unsettled(f"{type(exc).__name__}: {exc}") from exc
        if acknowledged < self.wait_replicas:
            log.warning("memory write acknowledged by %d of %d replicas within %d ms", acknowledged,
                        self.wait_replicas, self.wait_timeout_ms)
            self.guard.report("wait_replicas")
        return answer

    # -- reading -----------------------------------------------------------------------------

    def parse(self, raw: dict) -> ThreadState:
        """Build a ThreadState from an HGETALL answer (``{}`` gives the empty state;
        ``app.store.stored_state.parse_state`` with this store's limits and ``validate_reads``).

        Every part is checked with the stored-state schema; a part already checked in this
        process (a message, or the summary with the pins) is not checked again, so a turn
        validates only what changed since the last read.  The counters ``v``, ``gen`` and
        ``clr`` must be non-negative integers, and ``messages`` a JSON list, whatever
        ``validate_reads`` says.

        Raises:
            CorruptState: the hash does not satisfy the stored-state schema.
        """
        return parse_state(raw, self.limits, validate=self.validate_reads)

    @guarded
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
        log.error("thread %s is corrupt: %s", thread_label(thread_id), exc)
        raise exc

    # -- writing -----------------------------------------------------------------------------

    @guarded
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
            self.guard.report("commit_messages")
            raise OutcomeUnknown(f"lost reply not settled: {lost}; {type(exc).__name__}") from exc
        version = int(raw[1] or 0)
        if assistant.id in ids or user.id in ids:
            log.warning("commit on %s settled by reading back: %s", thread_label(thread_id),
                        "written" if assistant.id in ids else "a duplicate")
            return CommitResult(assistant.id in ids, version, len(messages), (user, assistant), settled=True)
        self.guard.report("commit_messages")
        raise StoreUnavailable(f"lost reply settled by reading back: not written ({lost})")

    def commit_final_turn(self, thread_id: str, turn: FinalTurn, *, expected_cleared: int | None = None,
                          expected_forgets: int | None = None) -> CommitResult:
        """Write a finished turn through the final-turn adapter.

        A turn without ids is deduplicated by text against the last stored pair.  With
        ``expected_cleared`` (the clear counter read when the turn started), a turn whose thread
        was cleared meanwhile writes nothing (``CommitResult.cleared``); with ``expected_forgets`` (the forget
        counter read then), a turn of a thread where a turn was forgotten meanwhile writes nothing (``forgotten``).

        Raises:
            TurnRejected: the turn is not written (status, source or text; docs/memory.md: The boundary).
            StoreUnavailable: Redis failed.
        """
        user, assistant = prepare_final_turn(turn, delivery_max_chars=self.limits.delivery_final_max_chars)
        by_text = turn.user_id is None and turn.assistant_id is None
        return self.commit_messages(thread_id, user, assistant, dedupe_by_text=by_text,
                                    expected_cleared=expected_cleared, expected_forgets=expected_forgets)

    @guarded
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
            log.warning("clear repaired the corrupt thread %s", thread_label(thread_id))
        return int(version)

    def _settle_clear(self, thread_id: str, before: str | None, lost: Unsettled) -> int:
        """A clear whose reply was lost: cleared when ``clr`` is no longer ``before`` (the script moves it on,
        ``lua/clear_thread.lua``); the version read back is returned."""
        try:
            cleared, version = self.redis.hmget(ThreadKeys(thread_id).state, "clr", "v")
        except redis.RedisError as exc:
            self.guard.report("clear")
            raise OutcomeUnknown(f"lost reply not settled: {lost}; {type(exc).__name__}") from exc
        if cleared is not None and cleared != before:
            log.warning("clear of %s settled by reading back: cleared", thread_label(thread_id))
            return int(version or 0)
        self.guard.report("clear")
        raise StoreUnavailable(f"lost reply settled by reading back: not cleared ({lost})")

    @guarded
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

    @guarded
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

    @guarded
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
                                  _dumps(list(notes)), _dumps([encode_entry(e) for e in entries]),
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
            self.guard.report("forget_turn")
            raise OutcomeUnknown(f"lost reply not settled: {lost}; {type(exc).__name__}") from exc
        applied = set(turns) <= set(forgotten_turns) and int(gen or 0) > expected_gen
        log.warning("forget on %s settled by reading back: %s", thread_label(thread_id),
                    "applied" if applied else "not applied")
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
            self.guard.report("apply_compaction")
            raise OutcomeUnknown(f"lost reply not settled: {lost}; {type(exc).__name__}") from exc
        applied = str(gen or "0") == str(expected_gen + 1) and value == written
        log.warning("compare-and-set on %s settled by reading back: %s", thread_label(thread_id),
                    "applied" if applied else "not applied")
        if applied:
            return CompactionCommit(Outcome.APPLIED, int(version or 0), settled=True)
        return CompactionCommit(Outcome.STALE, detail=Reason.GENERATION, settled=True)

    @guarded
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
            self.guard.report("set_pins")
            raise OutcomeUnknown(f"lost reply not settled: {lost}; {type(exc).__name__}") from exc
        applied = int(gen or 0) > expected_gen and values == [written[name] for name in names]
        log.warning("pins of %s settled by reading back: %s", thread_label(thread_id),
                    "applied" if applied else "not applied")
        return applied

    @guarded
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

    # -- events ----------------------------------------------------------------------------------

    @guarded
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

    # -- the compaction markers' two calls the turn path and the benchmarks make through the store --------------

    def mark_compaction_pending(self, thread_id: str, version: int, ttl_seconds: int, *,
                                refine: bool = False) -> bool:
        """``markers.mark_compaction_pending``: set the one-pending marker (SET NX EX); False when one is pending
        or the thread's folds are blocked.  ``CompactionRequests`` marks through this method, so that a caller
        may time or wrap one store's marking (``bench/compaction.py``).

        Raises:
            StoreUnavailable: Redis failed.
        """
        return self.markers.mark_compaction_pending(thread_id, version, ttl_seconds, refine=refine)

    def refine_status(self, thread_id: str) -> RefineStatus:
        """``markers.refine_status``: ``rf``, ``uf`` and the thread's activity key with its remaining life.

        Raises:
            StoreUnavailable: Redis failed.
        """
        return self.markers.refine_status(thread_id)
