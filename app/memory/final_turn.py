"""The final-turn adapter: which finished turns enter memory, and in what form.

A finished turn comes from a producer (plain chat, a tool call, an MCP-style
resource read, the task-list agent, the delivery workflow).  Only what the
person was finally told is remembered: the user's text and the final assistant
text, trimmed (``docs/contract.md``, ThreadState; docs/memory.md: "The boundary: what
enters memory").  Which statuses are written is ``TurnStatus.writes_memory``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from app.memory.schemas import MESSAGE_ID_RE
from app.memory.state import ThreadMessage, new_message_id, utc_now_iso
from app.memory.status import TurnStatus
from app.memory.text import grapheme_prefix

SOURCES = frozenset({"chat", "tool", "mcp-resource", "tasklist-agent", "delivery-chain"})
TRUNCATION_NOTICE = "\n\n[Report truncated for memory.]"


class TurnRejected(ValueError):
    """A finished turn that is not written.  ``reason`` is a short machine-readable code."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class FinalTurn:
    """A finished turn as a producer reports it.

    Attributes:
        user_text: what the person sent (must be a non-blank string).
        assistant_text: what the person was finally told (must be a non-blank string).
        status: a ``TurnStatus`` value: ``completed`` (also when None), ``blocked``, ``final``
            are written; ``cancelled``, ``failed``, ``interrupted``, ``paused`` never are.
        source: the producer; used at append time, never stored.
        user_id: the user message id (client-chosen), or None for a fresh one.
        assistant_id: the assistant message id, or None for a fresh one.
    """

    user_text: Any
    assistant_text: Any
    status: str | None = None
    source: str = "chat"
    user_id: str | None = None
    assistant_id: str | None = None


def truncate_delivery_report(text: str, max_chars: int) -> str:
    """Cut a delivery-chain final report to at most ``max_chars`` characters.

    Deterministic: the longest prefix of whole grapheme clusters that leaves room for
    ``TRUNCATION_NOTICE``, trailing whitespace removed, then the notice.  The cut never
    splits what a person sees as one character (an emoji ZWJ sequence, a flag, a letter
    with its accents), so no dangling U+200D or lone modifier is stored.
    """
    if len(text) <= max_chars:
        return text
    prefix = grapheme_prefix(text, max_chars - len(TRUNCATION_NOTICE)).rstrip()
    return prefix + TRUNCATION_NOTICE


def _clean_text(value: Any, which: str) -> str:
    if not isinstance(value, str):
        raise TurnRejected("invalid_text", f"{which} text must be a string, got {type(value).__name__}")
    cleaned = value.strip()
    if not cleaned:
        raise TurnRejected("blank_text", f"{which} text is blank")
    try:
        cleaned.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: it could never be stored or sent
        raise TurnRejected("invalid_text", f"{which} text is not valid Unicode") from None
    return cleaned


def _check_ids(user_id: Any, assistant_id: Any) -> None:
    # An id the stored-state schema refuses would make the whole thread unreadable.
    for which, value in (("user", user_id), ("assistant", assistant_id)):
        if value is not None and (not isinstance(value, str) or not MESSAGE_ID_RE.match(value)):
            raise TurnRejected("invalid_id", f"{which} message id is not a valid id")
    if user_id is not None and user_id == assistant_id:
        raise TurnRejected("invalid_id", "the user and assistant messages need different ids")


def prepare_final_turn(
    turn: FinalTurn,
    *,
    delivery_max_chars: int = 8000,
    now: Callable[[], str] = utc_now_iso,
    new_id: Callable[[], str] = new_message_id,
) -> tuple[ThreadMessage, ThreadMessage]:
    """Turn a finished turn into the two messages to append.

    Returns:
        ``(user_message, assistant_message)`` with trimmed texts and ids.

    Raises:
        TurnRejected: the status is not written (``reason="not_final"``) or unknown
            (``"unknown_status"``), the source is unknown (``"unknown_source"``), a text is not
            a string, not valid Unicode or blank (``"invalid_text"``, ``"blank_text"``), or an id
            is malformed or shared by both messages (``"invalid_id"``).
    """
    status = TurnStatus.parse(turn.status or TurnStatus.COMPLETED)
    if status is None:
        raise TurnRejected("unknown_status", f"unknown turn status {turn.status!r}")
    if not status.writes_memory:
        raise TurnRejected("not_final", f"a {status} turn is not written")
    if turn.source not in SOURCES:
        raise TurnRejected("unknown_source", f"unknown turn source {turn.source!r}")
    _check_ids(turn.user_id, turn.assistant_id)
    user_text = _clean_text(turn.user_text, "user")
    assistant_text = _clean_text(turn.assistant_text, "assistant")
    if turn.source == "delivery-chain":
        assistant_text = truncate_delivery_report(assistant_text, delivery_max_chars)
    created = now()
    user = ThreadMessage(turn.user_id or new_id(), "user", user_text, created)
    assistant = ThreadMessage(turn.assistant_id or new_id(), "assistant", assistant_text, created)
    return user, assistant
