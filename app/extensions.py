"""The process-wide services the web app and the workers share: Redis, the store, the tokenizer, the LLM client.

``Services`` is built once per process by ``create_app`` and kept in
``app.extensions["chat"]``; use ``services()`` inside a request or task.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import redis
from flask import current_app

from app.memory.tokens import TokenCounter, counter_for
from app.settings import Settings
from app.store.redis_client import make_redis
from app.store.thread_store import ThreadStore


@dataclass
class Services:
    """Shared services for one process, created lazily (no connection is opened at import)."""

    settings: Settings

    @cached_property
    def redis(self) -> redis.Redis:
        """The Redis client (pool sized to the web threads plus headroom)."""
        return make_redis(self.settings.redis_url, max_connections=self.settings.web_threads + 16,
                          socket_timeout=self.settings.redis_socket_timeout)

    @cached_property
    def store(self) -> ThreadStore:
        """The ThreadState store."""
        return ThreadStore(self.redis, self.settings.limits, self.settings.memory_ttl_seconds)

    @cached_property
    def counter(self) -> TokenCounter:
        """The chat model's token counter."""
        return counter_for(self.settings.chat_model, self.settings.tokenizer_encoding)

    @cached_property
    def llm(self):
        """The LLM client (``app.llm.client.LLMClient``)."""
        from app.llm.client import LLMClient
        return LLMClient(self.settings)


def services() -> Services:
    """The current app's services."""
    return current_app.extensions["chat"]
