"""The Celery tasks of the worker process: ``compact_thread`` (the fold) and ``refine_thread`` (the model's part),
thin shells around the service (docs/memory.md: A compaction).

Queue, late acknowledgement, rejection on a lost worker, prefetch and time limits
come from the Celery configuration (``app.celery_setup``), not from here.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import TYPE_CHECKING

from celery import shared_task, signals

from app.compaction.requests import REFINE_TASK_NAME, TASK_NAME, SendRefine
from app.compaction.service import run_compaction, run_refinement
from app.extensions import services
from app.memory.state import thread_label
from app.observability.metrics import observe_compaction
from app.store.compaction_outcome import Outcome

if TYPE_CHECKING:
    from celery import Celery, Task
    from celery.worker import WorkController

log = logging.getLogger(__name__)


def _load_the_fact_reader() -> None:
    """Load jieba's dictionary and the sentence segmenter (1-3 s) before the first compaction needs them."""
    from app.memory.compaction.record import statement_lines
    from app.memory.state import ThreadMessage

    try:
        statement_lines([ThreadMessage("warm", "user", "我叫林伟。My name is Lin Wei.", "2026-01-01T00:00:00.000Z")])
    except Exception:  # the first compaction loads them itself (and reports what fails)
        log.warning("the fact reader was not loaded ahead of the first compaction", exc_info=True)


def _warm_in_background() -> None:
    threading.Thread(target=_load_the_fact_reader, name="load-fact-reader", daemon=True).start()


def _pool_forks(pool_cls: str | type | None) -> bool:
    """True when ``pool_cls`` (a name such as ``"prefork"`` or a pool class) forks child processes."""
    from celery import concurrency
    from celery.concurrency.prefork import TaskPool as PreforkPool

    try:
        cls = concurrency.get_implementation(pool_cls)
    except Exception:
        return True  # unknown: warm nowhere but in children (the lazy load still works)
    return isinstance(cls, type) and issubclass(cls, PreforkPool)


# No thread may run in a process that forks: a child inherits every lock such a thread holds at the
# fork, locked for ever (jieba's load holds one for seconds).  A prefork pool's children each load the
# fact reader after their fork (``worker_process_init``, in a thread of the child: the pool waits only
# a few seconds for a child to start); a pool that does not fork (``solo``, ``threads``) loads it in the
# worker's own process.  The first compaction waits for that load at most.


@signals.worker_process_init.connect(weak=False)
def _warm_child(**_kwargs: object) -> None:
    _warm_in_background()


@signals.worker_init.connect(weak=False)
def _warm_unforked_worker(sender: WorkController | None = None, **_kwargs: object) -> None:
    if sender is not None and not _pool_forks(getattr(sender, "pool_cls", None)):
        _warm_in_background()


STALE_RESULT = "discarded: stale"
"""The task's return value for a stale compaction: neither a plain success nor a failure."""


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


def _refine_sender(app: Celery) -> SendRefine:
    """Publishes ``refine_thread`` for ``(thread_id, token)`` after ``countdown`` seconds (0: at once)."""
    def send(thread_id: str, token: int, countdown: float) -> None:
        options = {"countdown": retry_countdown_for(app.conf.broker_url, countdown)} if countdown > 0 else {}
        app.send_task(REFINE_TASK_NAME, args=[thread_id, int(token)], **options)
    return send


@shared_task(bind=True, name=TASK_NAME)
def compact_thread(self: Task, thread_id: str, seen_version: int) -> str:
    """Fold one thread's oldest turns beyond the recent window, without a model
    (``app.compaction.service.run_compaction``); ask for a refinement when one applied.

    Args:
        thread_id: ``chat:`` + 64 hex.  Message text never travels in the task.
        seen_version: the version the request saw.

    Returns:
        The outcome: ``fold applied``, ``failed``, ``blocked``, ``skipped``, or ``discarded: stale`` for a result
        discarded because the thread changed meanwhile (``STALE_RESULT``).  There is no result
        backend; Flower shows this value in the task's Result column (docs/memory.md: A compaction).

    Transient failures are retried (``self.retry`` with a jittered exponential countdown,
    at most ``COMPACTION_MAX_RETRIES`` times); the pending marker is kept while a retry waits.
    """
    svc = services()
    outcome = run_compaction(svc, thread_id, seen_version, attempt=self.request.retries,
                             send_refine=_refine_sender(self.app))
    if outcome.entry is not None:
        observe_compaction(svc.redis, outcome.entry)  # counters for /metrics, aggregated through Redis
    if outcome.retry_in is not None:
        raise self.retry(countdown=retry_countdown_for(self.app.conf.broker_url, outcome.retry_in),
                         max_retries=svc.settings.compaction_max_retries)
    if outcome.outcome == Outcome.STALE:
        return STALE_RESULT
    if outcome.outcome == Outcome.APPLIED:
        return FOLD_RESULT
    return str(outcome.outcome)  # Flower shows the repr: a plain str


FOLD_RESULT = "fold applied"
REFINED_RESULT = "refined"
"""The tasks' return values for an applied fold and an applied refinement (Flower's Result column)."""


@shared_task(bind=True, name=REFINE_TASK_NAME)
def refine_thread(self: Task, thread_id: str, token: int) -> str:
    """Add the model's gist and notes for the turns folded since the last refinement, when the thread is
    quiet (``app.compaction.service.run_refinement``).

    Args:
        thread_id: ``chat:`` + 64 hex.
        token: the value of the thread's refinement marker.

    Returns:
        ``refined``, ``waiting: <seconds> s`` (not quiet yet: the task was published again with that
        countdown), ``failed``, ``skipped`` or ``discarded: stale`` (asked again later).  Transient model or
        store failures are retried like the fold's (``COMPACTION_MAX_RETRIES``).
    """
    svc = services()
    outcome = run_refinement(svc, thread_id, token, attempt=self.request.retries)
    if outcome.entry is not None:
        observe_compaction(svc.redis, outcome.entry)
    if outcome.retry_in is not None:
        raise self.retry(countdown=retry_countdown_for(self.app.conf.broker_url, outcome.retry_in),
                         max_retries=svc.settings.compaction_max_retries)
    if outcome.reschedule_in is not None:
        try:
            _refine_sender(self.app)(thread_id, token, outcome.reschedule_in)
        except Exception as exc:  # the marker expires; the next fold asks again
            log.warning("refinement of %s not rescheduled: %s", thread_label(thread_id), type(exc).__name__)
            svc.compaction_requests.release(thread_id, token, refine=True)
        if outcome.outcome == Outcome.STALE:
            return STALE_RESULT
        return f"waiting: {outcome.reschedule_in:.0f} s"
    if outcome.outcome == Outcome.APPLIED:
        return REFINED_RESULT
    return str(outcome.outcome)
