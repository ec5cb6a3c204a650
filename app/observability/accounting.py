"""Per-turn token accounting, kept per thread (numbers, message ids and hash prefixes only, never text).

Each finished turn (completed, blocked, cancelled, failed, or interrupted when the
socket closed) adds one record to ``mem:{hex}:stats`` (newest first, the last
``MAX_TURN_RECORDS`` kept, with the thread's TTL):

``{"messageId", "status", "at", "promptTokens", "sections": {system, summary, pins, recall, recent, input},
"completionTokens", "completionTokensSource": "provider"|"counted", "budget", "firstTokenMs",
"prompt": [{"origin", "role", "tokens", "ref", "sha"}], "recordLast", "recordShown", "recallTurns"}``

``sections`` holds every section that was sent, in tokens, and adds up to ``promptTokens``.  The folded
turns a prompt showed word for word after the record (``MEMORY_PROMPT_FOLD_STEP``; docs/contract.md: Model
context for a turn) count as ``summary``, with the record they stand for, not as ``recent``: their prompt
entries have the origin ``folded``.  So the meter's summary figure covers every line the panel lists.

``prompt`` describes the assembled prompt message by message; ``ref`` is the stored
message id of a recent, folded or input message and ``sha`` the first 16 hex characters of
the SHA-256 of the content sent, so the inspector can show what the model saw from the
thread and its archive (and say when one changed since) without the prompt text ever
being stored.  For the parts made from memory rather than stored as they are, the record
keeps the turn numbers that rebuild them (``app.observability.inspector``): ``recordLast``
the last turn the stored record held, ``recordShown`` the last turn of it the prompt's record
showed, ``recallTurns`` the turns the recalled excerpts came from.  ``GET /api/chat/stats``
serves the records without these (``public_turn``).

The same function logs the prompt at DEBUG: lengths, token counts and hash prefixes;
the text only when ``MEMORY_DEBUG_LOG_CONTENT=1``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from app.memory.state import thread_label, utc_now_iso
from app.observability import metrics
from app.store.compaction_history import HISTORY_MAX, HistoryStep
from app.store.keys import ThreadKeys

if TYPE_CHECKING:  # the layer above, for types only (docs/architecture.md)
    from app.chat.turn import TurnOutcome
    from app.extensions import Services
    from app.memory.context import AssembledContext
    from app.memory.state import ThreadState
    from app.memory.tokens import TokenCounter

log = logging.getLogger(__name__)
MAX_TURN_RECORDS = 200
SHA_CHARS = 16
PUBLIC_TURN_FIELDS = ("messageId", "status", "at", "promptTokens", "sections", "completionTokens",
                      "completionTokensSource", "budget", "firstTokenMs")
COMPACTION_FIELDS = ("at", "outcome", "reason", "step", "turnsFolded", "turnsRefined", "modelCalls", "promptTokens",
                     "tokensBefore", "tokensAfter", "summaryChars",
                     "notesCount", "factRetention", "factsChecked", "factsDropped", "factsSkipped", "unreadShare",
                     "durationMs", "forgottenTurn", "droppedTurns", "message")


def content_sha(text: str) -> str:
    """The first ``SHA_CHARS`` hex characters of the SHA-256 of ``text`` (UTF-8)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:SHA_CHARS]


FOLDED = "folded"
"""The prompt entry origin of a folded turn's message shown word for word after the record."""
TURN_REF = re.compile(r"\(turn (\d+)\)")
"""A turn number as recalled excerpts name it (docs/contract.md: Model context for a turn)."""


def _prompt_entries(context: AssembledContext, state: ThreadState | None,
                    user_message_id: str | None) -> tuple[list[dict], dict]:
    """The prompt's entries and the sections with the folded turns shown word for word counted as ``summary``."""
    stored = {m.id for m in state.messages} if state is not None else None
    sections = {k: int(v) for k, v in context.sections.items()}
    entries = []
    for m in context.messages:
        origin = m.origin
        if origin == "recent" and stored is not None and m.ref not in stored:
            origin = FOLDED  # not among the thread's own recent messages: a folded turn from the archive
            sections["recent"] = sections.get("recent", 0) - m.tokens
            sections["summary"] = sections.get("summary", 0) + m.tokens
        entries.append({"origin": origin, "role": m.role, "tokens": m.tokens,
                        "ref": user_message_id if origin == "input" else m.ref, "sha": content_sha(m.content)})
    return entries, sections


def turn_record(outcome: TurnOutcome, *, user_message_id: str | None, counter: TokenCounter,
                state: ThreadState | None = None) -> dict | None:
    """Build the accounting record of a finished turn (None when no prompt was assembled).

    Args:
        outcome: the turn's ``TurnOutcome``.
        user_message_id: the id of the turn's user message.
        counter: the model's token counter (an answer without provider usage is counted).
        state: the ``ThreadState`` the prompt was assembled from (None: the folded turns shown word for
            word cannot be told from recent ones, and nothing is kept to rebuild the record or the recall).
    """
    context = outcome.context
    if context is None:
        return None
    entries, sections = _prompt_entries(context, state, user_message_id)
    extra: dict[str, int | list[int]] = {}
    if state is not None:
        folded_turns = sum(1 for e in entries if e["origin"] == FOLDED and e["role"] == "user")
        extra = {"recordLast": state.record.last_turn, "recordShown": state.record.last_turn - folded_turns}
    recalled = [m.content for m in context.messages if m.origin == "recall"]
    if recalled:
        extra["recallTurns"] = sorted({int(n) for n in TURN_REF.findall(recalled[0])})
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
        "sections": sections,
        "completionTokens": completion,
        "completionTokensSource": source,
        "budget": context.budget,
        "firstTokenMs": round(first_ms, 1) if first_ms is not None else None,
        "prompt": entries,
        **extra,
    }


def log_prompt(thread_id: str, context: AssembledContext | None, *, message_id: str, include_text: bool) -> None:
    """Log an assembled prompt at DEBUG: per message origin, role, characters, tokens, SHA-256 prefix.

    Args:
        thread_id: the thread (only its label, ``thread_label``, is logged).
        context: the ``AssembledContext``.
        message_id: the assistant message id of the turn.
        include_text: also log each message's text (``settings.debug_log_content``).
    """
    if not log.isEnabledFor(logging.DEBUG) or context is None:
        return
    sections = " ".join(f"{k}={v}" for k, v in context.sections.items())
    log.debug("prompt of %s on %s: %d messages, %d tokens of %d (%s), %d turns dropped", message_id,
              thread_label(thread_id), len(context.messages), context.prompt_tokens, context.budget, sections,
              context.dropped_turns)
    for i, m in enumerate(context.messages):
        if include_text:
            log.debug("prompt of %s [%d] %s/%s chars=%d tokens=%d sha256=%s text=%r", message_id, i, m.origin,
                      m.role, len(m.content), m.tokens, content_sha(m.content), m.content)
        else:
            log.debug("prompt of %s [%d] %s/%s chars=%d tokens=%d sha256=%s", message_id, i, m.origin, m.role,
                      len(m.content), m.tokens, content_sha(m.content))


def record_turn(services: Services, thread_id: str, outcome: TurnOutcome,
                state: ThreadState | None = None) -> dict | None:
    """Store a turn's accounting record, count it in the metrics and log its prompt; returns the record.

    ``state``: the ``ThreadState`` the turn's prompt was assembled from (``turn_record``).

    The record is stored only while the thread exists (``lua/record_turn_stats.lua``): statistics live
    with their thread or not at all, so a cancelled or unsaved first turn leaves no key behind.
    Store failures are logged and counted, never raised.
    """
    record = turn_record(outcome, user_message_id=outcome.user_message_id, counter=services.counter, state=state)
    if record is None:
        return None
    try:
        metrics.observe_turn(record)
    except Exception:
        log.warning("turn metrics not counted", exc_info=True)
    log_prompt(thread_id, outcome.context, message_id=outcome.message_id,
               include_text=services.settings.debug_log_content)
    try:  # only while the thread exists: a turn of a thread never written leaves no key
        services.quotas.record_turn_stats(thread_id, json.dumps(record, separators=(",", ":")),
                                          most=MAX_TURN_RECORDS, ttl_seconds=services.settings.memory_ttl_seconds)
    except Exception as exc:  # redis errors: observability never breaks a turn
        log.warning("turn accounting not stored: %s", type(exc).__name__)
        metrics.count_store_error("record_turn")
    return record


def load_turn_records(services: Services, thread_id: str, limit: int = MAX_TURN_RECORDS) -> list[dict]:
    """The thread's accounting records, oldest first.

    Raises:
        redis.RedisError: the store failed.
    """
    return _json_records(services.redis.lrange(ThreadKeys(thread_id).stats, 0, limit - 1))


def _json_records(raw: Sequence[str | bytes]) -> list[dict]:
    """Decode a newest-first Redis list of JSON objects into a list oldest first, skipping bad items."""
    records = []
    for item in reversed(raw):
        try:
            record = json.loads(item)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def find_turn_record(records: list[dict], message_id: str) -> dict | None:
    """The newest record of the turn whose assistant message id is ``message_id``."""
    return next((r for r in reversed(records) if r.get("messageId") == message_id), None)


def public_turn(record: dict) -> dict:
    """A record as ``GET /api/chat/stats`` serves it: numbers, status and ids; no prompt refs or hashes."""
    out = {k: record.get(k) for k in PUBLIC_TURN_FIELDS if k in record}
    sections = record.get("sections") or {}
    out["sections"] = {k: int(v) for k, v in sections.items() if isinstance(v, (int, float))}
    return out


def _iso_from_millis(value: object) -> str | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        stamp = datetime.fromtimestamp(value / 1000.0, tz=timezone.utc)
        return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return value if isinstance(value, str) else None


def public_compaction(record: dict) -> dict:
    """A compaction history entry as served: the documented fields only, ``at`` as ISO 8601 UTC."""
    out = {}
    for key in COMPACTION_FIELDS:
        if key not in record:
            continue
        value = record[key]
        if key == "at":
            value = _iso_from_millis(value)
        elif key == "reason":
            value = metrics.category(value, "other") if value else None
            if value is None:
                continue
        elif key == "outcome":
            value = metrics.category(value, "unknown")
        elif key == "droppedTurns":
            if not (isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value)):
                continue
        elif key == "step":
            if value not in HistoryStep.values():
                continue
        elif key == "message":
            if not isinstance(value, str) or len(value) > 80:
                continue
        elif not (value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))):
            continue
        out[key] = value
    return out


def load_compactions(services: Services, thread_id: str, limit: int = HISTORY_MAX) -> list[dict]:
    """The thread's compaction history (public form), oldest first.

    Raises:
        redis.RedisError: the store failed.
    """
    raw = services.redis.lrange(ThreadKeys(thread_id).compactions, 0, limit - 1)
    return [public_compaction(record) for record in _json_records(raw)]
