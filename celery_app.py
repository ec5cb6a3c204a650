"""Celery entry point: ``celery -A celery_app worker -Q compaction``."""
from app import create_app

flask_app = create_app()
celery_app = flask_app.extensions["celery"]
