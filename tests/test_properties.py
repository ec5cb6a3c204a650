"""Property-based: random commits, duplicates, invalid turns and clears against the REAL store.

After every step the stored hash satisfies the stored-state schema, keeps commit order, holds no message id
twice, and equals a pure reference model built with ``append_turn`` (the Python twin of the Lua dedupe).
"""

from __future__ import annotations

import json

import redis
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from app.memory.final_turn import FinalTurn, TurnRejected
from app.memory.schemas import stored_state_schema
from app.memory.state import ThreadState
from app.settings import MemoryLimits
from app.store.keys import ThreadKeys
from app.store.redis_client import make_redis
from app.store.thread_store import ThreadStore
from tests.fixtures.memory_data import new_thread_id
from tests.fixtures.reference_memory import append_turn

IDS = st.one_of(st.none(), st.sampled_from(["c1", "c2", "m1", "m2", "m_3"]), st.just("bad id"))
TEXTS = st.one_of(
    st.sampled_from(["hi", "hello", " hi ", "hello\n", "中文", "😀", "<|endoftext|>", 'a"b\\c']),
    st.sampled_from(["", "   "]),                       # blank
    st.sampled_from([42, None, ["hi"], {"t": "hi"}]),   # not a string
    st.text(min_size=1, max_size=12),
)
STATUSES = st.sampled_from([None, "completed", "blocked", "final", "paused", "failed", "cancelled", "interrupted"])
SOURCES = st.sampled_from(["chat", "tool", "mcp-resource", "tasklist-agent", "delivery-chain", "browser"])

COMMIT = st.builds(lambda u, a, status, source, uid, aid: ("commit", FinalTurn(u, a, status, source, uid, aid)),
                   TEXTS, TEXTS, STATUSES, SOURCES, IDS, IDS)
REPEAT = st.just(("repeat", None))  # the previous commit again, verbatim
CLEAR = st.just(("clear", None))
STEPS = st.lists(st.one_of(COMMIT, COMMIT, COMMIT, REPEAT, CLEAR), min_size=1, max_size=12)


def check_stored(client: redis.Redis, store: ThreadStore, thread_id: str, model: ThreadState) -> None:
    raw = client.hgetall(ThreadKeys(thread_id).state)
    if raw:
        # The hash as the store decodes it: absent summary/pins/notes fields mean empty.
        assert set(raw) <= {"v", "gen", "clr", "messages", "summary", "pins", "notes", "lastCompactedAt",
                            "born"}, raw
        data = {"messages": json.loads(raw["messages"]), "summary": raw.get("summary", ""),
                "pins": json.loads(raw.get("pins") or "[]"), "notes": json.loads(raw.get("notes") or "[]")}
        if "lastCompactedAt" in raw:
            data["lastCompactedAt"] = raw["lastCompactedAt"]
        stored_state_schema(store.limits).load(data)  # raises on any violation
    loaded = store.load(thread_id)
    ids = [m.id for m in loaded.messages]
    assert len(ids) == len(set(ids)), ids
    assert loaded.messages == model.messages
    assert [m.role for m in loaded.messages] == ["user", "assistant"] * (len(loaded.messages) // 2)
    assert (loaded.summary, loaded.pins) == ("", ())


WRITTEN_STATUSES = {None, "completed", "blocked", "final"}  # FinalTurn docstring: the others never are
KNOWN_SOURCES = {"chat", "tool", "mcp-resource", "tasklist-agent", "delivery-chain"}
VALID_IDS = {None, "c1", "c2", "m1", "m2", "m_3"}  # of IDS: letters, digits, "_"; "bad id" has a space


def reference_accepts(turn: FinalTurn) -> bool:
    """The rule of ``FinalTurn``/``prepare_final_turn`` restated: a written status, a known source,
    well-formed distinct ids, and two texts that are strings and not blank once trimmed."""
    def good_text(value) -> bool:
        return isinstance(value, str) and value.strip() != "" and not any(0xD800 <= ord(c) <= 0xDFFF for c in value)

    ids_ok = (turn.user_id in VALID_IDS and turn.assistant_id in VALID_IDS
              and (turn.user_id is None or turn.user_id != turn.assistant_id))
    return (turn.status in WRITTEN_STATUSES and turn.source in KNOWN_SOURCES and ids_ok
            and good_text(turn.user_text) and good_text(turn.assistant_text))


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS)
def test_random_commit_sequences_keep_the_store_equal_to_the_reference_model(redis_url, steps):
    client = make_redis(redis_url)
    client.flushdb()
    store = ThreadStore(client, MemoryLimits(), 604800)
    thread_id = new_thread_id()
    model = ThreadState()
    last_turn = None
    try:
        for kind, turn in steps:
            if kind == "repeat":
                if last_turn is None:
                    continue
                turn = last_turn
            if kind == "clear":
                store.clear(thread_id)
                model = ThreadState()
            else:
                last_turn = turn
                try:
                    result = store.commit_final_turn(thread_id, turn)
                except TurnRejected:
                    assert not reference_accepts(turn)
                else:
                    assert reference_accepts(turn)
                    by_text = turn.user_id is None and turn.assistant_id is None
                    user, assistant = result.messages
                    after = append_turn(model, user, assistant, by_text=by_text)
                    assert result.appended == (after is not model)
                    assert result.message_count == len(after.messages)
                    model = after
            check_stored(client, store, thread_id, model)
    finally:
        client.close()


@hsettings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["x", "y"])), min_size=1, max_size=10))
def test_id_less_duplicates_only_collapse_against_the_last_pair(redis_url, pairs):
    client = make_redis(redis_url)
    client.flushdb()
    store = ThreadStore(client, MemoryLimits(), 604800)
    thread_id = new_thread_id()
    expected: list[tuple[str, str]] = []
    try:
        for pair in pairs:
            store.commit_final_turn(thread_id, FinalTurn(*pair))
            if not expected or expected[-1] != pair:
                expected.append(pair)
        stored = [m.text for m in store.load(thread_id).messages]
        assert stored == [t for pair in expected for t in pair]
    finally:
        client.close()
