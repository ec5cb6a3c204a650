"""Celery configured from the application's settings (the Flask ``celery_init_app`` pattern).

Broker: the same Redis as the store (``rediss://`` with self-signed certificates
works).  Compaction tasks go to the dedicated ``compaction`` queue, are
acknowledged late and rejected back to the queue when a worker dies, one at a
time per worker process, with no result storage and with task events on so
Flower shows them.  The visibility timeout exceeds the longest task plus its
retries, so a task is not redelivered while it still runs.
"""

from __future__ import annotations

from celery import Celery, Task
from flask import Flask

from app.settings import Settings
from app.store.redis_client import celery_broker_url

COMPACTION_QUEUE = "compaction"


def celery_config(settings: Settings) -> dict:
    """The Celery configuration for ``settings`` (time limits in seconds)."""
    broker = celery_broker_url(settings.redis_url)
    hard_limit = settings.compaction_time_limit
    # COMPACTION_VISIBILITY_TIMEOUT_SECONDS overrides the derived value (tests of redelivery use a short one).
    visibility = settings.compaction_visibility_timeout or max(3600, 4 * hard_limit + 600)
    config = {
        "broker_url": broker,
        "result_backend": None,
        "task_ignore_result": True,
        "task_default_queue": COMPACTION_QUEUE,
        "task_routes": {"workers.compaction.*": {"queue": COMPACTION_QUEUE}},
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_time_limit": hard_limit,
        "task_soft_time_limit": max(1, hard_limit - 10),
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "broker_transport_options": {"visibility_timeout": visibility},
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        # A task running when the broker connection drops is redelivered; a rerun cannot apply twice
        # (the commit is a compare-and-set), so the running copy may as well be cancelled.
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_hijack_root_logger": False,
        "include": ["workers.compaction"],
    }
    if broker.startswith("rediss://"):
        config["broker_use_ssl"] = {"ssl_cert_reqs": "none"}
    return config


def celery_init_app(app: Flask, settings: Settings) -> Celery:
    """Create the Celery app bound to ``app`` (tasks run inside its app context)."""

    class FlaskTask(Task):
        def __call__(self, *args, **kwargs):
            with app.app_context():
                return self.run(*args, **kwargs)

    celery = Celery(app.name, task_cls=FlaskTask)
    celery.conf.update(celery_config(settings))
    celery.set_default()
    app.extensions["celery"] = celery
    return celery
