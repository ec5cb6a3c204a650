"""Who the client is and what it may do (docs/deployment.md: "Budgets"; docs/contract.md: HTTP, WebSocket).

A client is its signed session and, for what a session cannot bound, its network address as the
platform's router reports it: ``TRUSTED_PROXIES`` proxies' ``X-Forwarded-For`` entries are trusted
(werkzeug's ``ProxyFix``), so ``request.remote_addr`` is the visitor's address, not the router's.  Every
budget counts that address as its client (``client_address``: ``app.store.quotas.client_of``): an IPv6
address by its ``CLIENT_IPV6_PREFIX`` network, an IPv4 address once whatever its spelling.

Installed for the whole app by ``install_client_rules``, in this order, before any route runs:

1. ``Host`` must be trusted (``Settings.host_allowed``: ``TRUSTED_HOSTS``; in development loopback names
   only), else 400 ``untrusted_host``: a DNS-rebinding page cannot drive a local server.
2. A state-changing request (any method but GET, HEAD, OPTIONS) counts against the address's
   ``API_WRITES_PER_MINUTE``: 429 ``rate_limited`` with ``Retry-After`` beyond it.
3. The websocket upgrade needs the session cookie (the page always has one), else 403 ``no_session``
   before any upgrade (after its origin check): a refused upgrade holds nothing.
4. A fresh session is handed to an address at most ``SESSIONS_PER_HOUR_PER_CLIENT`` times an hour:
   429 ``session_limit`` beyond it (the identity's session gate).

The counters live in the store (``app.store.quotas``); with the store down nothing is refused here.
"""

from __future__ import annotations

import logging

from flask import Flask, Response, request
from werkzeug.middleware.proxy_fix import ProxyFix

from app.extensions import services
from app.identity import has_session
from app.observability.metrics import count_refusal
from app.settings import Settings
from app.store.quotas import client_of
from app.store.thread_store import StoreUnavailable
from app.web.responses import ApiError, error_response

log = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
WEBSOCKET_PATH = "/ws/chat"
UNTRUSTED_HOST = ("untrusted_host", "This server does not answer for that host name.")
NO_SESSION = ("no_session", "Open the chat page first: a chat connection needs its session cookie.")


def client_address() -> str:
    """The client the request's address (after ``ProxyFix``) counts as: ``app.store.quotas.client_of`` with
    ``CLIENT_IPV6_PREFIX`` (an IPv6 network, or an IPv4 address whatever its spelling), or ``unknown``."""
    return client_of(request.remote_addr, services().settings.client_ipv6_prefix)


def _retry_after(kind: str, who: str, limit: str) -> int:
    try:
        return services().quotas.retry_after(kind, who, limit)
    except StoreUnavailable:
        return 60


def _over(kind: str, who: str, limit: str) -> bool:
    """True when this request is one too many for ``limit``; False with the store down (fail open)."""
    try:
        return not services().quotas.hit(kind, who, limit)
    except StoreUnavailable:
        log.warning("%s quota not checked: store unavailable", kind)
        return False


def refuse_untrusted_host() -> Response | None:
    """400 ``untrusted_host`` when the ``Host`` header names no trusted host; else None."""
    if services().settings.host_allowed(request.host):
        return None
    log.info("%s %s refused: untrusted Host", request.method, request.path)
    count_refusal("untrusted_host")
    return error_response(400, *UNTRUSTED_HOST)


def refuse_cookieless_upgrade() -> Response | None:
    """403 ``no_session`` for a websocket upgrade without a valid session cookie; else None."""
    if request.path != WEBSOCKET_PATH or has_session():
        return None
    log.info("websocket refused: no session cookie")
    count_refusal("no_session")
    return error_response(403, *NO_SESSION)


def limit_api_writes() -> Response | None:
    """429 ``rate_limited`` (with ``Retry-After``) beyond ``API_WRITES_PER_MINUTE`` writes of this address."""
    most = services().settings.client_quotas.api_writes_per_minute
    if request.method in SAFE_METHODS or not most:
        return None
    address, limit = client_address(), f"{most}/minute"
    if not _over("api_write", address, limit):
        return None
    count_refusal("api_writes")
    wait = _retry_after("api_write", address, limit)
    response = error_response(429, "rate_limited", f"Too many changes in a short time. Please wait {wait} s.")
    response.headers["Retry-After"] = str(wait)
    return response


def session_gate() -> None:
    """Called before a fresh session is handed out: 429 ``session_limit`` beyond
    ``SESSIONS_PER_HOUR_PER_CLIENT`` new sessions of this address in an hour.

    Raises:
        ApiError: 429 ``session_limit``.
    """
    most = services().settings.client_quotas.sessions_per_hour_per_client
    if most and _over("session_new", client_address(), f"{most}/hour"):
        log.info("new session refused: the address's hourly quota is spent")
        count_refusal("sessions")
        raise ApiError(429, "session_limit", "Too many new chats were started from your network. "
                                             "Please try again later.")


def install_client_rules(app: Flask, settings: Settings) -> None:
    """Trust ``TRUSTED_PROXIES`` proxies, and run the checks of this module's docstring before every request."""
    if settings.proxies_trusted:
        # Flask's documented way to wrap its WSGI app (its hints call wsgi_app a method, not an attribute)
        app.wsgi_app = ProxyFix(  # type: ignore[method-assign]
            app.wsgi_app, x_for=settings.proxies_trusted, x_proto=settings.proxies_trusted,
            x_host=0, x_port=0, x_prefix=0)
    app.extensions["session_gate"] = session_gate
    # before_request functions run in registration order, the app's before a blueprint's: the host and
    # the quota come before every other check; the cookie after the websocket's origin check
    app.before_request_funcs.setdefault(None, [])[:0] = [refuse_untrusted_host, limit_api_writes]
    app.before_request_funcs.setdefault("chat", []).append(refuse_cookieless_upgrade)
