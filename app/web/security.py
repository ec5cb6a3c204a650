"""Same-origin rules: only pages of an allowed origin may drive a visitor's thread.

- The websocket handshake (``/ws/chat``) needs an ``Origin`` header naming an
  allowed origin (docs/contract.md: WebSocket): ``refuse_foreign_websocket`` is
  the chat blueprint's ``before_request`` and answers 403 otherwise.
- Every state-changing request (any method but GET, HEAD, OPTIONS, on every route: clear,
  pins, notes, feedback) follows one rule, ``refuse_cross_site_writes``, installed for the
  whole app: its ``Origin`` must be allowed; without ``Origin`` its ``Referer`` (its
  scheme, host and port) must be; a request with neither (not sent by a browser page)
  passes.  Otherwise 403 ``forbidden``.  The SameSite=Lax cookie is a second guard, not
  the only one.

Allowed origins are ``ALLOWED_ORIGINS``, or when none is configured the origin
naming this host.  The chat layer knows nothing of this module: the web layer
attaches the check to the chat blueprint here.
"""

from __future__ import annotations

import logging
from urllib.parse import urlparse

from flask import Response, abort, request

from app.chat.ws import bp as chat_bp
from app.extensions import services
from app.web.responses import error_response
from app.web.routes import bp as web_bp

log = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def origin_allowed(origin: str | None, host: str, allowed: tuple[str, ...]) -> bool:
    """Same-origin check: ``origin`` is in ``allowed``, or (none configured) is ``http(s)://<host>``."""
    if not origin:
        return False
    origin = origin.rstrip("/")
    if allowed:
        return origin in allowed
    parsed = urlparse(origin)
    return parsed.scheme in {"http", "https"} and parsed.netloc == host


def _request_origin_allowed() -> bool:
    return origin_allowed(request.headers.get("Origin"), request.host, services().settings.allowed_origins)


@chat_bp.before_request
def refuse_foreign_websocket() -> None:
    """Abort the websocket handshake with 403 unless its ``Origin`` is allowed."""
    if not _request_origin_allowed():
        log.info("websocket refused: origin not allowed")
        abort(403)


def referer_origin(referer: str | None) -> str | None:
    """``scheme://host[:port]`` of a ``Referer`` header, or None when absent or not an http(s) URL."""
    if not referer:
        return None
    parsed = urlparse(referer)
    if parsed.scheme not in {"http", "https"} or not parsed.netloc:
        return None
    return f"{parsed.scheme}://{parsed.netloc}"


@web_bp.before_app_request
def refuse_cross_site_writes() -> Response | None:
    """403 ``forbidden`` for a state-changing request from a page of another origin; else None.

    Judged by ``Origin``; without it by ``Referer`` (an unparseable one counts as foreign);
    with neither the request passes (no browser page sent it).
    """
    if request.method in SAFE_METHODS:
        return None
    origin = request.headers.get("Origin")
    if origin is None:
        referer = request.headers.get("Referer")
        if referer is None:
            return None
        origin = referer_origin(referer)
    if origin_allowed(origin, request.host, services().settings.allowed_origins):
        return None
    log.info("%s %s refused: origin not allowed", request.method, request.path)
    return error_response(403, "forbidden", "Not allowed from another site.")
