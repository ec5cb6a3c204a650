"""marshmallow schemas of the memory domain: stored state, compaction output, hydration DTO (pure, no servers)."""

from __future__ import annotations

import pytest
from marshmallow import RAISE, Schema, ValidationError, fields, validate

from app.memory.hydration import build_hydration
from app.memory.schemas import (
    MESSAGE_SCHEMA,
    SUMMARY_PREVIEW_CHARS,
    THREAD_ID_RE,
    MessageSchema,
    stored_state_schema,
)
from app.memory.state import ThreadState
from app.settings import MemoryLimits
from tests.fixtures.memory_data import CREATED, new_thread_id, state

LIMITS = MemoryLimits()
SMALL = MemoryLimits(summary_max_chars=100, pinned_max=2, pinned_max_chars=10)


def stored(messages=None, summary="", pins=None, **extra) -> dict:
    data = {"messages": messages if messages is not None else [], "summary": summary,
            "pins": pins if pins is not None else []}
    data.update(extra)
    return data


def msg(**overrides) -> dict:
    data = {"id": "u1", "role": "user", "text": "hi", "createdAt": CREATED}
    data.update(overrides)
    return data


def errors_of(schema, data) -> dict:
    with pytest.raises(ValidationError) as info:
        schema.load(data)
    return info.value.messages


# -- the empty state -------------------------------------------------------------------------------

def test_empty_state_has_no_messages_no_pins_empty_summary_and_no_last_compacted_at():
    empty = ThreadState()
    assert (empty.messages, empty.pins, empty.summary, empty.last_compacted_at) == ((), (), "", None)
    assert empty.pinned_decisions == []
    assert empty.is_empty is True
    assert (empty.version, empty.gen) == (0, 0)


def test_empty_stored_state_loads_with_last_compacted_at_none():
    assert stored_state_schema(LIMITS).load(stored()) == {"messages": [], "summary": "", "pins": [], "notes": [],
                                                           "lastCompactedAt": None}


# -- messages ----------------------------------------------------------------------------------------

def test_message_with_exactly_the_four_keys_is_accepted():
    assert MESSAGE_SCHEMA.load(msg()) == msg()


@pytest.mark.parametrize("extra", ["source", "displayKind", "turnId", "toolCall", "status"])
def test_message_with_an_extra_key_is_rejected_naming_the_key(extra):
    errors = errors_of(stored_state_schema(LIMITS), stored([msg(**{extra: "x"})]))
    assert errors == {"messages": {0: {extra: ["Unknown field."]}}}


@pytest.mark.parametrize("missing", ["id", "role", "text", "createdAt"])
def test_message_missing_a_key_is_rejected(missing):
    data = msg()
    del data[missing]
    assert errors_of(MESSAGE_SCHEMA, data) == {missing: ["Missing data for required field."]}


@pytest.mark.parametrize("field,value", [
    ("role", "system"),
    ("role", "tool"),
    ("text", ""),
    ("text", "   "),
    ("text", " padded "),
    ("id", "has space"),
    ("id", "x" * 129),
    ("id", ""),
    ("createdAt", "yesterday"),
    ("createdAt", "2026-01-02T03:04:05+02:00"),
    ("createdAt", "2026-01-02T03:04:05"),
    ("text", 42),
])
def test_message_with_an_invalid_value_is_rejected(field, value):
    assert list(errors_of(MESSAGE_SCHEMA, msg(**{field: value}))) == [field]


@pytest.mark.parametrize("created", ["2026-01-02T03:04:05Z", "2026-01-02T03:04:05.678Z", "2026-01-02T03:04:05+00:00"])
def test_message_timestamps_in_utc_are_accepted(created):
    assert MESSAGE_SCHEMA.load(msg(createdAt=created))["createdAt"] == created


def test_stored_state_with_an_unknown_top_level_key_is_rejected():
    assert errors_of(stored_state_schema(LIMITS), stored(recentMessages=[])) == {"recentMessages": ["Unknown field."]}


def test_stored_pin_needs_text_and_who_pinned_it():
    schema = stored_state_schema(LIMITS)
    assert schema.load(stored(pins=[{"text": "use tabs", "by": "person"}]))["pins"] == [{"text": "use tabs", "by": "person"}]
    assert errors_of(schema, stored(pins=[{"text": "use tabs", "by": "robot"}])) == {"pins": {0: {"by": ["Must be one of: person, model."]}}}
    assert errors_of(schema, stored(pins=[{"text": "use tabs", "by": "model", "source": "x"}])) == {"pins": {0: {"source": ["Unknown field."]}}}


# -- limits ---------------------------------------------------------------------------------------------

def test_limits_come_from_a_custom_memory_limits():
    # The stored-state schema applies the limits to the person's pins and the summary.
    stored_schema = stored_state_schema(SMALL)
    assert "summary" in errors_of(stored_schema, stored(summary="s" * 101))
    assert "pins" in errors_of(stored_schema, stored(pins=[{"text": "p", "by": "person"}] * 3))
    # Model pins of earlier versions are read as notes: their own cap applies.
    assert "notes" in errors_of(stored_schema, {**stored(), "notes": ["n"] * 9})
    # A default-limits schema accepts what the small one refuses.
    assert stored_state_schema(LIMITS).load(stored(summary="s" * 101))["summary"] == "s" * 101


def test_schema_instances_are_cached_per_limits_value():
    assert stored_state_schema(MemoryLimits()) is stored_state_schema(MemoryLimits())
    assert stored_state_schema(SMALL) is not stored_state_schema(LIMITS)


# -- the hydration DTO ---------------------------------------------------------------------------------


class RecordLineSchema(Schema):
    """A line of the DTO's ``record``."""

    class Meta:
        unknown = RAISE

    kind = fields.String(required=True, validate=validate.OneOf(("about", "asked", "person", "assistant", "told",
                                                                 "text")))
    text = fields.String(required=True)
    turn = fields.Integer(required=True, allow_none=True, validate=validate.Range(min=1))
    replacedBy = fields.Integer(required=True, allow_none=True, validate=validate.Range(min=1))


class RecordSchema(Schema):
    """The DTO's ``record``: the summary as data."""

    class Meta:
        unknown = RAISE

    firstTurn = fields.Integer(required=True, validate=validate.Range(min=0))
    lastTurn = fields.Integer(required=True, validate=validate.Range(min=0))
    lines = fields.List(fields.Nested(RecordLineSchema), required=True, validate=validate.Length(min=1))


class HydrationSchema(Schema):
    """The DTO of ``GET /api/chat/thread`` as ``docs/contract.md`` (HTTP) describes it."""

    class Meta:
        unknown = RAISE

    threadId = fields.String(required=True, validate=validate.Regexp(THREAD_ID_RE))
    messages = fields.List(fields.Nested(MessageSchema), required=True)
    archived = fields.List(fields.Nested(MessageSchema), validate=validate.Length(min=1))
    summaryPreview = fields.String(validate=validate.Length(min=1, max=SUMMARY_PREVIEW_CHARS))
    summary = fields.String(validate=validate.Length(min=1, max=LIMITS.summary_max_chars))
    record = fields.Nested(RecordSchema)
    pinnedDecisions = fields.List(fields.String(validate=validate.Length(min=1, max=LIMITS.pinned_max_chars)),
                                  required=True, validate=validate.Length(max=LIMITS.pinned_max))
    restored = fields.Boolean(required=True)
    earliestKeptTurn = fields.Integer(validate=validate.Range(min=1))


def test_hydration_schema_accepts_what_build_hydration_returns():
    thread_id = new_thread_id()
    dto = build_hydration(thread_id, state(2, summary="s" * 300, pins=("p1", "p2")))
    loaded = HydrationSchema().load(dto)
    assert loaded["summaryPreview"] == ("Statements kept from earlier turns:\n- " + "s" * 300)[:240]
    assert loaded["record"]["lines"] == [{"kind": "text", "text": "s" * 300, "turn": None, "replacedBy": None}]
    assert loaded["restored"] is True
    assert len(loaded["messages"]) == 4 and "archived" not in loaded


def test_hydration_schema_accepts_archived_turns():
    from app.memory.recall import ArchivedTurn

    folded = state(2)
    archived = [ArchivedTurn(1, folded.messages[:2]), ArchivedTurn(2, folded.messages[2:])]
    dto = build_hydration(new_thread_id(), state(1), archived=archived)
    loaded = HydrationSchema().load(dto)
    assert [m["id"] for m in loaded["archived"]] == [m.id for m in folded.messages]


@pytest.mark.parametrize("bad", [
    {"sessionId": "abc"},
    {"threadId": "chat:ABC"},
    {"threadId": "session-1"},
    {"summaryPreview": "s" * 241},
    {"summaryPreview": ""},
])
def test_hydration_schema_rejects_unknown_keys_bad_thread_ids_and_long_previews(bad):
    dto = build_hydration(new_thread_id(), state(1))
    dto.update(bad)
    assert list(errors_of(HydrationSchema(), dto)) == list(bad)
