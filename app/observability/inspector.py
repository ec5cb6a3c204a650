"""The context inspector: what the model saw for the last turn, message by message, for the person's own thread.

The accounting record keeps no prompt text, only each message's origin, role,
token count, the stored message id (recent, folded and input messages), a SHA-256
prefix of the content sent, and the turn numbers that rebuild the parts made from
memory (``app.observability.accounting``).  The texts are resolved here from the
thread's current state and its archive of folded turns, so a turn's prompt stays
visible after that turn's fold:

- ``system``: the deployment's system prompt;
- ``summary``: the record as it is now, else rebuilt as the prompt showed it (the current
  record's lines up to the last turn it showed then, with the current notes);
- ``pins``: the pins message as it is now;
- ``recent`` / ``folded`` / ``input``: the message with that id, in the thread or in its archive;
- ``recall``: the excerpts rebuilt from the archived turns they came from, leaving out what the
  rest of that prompt held (docs/contract.md: Model context for a turn).

A text is shown only when its hash matches what was sent.  Otherwise the entry says why
instead (``text`` is null and ``note`` explains): rewritten since (a refinement, a pin or a
forget), folded into the summary and no longer in the archive, no longer in memory, or never
kept (a failed or cancelled turn's input is not written).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from app.memory.context import format_pins, format_summary
from app.memory.recall import ArchiveIndex, format_recall, recall
from app.memory.record import Record
from app.memory.state import ThreadState
from app.memory.status import writes_memory
from app.observability.accounting import content_sha

if TYPE_CHECKING:
    from app.memory.tokens import TokenCounter

NOTE_FOLDED = "Folded into the summary since this turn."
NOTE_CHANGED = "Changed since this turn (by a refinement, a pin or a forget)."
NOTE_NOT_KEPT = "Not kept in memory: this turn was not written."
NOTE_SYSTEM_CHANGED = "The system prompt has changed since this turn."
NOTE_CLEARED = "No longer in memory."
NOTE_RECALL_CHANGED = "Recalled from the archive (turns {turns}); changed since this turn (a refinement or a forget)."


def _matches(entry: dict, text: str) -> bool:
    sha = entry.get("sha")
    return sha is None or sha == content_sha(text)


def record_up_to(record: Record, last: int) -> Record:
    """``record`` as it was when its last folded turn was ``last``: its lines of turns up to ``last``, a line
    replaced by a later turn shown again (``Record()`` when no line is left)."""
    if last >= record.last_turn:
        return record
    lines = tuple(replace(line, replaced_by=0) if line.replaced_by > last else line
                  for line in record.lines if line.turn <= last)
    if not lines or last < 1:
        return Record()
    return replace(record, last_turn=last, lines=lines)


def _summary_candidates(record: dict, state: ThreadState) -> list[str]:
    """The record message as it is now, then as the turn's prompt showed it (rebuilt), when they differ."""
    out = [format_summary(state.record, state.notes)] if state.record.lines or state.notes else []
    shown = record.get("recordShown")
    if isinstance(shown, int) and not isinstance(shown, bool):
        before = record_up_to(state.record, shown)
        if before.lines or state.notes:
            out.append(format_summary(before, state.notes))
    return out


def _recalled(record: dict, entry: dict, held: list[str], query: str | None, state: ThreadState,
              archive: ArchiveIndex | None, counter: TokenCounter | None) -> tuple[str | None, str]:
    """The recall message rebuilt from its archived turns, or ``(None, note)``."""
    turns = [n for n in record.get("recallTurns") or [] if isinstance(n, int) and not isinstance(n, bool)]
    listed = ", ".join(str(n) for n in turns) or "?"
    note = NOTE_RECALL_CHANGED.format(turns=listed)
    if archive is None or counter is None or query is None or not turns:
        return None, note
    index = ArchiveIndex()
    index.add(t for t in archive.turns if t.number in set(turns))
    if [t.number for t in index.turns] != turns:
        return None, NOTE_CLEARED
    last = record.get("recordLast")
    full = record_up_to(state.record, last) if isinstance(last, int) and not isinstance(last, bool) else state.record
    held_then = [full.render(), *state.notes, *state.pinned_decisions, *held]
    excerpts = recall(index, query, held=held_then, max_tokens=int(entry.get("tokens") or 0), counter=counter,
                      max_excerpts=len(turns))
    return (format_recall(excerpts) if excerpts else None), note


def resolve_prompt(record: dict, state: ThreadState, system_prompt: str, archive: ArchiveIndex | None = None,
                   counter: TokenCounter | None = None, shown: Callable[[str], str] | None = None) -> list[dict]:
    """The prompt of ``record`` as ``[{"origin", "role", "tokens", "text": str|None, "note"?}]``.

    Args:
        record: an accounting record (``accounting.turn_record``) of this thread.
        state: the thread's current state.
        system_prompt: the deployment's system prompt.
        archive: the thread's archive of folded turns (``app.store.archive.load_turn_memory``); None: a message
            folded since the turn, and the recalled excerpts, are not shown.
        counter: the model's token counter (needed to rebuild the recalled excerpts).
        shown: how an earlier answer was shown in the prompt (``app.memory.context.shorten_answer`` with the
            deployment's ``MEMORY_PROMPT_ANSWER_MAX_TOKENS``); None: answers were shown whole.
    """
    by_id = {m.id: m for m in state.messages}
    if archive is not None:
        for turn in archive.turns:
            for m in turn.messages:
                by_id.setdefault(m.id, m)
    written = writes_memory(record.get("status"))
    prompt = [e for e in record.get("prompt") or [] if isinstance(e, dict)]
    out = []
    texts: dict[int, str] = {}  # the text as the model saw it
    full: dict[int, str] = {}  # the message's whole text
    for i, entry in enumerate(prompt):
        origin = entry.get("origin")
        if origin in ("system", "summary", "pins", "recall"):
            continue
        message = by_id.get(entry.get("ref") or "")
        if message is None:
            continue
        seen = [message.text]
        if shown is not None and message.role == "assistant" and origin in ("recent", "folded"):
            seen.append(shown(message.text))
        match = next((text for text in seen if _matches(entry, text)), None)
        if match is not None:
            texts[i], full[i] = match, message.text
    query = next((texts.get(i) for i, e in enumerate(prompt) if e.get("origin") == "input"), None)
    for i, entry in enumerate(prompt):
        origin = entry.get("origin")
        item = {"origin": origin, "role": entry.get("role"), "tokens": entry.get("tokens"), "text": None}
        candidates: list[str] = []
        if origin == "system":
            candidates, note = [system_prompt], NOTE_SYSTEM_CHANGED
        elif origin == "summary":
            candidates, note = _summary_candidates(record, state), NOTE_CHANGED
        elif origin == "pins":
            candidates, note = ([format_pins(state.pinned_decisions)] if state.pins else []), NOTE_CHANGED
        elif origin == "recall":
            held = [t for j, t in full.items() if prompt[j].get("origin") in ("recent", "folded")]
            text, note = _recalled(record, entry, held, query, state, archive, counter)
            candidates = [text] if text is not None else []
        else:  # recent, folded, input
            if i in texts:
                candidates = [texts[i]]
            if origin == "input" and not written:
                note = NOTE_NOT_KEPT
            elif (entry.get("ref") or "") in by_id:
                note = NOTE_CHANGED
            else:  # in neither the thread nor the archive (capped, or not read)
                note = NOTE_FOLDED if state.summary else NOTE_CLEARED
        found = next((c for c in candidates if _matches(entry, c)), None)
        if found is not None:
            item["text"] = found
        else:
            item["note"] = note
        out.append(item)
    return out
