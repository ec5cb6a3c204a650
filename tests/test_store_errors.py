"""Store code raises store errors: the ThreadState store and the run state raise ``StoreUnavailable`` when
Redis fails (and tell the store's error hook), and the person gets the answers other store failures give:
503 ``store_unavailable`` over HTTP, an error frame in a turn.  Real Redis, stopped or cut."""

from __future__ import annotations

import json

import pytest

from app.memory.final_turn import FinalTurn
from app.runtime.run_store import Run, RunStore, new_run_id
from app.settings import MemoryLimits
from app.store.keys import ThreadKeys
from app.store.redis_client import make_redis
from app.store.thread_store import StoreUnavailable, ThreadStore
from chat_support.live_app import ChatClient
from tests.helpers.errors import assert_no_exception_text

THREAD = "chat:" + "cd" * 32


def test_the_thread_store_tells_its_error_hook_then_raises_store_unavailable(own_redis):
    seen = []
    store = ThreadStore(make_redis(own_redis.url, socket_timeout=0.5), MemoryLimits(), 600, on_error=seen.append)
    assert store.commit_final_turn(THREAD, FinalTurn("hi", "hello")).appended is True
    assert seen == []
    own_redis.stop()
    with pytest.raises(StoreUnavailable):
        store.load(THREAD)
    with pytest.raises(StoreUnavailable):
        store.commit_final_turn(THREAD, FinalTurn("again", "hello"))
    assert seen == ["load", "commit_messages"]
    assert (ThreadStore.load.__name__, ThreadStore.load.__wrapped__.__name__) == ("load", "load")
    assert ThreadStore.load.__doc__.startswith("Return the thread's state")

    def broken_hook(operation):
        raise RuntimeError("metrics are down too")

    quiet = ThreadStore(store.redis, MemoryLimits(), 600, on_error=broken_hook)
    with pytest.raises(StoreUnavailable):  # a failing hook changes nothing
        quiet.clear(THREAD)


def test_every_run_store_write_and_claim_raises_store_unavailable_with_redis_stopped(own_redis):
    client = make_redis(own_redis.url, socket_timeout=0.5)
    store = RunStore(client, THREAD)
    run = Run(new_run_id(), "delivery", "Build a page")
    store.save(run)
    store.set_paused(run.id)
    own_redis.stop()
    for call in (lambda: store.save(run), lambda: store.load(run.id), lambda: store.set_paused(run.id),
                 lambda: store.take_paused(), lambda: store.drop_paused()):
        with pytest.raises(StoreUnavailable):
            call()
    assert store.paused_id() is None  # a peek degrades to "nothing waits"
    store.save_quietly(run)  # a run that ends anyway: logged, not raised
    client.close()


def test_clearing_a_thread_while_redis_drops_answers_503_and_works_once_redis_is_back(
        own_redis, cutting_proxy, make_live_app, app_settings, fake_llm):
    fake_llm.default = "Noted."
    # Redis drops at the first command on run state: the clear of the thread itself has gone through
    proxy = cutting_proxy(own_redis.port, cut_on=b"run:{")
    live = make_live_app(app_settings.with_overrides(redis_url=proxy.url, redis_socket_timeout=0.5))
    browser = ChatClient(live)
    thread_id = browser.thread()["threadId"]
    browser.connect()
    assert browser.turn("remember this")[-1]["status"] == "completed"
    browser.close()
    assert not proxy.cut.is_set()

    cleared = browser.http.delete(live.url + "/api/chat/thread", timeout=10)
    assert proxy.cut.is_set()
    assert cleared.status_code == 503
    assert cleared.json() == {"error": {"code": "store_unavailable",
                                        "message": "Memory is unavailable right now; try again shortly."}}
    assert_no_exception_text(cleared.text)
    assert json.loads(own_redis.client().hget(ThreadKeys(thread_id).state, "messages")) == []

    proxy.restore()
    assert browser.http.delete(live.url + "/api/chat/thread", timeout=10).status_code == 204
    assert browser.thread()["messages"] == []


def test_a_run_whose_state_cannot_be_saved_fails_with_an_error_frame(own_redis, make_live_app, app_settings, fake_llm):
    live = make_live_app(app_settings.with_overrides(redis_url=own_redis.url, redis_socket_timeout=0.5))
    browser = ChatClient(live).connect()
    own_redis.stop()
    frames = browser.turn("/delivery Build a landing page")
    assert [f["type"] for f in frames] == ["start", "error", "done"]
    assert frames[1] == {"type": "error", "code": "runtime_unavailable",
                         "message": "Task state is unavailable right now. Please try again."}
    assert frames[2]["status"] == "failed"
    assert fake_llm.chat_requests() == []  # nothing was asked of the model without a place for its state
    browser.close()
