"""HTTP routes of docs/contract.md: ``GET /``, ``GET``/``DELETE /api/chat/thread``, ``GET /healthz``."""

from __future__ import annotations

import logging
import mimetypes
import time

import redis
from flask import Blueprint, Response, current_app, jsonify, render_template

from app.extensions import services
from app.identity import current_thread_id
from app.llm.health import model_status
from app.memory.hydration import build_hydration, empty_hydration
from app.memory.state import thread_label
from app.runtime.capabilities import tools_enabled
from app.store.thread_store import CorruptState, OutcomeUnknown, StoreUnavailable
from app.web.responses import ApiError, guarded_json, outcome_unknown, store_unavailable

log = logging.getLogger(__name__)
# The page's scripts are ES modules (static/js/), which browsers refuse unless served as JavaScript;
# some systems' MIME tables map .js otherwise.
mimetypes.add_type("text/javascript", ".js")
bp = Blueprint("web", __name__, static_folder="static", template_folder="templates",
               static_url_path="/static")


@bp.get("/")
def index() -> Response | str:
    """The chat page; 429 in plain text (what happened, for a person) when no new session may start."""
    try:
        current_thread_id()  # start the session before the websocket opens
    except ApiError as refused:
        return Response(refused.message + "\n", status=refused.status, mimetype="text/plain",
                        headers={"Retry-After": "600"})
    settings = services().settings
    return render_template(
        "index.html",
        model_name=settings.chat_model,
        bundled_model=settings.bundled_model,
        tools_enabled=tools_enabled(services()),  # TOOLS_ENABLED and the provider accepts tools
        max_input_chars=settings.max_input_chars,
    )


@bp.get("/api/chat/thread")
def get_thread() -> tuple[Response, int]:
    """Hydration: the thread as the browser may see it (docs/contract.md: HTTP; an empty thread when the store fails)."""
    thread_id = current_thread_id()
    try:
        state = services().store.load(thread_id)
    except (StoreUnavailable, CorruptState) as exc:  # a corrupt thread is logged at ERROR by the store
        log.warning("hydration degraded for thread %s: %s", thread_label(thread_id), type(exc).__name__)
        return guarded_json(empty_hydration(thread_id))
    try:
        archived = services().archive.newest_turns(thread_id) if state.folded_turns else []
        earliest = services().archive.earliest_kept_turn(thread_id, state)
    except StoreUnavailable:
        archived, earliest = [], None  # the earlier turns stay out of view; the thread itself is shown
    return guarded_json(build_hydration(thread_id, state, archived=archived, earliest_kept_turn=earliest))


@bp.delete("/api/chat/thread")
def delete_thread() -> Response | tuple[str, int]:
    """Empty the thread (a compaction in flight cannot bring anything back) and drop a waiting task list.

    204 even on a corrupt thread (it is replaced by an empty one); 202 ``outcome: unknown`` when its reply was
    lost and reading back failed too; 503 ``store_unavailable`` when
    Redis failed or refused the write (nothing changed); 403 from another origin (``app.web.security``).
    """
    from app.runtime.run_store import RunStore

    thread_id = current_thread_id()
    svc = services()
    try:
        svc.store.clear(thread_id)
        RunStore(svc.redis, thread_id).drop_paused()
    except OutcomeUnknown:  # the clear's reply lost and not read back: the page reads the thread again
        log.warning("clear of thread %s: outcome unknown", thread_label(thread_id))
        return outcome_unknown()
    except (StoreUnavailable, redis.RedisError):
        log.warning("clear failed for thread %s: store unavailable", thread_label(thread_id))
        return store_unavailable()
    return "", 204


def store_health() -> str:
    """``up``, ``degraded`` (Redis answers but refuses writes: maxmemory with noeviction, read-only)
    or ``down`` (no answer).

    PING on every call; the write probe (``StoreHealth.probe_write``, one small key) at most once
    per ``HEALTH_WRITE_PROBE_SECONDS`` per process, its answer kept in between.
    """
    svc = services()
    try:
        svc.store_health.ping()
    except StoreUnavailable:
        return "down"
    cache = current_app.extensions.setdefault("health_write_probe", {"at": None, "writable": True})
    now = time.monotonic()
    if cache["at"] is None or now - cache["at"] >= svc.settings.health_write_probe_interval:
        try:
            writable = svc.store_health.probe_write()
        except StoreUnavailable:
            return "down"
        if not writable:
            log.warning("health: the store answers but refuses writes")
        cache.update(at=now, writable=writable)
    return "up" if cache["writable"] else "degraded"


@bp.get("/healthz")
def healthz() -> Response | tuple[Response, int]:
    """200 ``{"status": "ok", "store": "up", "model": "up"}``; 503 ``{"status": "degraded", ...}`` when the store
    is ``down`` or ``degraded`` (refusing writes; ``store_health``) or the chat model endpoint is down (the
    model probe is ``app.llm.health``)."""
    store = store_health()
    model = model_status(services().settings)
    if store == "up" and model == "up":
        return jsonify({"status": "ok", "store": "up", "model": "up"})
    return jsonify({"status": "degraded", "store": store, "model": model}), 503
