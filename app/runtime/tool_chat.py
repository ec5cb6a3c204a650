"""Chat with tools: the model may call the built-in tools before it answers.

Loop (at most ``MAX_TOOL_ROUNDS`` rounds of tool calls, then one answer without tools)::

    stream the answer to the prompt with ``tools``
      -> text deltas go to the person as they come
      -> tool calls: a ``tool`` frame ``started`` (name, arguments), run the tool, a ``tool`` frame
         ``finished`` (result); the assistant's tool-call message and the tool results are
         appended to this turn's prompt only; ask again
      -> no tool call: the answer is complete

What the person was told (every streamed delta) is the final text; memory keeps it with
source ``tool`` (``mcp-resource`` when a resource was read; ``chat`` when no tool was
called).  Tool arguments and results exist in frames and in this turn's prompt, never in
memory.  A provider that answers the first request with a refusal naming tools gets plain
chat, and the refusal is recorded for it (``app.runtime.capabilities``).
"""

from __future__ import annotations

import logging
from typing import Any

from app.llm.provider import LLMError
from app.memory.state import thread_label
from app.memory.status import TurnStatus
from app.runtime import capabilities
from app.runtime.budget import Room
from app.runtime.chat import ChatProducer, ToolCall, stream_reply
from app.runtime.producer import ProducerResult, TurnIO
from app.runtime.tools import RESOURCE_SOURCE, TOOL_SOURCE, parse_arguments, run_tool, tool_specs

log = logging.getLogger(__name__)

MAX_TOOL_ROUNDS = 4
MAX_CALLS_PER_ROUND = 8
MIN_RESULT_TOKENS = 32  # a tool result is never cut below this; it is refused instead
MESSAGE_TOKENS = 8       # per-message overhead allowance for appended messages


class ToolChatProducer:
    """Chat that offers ``calculator``, ``current_time`` and ``read_resource`` to the model."""

    source = "chat"

    def run(self, io: TurnIO) -> ProducerResult:
        """Stream the answer, running tool calls in between (see the module docstring)."""
        specs = tool_specs()
        counter = io.services.counter
        room = Room(counter, io.context.budget, io.context.prompt_tokens)
        specs_cost = room.cost(specs)
        if specs_cost > room.left:
            log.info("turn on %s without tools: no room in the context", thread_label(io.thread_id))
            return ChatProducer().run(io)
        room.take(specs_cost)
        messages = io.context.to_openai()
        sources: set[str] = set()
        for round_no in range(MAX_TOOL_ROUNDS + 1):
            extra: dict[str, Any] = {"tools": specs}
            if round_no == MAX_TOOL_ROUNDS:
                extra["tool_choice"] = "none"  # enough tools: answer now
            try:
                step = stream_reply(io, messages, new_paragraph=True, **extra)
            except LLMError as exc:
                if round_no == 0 and not io.streamed_text and capabilities.rejects_tools(exc):
                    capabilities.mark_tools_refused(io.services)
                    return ChatProducer().run(io)
                raise
            if step.cancelled:
                return ProducerResult(TurnStatus.CANCELLED, io.streamed_text, self._source(sources))
            if not step.tool_calls or round_no == MAX_TOOL_ROUNDS:
                break
            calls = [step.tool_calls[i] for i in sorted(step.tool_calls)][:MAX_CALLS_PER_ROUND]
            assistant = {"role": "assistant", "content": step.text or None, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments or "{}"}}
                for c in calls]}
            room.take(room.cost(assistant) + MESSAGE_TOKENS)
            messages.append(assistant)
            for call in calls:
                if io.cancelled.is_set():
                    return ProducerResult(TurnStatus.CANCELLED, io.streamed_text, self._source(sources))
                result_message = self._run_call(io, call, room, sources)
                messages.append(result_message)
        return ProducerResult(TurnStatus.COMPLETED, io.streamed_text, self._source(sources))

    @staticmethod
    def _source(sources: set[str]) -> str:
        if RESOURCE_SOURCE in sources:
            return RESOURCE_SOURCE
        return TOOL_SOURCE if sources else "chat"

    def _run_call(self, io: TurnIO, call: ToolCall, room: Room, sources: set[str]) -> dict:
        io.emit({"type": "tool", "id": call.id, "name": call.name, "arguments": parse_arguments(call.arguments)[0],
                 "status": "started"})
        outcome = run_tool(call.name, call.arguments)
        result = outcome.result
        allowed = room.left - MESSAGE_TOKENS
        if allowed < MIN_RESULT_TOKENS:
            result = "error: the result does not fit in the model's context"
        else:
            result = room.clip(result, allowed)
        room.take(room.cost(result) + MESSAGE_TOKENS)
        if outcome.ok:
            sources.add(outcome.source)
        else:
            sources.add(TOOL_SOURCE)
        io.emit({"type": "tool", "id": call.id, "name": call.name, "arguments": outcome.arguments,
                 "result": result, "status": "finished"})
        return {"role": "tool", "tool_call_id": call.id, "content": result}
