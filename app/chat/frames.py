"""Client frames of ``/ws/chat``: parsing and validation (docs/contract.md: WebSocket).

Every bad frame gives a ``FrameError`` with an error code of the contract and a
message for people; the connection stays usable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from app.memory.schemas import MESSAGE_ID_RE


class FrameError(ValueError):
    """A client frame was refused: ``code`` (an error code of docs/contract.md) and ``message`` for people."""

    def __init__(self, code: str, message: str):
        super().__init__(code)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class MessageFrame:
    """``{"type":"message","id"?,"text"}``: the text is the person's, trimmed; ``id`` is the client's or None."""

    text: str
    client_id: str | None


@dataclass(frozen=True)
class CancelFrame:
    """``{"type":"cancel"}``."""


def parse_frame(data, *, max_input_chars: int):
    """Parse one received websocket message.

    Args:
        data: what ``ws.receive()`` returned (``str`` for text frames, ``bytes`` for binary).
        max_input_chars: longest accepted user text, in characters (``MAX_INPUT_CHARS``).

    Returns:
        ``MessageFrame`` or ``CancelFrame``.

    Raises:
        FrameError: ``invalid_json``, ``unknown_type``, ``empty_input``, ``input_too_long`` or ``invalid_id``.
    """
    if isinstance(data, (bytes, bytearray)):
        raise FrameError("invalid_json", "Messages must be JSON text frames.")
    try:
        frame = json.loads(data)
    except ValueError:
        raise FrameError("invalid_json", "That message was not valid JSON.") from None
    if not isinstance(frame, dict):
        raise FrameError("invalid_json", "A message must be a JSON object.")
    kind = frame.get("type")
    if kind == "cancel":
        return CancelFrame()
    if kind != "message":
        raise FrameError("unknown_type", "Unknown message type.")
    text = frame.get("text")
    if not isinstance(text, str) or not text.strip():
        raise FrameError("empty_input", "Please type a message first.")
    text = text.strip()
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape such as "\ud83d": not valid Unicode text
        raise FrameError("invalid_json", "That message contained invalid characters.") from None
    if len(text) > max_input_chars:
        raise FrameError("input_too_long", f"Messages are limited to {max_input_chars} characters.")
    client_id = frame.get("id")
    if client_id is not None and (not isinstance(client_id, str) or not MESSAGE_ID_RE.match(client_id)):
        raise FrameError("invalid_id", "The message id must be 1-128 letters, digits, '-', '_', '.' or ':'.")
    return MessageFrame(text, client_id)
