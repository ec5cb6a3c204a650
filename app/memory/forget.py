"""What forgetting a turn changes in a thread's memory, in pure Python (docs/memory.md: "Forget and provenance";
docs/contract.md: Forget).

A thread keeps a turn in four places: the recent messages, the archive of folded turns, the record
(``app.memory.record``: lines numbered by the turn they came from) and the model's notes (plain strings
written by a refinement, without turn numbers).  ``plan_forget`` computes what the store's one script
(``lua/forget_turn.lua``) writes:

* the ids of the turn's recent messages (the script removes them);
* the record without every line of that turn (``RecordLine.turn == n``); a line that said it was
  ``replacedBy`` that turn is kept with ``replacedBy`` cleared;
* the notes without those that *quote* the forgotten text, and the record's lines without a turn number
  (0: written before lines had numbers) that quote it.

**The quoting rule** (``quotes``).  Texts are compared by their retrieval tokens (``words.tokens``:
NFKC, case-folded, function words out; an identifier such as ``zebra-4471`` also gives its parts).  A text quotes the forgotten turn when it holds a token that the
forgotten turn holds and that nothing else memory keeps (the other recent and archived turns) holds, or
when at least half of its tokens are tokens of the forgotten turn.  A phrase forget (``phrase``) also
removes every note and unnumbered line that contains the phrase (``phrase_form``).

The person's pins are never removed; ``pins_quoting`` says which quote the forgotten text (same rule).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Collection, Iterable, Sequence

from app.memory.record import Record, RecordLine
from app.memory.state import ThreadMessage, ThreadState
from app.memory.words import tokens as tokenize

_ID_PARTS_RE = re.compile(r"[-_./:#@]")


def with_parts(tokens: Iterable[str]) -> list[str]:
    """``tokens`` with the parts of each identifier too (``zebra-4471`` also gives ``zebra``, ``4471``)."""
    out = []
    for token in tokens:
        out.append(token)
        if any(c in token for c in "-_./:#@"):
            out.extend(p for p in _ID_PARTS_RE.split(token) if len(p) > 1)
    return out


def _words(text: str) -> list[str]:
    """``tokenize(text)`` with the parts of each identifier too (``with_parts``)."""
    return with_parts(tokenize(text))


QUOTE_SHARE = 0.5
"""A text whose tokens are at least this share tokens of the forgotten turn quotes it."""
PHRASE_MAX_CHARS = 200
"""Longest phrase a forget by phrase takes."""


def phrase_form(text: str) -> str:
    """The compare form of a phrase search: NFKC then casefold (Chinese compares as written)."""
    return unicodedata.normalize("NFKC", text).casefold()


def contains_phrase(text: str, phrase: str) -> bool:
    """True when ``text`` holds ``phrase`` (both in ``phrase_form``; a blank phrase matches nothing)."""
    needle = phrase_form(phrase).strip()
    return bool(needle) and needle in phrase_form(text)


@dataclass(frozen=True)
class Quoting:
    """The tokens of a forgotten turn: all of them, and those nothing else memory keeps holds."""

    tokens: frozenset[str]
    own: frozenset[str]

    @classmethod
    def of(cls, forgotten: Iterable[str], kept: Iterable[str]) -> "Quoting":
        """From the forgotten turn's texts and every other text memory keeps (recent and archived turns)."""
        return cls.of_tokens((_words(text) for text in forgotten), (_words(text) for text in kept))

    @classmethod
    def of_tokens(cls, forgotten: Iterable[Iterable[str]], kept: Iterable[Iterable[str]]) -> "Quoting":
        """From the tokens (``words.tokens``) of the forgotten turns' texts and of every other text memory keeps,
        e.g. an archive index's term counts (no text is tokenised again); identifier parts are added here."""
        tokens = frozenset(t for group in forgotten for t in with_parts(group))
        others: set[str] = set()
        for group in kept:
            others.update(t for t in with_parts(group) if t in tokens)
        return cls(tokens, tokens - others)

    def quotes(self, text: str) -> bool:
        """True when ``text`` quotes the forgotten turn (module docstring: the quoting rule)."""
        words = _words(text)
        if not words or not self.tokens:
            return False
        if any(w in self.own for w in words):
            return True
        return sum(w in self.tokens for w in words) >= QUOTE_SHARE * len(words)


@dataclass(frozen=True)
class ForgetPlan:
    """What forgetting turns ``turns`` writes.

    Attributes:
        turn: the first turn number.
        message_ids: ids of the turns' messages among the recent ones (the script removes them).
        record: the record without the turn's lines, or None when no line changes.
        notes: the notes as they are to be stored.
        record_lines: how many record lines go.
        notes_removed: how many notes go.
        pins_quoting: 1-based numbers of the pins quoting the forgotten text (never removed).
    """

    turn: int
    message_ids: tuple[str, ...]
    record: Record | None
    notes: tuple[str, ...]
    record_lines: int
    notes_removed: int
    pins_quoting: tuple[int, ...]
    turns: tuple[int, ...] = ()


def recent_turn(state: ThreadState, turn: int) -> tuple[ThreadMessage, ...]:
    """The messages of turn ``turn`` among the recent ones (a tuple; empty when not there)."""
    return tuple(m for msgs, n in zip(state.turns(), state.turn_numbers(), strict=True) for m in msgs if n == turn)


def _line_goes(line: RecordLine, turns: Collection[int], quoting: Quoting, phrase: str | None) -> bool:
    if line.turn in turns:
        return True
    if line.turn:
        return False
    return quoting.quotes(line.text) or (phrase is not None and contains_phrase(line.text, phrase))


def plan_forget(state: ThreadState, turn: int | Collection[int], *, forgotten: Sequence[str] = (),
                kept: Iterable[str] = (), quoting: Quoting | None = None, phrase: str | None = None) -> ForgetPlan:
    """What forgetting ``turn`` (one number, or several forgotten together) changes (module docstring).

    Linear in what memory keeps, once, whatever the number of turns: every text is read once (``quoting``
    given: not at all), every record line, note and pin is compared once.

    Args:
        state: the thread as read (its ``gen`` is what the script compares).
        turn: the turn number, or the turn numbers (1-based, as record lines and archive scores count).
        forgotten: the turns' texts (person messages and answers), from the recent messages or the archive.
        kept: every other text of the recent and archived turns.
        quoting: instead of ``forgotten`` and ``kept``, their tokens already compared (``Quoting.of_tokens``).
        phrase: with a forget by phrase, the phrase (notes and unnumbered lines holding it go too).
    """
    turns = frozenset((turn,) if isinstance(turn, int) else turn)
    if quoting is None:
        quoting = Quoting.of(forgotten, kept)
    ids = tuple(m.id for msgs, n in zip(state.turns(), state.turn_numbers(), strict=True) if n in turns for m in msgs)
    lines, dropped = [], 0
    for line in state.record.lines:
        if _line_goes(line, turns, quoting, phrase):
            dropped += 1
        elif line.replaced_by in turns:
            lines.append(RecordLine(line.kind, line.text, line.turn, 0))
        else:
            lines.append(line)
    changed = dropped or len(lines) != len(state.record.lines) or any(
        a is not b for a, b in zip(lines, state.record.lines, strict=False))
    record = Record(state.record.first_turn, state.record.last_turn, tuple(lines)) if changed else None
    notes = tuple(n for n in state.notes
                  if not (quoting.quotes(n) or (phrase is not None and contains_phrase(n, phrase))))
    pins = tuple(i for i, pin in enumerate(state.pins, 1)
                 if quoting.quotes(pin.text) or (phrase is not None and contains_phrase(pin.text, phrase)))
    ordered = tuple(sorted(turns))
    return ForgetPlan(ordered[0] if ordered else 0, ids, record, notes, dropped, len(state.notes) - len(notes),
                      pins, ordered)
