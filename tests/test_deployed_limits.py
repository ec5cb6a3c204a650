"""Websocket limits of the Procfile's ``web`` as deployed (gunicorn, gevent, two workers; docs/contract.md:
WebSocket, close codes; docs/deployment.md).

- ``WEB_THREADS=8``: each worker serves at most 6 sockets (``WS_MAX_PER_WORKER`` derived: 8 minus 2 kept for
  HTTP) and closes the next with 1013; ``WS_MAX_PER_SESSION=4`` closes a session's fifth socket with 4429 over
  both workers.  With every socket place taken by idle sockets, ``/healthz`` and the page still answer, and
  closed sockets give their places back.
- ``WS_IDLE_TIMEOUT_SECONDS=2``: a socket that sends nothing is closed with 4408; one waiting for a long answer
  is not, nor one that keeps sending.
- The page (a real Chromium on the deployed web) sees the clean 4408 close, reconnects by itself and chats on.
"""

from __future__ import annotations

import json
import time

import pytest
import requests
import websocket

from app.settings import ConfigError, Settings
from chat_support.fake_llm import FakeLLM, Reply, words
from chat_support.live_app import answer_text
from chat_support.polling import wait_until
from tests.fixtures.deployed_web import Visitor

PER_WORKER, WORKERS, PER_SESSION = 6, 2, 4
# Counts the page's sockets and records each close as [code, wasClean] (the page's own code is unchanged).
RECORD_CLOSES = """
(() => {
  const Native = window.WebSocket;
  window.__closes = []; window.__opened = 0;
  class Recorded extends Native {
    constructor(...args) {
      super(...args);
      window.__opened += 1;
      this.addEventListener("close", (e) => window.__closes.push([e.code, e.wasClean]));
    }
  }
  window.WebSocket = Recorded;
})();
"""


@pytest.fixture(scope="module")
def model():
    with FakeLLM() as llm:
        yield llm


@pytest.fixture(scope="module")
def limited(model, procfile, tmp_path_factory):
    with procfile.deployed_web(model, tmp_path_factory.mktemp("limited-web"), WEB_THREADS="8",
                      WS_MAX_PER_SESSION=str(PER_SESSION)) as web:
        yield web


@pytest.fixture(scope="module")
def idle_web(model, procfile, tmp_path_factory):
    with procfile.deployed_web(model, tmp_path_factory.mktemp("idle-web"), WS_IDLE_TIMEOUT_SECONDS="2") as web:
        yield web


def open_socket(visitor: Visitor) -> websocket.WebSocket:
    return websocket.create_connection(visitor.web.ws_url, origin=visitor.web.url, cookie=visitor.cookie,
                                       timeout=30)


def served_or_close_code(ws: websocket.WebSocket) -> str | int:
    """``"served"`` when the socket answers a bad frame with an error frame, else the server's close code."""
    try:
        ws.send("not json")
    except (OSError, websocket.WebSocketException):
        pass  # closed already: its close frame is still to be read
    frame = ws.recv_frame()
    if frame.opcode == websocket.ABNF.OPCODE_TEXT:
        assert json.loads(frame.data)["code"] == "invalid_json"
        return "served"
    assert frame.opcode == websocket.ABNF.OPCODE_CLOSE
    return int.from_bytes(frame.data[:2], "big")


def served_together(visitor: Visitor, n: int) -> list[websocket.WebSocket] | None:
    """``n`` sockets of ``visitor`` open and served at once, or None (each closed) when one was refused."""
    sockets = [open_socket(visitor) for _ in range(n)]
    if all(served_or_close_code(ws) == "served" for ws in sockets):
        return sockets
    for ws in sockets:
        ws.close()
    return None


def close_code(ws: websocket.WebSocket) -> int:
    """The code of the next frame, which must be the server's close frame."""
    frame = ws.recv_frame()
    assert frame.opcode == websocket.ABNF.OPCODE_CLOSE, frame.data
    return int.from_bytes(frame.data[:2], "big")


def test_the_socket_settings_keep_connections_for_http():
    assert Settings.from_env({}).ws_per_worker_limit == 48  # WEB_THREADS=64
    env = {"WEB_THREADS": "8"}
    assert Settings.from_env(env).ws_per_worker_limit == PER_WORKER
    assert (Settings.from_env({}).ws_idle_timeout, Settings.from_env({}).ws_max_per_session) == (300.0, 8)
    assert Settings.from_env({**env, "WS_MAX_PER_WORKER": "7"}).ws_per_worker_limit == 7
    with pytest.raises(ConfigError, match="^WS_MAX_PER_WORKER must be smaller than WEB_THREADS"):
        Settings.from_env({**env, "WS_MAX_PER_WORKER": "8"})
    with pytest.raises(ConfigError, match="^WS_IDLE_TIMEOUT_SECONDS must be positive"):
        Settings.from_env({"WS_IDLE_TIMEOUT_SECONDS": "0"})


def test_idle_sockets_cannot_take_every_connection_and_each_session_has_a_cap(limited):
    sockets: list[websocket.WebSocket] = []
    try:
        first = Visitor(limited)
        mine = [open_socket(first) for _ in range(PER_SESSION + 2)]
        sockets += mine
        # each socket claims its place after its handshake, so which two are refused is not known; how many is
        assert sorted(map(str, (served_or_close_code(ws) for ws in mine))) == ["4429", "4429"] + ["served"] * PER_SESSION

        others = [Visitor(limited) for _ in range(5)]
        theirs = [open_socket(v) for v in others for _ in range(PER_SESSION)]
        sockets += theirs
        outcomes = [served_or_close_code(ws) for ws in theirs]
        served = PER_SESSION + outcomes.count("served")
        assert set(outcomes) <= {"served", 1013}
        # never more than each worker's cap; a 1013 means a worker was full
        assert PER_WORKER <= served <= PER_WORKER * WORKERS
        assert outcomes.count(1013) == len(theirs) - (served - PER_SESSION) >= 8

        # every socket place is held by an idle socket: health checks and page loads are still served
        for _ in range(4):
            health = requests.get(limited.url + "/healthz", timeout=10)
            assert (health.status_code, health.json()["status"]) == (200, "ok")
            page = requests.get(limited.url + "/", timeout=10)
            assert page.status_code == 200 and "<html" in page.text.lower()
    finally:
        for ws in sockets:
            ws.close()

    # closed sockets give their places back (as each handler sees its close): the session opens its four again
    again = wait_until(lambda: served_together(first, PER_SESSION), timeout=30,
                       message="the session's places to come back", interval=0.2)
    for ws in again:
        ws.close()
    limited.model.default = Reply(text="Still here.")
    newcomer = Visitor(limited)
    try:
        frames = newcomer.connect().turn("hello", timeout=30)
        assert frames[-1]["status"] == "completed" and answer_text(frames) == "Still here."
    finally:
        newcomer.close()


def test_an_idle_socket_is_closed_with_4408_but_not_while_a_long_answer_streams_or_it_keeps_sending(idle_web):
    visitor = Visitor(idle_web)
    silent = open_socket(visitor)
    assert close_code(silent) == 4408
    silent.close()

    # an answer taking about 4.5 s (longer than the idle timeout) streams to its end
    idle_web.model.default = Reply(tokens=words(30), token_delay=0.15)
    chat = visitor.connect()
    frames = chat.turn("Count slowly.", timeout=60)
    assert frames[-1]["status"] == "completed" and answer_text(frames) == "".join(words(30))
    # a socket that sends something every half second for 3 s stays open
    talker = open_socket(visitor)
    for _ in range(6):
        talker.send("not json")
        assert json.loads(talker.recv())["code"] == "invalid_json"
        time.sleep(0.5)
    # both fall idle afterwards and are closed
    assert close_code(talker) == 4408
    assert close_code(chat.ws) == 4408
    talker.close()
    chat.close()
    assert texts_of(visitor) == ["Count slowly.", "".join(words(30))]


def texts_of(visitor: Visitor) -> list[str]:
    return [m["text"] for m in visitor.thread()["messages"]]


@pytest.mark.browser
def test_the_page_reconnects_by_itself_after_an_idle_close(browser_page, idle_web):
    server = idle_web
    server.model.default = Reply(text="Welcome back.")
    page = browser_page
    page.add_init_script(RECORD_CLOSES)
    page.goto(server.url + "/")
    page.wait_for_selector('[data-testid="connection"][data-state="connected"]')
    page.wait_for_function("() => window.__closes.length >= 1", timeout=20000)
    assert page.evaluate("window.__closes[0]") == [4408, True]  # the server closed it as idle, cleanly
    page.get_by_test_id("message-input").press("a")  # the person is back (a key), if the page was not focused
    page.wait_for_function("() => window.__opened >= 2", timeout=20000)
    page.wait_for_selector('[data-testid="connection"][data-state="connected"]')
    box = page.get_by_test_id("message-input")
    box.fill("Are you there?")
    box.press("Enter")
    page.wait_for_function(
        """() => [...document.querySelectorAll('[data-testid="message"][data-role="assistant"]')]
                 .some(e => e.innerText.includes('Welcome back.'))""")
    assert page.errors == []
