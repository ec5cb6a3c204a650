"""Asking for a compaction after a committed turn: due? then one pending marker, then the task by name.

A compaction runs in two speeds (docs/memory.md: A compaction): the *fold* (``TASK_NAME``), asked here after
every commit that leaves more than ``MEMORY_RECENT_TURNS`` whole turns stored, moves the oldest
turns into the record and the archive without a model; the *refinement* (``REFINE_TASK_NAME``),
asked by an applied fold (``request_refinement``), adds the model's gist and notes later, when
the thread is quiet.  A turn marks its thread ``streaming`` while it streams and ``idle`` for
``COMPACTION_IDLE_SECONDS`` after (``turn_streaming``, ``turn_ended``).

``CompactionRequests.after_commit`` is what the turn runner calls right after a
commit.  When ``compaction_due`` says so it sets the thread's one-pending marker
(SET NX EX, holding the version it saw) and publishes ``TASK_NAME`` with the
thread id and that version only, never the data.  A second request while one is
pending does nothing; a duplicate delivery is harmless (the task re-reads and
commits with a compare-and-set).  Store or broker failures are logged and never
reach the turn.

The marker never outlives its task by more than ``COMPACTION_QUEUED_TTL_SECONDS``
(docs/deployment.md): it expires that long after the request unless the task
starts, which holds it for as long as the attempt may run (its hard time limit)
plus that TTL again, and, before a retry, for the countdown plus that TTL.  A task
lost with its broker therefore blocks the thread's compactions for at most the
queued TTL; the next turn that finds a compaction due after that asks again.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Callable

from app.memory.compaction import compaction_due
from app.memory.state import thread_label
from app.store.compaction_markers import Activity
from app.store.errors import StoreUnavailable
from app.store.thread_store import ThreadStore

if TYPE_CHECKING:
    from app.settings import Settings

log = logging.getLogger(__name__)

TASK_NAME = "workers.compact_thread"
"""The fold task's name (``workers/tasks.py`` registers it; routing sends it to the ``compaction`` queue)."""
REFINE_TASK_NAME = "workers.refine_thread"
"""The refinement task's name (the model's part of a compaction; routed to its own ``refine`` queue, so a
fold never waits behind one: ``app.celery_setup``)."""

SendTask = Callable[[str, int], None]
"""Publishes the compaction task for ``(thread_id, version)``; raises on a broker failure."""
SendRefine = Callable[[str, int, float], None]
"""Publishes the refinement task for ``(thread_id, token)`` after ``countdown`` seconds; raises on a broker failure."""

STREAMING, IDLE = Activity.STREAMING, Activity.IDLE
"""The values of a thread's activity key (``ThreadKeys.active``; ``app.store.compaction_markers.Activity``)."""
ACTIVITY_MARGIN_SECONDS = 30
"""How much longer than ``LLM_TURN_TIMEOUT_SECONDS`` a ``streaming`` mark lives (a turn whose process died)."""


def queued_marker_ttl(settings: Settings) -> int:
    """Seconds the marker lives from the request until the task starts (``COMPACTION_QUEUED_TTL_SECONDS``)."""
    return int(settings.compaction_queued_ttl)


def running_marker_ttl(settings: Settings) -> int:
    """Seconds a started attempt holds the marker: its hard time limit plus the queued TTL.

    The task releases the marker at its final outcome; the expiry only covers an attempt that
    never reaches one (its process killed at the hard limit, or lost).
    """
    return int(settings.compaction_time_limit + settings.compaction_queued_ttl)


def retry_marker_ttl(settings: Settings, countdown: float) -> int:
    """Seconds a marker is held while its task waits ``countdown`` seconds (a retry's backoff, or a refinement
    waiting for the thread to be quiet): that wait, rounded up, plus the queued TTL."""
    return int(math.ceil(countdown) + settings.compaction_queued_ttl)


class CompactionRequests:
    """The web side's way to ask for compactions.

    Args:
        store: the thread store (the marker lives with the thread).
        settings: ``Settings`` (limits, prompt budget, the marker's expiries).
        send: publishes the task (``celery.send_task(TASK_NAME, args=[thread_id, version])``).
    """

    def __init__(self, store: ThreadStore, settings: Settings, send: SendTask) -> None:
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
            if not self.store.mark_compaction_pending(thread_id, version, queued_marker_ttl(settings)):
                return False
        except StoreUnavailable as exc:
            log.warning("compaction for %s not requested: store unavailable (%s)", thread_label(thread_id), exc)
            return False
        try:
            self.send(thread_id, int(version))
        except Exception as exc:
            log.warning("compaction for %s not enqueued: %s", thread_label(thread_id), type(exc).__name__)
            self.release(thread_id, version)
            return False
        log.info("compaction requested for %s at version %s", thread_label(thread_id), version)
        return True

    def turn_streaming(self, thread_id: str) -> None:
        """Mark the thread's turn as streaming (no refinement starts meanwhile); never raises."""
        self._mark(thread_id, STREAMING, self.settings.llm_turn_timeout + ACTIVITY_MARGIN_SECONDS)

    def turn_ended(self, thread_id: str) -> None:
        """Mark the thread as busy for ``COMPACTION_IDLE_SECONDS`` more after a turn ended; never raises."""
        self._mark(thread_id, IDLE, self.settings.compaction_idle_seconds)

    def _mark(self, thread_id: str, activity: str, seconds: float) -> None:
        try:
            self.store.markers.mark_activity(thread_id, activity, seconds)
        except Exception as exc:  # never changes a turn: a refinement may then start during it
            log.warning("activity of %s not marked: %s", thread_label(thread_id), type(exc).__name__)

    def request_refinement(self, thread_id: str, token: int, unrefined_folds: int, send: SendRefine | None) -> bool:
        """After an applied fold: ask for the model's part once (one pending refinement per thread).

        The task is published with a countdown of ``COMPACTION_IDLE_SECONDS``, or at once when
        ``unrefined_folds`` reached ``COMPACTION_REFINE_AFTER_FOLDS``; the task itself re-checks (quiet?
        streaming?) and publishes itself again when it is too early.  Nothing is asked with
        ``COMPACTION_STRATEGY=extractive`` or without ``send``.

        Returns:
            True when a refinement was published.  Failures are logged and give False.
        """
        settings = self.settings
        if send is None or settings.compaction_strategy != "llm":
            return False
        due_now = unrefined_folds >= settings.compaction_refine_after_folds and not settings.bundled_model
        countdown = 0.0 if due_now else float(settings.compaction_idle_seconds)
        try:
            if not self.store.mark_compaction_pending(thread_id, token, retry_marker_ttl(settings, countdown),
                                                      refine=True):
                return False
        except StoreUnavailable as exc:
            log.warning("refinement for %s not requested: store unavailable (%s)", thread_label(thread_id), exc)
            return False
        try:
            send(thread_id, int(token), countdown)
        except Exception as exc:
            log.warning("refinement for %s not enqueued: %s", thread_label(thread_id), type(exc).__name__)
            self.release(thread_id, token, refine=True)
            return False
        log.info("refinement requested for %s in %.0f s (%d folds without it)", thread_label(thread_id), countdown,
                 unrefined_folds)
        return True

    def block(self, thread_id: str, reason: str) -> None:
        """Stop asking for folds of this thread for ``COMPACTION_BLOCKED_SECONDS`` (a reason a retry will not
        fix); a clear lifts it.  Never raises."""
        try:
            self.store.markers.block_compactions(thread_id, reason, self.settings.compaction_blocked_seconds)
        except StoreUnavailable as exc:
            log.warning("compactions of %s not marked as blocked: %s", thread_label(thread_id), exc)

    def release(self, thread_id: str, version: int, *, refine: bool = False) -> None:
        """Release the pending marker if it still holds ``version`` (it expires otherwise)."""
        try:
            self.store.markers.release_compaction_marker(thread_id, version, refine=refine)
        except StoreUnavailable as exc:
            log.warning("compaction marker for %s not released (it expires): %s", thread_label(thread_id), exc)

    def hold(self, thread_id: str, version: int, seconds: int, *, refine: bool = False) -> bool:
        """Hold the marker of the task for ``version`` for ``seconds`` more (set again when it expired).

        Returns False when another request's marker stands (this task then runs as a harmless
        duplicate) or the store failed (logged; the marker keeps its expiry).
        """
        try:
            return self.store.markers.hold_compaction_marker(thread_id, version, seconds, refine=refine)
        except StoreUnavailable as exc:
            log.warning("compaction marker for %s not held (it expires): %s", thread_label(thread_id), exc)
            return False
