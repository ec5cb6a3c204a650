"""A memory-changing script whose reply is lost (docs/contract.md: the done frame; docs/memory.md: Forget and
provenance, a lost reply).

Between the store and the real test Redis runs a TCP proxy that, once armed, lets the next script (``EVALSHA``)
through and closes the connection instead of returning its reply, or drops the script before Redis sees it, or
(``"dark"``) lets it through, loses its reply and then every reply until ``light()`` (the read-back fails too).
The store never sends the script again: it settles the outcome by reading the thread back; when that fails too
the outcome is unknown (``OutcomeUnknown``), never "not written" (docs/contract.md: the done frame; HTTP,
"Outcome unknown")."""

from __future__ import annotations

import pytest

from app.memory.final_turn import FinalTurn
from app.memory.state import Pin
from app.store.redis_client import make_redis
from app.store.thread_store import OutcomeUnknown, StoreUnavailable, ThreadStore
from tests.fixtures.lossy_proxy import LossyProxy, proxied_url
from tests.fixtures.memory_data import new_thread_id


@pytest.fixture
def lossy(settings):
    proxy = LossyProxy.before(settings.redis_url)
    client = make_redis(proxied_url(settings.redis_url, proxy), socket_timeout=2.0)
    yield proxy, ThreadStore(client, settings.limits, settings.memory_ttl_seconds)
    client.close()
    proxy.close()


def test_a_commit_whose_reply_is_lost_is_settled_as_written_and_sent_once(lossy, store):
    proxy, lossy_store = lossy
    lossy_store.commit_final_turn(new_thread_id(), FinalTurn("warm the script cache", "ok"))  # EVALSHA now loads
    tid = new_thread_id()
    lossy_store.commit_final_turn(tid, FinalTurn("first", "one"))
    sent = proxy.scripts_sent
    proxy.arm("reply")
    result = lossy_store.commit_final_turn(tid, FinalTurn("My locker is 4471.", "Noted."))
    assert (result.appended, result.settled) == (True, True)
    assert proxy.scripts_sent == sent + 1  # never sent again
    assert [m.text for m in store.load(tid).messages] == ["first", "one", "My locker is 4471.", "Noted."]


def test_a_commit_lost_before_redis_saw_it_is_reported_as_not_saved(lossy, store):
    proxy, lossy_store = lossy
    lossy_store.commit_final_turn(new_thread_id(), FinalTurn("warm the script cache", "ok"))
    tid = new_thread_id()
    lossy_store.commit_final_turn(tid, FinalTurn("first", "one"))
    proxy.arm("command")
    with pytest.raises(StoreUnavailable):
        lossy_store.commit_final_turn(tid, FinalTurn("My locker is 4471.", "Noted."))
    assert [m.text for m in store.load(tid).messages] == ["first", "one"]


def test_a_fold_whose_reply_is_lost_is_settled_as_applied_and_a_second_try_is_stale(lossy, store):
    from tests.fixtures.memory_data import CREATED, text_record

    proxy, lossy_store = lossy
    threads = [new_thread_id(), new_thread_id()]
    for tid in threads:
        for n in range(1, 6):
            lossy_store.commit_final_turn(tid, FinalTurn(f"person {n}", f"answer {n}"))
    warm, tid = threads  # a first fold loads the script (a lost NOSCRIPT reply would mean nothing ran)
    warm_state = store.load(warm)
    assert lossy_store.apply_compaction(warm, expected_gen=warm_state.gen, folded_ids=[m.id for m in warm_state.messages[:2]],
                                        record=text_record("x"), notes=[], compacted_at=CREATED).outcome == "applied"
    state = store.load(tid)
    folded = [m.id for m in state.messages[:2]]
    proxy.arm("reply")
    first = lossy_store.apply_compaction(tid, expected_gen=state.gen, folded_ids=folded,
                                         record=text_record("They met."), notes=[], compacted_at=CREATED)
    assert first.outcome == "applied"
    after = store.load(tid)
    assert [m.text for m in after.messages][0] == "person 2" and after.gen == state.gen + 1
    again = lossy_store.apply_compaction(tid, expected_gen=state.gen, folded_ids=folded,
                                         record=text_record("They met."), notes=[], compacted_at=CREATED)
    assert again.outcome == "stale" and len(store.load(tid).messages) == 8


def _thread_with_turns(lossy_store, n: int = 3) -> str:
    lossy_store.commit_final_turn(new_thread_id(), FinalTurn("warm the script cache", "ok"))  # EVALSHA now loads
    tid = new_thread_id()
    for i in range(1, n + 1):
        lossy_store.commit_final_turn(tid, FinalTurn(f"person {i}", f"answer {i}"))
    return tid


def test_a_commit_whose_reply_and_read_back_are_lost_is_unknown_not_unsaved(lossy, store):
    proxy, lossy_store = lossy
    tid = _thread_with_turns(lossy_store, 1)
    proxy.arm("dark")
    with pytest.raises(OutcomeUnknown):
        lossy_store.commit_final_turn(tid, FinalTurn("My locker is 4471.", "Noted."))
    proxy.light()
    assert [m.text for m in store.load(tid).messages] == ["person 1", "answer 1", "My locker is 4471.", "Noted."]


def _forget(lossy_store, tid: str, state, turn: int):
    ids = [m.id for messages, n in zip(state.turns(), state.turn_numbers(), strict=True) if n == turn for m in messages]
    return lossy_store.forget_turn(tid, expected_gen=state.gen, turns=[turn], message_ids=ids, record=None,
                                   notes=list(state.notes), entries=[{"at": 1, "forgottenTurn": turn}], max_entries=50,
                                   turn_message_ids=ids)


def _warm_forget(lossy_store, store) -> None:
    """Loads the forget script (a lost NOSCRIPT reply would mean nothing ran)."""
    tid = new_thread_id()
    lossy_store.commit_final_turn(tid, FinalTurn("a", "b"))
    assert _forget(lossy_store, tid, store.load(tid), 1).applied


def test_a_forget_whose_reply_is_lost_is_settled_as_applied(lossy, store):
    proxy, lossy_store = lossy
    tid = _thread_with_turns(lossy_store)
    _warm_forget(lossy_store, store)
    state = store.load(tid)
    proxy.arm("reply")
    committed = _forget(lossy_store, tid, state, 2)
    assert (committed.applied, committed.settled, committed.recent_removed) == (True, True, 2)
    after = store.load(tid)
    assert [m.text for m in after.messages] == ["person 1", "answer 1", "person 3", "answer 3"]
    assert after.forgotten_turns == (2,) and after.gen == state.gen + 1


def test_a_forget_lost_before_redis_saw_it_is_not_applied(lossy, store):
    proxy, lossy_store = lossy
    tid = _thread_with_turns(lossy_store)
    _warm_forget(lossy_store, store)
    state = store.load(tid)
    proxy.arm("command")
    committed = _forget(lossy_store, tid, state, 2)
    assert (committed.applied, committed.settled) == (False, True)
    assert len(store.load(tid).messages) == 6 and store.load(tid).forgotten_turns == ()


def test_a_forget_whose_reply_and_read_back_are_lost_is_unknown(lossy, store):
    proxy, lossy_store = lossy
    tid = _thread_with_turns(lossy_store)
    _warm_forget(lossy_store, store)
    state = store.load(tid)
    proxy.arm("dark")
    with pytest.raises(OutcomeUnknown):
        _forget(lossy_store, tid, state, 2)
    proxy.light()
    assert store.load(tid).forgotten_turns == (2,)


def test_pins_whose_reply_is_lost_are_settled_and_unknown_when_the_read_back_fails(lossy, store):
    proxy, lossy_store = lossy
    tid = _thread_with_turns(lossy_store, 1)
    lossy_store.set_pins(new_thread_id(), expected_gen=0, pins=[])  # loads the script
    gen = store.load(tid).gen
    proxy.arm("reply")
    assert lossy_store.set_pins(tid, expected_gen=gen, pins=[Pin("Use Postgres")]) is True
    assert store.load(tid).pinned_decisions == ["Use Postgres"]
    proxy.arm("dark")
    with pytest.raises(OutcomeUnknown):
        lossy_store.set_pins(tid, expected_gen=gen + 1, pins=[Pin("Use Postgres"), Pin("Ship Friday")])
    proxy.light()
    assert store.load(tid).pinned_decisions == ["Use Postgres", "Ship Friday"]
    proxy.arm("command")
    assert lossy_store.set_pins(tid, expected_gen=gen + 2, pins=[]) is False  # Redis never saw it: not written
    assert store.load(tid).pinned_decisions == ["Use Postgres", "Ship Friday"]


def test_a_clear_whose_reply_is_lost_is_settled_and_unknown_when_the_read_back_fails(lossy, store):
    proxy, lossy_store = lossy
    tid = _thread_with_turns(lossy_store, 2)
    lossy_store.clear(new_thread_id())  # loads the script
    proxy.arm("reply")
    version = lossy_store.clear(tid)
    after = store.load(tid)
    assert after.messages == () and after.cleared == 1 and version == after.version
    lossy_store.commit_final_turn(tid, FinalTurn("again", "yes"))
    proxy.arm("dark")
    with pytest.raises(OutcomeUnknown):
        lossy_store.clear(tid)
    proxy.light()
    assert store.load(tid).messages == () and store.load(tid).cleared == 2
    lossy_store.commit_final_turn(tid, FinalTurn("once more", "yes"))
    proxy.arm("command")
    with pytest.raises(StoreUnavailable) as refused:
        lossy_store.clear(tid)
    assert not isinstance(refused.value, OutcomeUnknown)
    assert len(store.load(tid).messages) == 2


# -- through the app: what the person is told (the live app's store behind the proxy) --------------------------

@pytest.fixture
def lossy_app(make_live_app, app_settings):
    from chat_support.live_app import ChatClient

    proxy = LossyProxy.before(app_settings.redis_url)
    server = make_live_app(app_settings.with_overrides(redis_url=proxied_url(app_settings.redis_url, proxy)))
    chat = ChatClient(server).connect()
    yield proxy, server, chat
    proxy.light()
    chat.close()
    proxy.close()


def test_the_done_frame_says_unknown_when_the_commit_and_its_read_back_are_lost(lossy_app, store, fake_llm):
    from chat_support.fake_llm import Reply

    proxy, _server, chat = lossy_app
    fake_llm.default = Reply(text="Noted.")
    assert chat.turn("warm the commit script")[-1]["status"] == "completed"
    proxy.arm("dark")
    frames = chat.turn("My locker is 4471.")
    proxy.light()
    assert frames[-1] == {"type": "done", "status": "completed", "messageId": frames[0]["messageId"],
                          "saved": "unknown"}
    thread_id = chat.thread()["threadId"]
    assert [m.text for m in store.load(thread_id).messages][-2:] == ["My locker is 4471.", "Noted."]  # it was stored


def test_the_forget_route_answers_what_redis_holds_when_its_reply_is_lost(lossy_app, store, fake_llm):
    from chat_support.fake_llm import Reply

    proxy, server, chat = lossy_app
    fake_llm.default = Reply(text="Noted.")
    for text in ("first", "second", "third"):
        assert chat.turn(text)[-1]["status"] == "completed"
    thread_id = chat.thread()["threadId"]
    assert chat.http.delete(server.url + "/api/chat/turns/1", timeout=10).status_code == 200  # loads the script
    proxy.arm("reply")
    lost = chat.http.delete(server.url + "/api/chat/turns/2", timeout=10)
    assert lost.status_code == 200 and lost.json()["forgotten"]["turn"] == 2 and lost.json()["forgotten"]["recent"]
    assert store.load(thread_id).forgotten_turns == (1, 2)
    proxy.arm("dark")
    unknown = chat.http.delete(server.url + "/api/chat/turns/3", timeout=10)
    proxy.light()
    assert (unknown.status_code, unknown.json()["outcome"]) == (202, "unknown")
    assert "error" not in unknown.json()
    assert store.load(thread_id).forgotten_turns == (1, 2, 3)
    # what the page reads again to know
    assert chat.http.get(server.url + "/api/chat/turns/3", timeout=10).json()["reason"] == "forgotten"


def test_the_pins_and_clear_routes_answer_what_redis_holds_when_a_reply_is_lost(lossy_app, store):
    proxy, server, chat = lossy_app
    pins, thread = server.url + "/api/chat/pins", server.url + "/api/chat/thread"
    thread_id = chat.thread()["threadId"]
    assert chat.http.post(pins, json={"text": "Use Postgres"}, timeout=10).status_code == 201  # loads the script
    proxy.arm("reply")
    settled = chat.http.post(pins, json={"text": "Ship Friday"}, timeout=10)
    assert (settled.status_code, settled.json()["pinnedDecisions"]) == (201, ["Use Postgres", "Ship Friday"])
    proxy.arm("dark")
    unknown = chat.http.delete(pins + "/1", timeout=10)
    proxy.light()
    assert (unknown.status_code, unknown.json()["outcome"]) == (202, "unknown")
    assert store.load(thread_id).pinned_decisions == ["Ship Friday"]
    assert chat.clear() == 204  # loads the clear script
    chat.http.post(pins, json={"text": "Use Postgres"}, timeout=10)
    proxy.arm("dark")
    cleared = chat.http.delete(thread, timeout=10)
    proxy.light()
    assert (cleared.status_code, cleared.json()["outcome"]) == (202, "unknown")
    assert store.load(thread_id).pinned_decisions == []
    chat.http.post(pins, json={"text": "Use Postgres"}, timeout=10)
    proxy.arm("command")  # Redis never sees it: the one answer that says nothing changed
    refused = chat.http.delete(thread, timeout=10)
    assert (refused.status_code, refused.json()["error"]["code"]) == (503, "store_unavailable")
    assert store.load(thread_id).pinned_decisions == ["Use Postgres"]
