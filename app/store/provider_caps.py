"""What a model provider was found to refuse, one record shared by every process.

Some OpenAI-compatible servers refuse parts of the API: ``tools`` (older llama.cpp or vLLM
builds, some Ollama models), ``response_format`` ``json_schema`` (llama-cpp-python's server
answers HTTP 500; llama.cpp's own server, the bundled model's, takes it), or a ``schema`` inside
``json_object``.  The first refusal is recorded for
the provider's base URL in one Redis hash, ``caps:<digest>`` (``keys.provider_caps_key``), a
field ``"1"`` per refused feature, with a day's TTL: every web process and Celery worker then
skips the feature, and a provider upgrade is noticed again the next day.

The record is best effort: with Redis unreachable nothing is known (every feature is tried,
and the provider refuses it again) and nothing is recorded; no error is raised.
"""

from __future__ import annotations

import logging

import redis

from app.store.keys import provider_caps_key
from app.store.redis_client import StoreClient

log = logging.getLogger(__name__)

CAPS_TTL_SECONDS = 86400


class ProviderCaps:
    """The refusals recorded for one provider.

    Args:
        client: ``redis.Redis`` with ``decode_responses=True``.
        base_url: the provider's base URL (``OPENAI_BASE_URL``; None is the SDK's default).
        ttl_seconds: how long a refusal is remembered (seconds).
    """

    def __init__(self, client: StoreClient, base_url: str | None, *, ttl_seconds: int = CAPS_TTL_SECONDS):
        self.redis = client
        self.base_url = base_url
        self.key = provider_caps_key(base_url)
        self.ttl = ttl_seconds

    def refused(self) -> frozenset[str]:
        """Every feature recorded as refused (empty when Redis cannot be read)."""
        try:
            fields = self.redis.hgetall(self.key)
        except redis.RedisError:
            log.debug("provider capabilities unreadable", exc_info=True)
            return frozenset()
        # decode_responses=True: the names are str (redis-py's hints say bytes | str)
        return frozenset(name for name, value in fields.items() if value == "1")  # type: ignore[misc]

    def refuses(self, feature: str) -> bool:
        """True when ``feature`` is recorded as refused (False when Redis cannot be read)."""
        try:
            return self.redis.hget(self.key, feature) == "1"
        except redis.RedisError:
            log.debug("provider capabilities unreadable", exc_info=True)
            return False

    def mark_refused(self, feature: str) -> None:
        """Record that the provider refuses ``feature`` (and refresh the record's TTL)."""
        log.warning("model provider refuses %s; falling back", feature)
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hset(self.key, feature, "1")
            pipe.expire(self.key, self.ttl)
            pipe.execute()
        except redis.RedisError:
            log.warning("could not record the provider capability in Redis")
