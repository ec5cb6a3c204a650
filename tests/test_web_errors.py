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
