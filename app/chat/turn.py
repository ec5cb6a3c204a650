"""The turn runner: read ThreadState, assemble the context, produce the answer, commit once, then ``done``.

A turn's life (``docs/contract.md``, WebSocket; docs/memory.md: "A turn")::

    start -> [waiting] -> delta* (and display-only tool/progress frames) -> commit (statuses that write memory only)
          -> done -> compaction request (due? marker + enqueue)
       \\-> cancel: done "cancelled", nothing written
       \\-> upstream failure: error + done "failed", nothing written
       \\-> the thread was cleared after the turn started: done "completed" with "saved": false,
           "reason": "thread_cleared", nothing written (a clear is final for everything that started before it)
       \\-> the store refused or failed the commit, or the final-turn adapter rejected the text: done
           "completed" with "saved": false and "reason" "store_unavailable" or "rejected"
       \\-> the commit's reply was lost and reading back failed too: done "completed" with "saved": "unknown"

What produces the answer is a *producer* (``app.runtime.producer``: plain chat by
default; tools, the task-list agent and the delivery workflow are chosen by
``app.runtime.producers``).  ``Turn`` is the producer's ``TurnIO``.  Whatever a
producer does inside the turn, only its final text is written, through the
final-turn adapter.  The browser's own history is never an input: the prompt
comes from the stored ThreadState only.  A memory failure is logged and never
changes what the person already received.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from app.compaction.service import fold_at_cap
from app.extensions import Services
from app.llm.client import CancelEvent, StreamStats
from app.llm.provider import LLMError
from app.memory.compaction import forms
from app.memory.compaction.record import sentences
from app.memory.context import AssembledContext, ContextTooLong, assemble_context
from app.memory.final_turn import FinalTurn, TurnRejected
from app.memory.state import ThreadState, new_message_id, thread_label
from app.memory.status import TurnStatus
from app.runtime.chat import ChatProducer
from app.runtime.producer import Producer, ProducerError, ProducerResult, TurnIO
from app.store.thread_store import OutcomeUnknown, StoreUnavailable

if TYPE_CHECKING:
    from app.store.thread_store import CommitResult

log = logging.getLogger(__name__)


def asks_something(text: str) -> bool:
    """True when one of ``text``'s sentences may ask or request something (``forms.may_ask``), English or
    Chinese.  Linear in ``text`` (``record.sentences`` splits in bounded windows)."""
    return any(forms.may_ask(s) for s in sentences(text))

def told_failure(message: str, *, shown: bool) -> str:
    """A failed turn's message for people: after text was shown it also says that part was not kept."""
    if shown and "not saved" not in message:
        return f"{message} The part shown was not saved."
    return message


def next_turn_number(state: ThreadState) -> int:
    """The number the next person turn of ``state`` takes (docs/contract.md: "Turn numbers"): one past the last
    turn's (or past the folded turns), skipping the numbers of forgotten turns."""
    numbers = state.turn_numbers()
    number = max(numbers[-1] if numbers else 0, state.folded_turns) + 1
    while number in state.forgotten_turns:
        number += 1
    return number


STREAMING_MARK_EVERY_SECONDS = 20.0
"""While text flows, the thread's ``streaming`` mark (``CompactionRequests.turn_streaming``; it lives
``LLM_FIRST_TOKEN_TIMEOUT_SECONDS`` plus a margin of 30 s) is renewed this often: an answer that keeps coming
has no total-time limit, and no refinement of its thread may start while it streams."""

STREAMING, COMMITTING, FINISHED = "streaming", "committing", "finished"
T = TypeVar("T")
REFUSALS = {"id_conflict": "message_id_reused", "full": "memory_full", "forgotten": "turn_forgotten"}
"""The store's refusals of a commit (``CommitResult.refused``) as the done frame's ``reason``."""


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
        cleared: True when nothing was written because the thread was cleared after the turn started.
        unsaved_reason: why a turn that ended ``completed`` or ``blocked`` was not written
            (``thread_cleared``, ``turn_forgotten``, ``store_unavailable``, ``rejected``, ``message_id_reused``,
            ``memory_full``;
            the done frame's ``reason``), or None.
        error_code: the contract error code of a failed turn.
        saved_unknown: True when the commit's reply was lost and reading back failed too: the turn may be
            stored (the done frame's ``"saved": "unknown"``; the page reads the thread again).
        user_message_id: the user message id of the turn.
    """

    status: TurnStatus
    message_id: str
    user_message_id: str | None = None
    context: AssembledContext | None = None
    stats: StreamStats = field(default_factory=StreamStats)
    started_at: float = 0.0
    answer: str = ""
    committed: bool = False
    cleared: bool = False
    unsaved_reason: str | None = None
    error_code: str | None = None
    saved_unknown: bool = False

    @property
    def first_token_ms(self) -> float | None:
        """Milliseconds from the start of streaming to the first text delta."""
        if self.stats.first_token_at is None:
            return None
        return (self.stats.first_token_at - self.started_at) * 1000.0


class Turn(TurnIO):
    """One turn in flight on one connection; its producer's ``TurnIO``.

    Args:
        services: shared services (store, LLM, tokenizer, settings).
        writer: the connection's ``FrameWriter``.
        thread_id: the session's thread.
        text: the person's new text (validated, trimmed).
        client_id: the client's message id, or None.
        producer: what produces the answer (``ChatProducer`` by default).
    """

    # ``writer`` is a FrameWriter; Any while bench/locomo_qa.py builds prepare()-only turns with writer=None.
    def __init__(self, services: Services, writer: Any, thread_id: str, text: str, client_id: str | None,
                 producer: Producer | None = None) -> None:
        self.services = services
        self.writer = writer
        self.thread_id = thread_id
        self.text = text
        self.producer = producer or ChatProducer()
        self.user_id = client_id or new_message_id()
        self.message_id = new_message_id()
        self.cancelled = CancelEvent()  # setting it also shuts the upstream connection down
        self.state = ThreadState()
        self.cleared_seen: int | None = None  # the clear counter read by prepare(); None: not known
        self.forgets_seen: int | None = None  # the forget counter read by prepare() (a forget is final too)
        self.context: AssembledContext  # set by prepare() (a producer reads it after)
        self._lock = threading.Lock()
        self._phase = STREAMING
        self._pieces: list[str] = []
        self._folded_at_cap = False
        self.outcome = TurnOutcome(TurnStatus.FAILED, self.message_id, self.user_id)
        self.stats = self.outcome.stats
        self.stats.on_wait = self._told_wait
        self._wait_told: tuple[str, int | None, float] | None = None  # the last waiting frame: for, percent, when
        self._marked_at = 0.0  # when the thread was last marked streaming (time.monotonic())

    @property
    def deadline(self) -> float:
        """``time.monotonic()`` by which a model call starting now must bring its first text (seconds; ``TurnIO``).

        A turn's clock measures silence, not length (docs/contract.md: Configuration): each streamed call
        may wait ``LLM_FIRST_TOKEN_TIMEOUT_SECONDS`` for its first text, then ``LLM_TOKEN_GAP_TIMEOUT_SECONDS``
        between two pieces of it (``app.llm.client.SilenceClock``); nothing limits the answer's total time.
        """
        return time.monotonic() + self.services.settings.llm_first_token_timeout

    @property
    def active(self) -> bool:
        """True until ``done`` has been sent."""
        return self._phase != FINISHED

    def _finish(self, status: TurnStatus, **extra: object) -> None:
        self.outcome.status = status
        self._phase = FINISHED
        self._account()  # before done: a stats read after done sees this turn
        self.writer.send({"type": "done", "status": status, "messageId": self.message_id, **extra,
                          **self._done_facts()})

    def _done_facts(self) -> dict:
        """What ``done`` tells beyond its status (docs/contract.md: the done frame): ``"turn"``, the memory turn
        number of a turn that was written; ``"finish": "length"`` when the answer ended at its token limit."""
        facts: dict = {}
        if self.outcome.committed:
            facts["turn"] = next_turn_number(self.state)
        if self.outcome.status.writes_memory and self.stats.finish_reason == "length":
            facts["finish"] = "length"
        return facts

    WAIT_WORDS = {
        "model_busy": "The model is answering another message first.",
        "another_turn": "The model is answering another visitor first.",
        "reading": "Reading the conversation again…",
    }
    """The ``message`` of each ``waiting`` frame's ``for`` (docs/contract.md: the waiting frame)."""

    def _told_wait(self, reason: str, percent: int | None) -> None:
        """The model's stream said why the first token waits (``StreamStats.on_wait``): send a ``waiting`` frame
        when the reason changes, or when a reading's percent changed and a second passed since the last one."""
        if self.stats.first_token_at is not None or reason not in self.WAIT_WORDS:
            return
        now = time.monotonic()
        last = self._wait_told
        if last is not None and last[0] == reason and (last[1] == percent or now - last[2] < 1.0):
            return
        self._wait_told = (reason, percent, now)
        frame: dict = {"type": "waiting", "for": reason, "message": self.WAIT_WORDS[reason]}
        if percent is not None:
            frame["percent"] = percent
        self.send_if_streaming(frame)

    def send_if_streaming(self, frame: dict, piece: str | None = None) -> bool:
        """Send ``frame`` while the turn streams (``TurnIO``); ``piece`` joins ``streamed_text`` with it."""
        with self._lock:
            if self._phase != STREAMING:
                return False
            if piece is not None:
                self._pieces.append(piece)
            self.writer.send(frame)
        if piece is not None and time.monotonic() - self._marked_at >= STREAMING_MARK_EVERY_SECONDS:
            self._mark_activity(streaming=True)  # an answer has no total-time limit: its mark must outlive it
        return True

    @property
    def streamed_text(self) -> str:
        """Every piece of answer text sent so far."""
        return "".join(self._pieces)

    def cancel(self) -> bool:
        """Stop the turn: ``done`` ``cancelled`` now; the producer's thread closes the upstream.

        Returns False when the turn is already committing or finished (too late to cancel).
        """
        with self._lock:
            if self._phase != STREAMING:
                return False
            self.cancelled.set()
            self._finish(TurnStatus.CANCELLED)
            return True

    def abandon(self) -> None:
        """The socket closed (or the turn was refused): stop and write nothing."""
        with self._lock:
            self.cancelled.set()
            if self._phase == STREAMING:
                self._phase = FINISHED
                self.outcome.status = TurnStatus.INTERRUPTED

    def load_state(self) -> ThreadState:
        """The stored ThreadState, or the empty state when the store is down (degrade, never break).

        Sets ``cleared_seen`` to the state's clear counter (None when the store failed: the commit
        then skips the clear check).

        Raises:
            CorruptState: the stored thread cannot be read; the turn must not run (nothing it wrote
                could be kept).  The socket answers ``memory_unreadable``; a clear repairs the thread.
        """
        self.cleared_seen = self.forgets_seen = None
        self.archive = None
        try:
            settings = self.services.settings
            if settings.limits.recall_share > 0 or settings.fold_step > 1:  # thread and archive, one round trip
                state, self.archive = self.services.archive.load_turn_memory(self.thread_id, run=off_the_event_loop)
            else:
                state = self.services.store.load(self.thread_id)
            self.cleared_seen, self.forgets_seen = state.cleared, state.forgets
            return state
        except StoreUnavailable as exc:
            log.warning("turn on %s uses empty memory: %s", thread_label(self.thread_id), type(exc).__name__)
            return ThreadState()

    def recall_share(self) -> float:
        """The share of the prompt budget this turn's recalled excerpts may use (``Settings.recall_share_cap``):
        0.0 when recall is only for messages that ask (``Settings.recall_asks_only``) and this one does not
        ask or request anything (``app.memory.compaction.forms``).  CPU work: call it off the event loop."""
        settings = self.services.settings
        share = settings.recall_share_cap
        if share > 0 and settings.recall_asks_only and not asks_something(self.text):
            return 0.0
        return share

    def prepare(self) -> AssembledContext:
        """Load memory and assemble the prompt.

        The store reads run here; the CPU work (tokenising new archived turns, counting, recall) runs off
        the event loop under gevent (``off_the_event_loop``), so it never holds up the process's other
        sockets (docs/benchmarks.md: Performance).  A refused input leaves no count in the token-count cache.

        Raises:
            ContextTooLong: the input does not fit even without recent turns.
            CorruptState: the stored thread cannot be read (``load_state``).
        """
        settings = self.services.settings
        self.state = self.load_state()
        try:
            context = off_the_event_loop(lambda: assemble_context(
                self.state, self.text, system_prompt=settings.system_prompt, counter=self.services.counter,
                context_tokens=settings.model_context_tokens, reserved_output_tokens=settings.reserved_output_tokens,
                archive=self.archive, recall_share=self.recall_share(), fold_step=settings.fold_step,
                answer_max_tokens=settings.prompt_answer_max_tokens))
        except ContextTooLong:
            self.services.counter.forget(self.text)  # a refused input is never cached
            raise
        self.context = self.outcome.context = context
        return context

    def run(self, context: AssembledContext) -> TurnOutcome:
        """Produce the answer and finish the turn (runs in the turn's own thread).

        An unexpected error still ends the turn with ``done`` (``failed`` while streaming).
        """
        self._mark_activity(streaming=True)  # docs/memory.md: A compaction (the model's part waits for quiet)
        try:
            self._run(context)
        except Exception:
            log.exception("turn on %s crashed", thread_label(self.thread_id))
            with self._lock:
                if self._phase == STREAMING:
                    self.writer.error("internal", "Something went wrong. Please try again.")
                    self.outcome.error_code = "internal"
                    self._finish(TurnStatus.FAILED, code="internal")
                elif self._phase == COMMITTING:
                    self._finish(TurnStatus.COMPLETED)
        finally:
            self._account()
            self._mark_activity(streaming=False)
        return self.outcome

    def _mark_activity(self, *, streaming: bool) -> None:
        """Tell the compaction requests that this thread streams, or has just ended a turn; never raises."""
        self._marked_at = time.monotonic()
        try:
            requests = self.services.compaction_requests
            (requests.turn_streaming if streaming else requests.turn_ended)(self.thread_id)
        except Exception:
            log.debug("activity of %s not marked", thread_label(self.thread_id), exc_info=True)

    def _run(self, context: AssembledContext) -> None:
        settings = self.services.settings
        outcome = self.outcome
        outcome.started_at = time.monotonic()
        self.context = context
        self.writer.send({"type": "start", "messageId": self.message_id})
        if settings.bundled_model and self.services.llm.streams_in_flight:
            # The bundled model's server answers one request at a time (docs/bundled-model.md): say so.
            self._wait_told = ("model_busy", None, time.monotonic())
            self.send_if_streaming({"type": "waiting", "for": "model_busy", "message": self.WAIT_WORDS["model_busy"]})
        try:
            result = self.producer.run(self)
        except (LLMError, ProducerError) as exc:
            log.info("turn on %s failed: %s", thread_label(self.thread_id), getattr(exc, "category", exc.code))
            with self._lock:
                if self._phase == STREAMING:
                    self.writer.error(exc.code, told_failure(exc.message, shown=bool(self._pieces)))
                    outcome.error_code = exc.code
                    self._finish(TurnStatus.FAILED, code=exc.code)
            return
        status = TurnStatus.parse(result.status)
        with self._lock:
            if self._phase != STREAMING:
                return  # cancelled or socket gone: nothing is written
            if status is None or not status.writes_memory:
                # paused, failed and cancelled are told as they are; a producer has no other status
                told = (TurnStatus.PAUSED, TurnStatus.FAILED, TurnStatus.CANCELLED)
                self._finish(status if status in told else TurnStatus.FAILED)
                return
            if not result.text.strip():
                self.writer.error("llm_unavailable", "The model returned an empty answer. Please try again.")
                outcome.error_code = "llm_unavailable"
                self._finish(TurnStatus.FAILED, code="llm_unavailable")
                return
            self._phase = COMMITTING
        outcome.answer = result.text
        commit = self._commit(result)
        with self._lock:
            unsaved = ({"saved": False, "reason": outcome.unsaved_reason} if outcome.unsaved_reason
                       else {"saved": "unknown"} if outcome.saved_unknown else {})
            self._finish(status.done_status, **unsaved)  # docs/contract.md: WebSocket, the done frame
        if commit is not None:
            # After done: enqueueing costs a Celery publish (~2 ms) that the person need not wait for.
            self._request_compaction(commit, result)

    def _commit(self, result: ProducerResult) -> CommitResult | None:
        """Write the final turn once; return the ``CommitResult`` when appended, else None.

        Failures are logged only: memory trouble never changes what the person received.
        """
        store = self.services.store
        user_text = result.user_text or self.text
        try:
            commit = store.commit_final_turn(self.thread_id, FinalTurn(
                user_text, result.text, result.status, result.source,
                user_id=self.user_id, assistant_id=self.message_id), expected_cleared=self.cleared_seen,
                expected_forgets=self.forgets_seen)
        except TurnRejected as exc:
            log.warning("turn on %s not written: %s", thread_label(self.thread_id), exc.reason)
            self.outcome.unsaved_reason = "rejected"
            return None
        except OutcomeUnknown:
            log.error("turn on %s: commit's reply lost and not read back: saved unknown", thread_label(self.thread_id))
            self.outcome.saved_unknown = True
            return None
        except StoreUnavailable:
            log.error("turn on %s not written: store unavailable", thread_label(self.thread_id))
            self.outcome.unsaved_reason = "store_unavailable"
            return None
        if commit.refused == "full" and not self._folded_at_cap:
            self._folded_at_cap = True  # the worker's folds are behind: fold here, without the model, once
            if fold_at_cap(self.services, self.thread_id):
                return self._commit(result)
        self.outcome.committed = commit.appended
        if commit.cleared:
            log.info("turn on %s not written: the thread was cleared after it started", thread_label(self.thread_id))
            self.outcome.cleared = True
            self.outcome.unsaved_reason = "thread_cleared"
        elif commit.refused in REFUSALS:  # docs/contract.md: the done frame
            log.warning("turn on %s not written: %s", thread_label(self.thread_id), commit.refused)
            self.outcome.unsaved_reason = REFUSALS[commit.refused]
            if commit.refused == "full":  # and folding here did not help: ask the worker again
                self._request_compaction(commit, result)
        return commit if commit.appended else None

    def _request_compaction(self, commit: CommitResult, result: ProducerResult) -> None:
        """Ask for a compaction when one is due after this commit (docs/memory.md: A compaction, step 1); never
        raises."""
        counter = self.services.counter
        uncompacted = sum(counter.count(m.text) for m in self.state.messages) + \
            counter.count(result.user_text or self.text) + counter.count(result.text)
        try:
            self.services.compaction_requests.after_commit(
                self.thread_id, message_count=commit.message_count, uncompacted_tokens=uncompacted,
                version=commit.version)
        except Exception:
            log.exception("compaction request for %s failed", thread_label(self.thread_id))

    def _account(self) -> None:
        """Record the turn's token accounting once (observability; failures are logged only)."""
        if getattr(self, "_accounted", False):
            return
        self._accounted = True
        try:
            from app.observability.accounting import record_turn
            record_turn(self.services, self.thread_id, self.outcome, state=self.state)
        except Exception:
            log.warning("turn accounting for %s failed", thread_label(self.thread_id), exc_info=True)


# ------------------------------------------------------------------------------------------ the prepare path's CPU


def off_the_event_loop(work: Callable[[], T]) -> T:
    """``work()``, run in gevent's pool of real threads when this process runs under gevent (the standard
    library monkey-patched: gunicorn's gevent worker), else right here; its result or its exception.

    Under gevent every socket of the process shares one OS thread: CPU-heavy work on a socket's greenlet
    (a long message's tokenising, a recall over a large archive) would hold up every other socket's
    stream for as long as it runs.  In a real thread the event loop keeps running beside it (the two
    share the interpreter lock in turns of ``sys.getswitchinterval()``, 5 ms).  ``work`` must not use
    the store or a socket (its reads belong to the loop).
    """
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("threading"):
        return work()
    import gevent

    def guarded() -> tuple[bool, object]:  # gevent's pool prints what a task raises: hand it back instead
        try:
            return True, work()
        except Exception as exc:
            return False, exc

    done, value = gevent.get_hub().threadpool.apply(guarded)
    if not done:
        raise value
    return value
