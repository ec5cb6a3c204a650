"""Reading a thread's stored hash into a ``ThreadState`` (docs/contract.md: ThreadState; ``app.store.keys``:
``mem:{hex}``), with this process's caches of the parts already checked.

``parse_state`` checks every part with the stored-state schema; a part already checked in this process (a
message; the record with the pins, notes and ``lastCompactedAt``) is not checked again, so a turn validates only
what changed since its last read.  Those two caches hold text of threads: ``drop_texts`` drops it (after a forget;
``app.extensions.ThreadCaches.drop_thread`` is the one caller).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import TypeAlias

from marshmallow import ValidationError

from app.memory import migration
from app.memory.cache import bytes_cached
from app.memory.limits import MemoryLimits
from app.memory.record import Record
from app.memory.schemas import MESSAGE_SCHEMA, stored_state_schema
from app.memory.state import PINNED_BY_PERSON, Pin, ThreadMessage, ThreadState
from app.store.errors import CorruptState

_Meta: TypeAlias = "tuple[Record, tuple[Pin, ...], tuple[str, ...], str | None]"
"""A stored hash's record, person's pins, notes and ``lastCompactedAt``."""

# A counter field (``v``, ``gen``, ``clr``): a non-negative decimal integer, as HINCRBY writes it.
_COUNTER_RE = re.compile(r"\A[0-9]{1,12}\Z")


def counter(raw: dict, name: str) -> int:
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


def forgotten_turns(value: str | bytes | None) -> tuple[int, ...]:
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


def dumps(value: object) -> str:
    """``value`` as the store writes JSON fields: compact, non-ASCII characters as they are."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


_MESSAGE_FIELDS = frozenset(("id", "role", "text", "createdAt"))


def _checked_message(data: object) -> ThreadMessage:
    """A stored message checked with ``MessageSchema`` (exactly four fields; docs/contract.md: ThreadState)."""
    if not isinstance(data, dict) or data.keys() != _MESSAGE_FIELDS:
        raise ValueError("a stored message must have exactly id, role, text and createdAt")
    return _checked_message_values(data["id"], data["role"], data["text"], data["createdAt"])


@bytes_cached(32 * 1024 * 1024, 128 * 1024)  # docs/benchmarks.md: Performance (each process's memory)
def _checked_message_values(id_: str, role: str, text: str, created_at: str) -> ThreadMessage:
    MESSAGE_SCHEMA.load({"id": id_, "role": role, "text": text, "createdAt": created_at})
    return ThreadMessage(id_, role, text, created_at)


@bytes_cached(16 * 1024 * 1024, 256 * 1024)
def _checked_meta(limits: MemoryLimits, summary: str, pins_json: str, notes_json: str, last: str | None) -> _Meta:
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


def _meta(limits: MemoryLimits, summary: str, pins_json: str, notes_json: str, last: str | None) -> _Meta:
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


def parse_state(raw: dict, limits: MemoryLimits, *, validate: bool = True) -> ThreadState:
    """Build a ThreadState from an HGETALL answer (``{}`` gives the empty state).

    With ``validate`` every part is checked with the stored-state schema (``limits``), each part once per
    process (module docstring).  The counters ``v``, ``gen``, ``clr``, ``ft`` and ``fg`` must be non-negative
    integers, ``fgt`` a list of turn numbers and ``messages`` a JSON list, whatever ``validate`` says.

    Raises:
        CorruptState: the hash does not satisfy the stored-state schema.
    """
    if not raw:
        return ThreadState()
    try:
        version, gen, cleared = counter(raw, "v"), counter(raw, "gen"), counter(raw, "clr")
        folded = counter(raw, "ft")
        forgets = counter(raw, "fg")
        forgotten = forgotten_turns(raw.get("fgt"))
        messages = json.loads(raw.get("messages") or "[]")
        if not isinstance(messages, list):
            raise ValueError("messages is not a list")
        meta = (limits, raw.get("summary", ""), raw.get("pins") or "[]", raw.get("notes") or "[]",
                raw.get("lastCompactedAt"))
        if validate:
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


def drop_texts(texts: Iterable[str]) -> None:
    """Drop the checked messages holding any of ``texts``, and every checked record, pins and notes (their
    cache is keyed by whole fields, not by thread); each is checked again on its next read."""
    gone = set(texts)
    if gone:
        _checked_message_values.cache.discard_where(lambda key: len(key) > 2 and key[2] in gone)
    _checked_meta.cache_clear()


def cached_texts() -> list[str]:
    """Every message text and stored record, pins and notes field the caches hold now (for tests and checks:
    what a forget must have dropped)."""
    held = [key[2] for key in _checked_message_values.cache.keys() if len(key) > 2]
    for key in _checked_meta.cache.keys():
        held.extend(part for part in key[1:] if isinstance(part, str))
    return held
