"""Client frames of ``/ws/chat``: parsing and validation (docs/contract.md: WebSocket).

Every bad frame gives a ``FrameError`` with an error code of the contract and a
message for people; the connection stays usable.  A message frame's fields are checked by
``MessageFrameSchema`` (marshmallow, ``app.chat.client_input``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from marshmallow import validates

from app.chat.client_input import (
    INVALID_TEXT,
    ClientRefused,
    ClientSchema,
    JSONRefused,
    Refusal,
    check,
    client_text,
    is_blank,
    load_client,
    loads_client_json,
    message_id,
    refuse,
    storable,
)

EMPTY_INPUT = Refusal("empty_input", "Please type a message first.")
INVALID_ID = Refusal("invalid_id", "The message id must be 1-128 letters, digits, '-', '_', '.' or ':'.")
NOT_READABLE = Refusal("invalid_json", "That message could not be read.")


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


def parse_frame(data: str | bytes, *, max_input_chars: int) -> MessageFrame | CancelFrame:
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
            raise FrameError(INVALID_TEXT.code, INVALID_TEXT.message) from None
        raise FrameError("invalid_json", "That message was not valid JSON.") from None
    if not isinstance(frame, dict):
        raise FrameError("invalid_json", "A message must be a JSON object.")
    kind = frame.get("type")
    if kind == "cancel":
        return CancelFrame()
    if kind != "message":
        raise FrameError("unknown_type", "Unknown message type.")
    try:
        fields = load_client_frame(frame, max_input_chars)
    except ClientRefused as refused:
        raise FrameError(refused.code, refused.message) from None
    return MessageFrame(fields["text"].strip(), fields["id"])


class MessageFrameSchema(ClientSchema):
    """The fields of ``{"type":"message","id"?,"text"}``: the text not blank (nothing but whitespace and
    invisible format characters, Unicode category Cf, is blank), storable and at most
    ``max_input_chars`` characters once trimmed; the id a message id, null or absent."""

    text = client_text(EMPTY_INPUT, check(lambda text: not is_blank(text), EMPTY_INPUT), storable, required=True)
    id = message_id(INVALID_ID, load_default=None, allow_none=True)

    def __init__(self, *, max_input_chars: int, **kwargs: Any) -> None:
        self.max_input_chars = max_input_chars
        super().__init__(**kwargs)

    @validates("text")
    def _length(self, text: str, **kwargs: Any) -> None:
        if len(text.strip()) > self.max_input_chars:
            raise refuse(Refusal("input_too_long", f"Messages are limited to {self.max_input_chars} characters."))


@lru_cache(maxsize=8)
def _frame_schema(max_input_chars: int) -> MessageFrameSchema:
    return MessageFrameSchema(max_input_chars=max_input_chars)


def load_client_frame(frame: dict, max_input_chars: int) -> dict:
    """A message frame's ``{"text", "id"}`` (text as sent, id or None); ``ClientRefused`` when refused."""
    return load_client(_frame_schema(max_input_chars), frame, NOT_READABLE)
