"""Memory on a real Redis Cluster (3 masters, 3 replicas) with RabbitMQ as the broker (docs/scale-out.md).

The storage cases that matter for a cluster, run on it: every key of a thread in one slot, a turn
committed once, dedupe, the compare-and-sets with a turn committed while a refinement's model call is in
flight (the fold it asks for runs after it), a clear during a refinement, the TTL of every key, events
through sharded pub/sub to an open socket, and ``MEMORY_WAIT_REPLICAS``.  A real embedded Celery worker
consumes RabbitMQ's quorum queue; the app is served for real; the fake LLM is a real HTTP server.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from app.memory.final_turn import FinalTurn
from app.settings import MemoryLimits
from app.store.keys import ThreadKeys
from app.store.redis_client import ClusterClient, ClusterUnavailable, make_redis
from app.store.thread_store import StoreUnavailable, ThreadStore
from chat_support.fake_llm import Reply
from chat_support.live_app import ChatClient
from scripts.cluster import free_cluster_ports
from tests.fixtures.celery_worker import (
    NUMBERS_ANSWER,
    asked,
    commit_turn,
    folded_section,
    history,
    message_ids,
    record,
    rendered,
    seed_turns,
    thread_id_for,
    turn_ids,
    wait_no_refinement,
    wait_until,
)

ANSWER = NUMBERS_ANSWER
SUMMARY = record(1, 2, asked(1), asked(2), "- About: " + ANSWER["summary"])


@pytest.fixture
def cluster_store(cluster_settings):
    client = make_redis(cluster_settings.redis_url, cluster=True)
    yield ThreadStore(client, cluster_settings.limits, cluster_settings.memory_ttl_seconds)
    client.close()


@pytest.fixture
def cluster_rig(make_compaction_rig, cluster_settings):
    return make_compaction_rig(redis_url=cluster_settings.redis_url, redis_cluster=True,
                               celery_broker_url=cluster_settings.celery_broker_url)


@pytest.fixture
def refining_rig(make_compaction_rig, cluster_settings):
    """The cluster rig with a refinement right after every fold (``COMPACTION_REFINE_AFTER_FOLDS=1``), and one
    that has to wait for quiet again (a stale one) waiting a second (``COMPACTION_IDLE_SECONDS=1``)."""
    return make_compaction_rig(redis_url=cluster_settings.redis_url, redis_cluster=True,
                               celery_broker_url=cluster_settings.celery_broker_url,
                               compaction_refine_after_folds=1, compaction_idle_seconds=1)


def test_every_key_of_a_thread_is_in_one_slot_and_threads_spread_over_the_masters(cluster_store, redis_cluster):
    cluster = cluster_store.redis.cluster()
    owners = set()
    for n in range(12):
        keys = ThreadKeys(thread_id_for(f"slot {n}"))
        names = [keys.state, keys.compacting, keys.events, keys.stats, keys.compactions, keys.feedback,
                 keys.run("r1"), keys.paused_run]
        assert len({cluster.keyslot(k) for k in names}) == 1
        owners.add(redis_cluster.owner_of(keys.state).port)
    assert len(owners) == 3  # twelve threads land on all three masters


def test_a_turn_is_committed_once_and_duplicates_add_nothing(cluster_store):
    tid = thread_id_for("cluster commit once")
    first = cluster_store.commit_final_turn(tid, FinalTurn("hi", "hello", user_id="c1", assistant_id="m1"))
    again = cluster_store.commit_final_turn(tid, FinalTurn("hi", "hello", user_id="c1", assistant_id="m1"))
    same_answer = cluster_store.commit_final_turn(tid, FinalTurn("hi", "hello", user_id="c2", assistant_id="m1"))
    assert (first.appended, again.appended, same_answer.appended) == (True, False, False)
    cluster_store.commit_final_turn(tid, FinalTurn("id-less", "pair"))
    assert cluster_store.commit_final_turn(tid, FinalTurn("id-less", "pair")).appended is False
    state = cluster_store.load(tid)
    assert [(m.id, m.text) for m in state.messages][:2] == [("c1", "hi"), ("m1", "hello")]
    assert [m.text for m in state.messages] == ["hi", "hello", "id-less", "pair"]
    assert state.version == 2


def test_a_repeated_client_message_id_over_the_websocket_adds_nothing(make_live_app, cluster_settings, fake_llm):
    live = make_live_app(cluster_settings.with_overrides(openai_base_url=fake_llm.url))
    browser = ChatClient(live).connect()
    try:
        assert browser.turn("hi", message_id="client-1")[-1]["status"] == "completed"
        browser.turn("hi", message_id="client-1")
        thread = browser.thread()
    finally:
        browser.close()
    assert [(m["role"], m["text"]) for m in thread["messages"]] == [
        ("user", "hi"), ("assistant", "Hello from the fake model.")]
    assert thread["messages"][0]["id"] == "client-1"


def test_a_turn_committed_during_compaction_is_kept_exactly_once(refining_rig, fake_llm):
    rig = refining_rig
    gate = threading.Event()
    calls = []

    def model(body):
        calls.append(folded_section(body))
        if len(calls) == 1:
            time.sleep(1.5)  # the refinement's model call is in flight while turn 7 commits
            return ANSWER
        gate.wait(10)
        return {"summary": "They chatted about the number three.", "pinnedDecisions": []}

    fake_llm.add_rule(model, structured=True)
    rig.worker()
    tid = thread_id_for("cluster b2")
    rig.events.watch(tid)
    assert rig.request(tid, seed_turns(rig.store, tid, 6))  # the fold of turns 1-2, then its refinement
    fake_llm.wait_for_requests(1, "structured", timeout=20)
    assert [(e["outcome"], e["step"]) for e in history(rig.client, tid)] == [("applied", "fold")]
    seventh = commit_turn(rig.store, tid, 7)
    # the fold turn 7 makes due is asked for at once (a refinement never holds the folds back); the one worker
    # runs it after the refinement
    assert seventh.appended and rig.request(tid, seventh) is True
    assert rig.request(tid, seventh) is False  # one fold pending
    rig.wait_outcome(tid, "applied", count=3, timeout=20)  # the refinement, then the fold of turn 3
    fake_llm.wait_for_requests(2, "structured", timeout=20)  # and the fold's refinement, held at the gate
    # The refinement applied with turn 7 committed meanwhile (it compares the generation, which a commit leaves
    # as it is, and writes the summary only); then the fold read turn 7 and kept it.
    assert [(e["outcome"], e["step"]) for e in history(rig.client, tid)] == [
        ("applied", "fold"), ("applied", "refine"), ("applied", "fold")]
    folded = rig.store.load(tid)
    assert message_ids(folded) == turn_ids(4, 7) and message_ids(folded).count("u7") == 1
    assert folded.summary == record(1, 3, *SUMMARY.splitlines()[1:-1], asked(3))
    assert calls == [rendered([1, 2]), rendered([3])]
    gate.set()
    rig.wait_outcome(tid, "applied", count=4, timeout=20)
    wait_no_refinement(rig, tid)
    final = rig.store.load(tid)
    assert message_ids(final) == turn_ids(4, 7) and message_ids(final).count("u7") == 1
    assert final.summary == record(1, 3, *folded.summary.splitlines()[1:-1],
                                   "- About: They chatted about the number three.")
    assert len(calls) == 2
    assert [(e["outcome"], e["step"]) for e in history(rig.client, tid)] == [
        ("applied", "refine"), ("applied", "fold"), ("applied", "refine"), ("applied", "fold")]
    # every step told the watching subscriber, through the thread's shard channel
    events = rig.events.wait_statuses(tid, 6)
    assert [(e["status"], e["step"]) for e in rig.events.for_thread(tid)] == [
        ("succeeded", "fold"), ("started", "refine"), ("succeeded", "refine"),
        ("succeeded", "fold"), ("started", "refine"), ("succeeded", "refine")] and len(events) == 6


def test_a_clear_during_compaction_leaves_the_thread_empty(refining_rig, fake_llm):
    rig = refining_rig
    fake_llm.add_rule(Reply(json=ANSWER, delay=1.5), structured=True)
    rig.worker()
    tid = thread_id_for("cluster clear")
    assert rig.request(tid, seed_turns(rig.store, tid, 6))  # the fold of turns 1-2, then its refinement
    fake_llm.wait_for_requests(1, "structured", timeout=20)  # the refinement's model call is in flight
    rig.store.clear(tid)  # it takes the markers and the fold's history with it
    # the refinement's compare-and-set fails: it holds its marker again to wait for quiet (a second)...
    wait_until(lambda: rig.client.exists(ThreadKeys(tid).refining), 20, message="the discarded refinement's hold")
    wait_no_refinement(rig, tid)  # ...then finds nothing to refine: no second model call
    state = rig.store.load(tid)
    assert (state.messages, state.summary, state.notes, state.folded_turns) == ((), "", (), 0)
    assert history(rig.client, tid) == []  # the old conversation's work is not listed in the new one
    assert len(fake_llm.chat_requests("structured")) == 1


def live_thread(rig, fake_llm, make_live_app):
    """A worker answering refinements with ``ANSWER``, the app served on the cluster, and a connected socket
    whose thread holds five seeded turns (the sixth makes a fold due); returns ``(live app, client, thread id)``."""
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    rig.worker()
    live = make_live_app(rig.settings)
    browser = ChatClient(live)
    tid = browser.thread()["threadId"]
    seed_turns(rig.store, tid, 5)
    browser.connect()
    return live, browser, tid


def test_every_key_of_a_thread_carries_the_memory_ttl(cluster_rig, fake_llm, make_live_app):
    rig = cluster_rig
    ttl = rig.settings.memory_ttl_seconds
    live, browser, tid = live_thread(rig, fake_llm, make_live_app)
    try:
        frames = browser.turn("the sixth turn", message_id="u6")  # stats, then a compaction (history)
        assert frames[-1]["status"] == "completed"
        rig.wait_outcome(tid, "applied", timeout=20)
        rig.wait_idle(tid)
        answer = next(m for m in browser.thread()["messages"] if m["role"] == "assistant")
        rated = browser.http.post(live.url + "/api/chat/feedback", json={"messageId": answer["id"], "rating": "up"},
                                  headers={"Origin": live.url}, timeout=10)
        assert rated.status_code in (200, 201, 204), rated.text
    finally:
        browser.close()
    keys = ThreadKeys(tid)
    for key in keys.ttl_keys():
        assert rig.client.exists(key), key
        assert ttl - 60 < rig.client.ttl(key) <= ttl, key


def test_a_socket_gets_the_compaction_events_from_the_master_of_its_thread(refining_rig, fake_llm, make_live_app,
                                                                          redis_cluster):
    rig = refining_rig
    live, browser, tid = live_thread(rig, fake_llm, make_live_app)
    try:
        hub = wait_until(lambda: live.app.extensions.get("chat_events"), 10, message="the socket's event hub")
        assert hub.subscribed.wait(10)  # set once the socket's thread channel is confirmed
        channel = ThreadKeys(tid).events
        owner = redis_cluster.owner_of(channel)
        for master in redis_cluster.masters():  # SSUBSCRIBE went to the thread's master only
            node = redis.Redis(host="127.0.0.1", port=master.port, decode_responses=True)
            [(name, count)] = node.pubsub_shardnumsub(channel)
            node.close()
            assert (name, count) == (channel, 1 if master.port == owner.port else 0), master.port
        browser.send({"type": "message", "id": "u6", "text": "the sixth turn"})
        frames = browser.recv_until(lambda f: f["type"] == "memory" and f["status"] == "succeeded"
                                    and f["step"] == "refine", timeout=30)
    finally:
        browser.close()
    memory = [(f["status"], f["step"]) for f in frames if f["type"] == "memory"]
    assert memory == [("succeeded", "fold"), ("started", "refine"), ("succeeded", "refine")]
    assert [f["type"] for f in frames].count("done") == 1
    assert frames.index(next(f for f in frames if f["type"] == "done")) < frames.index(
        next(f for f in frames if f["type"] == "memory"))  # the fold is asked for once the done is sent


def test_wait_replicas_holds_the_answer_until_a_replica_has_the_write(cluster_settings, redis_cluster):
    errors: list[str] = []
    client = make_redis(cluster_settings.redis_url, cluster=True)
    store = ThreadStore(client, cluster_settings.limits, cluster_settings.memory_ttl_seconds,
                        on_error=errors.append, wait_replicas=1, wait_timeout_ms=400)
    tid = thread_id_for("cluster wait")
    try:
        commit_turn(store, tid, 1)
        replica = redis_cluster.replica_of(redis_cluster.owner_of(ThreadKeys(tid).state))
        reader = redis.Redis(host="127.0.0.1", port=replica.port, decode_responses=True)
        reader.execute_command("READONLY")
        assert reader.hget(ThreadKeys(tid).state, "v") == "1"  # there when the commit returned
        redis_cluster.pause_node(replica)
        try:
            started = time.monotonic()
            result = commit_turn(store, tid, 2)
            waited = time.monotonic() - started
        finally:
            redis_cluster.resume_node(replica)
        # the write stands on the master; the missing acknowledgement is reported, not raised
        assert (result.appended, result.version, errors) == (True, 2, ["wait_replicas"])
        assert 0.39 <= waited < 3.0
        wait_until(lambda: reader.hget(ThreadKeys(tid).state, "v") == "2", 10, message="the replica to catch up")
        reader.close()
    finally:
        client.close()


def test_the_cluster_client_connects_on_first_use_and_fails_as_a_redis_error():
    port = free_cluster_ports(1)[0]  # nothing listens there
    client = make_redis(f"redis://127.0.0.1:{port}", cluster=True, socket_timeout=0.5)
    assert isinstance(client, ClusterClient)
    store = ThreadStore(client, MemoryLimits(), 60)  # building the store connects nowhere
    with pytest.raises(redis.ConnectionError) as info:
        client.hgetall("mem:{x}")
    assert isinstance(info.value, ClusterUnavailable)
    with pytest.raises(StoreUnavailable):
        store.load(thread_id_for("nowhere"))
