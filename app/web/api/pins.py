"""Pins and notes: ``POST /api/chat/pins``, ``DELETE /api/chat/pins/<n>``, ``POST /api/chat/notes/<n>/pin``
and ``DELETE /api/chat/notes/<n>`` (docs/memory.md: "Seeing what memory did"; docs/contract.md: HTTP).

A person's pin is kept word for word (whitespace runs collapsed); pinning a stored
message pins its text cut at a word boundary to ``MEMORY_PINNED_MAX_CHARS``.  A model's
note (what a compaction proposed to remember) can be promoted to the person's pinned
decision, or removed.  Every change reads the thread fresh and commits with the store's
compare-and-set on the generation, retried a few times, so a compaction in flight is never
overwritten; a change that started before the thread was cleared writes nothing (409
``thread_cleared``).  Refusals are ``ApiError`` answers (400, 404, 409; 503 with the store down).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import TypeVar

from flask import Blueprint, Response

from app.chat.client_input import without_format_characters
from app.extensions import services
from app.identity import current_thread_id
from app.memory.compaction import normalize_pin
from app.memory.context import PINS_MAX_PROMPT_SHARE, pins_prompt_tokens
from app.memory.limits import MemoryLimits
from app.memory.state import PINNED_BY_PERSON, Pin, ThreadState, thread_label
from app.memory.text import cut_at_word
from app.memory.tokens import TokenCounter
from app.observability import metrics
from app.store.thread_store import CorruptState, OutcomeUnknown, StoreUnavailable
from app.web.bodies import clean_pin_text, load_body, pin_body
from app.web.responses import MEMORY_UNREADABLE, STORE_UNAVAILABLE, ApiError, UnknownOutcome, guarded_json

log = logging.getLogger(__name__)
bp = Blueprint("pins", __name__)

PIN_WRITE_ATTEMPTS = 5
# A path's item number: ASCII decimal digits, at most 6 of them (any other segment is 404).
ITEM_NUMBER_RE = re.compile(r"[0-9]{1,6}")

T = TypeVar("T")


def pin_key(text: str) -> str:
    """What two pins are compared by: ``normalize_pin`` of the text without invisible format characters."""
    return normalize_pin(without_format_characters(text))


def _pin_text(body: dict, state: ThreadState, limits: MemoryLimits) -> str:
    """The text to pin from a loaded ``PinBody``: the typed text, or a stored message's text cut at a word."""
    if "text" in body:
        return body["text"]
    message = next((m for m in state.messages if m.id == body["messageId"]), None)
    if message is None:
        raise ApiError(404, "unknown_message", "That message is no longer in memory, so it can't be pinned.")
    return cut_at_word(clean_pin_text(message.text), limits.pinned_max_chars, mark="…", strip=" ,;:-")


def _with_new_pin(state: ThreadState, text: str, limits: MemoryLimits, *, counter: TokenCounter,
                  max_tokens: int) -> list[Pin]:
    """The pins with ``text`` pinned by the person; refused over the count limit, or when the
    pins message would cost more than ``max_tokens`` tokens."""
    pins = _pins_with(state, text, limits)
    if pins_prompt_tokens([p.text for p in pins], counter) > max_tokens:
        raise ApiError(409, "pin_limit", "The pinned decisions are too long to fit beside the conversation. "
                                         "Unpin one, or pin something shorter.")
    return pins


def _pins_with(state: ThreadState, text: str, limits: MemoryLimits) -> list[Pin]:
    pins = list(state.pins)
    key = pin_key(text)
    for i, pin in enumerate(pins):
        if pin_key(pin.text) == key:
            if pin.by == PINNED_BY_PERSON:
                raise ApiError(409, "already_pinned", "That decision is already pinned.")
            pins[i] = Pin(text, PINNED_BY_PERSON)  # the model's pin becomes the person's, in their words
            return pins
    if len(pins) >= limits.pinned_max:
        raise ApiError(409, "pin_limit", f"You can pin at most {limits.pinned_max} decisions. "
                                         "Unpin one to make room.")
    pins.append(Pin(text, PINNED_BY_PERSON))
    return pins


def _without(items: Iterable[T], n: str, what: str) -> list[T]:
    """``items`` without its ``n``-th (1-based, as in the URL).

    Raises:
        ApiError: 404 ``<what>_not_found`` when ``n`` names no item.
    """
    kept = list(items)
    if not ITEM_NUMBER_RE.fullmatch(n) or not 1 <= int(n) <= len(kept):
        raise ApiError(404, f"{what}_not_found", f"There is no such {what} (it may have been removed already).")
    del kept[int(n) - 1]
    return kept


def _promoted(state: ThreadState, n: str, limits: MemoryLimits, *, counter: TokenCounter,
              max_tokens: int) -> tuple[list[Pin], list[str]]:
    """``(pins, notes)`` with the ``n``-th note (1-based) made the person's pinned decision.

    A note the person has already pinned (same words) is only removed from the notes.
    """
    notes = _without(state.notes, n, "note")
    text = clean_pin_text(state.notes[int(n) - 1])
    try:
        return _with_new_pin(state, text, limits, counter=counter, max_tokens=max_tokens), notes
    except ApiError as refused:
        if refused.code != "already_pinned":
            raise
        return list(state.pins), notes


def _change(action: str, change: Callable[[ThreadState], tuple[list[Pin], list[str] | None]]) -> ThreadState:
    """Read fresh, apply ``change(state) -> (pins, notes or None)``, compare-and-set; retry on a stale generation.

    With notes None only the pins are written (``set_pins``), else both (``set_pins_and_notes``).
    A retry that finds the thread cleared since the first read writes nothing.

    Returns:
        The state as written (pins and notes as stored now).

    Raises:
        ApiError: ``change`` refused, 409 ``thread_cleared`` when the thread was cleared meanwhile,
            409 ``thread_expired`` when it expired meanwhile (its clear counter went back),
            409 ``conflict`` after ``PIN_WRITE_ATTEMPTS`` stale generations, 409 ``memory_unreadable``
            when the stored thread is corrupt (a clear repairs it), 503 ``store_unavailable``.
        UnknownOutcome: a write's reply was lost and reading back failed too (202 ``outcome: unknown``).
    """
    thread_id = current_thread_id()
    svc = services()
    try:
        first = None
        for _attempt in range(PIN_WRITE_ATTEMPTS):
            state = svc.store.load(thread_id)
            first = state.cleared if first is None else first
            # docs/memory.md: clearing a thread is final for everything that started before it
            if state.cleared > first:
                raise ApiError(409, "thread_cleared", "A new chat was started meanwhile, so nothing was changed.")
            if state.cleared < first:  # the clear counter never goes back: the thread expired meanwhile
                raise ApiError(409, "thread_expired", "This conversation expired meanwhile, so nothing was changed.")
            pins, notes = change(state)
            if notes is None:
                written = svc.store.set_pins(thread_id, expected_gen=state.gen, pins=pins)
            else:
                written = svc.store.set_pins_and_notes(thread_id, expected_gen=state.gen, pins=pins, notes=notes)
            if written:
                metrics.observe_pin_request(action, "ok")
                return ThreadState(pins=tuple(pins), notes=tuple(state.notes if notes is None else notes))
        metrics.observe_pin_request(action, "conflict")
        raise ApiError(409, "conflict", "Memory was changing at that moment; please try again.")
    except ApiError as refused:
        if refused.code != "conflict":
            metrics.observe_pin_request(action, refused.code)
        raise
    except OutcomeUnknown:
        log.warning("%s on %s: reply lost and not read back: outcome unknown", action, thread_label(thread_id))
        metrics.observe_pin_request(action, "outcome_unknown")
        raise UnknownOutcome() from None
    except CorruptState:
        metrics.observe_pin_request(action, "memory_unreadable")
        raise ApiError(409, *MEMORY_UNREADABLE) from None
    except StoreUnavailable as exc:
        log.warning("%s failed for %s: %s", action, thread_label(thread_id), type(exc).__name__)
        metrics.observe_pin_request(action, "store_unavailable")
        raise ApiError(503, *STORE_UNAVAILABLE) from None


def _pins_max_tokens() -> int:
    return int(services().settings.prompt_budget * PINS_MAX_PROMPT_SHARE)


@bp.post("/api/chat/pins")
def add_pin() -> tuple[Response, int]:
    """Pin a decision by the person: typed text, or a stored message's text.  201 ``{"pinnedDecisions"}``."""
    svc = services()
    limits = svc.settings.limits
    try:
        body = load_body(pin_body(limits.pinned_max_chars), 'Send a JSON object with "text" or "messageId".')
    except ApiError as refused:
        metrics.observe_pin_request("pin", refused.code)
        raise
    state = _change("pin", lambda state: (_with_new_pin(state, _pin_text(body, state, limits), limits,
                                                        counter=svc.counter, max_tokens=_pins_max_tokens()), None))
    return guarded_json({"pinnedDecisions": state.pinned_decisions}, 201)


@bp.delete("/api/chat/pins/<n>")
def delete_pin(n: str) -> tuple[Response, int]:
    """Unpin the ``n``-th pinned decision (1-based).  200 ``{"pinnedDecisions"}``."""
    state = _change("unpin", lambda state: (_without(state.pins, n, "pin"), None))
    return guarded_json({"pinnedDecisions": state.pinned_decisions}, 200)


@bp.post("/api/chat/notes/<n>/pin")
def promote_note(n: str) -> tuple[Response, int]:
    """Make the ``n``-th model note (1-based) the person's pinned decision; the note leaves the notes.

    201 ``{"pinnedDecisions": [str], "modelNotes": [str]}``; 404 ``note_not_found``, 409 ``pin_limit``.
    """
    svc = services()
    state = _change("promote_note", lambda state: _promoted(state, n, svc.settings.limits, counter=svc.counter,
                                                            max_tokens=_pins_max_tokens()))
    return guarded_json({"pinnedDecisions": state.pinned_decisions, "modelNotes": list(state.notes)}, 201)


@bp.delete("/api/chat/notes/<n>")
def delete_note(n: str) -> tuple[Response, int]:
    """Remove the ``n``-th model note (1-based).  200 ``{"pinnedDecisions": [str], "modelNotes": [str]}``; 404."""
    state = _change("remove_note", lambda state: (list(state.pins), _without(state.notes, n, "note")))
    return guarded_json({"pinnedDecisions": state.pinned_decisions, "modelNotes": list(state.notes)}, 200)
