"""Forget and provenance (docs/memory.md: "Forget and provenance"; docs/contract.md: Forget and provenance): the turn,
forget and export routes, their origin and session rules, the archive's dropped turns, a compaction read before a
forget being discarded, and the proof that a forgotten word reaches no prompt, response, Redis key or cache.

Real Redis, the app served on loopback, the fake LLM recording every request; folds and refinements are the
service's task bodies called in this process (no eager Celery)."""

from __future__ import annotations

import json

import pytest
import requests

from app.compaction.service import fold_at_cap, run_refinement
from app.memory.forget import Quoting, contains_phrase, plan_forget
from app.memory.record import PERSON, Record, RecordLine
from app.memory.state import Pin, ThreadState
from app.store.keys import ThreadKeys
from chat_support.fake_llm import Reply
from chat_support.live_app import ChatClient, LiveServer
from tests.fixtures.celery_worker import commit_turn, history, seed_turns
from tests.helpers.store_dump import store_text

WORD = "zebrafinch"
PLANTED = f"My locker code is {WORD}-4471, keep it safe."


@pytest.fixture
def served(compaction_rig):
    """``(rig, server)``: the compaction rig's app served on loopback."""
    server = LiveServer(compaction_rig.app)
    yield compaction_rig, server
    server.stop()


def session(server) -> tuple[requests.Session, str]:
    """A browser-like HTTP session and its thread id (from hydration)."""
    http = requests.Session()
    return http, http.get(server.url + "/api/chat/thread", timeout=10).json()["threadId"]


def seed_with_planted(rig, tid: str, turns: int = 7, planted: int = 3):
    """Commit ``turns`` turns, turn ``planted`` holding ``PLANTED``; returns the last commit."""
    result = None
    for n in range(1, turns + 1):
        result = commit_turn(rig.store, tid, n, user=PLANTED if n == planted else None)
    return result


def fold_all(rig, tid: str) -> None:
    """Fold what is due, model-free, as the turn does at the hard cap."""
    assert fold_at_cap(rig.services, tid)


def everything_in_redis(client, tid: str) -> str:
    """Every key of the thread (SCAN on its hash tag) and every value, as one text."""
    return store_text(client, f"*{ThreadKeys(tid).tag}*")


# -- the domain rule -----------------------------------------------------------------------------------


def test_the_plan_drops_the_turns_lines_clears_replaced_by_and_notes_quoting_it_but_keeps_pins():
    record = Record(1, 4, (RecordLine(PERSON, PLANTED, 3), RecordLine(PERSON, "Dinner on Friday.", 2, 3),
                           RecordLine(PERSON, "Tea, not coffee.", 4)))
    state = ThreadState(record=record, notes=(f"The locker code is {WORD}-4471.", "Likes tea."),
                        pins=(Pin("tea please"), Pin(f"{WORD} matters")))
    plan = plan_forget(state, 3, forgotten=[PLANTED, "Noted."], kept=["Dinner on Friday.", "Tea, not coffee."])
    assert [(line.turn, line.replaced_by) for line in plan.record.lines] == [(2, 0), (4, 0)]
    assert plan.notes == ("Likes tea.",) and (plan.record_lines, plan.notes_removed) == (1, 1)
    assert plan.pins_quoting == (2,)


def test_quoting_is_a_word_only_the_forgotten_turn_holds_or_half_the_words():
    quoting = Quoting.of(["The password is hunter2 for the wifi"], ["the wifi is slow today"])
    assert quoting.quotes("hunter2")
    assert quoting.quotes("password wifi")  # half its words come from the forgotten turn
    assert not quoting.quotes("the wifi is slow, they said, again and again")


def test_a_phrase_matches_case_and_width_insensitively_and_chinese_as_written():
    assert contains_phrase("My ZEBRAFINCH code", "zebrafinch")
    assert contains_phrase("code ｚｅｂｒａｆｉｎｃｈ", "ZebraFinch")
    assert contains_phrase("我的储物柜密码是斑马", "储物柜")
    assert not contains_phrase("anything", "   ")


# -- the routes ----------------------------------------------------------------------------------------


def test_a_turn_is_answered_from_the_recent_turns_or_the_archive_and_unknown_turns_are_404(served):
    rig, server = served
    http, tid = session(server)
    seed_with_planted(rig, tid)
    fold_all(rig, tid)  # turns 1-3 archived, 4-7 recent
    body = http.get(server.url + "/api/chat/turns/3", timeout=10).json()
    assert (body["turn"], body["where"], body["reason"]) == (3, "archive", None)
    assert [m["text"] for m in body["messages"]][0] == PLANTED
    assert http.get(server.url + "/api/chat/turns/6", timeout=10).json()["where"] == "recent"
    for n in ("8", "0", "abc", "1234567", "-1"):
        response = http.get(server.url + f"/api/chat/turns/{n}", timeout=10)
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert http.get(server.url + "/api/chat/thread", timeout=10).json()["earliestKeptTurn"] == 1


def test_forgetting_an_archived_turn_removes_it_everywhere_and_names_the_pins_quoting_it(served):
    rig, server = served
    http, tid = session(server)
    seed_with_planted(rig, tid)
    fold_all(rig, tid)
    state = rig.store.load(tid)
    assert any(line.turn == 3 for line in state.record.lines)
    assert rig.store.set_pins_and_notes(tid, expected_gen=state.gen, pins=[Pin(f"remember {WORD}")],
                                        notes=[f"The locker code is {WORD}-4471.", "The person likes numbers."])
    response = http.delete(server.url + "/api/chat/turns/3", timeout=10)
    assert response.status_code == 200
    body = response.json()
    assert body["forgotten"]["turn"] == 3 and body["forgotten"]["archive"] is True
    assert body["forgotten"]["recent"] is False and body["forgotten"]["recordLines"] >= 1
    assert body["forgotten"]["notes"] == 1 and body["pinsQuoting"] == [1]
    after = rig.store.load(tid)
    assert after.pinned_decisions == [f"remember {WORD}"]  # pins are never removed
    assert after.notes == ("The person likes numbers.",)
    assert after.gen > state.gen + 1 and after.forgotten_turns == (3,)
    gone = http.get(server.url + "/api/chat/turns/3", timeout=10).json()
    assert gone == {"turn": 3, "where": "gone", "reason": "forgotten", "messages": []}
    rig.client.hset(ThreadKeys(tid).state, "pins", "[]")  # the pin was the person's own; drop it to scan
    assert WORD not in everything_in_redis(rig.client, tid).lower()
    [entry] = [e for e in history(rig.client, tid) if e.get("step") == "forget"]
    assert entry["forgottenTurn"] == 3


def test_forgetting_a_recent_turn_removes_its_messages(served):
    rig, server = served
    http, tid = session(server)
    seed_turns(rig.store, tid, 3)
    for answer in ("a2", "a3"):
        assert http.post(server.url + "/api/chat/feedback", json={"messageId": answer, "rating": "down",
                                                                  "reason": f"wrong about {answer}"},
                         timeout=10).status_code == 201
    body = http.delete(server.url + "/api/chat/turns/2", timeout=10).json()
    assert body["forgotten"] == {"turn": 2, "recent": True, "archive": False, "recordLines": 0, "notes": 0}
    assert [m.id for m in rig.store.load(tid).messages] == ["u1", "a1", "u3", "a3"]
    feedback = [json.loads(item) for item in rig.client.lrange(ThreadKeys(tid).feedback, 0, -1)]
    assert [entry["messageId"] for entry in feedback] == ["a3"]  # the forgotten answer's feedback went with it


def test_turns_after_a_forgotten_one_keep_their_numbers_through_later_folds(served):
    rig, server = served
    http, tid = session(server)
    seed_with_planted(rig, tid, turns=5)
    assert http.delete(server.url + "/api/chat/turns/3", timeout=10).status_code == 200
    assert http.delete(server.url + "/api/chat/turns/5", timeout=10).status_code == 200  # the newest
    assert http.get(server.url + "/api/chat/turns/5", timeout=10).json()["reason"] == "forgotten"
    for n in range(6, 10):
        commit_turn(rig.store, tid, n)
    assert rig.store.load(tid).turn_numbers() == [1, 2, 4, 6, 7, 8, 9]
    fold_all(rig, tid)  # folds turns 1, 2 and 4
    assert [(t.number, t.messages[0].id) for t in rig.services.archive.all_turns(tid)] == [(1, "u1"), (2, "u2"),
                                                                                        (4, "u4")]
    assert {line.turn for line in rig.store.load(tid).record.lines} <= {0, 1, 2, 4}
    assert http.get(server.url + "/api/chat/turns/4", timeout=10).json()["messages"][0]["id"] == "u4"
    assert http.get(server.url + "/api/chat/turns/3", timeout=10).json()["where"] == "gone"
    assert http.get(server.url + "/api/chat/turns/7", timeout=10).json()["messages"][0]["id"] == "u7"


def test_a_foreign_origin_is_refused_and_another_sessions_turns_are_404(served):
    rig, server = served
    http, tid = session(server)
    seed_with_planted(rig, tid, turns=4)
    foreign = {"Origin": "http://evil.example"}
    assert http.delete(server.url + "/api/chat/turns/3", headers=foreign, timeout=10).status_code == 403
    assert http.post(server.url + "/api/chat/forget", json={"phrase": WORD, "turns": [3]}, headers=foreign,
                     timeout=10).status_code == 403
    other, _ = session(server)
    for method, path in (("get", "/api/chat/turns/3"), ("delete", "/api/chat/turns/3")):
        response = getattr(other, method)(server.url + path, timeout=10)
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    response = other.post(server.url + "/api/chat/forget", json={"phrase": WORD, "turns": [3]}, timeout=10)
    assert response.status_code == 404
    assert rig.store.load(tid).messages[4].text == PLANTED  # nothing of the first session was touched


def test_forget_by_phrase_previews_every_place_then_forgets_the_chosen_turns(served):
    rig, server = served
    http, tid = session(server)
    seed_with_planted(rig, tid)
    fold_all(rig, tid)
    state = rig.store.load(tid)
    rig.store.set_pins_and_notes(tid, expected_gen=state.gen, pins=[Pin(f"{WORD.upper()} stays mine")],
                                 notes=[f"Code {WORD}."])
    preview = http.get(server.url + "/api/chat/forget", params={"phrase": "ＺＥＢＲＡＦＩＮＣＨ"}, timeout=10).json()
    assert preview["phrase"] == "ＺＥＢＲＡＦＩＮＣＨ"
    places = {(item["place"], item["turn"]) for item in preview["items"]}
    assert {("archive", 3), ("record", 3), ("notes", None), ("pins", None)} <= places
    for bad in ("", "   ", "x" * 201):
        response = http.get(server.url + "/api/chat/forget", params={"phrase": bad}, timeout=10)
        assert response.status_code == 400 and response.json()["error"]["code"] == "bad_request"
    response = http.post(server.url + "/api/chat/forget", json={"phrase": WORD, "turns": [3]}, timeout=10)
    assert response.status_code == 200
    body = response.json()
    assert [f["turn"] for f in body["forgotten"]] == [3] and body["pinsQuoting"] == [1]
    left = http.get(server.url + "/api/chat/forget", params={"phrase": WORD}, timeout=10).json()["items"]
    assert [item["place"] for item in left] == ["pins"]
    assert http.post(server.url + "/api/chat/forget", json={"turns": "3"}, timeout=10).status_code == 400


def test_the_export_holds_everything_the_thread_keeps(served):
    rig, server = served
    http, tid = session(server)
    seed_with_planted(rig, tid)
    fold_all(rig, tid)
    response = http.get(server.url + "/api/chat/export", timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Disposition"] == 'attachment; filename="chat-export.json"'
    body = response.json()
    assert set(body) == {"exportedAt", "threadId", "messages", "record", "notes", "pins", "archive", "compactions",
                         "earliestKeptTurn"}
    assert body["threadId"] == tid and [t["turn"] for t in body["archive"]] == [1, 2, 3]
    assert len(body["messages"]) == 8 and body["record"]["lines"] and body["earliestKeptTurn"] == 1
    assert body["compactions"][0]["outcome"] == "applied" and body["compactions"][0]["turnsFolded"] == 3


def test_a_fold_that_makes_the_archive_drop_turns_says_which(make_compaction_rig):
    from app.memory.limits import MemoryLimits
    from app.store.thread_store import ThreadStore
    from tests.fixtures.celery_worker import thread_id_for

    rig = make_compaction_rig()
    rig.services.store = ThreadStore(rig.client, MemoryLimits(archive_max_turns=2), rig.settings.memory_ttl_seconds)
    tid = thread_id_for("forget-dropped")
    seed_turns(rig.store, tid, 9)
    fold_all(rig, tid)  # turns 1-5 folded, the archive keeps 4 and 5
    [entry] = history(rig.client, tid)
    assert entry["droppedTurns"] == [1, 3] and entry["message"] == "turns 1–3 are no longer kept"
    from app.observability.accounting import load_compactions
    assert load_compactions(rig.services, tid)[0]["droppedTurns"] == [1, 3]
    from app.store.archive import Archive
    assert Archive(rig.store).earliest_kept_turn(tid, rig.store.load(tid)) == 4


def test_a_compaction_or_refinement_that_read_memory_before_a_forget_is_discarded(served):
    rig, server = served
    http, tid = session(server)
    seed_with_planted(rig, tid)
    fold_all(rig, tid)
    before = rig.store.load(tid)
    commit_turn(rig.store, tid, 8)
    assert http.delete(server.url + "/api/chat/turns/3", timeout=10).status_code == 200
    stale = rig.store.apply_compaction(tid, expected_gen=before.gen, folded_ids=["u4", "a4"], record=before.record,
                                       notes=[], compacted_at="2026-12-04T00:00:00.000Z")
    assert (stale.outcome, stale.detail) == ("stale", "generation")
    refined = rig.store.apply_refinement(tid, expected_gen=before.gen, refined_turns=3, record=before.record,
                                         notes=[])
    assert refined.outcome == "stale"
    assert WORD not in rig.store.load(tid).summary


def test_a_fold_prepared_before_a_forget_is_discarded_and_the_next_one_applies(served):
    from app.compaction import service

    rig, server = served
    http, tid = session(server)
    seed_with_planted(rig, tid, turns=5)  # turn 1 is due to fold; turn 3 is recent
    prepared = service.prepare(rig.services, tid)
    result = service._compose(rig.services, prepared, None)
    assert http.delete(server.url + "/api/chat/turns/3", timeout=10).status_code == 200
    assert service.commit(rig.services, prepared, result).outcome == "stale"
    assert rig.store.load(tid).folded_turns == 0
    commit_turn(rig.store, tid, 6)
    fold_all(rig, tid)  # read after the forget: applies, without the forgotten turn
    assert WORD not in everything_in_redis(rig.client, tid).lower()


# -- the proof -----------------------------------------------------------------------------------------


def _caches_hold(word: str, tid: str, rig) -> list[str]:
    """Which per-process caches still hold ``word`` (for ``tid``)."""
    from app.store import stored_state

    found = []
    caches = rig.services.caches
    index = caches.archive.cached(tid)
    if index is not None and any(word in m.text.lower() for t in index.turns for m in t.messages):
        found.append("archive index")
    if any(not isinstance(k, bytes) for k in rig.services.counter.cache.keys()):
        found.append("token counts keyed by text")
    if word in repr(stored_state.cached_texts()).lower():
        found.append("stored state")
    for n, cache in enumerate(caches.text_caches):
        if word in repr(cache.keys()).lower():
            found.append(f"text cache {n}")
    return found


@pytest.mark.parametrize("how", ["turn", "phrase"])
def test_a_forgotten_word_reaches_no_prompt_response_key_or_cache(served, fake_llm, how):
    rig, server = served
    fake_llm.add_rule(Reply(json={"summary": "They talked about numbers and a locker.", "pinnedDecisions": []}),
                      structured=True)
    chat = ChatClient(server).connect()
    try:
        tid = chat.thread()["threadId"]
        for n in range(1, 8):
            chat.turn(PLANTED if n == 3 else f"tell me about the number {n} please")
        fold_all(rig, tid)
        assert any(t.number == 3 for t in rig.services.archive.all_turns(tid))
        chat.turn("What is my locker code again?")  # recall brings turn 3 back into the prompt before the forget
        assert WORD in json.dumps([r.body for r in fake_llm.requests]).lower()
        assert "archive index" in _caches_hold(WORD, tid, rig)  # the check below looks where the word was

        if how == "turn":
            assert chat.http.delete(server.url + "/api/chat/turns/3", timeout=10).status_code == 200
        else:
            items = chat.http.get(server.url + "/api/chat/forget", params={"phrase": WORD}, timeout=10).json()["items"]
            turns = sorted({i["turn"] for i in items if i["turn"]})
            assert turns == [3]
            assert chat.http.post(server.url + "/api/chat/forget", json={"phrase": WORD, "turns": turns},
                                  timeout=10).status_code == 200
        fake_llm.clear_requests()

        for n in range(30):
            question = "Which locker code did I give you, the one to keep safe?" if n % 3 == 0 \
                else f"and the number {n + 10}, what do you think about it?"
            chat.turn(question)
            if n % 5 == 4:
                fold_all(rig, tid)
            if n % 10 == 9:
                rig.client.delete(ThreadKeys(tid).active)
                state = rig.store.load(tid)
                run_refinement(rig.services, tid, state.folded_turns)
        assert fake_llm.requests, "the model was asked"
        assert WORD not in json.dumps([r.body for r in fake_llm.requests], ensure_ascii=False).lower()
        assert any(r.messages for r in fake_llm.chat_requests("structured")), "a refinement asked the model"

        for path in ("/api/chat/thread", "/api/chat/inspector", "/api/chat/export", "/api/chat/stats",
                     "/api/chat/turns/3"):
            response = chat.http.get(server.url + path, timeout=10)
            assert response.status_code == 200, path
            assert WORD not in response.text.lower(), path
        assert chat.http.get(server.url + "/api/chat/turns/3", timeout=10).json()["reason"] == "forgotten"
        assert WORD not in everything_in_redis(rig.client, tid).lower()
        assert _caches_hold(WORD, tid, rig) == []
    finally:
        chat.close()


def test_many_turns_are_forgotten_in_one_write_and_a_turn_already_forgotten_writes_nothing(served):
    rig, server = served
    http, tid = session(server)
    seed_with_planted(rig, tid, turns=9)
    fold_all(rig, tid)
    before = rig.store.load(tid)
    response = http.post(server.url + "/api/chat/forget", json={"turns": [5, 1, 3, 8]}, timeout=10)
    assert response.status_code == 200
    body = response.json()
    assert [f["turn"] for f in body["forgotten"]] == [1, 3, 5, 8]
    assert [f["archive"] or f["recent"] for f in body["forgotten"]] == [True, True, True, True]
    after = rig.store.load(tid)
    assert after.version == before.version + 1  # one script, one write, however many turns
    assert (after.forgets, sorted(after.forgotten_turns)) == (before.forgets + 4, [1, 3, 5, 8])
    assert sorted(e["forgottenTurn"] for e in history(rig.client, tid) if e.get("step") == "forget") == [1, 3, 5, 8]
    assert WORD not in everything_in_redis(rig.client, tid).lower()

    again = http.delete(server.url + "/api/chat/turns/3", timeout=10)
    assert again.status_code == 200
    assert again.json() == {"forgotten": {"turn": 3, "recent": False, "archive": False, "recordLines": 0, "notes": 0},
                            "pinsQuoting": []}
    assert http.post(server.url + "/api/chat/forget", json={"turns": [1, 8]}, timeout=10).status_code == 200
    unchanged = rig.store.load(tid)
    assert (unchanged.version, unchanged.gen, unchanged.forgets) == (after.version, after.gen, after.forgets)
    assert len([e for e in history(rig.client, tid) if e.get("step") == "forget"]) == 4
    mixed = http.post(server.url + "/api/chat/forget", json={"turns": [3, 6]}, timeout=10).json()["forgotten"]
    assert [(f["turn"], f["recent"] or f["archive"]) for f in mixed] == [(3, False), (6, True)]
    assert rig.store.load(tid).forgets == after.forgets + 1
