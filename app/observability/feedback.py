"""Feedback on assistant messages: thumbs up or down, an optional reason, that turn's token accounting.

Kept in ``mem:{hex}:feedback`` (newest first, at most ``MAX_FEEDBACK`` entries, with
the thread's TTL).  One entry per message: a second rating of the same message
replaces the first (the person changed their mind, or added a reason).  Entry::

    {"messageId", "rating": "up"|"down", "reason"?: str, "at": ISO 8601 UTC,
     "turn": {"status", "promptTokens", "sections", "completionTokens", "budget", "firstTokenMs"} | null}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.memory.state import utc_now_iso
from app.store.feedback_store import FeedbackStore

if TYPE_CHECKING:
    from app.store.redis_client import StoreClient

MAX_FEEDBACK = 200
MAX_REASON_CHARS = 500
RATINGS = ("up", "down")
TURN_FIELDS = ("status", "promptTokens", "sections", "completionTokens", "budget", "firstTokenMs")


def feedback_entry(message_id: str, rating: str, reason: str | None, turn: dict | None) -> dict:
    """Build the stored entry (``turn`` is the turn's accounting record, or None)."""
    entry: dict[str, Any] = {"messageId": message_id, "rating": rating, "at": utc_now_iso()}
    if reason:
        entry["reason"] = reason
    entry["turn"] = {k: turn.get(k) for k in TURN_FIELDS} if turn else None
    return entry


def store_feedback(client: StoreClient, thread_id: str, entry: dict, ttl_seconds: int) -> int:
    """Store ``entry`` (replacing the same message's earlier one); returns how many entries are kept.

    Raises:
        redis.RedisError: the store failed.
    """
    return FeedbackStore(client).put(thread_id, entry, MAX_FEEDBACK, ttl_seconds)


def load_feedback(client: StoreClient, thread_id: str) -> list[dict]:
    """The thread's feedback entries, newest first."""
    return FeedbackStore(client).load(thread_id)
