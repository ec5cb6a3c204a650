"""Browser identity: the signed session cookie and the HMAC thread id (contract: Identity; P15)."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import re

import pytest

from app import create_app
from app.identity import SESSION_KEY, thread_id_for
from app.memory.final_turn import FinalTurn
from chat_support.live_app import ChatClient

THREAD_RE = re.compile(r"^chat:[a-f0-9]{64}$")


@pytest.fixture
def app(settings):
    return create_app(settings)


def session_of(app, cookie_value: str) -> dict:
    """Decode a ``chat_session`` cookie with the app's own key."""
    return app.session_interface.get_signing_serializer(app).loads(cookie_value)


def sign_session(app, data: dict) -> str:
    return app.session_interface.get_signing_serializer(app).dumps(data)


def first_visit(client):
    response = client.get("/api/chat/thread")
    assert response.status_code == 200
    return response


# -- the thread id (P15) ---------------------------------------------------------------------------------

def test_same_session_id_always_gives_the_same_thread_id():
    sid = "ab" * 32
    assert thread_id_for("k" * 64, sid) == thread_id_for("k" * 64, sid)


def test_thread_id_is_chat_plus_the_hex_hmac_sha256_of_the_session_id():
    secret, sid = "k" * 64, "0123456789abcdef" * 4
    thread_id = thread_id_for(secret, sid)
    assert THREAD_RE.match(thread_id)
    assert thread_id == "chat:" + hmac.new(secret.encode(), sid.encode(), hashlib.sha256).hexdigest()
    assert sid not in thread_id


def test_thread_id_depends_on_the_secret_and_the_session():
    assert thread_id_for("a" * 64, "s" * 64) != thread_id_for("b" * 64, "s" * 64)
    assert thread_id_for("a" * 64, "s" * 64) != thread_id_for("a" * 64, "t" * 64)


# -- the cookie -----------------------------------------------------------------------------------------

def test_session_cookie_is_httponly_samesite_lax_and_not_secure_over_http(app):
    response = first_visit(app.test_client())
    (set_cookie,) = response.headers.getlist("Set-Cookie")
    parts = [p.strip() for p in set_cookie.split(";")]
    assert parts[0].startswith("chat_session=")
    assert "HttpOnly" in parts
    assert "SameSite=Lax" in parts
    assert "Secure" not in parts


def test_session_cookie_is_secure_in_production(settings):
    prod = create_app(settings.with_overrides(env="production"))
    set_cookie = first_visit(prod.test_client()).headers["Set-Cookie"]
    assert "Secure" in [p.strip() for p in set_cookie.split(";")]


def test_session_holds_a_random_id_of_at_least_128_bits(app):
    client = app.test_client()
    first_visit(client)
    data = session_of(app, client.get_cookie("chat_session").value)
    sid = data[SESSION_KEY]
    assert re.fullmatch(r"[a-f0-9]{64}", sid)
    assert len(sid) * 4 >= 128
    other = app.test_client()
    first_visit(other)
    assert session_of(app, other.get_cookie("chat_session").value)[SESSION_KEY] != sid


def test_thread_id_returned_is_the_hmac_of_the_session_and_never_the_session_id(app, settings):
    client = app.test_client()
    body = first_visit(client).get_data(as_text=True)
    sid = session_of(app, client.get_cookie("chat_session").value)[SESSION_KEY]
    assert json.loads(body)["threadId"] == thread_id_for(settings.secret_key, sid)
    assert sid not in body


def test_same_cookie_keeps_the_same_thread(app):
    client = app.test_client()
    first = first_visit(client).get_json()["threadId"]
    assert first_visit(client).get_json()["threadId"] == first
    assert first_visit(client).get_json()["threadId"] == first


def test_two_sessions_never_see_each_others_thread(app, store):
    alice, bob = app.test_client(), app.test_client()
    alice_thread = first_visit(alice).get_json()["threadId"]
    bob_thread = first_visit(bob).get_json()["threadId"]
    assert alice_thread != bob_thread
    store.commit_final_turn(alice_thread, FinalTurn("alice's secret", "noted"))
    assert first_visit(bob).get_json()["messages"] == []
    assert bob.delete("/api/chat/thread").status_code == 204
    assert [m["text"] for m in first_visit(alice).get_json()["messages"]] == ["alice's secret", "noted"]


# -- tampered, foreign and malformed cookies -----------------------------------------------------------------

def victim_with_a_thread(app, store):
    client = app.test_client()
    thread_id = first_visit(client).get_json()["threadId"]
    store.commit_final_turn(thread_id, FinalTurn("victim text", "victim answer"))
    sid = session_of(app, client.get_cookie("chat_session").value)[SESSION_KEY]
    return thread_id, sid


def assert_fresh_session(response, victim_thread):
    body = response.get_json()
    assert response.status_code == 200
    assert body["threadId"] != victim_thread
    assert THREAD_RE.match(body["threadId"])
    assert (body["messages"], body["restored"]) == ([], False)
    assert "chat_session=" in response.headers["Set-Cookie"]


def test_cookie_signed_with_another_key_gets_a_fresh_session(app, settings, store):
    victim_thread, victim_sid = victim_with_a_thread(app, store)
    forger = create_app(settings.with_overrides(secret_key="f" * 64))
    forged = sign_session(forger, {SESSION_KEY: victim_sid})
    attacker = app.test_client()
    attacker.set_cookie("chat_session", forged)
    assert_fresh_session(attacker.get("/api/chat/thread"), victim_thread)
    assert attacker.delete("/api/chat/thread").status_code == 204
    assert [m.text for m in store.load(victim_thread).messages] == ["victim text", "victim answer"]


def test_tampered_cookie_gets_a_fresh_session(app, store):
    victim_thread, _ = victim_with_a_thread(app, store)
    attacker = app.test_client()
    first_visit(attacker)
    value = attacker.get_cookie("chat_session").value
    attacker.set_cookie("chat_session", value[:-2] + ("AA" if value[-2:] != "AA" else "BB"))
    assert_fresh_session(attacker.get("/api/chat/thread"), victim_thread)


@pytest.mark.parametrize("payload", [{SESSION_KEY: "abc"}, {SESSION_KEY: 42}, {SESSION_KEY: ["a" * 64]},
                                     {SESSION_KEY: "A" * 64}, {"other": "x"}, {}])
def test_validly_signed_cookie_with_a_malformed_session_id_gets_a_fresh_session(app, settings, store, payload):
    victim_thread, _ = victim_with_a_thread(app, store)
    client = app.test_client()
    client.set_cookie("chat_session", sign_session(app, payload))
    response = client.get("/api/chat/thread")
    assert_fresh_session(response, victim_thread)
    if isinstance(payload.get(SESSION_KEY), str):
        assert response.get_json()["threadId"] != thread_id_for(settings.secret_key, payload[SESSION_KEY])


@pytest.mark.parametrize("garbage", ["", "garbage", "!!!!", "a.b.c", "e30.e30.e30", "\xff\xfe\x80\x81", "é" * 50])
def test_garbage_cookie_gets_a_fresh_session(app, store, garbage):
    victim_thread, _ = victim_with_a_thread(app, store)
    response = app.test_client().get("/api/chat/thread", headers={"Cookie": f"chat_session={garbage}"})
    assert_fresh_session(response, victim_thread)


def test_invalid_utf8_bytes_in_the_cookie_over_real_http_get_a_fresh_session(live_app, store):
    victim = ChatClient(live_app)
    victim_thread = victim.thread()["threadId"]
    store.commit_final_turn(victim_thread, FinalTurn("victim text", "victim answer"))
    conn = http.client.HTTPConnection("127.0.0.1", live_app.port, timeout=10)
    conn.putrequest("GET", "/api/chat/thread")
    conn.putheader("Cookie", b"chat_session=\xff\xfe\xc3\x28\x80; other=\xe2\x82")
    conn.endheaders()
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    assert response.status == 200
    assert body["threadId"] != victim_thread and THREAD_RE.match(body["threadId"])
    assert (body["messages"], body["restored"]) == ([], False)
    assert "chat_session=" in response.getheader("Set-Cookie")
    assert [m["text"] for m in victim.thread()["messages"]] == ["victim text", "victim answer"]


def test_two_browsers_on_the_websocket_each_remember_only_their_own_turns(live_app, fake_llm):
    alice, bob = ChatClient(live_app).connect(), ChatClient(live_app).connect()
    try:
        fake_llm.default = "noted"
        assert alice.turn("alice: my PIN is 1234")[-1]["status"] == "completed"
        assert bob.turn("bob: what is alice's PIN?")[-1]["status"] == "completed"
        assert [m["content"] for m in fake_llm.last_request().messages[1:]] == ["bob: what is alice's PIN?"]
        assert [m["text"] for m in alice.thread()["messages"]] == ["alice: my PIN is 1234", "noted"]
        assert [m["text"] for m in bob.thread()["messages"]] == ["bob: what is alice's PIN?", "noted"]
        assert alice.thread()["threadId"] != bob.thread()["threadId"]
    finally:
        alice.close()
        bob.close()
