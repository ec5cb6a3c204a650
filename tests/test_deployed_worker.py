"""The production ``Procfile`` worker as deployed: Celery's prefork pool with its default concurrency.

Each test starts the Procfile's ``worker:`` command exactly as written (``bash -c``, own process
group, production environment; ``tests.helpers.processes``) against the test Redis and a real broker:

- a thread written in Chinese is compacted: the prefork children load jieba and the sentence
  segmenter themselves after the fork (``workers.tasks``), none inherits a lock held by a thread
  of the parent;
- a compaction task lost with its broker (a Redis without persistence, restarted) blocks the
  thread's compactions only while the queued marker lives (``COMPACTION_QUEUED_TTL_SECONDS``):
  the next turn that finds a compaction due after that asks again, and the worker applies it;
- a running refinement (the step that waits on the model) holds its marker past the queued TTL, so a
  fold meanwhile, which runs at once beside it, does not ask for a second one (docs/deployment.md);
- with the ``refiner:`` process beside it (refinements on their own ``refine`` queue), a fold for one
  thread is applied while two other threads' refinements wait on a slow model: folds never queue
  behind refinements.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from app.store.keys import ThreadKeys
from chat_support.fake_llm import Reply
from chat_support.processes import PROCFILE, prod_env, stop_group
from chat_support.servers import free_port, port_open
from tests.fixtures.celery_worker import (
    commit_turn,
    folded_section,
    history,
    rendered,
    seed_turns,
    thread_id_for,
    wait_no_refinement,
    wait_until,
)

ANSWER = {"summary": "They talked about where they live.", "pinnedDecisions": []}

CHINESE_TURNS = [
    ("我叫林伟，住在杭州西湖区。", "你好林伟，杭州西湖区是个好地方，我记住了你住在那里，以后聊天时会想起来的。"),
    ("我们决定把数据库迁移推迟到4月2日，负责人是王芳。", "好的，数据库迁移推迟到4月2日，由王芳负责，我会记住这个安排和负责人。"),
    ("下周三我要去上海出差，会议定在下午三点半。", "明白了，下周三去上海出差，下午三点半开会，祝你一路顺利，会议成功。"),
    ("服务器有16核，内存64GB，集群需要3个副本。", "收到，服务器16核、内存64GB，集群需要3个副本，这个配置很充足。"),
    ("我今年35岁，体重68公斤。", "好的，你今年35岁，体重68公斤，我都记下来了，有需要时可以随时问我。"),
    ("张伟和李娜明天去北京开会。", "张伟和李娜明天去北京开会，希望他们一路平安，会议顺利，早点回来。"),
]


def test_the_worker_command_uses_the_prefork_pool_by_default():
    command = PROCFILE["worker"]
    assert "--pool" not in command and " -P " not in command  # Celery's default: prefork
    assert "--concurrency ${WORKER_CONCURRENCY:-2}" in command


def worker_log(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def wait_worker_ready(proc: subprocess.Popen, log: Path, timeout: float = 90.0) -> str:
    """Wait until the worker logs ``ready.`` (its pool's children are forked by then); return the log."""
    def ready():
        assert proc.poll() is None, f"worker exited with {proc.returncode}: {worker_log(log)[-3000:]}"
        return "ready." in worker_log(log)
    wait_until(ready, timeout, message="the worker to be ready")
    return worker_log(log)


@pytest.mark.slow
def test_prefork_worker_compacts_a_chinese_thread(procfile, compaction_rig, fake_llm, tmp_path):
    rig = compaction_rig
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    tid = thread_id_for("deployed-chinese")
    result = None
    for n, (user, assistant) in enumerate(CHINESE_TURNS, start=1):
        result = commit_turn(rig.store, tid, n, user=user, assistant=assistant)
    log = tmp_path / "worker.log"
    proc = procfile.start("worker", prod_env(rig.settings), log)  # default concurrency, prefork
    try:
        text = wait_worker_ready(proc, log)
        assert "concurrency: 2 (prefork)" in text
        assert rig.request(tid, result)
        # Loaded per child after the fork: well inside the 110 s soft time limit a stuck lock would run into.
        entries = rig.wait_outcome(tid, "applied", timeout=60)
        rig.wait_idle(tid)
        state = rig.store.load(tid)
        assert [e["outcome"] for e in entries] == ["applied"]
        assert [m.id for m in state.messages] == [x for n in range(3, 7) for x in (f"u{n}", f"a{n}")]
        assert "林伟" in state.summary and "4月2日" in state.summary and "王芳" in state.summary
        assert "SoftTimeLimitExceeded" not in worker_log(log)
    finally:
        assert stop_group(proc) in (0, -signal.SIGTERM)


class BrokerRedis:
    """A ``redis-server`` of the test's own as the Celery broker, without persistence (no RDB, no AOF):
    a restart comes back empty, as a broker's restart without persistence loses its queue."""

    def __init__(self, tmp_path: Path):
        self.port = free_port()
        self.dir = tmp_path
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "BrokerRedis":
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: port_open(self.port), 10, message="the broker to listen")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()  # gone with whatever it held
            self.proc.wait(10)
            self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True)


@pytest.fixture
def broker(tmp_path):
    server = BrokerRedis(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()


def marker_ttl_now(rig, tid: str) -> int:
    """The marker's remaining seconds (-2: no marker)."""
    return rig.client.ttl(ThreadKeys(tid).compacting)


@pytest.mark.slow
def test_a_task_lost_with_its_broker_is_requested_again_after_the_queued_ttl(procfile, make_compaction_rig, fake_llm,
                                                                             broker, tmp_path):
    queued_ttl = 3
    rig = make_compaction_rig(celery_broker_url=broker.url, compaction_queued_ttl=queued_ttl)
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    tid = thread_id_for("deployed-lost-task")
    result = seed_turns(rig.store, tid, 5)
    assert rig.request(tid, result)
    with broker.client() as client:
        assert client.llen("compaction") == 1
    broker.stop()
    broker.start()  # no persistence: the queued task is gone
    with broker.client() as client:
        assert client.llen("compaction") == 0
    # A turn right after: the lost task's marker still stands, so nothing is asked yet ...
    assert rig.request(tid, commit_turn(rig.store, tid, 6)) is False
    assert 0 < marker_ttl_now(rig, tid) <= queued_ttl
    log = tmp_path / "worker.log"
    proc = procfile.start("worker", prod_env(rig.settings, CELERY_BROKER_URL=broker.url,
                                    COMPACTION_QUEUED_TTL_SECONDS=str(queued_ttl)), log)
    try:
        wait_worker_ready(proc, log)
        # ... but only while the queued marker lives: then the next turn that finds a compaction due asks again.
        wait_until(lambda: marker_ttl_now(rig, tid) == -2, queued_ttl + 5, message="the lost task's marker to expire")
        assert history(rig.client, tid) == []
        assert rig.request(tid, commit_turn(rig.store, tid, 7)) is True
        entries = rig.wait_outcome(tid, "applied", timeout=60)
        rig.wait_idle(tid)
        assert [e["outcome"] for e in entries] == ["applied"]
        state = rig.store.load(tid)
        assert state.summary.endswith("(turns 1–3 of this conversation)")
        assert [m.id for m in state.messages] == [x for n in range(4, 8) for x in (f"u{n}", f"a{n}")]
    finally:
        assert stop_group(proc) in (0, -signal.SIGTERM)


@pytest.mark.slow
def test_a_running_compaction_holds_its_marker_past_the_queued_ttl(procfile, make_compaction_rig, fake_llm, tmp_path):
    queued_ttl = 3
    rig = make_compaction_rig(compaction_queued_ttl=queued_ttl)
    fake_llm.enqueue(Reply(json=ANSWER, delay=2 * queued_ttl + 2), structured=True)  # the first refinement's call
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    tid = thread_id_for("deployed-held-marker")
    refining = ThreadKeys(tid).refining
    log = tmp_path / "worker.log"
    # a refinement right after each fold; one that has to wait for quiet again waits a second
    env = prod_env(rig.settings, COMPACTION_QUEUED_TTL_SECONDS=str(queued_ttl), COMPACTION_REFINE_AFTER_FOLDS="1",
                   COMPACTION_IDLE_SECONDS="1")
    proc = procfile.start("worker", env, log)
    refiner = procfile.start("refiner", env, tmp_path / "refiner.log")
    try:
        wait_worker_ready(proc, log)
        wait_worker_ready(refiner, tmp_path / "refiner.log")
        assert rig.request(tid, seed_turns(rig.store, tid, 6))  # folds turns 1-2, then asks for their refinement
        fake_llm.wait_for_requests(1, "structured", timeout=60)
        # The refinement holds its marker for its hard time limit (120 s) plus the queued TTL.
        assert 120 < rig.client.ttl(refining) <= 120 + queued_ttl
        time.sleep(queued_ttl + 1)  # past the queued TTL; the model still answers
        assert [(e["outcome"], e["step"]) for e in history(rig.client, tid)] == [("applied", "fold")]
        assert rig.client.get(refining) == "2" and rig.client.ttl(refining) > 120 - queued_ttl - 2
        # Turn 7 makes a fold due: it runs at once, beside the refinement (a fold never waits for the model),
        # and finds the refinement's marker held: it asks for no second refinement.
        assert rig.request(tid, commit_turn(rig.store, tid, 7)) is True
        rig.wait_outcome(tid, "applied", count=2, timeout=30)
        rig.wait_idle(tid)
        assert [(e["outcome"], e["step"]) for e in history(rig.client, tid)] == [("applied", "fold")] * 2
        assert rig.client.get(refining) == "2" and rig.client.llen("compaction") == 0
        assert len(fake_llm.chat_requests("structured")) == 1
        # The refinement read the thread before that fold: it is discarded, waits for quiet again and then
        # refines turns 1-3 in one call, after the first call ended: two refinements one after the other,
        # never two at once.
        rig.wait_outcome(tid, "applied", count=3, timeout=60)
        wait_no_refinement(rig, tid)
        assert [(e["outcome"], e["step"]) for e in history(rig.client, tid)] == [
            ("applied", "refine"), ("stale", "refine"), ("applied", "fold"), ("applied", "fold")]
        first, second = fake_llm.chat_requests("structured")
        assert second.time >= first.end_time
        assert folded_section(first.body) == rendered([1, 2]) and folded_section(second.body) == rendered([1, 2, 3])
        state = rig.store.load(tid)
        assert state.summary.endswith("\n- About: " + ANSWER["summary"] + "\n(turns 1–3 of this conversation)")
        assert [m.id for m in state.messages] == [x for n in range(4, 8) for x in (f"u{n}", f"a{n}")]
    finally:
        assert stop_group(refiner) in (0, -signal.SIGTERM)
        assert stop_group(proc) in (0, -signal.SIGTERM)


def steps(rig, tid: str) -> list[tuple[str, str]]:
    """The thread's compaction history as ``(outcome, step)``, newest first."""
    return [(e["outcome"], e["step"]) for e in history(rig.client, tid)]


@pytest.mark.slow
def test_a_fold_is_applied_while_two_other_threads_refinements_wait_on_a_slow_model(procfile, compaction_rig, fake_llm,
                                                                                    tmp_path):
    rig = compaction_rig
    slow = 12  # seconds each of the first two refinements' model calls takes
    fake_llm.enqueue(Reply(json=ANSWER, delay=slow), structured=True)  # thread A's refinement
    fake_llm.enqueue(Reply(json=ANSWER, delay=slow), structured=True)  # thread B's refinement
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)  # thread C's, after them
    first, second, third = (thread_id_for(f"deployed-fold-queue-{x}") for x in "abc")
    # a refinement right after each fold (the Procfile's shape: the worker and the refiner, prefork)
    env = prod_env(rig.settings, COMPACTION_REFINE_AFTER_FOLDS="1", COMPACTION_IDLE_SECONDS="1")
    logs = {name: tmp_path / f"{name}.log" for name in ("worker", "refiner")}
    procs = {name: procfile.start(name, env, log) for name, log in logs.items()}
    try:
        for name, proc in procs.items():
            wait_worker_ready(proc, logs[name])
        assert "concurrency: 1 (prefork)" in worker_log(logs["refiner"])
        assert "concurrency: 2 (prefork)" in worker_log(logs["worker"])
        assert rig.request(first, seed_turns(rig.store, first, 6))
        fake_llm.wait_for_requests(1, "structured", timeout=60)  # A's refinement waits on the model
        assert rig.request(second, seed_turns(rig.store, second, 6))
        rig.wait_outcome(second, "applied", timeout=30)  # B's fold; its refinement queues behind A's
        wait_until(lambda: rig.client.llen("refine") == 1, 30, message="B's refinement on the refine queue")
        assert rig.request(third, seed_turns(rig.store, third, 6))
        rig.wait_outcome(third, "applied", timeout=30)
        # C's fold applied while both slower refinements were still to end: neither has written anything.
        assert steps(rig, third) == [("applied", "fold")]
        assert steps(rig, first) == [("applied", "fold")] and steps(rig, second) == [("applied", "fold")]
        assert len(fake_llm.chat_requests("structured")) == 1 and rig.client.llen("refine") >= 1
        assert [m.id for m in rig.store.load(third).messages] == [x for n in range(3, 7) for x in (f"u{n}", f"a{n}")]
        # Then the refinements apply, one at a time, A's first: C's after them.
        for tid in (first, second, third):
            rig.wait_outcome(tid, "applied", count=2, timeout=3 * slow + 30)
            wait_no_refinement(rig, tid, timeout=30)
            assert steps(rig, tid) == [("applied", "refine"), ("applied", "fold")]
        calls = fake_llm.chat_requests("structured")
        assert len(calls) == 3 and calls[1].time >= calls[0].end_time and calls[2].time >= calls[1].end_time
        assert "Task workers.compact_thread[" not in worker_log(logs["refiner"])
        assert "Task workers.refine_thread[" not in worker_log(logs["worker"])
        assert "Task workers.compact_thread[" in worker_log(logs["worker"])
    finally:
        for proc in procs.values():
            assert stop_group(proc) in (0, -signal.SIGTERM)


def test_holding_the_marker_keeps_a_newer_requests_marker(store, redis_client):
    tid = thread_id_for("hold-marker")
    marker = ThreadKeys(tid).compacting
    assert store.mark_compaction_pending(tid, 5, 3) is True
    assert store.markers.hold_compaction_marker(tid, 5, 200) is True
    assert (redis_client.get(marker), 195 <= redis_client.ttl(marker) <= 200) == ("5", True)
    redis_client.delete(marker)  # expired while the task was queued: set again for the task that runs
    assert store.markers.hold_compaction_marker(tid, 5, 100) is True
    assert (redis_client.get(marker), 95 <= redis_client.ttl(marker) <= 100) == ("5", True)
    redis_client.set(marker, "7", ex=30)  # a newer request's marker is left as it is
    assert store.markers.hold_compaction_marker(tid, 5, 100) is False
    assert (redis_client.get(marker), redis_client.ttl(marker) <= 30) == ("7", True)
