"""Streaming chat completions with the ``openai`` SDK.

Retries happen only before the first token arrives (a retry after tokens were
shown would duplicate text), with tenacity's exponential backoff, and never past
the call's first-token deadline.  A stream's clock measures silence, not length
(docs/contract.md: Configuration, ``LLM_FIRST_TOKEN_TIMEOUT_SECONDS`` and
``LLM_TOKEN_GAP_TIMEOUT_SECONDS``): the wait for the first text, then the gap
between two pieces of text; events without text (keep-alives, the bundled model's
``x.wait`` and prompt progress) keep the connection alive but do not count as text.  Cancelling closes the upstream response so the provider
stops generating.  Every failure surfaces as ``LLMError`` (contract error codes,
a message for people, no exception text).
"""

from __future__ import annotations

import logging
import math
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

import openai
import orjson
from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, stop_before_delay, wait_exponential

from app.llm.cache_key import cache_headers
from app.llm.provider import LLMError, make_openai_client, map_error
from app.llm.sampling import answer_options
from app.settings import Settings

if TYPE_CHECKING:
    import h11
    import httpx2
    from openai._response import ResponseContextManager
    from openai.types.chat import ChatCompletionChunk

log = logging.getLogger(__name__)


@dataclass
class StreamStats:
    """What a finished (or abandoned) stream reported.

    Attributes:
        prompt_tokens: the provider's count, when it reports usage (tokens), else None.
        completion_tokens: the provider's count, when it reports usage (tokens), else None.
        first_token_at: ``time.monotonic()`` of the first text delta, or None.
        attempts: how many requests were made (1 + retries).
        finish_reason: the provider's, when it sent one.
        prompt_read: prompt tokens the server read for this answer (llama.cpp's ``timings.prompt_n``), else None.
        prompt_cached: prompt tokens it took from its cache instead (llama.cpp's ``timings.cache_n``), else None.
        on_wait: called from the reading thread with ``(reason, percent)`` when the stream says why the
            first token waits: ``("another_turn", None)`` for the slot proxy's ``x.wait`` event, ``("reading",
            0..100)`` for llama.cpp's prompt progress while more than ``READING_NOTICE_TOKENS`` remain to read.
            Set by the turn; None: ignored.  It must not block.
    """

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    first_token_at: float | None = None
    attempts: int = 0
    finish_reason: str | None = None
    prompt_read: int | None = None
    prompt_cached: int | None = None
    on_wait: Callable[[str, int | None], None] | None = field(default=None, repr=False, compare=False)


def _next_tick(after: float, interval: float) -> float:
    """The first multiple of ``interval`` on the monotonic clock at least ``interval / 2`` past ``after`` (seconds)."""
    return math.ceil((after + interval / 2) / interval) * interval


def _retryable(exc: BaseException) -> bool:
    return map_error(exc).retryable


class CancelEvent(threading.Event):
    """A ``threading.Event`` that also runs callbacks when set.

    ``stream_chat`` registers one that shuts the upstream connection down, so a cancel stops the
    provider at once, even while the reading thread is blocked waiting for the first token or in
    a stall (with a plain ``Event`` the stream is only closed when the next chunk arrives).
    """

    def __init__(self) -> None:
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

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Run ``callback()`` when the event is set (at once when it already is)."""
        with self._callbacks_lock:
            if not self.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def remove_callback(self, callback: Callable[[], None]) -> None:
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

    def __init__(self, stream: SSEStream, cancelled: threading.Event) -> None:
        self._stream = stream
        self._cancelled = cancelled  # the event this may be registered on (a ``CancelEvent``'s ``add_callback``)
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

    def release(self) -> None:
        if isinstance(self._cancelled, CancelEvent):
            self._cancelled.remove_callback(self)
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


@dataclass(slots=True)
class StreamDelta:
    """What one read of the answer stream brought: every event that had arrived when it was read.

    Attributes:
        text: the ``choices[*].delta.content`` pieces of those events, joined (may be "").
        tool_calls: their ``choices[*].delta.tool_calls`` parts, the provider's JSON objects in order
            (``{"index", "id"?, "function": {"name"?, "arguments"?}}``).

    A value is true when it carries text or tool-call parts.
    """

    text: str = ""
    tool_calls: list = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.text or self.tool_calls)


MAX_SSE_LINE_BYTES = 1 << 20  # an unfinished event line longer than this fails the stream

READING_NOTICE_TOKENS = 200
"""Prompt progress is told (``on_wait("reading", percent)``) only while more than this many tokens remain to read."""


def event_error(error: object) -> LLMError:
    """The ``LLMError`` of an error event in a stream that had already answered 200
    (``data: {"error": {"message", "code": <HTTP status>}}``, as llama.cpp's server and the bundled model's
    slot proxy send it): the same as a non-200 answer with that status would give (``map_error``), so it is
    retried only before any text was shown.  ``status_code`` and ``provider_message`` are set (for logs).
    """
    status = error.get("code") if isinstance(error, dict) else None
    status = status if isinstance(status, int) and not isinstance(status, bool) else None
    detail = error.get("message") if isinstance(error, dict) else error
    if status == 429:
        err = LLMError("rate_limited", "The model provider is busy right now. Please try again in a moment.",
                       "rate_limited", True)
    elif status is not None and 400 <= status < 500 and status != 408:
        err = LLMError("llm_unavailable", "The model provider refused the request.", "bad_request", False)
    else:
        err = LLMError("llm_unavailable", "The model is unavailable right now. Please try again.", "unavailable",
                       True)
    err.status_code = status
    err.provider_message = str(detail or "")[:500]
    return err


def _timed_out(exc: BaseException) -> bool:
    """True for a read that timed out (httpx's or the SDK's exception)."""
    return isinstance(exc, (openai.APITimeoutError, TimeoutError)) or any(
        cls.__name__ == "TimeoutException" for cls in type(exc).__mro__)


def first_token_error(limit: float) -> LLMError:
    """The failure of an answer whose first text did not come within ``limit`` seconds (not retried: the
    limit covers the retries)."""
    return LLMError("llm_unavailable", f"The model did not start answering within {limit:g} s. Please try again.",
                    "first_token_timeout", False)


def token_gap_error(limit: float) -> LLMError:
    """The failure of an answer that sent no text for ``limit`` seconds after some text was shown."""
    return LLMError("llm_unavailable", f"The model stopped answering: no text for {limit:g} s. "
                    "The part shown was not saved.", "token_gap_timeout", False)


class SilenceClock:
    """The silence limits of one streamed answer, kept by a watchdog thread (a greenlet under gevent).

    Before the first text the limit is ``first_deadline`` (``time.monotonic()`` seconds, the same for every
    attempt of a call); once text came, it is ``gap`` seconds from the moment the reader began waiting for
    more (time the consumer holds a piece is not silence).  Events without text never move either.  When a
    limit passes, ``expired`` says which (``"first_token"`` or ``"gap"``) and ``abort()`` is called (it shuts
    the connection down, so the blocked read returns at once and the provider sees the client go away).

    Args:
        first_deadline: ``time.monotonic()`` by which the first text must come (seconds).
        first_limit: the first-token limit in seconds (for the message).
        gap: the longest silence between two pieces of text (seconds).
        abort: called once, from the watchdog, when a limit passes.
    """

    def __init__(self, first_deadline: float, first_limit: float, gap: float, abort: Callable[[], None]):
        self.first_deadline = first_deadline
        self.first_limit = first_limit
        self.gap = gap
        self._abort = abort
        self.text_seen = False
        self.waiting_since: float | None = None  # set by the reader while it waits after text
        self.expired: str | None = None
        self._stopped = threading.Event()
        threading.Thread(target=self._watch, name="llm-silence-clock", daemon=True).start()

    def _due(self) -> float | None:
        if not self.text_seen:
            return self.first_deadline
        since = self.waiting_since
        return None if since is None else since + self.gap

    def _watch(self) -> None:
        while True:
            due = self._due()
            rest = self.gap if due is None else due - time.monotonic()
            if rest > 0:
                if self._stopped.wait(rest):
                    return
                continue
            self.expired = "gap" if self.text_seen else "first_token"
            if not self._stopped.is_set():
                self._abort()
            return

    def error(self) -> LLMError:
        """The failure for the limit that passed (for the current phase when none did: the socket's own read
        timeout, equal to the limit, fired first)."""
        gap = self.expired == "gap" if self.expired else self.text_seen
        return token_gap_error(self.gap) if gap else first_token_error(self.first_limit)

    def stop(self) -> None:
        """End the watchdog (the stream ended); no abort happens after this returns... unless it already ran."""
        self._stopped.set()


def truncated_error() -> LLMError:
    """The failure of a stream whose body ended before ``data: [DONE]`` or a ``finish_reason``
    (``upstream_truncated``; docs/contract.md: WebSocket).  Retried only before any text was shown."""
    return LLMError("upstream_truncated", "The model's answer was cut off before it finished, so it was not "
                    "saved. Please try again.", "truncated", True)


def http_parser(response: httpx2.Response) -> h11.Connection | None:
    """The ``h11.Connection`` parsing ``response``'s body, or None when this transport has none.

    httpx exposes no public way to it: the path is httpx2's transport stream, then httpcore2's pooled
    HTTP/1.1 stream.  Any other shape (another version, HTTP/2) gives None.
    """
    stream = getattr(getattr(response, "stream", None), "_stream", None)
    stream = getattr(getattr(stream, "_httpcore_stream", None), "_stream", None)
    parser = getattr(getattr(stream, "_connection", None), "_h11_state", None)
    return parser if hasattr(parser, "trailing_data") else None


def _waiting_probe(response: httpx2.Response) -> Callable[[], bool]:
    """A function telling whether more of ``response``'s body was already received, without reading it.

    Over plain TCP one socket read takes everything the kernel holds (up to 64 KiB), so it is enough
    to ask the HTTP parser whether it still holds unparsed bytes (``h11.Connection.trailing_data``):
    no system call, which matters because every call that releases the interpreter lock can hand it
    to another thread.  Over TLS a read returns one record at a time, so the socket is polled too.
    Without a parser or socket (another transport) it always says no: each read is then one frame.
    """
    network_stream = response.extensions.get("network_stream")
    sock = network_stream.get_extra_info("socket") if network_stream is not None else None
    parser = http_parser(response)
    # after a chunk's data the parser keeps its closing CRLF until the next call: that alone is no more body
    parsed = (lambda: bool(parser.trailing_data[0].strip(b"\r\n"))) if parser is not None else (lambda: False)
    if sock is None:
        return parsed
    pending = getattr(sock, "pending", None)  # ssl.SSLSocket
    if pending is None and parser is not None:
        return parsed
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    if pending is None:
        return lambda: bool(poller.poll(0))
    return lambda: parsed() or pending() > 0 or bool(poller.poll(0))


class SSEDecoder:
    """Server-sent events of a chat-completions stream, from body bytes in any split.

    Each ``data:`` line is one JSON event (a provider sends one line per event); ``data: [DONE]``
    ends the stream; other lines (comments, ``event:``, the blank separators) are skipped.  A line
    may be split anywhere between two ``feed`` calls, even inside a UTF-8 sequence.
    """

    def __init__(self) -> None:
        self._tail = b""
        self.done = False  # [DONE] was read; later bytes are ignored

    def feed(self, data: bytes) -> list[dict]:
        """The events completed by ``data``, in order.

        Raises:
            LLMError: an event that is not a JSON object, an error event, or a line longer than
                ``MAX_SSE_LINE_BYTES`` (``llm_unavailable``).
        """
        if self.done:
            return []
        if self._tail:
            data = self._tail + data
        lines = data.splitlines(True)
        if lines and not lines[-1].endswith((b"\n", b"\r")):
            self._tail = lines.pop()
            if len(self._tail) > MAX_SSE_LINE_BYTES:
                raise LLMError("llm_unavailable", "The model sent an unreadable answer.", "unavailable", True)
        else:
            self._tail = b""
        events = []
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                break
            try:
                event = orjson.loads(payload)
            except ValueError:  # orjson.JSONDecodeError is one
                raise LLMError("llm_unavailable", "The model sent an unreadable answer.", "unavailable", True) from None
            if not isinstance(event, dict):
                raise LLMError("llm_unavailable", "The model sent an unreadable answer.", "unavailable", True)
            if event.get("error"):
                raise event_error(event["error"])
            events.append(event)
        return events


class SSEStream:
    """The chat-completions event stream of one request: the SDK sends the request and raises its
    status errors; the body is read here, straight from its bytes.

    The events are decoded by ``SSEDecoder``.  ``read()`` returns everything that had arrived by the
    time it was called as one ``StreamDelta``, so a stream read less often than its tokens arrive
    costs one wake-up and one frame per read, not per token.  Reading the JSON directly (no SDK
    chunk objects, no text decoding of lines) keeps the work per event to one ``orjson.loads``.

    Args:
        manager: what ``client.chat.completions.with_streaming_response.create(...)`` returned.
        stats: filled with usage, finish reason and the first-token time as events arrive.
    """

    def __init__(self, manager: ResponseContextManager[openai.APIResponse[openai.Stream[ChatCompletionChunk]]],
                 stats: StreamStats, clock: Callable[["SSEStream"], SilenceClock] | None = None) -> None:
        self._manager = manager
        self._api_response = manager.__enter__()
        self.response = self._api_response.http_response  # the httpx response (its socket, for aborts)
        self._stats = stats
        # without a content coding the body's bytes are the raw ones: skip httpx's decoder layer per chunk
        coded = self.response.headers.get("content-encoding", "identity").lower() not in ("identity", "")
        self._body = self.response.iter_bytes() if coded else self.response.iter_raw()
        self._decoder = SSEDecoder()
        self._waiting = _waiting_probe(self.response)
        self.finished = False  # [DONE] read or the body ended
        self._failure: Exception | None = None  # raised by the next read()
        self._finish_read = False  # a finish_reason came in this response (not an earlier attempt's)
        self.clock = clock(self) if clock is not None else None

    @property
    def complete(self) -> bool:
        """True once the answer is known to be whole: ``data: [DONE]`` or a ``finish_reason`` was read."""
        return self._decoder.done or self._finish_read

    def read(self) -> StreamDelta | None:
        """Block until the body has more, then take every event already received.

        Returns the events' text and tool-call parts (an empty ``StreamDelta`` when they carried
        neither, e.g. the usage event at the end), or None once the stream had ended.  When the
        body fails after some events were read, those come first and the next call raises.

        An answer is whole only with ``data: [DONE]`` or a ``finish_reason``: a body that ends
        without either (the provider's connection closed, its process killed) is a failure.

        Raises:
            LLMError: an unreadable event or an error event (``event_error``); the body ended
                before the answer was whole (``upstream_truncated``); a silence limit passed
                (``SilenceClock``: ``first_token_error``, ``token_gap_error``).
            httpx.HTTPError: the connection failed (the caller maps it).
        """
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        if self.finished:
            return None
        clock = self.clock
        if clock is not None and clock.text_seen:
            clock.waiting_since = time.monotonic()
        pieces: list[str] = []
        tool_calls: list = []
        while True:
            try:
                data = next(self._body)
                self._feed(data, pieces, tool_calls)
                if clock is not None and clock.expired:
                    raise clock.error()
            except StopIteration:
                self.finished = True
                ended: LLMError | None = clock.error() if clock is not None and clock.expired else \
                    None if self.complete else truncated_error()
                if ended is not None:
                    if not (pieces or tool_calls):
                        raise ended from None
                    self._failure = ended  # after what did arrive
                break
            except Exception as exc:
                # the watchdog shut the connection down, or the socket's read timeout (the same limit) fired
                cause: Exception = exc
                if clock is not None and not isinstance(exc, LLMError) and (clock.expired or _timed_out(exc)):
                    cause = clock.error()
                if not (pieces or tool_calls):
                    if cause is exc:
                        raise
                    raise cause from None
                # what arrived before the failure is still delivered (once); the failure comes next
                self._failure, self.finished = cause, True
                break
            if pieces or tool_calls:
                if clock is not None:
                    clock.text_seen = True
                    clock.waiting_since = time.monotonic()
                if self.finished or not self._waiting():
                    break
            elif self.finished:
                break
        if clock is not None:
            clock.waiting_since = None  # the consumer holds it: not silence
        text = "".join(pieces)
        if text and self._stats.first_token_at is None:
            self._stats.first_token_at = time.monotonic()
        return StreamDelta(text, tool_calls)

    def _feed(self, data: bytes, pieces: list[str], tool_calls: list) -> None:
        stats = self._stats
        for event in self._decoder.feed(data):
            if event.get("object") == "x.wait" or "prompt_progress" in event:
                self._told_wait(event)
            for choice in event.get("choices") or ():
                delta = choice.get("delta")
                if delta:
                    content = delta.get("content")
                    if content:
                        pieces.append(content)
                    parts = delta.get("tool_calls")
                    if parts:
                        tool_calls.extend(parts)
                if choice.get("finish_reason"):
                    stats.finish_reason = choice["finish_reason"]
                    self._finish_read = True
            usage = event.get("usage")
            if usage:
                stats.prompt_tokens = usage.get("prompt_tokens")
                stats.completion_tokens = usage.get("completion_tokens")
            timings = event.get("timings")
            if isinstance(timings, dict):
                stats.prompt_read = timings.get("prompt_n")
                stats.prompt_cached = timings.get("cache_n")
        if self._decoder.done:
            self.finished = True

    def _told_wait(self, event: dict) -> None:
        """Pass a wait event on to ``stats.on_wait``: the slot proxy's ``{"object": "x.wait", "reason"}`` or
        llama.cpp's ``{"prompt_progress": {"total", "cache", "processed", "time_ms"}}`` (tokens; ``processed``
        counts the cached ones too)."""
        listener = self._stats.on_wait
        if listener is None:
            return
        progress = event.get("prompt_progress")
        if isinstance(progress, dict):
            total, cache, processed = progress.get("total"), progress.get("cache"), progress.get("processed")
            if not (isinstance(total, int) and isinstance(cache, int) and isinstance(processed, int)):
                return
            to_read = total - cache
            if to_read <= READING_NOTICE_TOKENS or processed >= total:
                return
            percent = max(0, min(99, (processed - cache) * 100 // to_read))
            listener("reading", percent)
        else:
            reason = event.get("reason")
            listener(reason if isinstance(reason, str) and reason else "another_turn", None)

    def close(self) -> None:
        """Stop the clock and close the response (its connection goes back to the pool or is closed)."""
        if self.clock is not None:
            self.clock.stop()
        self._manager.__exit__(None, None, None)


class LLMClient:
    """The chat model of the deployment (``CHAT_MODEL`` at ``OPENAI_BASE_URL``).

    Args:
        settings: provider, model, timeouts (seconds) and ``llm_max_retries``.
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self.client = make_openai_client(settings, max_retries=0)
        self._lock = threading.Lock()
        self._in_flight = 0

    @property
    def streams_in_flight(self) -> int:
        """How many ``stream_chat`` calls of this process are between their request and their end."""
        return self._in_flight

    def _count(self, step: int) -> None:
        with self._lock:
            self._in_flight += step

    def _timeout(self, deadline: float) -> openai.Timeout:
        """The socket's limits for one attempt: a read may wait for the first text until ``deadline`` and, once
        text flows, for one token gap (the ``SilenceClock`` keeps both exactly; this bounds the wait for the
        response's headers, before the clock runs)."""
        remaining = max(0.5, deadline - time.monotonic())
        read = max(remaining, self.settings.llm_token_gap_timeout)
        return openai.Timeout(read, connect=min(self.settings.llm_connect_timeout, remaining))

    def first_token_deadline(self) -> float:
        """``time.monotonic()`` by which a model call starting now must bring its first text (seconds)."""
        return time.monotonic() + self.settings.llm_first_token_timeout

    def _open(self, messages: list[dict], model: str, deadline: float, stats: StreamStats, extra: dict,
              cancelled: threading.Event,
              headers: dict | None = None) -> tuple[SSEStream, StreamDelta | None, _UpstreamAbort]:
        """Open a stream and read up to its first text or tool-call delta; returns ``(stream, first, abort)``.

        ``first`` is that ``StreamDelta`` (None when the stream ended without one); ``abort`` is the
        callback registered on ``cancelled`` (a ``CancelEvent``), or None.
        """
        if cancelled.is_set():
            raise LLMError("llm_unavailable", "The turn was cancelled.", "cancelled", False)
        if time.monotonic() >= deadline:
            raise first_token_error(self.settings.llm_first_token_timeout)
        stats.attempts += 1
        # The answer may use at most RESERVED_OUTPUT_TOKENS: the prompt was assembled to leave exactly that room.
        extra = {**answer_options(self.settings), **extra}
        if self.settings.bundled_model:
            extra.setdefault("return_progress", True)  # llama.cpp's prompt progress: the page says "reading"
        # The prompt (and tools) go as extra_body, the SDK's own way to send JSON as given: its per-request
        # transformation of typed parameters walks every message and tool schema (about half of a turn's
        # CPU in bench/ws_load.py) and changes nothing in these plain JSON values.  The body is the same.
        settings = self.settings
        abort_box: list[_UpstreamAbort] = []

        def clock(stream: SSEStream) -> SilenceClock:
            abort_box.append(_UpstreamAbort(stream, cancelled))
            return SilenceClock(deadline, settings.llm_first_token_timeout, settings.llm_token_gap_timeout,
                                abort_box[0])

        stream = SSEStream(self.client.chat.completions.with_streaming_response.create(
            model=model, messages=[], stream=True, stream_options={"include_usage": True},
            timeout=self._timeout(deadline), extra_body={"messages": messages, **extra},
            extra_headers=headers or None), stats, clock)
        abort = abort_box[0]  # released before the stream is closed, registered or not
        if isinstance(cancelled, CancelEvent):
            cancelled.add_callback(abort)
        try:
            first = stream.read()
            while first is not None and not first:
                first = stream.read()
        except BaseException:
            if abort is not None:
                abort.release()
            stream.close()
            raise
        return stream, first, abort

    def stream_chat(self, messages: list[dict], *, cancelled: threading.Event, deadline: float | None = None,
                    stats: StreamStats, model: str | None = None, flush_interval: float = 0.0,
                    thread_id: str | None = None, **extra: object) -> Iterator[StreamDelta]:
        """Yield the answer as ``StreamDelta`` values: each holds every event that had arrived when it was read.

        The first one comes as soon as the first token does.  With ``flush_interval`` (seconds) the
        stream is read again at the next tick of a clock that ticks every ``flush_interval``, at least
        half an interval after the previous value was yielded (a cancel ends the wait at once), so a
        fast model's tokens come a few at a time: one wake-up, one parse of the buffered bytes and one
        frame per interval instead of per token.  Every stream of the process waits for the same
        ticks, so one wake-up of the process serves all of them (on a 2-core VM a wake-up from idle
        costs 50-200 us of CPU; docs/benchmarks.md: Performance).  Nothing is dropped or reordered; the end of the
        stream is read at most 1.5 intervals late.

        Args:
            messages: the prompt, ``[{"role", "content"}]``.
            cancelled: set by another thread to stop; the upstream response is then closed.
            deadline: ``time.monotonic()`` by which the first text must come, through every retry (default: now
                plus ``LLM_FIRST_TOKEN_TIMEOUT_SECONDS``); once text flows, only the gap between two pieces of
                text is limited (``LLM_TOKEN_GAP_TIMEOUT_SECONDS``), never the answer's total time: its length
                is bounded by ``max_tokens`` (``app.llm.sampling.answer_options``).
            stats: filled with usage, first-token time and attempts.
            model: overrides ``CHAT_MODEL``.
            flush_interval: least time between two values after the first (seconds; 0: read on).
            thread_id: the thread the prompt is for: with the bundled model, the request carries its cache key
                (``app.llm.cache_key``), so the chat server restores that thread's cached prompt.
            extra: further chat-completion arguments (for example ``tools``, ``tool_choice``);
                the values then carry ``tool_calls`` parts too.

        Raises:
            LLMError: the provider failed (an HTTP error, or an error event after it answered 200), or a
                silence limit passed (``first_token_error``, ``token_gap_error``), with ``status_code`` and
                ``provider_message`` set, see ``mapped_error``.
        """
        model = model or self.settings.chat_model
        if deadline is None:
            deadline = self.first_token_deadline()
        retrying = Retrying(
            stop=stop_after_attempt(1 + self.settings.llm_max_retries)
            # stop_before_delay counts the coming backoff: no attempt starts later than 1 s before the deadline
            | stop_before_delay(max(0.0, deadline - time.monotonic() - 1)),
            wait=wait_exponential(multiplier=0.25, max=2),
            retry=retry_if_exception(lambda exc: not cancelled.is_set() and _retryable(exc)),
            reraise=True,
        )
        self._count(1)
        try:
            yield from self._stream(retrying, messages, model, deadline, stats, extra, cancelled, flush_interval,
                                    cache_headers(self.settings, thread_id))
        finally:
            self._count(-1)

    def _stream(self, retrying: Retrying, messages: list[dict], model: str, deadline: float, stats: StreamStats,
                extra: dict, cancelled: threading.Event, flush_interval: float,
                headers: dict[str, str]) -> Iterator[StreamDelta]:
        """``stream_chat``'s body: open the stream (with ``retrying``), then yield its values."""
        try:
            stream, delta, abort = retrying(self._open, messages, model, deadline, stats, extra, cancelled,
                                            headers)
        except RetryError as exc:  # pragma: no cover - reraise=True makes this unreachable
            raise mapped_error(exc.last_attempt.exception() or exc) from None
        except Exception as exc:
            if cancelled.is_set():
                return  # cancelled while connecting: the connection is already shut down
            if _timed_out(exc) and time.monotonic() >= deadline - 0.05:
                raise first_token_error(self.settings.llm_first_token_timeout) from None
            raise mapped_error(exc) from None
        try:
            while delta is not None:
                if delta:
                    yielded_at = time.monotonic()
                    yield delta
                    if flush_interval > 0:
                        rest = _next_tick(yielded_at, flush_interval) - time.monotonic()
                        if rest > 0 and cancelled.wait(rest):
                            return
                if cancelled.is_set():
                    return
                delta = stream.read()
        except LLMError:
            raise
        except Exception as exc:
            if cancelled.is_set():
                return  # the read failed because the cancel shut the connection down
            raise mapped_error(exc) from None
        finally:
            if abort is not None:
                abort.release()
            stream.close()
