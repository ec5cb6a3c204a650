"""No observability endpoint (stats, inspector, feedback, pins, metrics) returns another session's data or any forbidden key (contract: HTTP)."""

from __future__ import annotations

import json

from app.memory.hydration import find_forbidden_key
from chat_support.fake_llm import Reply
from chat_support.live_app import ChatClient

SECRET_USER = "alice's passport number is X1234567"
SECRET_ANSWER = "I noted the passport number X1234567."
SECRET_PIN = "Alice flies to Oslo on the 14th"


def every_endpoint(client: ChatClient, foreign_message_ids: list[str]) -> list:
    """Call each observability endpoint as ``client``; returns the responses."""
    base = client.server.url
    http = client.http
    responses = [
        http.get(base + "/api/chat/stats", timeout=10),
        http.get(base + "/api/chat/inspector", timeout=10),
        http.post(base + "/api/chat/pins", json={"text": "bob's own pin"}, timeout=10),
        http.delete(base + "/api/chat/pins/2", timeout=10),
        http.get(base + "/metrics", timeout=10),
    ]
    for message_id in foreign_message_ids:
        responses.append(http.post(base + "/api/chat/pins", json={"messageId": message_id}, timeout=10))
        responses.append(http.post(base + "/api/chat/feedback", json={"messageId": message_id, "rating": "down",
                                                                      "reason": "forgot"}, timeout=10))
    return responses


def test_no_endpoint_returns_another_sessions_data_or_a_forbidden_key(live_app, fake_llm):
    alice = ChatClient(live_app).connect()
    fake_llm.default = Reply(text=SECRET_ANSWER)
    frames = alice.turn(SECRET_USER, message_id="u-alice-1")
    answer_id = frames[0]["messageId"]
    alice.close()
    alice_thread = alice.thread()["threadId"]
    base = live_app.url
    assert alice.http.post(base + "/api/chat/pins", json={"text": SECRET_PIN}, timeout=10).status_code == 201
    assert alice.http.post(base + "/api/chat/feedback", json={"messageId": answer_id, "rating": "up"},
                           timeout=10).status_code == 201
    alice_inspector = alice.http.get(base + "/api/chat/inspector", timeout=10).json()
    assert any(m["text"] == SECRET_USER for m in alice_inspector["messages"])  # Alice sees her own texts

    bob = ChatClient(live_app)
    bob.thread()
    responses = every_endpoint(bob, [answer_id, "u-alice-1"])
    statuses = [r.status_code for r in responses]
    assert statuses == [200, 200, 201, 404, 200, 404, 404, 404, 404]
    for response in responses:
        for secret in (SECRET_USER, SECRET_ANSWER, SECRET_PIN, "X1234567", alice_thread, alice_thread[5:],
                       answer_id, "u-alice-1"):
            assert secret not in response.text, (response.request.method, response.url, secret)
        if response.headers["Content-Type"].startswith("application/json"):
            assert find_forbidden_key(response.json()) is None
    stats, inspector = responses[0].json(), responses[1].json()
    assert stats["turns"] == [] and stats["compactions"] == []
    assert inspector == {"turn": None, "messages": []}
    assert responses[2].json() == {"pinnedDecisions": ["bob's own pin"]}

    # Alice's thread is untouched by Bob's calls
    assert alice.thread()["pinnedDecisions"] == [SECRET_PIN]
    alice_stats = alice.http.get(base + "/api/chat/stats", timeout=10).json()
    assert [t["messageId"] for t in alice_stats["turns"]] == [answer_id]
    for body in (alice_stats, alice_inspector):
        assert find_forbidden_key(body) is None


def test_a_tampered_cookie_gets_a_fresh_empty_thread(live_app, chat, fake_llm):
    fake_llm.default = Reply(text=SECRET_ANSWER)
    assert chat.turn(SECRET_USER)[-1]["status"] == "completed"
    forged = ChatClient(live_app)
    name, value = next((c.name, c.value) for c in chat.http.cookies)
    forged.http.cookies.set(name, value[:-4] + ("AAAA" if not value.endswith("AAAA") else "BBBB"))
    for path in ("/api/chat/stats", "/api/chat/inspector"):
        response = forged.http.get(live_app.url + path, timeout=10)
        assert response.status_code == 200
        assert SECRET_USER not in response.text and SECRET_ANSWER not in response.text
        body = response.json()
        assert body.get("turns", []) == [] and body.get("messages", []) == []


def test_stats_and_inspector_carry_no_forbidden_key_after_every_kind_of_turn(chat, fake_llm, store):
    fake_llm.default = Reply(text="fine")
    assert chat.turn("completed turn")[-1]["status"] == "completed"
    fake_llm.default = Reply(status=400)
    assert chat.turn("failed turn")[-1]["status"] == "failed"
    base = chat.server.url
    for path in ("/api/chat/stats", "/api/chat/inspector"):
        body = chat.http.get(base + path, timeout=10).json()
        assert find_forbidden_key(body) is None
        assert "toolCall" not in json.dumps(body) and "rawPrompt" not in json.dumps(body)
