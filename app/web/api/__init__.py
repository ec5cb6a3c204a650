"""The JSON API beside the chat, one blueprint per feature (docs/memory.md: "Seeing what memory did").

Every JSON answer goes through ``guarded_json`` (the forbidden-key guard) and is
about the caller's own thread only: the thread id always comes from the session
cookie, never from the request.

| request | answer |
| --- | --- |
| ``GET /api/chat/stats`` | 200 ``{"budget", "contextTokens", "reservedOutputTokens", "turns": [...], "compactions": [...]}`` (numbers only) |
| ``GET /api/chat/inspector`` | 200 ``{"turn": {...} or null, "messages": [{"origin", "role", "tokens", "text", "note"?}]}`` |
| ``POST /api/chat/pins`` ``{"text"}`` or ``{"messageId"}`` | 201 ``{"pinnedDecisions": [...]}``; 400 invalid; 404 unknown message; 409 ``pin_limit``, ``already_pinned``, ``conflict`` |
| ``DELETE /api/chat/pins/<n>`` (1-based) | 200 ``{"pinnedDecisions": [...]}``; 404 ``pin_not_found`` |
| ``POST /api/chat/feedback`` ``{"messageId", "rating": "up"|"down", "reason"?}`` | 201 ``{"messageId", "rating"}``; 400 invalid; 404 not an assistant message of this thread |
| ``GET /api/chat/turns/<n>`` | 200 ``{"turn", "where", "reason", "messages"}``; 404 ``not_found`` |
| ``DELETE /api/chat/turns/<n>`` | 200 ``{"forgotten": {"turn", "recent", "archive", "recordLines", "notes"}, "pinsQuoting"}``; 404 ``not_found``; 409 ``conflict`` |
| ``GET /api/chat/forget?phrase=`` | 200 ``{"phrase", "items": [{"place", "turn", "text"}]}``; 400 ``bad_request`` |
| ``POST /api/chat/forget`` ``{"phrase", "turns"}`` | 200 ``{"forgotten": [...], "pinsQuoting"}``; 400; 404 ``not_found`` |
| ``GET /api/chat/export`` | 200 everything the thread holds, as an attachment ``chat-export.json`` |
| ``GET /metrics`` | Prometheus text; in production only with ``Authorization: Bearer $METRICS_TOKEN`` (404 when no token is configured, 401 without the right one) |

A client past its quota of writes answers 429 ``rate_limited`` (``app.web.clients``).  Store failures answer 503 ``store_unavailable``, a corrupt stored thread 409
``memory_unreadable``; text with a NUL or an unpaired surrogate 400 ``invalid_text``; any
write from a page of another origin (by ``Origin``, else ``Referer``) 403 ``forbidden``
(``app.web.security``, for every route).  Error bodies are ``error_response``'s
``{"error": {"code", "message"}}`` with a message meant for people.
"""

from __future__ import annotations

from app.web.api.feedback import bp as feedback_bp
from app.web.api.forget import bp as forget_bp
from app.web.api.metrics import bp as metrics_bp
from app.web.api.pins import bp as pins_bp
from app.web.api.stats import bp as stats_bp

BLUEPRINTS = (stats_bp, pins_bp, feedback_bp, forget_bp, metrics_bp)
