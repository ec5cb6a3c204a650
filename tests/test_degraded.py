"""Degrade, never break: Redis down or silent, then back, without restarting the app."""

from __future__ import annotations

import json
import re
import time

import requests

from chat_support.live_app import ChatClient, answer_text
from tests.helpers.errors import assert_no_exception_text


def empty_dto(thread_id: str) -> dict:
    return {"threadId": thread_id, "messages": [], "pinnedDecisions": [], "restored": False}


def test_store_down_degrades_then_recovers_without_a_restart(own_redis, make_live_app, app_settings, fake_llm):
    fake_llm.default = "The fake model answers."
    live = make_live_app(app_settings.with_overrides(redis_url=own_redis.url, redis_socket_timeout=0.5))
    browser = ChatClient(live)
    thread_id = browser.thread()["threadId"]
    browser.connect()
    assert browser.turn("before the outage")[-1]["status"] == "completed"
    assert [m["text"] for m in browser.thread()["messages"]] == ["before the outage", "The fake model answers."]

    own_redis.stop()

    # Reads give the empty state, still 200.
    response = browser.http.get(live.url + "/api/chat/thread", timeout=10)
    assert response.status_code == 200
    assert response.json() == empty_dto(thread_id)
    assert_no_exception_text(response.text)

    # Health says degraded, without exception text.
    health = requests.get(live.url + "/healthz", timeout=10)
    assert health.status_code == 503
    assert health.json()["status"] == "degraded"
    assert health.json() == {"status": "degraded", "store": "down", "model": "up"}
    assert_no_exception_text(health.text)

    # A turn on the open socket still completes; it is simply not stored, and done says so.
    frames = browser.turn("during the outage")
    assert frames[0]["type"] == "start"
    assert frames[-1] == {"type": "done", "status": "completed", "messageId": frames[0]["messageId"],
                          "saved": False, "reason": "store_unavailable"}
    assert answer_text(frames) == "The fake model answers."
    assert_no_exception_text(json.dumps(frames))

    # A socket opened during the outage works too.
    late = ChatClient(live, session=browser.http).connect()
    assert late.turn("new socket during the outage")[-1]["status"] == "completed"
    late.close()

    # Clearing cannot be done: a clear 503 without exception text.
    cleared = browser.http.delete(live.url + "/api/chat/thread", timeout=10)
    assert cleared.status_code == 503
    assert cleared.json()["error"]["code"] == "store_unavailable"
    assert_no_exception_text(cleared.text)

    own_redis.start()  # same port, empty data (no persistence)

    assert requests.get(live.url + "/healthz", timeout=10).status_code == 200
    assert browser.turn("after the outage")[-1]["status"] == "completed"
    body = browser.thread()
    assert [m["text"] for m in body["messages"]] == ["after the outage", "The fake model answers."]
    assert body["restored"] is True
    assert body["threadId"] == thread_id
    browser.close()


def test_silent_store_times_out_into_the_degraded_answers(silent_redis_url, make_live_app, app_settings, fake_llm):
    live = make_live_app(app_settings.with_overrides(redis_url=silent_redis_url, redis_socket_timeout=0.3))
    browser = ChatClient(live)
    started = time.monotonic()
    response = browser.http.get(live.url + "/api/chat/thread", timeout=15)
    # One socket timeout, not one per retry layer (redis-py would retry the handshake and the command).
    assert time.monotonic() - started < 1.0
    assert response.status_code == 200
    body = response.json()
    assert re.fullmatch(r"chat:[a-f0-9]{64}", body["threadId"])
    assert body == empty_dto(body["threadId"])
    assert_no_exception_text(response.text)
    health = requests.get(live.url + "/healthz", timeout=15)
    assert (health.status_code, health.json()["status"]) == (503, "degraded")
    assert_no_exception_text(health.text)
    browser.connect()
    frames = browser.turn("is anyone there?", timeout=20)
    assert frames[-1]["status"] == "completed"
    assert answer_text(frames) == "Hello from the fake model."
    browser.close()


def test_store_restart_between_requests_is_invisible(own_redis, make_live_app, app_settings):
    live = make_live_app(app_settings.with_overrides(redis_url=own_redis.url))
    browser = ChatClient(live)
    thread_id = browser.thread()["threadId"]  # the pool now holds a connection to the old server
    assert requests.get(live.url + "/healthz", timeout=10).status_code == 200
    own_redis.stop()
    own_redis.start()
    # The first request meets the stale pooled connection and retries on a fresh one.
    health = requests.get(live.url + "/healthz", timeout=10)
    assert (health.status_code, health.json()["status"]) == (200, "ok")
    assert browser.thread() == empty_dto(thread_id)
    browser.connect()
    assert browser.turn("after a quick restart")[-1]["status"] == "completed"
    assert [m["text"] for m in browser.thread()["messages"]] == ["after a quick restart", "Hello from the fake model."]
    browser.close()
