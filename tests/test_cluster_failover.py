"""Failover on a real Redis Cluster: the master that owns a live thread's slot is killed mid-chat.

3 masters + 3 replicas (``cluster-node-timeout`` 1.5 s), RabbitMQ as the broker, the app served for
real and a real Celery worker.  Neither is restarted: while the slot has no master a turn degrades
as it does with a single Redis down (the answer streams, nothing is stored, hydration is empty), a
thread on another master carries on, and once the replica has taken over the same processes commit,
fold and refine (``COMPACTION_REFINE_AFTER_FOLDS=1``: a refinement right after each fold) and deliver the
events of both again.

Redis replicates asynchronously (docs/scale-out.md).  To make "acknowledged just before the kill" a
fact rather than a race, the replica of the thread's master is paused and its replication link cut
(``CLIENT KILL TYPE replica``) before the last turn:

- without ``MEMORY_WAIT_REPLICAS`` that turn is acknowledged at once and is lost by the failover;
- with ``MEMORY_WAIT_REPLICAS=1`` its ``done`` waits until the replica has the write, and it survives.
"""

from __future__ import annotations

import time

import pytest
import redis
import websocket

from app.store.keys import ThreadKeys
from chat_support.fake_llm import Reply
from chat_support.live_app import ChatClient, answer_text
from scripts.cluster import ClusterError
from tests.fixtures.celery_worker import ANSWER_TAIL, asked, history, record, user_text, wait_no_refinement, wait_until

ANSWER = {"summary": "They talked about small things.", "pinnedDecisions": []}
# Long enough that folding one turn leaves room for the model's gist under the gain rule (docs/memory.md: A compaction):
# with ANSWER_TAIL alone a first fold frees too little, and with two sentences it folds without asking the model.
REPLY = ("that is a lovely thing to ask about," + ANSWER_TAIL + ". And it is a number that children learn early, "
         "so it feels friendly and familiar to almost everybody. Many stories use it too, and people smile when "
         "they hear it in a tune or a rhyme at school")
OUTAGE = "a message sent while the thread's master was down"


def said(n: int) -> str:
    """What the person says in turn ``n``."""
    return user_text(n)


def texts(thread: dict) -> list[str]:
    return [m["text"] for m in thread["messages"] if m["role"] == "user"]


def done(frames: list[dict]) -> dict:
    return next(f for f in frames if f["type"] == "done")


@pytest.fixture
def failover(make_compaction_rig, make_live_app, cluster_settings, fake_llm, redis_cluster):
    """Factory: ``(rig, live, browser, master, replica)`` for a thread with three turns, worker running."""
    started = []

    def make(**overrides):
        rig = make_compaction_rig(redis_url=cluster_settings.redis_url, redis_cluster=True,
                                  celery_broker_url=cluster_settings.celery_broker_url,
                                  compaction_refine_after_folds=1, **overrides)
        fake_llm.default = Reply(text=REPLY)
        fake_llm.add_rule(Reply(json=ANSWER), structured=True)
        rig.worker()
        live = make_live_app(rig.settings)
        browser = ChatClient(live)
        tid = browser.thread()["threadId"]
        browser.connect()
        started.append(browser)
        for n in (1, 2, 3):
            assert done(browser.turn(said(n), message_id=f"m{n}"))["status"] == "completed"
        master = redis_cluster.owner_of(ThreadKeys(tid).state)
        # The worker has been running: its client knows every node, not only the seed (which may be the
        # master killed below; a process that starts while its seed is down waits for it: docs/scale-out.md).
        assert len(rig.store.load(tid).messages) == 6 and rig.client.exists(ThreadKeys(tid).state) == 1
        return rig, live, browser, tid, master, redis_cluster.replica_of(master)

    yield make
    for browser in started:
        browser.close()
    for node in redis_cluster.nodes:
        if node.proc is not None:
            redis_cluster.resume_node(node)  # never leave a node stopped


def cut_replication(redis_cluster, master, replica) -> None:
    """Pause ``replica`` and drop its link: what ``master`` writes next reaches no replica."""
    redis_cluster.pause_node(replica)
    client = redis.Redis(host="127.0.0.1", port=master.port)
    assert client.execute_command("CLIENT", "KILL", "TYPE", "replica") == 1
    client.close()


def other_shard_browser(live, redis_cluster, master) -> ChatClient:
    """A second person whose thread lives on another master."""
    for _ in range(40):
        browser = ChatClient(live)
        tid = browser.thread()["threadId"]
        if redis_cluster.owner_of(ThreadKeys(tid).state).port != master.port:
            return browser.connect()
    raise AssertionError("no session landed on another master in 40 tries")


def degrade_then_recover(rig, live, browser, tid, master, replica, redis_cluster) -> None:
    """Kill ``master``; check the degraded window, the takeover and the recovery of web and worker."""
    other = other_shard_browser(live, redis_cluster, master)
    redis_cluster.kill_node(master)
    redis_cluster.resume_node(replica)
    try:
        # The slot has no master: the turn answers, stores nothing; hydration is empty, never an error.
        during = browser.turn(OUTAGE, message_id="m-out", timeout=30)
        assert (done(during)["status"], answer_text(during)) == ("completed", REPLY)
        response = browser.http.get(live.url + "/api/chat/thread", timeout=10)
        assert (response.status_code, response.json()["messages"], response.json()["restored"]) == (200, [], False)
        # Another master keeps serving its threads.
        assert done(other.turn("elsewhere", message_id="o1"))["status"] == "completed"
        assert texts(other.thread()) == ["elsewhere"]
    finally:
        other.close()
    def taken_over():
        try:
            return redis_cluster.owner_of(ThreadKeys(tid).state, agreed=True).port == replica.port
        except ClusterError:
            return False
    wait_until(taken_over, 30, message="every node to know the replica took over the slot", interval=0.1)
    redis_cluster.start_node(master)  # the failed machine comes back, as the new master's replica
    redis_cluster.wait_ready(timeout=60)
    # The same web process commits again, by itself.
    assert done(browser.turn(said(6), message_id="m6", timeout=30))["status"] == "completed"
    wait_no_refinement(rig, tid)  # a fold turn 6 may have asked for, and its refinement, are over
    # The same worker folds and refines again, and the socket hears of both from the new master.
    hub = live.app.extensions["chat_events"]
    assert hub.subscribed.wait(30), "the web process did not subscribe on the new master"
    seen = len(history(rig.client, tid))
    browser.send({"type": "message", "id": "m7", "text": said(7)})
    frames = browser.recv_until(lambda f: f["type"] == "done", timeout=30)
    frames = browser.recv_until(lambda f: f["type"] == "memory" and f["status"] == "succeeded"
                                and f["step"] == "refine", timeout=30)  # turn 7's, sent after its done
    assert [(f["status"], f["step"]) for f in frames if f["type"] == "memory"] == [
        ("succeeded", "fold"), ("started", "refine"), ("succeeded", "refine")]
    wait_no_refinement(rig, tid)
    assert [(e["outcome"], e["step"]) for e in history(rig.client, tid)][:2] == [("applied", "refine"),
                                                                                 ("applied", "fold")]
    assert len(history(rig.client, tid)) == seen + 2


def test_without_wait_a_turn_acknowledged_just_before_the_kill_is_lost(failover, redis_cluster):
    rig, live, browser, tid, master, replica = failover()
    cut_replication(redis_cluster, master, replica)
    started = time.monotonic()
    frames = browser.turn(said(4), message_id="m4")
    assert done(frames)["status"] == "completed" and time.monotonic() - started < 5  # acknowledged at once
    assert texts(browser.thread()) == [said(n) for n in (1, 2, 3, 4)]  # on the master, for now

    degrade_then_recover(rig, live, browser, tid, master, replica, redis_cluster)

    state = rig.store.load(tid)
    kept = [m.text for m in state.messages if m.role == "user"]
    # turn 4 was acknowledged but never replicated: the failover lost it; the outage turn was never
    # stored; everything else is there once (turn 1 folded after turn 7, then refined)
    assert kept == [said(n) for n in (2, 3, 6, 7)]
    assert state.summary == record(1, 1, asked(1), "- About: " + ANSWER["summary"])


def test_with_wait_replicas_the_turn_acknowledged_before_the_kill_survives(failover, redis_cluster):
    rig, live, browser, tid, master, replica = failover(memory_wait_replicas=1, memory_wait_timeout_ms=6000,
                                                        redis_socket_timeout=8.0)
    cut_replication(redis_cluster, master, replica)
    browser.send({"type": "message", "id": "m4", "text": said(4)})
    held = browser.recv_until(lambda f: f["type"] == "delta", timeout=10)
    try:  # the answer streams; then nothing for a second: its done waits for the replica
        while True:
            held.append(browser.recv(timeout=1.0))
    except websocket.WebSocketTimeoutException:
        pass
    assert answer_text(held) == REPLY and not any(f["type"] == "done" for f in held)
    redis_cluster.resume_node(replica)  # the replica reconnects, catches up and acknowledges
    frames = held + browser.recv_until(lambda f: f["type"] == "done", timeout=20)
    assert done(frames)["status"] == "completed"

    degrade_then_recover(rig, live, browser, tid, master, replica, redis_cluster)

    state = rig.store.load(tid)
    kept = [m.text for m in state.messages if m.role == "user"]
    # turn 4 was on the replica when its done was sent: it survived the failover.  Turn 6 made five
    # turns (turn 1 folded), turn 7 five again (turn 2 folded); the outage turn was never stored.
    assert kept == [said(n) for n in (3, 4, 6, 7)]
    assert state.summary.startswith("Statements kept from earlier turns:\n") and OUTAGE not in state.summary
    assert state.summary.endswith("\n(turns 1–2 of this conversation)")
