"""The name of a thread's prompt cache on the bundled model's chat server (docs/bundled-model.md: The bundled model).

The chat server keeps one slot file per thread (``scripts/slot_cache.py``), named by the key a chat request
carries in ``CACHE_HEADER``: the HMAC-SHA256 of the thread id under the deployment's ``SECRET_KEY``, 64 lowercase
hex characters.  The raw thread id never leaves the web process, and without the secret no key can be derived
from an id.  The header is sent only to the bundled model (``BUNDLED_MODEL``), never to a hosted provider.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import logging
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from app.settings import Settings

log = logging.getLogger(__name__)
DROP_TIMEOUT = 2.0
"""Seconds a request to drop a thread's slot file may take."""

CACHE_HEADER = "X-Model-Cache-Key"
_DOMAIN = b"model-slot-cache\x00"


def thread_cache_key(secret: str, thread_id: str) -> str:
    """``hex(HMAC-SHA256(secret, "model-slot-cache\\0" + thread_id))``: 64 lowercase hex characters.

    Raises:
        ValueError: ``secret`` is empty (a key must not be computable from the id alone).
    """
    if not secret:
        raise ValueError("a cache key needs the deployment's secret")
    return hmac.new(secret.encode(), _DOMAIN + thread_id.encode(), hashlib.sha256).hexdigest()


def cache_headers(settings: Settings, thread_id: str | None) -> dict[str, str]:
    """``{CACHE_HEADER: key}`` for a request about ``thread_id`` to the bundled model, else ``{}`` (a hosted
    provider, no thread, or no secret)."""
    if not thread_id or not getattr(settings, "bundled_model", False) or not getattr(settings, "secret_key", ""):
        return {}
    return {CACHE_HEADER: thread_cache_key(settings.secret_key, thread_id)}


def drop_thread_cache(settings: Settings, thread_id: str) -> bool:
    """Ask the bundled model's chat server to delete ``thread_id``'s slot file (``DELETE /cache`` with
    ``CACHE_HEADER``; ``scripts/slot_cache.py`` answers it from loopback only), after a forget.

    Does nothing (False) without ``BUNDLED_MODEL``, a secret or a base URL.  Never raises: a server that is
    down holds no slot to drop; a failure is logged without the key.

    Returns:
        True when the server answered 204.
    """
    headers = cache_headers(settings, thread_id)
    base = getattr(settings, "openai_base_url", None)
    if not headers or not base:
        return False
    parts = urlsplit(base)
    if parts.scheme != "http" or not parts.hostname:
        return False
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=DROP_TIMEOUT)
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
