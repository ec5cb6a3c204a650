"""The producer interface: what answers a turn, and what it may do while the turn streams.

A *producer* (plain chat, chat with tools, the task-list agent, the delivery workflow) is
handed a ``TurnIO`` by the turn runner (``app.chat.turn.Turn`` implements it) and returns one
``ProducerResult``.  It streams answer text with ``io.delta`` and display-only frames
(``tool``, ``progress``) with ``io.emit``; only the result's texts can enter memory, and only
when its status writes memory (``TurnStatus.writes_memory``; docs/memory.md: "The boundary: what
enters memory").

To add a producer: a class with ``source`` and ``run(io) -> ProducerResult``, chosen by
``app.runtime.producers.choose_producer``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from app.llm.client import StreamStats
from app.memory.context import AssembledContext
from app.memory.state import ThreadState
from app.memory.status import TurnStatus

if TYPE_CHECKING:  # the layer above, for types only (docs/architecture.md)
    from app.extensions import Services


@dataclass
class ProducerResult:
    """What a producer finally told the person.

    Attributes:
        status: a ``TurnStatus``: ``completed``, ``final`` or ``blocked`` (written); ``paused``,
            ``failed``, ``cancelled`` (never written).
        text: the final assistant text (what memory keeps when written).
        source: ``chat``, ``tool``, ``mcp-resource``, ``tasklist-agent`` or ``delivery-chain``.
        user_text: the user text to remember, when it differs from what was typed
            (for example the goal of ``/tasklist <goal>``); None keeps the typed text.
    """

    status: TurnStatus
    text: str = ""
    source: str = "chat"
    user_text: str | None = None


class ProducerError(RuntimeError):
    """A producer cannot finish its turn for a reason of its own (not the provider's).

    The turn fails with an error frame ``{"code", "message"}`` (``message`` is for people)
    and ``done`` ``failed``; nothing is written.
    """

    def __init__(self, code: str, message: str):
        super().__init__(code)
        self.code = code
        self.message = message


def run_state_unavailable() -> ProducerError:
    """The error of a run whose state cannot be read or written (the store is unreachable)."""
    return ProducerError("runtime_unavailable", "Task state is unavailable right now. Please try again.")


class TurnIO(Protocol):
    """What a producer may read and do inside a turn.

    Attributes:
        services: the process's ``Services`` (store, Redis, LLM clients, token counter, settings).
        thread_id: the turn's thread.
        text: the person's input (validated, trimmed).
        state: the ``ThreadState`` read at the start of the turn.
        context: the assembled prompt (``AssembledContext``; its budget in tokens).
        cancelled: set when the person cancels or the socket closes.
        deadline: ``time.monotonic()`` seconds by which a model call starting now must bring its first text
            (docs/contract.md: Configuration, ``LLM_FIRST_TOKEN_TIMEOUT_SECONDS``; once text flows only the gap
            between two pieces is limited, never an answer's total time).
        stats: the ``StreamStats`` the streamed model calls fill (tokens, first-token time).
        message_id: the assistant message id the turn writes.
        user_id: the user message id the turn writes.
    """

    services: Services
    thread_id: str
    text: str
    state: ThreadState
    context: AssembledContext
    cancelled: threading.Event
    stats: StreamStats
    message_id: str
    user_id: str

    @property
    def deadline(self) -> float:
        """See the class docstring: a new value for each model call (seconds on ``time.monotonic()``)."""
        ...

    def send_if_streaming(self, frame: dict, piece: str | None = None) -> bool:
        """Send ``frame`` to the person while the turn still streams.

        ``piece`` is the answer text the frame carries, added to ``streamed_text`` together with
        the send.  Returns False (and sends nothing) once the turn was cancelled, finished or
        its socket closed.
        """

    @property
    def streamed_text(self) -> str:
        """Every piece of answer text sent so far, in order."""

    def delta(self, text: str) -> bool:
        """Stream a piece of the answer; False once the turn is no longer streaming."""
        return self.send_if_streaming({"type": "delta", "text": text}, text)

    def emit(self, frame: dict) -> bool:
        """Send a display-only frame (``tool``, ``progress``), never stored; False once not streaming."""
        return self.send_if_streaming(frame)


class Producer(Protocol):
    """Produces a turn's answer.

    Attributes:
        source: the memory source of its answers (see ``ProducerResult.source``).
    """

    source: str

    def run(self, io: TurnIO) -> ProducerResult:
        """Produce the answer through ``io``.

        Raises:
            LLMError: the provider failed (the turn fails with its code and message).
            ProducerError: the producer cannot go on (for example its run state is unreachable).
        """
