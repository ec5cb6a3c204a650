"""The turn runner: read ThreadState, assemble the context, stream, commit once, then ``done``.

A turn's life (contract: WebSocket; issue 3 item 3)::

    start -> delta* -> commit (completed only) -> compaction request -> done
                  \\-> cancel: done "cancelled", nothing written
                  \\-> upstream failure: error + done "failed", nothing written

The browser's own history is never an input: the prompt comes from the stored
ThreadState only (acceptance P17).  A memory failure (store down) is logged and
never changes what the person already received.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from app.extensions import Services
from app.llm.client import StreamStats
from app.llm.provider import LLMError
from app.memory.context import AssembledContext, ContextTooLong, assemble_context
from app.memory.final_turn import FinalTurn, TurnRejected
from app.memory.state import ThreadState, new_message_id
from app.store.thread_store import CorruptState, StoreUnavailable

log = logging.getLogger(__name__)

STREAMING, COMMITTING, FINISHED = "streaming", "committing", "finished"


@dataclass
class TurnOutcome:
    """What a turn ended as, for accounting: ``status`` and token/latency figures."""

    status: str
    message_id: str
    context: AssembledContext | None = None
    stats: StreamStats = field(default_factory=StreamStats)
    started_at: float = 0.0
    answer: str = ""
    committed: bool = False


class Turn:
    """One turn in flight on one connection.

    Args:
        services: shared services (store, LLM, tokenizer, settings).
        writer: the connection's ``FrameWriter``.
        thread_id: the session's thread.
        text: the person's new text (validated, trimmed).
        client_id: the client's message id, or None.
    """

    def __init__(self, services: Services, writer, thread_id: str, text: str, client_id: str | None):
        self.services = services
        self.writer = writer
        self.thread_id = thread_id
        self.text = text
        self.user_id = client_id or new_message_id()
        self.message_id = new_message_id()
        self.cancelled = threading.Event()
        self._lock = threading.Lock()
        self._phase = STREAMING
        self.outcome = TurnOutcome("failed", self.message_id)

    @property
    def active(self) -> bool:
        """True until ``done`` has been sent."""
        return self._phase != FINISHED

    def _finish(self, status: str, **extra) -> None:
        self.outcome.status = status
        self._phase = FINISHED
        self.writer.send({"type": "done", "status": status, "messageId": self.message_id, **extra})

    def cancel(self) -> bool:
        """Stop the turn: ``done`` ``cancelled`` now, upstream closed by the turn's thread.

        Returns False when the turn is already committing or finished (too late to cancel).
        """
        with self._lock:
            if self._phase != STREAMING:
                return False
            self.cancelled.set()
            self._finish("cancelled")
            return True

    def abandon(self) -> None:
        """The socket closed: stop streaming and write nothing."""
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
        state = self.load_state()
        self.state = state
        return assemble_context(state, self.text, system_prompt=settings.system_prompt,
                                counter=self.services.counter, context_tokens=settings.model_context_tokens,
                                reserved_output_tokens=settings.reserved_output_tokens)

    def run(self, context: AssembledContext) -> TurnOutcome:
        """Stream the answer and finish the turn (runs in the turn's own thread).

        An unexpected error still ends the turn with ``done`` (``failed`` while streaming).
        """
        try:
            return self._run(context)
        except Exception:
            log.exception("turn on %s crashed", self.thread_id[:13])
            with self._lock:
                if self._phase == STREAMING:
                    self.writer.error("internal", "Something went wrong. Please try again.")
                    self._finish("failed", code="internal")
                elif self._phase == COMMITTING:
                    self._finish("completed")
            return self.outcome

    def _run(self, context: AssembledContext) -> TurnOutcome:
        settings = self.services.settings
        outcome = self.outcome
        outcome.context = context
        outcome.started_at = time.monotonic()
        deadline = outcome.started_at + settings.llm_turn_timeout
        pieces: list[str] = []
        self.writer.send({"type": "start", "messageId": self.message_id})
        try:
            for chunk in self.services.llm.stream_chat(context.to_openai(), cancelled=self.cancelled,
                                                       deadline=deadline, stats=outcome.stats):
                for choice in chunk.choices:
                    text = choice.delta.content if choice.delta else None
                    if not text:
                        continue
                    with self._lock:
                        if self._phase != STREAMING:
                            return outcome
                        pieces.append(text)
                        self.writer.send({"type": "delta", "text": text})
        except LLMError as exc:
            log.info("turn on %s failed upstream: %s", self.thread_id[:13], exc.category)
            with self._lock:
                if self._phase == STREAMING:
                    self.writer.error(exc.code, exc.message)
                    self._finish("failed", code=exc.code)
            return outcome
        answer = "".join(pieces)
        with self._lock:
            if self._phase != STREAMING:
                return outcome  # cancelled or socket gone: nothing is written
            if not answer.strip():
                self.writer.error("llm_unavailable", "The model returned an empty answer. Please try again.")
                self._finish("failed", code="llm_unavailable")
                return outcome
            self._phase = COMMITTING
        outcome.answer = answer
        self._commit(answer)
        with self._lock:
            self._finish("completed")
        return outcome

    def _commit(self, answer: str) -> None:
        """Write the final turn once; request a compaction when due.  Failures are logged only."""
        store = self.services.store
        try:
            result = store.commit_final_turn(self.thread_id, FinalTurn(
                self.text, answer, "completed", "chat", user_id=self.user_id, assistant_id=self.message_id))
        except TurnRejected as exc:
            log.warning("turn on %s not written: %s", self.thread_id[:13], exc.reason)
            return
        except StoreUnavailable:
            log.error("turn on %s not written: store unavailable", self.thread_id[:13])
            return
        self.outcome.committed = result.appended
        if not result.appended:
            return
        counter = self.services.counter
        uncompacted = sum(counter.count(m.text) for m in self.state.messages) + \
            counter.count(self.text) + counter.count(answer)
        try:
            from workers.compaction import request_compaction
            request_compaction(self.services, self.thread_id, message_count=result.message_count,
                               uncompacted_tokens=uncompacted, version=result.version)
        except Exception:
            log.exception("compaction request for %s failed", self.thread_id[:13])
