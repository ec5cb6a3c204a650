"""Provenance, forget and export: ``GET``/``DELETE /api/chat/turns/<n>``, ``GET``/``POST /api/chat/forget`` and
``GET /api/chat/export`` (README: "Forget and provenance"; docs/contract.md: Forget and provenance).

Turn numbers are those of record lines and archive scores: the n-th person turn of the thread.  A path's
number is 1-6 ASCII digits, else 404.  Every answer is about the session's own thread (the id comes from the
cookie); a turn the thread never had answers 404 ``not_found``.

Forgetting a turn (``forget_turn``) reads the thread and the archive, computes the new record and notes in
pure Python (``app.memory.forget.plan_forget``) and writes it all with one compare-and-set script
(``ThreadStore.forget_turn``: recent messages, archive member, record lines, notes, the forgotten-turn set,
the forget counter, the generation, a history entry), retried a few times on a stale generation.  Then this
process drops its own copies (the archive index, parsed messages and records, split sentences and facts);
other processes' archive indexes are keyed by the forget counter, their token counts by a digest of the text,
and the bundled model's slot file of the thread is deleted (``drop_thread_cache``).  Refusals are ``ApiError``
answers (400, 404, 409; 503 with the store down).
"""

from __future__ import annotations

import logging
import time

import redis

from flask import Blueprint, request

from app.chat.events import forget_frame
from app.extensions import services
from app.identity import current_thread_id
from app.llm.cache_key import drop_thread_cache
from app.memory.forget import contains_phrase, plan_forget
from app.memory.state import utc_now_iso
from app.observability import accounting
from app.store import archive as archive_store
from app.store.thread_store import CorruptState, OutcomeUnknown, StoreUnavailable
from app.web.api.pins import ITEM_NUMBER_RE
from app.web.bodies import BAD_PHRASE, PHRASE_QUERY, forget_body, load_body, load_query
from app.web.responses import MEMORY_UNREADABLE, STORE_UNAVAILABLE, ApiError, UnknownOutcome, guarded_json

log = logging.getLogger(__name__)
bp = Blueprint("forget", __name__)

FORGET_ATTEMPTS = 5
POST_MAX_TURNS = 50
"""Most turns one ``POST /api/chat/forget`` forgets."""
HISTORY_MAX = 50
"""Entries the compaction history keeps (as ``app.compaction.service.HISTORY_MAX``)."""
NOT_FOUND = ("not_found", "This conversation has no such turn.")


def _store_errors(fn):
    """Turn store failures into the contract's answers (409 ``memory_unreadable``, 503 ``store_unavailable``)."""
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except CorruptState:
            raise ApiError(409, *MEMORY_UNREADABLE) from None
        except OutcomeUnknown:  # a reply lost and not read back: 202 outcome unknown, the page reads again
            log.warning("%s for %s: outcome unknown", fn.__name__, current_thread_id()[:13])
            raise UnknownOutcome() from None
        except StoreUnavailable as exc:
            log.warning("%s failed for %s: %s", fn.__name__, current_thread_id()[:13], type(exc).__name__)
            raise ApiError(503, *STORE_UNAVAILABLE) from None
    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def _turns_so_far(state) -> int:
    """Person turns the thread has had: folded, recent and forgotten ones."""
    numbers = state.turn_numbers()
    return max(numbers[-1] if numbers else 0, state.folded_turns, max(state.forgotten_turns, default=0))


def _turn_number(n: str, state) -> int:
    """The path's turn number when the thread had that turn.

    Raises:
        ApiError: 404 ``not_found``.
    """
    if not ITEM_NUMBER_RE.fullmatch(n) or not 1 <= int(n) <= _turns_so_far(state):
        raise ApiError(404, *NOT_FOUND)
    return int(n)


def _where(state, turn: int, archived) -> tuple[str, str | None, list[dict]]:
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
def get_turn(n: str):
    """Turn ``n`` as stored: 200 ``{"turn", "where", "reason", "messages"}``; 404 ``not_found``."""
    svc, thread_id = services(), current_thread_id()
    state = svc.store.load(thread_id)
    turn = _turn_number(n, state)
    archived = archive_store.archived_turn(svc.store, thread_id, turn)
    where, reason, messages = _where(state, turn, archived)
    return guarded_json({"turn": turn, "where": where, "reason": reason, "messages": messages})


def _forget_one(thread_id: str, turn: int, phrase: str | None = None) -> tuple[dict, list[int]]:
    """Forget ``turn`` (module docstring); ``({"turn", "recent", "archive", "recordLines", "notes"}, pinsQuoting)``.

    Raises:
        ApiError: 404 ``not_found`` (the thread has no such turn), 409 ``conflict`` after ``FORGET_ATTEMPTS``
            stale generations.
        StoreUnavailable, CorruptState: the store failed.
    """
    svc = services()
    for _attempt in range(FORGET_ATTEMPTS):
        state = svc.store.load(thread_id)
        _turn_number(str(turn), state)
        archived = archive_store.all_archived_turns(svc.store, thread_id) if state.folded_turns else []
        numbers = state.turn_numbers()
        forgotten_texts: list[str] = []
        kept: list[str] = []
        ids: list[str] = []
        for messages, number in [*zip(state.turns(), numbers), *((t.messages, t.number) for t in archived)]:
            if number == turn:
                forgotten_texts.extend(m.text for m in messages)
                ids.extend(m.id for m in messages)
            else:
                kept.extend(m.text for m in messages)
        plan = plan_forget(state, turn, forgotten=forgotten_texts, kept=kept, phrase=phrase)
        entry = {"at": int(time.time() * 1000), "outcome": "applied", "reason": "forgotten", "step": "forget",
                 "forgottenTurn": turn}
        committed = svc.store.forget_turn(thread_id, expected_gen=state.gen, turn=turn,
                                          message_ids=list(plan.message_ids), record=plan.record,
                                          notes=list(plan.notes), entry=entry, max_entries=HISTORY_MAX,
                                          turn_message_ids=ids)
        if committed.applied:
            _drop_process_copies(thread_id, forgotten_texts)
            drop_thread_cache(svc.settings, thread_id)
            _tell_every_tab(thread_id, [turn], ids)
            log.info("turn forgotten in %s: %d recent messages, %d archived, %d record lines, %d notes",
                     thread_id[:13], committed.recent_removed, committed.archive_removed, plan.record_lines,
                     plan.notes_removed)
            in_archive = committed.archive_removed > 0 or (committed.settled and any(t.number == turn for t in archived))
            return ({"turn": turn, "recent": committed.recent_removed > 0, "archive": in_archive,
                     "recordLines": plan.record_lines, "notes": plan.notes_removed}, list(plan.pins_quoting))
    raise ApiError(409, "conflict", "Memory was changing at that moment; please try again.")


def _tell_every_tab(thread_id: str, turns: list[int], message_ids: list[str]) -> None:
    """Publish the forget on the thread's events channel (``app.chat.events.forget_frame``): every open socket of
    the session takes the turn off its page.  Best effort: a page that misses it shows the turn until it reloads."""
    try:
        services().store.publish_event(thread_id, forget_frame(turns, message_ids))
    except StoreUnavailable:
        log.warning("forget of %s not announced: store unavailable", thread_id[:13])


def _drop_process_copies(thread_id: str, texts: list[str]) -> None:
    """Drop what this process keeps of the thread's older memory: its archive index, the parsed messages holding
    ``texts``, parsed records and notes, and split sentences (each rebuilt on its next use)."""
    from app.memory.compaction import facts, record
    from app.store import thread_store

    archive_store.forget(thread_id)
    gone = set(texts)
    thread_store._checked_message_values.cache.discard_where(lambda key: len(key) > 2 and key[2] in gone)
    thread_store._checked_meta.cache_clear()
    facts._cache.clear()
    record._split_cache.clear()


@bp.delete("/api/chat/turns/<n>")
@_store_errors
def delete_turn(n: str):
    """Forget turn ``n``: 200 ``{"forgotten": {...}, "pinsQuoting": [int]}``; 404 ``not_found``; 409 ``conflict``."""
    if not ITEM_NUMBER_RE.fullmatch(n):
        raise ApiError(404, *NOT_FOUND)
    forgotten, pins = _forget_one(current_thread_id(), int(n))
    return guarded_json({"forgotten": forgotten, "pinsQuoting": pins})


@bp.get("/api/chat/forget")
@_store_errors
def preview_forget():
    """Every memory item holding the phrase: 200 ``{"phrase", "items": [{"place", "turn", "text"}]}``; 400."""
    phrase = load_query(PHRASE_QUERY, {"phrase": request.args.get("phrase")}, BAD_PHRASE.message)["phrase"]
    svc, thread_id = services(), current_thread_id()
    state = svc.store.load(thread_id)
    items: list[dict] = []
    for messages, number in zip(state.turns(), state.turn_numbers()):
        items.extend({"place": "recent", "turn": number, "text": m.text}
                     for m in messages if contains_phrase(m.text, phrase))
    if state.folded_turns:
        for archived in archive_store.all_archived_turns(svc.store, thread_id):
            items.extend({"place": "archive", "turn": archived.number, "text": m.text}
                         for m in archived.messages if contains_phrase(m.text, phrase))
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
def forget_by_phrase():
    """Forget the chosen turns: 200 ``{"forgotten": [{...}], "pinsQuoting": [int]}``; 400; 404 ``not_found``
    (nothing forgotten when any listed turn is not the thread's)."""
    phrase, turns = _forget_body()
    svc, thread_id = services(), current_thread_id()
    state = svc.store.load(thread_id)
    for turn in turns:
        _turn_number(str(turn), state)
    forgotten, pins = [], set()
    for turn in turns:
        done, quoting = _forget_one(thread_id, turn, phrase)
        forgotten.append(done)
        pins.update(quoting)
    return guarded_json({"forgotten": forgotten, "pinsQuoting": sorted(pins)})


@bp.get("/api/chat/export")
@_store_errors
def export_thread():
    """Everything the thread holds, as a JSON download (docs/contract.md: GET /api/chat/export)."""
    svc, thread_id = services(), current_thread_id()
    state = svc.store.load(thread_id)
    archived = archive_store.all_archived_turns(svc.store, thread_id) if state.folded_turns else []
    try:
        compactions = accounting.load_compactions(svc, thread_id)
    except redis.RedisError as exc:  # the history is part of the export, so the export fails
        log.warning("export failed for %s: %s", thread_id[:13], type(exc).__name__)
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
        "earliestKeptTurn": archive_store.earliest_kept_turn(svc.store, thread_id, state),
    }
    response, status = guarded_json(payload)
    response.headers["Content-Disposition"] = 'attachment; filename="chat-export.json"'
    return response, status
