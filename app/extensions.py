"""The process-wide services the web app and the workers share: Redis, the store, the tokenizer, the LLM clients.

``Services`` is built once per process by ``create_app`` and kept in
``app.extensions["chat"]``; use ``services()`` inside a request or task.  It is where
the layers are wired together (for example the store's error hook to the metrics).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from flask import current_app

from app.compaction.requests import CompactionRequests
from app.llm.cache_key import drop_thread_cache
from app.llm.client import LLMClient
from app.llm.structured import StructuredClient, compaction_endpoint
from app.memory.cache import ByteCache
from app.memory.compaction import facts, record
from app.memory.recall import ArchiveIndex
from app.memory.tokens import TokenCounter, counter_for
from app.observability.metrics import count_store_error
from app.settings import Settings
from app.store import stored_state
from app.store.archive import Archive
from app.store.health import StoreHealth
from app.store.provider_caps import ProviderCaps
from app.store.quotas import Quotas
from app.store.redis_client import StoreClient, make_redis
from app.store.socket_leases import SocketLeases
from app.store.thread_store import ThreadStore


class ThreadCaches:
    """Every cache this process keeps of a thread's memory, behind one ``drop_thread`` (after a forget: a forgotten
    turn never comes back from a cache; docs/contract.md: Forget and provenance).

    They are: the archive's tokenised index (``Archive``, keyed by thread), the stored state's checked messages and
    checked record, pins and notes (``app.store.stored_state``, keyed by their text), the facts read from a text
    (``app.memory.compaction.facts``) and the sentences a text splits into (``app.memory.compaction.record``);
    besides, the bundled model's slot file of the thread (``app.llm.cache_key.drop_thread_cache``).  Token counts
    are keyed by a digest of the text, never by the text, and are left alone.

    Args:
        settings: the process's settings (the bundled model's address and secret).
        archive: the process's ``Archive``.
        text_caches: the caches keyed by a text that are emptied whole (facts, sentences).
    """

    def __init__(self, settings: Settings, archive: Archive, text_caches: Iterable[ByteCache]):
        self.settings = settings
        self.archive = archive
        self.text_caches = tuple(text_caches)

    def drop_thread(self, thread_id: str, *, texts: Iterable[str] = (), keep: ArchiveIndex | None = None) -> None:
        """Drop what this process keeps of ``thread_id``: its archive index (replaced by ``keep``, an index valid
        for the thread as it is now, when given), the checked messages holding ``texts`` (the forgotten turns'
        messages), every checked record, pins and notes, facts and split sentences (each rebuilt on its next use),
        and ask the bundled model to delete the thread's slot file (never raises for it)."""
        self.archive.drop_thread(thread_id, keep=keep)
        stored_state.drop_texts(texts)
        for cache in self.text_caches:
            cache.clear()
        drop_thread_cache(self.settings, thread_id)


@dataclass
class Services:
    """Shared services for one process, created lazily (no connection is opened at import)."""

    settings: Settings

    @cached_property
    def redis(self) -> StoreClient:
        """The Redis client (pool sized to the web threads plus headroom)."""
        return make_redis(self.settings.redis_url, cluster=self.settings.redis_cluster,
                          max_connections=self.settings.web_threads + 16,
                          socket_timeout=self.settings.redis_socket_timeout)

    @cached_property
    def store(self) -> ThreadStore:
        """The ThreadState store; its Redis failures are counted in the metrics."""
        return ThreadStore(self.redis, self.settings.limits, self.settings.memory_ttl_seconds,
                           on_error=count_store_error, wait_replicas=self.settings.memory_wait_replicas,
                           wait_timeout_ms=self.settings.memory_wait_timeout_ms)

    @cached_property
    def archive(self) -> Archive:
        """The archives of folded turns, with this process's cache of their tokenised indexes
        (``ARCHIVE_CACHE_MAX_BYTES``)."""
        return Archive(self.store, cache_max_bytes=self.settings.archive_cache_max_bytes)

    @cached_property
    def caches(self) -> ThreadCaches:
        """Every cache this process keeps of a thread, with its one ``drop_thread``."""
        # the two memory modules keep their caches as module state; they are named here and nowhere else
        return ThreadCaches(self.settings, self.archive, (facts._cache, record._split_cache))

    @cached_property
    def sockets(self) -> SocketLeases:
        """The websocket leases of sessions and of network addresses (``WS_MAX_PER_SESSION``, ``WS_MAX_PER_CLIENT``)."""
        return SocketLeases(self.redis, self.store.guard)

    @cached_property
    def store_health(self) -> StoreHealth:
        """The store's probes for ``/healthz``."""
        return StoreHealth(self.redis, self.store.guard)

    @cached_property
    def quotas(self) -> Quotas:
        """Per-client counters and the store's budget (docs/deployment.md: "Budgets")."""
        return Quotas(self.redis, redis_url=self.settings.redis_url, cluster=self.settings.redis_cluster)

    @cached_property
    def counter(self) -> TokenCounter:
        """The chat model's token counter (its cache of counts within ``TOKEN_CACHE_MAX_BYTES``)."""
        settings = self.settings
        return counter_for(settings.chat_model, settings.tokenizer_encoding, settings.token_cache_max_bytes)

    @cached_property
    def llm(self) -> LLMClient:
        """The chat model's streaming client."""
        return LLMClient(self.settings)

    @cached_property
    def provider_caps(self) -> ProviderCaps:
        """What the chat model's provider (``OPENAI_BASE_URL``) was found to refuse, shared by every process."""
        return ProviderCaps(self.redis, self.settings.openai_base_url)

    @cached_property
    def compaction_llm(self) -> StructuredClient:
        """Structured (JSON) answers of ``COMPACTION_MODEL`` (at ``compaction_endpoint(settings)``) for compaction."""
        return StructuredClient.for_compaction(
            self.settings, ProviderCaps(self.redis, compaction_endpoint(self.settings)))

    @cached_property
    def structured(self) -> StructuredClient:
        """Structured (JSON) answers of ``CHAT_MODEL`` for the runtime (task list, delivery review)."""
        settings = self.settings
        return StructuredClient(self.llm.client, model=settings.chat_model, record=self.provider_caps,
                                max_retries=settings.llm_max_retries, connect_timeout=settings.llm_connect_timeout,
                                timeout=settings.llm_turn_timeout)

    send_compaction: Callable[[str, int], None] | None = None
    """Publishes the compaction task for ``(thread_id, version)``; set by ``create_app`` once Celery exists."""

    @cached_property
    def compaction_requests(self) -> CompactionRequests:
        """How a turn asks for a compaction: marks it due and publishes the task (``send_compaction``)."""

        def send(thread_id: str, version: int) -> None:
            if self.send_compaction is None:
                raise RuntimeError("no Celery app to publish compactions with")
            self.send_compaction(thread_id, version)

        return CompactionRequests(self.store, self.settings, send)


def services() -> Services:
    """The current app's services."""
    return current_app.extensions["chat"]
