"""Streaming chat completions with the ``openai`` SDK.

Retries happen only before the first token arrives (a retry after tokens were
shown would duplicate text), with tenacity's exponential backoff, and never past
the turn's deadline.  Cancelling closes the upstream response so the provider
stops generating.  Every failure surfaces as ``LLMError`` (contract error codes,
a message for people, no exception text).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

import openai
from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential

from app.llm.provider import LLMError, make_openai_client, map_error
from app.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class StreamStats:
    """What a finished (or abandoned) stream reported.

    Attributes:
        prompt_tokens: the provider's count, when it reports usage (tokens), else None.
        completion_tokens: the provider's count, when it reports usage (tokens), else None.
        first_token_at: ``time.monotonic()`` of the first text delta, or None.
        attempts: how many requests were made (1 + retries).
    """

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    first_token_at: float | None = None
    attempts: int = 0
    finish_reason: str | None = None
    extra: dict = field(default_factory=dict)


def _retryable(exc: BaseException) -> bool:
    return map_error(exc).retryable


class LLMClient:
    """The chat model of the deployment (``CHAT_MODEL`` at ``OPENAI_BASE_URL``).

    Args:
        settings: provider, model, timeouts (seconds) and ``llm_max_retries``.
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self.client = make_openai_client(settings, max_retries=0)

    def _timeout(self, deadline: float) -> openai.Timeout:
        remaining = max(0.5, deadline - time.monotonic())
        read = min(self.settings.llm_read_timeout, remaining)
        return openai.Timeout(read, connect=min(self.settings.llm_connect_timeout, remaining))

    def _open(self, messages: list[dict], model: str, deadline: float, stats: StreamStats, extra: dict):
        """Open a stream and read up to its first text delta; returns ``(stream, iterator, first_pieces)``."""
        stats.attempts += 1
        stream = self.client.chat.completions.create(
            model=model, messages=messages, stream=True, stream_options={"include_usage": True},
            timeout=self._timeout(deadline), **extra)
        iterator = iter(stream)
        pending = []
        try:
            for chunk in iterator:
                pending.append(chunk)
                if any(c.delta and (c.delta.content or c.delta.tool_calls) for c in chunk.choices):
                    break
        except BaseException:
            stream.close()
            raise
        return stream, iterator, pending

    def stream_chat(self, messages: list[dict], *, cancelled: threading.Event, deadline: float,
                    stats: StreamStats, model: str | None = None, **extra) -> Iterator[openai.types.chat.ChatCompletionChunk]:
        """Yield the answer's chunks as they arrive.

        Args:
            messages: the prompt, ``[{"role", "content"}]``.
            cancelled: set by another thread to stop; the upstream response is then closed.
            deadline: ``time.monotonic()`` after which the turn fails (``llm_unavailable``).
            stats: filled with usage, first-token time and attempts.
            model: overrides ``CHAT_MODEL``.
            extra: further chat-completion arguments (for example ``tools``).

        Raises:
            LLMError: the provider failed, timed out, or the deadline passed.
        """
        model = model or self.settings.chat_model
        retrying = Retrying(
            stop=stop_after_attempt(1 + self.settings.llm_max_retries)
            | stop_after_delay(max(0.0, deadline - time.monotonic() - 1)),
            wait=wait_exponential(multiplier=0.25, max=2),
            retry=retry_if_exception(_retryable),
            reraise=True,
        )
        try:
            stream, iterator, pending = retrying(self._open, messages, model, deadline, stats, extra)
        except RetryError as exc:  # pragma: no cover - reraise=True makes this unreachable
            raise map_error(exc.last_attempt.exception()) from None
        except Exception as exc:
            raise map_error(exc) from None
        try:
            for chunk in self._chunks(pending, iterator, cancelled, deadline):
                if chunk.usage:
                    stats.prompt_tokens = chunk.usage.prompt_tokens
                    stats.completion_tokens = chunk.usage.completion_tokens
                for choice in chunk.choices:
                    if choice.finish_reason:
                        stats.finish_reason = choice.finish_reason
                    if stats.first_token_at is None and choice.delta and choice.delta.content:
                        stats.first_token_at = time.monotonic()
                yield chunk
        except LLMError:
            raise
        except Exception as exc:
            raise map_error(exc) from None
        finally:
            stream.close()

    @staticmethod
    def _chunks(pending, iterator, cancelled: threading.Event, deadline: float):
        yield from pending
        for chunk in iterator:
            if cancelled.is_set():
                return
            if time.monotonic() > deadline:
                raise LLMError("llm_unavailable", "The model took too long to answer. Please try again.",
                               "timeout", False)
            yield chunk
