"""Client frames of ``/ws/chat``: parsing and validation (docs/contract.md: WebSocket).

Every bad frame gives a ``FrameError`` with an error code of the contract and a
message for people; the connection stays usable.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from app.memory.schemas import MESSAGE_ID_RE

# The most nested a client's JSON may be: orjson's own bound (it refuses deeper input without
# recursing in Python, so no RecursionError whatever the nesting).
MAX_JSON_DEPTH = 1024
INVALID_TEXT_MESSAGE = "That text contains characters that can't be stored (a NUL or a broken character)."


class JSONRefused(ValueError):
    """Client JSON was refused: ``code`` is ``invalid_json`` or ``invalid_text`` (unpaired surrogate escape)."""

    def __init__(self, code: str):
        super().__init__(code)
        self.code = code


def loads_client_json(data: str | bytes):
    """Parse JSON a client sent (a websocket frame, an HTTP body) with orjson.

    Nesting is bounded by orjson (``MAX_JSON_DEPTH`` levels); an escape of an unpaired UTF-16
    surrogate (``"\\ud800"``) is refused, since such text can never be stored or sent.

    Raises:
        JSONRefused: ``invalid_text`` for an unpaired surrogate, ``invalid_json`` for anything else
            that is not JSON (including bytes that are not UTF-8 and nesting deeper than the bound).
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        # orjson names the surrogate problem in its message; only the category leaves this function
        raise JSONRefused("invalid_text" if "surrogate" in str(exc) else "invalid_json") from None


def text_is_storable(text: str) -> bool:
    """False when ``text`` holds a NUL character or an unpaired surrogate (not storable, not sendable)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
        FrameError: ``invalid_json`` (not JSON, not an object, nested deeper than ``MAX_JSON_DEPTH``),
            ``invalid_text`` (a NUL or an unpaired surrogate in the text), ``unknown_type``,
            ``empty_input``, ``input_too_long`` or ``invalid_id``.
    """
    if isinstance(data, (bytes, bytearray)):
        raise FrameError("invalid_json", "Messages must be JSON text frames.")
    try:
        frame = loads_client_json(data)
    except JSONRefused as exc:
        if exc.code == "invalid_text":
            raise FrameError("invalid_text", INVALID_TEXT_MESSAGE) from None
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
    if not text_is_storable(text):
        raise FrameError("invalid_text", INVALID_TEXT_MESSAGE)
    if len(text) > max_input_chars:
        raise FrameError("input_too_long", f"Messages are limited to {max_input_chars} characters.")
    client_id = frame.get("id")
    if client_id is not None and (not isinstance(client_id, str) or not MESSAGE_ID_RE.match(client_id)):
        raise FrameError("invalid_id", "The message id must be 1-128 letters, digits, '-', '_', '.' or ':'.")
    return MessageFrame(text, client_id)
