"""Every error of the web layer has one JSON shape, ``{"error": {"code", "message"}}``, without exception text.

Flask's test client against the app on the test Redis: no socket is involved.
"""

from __future__ import annotations

import pytest

from app import create_app
from app.web.responses import ApiError


@pytest.fixture
def app(settings):
    app = create_app(settings)

    @app.get("/boom")
    def boom():
        raise RuntimeError("secret-internal-detail at /srv/app.py line 42")

    @app.get("/refused")
    def refused():
        raise ApiError(409, "conflict", "Memory was changing at that moment; please try again.")

    return app


def error_of(response) -> dict:
    assert response.mimetype == "application/json"
    return response.get_json()


def test_flasks_own_http_errors_answer_the_json_shape(app):
    client = app.test_client()
    missing = client.get("/nope")
    assert (missing.status_code, error_of(missing)) == (404, {"error": {"code": "not_found", "message": "Not found."}})

    wrong_method = client.post("/api/chat/thread")
    assert (wrong_method.status_code, error_of(wrong_method)) == (
        405, {"error": {"code": "method_not_allowed", "message": "Method not allowed."}})
    assert {m.strip() for m in wrong_method.headers["Allow"].split(",")} >= {"GET", "DELETE"}

    too_large = client.post("/api/chat/pins", data="x" * (65 * 1024), content_type="application/json")
    assert (too_large.status_code, error_of(too_large)) == (
        413, {"error": {"code": "too_large", "message": "The request is too large."}})


def test_an_unhandled_exception_is_a_500_without_its_text(app):
    response = app.test_client().get("/boom")
    assert (response.status_code, error_of(response)) == (
        500, {"error": {"code": "internal", "message": "Something went wrong."}})
    assert "secret-internal-detail" not in response.get_data(as_text=True)


def test_an_api_error_raised_anywhere_is_answered_as_given(app):
    response = app.test_client().get("/refused")
    assert (response.status_code, error_of(response)) == (
        409, {"error": {"code": "conflict", "message": "Memory was changing at that moment; please try again."}})


@pytest.mark.parametrize("origin", [None, "https://evil.example"])
def test_a_websocket_handshake_from_another_origin_is_a_json_403(app, origin):
    headers = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    if origin:
        headers["Origin"] = origin
    response = app.test_client().get("/ws/chat", headers=headers)
    assert (response.status_code, error_of(response)) == (
        403, {"error": {"code": "forbidden", "message": "Not allowed from another site."}})


# -- one contract on every route (docs/contract.md: HTTP) -----------------------------------------------------

def _thread_with_a_turn(app, store):
    from app.memory.final_turn import FinalTurn

    client = app.test_client()
    thread_id = client.get("/api/chat/thread").get_json()["threadId"]
    store.commit_final_turn(thread_id, FinalTurn("My locker code is zebrafinch.", "Noted."))
    return client, thread_id


CORRUPT_READS = [("GET", "/api/chat/inspector", None), ("GET", "/api/chat/turns/1", None),
                 ("DELETE", "/api/chat/turns/1", None), ("GET", "/api/chat/forget?phrase=zebrafinch", None),
                 ("POST", "/api/chat/forget", {"turns": [1], "phrase": "zebrafinch"}),
                 ("POST", "/api/chat/pins", {"text": "Use Postgres"}), ("GET", "/api/chat/export", None)]


@pytest.mark.parametrize("method, path, body", CORRUPT_READS)
def test_a_corrupt_thread_is_409_memory_unreadable_on_every_route(app, store, method, path, body):
    from app.store.keys import ThreadKeys

    client, thread_id = _thread_with_a_turn(app, store)
    store.redis.hset(ThreadKeys(thread_id).state, "summary", "x" * 40000)  # over its limit: unreadable
    response = client.open(path, method=method, json=body)
    assert response.status_code == 409 and error_of(response)["error"]["code"] == "memory_unreadable"


def test_keys_a_route_does_not_read_are_ignored_on_every_body(app, store):
    client, thread_id = _thread_with_a_turn(app, store)
    pinned = client.post("/api/chat/pins", json={"text": "Use Postgres", "colour": "red"})
    assert pinned.status_code == 201 and pinned.get_json()["pinnedDecisions"] == ["Use Postgres"]
    answer_id = store.load(thread_id).messages[1].id
    rated = client.post("/api/chat/feedback", json={"messageId": answer_id, "rating": "up", "extra": [1]})
    assert rated.status_code == 201
    forgotten = client.post("/api/chat/forget", json={"turns": [1], "phrase": "zebrafinch", "reason": "old"})
    assert forgotten.status_code == 200 and [f["turn"] for f in forgotten.get_json()["forgotten"]] == [1]
    assert store.load(thread_id).forgotten_turns == (1,)


@pytest.mark.parametrize("phrase", ["\x00", "\u200b", "\x00\u200b\u2060", " \ufeff ", "\u3000", ""])
def test_a_phrase_of_nul_and_zero_width_characters_is_blank(app, store, phrase):
    client, thread_id = _thread_with_a_turn(app, store)
    preview = client.get("/api/chat/forget", query_string={"phrase": phrase})
    assert preview.status_code == 400 and error_of(preview)["error"]["code"] == "bad_request"
    forget = client.post("/api/chat/forget", json={"turns": [1], "phrase": phrase})
    assert forget.status_code == 400 and error_of(forget)["error"]["code"] == "bad_request"
    assert len(store.load(thread_id).messages) == 2  # nothing lost


def test_a_forget_body_is_refused_with_its_first_problem(app, store):
    client, thread_id = _thread_with_a_turn(app, store)
    for body in ({"turns": "1"}, {"turns": []}, {"turns": [True]}, {"turns": [0]}, {"turns": [1.5]},
                 {"turns": list(range(1, 52))}, {"phrase": "x"}, {"turns": [1], "phrase": "x" * 201}, [1]):
        refused = client.post("/api/chat/forget", json=body)
        assert refused.status_code == 400 and error_of(refused)["error"]["code"] == "bad_request", body
    nul = client.post("/api/chat/forget", json={"turns": [1], "phrase": "zebra\x00finch"})
    assert error_of(nul)["error"]["code"] == "invalid_text"
    assert len(store.load(thread_id).messages) == 2
