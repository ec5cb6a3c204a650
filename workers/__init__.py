"""Celery tasks (run by ``celery -A celery_app worker -Q compaction``)."""
