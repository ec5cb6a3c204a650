"""Non-streaming model calls of the runtime: plain answers and structured (JSON) answers.

Each call may take ``LLM_TURN_TIMEOUT`` seconds from its start (a task list or a delivery
run makes several in one turn).  Structured answers go through the one structured-output
client (``Services.structured``, ``app.llm.structured``): its ladder of ``response_format``
modes, the provider's record of refused modes, and validation by a pydantic model.  Every
failure is an ``LLMError``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TypeVar, cast

import openai
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel

from app.llm.client import mapped_error
from app.llm.structured import invalid_answer

if TYPE_CHECKING:  # the layer above, for types only (docs/architecture.md)
    from app.extensions import Services
    from app.settings import Settings

M = TypeVar("M", bound=BaseModel)


def call_deadline(settings: Settings) -> float:
    """``time.monotonic()`` by which one runtime model call must have answered."""
    return time.monotonic() + settings.llm_turn_timeout


def complete_text(services: Services, messages: list[dict], *, deadline: float | None = None) -> str:
    """One non-streaming answer's text (``CHAT_MODEL``, the SDK retrying ``LLM_MAX_RETRIES`` times).

    Raises:
        LLMError: the provider failed, or answered nothing (``invalid_answer``).
    """
    settings = services.settings
    deadline = deadline or call_deadline(settings)
    remaining = max(0.5, deadline - time.monotonic())
    client = services.llm.client.with_options(
        max_retries=settings.llm_max_retries,
        timeout=openai.Timeout(remaining, connect=min(settings.llm_connect_timeout, remaining)))
    try:
        # {"role", "content"} dicts: the shape the SDK types as ChatCompletionMessageParam
        response = client.chat.completions.create(
            model=settings.chat_model, messages=cast("list[ChatCompletionMessageParam]", messages))
    except Exception as exc:
        raise mapped_error(exc) from None
    try:
        text = (response.choices[0].message.content or "").strip()
    except (AttributeError, IndexError):
        text = ""
    if not text:
        raise invalid_answer()
    return text


def structured_answer(services: Services, messages: list[dict], answer: type[M], *, name: str,
                      deadline: float | None = None) -> M:
    """A structured answer of ``CHAT_MODEL`` validated by the pydantic model ``answer``.

    Raises:
        LLMError: the provider failed, or two answers in a row were unusable (``invalid_answer``).
    """
    return services.structured.ask(messages, answer, name=name,
                                   deadline=deadline or call_deadline(services.settings))
