"""``/ws/chat``: the websocket route (docs/contract.md: WebSocket).

The handler thread reads frames; each turn streams in its own thread; every
frame goes out through the connection's ``FrameWriter``.  One turn in flight
per connection.  Only pages of an allowed origin may open the socket, so a
cross-site page cannot drive a visitor's thread: the web layer gives this
blueprint that check as its ``before_request`` (``app/web/security.py``).
"""

from __future__ import annotations

import threading

from flask import Blueprint, current_app
from flask_sock import Sock
from simple_websocket import ConnectionClosed

from app.chat.connection import FrameWriter
from app.chat.events import EventHub
from app.chat.frames import CancelFrame, FrameError, parse_frame
from app.chat.turn import Turn
from app.extensions import services
from app.identity import current_thread_id
from app.memory.context import ContextTooLong
from app.observability.metrics import websocket_closed, websocket_opened
from app.runtime.producers import CommandError, choose_producer
from app.store.redis_client import make_redis

sock = Sock()
bp = Blueprint("chat", __name__)


def event_hub() -> EventHub:
    """The process's memory-event hub (created on first use)."""
    ext = current_app.extensions
    hub = ext.get("chat_events")
    if hub is None:
        settings = services().settings
        url, cluster = settings.redis_url, settings.redis_cluster
        hub = ext.setdefault("chat_events", EventHub(
            lambda: make_redis(url, cluster=cluster, max_connections=4, socket_timeout=5.0), sharded=cluster))
    return hub


@sock.route("/ws/chat", bp=bp)
def chat_socket(ws):
    """Serve one browser connection until it closes."""
    svc = services()
    settings = svc.settings
    thread_id = current_thread_id()
    writer = FrameWriter(ws)
    hub = event_hub()
    hub.register(thread_id, writer.send)
    turn: Turn | None = None
    websocket_opened()
    try:
        while True:
            data = ws.receive()
            try:
                frame = parse_frame(data, max_input_chars=settings.max_input_chars)
            except FrameError as exc:
                writer.error(exc.code, exc.message)
                continue
            if isinstance(frame, CancelFrame):
                if turn is not None:
                    turn.cancel()
                continue
            if turn is not None and turn.active:
                writer.error("turn_in_progress", "Please wait for the current answer, or stop it first.")
                continue
            try:  # /tasklist, /delivery, a confirmation, or chat (with tools when on)
                producer = choose_producer(svc, thread_id, frame.text)
            except CommandError as exc:
                writer.error(exc.code, exc.message)
                continue
            turn = Turn(svc, writer, thread_id, frame.text, frame.client_id, producer=producer)
            try:
                context = turn.prepare()
            except ContextTooLong:
                turn.abandon()
                writer.error("input_too_long", "That message is too long for the model's context window.")
                continue
            threading.Thread(target=turn.run, args=(context,), name="chat-turn", daemon=True).start()
    except ConnectionClosed:
        pass
    finally:
        websocket_closed()
        hub.unregister(thread_id, writer.send)
        writer.closed = True
        if turn is not None:
            turn.abandon()
