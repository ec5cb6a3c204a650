"""Streaming chat completions with the ``openai`` SDK.

Retries happen only before the first token arrives (a retry after tokens were
shown would duplicate text), with tenacity's exponential backoff, and never past
the turn's deadline.  Cancelling closes the upstream response so the provider
stops generating.  Every failure surfaces as ``LLMError`` (contract error codes,
a message for people, no exception text).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import openai
from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, stop_before_delay, wait_exponential

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


def _retryable(exc: BaseException) -> bool:
    return map_error(exc).retryable


class CancelEvent(threading.Event):
    """A ``threading.Event`` that also runs callbacks when set.

    ``stream_chat`` registers one that shuts the upstream connection down, so a cancel stops the
    provider at once, even while the reading thread is blocked waiting for the first token or in
    a stall (with a plain ``Event`` the stream is only closed when the next chunk arrives).
    """

    def __init__(self):
        super().__init__()
        self._callbacks: list = []
        self._callbacks_lock = threading.Lock()

    def set(self) -> None:
        super().set()
        with self._callbacks_lock:
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.debug("cancel callback failed", exc_info=True)

    def add_callback(self, callback) -> None:
        """Run ``callback()`` when the event is set (at once when it already is)."""
        with self._callbacks_lock:
            if not self.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def remove_callback(self, callback) -> None:
        """Forget ``callback`` (the stream it would close has ended)."""
        with self._callbacks_lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)


class _UpstreamAbort:
    """Called from any thread, shuts the stream's TCP connection down: a blocked read returns at once and the
    provider sees the client go away (closing the response alone does not wake a blocked read).

    ``release()`` (before the stream is closed) makes later calls do nothing, so a cancel that races the end
    of the stream never shuts down a pooled connection that another request already reuses.
    """

    def __init__(self, stream):
        self._stream = stream
        self._lock = threading.Lock()
        self._released = False

    def __call__(self) -> None:
        with self._lock:
            if self._released:
                return
            network_stream = self._stream.response.extensions.get("network_stream")
            sock = network_stream.get_extra_info("socket") if network_stream is not None else None
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def release(self, cancelled: "CancelEvent") -> None:
        cancelled.remove_callback(self)
        with self._lock:
            self._released = True


def mapped_error(exc: BaseException) -> LLMError:
    """``map_error`` plus what the runtime needs to recognise an unsupported feature.

    Sets ``status_code`` (the provider's HTTP status or None) and ``provider_message`` (the
    provider's error text, at most 500 characters).  Both are for logs and capability
    detection (for example a 400 that names ``tools``); never shown to people.
    """
    err = map_error(exc)
    if getattr(err, "status_code", None) is None:
        err.status_code = getattr(exc, "status_code", None)
        body = getattr(exc, "body", None)
        detail = body.get("message") if isinstance(body, dict) else None
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            detail = body["error"].get("message")
        err.provider_message = str(detail or getattr(exc, "message", "") or "")[:500]
    return err


class Chunk:
    """A streamed chunk read straight from the SSE JSON, with the SDK's attribute names.

    ``chunk.choices[0].delta.content``, ``.delta.tool_calls[i].function.arguments``,
    ``.finish_reason``, ``chunk.usage.prompt_tokens``: a missing key reads as None.  Reading
    the JSON directly costs a few microseconds per chunk where building the SDK's pydantic
    chunk models costs about 150 (measured by ``bench/ws_load.py``), on every streamed token.
    """

    __slots__ = ("_data",)

    def __init__(self, data: dict):
        self._data = data

    def __getattr__(self, name: str):
        value = self._data.get(name)
        if isinstance(value, dict):
            return Chunk(value)
        if isinstance(value, list):
            return [Chunk(v) if isinstance(v, dict) else v for v in value]
        return value


class SSEStream:
    """The chat-completions event stream of one request: the SDK sends the request and raises its
    status errors; the body's ``data:`` lines are read here into ``Chunk`` values.

    Args:
        manager: what ``client.chat.completions.with_streaming_response.create(...)`` returned.
    """

    def __init__(self, manager):
        self._manager = manager
        self._api_response = manager.__enter__()
        self.response = self._api_response.http_response  # the httpx response (its socket, for aborts)

    def __iter__(self) -> Iterator[Chunk]:
        for line in self._api_response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                event = json.loads(data)
            except ValueError:
                raise LLMError("llm_unavailable", "The model sent an unreadable answer.", "unavailable", True) from None
            if not isinstance(event, dict) or event.get("error"):
                raise LLMError("llm_unavailable", "The model is unavailable right now. Please try again.",
                               "unavailable", True)
            yield Chunk(event)

    def close(self) -> None:
        """Close the response (its connection goes back to the pool or is closed)."""
        self._manager.__exit__(None, None, None)


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

    def _open(self, messages: list[dict], model: str, deadline: float, stats: StreamStats, extra: dict,
              cancelled: threading.Event):
        """Open a stream and read up to its first text delta; returns ``(stream, iterator, first_pieces, abort)``.

        ``abort`` is the callback registered on ``cancelled`` (a ``CancelEvent``), or None.
        """
        if cancelled.is_set():
            raise LLMError("llm_unavailable", "The turn was cancelled.", "cancelled", False)
        stats.attempts += 1
        stream = SSEStream(self.client.chat.completions.with_streaming_response.create(
            model=model, messages=messages, stream=True, stream_options={"include_usage": True},
            timeout=self._timeout(deadline), **extra))
        abort = None
        if isinstance(cancelled, CancelEvent):
            abort = _UpstreamAbort(stream)
            cancelled.add_callback(abort)
        iterator = iter(stream)
        pending = []
        try:
            for chunk in iterator:
                pending.append(chunk)
                if any(c.delta and (c.delta.content or c.delta.tool_calls) for c in chunk.choices):
                    break
        except BaseException:
            if abort is not None:
                abort.release(cancelled)
            stream.close()
            raise
        return stream, iterator, pending, abort

    def stream_chat(self, messages: list[dict], *, cancelled: threading.Event, deadline: float,
                    stats: StreamStats, model: str | None = None, **extra) -> Iterator[Chunk]:
        """Yield the answer's chunks (``Chunk``, the SDK's attribute names) as they arrive.

        Args:
            messages: the prompt, ``[{"role", "content"}]``.
            cancelled: set by another thread to stop; the upstream response is then closed.
            deadline: ``time.monotonic()`` after which the turn fails (``llm_unavailable``).
            stats: filled with usage, first-token time and attempts.
            model: overrides ``CHAT_MODEL``.
            extra: further chat-completion arguments (for example ``tools``, ``tool_choice``);
                the chunks then carry ``delta.tool_calls`` too.

        Raises:
            LLMError: the provider failed, timed out, or the deadline passed (with ``status_code``
                and ``provider_message`` set, see ``mapped_error``).
        """
        model = model or self.settings.chat_model
        retrying = Retrying(
            stop=stop_after_attempt(1 + self.settings.llm_max_retries)
            # stop_before_delay counts the coming backoff: no attempt starts later than 1 s before the deadline
            | stop_before_delay(max(0.0, deadline - time.monotonic() - 1)),
            wait=wait_exponential(multiplier=0.25, max=2),
            retry=retry_if_exception(lambda exc: not cancelled.is_set() and _retryable(exc)),
            reraise=True,
        )
        try:
            stream, iterator, pending, abort = retrying(self._open, messages, model, deadline, stats, extra, cancelled)
        except RetryError as exc:  # pragma: no cover - reraise=True makes this unreachable
            raise mapped_error(exc.last_attempt.exception()) from None
        except Exception as exc:
            if cancelled.is_set():
                return  # cancelled while connecting: the connection is already shut down
            raise mapped_error(exc) from None
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
            if cancelled.is_set():
                return  # the read failed because the cancel shut the connection down
            raise mapped_error(exc) from None
        finally:
            if abort is not None:
                abort.release(cancelled)
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
