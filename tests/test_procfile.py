"""The production ``Procfile``, run for real the way a Heroku-style platform runs it.

Each process type's command line is read from ``Procfile`` and run with
``bash -c`` in a new process group, with a production environment (``APP_ENV=
production``, ``$PORT``, the test Redis, the fake LLM):

- ``web``: gunicorn (gevent by default, gthread with ``WEB_WORKER_CLASS``; ``--preload``)
  binds ``0.0.0.0:$PORT``, answers ``/healthz``, a websocket turn streams coalesced deltas
  and is kept in memory, and a cancelled turn stops the model and keeps nothing; a bad
  configuration gives one ``config error`` line and exit 3 (nothing else).
- ``worker`` (folds, ``compaction`` queue) and ``refiner`` (refinements, ``refine`` queue, one at a time):
  a SIGTERM to the refiner's processes while a refinement (the compaction step that
  waits on the model) runs puts the task back on its queue at once (``REMAP_SIGTERM=SIGQUIT``: cold shutdown,
  the late-acknowledged message is requeued, not left for the 1-hour visibility
  timeout), and the next worker applies it exactly once.
- ``flower``: binds ``$PORT`` and asks for ``FLOWER_BASIC_AUTH``.
- ``release``: the configuration check.
"""

from __future__ import annotations

import re
import signal
import time

import pytest
import requests

from app.store.keys import ThreadKeys
from chat_support.config_env import PASSWORD
from chat_support.fake_llm import Reply, words
from chat_support.live_app import ChatClient, answer_text, frame_kinds
from chat_support.processes import PROCFILE, prod_env, stop_group
from chat_support.servers import free_port, wait_http
from tests.fixtures.celery_worker import asked, history, raw_hash, record, seed_turns, thread_id_for, wait_until

ANSWER = {"summary": "They talked about the numbers one and two.", "pinnedDecisions": ["Keep answers short"]}


def test_the_procfile_has_the_contract_process_types():
    assert sorted(PROCFILE) == ["flower", "refiner", "release", "web", "worker"]
    assert PROCFILE["web"].startswith(
        "gunicorn wsgi:app -c gunicorn.conf.py --preload --worker-class ${WEB_WORKER_CLASS:-gevent} ")
    assert "--bind 0.0.0.0:${PORT:-5000}" in PROCFILE["web"]
    assert "--threads ${WEB_THREADS:-64}" in PROCFILE["web"]  # the same default as Settings.web_threads
    assert PROCFILE["worker"].startswith("REMAP_SIGTERM=SIGQUIT celery -A celery_app worker -Q compaction ")
    # refinements have a worker of their own, one at a time: a fold never waits behind one
    assert PROCFILE["refiner"].startswith("REMAP_SIGTERM=SIGQUIT celery -A celery_app worker -Q refine ")
    assert "--concurrency 1 " in PROCFILE["refiner"] and "-n refiner@%h" in PROCFILE["refiner"]
    assert "--port=${PORT:-5555}" in PROCFILE["flower"]


@pytest.mark.parametrize("worker_class", [None, "gthread"], ids=["gevent-default", "gthread"])
def test_web_serves_http_and_websocket_chat_in_production(procfile, settings, fake_llm, tmp_path, worker_class):
    fake_llm.default = Reply(text="Hello from the fake model.")
    port = free_port()
    log = tmp_path / "web.log"
    extra = {"WEB_WORKER_CLASS": worker_class} if worker_class else {}
    proc = procfile.start("web", prod_env(settings.with_overrides(openai_base_url=fake_llm.url), PORT=str(port),
                                 WEB_CONCURRENCY="2", WEB_THREADS="4", **extra), log)
    try:
        health = wait_http(f"http://127.0.0.1:{port}/healthz", proc, log)
        assert (health.status_code, health.json()) == (200, {"status": "ok", "store": "up", "model": "up"})
        server = type("Server", (), {"url": f"http://127.0.0.1:{port}", "ws_url": f"ws://127.0.0.1:{port}/ws/chat"})
        client = ChatClient(server).connect()
        try:
            frames = client.turn("Say hello.", message_id="m-1", timeout=30)
            # a fast answer comes in a few coalesced frames, all of it, in order, before done
            tokens = words(200)
            fake_llm.default = Reply(tokens=tokens, token_delay=0.002)
            fast = client.turn("Count fast.", timeout=30)
            # a cancel mid-answer: done cancelled at once, the model's stream closed, nothing after done
            fake_llm.default = Reply(tokens=words(300), token_delay=0.01)
            client.send({"type": "message", "text": "Count slowly."})
            head = []
            while "word5" not in answer_text(head):
                head.append(client.recv())
            client.send({"type": "cancel"})
            cancelled = head + client.recv_until(lambda f: f["type"] == "done")
            slow = fake_llm.last_request()
            fake_llm.default = Reply(text="Hello from the fake model.")
        finally:
            client.close()
        assert (frames[0]["type"], frames[-1]["type"], frames[-1]["status"]) == ("start", "done", "completed")
        assert answer_text(frames) == "Hello from the fake model."
        assert frame_kinds(fast) == ["start", "delta", "done"] and answer_text(fast) == "".join(tokens)
        assert len([f for f in fast if f["type"] == "delta"]) < len(tokens) / 2
        cancelled = [f for f in cancelled if f["type"] != "memory"]
        assert frame_kinds(cancelled) == ["start", "delta", "done"] and cancelled[-1]["status"] == "cancelled"
        assert "".join(words(300)).startswith(answer_text(cancelled))
        assert slow.wait(3.0) and slow.outcome == "aborted" and slow.tokens_sent < 300
        # The session cookie is Secure in production: send it by hand over this plain-http loopback.
        thread = requests.get(server.url + "/api/chat/thread", headers={"Cookie": client.cookie_header()},
                              timeout=10).json()
        assert [(m["role"], m["text"]) for m in thread["messages"]] == [
            ("user", "Say hello."), ("assistant", "Hello from the fake model."),
            ("user", "Count fast."), ("assistant", "".join(tokens))]
        text = log.read_text()
        assert f"Using worker: {worker_class or 'gevent'}" in text and text.count("Booting worker with pid") == 2
        assert "MonkeyPatchWarning" not in text
        assert f"Listening at: http://0.0.0.0:{port}" in text
    finally:
        assert stop_group(proc) == 0


def test_web_with_a_bad_configuration_prints_one_line_and_exits_3(procfile, settings, tmp_path):
    port = free_port()
    log = tmp_path / "web.log"
    proc = procfile.start("web", prod_env(settings, PORT=str(free_port()),
                                 REDIS_URL=f"redis://:{PASSWORD}@127.0.0.1:{port}/0"), log)
    assert proc.wait(30) == 3
    assert log.read_text() == (f"config error: REDIS_URL is unreachable (redis://:***@127.0.0.1:{port}/0): "
                               "set REDIS_URL to a reachable Redis\n")


@pytest.mark.slow
def test_worker_sigterm_requeues_the_running_compaction_at_once(procfile, compaction_rig, fake_llm, tmp_path):
    rig = compaction_rig
    fake_llm.enqueue(Reply(json=ANSWER, delay=60), structured=True)  # the first worker is stopped during this
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    tid = thread_id_for("procfile-sigterm")
    result = seed_turns(rig.store, tid, 6)
    env = prod_env(rig.settings, WORKER_CONCURRENCY="1", COMPACTION_REFINE_AFTER_FOLDS="1")  # refine each fold
    folds = procfile.start("worker", env, tmp_path / "worker.log")
    first = procfile.start("refiner", env, tmp_path / "first.log")
    second = None
    try:
        assert rig.request(tid, result)  # the fold (no model), then its refinement, which waits on the model
        fake_llm.wait_for_requests(1, "structured", timeout=60)
        assert [(e["outcome"], e["step"]) for e in history(rig.client, tid)] == [("applied", "fold")]
        before = raw_hash(rig.client, tid)  # as the fold left it
        assert rig.client.llen("refine") == 0  # the refinement: taken by the first refiner
        stopped = time.monotonic()
        stop_group(first, signal.SIGTERM, timeout=30)
        assert time.monotonic() - stopped < 15  # did not wait for the 60 s model call
        log = (tmp_path / "first.log").read_text()
        assert "worker: Cold shutdown (MainProcess)" in log  # SIGTERM was remapped to SIGQUIT
        assert "Restoring 1 unacknowledged message(s)" in log
        # Back on the queue now, not after the visibility timeout (1 hour by default).
        assert rig.client.llen("refine") == 1
        assert rig.client.zcard("unacked_index") == 0
        assert raw_hash(rig.client, tid) == before  # the refinement wrote nothing
        assert [(e["outcome"], e["step"]) for e in history(rig.client, tid)] == [("applied", "fold")]
        second = procfile.start("refiner", env, tmp_path / "second.log")
        rig.wait_outcome(tid, "applied", count=2, timeout=60)
        wait_until(lambda: not rig.client.exists(ThreadKeys(tid).refining), 15, message="the refinement's marker")
        state = rig.store.load(tid)
        assert state.summary == record(1, 2, asked(1), asked(2), "- About: " + ANSWER["summary"])
        assert [m.id for m in state.messages] == [x for n in range(3, 7) for x in (f"u{n}", f"a{n}")]
        assert [(e["outcome"], e["step"]) for e in history(rig.client, tid)] == [("applied", "refine"),
                                                                                 ("applied", "fold")]
        assert len(fake_llm.chat_requests("structured")) == 2
    finally:
        for proc in (folds, first, second):
            if proc is not None:
                stop_group(proc)


def test_flower_binds_port_and_requires_basic_auth(procfile, settings, tmp_path):
    port = free_port()
    log = tmp_path / "flower.log"
    proc = procfile.start("flower", prod_env(settings, PORT=str(port), FLOWER_BASIC_AUTH="ops:flower-Pa55"), log)
    try:
        anonymous = wait_http(f"http://127.0.0.1:{port}/api/workers", proc, log)
        assert anonymous.status_code == 401
        page = requests.get(f"http://127.0.0.1:{port}/", timeout=5)
        assert (page.status_code, page.headers.get("WWW-Authenticate")) == (401, 'Basic realm="flower"')
        wrong = requests.get(f"http://127.0.0.1:{port}/api/workers", auth=("ops", "nope"), timeout=5)
        assert wrong.status_code == 401
        allowed = requests.get(f"http://127.0.0.1:{port}/api/tasks", auth=("ops", "flower-Pa55"), timeout=5)
        assert (allowed.status_code, allowed.json()) == (200, {})
        # the tasks page shows each task's result: a compaction's applied / skipped / discarded: stale
        tasks = requests.get(f"http://127.0.0.1:{port}/tasks", auth=("ops", "flower-Pa55"), timeout=5)
        assert re.findall(r'<th data-column="([a-z-]+)">', tasks.text) == [
            "name", "uuid", "state", "result", "received", "runtime", "worker"]
        assert "flower-Pa55" not in log.read_text()
    finally:
        stop_group(proc)


def test_flower_without_basic_auth_in_production_refuses(procfile, settings, tmp_path):
    log = tmp_path / "flower.log"
    proc = procfile.start("flower", prod_env(settings, PORT=str(free_port())), log)
    assert proc.wait(30) == 3
    assert log.read_text() == ("config error: FLOWER_BASIC_AUTH is not set: set FLOWER_BASIC_AUTH=user:password "
                               "(Flower refuses to start without it outside development)\n")


def test_release_phase_checks_the_configuration(procfile, settings, tmp_path):
    log = tmp_path / "release.log"
    ok = procfile.start("release", prod_env(settings), log)
    assert ok.wait(60) == 0
    assert log.read_text() == (f"config ok: APP_ENV=production, store {settings.redis_url}, model provider "
                               f"{settings.openai_base_url}, chat model fake-chat\n")
    bad = procfile.start("release", prod_env(settings, SECRET_KEY=""), log)
    assert bad.wait(60) == 3
    assert log.read_text().startswith("config error: SECRET_KEY is not set: set SECRET_KEY to at least 32 ")
