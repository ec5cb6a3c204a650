"""A connection the protocol failed (docs/contract.md: WebSocket): simple-websocket's reader thread marks it closed
*before* it writes its closing reply, so the handler waits for that reply (``FrameWriter.peer_closed``) before it
returns and the web server writes anything of its own into the upgraded socket.

A real simple-websocket ``Server`` on one end of a socket pair, a raw client on the other."""

from __future__ import annotations

import base64
import os
import socket

import pytest
import websocket
from simple_websocket import ConnectionClosed, Server

from app.chat.connection import FrameWriter


def upgraded_pair() -> tuple[Server, socket.socket]:
    """``(server, client socket)`` after a websocket handshake over a socket pair."""
    server_sock, client = socket.socketpair()
    environ = {"werkzeug.socket": server_sock, "HTTP_HOST": "localhost", "HTTP_CONNECTION": "Upgrade",
               "HTTP_UPGRADE": "websocket", "HTTP_SEC_WEBSOCKET_VERSION": "13",
               "HTTP_SEC_WEBSOCKET_KEY": base64.b64encode(os.urandom(16)).decode()}
    ws = Server(environ)
    client.settimeout(5)
    response = b""
    while b"\r\n\r\n" not in response:
        response += client.recv(4096)
    assert response.startswith(b"HTTP/1.1 101")
    return ws, client


def test_after_peer_closed_the_closing_reply_to_bad_utf8_is_on_the_wire():
    ws, client = upgraded_pair()
    writer = FrameWriter(ws)
    try:
        client.sendall(websocket.ABNF.create_frame(b'{"type":"message","text":"\xff\xfe"}',
                                                   websocket.ABNF.OPCODE_TEXT).format())
        with pytest.raises(ConnectionClosed):
            ws.receive(timeout=5)
        writer.peer_closed()
        assert not ws.thread.is_alive()  # the reader wrote its reply and closed its socket
        client.setblocking(False)
        frame = client.recv(4096)  # already there: nothing to wait for
        assert frame[0] == 0x88  # FIN and the close opcode, no RSV bit
        assert int.from_bytes(frame[2:4], "big") == 1007  # invalid frame payload data (RFC 6455, 7.4.1)
    finally:
        writer.finish()
        client.close()

