"""``GET``/``DELETE /api/chat/thread`` and ``/healthz`` over Flask's test client, against a real Redis."""

from __future__ import annotations

import json
import re

import pytest
import redis

from app import create_app
from app.memory.final_turn import FinalTurn
from app.memory.hydration import find_forbidden_key
from app.memory.record import PERSON, Record, RecordLine
from app.memory.state import Pin
from app.store.keys import ThreadKeys
from app.web.responses import guarded_json
from tests.fixtures.memory_data import CREATED, state, text_record, write_raw_state

THREAD_RE = re.compile(r"^chat:[a-f0-9]{64}$")


@pytest.fixture
def app(settings):
    return create_app(settings)


@pytest.fixture
def client(app):
    return app.test_client()


def hydrate(client) -> dict:
    response = client.get("/api/chat/thread")
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    return response.get_json()


def test_new_session_gets_exactly_the_empty_dto(client):
    body = hydrate(client)
    assert THREAD_RE.match(body["threadId"])
    assert body == {"threadId": body["threadId"], "messages": [], "pinnedDecisions": [], "restored": False}


def test_stored_turns_are_returned_in_order_with_exactly_four_keys(client, store):
    thread_id = hydrate(client)["threadId"]
    first = store.commit_final_turn(thread_id, FinalTurn("hi", "hello", user_id="c1", assistant_id="m1"))
    store.commit_final_turn(thread_id, FinalTurn("中文 😀", "好的", user_id="c2", assistant_id="m2"))
    body = hydrate(client)
    created = first.messages[0].created_at
    assert body["restored"] is True
    assert body["messages"][:2] == [
        {"id": "c1", "role": "user", "text": "hi", "createdAt": created},
        {"id": "m1", "role": "assistant", "text": "hello", "createdAt": created},
    ]
    assert [m["text"] for m in body["messages"]] == ["hi", "hello", "中文 😀", "好的"]
    assert all(set(m) == {"id", "role", "text", "createdAt"} for m in body["messages"])
    assert "summaryPreview" not in body


def test_summary_preview_is_the_first_240_characters_and_pins_are_texts(client, redis_client):
    thread_id = hydrate(client)["threadId"]
    record = Record(1, 2, (RecordLine(PERSON, "S" * 200 + "T" * 500, 1), RecordLine(PERSON, "Ok.", 2)))
    summary = record.render()
    write_raw_state(redis_client, thread_id, state(1, pins=("use tabs", "ship Friday"), last_compacted_at=CREATED))
    redis_client.hset(ThreadKeys(thread_id).state, "summary", record.to_stored())
    body = hydrate(client)
    assert body["summaryPreview"] == summary[:240] and body["summaryPreview"].endswith("S" * 185)
    assert body["summary"] == summary  # the whole record, for the page's "Earlier in this conversation"
    assert body["record"] == record.to_dict()  # the same record as data
    assert body["pinnedDecisions"] == ["use tabs", "ship Friday"]
    assert set(body) == {"threadId", "messages", "summaryPreview", "summary", "record", "pinnedDecisions",
                         "restored", "earliestKeptTurn"}
    # a summary an earlier version stored as text reads the same
    redis_client.hset(ThreadKeys(thread_id).state, "summary", summary)
    assert hydrate(client) == body


def test_thread_holding_only_pins_is_restored(client, store):
    thread_id = hydrate(client)["threadId"]
    store.set_pins(thread_id, expected_gen=0, pins=[Pin("remember me", "person")])
    body = hydrate(client)
    assert (body["messages"], body["pinnedDecisions"], body["restored"]) == ([], ["remember me"], True)


def test_delete_empties_the_thread(client, store):
    thread_id = hydrate(client)["threadId"]
    store.commit_final_turn(thread_id, FinalTurn("hi", "hello"))
    store.set_pins(thread_id, expected_gen=0, pins=[Pin("p")])
    response = client.delete("/api/chat/thread")
    assert (response.status_code, response.get_data()) == (204, b"")
    assert hydrate(client) == {"threadId": thread_id, "messages": [], "pinnedDecisions": [], "restored": False}


def test_compaction_running_during_delete_cannot_bring_anything_back(client, store):
    thread_id = hydrate(client)["threadId"]
    for i in range(6):
        store.commit_final_turn(thread_id, FinalTurn(f"U{i}", f"A{i}"))
    seen = store.load(thread_id)
    assert client.delete("/api/chat/thread").status_code == 204
    result = store.apply_compaction(thread_id, expected_gen=seen.gen, folded_ids=[m.id for m in seen.messages[:4]],
                                    record=text_record("resurrected"), notes=["resurrected"], compacted_at=CREATED)
    assert result.outcome == "stale"
    assert hydrate(client)["restored"] is False


def test_delete_only_touches_the_callers_thread(app, store):
    alice, bob = app.test_client(), app.test_client()
    alice_thread = hydrate(alice)["threadId"]
    store.commit_final_turn(alice_thread, FinalTurn("hi", "hello"))
    assert bob.delete("/api/chat/thread").status_code == 204
    assert [m["text"] for m in hydrate(alice)["messages"]] == ["hi", "hello"]


# -- degraded reads (P16) ---------------------------------------------------------------------------------

def redis_error_text(redis_client, key: str) -> str:
    try:
        redis_client.hgetall(key)
    except redis.RedisError as exc:
        return str(exc)
    raise AssertionError("expected a Redis error")


def assert_nothing_leaks(raw_body: str, *fragments: str):
    for fragment in fragments:
        assert fragment not in raw_body


def test_wrong_type_at_the_thread_key_gives_the_empty_dto_without_the_error_text(client, redis_client):
    thread_id = hydrate(client)["threadId"]
    key = ThreadKeys(thread_id).state
    redis_client.set(key, "x")
    error = redis_error_text(redis_client, key)
    assert "WRONGTYPE" in error
    response = client.get("/api/chat/thread")
    raw = response.get_data(as_text=True)
    assert response.status_code == 200
    assert response.get_json() == {"threadId": thread_id, "messages": [], "pinnedDecisions": [], "restored": False}
    assert_nothing_leaks(raw, error, "WRONGTYPE", "wrong kind", "HGETALL", "hgetall", key, "mem:{", "Error")


def test_corrupt_stored_state_gives_the_empty_dto_without_its_content(client, redis_client):
    thread_id = hydrate(client)["threadId"]
    key = ThreadKeys(thread_id).state
    bad = [{"id": "u1", "role": "user", "text": "leaky secret", "createdAt": CREATED, "toolArgs": "sk-123"}]
    redis_client.hset(key, mapping={"v": 1, "gen": 0, "messages": json.dumps(bad), "summary": "", "pins": "[]"})
    response = client.get("/api/chat/thread")
    raw = response.get_data(as_text=True)
    assert response.status_code == 200
    assert response.get_json() == {"threadId": thread_id, "messages": [], "pinnedDecisions": [], "restored": False}
    assert_nothing_leaks(raw, "leaky secret", "toolArgs", "sk-123", "Unknown field")


# -- the forbidden-key guard on responses ------------------------------------------------------------------

def test_response_with_a_forbidden_key_is_a_generic_500_without_the_data(app):
    with app.test_request_context("/api/chat/thread"):
        response, status = guarded_json({"threadId": "chat:" + "0" * 64,
                                         "messages": [{"id": "u1", "rawCheckpoint": {"secret": "graph-state-42"}}]})
    raw = response.get_data(as_text=True)
    assert status == 500
    assert json.loads(raw) == {"error": {"code": "internal", "message": "Something went wrong."}}
    assert_nothing_leaks(raw, "graph-state-42", "rawCheckpoint", "secret")


def test_guarded_response_without_forbidden_keys_is_passed_through(app):
    payload = {"threadId": "chat:" + "0" * 64, "messages": [{"text": "my tasklist and runtimeArtifact"}]}
    with app.test_request_context("/"):
        response, status = guarded_json(payload)
    assert (status, response.get_json()) == (200, payload)


def test_no_response_of_the_api_carries_a_forbidden_key(client, store):
    thread_id = hydrate(client)["threadId"]
    store.commit_final_turn(thread_id, FinalTurn("tasklist source toolCall", "sessionId stack"))
    for response in (client.get("/api/chat/thread"), client.get("/healthz"), client.get("/nope"),
                     client.post("/api/chat/thread")):
        assert find_forbidden_key(response.get_json()) is None


# -- health ------------------------------------------------------------------------------------------------

def test_healthz_is_ok_when_the_store_and_the_model_answer(settings, fake_llm):
    response = create_app(settings.with_overrides(openai_base_url=fake_llm.url)).test_client().get("/healthz")
    assert (response.status_code, response.get_json()) == (200, {"status": "ok", "store": "up", "model": "up"})


def test_healthz_is_degraded_when_the_model_endpoint_is_down(client):
    response = client.get("/healthz")  # the test settings' model endpoint, 127.0.0.1:9, refuses connections
    assert (response.status_code, response.get_json()) == (503, {"status": "degraded", "store": "up",
                                                                 "model": "down"})


def test_unsupported_method_is_a_json_405(client):
    response = client.put("/api/chat/thread")
    assert (response.status_code, response.get_json()["error"]["code"]) == (405, "method_not_allowed")
