"""marshmallow 4 schemas: the stored state.

Unknown keys are rejected everywhere (marshmallow's ``RAISE``), so a message
with an extra key such as ``source`` or ``turnId`` never passes
(docs/contract.md: ThreadState).  Limits come from ``MemoryLimits``; build schemas with the functions at the
bottom, which cache one instance per limits value.
"""

from __future__ import annotations

import re
from datetime import datetime
from functools import lru_cache
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

from app.memory.limits import MemoryLimits
from app.memory.state import PINNED_BY_MODEL, PINNED_BY_PERSON, ROLES

THREAD_ID_RE = re.compile(r"^chat:[a-f0-9]{64}$")
MESSAGE_ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
SUMMARY_PREVIEW_CHARS = 240


def _trimmed_non_empty(value: str) -> None:
    if not value.strip():
        raise ValidationError("must not be blank")
    if value != value.strip():
        raise ValidationError("must be trimmed")


def _iso_utc(value: str) -> None:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValidationError("must be an ISO 8601 timestamp") from None
    offset = parsed.utcoffset()
    if offset is None or offset.total_seconds() != 0:
        raise ValidationError("must be in UTC")


class _Strict(Schema):
    class Meta:
        unknown = RAISE


class MessageSchema(_Strict):
    """A stored message: exactly ``{id, role, text, createdAt}`` (docs/contract.md: ThreadState)."""

    id = fields.String(required=True, validate=validate.Regexp(MESSAGE_ID_RE))
    role = fields.String(required=True, validate=validate.OneOf(ROLES))
    text = fields.String(required=True, validate=_trimmed_non_empty)
    createdAt = fields.String(required=True, validate=_iso_utc)


class _Limited(_Strict):
    """A schema whose limits are given at construction (marshmallow 4 has no ``context``)."""

    def __init__(self, *, summary_max_chars: int, pinned_max: int, pinned_max_chars: int, **kwargs: Any) -> None:
        self.summary_max_chars = summary_max_chars
        self.pinned_max = pinned_max
        self.pinned_max_chars = pinned_max_chars
        super().__init__(**kwargs)

    def _check_summary(self, summary: str | None, errors: dict) -> None:
        if summary is not None and len(summary) > self.summary_max_chars:
            errors["summary"] = [f"at most {self.summary_max_chars} characters, got {len(summary)}"]

    def _check_pin_texts(self, texts: list[str], errors: dict, key: str) -> None:
        problems = []
        if len(texts) > self.pinned_max:
            problems.append(f"at most {self.pinned_max} pinned decisions, got {len(texts)}")
        for i, text in enumerate(texts):
            if not text.strip():
                problems.append(f"decision {i + 1} is blank")
            elif text != text.strip():
                problems.append(f"decision {i + 1} must be trimmed")
            elif len(text) > self.pinned_max_chars:
                problems.append(f"decision {i + 1} is longer than {self.pinned_max_chars} characters")
        if problems:
            errors[key] = problems


class PinSchema(_Strict):
    """A stored pin: ``{text, by}`` with ``by`` in ``person``/``model``."""

    text = fields.String(required=True)
    by = fields.String(required=True, validate=validate.OneOf((PINNED_BY_PERSON, PINNED_BY_MODEL)))


class StoredStateSchema(_Limited):
    """The decoded thread hash: ``{messages, summary, pins, notes, lastCompactedAt}``.

    ``pins`` may hold, besides the person's pins, model pins written before notes existed
    (they are read as notes), so the pin count is checked against ``pinned_max`` plus
    ``notes_max``.
    """

    messages = fields.List(fields.Nested(MessageSchema), required=True)
    summary = fields.String(required=True)
    pins = fields.List(fields.Nested(PinSchema), required=True)
    notes = fields.List(fields.String(), load_default=list)
    lastCompactedAt = fields.String(load_default=None, allow_none=True, validate=_iso_utc)

    def __init__(self, *, notes_max: int = 8, note_max_chars: int = 200, **kwargs: Any) -> None:
        self.notes_max = notes_max
        self.note_max_chars = note_max_chars
        super().__init__(**kwargs)

    @validates_schema
    def _limits(self, data: dict[str, Any], **kwargs: Any) -> None:
        errors: dict = {}
        self._check_summary(data.get("summary"), errors)
        person = [p["text"] for p in data.get("pins", []) if p["by"] == PINNED_BY_PERSON]
        self._check_pin_texts(person, errors, "pins")
        notes = list(data.get("notes", [])) + [p["text"] for p in data.get("pins", []) if p["by"] != PINNED_BY_PERSON]
        problems = []
        for i, text in enumerate(notes):
            if not text.strip() or text != text.strip():
                problems.append(f"note {i + 1} must be trimmed and not blank")
            elif len(text) > max(self.note_max_chars, self.pinned_max_chars):
                problems.append(f"note {i + 1} is longer than {self.note_max_chars} characters")
        if len(data.get("notes", [])) > self.notes_max:
            problems.append(f"at most {self.notes_max} notes, got {len(data['notes'])}")
        if problems:
            errors["notes"] = problems
        if errors:
            raise ValidationError(errors)


def _limit_kwargs(limits: MemoryLimits) -> dict:
    return {"summary_max_chars": limits.summary_max_chars, "pinned_max": limits.pinned_max,
            "pinned_max_chars": limits.pinned_max_chars}


@lru_cache(maxsize=16)
def stored_state_schema(limits: MemoryLimits) -> StoredStateSchema:
    """Return the stored-state schema for ``limits``."""
    return StoredStateSchema(notes_max=limits.notes_max, note_max_chars=limits.note_max_chars,
                             **_limit_kwargs(limits))


MESSAGE_SCHEMA = MessageSchema()
