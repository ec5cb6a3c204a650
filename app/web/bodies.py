"""Request bodies of the HTTP API, checked by marshmallow schemas (docs/contract.md: HTTP).

``load_body(schema, hint)`` reads the JSON object a POST must send and loads it with ``schema``; a refusal
is an ``ApiError`` 400 in the one error shape (``app.web.responses``): ``bad_request`` saying ``hint`` when
the body is not a JSON object, else the first problem the schema found, with its own code
(``invalid_text``, ``empty_pin``, ``pin_too_long``, ``reason_too_long`` or ``bad_request``) and sentence.
Keys a schema does not read are ignored on every route (``ClientSchema``: marshmallow's ``EXCLUDE``).
The fields and the loader are shared with the websocket's frames (``app.chat.client_input``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from flask import request
from marshmallow import Schema, fields, post_load, pre_load, validates

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
    refused_as,
    storable,
)
from app.memory.forget import PHRASE_MAX_CHARS
from app.observability.feedback import MAX_REASON_CHARS, RATINGS
from app.web.responses import ApiError

BAD_MESSAGE_ID = Refusal("bad_request", "That message id is not valid.")
BAD_RATING = Refusal("bad_request", 'The rating must be "up" or "down".')


def clean_pin_text(text: str) -> str:
    """A pin's text: whitespace runs collapsed to one space, trimmed."""
    return " ".join(text.split())


class PinBody(ClientSchema):
    """``POST /api/chat/pins``: ``{"text"}`` (the person's words) or ``{"messageId"}`` (a stored message), not both.

    Loads to ``{"text": str}`` (whitespace collapsed, not empty, at most ``pinned_max_chars`` characters)
    or ``{"messageId": str}``.
    """

    text = client_text(Refusal("bad_request", "The pin text must be a string."), storable)
    messageId = message_id(BAD_MESSAGE_ID)

    def __init__(self, *, pinned_max_chars: int, **kwargs: Any) -> None:
        self.pinned_max_chars = pinned_max_chars
        super().__init__(**kwargs)

    @pre_load
    def _one_of(self, data: dict, **kwargs: Any) -> dict:
        present = {key: value for key, value in data.items() if value is not None}
        if ("text" in present) == ("messageId" in present):
            raise refuse(Refusal("bad_request", 'Send either "text" or "messageId".'))
        return present

    @validates("text")
    def _pinnable(self, text: str, **kwargs: Any) -> None:
        text = clean_pin_text(text)
        if is_blank(text):
            raise refuse(Refusal("empty_pin", "Type the decision to pin first."))
        if len(text) > self.pinned_max_chars:
            raise refuse(Refusal("pin_too_long", f"A pin can be at most {self.pinned_max_chars} characters "
                                                 f"(this one has {len(text)})."))

    @post_load
    def _cleaned(self, data: dict, **kwargs: Any) -> dict:
        return {**data, "text": clean_pin_text(data["text"])} if "text" in data else data


class FeedbackBody(ClientSchema):
    """``POST /api/chat/feedback``: ``{"messageId", "rating": "up"|"down", "reason"?}``.

    Loads to ``{"messageId", "rating", "reason"}`` with the reason trimmed (None when absent or blank,
    at most ``MAX_REASON_CHARS`` characters).
    """

    messageId = message_id(BAD_MESSAGE_ID, required=True)
    rating = fields.String(required=True, validate=check(lambda rating: rating in RATINGS, BAD_RATING),
                           error_messages=refused_as(BAD_RATING))
    reason = client_text(Refusal("bad_request", "The reason must be text."), storable,
                         check(lambda reason: len(reason.strip()) <= MAX_REASON_CHARS, Refusal(
                             "reason_too_long", f"The reason can be at most {MAX_REASON_CHARS} characters.")),
                         load_default=None, allow_none=True)

    @post_load
    def _trimmed(self, data: dict, **kwargs: Any) -> dict:
        return {**data, "reason": (data["reason"] or "").strip() or None}


BAD_PHRASE = Refusal("bad_request", f"Type a phrase of 1 to {PHRASE_MAX_CHARS} characters.")
MAX_TURN_NUMBER = 999_999


def _phrase_field(**kwargs: Any) -> fields.String:
    """A forget phrase: a string, not blank (``is_blank``: NUL and zero-width characters alone are blank), at
    most ``PHRASE_MAX_CHARS`` characters once trimmed, storable."""
    return client_text(BAD_PHRASE, check(lambda p: not is_blank(p) and len(p.strip()) <= PHRASE_MAX_CHARS, BAD_PHRASE),
                       storable, **kwargs)


class PhraseQuery(ClientSchema):
    """``GET /api/chat/forget?phrase=``: loads to ``{"phrase": str}`` (trimmed)."""

    phrase = _phrase_field(required=True)

    @post_load
    def _trimmed(self, data: dict, **kwargs: Any) -> dict:
        return {"phrase": data["phrase"].strip()}


class ForgetBody(ClientSchema):
    """``POST /api/chat/forget``: ``{"turns": [int], "phrase"?}``; loads to ``{"turns": [int] ascending, unique,
    "phrase": str (trimmed) or None}``.  ``turns``: 1 to ``max_turns`` numbers of 1-999999 (JSON integers)."""

    turns = fields.List(fields.Raw(validate=check(lambda t: type(t) is int and 1 <= t <= MAX_TURN_NUMBER,
                                                  Refusal("bad_request", "Turn numbers are whole numbers from 1."))),
                        required=True, error_messages=refused_as(Refusal("bad_request", "Send the turns as a list.")))
    phrase = _phrase_field(load_default=None, allow_none=True)

    def __init__(self, *, max_turns: int, hint: str, **kwargs: Any) -> None:
        self.max_turns, self.hint = max_turns, hint
        super().__init__(**kwargs)

    @validates("turns")
    def _how_many(self, turns: list, **kwargs: Any) -> None:
        if not 1 <= len(turns) <= self.max_turns:
            raise refuse(Refusal("bad_request", self.hint))

    @post_load
    def _cleaned(self, data: dict, **kwargs: Any) -> dict:
        phrase = data.get("phrase")
        return {"turns": sorted(set(data["turns"])), "phrase": phrase.strip() if phrase is not None else None}


PHRASE_QUERY = PhraseQuery()


@lru_cache(maxsize=8)
def forget_body(max_turns: int, hint: str) -> ForgetBody:
    """The (shared, stateless) ``ForgetBody`` schema for ``max_turns``; ``hint`` says how many turns fit."""
    return ForgetBody(max_turns=max_turns, hint=hint)


def load_query(schema: Schema, query: dict, hint: str) -> dict:
    """``query`` (a route's query arguments) loaded with ``schema``.

    Raises:
        ApiError: 400 with the schema's first refusal (``bad_request`` saying ``hint`` when it carries none).
    """
    try:
        return load_client(schema, query, Refusal("bad_request", hint))
    except ClientRefused as refused:
        raise ApiError(400, refused.code, refused.message) from None


@lru_cache(maxsize=8)
def pin_body(pinned_max_chars: int) -> PinBody:
    """The (shared, stateless) ``PinBody`` schema for ``pinned_max_chars``."""
    return PinBody(pinned_max_chars=pinned_max_chars)


FEEDBACK_BODY = FeedbackBody()


def load_body(schema: Schema, hint: str) -> dict:
    """The request's JSON object (``Content-Type: application/json``, parsed by ``loads_client_json``) loaded
    with ``schema``.

    Raises:
        ApiError: 400 ``bad_request`` saying ``hint`` when the body is not a JSON object, 400 ``invalid_text``
            when a string escapes an unpaired surrogate, else 400 with the schema's first refusal.
    """
    not_an_object = Refusal("bad_request", hint)
    if not request.is_json:
        raise ApiError(400, not_an_object.code, not_an_object.message)
    try:
        body = loads_client_json(request.get_data(cache=True))
        if not isinstance(body, dict):
            raise ClientRefused(not_an_object)
        return load_client(schema, body, not_an_object)
    except JSONRefused as exc:
        refusal = INVALID_TEXT if exc.code == INVALID_TEXT.code else not_an_object
        raise ApiError(400, refusal.code, refusal.message) from None
    except ClientRefused as refused:
        raise ApiError(400, refused.code, refused.message) from None
