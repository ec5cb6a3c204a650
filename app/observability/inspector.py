"""The context inspector: what the model saw for the last turn, message by message, for the person's own thread.

The accounting record keeps no prompt text, only each message's origin, role,
token count, the stored message id (recent and input messages) and a SHA-256
prefix of the content sent.  The texts are resolved here from the thread's
current state:

- ``system``: the deployment's system prompt;
- ``summary`` / ``pins``: the summary and pins system messages as they are now;
- ``recent`` / ``input``: the stored message with that id.

A text is shown only when its hash still matches what was sent.  Otherwise the
entry says why instead (``text`` is null and ``note`` explains): folded into the
summary since, changed by a compaction since, or never kept (a failed or
cancelled turn's input is not written).
"""

from __future__ import annotations

from app.memory.context import format_pins, format_summary
from app.memory.state import ThreadState
from app.memory.status import writes_memory
from app.observability.accounting import content_sha

NOTE_FOLDED = "Folded into the summary since this turn."
NOTE_CHANGED = "Changed by a compaction (or a pin) since this turn."
NOTE_NOT_KEPT = "Not kept in memory: this turn was not written."
NOTE_SYSTEM_CHANGED = "The system prompt has changed since this turn."
NOTE_CLEARED = "No longer in memory."


def _matches(entry: dict, text: str) -> bool:
    sha = entry.get("sha")
    return sha is None or sha == content_sha(text)


def resolve_prompt(record: dict, state: ThreadState, system_prompt: str) -> list[dict]:
    """The prompt of ``record`` as ``[{"origin", "role", "tokens", "text": str|None, "note"?}]``.

    Args:
        record: an accounting record (``accounting.turn_record``) of this thread.
        state: the thread's current state.
        system_prompt: the deployment's system prompt.
    """
    by_id = {m.id: m for m in state.messages}
    written = writes_memory(record.get("status"))
    out = []
    for entry in record.get("prompt") or []:
        origin = entry.get("origin")
        item = {"origin": origin, "role": entry.get("role"), "tokens": entry.get("tokens"), "text": None}
        candidate: str | None
        if origin == "system":
            candidate, note = system_prompt, NOTE_SYSTEM_CHANGED
        elif origin == "summary":
            candidate = format_summary(state.record) if state.record.lines else None
            note = NOTE_CHANGED
        elif origin == "pins":
            candidate = format_pins(state.pinned_decisions) if state.pins else None
            note = NOTE_CHANGED
        else:  # recent, input
            message = by_id.get(entry.get("ref") or "")
            candidate = message.text if message is not None else None
            if message is None:
                if origin == "input" and not written:
                    note = NOTE_NOT_KEPT
                elif state.summary:
                    note = NOTE_FOLDED
                else:
                    note = NOTE_CLEARED
            else:
                note = NOTE_CHANGED
        if candidate is not None and _matches(entry, candidate):
            item["text"] = candidate
        else:
            item["note"] = note
        out.append(item)
    return out
