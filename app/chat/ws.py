"""``/ws/chat``: the websocket route (docs/contract.md: WebSocket).

The handler thread reads frames; each turn streams in its own thread; every
frame goes out through the connection's ``FrameWriter``.  One turn in flight
per connection.  Only pages of an allowed origin may open the socket, so a
cross-site page cannot drive a visitor's thread: the web layer gives this
blueprint that check as its ``before_request`` (``app/web/security.py``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

from flask import Blueprint, current_app
from flask_sock import Sock
from simple_websocket import ConnectionClosed

from app.chat.connection import CompactionWarmup, FrameWriter, prompt_warmup
from app.chat.events import EventHub
from app.chat.frames import CancelFrame, FrameError, parse_frame
from app.chat.turn import Turn
from app.extensions import Services, services
from app.identity import current_thread_id
from app.memory.context import ContextTooLong
from app.observability.metrics import websocket_closed, websocket_opened
from app.runtime.producers import CommandError, choose_producer
from app.store.redis_client import make_redis
from app.store.thread_store import CorruptState, StoreUnavailable

log = logging.getLogger(__name__)
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


# Close codes of docs/contract.md: WebSocket (4xxx are the application's own).
CLOSE_IDLE = 4408          # nothing sent for WS_IDLE_TIMEOUT_SECONDS with no turn in flight
CLOSE_SESSION_LIMIT = 4429  # the session already has WS_MAX_PER_SESSION sockets open
CLOSE_BUSY = 1013          # "try again later": this worker serves its most sockets (WS_MAX_PER_WORKER)
CLOSE_INTERNAL = 1011      # the handler failed; the page reconnects
LEASE_SECONDS = 60.0       # a session socket's lease in Redis, renewed every third of it


class _OpenSockets:
    """How many websockets this process serves; ``enter`` refuses beyond ``most``."""

    def __init__(self):
        self._lock = threading.Lock()
        self.count = 0

    def enter(self, most: int) -> bool:
        with self._lock:
            if self.count >= most:
                return False
            self.count += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self.count -= 1


OPEN_SOCKETS = _OpenSockets()


@sock.route("/ws/chat", bp=bp)
def chat_socket(ws):
    """Serve one browser connection until it closes, the person goes idle, or a limit refuses it.

    Limits (docs/contract.md: WebSocket, close codes): at most ``ws_per_worker_limit`` sockets per
    process (else close 1013), at most ``WS_MAX_PER_SESSION`` per session over every process (a
    lease in Redis; else close 4429; with Redis down the socket is served), and a socket that sends
    nothing for ``WS_IDLE_TIMEOUT_SECONDS`` while no turn is in flight is closed with 4408.  An
    unexpected error closes the socket with 1011 (never an HTTP answer inside the upgraded socket).
    """
    settings = services().settings
    writer = FrameWriter(ws)
    if not OPEN_SOCKETS.enter(settings.ws_per_worker_limit):
        log.warning("websocket refused: this worker serves %d sockets already", settings.ws_per_worker_limit)
        writer.close(CLOSE_BUSY, "server busy")
        return
    try:
        _serve(ws, writer)
    except ConnectionClosed:
        pass
    except Exception:
        log.exception("websocket handler failed")
        writer.close(CLOSE_INTERNAL, "internal error")
    finally:
        OPEN_SOCKETS.leave()


def _claim_session_place(svc: Services, thread_id: str, socket_id: str) -> bool:
    """True when the session may open one more socket (or the store cannot tell: served anyway)."""
    try:
        return svc.store.claim_socket(thread_id, socket_id, most=svc.settings.ws_max_per_session,
                                      lease_seconds=LEASE_SECONDS)
    except StoreUnavailable:
        log.warning("socket limit of %s not checked: store unavailable", thread_id[:13])
        return True


def _serve(ws, writer: FrameWriter) -> None:
    svc = services()
    settings = svc.settings
    thread_id = current_thread_id()
    socket_id = uuid.uuid4().hex
    if not _claim_session_place(svc, thread_id, socket_id):
        log.info("websocket of %s refused: %d open already", thread_id[:13], settings.ws_max_per_session)
        writer.close(CLOSE_SESSION_LIMIT, "too many open chats")
        return
    hub = event_hub()
    hub.register(thread_id, writer.send)
    turn: Turn | None = None
    warmer = CompactionWarmup(svc, thread_id, prompt_warmup(settings), lambda: turn is not None and turn.active)
    if settings.warms_prompts:
        hub.register(thread_id, warmer)
    websocket_opened()
    now = time.monotonic()
    last_heard, renew_at = now, now + LEASE_SECONDS / 3
    try:
        while True:
            now = time.monotonic()
            if now >= renew_at:
                renew_at = now + LEASE_SECONDS / 3
                try:
                    svc.store.renew_socket(thread_id, socket_id, lease_seconds=LEASE_SECONDS)
                except StoreUnavailable:
                    pass
            if turn is not None and turn.active:
                last_heard = now  # a person waiting for an answer is not idle
            idle_at = last_heard + settings.ws_idle_timeout
            if now >= idle_at:
                log.info("websocket of %s closed: idle for %.0f s", thread_id[:13], settings.ws_idle_timeout)
                writer.close(CLOSE_IDLE, "idle")
                return
            data = ws.receive(timeout=max(0.05, min(idle_at, renew_at) - now))
            if data is None:
                continue
            last_heard = time.monotonic()
            turn = _handle(svc, writer, thread_id, data, turn)
    finally:
        websocket_closed()
        hub.unregister(thread_id, writer.send)
        hub.unregister(thread_id, warmer)
        writer.closed = True
        if turn is not None:
            turn.abandon()
        try:
            svc.store.release_socket(thread_id, socket_id)
        except StoreUnavailable:
            pass  # the lease ends by itself


def _handle(svc: Services, writer: FrameWriter, thread_id: str, data, turn: Turn | None) -> Turn | None:
    """Act on one received frame; return the connection's turn (a new one when a turn started)."""
    try:
        frame = parse_frame(data, max_input_chars=svc.settings.max_input_chars)
    except FrameError as exc:
        writer.error(exc.code, exc.message)
        return turn
    if isinstance(frame, CancelFrame):
        if turn is not None:
            turn.cancel()
        return turn
    if turn is not None and turn.active:
        writer.error("turn_in_progress", "Please wait for the current answer, or stop it first.")
        return turn
    try:  # /tasklist, /delivery, a confirmation, or chat (with tools when on)
        producer = choose_producer(svc, thread_id, frame.text)
    except CommandError as exc:
        writer.error(exc.code, exc.message)
        return turn
    new = Turn(svc, writer, thread_id, frame.text, frame.client_id, producer=producer)
    try:
        context = new.prepare()
    except ContextTooLong:
        new.abandon()
        writer.error("input_too_long", "That message is too long for the model's context window.")
        return turn
    except CorruptState:
        new.abandon()
        writer.error("memory_unreadable", "This conversation's memory can't be read. Start a new chat to go on.")
        return turn
    threading.Thread(target=new.run, args=(context,), name="chat-turn", daemon=True).start()
    return new
