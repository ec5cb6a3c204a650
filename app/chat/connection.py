"""One websocket connection's writer: every frame goes through one lock, so frames never interleave.

flask-sock (simple-websocket) corrupts frames when two threads send at once; the
turn thread, the socket's reader and the memory-event hub all send through
``FrameWriter.send``.
"""

from __future__ import annotations

import json
import logging
import threading

import orjson
from simple_websocket import ConnectionClosed

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
