"""The Procfile's ``web`` as deployed (gunicorn, gevent, ``--preload``, two workers, ``APP_ENV=production``) under
tampered state, bad input, foreign pages and a Redis that refuses writes (docs/contract.md: HTTP, WebSocket).

One web process group serves the whole module, on a Redis of its own (embedded Valkey started with
``maxmemory-policy noeviction``) and the fake model server; each test is its own visitor (session):

- a thread hash corrupted with ``HSET`` (``v`` / ``gen`` not numbers, ``messages`` not JSON) hydrates empty with
  ``restored: false`` and an ERROR line, a turn gets ``memory_unreadable`` (the socket stays usable, the model is
  not called), and "New chat" (``DELETE /api/chat/thread``) answers 204 and leaves a valid empty thread;
- text holding NUL or an unpaired surrogate answers 400 ``invalid_text`` (HTTP) or an ``invalid_text`` error frame,
  JSON nested 30,000 deep answers 400 and a 10,000-deep frame an ``invalid_json`` frame: no 500, nothing but JSON
  frames in the socket, nothing stored;
- every state-changing route, clear included, refuses a foreign ``Origin``, or without one a foreign ``Referer``;
- with Redis at ``maxmemory`` (noeviction) a turn streams and ends ``done`` ``completed`` with ``"saved": false,
  "reason": "store_unavailable"``, and ``/healthz`` says the store is ``degraded`` until writes work again.
"""

from __future__ import annotations

import json

import pytest
import redis
import requests
import websocket

from app.memory.state import thread_label
from app.store.keys import ThreadKeys
from chat_support.fake_llm import FakeLLM, Reply
from chat_support.live_app import answer_text
from tests.fixtures.deployed_web import Visitor

ANSWER = "Hello from the deployed web."
FOREIGN = "http://evil.example"


@pytest.fixture(scope="module")
def model():
    with FakeLLM() as llm:
        yield llm


@pytest.fixture(scope="module")
def deployed(model, procfile, tmp_path_factory):
    # HEALTH_WRITE_PROBE_SECONDS=0: a write probe on every /healthz, so the test sees each change at once
    with procfile.deployed_web(model, tmp_path_factory.mktemp("deployed-web"), HEALTH_WRITE_PROBE_SECONDS="0") as web:
        yield web


@pytest.fixture
def visitor(deployed):
    deployed.model.default = Reply(text=ANSWER)
    person = Visitor(deployed)
    yield person
    person.close()


def texts(thread: dict) -> list[str]:
    return [m["text"] for m in thread["messages"]]


# -- a corrupt thread --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [("v", "abc"), ("gen", "1.5"), ("clr", "-1"), ("messages", "[{broken"),
                                          ("messages", '{"not": "a list"}')],
                         ids=["v-not-a-number", "gen-not-an-integer", "clr-negative", "messages-not-json",
                              "messages-not-a-list"])
def test_a_corrupt_thread_hydrates_empty_refuses_turns_and_new_chat_repairs_it(deployed, visitor, field, value):
    chat = visitor.connect()
    assert chat.turn("first", timeout=30)[-1]["status"] == "completed"
    thread = visitor.thread()
    assert texts(thread) == ["first", ANSWER] and thread["restored"] is True
    key = ThreadKeys(thread["threadId"]).state
    deployed.redis.hset(key, field, value)
    calls = len(deployed.model.chat_requests())

    hydrated = visitor.thread()
    assert (hydrated["messages"], hydrated["restored"], hydrated["pinnedDecisions"]) == ([], False, [])
    assert f"ERROR app.store.thread_store: thread {thread_label(thread['threadId'])} is corrupt" in deployed.log_text()

    frames = chat.turn("second", timeout=30)
    assert [(f["type"], f.get("code")) for f in frames] == [("error", "memory_unreadable")]
    assert "new chat" in frames[0]["message"].lower()
    chat.send("not json")  # the handler is alive: the next frame gets its own answer
    assert chat.recv(timeout=30)["code"] == "invalid_json"
    assert len(deployed.model.chat_requests()) == calls
    pin = visitor.request("POST", "/api/chat/pins", json={"text": "keep it short"})
    assert (pin.status_code, pin.json()["error"]["code"]) == (409, "memory_unreadable")

    assert visitor.request("DELETE", "/api/chat/thread").status_code == 204
    raw = deployed.redis.hgetall(key)
    assert all(raw[name].isdigit() for name in ("v", "gen", "clr")) and raw["messages"] == "[]"
    assert visitor.thread()["messages"] == [] and "clear repaired the corrupt thread" in deployed.log_text()
    frames = chat.turn("after the new chat", timeout=30)
    assert frames[-1] == {"type": "done", "status": "completed", "messageId": frames[0]["messageId"], "turn": 1}
    assert texts(visitor.thread()) == ["after the new chat", ANSWER]


def test_a_state_key_of_another_type_is_corrupt_and_new_chat_replaces_it(deployed, visitor):
    tid = visitor.thread()["threadId"]
    deployed.redis.set(ThreadKeys(tid).state, "not a hash")
    assert visitor.thread()["restored"] is False
    assert visitor.connect().turn("hello", timeout=30)[0]["code"] == "memory_unreadable"
    assert visitor.request("DELETE", "/api/chat/thread").status_code == 204
    assert deployed.redis.type(ThreadKeys(tid).state) == "hash"
    assert visitor.chat.turn("hello again", timeout=30)[-1]["status"] == "completed"
    assert texts(visitor.thread()) == ["hello again", ANSWER]


# -- bad input ----------------------------------------------------------------------------------------------------

def test_nul_and_unpaired_surrogates_are_refused_with_invalid_text_over_http_and_websocket(deployed, visitor):
    chat = visitor.connect()
    assert chat.turn("first", timeout=30)[-1]["status"] == "completed"
    message_id = visitor.thread()["messages"][1]["id"]
    before = visitor.thread()
    json_headers = {"Content-Type": "application/json"}
    refused = [
        visitor.request("POST", "/api/chat/pins", json={"text": "nul \u0000 inside"}),
        visitor.request("POST", "/api/chat/pins", data='{"text": "lone \\ud800 surrogate"}', headers=json_headers),
        visitor.request("POST", "/api/chat/feedback",
                        json={"messageId": message_id, "rating": "down", "reason": "nul \u0000"}),
        visitor.request("POST", "/api/chat/feedback", headers=json_headers,
                        data=json.dumps({"messageId": message_id, "rating": "down"})[:-1] + ', "reason": "\\udc00"}'),
    ]
    assert [(r.status_code, r.json()["error"]["code"]) for r in refused] == [(400, "invalid_text")] * 4
    assert all("\\u" not in r.text and "Traceback" not in r.text for r in refused)
    for frame in ('{"type":"message","text":"nul \\u0000 inside"}', '{"type":"message","text":"lone \\ud800"}'):
        chat.send(frame)
        reply = chat.recv(timeout=30)
        assert (reply["type"], reply["code"]) == ("error", "invalid_text")
    assert visitor.thread() == before
    assert deployed.redis.llen(ThreadKeys(before["threadId"]).feedback) == 0


def test_deeply_nested_json_is_refused_without_a_500_and_the_socket_keeps_working(deployed, visitor):
    chat = visitor.connect()
    json_headers = {"Content-Type": "application/json"}
    deep_body = '{"text": ' + "[" * 30000 + "]" * 30000 + "}"  # 60 KB, under the 64 KB body limit
    for path in ("/api/chat/pins", "/api/chat/feedback"):
        response = visitor.request("POST", path, data=deep_body, headers=json_headers)
        assert (response.status_code, response.json()["error"]["code"]) == (400, "bad_request")
    chat.send("[" * 10000 + "]" * 10000)  # 20 KB frame
    frame = chat.ws.recv_frame()  # the raw frame: a JSON text frame, never an HTTP answer inside the socket
    assert frame.opcode == websocket.ABNF.OPCODE_TEXT
    assert json.loads(frame.data)["code"] == "invalid_json"
    chat.send({"type": "message", "text": "[" * 5000})  # deep-looking text is only text
    frames = chat.recv_until(lambda f: f["type"] == "done", timeout=30)
    assert frames[-1]["status"] == "completed" and answer_text(frames) == ANSWER
    assert texts(visitor.thread()) == ["[" * 5000, ANSWER]
    assert visitor.thread()["pinnedDecisions"] == []
    assert " 500 " not in deployed.log_text() and "RecursionError" not in deployed.log_text()


# -- one origin rule ------------------------------------------------------------------------------------------------

def test_every_write_refuses_a_foreign_origin_or_referer_and_clear_is_one_of_them(deployed, visitor):
    assert visitor.connect().turn("keep me", timeout=30)[-1]["status"] == "completed"
    kept = visitor.thread()
    foreign_referer = {"Referer": FOREIGN + "/attack.html"}
    refused = [
        visitor.request("DELETE", "/api/chat/thread", origin=FOREIGN),
        visitor.request("DELETE", "/api/chat/thread", origin="null"),
        visitor.request("DELETE", "/api/chat/thread", origin=None, headers=foreign_referer),
        visitor.request("DELETE", "/api/chat/thread", origin=None, headers={"Referer": "not a url"}),
        visitor.request("POST", "/api/chat/pins", origin=None, headers=foreign_referer, json={"text": "a pin"}),
        visitor.request("POST", "/api/chat/feedback", origin=None, headers=foreign_referer,
                        json={"messageId": kept["messages"][1]["id"], "rating": "up"}),
        # an allowed Referer does not excuse a foreign Origin
        visitor.request("DELETE", "/api/chat/thread", origin=FOREIGN, headers={"Referer": deployed.url + "/"}),
    ]
    assert [(r.status_code, r.json()["error"]["code"]) for r in refused] == [(403, "forbidden")] * len(refused)
    assert visitor.thread() == kept
    pinned = visitor.request("POST", "/api/chat/pins", origin=None, headers={"Referer": deployed.url + "/"},
                             json={"text": "a pin"})
    assert (pinned.status_code, pinned.json()) == (201, {"pinnedDecisions": ["a pin"]})
    assert visitor.request("DELETE", "/api/chat/thread", origin=None,
                           headers={"Referer": deployed.url + "/"}).status_code == 204
    assert visitor.thread()["messages"] == []
    assert visitor.connect().turn("again", timeout=30)[-1]["status"] == "completed"
    # a request that no browser page sent (no Origin, no Referer) is not a cross-site one
    assert visitor.request("DELETE", "/api/chat/thread", origin=None).status_code == 204
    assert visitor.thread()["messages"] == []


# -- a Redis that refuses writes --------------------------------------------------------------------------------------

def fill_to_maxmemory(client: redis.Redis) -> int:
    """Set ``maxmemory`` a little above what is used now and write until Redis refuses even a small write
    (big values first, then smaller ones: a big command's own buffer counts while it runs), then set it to half
    of what is used (``noeviction``: every write refused, reads and deletes served); return keys written."""
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", str(used + 4 * 1024 * 1024))
    n = 0
    for size in (64 * 1024, 4 * 1024, 256, 16):
        while True:
            try:
                client.set(f"filler:{n}", "x" * size)
            except redis.exceptions.OutOfMemoryError:  # "OOM command not allowed when used memory > 'maxmemory'"
                break
            n += 1
            assert n < 100000, "Redis never refused a write"
    # Then the limit below what is used: a client buffer freed after the last refusal must not let a write through.
    client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) // 2))
    return n


def test_with_redis_refusing_writes_done_says_not_saved_and_healthz_says_degraded(deployed, visitor):
    chat = visitor.connect()
    assert chat.turn("stored first", timeout=30)[-1]["status"] == "completed"
    before = visitor.thread()
    assert requests.get(deployed.url + "/healthz", timeout=10).json() == {"status": "ok", "store": "up",
                                                                          "model": "up"}
    assert deployed.redis.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    filled = fill_to_maxmemory(deployed.redis)
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            deployed.redis.set("one-more", "x")
        health = requests.get(deployed.url + "/healthz", timeout=10)
        assert (health.status_code, health.json()) == (503, {"status": "degraded", "store": "degraded",
                                                             "model": "up"})
        frames = chat.turn("not stored", timeout=30)
        assert answer_text(frames) == ANSWER  # the person got the answer in full
        assert frames[-1] == {"type": "done", "status": "completed", "messageId": frames[0]["messageId"],
                              "saved": False, "reason": "store_unavailable"}
        assert visitor.thread() == before
    finally:
        deployed.redis.delete(*[f"filler:{n}" for n in range(filled + 1)])
        deployed.redis.config_set("maxmemory", "0")
    health = requests.get(deployed.url + "/healthz", timeout=10)
    assert (health.status_code, health.json()["store"]) == (200, "up")
    frames = chat.turn("stored again", timeout=30)
    assert "saved" not in frames[-1] and frames[-1]["status"] == "completed"
    assert texts(visitor.thread()) == ["stored first", ANSWER, "stored again", ANSWER]

