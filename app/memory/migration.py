"""The one reader of a thread's stored record, in every shape a version of this project wrote.

The thread hash's ``summary`` field (docs/contract.md: ThreadState) holds one of:

- ``""``: no record (a thread never compacted, or cleared: ``lua/clear_thread.lua`` writes it);
- format 2 (``app.memory.record.FORMAT_VERSION``), what this version writes: a JSON object
  ``{"fmt": 2, "firstTurn", "lastTurn", "lines": [{"kind", "text", "turn", "replacedBy"}]}``
  (``Record.to_stored``);
- format 1, what earlier versions wrote: the record rendered as text, or before records existed
  free text (**older shapes**, read here only)::

      Statements kept from earlier turns:          (or the older "Earlier turns, kept as notes:")
      - About: ...
      - Person (turn 2) [replaced by turn 5]: ...
      - Person: ...                                (a line written before lines had turn numbers)
      (turns 1–5 of this conversation)

  Each labelled line becomes a line of its kind with its numbers; any other ``- `` line a
  ``text`` line; any other text one ``text`` line per sentence (``app.memory.compaction.record.sentences``);
  without the footer the record covers turns 1 to 1.  Rendering what was read gives the same
  text back for every record a version wrote (the header of the oldest records becomes today's).

Nothing is rewritten when it is read: a thread read in format 1 is upgraded by its next
write (a fold or a refinement writes format 2).  A JSON object with a ``fmt`` this version
does not know is refused with ``UnsupportedRecordFormat`` (written by a newer version: the
store reports the thread unreadable rather than guess, and so never overwrites it).
"""

from __future__ import annotations

import json

from app.memory.record import (
    ABOUT,
    ASKED,
    ASSISTANT,
    FORMAT_VERSION,
    HEADER,
    PERSON,
    TEXT,
    TOLD,
    Record,
    RecordLine,
    UnsupportedRecordFormat,
)

EMPTY, TEXT_FORMAT = 0, 1
"""``stored_format`` of an empty field and of a format-1 (text) summary."""
LEGACY_HEADERS = ("Earlier turns, kept as notes:",)
"""Headers of format-1 records written by the oldest versions, read as ``HEADER``."""
_KINDS = {"About": ABOUT, "Asked": ASKED, "Person": PERSON, "Assistant": ASSISTANT, "Told": TOLD}
_FOOTER_HEAD, _FOOTER_TAIL = "(turns ", " of this conversation)"
_TURN_OPEN, _REPLACED_OPEN = " (turn ", " [replaced by turn "


def _versioned(stored: str) -> dict | None:
    """The JSON object of a versioned record (one with a ``fmt`` key), or None for anything else."""
    if not stored.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(stored)
    except ValueError:
        return None
    return data if isinstance(data, dict) and "fmt" in data else None


def stored_format(stored: str) -> int:
    """``EMPTY`` (0), ``TEXT_FORMAT`` (1) or the ``fmt`` of a versioned record (2 for this version's; any
    integer a newer version may write).

    Raises:
        ValueError: a versioned record whose ``fmt`` is not an integer.
    """
    if not stored.strip():
        return EMPTY
    data = _versioned(stored)
    if data is None:
        return TEXT_FORMAT
    if type(data["fmt"]) is not int:
        raise ValueError("a record's fmt is an integer")
    return data["fmt"]


def read_record(stored: str) -> Record:
    """The ``Record`` a thread hash's ``summary`` field holds, whatever version wrote it (module docstring).

    Raises:
        UnsupportedRecordFormat: a ``fmt`` newer than ``FORMAT_VERSION``.
        ValueError: a versioned record that is not of its shape (``Record.from_dict``), or of a ``fmt`` no
            version wrote (below ``FORMAT_VERSION``).
    """
    if not stored.strip():
        return Record()
    data = _versioned(stored)
    if data is None:
        return _read_text(stored)
    fmt = data["fmt"]
    if type(fmt) is not int:
        raise ValueError("a record's fmt is an integer")
    if fmt > FORMAT_VERSION:
        raise UnsupportedRecordFormat(f"record format {fmt} is newer than this version reads ({FORMAT_VERSION})")
    if fmt != FORMAT_VERSION:
        raise ValueError(f"no version wrote a record of format {fmt}")
    return Record.from_dict(data)


# ------------------------------------------------------------------------------------------ format 1


def _read_text(summary: str) -> Record:
    """A format-1 summary (the rendered record, or free text) as a ``Record``."""
    lines = [line.strip() for line in summary.strip().split("\n") if line.strip()]
    first = last = 0
    if lines and (lines[0] == HEADER or lines[0] in LEGACY_HEADERS):
        lines = lines[1:]
    footer = _footer(lines[-1]) if lines else None
    if footer is not None:
        first, last = footer
        lines = lines[:-1]
    read: list[RecordLine] = []
    for line in lines:
        labelled = _labelled(line)
        if labelled is not None:
            read.append(labelled)
        elif line.startswith("- "):
            read.append(RecordLine(TEXT, line[2:].strip()))
        else:
            from app.memory.compaction.record import sentences

            read.extend(RecordLine(TEXT, s) for s in sentences(line))
    return Record(first or 1, last or 1, tuple(line for line in read if line.text))


def _number(text: str) -> int | None:
    """``text`` as a turn number when it is only decimal digits, else None."""
    return int(text) if text.isdecimal() else None


def _footer(line: str) -> tuple[int, int] | None:
    """``(first, last)`` of a ``(turns F–L of this conversation)`` line (an ASCII ``-`` too), else None."""
    if not (line.startswith(_FOOTER_HEAD) and line.endswith(_FOOTER_TAIL)):
        return None
    span = line[len(_FOOTER_HEAD):len(line) - len(_FOOTER_TAIL)]
    for dash in ("–", "-"):
        first, found, last = span.partition(dash)
        if found and _number(first) is not None and _number(last) is not None:
            return int(first), int(last)
    return None


def _labelled(line: str) -> RecordLine | None:
    """A ``- Label (turn N) [replaced by turn M]: text`` line (both numbers optional) as its ``RecordLine``;
    None for any other line."""
    if not line.startswith("- "):
        return None
    rest = line[2:]
    label = next((label for label in _KINDS if rest.startswith(label)), None)
    if label is None:
        return None
    rest = rest[len(label):]
    numbers = []
    for opening, closing in ((_TURN_OPEN, ")"), (_REPLACED_OPEN, "]")):
        number = 0
        if rest.startswith(opening):
            inside, closed, after = rest[len(opening):].partition(closing)
            if not closed or _number(inside) is None:
                return None
            number, rest = int(inside), after
        numbers.append(number)
    if not rest.startswith(": "):
        return None
    return RecordLine(_KINDS[label], rest[2:].strip(), numbers[0], numbers[1])
