"""``/ws/chat``: the websocket route (contract: WebSocket).

The handler thread reads frames; each turn streams in its own thread; every
frame goes out through the connection's ``FrameWriter``.  One turn in flight
per connection.  Only pages of an allowed origin may open the socket, so a
cross-site page cannot drive a visitor's thread.
"""

from __future__ import annotations

import logging
import threading
from urllib.parse import urlparse

from flask import Blueprint, abort, current_app, request
from flask_sock import Sock
from simple_websocket import ConnectionClosed

from app.chat.connection import FrameWriter
from app.chat.events import EventHub
from app.chat.frames import CancelFrame, FrameError, parse_frame
from app.chat.turn import Turn
from app.extensions import services
from app.memory.context import ContextTooLong
from app.observability.metrics import websocket_closed, websocket_opened
from app.runtime.producers import CommandError, choose_producer
from app.store.redis_client import make_redis
from app.web.identity import current_thread_id

log = logging.getLogger(__name__)
sock = Sock()
bp = Blueprint("chat", __name__)


def origin_allowed(origin: str | None, host: str, allowed: tuple[str, ...]) -> bool:
    """Same-origin check: ``origin`` is in ``ALLOWED_ORIGINS``, or (none configured) names this host."""
    if not origin:
        return False
    origin = origin.rstrip("/")
    if allowed:
        return origin in allowed
    parsed = urlparse(origin)
    return parsed.scheme in {"http", "https"} and parsed.netloc == host


@bp.before_app_request
def _refuse_foreign_origin():
    if request.path == "/ws/chat" and not origin_allowed(
            request.headers.get("Origin"), request.host, services().settings.allowed_origins):
        log.info("websocket refused: origin not allowed")
        abort(403)


def event_hub() -> EventHub:
    """The process's memory-event hub (created on first use)."""
    ext = current_app.extensions
    hub = ext.get("chat_events")
    if hub is None:
        url = services().settings.redis_url
        hub = ext.setdefault("chat_events", EventHub(lambda: make_redis(url, max_connections=2, socket_timeout=5.0)))
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
            try:  # issue 6: /tasklist, /delivery, a confirmation, or chat (with tools when on)
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
