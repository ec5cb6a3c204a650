"""What a client sends: its JSON (``loads_client_json``) and the marshmallow fields and loader shared by the
websocket's message frame (``app.chat.frames``) and the HTTP API's request bodies (``app.web.bodies``).

Every problem a schema finds is a ``Refusal``: an error code of docs/contract.md and one sentence for the
person (marshmallow keeps messages that are not strings as they are given, so each field's messages are
``Refusal``s: ``refuse(refusal)`` is the error to raise, ``check`` a validator).  ``load_client`` answers the first problem in the schema's field order as a ``ClientRefused``,
so a client hears one clear reason, the same one the hand-written checks gave before.  Unknown keys are
ignored (marshmallow's ``EXCLUDE``): a newer page may send more than this server reads.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from marshmallow import EXCLUDE, Schema, ValidationError, fields

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


def loads_client_json(data: str | bytes) -> Any:
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


@dataclass(frozen=True)
class Refusal:
    """One problem with a client's input: ``code`` (docs/contract.md) and ``message`` for people."""

    code: str
    message: str


class ClientRefused(ValueError):
    """A client's input was refused: ``code`` and ``message`` of its first ``Refusal``."""

    def __init__(self, refusal: Refusal):
        super().__init__(refusal.code)
        self.code, self.message = refusal.code, refusal.message


INVALID_TEXT = Refusal("invalid_text", INVALID_TEXT_MESSAGE)


def text_is_storable(text: str) -> bool:
    """False when ``text`` holds a NUL character or an unpaired surrogate (not storable, not sendable)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def without_format_characters(text: str) -> str:
    """``text`` without its invisible format characters (Unicode category Cf: zero-width spaces and joiners,
    bidirectional marks, the soft hyphen, the byte order mark...).  Used to judge a text (is it blank? are
    two pins the same?), never to change what is stored."""
    if text.isascii():
        return text
    return "".join(ch for ch in text if unicodedata.category(ch) != "Cf")


def is_blank(text: str) -> bool:
    """True when ``text`` holds nothing visible once NFKC-normalised: only whitespace, format characters
    (category Cf: zero-width spaces and joiners, bidirectional marks...) and control characters (category Cc:
    NUL...).  One rule for every text a person sends (docs/contract.md: HTTP, blank text)."""
    if text.isascii():
        return not "".join(ch for ch in text if ch.isprintable()).strip()
    normalised = unicodedata.normalize("NFKC", text)
    return not "".join(ch for ch in normalised if unicodedata.category(ch) not in ("Cf", "Cc")).strip()


def refuse(refusal: Refusal) -> ValidationError:
    """The ``ValidationError`` a field validator, ``@validates`` or ``@pre_load`` method raises for ``refusal``
    (marshmallow keeps the list's items as given)."""
    return ValidationError([refusal])


def check(test: Callable[[Any], bool], refusal: Refusal) -> Callable[[Any], None]:
    """A marshmallow validator: ``refusal`` when ``test(value)`` is false."""
    def validator(value: Any) -> None:
        if not test(value):
            raise refuse(refusal)
    return validator


class ClientSchema(Schema):
    """A client's JSON object: unknown keys ignored."""

    class Meta:
        unknown = EXCLUDE


storable = check(text_is_storable, INVALID_TEXT)
"""Validator: ``invalid_text`` when a text holds a NUL or an unpaired surrogate."""


def refused_as(wrong: Refusal) -> dict[str, Any]:
    """A field's ``error_messages``: ``wrong`` when the value is missing, null or not of the field's type.
    marshmallow keeps any object as a message (its hints say ``str``), so ``first_refusal`` finds it."""
    return {"required": wrong, "null": wrong, "invalid": wrong}


def client_text(wrong: Refusal, *validators: Callable[[Any], None], **kwargs: Any) -> fields.String:
    """A text field: ``wrong`` when it is missing, null or not a string, then ``validators`` in order
    (``storable`` among them).  ``kwargs`` go to ``fields.String``."""
    return fields.String(error_messages=refused_as(wrong),
                         validate=list(validators), **kwargs)


def message_id(wrong: Refusal, **kwargs: Any) -> fields.String:
    """A message id (1-128 of ``[A-Za-z0-9_.:-]``, docs/contract.md); ``wrong`` when it is not one."""
    return fields.String(error_messages=refused_as(wrong),
                         validate=check(lambda value: MESSAGE_ID_RE.match(value) is not None, wrong), **kwargs)


def first_refusal(errors: Any, order: list[str]) -> Refusal | None:
    """The first ``Refusal`` in marshmallow's ``errors`` (a dict by field name, lists, or one message),
    fields taken in ``order`` and the schema's own problems (``_schema``) before them."""
    if isinstance(errors, Refusal):
        return errors
    if isinstance(errors, dict):
        for key in ["_schema", *order, *errors]:
            if key in errors and (found := first_refusal(errors[key], order)) is not None:
                return found
    if isinstance(errors, list):
        for item in errors:
            if (found := first_refusal(item, order)) is not None:
                return found
    return None


def load_client(schema: Schema, data: dict, otherwise: Refusal) -> dict:
    """``schema.load(data)``: the loaded fields.

    Raises:
        ClientRefused: the first problem found (``otherwise`` for a problem that carries no ``Refusal``).
    """
    try:
        return schema.load(data)
    except ValidationError as exc:
        order = [field.data_key or name for name, field in schema.fields.items()]
        raise ClientRefused(first_refusal(exc.messages, order) or otherwise) from None
