"""The turn runner: read ThreadState, assemble the context, produce the answer, commit once, then ``done``.

A turn's life (contract: WebSocket; issue 3 item 3)::

    start -> delta* (and display-only tool/progress frames) -> commit (completed/blocked only)
          -> done -> compaction request (due? marker + enqueue)
       \\-> cancel: done "cancelled", nothing written
       \\-> upstream failure: error + done "failed", nothing written

What produces the answer is a *producer* (plain chat here; tools, the task-list
agent and the delivery workflow elsewhere).  Whatever it does inside the turn,
only its final text is written, through the final-turn adapter.  The browser's
own history is never an input: the prompt comes from the stored ThreadState only
(acceptance P17).  A memory failure is logged and never changes what the person
already received.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from app.extensions import Services
from app.llm.client import CancelEvent, StreamStats
from app.llm.provider import LLMError
from app.memory.context import AssembledContext, assemble_context
from app.memory.final_turn import FinalTurn, TurnRejected
from app.memory.state import ThreadState, new_message_id
from app.store.thread_store import CorruptState, StoreUnavailable

log = logging.getLogger(__name__)

STREAMING, COMMITTING, FINISHED = "streaming", "committing", "finished"
# A producer's final status -> the done frame's status.  "paused" is an extension for the
# task-list agent waiting for confirmation: nothing is written, like "cancelled".
DONE_STATUS = {"completed": "completed", "final": "completed", "blocked": "blocked",
               "paused": "paused", "failed": "failed", "cancelled": "cancelled"}
WRITTEN = {"completed", "final", "blocked"}


@dataclass
class ProducerResult:
    """What a producer finally told the person.

    Attributes:
        status: ``completed``, ``final`` or ``blocked`` (written); ``paused``, ``failed``,
            ``cancelled`` (never written).
        text: the final assistant text (what memory keeps when written).
        source: ``chat``, ``tool``, ``mcp-resource``, ``tasklist-agent`` or ``delivery-chain``.
        user_text: the user text to remember, when it differs from what was typed
            (for example the goal of ``/tasklist <goal>``); None keeps the typed text.
    """

    status: str
    text: str = ""
    source: str = "chat"
    user_text: str | None = None


class Producer(Protocol):
    """Produces a turn's answer: streams deltas and display frames through ``TurnIO``."""

    def run(self, io: "TurnIO") -> ProducerResult:
        """Produce the answer; raise ``LLMError`` on provider failure."""


@dataclass
class TurnOutcome:
    """What a turn ended as, for accounting.

    Attributes:
        status: the done status (or ``interrupted`` when the socket closed).
        message_id: the assistant message id.
        context: the assembled prompt (sections in tokens), or None.
        stats: provider usage (tokens) and first-token time.
        started_at: ``time.monotonic()`` when streaming started (seconds).
        answer: the final assistant text.
        committed: True when memory was written.
        error_code: the contract error code of a failed turn.
        user_message_id: the user message id of the turn.
    """

    status: str
    message_id: str
    user_message_id: str | None = None
    context: AssembledContext | None = None
    stats: StreamStats = field(default_factory=StreamStats)
    started_at: float = 0.0
    answer: str = ""
    committed: bool = False
    error_code: str | None = None

    @property
    def first_token_ms(self) -> float | None:
        """Milliseconds from the start of streaming to the first text delta."""
        if self.stats.first_token_at is None:
            return None
        return (self.stats.first_token_at - self.started_at) * 1000.0


class TurnIO:
    """What a producer may do inside a turn: send deltas and display frames, watch for cancel.

    Attributes:
        services, thread_id, text (the person's input), state (ThreadState read at the
        start), context (assembled prompt), cancelled (``threading.Event``), deadline
        (``time.monotonic()`` seconds), stats (``StreamStats`` to fill), message_id and
        user_id (the ids the turn writes its final turn with).
    """

    def __init__(self, turn: "Turn", context: AssembledContext, deadline: float):
        self._turn = turn
        self.services = turn.services
        self.thread_id = turn.thread_id
        self.text = turn.text
        self.state = turn.state
        self.context = context
        self.cancelled = turn.cancelled
        self.deadline = deadline
        self.stats = turn.outcome.stats
        self.message_id = turn.message_id
        self.user_id = turn.user_id  # the user message id the turn will write (issue 6: runs record it)
        self.pieces: list[str] = []

    def delta(self, text: str) -> bool:
        """Stream a piece of the answer; False once the turn is no longer streaming."""
        return self._turn._send_if_streaming({"type": "delta", "text": text}, self.pieces, text)

    def emit(self, frame: dict) -> bool:
        """Send a display-only frame (``tool``, ``progress``); never stored."""
        return self._turn._send_if_streaming(frame)

    @property
    def streamed_text(self) -> str:
        """Everything streamed so far."""
        return "".join(self.pieces)


class ChatProducer:
    """Plain chat: stream the model's answer to the assembled prompt."""

    source = "chat"

    def run(self, io: TurnIO) -> ProducerResult:
        """Stream deltas; the final text is what was streamed."""
        for chunk in io.services.llm.stream_chat(io.context.to_openai(), cancelled=io.cancelled,
                                                 deadline=io.deadline, stats=io.stats):
            for choice in chunk.choices:
                text = choice.delta.content if choice.delta else None
                if text and not io.delta(text):
                    return ProducerResult("cancelled", io.streamed_text, self.source)
        return ProducerResult("completed", io.streamed_text, self.source)


class Turn:
    """One turn in flight on one connection.

    Args:
        services: shared services (store, LLM, tokenizer, settings).
        writer: the connection's ``FrameWriter``.
        thread_id: the session's thread.
        text: the person's new text (validated, trimmed).
        client_id: the client's message id, or None.
        producer: what produces the answer (``ChatProducer`` by default).
    """

    def __init__(self, services: Services, writer, thread_id: str, text: str, client_id: str | None,
                 producer: Producer | None = None):
        self.services = services
        self.writer = writer
        self.thread_id = thread_id
        self.text = text
        self.producer = producer or ChatProducer()
        self.user_id = client_id or new_message_id()
        self.message_id = new_message_id()
        self.cancelled = CancelEvent()  # setting it also shuts the upstream connection down
        self.state = ThreadState()
        self._lock = threading.Lock()
        self._phase = STREAMING
        self.outcome = TurnOutcome("failed", self.message_id, self.user_id)

    @property
    def active(self) -> bool:
        """True until ``done`` has been sent."""
        return self._phase != FINISHED

    def _finish(self, status: str, **extra) -> None:
        self.outcome.status = status
        self._phase = FINISHED
        self._account()  # before done: a stats read after done sees this turn (issue 7)
        self.writer.send({"type": "done", "status": status, "messageId": self.message_id, **extra})

    def _send_if_streaming(self, frame: dict, pieces: list | None = None, piece: str | None = None) -> bool:
        with self._lock:
            if self._phase != STREAMING:
                return False
            if pieces is not None:
                pieces.append(piece)
            self.writer.send(frame)
            return True

    def cancel(self) -> bool:
        """Stop the turn: ``done`` ``cancelled`` now; the producer's thread closes the upstream.

        Returns False when the turn is already committing or finished (too late to cancel).
        """
        with self._lock:
            if self._phase != STREAMING:
                return False
            self.cancelled.set()
            self._finish("cancelled")
            return True

    def abandon(self) -> None:
        """The socket closed (or the turn was refused): stop and write nothing."""
        with self._lock:
            self.cancelled.set()
            if self._phase == STREAMING:
                self._phase = FINISHED
                self.outcome.status = "interrupted"

    def load_state(self) -> ThreadState:
        """The stored ThreadState, or the empty state when the store is down (degrade, never break)."""
        try:
            return self.services.store.load(self.thread_id)
        except (StoreUnavailable, CorruptState) as exc:
            log.warning("turn on %s uses empty memory: %s", self.thread_id[:13], type(exc).__name__)
            return ThreadState()

    def prepare(self) -> AssembledContext:
        """Load memory and assemble the prompt.

        Raises:
            ContextTooLong: the input does not fit even without recent turns.
        """
        settings = self.services.settings
        self.state = self.load_state()
        context = assemble_context(self.state, self.text, system_prompt=settings.system_prompt,
                                   counter=self.services.counter, context_tokens=settings.model_context_tokens,
                                   reserved_output_tokens=settings.reserved_output_tokens)
        self.outcome.context = context
        return context

    def run(self, context: AssembledContext) -> TurnOutcome:
        """Produce the answer and finish the turn (runs in the turn's own thread).

        An unexpected error still ends the turn with ``done`` (``failed`` while streaming).
        """
        try:
            self._run(context)
        except Exception:
            log.exception("turn on %s crashed", self.thread_id[:13])
            with self._lock:
                if self._phase == STREAMING:
                    self.writer.error("internal", "Something went wrong. Please try again.")
                    self.outcome.error_code = "internal"
                    self._finish("failed", code="internal")
                elif self._phase == COMMITTING:
                    self._finish("completed")
        finally:
            self._account()
        return self.outcome

    def _run(self, context: AssembledContext) -> None:
        settings = self.services.settings
        outcome = self.outcome
        outcome.started_at = time.monotonic()
        io = TurnIO(self, context, outcome.started_at + settings.llm_turn_timeout)
        self.writer.send({"type": "start", "messageId": self.message_id})
        try:
            result = self.producer.run(io)
        except LLMError as exc:
            log.info("turn on %s failed upstream: %s", self.thread_id[:13], exc.category)
            with self._lock:
                if self._phase == STREAMING:
                    self.writer.error(exc.code, exc.message)
                    outcome.error_code = exc.code
                    self._finish("failed", code=exc.code)
            return
        with self._lock:
            if self._phase != STREAMING:
                return  # cancelled or socket gone: nothing is written
            if result.status in WRITTEN and not result.text.strip():
                self.writer.error("llm_unavailable", "The model returned an empty answer. Please try again.")
                outcome.error_code = "llm_unavailable"
                self._finish("failed", code="llm_unavailable")
                return
            if result.status not in WRITTEN:
                self._finish(DONE_STATUS.get(result.status, "failed"))
                return
            self._phase = COMMITTING
        outcome.answer = result.text
        commit = self._commit(result)
        with self._lock:
            self._finish(DONE_STATUS[result.status])
        if commit is not None:
            # After done: enqueueing costs a Celery publish (~2 ms) that the person need not wait for.
            self._request_compaction(commit, result)

    def _commit(self, result: ProducerResult):
        """Write the final turn once; return the ``CommitResult`` when appended, else None.

        Failures are logged only: memory trouble never changes what the person received.
        """
        store = self.services.store
        user_text = result.user_text or self.text
        try:
            commit = store.commit_final_turn(self.thread_id, FinalTurn(
                user_text, result.text, result.status, result.source,
                user_id=self.user_id, assistant_id=self.message_id))
        except TurnRejected as exc:
            log.warning("turn on %s not written: %s", self.thread_id[:13], exc.reason)
            return
        except StoreUnavailable:
            log.error("turn on %s not written: store unavailable", self.thread_id[:13])
            return
        self.outcome.committed = commit.appended
        return commit if commit.appended else None

    def _request_compaction(self, commit, result: ProducerResult) -> None:
        """Ask for a compaction when one is due after this commit (issue 4 item 2); never raises."""
        counter = self.services.counter
        uncompacted = sum(counter.count(m.text) for m in self.state.messages) + \
            counter.count(result.user_text or self.text) + counter.count(result.text)
        try:
            from workers.compaction import request_compaction
            request_compaction(self.services, self.thread_id, message_count=commit.message_count,
                               uncompacted_tokens=uncompacted, version=commit.version)
        except Exception:
            log.exception("compaction request for %s failed", self.thread_id[:13])

    def _account(self) -> None:
        """Record the turn's token accounting once (observability; failures are logged only)."""
        if getattr(self, "_accounted", False):
            return
        self._accounted = True
        try:
            from app.observability.accounting import record_turn
            record_turn(self.services, self.thread_id, self.outcome)
        except Exception:
            log.warning("turn accounting for %s failed", self.thread_id[:13], exc_info=True)
