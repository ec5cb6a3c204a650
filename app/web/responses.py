"""JSON answers of every route: ``guarded_json`` for payloads, ``error_response`` for errors.

An error body is always ``{"error": {"code", "message"}}``: ``code`` is for
programs, ``message`` for people, and neither ever carries exception text
(docs/contract.md: HTTP).  A route answers ``error_response(status, code,
message)`` or raises ``ApiError`` from any depth; Flask's own HTTP errors (404,
405, 413, an unhandled exception's 500, a refused websocket handshake's 403)
get the same shape from the handlers ``register_errorhandlers`` installs.
Request bodies are read by ``app.web.bodies``.

A change whose outcome the store could not settle (its script's reply was lost and reading back failed too;
``app.store.thread_store.OutcomeUnknown``) is neither a success nor an error: ``outcome_unknown()`` answers
202 ``{"outcome": "unknown", "message"}`` and the page reads the state again until it knows
(docs/contract.md: HTTP, "Outcome unknown").  A route raises ``UnknownOutcome`` for it from any depth.
"""

from __future__ import annotations

import logging

from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from app.memory.hydration import ForbiddenKeyError, assert_no_forbidden_keys

log = logging.getLogger(__name__)

INTERNAL = ("internal", "Something went wrong.")
STORE_UNAVAILABLE = ("store_unavailable", "Memory is unavailable right now; try again shortly.")
OUTCOME_UNKNOWN_MESSAGE = "The change may or may not have been made; checking again…"
MEMORY_UNREADABLE = ("memory_unreadable", "This conversation's memory can't be read. Start a new chat to go on.")

# Flask's HTTP errors: status -> (code, message).  Other statuses use werkzeug's name for the status.
HTTP_ERRORS = {
    400: ("bad_request", "The request could not be understood."),
    403: ("forbidden", "Not allowed from another site."),
    404: ("not_found", "Not found."),
    405: ("method_not_allowed", "Method not allowed."),
    413: ("too_large", "The request is too large."),
    500: INTERNAL,
}


class ApiError(Exception):
    """Raised by a route or its helpers; answered as ``error_response(status, code, message)``.

    Attributes:
        status: the HTTP status (4xx or 5xx).
        code: a stable snake_case code, e.g. ``pin_limit``.
        message: one sentence for the person.
    """

    def __init__(self, status: int, code: str, message: str):
        super().__init__(code)
        self.status, self.code, self.message = status, code, message


class UnknownOutcome(Exception):
    """Raised by a route or its helpers when a change's outcome is not known; answered by ``outcome_unknown``."""


def outcome_unknown() -> Response:
    """202 ``{"outcome": "unknown", "message"}``: the change may or may not have been made (never an error)."""
    response = jsonify({"outcome": "unknown", "message": OUTCOME_UNKNOWN_MESSAGE})
    response.status_code = 202
    return response


def error_response(status: int, code: str, message: str) -> Response:
    """The JSON error answer ``{"error": {"code", "message"}}`` with ``status``."""
    response = jsonify({"error": {"code": code, "message": message}})
    response.status_code = status
    return response


def store_unavailable() -> Response:
    """503 ``store_unavailable``: the store did not answer; nothing was changed."""
    return error_response(503, *STORE_UNAVAILABLE)


def guarded_json(payload: dict, status: int = 200) -> tuple[Response, int]:
    """``(response, status)`` answering ``payload`` as JSON after the forbidden-key check.

    A violation is logged (the path to the key, never the data) and answered as a 500 ``internal``.
    """
    try:
        assert_no_forbidden_keys(payload)
    except ForbiddenKeyError as exc:
        log.error("response blocked: forbidden key at %s", exc.path)
        return error_response(500, *INTERNAL), 500
    return jsonify(payload), status


def _api_error(error: ApiError) -> Response:
    return error_response(error.status, error.code, error.message)


def _http_error(error: HTTPException) -> Response:
    status = error.code or 500
    code, message = HTTP_ERRORS.get(status) or ("_".join((error.name or "error").lower().split()),
                                                f"{error.name or 'Error'}.")
    response = error_response(status, code, message)
    if isinstance(error, MethodNotAllowed) and error.valid_methods:
        response.headers["Allow"] = ", ".join(error.valid_methods)
    return response


def register_errorhandlers(app: Flask) -> None:
    """Answer ``ApiError`` and every HTTP error of ``app`` with ``error_response``, ``UnknownOutcome`` with
    ``outcome_unknown``."""
    app.register_error_handler(ApiError, _api_error)
    app.register_error_handler(UnknownOutcome, lambda _unknown: outcome_unknown())
    app.register_error_handler(HTTPException, _http_error)
