"""What the configured model provider was found not to support, remembered per base URL.

Some OpenAI-compatible servers (older llama.cpp or vLLM builds, some Ollama models)
answer HTTP 400 to a request with ``tools``, or reject ``response_format`` of type
``json_schema``.  The first such refusal is remembered for the provider's base URL in
this process and in Redis (``caps:<hash>``, a day's TTL, so every web process and the page
agree, and a provider upgrade is noticed again), and later turns skip the feature.
"""

from __future__ import annotations

import logging
import threading

import redis

from app.store.keys import provider_caps_key

log = logging.getLogger(__name__)

TOOLS = "tools"
JSON_SCHEMA = "json_schema"
CAPS_TTL_SECONDS = 86400

_local: dict[tuple[str, str], bool] = {}
_lock = threading.Lock()


def _base(settings) -> str:
    return (settings.openai_base_url or "default").rstrip("/")


def is_unsupported(services, feature: str) -> bool:
    """True when the provider of ``services.settings`` was seen refusing ``feature``."""
    key = (_base(services.settings), feature)
    with _lock:
        if _local.get(key):
            return True
    try:
        flagged = bool(services.redis.hget(provider_caps_key(services.settings.openai_base_url), feature))
    except redis.RedisError:
        return False
    if flagged:
        with _lock:
            _local[key] = True
    return flagged


def mark_unsupported(services, feature: str) -> None:
    """Remember that the provider refuses ``feature`` (best effort in Redis)."""
    with _lock:
        _local[(_base(services.settings), feature)] = True
    log.warning("model provider does not support %s; falling back", feature)
    name = provider_caps_key(services.settings.openai_base_url)
    try:
        pipe = services.redis.pipeline(transaction=False)
        pipe.hset(name, feature, "1")
        pipe.expire(name, CAPS_TTL_SECONDS)
        pipe.execute()
    except redis.RedisError:
        log.warning("could not record the provider capability in Redis")


def forget(services=None) -> None:
    """Forget what this process learned (all providers), and the Redis record of ``services``' provider."""
    with _lock:
        _local.clear()
    if services is not None:
        try:
            services.redis.delete(provider_caps_key(services.settings.openai_base_url))
        except redis.RedisError:
            pass


def tools_enabled(services) -> bool:
    """Whether chat turns offer tools: ``TOOLS_ENABLED`` and the provider has not refused them."""
    return bool(services.settings.tools_enabled) and not is_unsupported(services, TOOLS)


def rejects_feature(error, feature: str) -> bool:
    """True when a mapped ``LLMError`` is the provider refusing ``feature`` (a 4xx/5xx naming it)."""
    status = getattr(error, "status_code", None)
    message = (getattr(error, "provider_message", "") or "").lower()
    if status is None or status < 400:
        return False
    if feature == TOOLS:
        return status in (400, 422, 500, 501) and ("tool" in message or "function" in message)
    if feature == JSON_SCHEMA:
        return "json_schema" in message or "response_format" in message or "schema" in message
    return False
