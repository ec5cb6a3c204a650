"""The hydration DTO and the forbidden-key guard (pure, no servers)."""

from __future__ import annotations

import re

import pytest

from app.memory.hydration import (
    FORBIDDEN_KEYS,
    ForbiddenKeyError,
    assert_no_forbidden_keys,
    build_hydration,
    empty_hydration,
    find_forbidden_key,
    normalize_key,
)
from app.memory.record import ABOUT, PERSON, Record, RecordLine
from app.memory.state import Pin, ThreadState
from tests.fixtures.memory_data import CREATED, new_thread_id, state

CONTRACT_FORBIDDEN = (
    "apiKey checkpoint cookie deliveryChain displayKind graphState mcpEnvelope providerConfig providerResponse "
    "rawCheckpoint rawPrompt resourceContent runtimeArtifact sessionId source stack subagentInvocation "
    "subagentResult toolArgs toolCall toolMessage toolResult turnId tasklist workflowProgress"
).split()


def test_forbidden_keys_are_exactly_the_contracts():
    assert sorted(FORBIDDEN_KEYS) == sorted(CONTRACT_FORBIDDEN)


def test_empty_thread_hydrates_to_exactly_the_empty_dto():
    thread_id = new_thread_id()
    expected = {"threadId": thread_id, "messages": [], "pinnedDecisions": [], "restored": False}
    assert build_hydration(thread_id, ThreadState()) == expected
    assert empty_hydration(thread_id) == expected


def test_dto_carries_messages_pin_texts_the_record_as_text_and_data_and_a_240_character_summary_preview():
    thread_id = new_thread_id()
    record = Record(1, 3, (RecordLine(ABOUT, "Plans."), RecordLine(PERSON, "x" * 147 + "yz", 1, 3),
                           RecordLine(PERSON, "Moved to Tuesday.", 3)))
    st = ThreadState(messages=state(1).messages, record=record,
                     pins=(Pin("use tabs", "person"), Pin("ship Friday", "model")))
    dto = build_hydration(thread_id, st)
    summary = ("Statements kept from earlier turns:\n- About: Plans.\n- Person (turn 1) [replaced by turn 3]: "
               + "x" * 147 + "yz\n- Person (turn 3): Moved to Tuesday.\n(turns 1–3 of this conversation)")
    assert summary[:240].endswith("x" * 147 + "y")
    assert dto == {
        "threadId": thread_id,
        "messages": [{"id": "u1", "role": "user", "text": "U1", "createdAt": CREATED},
                     {"id": "a1", "role": "assistant", "text": "A1", "createdAt": CREATED}],
        "pinnedDecisions": ["use tabs", "ship Friday"],
        "restored": True,
        "summaryPreview": summary[:240],
        "summary": summary,
        "record": {"firstTurn": 1, "lastTurn": 3, "lines": [
            {"kind": "about", "text": "Plans.", "turn": None, "replacedBy": None},
            {"kind": "person", "text": "x" * 147 + "yz", "turn": 1, "replacedBy": 3},
            {"kind": "person", "text": "Moved to Tuesday.", "turn": 3, "replacedBy": None}]},
    }


def test_thread_with_only_pins_or_only_a_summary_is_restored():
    assert build_hydration(new_thread_id(), state(0, pins=("p",)))["restored"] is True
    assert build_hydration(new_thread_id(), state(0, summary="s"))["restored"] is True


def test_restored_can_be_forced_false_for_a_degraded_read():
    assert build_hydration(new_thread_id(), state(1), restored=False)["restored"] is False


# -- the forbidden-key guard -------------------------------------------------------------------------------

def dto_with(**extra) -> dict:
    dto = build_hydration(new_thread_id(), state(1))
    dto.update(extra)
    return dto


def test_forbidden_key_in_a_message_is_rejected_and_named():
    dto = dto_with()
    dto["messages"][0]["rawCheckpoint"] = {"step": 3}
    with pytest.raises(ForbiddenKeyError) as info:
        assert_no_forbidden_keys(dto)
    assert info.value.path == "$.messages[0].rawCheckpoint"
    assert "rawCheckpoint" in str(info.value)


def test_forbidden_top_level_key_is_rejected():
    with pytest.raises(ForbiddenKeyError) as info:
        assert_no_forbidden_keys(dto_with(workflowProgress={"done": 1}))
    assert info.value.path == "$.workflowProgress"


def test_forbidden_key_nested_deep_in_lists_is_rejected():
    dto = dto_with(extra=[{"a": [[{"b": {"displayKind": "card"}}]]}])
    assert find_forbidden_key(dto) == "$.extra[0].a[0][0].b.displayKind"


@pytest.mark.parametrize("spelling", ["raw_checkpoint", "RAW-CHECKPOINT", "RawCheckpoint", "tool_call", "SOURCE",
                                      "session-id", "Task_List", "api_key", "TURN_ID"])
def test_forbidden_keys_match_ignoring_case_underscores_and_hyphens(spelling):
    assert find_forbidden_key({"messages": [{spelling: 1}]}) == f"$.messages[0].{spelling}"


@pytest.mark.parametrize("allowed", ["sources", "stacked", "toolbox", "text", "checkpoints", "id"])
def test_keys_that_merely_resemble_forbidden_ones_are_allowed(allowed):
    assert find_forbidden_key({allowed: 1}) is None


def test_values_are_never_inspected():
    dto = dto_with()
    dto["messages"][0]["text"] = "my tasklist has a runtimeArtifact and a rawCheckpoint"
    dto["pinnedDecisions"] = ["source", "toolCall", "sessionId"]
    assert_no_forbidden_keys(dto)
    assert find_forbidden_key(dto) is None


def test_normalize_key_lowercases_and_drops_underscores_and_hyphens():
    assert normalize_key("Raw_Check-point") == "rawcheckpoint"


def test_guard_checks_keys_of_tuples_and_non_string_keys():
    assert find_forbidden_key(({"x": 1}, ({"toolResult": 2},))) == "$[1][0].toolResult"
    assert find_forbidden_key({1: {"ok": True}}) is None


def test_every_built_dto_passes_the_guard():
    dto = build_hydration(new_thread_id(), state(4, summary="s" * 3000, pins=("a", "b")))
    assert find_forbidden_key(dto) is None
    assert re.fullmatch(r"chat:[a-f0-9]{64}", dto["threadId"])
