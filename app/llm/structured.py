"""Structured (JSON) answers from any OpenAI-compatible provider: one ladder of modes, one record, one parser.

Providers differ in how they take a schema, so a call tries these ``response_format`` modes
in order (``MODES``):

1. ``json_schema``: ``{"type": "json_schema", "json_schema": {name, schema, "strict": true}}``
   (OpenAI, vLLM, recent Ollama, llama.cpp's own server, which serves the bundled model and
   turns the schema into a grammar), with the strict form of the schema (no string lengths);
2. ``json_object_schema``: ``{"type": "json_object", "schema": {...}}`` (llama-cpp-python's
   server, which answers HTTP 500 to ``json_schema``);
3. ``json_object``: ``{"type": "json_object"}`` (DeepSeek and other JSON-mode-only servers).

A mode the provider refuses (HTTP 400, 422, 500 or 501 naming ``response_format`` or a
schema) is recorded in the provider's record (a ``ModeRecord``: ``ProviderCaps`` in Redis,
shared by every process) and skipped from then on by every call of every process.  The
answer is always parsed here (``parse_json``: one Markdown fence and text around one object
are tolerated) and validated by its pydantic model; the schema sent is only a hint.

* ``StructuredClient.ask(messages, Model)``: a validated ``Model``; the schema (from
  ``Model.model_json_schema()``) is added to the instructions, and one unusable answer is
  answered with what was wrong before it is a failure.
* ``StructuredClient.complete_json(messages, schema=..., strict_schema=...)``: one parsed
  answer (``StructuredAnswer``), validated by the caller (compaction).

The clients: ``Services.structured`` (``CHAT_MODEL``, for the runtime) and
``Services.compaction_llm`` (``StructuredClient.for_compaction``: ``COMPACTION_MODEL`` at
``compaction_endpoint(settings)``); each is given its provider's record of refused modes.
Every failure is an ``LLMError`` (``rate_limited``, ``timeout``, ``unavailable``,
``bad_request``, ``invalid_answer``) without provider text in ``message``.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import KW_ONLY, dataclass
from functools import lru_cache
from typing import Any, Protocol, TypeVar, cast

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
from openai.types.chat.completion_create_params import ResponseFormat
from pydantic import BaseModel, ValidationError
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_before_delay, wait_exponential
from tenacity.stop import stop_base

from app.llm.provider import LLMError, is_refusal, make_openai_client, map_error
from app.settings import Settings

log = logging.getLogger(__name__)

MODES = ("json_schema", "json_object_schema", "json_object")
_REFUSAL_WORDS = ("response_format", "response format", "schema")
_FENCE_RE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)
ANSWER_ATTEMPTS = 2
PROBLEM_CHARS = 200

# llama-cpp-python turns a schema into a grammar with one rule per repeated character: a ``maxLength`` much
# above 1000 makes it refuse the grammar ("exceeds sane defaults") and its version 0.3.36 then
# crashes (SIGSEGV) instead of answering an error.  Such limits are left out of the schema sent in the
# ``json_object_schema`` mode; the parsed answer is validated against the real limits all the same.
GRAMMAR_MAX_LENGTH = 1000
# OpenAI's strict mode does not take string lengths.
_NOT_STRICT = frozenset({"maxLength", "minLength"})
_NOT_SENT = frozenset({"title", "description", "default", "$defs"})

M = TypeVar("M", bound=BaseModel)


def invalid_answer() -> LLMError:
    """The ``LLMError`` of an answer that cannot be used: empty, not JSON, or not valid (retryable)."""
    return LLMError("llm_unavailable", "The model's answer could not be used. Please try again.",
                    "invalid_answer", True)


class UnusableAnswer(ValueError):
    """An answer that is not one usable JSON value; ``str()`` is the reason, told to the model."""


# ------------------------------------------------------------------------------------------ parsing


def parse_json(content: str | None) -> Any:
    """The JSON value of a model's answer.

    Surrounding white space and one Markdown code fence are tolerated; an answer that is not
    JSON as a whole but holds one JSON object among other text gives that object.

    Raises:
        UnusableAnswer: no content, or no JSON in it.
    """
    text = (content or "").strip()
    if not text:
        raise UnusableAnswer("the answer is empty")
    fenced = _FENCE_RE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        return json.loads(text)
    except ValueError:
        start, end = text.find("{"), text.rfind("}")
        if start >= 0 and end > start:
            try:
                return json.loads(text[start:end + 1])
            except ValueError:
                pass
    raise UnusableAnswer("the answer is not JSON")


def parse_json_answer(content: str | None) -> Any:
    """``parse_json``, failing with ``invalid_answer()`` (an ``LLMError``)."""
    try:
        return parse_json(content)
    except UnusableAnswer:
        raise invalid_answer() from None


def answer_problems(exc: ValidationError) -> list[str]:
    """What was wrong with an answer, one reason per error, in the model's words (``Value error, `` removed)."""
    problems = []
    for error in exc.errors():
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        if error.get("type") != "value_error" and error.get("loc"):
            message = ".".join(str(part) for part in error["loc"]) + ": " + message
        if message not in problems:
            problems.append(message)
    return problems


# ------------------------------------------------------------------------------------------ schemas


def grammar_safe(schema: Any) -> Any:
    """A copy of ``schema`` without any ``maxLength`` above ``GRAMMAR_MAX_LENGTH`` (characters)."""
    if isinstance(schema, dict):
        return {k: grammar_safe(v) for k, v in schema.items()
                if not (k == "maxLength" and isinstance(v, int) and v > GRAMMAR_MAX_LENGTH)}
    if isinstance(schema, list):
        return [grammar_safe(v) for v in schema]
    return schema


def _closed(node: Any, defs: dict, drop: frozenset[str]) -> Any:
    """``node`` with ``$ref`` inlined, ``title``, ``description`` (pydantic takes the class docstring:
    developers' words, not the model's instructions), ``default`` and the ``drop`` keywords removed, and
    every object closed (``additionalProperties: false``, every property required)."""
    if isinstance(node, list):
        return [_closed(v, defs, drop) for v in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _closed(defs[node["$ref"].rsplit("/", 1)[-1]], defs, drop)
    out = {k: _closed(v, defs, drop) for k, v in node.items()
           if k not in drop and k not in _NOT_SENT and k != "properties"}
    if "properties" in node:  # property names are names, not keywords
        out["properties"] = {name: _closed(value, defs, drop) for name, value in node["properties"].items()}
        out["required"] = list(node["properties"])
        out["additionalProperties"] = False
    return out


@lru_cache(maxsize=64)
def _schemas_of(model: type[BaseModel]) -> tuple[dict, dict]:
    raw = model.model_json_schema()
    defs = raw.get("$defs", {})
    return _closed(raw, defs, frozenset()), _closed(raw, defs, _NOT_STRICT)


def answer_schema(model: type[BaseModel]) -> dict:
    """The JSON schema of ``model`` as sent: references inlined, no titles, descriptions or defaults,
    closed objects."""
    return _schemas_of(model)[0]


def strict_answer_schema(model: type[BaseModel]) -> dict:
    """``answer_schema(model)`` in the form OpenAI's strict ``json_schema`` mode takes (no string lengths)."""
    return _schemas_of(model)[1]


def response_format_for(mode: str, schema: dict, strict_schema: dict, name: str) -> dict:
    """The ``response_format`` request field of one mode (see ``MODES``)."""
    if mode == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": name, "schema": strict_schema, "strict": True}}
    if mode == "json_object_schema":
        return {"type": "json_object", "schema": grammar_safe(schema)}
    return {"type": "json_object"}


def is_format_rejection(exc: BaseException) -> bool:
    """True when a provider error says it does not take this ``response_format``."""
    return isinstance(exc, openai.APIStatusError) and is_refusal(exc, _REFUSAL_WORDS)


# ------------------------------------------------------------------------------------------ the client


class ModeRecord(Protocol):
    """Where the modes a provider refuses are recorded (``app.store.provider_caps.ProviderCaps``)."""

    def refused(self) -> frozenset[str]:
        """The features (modes among them) recorded as refused."""

    def mark_refused(self, feature: str) -> None:
        """Record that ``feature`` is refused."""


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


@dataclass
class StructuredClient:
    """Structured calls to one model of one provider.

    Attributes (all but ``client`` keyword-only):
        client: the SDK client (its base URL is the provider's).
        model: the model name.
        record: the provider's record of refused modes.
        temperature: sent when not None.
        max_retries: further tries of a mode after a retryable failure that is no refusal
            (rate limit, timeout, 5xx), with exponential backoff; never past a call's deadline.
        connect_timeout: seconds to connect, when a call has a deadline.
        timeout: seconds a call without a deadline may wait for its answer.
    """

    client: openai.OpenAI
    _: KW_ONLY
    model: str
    record: ModeRecord
    temperature: float | None = None
    max_retries: int = 0
    connect_timeout: float = 5.0
    timeout: float = 60.0

    @classmethod
    def for_compaction(cls, settings: Settings, record: "ModeRecord") -> "StructuredClient":
        """``COMPACTION_MODEL`` at ``compaction_endpoint(settings)``, temperature 0, no retries (the Celery
        task retries), ``compaction_llm_timeout`` seconds a call; ``record`` is that provider's record
        of refused modes (``app.store.provider_caps.ProviderCaps``)."""
        client = make_openai_client(settings, read_timeout=settings.compaction_llm_timeout, max_retries=0,
                                    base_url=compaction_endpoint(settings))
        return cls(client, model=settings.compaction_model, record=record, temperature=0,
                   connect_timeout=settings.llm_connect_timeout, timeout=settings.compaction_llm_timeout)

    def _modes(self) -> list[str]:
        """The modes to try, in order: those the provider is not recorded to refuse (at least the last)."""
        refused = self.record.refused()
        return [m for m in MODES if m not in refused] or [MODES[-1]]

    # -- requests ------------------------------------------------------------------------------

    def _timeout(self, timeout: float | None, deadline: float | None) -> float | openai.Timeout:
        if deadline is None:
            return timeout if timeout is not None else self.timeout
        remaining = max(0.5, deadline - time.monotonic())
        return openai.Timeout(remaining, connect=min(self.connect_timeout, remaining))

    def _create(self, messages: list[dict], response_format: dict, timeout: float | None, deadline: float | None,
                max_tokens: int | None) -> ChatCompletion:
        extra: dict[str, Any] = {} if self.temperature is None else {"temperature": self.temperature}
        if max_tokens:
            extra["max_tokens"] = max_tokens
        # Plain dicts of the shapes the SDK types as TypedDicts ({"role", "content"}; the ladder's formats).
        return self.client.chat.completions.create(
            model=self.model, messages=cast("list[ChatCompletionMessageParam]", messages), stream=False,
            response_format=cast(ResponseFormat, response_format), timeout=self._timeout(timeout, deadline),
            **extra)

    def _create_with_retries(self, messages: list[dict], response_format: dict, timeout: float | None,
                            deadline: float | None, max_tokens: int | None) -> ChatCompletion:
        stop: stop_base = stop_after_attempt(1 + self.max_retries)
        if deadline is not None:
            # stop_before_delay counts the coming backoff: no attempt starts later than 1 s before the deadline
            stop = stop | stop_before_delay(max(0.0, deadline - time.monotonic() - 1))
        retrying = Retrying(stop=stop, wait=wait_exponential(multiplier=0.25, max=2), reraise=True,
                            retry=retry_if_exception(lambda e: not is_format_rejection(e) and map_error(e).retryable))
        return retrying(self._create, messages, response_format, timeout, deadline, max_tokens)

    def _answer(self, messages: list[dict], schema: dict, strict_schema: dict, name: str,
                timeout: float | None, deadline: float | None, max_tokens: int | None) -> tuple[str | None, str, int]:
        """``(content, mode, duration_ms)`` of the first answer on the ladder of modes."""
        for mode in self._modes():
            started = time.monotonic()
            try:
                completion = self._create_with_retries(
                    messages, response_format_for(mode, schema, strict_schema, name), timeout, deadline, max_tokens)
            except openai.APIStatusError as exc:
                if is_format_rejection(exc):
                    log.info("provider refused response_format mode %s (HTTP %s)", mode, exc.status_code)
                    if mode != MODES[-1]:
                        self.record.mark_refused(mode)
                    continue
                raise map_error(exc) from None
            except Exception as exc:  # transport errors, timeouts
                raise map_error(exc) from None
            duration_ms = int((time.monotonic() - started) * 1000)
            return (completion.choices[0].message.content if completion.choices else None), mode, duration_ms
        raise LLMError("llm_unavailable", "The model provider refused the request.", "bad_request", False)

    def complete_json(self, messages: list[dict], *, schema: dict, strict_schema: dict, name: str = "compaction",
                      timeout: float | None = None, deadline: float | None = None,
                      max_tokens: int | None = None) -> StructuredAnswer:
        """One structured completion (non-streaming), on the ladder of modes.

        Args:
            messages: the prompt, ``[{"role", "content"}, ...]``.
            schema: the JSON schema with limits (for the ``json_object_schema`` mode).
            strict_schema: the JSON schema for OpenAI-style strict ``json_schema`` mode.
            name: the schema's name in ``json_schema`` mode (letters, digits, ``_``).
            timeout: seconds this call may wait for the answer (default: the client's).
            deadline: ``time.monotonic()`` by which the call must have answered (instead of ``timeout``).
            max_tokens: the most tokens the answer may use (None: the provider's default).

        Returns:
            The parsed answer (any JSON value).

        Raises:
            LLMError: ``rate_limited`` (429), ``timeout``, ``unavailable`` (5xx, connection),
                ``bad_request`` (other 4xx, or every mode refused), ``invalid_answer``
                (empty or not JSON).
        """
        content, mode, duration_ms = self._answer(messages, schema, strict_schema, name, timeout, deadline,
                                                  max_tokens)
        return StructuredAnswer(parse_json_answer(content), content or "", mode, duration_ms)

    def ask(self, messages: list[dict], answer: type[M], *, name: str | None = None, timeout: float | None = None,
            deadline: float | None = None, max_tokens: int | None = None) -> M:
        """A structured answer validated by ``answer`` (a pydantic model).

        The model's JSON schema is appended to the instructions.  An answer that is not JSON or
        fails validation is answered once with what was wrong; a second unusable answer fails.

        Args:
            messages: the prompt.
            answer: the answer's model; its JSON schema is sent, and it validates what comes back.
            name: the schema's name in ``json_schema`` mode (default: the model's class name).
            timeout, deadline, max_tokens: as for ``complete_json``, per request.

        Raises:
            LLMError: the provider failed, or ``invalid_answer`` after two unusable answers.
        """
        schema, strict = answer_schema(answer), strict_answer_schema(answer)
        prompt = list(messages) + [{"role": "system", "content": "Answer with one JSON object only, matching "
                                    "this JSON Schema:\n" + json.dumps(schema, separators=(",", ":"))}]
        problem = None
        for _attempt in range(ANSWER_ATTEMPTS):
            if problem:
                prompt = prompt + [{"role": "user", "content":
                                    f"That answer could not be used ({problem}). Answer again with the JSON object only."}]
            content, _mode, _ms = self._answer(prompt, schema, strict, name or answer.__name__, timeout, deadline,
                                               max_tokens)
            try:
                return answer.model_validate(parse_json(content))
            except UnusableAnswer as exc:
                problem = str(exc)
            except ValidationError as exc:
                problem = "; ".join(answer_problems(exc))[:PROBLEM_CHARS] or "invalid"
        raise invalid_answer()


def compaction_endpoint(settings: Settings) -> str | None:
    """The base URL compaction calls go to: ``COMPACTION_BASE_URL``, else ``OPENAI_BASE_URL`` (None: OpenAI)."""
    return settings.compaction_base_url or settings.openai_base_url
