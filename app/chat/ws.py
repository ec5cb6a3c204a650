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
from typing import TYPE_CHECKING

from flask import Blueprint, current_app, request
from flask_sock import Sock
from simple_websocket import ConnectionClosed

from app.chat.connection import CompactionWarmup, FrameWriter, prompt_warmup
from app.chat.events import EventHub
from app.chat.frames import CancelFrame, FrameError, parse_frame
from app.chat.turn import Turn
from app.extensions import Services, services
from app.identity import current_thread_id
from app.memory.context import ContextTooLong
from app.memory.state import thread_label
from app.observability.metrics import count_refusal, websocket_closed, websocket_opened
from app.runtime.producers import CommandError, choose_producer
from app.store.quotas import client_of
from app.store.redis_client import make_redis
from app.store.socket_leases import LeaseOwner
from app.store.thread_store import CorruptState, StoreUnavailable

if TYPE_CHECKING:
    from simple_websocket import Server

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
CLOSE_RATE_LIMITED = 4430  # this network address opened WS_NEW_PER_MINUTE sockets in the last minute
CLOSE_BUSY = 1013          # "try again later": this worker serves its most sockets (WS_MAX_PER_WORKER)
CLOSE_INTERNAL = 1011      # the handler failed; the page reconnects
LEASE_SECONDS = 60.0       # a session socket's lease in Redis, renewed every third of it


class _OpenSockets:
    """How many websockets this process serves; ``enter`` refuses beyond ``most``."""

    def __init__(self) -> None:
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
def chat_socket(ws: Server) -> None:
    """Serve one browser connection until it closes, the person goes idle, or a limit refuses it.

    Limits (docs/contract.md: WebSocket, close codes): at most ``ws_per_worker_limit`` sockets per
    process (else close 1013), at most ``WS_MAX_PER_SESSION`` per session over every process (a
    lease in Redis; else close 4429; with Redis down the socket is served), and a socket that sends
    nothing for ``WS_IDLE_TIMEOUT_SECONDS`` while no turn is in flight is closed with 4408.  An
    unexpected error closes the socket with 1011 (never an HTTP answer inside the upgraded socket).
    """
    settings = services().settings
    writer = FrameWriter(ws, send_timeout=settings.ws_send_timeout, max_queued_bytes=settings.ws_send_queue_bytes)
    if not OPEN_SOCKETS.enter(settings.ws_per_worker_limit):
        log.warning("websocket refused: this worker serves %d sockets already", settings.ws_per_worker_limit)
        count_refusal("ws_worker")
        writer.close(CLOSE_BUSY, "server busy")
        return
    try:
        _serve(ws, writer)
    except ConnectionClosed:
        writer.peer_closed()
    except Exception:
        log.exception("websocket handler failed")
        writer.close(CLOSE_INTERNAL, "internal error")
    finally:
        writer.finish()
        if writer.dropped:
            count_refusal(writer.dropped)
        OPEN_SOCKETS.leave()


def _claim_session_place(svc: Services, thread_id: str, socket_id: str) -> bool:
    """True when the session may open one more socket (or the store cannot tell: served anyway)."""
    try:
        return svc.sockets.claim(LeaseOwner.session(thread_id), socket_id, most=svc.settings.ws_max_per_session,
                                 lease_seconds=LEASE_SECONDS)
    except StoreUnavailable:
        log.warning("socket limit of %s not checked: store unavailable", thread_label(thread_id))
        return True


def client_address(svc: Services) -> str:
    """The client the request's address counts as (``TRUSTED_PROXIES``: werkzeug's ProxyFix), as every
    budget counts it (``app.store.quotas.client_of``)."""
    return client_of(request.remote_addr, svc.settings.client_ipv6_prefix)


def _client_refusal(svc: Services, address: str, socket_id: str) -> tuple[int, str] | None:
    """``(close code, reason)`` when this address may not open one more socket, else None (its place taken).

    ``WS_NEW_PER_MINUTE`` new sockets per address and minute (4430), ``WS_MAX_PER_CLIENT`` open ones
    (4429).  With the store down nothing is refused.
    """
    quotas = svc.settings.client_quotas
    try:
        if quotas.ws_new_per_minute and not svc.quotas.hit("ws_new", address, f"{quotas.ws_new_per_minute}/minute"):
            count_refusal("ws_new")
            return CLOSE_RATE_LIMITED, "too many new connections"
        if quotas.ws_max_per_client and not svc.sockets.claim(
                LeaseOwner.client(address), socket_id, most=quotas.ws_max_per_client, lease_seconds=LEASE_SECONDS):
            count_refusal("ws_client")
            return CLOSE_SESSION_LIMIT, "too many open chats from your network"
    except StoreUnavailable:
        log.warning("client socket limits not checked: store unavailable")
    return None


def _release_client_place(svc: Services, address: str, socket_id: str) -> None:
    if svc.settings.client_quotas.ws_max_per_client:
        try:
            svc.sockets.release(LeaseOwner.client(address), socket_id)
        except StoreUnavailable:
            pass  # the lease ends by itself


def _serve(ws: Server, writer: FrameWriter) -> None:
    svc = services()
    thread_id = current_thread_id()
    address = client_address(svc)
    socket_id = uuid.uuid4().hex
    refusal = _client_refusal(svc, address, socket_id)
    if refusal is not None:
        log.info("websocket of %s refused: %s", thread_label(thread_id), refusal[1])
        writer.close(*refusal, wait=0.5)
        return
    try:
        _serve_claimed(ws, writer, svc, thread_id, address, socket_id)
    finally:
        _release_client_place(svc, address, socket_id)


def _serve_claimed(ws: Server, writer: FrameWriter, svc: Services, thread_id: str, address: str,
                   socket_id: str) -> None:
    settings = svc.settings
    if not _claim_session_place(svc, thread_id, socket_id):
        log.info("websocket of %s refused: %d open already", thread_label(thread_id), settings.ws_max_per_session)
        count_refusal("ws_session")
        writer.close(CLOSE_SESSION_LIMIT, "too many open chats", wait=0.5)
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
                    svc.sockets.renew(LeaseOwner.session(thread_id), socket_id, lease_seconds=LEASE_SECONDS)
                    if settings.client_quotas.ws_max_per_client:
                        svc.sockets.renew(LeaseOwner.client(address), socket_id, lease_seconds=LEASE_SECONDS)
                except StoreUnavailable:
                    pass
            if turn is not None and turn.active:
                last_heard = now  # a person waiting for an answer is not idle
            idle_at = last_heard + settings.ws_idle_timeout
            if now >= idle_at:
                log.info("websocket of %s closed: idle for %.0f s", thread_label(thread_id), settings.ws_idle_timeout)
                writer.close(CLOSE_IDLE, "idle")
                return
            data = ws.receive(timeout=max(0.05, min(idle_at, renew_at) - now))
            if data is None:
                continue
            last_heard = time.monotonic()
            turn = _handle(svc, writer, thread_id, data, turn, address=address)
    finally:
        websocket_closed()
        hub.unregister(thread_id, writer.send)
        hub.unregister(thread_id, warmer)
        writer.finish()
        if turn is not None:
            turn.abandon()
        try:
            svc.sockets.release(LeaseOwner.session(thread_id), socket_id)
        except StoreUnavailable:
            pass  # the lease ends by itself


def _turn_refusal(svc: Services, thread_id: str, address: str, *, spend: bool = False
                  ) -> tuple[str, str, int | None] | None:
    """``(code, message, retry after seconds or None)`` when a new turn may not start now, else None.

    ``rate_limited``: the session's ``TURNS_PER_MINUTE_PER_SESSION`` or the address's
    ``TURNS_PER_MINUTE_PER_CLIENT`` are spent; ``store_full``: the store is past ``STORE_FULL_FRACTION`` of
    its memory and this thread does not exist yet (existing threads go on).  With ``spend`` False nothing is
    counted (asked before the turn is prepared); with ``spend`` True the turn is counted (once it is
    accepted), so a message refused before its turn starts spends no quota (docs/deployment.md: "Budgets").
    With the store down nothing is refused here (the turn meets the store's own error).
    """
    quotas = svc.settings.client_quotas
    try:
        for kind, who, most in (("turn_session", thread_id, quotas.turns_per_minute_per_session),
                                ("turn_client", address, quotas.turns_per_minute_per_client)):
            if not most:
                continue
            limit = f"{most}/minute"
            if not (svc.quotas.hit(kind, who, limit) if spend else svc.quotas.allows(kind, who, limit)):
                count_refusal(kind.replace("turn_", "turns_"))
                wait = svc.quotas.retry_after(kind, who, limit)
                return ("rate_limited", f"You're sending messages too fast. Please wait {wait} s and try again.",
                        wait)
        if not spend and store_full(svc) and not svc.quotas.thread_exists(thread_id):
            count_refusal("store_full")
            return ("store_full", "The service is full right now, so new conversations can't start. "
                                  "Please try again later.", None)
    except StoreUnavailable:
        log.warning("turn quotas of %s not checked: store unavailable", thread_label(thread_id))
    return None


STORE_FULL_CHECK_SECONDS = 5.0  # how long a process trusts its last reading of the store's used memory


def store_full(svc: Services) -> bool:
    """True when the store's used memory is past ``STORE_FULL_FRACTION`` of its ``maxmemory`` (read at most
    once per ``STORE_FULL_CHECK_SECONDS`` per process; False when the store sets no ``maxmemory``).

    Raises:
        StoreUnavailable: the store did not answer.
    """
    cache = current_app.extensions.setdefault("store_fullness", {"at": None, "full": False})
    now = time.monotonic()
    if cache["at"] is None or now - cache["at"] >= STORE_FULL_CHECK_SECONDS:
        fraction = svc.quotas.used_memory_fraction()
        cache.update(at=now, full=fraction is not None and fraction >= svc.settings.store_full_fraction)
    return cache["full"]


def _handle(svc: Services, writer: FrameWriter, thread_id: str, data: str | bytes, turn: Turn | None, *,
            address: str = "unknown") -> Turn | None:
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
    refused = _turn_refusal(svc, thread_id, address)
    if refused is not None:
        code, message, wait = refused
        writer.error(code, message, **({"retryAfter": wait} if wait else {}))
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
    refused = _turn_refusal(svc, thread_id, address, spend=True)
    if refused is not None:  # another socket of this client took the last place meanwhile
        new.abandon()
        code, message, wait = refused
        writer.error(code, message, **({"retryAfter": wait} if wait else {}))
        return turn
    threading.Thread(target=new.run, args=(context,), name="chat-turn", daemon=True).start()
    return new
