"""Issue 7's HTTP API: token accounting, the context inspector, pins by the person, feedback, ``/metrics``.

Every JSON answer goes through ``guarded_json`` (the forbidden-key guard) and is
about the caller's own thread only: the thread id always comes from the
session cookie, never from the request.

| request | answer |
| --- | --- |
| ``GET /api/chat/stats`` | 200 ``{"budget", "contextTokens", "reservedOutputTokens", "turns": [...], "compactions": [...]}`` (numbers only) |
| ``GET /api/chat/inspector`` | 200 ``{"turn": {...} or null, "messages": [{"origin", "role", "tokens", "text", "note"?}]}`` |
| ``POST /api/chat/pins`` ``{"text"}`` or ``{"messageId"}`` | 201 ``{"pinnedDecisions": [...]}``; 400 invalid; 404 unknown message; 409 ``pin_limit``, ``already_pinned``, ``conflict`` |
| ``DELETE /api/chat/pins/<n>`` (1-based) | 200 ``{"pinnedDecisions": [...]}``; 404 ``pin_not_found`` |
| ``POST /api/chat/feedback`` ``{"messageId", "rating": "up"|"down", "reason"?}`` | 201 ``{"messageId", "rating"}``; 400 invalid; 404 not an assistant message of this thread |
| ``GET /metrics`` | Prometheus text; in production only with ``Authorization: Bearer $METRICS_TOKEN`` (404 when no token is configured, 401 without the right one) |

Store failures answer 503 ``store_unavailable``.  Error bodies are
``{"error": {"code", "message"}}`` with a message meant for people.
"""

from __future__ import annotations

import hmac
import logging

import redis
from flask import Blueprint, Response, request

from app.extensions import services
from app.memory.context import PINS_MAX_PROMPT_SHARE, pins_prompt_tokens
from app.memory.schemas import MESSAGE_ID_RE
from app.memory.state import PINNED_BY_PERSON, Pin
from app.observability import accounting, feedback, metrics
from app.observability.inspector import resolve_prompt
from app.store.thread_store import CorruptState, StoreUnavailable
from app.web.identity import current_thread_id
from app.web.routes import guarded_json

log = logging.getLogger(__name__)
bp = Blueprint("observability_api", __name__)

PIN_WRITE_ATTEMPTS = 5
# Loggers that write request bodies (prompt text) at DEBUG; kept at INFO unless MEMORY_DEBUG_LOG_CONTENT=1.
CONTENT_LOGGERS = ("openai",)


@bp.record_once
def _on_register(state) -> None:
    settings = state.app.extensions["chat"].settings
    metrics.remember_redis_url(settings.redis_url)
    if not settings.debug_log_content:
        for name in CONTENT_LOGGERS:
            logger = logging.getLogger(name)
            if logger.level == logging.NOTSET or logger.level < logging.INFO:
                logger.setLevel(logging.INFO)


def error(status: int, code: str, message: str):
    """An error answer ``{"error": {"code", "message"}}``."""
    return guarded_json({"error": {"code": code, "message": message}}, status)


def store_unavailable():
    return error(503, "store_unavailable", "Memory is unavailable right now; try again shortly.")


def _json_object() -> dict | None:
    body = request.get_json(silent=True)
    return body if isinstance(body, dict) else None


def _foreign_origin() -> bool:
    """True when a browser on another origin sent this request (state-changing calls are same-origin only)."""
    from app.chat.ws import origin_allowed

    origin = request.headers.get("Origin")
    return origin is not None and not origin_allowed(origin, request.host, services().settings.allowed_origins)


# --------------------------------------------------------------------------------------- stats


@bp.get("/api/chat/stats")
def get_stats():
    """Token accounting (per turn, oldest first) and compaction history of the caller's thread."""
    thread_id = current_thread_id()
    svc = services()
    settings = svc.settings
    try:
        turns = accounting.load_turn_records(svc, thread_id)
        compactions = accounting.load_compactions(svc, thread_id)
    except redis.RedisError as exc:
        log.warning("stats unavailable for %s: %s", thread_id[:13], type(exc).__name__)
        metrics.count_store_error("stats")
        return store_unavailable()
    return guarded_json({
        "budget": settings.prompt_budget,
        "contextTokens": settings.model_context_tokens,
        "reservedOutputTokens": settings.reserved_output_tokens,
        "turns": [accounting.public_turn(r) for r in turns],
        "compactions": compactions,
    })


# --------------------------------------------------------------------------------------- inspector


@bp.get("/api/chat/inspector")
def get_inspector():
    """The last turn's prompt, message by message, with the texts of the caller's own thread."""
    thread_id = current_thread_id()
    svc = services()
    try:
        records = accounting.load_turn_records(svc, thread_id, limit=1)
        state = svc.store.load(thread_id)
    except (redis.RedisError, StoreUnavailable, CorruptState) as exc:
        log.warning("inspector unavailable for %s: %s", thread_id[:13], type(exc).__name__)
        if isinstance(exc, redis.RedisError):
            metrics.count_store_error("inspector")
        return store_unavailable()
    if not records:
        return guarded_json({"turn": None, "messages": []})
    record = records[-1]
    turn = {k: record.get(k) for k in ("messageId", "status", "at", "promptTokens", "budget")}
    return guarded_json({"turn": turn, "messages": resolve_prompt(record, state, svc.settings.system_prompt)})


# --------------------------------------------------------------------------------------- pins


class PinRefused(Exception):
    """A pin request that cannot be done; carries the HTTP answer."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(code)
        self.status, self.code, self.message = status, code, message


def clean_pin_text(text: str) -> str:
    """A pin's text: whitespace runs collapsed to one space, trimmed."""
    return " ".join(text.split())


def cut_at_word(text: str, max_chars: int) -> str:
    """``text`` (cleaned) cut to at most ``max_chars`` characters at a word boundary, ending with ``…`` when cut."""
    text = clean_pin_text(text)
    if len(text) <= max_chars:
        return text
    cut = text[: max_chars - 1]
    at = cut.rfind(" ")
    if at >= max_chars // 2:
        cut = cut[:at]
    return cut.rstrip(" ,;:-") + "…"


def _normalized(text: str) -> str:
    try:
        from app.memory.compaction import normalize_pin
    except ImportError:  # pragma: no cover - the compaction module ships with the app
        return clean_pin_text(text).casefold()
    return normalize_pin(text)


def _pin_text(body: dict, state, limits) -> str:
    """The text to pin from a request body (typed text, or a stored message's text)."""
    text, message_id = body.get("text"), body.get("messageId")
    if (text is None) == (message_id is None):
        raise PinRefused(400, "bad_request", 'Send either "text" or "messageId".')
    if message_id is not None:
        if not isinstance(message_id, str) or not MESSAGE_ID_RE.match(message_id):
            raise PinRefused(400, "bad_request", "That message id is not valid.")
        message = next((m for m in state.messages if m.id == message_id), None)
        if message is None:
            raise PinRefused(404, "unknown_message", "That message is no longer in memory, so it can't be pinned.")
        return cut_at_word(message.text, limits.pinned_max_chars)
    if not isinstance(text, str):
        raise PinRefused(400, "bad_request", "The pin text must be a string.")
    text = clean_pin_text(text)
    if not text:
        raise PinRefused(400, "empty_pin", "Type the decision to pin first.")
    if len(text) > limits.pinned_max_chars:
        raise PinRefused(400, "pin_too_long",
                         f"A pin can be at most {limits.pinned_max_chars} characters (this one has {len(text)}).")
    return text


def _with_new_pin(state, text: str, limits, *, counter=None, max_tokens: int | None = None) -> list[Pin]:
    """The pins with ``text`` pinned by the person; refused over the count limit or, when
    ``max_tokens`` is given, when the pins message would cost more than ``max_tokens`` tokens."""
    pins = _pins_with(state, text, limits)
    if max_tokens is not None and pins_prompt_tokens([p.text for p in pins], counter) > max_tokens:
        raise PinRefused(409, "pin_limit", "The pinned decisions are too long to fit beside the conversation. "
                                           "Unpin one, or pin something shorter.")
    return pins


def _pins_with(state, text: str, limits) -> list[Pin]:
    pins = list(state.pins)
    key = _normalized(text)
    for i, pin in enumerate(pins):
        if _normalized(pin.text) == key:
            if pin.by == PINNED_BY_PERSON:
                raise PinRefused(409, "already_pinned", "That decision is already pinned.")
            pins[i] = Pin(text, PINNED_BY_PERSON)  # the model's pin becomes the person's, in their words
            return pins
    if len(pins) >= limits.pinned_max:
        raise PinRefused(409, "pin_limit", f"You can pin at most {limits.pinned_max} decisions. "
                                           "Unpin one to make room.")
    pins.append(Pin(text, PINNED_BY_PERSON))
    return pins


def _without_pin(state, n: str) -> list[Pin]:
    pins = list(state.pins)
    if not n.isdigit() or not 1 <= int(n) <= len(pins):
        raise PinRefused(404, "pin_not_found", "There is no such pin (it may have been removed already).")
    del pins[int(n) - 1]
    return pins


def _change_pins(action: str, change):
    """Read fresh, apply ``change(state) -> pins``, compare-and-set; retry on a stale generation."""
    thread_id = current_thread_id()
    svc = services()
    try:
        for _attempt in range(PIN_WRITE_ATTEMPTS):
            state = svc.store.load(thread_id)
            pins = change(state)
            if svc.store.set_pins(thread_id, expected_gen=state.gen, pins=pins):
                metrics.observe_pin_request(action, "ok")
                return [p.text for p in pins]
        metrics.observe_pin_request(action, "conflict")
        raise PinRefused(409, "conflict", "Memory was changing at that moment; please try again.")
    except PinRefused as refused:
        if refused.code != "conflict":
            metrics.observe_pin_request(action, refused.code)
        raise
    except (StoreUnavailable, CorruptState) as exc:
        log.warning("%s failed for %s: %s", action, thread_id[:13], type(exc).__name__)
        metrics.observe_pin_request(action, "store_unavailable")
        raise PinRefused(503, "store_unavailable", "Memory is unavailable right now; try again shortly.") from None


@bp.post("/api/chat/pins")
def add_pin():
    """Pin a decision by the person: typed text, or a stored message's text."""
    if _foreign_origin():
        return error(403, "forbidden", "Not allowed from another site.")
    body = _json_object()
    if body is None:
        return error(400, "bad_request", 'Send a JSON object with "text" or "messageId".')
    limits = services().settings.limits
    try:
        svc = services()
        max_tokens = int(svc.settings.prompt_budget * PINS_MAX_PROMPT_SHARE)
        pins = _change_pins("pin", lambda state: _with_new_pin(state, _pin_text(body, state, limits), limits,
                                                               counter=svc.counter, max_tokens=max_tokens))
    except PinRefused as refused:
        return error(refused.status, refused.code, refused.message)
    return guarded_json({"pinnedDecisions": pins}, 201)


@bp.delete("/api/chat/pins/<n>")
def delete_pin(n: str):
    """Unpin the ``n``-th pinned decision (1-based)."""
    if _foreign_origin():
        return error(403, "forbidden", "Not allowed from another site.")
    try:
        pins = _change_pins("unpin", lambda state: _without_pin(state, n))
    except PinRefused as refused:
        return error(refused.status, refused.code, refused.message)
    return guarded_json({"pinnedDecisions": pins}, 200)


# --------------------------------------------------------------------------------------- feedback


@bp.post("/api/chat/feedback")
def post_feedback():
    """Thumbs up or down on an assistant message of the caller's thread, stored with that turn's accounting."""
    if _foreign_origin():
        return error(403, "forbidden", "Not allowed from another site.")
    body = _json_object()
    if body is None:
        return error(400, "bad_request", 'Send a JSON object with "messageId" and "rating".')
    message_id, rating, reason = body.get("messageId"), body.get("rating"), body.get("reason")
    if not isinstance(message_id, str) or not MESSAGE_ID_RE.match(message_id):
        return error(400, "bad_request", "That message id is not valid.")
    if rating not in feedback.RATINGS:
        return error(400, "bad_request", 'The rating must be "up" or "down".')
    if reason is not None and not isinstance(reason, str):
        return error(400, "bad_request", "The reason must be text.")
    reason = (reason or "").strip() or None
    if reason and len(reason) > feedback.MAX_REASON_CHARS:
        return error(400, "reason_too_long",
                     f"The reason can be at most {feedback.MAX_REASON_CHARS} characters.")
    thread_id = current_thread_id()
    svc = services()
    try:
        state = svc.store.load(thread_id)
        records = accounting.load_turn_records(svc, thread_id)
        record = accounting.find_turn_record(records, message_id)
        in_memory = any(m.id == message_id and m.role == "assistant" for m in state.messages)
        written = record is not None and record.get("status") in ("completed", "blocked")
        if not in_memory and not written:
            return error(404, "unknown_message", "There is no such answer in this conversation.")
        entry = feedback.feedback_entry(message_id, rating, reason, record)
        feedback.store_feedback(svc.redis, thread_id, entry, svc.settings.memory_ttl_seconds)
    except (redis.RedisError, StoreUnavailable, CorruptState) as exc:
        log.warning("feedback not stored for %s: %s", thread_id[:13], type(exc).__name__)
        if isinstance(exc, redis.RedisError):
            metrics.count_store_error("feedback")
        return store_unavailable()
    metrics.observe_feedback(rating, reason)
    return guarded_json({"messageId": message_id, "rating": rating}, 201)


# --------------------------------------------------------------------------------------- metrics


def _metrics_allowed() -> tuple[bool, int]:
    settings = services().settings
    if not settings.production:
        return True, 200
    token = settings.metrics_token
    if not token:
        return False, 404
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        return False, 401
    return True, 200


@bp.get("/metrics")
def get_metrics():
    """Prometheus exposition (every gunicorn process, plus the Celery workers' counters from Redis)."""
    allowed, status = _metrics_allowed()
    if not allowed:
        if status == 401:
            return Response("unauthorized\n", status=401, mimetype="text/plain",
                            headers={"WWW-Authenticate": 'Bearer realm="metrics"'})
        return error(404, "not_found", "Not found.")
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(metrics.render_metrics(services().redis), status=200,
                    headers={"Content-Type": CONTENT_TYPE_LATEST, "Cache-Control": "no-store"})
