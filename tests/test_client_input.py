"""What a client sends, checked by the marshmallow schemas of app.chat.client_input, app.chat.frames and
app.web.bodies: the first problem in field order, its code and sentence; unknown keys ignored."""

from __future__ import annotations

import pytest

from app.chat.client_input import ClientRefused, Refusal, load_client
from app.chat.frames import load_client_frame
from app.web.bodies import FEEDBACK_BODY, PHRASE_QUERY, forget_body, pin_body

OTHERWISE = Refusal("bad_request", "Send a JSON object.")


def refusal(schema, body):
    with pytest.raises(ClientRefused) as caught:
        load_client(schema, body, OTHERWISE)
    return caught.value.code, caught.value.message


def test_a_message_frame_loads_its_text_and_id_and_ignores_other_keys():
    assert load_client_frame({"type": "message", "text": " hi ", "id": "m_1", "sentAt": 3}, 100) == {
        "text": " hi ", "id": "m_1"}
    assert load_client_frame({"type": "message", "text": "hi", "id": None}, 100) == {"text": "hi", "id": None}
    assert load_client_frame({"text": "  " + "x" * 10 + "  "}, 10)["text"] == "  " + "x" * 10 + "  "  # limit once trimmed


@pytest.mark.parametrize("frame, code", [
    ({"text": 42, "id": "bad id"}, "empty_input"),  # the text is checked before the id
    ({"text": "\x00", "id": "bad id"}, "empty_input"),  # NUL and zero-width characters alone are blank
    ({"text": "\x00\u200b \u2060", "id": "bad id"}, "empty_input"),
    ({"text": "a\x00", "id": "bad id"}, "invalid_text"),
    ({"text": "x" * 11}, "input_too_long"),
    ({"text": "ok", "id": 7}, "invalid_id"),
])
def test_a_message_frame_refusal_is_the_first_problem(frame, code):
    with pytest.raises(ClientRefused) as caught:
        load_client_frame(frame, 10)
    assert caught.value.code == code


def test_a_pin_body_is_text_or_message_id():
    schema = pin_body(20)
    assert load_client(schema, {"text": "  ship \n on   Friday ", "client": "x"}, OTHERWISE) == {
        "text": "ship on Friday"}
    assert load_client(schema, {"text": None, "messageId": "m_1"}, OTHERWISE) == {"messageId": "m_1"}
    assert refusal(schema, {"text": 5, "messageId": "m_1"}) == ("bad_request", 'Send either "text" or "messageId".')
    assert refusal(schema, {"text": "x" * 21}) == ("pin_too_long",
                                                  "A pin can be at most 20 characters (this one has 21).")
    assert refusal(schema, {"text": "a\udc00"})[0] == "invalid_text"


def test_a_feedback_body_trims_its_reason_and_checks_fields_in_order():
    assert load_client(FEEDBACK_BODY, {"messageId": "m_1", "rating": "up", "reason": "   "}, OTHERWISE) == {
        "messageId": "m_1", "rating": "up", "reason": None}
    assert load_client(FEEDBACK_BODY, {"messageId": "m_1", "rating": "down", "reason": " wrong date "},
                       OTHERWISE)["reason"] == "wrong date"
    assert refusal(FEEDBACK_BODY, {"rating": "meh", "reason": 5}) == ("bad_request", "That message id is not valid.")
    assert refusal(FEEDBACK_BODY, {"messageId": "m_1", "reason": 5}) == ("bad_request",
                                                                          'The rating must be "up" or "down".')
    assert refusal(FEEDBACK_BODY, {"messageId": "m_1", "rating": "up", "reason": " " + "y" * 501})[0] == (
        "reason_too_long")
    assert load_client(FEEDBACK_BODY, {"messageId": "m_1", "rating": "up", "reason": " " + "y" * 500 + " "},
                       OTHERWISE)["reason"] == "y" * 500


def test_a_forget_body_loads_its_turns_and_phrase_and_ignores_other_keys():
    schema = forget_body(3, "hint")
    assert load_client(schema, {"turns": [3, 1, 3], "phrase": " zebra ", "why": "old"}, OTHERWISE) == {
        "turns": [1, 3], "phrase": "zebra"}
    assert load_client(schema, {"turns": [2]}, OTHERWISE) == {"turns": [2], "phrase": None}
    assert refusal(schema, {"turns": [1, 2, 3, 4]}) == ("bad_request", "hint")
    assert refusal(schema, {"turns": [1], "phrase": "\u200b\x00"})[0] == "bad_request"
    assert refusal(PHRASE_QUERY, {"phrase": "\ufeff"})[0] == "bad_request"
    assert load_client(PHRASE_QUERY, {"phrase": " ｚｅｂｒａ "}, OTHERWISE) == {"phrase": "ｚｅｂｒａ"}
