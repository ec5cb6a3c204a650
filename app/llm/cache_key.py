"""The name of a thread's prompt cache on the bundled model's chat server (README: The bundled model).

The chat server keeps one slot file per thread (``scripts/slot_cache.py``), named by the key a chat request
carries in ``CACHE_HEADER``: the HMAC-SHA256 of the thread id under the deployment's ``SECRET_KEY``, 64 lowercase
hex characters.  The raw thread id never leaves the web process, and without the secret no key can be derived
from an id.  The header is sent only to the bundled model (``BUNDLED_MODEL``), never to a hosted provider.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import logging
from urllib.parse import urlsplit

log = logging.getLogger(__name__)
DROP_TIMEOUT = 2.0
"""Seconds a request to drop a thread's slot file may take."""

CACHE_HEADER = "X-Model-Cache-Key"
KEEP_HEADER = "X-Model-Keep-Warmup"
"""``"1"`` on a turn that continues its thread's previous prompt while a warm-up of the thread's new prompt is under
way (``scripts/slot_cache.py``: the warm-up's part read is kept for later; ``app.chat.turn.PromptLayout``)."""
WARMING_TIMEOUT = 0.5
"""Seconds the question "is a warm-up of this thread under way?" may take (a loopback request)."""
_DOMAIN = b"model-slot-cache\x00"


def thread_cache_key(secret: str, thread_id: str) -> str:
    """``hex(HMAC-SHA256(secret, "model-slot-cache\\0" + thread_id))``: 64 lowercase hex characters.

    Raises:
        ValueError: ``secret`` is empty (a key must not be computable from the id alone).
    """
    if not secret:
        raise ValueError("a cache key needs the deployment's secret")
    return hmac.new(secret.encode(), _DOMAIN + thread_id.encode(), hashlib.sha256).hexdigest()


def cache_headers(settings, thread_id: str | None) -> dict[str, str]:
    """``{CACHE_HEADER: key}`` for a request about ``thread_id`` to the bundled model, else ``{}`` (a hosted
    provider, no thread, or no secret)."""
    if not thread_id or not getattr(settings, "bundled_model", False) or not getattr(settings, "secret_key", ""):
        return {}
    return {CACHE_HEADER: thread_cache_key(settings.secret_key, thread_id)}


def _proxy(settings, thread_id: str, timeout: float) -> tuple[http.client.HTTPConnection, dict] | None:
    """A connection to the bundled chat server's proxy and the thread's key header, or None (no bundled model,
    secret or plain-HTTP base URL)."""
    headers = cache_headers(settings, thread_id)
    base = getattr(settings, "openai_base_url", None)
    if not headers or not base:
        return None
    parts = urlsplit(base)
    if parts.scheme != "http" or not parts.hostname:
        return None
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout), headers


def warming(settings, thread_id: str) -> bool:
    """Whether the bundled chat server is warming ``thread_id``'s new prompt: a warm-up queued, running or read
    in part (``GET /cache`` with ``CACHE_HEADER``).  False without the bundled model, and when the server does not
    answer within ``WARMING_TIMEOUT`` (never raises: a turn then uses the new prompt, as without the question)."""
    proxy = _proxy(settings, thread_id, WARMING_TIMEOUT)
    if proxy is None:
        return False
    conn, headers = proxy
    try:
        conn.request("GET", "/cache", headers=headers)
        response = conn.getresponse()
        body = response.read()
        return response.status == 200 and json.loads(body).get("warming") is True
    except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
        log.info("warm-up state not known: %s", type(exc).__name__)
        return False
    finally:
        conn.close()


def drop_thread_cache(settings, thread_id: str) -> bool:
    """Ask the bundled model's chat server to delete ``thread_id``'s slot file (``DELETE /cache`` with
    ``CACHE_HEADER``; ``scripts/slot_cache.py`` answers it from loopback only), after a forget.

    Does nothing (False) without ``BUNDLED_MODEL``, a secret or a base URL.  Never raises: a server that is
    down holds no slot to drop; a failure is logged without the key.

    Returns:
        True when the server answered 204.
    """
    proxy = _proxy(settings, thread_id, DROP_TIMEOUT)
    if proxy is None:
        return False
    conn, headers = proxy
    try:
        conn.request("DELETE", "/cache", headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status == 204
    except (OSError, http.client.HTTPException) as exc:
        log.warning("slot file not dropped: %s", type(exc).__name__)
        return False
    finally:
        conn.close()
