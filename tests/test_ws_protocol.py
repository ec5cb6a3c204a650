"""``/ws/chat`` framing and admission: bad frames, input limits, the Origin allow-list.

Every bad frame gets one error frame with the contract's code and the connection stays usable; a
cross-site page can never open the socket.
"""

from __future__ import annotations

import json

import pytest
import websocket

from chat_support.fake_llm import Reply
from chat_support.live_app import ChatClient, answer_text, frame_kinds

BAD_FRAMES = [
    ("not json", "invalid_json"),
    ("{\"type\": \"message\", \"text\": ", "invalid_json"),
    ("[1, 2]", "invalid_json"),
    ("\"message\"", "invalid_json"),
    ("", "invalid_json"),
    (b"\x00\x01binary", "invalid_json"),
    ({"type": "shout", "text": "hi"}, "unknown_type"),
    ({"text": "no type"}, "unknown_type"),
    ({"type": "message"}, "empty_input"),
    ({"type": "message", "text": ""}, "empty_input"),
    ({"type": "message", "text": " \n\t "}, "empty_input"),
    ({"type": "message", "text": 42}, "empty_input"),
    ({"type": "message", "text": "x" * 12001}, "input_too_long"),
]


def test_each_bad_frame_gets_an_error_and_the_connection_stays_usable(chat, fake_llm):
    for frame, code in BAD_FRAMES:
        chat.send(frame)
        reply = chat.recv(timeout=5)
        assert reply["type"] == "error" and reply["code"] == code, (frame if not isinstance(frame, str) else frame[:40], reply)
        assert reply["message"] and "Traceback" not in reply["message"]
    assert fake_llm.chat_requests() == []
    assert chat.thread()["messages"] == []

    fake_llm.default = Reply(text="Still listening.")
    frames = chat.turn("are you there?")
    assert frames[-1]["status"] == "completed" and answer_text(frames) == "Still listening."
    assert [m["text"] for m in chat.thread()["messages"]] == ["are you there?", "Still listening."]


def test_input_at_the_limit_is_accepted_and_trimmed(chat, fake_llm, app_settings):
    text = "y" * app_settings.max_input_chars
    frames = chat.turn("   " + text + "   ")  # padding does not count against the limit
    assert frames[-1]["status"] == "completed"
    assert fake_llm.last_request().messages[-1]["content"] == text


def test_invalid_client_message_id_is_refused(chat, fake_llm):
    chat.send({"type": "message", "id": "bad id with spaces", "text": "hi"})
    reply = chat.recv()
    assert reply["type"] == "error" and reply["code"] == "invalid_id"
    assert fake_llm.chat_requests() == []
    assert chat.turn("hi", message_id="ok-id_1")[-1]["status"] == "completed"


def test_cancel_without_a_turn_is_ignored(chat, fake_llm):
    chat.send({"type": "cancel"})
    frames = chat.turn("hello")
    assert frames[0]["type"] == "start" and frames[-1]["status"] == "completed"


def test_invalid_utf8_text_frame_is_refused_and_nothing_is_stored(live_app, fake_llm):
    """B7 at the socket: bytes that are not UTF-8 in a text frame never reach memory or the model.

    RFC 6455 (8.1) says to fail the connection, and wsproto does, with close code 1007; the page reconnects.
    """
    client = ChatClient(live_app).connect()
    client.ws.send(b'{"type":"message","text":"\xff\xfe bad"}', opcode=websocket.ABNF.OPCODE_TEXT)
    client.ws.settimeout(5)
    frame = client.ws.recv_frame()
    if frame.opcode == websocket.ABNF.OPCODE_TEXT:
        reply = json.loads(frame.data)
        assert reply["type"] == "error" and reply["code"] == "invalid_json"
    else:
        assert frame.opcode == websocket.ABNF.OPCODE_CLOSE
        assert int.from_bytes(frame.data[:2], "big") == 1007
    client.close()
    assert fake_llm.chat_requests() == []
    assert client.thread()["messages"] == []
    again = ChatClient(live_app, session=client.http).connect()
    try:
        assert again.turn("valid now")[-1]["status"] == "completed"
    finally:
        again.close()


def handshake_status(server, origin: str | None, session: ChatClient | None = None) -> int:
    """The HTTP status of a websocket handshake with ``Origin: origin`` (None: no Origin header)."""
    client = session or ChatClient(server)
    client.thread()
    try:
        ws = websocket.create_connection(server.ws_url, origin=origin, suppress_origin=origin is None,
                                         cookie=client.cookie_header(), timeout=5)
    except websocket.WebSocketBadStatusException as exc:
        return exc.status_code
    ws.close()
    return 101


@pytest.mark.parametrize("origin", [
    "http://evil.example",
    None,
    "null",
    "http://127.0.0.1.evil.example",
    "http://127.0.0.1:1",
])
def test_cross_origin_handshake_is_refused(live_app, fake_llm, origin):
    origin = origin.format(port=live_app.port) if origin else None
    assert handshake_status(live_app, origin) == 403
    assert handshake_status(live_app, live_app.url) == 101
    assert fake_llm.chat_requests() == []


def test_refused_origin_cannot_drive_the_thread(live_app, fake_llm):
    """A cross-site page with the visitor's cookie gets no socket, so no turn and no memory."""
    victim = ChatClient(live_app, origin="http://evil.example")
    victim.thread()
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        victim.connect()
    assert refused.value.status_code == 403
    assert b"Traceback" not in (refused.value.resp_body or b"")
    assert victim.thread()["messages"] == [] and fake_llm.chat_requests() == []


def test_allowed_origins_configured_admit_only_those(make_live_app, app_settings, fake_llm):
    server = make_live_app(app_settings.with_overrides(allowed_origins=("https://chat.example.com",
                                                                        "http://localhost:8080")))
    assert handshake_status(server, "https://chat.example.com") == 101
    assert handshake_status(server, "http://localhost:8080") == 101
    assert handshake_status(server, "https://chat.example.com/") == 101  # a trailing slash is the same origin
    assert handshake_status(server, server.url) == 403  # the app's own address is not on the list
    assert handshake_status(server, "http://evil.example") == 403
    assert handshake_status(server, "https://chat.example.com.evil.example") == 403

    client = ChatClient(server, origin="https://chat.example.com").connect()
    try:
        assert client.turn("hi")[-1]["status"] == "completed"
    finally:
        client.close()


def test_frames_are_single_json_objects(chat, fake_llm):
    """Every server frame is one JSON object with a ``type`` (one writer per socket, nothing interleaved)."""
    answer = " ".join(f"w{i}" for i in range(300))
    fake_llm.default = Reply(text=answer, token_delay=0.001)
    chat.send({"type": "message", "text": "many deltas"})
    chat.ws.settimeout(10)
    frames = []
    while True:
        frame = json.loads(chat.ws.recv())
        assert isinstance(frame, dict) and isinstance(frame.get("type"), str)
        frames.append(frame)
        if frame["type"] == "done":
            break
    assert frame_kinds(frames) == ["start", "delta", "done"] and frames[-1]["status"] == "completed"
    assert answer_text(frames) == answer
