"""WSGI entry point: ``gunicorn wsgi:app``.

The configuration is validated first (``app.startup``): a malformed variable, a
missing production ``SECRET_KEY`` or, in production, an unreachable store prints
one ``config error: ...`` line on stderr and exits with status 3.
"""
from app import create_app
from app.startup import settings_or_exit

app = create_app(settings_or_exit("web"))
