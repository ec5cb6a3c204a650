"""The record of the earlier conversation as data: its lines, how it renders, its stored form.

A thread's record (``ThreadState.record``) is a turn range and a list of lines, each a
``RecordLine`` (kind, text, turn number, the turn that replaced it).  It is stored as
JSON in the thread hash's ``summary`` field (docs/contract.md: ThreadState)::

    {"fmt": 2, "firstTurn": 1, "lastTurn": 5,
     "lines": [{"kind": "person", "text": "The dinner is on Friday.", "turn": 2, "replacedBy": 5}, ...]}

and rendered to text only when a prompt (``app.memory.context``) or the page
(``app.memory.hydration``) is built: ``Record.render`` is the only producer of that text::

    Statements kept from earlier turns:
    - About: The person introduced themselves and planned a dinner.
    - Person (turn 2) [replaced by turn 5]: The dinner is on Friday.
    - Assistant (turn 3): Redis listens on port 6379 by default.
    (turns 1–5 of this conversation)

Nothing reads memory back from that text.  Summaries stored by earlier versions (the rendered
text itself, or free text) are read by ``app.memory.migration`` only, the one reader of stored
shapes; what a compaction or refinement writes is always this format (``FORMAT_VERSION``), so a
thread read in an older shape is upgraded on its next write.  Which lines a record holds and
how it is fitted to its limits is ``app.memory.compaction.record``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property


class LineKind(StrEnum):
    """What a record line says (``RecordLine.kind``): its member is the very string stored as the line's
    ``kind`` and sent in the page's ``record`` (docs/contract.md: ThreadState)."""

    ABOUT = "about"
    """The model's gist of a fold (rendered ``- About: ...``, without a turn number)."""
    ASKED = "asked"
    """The opening of a person's message that carried no statement."""
    PERSON = "person"
    """A sentence the person wrote."""
    ASSISTANT = "assistant"
    """A sentence of an answer."""
    TOLD = "told"
    """An answer's sentence the person accepted (read in older records, kept)."""
    TEXT = "text"
    """A line of an earlier free-text summary (rendered without a label)."""


ABOUT, ASKED, PERSON, ASSISTANT, TOLD, TEXT = (LineKind.ABOUT, LineKind.ASKED, LineKind.PERSON, LineKind.ASSISTANT,
                                               LineKind.TOLD, LineKind.TEXT)
KINDS = tuple(LineKind)
LABELS: dict[str, str] = {ABOUT: "About", ASKED: "Asked", PERSON: "Person", ASSISTANT: "Assistant", TOLD: "Told"}
"""The label a line of each kind renders with (a ``text`` line has none)."""
HEADER = "Statements kept from earlier turns:"
FOOTER = "(turns {first}–{last} of this conversation)"
FORMAT_VERSION = 2
"""The stored form's ``fmt``.  Version 1 is the rendered text earlier versions stored (``app.memory.migration``)."""


class UnsupportedRecordFormat(ValueError):
    """A stored record has a ``fmt`` this version does not read (written by a newer version).  Its text is for
    logs only; the store reports the thread as unreadable (``CorruptState``) and never overwrites it."""


@dataclass(frozen=True)
class RecordLine:
    """One statement of the record.

    Attributes:
        kind: a ``LineKind`` (a plain string equal to one is the same kind): ``about`` (the model's gist of a
            fold), ``asked``, ``person``, ``assistant``, ``told`` (an answer's sentence the person accepted), or
            ``text`` (a line of an earlier free-text summary).
        text: the statement, one line, without its label.
        turn: the number of the turn it comes from (0: not known, e.g. a line written before lines had numbers).
        replaced_by: the number of the later turn whose line replaced this one (0: none).
    """

    kind: str
    text: str
    turn: int = 0
    replaced_by: int = 0

    def render(self) -> str:
        """``- Person (turn 3): ...``, ``- Person (turn 3) [replaced by turn 7]: ...``, ``- About: ...`` or ``- ...``."""
        label = LABELS.get(self.kind)
        if not label:
            return f"- {self.text}"
        number = f" (turn {self.turn})" if self.turn and self.kind != ABOUT else ""
        replaced = f" [replaced by turn {self.replaced_by}]" if self.replaced_by else ""
        return f"- {label}{number}{replaced}: {self.text}"

    def to_dict(self) -> dict:
        """``{"kind", "text", "turn": int | None, "replacedBy": int | None}`` (None: not known / not replaced)."""
        return {"kind": self.kind, "text": self.text, "turn": self.turn or None, "replacedBy": self.replaced_by or None}

    @classmethod
    def from_dict(cls, data: object) -> "RecordLine":
        """The line of a stored ``to_dict`` form.

        Raises:
            ValueError: not that shape (an unknown key or kind, a text that is not a string, a turn that is not a
                positive integer or null).
        """
        if not isinstance(data, dict) or not {"kind", "text"} <= data.keys() <= {"kind", "text", "turn", "replacedBy"}:
            raise ValueError("a record line is {kind, text, turn, replacedBy}")
        kind, text = data["kind"], data["text"]
        if kind not in KINDS:
            raise ValueError("a record line's kind is unknown")
        if not isinstance(text, str):
            raise ValueError("a record line's text is a string")
        return cls(LineKind(kind), text, _turn(data.get("turn")), _turn(data.get("replacedBy")))


def _turn(value: object) -> int:
    if value is None:
        return 0
    if type(value) is not int or value < 1:
        raise ValueError("a turn number is a positive integer or null")
    return value


@dataclass(frozen=True)
class Record:
    """The record: the turn range it covers and its lines, oldest first.

    Attributes:
        first_turn: number of the first folded turn (1 once anything was folded, 0 for none).
        last_turn: number of the last folded turn.
        lines: the statements, oldest first.
    """

    first_turn: int = 0
    last_turn: int = 0
    lines: tuple[RecordLine, ...] = field(default=())

    def render(self) -> str:
        """The summary text ("" for a record without lines): the header, the lines, the turn range."""
        return self._text

    @cached_property
    def _text(self) -> str:
        if not self.lines:
            return ""
        footer = FOOTER.format(first=max(self.first_turn, 1), last=max(self.last_turn, 1))
        return "\n".join([HEADER, *(line.render() for line in self.lines), footer])

    def to_dict(self) -> dict:
        """``{"firstTurn", "lastTurn", "lines": [RecordLine.to_dict()]}`` (the page's ``record``; docs/contract.md)."""
        return {"firstTurn": self.first_turn, "lastTurn": self.last_turn,
                "lines": [line.to_dict() for line in self.lines]}

    def to_stored(self) -> str:
        """The stored form: ``to_dict`` with ``"fmt": FORMAT_VERSION`` first, as compact JSON."""
        return json.dumps({"fmt": FORMAT_VERSION, **self.to_dict()}, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: object) -> "Record":
        """The record of a stored form of ``FORMAT_VERSION`` (``fmt`` included or not).

        Raises:
            ValueError: not that shape (``RecordLine.from_dict``; turn numbers not integers of at least 0).
        """
        if not isinstance(data, dict) or not {"firstTurn", "lastTurn", "lines"} <= data.keys() \
                <= {"fmt", "firstTurn", "lastTurn", "lines"}:
            raise ValueError("a record is {fmt, firstTurn, lastTurn, lines}")
        first, last, lines = data["firstTurn"], data["lastTurn"], data["lines"]
        if type(first) is not int or type(last) is not int or first < 0 or last < 0:
            raise ValueError("a record's turn range is two integers of at least 0")
        if not isinstance(lines, list):
            raise ValueError("a record's lines are a list")
        return cls(first, last, tuple(RecordLine.from_dict(line) for line in lines))
