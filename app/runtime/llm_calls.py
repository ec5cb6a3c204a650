"""Model calls of the runtime: structured (JSON) answers, plain answers, and streamed final texts.

Structured calls ask for ``response_format`` ``json_schema`` (strict); a provider that
rejects it (llama.cpp answers HTTP 500 naming ``json_schema``, others 400) is asked again
with ``json_object`` and the schema in the instructions, and the refusal is remembered
per base URL.  Whatever the provider promised, the answer is parsed and validated here;
one corrective retry follows an unusable answer.  Every failure is an ``LLMError``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any, Callable

import openai

from app.llm.client import StreamStats, mapped_error
from app.llm.provider import LLMError
from app.runtime import capabilities
from app.runtime.capabilities import JSON_SCHEMA



def invalid_answer() -> LLMError:
    """The error of an answer that cannot be used (empty, not JSON, not valid)."""
    return LLMError("llm_unavailable", "The model's answer could not be used. Please try again.",
                    "invalid_answer", False)


_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.S)


def call_deadline(settings) -> float:
    """``time.monotonic()`` by which one runtime model call must have answered."""
    return time.monotonic() + settings.llm_turn_timeout


def _timeout(settings, deadline: float) -> openai.Timeout:
    remaining = max(0.5, deadline - time.monotonic())
    return openai.Timeout(remaining, connect=min(settings.llm_connect_timeout, remaining))


def _create(services, deadline: float, retries: int, **kwargs):
    settings = services.settings
    client = services.llm.client.with_options(max_retries=retries, timeout=_timeout(settings, deadline))
    return client.chat.completions.create(model=settings.chat_model, **kwargs)


def _content(response) -> str:
    try:
        return response.choices[0].message.content or ""
    except (AttributeError, IndexError):
        return ""


def complete_text(services, messages: list[dict], *, deadline: float | None = None) -> str:
    """One non-streaming answer's text.

    Raises:
        LLMError: the provider failed, or answered nothing.
    """
    deadline = deadline or call_deadline(services.settings)
    try:
        response = _create(services, deadline, services.settings.llm_max_retries, messages=messages)
    except Exception as exc:
        raise mapped_error(exc) from None
    text = _content(response).strip()
    if not text:
        raise invalid_answer()
    return text


def parse_json_object(text: str) -> dict:
    """The JSON object in a model's answer (a fenced block is unwrapped).

    Raises:
        ValueError: no JSON object.
    """
    match = _FENCE.match(text or "")
    body = match.group(1) if match else (text or "").strip()
    try:
        value = json.loads(body)
    except ValueError:
        start, end = body.find("{"), body.rfind("}")
        if start < 0 or end <= start:
            raise ValueError("the answer is not JSON") from None
        value = json.loads(body[start:end + 1])
    if not isinstance(value, dict):
        raise ValueError("the answer is not a JSON object")
    return value


def complete_json(services, messages: list[dict], *, name: str, schema: dict,
                  validate: Callable[[dict], Any], deadline: float | None = None) -> Any:
    """A structured answer: ``validate(parsed_object)``'s return value.

    Args:
        messages: the prompt; the schema is appended to its instructions as well.
        name: the ``json_schema`` name (letters, digits, ``_``).
        schema: a JSON Schema with every property required and no additional properties.
        validate: raises ``ValueError`` (with a reason for the model) on an unusable object.

    Raises:
        LLMError: the provider failed, or two answers in a row were unusable.
    """
    settings = services.settings
    deadline = deadline or call_deadline(settings)
    prompt = list(messages) + [{"role": "system", "content":
                                "Answer with one JSON object only, matching this JSON Schema:\n" +
                                json.dumps(schema, separators=(",", ":"))}]
    problem = None
    for _attempt in range(2):
        if problem:
            prompt = prompt + [{"role": "user", "content":
                                f"That answer could not be used ({problem}). Answer again with the JSON object only."}]
        text = _structured_once(services, prompt, name, schema, deadline)
        try:
            return validate(parse_json_object(text))
        except (ValueError, TypeError, KeyError) as exc:
            problem = str(exc)[:200] or "invalid"
    raise invalid_answer()


def _structured_once(services, prompt: list[dict], name: str, schema: dict, deadline: float) -> str:
    retries = services.settings.llm_max_retries
    if not capabilities.is_unsupported(services, JSON_SCHEMA):
        response_format = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
        try:
            # No SDK retries on the first try: a refusal of json_schema must not be retried as is.
            return _content(_create(services, deadline, 0, messages=prompt, response_format=response_format))
        except Exception as exc:
            error = mapped_error(exc)
            if capabilities.rejects_feature(error, JSON_SCHEMA):
                capabilities.mark_unsupported(services, JSON_SCHEMA)
            elif error.retryable and retries > 0:
                try:
                    return _content(_create(services, deadline, retries, messages=prompt,
                                            response_format=response_format))
                except Exception as again:
                    raise mapped_error(again) from None
            else:
                raise error from None
    try:
        return _content(_create(services, deadline, retries, messages=prompt,
                                response_format={"type": "json_object"}))
    except Exception as exc:
        raise mapped_error(exc) from None


def stream_text(services, messages: list[dict], *, delta: Callable[[str], bool], cancelled: threading.Event,
                stats: StreamStats, deadline: float | None = None) -> tuple[str, bool]:
    """Stream an answer through ``delta``; returns ``(text, completed)``.

    ``completed`` is False when ``delta`` refused a piece (the turn was cancelled) or
    ``cancelled`` was set.

    Raises:
        LLMError: the provider failed or timed out.
    """
    deadline = deadline or call_deadline(services.settings)
    pieces: list[str] = []
    for chunk in services.llm.stream_chat(messages, cancelled=cancelled, deadline=deadline, stats=stats):
        for choice in chunk.choices:
            text = choice.delta.content if choice.delta else None
            if text:
                if not delta(text):
                    return "".join(pieces), False
                pieces.append(text)
    return "".join(pieces), not cancelled.is_set()
