"""The fake OpenAI-compatible model server that the tests and the benchmarks share.

It speaks the real wire protocol over real HTTP/1.1 on loopback, so the real
``openai`` SDK (which has its own HTTP stack) can be pointed at it with
``OPENAI_BASE_URL=http://127.0.0.1:<port>/v1``. Only the standard library is
used, so it also runs as a standalone process (``python -m chat_support.fake_llm``,
:class:`FakeLLMProcess`, or :mod:`chat_support.llama_standin` in place of llama.cpp).

Modes
-----
echo
    ``Reply(echo=True)`` (``--echo``): the answer is the last user message.
cut stream
    ``Reply(drop_after=N)``: the stream stops mid-answer (connection closed);
    ``framing="close"`` makes the body end at the close (HTTP/1.0 style), ``done=False``
    leaves out ``[DONE]``; :class:`CutPlan` (``--cut-plan``) plans it from the message
    (``[cut N]``, ``[hang N]``, ``[nodone N]``).
slow
    ``first_token_delay`` / ``token_delay`` (seconds; ``--token-delay``), paced by one
    scheduler thread; ``stall`` / ``stall_after`` hang.
recording
    every request is kept (:attr:`FakeLLM.requests`, with what was answered); with
    ``upstream=`` (``--upstream``) requests are forwarded to a real server and its answers
    recorded; :meth:`FakeLLM.recording` / ``save_recording`` (``--record FILE``).
replay
    :class:`Replay` (``--replay FILE``) answers from a recorded list, in order or by messages.
structured answers
    scripted replies per request: rules, ``enqueue``, :meth:`FakeLLM.answer_structured`
    (``--structured FILE``) for JSON compaction answers, or a callable of the request; a
    structured request without one gets a minimal instance of its JSON schema.
failures
    HTTP statuses (429 with ``Retry-After``), SSE error events, ``reject_json_schema``,
    ``crash="SIGILL"`` (the process kills itself), rules per path (e.g. ``/v1/models``).
llama.cpp
    ``GET /health``, ``POST /v1/completions``, ``require_model=False``, and with
    ``slot_dir=`` its one slot and ``POST /slots/<id>?action=save|restore|erase``.

Endpoints
---------
``POST /v1/chat/completions``
    ``stream: true``  -> ``text/event-stream``, chunked transfer encoding; one
    ``data: {chat.completion.chunk}\\n\\n`` event per token, a final chunk with
    ``finish_reason``, then (when ``stream_options.include_usage`` is true) a
    usage chunk with ``choices: []``, then ``data: [DONE]\\n\\n``.
    ``stream: false`` -> one ``chat.completion`` JSON object with ``usage``.
    ``response_format`` of type ``text``, ``json_object`` (with or without a
    llama.cpp-style ``schema``) and ``json_schema`` is accepted;
    ``FakeLLM(reject_json_schema=True)`` makes ``json_schema`` fail with HTTP 500
    the way llama-cpp-python's server does (or pass a status code, e.g. 400).
``GET /v1/models``, ``GET /v1/models/<id>``, ``GET /health``
``POST /v1/completions`` (one ``text_completion`` JSON; llama.cpp's start check)
``POST /slots/<id>?action=save|restore|erase`` (with ``slot_dir``)
``POST /_control/script``, ``GET /_control/requests``, ``POST /_control/reset``
    Control plane for a fake running in another process (see ``FakeLLM.apply_script``
    for the JSON shape). Control requests are not recorded.

Scripting
---------
Each chat request is answered by a :class:`Reply`. It is chosen from the rule
list (first matching rule, in insertion order; a rule with ``times=N`` is used N
times and then removed) or else the default. A rule or default may also be a
callable ``f(request_body: dict) -> Reply | str | dict`` (a ``str`` means
``Reply(text=...)``, a ``dict`` means ``Reply(json=...)``).

Units: every delay or duration is in seconds (float); token counts are ints;
``time`` / ``end_time`` of a record are ``time.time()`` wall-clock seconds.

Recording and client hang-ups
-----------------------------
Every ``/v1`` request becomes a :class:`RecordedRequest` (parsed body, headers,
path, time) *before* it is answered, and its outcome is filled in as the answer
goes out: ``tokens_sent`` and ``outcome`` (``"completed"``, ``"aborted"`` when the
client closed the connection early, ...). Streams watch their socket for the
client's FIN/RST while waiting between tokens, so ``stream.close()`` on the
client is noticed within milliseconds and no further token is written.

Load: tokens are paced by one scheduler thread (epoll + a deadline heap) rather
than a sleeping thread per stream; 300 concurrent streams x 100 tokens 10 ms
apart cost well under one core (about 0.7 CPU-seconds in total on 2 cores).

In-process use::

    with FakeLLM() as llm:                      # llm.url == "http://127.0.0.1:PORT/v1"
        llm.add_rule(Reply(json={"summary": "s"}), stream=False)
        llm.enqueue(Reply(status=429))          # next matching request only
        ...
        llm.last_request().messages             # what the model was sent

Standalone (benchmarks)::

    python -m chat_support.fake_llm --port 0 --tokens 100 --token-delay 0.01 --first-token-delay 0.05
    # prints "READY http://127.0.0.1:PORT/v1" on stdout and serves until killed

or :class:`FakeLLMProcess` which starts that and drives its control endpoints.
"""

from __future__ import annotations

import argparse
import heapq
import http.client
import json
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union
from urllib.parse import parse_qs, urlsplit

from chat_support import servers

__all__ = [
    "DEFAULT_TEXT",
    "CutPlan",
    "FakeLLM",
    "FakeLLMProcess",
    "RecordedRequest",
    "Replay",
    "Reply",
    "Rule",
    "answer_of",
    "plan_pieces",
    "split_tokens",
    "words",
]

DEFAULT_TEXT = "Hello from the fake model."
USAGE_AUTO = "auto"

_TOKEN_RE = re.compile(r"\s*\S+|\s+")


def split_tokens(text: str) -> list[str]:
    """Split ``text`` into whitespace-preserving word pieces.

    Leading whitespace is attached to the following word, like real BPE tokens:
    ``"Hello big world"`` -> ``["Hello", " big", " world"]``; ``"".join`` of the
    result is always ``text``.
    """
    return _TOKEN_RE.findall(text)


def words(n: int, word: str = "word") -> list[str]:
    """``n`` numbered token pieces: ``["word0", " word1", ..., " word{n-1}"]``."""
    return [f"{'' if i == 0 else ' '}{word}{i}" for i in range(n)]


# --------------------------------------------------------------------------- Reply


_monotonic = time.monotonic  # a field of RecordedRequest is named ``time``


@dataclass
class Reply:
    """How the fake answers one chat-completions request.

    Content (first one set wins): ``tokens`` (explicit list of pieces, streamed
    one per chunk) > ``json`` (any JSON value, serialised with ``json.dumps`` as
    the message content) > ``echo`` (the last user message's text) > ``text``
    (split with :func:`split_tokens`). With none of them set: a structured request
    (``response_format`` json_object/json_schema) gets a minimal JSON instance of
    its schema (``{}`` without a schema), any other request gets ``DEFAULT_TEXT``
    (unless ``tool_calls`` is set, then there is no content).

    ``tool_calls``: list of ``{"name": str, "arguments": dict | str, "id"?: str}``
    (or OpenAI-shaped ``{"id", "type": "function", "function": {...}}``). Streamed
    as ``delta.tool_calls`` chunks: one header chunk per call (index, id, type,
    name, ``arguments: ""``) then the arguments string in pieces;
    ``finish_reason`` becomes ``"tool_calls"``.

    Timing, all in seconds: ``delay`` before the status line and headers;
    ``first_token_delay`` from headers to the first token; ``token_delay`` between
    tokens. A non-streaming answer is sent whole after
    ``delay + first_token_delay + (n-1) * token_delay``.

    Framing (streams): ``framing="chunked"`` (HTTP/1.1 chunked transfer encoding, the default) or ``"close"``
    (no length and no chunks: the body ends when the server closes the connection, as with HTTP/1.0 and many
    proxies; the connection is closed after the answer). ``done=False`` leaves out the final ``data: [DONE]``
    (the finish chunk is still sent).

    Failures:
      * ``status`` >= 400: an OpenAI-style ``{"error": {message, type, param,
        code}}`` body (``error_message`` / ``error_type`` / ``error_code``
        override the defaults). 429 and 503 carry ``Retry-After: retry_after``
        (seconds; ``None`` omits it).
      * ``drop_after=N``: send N tokens (N may be 0), then close the connection
        without the terminating chunk or ``[DONE]``; the SDK raises
        ``APIConnectionError`` while iterating.
      * ``stall=True`` / ``stall_after=N``: send headers (and N tokens), then
        nothing until the client goes away, the server stops, or ``stall_max``
        seconds pass (``None``: the server's ``stall_max``); then close.
        Non-streaming: headers (with the final Content-Length) then nothing.
      * ``stream_error_after=N``: send N tokens, then an SSE
        ``data: {"error": {...}}`` event and end the stream (the SDK raises
        ``APIError``). With ``stream_error_status`` (an HTTP status, int) the event is
        ``{"error": {"message", "code": <status>}}``, as llama.cpp's server and the bundled
        model's slot proxy send it after they already answered 200.

    Events before the first token (streams): ``before_first`` is a list of ``[seconds, event]``
    pairs, each written that many seconds after the headers (keep them below
    ``first_token_delay``): ``event`` a dict is one ``data:`` event (e.g. the slot proxy's
    ``{"object": "x.wait", "reason": "another_turn"}`` or llama.cpp's
    ``{"prompt_progress": {"total", "cache", "processed", "time_ms"}}`` chunk, see
    :func:`progress_event`), a string starting with ``:`` an SSE comment (a keep-alive).
    ``wait_events(seconds, every)`` and ``progress_events(total, seconds, every)`` build such lists.
      * ``crash="SIGILL"`` (any signal name): the serving process kills itself with that signal at this
        request, before answering anything, as a model server whose build the CPU cannot run does. Only
        for a fake in a process of its own (:mod:`chat_support.llama_standin`).

    ``usage``: ``"auto"`` (rough count: prompt ~ chars/4 + 4 per message,
    completion = number of streamed pieces), ``None`` (no usage at all), a
    ``(prompt_tokens, completion_tokens)`` tuple, or a dict with those keys.

    ``finish_reason`` defaults to ``"stop"`` (``"tool_calls"`` with tool calls);
    ``model`` defaults to the request's model; ``headers`` are extra response
    headers.
    """

    text: Optional[str] = None
    tokens: Optional[list[str]] = None
    json: Any = None
    echo: bool = False
    tool_calls: Optional[list[dict]] = None
    first_token_delay: float = 0.0
    token_delay: float = 0.0
    delay: float = 0.0
    status: int = 200
    error_message: Optional[str] = None
    error_type: Optional[str] = None
    error_code: Optional[str] = None
    retry_after: Optional[float] = 1.0
    drop_after: Optional[int] = None
    stall: bool = False
    stall_after: Optional[int] = None
    stall_max: Optional[float] = None
    stream_error_after: Optional[int] = None
    stream_error_status: Optional[int] = None
    before_first: Optional[list] = None
    usage: Any = USAGE_AUTO
    finish_reason: Optional[str] = None
    model: Optional[str] = None
    headers: dict = field(default_factory=dict)
    framing: str = "chunked"
    done: bool = True
    crash: Optional[str] = None

    @classmethod
    def from_dict(cls, data: dict) -> "Reply":
        """Build from a JSON dict with the same field names; unknown keys raise ``ValueError``."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown Reply fields: {sorted(unknown)}")
        data = dict(data)
        if isinstance(data.get("usage"), list):
            data["usage"] = tuple(data["usage"])
        return cls(**data)

    def to_dict(self) -> dict:
        return asdict(self)


ReplySource = Union[Reply, Callable[[dict], Any]]


def _coerce_reply(value: Any) -> Reply:
    if isinstance(value, Reply):
        return value
    if isinstance(value, str):
        return Reply(text=value)
    if isinstance(value, (dict, list)):
        return Reply(json=value)
    raise TypeError(f"a reply callable must return Reply, str or dict, not {type(value).__name__}")


# --------------------------------------------------------------------------- rules


def _is_structured(body: dict) -> bool:
    rf = body.get("response_format")
    return isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema")


@dataclass
class Rule:
    """One entry of the rule list: ``reply`` answers requests matching every given criterion.

    ``path``: the request's path without the query (e.g. ``"/v1/models"``, ``"/v1/completions"``): such a
    rule answers any request to that path (any method) before its body is checked, so it can fail or crash
    the models endpoint or a malformed request too; a rule without ``path`` answers completion requests
    (``/v1/chat/completions``, ``/v1/completions``) that passed the checks.
    ``stream``: match ``body["stream"]`` truthiness; ``model``: exact model name;
    ``structured``: request has ``response_format`` json_object/json_schema (or
    not); ``when``: predicate ``f(body: dict) -> bool``; ``times``: use at most
    this many times, then the rule is removed (``None``: forever).
    """

    reply: ReplySource
    stream: Optional[bool] = None
    model: Optional[str] = None
    structured: Optional[bool] = None
    when: Optional[Callable[[dict], bool]] = None
    times: Optional[int] = None
    name: Optional[str] = None
    path: Optional[str] = None

    def matches(self, body: dict, path: Optional[str] = None) -> bool:
        if self.path != path:
            return False
        body = body if isinstance(body, dict) else {}
        if self.stream is not None and bool(body.get("stream")) != self.stream:
            return False
        if self.model is not None and body.get("model") != self.model:
            return False
        if self.structured is not None and _is_structured(body) != self.structured:
            return False
        if self.when is not None and not self.when(body):
            return False
        return True


# --------------------------------------------------------------------------- records


@dataclass
class RecordedRequest:
    """One request received under ``/v1`` (what the model was sent, and what happened).

    ``body`` is the parsed JSON body (``None`` for GET or unparsable bodies),
    ``headers`` a dict with lower-case names, ``time`` / ``end_time`` wall-clock
    seconds (``time.time()``) when the request was read / the response ended.

    Outcome (filled in by the server thread: ``status`` and ``outcome`` are set
    before the last bytes go out, so they are right once the client has seen the
    end of a completed/error answer; for aborts, drops and stalls call
    :meth:`wait` first): ``status`` (HTTP status sent), ``tokens_sent`` (content or
    tool-call pieces written to the socket), ``outcome`` one of
    ``"completed"``, ``"error"`` (status >= 400), ``"aborted"`` (the client
    closed the connection before the end, e.g. ``stream.close()`` or a client
    timeout), ``"dropped"`` (``drop_after``), ``"stall_expired"``,
    ``"server_stopped"``; ``rule`` is the matching rule's name (or its
    ``"rule#<n>"``) or ``"default"`` (``"upstream"`` when forwarded).

    ``answer``: the content text of the answer (what was scripted, or what the upstream server sent back in
    forwarding mode: the joined ``delta.content`` of a stream or ``message.content`` / ``text`` of a JSON
    answer), ``None`` for errors and non-chat requests; ``usage``: the answer's usage dict when it had one
    (forwarding mode). ``started`` / ``ended``: ``time.monotonic()`` seconds of ``time`` / ``end_time``, to
    compare with a caller's own monotonic clock.
    """

    method: str
    path: str
    headers: dict
    body: Any
    time: float
    end_time: Optional[float] = None
    status: Optional[int] = None
    tokens_sent: int = 0
    outcome: Optional[str] = None
    rule: Optional[str] = None
    answer: Optional[str] = None
    usage: Optional[dict] = None
    started: float = field(default_factory=_monotonic)
    ended: Optional[float] = None
    _done: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    # -- convenience views of the body
    @property
    def messages(self) -> list:
        return (self.body or {}).get("messages", []) if isinstance(self.body, dict) else []

    @property
    def model(self) -> Optional[str]:
        return self.body.get("model") if isinstance(self.body, dict) else None

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream")) if isinstance(self.body, dict) else False

    @property
    def response_format(self) -> Optional[dict]:
        return self.body.get("response_format") if isinstance(self.body, dict) else None

    @property
    def tools(self) -> Optional[list]:
        return self.body.get("tools") if isinstance(self.body, dict) else None

    @property
    def is_chat(self) -> bool:
        """A completion request: ``POST .../chat/completions`` (or llama.cpp's ``POST /v1/completions``)."""
        return self.method == "POST" and self.path.split("?")[0].rstrip("/").endswith("/completions")

    @property
    def kind(self) -> str:
        """``"stream"``, ``"structured"`` (non-streaming with json response_format),
        ``"plain"`` (other non-streaming chat) or ``"other"`` (not a chat request)."""
        if not self.is_chat:
            return "other"
        if self.stream:
            return "stream"
        if isinstance(self.body, dict) and _is_structured(self.body):
            return "structured"
        return "plain"

    @property
    def aborted(self) -> bool:
        return self.outcome == "aborted"

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float = 5.0) -> bool:
        """Block until the response has ended (any outcome); returns False on timeout (seconds)."""
        return self._done.wait(timeout)

    def _finish(self, outcome: str, status: Optional[int] = None) -> None:
        if self._done.is_set():
            return
        if status is not None:
            self.status = status
        self.outcome = outcome
        self.end_time, self.ended = time.time(), time.monotonic()
        self._done.set()

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "path": self.path,
            "headers": self.headers,
            "body": self.body,
            "time": self.time,
            "end_time": self.end_time,
            "status": self.status,
            "tokens_sent": self.tokens_sent,
            "outcome": self.outcome,
            "rule": self.rule,
            "kind": self.kind,
            "answer": self.answer,
            "usage": self.usage,
        }


# --------------------------------------------------------------------------- helpers


def _error_body(status: int, message: Optional[str], etype: Optional[str], code: Any) -> dict:
    defaults = {
        400: ("Invalid request.", "invalid_request_error", None),
        401: ("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
        403: ("Forbidden.", "invalid_request_error", None),
        404: ("Not found.", "invalid_request_error", "not_found"),
        422: ("Unprocessable request.", "invalid_request_error", None),
        429: ("Rate limit reached for requests. Please try again in 1s.", "requests", "rate_limit_exceeded"),
        500: ("The server had an error while processing your request. Sorry about that!", "server_error", None),
        502: ("Bad gateway.", "server_error", None),
        503: ("The engine is currently overloaded, please try again later.", "server_error", None),
    }
    d_msg, d_type, d_code = defaults.get(status, (f"HTTP {status}", "server_error" if status >= 500 else "invalid_request_error", None))
    return {
        "error": {
            "message": message if message is not None else d_msg,
            "type": etype if etype is not None else d_type,
            "param": None,
            "code": code if code is not None else d_code,
        }
    }


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _last_user_text(body: dict) -> str:
    for m in reversed(body.get("messages") or []):
        if isinstance(m, dict) and m.get("role") == "user":
            return _text_of(m.get("content"))
    return ""


def _estimate_prompt_tokens(body: dict) -> int:
    total = 0
    for m in body.get("messages") or []:
        if isinstance(m, dict):
            total += 4 + (len(_text_of(m.get("content"))) + 3) // 4
    return max(total, 1)


def _schema_of(response_format: dict) -> Optional[dict]:
    if response_format.get("type") == "json_schema":
        js = response_format.get("json_schema") or {}
        return js.get("schema") if isinstance(js, dict) else None
    return response_format.get("schema")


def _instance_of(schema: Any, root: Optional[dict] = None, depth: int = 0) -> Any:
    """A minimal JSON value valid against a (simple) JSON schema."""
    root = root if root is not None else schema
    if not isinstance(schema, dict) or depth > 20:
        return {}
    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return _instance_of(target, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return _instance_of(schema[key][0], root, depth + 1)
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "null")
    if t == "object" or (t is None and "properties" in schema):
        props = schema.get("properties") or {}
        return {k: _instance_of(v, root, depth + 1) for k, v in props.items()}
    if t == "array":
        n = int(schema.get("minItems", 0))
        return [_instance_of(schema.get("items", {}), root, depth + 1) for _ in range(n)]
    if t == "string":
        s = "fake"
        lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
        s = s.ljust(lo, "x")
        return s[: int(hi)] if hi is not None else s
    if t in ("integer", "number"):
        return schema.get("minimum", 0)
    if t == "boolean":
        return False
    if t == "null":
        return None
    return {}


def _normalise_tool_calls(calls: list[dict]) -> list[dict]:
    out = []
    for c in calls:
        fn: dict = c["function"] if isinstance(c.get("function"), dict) else c
        args = fn.get("arguments", {})
        if not isinstance(args, str):
            args = json.dumps(args)
        out.append(
            {
                "id": c.get("id") or f"call_{uuid.uuid4().hex[:20]}",
                "type": "function",
                "function": {"name": fn["name"], "arguments": args},
            }
        )
    return out


def _usage_dict(usage: Any, body: dict, completion_tokens: int) -> Optional[dict]:
    if usage is None:
        return None
    if usage == USAGE_AUTO:
        p, c = _estimate_prompt_tokens(body), completion_tokens
    elif isinstance(usage, (tuple, list)):
        p, c = int(usage[0]), int(usage[1])
    elif isinstance(usage, dict):
        p, c = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
        if "total_tokens" in usage:
            return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": int(usage["total_tokens"])}
    else:
        raise ValueError(f"bad usage: {usage!r}")
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def wait_events(seconds: float, every: float = 2.0, reason: str = "another_turn") -> list:
    """``Reply.before_first`` for a request that waits ``seconds`` behind another thread's: the slot proxy's
    ``x.wait`` event at once, then every ``every`` seconds while the wait lasts."""
    count = max(1, int(-(-seconds // every)))  # ceil
    return [[i * every, {"object": "x.wait", "reason": reason}] for i in range(count)]


def progress_event(total: int, processed: int, cache: int = 0) -> dict:
    """llama.cpp's prompt-progress chunk (``"return_progress": true``; its real shape: an empty assistant delta
    plus ``prompt_progress``, token counts, ``processed`` counting the cached tokens too)."""
    return {"choices": [{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}],
            "object": "chat.completion.chunk",
            "prompt_progress": {"total": total, "cache": cache, "processed": processed, "time_ms": 0}}


def progress_events(total: int, seconds: float, every: float = 0.5, cache: int = 0) -> list:
    """``Reply.before_first`` for reading ``total`` prompt tokens (``cache`` of them cached) evenly over
    ``seconds``, one progress chunk every ``every`` seconds (the first at once, at 0 read)."""
    steps = max(1, int(seconds / every))
    return [[i * every, progress_event(total, cache + (total - cache) * i // steps, cache)] for i in range(steps)]


def _sse(obj: Any) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


_LAST_CHUNK = b"0\r\n\r\n"
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "proxy-connection", "te",
        "trailer", "upgrade"}


def answer_of(raw: bytes) -> tuple[str, Optional[dict]]:
    """``(content text, usage or None)`` of a raw chat answer: the joined ``delta.content`` of an SSE stream
    (its last ``usage``), or the ``message.content`` (``text`` for ``/v1/completions``) of a JSON body."""
    text = raw.decode("utf-8", errors="replace")
    usage = None
    if not text.lstrip().startswith("data:"):
        try:
            body = json.loads(text)
        except ValueError:
            return "", None
        if not isinstance(body, dict):
            return "", None
        parts = [(c.get("message") or {}).get("content") or c.get("text") or "" for c in body.get("choices") or []]
        return "".join(parts), body.get("usage")
    parts = []
    for line in text.splitlines():
        data = line[5:].strip() if line.startswith("data:") else ""
        if data in ("", "[DONE]"):
            continue
        try:
            event = json.loads(data)
        except ValueError:
            continue
        usage = event.get("usage") or usage
        for choice in event.get("choices") or []:
            parts.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    return "".join(parts), usage
_POLL_MASK = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP | getattr(select, "POLLRDHUP", 0)
_POLL_MASK_NO_IN = select.POLLERR | select.POLLHUP | getattr(select, "POLLRDHUP", 0)


class _ClientGone(Exception):
    pass


class _ServerStopping(Exception):
    pass


# --------------------------------------------------------------------------- pacer


class _Job:
    """The timed part of one stream: ``datas[i]`` is written at ``start + i * token_delay`` (monotonic s)."""

    __slots__ = ("sock", "fd", "datas", "start", "token_delay", "rec", "final", "i", "pending", "done", "result")

    def __init__(self, sock: socket.socket, datas: list, start: float, token_delay: float,
                 rec: RecordedRequest, final: bool) -> None:
        self.sock, self.fd, self.datas = sock, sock.fileno(), datas
        self.start, self.token_delay, self.rec, self.final = start, token_delay, rec, final
        self.i = 0
        self.pending = b""
        self.done = threading.Event()
        self.result: Optional[str] = None  # "sent" | "aborted" | "server_stopped"


class _Pacer:
    """One thread that writes every stream's timed chunks.

    A heap of deadlines plus one epoll set watching each stream's socket for a client hang-up
    (EPOLLRDHUP/HUP/ERR): a client close is noticed within the same wake-up, and 300 streams
    cost one syscall per written chunk instead of a thread wake-up, a GIL hand-off and a poll each.
    Sends are non-blocking; a client that does not read keeps its remainder pending (retried
    every 2 ms) without holding up other streams. Linux only (``select.epoll``).
    """

    def __init__(self) -> None:
        self._heap: list = []
        self._seq = 0
        self._lock = threading.Lock()
        self._jobs: dict[int, _Job] = {}
        self._ep = select.epoll()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._ep.register(self._wake_r.fileno(), select.EPOLLIN)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="fake-llm-pacer", daemon=True)
        self._thread.start()

    def submit(self, job: _Job) -> None:
        with self._lock:
            if self._stopping:
                job.result = "server_stopped"
                job.done.set()
                return
            self._jobs[job.fd] = job
            self._ep.register(job.fd, select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR)
            self._push(job, job.start)
        self._wake()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
        self._wake()
        self._thread.join(timeout=5)
        for job in list(self._jobs.values()):
            self._end(job, "server_stopped")
        self._ep.close()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # buffer full: a wake-up is already pending
            pass

    def _push(self, job: _Job, deadline: float) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (deadline, self._seq, job))

    def _end(self, job: _Job, result: str) -> None:
        with self._lock:
            if self._jobs.get(job.fd) is job:
                del self._jobs[job.fd]
                try:
                    self._ep.unregister(job.fd)
                except (OSError, ValueError):
                    pass
        if job.result is None:
            job.result = result
            job.done.set()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stopping:
                    return
                timeout = max(self._heap[0][0] - time.monotonic(), 0.0) if self._heap else 1.0
            for fd, _ev in self._ep.poll(timeout):
                if fd == self._wake_r.fileno():
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except OSError:
                        pass
                    continue
                job = self._jobs.get(fd)
                if job is not None:
                    self._end(job, "aborted")
            now = time.monotonic()
            due = []
            with self._lock:
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap)[2])
            for job in due:
                if job.result is None:
                    self._step(job)

    def _step(self, job: _Job) -> None:
        data = job.pending or job.datas[job.i]
        last = job.i == len(job.datas) - 1
        if last and job.final and not job.pending:
            job.rec.outcome = "completed"  # visible before the client can see [DONE]
        try:
            sent = job.sock.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._end(job, "aborted")
            return
        if sent < len(data):
            job.pending = data[sent:]
            with self._lock:
                self._push(job, time.monotonic() + 0.002)
            return
        job.pending = b""
        job.i += 1
        job.rec.tokens_sent = job.i
        if job.i == len(job.datas):
            self._end(job, "sent")
        else:
            with self._lock:
                self._push(job, job.start + job.i * job.token_delay)


# --------------------------------------------------------------------------- HTTP handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeLLM/1.0"
    sys_version = ""
    server: "_Server"

    # -- connection lifecycle
    def setup(self) -> None:
        super().setup()
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        self._poll: Any = None
        self.server.fake._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.fake._track(self.connection, False)

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if self.server.fake.verbose:
            super().log_message(format, *args)

    # -- low-level I/O
    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(parts)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _peer_closed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True as soon as the client has closed its end."""
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.connection, _POLL_MASK)
        if not self._poll.poll(max(timeout, 0.0) * 1000.0):
            return False
        try:
            data = self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            return True
        if data == b"":
            return True
        # The client sent more bytes (pipelining): stop watching for input so we don't spin.
        self._poll.modify(self.connection, _POLL_MASK_NO_IN)
        return False

    def _sleep_until(self, deadline: float) -> None:
        """Sleep until ``deadline`` (time.monotonic seconds), noticing client close / server stop."""
        stopping = self.server.fake._stopping
        while True:
            if stopping.is_set():
                raise _ServerStopping()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if self._peer_closed(min(remaining, 0.25)):
                raise _ClientGone()

    def _write(self, data: bytes) -> None:
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError as exc:  # BrokenPipe, ConnectionReset
            raise _ClientGone() from exc

    def _send_headers(self, status: int, headers: dict) -> None:
        try:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, str(v))
            self.end_headers()
        except OSError as exc:
            raise _ClientGone() from exc

    def _send_json(self, status: int, obj: Any, extra: Optional[dict] = None) -> None:
        payload = json.dumps(obj, ensure_ascii=False).encode()
        headers = {"Content-Type": "application/json", "Content-Length": len(payload)}
        headers.update(extra or {})
        self._send_headers(status, headers)
        self._write(payload)

    def _hard_close(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # -- dispatch
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        fake = self.server.fake
        raw = self._read_body() if method in ("POST", "DELETE") else b""
        path = self.path.split("?")[0].rstrip("/")
        body: Any = None
        bad_json = False
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                bad_json = True
        if path.startswith("/_control"):
            self._control(method, path, body, bad_json)
            return

        rec = RecordedRequest(
            method=method,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body if not bad_json else raw.decode("utf-8", "replace"),
            time=time.time(),
        )
        fake._record(rec)
        try:
            self._serve_v1(method, path, body, bad_json, rec, raw)
        except _ClientGone:
            self.close_connection = True
            rec._finish("server_stopped" if fake._stopping.is_set() else "aborted")
        except _ServerStopping:
            self._hard_close()
            rec._finish("server_stopped")
        except Exception as exc:  # a bug in a reply callable, etc.: answer 500, keep serving
            traceback.print_exc()
            self.close_connection = True
            rec._finish("error", 500)
            try:
                self._send_json(500, _error_body(500, f"fake_llm internal error: {exc!r}", None, None))
            except _ClientGone:
                pass
        finally:
            rec._finish("completed")

    def _error(self, rec: RecordedRequest, status: int, message: Optional[str] = None, etype: Optional[str] = None,
               code: Any = None, extra: Optional[dict] = None) -> None:
        rec.status, rec.outcome = status, "error"  # visible before the client can see the answer
        self._send_json(status, _error_body(status, message, etype, code), extra)
        rec._finish("error", status)

    # -- /v1
    def _serve_v1(self, method: str, path: str, body: Any, bad_json: bool, rec: RecordedRequest,
                  raw: bytes = b"") -> None:
        fake = self.server.fake
        if fake.upstream:
            return self._forward(method, raw, rec)
        if fake.api_key is not None and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
            return self._error(rec, 401)
        chosen = fake._choose(body, path=path)
        if chosen is not None:  # a rule for this path answers before anything is checked
            reply, rec.rule = chosen
            if reply.crash:
                _crash(reply.crash)
            if reply.status >= 400 or method != "POST":
                return self._answer_status(rec, reply, {"object": "list", "data": []})
            return self._answer_chat(body if isinstance(body, dict) else {}, reply, rec)
        if method == "GET" and path == "/health":  # llama.cpp's server
            return self._ok_json(rec, {"status": "ok"})
        if method == "GET" and path == "/v1/models":
            return self._ok_json(rec, {"object": "list", "data": [fake._model_obj(m) for m in fake.models]})
        if method == "GET" and path.startswith("/v1/models/"):
            mid = path[len("/v1/models/"):]
            if mid in fake.models:
                return self._ok_json(rec, fake._model_obj(mid))
            return self._error(rec, 404, f"The model '{mid}' does not exist", code="model_not_found")
        if method == "POST" and path.startswith("/slots/") and fake.slot_dir is not None:
            return self._slot_action(path, body, rec)
        if not (method == "POST" and path in ("/v1/chat/completions", "/v1/completions")):
            return self._error(rec, 404, f"Unknown request URL: {method} {self.path}", code="unknown_url")
        if bad_json or not isinstance(body, dict):
            return self._error(rec, 400, "We could not parse the JSON body of your request.")
        problem = (_validate_chat(body, fake.require_model) if path == "/v1/chat/completions"
                   else _validate_text_completion(body, fake.require_model))
        if problem:
            return self._error(rec, 400, problem)
        rf = body.get("response_format")
        if fake.reject_json_schema and isinstance(rf, dict) and rf.get("type") == "json_schema":
            status = 500 if fake.reject_json_schema is True else int(fake.reject_json_schema)
            return self._error(
                rec, status,
                'response_format type must be one of "text" or "json_object", but got: json_schema',
                "server_error" if status >= 500 else "invalid_request_error",
            )
        reply, rec.rule = fake._choose(body)  # type: ignore[misc]
        if fake.slot_dir is not None and path == "/v1/chat/completions":
            # llama.cpp's one slot: it holds the last request's messages and its answer
            pieces = _content_pieces(reply, body)
            with fake._slot_lock:
                before = list(fake.slot)
                fake.slot = [_text_of(m.get("content")) for m in body["messages"]] + ["".join(pieces)]
            return self._answer_chat(body, reply, rec, pieces, {"slot_before": before})
        self._answer_chat(body, reply, rec)

    def _answer_status(self, rec: RecordedRequest, reply: Reply, ok_body: Any) -> None:
        """A path rule's answer to a request that is not a completion: its error, or ``ok_body`` with its status."""
        if reply.delay:
            self._sleep_until(time.monotonic() + reply.delay)
        if reply.status >= 400:
            return self._error(rec, reply.status, reply.error_message, reply.error_type, reply.error_code,
                               dict(reply.headers))
        rec.status, rec.outcome = reply.status, "completed"
        self._send_json(reply.status, reply.json if reply.json is not None else ok_body, dict(reply.headers))
        rec._finish("completed", reply.status)

    # -- llama.cpp's slots (``FakeLLM(slot_dir=...)``)
    def _slot_action(self, path: str, body: Any, rec: RecordedRequest) -> None:
        """``POST /slots/<id>?action=save|restore|erase`` with ``{"filename"}``: write the slot's texts as JSON
        into ``slot_dir/filename``, read them back (404 when the file is missing), or empty the slot."""
        fake = self.server.fake
        query = parse_qs(urlsplit(self.path).query)
        action = (query.get("action") or [""])[0]
        filename = (body or {}).get("filename", "") if isinstance(body, dict) else ""
        if action not in ("save", "restore", "erase") or (action != "erase" and (not filename or "/" in filename)):
            return self._error(rec, 400, f"bad slot action {action!r} or filename {filename!r}")
        target = Path(str(fake.slot_dir)) / filename
        with fake._slot_lock:
            if action == "save":
                target.write_text(json.dumps(fake.slot))
            elif action == "restore":
                if not target.is_file():
                    return self._error(rec, 404, "no file")
                fake.slot = json.loads(target.read_text())
            else:
                fake.slot = []
        slot_id = int(path.rsplit("/", 1)[1]) if path.rsplit("/", 1)[1].isdigit() else 0
        self._ok_json(rec, {"id_slot": slot_id, "filename": filename})

    # -- forwarding mode (``FakeLLM(upstream=...)``)
    def _forward(self, method: str, raw: bytes, rec: RecordedRequest) -> None:
        """Send the request to the upstream server and its answer back as it comes (chunked), recording the
        answer's status, content text and usage."""
        fake = self.server.fake
        up = urlsplit(fake.upstream or "")
        conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port or 80, timeout=fake.upstream_timeout)
        rec.rule = "upstream"
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            try:
                conn.request(method, self.path, body=raw or None, headers=headers)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException):
                return self._error(rec, 502, "The upstream model server is not reachable.")
            rec.status = resp.status
            out = {k: v for k, v in resp.getheaders() if k.lower() not in _HOP}
            out["Transfer-Encoding"] = "chunked"
            self._send_headers(resp.status, out)
            received = []
            try:
                while chunk := resp.read1(65536):
                    received.append(chunk)
                    self._write(_http_chunk(chunk))
            except (OSError, http.client.HTTPException):  # the upstream broke off: so does this answer
                self._hard_close()
                return rec._finish("dropped", resp.status)
            self._write(_LAST_CHUNK)
        finally:
            conn.close()
        if rec.is_chat and resp.status < 400:
            rec.answer, rec.usage = answer_of(b"".join(received))
        rec.tokens_sent = len(received)
        rec._finish("completed" if resp.status < 400 else "error", resp.status)

    def _ok_json(self, rec: RecordedRequest, obj: Any) -> None:
        rec.status, rec.outcome = 200, "completed"
        self._send_json(200, obj)
        rec._finish("completed", 200)

    # -- chat completions
    def _answer_chat(self, body: dict, reply: Reply, rec: RecordedRequest, pieces: Optional[list[str]] = None,
                     extra: Optional[dict] = None) -> None:
        """Answer a completion request with ``reply``; ``pieces``: its content (else from the reply), ``extra``:
        fields added to the JSON answer or to the stream's finish chunk (e.g. ``slot_before``)."""
        fake = self.server.fake
        if reply.crash:
            _crash(reply.crash)
        t0 = time.monotonic()
        if reply.delay:
            self._sleep_until(t0 + reply.delay)
            t0 = time.monotonic()
        if reply.status >= 400:
            extra = dict(reply.headers)
            if reply.status in (429, 503) and reply.retry_after is not None:
                ra = reply.retry_after
                extra.setdefault("Retry-After", str(int(ra)) if float(ra).is_integer() else str(ra))
                extra.setdefault("retry-after-ms", str(int(ra * 1000)))
            return self._error(rec, reply.status, reply.error_message, reply.error_type, reply.error_code, extra)

        model = reply.model or body.get("model") or "fake-model"
        pieces = _content_pieces(reply, body) if pieces is None else pieces
        tool_calls = _normalise_tool_calls(reply.tool_calls) if reply.tool_calls else []
        rec.answer = "".join(pieces)
        if rec.path.split("?")[0].rstrip("/") == "/v1/completions":
            return self._answer_text_completion(body, reply, rec, t0, model, pieces, finish_reason=reply.finish_reason)
        finish = reply.finish_reason or ("tool_calls" if tool_calls else "stop")
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        stall_at = reply.stall_after if reply.stall_after is not None else (0 if reply.stall else None)
        stall_max = reply.stall_max if reply.stall_max is not None else fake.stall_max

        if body.get("stream"):
            return self._stream(body, reply, rec, t0, model, pieces, tool_calls, finish, cid, created, stall_at,
                                stall_max, extra)

        n_pieces = len(pieces) + sum(1 + len(split_tokens(tc["function"]["arguments"])) for tc in tool_calls)
        message: dict = {"role": "assistant", "content": "".join(pieces) if (pieces or not tool_calls) else None, "refusal": None}
        if tool_calls:
            message["tool_calls"] = tool_calls
        obj: dict = {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        }
        usage = _usage_dict(reply.usage, body, n_pieces)
        if usage is not None:
            obj["usage"] = usage
        obj.update(extra or {})
        payload = json.dumps(obj, ensure_ascii=False).encode()
        headers = {"Content-Type": "application/json", "Content-Length": len(payload), "x-request-id": cid}
        headers.update(reply.headers)
        if stall_at is not None:
            self._send_headers(200, headers)
            rec.status = 200
            return self._stall(rec, stall_max)
        gen_time = reply.first_token_delay + max(n_pieces - 1, 0) * reply.token_delay
        if gen_time > 0:
            self._sleep_until(t0 + gen_time)
        if reply.drop_after is not None:
            rec.status, rec.outcome = 200, "dropped"
            self._send_headers(200, headers)
            self._hard_close()
            return rec._finish("dropped", 200)
        rec.status, rec.outcome, rec.tokens_sent = 200, "completed", n_pieces
        self._send_headers(200, headers)
        self._write(payload)
        rec._finish("completed", 200)

    def _answer_text_completion(self, body: dict, reply: Reply, rec: RecordedRequest, t0: float, model: str,
                                pieces: list[str], finish_reason: Optional[str]) -> None:
        """``POST /v1/completions`` (llama.cpp's start check asks for one token): one ``text_completion`` JSON."""
        gen_time = reply.first_token_delay + max(len(pieces) - 1, 0) * reply.token_delay
        if gen_time > 0:
            self._sleep_until(t0 + gen_time)
        obj: dict = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
                     "model": model, "choices": [{"index": 0, "text": "".join(pieces), "logprobs": None,
                                                  "finish_reason": finish_reason or "stop"}]}
        usage = _usage_dict(reply.usage, {"messages": [{"content": body.get("prompt") or ""}]}, len(pieces))
        if usage is not None:
            obj["usage"] = usage
        self._ok_json(rec, obj)

    def _stream(self, body: dict, reply: Reply, rec: RecordedRequest, t0: float, model: str, pieces: list[str],
                tool_calls: list[dict], finish: str, cid: str, created: int, stall_at: Optional[int],
                stall_max: float, extra: Optional[dict] = None) -> None:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk_json(delta: dict, finish_reason: Optional[str] = None) -> str:
            obj: dict = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "fp_fake",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
            }
            if include_usage:
                obj["usage"] = None
            return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))

        chunked = reply.framing != "close"
        frame = _http_chunk if chunked else (lambda data: data)

        def chunk(delta: dict, finish_reason: Optional[str] = None) -> bytes:
            return frame(_sse(chunk_json(delta, finish_reason)))

        # Pre-render every event so the per-token loop is just wait + write. Content chunks (the bulk)
        # come from a template: the same bytes as chunk({"content": p}), ~10x cheaper.
        role = chunk({"role": "assistant", "content": "" if pieces or not tool_calls else None, "refusal": None})
        pre, post = chunk_json({"content": "\0"}).split('"\\u0000"')
        events = [frame(f"data: {pre}{json.dumps(p, ensure_ascii=False)}{post}\n\n".encode()) for p in pieces]
        for i, tc in enumerate(tool_calls):
            events.append(chunk({"tool_calls": [{"index": i, "id": tc["id"], "type": "function",
                                                 "function": {"name": tc["function"]["name"], "arguments": ""}}]}))
            for part in split_tokens(tc["function"]["arguments"]):
                events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]}))
        tail = chunk({}, finish) if not extra else frame(_sse({**json.loads(chunk_json({}, finish)), **extra}))
        if include_usage:
            usage = _usage_dict(reply.usage, body, len(events))
            if usage is not None:
                tail += frame(_sse({"id": cid, "object": "chat.completion.chunk", "created": created,
                                          "model": model, "system_fingerprint": "fp_fake", "choices": [],
                                          "usage": usage}))
        tail += (frame(_sse("[DONE]")) if reply.done else b"") + (_LAST_CHUNK if chunked else b"")

        headers = {
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "x-request-id": cid,
        }
        if chunked:
            headers["Transfer-Encoding"] = "chunked"
        else:  # the body ends when the connection closes
            headers["Connection"] = "close"
            self.close_connection = True
        headers.update(reply.headers)
        self._send_headers(200, headers)
        rec.status = 200
        for at, event in reply.before_first or ():
            self._sleep_until(t0 + float(at))
            if isinstance(event, str):
                self._write(frame(event.encode() + b"\n\n"))
            else:
                self._write(frame(_sse({"id": cid, "created": created, "model": model, **event})))
        start = t0 + reply.first_token_delay
        n = len(events)
        # Where the scripted failure (if any) cuts the stream: the earliest of drop/stall/error, at most n.
        cuts = [(min(at, n), order, action) for order, (action, at) in enumerate(
            (("drop", reply.drop_after), ("stall", stall_at), ("error", reply.stream_error_after))) if at is not None]
        cut, _, action = min(cuts) if cuts else (n, 0, None)
        if n == 0 and action is None:
            self._sleep_until(start)
            rec.outcome = "completed"
            self._write(role + tail)
            return rec._finish("completed")
        datas = [role + events[0]] + events[1:cut] if cut else []
        if action is None:
            datas[-1] += tail
        pacer = self.server.fake._pacer
        if pacer is not None and datas:
            # One scheduler thread writes the timed chunks of every stream (cheap under load).
            job = _Job(self.connection, datas, start, reply.token_delay, rec, action is None)
            pacer.submit(job)
            while not job.done.wait(0.5):
                pass
            if job.result == "aborted":
                raise _ClientGone()
            if job.result == "server_stopped":
                raise _ServerStopping()
        else:
            for i, data in enumerate(datas):
                self._sleep_until(start + i * reply.token_delay)
                if action is None and i == n - 1:
                    rec.outcome = "completed"  # visible before the client can see [DONE]
                rec.tokens_sent = i + 1
                try:
                    self._write(data)
                except _ClientGone:
                    rec.tokens_sent = i
                    raise
        if action is None:
            rec._finish("completed")
        elif action == "drop":
            rec.outcome = "dropped"
            self._hard_close()
            rec._finish("dropped")
        elif action == "stall":
            self._stall(rec, stall_max)
        else:
            if reply.stream_error_status is not None:  # llama.cpp's and the slot proxy's shape
                err = {"error": {"message": reply.error_message or "The server had an error.",
                                 "code": reply.stream_error_status}}
            else:
                err = _error_body(500, reply.error_message or "The server had an error while processing your "
                                  "request.", reply.error_type, reply.error_code)
            rec.outcome = "error"
            self._write(frame(_sse(err)) + (_LAST_CHUNK if chunked else b""))
            rec._finish("error")

    def _stall(self, rec: RecordedRequest, stall_max: float) -> None:
        try:
            self._sleep_until(time.monotonic() + stall_max)
        finally:
            self.close_connection = True
        rec.outcome = "stall_expired"
        self._hard_close()
        rec._finish("stall_expired")

    # -- control plane
    def _control(self, method: str, path: str, body: Any, bad_json: bool) -> None:
        fake = self.server.fake
        try:
            if bad_json:
                raise ValueError("invalid JSON")
            if method == "GET" and path == "/_control/requests":
                self._send_json(200, [r.to_dict() for r in fake.requests])
            elif method == "POST" and path == "/_control/reset":
                fake.reset(script=(body or {}).get("script", True))
                self._send_json(200, {"ok": True})
            elif method == "POST" and path == "/_control/script":
                self._send_json(200, {"ok": True, "target": fake.apply_script(body or {})})
            else:
                self._send_json(404, {"error": {"message": f"unknown control path {path}"}})
        except (ValueError, TypeError, KeyError) as exc:
            self._send_json(400, {"error": {"message": str(exc)}})
        except _ClientGone:
            self.close_connection = True


def _validate_text_completion(body: dict, require_model: bool = True) -> Optional[str]:
    if require_model and not body.get("model"):
        return "you must provide a model parameter"
    if not isinstance(body.get("prompt"), (str, list)):
        return "Invalid 'prompt': must be a string or an array."
    return None


def _crash(name: str) -> None:
    """Kill this process with signal ``name`` (e.g. ``"SIGILL"``), delivered to the calling thread as a faulting
    instruction would be: it dies before writing anything more (``os.kill`` would let it run on)."""
    sig = getattr(signal, name)
    signal.pthread_kill(threading.get_ident(), sig)
    time.sleep(5)  # not reached when the signal's action is the default one
    raise RuntimeError(f"{name} did not end the process (its signal has a handler)")


def _validate_chat(body: dict, require_model: bool = True) -> Optional[str]:
    if require_model and not body.get("model"):
        return "you must provide a model parameter"
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return "Invalid 'messages': must be a non-empty array."
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool", "function"):
            return f"Invalid 'messages[{i}]': missing or invalid role."
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
            return "Invalid 'response_format.type': must be one of 'text', 'json_object', 'json_schema'."
        if rf["type"] == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict):
                return "Missing required parameter: 'response_format.json_schema'."
            if not isinstance(js.get("name"), str) or not js["name"]:
                return "Missing required parameter: 'response_format.json_schema.name'."
    return None


def _content_pieces(reply: Reply, body: dict) -> list[str]:
    if reply.tokens is not None:
        return [str(t) for t in reply.tokens]
    if reply.json is not None:
        return split_tokens(json.dumps(reply.json, ensure_ascii=False))
    if reply.echo:
        return split_tokens(_last_user_text(body))
    if reply.text is not None:
        return split_tokens(reply.text)
    if reply.tool_calls:
        return []
    if _is_structured(body):
        return split_tokens(json.dumps(_instance_of(_schema_of(body["response_format"]) or {"type": "object"})))
    return split_tokens(DEFAULT_TEXT)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self, addr: tuple, fake: "FakeLLM") -> None:
        self.fake = fake
        super().__init__(addr, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if self.fake.verbose:
            super().handle_error(request, client_address)


# --------------------------------------------------------------------------- FakeLLM


class FakeLLM:
    """An in-process fake OpenAI-compatible server (see the module docstring).

    ``FakeLLM(default=Reply(), *, rules=(), host="127.0.0.1", port=0, models=("fake-chat",
    "fake-compact"), reject_json_schema=False, api_key=None, stall_max=30.0, verbose=False, pacer=True)``

    * ``default``: a :class:`Reply` or ``f(body) -> Reply | str | dict``, used when no rule matches.
    * ``rules``: initial :class:`Rule` list; ``reset()`` returns to ``default`` and these rules.
    * ``port=0`` picks a free port; ``url`` is ``"http://127.0.0.1:PORT/v1"`` (the SDK's ``base_url``).
    * ``reject_json_schema``: ``True`` -> ``response_format.type == "json_schema"`` gets HTTP 500
      (llama-cpp-python style); an int picks the status (e.g. 400). ``json_object`` still works.
    * ``api_key``: when set, requests without ``Authorization: Bearer <api_key>`` get 401.
    * ``stall_max``: seconds a stalled response waits before the server closes it.
    * ``require_model``: False accepts completion requests without ``model``, as llama.cpp's server does.
    * ``slot_dir``: a folder: the server keeps llama.cpp's one slot (the texts of the last chat request's
      messages and its answer; each chat answer carries ``slot_before``, what the slot held when the request
      came) and serves ``POST /slots/<id>?action=save|restore|erase`` with ``{"filename"}`` into that folder,
      as llama.cpp does with ``--slot-save-path``.
    * ``upstream``: ``http://HOST:PORT`` of a real server: every request (but ``/_control``) is forwarded there
      and its answer streamed back as it comes, and recorded (forwarding mode: the rules are not used). May be
      changed while serving.
    * ``pacer``: True (default, Linux): one scheduler thread writes the timed tokens of all streams
      (cheap with hundreds of concurrent streams); False, or without ``select.epoll``: each handler
      thread sleeps per token itself. Behaviour is the same.

    ``start()`` / ``stop()`` or ``with FakeLLM() as llm``. Thread-safe.
    """

    def __init__(
        self,
        default: ReplySource | None = None,
        *,
        rules: tuple | list = (),
        host: str = "127.0.0.1",
        port: int = 0,
        models: tuple | list = ("fake-chat", "fake-compact"),
        reject_json_schema: Union[bool, int] = False,
        api_key: Optional[str] = None,
        stall_max: float = 30.0,
        verbose: bool = False,
        pacer: bool = True,
        require_model: bool = True,
        slot_dir: Union[str, Path, None] = None,
        upstream: Optional[str] = None,
        upstream_timeout: float = 900.0,
    ) -> None:
        self._initial_default: ReplySource = default if default is not None else Reply()
        self._initial_rules = list(rules)
        self.default: ReplySource = self._initial_default
        self.rules: list[Rule] = list(self._initial_rules)
        self.host, self.port = host, port
        self.models = list(models)
        self.reject_json_schema = reject_json_schema
        self.api_key = api_key
        self.stall_max = stall_max
        self.verbose = verbose
        self.require_model = require_model
        self.slot_dir = Path(slot_dir) if slot_dir is not None else None
        self.slot: list[str] = []
        self._slot_lock = threading.Lock()
        self.upstream = upstream.rstrip("/") if upstream else None
        self.upstream_timeout = upstream_timeout
        self.use_pacer = pacer and hasattr(select, "epoll")
        self._pacer: Optional[_Pacer] = None
        self._lock = threading.RLock()
        self._log: list[RecordedRequest] = []
        self._conns: set = set()
        self._stopping = threading.Event()
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self._new_request = threading.Condition(self._lock)

    # -- lifecycle
    @property
    def base_url(self) -> str:
        """``http://HOST:PORT`` (no ``/v1``), for the control endpoints."""
        if self._server is None:
            raise RuntimeError("FakeLLM is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """``http://HOST:PORT/v1``: the ``base_url`` / ``OPENAI_BASE_URL`` for the SDK."""
        return self.base_url + "/v1"

    @property
    def address(self) -> tuple[str, int]:
        """``(HOST, PORT)`` it listens on."""
        if self._server is None:
            raise RuntimeError("FakeLLM is not started")
        return self.host, self.port

    def start(self) -> "FakeLLM":
        if self._server is not None:
            return self
        self._stopping.clear()
        self._pacer = _Pacer() if self.use_pacer else None
        self._server = _Server((self.host, self.port), self)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"fake-llm-{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: in-flight streams/stalls end (outcome ``server_stopped``), sockets close."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        if self._pacer is not None:
            self._pacer.stop()
        server.shutdown()
        server.server_close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "FakeLLM":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- scripting
    def add_rule(
        self,
        reply: ReplySource,
        *,
        stream: Optional[bool] = None,
        model: Optional[str] = None,
        structured: Optional[bool] = None,
        when: Optional[Callable[[dict], bool]] = None,
        times: Optional[int] = None,
        name: Optional[str] = None,
        path: Optional[str] = None,
    ) -> Rule:
        """Append a rule (checked in insertion order, first match wins). See :class:`Rule`."""
        rule = Rule(reply, stream=stream, model=model, structured=structured, when=when, times=times, name=name,
                    path=path)
        with self._lock:
            self.rules.append(rule)
        return rule

    def enqueue(self, *replies: ReplySource, **match: Any) -> None:
        """Queue one-shot replies: the next matching requests get them in order (``times=1`` rules).

        ``match`` takes the criteria of :meth:`add_rule` (``stream``, ``model``, ``structured``, ``when``, ``path``).
        """
        for r in replies:
            self.add_rule(r, times=1, **match)

    def answer_structured(self, *answers: Any) -> None:
        """Structured answers, scripted per request: the next structured requests (``response_format``
        json_object/json_schema, e.g. compaction calls) get ``answers`` in order, each a JSON value sent as the
        message content (or a :class:`Reply`); other requests are not affected."""
        self.enqueue(*[a if isinstance(a, Reply) else Reply(json=a) for a in answers], structured=True)

    def clear_rules(self) -> None:
        with self._lock:
            self.rules.clear()

    def apply_script(self, script: dict) -> str:
        """Apply a control-plane script (the JSON of ``POST /_control/script``); returns ``"default"`` or ``"rule"``.

        Shape: Reply fields at top level (e.g. ``{"text": "hi", "token_delay": 0.01}``), plus optional
        ``"match": {"stream": bool, "model": str, "structured": bool, "contains": str}`` (``contains``:
        substring of the last user message), ``"times": int``, ``"name": str``. Without ``match`` or
        ``times`` it replaces the default; with them it appends a rule. ``{"clear_rules": true}`` clears
        the rules first.
        """
        script = dict(script)
        if script.pop("clear_rules", False):
            self.clear_rules()
        match = script.pop("match", None)
        times = script.pop("times", None)
        name = script.pop("name", None)
        if not script and match is None and times is None:
            return "none"
        reply = Reply.from_dict(script)
        if match is None and times is None:
            with self._lock:
                self.default = reply
            return "default"
        match = dict(match or {})
        contains = match.pop("contains", None)
        unknown = set(match) - {"stream", "model", "structured", "path"}
        if unknown:
            raise ValueError(f"unknown match keys: {sorted(unknown)}")
        when = (lambda b, s=contains: s in _last_user_text(b)) if contains is not None else None
        self.add_rule(reply, when=when, times=times, name=name, **match)
        return "rule"

    def _choose(self, body: Any, path: Optional[str] = None) -> Optional[tuple[Reply, str]]:
        """The reply for a request and its label. ``path`` set: only rules for that path are checked, and None
        means none matched; else the rules without a path, then the default."""
        with self._lock:
            source, label = self.default, "default"
            if path is not None and not any(rule.path == path for rule in self.rules):
                return None
            for i, rule in enumerate(self.rules):
                if rule.matches(body, path):
                    source, label = rule.reply, rule.name or f"rule#{i}"
                    if rule.times is not None:
                        rule.times -= 1
                        if rule.times <= 0:
                            self.rules.remove(rule)
                    break
            else:
                if path is not None:
                    return None
        if not isinstance(source, Reply) and callable(source):
            return _coerce_reply(source(body)), label
        return _coerce_reply(source), label

    # -- request log
    def _record(self, rec: RecordedRequest) -> None:
        with self._new_request:
            self._log.append(rec)
            self._new_request.notify_all()

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._conns.add if add else self._conns.discard)(conn)

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every recorded ``/v1`` request, oldest first (a copy)."""
        with self._lock:
            return list(self._log)

    def chat_requests(self, kind: Union[str, Callable[[RecordedRequest], bool], None] = None) -> list[RecordedRequest]:
        """Chat-completion requests, oldest first, optionally filtered.

        ``kind``: ``"stream"``, ``"structured"`` (non-streaming with json response_format), ``"plain"``
        (other non-streaming), ``"nonstream"`` (structured + plain), or a predicate on the record.
        """
        return self._filter([r for r in self.requests if r.is_chat], kind)

    def last_request(self, kind: Union[str, Callable[[RecordedRequest], bool], None] = None) -> RecordedRequest:
        """The latest chat-completion request (optionally of ``kind``); ``LookupError`` if none."""
        reqs = self.chat_requests(kind)
        if not reqs:
            raise LookupError(f"no chat request recorded (kind={kind!r})")
        return reqs[-1]

    def wait_for_requests(self, n: int, kind: Union[str, Callable, None] = None, timeout: float = 5.0) -> list[RecordedRequest]:
        """Block until at least ``n`` chat requests of ``kind`` arrived (``timeout`` seconds); returns them.

        Raises ``TimeoutError`` with what did arrive.
        """
        deadline = time.monotonic() + timeout
        with self._new_request:
            while True:
                reqs = [r for r in self._log if r.is_chat]
                got = self._filter(reqs, kind)
                if len(got) >= n:
                    return got
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"expected {n} chat requests of kind {kind!r}, got {len(got)}")
                self._new_request.wait(remaining)

    def _filter(self, reqs: list[RecordedRequest], kind: Any) -> list[RecordedRequest]:
        if kind is None:
            return reqs
        if callable(kind):
            return [r for r in reqs if kind(r)]
        if kind == "nonstream":
            return [r for r in reqs if r.kind in ("structured", "plain")]
        if kind not in ("stream", "structured", "plain"):
            raise ValueError(f"unknown kind {kind!r}")
        return [r for r in reqs if r.kind == kind]

    def recording(self) -> list[dict]:
        """The chat exchanges so far, oldest first, as :class:`Replay` takes them: ``{"request": body,
        "status": int, "answer": str | None}`` for each finished completion request."""
        return [{"request": r.body, "status": r.status, "answer": r.answer}
                for r in self.chat_requests() if r.finished]

    def save_recording(self, path: Union[str, Path]) -> int:
        """Write :meth:`recording` to ``path`` as JSON; returns how many exchanges."""
        exchanges = self.recording()
        Path(path).write_text(json.dumps(exchanges, ensure_ascii=False, indent=1))
        return len(exchanges)

    def clear_requests(self) -> None:
        with self._lock:
            self._log.clear()

    def reset(self, script: bool = True) -> None:
        """Clear the request log and (unless ``script=False``) restore the constructor's default and rules."""
        with self._lock:
            self._log.clear()
            if script:
                self.default = self._initial_default
                self.rules = list(self._initial_rules)

    def _model_obj(self, mid: str) -> dict:
        return {"id": mid, "object": "model", "created": 1700000000, "owned_by": "fake-llm"}


# --------------------------------------------------------------------------- modes


PLAN = re.compile(r"\[(cut|hang|nodone) (\d+)\]")


def plan_pieces(count: int) -> list[str]:
    """The cut plan's answer: ``"Echo:"``, ``" t1"``, ``" t2"``, ... (``count`` pieces in all)."""
    return ["Echo:"] + [f" t{n}" for n in range(1, count)]


class CutPlan:
    """Cut streams, planned by the request: a reply callable whose streams end the way the last user message asks.

    The answer is :func:`plan_pieces` (``tokens`` of them, ``token_delay`` seconds apart) with ``framing``
    (default ``"close"``: the body ends when the connection closes, as with HTTP/1.0 and many proxies):

    - ``[cut N]``: after N pieces the connection is closed: no ``finish_reason``, no ``data: [DONE]``;
    - ``[hang N]``: after N pieces nothing more is sent until the client or the server goes away (or
      ``stall_max`` seconds pass);
    - ``[nodone N]``: N pieces and a ``finish_reason`` of ``stop``, then the end without ``data: [DONE]``;
    - otherwise: every piece, a ``finish_reason`` of ``stop``, then ``data: [DONE]``.
    """

    def __init__(self, tokens: int = 40, token_delay: float = 0.01, framing: str = "close") -> None:
        self.tokens, self.token_delay, self.framing = tokens, token_delay, framing

    def __call__(self, body: dict) -> Reply:
        pieces = plan_pieces(self.tokens)
        found = PLAN.search(_last_user_text(body))
        timing: dict[str, Any] = {"token_delay": self.token_delay, "framing": self.framing, "usage": None}
        if found is None:
            return Reply(tokens=pieces, **timing)
        action, at = found.group(1), int(found.group(2))
        if action == "cut":
            return Reply(tokens=pieces, drop_after=at, **timing)
        if action == "hang":
            return Reply(tokens=pieces, stall_after=at, **timing)
        return Reply(tokens=pieces[:at], done=False, **timing)


class Replay:
    """Answers from a recorded list (:meth:`FakeLLM.recording`, or a JSON file of it): a reply callable.

    ``exchanges``: ``[{"request": body, "answer": str, "status": int}]``. ``match="order"``: the n-th request
    gets the n-th answer; ``match="messages"``: the first unused exchange whose request had the same
    ``messages``. A recorded status >= 400 is answered with that status. A request without a recorded answer
    gets HTTP 500 naming why (``missed`` counts them). Thread-safe.
    """

    def __init__(self, exchanges: Iterable[dict], match: str = "order") -> None:
        if match not in ("order", "messages"):
            raise ValueError(f"unknown match {match!r}")
        self.exchanges = [e for e in exchanges if isinstance(e.get("request"), dict) or match == "order"]
        self.match = match
        self.used: list[bool] = [False] * len(self.exchanges)
        self.missed = 0
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Union[str, Path], match: str = "order") -> "Replay":
        """A replay of the JSON list saved by :meth:`FakeLLM.save_recording`."""
        return cls(json.loads(Path(path).read_text()), match)

    def __call__(self, body: dict) -> Reply:
        with self._lock:
            for i, exchange in enumerate(self.exchanges):
                if self.used[i]:
                    continue
                if self.match == "messages" and exchange["request"].get("messages") != body.get("messages"):
                    continue
                self.used[i] = True
                break
            else:
                self.missed += 1
                why = "no recorded answer left" if self.match == "order" else "no recorded answer for these messages"
                return Reply(status=500, error_message=f"replay: {why} ({len(self.exchanges)} recorded)")
        status = int(exchange.get("status") or 200)
        if status >= 400:
            return Reply(status=status)
        return Reply(text=exchange.get("answer") or "")


# --------------------------------------------------------------------------- subprocess helper


class FakeLLMProcess:
    """Runs ``python -m chat_support.fake_llm`` as a child process and drives its control endpoints.

    ``FakeLLMProcess(tokens=100, token_delay=0.01, first_token_delay=0.05, extra_args=(), startup_timeout=10.0,
    stderr=None)``: ``extra_args`` are more of the command line's options (e.g. ``["--cut-plan"]``), ``stderr`` a
    file for the child's stderr (default: inherited).
    ``start()`` waits for the ``READY <url>`` line; ``url`` is then ``http://127.0.0.1:PORT/v1``.
    ``script(**reply_fields_and_match)`` -> ``POST /_control/script``; ``requests()`` -> list of dicts
    (``RecordedRequest.to_dict()``); ``reset(script=True)``; ``stop()`` terminates the child (by pid).
    """

    def __init__(self, tokens: int = 100, token_delay: float = 0.0, first_token_delay: float = 0.0,
                 extra_args: tuple | list = (), startup_timeout: float = 10.0, stderr: Any = None) -> None:
        self.args = [sys.executable, "-m", "chat_support.fake_llm", "--port", "0", "--tokens", str(tokens),
                     "--token-delay", str(token_delay), "--first-token-delay", str(first_token_delay), *extra_args]
        self.startup_timeout = startup_timeout
        self.stderr = stderr
        self.proc: Optional[subprocess.Popen] = None
        self.url = ""

    @property
    def base_url(self) -> str:
        return self.url[: -len("/v1")]

    def start(self) -> "FakeLLMProcess":
        # stderr is inherited or a file (never a pipe nobody drains, which could block the child).
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(self.startup_timeout)
        if not line or not line[0].startswith("READY "):
            self.stop()
            raise RuntimeError(f"fake_llm did not start: {line!r}")
        self.url = line[0].split()[1]
        return self

    def stop(self) -> None:
        if self.proc is not None:
            servers.stop(self.proc, timeout=5)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> "FakeLLMProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        data = json.dumps(payload).encode() if payload is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def script(self, **script: Any) -> Any:
        return self._call("POST", "/_control/script", script)

    def requests(self) -> list[dict]:
        return self._call("GET", "/_control/requests")

    def reset(self, script: bool = True) -> Any:
        return self._call("POST", "/_control/reset", {"script": script})


# --------------------------------------------------------------------------- CLI


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chat_support.fake_llm",
                                description="Fake OpenAI-compatible LLM server.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = pick a free port")
    p.add_argument("--tokens", type=int, default=20, help="tokens in the default streamed answer")
    p.add_argument("--text", default=None, help="default answer text (overrides --tokens)")
    p.add_argument("--echo", action="store_true", help="answer with the last user message (echo mode)")
    p.add_argument("--cut-plan", action="store_true",
                   help="answer by the last user message's [cut N] / [hang N] / [nodone N] (CutPlan, --tokens pieces)")
    p.add_argument("--token-delay", type=float, default=0.0, help="seconds between tokens (slow mode)")
    p.add_argument("--first-token-delay", type=float, default=0.0, help="seconds before the first token")
    p.add_argument("--structured", type=Path, default=None, metavar="FILE",
                   help="JSON list of answers given in order to structured requests (then a schema instance)")
    p.add_argument("--replay", type=Path, default=None, metavar="FILE", help="answer from a saved recording")
    p.add_argument("--replay-match", choices=("order", "messages"), default="order")
    p.add_argument("--record", type=Path, default=None, metavar="FILE",
                   help="write the chat exchanges (FakeLLM.recording) to FILE when stopped")
    p.add_argument("--upstream", default=None, metavar="URL", help="forward to this server and record (http://HOST:PORT)")
    p.add_argument("--models", default="fake-chat,fake-compact", help="comma-separated model ids of /v1/models")
    p.add_argument("--no-model-required", action="store_true", help="accept requests without a model (llama.cpp)")
    p.add_argument("--slot-dir", type=Path, default=None, help="keep llama.cpp's slot, slot files in this folder")
    p.add_argument("--reject-json-schema", nargs="?", const=500, type=int, default=0, metavar="STATUS",
                   help="answer response_format json_schema with this HTTP status (default 500)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--stall-max", type=float, default=30.0)
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args(argv)

    timing = {"token_delay": a.token_delay, "first_token_delay": a.first_token_delay}
    default: ReplySource
    if a.replay is not None:
        default = Replay.load(a.replay, a.replay_match)
    elif a.cut_plan:
        default = CutPlan(a.tokens, a.token_delay)
    elif a.echo:
        default = Reply(echo=True, **timing)
    elif a.text is not None:
        default = Reply(text=a.text, **timing)
    else:
        default = Reply(tokens=words(a.tokens), **timing)
    rules = []
    if a.structured is not None:
        rules += [Rule(Reply(json=answer, **timing), structured=True, times=1, name=f"structured#{i}")
                  for i, answer in enumerate(json.loads(a.structured.read_text()))]
    if a.replay is None:  # structured (compaction-style) requests get a JSON instance of their schema by default
        rules.append(Rule(Reply(first_token_delay=a.first_token_delay), structured=True, name="structured-default"))
    llm = FakeLLM(default, rules=rules, host=a.host, port=a.port, models=[m for m in a.models.split(",") if m],
                  reject_json_schema=a.reject_json_schema or False, api_key=a.api_key, stall_max=a.stall_max,
                  verbose=a.verbose, require_model=not a.no_model_required, slot_dir=a.slot_dir, upstream=a.upstream)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    llm.start()
    print(f"READY {llm.url}", flush=True)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        llm.stop()
        if a.record is not None:
            llm.save_recording(a.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
