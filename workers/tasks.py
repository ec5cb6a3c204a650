"""The Celery tasks of the worker process: one task, ``compact_thread``, a thin shell around the service.

Queue, late acknowledgement, rejection on a lost worker, prefetch and time limits
come from the Celery configuration (``app.celery_setup``), not from here.
"""

from __future__ import annotations

import math
import threading

from celery import shared_task

from app.compaction.requests import TASK_NAME
from app.compaction.service import OUTCOME_STALE, run_compaction
from app.extensions import services
from app.observability.metrics import observe_compaction


def _load_the_fact_reader() -> None:
    """Load jieba's dictionary and the sentence segmenter (1-3 s) before the first compaction needs them."""
    from app.memory.compaction.record import statement_lines
    from app.memory.state import ThreadMessage

    statement_lines([ThreadMessage("warm", "user", "我叫林伟。My name is Lin Wei.", "2026-01-01T00:00:00.000Z")])


STALE_RESULT = "discarded: stale"
"""The task's return value for a stale compaction: neither a plain success nor a failure."""

# In the background when the worker loads its tasks: a first compaction waits for it at most.
threading.Thread(target=_load_the_fact_reader, name="load-fact-reader", daemon=True).start()


def retry_countdown_for(broker_url: str | None, seconds: float) -> float:
    """The countdown to give ``Task.retry`` for a wait of ``seconds`` on this broker.

    With RabbitMQ (``amqp``/``amqps``) Celery uses kombu's native delayed delivery, which routes a
    delayed message by whole seconds and refuses a countdown under one (``ValueError: countdown must
    be a positive number``, which Celery turns into a rejected task): round up to whole seconds, at
    least 1.  Redis keeps the countdown as given.
    """
    if (broker_url or "").split(":", 1)[0].lower() in ("amqp", "amqps", "pyamqp"):
        return float(max(1, math.ceil(seconds)))
    return seconds


@shared_task(bind=True, name=TASK_NAME)
def compact_thread(self, thread_id: str, seen_version: int) -> str:
    """Compact one thread (``app.compaction.service.run_compaction``).

    Args:
        thread_id: ``chat:`` + 64 hex.  Message text never travels in the task.
        seen_version: the version the request saw.

    Returns:
        The outcome: ``applied``, ``failed``, ``skipped``, or ``discarded: stale`` for a result
        discarded because the thread changed meanwhile (``STALE_RESULT``).  There is no result
        backend; Flower shows this value in the task's Result column (README: A compaction).

    Transient failures are retried (``self.retry`` with a jittered exponential countdown,
    at most ``COMPACTION_MAX_RETRIES`` times); the pending marker is kept while a retry waits.
    """
    svc = services()
    outcome = run_compaction(svc, thread_id, seen_version, attempt=self.request.retries)
    if outcome.entry is not None:
        observe_compaction(svc.redis, outcome.entry)  # counters for /metrics, aggregated through Redis
    if outcome.retry_in is not None:
        raise self.retry(countdown=retry_countdown_for(self.app.conf.broker_url, outcome.retry_in),
                         max_retries=svc.settings.compaction_max_retries)
    return STALE_RESULT if outcome.outcome == OUTCOME_STALE else outcome.outcome
