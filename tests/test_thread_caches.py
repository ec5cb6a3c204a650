"""Every cache a process keeps of a thread sits behind ``Services.caches`` and its one ``drop_thread`` (the forget
path's only call): the archive's tokenised index, the stored state's checked messages and record, the facts and the
sentences read from texts.  A real Redis."""

from __future__ import annotations

from app.extensions import Services
from app.memory.compaction import extract_facts
from app.memory.compaction.record import sentences
from app.store import stored_state
from app.store.keys import ThreadKeys
from tests.fixtures.memory_data import CREATED, new_thread_id, text_record, turn

SECRET = "my locker code is quokkafern-4471. I keep it safe."
OTHER = "the garden needs water on friday. The roses too."


def _seed(store, tid: str, secret: str) -> None:
    store.commit_messages(tid, *turn(1, secret, "noted"), dedupe_by_text=False)
    for i in range(2, 6):
        store.commit_messages(tid, *turn(i, f"turn {i} of the thread", f"answer {i}"), dedupe_by_text=False)
    gen = store.load(tid).gen
    assert store.apply_compaction(tid, expected_gen=gen, folded_ids=["u1", "a1"], record=text_record("s"),
                                  notes=[], compacted_at=CREATED).outcome == "applied"
    store.commit_messages(tid, *turn(6, secret + " (again)", "noted again"), dedupe_by_text=False)


def _fill(svc: Services, tid: str, secret: str):
    state, index = svc.archive.load_turn_memory(tid)  # the index, and the checked messages and record
    extract_facts(secret)
    sentences(secret)
    return state, index


def test_drop_thread_empties_every_cache_of_the_thread_and_keeps_what_it_is_given(settings):
    svc = Services(settings)
    caches = svc.caches
    assert caches.archive is svc.archive and len(caches.text_caches) == 2
    tid, other = new_thread_id(), new_thread_id()
    _seed(svc.store, tid, SECRET)
    _seed(svc.store, other, OTHER)
    state, index = _fill(svc, tid, SECRET)
    _, other_index = _fill(svc, other, OTHER)
    assert [t.number for t in index.turns] == [1] and index.turns[0].person == SECRET
    assert svc.archive.cached(tid) is index and svc.archive.cached(other) is other_index
    held = stored_state.cached_texts()
    assert SECRET + " (again)" in held and OTHER + " (again)" in held and "turn 2 of the thread" in held
    facts, split = caches.text_caches
    assert SECRET in facts.keys() and SECRET in split.keys()  # the facts read from it, its sentences
    summary = svc.redis.hget(ThreadKeys(tid).state, "summary")
    assert summary in held  # the checked record (with the pins and notes)

    forgotten = [m.text for m in state.messages if m.text.startswith(SECRET)] + [SECRET, "noted"]
    caches.drop_thread(tid, texts=forgotten)

    assert svc.archive.cached(tid) is None
    assert svc.archive.cached(other) is other_index  # another thread's index stays
    held = stored_state.cached_texts()
    assert not any(SECRET in text for text in held)
    assert OTHER + " (again)" in held and "turn 2 of the thread" in held  # messages of other texts stay
    assert [len(cache) for cache in caches.text_caches] == [0, 0]
    assert summary not in held  # every checked record is checked again on its next read

    state_again, rebuilt = svc.archive.load_turn_memory(tid)  # everything is rebuilt on its next use
    assert state_again == state and [t.number for t in rebuilt.turns] == [1] and rebuilt is not index
    kept = rebuilt.without(frozenset({1}), forgets=rebuilt.forgets)
    caches.drop_thread(tid, keep=kept)
    assert svc.archive.cached(tid) is kept and len(kept) == 0
    caches.drop_thread(tid)
    assert svc.archive.cached(tid) is None


def test_the_forget_route_drops_the_caches_through_drop_thread_only():
    from pathlib import Path

    source = (Path(__file__).resolve().parents[1] / "app/web/api/forget.py").read_text()
    assert source.count("caches.drop_thread(") == 1
    for private in ("_cache", "_split_cache", "_checked_", "drop_thread_cache"):
        assert private not in source
