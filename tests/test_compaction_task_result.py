"""What Flower shows as a compaction task's result (docs/memory.md: A compaction): there is no result backend, so the
task's return value is what its Result column says.  A stale compaction is neither a plain success nor a failure."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import workers.tasks as tasks
from app.compaction.service import CompactionOutcome
from app.store.compaction_outcome import Outcome, Reason
from tests.fixtures.celery_worker import thread_id_for


@pytest.mark.parametrize("outcome, reason, result", [
    ("stale", "generation", "discarded: stale"),
    ("applied", "extractive", "fold applied"),
    ("skipped", "not_due", "skipped"),
    (Outcome.STALE, Reason.GENERATION, "discarded: stale"),
    (Outcome.APPLIED, "extractive", "fold applied"),
    (Outcome.SKIPPED, Reason.NOT_DUE, "skipped"),
    (Outcome.FAILED, Reason.STORE_UNAVAILABLE, "failed"),
    (Outcome.BLOCKED, Reason.CORRUPT, "blocked"),
])
def test_the_task_result_names_a_discarded_compaction(monkeypatch, outcome, reason, result):
    monkeypatch.setattr(tasks, "services", lambda: SimpleNamespace(redis=None, settings=None))
    monkeypatch.setattr(tasks, "observe_compaction", lambda *_args: True)
    monkeypatch.setattr(tasks, "run_compaction",
                        lambda svc, thread_id, version, attempt, send_refine: CompactionOutcome(outcome, reason))
    returned = tasks.compact_thread(thread_id_for("flower"), 7)
    assert returned == result
    assert repr(returned) == repr(result)  # what Flower's Result column shows: the plain string, not an enum's repr
