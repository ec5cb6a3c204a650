"""Celery configured from the application's settings (the Flask ``celery_init_app`` pattern).

Broker: ``CELERY_BROKER_URL``, by default the same Redis as the store (``rediss://``
with self-signed certificates works); with ``REDIS_CLUSTER=1`` a separate broker
(``amqp://`` RabbitMQ, or a plain Redis), since Celery's Redis transport cannot use a
cluster.  Folds (``TASK_NAME``) go to the ``compaction`` queue and refinements
(``REFINE_TASK_NAME``, the model's part: tens of seconds with the bundled model) to the
``refine`` queue, each consumed by its own worker process (Procfile: ``worker`` and
``refiner``), so a fold never waits behind a refinement (docs/deployment.md).  Tasks are
acknowledged late and rejected back to their queue when a worker dies, one at a time per
worker process, with no result storage and with task events on so Flower shows them.

- Redis broker: the visibility timeout exceeds the longest task plus its retries, so a
  task is not redelivered while it still runs.
- RabbitMQ: ``compaction`` and ``refine`` are durable quorum queues (replicated by a RabbitMQ cluster)
  each on a topic exchange, so a retry's countdown waits in RabbitMQ's delayed-delivery
  queues (Celery's native delayed delivery) instead of in a worker.  There is no
  visibility timeout: RabbitMQ hands an unacknowledged task to another worker as soon
  as the worker's connection closes (docs/scale-out.md).
"""

from __future__ import annotations

from typing import Any

from celery import Celery, Task
from flask import Flask
from kombu import Exchange, Queue

from app.compaction.requests import REFINE_TASK_NAME, TASK_NAME
from app.settings import Settings
from app.store.redis_client import celery_broker_url

COMPACTION_QUEUE = "compaction"
"""The folds' queue (``workers.compact_thread``): consumed by the Procfile's ``worker``."""
REFINE_QUEUE = "refine"
"""The refinements' queue (``workers.refine_thread``): consumed by the Procfile's ``refiner``."""
QUEUES = (COMPACTION_QUEUE, REFINE_QUEUE)


def is_amqp(url: str) -> bool:
    """True for a RabbitMQ broker URL (``amqp://``, ``amqps://``)."""
    return url.startswith(("amqp://", "amqps://"))


def quorum_queue(name: str) -> Queue:
    """A RabbitMQ queue ``name``: durable, quorum type, on a topic exchange (native delayed delivery
    needs one) of the same name."""
    return Queue(name, Exchange(name, type="topic", durable=True),
                 routing_key=name, durable=True, queue_arguments={"x-queue-type": "quorum"})


def compaction_queue() -> Queue:
    """RabbitMQ's ``compaction`` queue (the folds)."""
    return quorum_queue(COMPACTION_QUEUE)


def refine_queue() -> Queue:
    """RabbitMQ's ``refine`` queue (the refinements)."""
    return quorum_queue(REFINE_QUEUE)


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration for ``settings`` (time limits in seconds)."""
    broker = celery_broker_url(settings.broker_url)
    hard_limit = settings.compaction_time_limit
    # COMPACTION_VISIBILITY_TIMEOUT_SECONDS overrides the derived value (tests of redelivery use a short one).
    visibility = settings.compaction_visibility_timeout or max(3600, 4 * hard_limit + 600)
    config: dict[str, Any] = {
        "broker_url": broker,
        "result_backend": None,
        "task_ignore_result": True,
        "task_default_queue": COMPACTION_QUEUE,
        "task_routes": {TASK_NAME: {"queue": COMPACTION_QUEUE}, REFINE_TASK_NAME: {"queue": REFINE_QUEUE}},
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_time_limit": hard_limit,
        "task_soft_time_limit": max(1, hard_limit - 10),
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        # A task running when the broker connection drops is redelivered; a rerun cannot apply twice
        # (the commit is a compare-and-set), so the running copy may as well be cancelled.
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_hijack_root_logger": False,
        "include": ["workers.tasks"],
    }
    if is_amqp(broker):
        config["task_queues"] = [compaction_queue(), refine_queue()]
        # A publish returns once RabbitMQ holds the task; redelivery of an unacknowledged task follows
        # the worker's connection, not a timeout (there is no visibility timeout).
        config["broker_transport_options"] = {"confirm_publish": True}
    else:
        config["broker_transport_options"] = {"visibility_timeout": visibility}
    if broker.startswith("rediss://"):
        config["broker_use_ssl"] = {"ssl_cert_reqs": "none"}
    return config


def celery_init_app(app: Flask, settings: Settings) -> Celery:
    """Create the Celery app bound to ``app`` (tasks run inside its app context)."""

    class FlaskTask(Task):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            with app.app_context():
                return self.run(*args, **kwargs)

    celery = Celery(app.name, task_cls=FlaskTask)
    celery.conf.update(celery_config(settings))
    celery.set_default()
    app.extensions["celery"] = celery
    services = app.extensions.get("chat")
    if services is not None:  # turns ask for compactions by task name (app never imports the workers)
        services.send_compaction = lambda thread_id, version: celery.send_task(TASK_NAME, args=[thread_id, version])
    return celery
