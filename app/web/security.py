"""Same-origin rules: only pages of an allowed origin may drive a visitor's thread.

- The websocket handshake (``/ws/chat``) needs an ``Origin`` header naming an
  allowed origin (docs/contract.md: WebSocket): ``refuse_foreign_websocket`` is
  the chat blueprint's ``before_request`` and answers 403 otherwise.
- State-changing API calls (pins, feedback) refuse a browser on another origin:
  ``refuse_cross_site_writes`` is those blueprints' ``before_request`` and answers
  403 ``forbidden``.  A request without ``Origin`` (not sent by a cross-site
  browser) passes.

Allowed origins are ``ALLOWED_ORIGINS``, or when none is configured the origin
naming this host.  The chat layer knows nothing of this module: the web layer
attaches the check to the chat blueprint here.
"""

from __future__ import annotations

import logging
from urllib.parse import urlparse

from flask import abort, request

from app.chat.ws import bp as chat_bp
from app.extensions import services
from app.web.responses import error_response

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


def refuse_cross_site_writes():
    """403 ``forbidden`` for a state-changing request that a browser on another origin sent; else None."""
    if request.method in SAFE_METHODS or request.headers.get("Origin") is None or _request_origin_allowed():
        return None
    return error_response(403, "forbidden", "Not allowed from another site.")
