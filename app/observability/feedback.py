"""Feedback on assistant messages: thumbs up or down, an optional reason, that turn's token accounting.

Kept in ``mem:{hex}:feedback`` (newest first, at most ``MAX_FEEDBACK`` entries, with
the thread's TTL).  One entry per message: a second rating of the same message
replaces the first (the person changed their mind, or added a reason).  Entry::

    {"messageId", "rating": "up"|"down", "reason"?: str, "at": ISO 8601 UTC,
     "turn": {"status", "promptTokens", "sections", "completionTokens", "budget", "firstTokenMs"} | null}
"""

from __future__ import annotations

import json

from app.memory.state import utc_now_iso
from app.store.keys import ThreadKeys

MAX_FEEDBACK = 200
MAX_REASON_CHARS = 500
RATINGS = ("up", "down")
TURN_FIELDS = ("status", "promptTokens", "sections", "completionTokens", "budget", "firstTokenMs")

# KEYS[1] the feedback list.  ARGV: entry JSON, message id, cap, ttl seconds.
# Drops an earlier entry for the same message, pushes the new one, caps the list.  Returns its length.
_STORE_LUA = """
local items = redis.call('LRANGE', KEYS[1], 0, -1)
for i = 1, #items do
  local ok, entry = pcall(cjson.decode, items[i])
  if ok and type(entry) == 'table' and entry['messageId'] == ARGV[2] then
    redis.call('LREM', KEYS[1], 0, items[i])
  end
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[3]) - 1)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
return redis.call('LLEN', KEYS[1])
"""


def feedback_entry(message_id: str, rating: str, reason: str | None, turn: dict | None) -> dict:
    """Build the stored entry (``turn`` is the turn's accounting record, or None)."""
    entry = {"messageId": message_id, "rating": rating, "at": utc_now_iso()}
    if reason:
        entry["reason"] = reason
    entry["turn"] = {k: turn.get(k) for k in TURN_FIELDS} if turn else None
    return entry


def store_feedback(client, thread_id: str, entry: dict, ttl_seconds: int) -> int:
    """Store ``entry`` (replacing the same message's earlier one); returns how many entries are kept.

    Raises:
        redis.RedisError: the store failed.
    """
    key = ThreadKeys(thread_id).feedback
    return int(client.eval(_STORE_LUA, 1, key, json.dumps(entry, ensure_ascii=False, separators=(",", ":")),
                           entry["messageId"], MAX_FEEDBACK, ttl_seconds))


def load_feedback(client, thread_id: str) -> list[dict]:
    """The thread's feedback entries, newest first."""
    return [json.loads(item) for item in client.lrange(ThreadKeys(thread_id).feedback, 0, -1)]
