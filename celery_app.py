"""Celery entry point: ``celery -A celery_app worker -Q compaction`` (folds), ``... worker -Q refine``
(refinements) and ``celery -A celery_app flower``.

The configuration is validated first (``app.startup``): a malformed variable, a
missing production ``SECRET_KEY`` or an unreachable store prints one
``config error: ...`` line on stderr and exits with status 3; so does Flower
started outside development without ``FLOWER_BASIC_AUTH``.
"""
import sys

from app import create_app
from app.startup import celery_command, settings_or_exit

_role = "flower" if celery_command(sys.argv) == "flower" else "worker"
flask_app = create_app(settings_or_exit(_role))
celery_app = flask_app.extensions["celery"]
