"""The ``openai`` SDK client for any OpenAI-compatible server, and provider error mapping.

Errors shown to people never carry exception text: ``map_error`` turns an SDK
exception into an error code of ``docs/contract.md`` and a fixed message for people.
``is_refusal`` tells a provider refusing a feature (``tools``, a ``response_format``)
from any other failure.
"""

from __future__ import annotations

import json

import openai

from app.settings import Settings

LOCAL_API_KEY = "not-needed"  # local OpenAI-compatible servers ignore the key but the SDK wants one


def make_openai_client(settings: Settings, *, read_timeout: float | None = None, max_retries: int = 0,
                       base_url: str | None = None) -> openai.OpenAI:
    """Return an SDK client for the configured provider.

    Args:
        settings: ``OPENAI_API_KEY``, ``OPENAI_BASE_URL`` and the LLM timeouts.
        read_timeout: seconds to wait between bytes of an answer (default ``settings.llm_read_timeout``).
        max_retries: the SDK's own retries (0: the caller decides when retrying is safe).
        base_url: the server to talk to (default ``OPENAI_BASE_URL``; None there too: OpenAI).
    """
    timeout = openai.Timeout(read_timeout or settings.llm_read_timeout, connect=settings.llm_connect_timeout)
    return openai.OpenAI(
        api_key=settings.openai_api_key or LOCAL_API_KEY,
        base_url=base_url or settings.openai_base_url,
        timeout=timeout,
        max_retries=max_retries,
    )


class LLMError(RuntimeError):
    """A provider failure, already mapped: ``code`` (contract error code) and ``message`` for people.

    ``category`` is a short reason for logs and metrics (``rate_limited``, ``timeout``,
    ``unavailable``, ``bad_request``, ``invalid_answer``).
    """

    # Set by ``app.llm.client.mapped_error``, for logs and capability detection only: the provider's
    # HTTP status (None when unknown) and its error text (at most 500 characters).
    status_code: int | None = None
    provider_message: str = ""

    def __init__(self, code: str, message: str, category: str, retryable: bool):
        super().__init__(f"{category}")
        self.code = code
        self.message = message
        self.category = category
        self.retryable = retryable


def map_error(exc: BaseException) -> LLMError:
    """Map an SDK or transport exception to an ``LLMError`` (``docs/contract.md``, WebSocket errors)."""
    if isinstance(exc, LLMError):
        return exc
    if isinstance(exc, openai.RateLimitError):
        return LLMError("rate_limited", "The model provider is busy right now. Please try again in a moment.",
                        "rate_limited", True)
    if isinstance(exc, (openai.APITimeoutError, TimeoutError)):
        return LLMError("llm_unavailable", "The model took too long to answer. Please try again.", "timeout", True)
    if isinstance(exc, openai.APIStatusError) and 400 <= exc.status_code < 500 and exc.status_code != 408:
        return LLMError("llm_unavailable", "The model provider refused the request.", "bad_request", False)
    return LLMError("llm_unavailable", "The model is unavailable right now. Please try again.", "unavailable", True)


REFUSAL_STATUSES = frozenset({400, 422, 500, 501})


def is_refusal(error: BaseException, words: tuple[str, ...]) -> bool:
    """True when a provider answered HTTP 400, 422, 500 or 501 with an error text naming one of ``words``.

    Args:
        error: an SDK ``openai.APIStatusError``, or an ``LLMError`` from ``client.mapped_error``
            (which keeps the provider's ``status_code`` and ``provider_message``).
        words: lower-case fragments, for example ``("tool", "function")``.
    """
    status = getattr(error, "status_code", None)
    if status not in REFUSAL_STATUSES:
        return False
    if isinstance(error, openai.APIStatusError):
        text = (getattr(error, "message", "") or "") + " " + json.dumps(error.body, default=str)
    else:
        text = getattr(error, "provider_message", "") or ""
    text = text.lower()
    return any(word in text for word in words)
