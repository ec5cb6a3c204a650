"""``GET /metrics``: the Prometheus exposition of every gunicorn process, plus the Celery workers' counters.

Open outside production; in production only with ``Authorization: Bearer
$METRICS_TOKEN`` (404 when no token is configured, 401 with a
``WWW-Authenticate`` challenge without the right one).
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from flask import Blueprint, Response, request
from prometheus_client import CONTENT_TYPE_LATEST

from app.extensions import services
from app.observability import metrics
from app.web.responses import error_response

if TYPE_CHECKING:
    from flask.blueprints import BlueprintSetupState

bp = Blueprint("metrics", __name__)


@bp.record_once
def _on_register(state: BlueprintSetupState) -> None:
    settings = state.app.extensions["chat"].settings
    metrics.remember_redis_url(settings.redis_url, settings.redis_cluster)


def _refusal() -> Response | None:
    """None when the caller may read the metrics; otherwise the 404 or 401 answer."""
    settings = services().settings
    if not settings.production:
        return None
    token = settings.metrics_token
    if not token:
        return error_response(404, "not_found", "Not found.")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        response = error_response(401, "unauthorized", "The metrics need the bearer token.")
        response.headers["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return None


@bp.get("/metrics")
def get_metrics() -> Response:
    """Prometheus text (``CONTENT_TYPE_LATEST``), never cached."""
    refusal = _refusal()
    if refusal is not None:
        return refusal
    return Response(metrics.render_metrics(services().redis), status=200,
                    headers={"Content-Type": CONTENT_TYPE_LATEST, "Cache-Control": "no-store"})
