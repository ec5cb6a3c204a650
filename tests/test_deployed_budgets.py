"""Budgets of the Procfile's ``web`` as deployed (gunicorn, gevent, two workers, production;
docs/deployment.md: "Budgets"; docs/contract.md: HTTP, WebSocket).

Each test plays its clients from addresses of its own: the deployment trusts one proxy (``TRUSTED_PROXIES``'s
production default), so ``X-Forwarded-For`` names the client as a platform's router would.

- A websocket upgrade without the session cookie is refused before any upgrade (403 ``no_session``) and
  holds nothing: sixty of them leave the store's keys as they were and every socket place free.
- Per address: open sockets (``WS_MAX_PER_CLIENT``, close 4429), new sockets a minute (``WS_NEW_PER_MINUTE``,
  close 4430), turns a minute per session and per address (error ``rate_limited`` with ``retryAfter``), new
  sessions an hour (429 ``session_limit``), API writes a minute (429 ``rate_limited`` with ``Retry-After``);
  another address is served meanwhile.  The addresses of one IPv6 /64 are one client, and an IPv4 address is
  one client whatever its spelling (``::ffff:a.b.c.d``, ``::ffff:XXXX:XXXX``); a message refused before its
  turn starts (blank, malformed, too long for the frame or the model's context) spends no turn.
- The store's budget: a first turn that wrote nothing leaves no key; past ``STORE_FULL_FRACTION`` of the
  store's ``maxmemory`` a new thread's turn is refused (``store_full``) while an existing thread goes on.
- An incoming frame over 12 × ``MAX_INPUT_CHARS`` + 1024 bytes closes the socket (1009).
- A reader that stops reading is dropped when its socket's queue is full; memory events keep reaching the
  session's other socket, and another visitor's turn on the same web completes.
- Tidy input: a text of format characters only is ``empty_input``; pins compare without them; a path id that
  is not ASCII digits is 404; a foreign ``Host`` is 400 ``untrusted_host`` (also for the upgrade).
"""

from __future__ import annotations

import itertools
import json
import socket
import time

import pytest
import requests
import websocket

from app.chat.ws import STORE_FULL_CHECK_SECONDS
from app.store.keys import ThreadKeys
from chat_support.fake_llm import FakeLLM, Reply, words
from chat_support.polling import wait_until

LIMITS = dict(WS_MAX_PER_CLIENT="3", WS_NEW_PER_MINUTE="8", TURNS_PER_MINUTE_PER_SESSION="2",
              TURNS_PER_MINUTE_PER_CLIENT="3", SESSIONS_PER_HOUR_PER_CLIENT="4", API_WRITES_PER_MINUTE="5",
              WS_SEND_QUEUE_BYTES="65536", WS_SEND_TIMEOUT_SECONDS="3", TRUSTED_HOSTS="127.0.0.1")
_addresses = (f"198.51.100.{i}" for i in itertools.count(1))


@pytest.fixture(scope="module")
def model():
    with FakeLLM() as llm:
        yield llm


@pytest.fixture(scope="module")
def web(model, procfile, tmp_path_factory):
    with procfile.deployed_web(model, tmp_path_factory.mktemp("budgets-web"), **LIMITS) as deployed:
        yield deployed


@pytest.fixture(autouse=True)
def default_reply(model):
    model.default = Reply(text="a short answer")
    yield
    model.default = Reply(text="a short answer")


class Client:
    """One browser session at one network address (``X-Forwarded-For``), its cookie sent by hand."""

    def __init__(self, web, address: str | None = None, *, session: bool = True):
        self.web, self.address = web, address or next(_addresses)
        self.cookie = ""
        self.sockets: list[websocket.WebSocket] = []
        if session:
            assert self.request("GET", "/api/chat/thread").status_code == 200

    def headers(self, origin: bool = True) -> dict:
        headers = {"X-Forwarded-For": self.address}
        if origin:
            headers["Origin"] = self.web.url
        if self.cookie:
            headers["Cookie"] = self.cookie
        return headers

    def request(self, method: str, path: str, **kwargs) -> requests.Response:
        headers = {**self.headers(), **kwargs.pop("headers", {})}
        response = requests.request(method, self.web.url + path, headers=headers, timeout=10, **kwargs)
        if "chat_session" in response.cookies:
            self.cookie = f"chat_session={response.cookies['chat_session']}"
        return response

    def thread_id(self) -> str:
        return self.request("GET", "/api/chat/thread").json()["threadId"]

    def open(self, **kwargs) -> websocket.WebSocket:
        header = [f"{k}: {v}" for k, v in self.headers(origin=False).items() if k != "Cookie"]
        ws = websocket.create_connection(self.web.ws_url, origin=self.web.url, cookie=self.cookie or None,
                                         header=header, timeout=20, **kwargs)
        self.sockets.append(ws)
        return ws

    def close(self) -> None:
        for ws in self.sockets:
            try:
                ws.close()
            except (OSError, websocket.WebSocketException):
                pass


def recv_json(ws: websocket.WebSocket) -> dict:
    while True:
        opcode, data = ws.recv_data(control_frame=True)
        if opcode == websocket.ABNF.OPCODE_TEXT:
            return json.loads(data)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            raise websocket.WebSocketConnectionClosedException(close_code(data))


def close_code(data: bytes) -> int:
    return int.from_bytes(data[:2], "big") if len(data) >= 2 else 1005


def served_or_close(ws: websocket.WebSocket) -> str | int:
    """``"served"`` when the socket answers a bad frame with an error frame, else the server's close code."""
    try:
        ws.send("not json")
    except (OSError, websocket.WebSocketException):
        pass
    frame = ws.recv_frame()
    if frame.opcode == websocket.ABNF.OPCODE_TEXT:
        assert json.loads(frame.data)["code"] == "invalid_json"
        return "served"
    assert frame.opcode == websocket.ABNF.OPCODE_CLOSE
    return close_code(frame.data)


def turn(ws: websocket.WebSocket, text: str) -> list[dict]:
    ws.send(json.dumps({"type": "message", "text": text}))
    frames = []
    while True:
        frame = recv_json(ws)
        if frame["type"] == "memory":
            continue
        frames.append(frame)
        if frame["type"] == "done" or (frame["type"] == "error" and not frames[0]["type"] == "start"):
            return frames


# -- sockets ------------------------------------------------------------------------------------------------

def test_a_cookieless_upgrade_is_refused_and_holds_nothing(web):
    attacker = Client(web, session=False)
    keys_before = web.redis.dbsize()
    for _ in range(60):
        with pytest.raises(websocket.WebSocketBadStatusException) as refused:
            attacker.open()
        assert refused.value.status_code == 403
        assert json.loads(refused.value.resp_body)["error"]["code"] == "no_session"
    assert web.redis.dbsize() == keys_before  # no session, no counter, no lease: nothing kept
    visitor = Client(web)
    ws = visitor.open()
    assert served_or_close(ws) == "served"  # every socket place is free
    assert turn(ws, "hello")[-1]["status"] == "completed"
    visitor.close()


def test_one_address_holds_at_most_its_open_sockets_while_others_are_served(web):
    first, second = Client(web), None
    second = Client(web, first.address)  # another session at the same address
    held = [first.open(), first.open(), second.open()]
    assert [served_or_close(ws) for ws in held] == ["served"] * 3
    assert served_or_close(second.open()) == 4429
    other = Client(web)
    assert served_or_close(other.open()) == "served"
    held[0].close()  # a closed socket gives its place back
    assert wait_until(lambda: served_or_close(first.open()) == "served", timeout=10)
    for client in (first, second, other):
        client.close()


def test_new_sockets_per_minute_per_address(web):
    client = Client(web)
    outcomes = []
    for _ in range(9):
        ws = client.open()
        outcomes.append(served_or_close(ws))
        ws.close()
    assert outcomes[:8] == ["served"] * 8 and outcomes[8] == 4430
    other = Client(web)
    assert served_or_close(other.open()) == "served"
    other.close()


def test_sockets_failed_by_bad_utf8_at_once_each_get_a_clean_1007_and_give_their_places_back(web):
    """Ten sockets from ten addresses (with the visitor's, within one worker's share of sockets) send a text frame that is not UTF-8 at the same moment, while another
    visitor's turn streams: every one reads a well-formed close 1007 (never the web server's own bytes inside the
    upgraded socket), the visitor's answer completes, and each address may then open its full share of sockets
    again (the places were given back); text in other scripts is served as usual."""
    import concurrent.futures

    attackers = [Client(web) for _ in range(10)]
    sockets = [attacker.open() for attacker in attackers]
    visitor = Client(web)
    visitor_ws = visitor.open()

    def fail(ws: websocket.WebSocket) -> tuple[int, int]:
        ws.send(b'{"type":"message","text":"\xff\xfe"}', opcode=websocket.ABNF.OPCODE_TEXT)
        frame = ws.recv_frame()  # a frame with an RSV bit set raises here
        return frame.opcode, close_code(frame.data)

    with concurrent.futures.ThreadPoolExecutor(max_workers=10) as pool:
        failed = pool.map(fail, sockets)
        frames = turn(visitor_ws, "Γειά σου, 안녕하세요, مرحبا — and hello")
        assert list(failed) == [(websocket.ABNF.OPCODE_CLOSE, 1007)] * 10
    assert frames[-1]["type"] == "done" and frames[-1]["status"] == "completed"
    again = attackers[0]
    assert wait_until(lambda: [served_or_close(again.open()) for _ in range(3)] == ["served"] * 3, timeout=10)
    for client in (*attackers, visitor):
        client.close()


def test_incoming_frames_are_bounded(web):
    client = Client(web)
    ws = client.open()
    [refused] = turn(ws, "x" * 20_000)  # over MAX_INPUT_CHARS, within the frame bound: the socket stays
    assert refused["code"] == "input_too_long"
    ws.send(json.dumps({"type": "message", "text": "x" * (12 * 12_000 + 1024)}))
    with pytest.raises(websocket.WebSocketConnectionClosedException) as closed:
        recv_json(ws)
    assert closed.value.args[0] == 1009
    client.close()


# -- turns, sessions, API writes --------------------------------------------------------------------------------

def test_turns_per_minute_per_session_then_per_address(web):
    one = Client(web)
    ws = one.open()
    assert turn(ws, "first")[-1]["status"] == "completed"
    assert turn(ws, "second")[-1]["status"] == "completed"
    [refused] = turn(ws, "third")
    assert refused["code"] == "rate_limited" and 1 <= refused["retryAfter"] <= 61
    two = Client(web, one.address)
    ws2 = two.open()
    assert turn(ws2, "the address's third")[-1]["status"] == "completed"
    [refused] = turn(ws2, "the address's fourth")
    assert refused["code"] == "rate_limited"
    three = Client(web)
    assert turn(three.open(), "another address")[-1]["status"] == "completed"
    for client in (one, two, three):
        client.close()


def test_new_sessions_per_hour_per_address(web):
    address = next(_addresses)
    clients = [Client(web, address) for _ in range(4)]
    fresh = Client(web, address, session=False)
    refused = fresh.request("GET", "/api/chat/thread")
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "session_limit"
    assert "chat_session" not in refused.cookies
    page = fresh.request("GET", "/")  # a person opening the page is told in words
    assert page.status_code == 429 and page.headers["Content-Type"].startswith("text/plain")
    assert "Too many new chats" in page.text
    assert all(c.request("GET", "/api/chat/thread").status_code == 200 for c in clients)  # sessions go on
    assert Client(web).request("GET", "/api/chat/thread").status_code == 200  # another address


def test_ipv6_clients_count_by_their_network(web):
    """Ten addresses of one /64 (``CLIENT_IPV6_PREFIX``'s default) are one client: four new sessions an hour."""
    statuses = [Client(web, f"2001:db8:6:1::{i:x}", session=False).request("GET", "/api/chat/thread").status_code
                for i in range(1, 11)]
    assert statuses == [200] * 4 + [429] * 6
    assert Client(web, "2001:db8:6:2::1", session=False).request("GET", "/api/chat/thread").status_code == 200


def test_ipv6_clients_hold_their_open_sockets_by_network(web):
    clients = [Client(web, f"2001:db8:7:1::{i}") for i in range(1, 5)]
    opened = [client.open() for client in clients[:3]]
    assert [served_or_close(ws) for ws in opened] == ["served"] * 3  # each has its place now
    assert served_or_close(clients[3].open()) == 4429
    elsewhere = Client(web, "2001:db8:7:2::1")
    assert served_or_close(elsewhere.open()) == "served"
    for client in [*clients, elsewhere]:
        client.close()


def test_an_ipv4_address_counts_once_whatever_its_spelling(web):
    spellings = ["198.51.100.250", "::ffff:198.51.100.250", "::ffff:c633:64fa", "0:0:0:0:0:ffff:c633:64fa",
                 "[::ffff:198.51.100.250]"]
    statuses = [Client(web, address, session=False).request("GET", "/api/chat/thread").status_code
                for address in spellings]
    assert statuses == [200] * 4 + [429]
    sockets = [Client(web, address) for address in ("198.51.100.251", "::ffff:c633:64fb", "::FFFF:198.51.100.251")]
    opened = [client.open() for client in sockets]
    assert [served_or_close(ws) for ws in opened] == ["served"] * 3
    assert served_or_close(Client(web, "::ffff:198.51.100.251", session=True).open()) == 4429
    for client in sockets:
        client.close()


def test_messages_refused_before_their_turn_spend_no_quota(web):
    """Blank, malformed, too long for the frame or for the model's context, a bad id: none is a turn, so the
    session's two turns a minute are still both there afterwards."""
    client = Client(web)
    ws = client.open()
    refusals = [turn(ws, "  \u200b ")[0]["code"], turn(ws, "x" * 20_000)[0]["code"]]
    ws.send(json.dumps({"type": "message", "text": "hi", "id": "not an id!"}))
    refusals.append(recv_json(ws)["code"])
    ws.send("{not json")
    refusals.append(recv_json(ws)["code"])
    for _ in range(3):  # within MAX_INPUT_CHARS, over the model's context window
        ws.send(json.dumps({"type": "message", "text": "好 " * 5_900}, ensure_ascii=False))
        refusals.append(recv_json(ws)["code"])
    assert refusals == ["empty_input", "input_too_long", "invalid_id", "invalid_json"] + ["input_too_long"] * 3
    assert [turn(ws, question)[-1]["status"] for question in ("a short question", "another")] == ["completed"] * 2
    [refused] = turn(ws, "a third")
    assert refused["code"] == "rate_limited"
    client.close()


def test_api_writes_per_minute_per_address(web):
    client = Client(web)
    statuses = [client.request("DELETE", "/api/chat/thread").status_code for _ in range(6)]
    assert statuses == [204] * 5 + [429]
    refused = client.request("POST", "/api/chat/pins", json={"text": "x"})
    assert refused.json()["error"]["code"] == "rate_limited" and int(refused.headers["Retry-After"]) >= 1
    assert Client(web).request("DELETE", "/api/chat/thread").status_code == 204


# -- the store's budget -----------------------------------------------------------------------------------------

def test_a_cancelled_first_turn_leaves_no_key(web, model):
    model.default = Reply(tokens=words(200), token_delay=0.05)
    client = Client(web)
    thread_id = client.thread_id()
    ws = client.open()
    ws.send(json.dumps({"type": "message", "text": "cancel me"}))
    assert recv_json(ws)["type"] == "start"
    ws.send(json.dumps({"type": "cancel"}))
    while (frame := recv_json(ws))["type"] != "done":
        pass
    assert frame["status"] == "cancelled"
    keys = ThreadKeys(thread_id)
    assert web.redis.exists(keys.state, keys.stats, keys.compactions, keys.feedback, keys.archive) == 0
    client.close()


def test_past_the_store_bound_new_threads_are_refused_and_existing_ones_go_on(web):
    existing = Client(web)
    ws_old = existing.open()
    assert turn(ws_old, "written before the store filled")[-1]["status"] == "completed"
    used = int(web.redis.info("memory")["used_memory"])
    web.redis.config_set("maxmemory", str(int(used / 0.95)))  # past STORE_FULL_FRACTION (0.9)
    newcomers = []

    def first_turn(text: str) -> list[dict]:  # each try a new thread (a completed one exists from then on)
        newcomers.append(Client(web))
        frames = turn(newcomers[-1].open(), text)
        newcomers[-1].close()  # the web serves 2 x 12 sockets here (WEB_THREADS=16)
        return frames
    try:
        # each web process reads the store's used memory at most every 5 s: polled until both have
        assert wait_until(lambda: first_turn("a new thread")[0].get("code") == "store_full", timeout=20, interval=0.5)
        assert web.redis.exists(ThreadKeys(newcomers[-1].thread_id()).state) == 0
        assert turn(ws_old, "an existing thread goes on")[-1]["status"] == "completed"
    finally:
        web.redis.config_set("maxmemory", "0")
        # every web process trusts its last reading this long: past it, none still says full (later tests
        # start new threads on either process)
        time.sleep(STORE_FULL_CHECK_SECONDS + 0.5)
    assert first_turn("room again")[-1].get("status") == "completed"
    assert first_turn("room again, the other process too")[-1].get("status") == "completed"
    for client in (existing, *newcomers):
        client.close()


# -- slow and stuck peers --------------------------------------------------------------------------------------

def test_a_reader_that_stops_reading_is_dropped_and_blocks_no_one(web, model):
    client = Client(web)
    thread_id = client.thread_id()
    listener = client.open()  # the same session's other socket: memory events reach it
    stuck = client.open(sockopt=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)])
    model.default = Reply(tokens=[" " + "x" * 4000] * 3000)  # 12 MB: past the kernel buffers and the 64 KB queue
    stuck.send(json.dumps({"type": "message", "text": "a long answer, never read"}))
    event = {"type": "memory", "status": "started", "message": "Compacting…"}
    assert wait_until(lambda: "websocket dropped" in web.log_text(), timeout=30)
    web.redis.publish(ThreadKeys(thread_id).events, json.dumps(event))
    assert recv_json(listener) == event
    model.default = Reply(text="a short answer")
    other = Client(web)
    frames = turn(other.open(), "still served")
    assert frames[-1].get("status") == "completed", frames
    for each in (client, other):
        each.close()


# -- tidy input -------------------------------------------------------------------------------------------------

def test_format_characters_alone_are_empty_input_and_pins_compare_without_them(web):
    client = Client(web)
    ws = client.open()
    [refused] = turn(ws, "\u200b\u200b\u2060\ufeff \u200d")
    assert refused["code"] == "empty_input"
    assert client.request("POST", "/api/chat/pins", json={"text": "\u200b\u200c"}).json()["error"]["code"] == "empty_pin"
    assert client.request("POST", "/api/chat/pins", json={"text": "Use Postgres"}).status_code == 201
    again = client.request("POST", "/api/chat/pins", json={"text": "Use\u200b Post\u00adgres"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_pinned"
    client.close()


@pytest.mark.parametrize("n", ["\u00b2", "\u0663", "\uff11", "1" * 7, "-1", "0x1", " 1"])
def test_path_ids_that_are_not_short_ascii_numbers_are_404(web, n):
    client = Client(web)
    assert client.request("DELETE", f"/api/chat/pins/{n}").status_code == 404
    assert client.request("DELETE", f"/api/chat/notes/{n}").status_code == 404


def test_a_foreign_host_is_refused(web):
    client = Client(web)
    foreign = {"Host": "rebind.example:80", "Origin": "http://rebind.example"}
    refused = client.request("DELETE", "/api/chat/thread", headers=foreign)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "untrusted_host"
    with pytest.raises(websocket.WebSocketBadStatusException) as upgrade:
        websocket.create_connection(web.ws_url, host="rebind.example", origin="http://rebind.example",
                                    cookie=client.cookie, timeout=10)
    assert upgrade.value.status_code == 400
