"""The Redis ThreadStore against a real Redis: commits, versions, TTLs, dedupe, clear, compaction CAS, pins CAS."""

from __future__ import annotations

import json

import pytest

from app.memory.final_turn import FinalTurn, TurnRejected
from app.memory.migration import read_record
from app.memory.state import Pin, ThreadState
from app.store.keys import ThreadKeys
from app.store.thread_store import CorruptState, StoreUnavailable, ThreadStore
from tests.fixtures.memory_data import CHINESE, CREATED, new_thread_id, state, text_record, turn, write_raw_state

TTL = 604800


@pytest.fixture
def tid():
    return new_thread_id()


def texts(st: ThreadState) -> list[str]:
    return [m.text for m in st.messages]


def commit_turns(store, tid, n, start=1):
    for i in range(start, start + n):
        store.commit_messages(tid, *turn(i), dedupe_by_text=False)


# -- reading --------------------------------------------------------------------------------------------

def test_unknown_thread_loads_as_the_empty_state(store, tid):
    assert store.load(tid) == ThreadState()


def test_raw_hash_written_in_the_documented_layout_loads_back(store, redis_client, tid):
    st = ThreadState(messages=state(2).messages, record=text_record("sum"), pins=(Pin("p", "person"),),
                     last_compacted_at=CREATED)
    write_raw_state(redis_client, tid, st, version=5, gen=2)
    loaded = store.load(tid)
    assert loaded == ThreadState(st.messages, text_record("sum"), (Pin("p", "person"),), CREATED, version=5, gen=2)


def test_stored_message_with_an_extra_key_is_corrupt(store, redis_client, tid):
    key = ThreadKeys(tid).state
    bad = [dict(turn(1)[0].to_dict(), source="tool")]
    redis_client.hset(key, mapping={"v": 1, "gen": 0, "messages": json.dumps(bad), "summary": "", "pins": "[]"})
    with pytest.raises(CorruptState):
        store.load(tid)


def test_reads_skip_validation_when_asked(store, redis_client, tid):
    key = ThreadKeys(tid).state
    long_summary = "s" * 3000
    redis_client.hset(key, mapping={"v": 1, "gen": 0, "messages": "[]", "summary": long_summary, "pins": "[]"})
    with pytest.raises(CorruptState):
        store.load(tid)
    fast = ThreadStore(store.redis, store.limits, TTL, validate_reads=False)
    assert fast.load(tid).record == read_record(long_summary)  # read as the free text an earlier version wrote


def test_invalid_json_in_the_hash_is_corrupt(store, redis_client, tid):
    redis_client.hset(ThreadKeys(tid).state, mapping={"v": 1, "messages": "[{not json", "summary": "", "pins": "[]"})
    with pytest.raises(CorruptState):
        store.load(tid)


def test_a_state_key_that_is_not_a_hash_is_corrupt_and_clear_replaces_it(store, redis_client, tid):
    redis_client.set(ThreadKeys(tid).state, "x")  # HGETALL on a string: WRONGTYPE
    with pytest.raises(CorruptState):
        store.load(tid)
    assert store.clear(tid) == 1
    assert store.load(tid) == ThreadState(version=1, gen=1, cleared=1)


def test_redis_error_surfaces_as_store_unavailable(settings, tid):
    from app.store.redis_client import make_redis
    from chat_support.servers import free_port

    client = make_redis(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.5)
    dead = ThreadStore(client, settings.limits, TTL)
    with pytest.raises(StoreUnavailable) as info:
        dead.load(tid)
    assert "ConnectionError" in str(info.value)  # for logs only; responses never carry it


# -- committing -----------------------------------------------------------------------------------------

def test_commit_appends_both_messages(store, tid):
    result = store.commit_final_turn(tid, FinalTurn("  hi ", " hello "))
    assert (result.appended, result.version, result.message_count) == (True, 1, 2)
    loaded = store.load(tid)
    assert [(m.role, m.text) for m in loaded.messages] == [("user", "hi"), ("assistant", "hello")]
    assert [m.id for m in loaded.messages] == [m.id for m in result.messages]
    assert loaded.version == 1


def test_commits_keep_their_order(store, tid):
    commit_turns(store, tid, 5)
    assert texts(store.load(tid)) == ["U1", "A1", "U2", "A2", "U3", "A3", "U4", "A4", "U5", "A5"]


def test_commit_keeps_unicode_text_exactly(store, tid):
    weird = 'emoji 😀👍🏽, CJK 中文, quotes "\' \\ / \u2028 tab\t<|endoftext|>'
    store.commit_final_turn(tid, FinalTurn(CHINESE, weird))
    assert texts(store.load(tid)) == [CHINESE, weird]


def test_commit_does_not_write_a_rejected_turn(store, redis_client, tid):
    with pytest.raises(TurnRejected):
        store.commit_final_turn(tid, FinalTurn("hi", "partial", status="cancelled"))
    with pytest.raises(TurnRejected):
        store.commit_final_turn(tid, FinalTurn("hi", {"tool": "x"}))
    assert redis_client.exists(*ThreadKeys(tid).ttl_keys()) == 0


def test_version_changes_on_every_write(store, tid):
    versions = [store.commit_messages(tid, *turn(1), dedupe_by_text=False).version]
    versions.append(store.commit_messages(tid, *turn(2), dedupe_by_text=False).version)
    gen = store.load(tid).gen
    assert store.set_pins(tid, expected_gen=gen, pins=[Pin("p")]) is True
    versions.append(store.load(tid).version)
    applied = store.apply_compaction(tid, expected_gen=gen + 1, folded_ids=["u1", "a1"], record=text_record("s"),
                                     notes=["n"], compacted_at=CREATED)
    versions.append(applied.version)
    versions.append(store.clear(tid))
    versions.append(store.commit_messages(tid, *turn(3), dedupe_by_text=False).version)
    assert versions == [1, 2, 3, 4, 5, 6]
    assert store.load(tid).version == 6


def test_duplicate_commit_is_not_a_write(store, tid):
    store.commit_messages(tid, *turn(1), dedupe_by_text=False)
    again = store.commit_messages(tid, *turn(1), dedupe_by_text=False)
    assert (again.appended, again.version, again.message_count) == (False, 1, 2)


# -- TTL -------------------------------------------------------------------------------------------------

def seed_side_keys(redis_client, tid, seconds=30):
    keys = ThreadKeys(tid)
    for key in keys.ttl_keys()[1:]:
        if key == keys.archive:
            redis_client.zadd(key, {'{"n":0,"m":[]}': 0})
        else:
            redis_client.rpush(key, "1")
        redis_client.expire(key, seconds)
    return keys


def assert_ttls_refreshed(redis_client, keys, ttl=TTL):
    for key in keys:
        assert ttl - 5 <= redis_client.ttl(key) <= ttl, key


def test_commit_refreshes_the_ttl_of_every_key_of_the_thread(store, redis_client, tid):
    keys = seed_side_keys(redis_client, tid)
    store.commit_messages(tid, *turn(1), dedupe_by_text=False)
    assert keys.ttl_keys() == [keys.state, keys.stats, keys.compactions, keys.feedback, keys.archive]
    assert_ttls_refreshed(redis_client, keys.ttl_keys())


def test_ttl_is_memory_ttl_seconds_from_the_settings(redis_client, store, tid):
    short = ThreadStore(store.redis, store.limits, 120)
    keys = seed_side_keys(redis_client, tid, seconds=5)
    short.commit_messages(tid, *turn(1), dedupe_by_text=False)
    assert_ttls_refreshed(redis_client, keys.ttl_keys(), ttl=120)


def test_set_pins_and_apply_compaction_refresh_every_ttl(store, redis_client, tid):
    commit_turns(store, tid, 2)
    keys = seed_side_keys(redis_client, tid)
    assert store.set_pins(tid, expected_gen=0, pins=[Pin("p", "person")]) is True
    assert_ttls_refreshed(redis_client, keys.ttl_keys())
    seed_side_keys(redis_client, tid)
    redis_client.expire(keys.state, 30)
    result = store.apply_compaction(tid, expected_gen=1, folded_ids=["u1", "a1"], record=text_record("s"),
                                    notes=["n"], compacted_at=CREATED)
    assert result.outcome == "applied"
    assert_ttls_refreshed(redis_client, keys.ttl_keys())


def test_clear_keeps_an_expiring_empty_hash_and_deletes_the_side_keys(store, redis_client, tid):
    commit_turns(store, tid, 1)
    keys = seed_side_keys(redis_client, tid)
    store.clear(tid)
    assert_ttls_refreshed(redis_client, [keys.state])
    assert redis_client.exists(*keys.ttl_keys()[1:]) == 0


# -- dedupe -----------------------------------------------------------------------------------------------

def test_same_assistant_id_twice_leaves_two_messages(store, tid):
    first = store.commit_final_turn(tid, FinalTurn("hi", "hello", user_id="c1", assistant_id="m1"))
    second = store.commit_final_turn(tid, FinalTurn("hi again", "hello again", user_id="c2", assistant_id="m1"))
    assert (first.appended, second.appended) == (True, False)
    assert texts(store.load(tid)) == ["hi", "hello"]


def test_same_user_id_twice_leaves_two_messages(store, tid):
    store.commit_final_turn(tid, FinalTurn("hi", "hello", user_id="c1", assistant_id="m1"))
    store.commit_final_turn(tid, FinalTurn("hi", "other answer", user_id="c1", assistant_id="m2"))
    assert texts(store.load(tid)) == ["hi", "hello"]


def test_id_matching_an_older_turn_is_a_duplicate(store, tid):
    commit_turns(store, tid, 3)
    result = store.commit_messages(tid, *turn(1, "new", "new"), dedupe_by_text=False)
    assert result.appended is False
    assert len(store.load(tid).messages) == 6


def test_same_id_less_texts_twice_leave_two_messages(store, tid):
    store.commit_final_turn(tid, FinalTurn("hi", "hello"))
    again = store.commit_final_turn(tid, FinalTurn(" hi ", "hello\n"))  # equal once trimmed
    assert again.appended is False
    assert texts(store.load(tid)) == ["hi", "hello"]


def test_id_less_pair_equal_to_an_older_pair_is_appended(store, tid):
    for pair in [("hi", "hello"), ("x", "y"), ("hi", "hello")]:
        store.commit_final_turn(tid, FinalTurn(*pair))
    assert texts(store.load(tid)) == ["hi", "hello", "x", "y", "hi", "hello"]


def test_same_texts_with_new_ids_are_a_new_turn(store, tid):
    store.commit_final_turn(tid, FinalTurn("hi", "hello", user_id="c1", assistant_id="m1"))
    store.commit_final_turn(tid, FinalTurn("hi", "hello", user_id="c2", assistant_id="m2"))
    assert texts(store.load(tid)) == ["hi", "hello", "hi", "hello"]


def test_half_matching_texts_are_a_new_turn(store, tid):
    store.commit_final_turn(tid, FinalTurn("hi", "hello"))
    store.commit_final_turn(tid, FinalTurn("hi", "hello there"))
    assert texts(store.load(tid)) == ["hi", "hello", "hi", "hello there"]


# -- clear -------------------------------------------------------------------------------------------------

def test_clear_empties_the_thread_and_moves_the_generation(store, tid):
    commit_turns(store, tid, 3)
    store.set_pins(tid, expected_gen=0, pins=[Pin("p")])
    before = store.load(tid)
    store.clear(tid)
    after = store.load(tid)
    assert (after.messages, after.summary, after.pins, after.last_compacted_at) == ((), "", (), None)
    assert after.is_empty is True
    assert after.gen == before.gen + 1


def test_compaction_that_read_before_a_clear_is_stale_and_writes_nothing(store, redis_client, tid):
    commit_turns(store, tid, 6)
    seen = store.load(tid)
    store.clear(tid)
    raw_before = redis_client.hgetall(ThreadKeys(tid).state)
    result = store.apply_compaction(tid, expected_gen=seen.gen, folded_ids=["u1", "a1", "u2", "a2"],
                                    record=text_record("from before the clear"), notes=["stale note"],
                                    compacted_at=CREATED)
    assert (result.outcome, result.detail) == ("stale", "generation")
    assert redis_client.hgetall(ThreadKeys(tid).state) == raw_before
    assert store.load(tid).is_empty is True


def test_history_of_work_that_read_before_a_clear_is_not_recorded_in_the_new_conversation(store, redis_client, tid):
    commit_turns(store, tid, 3)
    seen = store.load(tid)
    entry = {"at": 1, "outcome": "stale", "reason": "generation", "step": "refine"}
    assert store.history.record_compaction(tid, entry, 50, cleared=seen.cleared) is True  # not cleared: recorded
    store.clear(tid)
    commit_turns(store, tid, 1)  # the new conversation's first turn: the thread exists again
    assert store.history.record_compaction(tid, entry, 50, cleared=seen.cleared) is False
    assert redis_client.lrange(ThreadKeys(tid).compactions, 0, -1) == []
    assert store.history.record_compaction(tid, entry, 50, cleared=store.load(tid).cleared) is True  # its own work is


def test_clear_then_commit_starts_a_fresh_thread(store, tid):
    commit_turns(store, tid, 2)
    store.clear(tid)
    store.commit_messages(tid, *turn(1), dedupe_by_text=False)  # ids of the old thread are reusable
    assert texts(store.load(tid)) == ["U1", "A1"]


def test_clear_moves_the_clear_counter_and_keeps_it(store, redis_client, tid):
    assert store.load(tid).cleared == 0
    commit_turns(store, tid, 1)
    store.clear(tid)
    store.clear(tid)
    assert redis_client.hget(ThreadKeys(tid).state, "clr") == "2"
    assert store.load(tid).cleared == 2


def test_a_turn_that_started_before_a_clear_writes_nothing(store, redis_client, tid):
    commit_turns(store, tid, 1)
    seen = store.load(tid).cleared
    store.clear(tid)
    raw_before = redis_client.hgetall(ThreadKeys(tid).state)
    result = store.commit_final_turn(tid, FinalTurn("U2", "A2", "completed", user_id="u2", assistant_id="a2"),
                                     expected_cleared=seen)
    assert (result.appended, result.cleared, result.message_count) == (False, True, 0)
    assert redis_client.hgetall(ThreadKeys(tid).state) == raw_before
    assert store.load(tid).is_empty is True
    fresh = store.commit_final_turn(tid, FinalTurn("U3", "A3", "completed"), expected_cleared=store.load(tid).cleared)
    assert (fresh.appended, fresh.cleared) == (True, False)
    assert texts(store.load(tid)) == ["U3", "A3"]


def test_set_pins_and_notes_is_a_compare_and_set_and_a_clear_makes_it_stale(store, tid):
    commit_turns(store, tid, 1)
    state = store.load(tid)
    assert store.set_pins_and_notes(tid, expected_gen=state.gen, pins=[Pin("keep")], notes=["n1", "n2"])
    after = store.load(tid)
    assert (after.pins, after.notes, after.gen) == ((Pin("keep"),), ("n1", "n2"), state.gen + 1)
    assert not store.set_pins_and_notes(tid, expected_gen=state.gen, pins=[], notes=[])
    store.clear(tid)
    assert not store.set_pins_and_notes(tid, expected_gen=after.gen, pins=[Pin("keep")], notes=["n1"])
    assert store.load(tid).is_empty is True


# -- apply_compaction ------------------------------------------------------------------------------------

WEIRD = 'U7 中文 😀👍🏽 "quotes" \\ back / slash \u2028 \x01 tab\t <|endoftext|>'


def test_compaction_keeps_messages_appended_meanwhile(store, tid):
    commit_turns(store, tid, 6)
    seen = store.load(tid)
    store.commit_messages(tid, *turn(7, WEIRD, "A7"), dedupe_by_text=False)  # while the model runs
    result = store.apply_compaction(tid, expected_gen=seen.gen, folded_ids=["u1", "a1", "u2", "a2"],
                                    record=text_record("U1 and U2 happened."), notes=["keep 中文 😀"],
                                    compacted_at=CREATED)
    assert result.outcome == "applied"
    after = store.load(tid)
    assert texts(after) == ["U3", "A3", "U4", "A4", "U5", "A5", "U6", "A6", WEIRD, "A7"]
    assert after.messages == seen.messages[4:] + turn(7, WEIRD, "A7")  # re-encoded by Lua's cjson, unchanged
    assert (after.record, after.notes, after.last_compacted_at) == (text_record("U1 and U2 happened."),
                                                                    ("keep 中文 😀",), CREATED)
    assert after.gen == seen.gen + 1
    assert result.version == after.version


def test_compaction_whose_folded_messages_are_no_longer_oldest_is_stale(store, tid):
    commit_turns(store, tid, 3)
    gen = store.load(tid).gen
    for folded in (["a1", "u2"], ["u1", "a2"], ["u1", "a1", "u2", "a2", "u3", "a3", "u9"], []):
        result = store.apply_compaction(tid, expected_gen=gen, folded_ids=folded, record=text_record("s"), notes=[],
                                        compacted_at=CREATED)
        assert (result.outcome, result.detail) == ("stale", "messages")
    assert texts(store.load(tid)) == ["U1", "A1", "U2", "A2", "U3", "A3"]


def test_compaction_of_a_missing_thread_is_stale_and_creates_nothing(store, redis_client, tid):
    result = store.apply_compaction(tid, expected_gen=0, folded_ids=["u1"], record=text_record("s"), notes=[],
                                    compacted_at=CREATED)
    assert (result.outcome, result.detail) == ("stale", "missing")
    assert redis_client.exists(ThreadKeys(tid).state) == 0


def test_second_compaction_with_the_same_generation_is_stale(store, tid):
    commit_turns(store, tid, 6)
    gen = store.load(tid).gen
    first = store.apply_compaction(tid, expected_gen=gen, folded_ids=["u1", "a1"], record=text_record("one"), notes=[],
                                   compacted_at=CREATED)
    second = store.apply_compaction(tid, expected_gen=gen, folded_ids=["u2", "a2"], record=text_record("two"), notes=[],
                                    compacted_at=CREATED)
    assert (first.outcome, second.outcome, second.detail) == ("applied", "stale", "generation")
    assert store.load(tid).record == text_record("one")


def test_compaction_of_every_message_leaves_an_empty_list(store, tid):
    commit_turns(store, tid, 1)
    result = store.apply_compaction(tid, expected_gen=0, folded_ids=["u1", "a1"], record=text_record("all folded"),
                                    notes=[], compacted_at=CREATED)
    assert result.outcome == "applied"
    after = store.load(tid)
    assert (after.messages, after.record) == ((), text_record("all folded"))
    store.commit_messages(tid, *turn(2), dedupe_by_text=False)
    assert texts(store.load(tid)) == ["U2", "A2"]


# -- set_pins ---------------------------------------------------------------------------------------------

def test_set_pins_is_a_compare_and_set_on_the_generation(store, tid):
    commit_turns(store, tid, 1)
    assert store.set_pins(tid, expected_gen=0, pins=[Pin("first", "person")]) is True
    assert store.set_pins(tid, expected_gen=0, pins=[Pin("lost update", "person")]) is False
    after = store.load(tid)
    assert (after.pins, after.gen) == ((Pin("first", "person"),), 1)
    assert store.set_pins(tid, expected_gen=1, pins=[]) is True
    assert store.load(tid).pins == ()
    assert texts(store.load(tid)) == ["U1", "A1"]


def test_set_pins_on_a_new_thread_creates_a_valid_state(store, tid):
    assert store.set_pins(tid, expected_gen=0, pins=[Pin("p", "person")]) is True
    assert store.load(tid) == ThreadState(pins=(Pin("p", "person"),), version=1, gen=1)


def test_set_pins_after_a_compaction_started_makes_the_compaction_stale(store, tid):
    commit_turns(store, tid, 6)
    seen = store.load(tid)
    assert store.set_pins(tid, expected_gen=seen.gen, pins=[Pin("mine", "person")]) is True
    result = store.apply_compaction(tid, expected_gen=seen.gen, folded_ids=["u1", "a1"], record=text_record("s"),
                                    notes=[], compacted_at=CREATED)
    assert result.outcome == "stale"
    assert store.load(tid).pins == (Pin("mine", "person"),)


# -- compaction marker ---------------------------------------------------------------------------------------

def test_one_pending_compaction_marker_at_a_time(store, redis_client, tid):
    assert store.mark_compaction_pending(tid, 3, 60) is True
    assert store.mark_compaction_pending(tid, 4, 60) is False
    assert redis_client.get(ThreadKeys(tid).compacting) == "3"
    assert 55 <= redis_client.ttl(ThreadKeys(tid).compacting) <= 60
    assert store.markers.release_compaction_marker(tid, 4) is False  # not the version it holds: left alone
    assert store.markers.release_compaction_marker(tid, 3) is True
    assert store.mark_compaction_pending(tid, 5, 60) is True


def test_a_marker_value_is_a_version_or_a_block_and_reads_back_as_it_was_written():
    from app.store.compaction_markers import MarkerValue

    assert MarkerValue.of_version(7).encode() == "7"
    assert MarkerValue.blocking("corrupt").encode() == "blocked:corrupt"
    assert MarkerValue.decode("7") == MarkerValue(version=7, blocked=None)
    assert MarkerValue.decode("blocked:corrupt") == MarkerValue(version=None, blocked="corrupt")
    assert MarkerValue.decode("blocked:") == MarkerValue(version=None, blocked="")
    assert [MarkerValue.decode(v) for v in (None, "", "soon", 7)] == [None, None, None, None]
    for value in (MarkerValue.of_version(0), MarkerValue.of_version(123456), MarkerValue.blocking("fact_guard")):
        assert MarkerValue.decode(value.encode()) == value


def test_a_block_holds_the_folds_marker_until_a_clear_and_no_fold_is_marked_meanwhile(store, redis_client, tid):
    commit_turns(store, tid, 1)
    markers = store.markers
    assert markers.compactions_blocked(tid) is None
    markers.block_compactions(tid, "corrupt", 300)
    assert redis_client.get(ThreadKeys(tid).compacting) == "blocked:corrupt"
    assert 295 <= redis_client.ttl(ThreadKeys(tid).compacting) <= 300
    assert markers.compactions_blocked(tid) == "corrupt"
    assert markers.mark_compaction_pending(tid, 4, 60) is False
    assert markers.hold_compaction_marker(tid, 4, 60) is False  # a block is no task's marker
    assert redis_client.get(ThreadKeys(tid).compacting) == "blocked:corrupt"
    assert markers.mark_compaction_pending(tid, 4, 60, refine=True) is True  # the refinement's marker is another key
    assert redis_client.get(ThreadKeys(tid).refining) == "4"
    redis_client.set(ThreadKeys(tid).compacting, "9")
    assert markers.compactions_blocked(tid) is None  # a version is no block
    markers.block_compactions(tid, "corrupt", 300)
    store.clear(tid)
    assert markers.compactions_blocked(tid) is None
    assert redis_client.exists(ThreadKeys(tid).compacting, ThreadKeys(tid).refining) == 0


def test_the_activity_key_reads_back_as_an_activity_with_its_remaining_life(store, redis_client, tid):
    from app.store.compaction_markers import Activity, RefineStatus

    assert store.refine_status(tid) == RefineStatus(0, 0, None, 0)
    store.markers.mark_activity(tid, Activity.STREAMING, 30)
    assert redis_client.get(ThreadKeys(tid).active) == "streaming"
    status = store.markers.refine_status(tid)
    assert status.activity is Activity.STREAMING and 29_000 <= status.activity_ms <= 30_000
    store.markers.mark_activity(tid, Activity.IDLE, 20)
    assert store.refine_status(tid).activity is Activity.IDLE
    redis_client.set(ThreadKeys(tid).active, "dozing", px=5000)
    assert store.refine_status(tid).activity == "dozing"  # a value no version writes is kept as read
    redis_client.hset(ThreadKeys(tid).state, mapping={"rf": 4, "uf": 2})
    status = store.refine_status(tid)
    assert (status.refined_turns, status.unrefined_folds, status.activity) == (4, 2, "dozing")


def test_the_history_keeps_the_newest_history_max_entries_and_a_forget_entry_has_its_shape(store, redis_client, tid):
    from app.store.compaction_history import HISTORY_MAX, HistoryStep, forget_entry

    assert HISTORY_MAX == 50
    assert forget_entry(3, 1_700_000_000_000) == {"at": 1_700_000_000_000, "outcome": "applied",
                                                   "reason": "forgotten", "step": "forget", "forgottenTurn": 3}
    assert HistoryStep.values() == {"fold", "refine", "forget", "clear"}
    assert store.history.record_compaction(tid, forget_entry(1, 1), 2) is False  # no thread: nothing recorded
    commit_turns(store, tid, 1)
    for n in range(1, HISTORY_MAX + 3):
        assert store.history.record_compaction(tid, forget_entry(n, n)) is True
    stored = redis_client.lrange(ThreadKeys(tid).compactions, 0, -1)
    assert len(stored) == HISTORY_MAX
    assert stored[0] == '{"at":52,"outcome":"applied","reason":"forgotten","step":"forget","forgottenTurn":52}'
    assert json.loads(stored[-1])["forgottenTurn"] == 3


# -- socket leases and health ---------------------------------------------------------------------------------

def test_one_lease_object_serves_the_session_and_the_address_limits(store, redis_client, tid):
    from app.store.keys import client_sockets_key
    from app.store.socket_leases import LeaseOwner, SocketLeases

    leases = SocketLeases(redis_client, store.guard)
    session, address = LeaseOwner.session(tid), LeaseOwner.client("192.0.2.7")
    assert (session.key, session.reported) == (ThreadKeys(tid).sockets, True)
    assert (address.key, address.reported) == (client_sockets_key("192.0.2.7"), False)
    for owner in (session, address):
        assert [leases.claim(owner, s, most=2, lease_seconds=60) for s in "abc"] == [True, True, False]
        assert sorted(redis_client.zrange(owner.key, 0, -1)) == ["a", "b"]
        leases.renew(owner, "a", lease_seconds=120)
        assert 59_000 <= redis_client.pttl(owner.key)
        leases.release(owner, "a")
        assert redis_client.zrange(owner.key, 0, -1) == ["b"]
        assert leases.claim(owner, "c", most=2, lease_seconds=60) is True


def test_a_failed_lease_is_reported_for_a_session_only_and_the_health_probes_report_ping(settings, tid):
    from app.settings import MemoryLimits
    from app.store.health import StoreHealth
    from app.store.redis_client import make_redis
    from app.store.socket_leases import LeaseOwner, SocketLeases
    from chat_support.servers import free_port

    seen: list[str] = []
    client = make_redis(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.5)
    dead = ThreadStore(client, MemoryLimits(), TTL, on_error=seen.append)
    leases, health = SocketLeases(client, dead.guard), StoreHealth(client, dead.guard)
    for call in (lambda: leases.claim(LeaseOwner.session(tid), "s", most=1, lease_seconds=1),
                 lambda: leases.renew(LeaseOwner.session(tid), "s", lease_seconds=1),
                 lambda: leases.release(LeaseOwner.session(tid), "s"),
                 lambda: leases.claim(LeaseOwner.client("192.0.2.7"), "s", most=1, lease_seconds=1),
                 health.ping, health.probe_write):
        with pytest.raises(StoreUnavailable):
            call()
    assert seen == ["claim_socket", "renew_socket", "release_socket", "ping"]


# -- isolation ------------------------------------------------------------------------------------------------

def test_threads_never_see_each_others_messages(store):
    a, b = new_thread_id(), new_thread_id()
    commit_turns(store, a, 2)
    store.commit_messages(b, *turn(9), dedupe_by_text=False)
    store.clear(b)
    assert texts(store.load(a)) == ["U1", "A1", "U2", "A2"]
    assert store.load(b).messages == ()


def test_malformed_thread_id_is_refused_before_touching_redis(store):
    with pytest.raises(ValueError):
        store.load("chat:../../etc")
    with pytest.raises(ValueError):
        store.commit_messages("mem:{x}", *turn(1), dedupe_by_text=False)
