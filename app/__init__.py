"""The Flask application factory: reads as a table of contents."""

from __future__ import annotations

import logging
from datetime import timedelta

from flask import Flask, Response

from app.extensions import Services
from app.settings import Settings
from app.web.responses import register_errorhandlers

# Loggers that write request bodies (prompt text) at DEBUG; kept at INFO unless MEMORY_DEBUG_LOG_CONTENT=1.
CONTENT_LOGGERS = ("openai",)


def create_app(settings: Settings | None = None) -> Flask:
    """Create the web application.

    Args:
        settings: configuration; read from the environment when None.

    Raises:
        ConfigError: the environment's configuration is invalid.
    """
    settings = settings or Settings.from_env()
    app = Flask(__name__, static_folder=None)  # assets are served by the web blueprint
    configure(app, settings)
    register_extensions(app, settings)
    register_blueprints(app)
    register_client_rules(app, settings)
    register_errorhandlers(app)
    register_security_headers(app)
    return app


def configure(app: Flask, settings: Settings) -> None:
    """Flask configuration derived from the settings (cookie policy of docs/contract.md: Identity)."""
    app.config.update(
        SECRET_KEY=settings.secret_key,
        SESSION_COOKIE_NAME="chat_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.production,
        PERMANENT_SESSION_LIFETIME=timedelta(seconds=settings.memory_ttl_seconds),
        MAX_CONTENT_LENGTH=64 * 1024,
        # Room for any text of MAX_INPUT_CHARS characters even when its JSON escapes every character
        # (12 bytes for a non-BMP one, as two \uXXXX escapes): a frame over this limit closes the
        # socket instead of getting input_too_long.
        SOCK_SERVER_OPTIONS={"ping_interval": 25, "max_message_size": 12 * settings.max_input_chars + 1024},
        JSON_SORT_KEYS=False,
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not settings.debug_log_content:
        for name in CONTENT_LOGGERS:
            logger = logging.getLogger(name)
            if logger.level == logging.NOTSET or logger.level < logging.INFO:
                logger.setLevel(logging.INFO)


def register_extensions(app: Flask, settings: Settings) -> None:
    """Shared services (Redis, store, tokenizer, LLM), websockets, Celery."""
    from app.celery_setup import celery_init_app
    from app.chat.ws import sock

    app.extensions["chat"] = Services(settings)
    sock.init_app(app)
    celery_init_app(app, settings)


def register_blueprints(app: Flask) -> None:
    """The page and the thread, the websocket route (origin-checked), the JSON API by feature."""
    from app.web.api import BLUEPRINTS as api_blueprints
    from app.web.routes import bp as web_bp
    from app.web.security import chat_bp  # the chat blueprint, with its origin check

    app.register_blueprint(web_bp)
    app.register_blueprint(chat_bp)
    for blueprint in api_blueprints:
        app.register_blueprint(blueprint)


def register_client_rules(app: Flask, settings: Settings) -> None:
    """Trusted proxies and hosts, the websocket's session cookie, per-client quotas (``app.web.clients``)."""
    from app.web.clients import install_client_rules

    install_client_rules(app, settings)


CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")


def register_security_headers(app: Flask) -> None:
    """A strict Content-Security-Policy: no inline script, nothing from other origins."""

    @app.after_request
    def add_headers(response: Response) -> Response:
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        return response
