"""Streaming a model answer to the person, and plain chat built on it.

``stream_reply(io, messages, **extra)`` is the one delta-streaming loop of the runtime: the
streamed answer's text goes to the person through ``io.delta`` as it arrives, one frame for
whatever arrived since the last one (the first token at once, then at most one frame per
``STREAM_FLUSH_INTERVAL_SECONDS``; docs/benchmarks.md: Performance), without the tags that frame memory in a prompt
(``TagStrip``), and the pieces of tool calls (when ``tools`` are offered) are put together.  Plain chat, chat with
tools and the task list's final answer all stream through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.memory.context import PROMPT_MARKUP
from app.memory.status import TurnStatus
from app.runtime.producer import ProducerResult, TurnIO


@dataclass
class ToolCall:
    """A tool call the model made: its id, the tool's name and the arguments' JSON text."""

    id: str
    name: str = ""
    arguments: str = ""


@dataclass
class StreamedReply:
    """One streamed answer.

    Attributes:
        text: the answer text this call streamed (without a paragraph break put before it).
        tool_calls: the tool calls, by the provider's index.
        cancelled: True when the turn stopped streaming (cancel, closed socket) before the end.
    """

    text: str = ""
    tool_calls: dict[int, ToolCall] = field(default_factory=dict)
    cancelled: bool = False

    def add_tool_call_part(self, part: dict) -> None:
        """Merge one streamed ``delta.tool_calls[i]`` part (the provider's JSON; id, name and arguments arrive in parts)."""
        if not isinstance(part, dict):
            return
        index = part.get("index")
        if not isinstance(index, int):
            index = len(self.tool_calls)
        call = self.tool_calls.get(index)
        if call is None:
            call = self.tool_calls[index] = ToolCall(part.get("id") or f"call_{len(self.tool_calls) + 1}")
        elif part.get("id") and not call.id:
            call.id = part["id"]
        function = part.get("function")
        if isinstance(function, dict):
            if isinstance(function.get("name"), str):
                call.name += function["name"]
            if isinstance(function.get("arguments"), str):
                call.arguments += function["arguments"]


class TagStrip:
    """Takes every mark a prompt frames memory with (``app.memory.context.PROMPT_MARKUP``: the record's and the
    recalled excerpts' tags, the `` […]`` of a shortened answer) out of streamed text, across piece boundaries.
    The bundled 0.5B model sometimes opens or ends an answer with a made-up ``<recalled>…</recalled>`` line, which a
    person would read as a quotation of memory, or ends it with `` […]``, read as an answer cut short
    (docs/bundled-model.md: The bundled model); the words between stay, as the model's.

    ``feed(piece)`` returns the text that can be shown now: a piece that ends with what could be the start of one
    holds that part back (at most 10 characters) until the next piece tells; ``flush()`` returns what is still
    held at the end of the stream.
    """

    def __init__(self) -> None:
        self.held = ""

    def feed(self, piece: str) -> str:
        text = self.held + piece
        for tag in PROMPT_MARKUP:
            text = text.replace(tag, "")
        keep = max((n for tag in PROMPT_MARKUP for n in range(1, len(tag)) if text.endswith(tag[:n])), default=0)
        text, self.held = text[:len(text) - keep], text[len(text) - keep:]
        return text

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held


def stream_reply(io: TurnIO, messages: list[dict], *, new_paragraph: bool = False, deadline: float | None = None,
                 **extra: Any) -> StreamedReply:
    """Stream the model's answer to ``messages`` through ``io.delta``.

    Args:
        io: the turn.
        messages: the prompt, ``[{"role", "content", ...}]``.
        new_paragraph: when text was already streamed in this turn (and does not end a line),
            send a blank line before this answer's first text.
        deadline: ``time.monotonic()`` seconds for this call (default ``io.deadline``).
        extra: further chat-completion arguments (``tools``, ``tool_choice``).

    Raises:
        LLMError: the provider failed or timed out.
    """
    reply = StreamedReply()
    pieces: list[str] = []
    separate = new_paragraph and bool(io.streamed_text)
    strip = TagStrip()

    def send(piece: str) -> bool:
        nonlocal separate
        text = piece
        if separate and not io.streamed_text.endswith("\n"):
            text = "\n\n" + text
        separate = False
        if not io.delta(text):
            return False
        pieces.append(piece)
        return True

    for delta in io.services.llm.stream_chat(messages, cancelled=io.cancelled,
                                             deadline=io.deadline if deadline is None else deadline,
                                             stats=io.stats, flush_interval=io.services.settings.stream_flush_interval,
                                             thread_id=io.thread_id, **extra):
        shown = strip.feed(delta.text) if delta.text else ""
        if shown and not send(shown):
            reply.text, reply.cancelled = "".join(pieces), True
            return reply
        for part in delta.tool_calls:
            reply.add_tool_call_part(part)
    rest = strip.flush()
    if rest and not send(rest):
        reply.text, reply.cancelled = "".join(pieces), True
        return reply
    reply.text = "".join(pieces)
    reply.cancelled = io.cancelled.is_set()
    return reply


class ChatProducer:
    """Plain chat: stream the model's answer to the assembled prompt."""

    source = "chat"

    def run(self, io: TurnIO) -> ProducerResult:
        """Stream deltas; the final text is what was streamed (``completed``, or ``cancelled``)."""
        reply = stream_reply(io, io.context.to_openai())
        status = TurnStatus.CANCELLED if reply.cancelled else TurnStatus.COMPLETED
        return ProducerResult(status, io.streamed_text, self.source)
