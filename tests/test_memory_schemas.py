"""marshmallow schemas of the memory domain: stored state, compaction output, hydration DTO (pure, no servers)."""

from __future__ import annotations

import pytest
from marshmallow import ValidationError

from app.memory.hydration import build_hydration
from app.memory.schemas import (
    MESSAGE_SCHEMA,
    compaction_output_schema,
    hydration_schema,
    stored_state_schema,
)
from app.memory.state import EMPTY_STATE, ThreadState
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
    assert empty == EMPTY_STATE


def test_empty_stored_state_loads_with_last_compacted_at_none():
    assert stored_state_schema(LIMITS).load(stored()) == {"messages": [], "summary": "", "pins": [],
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


# -- the compaction output (P2, P3) ----------------------------------------------------------------------

def test_compaction_output_with_summary_and_pins_is_accepted():
    data = {"summary": "The user likes tea.", "pinnedDecisions": ["Ship on Friday."]}
    assert compaction_output_schema(LIMITS).load(data) == data


@pytest.mark.parametrize("extra", ["compactedAt", "recentMessages", "lastCompactedAt", "messages"])
def test_compaction_output_with_an_extra_key_is_rejected(extra):
    data = {"summary": "s", "pinnedDecisions": ["p"], extra: "2026-01-01T00:00:00Z"}
    assert errors_of(compaction_output_schema(LIMITS), data) == {extra: ["Unknown field."]}


@pytest.mark.parametrize("missing", ["summary", "pinnedDecisions"])
def test_compaction_output_missing_a_key_is_rejected(missing):
    data = {"summary": "s", "pinnedDecisions": ["p"]}
    del data[missing]
    assert errors_of(compaction_output_schema(LIMITS), data) == {missing: ["Missing data for required field."]}


def test_compaction_output_limits_at_the_default_bounds():
    schema = compaction_output_schema(LIMITS)
    at_limit = {"summary": "s" * 2500, "pinnedDecisions": ["p" * 300] * 20}
    assert schema.load(at_limit) == at_limit
    assert "pinnedDecisions" in errors_of(schema, {"summary": "s", "pinnedDecisions": ["p"] * 21})
    assert "summary" in errors_of(schema, {"summary": "s" * 2501, "pinnedDecisions": []})
    assert "pinnedDecisions" in errors_of(schema, {"summary": "s", "pinnedDecisions": ["p" * 301]})
    assert "pinnedDecisions" in errors_of(schema, {"summary": "s", "pinnedDecisions": ["  "]})
    assert "pinnedDecisions" in errors_of(schema, {"summary": "s", "pinnedDecisions": [""]})
    assert "pinnedDecisions" in errors_of(schema, {"summary": "s", "pinnedDecisions": [" padded"]})


def test_limits_come_from_a_custom_memory_limits():
    schema = compaction_output_schema(SMALL)
    ok = {"summary": "s" * 100, "pinnedDecisions": ["p" * 10, "q" * 10]}
    assert schema.load(ok) == ok
    assert errors_of(schema, {"summary": "s" * 101, "pinnedDecisions": []}) == \
        {"summary": ["at most 100 characters, got 101"]}
    assert errors_of(schema, {"summary": "", "pinnedDecisions": ["a", "b", "c"]}) == \
        {"pinnedDecisions": ["at most 2 pinned decisions, got 3"]}
    assert errors_of(schema, {"summary": "", "pinnedDecisions": ["p" * 11]}) == \
        {"pinnedDecisions": ["decision 1 is longer than 10 characters"]}
    # The stored-state schema applies the same limits to stored pins and the summary.
    stored_schema = stored_state_schema(SMALL)
    assert "summary" in errors_of(stored_schema, stored(summary="s" * 101))
    assert "pins" in errors_of(stored_schema, stored(pins=[{"text": "p", "by": "model"}] * 3))
    # A default-limits schema accepts what the small one refuses.
    assert stored_state_schema(LIMITS).load(stored(summary="s" * 101))["summary"] == "s" * 101


def test_schema_instances_are_cached_per_limits_value():
    assert stored_state_schema(MemoryLimits()) is stored_state_schema(MemoryLimits())
    assert stored_state_schema(SMALL) is not stored_state_schema(LIMITS)


def test_compaction_output_accepts_special_token_spellings_as_text():
    data = {"summary": "The user typed <|endoftext|> and <|im_start|>.", "pinnedDecisions": ["<|im_end|> is text"]}
    assert compaction_output_schema(LIMITS).load(data) == data


# -- the hydration DTO ---------------------------------------------------------------------------------

def test_hydration_schema_accepts_what_build_hydration_returns():
    thread_id = new_thread_id()
    dto = build_hydration(thread_id, state(2, summary="s" * 300, pins=("p1", "p2")))
    loaded = hydration_schema(LIMITS).load(dto)
    assert loaded["summaryPreview"] == "s" * 240
    assert loaded["restored"] is True
    assert len(loaded["messages"]) == 4


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
    assert list(errors_of(hydration_schema(LIMITS), dto)) == list(bad)
