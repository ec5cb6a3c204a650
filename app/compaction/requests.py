"""Asking for a compaction after a committed turn: due? then one pending marker, then the task by name.

``CompactionRequests.after_commit`` is what the turn runner calls right after a
commit.  When ``compaction_due`` says so it sets the thread's one-pending marker
(SET NX EX, holding the version it saw) and publishes ``TASK_NAME`` with the
thread id and that version only, never the data.  A second request while one is
pending does nothing; a duplicate delivery is harmless (the task re-reads and
commits with a compare-and-set).  Store or broker failures are logged and never
reach the turn.
"""

from __future__ import annotations

import logging
from typing import Callable

from app.memory.compaction import compaction_due
from app.store.thread_store import StoreUnavailable, ThreadStore

log = logging.getLogger(__name__)

TASK_NAME = "workers.compact_thread"
"""The Celery task's name (``workers/tasks.py`` registers it; routing sends it to the ``compaction`` queue)."""

SendTask = Callable[[str, int], None]
"""Publishes the compaction task for ``(thread_id, version)``; raises on a broker failure."""


def marker_ttl(settings) -> int:
    """Seconds the pending marker lives: every attempt at its time limit plus the longest backoffs, plus a minute.

    The marker is a safety net only: the task releases it at its final outcome.
    """
    attempts = settings.compaction_max_retries + 1
    backoffs = sum(min(settings.compaction_retry_backoff * 2 ** n, 600) for n in range(settings.compaction_max_retries))
    return int(settings.compaction_time_limit * attempts + backoffs + 60)


class CompactionRequests:
    """The web side's way to ask for compactions.

    Args:
        store: the thread store (the marker lives with the thread).
        settings: ``Settings`` (limits, prompt budget, retry figures for the marker's TTL).
        send: publishes the task (``celery.send_task(TASK_NAME, args=[thread_id, version])``).
    """

    def __init__(self, store: ThreadStore, settings, send: SendTask):
        self.store = store
        self.settings = settings
        self.send = send

    def after_commit(self, thread_id: str, *, message_count: int, uncompacted_tokens: int, version: int) -> bool:
        """Enqueue a compaction when one is due after a commit.

        Args:
            thread_id: ``chat:`` + 64 hex.
            message_count: messages stored after the commit.
            uncompacted_tokens: tokens of the stored messages' texts.
            version: the thread's version after the commit.

        Returns:
            True when a compaction was enqueued.  Failures are logged and give False.
        """
        settings = self.settings
        if not compaction_due(message_count, uncompacted_tokens, settings.limits, settings.prompt_budget):
            return False
        try:
            if not self.store.mark_compaction_pending(thread_id, version, marker_ttl(settings)):
                return False
        except StoreUnavailable as exc:
            log.warning("compaction for %s not requested: store unavailable (%s)", thread_id[:13], exc)
            return False
        try:
            self.send(thread_id, int(version))
        except Exception as exc:
            log.warning("compaction for %s not enqueued: %s", thread_id[:13], type(exc).__name__)
            self.release(thread_id, version)
            return False
        log.info("compaction requested for %s at version %s", thread_id[:13], version)
        return True

    def release(self, thread_id: str, version: int) -> None:
        """Release the pending marker if it still holds ``version`` (it expires otherwise)."""
        try:
            self.store.release_compaction_marker(thread_id, version)
        except StoreUnavailable as exc:
            log.warning("compaction marker for %s not released (it expires): %s", thread_id[:13], exc)
