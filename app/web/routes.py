"""HTTP routes of the contract: ``GET /``, ``GET``/``DELETE /api/chat/thread``, ``GET /healthz``."""

from __future__ import annotations

import logging

import redis
from flask import Blueprint, jsonify, render_template

from app.extensions import services
from app.memory.hydration import ForbiddenKeyError, assert_no_forbidden_keys, build_hydration, empty_hydration
from app.runtime.capabilities import tools_enabled
from app.store.thread_store import CorruptState, StoreUnavailable
from app.web.identity import current_thread_id

log = logging.getLogger(__name__)
bp = Blueprint("web", __name__, static_folder="static", template_folder="templates",
               static_url_path="/static")


def guarded_json(payload: dict, status: int = 200):
    """Answer ``payload`` as JSON after the forbidden-key check; a violation is a logged 500."""
    try:
        assert_no_forbidden_keys(payload)
    except ForbiddenKeyError as exc:
        log.error("response blocked: forbidden key at %s", exc.path)
        return jsonify({"error": {"code": "internal", "message": "Something went wrong."}}), 500
    return jsonify(payload), status


@bp.get("/")
def index():
    """The chat page."""
    current_thread_id()  # start the session before the websocket opens
    settings = services().settings
    return render_template(
        "index.html",
        model_name=settings.chat_model,
        bundled_model=settings.bundled_model,
        tools_enabled=tools_enabled(services()),  # TOOLS_ENABLED and the provider accepts tools (issue 6)
        max_input_chars=settings.max_input_chars,
    )


@bp.get("/api/chat/thread")
def get_thread():
    """Hydration: the thread as the browser may see it (contract: HTTP; acceptance P13, P16)."""
    thread_id = current_thread_id()
    try:
        state = services().store.load(thread_id)
    except (StoreUnavailable, CorruptState) as exc:
        log.warning("hydration degraded for thread %s: %s", thread_id[:13], type(exc).__name__)
        return guarded_json(empty_hydration(thread_id))
    return guarded_json(build_hydration(thread_id, state))


@bp.delete("/api/chat/thread")
def delete_thread():
    """Empty the thread (a compaction in flight cannot bring anything back) and drop a waiting task list."""
    from app.runtime.run_store import RunStore

    thread_id = current_thread_id()
    svc = services()
    try:
        svc.store.clear(thread_id)
        RunStore(svc.redis, thread_id).drop_paused()
    except (StoreUnavailable, redis.RedisError):
        log.warning("clear failed for thread %s: store unavailable", thread_id[:13])
        return jsonify({"error": {"code": "store_unavailable",
                                  "message": "Memory is unavailable right now; try again shortly."}}), 503
    return "", 204


@bp.get("/healthz")
def healthz():
    """200 ``{"status": "ok"}`` or 503 ``{"status": "degraded", "store": "down"}``."""
    try:
        services().store.ping()
    except StoreUnavailable:
        return jsonify({"status": "degraded", "store": "down"}), 503
    return jsonify({"status": "ok", "store": "up"})
