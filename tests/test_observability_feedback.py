"""Feedback on assistant messages, stored with that turn's token accounting."""

from __future__ import annotations

import json

import pytest

from app.memory.hydration import find_forbidden_key
from app.observability.feedback import MAX_FEEDBACK, load_feedback
from app.store.keys import ThreadKeys
from chat_support.fake_llm import Reply
from chat_support.live_app import ChatClient
from tests.fixtures.memory_data import text_record


def feedback(client: ChatClient, **body):
    return client.http.post(client.server.url + "/api/chat/feedback", json=body, timeout=10)


def stats(client: ChatClient) -> dict:
    return client.http.get(client.server.url + "/api/chat/stats", timeout=10).json()


def test_thumbs_down_is_stored_with_the_turns_accounting(chat, fake_llm, redis_client, app_settings):
    fake_llm.default = Reply(text="Your flight is on Tuesday.", usage=(100, 7))
    frames = chat.turn("When is my flight? I said Monday.", message_id="u-flight")
    answer_id = frames[0]["messageId"]
    thread_id = chat.thread()["threadId"]

    response = feedback(chat, messageId=answer_id, rating="down", reason="  forgot something I said  ")
    assert response.status_code == 201
    assert response.json() == {"messageId": answer_id, "rating": "down"}

    [entry] = load_feedback(redis_client, thread_id)
    [turn] = stats(chat)["turns"]
    assert entry["messageId"] == answer_id and entry["rating"] == "down"
    assert entry["reason"] == "forgot something I said"
    assert entry["at"].endswith("Z")
    assert entry["turn"] == {"status": "completed", "promptTokens": turn["promptTokens"],
                             "sections": turn["sections"], "completionTokens": 7, "budget": 7168,
                             "firstTokenMs": turn["firstTokenMs"]}
    assert sum(entry["turn"]["sections"].values()) == entry["turn"]["promptTokens"]
    key = ThreadKeys(thread_id).feedback
    assert 0 < redis_client.ttl(key) <= app_settings.memory_ttl_seconds


def test_a_second_rating_of_the_same_message_replaces_the_first(chat, fake_llm, redis_client):
    fake_llm.default = lambda body: Reply(text=f"answer to {body['messages'][-1]['content']}")
    first = chat.turn("one")[0]["messageId"]
    second = chat.turn("two")[0]["messageId"]
    thread_id = chat.thread()["threadId"]
    assert feedback(chat, messageId=first, rating="up").status_code == 201
    assert feedback(chat, messageId=second, rating="down").status_code == 201
    assert feedback(chat, messageId=second, rating="down", reason="incorrect").status_code == 201
    assert feedback(chat, messageId=first, rating="down").status_code == 201
    entries = load_feedback(redis_client, thread_id)
    assert [(e["messageId"], e["rating"], e.get("reason")) for e in entries] == [
        (first, "down", None), (second, "down", "incorrect")]


def test_feedback_list_is_capped(chat, fake_llm, redis_client):
    fake_llm.default = Reply(text="ok")
    answer_id = chat.turn("hello")[0]["messageId"]
    thread_id = chat.thread()["threadId"]
    key = ThreadKeys(thread_id).feedback
    redis_client.lpush(key, *[json.dumps({"messageId": f"m_old{i}", "rating": "up"}) for i in range(MAX_FEEDBACK)])
    assert feedback(chat, messageId=answer_id, rating="up").status_code == 201
    assert redis_client.llen(key) == MAX_FEEDBACK
    assert json.loads(redis_client.lindex(key, 0))["messageId"] == answer_id


@pytest.mark.parametrize("body, status, code", [
    ({"rating": "down"}, 400, "bad_request"),
    ({"messageId": "m_x", "rating": "meh"}, 400, "bad_request"),
    ({"messageId": "m_x", "rating": "up", "reason": 5}, 400, "bad_request"),
    ({"messageId": "m_x", "rating": "down", "reason": "x" * 501}, 400, "reason_too_long"),
    ({"messageId": "m_0123456789abcdef0123456789abcdef", "rating": "up"}, 404, "unknown_message"),
])
def test_feedback_refusals(web, body, status, code):
    response = web.post("/api/chat/feedback", json=body)
    assert response.status_code == status
    assert response.get_json()["error"]["code"] == code
    assert response.get_json()["error"]["message"]


def test_feedback_only_on_an_assistant_message_of_the_callers_thread(live_app, chat, fake_llm, redis_client):
    fake_llm.default = Reply(text="the private answer")
    frames = chat.turn("a private question", message_id="u-private")
    answer_id = frames[0]["messageId"]
    assert feedback(chat, messageId="u-private", rating="up").status_code == 404  # a user message
    other = ChatClient(live_app)
    response = feedback(other, messageId=answer_id, rating="down", reason="forgot something I said")
    assert response.status_code == 404
    assert response.json() == {"error": {"code": "unknown_message",
                                         "message": "There is no such answer in this conversation."}}
    assert "private" not in response.text and find_forbidden_key(response.json()) is None
    assert load_feedback(redis_client, chat.thread()["threadId"]) == []
    assert load_feedback(redis_client, other.thread()["threadId"]) == []


def test_reason_of_exactly_500_characters_is_kept(chat, fake_llm, redis_client):
    fake_llm.default = Reply(text="ok")
    answer_id = chat.turn("hello")[0]["messageId"]
    assert feedback(chat, messageId=answer_id, rating="down", reason="y" * 500).status_code == 201
    assert load_feedback(redis_client, chat.thread()["threadId"])[0]["reason"] == "y" * 500


def test_feedback_on_a_folded_answer_still_counts(chat, fake_llm, store, redis_client):
    fake_llm.default = Reply(text="an answer that will be folded")
    answer_id = chat.turn("question to fold")[0]["messageId"]
    thread_id = chat.thread()["threadId"]
    state = store.load(thread_id)
    assert store.apply_compaction(thread_id, expected_gen=state.gen, folded_ids=[m.id for m in state.messages],
                                  record=text_record("A question was asked."), notes=[],
                                  compacted_at="2026-11-30T12:00:00.000Z").outcome == "applied"
    assert feedback(chat, messageId=answer_id, rating="up").status_code == 201
    assert load_feedback(redis_client, thread_id)[0]["turn"]["status"] == "completed"
