"""Bad input over the live websocket: a clear error frame, the connection stays usable, memory is unchanged."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.memory_data import CHINESE, ENGLISH, text_of_chars

ANSWER = "Hello from the fake model."


@pytest.fixture
def primed(chat):
    """The chat after one completed turn, and the thread as it was then."""
    assert chat.turn("remember this")[-1]["status"] == "completed"
    return chat, chat.thread()


def expect_error(chat, frame, code: str) -> dict:
    chat.send(frame)
    reply = chat.recv()
    assert (reply["type"], reply["code"]) == ("error", code)
    assert reply["message"] and "Traceback" not in reply["message"] and "Error" not in reply["message"]
    return reply


def assert_still_usable(chat, before: dict):
    assert chat.thread() == before
    frames = chat.turn("still there?")
    assert frames[-1]["status"] == "completed"
    after = chat.thread()
    assert [m["text"] for m in after["messages"]] == [m["text"] for m in before["messages"]] + ["still there?", ANSWER]


def test_text_over_max_input_chars_is_refused_as_input_too_long(primed, fake_llm):
    chat, before = primed
    calls = len(fake_llm.chat_requests())
    reply = expect_error(chat, {"type": "message", "text": "x" * 12001}, "input_too_long")
    assert "12000" in reply["message"]
    assert len(fake_llm.chat_requests()) == calls  # the model was never asked
    assert_still_usable(chat, before)


def test_text_of_exactly_max_input_chars_is_accepted_and_stored(primed):
    chat, before = primed
    text = text_of_chars(ENGLISH, 12000)
    assert chat.turn(text)[-1]["status"] == "completed"
    assert chat.thread()["messages"][-2]["text"] == text


def test_text_that_fits_the_characters_but_not_the_token_budget_is_refused(primed, fake_llm):
    chat, before = primed
    calls = len(fake_llm.chat_requests())
    text = text_of_chars(CHINESE, 11000)  # under 12000 characters, over 7168 tokens
    expect_error(chat, json.dumps({"type": "message", "text": text}, ensure_ascii=False), "input_too_long")
    assert len(fake_llm.chat_requests()) == calls
    assert_still_usable(chat, before)


@pytest.mark.parametrize("char", ["中", "😀"])
def test_ascii_escaped_json_of_a_text_within_the_limit_gets_an_answer_not_a_closed_socket(primed, char):
    # json.dumps escapes every non-ASCII character (6 bytes, 12 for a non-BMP one): 12000 of them are
    # still a text within MAX_INPUT_CHARS, so the frame is parsed (here: too many tokens), never cut off.
    chat, before = primed
    frame = json.dumps({"type": "message", "text": char * 12000})
    assert len(frame) > 4 * 12000 + 1024
    expect_error(chat, frame, "input_too_long")
    assert_still_usable(chat, before)


NON_STRING_OR_BLANK = [42, 4.2, True, ["hi"], {"text": "hi"}, None, "", "   \n\t"]


def test_non_string_blank_or_missing_text_is_refused(primed):
    chat, before = primed
    for text in NON_STRING_OR_BLANK:
        expect_error(chat, {"type": "message", "text": text}, "empty_input")
    expect_error(chat, {"type": "message"}, "empty_input")
    assert_still_usable(chat, before)


def test_unknown_or_missing_frame_type_is_refused(primed):
    chat, before = primed
    for frame in ({"type": "shout", "text": "hi"}, {"text": "hi"}, {"type": 7}):
        expect_error(chat, frame, "unknown_type")
    assert_still_usable(chat, before)


def test_invalid_client_message_id_is_refused(primed):
    chat, before = primed
    for client_id in (42, "has space", "x" * 129, "", "../etc", ["a"]):
        expect_error(chat, {"type": "message", "id": client_id, "text": "hi"}, "invalid_id")
    assert_still_usable(chat, before)


def test_unknown_keys_in_a_frame_never_reach_memory(primed):
    chat, before = primed
    chat.send({"type": "message", "text": "with extras", "source": "tool", "turnId": "t-1",
               "toolArgs": {"x": 1}, "messages": [{"role": "user", "text": "injected history"}]})
    frames = chat.recv_until(lambda f: f["type"] == "done")
    assert frames[-1]["status"] == "completed"
    after = chat.thread()
    assert [m["text"] for m in after["messages"]][-2:] == ["with extras", ANSWER]
    assert all(set(m) == {"id", "role", "text", "createdAt"} for m in after["messages"])
    assert "injected history" not in str(after)


def test_padded_text_is_stored_trimmed(primed):
    chat, _ = primed
    assert chat.turn("   padded text \n ")[-1]["status"] == "completed"
    assert chat.thread()["messages"][-2]["text"] == "padded text"
