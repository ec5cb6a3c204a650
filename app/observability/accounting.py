"""Per-turn token accounting, kept per thread (numbers and message ids only, never text).

Each committed, failed or cancelled turn adds one record to ``mem:{hex}:stats``
(newest first, the last ``MAX_TURN_RECORDS`` kept, with the thread's TTL):

``{"messageId", "status", "at", "promptTokens", "sections": {system, summary, pins, recent, input},
"completionTokens", "completionTokensSource": "provider"|"counted", "budget", "firstTokenMs",
"prompt": [{"origin", "role", "tokens", "ref"}]}``

``prompt`` describes the assembled prompt message by message; ``ref`` is the stored
message id of a recent or input message, so the inspector can show the person's
own texts from their thread without the prompt text ever being stored.
"""

from __future__ import annotations

import json
import logging

from app.memory.state import utc_now_iso
from app.store.keys import ThreadKeys

log = logging.getLogger(__name__)
MAX_TURN_RECORDS = 200


def turn_record(outcome, *, user_message_id: str, counter) -> dict | None:
    """Build the accounting record of a finished turn (None when no prompt was assembled)."""
    context = outcome.context
    if context is None:
        return None
    stats = outcome.stats
    if stats.completion_tokens is not None:
        completion, source = stats.completion_tokens, "provider"
    else:
        completion, source = counter.count(outcome.answer) if outcome.answer else 0, "counted"
    first_ms = outcome.first_token_ms
    return {
        "messageId": outcome.message_id,
        "status": outcome.status,
        "at": utc_now_iso(),
        "promptTokens": context.prompt_tokens,
        "sections": dict(context.sections),
        "completionTokens": completion,
        "completionTokensSource": source,
        "budget": context.budget,
        "firstTokenMs": round(first_ms, 1) if first_ms is not None else None,
        "prompt": [{"origin": m.origin, "role": m.role, "tokens": m.tokens,
                    "ref": user_message_id if m.origin == "input" else m.ref} for m in context.messages],
    }


def record_turn(services, thread_id: str, outcome) -> dict | None:
    """Store a turn's accounting record; returns it.  Store failures are logged, not raised."""
    record = turn_record(outcome, user_message_id=outcome.user_message_id, counter=services.counter)
    if record is None:
        return None
    keys = ThreadKeys(thread_id)
    try:
        pipe = services.redis.pipeline(transaction=False)
        pipe.lpush(keys.stats, json.dumps(record, separators=(",", ":")))
        pipe.ltrim(keys.stats, 0, MAX_TURN_RECORDS - 1)
        pipe.expire(keys.stats, services.settings.memory_ttl_seconds)
        pipe.execute()
    except Exception as exc:  # redis errors: observability never breaks a turn
        log.warning("turn accounting not stored: %s", type(exc).__name__)
    return record


def load_turn_records(services, thread_id: str, limit: int = MAX_TURN_RECORDS) -> list[dict]:
    """The thread's accounting records, oldest first."""
    raw = services.redis.lrange(ThreadKeys(thread_id).stats, 0, limit - 1)
    return [json.loads(r) for r in reversed(raw)]
