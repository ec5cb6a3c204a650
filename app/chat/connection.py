"""One websocket connection's writer, and its prompt warm-up after a compaction.

flask-sock (simple-websocket) corrupts frames when two threads send at once; the
turn thread, the socket's reader and the memory-event hub all send through
``FrameWriter.send``, whose one lock keeps frames from interleaving.

``CompactionWarmup`` listens to the same memory events as the writer: when a
compaction of the socket's thread was applied (``memory`` ``succeeded``) it sends
the chat model the thread's new prompt prefix (``app.llm.warmup``; docs/contract.md:
``PROMPT_WARMUP``).  It never writes to the socket.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Callable

import orjson
from flask import current_app
from simple_websocket import ConnectionClosed

from app.extensions import Services
from app.llm.warmup import PromptWarmup
from app.memory.context import ContextTooLong, assemble_context
from app.store.thread_store import CorruptState, StoreUnavailable

log = logging.getLogger(__name__)

CLOSE_WAIT_SECONDS = 2.0  # longest wait for the peer's closing frame after the server closes


class FrameWriter:
    """Serialises JSON frames onto one websocket.

    Args:
        ws: the flask-sock websocket.
    """

    def __init__(self, ws):
        self._ws = ws
        self._lock = threading.Lock()
        self.closed = False

    def send(self, frame: dict) -> bool:
        """Send one frame (compact JSON, UTF-8 as is); False (and nothing raised) when the socket is closed."""
        try:
            data = orjson.dumps(frame).decode()  # a few times faster than json.dumps, on every delta frame
        except TypeError:  # what orjson refuses (a lone surrogate, a huge int) json still writes
            data = json.dumps(frame, separators=(",", ":"))  # escaped: a lone surrogate cannot be UTF-8
        with self._lock:
            if self.closed:
                return False
            try:
                self._ws.send(data)
                return True
            except (ConnectionClosed, OSError):
                self.closed = True
                return False

    def close(self, code: int, reason: str, *, wait: float = CLOSE_WAIT_SECONDS) -> None:
        """Close the socket with ``code`` and ``reason`` (after any frame being sent); nothing raised.

        Then waits up to ``wait`` seconds for the peer's closing frame (simple-websocket's reader
        thread ends when it arrives), so the connection ends cleanly: a browser sees the code, not a
        reset connection.
        """
        with self._lock:
            if self.closed:
                return
            self.closed = True
            try:
                self._ws.close(reason=code, message=reason)
            except (ConnectionClosed, OSError):
                return
        reader = getattr(self._ws, "thread", None)
        if reader is not None and reader is not threading.current_thread():
            reader.join(wait)

    def error(self, code: str, message: str) -> bool:
        """Send ``{"type":"error","code","message"}``."""
        return self.send({"type": "error", "code": code, "message": message})


def prompt_warmup(settings) -> PromptWarmup:
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

    Skipped (nothing sent) when ``PROMPT_WARMUP`` is off for this deployment, while a turn of this socket
    is in flight or any turn of this process streams (a warm-up must not delay it: the bundled server has
    one slot), or when the thread cannot be read.  Runs in its own thread; never raises, never writes.
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
            log.debug("prompt warm-up of %s skipped: a turn is in flight", self.thread_id[:13])
            return
        self.thread = threading.Thread(target=self.run, name="prompt-warmup", daemon=True)
        self.thread.start()

    def _busy(self) -> bool:
        return self.turn_in_flight() or self.services.llm.streams_in_flight > 0

    def prefix(self) -> list[dict] | None:
        """The thread's prompt prefix as the next turn will send it (``AssembledContext.prefix``), or None."""
        settings = self.services.settings
        try:
            state = self.services.store.load(self.thread_id)
            context = assemble_context(state, "", system_prompt=settings.system_prompt,
                                       counter=self.services.counter, context_tokens=settings.model_context_tokens,
                                       reserved_output_tokens=settings.reserved_output_tokens)
        except (StoreUnavailable, CorruptState, ContextTooLong) as exc:
            log.info("prompt warm-up of %s skipped: %s", self.thread_id[:13], type(exc).__name__)
            return None
        return [m.to_openai() for m in context.prefix]

    def run(self) -> bool:
        """Read the thread and send its prefix (this thread); True when the server answered."""
        try:
            messages = self.prefix()
            if not messages or self._busy():
                return False
            return self.warmup.prefill(messages, label=f"of {self.thread_id[:13]}", thread_id=self.thread_id)
        except Exception:
            log.warning("prompt warm-up of %s failed", self.thread_id[:13], exc_info=True)
            return False
