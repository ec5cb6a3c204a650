"""One websocket connection's writer, and its prompt warm-up after a compaction.

``FrameWriter`` is the socket's one writer (docs/deployment.md: "Budgets"; docs/contract.md: WebSocket):

- ``send`` only puts the frame on the socket's outgoing queue and returns at once, so the turn thread,
  the socket's reader and the process's memory-event hub never wait on a slow peer.  One sender thread
  per socket writes the queue in order.
- The queue holds at most ``max_queued_bytes`` (``WS_SEND_QUEUE_BYTES``); a frame beyond it drops the
  connection (a peer that stopped reading), and every later ``send`` answers False.
- Every write completes within ``send_timeout`` seconds (``WS_SEND_TIMEOUT_SECONDS``) or the connection is
  dropped.
- simple-websocket's own reader thread also writes (pings, pongs, the close reply) and writes with one
  ``send`` that may write part of a frame under gevent; ``GuardedSocket`` makes every write of the
  connection, ours and the reader's, one ``sendall`` under one lock, so frames never interleave.

``CompactionWarmup`` listens to the same memory events as the writer: when a
compaction of the socket's thread was applied (``memory`` ``succeeded``) it sends
the chat model the thread's new prompt prefix (``app.llm.warmup``; docs/contract.md:
``PROMPT_WARMUP``).  It never writes to the socket.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

import orjson
from flask import current_app
from simple_websocket import ConnectionClosed

from app.chat.turn import off_the_event_loop
from app.extensions import Services
from app.llm.warmup import PromptWarmup
from app.memory.context import ContextTooLong, assemble_context
from app.memory.state import thread_label
from app.store.thread_store import CorruptState, StoreUnavailable

if TYPE_CHECKING:
    from simple_websocket import Server

    from app.settings import Settings

log = logging.getLogger(__name__)

CLOSE_WAIT_SECONDS = 2.0  # longest wait for the peer's closing frame after the server closes
SEND_TIMEOUT_SECONDS = 10.0
MAX_QUEUED_BYTES = 1 << 20


class GuardedSocket:
    """A connection's socket whose every ``send`` is one ``sendall`` under one lock, within a time limit.

    Args:
        sock: the connection's socket (gevent's or the standard library's).
        lock: the lock every writer of the connection takes.
        send_timeout: seconds a write may take (the socket's timeout; reads are unaffected in practice:
            simple-websocket reads only after its selector said the socket is readable).
    """

    def __init__(self, sock: socket.socket, lock: threading.Lock, send_timeout: float) -> None:
        self._sock = sock
        self._lock = lock
        try:
            sock.settimeout(send_timeout)
        except (OSError, AttributeError):
            pass

    def send(self, data: bytes) -> int:
        with self._lock:
            self._sock.sendall(data)
        return len(data)

    def sendall(self, data: bytes) -> None:
        self.send(data)

    def recv(self, size: int) -> bytes:
        try:
            return self._sock.recv(size)
        except socket.timeout:
            raise OSError("read timed out") from None

    def abort(self) -> None:
        """Drop the connection now (a write blocked on it fails at once); nothing raised."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


_CLOSE = object()


class FrameWriter:
    """The one writer of one websocket: a bounded outgoing queue and its sender thread.

    Args:
        ws: the flask-sock (simple-websocket) connection.
        send_timeout: seconds one write may take before the connection is dropped.
        max_queued_bytes: most bytes of frames waiting to go out before the connection is dropped.

    Attributes:
        closed: True once no more frames are accepted (closed, dropped, or the handler ended).
        dropped: why the connection was dropped (``"queue_full"``, ``"send_timeout"``, ``"close_timeout"``),
            or None.
    """

    def __init__(self, ws: Server, *, send_timeout: float = SEND_TIMEOUT_SECONDS,
                 max_queued_bytes: int = MAX_QUEUED_BYTES) -> None:
        self._ws = ws
        self._lock = threading.Lock()        # the connection's write lock (GuardedSocket)
        self._cond = threading.Condition()   # the queue's
        self._queue: deque = deque()
        self._queued_bytes = 0
        self._sender: threading.Thread | None = None
        self._sent_close = threading.Event()
        self.max_queued_bytes = max_queued_bytes
        self.send_timeout = send_timeout
        self.closed = False
        self.dropped: str | None = None
        raw = getattr(ws, "sock", None)
        self._guarded = GuardedSocket(raw, self._lock, send_timeout) if raw is not None else None
        if self._guarded is not None:
            ws.sock = self._guarded

    @staticmethod
    def encode(frame: dict) -> str:
        """A frame as compact JSON text (UTF-8 as is)."""
        try:
            return orjson.dumps(frame).decode()  # a few times faster than json.dumps, on every delta frame
        except TypeError:  # what orjson refuses (a lone surrogate, a huge int) json still writes
            return json.dumps(frame, separators=(",", ":"))  # escaped: a lone surrogate cannot be UTF-8

    def send(self, frame: dict) -> bool:
        """Queue one frame; False (nothing raised) when the socket is closed or was just dropped because its
        queue is full.  Never waits on the peer."""
        data = self.encode(frame)
        with self._cond:
            if self.closed:
                return False
            if self._queued_bytes + len(data) > self.max_queued_bytes:
                self._drop_locked("queue_full")
                return False
            self._queue.append(data)
            self._queued_bytes += len(data)
            self._start_sender_locked()
            self._cond.notify()
        return True

    def error(self, code: str, message: str, **extra: object) -> bool:
        """Send ``{"type":"error","code","message", **extra}``."""
        return self.send({"type": "error", "code": code, "message": message, **extra})

    def close(self, code: int, reason: str, *, wait: float = CLOSE_WAIT_SECONDS) -> None:
        """Close the socket with ``code`` and ``reason`` after the frames already queued; nothing raised.

        Waits for the queue to be written (the connection is dropped instead when that takes longer than
        the send timeout and ``CLOSE_WAIT_SECONDS``), then up to ``wait`` seconds for the peer's closing frame (simple-websocket's reader thread ends when it arrives), so a browser sees
        the code, not a reset connection.
        """
        with self._cond:
            if self.closed:
                return
            self.closed = True
            self._queue.append((_CLOSE, code, reason))
            self._start_sender_locked()
            self._cond.notify()
        sender = self._sender
        if sender is not None and sender is not threading.current_thread():
            sender.join(self.send_timeout + CLOSE_WAIT_SECONDS)
            if sender.is_alive():  # a peer that takes its frames too slowly: no clean close for it
                with self._cond:
                    self._drop_locked("close_timeout")
                return
        if self._sent_close.is_set():
            self._join_reader(wait)

    def peer_closed(self, wait: float = CLOSE_WAIT_SECONDS) -> None:
        """The connection was closed by the peer or failed by the protocol (``ConnectionClosed``): wait up to
        ``wait`` seconds for simple-websocket's reader thread to end; nothing raised.

        That thread marks the connection closed *before* it writes its closing reply (for bad UTF-8, close
        1007); a handler that returned at once would let the web server write its own bytes into the
        upgraded socket first, and the peer would read them as a broken frame.  Once the thread ends its
        reply is written and the socket closed.
        """
        self._join_reader(wait)

    def _join_reader(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for simple-websocket's reader thread to end (not from that thread)."""
        reader = getattr(self._ws, "thread", None)
        if reader is not None and reader is not threading.current_thread() and wait > 0:
            reader.join(wait)

    def finish(self) -> None:
        """The connection ended (the handler returns): accept no more frames, stop the sender."""
        with self._cond:
            self.closed = True
            self._queue.clear()
            self._queued_bytes = 0
            self._cond.notify()

    def _drop_locked(self, why: str) -> None:
        """Drop the connection (a stuck or failed peer): nothing more is sent; the handler sees it closed."""
        if self.dropped is None:
            self.dropped = why
            log.info("websocket dropped: %s", why)
        self.closed = True
        self._queue.clear()
        self._queued_bytes = 0
        self._cond.notify()
        if self._guarded is not None:
            self._guarded.abort()

    def _start_sender_locked(self) -> None:
        if self._sender is None:
            self._sender = threading.Thread(target=self._run, name="ws-sender", daemon=True)
            self._sender.start()

    def _run(self) -> None:
        """The sender: write queued frames in order until closed, dropped or finished."""
        while True:
            with self._cond:
                while not self._queue:
                    if self.closed:
                        return
                    self._cond.wait()
                item = self._queue.popleft()
                if isinstance(item, str):
                    self._queued_bytes -= len(item)
            try:
                if isinstance(item, tuple):
                    _, code, reason = item
                    self._ws.close(reason=code, message=reason)
                    self._sent_close.set()
                    return
                self._ws.send(item)
            except socket.timeout:
                with self._cond:
                    self._drop_locked("send_timeout")
                return
            except (ConnectionClosed, OSError):
                with self._cond:
                    self.closed = True
                    self._queue.clear()
                    self._queued_bytes = 0
                return


def prompt_warmup(settings: Settings) -> PromptWarmup:
    """The process's ``PromptWarmup`` (created on first use, in the Flask app's extensions)."""
    ext = current_app.extensions
    warmup = ext.get("prompt_warmup")
    if warmup is None:
        warmup = ext.setdefault("prompt_warmup", PromptWarmup(settings))
    return warmup


class CompactionWarmup:
    """A memory-event listener of one socket: after an applied compaction, warm the thread's new prompt prefix.

    Args:
        services: the process's ``Services`` (settings, store, token counter, the chat client).
        thread_id: the socket's thread (the session's own: the prefix is its own prompt).
        warmup: the process's ``PromptWarmup``.
        turn_in_flight: True while a turn of this socket is in flight.

    Skipped (nothing sent) when ``PROMPT_WARMUP`` is off for this deployment, or when the thread cannot be
    read; with a server other than the bundled chat server's proxy also while a turn of this socket is in flight
    or any turn of this process streams (a warm-up must not delay it: such a server has one slot).  The proxy
    queues a warm-up and lets every turn preempt it (``PromptWarmup.queued``): nothing waits behind it.  Runs in
    its own thread; never raises, never writes.
    """

    def __init__(self, services: Services, thread_id: str, warmup: PromptWarmup, turn_in_flight: Callable[[], bool]):
        self.services = services
        self.thread_id = thread_id
        self.warmup = warmup
        self.turn_in_flight = turn_in_flight
        self.thread: threading.Thread | None = None  # the last warm-up's thread (tests join it)

    def __call__(self, frame: dict) -> None:
        if frame.get("status") != "succeeded" or not self.services.settings.warms_prompts:
            return
        if self._busy():
            log.debug("prompt warm-up of %s skipped: a turn is in flight", thread_label(self.thread_id))
            return
        self.thread = threading.Thread(target=self.run, name="prompt-warmup", daemon=True)
        self.thread.start()

    def _busy(self) -> bool:
        if self.warmup.queued(self.thread_id):
            return False
        return self.turn_in_flight() or self.services.llm.streams_in_flight > 0

    def prefix(self) -> list[dict] | None:
        """The thread's prompt prefix as the next turn will send it (``AssembledContext.prefix``), or None."""
        settings = self.services.settings
        try:
            archive = None
            if settings.fold_step > 1:  # the prompt shows turns folded since its last checkpoint from the archive
                state, archive = self.services.archive.load_turn_memory(self.thread_id, run=off_the_event_loop)
            else:
                state = self.services.store.load(self.thread_id)
            context = off_the_event_loop(lambda: assemble_context(
                state, "", system_prompt=settings.system_prompt, counter=self.services.counter,
                context_tokens=settings.model_context_tokens, reserved_output_tokens=settings.reserved_output_tokens,
                archive=archive, recall_share=0.0, fold_step=settings.fold_step,
                answer_max_tokens=settings.prompt_answer_max_tokens))
        except (StoreUnavailable, CorruptState, ContextTooLong) as exc:
            log.info("prompt warm-up of %s skipped: %s", thread_label(self.thread_id), type(exc).__name__)
            return None
        return [m.to_openai() for m in context.prefix]

    def run(self) -> bool:
        """Read the thread and send its prefix (this thread); True when the server answered."""
        try:
            messages = self.prefix()
            if not messages or self._busy():
                return False
            return self.warmup.prefill(messages, label=f"of {thread_label(self.thread_id)}", thread_id=self.thread_id)
        except Exception:
            log.warning("prompt warm-up of %s failed", thread_label(self.thread_id), exc_info=True)
            return False
