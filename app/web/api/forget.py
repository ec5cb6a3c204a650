"""Provenance, forget and export: ``GET``/``DELETE /api/chat/turns/<n>``, ``GET``/``POST /api/chat/forget`` and
``GET /api/chat/export`` (docs/memory.md: "Forget and provenance"; docs/contract.md: Forget and provenance).

Turn numbers are those of record lines and archive scores: the n-th person turn of the thread.  A path's
number is 1-6 ASCII digits, else 404.  Every answer is about the session's own thread (the id comes from the
cookie); a turn the thread never had answers 404 ``not_found``.

Forgetting turns (``_forget_turns``; ``DELETE`` one, ``POST`` up to 50 together) is one job, whatever the number
of turns: one read of the thread and its tokenised archive (``load_turn_memory``: this process's index, brought up
to date), one plan in pure Python (``app.memory.forget.plan_forget``: the archive compared by the index's term
counts, linear in it once), one compare-and-set script (``ThreadStore.forget_turn``: recent messages, archive
members, record lines, notes, the forgotten-turn set, the forget counter, the generation, history entries),
retried a few times on a stale generation.  The CPU part runs off the event loop (``off_the_event_loop``: a real
thread under gevent).  A turn already forgotten is a no-op.  Then every process cache of the thread is dropped in
one place (``Services.caches.drop_thread``: this process keeps the index without the forgotten turns, and the
bundled model's slot file of the thread is deleted); other processes' archive indexes are keyed by the forget
counter and the thread's creation stamp, their token counts by a digest of the text.  Refusals
are ``ApiError`` answers (400, 404, 409; 503 with the store down).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import redis
from flask import Blueprint, Response, request

from app.chat.events import forget_frame
from app.chat.turn import off_the_event_loop
from app.extensions import services
from app.identity import current_thread_id
from app.memory.forget import ForgetPlan, Quoting, contains_phrase, plan_forget
from app.memory.state import ThreadState, thread_label, utc_now_iso
from app.observability import accounting
from app.store.compaction_history import HISTORY_MAX, forget_entry
from app.store.errors import CorruptState, OutcomeUnknown, StoreUnavailable
from app.store.keys import ThreadKeys
from app.web.api.pins import ITEM_NUMBER_RE
from app.web.bodies import BAD_PHRASE, PHRASE_QUERY, forget_body, load_body, load_query
from app.web.responses import MEMORY_UNREADABLE, STORE_UNAVAILABLE, ApiError, UnknownOutcome, guarded_json

if TYPE_CHECKING:
    from app.memory.recall import ArchivedTurn, ArchiveIndex

log = logging.getLogger(__name__)
bp = Blueprint("forget", __name__)

FORGET_ATTEMPTS = 5
STATUS_TTL_SECONDS = 120
"""Life of a forget job's status key (``ThreadKeys.forgetting``) should the process die before deleting it."""
POST_MAX_TURNS = 50
"""Most turns one ``POST /api/chat/forget`` forgets."""
NOT_FOUND = ("not_found", "This conversation has no such turn.")

P = ParamSpec("P")
R = TypeVar("R")


def _store_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn store failures into the contract's answers (409 ``memory_unreadable``, 503 ``store_unavailable``)."""
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except CorruptState:
            raise ApiError(409, *MEMORY_UNREADABLE) from None
        except OutcomeUnknown:  # a reply lost and not read back: 202 outcome unknown, the page reads again
            log.warning("%s for %s: outcome unknown", fn.__name__, thread_label(current_thread_id()))
            raise UnknownOutcome() from None
        except StoreUnavailable as exc:
            log.warning("%s failed for %s: %s", fn.__name__, thread_label(current_thread_id()), type(exc).__name__)
            raise ApiError(503, *STORE_UNAVAILABLE) from None
    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def _turns_so_far(state: ThreadState) -> int:
    """Person turns the thread has had: folded, recent and forgotten ones."""
    numbers = state.turn_numbers()
    return max(numbers[-1] if numbers else 0, state.folded_turns, max(state.forgotten_turns, default=0))


def _turn_number(n: str, state: ThreadState) -> int:
    """The path's turn number when the thread had that turn.

    Raises:
        ApiError: 404 ``not_found``.
    """
    if not ITEM_NUMBER_RE.fullmatch(n) or not 1 <= int(n) <= _turns_so_far(state):
        raise ApiError(404, *NOT_FOUND)
    return int(n)


def _where(state: ThreadState, turn: int, archived: ArchivedTurn | None) -> tuple[str, str | None, list[dict]]:
    """``(where, reason, messages)`` of turn ``turn`` (docs/contract.md: GET /api/chat/turns/<n>)."""
    from app.memory.forget import recent_turn

    recent = recent_turn(state, turn)
    if recent:
        return "recent", None, [m.to_dict() for m in recent]
    if archived is not None:
        return "archive", None, [m.to_dict() for m in archived.messages]
    if turn in state.forgotten_turns:
        return "gone", "forgotten", []
    return "gone", "archive_limit", []


@bp.get("/api/chat/turns/<n>")
@_store_errors
def get_turn(n: str) -> tuple[Response, int]:
    """Turn ``n`` as stored: 200 ``{"turn", "where", "reason", "messages"}``; 404 ``not_found``."""
    svc, thread_id = services(), current_thread_id()
    state = svc.store.load(thread_id)
    turn = _turn_number(n, state)
    archived = svc.archive.turn(thread_id, turn)
    where, reason, messages = _where(state, turn, archived)
    return guarded_json({"turn": turn, "where": where, "reason": reason, "messages": messages})


def _entry(turn: int, *, recent: bool = False, archive: bool = False, record_lines: int = 0, notes: int = 0) -> dict:
    return {"turn": turn, "recent": recent, "archive": archive, "recordLines": record_lines, "notes": notes}


def _plan(state: ThreadState, index: ArchiveIndex, turns: frozenset[int],
          phrase: str | None) -> tuple[ForgetPlan, list[str], list[str], set[int]]:
    """``(plan, forgotten texts, every message id of the turns, archived numbers among turns)``: CPU only, no store
    call (run off the event loop).  Linear in what memory keeps, once: the archive's turns are compared by the
    index's term counts (already tokenised), only the recent turns' texts are tokenised."""
    from app.memory.words import tokens

    forgotten_tokens: list = []
    kept_tokens: list = []
    texts: list[str] = []
    ids: list[str] = []
    for messages, number in zip(state.turns(), state.turn_numbers(), strict=True):
        if number in turns:
            texts.extend(m.text for m in messages)
            ids.extend(m.id for m in messages)
            forgotten_tokens.extend(tokens(m.text) for m in messages)
        else:
            kept_tokens.extend(tokens(m.text) for m in messages)
    archived = set()
    for turn, counts in index.counted():
        if turn.number in turns:
            archived.add(turn.number)
            texts.extend(m.text for m in turn.messages)
            ids.extend(m.id for m in turn.messages)
            forgotten_tokens.append(counts)
        else:
            kept_tokens.append(counts)
    quoting = Quoting.of_tokens(forgotten_tokens, kept_tokens)
    return plan_forget(state, turns, quoting=quoting, phrase=phrase), texts, ids, archived


def _job_status(thread_id: str, turns: list[int] | None) -> None:
    """Say that a forget job of ``turns`` runs now for the thread (None: that it ended); advisory, never raises."""
    key = ThreadKeys(thread_id).forgetting
    try:
        if turns is None:
            services().store.redis.delete(key)
        else:
            services().store.redis.set(key, json.dumps({"turns": turns, "startedAt": int(time.time() * 1000)}),
                                       ex=STATUS_TTL_SECONDS)
    except redis.RedisError as exc:
        log.warning("forget status of %s not written: %s", thread_label(thread_id), type(exc).__name__)


def _forget_turns(thread_id: str, turns: list[int], phrase: str | None = None) -> tuple[list[dict], list[int]]:
    """``_forget_job`` with its status (``GET /api/chat/forget/status``) said while it runs."""
    _job_status(thread_id, turns)
    try:
        return _forget_job(thread_id, turns, phrase)
    finally:
        _job_status(thread_id, None)


def _forget_job(thread_id: str, turns: list[int], phrase: str | None = None) -> tuple[list[dict], list[int]]:
    """Forget ``turns`` together (module docstring): one read of the thread and its archive index, one plan, one
    script, however many turns; ``([{"turn", "recent", "archive", "recordLines", "notes"}, ...], pinsQuoting)``
    in the order of ``turns``.  A turn already forgotten answers with nothing removed and writes nothing (a
    request of such turns only makes no write at all).  With several turns, the notes and unnumbered record lines
    quoting any of them are counted on the first turn forgotten now.

    Raises:
        ApiError: 404 ``not_found`` (the thread has no such turn), 409 ``conflict`` after ``FORGET_ATTEMPTS``
            stale generations.
        StoreUnavailable, CorruptState: the store failed.
    """
    svc = services()
    for _attempt in range(FORGET_ATTEMPTS):
        state, index = svc.archive.load_turn_memory(thread_id, run=off_the_event_loop)
        for turn in turns:
            _turn_number(str(turn), state)
        new = frozenset(t for t in turns if t not in state.forgotten_turns)
        if not new:
            return [_entry(t) for t in turns], []
        plan, texts, ids, archived = off_the_event_loop(partial(_plan, state, index, new, phrase))
        recent = {n for n in state.turn_numbers() if n in new}
        now = int(time.time() * 1000)
        entries = [forget_entry(t, now) for t in sorted(new)]
        committed = svc.store.forget_turn(thread_id, expected_gen=state.gen, turns=sorted(new),
                                          message_ids=list(plan.message_ids), record=plan.record,
                                          notes=list(plan.notes), entries=entries, max_entries=HISTORY_MAX,
                                          turn_message_ids=ids)
        if committed.applied:
            # a reply settled by reading back does not know the new forget counter: rebuild the index on next use
            kept = None if committed.settled else off_the_event_loop(
                partial(index.without, new, forgets=committed.forgets))
            svc.caches.drop_thread(thread_id, texts=texts, keep=kept)
            log.info("%d turns forgotten in %s: %d recent messages, %d archived, %d record lines, %d notes",
                     len(new), thread_label(thread_id), committed.recent_removed, committed.archive_removed,
                     plan.record_lines, plan.notes_removed)
            _tell_every_tab(thread_id, sorted(new), ids)
            numbered = {t: sum(1 for line in state.record.lines if line.turn == t) for t in new}
            first = min(new)
            other_lines = plan.record_lines - sum(numbered.values())
            return ([_entry(t, recent=t in recent, archive=t in archived,
                            record_lines=numbered[t] + (other_lines if t == first else 0),
                            notes=plan.notes_removed if t == first else 0) if t in new else _entry(t)
                     for t in turns], list(plan.pins_quoting))
    raise ApiError(409, "conflict", "Memory was changing at that moment; please try again.")


def _tell_every_tab(thread_id: str, turns: list[int], message_ids: list[str]) -> None:
    """Publish the forget on the thread's events channel (``app.chat.events.forget_frame``): every open socket of
    the session takes the turn off its page.  Best effort: a page that misses it shows the turn until it reloads."""
    try:
        services().store.publish_event(thread_id, forget_frame(turns, message_ids))
    except StoreUnavailable:
        log.warning("forget of %s not announced: store unavailable", thread_label(thread_id))


@bp.delete("/api/chat/turns/<n>")
@_store_errors
def delete_turn(n: str) -> tuple[Response, int]:
    """Forget turn ``n``: 200 ``{"forgotten": {...}, "pinsQuoting": [int]}``; 404 ``not_found``; 409 ``conflict``."""
    if not ITEM_NUMBER_RE.fullmatch(n):
        raise ApiError(404, *NOT_FOUND)
    [forgotten], pins = _forget_turns(current_thread_id(), [int(n)])
    return guarded_json({"forgotten": forgotten, "pinsQuoting": pins})


@bp.get("/api/chat/forget")
@_store_errors
def preview_forget() -> tuple[Response, int]:
    """Every memory item holding the phrase: 200 ``{"phrase", "items": [{"place", "turn", "text"}]}``; 400."""
    phrase = load_query(PHRASE_QUERY, {"phrase": request.args.get("phrase")}, BAD_PHRASE.message)["phrase"]
    svc, thread_id = services(), current_thread_id()
    state, index = svc.archive.load_turn_memory(thread_id, run=off_the_event_loop)
    items: list[dict] = []
    for messages, number in zip(state.turns(), state.turn_numbers(), strict=True):
        items.extend({"place": "recent", "turn": number, "text": m.text}
                     for m in messages if contains_phrase(m.text, phrase))

    def archived_items() -> list[dict]:  # CPU only: the whole archive, off the event loop
        return [{"place": "archive", "turn": archived.number, "text": m.text}
                for archived, _counts in index.counted() for m in archived.messages if contains_phrase(m.text, phrase)]

    items.extend(off_the_event_loop(archived_items))
    items.extend({"place": "record", "turn": line.turn or None, "text": line.text}
                 for line in state.record.lines if contains_phrase(line.text, phrase))
    items.extend({"place": "notes", "turn": None, "text": note} for note in state.notes if contains_phrase(note, phrase))
    items.extend({"place": "pins", "turn": None, "text": pin.text}
                 for pin in state.pins if contains_phrase(pin.text, phrase))
    return guarded_json({"phrase": phrase, "items": items})


def _forget_body() -> tuple[str | None, list[int]]:
    """``(phrase or None, turns)`` of ``POST /api/chat/forget`` (``app.web.bodies.ForgetBody``; keys it does not
    read are ignored).

    Raises:
        ApiError: 400 ``bad_request`` (not a JSON object; ``turns`` not a list of 1 to ``POST_MAX_TURNS`` turn
            numbers; a phrase that is blank or longer than 200 characters), 400 ``invalid_text``.
    """
    hint = 'Send a JSON object with "turns": [turn numbers] and the "phrase".'
    body = load_body(forget_body(POST_MAX_TURNS, hint), hint)
    return body["phrase"], body["turns"]


@bp.post("/api/chat/forget")
@_store_errors
def forget_by_phrase() -> tuple[Response, int]:
    """Forget the chosen turns: 200 ``{"forgotten": [{...}], "pinsQuoting": [int]}``; 400; 404 ``not_found``
    (nothing forgotten when any listed turn is not the thread's)."""
    phrase, turns = _forget_body()
    forgotten, pins = _forget_turns(current_thread_id(), turns, phrase)
    return guarded_json({"forgotten": forgotten, "pinsQuoting": sorted(pins)})


@bp.get("/api/chat/forget/status")
@_store_errors
def forget_status() -> tuple[Response, int]:
    """The session's forget job running now: 200 ``{"running": bool, "turns": [int], "startedAt": ms or null}``."""
    try:
        raw = services().store.redis.get(ThreadKeys(current_thread_id()).forgetting)
    except redis.RedisError as exc:
        raise StoreUnavailable(type(exc).__name__) from exc
    try:
        job = json.loads(raw or "null")
        turns, started = [int(t) for t in job["turns"]], int(job["startedAt"])
    except (ValueError, TypeError, KeyError):  # none running (or not readable: said as none)
        return guarded_json({"running": False, "turns": [], "startedAt": None})
    return guarded_json({"running": True, "turns": turns, "startedAt": started})


@bp.get("/api/chat/export")
@_store_errors
def export_thread() -> tuple[Response, int]:
    """Everything the thread holds, as a JSON download (docs/contract.md: GET /api/chat/export)."""
    svc, thread_id = services(), current_thread_id()
    state = svc.store.load(thread_id)
    archived = svc.archive.all_turns(thread_id) if state.folded_turns else []
    try:
        compactions = accounting.load_compactions(svc, thread_id)
    except redis.RedisError as exc:  # the history is part of the export, so the export fails
        log.warning("export failed for %s: %s", thread_label(thread_id), type(exc).__name__)
        raise ApiError(503, *STORE_UNAVAILABLE) from None
    payload = {
        "exportedAt": utc_now_iso(),
        "threadId": thread_id,
        "messages": [m.to_dict() for m in state.messages],
        "record": state.record.to_dict(),
        "notes": list(state.notes),
        "pins": state.pinned_decisions,
        "archive": [{"turn": t.number, "messages": [m.to_dict() for m in t.messages]} for t in archived],
        "compactions": compactions,
        "earliestKeptTurn": svc.archive.earliest_kept_turn(thread_id, state),
    }
    response, status = guarded_json(payload)
    response.headers["Content-Disposition"] = 'attachment; filename="chat-export.json"'
    return response, status
