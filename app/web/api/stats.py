"""``GET /api/chat/stats`` (token accounting, compaction history) and ``GET /api/chat/inspector`` (the last prompt)."""

from __future__ import annotations

import logging

import redis
from flask import Blueprint, Response

from app.extensions import services
from app.identity import current_thread_id
from app.memory.context import shorten_answer
from app.memory.state import thread_label
from app.observability import accounting, metrics
from app.observability.inspector import resolve_prompt
from app.store.thread_store import CorruptState, StoreUnavailable
from app.web.responses import MEMORY_UNREADABLE, error_response, guarded_json, store_unavailable

log = logging.getLogger(__name__)
bp = Blueprint("stats", __name__)


@bp.get("/api/chat/stats")
def get_stats() -> Response | tuple[Response, int]:
    """Token accounting (per turn, oldest first) and compaction history of the caller's thread."""
    thread_id = current_thread_id()
    svc = services()
    settings = svc.settings
    try:
        turns = accounting.load_turn_records(svc, thread_id)
        compactions = accounting.load_compactions(svc, thread_id)
    except redis.RedisError as exc:
        log.warning("stats unavailable for %s: %s", thread_label(thread_id), type(exc).__name__)
        metrics.count_store_error("stats")
        return store_unavailable()
    return guarded_json({
        "budget": settings.prompt_budget,
        "contextTokens": settings.model_context_tokens,
        "reservedOutputTokens": settings.reserved_output_tokens,
        "turns": [accounting.public_turn(r) for r in turns],
        "compactions": compactions,
    })


@bp.get("/api/chat/inspector")
def get_inspector() -> Response | tuple[Response, int]:
    """The last turn's prompt, message by message, with the texts of the caller's own thread."""
    thread_id = current_thread_id()
    svc = services()
    try:
        records = accounting.load_turn_records(svc, thread_id, limit=1)
        state, archive = svc.archive.load_turn_memory(thread_id)  # the archive shows what was folded since
    except CorruptState:  # one status for one state (docs/contract.md: HTTP): 409 as every other route
        log.warning("inspector of %s: memory unreadable", thread_label(thread_id))
        return error_response(409, *MEMORY_UNREADABLE)
    except (redis.RedisError, StoreUnavailable) as exc:
        log.warning("inspector unavailable for %s: %s", thread_label(thread_id), type(exc).__name__)
        if isinstance(exc, redis.RedisError):
            metrics.count_store_error("inspector")
        return store_unavailable()
    if not records:
        return guarded_json({"turn": None, "messages": []})
    record = records[-1]
    turn = {k: record.get(k) for k in ("messageId", "status", "at", "promptTokens", "budget")}
    limit = svc.settings.prompt_answer_max_tokens
    shown = (lambda text: shorten_answer(text, limit, svc.counter)) if limit else None
    messages = resolve_prompt(record, state, svc.settings.system_prompt, archive, svc.counter, shown=shown)
    return guarded_json({"turn": turn, "messages": messages})
