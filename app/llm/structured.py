"""Structured (JSON) completions for compaction with the ``openai`` SDK (issue 4 item 3).

One non-streaming call to ``COMPACTION_MODEL`` at temperature 0 that must answer
one JSON object.  Providers differ in how they accept a schema, so the call tries,
in order:

1. ``response_format={"type": "json_schema", "json_schema": {...}}`` (OpenAI, vLLM, recent Ollama);
2. ``response_format={"type": "json_object", "schema": {...}}`` (llama-cpp-python's server, which
   answers HTTP 500 to ``json_schema``);
3. ``response_format={"type": "json_object"}`` (DeepSeek and other JSON-mode-only servers).

A mode is skipped when the provider rejects it (HTTP 400, 422, 500 or 501 whose
error names ``response_format`` or ``json_schema``); the mode that worked is
remembered per base URL for the life of the process.  The answer is always
parsed here and validated by the caller; the schema sent is only a hint.
Failures are ``LLMError`` (``rate_limited``, ``timeout``, ``unavailable``,
``bad_request``, ``invalid_answer``) without any provider text in ``message``.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import openai

from app.llm.provider import LLMError, make_openai_client, map_error
from app.settings import Settings

log = logging.getLogger(__name__)

MODES = ("json_schema", "json_object_schema", "json_object")
REJECTION_STATUSES = frozenset({400, 422, 500, 501})
_REJECTION_WORDS = ("response_format", "json_schema", "response format", "json schema")
_FENCE_RE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)
DEFAULT_BASE_URL = "https://api.openai.com/v1"

_modes_lock = threading.Lock()
_working_modes: dict[str, str] = {}


def invalid_answer() -> LLMError:
    """The ``LLMError`` for an answer that is not one usable JSON object (retryable)."""
    return LLMError("llm_unavailable", "The model's answer could not be used.", "invalid_answer", True)


def compaction_json_schema(limits, *, with_lengths: bool = True) -> dict:
    """The JSON schema of a compaction answer: exactly ``{summary, pinnedDecisions}``.

    Args:
        limits: ``MemoryLimits``; the character limits become ``maxLength`` and the pin
            limit ``maxItems`` when ``with_lengths`` is true (OpenAI's strict mode does not
            take ``maxLength``, so the ``json_schema`` mode sends the schema without them).
    """
    summary: dict = {"type": "string"}
    item: dict = {"type": "string"}
    pins: dict = {"type": "array", "items": item}
    if with_lengths:
        summary["maxLength"] = limits.summary_max_chars
        item["maxLength"] = limits.pinned_max_chars
        pins["maxItems"] = limits.pinned_max
    return {
        "type": "object",
        "properties": {"summary": summary, "pinnedDecisions": pins},
        "required": ["summary", "pinnedDecisions"],
        "additionalProperties": False,
    }


# llama.cpp turns a schema into a grammar with one rule per repeated character: a ``maxLength`` much
# above 1000 makes it refuse the grammar ("exceeds sane defaults") and llama-cpp-python 0.3.36 then
# crashes (SIGSEGV) instead of answering an error.  Such limits are left out of the schema sent in the
# ``json_object_schema`` mode; the parsed answer is validated against the real limits all the same.
GRAMMAR_MAX_LENGTH = 1000


def grammar_safe(schema: Any) -> Any:
    """A copy of ``schema`` without any ``maxLength`` above ``GRAMMAR_MAX_LENGTH`` (characters)."""
    if isinstance(schema, dict):
        return {k: grammar_safe(v) for k, v in schema.items()
                if not (k == "maxLength" and isinstance(v, int) and v > GRAMMAR_MAX_LENGTH)}
    if isinstance(schema, list):
        return [grammar_safe(v) for v in schema]
    return schema


def response_format_for(mode: str, schema: dict, strict_schema: dict, name: str) -> dict:
    """The ``response_format`` request field of one mode (see ``MODES``)."""
    if mode == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": name, "schema": strict_schema, "strict": True}}
    if mode == "json_object_schema":
        return {"type": "json_object", "schema": grammar_safe(schema)}
    return {"type": "json_object"}


def parse_json_answer(content: str | None) -> Any:
    """Parse a model's JSON answer: surrounding whitespace and one Markdown code fence are tolerated.

    Raises:
        LLMError: ``category="invalid_answer"`` when there is no content or it is not JSON.
    """
    if not content or not content.strip():
        raise invalid_answer()
    text = content.strip()
    fenced = _FENCE_RE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        return json.loads(text)
    except ValueError:
        raise invalid_answer() from None


def is_format_rejection(exc: BaseException) -> bool:
    """True when a provider error says it does not take this ``response_format``."""
    if not isinstance(exc, openai.APIStatusError) or exc.status_code not in REJECTION_STATUSES:
        return False
    text = (getattr(exc, "message", "") or "") + " " + json.dumps(exc.body, default=str)
    text = text.lower()
    return any(word in text for word in _REJECTION_WORDS)


@dataclass(frozen=True)
class StructuredAnswer:
    """A parsed structured answer.

    Attributes:
        data: the parsed JSON value (not yet validated: the caller validates).
        raw: the content as received (kept in memory only for a second attempt's prompt).
        mode: the ``response_format`` mode that was accepted (one of ``MODES``).
        duration_ms: time of the successful request, in milliseconds.
    """

    data: Any
    raw: str
    mode: str
    duration_ms: int


class StructuredClient:
    """Makes structured compaction calls to ``COMPACTION_MODEL`` at ``OPENAI_BASE_URL``.

    Args:
        settings: provider, ``compaction_model``, ``compaction_llm_timeout`` (seconds).
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self.base_url = (settings.openai_base_url or DEFAULT_BASE_URL).rstrip("/")
        self.client = make_openai_client(settings, read_timeout=settings.compaction_llm_timeout, max_retries=0)

    def known_mode(self) -> str | None:
        """The mode remembered for this base URL, or None before the first accepted call."""
        with _modes_lock:
            return _working_modes.get(self.base_url)

    def _remember(self, mode: str) -> None:
        with _modes_lock:
            _working_modes[self.base_url] = mode

    def complete_json(self, messages: list[dict], *, schema: dict, strict_schema: dict,
                      name: str = "compaction", timeout: float | None = None) -> StructuredAnswer:
        """One structured completion (temperature 0, non-streaming, no SDK retries).

        Args:
            messages: the prompt, ``[{"role", "content"}, ...]``.
            schema: the JSON schema with limits (for ``json_object_schema`` mode).
            strict_schema: the JSON schema for OpenAI-style strict ``json_schema`` mode.
            name: the schema's name in ``json_schema`` mode.
            timeout: seconds this call may wait for the answer (default ``compaction_llm_timeout``).

        Returns:
            The parsed answer (any JSON value).

        Raises:
            LLMError: ``rate_limited`` (429), ``timeout``, ``unavailable`` (5xx, connection),
                ``bad_request`` (other 4xx, or every mode rejected), ``invalid_answer``
                (empty or not JSON).
        """
        start_mode = self.known_mode() or MODES[0]
        for mode in MODES[MODES.index(start_mode):]:
            started = time.monotonic()
            try:
                completion = self.client.chat.completions.create(
                    model=self.settings.compaction_model,
                    messages=messages,
                    temperature=0,
                    stream=False,
                    response_format=response_format_for(mode, schema, strict_schema, name),
                    timeout=timeout if timeout is not None else self.settings.compaction_llm_timeout,
                )
            except openai.APIStatusError as exc:
                if is_format_rejection(exc):
                    log.info("provider %s rejected response_format mode %s (HTTP %s); trying the next",
                             self.base_url, mode, exc.status_code)
                    continue
                raise map_error(exc) from None
            except Exception as exc:  # transport errors, timeouts
                raise map_error(exc) from None
            self._remember(mode)
            duration_ms = int((time.monotonic() - started) * 1000)
            if not completion.choices:
                raise invalid_answer()
            content = completion.choices[0].message.content
            return StructuredAnswer(parse_json_answer(content), content or "", mode, duration_ms)
        raise LLMError("llm_unavailable", "The model provider refused the request.", "bad_request", False)


@lru_cache(maxsize=8)
def structured_client(settings: Settings) -> StructuredClient:
    """The process's ``StructuredClient`` for ``settings`` (one HTTP connection pool each)."""
    return StructuredClient(settings)


def forget_modes() -> None:
    """Forget which mode worked for each base URL (tests)."""
    with _modes_lock:
        _working_modes.clear()
