"""The production ``Procfile`` worker as deployed: Celery's prefork pool with its default concurrency.

Each test starts the Procfile's ``worker:`` command exactly as written (``bash -c``, own process
group, production environment; ``tests.test_procfile``) against the test Redis and a real broker:

- a thread written in Chinese is compacted: the prefork children load jieba and the sentence
  segmenter themselves after the fork (``workers.tasks``), none inherits a lock held by a thread
  of the parent;
- a compaction task lost with its broker (a Redis without persistence, restarted) blocks the
  thread's compactions only while the queued marker lives (``COMPACTION_QUEUED_TTL_SECONDS``):
  the next turn that finds a compaction due after that asks again, and the worker applies it;
- a running compaction holds its marker past the queued TTL, so a turn meanwhile does not ask
  for a second one (README: Deployment).
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from app.store.keys import ThreadKeys
from tests.fake_llm import Reply
from tests.fixtures.celery_worker import commit_turn, history, seed_turns, thread_id_for, wait_until
from tests.servers import free_port, port_open, stop
from tests.test_procfile import PROCFILE, prod_env, start, stop_group

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
def test_prefork_worker_compacts_a_chinese_thread(compaction_rig, fake_llm, tmp_path):
    rig = compaction_rig
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    tid = thread_id_for("deployed-chinese")
    result = None
    for n, (user, assistant) in enumerate(CHINESE_TURNS, start=1):
        result = commit_turn(rig.store, tid, n, user=user, assistant=assistant)
    log = tmp_path / "worker.log"
    proc = start("worker", prod_env(rig.settings), log)  # default concurrency, prefork
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
