"""Many processes on one store: two web processes and two workers on the Redis Cluster and RabbitMQ.

Each process is the Procfile's own command (``bash -c``, production environment): two ``web``
gunicorn masters on two ports and two ``worker`` Celery processes, all with ``REDIS_CLUSTER=1``
and ``CELERY_BROKER_URL`` naming RabbitMQ.  A person chats on one web process, the socket
reconnects to the other (as after a deploy or a load balancer's choice), and continues the same
thread there: a repeated message adds nothing, the fold that the next turn asks for and the refinement
that follows it (``COMPACTION_REFINE_AFTER_FOLDS=1``) each run on one of the two workers exactly once, and
their events reach the socket on the second web process.  Then the worker running the next refinement (the
step that waits on the model) is killed (SIGKILL): RabbitMQ hands the unacknowledged task to the other
worker at once, which applies it once.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import kombu
import requests

from app.memory.migration import read_record
from app.store.keys import ThreadKeys
from app.store.redis_client import make_redis
from chat_support.fake_llm import Reply
from chat_support.live_app import ChatClient, answer_text
from chat_support.processes import PROCFILE, ROOT, prod_env, stop_group
from chat_support.servers import free_ports, wait_http
from tests.fixtures.celery_worker import ANSWER_TAIL, history, user_text, wait_until

ANSWER = {"summary": "They talked about small things.", "pinnedDecisions": []}
SECOND_ANSWER = {"summary": "They talked about the number two.", "pinnedDecisions": []}
# Long enough that folding one turn leaves room for the model's gist under the gain rule (docs/memory.md: A compaction):
# with ANSWER_TAIL alone a first fold frees too little, and with two sentences it folds without asking the model.
REPLY = ("that is a lovely thing to ask about," + ANSWER_TAIL + ". And it is a number that children learn early, "
         "so it feels friendly and familiar to almost everybody. Many stories use it too, and people smile when "
         "they hear it in a tune or a rhyme at school")


class Web:
    """A web process's addresses, as ``ChatClient`` wants them."""

    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}/ws/chat"


def hydrate(web: Web, cookie: str) -> dict:
    """``GET /api/chat/thread`` with the session cookie sent by hand (it is Secure in production)."""
    response = requests.get(web.url + "/api/chat/thread", headers={"Cookie": cookie}, timeout=10)
    assert response.status_code == 200
    return response.json()


def worker(n: int, env: dict, log) -> subprocess.Popen:
    """The Procfile's worker, named ``worker<n>@host``, consuming the refiner's ``refine`` queue too (this test is
    about redelivery, not the split): two workers on one machine need two names (on a platform each dyno has its
    own host name)."""
    command = PROCFILE["worker"].replace("-Q compaction ", "-Q compaction,refine ")
    with open(log, "w") as out:
        return subprocess.Popen(["bash", "-c", f"{command} -n worker{n}@%h"], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def task_lines(log, name: str = "workers.refine_thread") -> int:
    """How many tasks ``name`` a worker's log says it received."""
    return len(re.findall(re.escape(name) + r"\[[0-9a-f-]+\] received", log.read_text()))


def consumers(amqp_url: str) -> int:
    """How many workers consume RabbitMQ's ``compaction`` queue now (0 before it exists)."""
    with kombu.Connection(amqp_url, connect_timeout=5) as connection:
        try:
            return connection.default_channel.queue_declare("compaction", passive=True).consumer_count
        except Exception:
            return 0


def test_a_socket_that_moves_to_the_other_web_process_continues_the_thread(procfile, cluster_settings, fake_llm,
                                                                           tmp_path):
    fake_llm.default = Reply(text=REPLY)
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    settings = cluster_settings.with_overrides(openai_base_url=fake_llm.url)
    env = prod_env(settings, REDIS_CLUSTER="1", CELERY_BROKER_URL=settings.celery_broker_url, WEB_CONCURRENCY="1",
                   WEB_THREADS="8", WORKER_CONCURRENCY="1", COMPACTION_REFINE_AFTER_FOLDS="1")
    ports = free_ports(2)
    procs = [procfile.start("web", {**env, "PORT": str(port)}, tmp_path / f"web-{port}.log") for port in ports]
    procs += [worker(n, env, tmp_path / f"worker-{n}.log") for n in (1, 2)]
    first, second = Web(ports[0]), Web(ports[1])
    try:
        for web, proc, port in zip((first, second), procs[:2], ports, strict=True):
            assert wait_http(web.url + "/healthz", proc, tmp_path / f"web-{port}.log", timeout=60).status_code == 200
        wait_until(lambda: consumers(settings.celery_broker_url) == 2, 90, message="both workers to consume",
                   interval=0.5)

        browser = ChatClient(first)
        thread_id = browser.thread()["threadId"]
        cookie = browser.cookie_header()
        browser.connect()
        for n in (1, 2, 3, 4):
            assert browser.turn(user_text(n), message_id=f"m{n}")[-1]["status"] == "completed"
        browser.close()

        moved = ChatClient(second, session=browser.http).connect()  # same cookie, the other web process
        try:
            assert hydrate(second, cookie) == hydrate(first, cookie)
            repeated = moved.turn(user_text(4), message_id="m4")  # the page resends its last message
            assert repeated[-1]["status"] == "completed"
            assert [m["id"] for m in hydrate(second, cookie)["messages"]][::2] == ["m1", "m2", "m3", "m4"]
            moved.send({"type": "message", "id": "m5", "text": user_text(5)})
            frames = moved.recv_until(lambda f: f["type"] == "memory" and f["status"] == "succeeded"
                                      and f["step"] == "refine", timeout=60)
        finally:
            moved.close()
        assert answer_text(frames) == REPLY
        assert [(f["status"], f.get("step")) for f in frames if f["type"] in ("memory", "done")] == [
            ("completed", None), ("succeeded", "fold"), ("started", "refine"), ("succeeded", "refine")]

        body = hydrate(first, cookie)
        assert body == hydrate(second, cookie) and body["threadId"] == thread_id
        assert [m["id"] for m in body["messages"]][::2] == ["m2", "m3", "m4", "m5"]  # turn 1 folded, once
        assert [m["text"] for m in body["messages"]][::2] == [user_text(n) for n in (2, 3, 4, 5)]
        assert len({m["id"] for m in body["messages"]}) == 8
        assert body["summaryPreview"].startswith("Statements kept from earlier turns:")
        assert body["summaryPreview"].endswith("(turns 1–1 of this conversation)")
        client = make_redis(settings.redis_url, cluster=True)
        try:
            keys = ThreadKeys(thread_id)
            wait_until(lambda: not client.exists(keys.compacting) and not client.exists(keys.refining), 30,
                       message="the markers' release")
            assert [(e["outcome"], e["step"], e.get("turnsFolded", e.get("turnsRefined")))
                    for e in history(client, thread_id)] == [("applied", "refine", 1), ("applied", "fold", 1)]
            assert len(fake_llm.chat_requests("structured")) == 1  # one worker ran the refinement, once

            # A worker dies (SIGKILL) in the middle of the next refinement: RabbitMQ hands the
            # unacknowledged task to the other worker at once (late acknowledgement, no visibility
            # timeout), which applies it once; the dead worker wrote nothing.
            fake_llm.clear_rules()  # rules match in insertion order: the one-shot slow reply first
            fake_llm.enqueue(Reply(json=SECOND_ANSWER, delay=60), structured=True)
            fake_llm.add_rule(Reply(json=SECOND_ANSWER), structured=True)
            logs = [tmp_path / f"worker-{n}.log" for n in (1, 2)]
            received = [task_lines(log) for log in logs]
            moved = ChatClient(second, session=browser.http).connect()
            try:
                assert moved.turn(user_text(6), message_id="m6")[-1]["status"] == "completed"
            finally:
                moved.close()
            fake_llm.wait_for_requests(2, "structured", timeout=30)
            [busy] = wait_until(lambda: [i for i in (0, 1) if task_lines(logs[i]) > received[i]], 10,
                                message="the worker that took the refinement")
            folded = hydrate(second, cookie)  # the fold of turn 2 applied before its refinement started
            summary = client.hget(keys.state, "summary")
            assert [(e["outcome"], e["step"]) for e in history(client, thread_id)][0] == ("applied", "fold")
            os.killpg(procs[2 + busy].pid, signal.SIGKILL)
            wait_until(lambda: [(e["outcome"], e["step"]) for e in history(client, thread_id)] == [
                ("applied", "refine"), ("applied", "fold"), ("applied", "refine"), ("applied", "fold")], 30,
                message="the other worker to apply the redelivered refinement")
            wait_until(lambda: not client.exists(keys.compacting) and not client.exists(keys.refining), 30,
                       message="the markers' release")
            assert len(fake_llm.chat_requests("structured")) == 3  # the dead worker's call, then the other's
            body = hydrate(second, cookie)
            assert body["messages"] == folded["messages"]  # the refinement wrote the summary only
            assert read_record(client.hget(keys.state, "summary")).render() == read_record(summary).render().replace(
                "\n(turns 1–2", "\n- About: " + SECOND_ANSWER["summary"] + "\n(turns 1–2")  # and added its gist
            assert [m["id"] for m in body["messages"]][::2] == ["m3", "m4", "m5", "m6"]
            assert read_record(summary).render().startswith("Statements kept from earlier turns:")  # turns 1-2
            assert read_record(summary).render().endswith("(turns 1–2 of this conversation)")
        finally:
            client.close()
    finally:
        started = time.monotonic()
        for proc in procs:
            stop_group(proc)
        assert time.monotonic() - started < 60
