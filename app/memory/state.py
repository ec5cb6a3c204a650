"""ThreadState and its parts (docs/contract.md: ThreadState).

A thread is the short-term memory of one browser session: the recent messages
verbatim, a bounded record of older turns (``app.memory.record``), and pinned decisions.
Values here are immutable; every change produces a new value.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Container, Iterable, Sequence

from app.memory.record import Record

ROLES = ("user", "assistant")
PINNED_BY_PERSON = "person"
PINNED_BY_MODEL = "model"


def utc_now_iso() -> str:
    """Return the current time as ISO 8601 UTC with millisecond precision, e.g. ``2026-11-30T12:00:00.000Z``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_message_id() -> str:
    """Return a fresh server-side message id: ``m_`` + 32 hex characters."""
    return "m_" + uuid.uuid4().hex


def thread_label(thread_id: str) -> str:
    """A thread's short label for logs: the first 13 characters of its id, ``chat:`` and the first 8 hex characters
    of the id's HMAC (``app.identity``; docs/contract.md: ThreadState).

    32 bits tell the threads of one log apart, and a log line stays readable without the whole 69-character id,
    which names the thread's keys in Redis.
    """
    return thread_id[:13]


def group_turns(messages: Iterable[ThreadMessage]) -> list[tuple[ThreadMessage, ...]]:
    """Whole turns of ``messages`` (oldest first): each user message with the assistant messages after it.

    A leading assistant message without its user message forms a turn of its own.
    """
    turns: list[list[ThreadMessage]] = []
    for message in messages:
        if message.role == "user" or not turns:
            turns.append([message])
        else:
            turns[-1].append(message)
    return [tuple(t) for t in turns]


@dataclass(frozen=True)
class ThreadMessage:
    """One user-visible message: exactly ``{id, role, text, createdAt}``.

    Attributes:
        id: message id (client-chosen for user messages, server-chosen otherwise).
        role: ``"user"`` or ``"assistant"``.
        text: trimmed, non-empty text.
        created_at: ISO 8601 UTC timestamp.
    """

    id: str
    role: str
    text: str
    created_at: str

    def to_dict(self) -> dict:
        """Return the stored/wire form ``{"id", "role", "text", "createdAt"}``."""
        return {"id": self.id, "role": self.role, "text": self.text, "createdAt": self.created_at}

    @classmethod
    def from_dict(cls, data: dict) -> "ThreadMessage":
        """Build from the stored form (validate it with ``schemas.MessageSchema`` first)."""
        return cls(id=data["id"], role=data["role"], text=data["text"], created_at=data["createdAt"])


@dataclass(frozen=True)
class Pin:
    """A pinned decision: its text and who pinned it.

    Pinned decisions are the person's (``by="person"``): kept word for word, never changed
    by a compaction.  ``"model"`` marks a pin stored before model proposals became notes
    (``ThreadState.notes``); the store reads such pins as notes.
    """

    text: str
    by: str = PINNED_BY_PERSON

    def to_dict(self) -> dict:
        """Return the stored form ``{"text", "by"}``."""
        return {"text": self.text, "by": self.by}


@dataclass(frozen=True)
class ThreadState:
    """The whole memory of one thread (docs/contract.md: ThreadState).

    Attributes:
        messages: recent messages, oldest first; whole turns (user then assistant).
        record: the record of the folded turns (``app.memory.record``), rendered at most ``summary_max_chars``
            characters long (``summary``).
        pins: pinned decisions, oldest first.
        last_compacted_at: ISO 8601 UTC time of the last applied compaction, or None.
        version: store version, changes on every write (0 for a thread never written).
        gen: store generation, changes whenever summary, pins or notes change (or on clear).
        notes: what a compaction's model proposed to remember (grounded, capped), oldest
            first; shown and sent apart from the person's pinned decisions.
        cleared: how many times the thread was cleared (the store's ``clr``; 0 for a thread never
            cleared).  A turn commits only while it is unchanged (docs/memory.md: "New chat: clearing is final").
        folded_turns: how many person turns were folded into memory so far (the store's ``ft``; 0 for a
            thread never compacted): ``messages`` start at turn ``folded_turns + 1``.  Turn numbers are
            stable across compactions (docs/contract.md: Model context for a turn).
        forgets: how many turns were forgotten so far (the store's ``fg``; docs/memory.md: "Forget and provenance").
        forgotten_turns: the numbers of the forgotten turns (the store's ``fgt``), ascending.
    """

    messages: tuple[ThreadMessage, ...] = ()
    record: Record = Record()
    pins: tuple[Pin, ...] = ()
    last_compacted_at: str | None = None
    version: int = 0
    gen: int = 0
    notes: tuple[str, ...] = ()
    cleared: int = 0
    folded_turns: int = 0
    forgets: int = 0
    forgotten_turns: tuple[int, ...] = ()

    @property
    def summary(self) -> str:
        """The record as text (``Record.render``; "" without lines): what the page shows and the gain rule counts."""
        return self.record.render()

    @property
    def pinned_decisions(self) -> list[str]:
        """The pinned decisions' texts, oldest first."""
        return [p.text for p in self.pins]

    @property
    def is_empty(self) -> bool:
        """True when the thread holds no message, record line, pin or note."""
        return not self.messages and not self.record.lines and not self.pins and not self.notes

    def turns(self) -> list[tuple[ThreadMessage, ...]]:
        """Group messages into whole turns (``group_turns``)."""
        return group_turns(self.messages)

    def turn_numbers(self) -> list[int]:
        """The number of each of ``turns()`` (a turn without its person message shares the number before)."""
        return number_turns(self.turns(), self.folded_turns, self.forgotten_turns)


def number_turns(turns: Iterable[Sequence[ThreadMessage]], before: int, forgotten: Container[int] = ()) -> list[int]:
    """Numbers of whole ``turns`` (oldest first) when ``before`` person turns came earlier: each turn that
    opens with a person message takes the next number that is not a forgotten turn's (``forgotten``: a
    forgotten turn's number is never given again, so later turns keep theirs); one that does not keep the
    current one."""
    numbers, current = [], before
    for turn in turns:
        if turn and turn[0].role == "user":
            current += 1
            while current in forgotten:
                current += 1
        numbers.append(current)
    return numbers
