"""Prompt warm-up: have the chat server read a prompt prefix before the turn that needs it (docs/bundled-model.md:
The bundled model; docs/contract.md: ``PROMPT_WARMUP``).

A server that keeps the previous request's prompt cached (llama.cpp's ``cache_prompt``) reads again only what
follows the part a new prompt shares with it.  After a compaction a thread's prompt changes near its start (a
longer record, fewer recent turns), so its next turn would read almost all of it again; ``PromptWarmup.prefill``
sends that new prefix ahead of time as one request with ``max_tokens`` 1, whose answer is discarded.

With the bundled model (a request with the thread's cache key) the request carries ``X-Model-Warmup: 1``: the chat
server's proxy (``scripts/slot_cache.py``) answers 202 at once and reads the prefix itself when no turn is in it;
any turn preempts it (the server stops reading within one batch and keeps what it read), the newest warm-up of a
thread replaces an older one, so nothing waits behind a warm-up and this process holds no thread for it.  Any
other server gets a plain one-token request, one at a time per process: a second one asked for meanwhile is
skipped (a one-slot server would only queue the later behind the first).
"""

from __future__ import annotations

import logging
import threading
import time

import openai

from app.llm.cache_key import cache_headers
from app.llm.provider import make_openai_client
from app.settings import Settings

log = logging.getLogger(__name__)

WARMUP_TIMEOUT_SECONDS = 20.0  # longest wait for the server to read a prefix (about 1,600 tokens at 80 tokens/s)
QUEUE_TIMEOUT_SECONDS = 5.0  # longest wait for the bundled chat server's proxy to take a warm-up (it answers at once)
WARMUP_HEADER = "X-Model-Warmup"  # scripts/slot_cache.py: WARMUP_HEADER


class PromptWarmup:
    """Sends prompt prefixes to the chat model (``CHAT_MODEL`` at ``OPENAI_BASE_URL``).

    Args:
        settings: the provider, the model and the connect timeout (seconds).
        timeout: seconds to wait for one prefill's answer.
    """

    def __init__(self, settings: Settings, timeout: float = WARMUP_TIMEOUT_SECONDS):
        self.settings = settings
        self.timeout = timeout
        self._client: openai.OpenAI | None = None
        self._busy = threading.Lock()
        self.sent = 0  # prefills answered, for tests and logs

    @property
    def client(self) -> openai.OpenAI:
        if self._client is None:
            self._client = make_openai_client(self.settings, read_timeout=self.timeout, max_retries=0)
        return self._client

    def queued(self, thread_id: str | None) -> bool:
        """True when a prefill of ``thread_id`` goes to the bundled chat server's proxy, which queues it and
        lets every turn preempt it (so a turn in flight is no reason to skip it)."""
        return bool(thread_id) and bool(cache_headers(self.settings, thread_id))

    def prefill(self, messages: list[dict], *, label: str = "", thread_id: str | None = None) -> bool:
        """Ask the chat model for one token after ``messages`` (``[{"role", "content"}]``), in this thread.

        With ``thread_id`` and the bundled model the request carries the thread's cache key
        (``app.llm.cache_key``) and ``X-Model-Warmup: 1``: the proxy queues it and answers at once (within
        ``QUEUE_TIMEOUT_SECONDS``); the chat server keeps what it read as that thread's cached prompt.

        Returns True when the server answered (or the proxy queued it); False when another prefill was in flight
        (skipped, not with the proxy) or the request failed.  Never raises: failures are logged (category only,
        never the prompt's text).
        """
        if not messages:
            return False
        if self.queued(thread_id):
            return self._queue(messages, label, thread_id)
        if not self._busy.acquire(blocking=False):
            return False
        started = time.monotonic()
        try:
            self.client.chat.completions.create(
                model=self.settings.chat_model, messages=[], stream=False, max_tokens=1, temperature=0,
                timeout=openai.Timeout(self.timeout, connect=self.settings.llm_connect_timeout),
                extra_body={"messages": messages}, extra_headers=cache_headers(self.settings, thread_id) or None)
        except Exception as exc:  # a warm-up is an optimisation: nothing of it may reach a person
            log.info("prompt warm-up %s failed after %.1f s: %s", label, time.monotonic() - started,
                     type(exc).__name__)
            return False
        finally:
            self._busy.release()
        self.sent += 1
        log.info("prompt warm-up %s: %d messages read in %.1f s", label, len(messages), time.monotonic() - started)
        return True

    def _queue(self, messages: list[dict], label: str, thread_id: str | None) -> bool:
        started = time.monotonic()
        try:
            response = self.client.chat.completions.with_raw_response.create(
                model=self.settings.chat_model, messages=[], stream=False, max_tokens=1, temperature=0,
                timeout=openai.Timeout(QUEUE_TIMEOUT_SECONDS, connect=self.settings.llm_connect_timeout),
                extra_body={"messages": messages},
                extra_headers={**cache_headers(self.settings, thread_id), WARMUP_HEADER: "1"})
        except Exception as exc:  # a warm-up is an optimisation: nothing of it may reach a person
            log.info("prompt warm-up %s not queued: %s", label, type(exc).__name__)
            return False
        self.sent += 1
        log.info("prompt warm-up %s: %d messages queued (HTTP %d in %.2f s)", label, len(messages),
                 response.http_response.status_code, time.monotonic() - started)
        return True
