"""Browser identity: a session id in Flask's signed cookie, and its HMAC thread id (docs/contract.md: Identity).

The cookie is HttpOnly, SameSite=Lax (Secure over https) and holds a random
256-bit id.  A tampered, foreign or malformed cookie fails the signature check
or the format check and the browser gets a fresh session, never another
thread.  The raw session id is never stored, logged or returned: only its
HMAC-SHA256 under ``SECRET_KEY`` is used, as ``chat:<64 hex>``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from flask import current_app, session

SESSION_KEY = "sid"
_SID_RE = re.compile(r"^[a-f0-9]{64}$")


def thread_id_for(secret_key: str, session_id: str) -> str:
    """Return ``chat:`` + lowercase hex HMAC-SHA256(secret, session id): 69 characters."""
    digest = hmac.new(secret_key.encode(), session_id.encode(), hashlib.sha256).hexdigest()
    return "chat:" + digest


def has_session() -> bool:
    """True when the request carries a valid session (a signed cookie holding a well-formed id)."""
    sid = session.get(SESSION_KEY)
    return isinstance(sid, str) and _SID_RE.match(sid) is not None


def current_session_id() -> str:
    """Return this browser's session id, starting a fresh session when the cookie is absent or invalid.

    Raises:
        whatever the session gate raises when a fresh session is refused (see the module's docstring).
    """
    sid = session.get(SESSION_KEY)
    if not isinstance(sid, str) or not _SID_RE.match(sid):
        gate = current_app.extensions.get("session_gate")
        if gate is not None:
            gate()
        session.clear()
        sid = secrets.token_hex(32)
        session[SESSION_KEY] = sid
        session.permanent = True
    return sid


def current_thread_id() -> str:
    """The thread id of this browser's session (creating the session if needed)."""
    return thread_id_for(current_app.config["SECRET_KEY"], current_session_id())
