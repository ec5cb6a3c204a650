"""The browser's view of a thread and the forbidden-key guard (docs/contract.md: HTTP).

``GET /api/chat/thread`` returns ``build_hydration(...)`` after
``assert_no_forbidden_keys`` has checked every key at every depth.  Values are
never inspected: a message may say "tasklist".
"""

from __future__ import annotations

from typing import Iterable

from app.memory.schemas import SUMMARY_PREVIEW_CHARS
from app.memory.state import ThreadState

FORBIDDEN_KEYS = (
    "apiKey", "checkpoint", "cookie", "deliveryChain", "displayKind", "graphState", "mcpEnvelope",
    "providerConfig", "providerResponse", "rawCheckpoint", "rawPrompt", "resourceContent",
    "runtimeArtifact", "sessionId", "source", "stack", "subagentInvocation", "subagentResult",
    "toolArgs", "toolCall", "toolMessage", "toolResult", "turnId", "tasklist", "workflowProgress",
)


def normalize_key(key: str) -> str:
    """Compare form of a key: lower case, ``_`` and ``-`` removed."""
    return key.lower().replace("_", "").replace("-", "")


_FORBIDDEN = frozenset(normalize_key(k) for k in FORBIDDEN_KEYS)


class ForbiddenKeyError(ValueError):
    """A response would carry a forbidden key.  ``path`` names where, e.g. ``messages[0].rawCheckpoint``."""

    def __init__(self, path: str):
        super().__init__(f"forbidden key at {path}")
        self.path = path


def find_forbidden_key(value: object, path: str = "$") -> str | None:
    """Return the path of the first forbidden key in a JSON-like value, or None."""
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}"
            if normalize_key(str(key)) in _FORBIDDEN:
                return here
            found = find_forbidden_key(item, here)
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = find_forbidden_key(item, f"{path}[{i}]")
            if found:
                return found
    return None


def assert_no_forbidden_keys(value: object) -> None:
    """Raise ``ForbiddenKeyError`` naming the first forbidden key found in ``value``."""
    found = find_forbidden_key(value)
    if found:
        raise ForbiddenKeyError(found)


def build_hydration(thread_id: str, state: ThreadState, *, restored: bool | None = None,
                    archived: Iterable = (), earliest_kept_turn: int | None = None) -> dict:
    """Return the hydration DTO.

    Shape: ``{"threadId", "messages": [{id, role, text, createdAt}], "archived"?: [{id, role, text,
    createdAt}], "summaryPreview"?, "summary"?, "record"?: {"firstTurn", "lastTurn", "lines": [{"kind", "text",
    "turn", "replacedBy"}]}, "pinnedDecisions": [str], "modelNotes"?: [str], "restored": bool}``; ``archived``
    are the messages of the newest folded turns the thread's archive holds (``archived``: ``ArchivedTurn``s,
    oldest first; the page shows them dimmed above ``messages``), absent when there are none; ``summary`` is
    the record rendered as text (``Record.render``; at most ``MEMORY_SUMMARY_MAX_CHARS`` once written by this
    version), ``summaryPreview`` its first 240 characters and ``record`` the same record as data
    (``Record.to_dict``), all three absent when the record has no line;
    ``pinnedDecisions`` are the person's; ``modelNotes`` (what compactions proposed to
    remember) is absent when there are none; ``earliestKeptTurn`` is the number of the earliest turn memory still
    holds word for word (``app.store.archive.Archive.earliest_kept_turn``; absent for a thread without turns).
    """
    dto = {
        "threadId": thread_id,
        "messages": [m.to_dict() for m in state.messages],
        "pinnedDecisions": state.pinned_decisions,
        "restored": (not state.is_empty) if restored is None else restored,
    }
    if earliest_kept_turn is not None:
        dto["earliestKeptTurn"] = earliest_kept_turn
    folded = [m.to_dict() for turn in archived for m in turn.messages]
    if folded:
        dto["archived"] = folded
    if state.record.lines:
        summary = state.record.render()
        dto["summaryPreview"] = summary[:SUMMARY_PREVIEW_CHARS]
        dto["summary"] = summary
        dto["record"] = state.record.to_dict()
    if state.notes:
        dto["modelNotes"] = list(state.notes)
    return dto


def empty_hydration(thread_id: str) -> dict:
    """The DTO of a thread that holds nothing, or of any thread while the store is down."""
    return build_hydration(thread_id, ThreadState(), restored=False)
