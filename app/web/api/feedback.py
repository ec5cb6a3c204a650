"""``POST /api/chat/feedback``: thumbs up or down on an assistant message, stored with that turn's accounting."""

from __future__ import annotations

import logging

import redis
from flask import Blueprint, Response

from app.extensions import services
from app.identity import current_thread_id
from app.memory.state import thread_label
from app.memory.status import writes_memory
from app.observability import accounting, feedback, metrics
from app.store.thread_store import CorruptState, StoreUnavailable
from app.web.bodies import FEEDBACK_BODY, load_body
from app.web.responses import MEMORY_UNREADABLE, ApiError, error_response, guarded_json, store_unavailable

log = logging.getLogger(__name__)
bp = Blueprint("feedback", __name__)


@bp.post("/api/chat/feedback")
def post_feedback() -> Response | tuple[Response, int]:
    """Rate an assistant message of the caller's thread (in memory, or written by a finished turn)."""
    body = load_body(FEEDBACK_BODY, 'Send a JSON object with "messageId" and "rating".')
    message_id, rating, reason = body["messageId"], body["rating"], body["reason"]
    thread_id = current_thread_id()
    svc = services()
    try:
        state = svc.store.load(thread_id)
        records = accounting.load_turn_records(svc, thread_id)
        record = accounting.find_turn_record(records, message_id)
        in_memory = any(m.id == message_id and m.role == "assistant" for m in state.messages)
        written = record is not None and writes_memory(record.get("status"))
        if not in_memory and not written:
            raise ApiError(404, "unknown_message", "There is no such answer in this conversation.")
        entry = feedback.feedback_entry(message_id, rating, reason, record)
        feedback.store_feedback(svc.redis, thread_id, entry, svc.settings.memory_ttl_seconds)
    except CorruptState:
        return error_response(409, *MEMORY_UNREADABLE)
    except (redis.RedisError, StoreUnavailable) as exc:
        log.warning("feedback not stored for %s: %s", thread_label(thread_id), type(exc).__name__)
        if isinstance(exc, redis.RedisError):
            metrics.count_store_error("feedback")
        return store_unavailable()
    metrics.observe_feedback(rating, reason)
    return guarded_json({"messageId": message_id, "rating": rating}, 201)
