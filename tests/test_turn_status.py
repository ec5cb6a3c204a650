"""The one list of turn statuses: which write memory and what ``done`` says (docs/memory.md: "A turn")."""

from __future__ import annotations

import json

import pytest

from app.memory.final_turn import FinalTurn, TurnRejected, prepare_final_turn
from app.memory.state import ThreadState
from app.memory.status import TurnStatus, writes_memory
from app.observability.inspector import NOTE_FOLDED, NOTE_NOT_KEPT, resolve_prompt
from app.store.keys import ThreadKeys
from chat_support.fake_llm import Reply
from tests.fixtures.memory_data import text_record

TABLE = [  # status, writes memory, done status
    ("completed", True, "completed"), ("final", True, "completed"), ("blocked", True, "blocked"),
    ("paused", False, "paused"), ("failed", False, "failed"), ("cancelled", False, "cancelled"),
    ("interrupted", False, "interrupted"),
]


@pytest.mark.parametrize("value, written, done", TABLE)
def test_each_status_says_whether_it_writes_memory_and_what_done_says(value, written, done):
    status = TurnStatus(value)
    assert (status.writes_memory, status.done_status) == (written, done)
    assert writes_memory(value) is written
    # the members are the plain strings of frames, run records and accounting records
    assert status == value and json.dumps({"status": status}) == json.dumps({"status": value})
    if written:
        assert prepare_final_turn(FinalTurn("hi", "hello", value))[1].text == "hello"
    else:
        with pytest.raises(TurnRejected) as info:
            prepare_final_turn(FinalTurn("hi", "hello", value))
        assert info.value.reason == "not_final"


def test_the_statuses_are_exactly_these():
    assert [s.value for s in TurnStatus] == [row[0] for row in TABLE]
    for unknown in (None, "", "done", "COMPLETED", 3, ["final"]):
        assert writes_memory(unknown) is False
        assert TurnStatus.parse(unknown) is None


def test_feedback_on_a_folded_answer_whose_turn_ended_final_still_counts(chat, fake_llm, store, redis_client):
    """A turn recorded ``final`` wrote memory: feedback on its answer is taken after the answer was folded."""
    fake_llm.default = Reply(text="The task list is done.")
    answer_id = chat.turn("plan my week")[0]["messageId"]
    thread_id = chat.thread()["threadId"]
    stats_key = ThreadKeys(thread_id).stats
    record = json.loads(redis_client.lindex(stats_key, 0))
    assert record["messageId"] == answer_id
    redis_client.lset(stats_key, 0, json.dumps({**record, "status": "final"}))
    state = store.load(thread_id)
    assert store.apply_compaction(thread_id, expected_gen=state.gen, folded_ids=[m.id for m in state.messages],
                                  record=text_record("A task list ran."), notes=[],
                                  compacted_at="2026-11-30T12:00:00.000Z").outcome == "applied"
    response = chat.http.post(chat.server.url + "/api/chat/feedback", json={"messageId": answer_id, "rating": "up"},
                              timeout=10)
    assert response.status_code == 201
    assert response.json() == {"messageId": answer_id, "rating": "up"}


@pytest.mark.parametrize("status, note", [("final", NOTE_FOLDED), ("completed", NOTE_FOLDED), ("blocked", NOTE_FOLDED),
                                          ("cancelled", NOTE_NOT_KEPT), ("paused", NOTE_NOT_KEPT)])
def test_the_inspector_says_a_folded_input_was_kept_exactly_when_its_turn_wrote_memory(status, note):
    record = {"status": status, "prompt": [{"origin": "input", "role": "user", "tokens": 4, "ref": "u-gone"}]}
    state = ThreadState(record=text_record("Earlier turns were folded."))
    assert resolve_prompt(record, state, "system") == [
        {"origin": "input", "role": "user", "tokens": 4, "text": None, "note": note}]
