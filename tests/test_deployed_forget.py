"""A forgotten word, against the Procfile's real processes (docs/memory.md: "Forget and provenance"; docs/contract.md:
Forget and provenance): the ``web`` (gunicorn, gevent, ``--preload``, two workers, production) and the ``worker``
(Celery, prefork, RabbitMQ at 127.0.0.1:5672 as the broker) on a Redis of their own, and the fake model recording
every request.

A visitor plants a word in turn 3 of 7; the worker folds turn 3 into the record and the archive; a recall question
brings the word into the chat prompt.  Once no compaction or refinement is pending, ``DELETE /api/chat/turns/3``
forgets it; the worker and the web are stopped and started again (fresh processes, empty caches); 30 more turns
follow, every third a recall question that would match the word, with folds after every turn and a refinement
after every second fold (``COMPACTION_REFINE_AFTER_FOLDS=2``).  Then:

- no request the model received after the forget holds the word (chat turns and refinements alike), and
  refinements did ask the model after it;
- no API response holds it (``/api/chat/thread``, ``/inspector``, ``/export``, ``/stats``, ``/turns/3``, whose
  ``reason`` is ``forgotten``);
- no Redis key holds it, in its name or its value (SCAN of every key, each read by its type);
- no log line of the web or the worker holds it (logs never hold message text);
- the phrase preview (``GET /api/chat/forget?phrase=``) finds nothing, and no log holds the phrase (the access
  log names paths without their query).
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from app.store.keys import ThreadKeys
from chat_support.fake_llm import FakeLLM, Reply
from chat_support.processes import PROCFILE, ROOT, stop_group
from tests.fixtures.celery_worker import history, wait_until
from tests.fixtures.deployed_web import Deployed, Visitor
from tests.fixtures.lanes import starts_processes
from tests.helpers.store_dump import store_text

WORD = "zebrafinch"
PLANTED = f"My locker code is {WORD}-4471, keep it safe."
RECALL = "Which locker code did I give you, the one to keep safe?"
ANSWER = "Noted, I am glad to help with that."
GIST = {"summary": "They talked about numbers.", "pinnedDecisions": []}
WINDOW = 8  # messages: MEMORY_RECENT_TURNS (4) whole turns


@pytest.fixture
def model():
    with FakeLLM(default=Reply(text=ANSWER)) as llm:
        llm.add_rule(Reply(json=GIST), structured=True)
        yield llm


@pytest.fixture
def web(model, procfile, amqp_url, tmp_path):
    # a refinement after every second fold, and one second of quiet is enough for it; 38 turns within minutes
    # from one session and address: no turn budget (0)
    with procfile.deployed_web(model, tmp_path, CELERY_BROKER_URL=amqp_url, COMPACTION_REFINE_AFTER_FOLDS="2",
                      COMPACTION_IDLE_SECONDS="1", TURNS_PER_MINUTE_PER_SESSION="0",
                      TURNS_PER_MINUTE_PER_CLIENT="0") as deployed:
        yield deployed


class Worker:
    """The Procfile's ``worker`` and ``refiner`` with the web's variables (its store, broker and model); ``restart()`` stops the
    process group (SIGTERM: a cold shutdown) and starts a new one.  Each start logs to ``worker-<n>.log``."""

    def __init__(self, web: Deployed, log_dir: Path):
        self.env = dict(web.env, WORKER_CONCURRENCY="1")
        self.log_dir, self.starts = log_dir, 0
        self.proc: subprocess.Popen | None = None
        self.logs: list[Path] = []

    def start(self) -> "Worker":
        self.starts += 1
        log = self.log_dir / f"worker-{self.starts}.log"
        self.logs.append(log)
        with open(log, "w") as out:  # the Procfile's worker (folds) and refiner, one process group, one log
            self.proc = subprocess.Popen(["bash", "-c", f"{PROCFILE['worker']} & {PROCFILE['refiner']} & wait"],
                                         cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

        def ready():
            assert self.proc.poll() is None, f"worker exited with {self.proc.returncode}: {log.read_text()[-3000:]}"
            return log.exists() and log.read_text().count("ready.") == 2
        wait_until(ready, 120, message="the worker to be ready", interval=0.2)
        return self

    def stop(self) -> int:
        return stop_group(self.proc) if self.proc is not None else 0

    def restart(self) -> int:
        code = self.stop()
        self.start()
        return code

    def log_text(self) -> str:
        return "".join(log.read_text() for log in self.logs if log.exists())


@pytest.fixture
@starts_processes()
def worker(web, tmp_path):
    running = Worker(web, tmp_path)
    try:
        yield running.start()
    finally:
        running.stop()


def settled(web: Deployed, tid: str) -> bool:
    """No fold or refinement pending or due: no marker, no fold without its refinement, the window not passed."""
    keys = ThreadKeys(tid)
    if web.redis.exists(keys.compacting, keys.refining):
        return False
    raw = web.redis.hgetall(keys.state)
    return int(raw.get("uf") or 0) == 0 and len(json.loads(raw.get("messages") or "[]")) <= WINDOW


def wait_settled(web: Deployed, tid: str) -> None:
    wait_until(lambda: settled(web, tid), 60, message="no compaction or refinement pending", interval=0.1)


def sent_to_model(requests) -> str:
    """Every recorded request (path, headers, body) as one lower-case text."""
    return json.dumps([r.to_dict() for r in requests], ensure_ascii=False, default=str).lower()


def turn(visitor: Visitor, text: str) -> None:
    """One turn over the socket; it must complete and be saved (any error frame ends and fails it)."""
    visitor.chat.send({"type": "message", "text": text})
    frames = visitor.chat.recv_until(lambda f: f["type"] in ("done", "error"), timeout=60)
    assert frames[-1]["type"] == "done" and frames[-1]["status"] == "completed", frames
    assert "saved" not in frames[-1], frames


def test_a_forgotten_word_stays_gone_across_a_restart_of_the_worker_and_the_web(web, worker, model):
    visitor = Visitor(web)
    try:
        tid = visitor.thread()["threadId"]
        visitor.connect()
        for n in range(1, 8):
            turn(visitor, PLANTED if n == 3 else f"tell me about the number {n} please")
        # the worker folds turns 1-3 (four whole turns stay recent): turn 3 is in the archive and the record
        wait_until(lambda: visitor.request("GET", "/api/chat/turns/3").json()["where"] == "archive", 60,
                   message="turn 3 to be folded into the archive", interval=0.1)
        assert WORD in json.dumps(web.redis.hgetall(ThreadKeys(tid).state)).lower()  # in the record
        turn(visitor, RECALL)
        assert WORD in sent_to_model([model.last_request("stream")])  # the recall question's prompt holds it
        wait_settled(web, tid)  # nothing read before the forget is still on its way to the model
        assert any(e["step"] == "refine" and e["outcome"] == "applied" for e in history(web.redis, tid))

        forgotten = visitor.request("DELETE", "/api/chat/turns/3")  # Origin: the web's own
        assert forgotten.status_code == 200, forgotten.text
        assert forgotten.json()["forgotten"]["turn"] == 3 and forgotten.json()["forgotten"]["archive"] is True
        after_forget = len(model.requests)

        visitor.close()
        assert worker.restart() in (0, -signal.SIGTERM)
        assert web.restart() == 0
        wait_until(lambda: web.log_text().count("Booting worker with pid") == 2, 60, message="both web processes")
        visitor.connect()

        for n in range(30):
            turn(visitor, RECALL if n % 3 == 0 else f"and the number {n + 10}, what do you think about it?")
        wait_settled(web, tid)

        since = model.requests[after_forget:]
        assert len([r for r in since if r.kind == "stream"]) == 30
        assert [r for r in since if r.kind == "structured"], "no refinement asked the model after the forget"
        assert WORD not in sent_to_model(since)
        entries = history(web.redis, tid)  # newest first
        newer = entries[:next(i for i, e in enumerate(entries) if e.get("reason") == "forgotten")]
        assert {(e["step"], e["outcome"]) for e in newer} >= {("fold", "applied"), ("refine", "applied")}
        assert "succeeded" in worker.logs[-1].read_text() and "'refined'" in worker.logs[-1].read_text()  # the new one

        for path in ("/api/chat/thread", "/api/chat/inspector", "/api/chat/export", "/api/chat/stats",
                     "/api/chat/turns/3"):
            response = visitor.request("GET", path)
            assert response.status_code == 200, path
            assert WORD not in response.text.lower(), path
        gone = visitor.request("GET", "/api/chat/turns/3").json()
        assert (gone["where"], gone["reason"], gone["messages"]) == ("gone", "forgotten", [])
        assert WORD not in store_text(web.redis).lower()
        preview = visitor.request("GET", "/api/chat/forget", params={"phrase": WORD})
        assert preview.status_code == 200 and preview.json()["items"] == []
        # the logs, the access log included (it names paths without their query: the phrase above is not there)
        def logs() -> str:
            return "".join(log.read_text() for log in sorted(web.log.parent.glob("web*.log"))) + worker.log_text()
        wait_until(lambda: "GET /api/chat/forget HTTP/1.1" in logs(), 10, message="the access log's line")  # after the reply
        assert WORD not in logs().lower()
    finally:
        visitor.close()
