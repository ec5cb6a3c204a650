"""The name of a thread's prompt cache on the bundled model's chat server (README: The bundled model).

The chat server keeps one slot file per thread (``scripts/slot_cache.py``), named by the key a chat request
carries in ``CACHE_HEADER``: the HMAC-SHA256 of the thread id under the deployment's ``SECRET_KEY``, 64 lowercase
hex characters.  The raw thread id never leaves the web process, and without the secret no key can be derived
from an id.  The header is sent only to the bundled model (``BUNDLED_MODEL``), never to a hosted provider.
"""

from __future__ import annotations

import hashlib
import hmac

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


def cache_headers(settings, thread_id: str | None) -> dict[str, str]:
    """``{CACHE_HEADER: key}`` for a request about ``thread_id`` to the bundled model, else ``{}`` (a hosted
    provider, no thread, or no secret)."""
    if not thread_id or not getattr(settings, "bundled_model", False) or not getattr(settings, "secret_key", ""):
        return {}
    return {CACHE_HEADER: thread_cache_key(settings.secret_key, thread_id)}
