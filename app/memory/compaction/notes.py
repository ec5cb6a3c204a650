"""Model notes: what a compaction's model proposes to remember, kept only when it is grounded.

A pinned decision is the person's (pinned by the person, kept word for word, never
touched by a compaction).  What the model proposes is a *note*, stored and shown
apart from the person's decisions, and kept only when it:

- states a decision, constraint, preference or conclusion (``states_decision``);
- is not a question and not a bare value ("200", "UTC");
- is grounded in what the person said in the folded turns: at least 60 % of its
  content words (Chinese: character pairs) appear in one of the person's folded
  messages, and every fact in it appears in them too (a restated assistant
  explanation is not the person's decision);
- is not already a pin or a note (``normalize_pin`` compares).

Notes are capped in count and tokens below the person's pins; over the caps the
oldest notes go first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Sequence

from app.memory import words
from app.memory.compaction.facts import extract_facts, fact_present, states_decision
from app.memory.compaction.forms import is_question
from app.memory.state import ThreadMessage
from app.memory.text import CJK_RE
from app.memory.tokens import TokenCounter

GROUNDING_SHARE = 0.6
"""Share of a note's content words (or Chinese character pairs) that must appear in one person message."""
_LIST_MARK_RE = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")


class NoteProblem(StrEnum):
    """Why a proposed note is refused (``NotesMerge.refused``; only their count leaves the domain)."""

    EMPTY = "empty"
    TOO_LONG = "too long"
    QUESTION = "question"
    BARE = "bare value"
    NOT_DECISION = "not a decision"
    UNGROUNDED = "not grounded"
    NEW_FACT = "fact not in the person's words"
    DUPLICATE = "duplicate"


def normalize_pin(text: str) -> str:
    """Compare form of a decision or note: its words (``words.key``: case, punctuation and spacing do not
    count), without a leading list mark."""
    return words.key(_LIST_MARK_RE.sub("", text, count=1))


def grounding(text: str, sources: Sequence[str]) -> float:
    """Largest share (0.0-1.0) of ``text``'s tokens (``words.tokens``) found in one of ``sources``."""
    return words.overlap(text, sources)


def note_problem(text: str, folded: Sequence[ThreadMessage], existing: Sequence[str]) -> NoteProblem | None:
    """Why a proposed note is refused, or None when it is kept.

    Args:
        text: the proposed note, trimmed.
        folded: the folded messages (only the person's are grounds).
        existing: the texts of the pins and notes memory already holds.
    """
    if not text.strip():
        return NoteProblem.EMPTY
    if is_question(text):
        return NoteProblem.QUESTION
    cjk = len(CJK_RE.findall(text))
    if cjk < 4 and len(words.tokens(text, function_words=True)) < 3:
        return NoteProblem.BARE
    if not states_decision(text):
        return NoteProblem.NOT_DECISION
    person = [m.text for m in folded if m.role == "user"]
    if grounding(text, person) < GROUNDING_SHARE:
        return NoteProblem.UNGROUNDED
    said = "\n".join(person)
    if any(not fact_present(f, said) for f in extract_facts(text)):
        return NoteProblem.NEW_FACT
    key = normalize_pin(text)
    if any(normalize_pin(e) == key for e in existing):
        return NoteProblem.DUPLICATE
    return None


@dataclass(frozen=True)
class NotesMerge:
    """The notes after a compaction.

    Attributes:
        notes: the kept notes, oldest first.
        added: the proposals kept.
        refused: ``(proposal, problem)`` for each proposal refused.
        dropped: older notes removed to respect the caps.
    """

    notes: tuple[str, ...]
    added: tuple[str, ...] = ()
    refused: tuple[tuple[str, NoteProblem], ...] = ()
    dropped: tuple[str, ...] = ()


def merge_notes(old: Sequence[str], proposals: Sequence[str], folded: Sequence[ThreadMessage], *,
                pins: Sequence[str], max_count: int, max_chars: int, max_tokens: int,
                counter: TokenCounter) -> NotesMerge:
    """Keep the grounded proposals after the old notes, within ``max_count`` notes and ``max_tokens`` tokens.

    Args:
        old: the notes memory holds, oldest first.
        proposals: what the model proposed (trimmed strings).
        folded: the folded messages (grounds).
        pins: the person's pinned decisions (a note never repeats one).
        max_count: the most notes kept.
        max_chars: the longest note, in characters (longer proposals are refused).
        max_tokens: the most tokens all notes together may cost.
        counter: the model's token counter.
    """
    notes = list(old)
    added: list[str] = []
    refused: list[tuple[str, NoteProblem]] = []
    for proposal in proposals:
        text = " ".join(proposal.split())
        problem = NoteProblem.TOO_LONG if len(text) > max_chars else note_problem(text, folded, [*pins, *notes])
        if problem:
            refused.append((text, problem))
            continue
        notes.append(text)
        added.append(text)
    dropped: list[str] = []
    while notes and (len(notes) > max_count or sum(counter.count(n) for n in notes) > max_tokens):
        dropped.append(notes.pop(0))
    return NotesMerge(tuple(notes), tuple(a for a in added if a in notes), tuple(refused), tuple(dropped))
