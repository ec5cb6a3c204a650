"""The archive of folded turns on a real Redis: filled by apply_compaction.lua, capped, emptied by a clear,
read on the turn path in one round trip (app/store/archive.py), and shown again by hydration."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from app import create_app
from app.memory.final_turn import FinalTurn
from app.settings import MemoryLimits
from app.store.archive import CACHE_MAX_BYTES, Archive
from app.store.keys import ThreadKeys
from app.store.redis_client import make_redis
from app.store.thread_store import ThreadStore
from tests.fixtures.memory_data import CREATED, new_thread_id, text_record, turn


@pytest.fixture
def tid():
    return new_thread_id()


def commit(store, tid, first, last, text=None):
    for i in range(first, last + 1):
        store.commit_messages(tid, *turn(i, text(i) if text else None, f"answer {i}"), dedupe_by_text=False)


def fold(store, tid, ids, summary="s"):
    gen = store.load(tid).gen
    result = store.apply_compaction(tid, expected_gen=gen, folded_ids=ids, record=text_record(summary), notes=[],
                                    compacted_at=CREATED)
    assert result.outcome == "applied"


def members(redis_client, tid):
    return [(json.loads(m), score) for m, score in redis_client.zrange(ThreadKeys(tid).archive, 0, -1,
                                                                        withscores=True)]


def test_every_folded_turn_is_archived_with_its_number_and_the_numbers_go_on(store, redis_client, tid):
    commit(store, tid, 1, 6)
    fold(store, tid, ["u1", "a1", "u2", "a2"])
    fold(store, tid, ["u3", "a3"])
    got = members(redis_client, tid)
    assert [(m["n"], score) for m, score in got] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert [x for m, _ in got for x in m["m"]] == [msg.to_dict() for i in (1, 2, 3) for msg in turn(i, None,
                                                                                                      f"answer {i}")]
    state = store.load(tid)
    assert state.folded_turns == 3 and [m.id for m in state.messages] == ["u4", "a4", "u5", "a5", "u6", "a6"]
    assert state.turn_numbers() == [4, 5, 6]
    keys = ThreadKeys(tid)
    assert abs(redis_client.ttl(keys.archive) - redis_client.ttl(keys.state)) <= 1
    raw = redis_client.hgetall(keys.state)
    assert int(raw["ab"]) == sum(len(m.encode()) for m in redis_client.zrange(keys.archive, 0, -1))


def test_the_archive_keeps_the_newest_turns_within_its_caps(redis_client, settings, tid):
    client = make_redis(settings.redis_url)
    small = ThreadStore(client, MemoryLimits(archive_max_turns=3), settings.memory_ttl_seconds)
    commit(small, tid, 1, 9)
    for i in range(1, 6):
        fold(small, tid, [f"u{i}", f"a{i}"])
    assert [m["n"] for m, _ in members(redis_client, tid)] == [3, 4, 5]  # oldest out
    tiny = ThreadStore(client, MemoryLimits(archive_max_bytes=1000), settings.memory_ttl_seconds)
    tid2 = new_thread_id()
    commit(tiny, tid2, 1, 9, text=lambda i: f"turn {i} " + "x" * 300)
    for i in range(1, 6):
        fold(tiny, tid2, [f"u{i}", f"a{i}"])
    kept = redis_client.zrange(ThreadKeys(tid2).archive, 0, -1)
    assert [json.loads(m)["n"] for m in kept] == [4, 5] and sum(len(m.encode()) for m in kept) <= 1000
    assert int(redis_client.hget(ThreadKeys(tid2).state, "ab")) == sum(len(m.encode()) for m in kept)
    huge = ThreadStore(client, MemoryLimits(archive_max_bytes=1000), settings.memory_ttl_seconds)
    tid3 = new_thread_id()
    commit(huge, tid3, 1, 5, text=lambda i: "y" * 2000)
    fold(huge, tid3, ["u1", "a1"])
    assert [m["n"] for m, _ in members(redis_client, tid3)] == [1]  # the newest turn always stays
    client.close()


def test_a_clear_empties_the_archive_and_numbers_start_again(store, redis_client, tid):
    commit(store, tid, 1, 6)
    fold(store, tid, ["u1", "a1", "u2", "a2"])
    store.clear(tid)
    keys = ThreadKeys(tid)
    assert redis_client.exists(keys.archive) == 0
    assert "ft" not in redis_client.hgetall(keys.state) and store.load(tid).folded_turns == 0
    commit(store, tid, 7, 12)
    fold(store, tid, ["u7", "a7"])
    assert [(m["n"], m["m"][0]["id"]) for m, _ in members(redis_client, tid)] == [(1, "u7")]


class CountingProxy:
    """A TCP proxy in front of the test Redis that counts round trips: bursts of client bytes after an answer."""

    def __init__(self, port: int):
        self.trips = 0
        self._waiting = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.target = port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            client, _ = self._listener.accept()
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, source, target, from_client):
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                return
            if from_client and not self._waiting:
                self.trips += 1
                self._waiting = True
            elif not from_client:
                self._waiting = False
            target.sendall(data)


def test_the_turn_path_reads_the_thread_and_its_archive_in_one_round_trip(settings, store, tid):
    commit(store, tid, 1, 8, text=lambda i: f"we planned release rc-{i} for the lisbon office")
    fold(store, tid, ["u1", "a1", "u2", "a2"])
    port = int(settings.redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = CountingProxy(port)
    client = make_redis(f"redis://127.0.0.1:{proxy.port}/0")
    counted = ThreadStore(client, settings.limits, settings.memory_ttl_seconds)
    client.ping()  # the connection's handshake is not the turn's
    before = proxy.trips
    reader = Archive(counted)
    state, index = reader.load_turn_memory(tid)
    assert proxy.trips - before == 1
    assert (state.folded_turns, [t.number for t in index.turns]) == (2, [1, 2])
    fold(store, tid, ["u3", "a3"])
    before = proxy.trips
    state, again = reader.load_turn_memory(tid)
    assert proxy.trips - before == 1 and again is index  # the process's copy, brought up to date
    assert [t.number for t in index.turns] == [1, 2, 3] and index.turns[2].person.endswith("rc-3 for the lisbon office")
    store.clear(tid)
    commit(store, tid, 20, 25)
    fold(store, tid, ["u20", "a20"])
    state, fresh = reader.load_turn_memory(tid)  # cleared and folded again: read whole
    assert [t.messages[0].id for t in fresh.turns] == ["u20"] and fresh.cleared == 1
    client.close()


def test_the_process_keeps_tokenised_archives_within_its_byte_bound(store, tid):
    threads = [new_thread_id() for _ in range(4)]
    for thread in threads:
        commit(store, thread, 1, 6, text=lambda i: f"release rc-{i} for the lisbon office" + " word" * 200)
        fold(store, thread, [f"u{i}" if k == 0 else f"a{i}" for i in range(1, 5) for k in (0, 1)])
    _, first = Archive(store).load_turn_memory(threads[0])
    one = first.nbytes
    assert one > 4 * 1000  # four turns of 200 words
    archive = Archive(store, cache_max_bytes=int(2.5 * one))
    assert Archive(store).max_bytes == CACHE_MAX_BYTES
    ran = []
    for thread in threads:  # the tokenising runs in what the caller gives
        archive.load_turn_memory(thread, run=lambda work: ran.append(work()))
    assert len(ran) == 4
    assert archive.cached_bytes <= int(2.5 * one)
    assert archive.cached(threads[0]) is None and archive.cached(threads[3]) is not None  # oldest out
    archive.resize(one // 2)  # one index is larger than the whole bound: used, never kept
    archive.drop_all()
    _, index = archive.load_turn_memory(threads[1])
    assert len(index) == 4 and archive.cached_bytes == 0


def test_hydration_returns_the_archived_turns_before_the_messages(settings, store, tid):
    app = create_app(settings)
    web = app.test_client()
    thread_id = web.get("/api/chat/thread").get_json()["threadId"]
    for i in range(1, 6):
        store.commit_final_turn(thread_id, FinalTurn(f"question {i}", f"answer {i}", user_id=f"u{i}",
                                                     assistant_id=f"m{i}"))
    assert "archived" not in web.get("/api/chat/thread").get_json()
    gen = store.load(thread_id).gen
    store.apply_compaction(thread_id, expected_gen=gen, folded_ids=["u1", "m1", "u2", "m2"], record=text_record("s"),
                           notes=[], compacted_at=CREATED)
    body = web.get("/api/chat/thread").get_json()
    assert [(m["id"], m["text"]) for m in body["archived"]] == [("u1", "question 1"), ("m1", "answer 1"),
                                                               ("u2", "question 2"), ("m2", "answer 2")]
    assert all(set(m) == {"id", "role", "text", "createdAt"} for m in body["archived"])
    assert [m["id"] for m in body["messages"]] == ["u3", "m3", "u4", "m4", "u5", "m5"]
    assert web.delete("/api/chat/thread").status_code == 204
    assert "archived" not in web.get("/api/chat/thread").get_json()


def test_a_turn_over_the_socket_recalls_a_folded_turn_into_the_prompt(chat, fake_llm, store):
    from chat_support.fake_llm import Reply
    from tests.fixtures.streamed_chat import seed_memory

    thread_id = chat.thread()["threadId"]
    seed_memory(store, thread_id, turns=6, fold_turns=2, summary="They talked.", prefix="stored")
    store.commit_final_turn(thread_id, FinalTurn("My sister Ana is allergic to peanuts, remember it.", "Noted."))
    store.commit_final_turn(thread_id, FinalTurn("stored question 8", "stored answer 8"))
    state = store.load(thread_id)  # fold turns 3-7: the allergy is in the archive only
    assert store.apply_compaction(thread_id, expected_gen=state.gen, folded_ids=[m.id for m in state.messages[:-2]],
                                  record=text_record("They talked."), notes=[],
                                  compacted_at=CREATED).outcome == "applied"
    fake_llm.default = Reply(text="Ana is allergic to peanuts.")
    frames = chat.turn("Who is allergic to peanuts?")
    assert frames[-1]["status"] == "completed"
    prompt = fake_llm.last_request().messages
    [recalled] = [m["content"] for m in prompt[1:] if m["role"] == "system" and "<recalled>" in m["content"]]
    assert "- Person (turn 7): My sister Ana is allergic to peanuts, remember it." in recalled
    # after the recent turn (the prompt's stable prefix), right before the new text
    assert [m["content"] for m in prompt].index(recalled) == len(prompt) - 2
    assert [m["role"] for m in prompt] == ["system", "system", "user", "assistant", "system", "user"]


def test_a_thread_that_expired_and_began_again_is_never_served_the_old_index(store, redis_client, tid):
    commit(store, tid, 1, 6, text=lambda i: "my locker code is quokkafern-4471" if i == 2 else f"garden talk {i}")
    fold(store, tid, ["u1", "a1", "u2", "a2"])
    archive = Archive(store)
    old_state, old = archive.load_turn_memory(tid)
    born = redis_client.hget(ThreadKeys(tid).state, "born")
    assert born and old.born == born and [t.number for t in old.turns] == [1, 2]
    keys = ThreadKeys(tid)
    redis_client.delete(*keys.ttl_keys())  # the thread expired
    commit(store, tid, 1, 6, text=lambda i: f"garden talk {i}")  # the same browser session begins again
    fold(store, tid, ["u1", "a1", "u2", "a2"])  # as many archived turns, the same counters
    assert (store.load(tid).cleared, store.load(tid).forgets) == (old_state.cleared, old_state.forgets)
    state, index = archive.load_turn_memory(tid)
    assert redis_client.hget(keys.state, "born") not in ("", born) and index.born != born
    assert all("quokkafern" not in m.text for t in index.turns for m in t.messages)


def test_an_index_without_forgotten_turns_scores_as_one_built_from_the_rest():
    from app.memory.recall import ArchivedTurn, ArchiveIndex
    from app.memory.state import ThreadMessage

    def archived(n, text):
        return ArchivedTurn(n, (ThreadMessage(f"u{n}", "user", text, CREATED),
                                ThreadMessage(f"a{n}", "assistant", "noted", CREATED)))

    turns = [archived(n, f"garden {'tomato' if n % 3 else 'quokkafern'} talk number {n}") for n in range(1, 10)]
    full = ArchiveIndex(forgets=2)
    full.add(turns)
    without = full.without({3, 6}, forgets=4)
    rebuilt = ArchiveIndex(forgets=4)
    rebuilt.add([t for t in turns if t.number not in (3, 6)])
    assert [t.number for t in without.turns] == [1, 2, 4, 5, 7, 8, 9] and without.forgets == 4
    assert without.nbytes == rebuilt.nbytes
    for query in (["quokkafern"], ["tomato", "garden"], ["number", "9"]):
        assert [(round(s, 9), t.number) for s, t in without.scores(query)] == \
            [(round(s, 9), t.number) for s, t in rebuilt.scores(query)]
    assert [t.number for t in full.turns] == list(range(1, 10))  # the original is left as it was
