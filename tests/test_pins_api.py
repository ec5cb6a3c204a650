"""Pins by the person (``POST /api/chat/pins``, ``DELETE /api/chat/pins/<n>``).

Real components: the test Redis; Flask's test client for plain HTTP; the app on
loopback and the fake model over HTTP where a turn runs and, for the compaction
test, a real Celery worker consuming the real Redis broker.
"""

from __future__ import annotations

import itertools
import threading

import pytest

from app.memory.context import PINS_HEADER, PINS_MAX_PROMPT_SHARE, pins_prompt_tokens
from app.memory.hydration import find_forbidden_key
from app.memory.state import Pin
from app.memory.tokens import TokenCounter
from app.settings import MemoryLimits
from chat_support.fake_llm import Reply
from chat_support.live_app import ChatClient, LiveServer
from tests.fixtures.celery_worker import WORDS, user_text


def pin(client: ChatClient, **body):
    return client.http.post(client.server.url + "/api/chat/pins", json=body, timeout=10)


def unpin(client: ChatClient, n):
    return client.http.delete(f"{client.server.url}/api/chat/pins/{n}", timeout=10)


def post_pin(web, **body):
    """``POST /api/chat/pins`` through Flask's test client."""
    return web.post("/api/chat/pins", json=body)


def delete_pin(web, n):
    return web.delete(f"/api/chat/pins/{n}")


def hydrated(web) -> dict:
    return web.get("/api/chat/thread").get_json()


def pins_message(messages: list[dict]) -> str | None:
    return next((m["content"] for m in messages if m["role"] == "system" and m["content"].startswith(PINS_HEADER)),
                None)


def test_pin_typed_text_reaches_memory_and_the_next_prompt(chat, fake_llm):
    response = pin(chat, text="  Ship the release on   Friday,\n after the review.  ")
    assert response.status_code == 201
    assert response.json() == {"pinnedDecisions": ["Ship the release on Friday, after the review."]}
    assert response.headers["Content-Type"].startswith("application/json")
    assert pin(chat, text="Keep the old API for one more month").status_code == 201
    assert chat.thread()["pinnedDecisions"] == ["Ship the release on Friday, after the review.",
                                                "Keep the old API for one more month"]
    fake_llm.default = Reply(text="Understood.")
    assert chat.turn("What did we decide?")[-1]["status"] == "completed"
    assert pins_message(fake_llm.last_request().messages) == (
        PINS_HEADER + "1. Ship the release on Friday, after the review.\n2. Keep the old API for one more month")


def test_pin_a_stored_message_cut_at_a_word_boundary(chat, fake_llm, store):
    long_answer = " ".join(f"Decision {i}: we keep component {i} as it is." for i in range(1, 30))
    assert len(long_answer) > 600
    fake_llm.default = Reply(text=long_answer)
    frames = chat.turn("Summarize the decisions", message_id="u-decisions-1")
    answer_id = frames[0]["messageId"]

    response = pin(chat, messageId=answer_id)
    assert response.status_code == 201
    [text] = response.json()["pinnedDecisions"]
    assert len(text) <= 300 and text.endswith("…")
    kept = text[:-1]
    assert long_answer.startswith(kept) and long_answer[len(kept)] == " "  # cut between words
    assert len(kept) > 200  # not cut needlessly short

    response = pin(chat, messageId="u-decisions-1")
    assert response.status_code == 201
    assert response.json()["pinnedDecisions"] == [text, "Summarize the decisions"]
    thread_id = chat.thread()["threadId"]
    assert [(p.text, p.by) for p in store.load(thread_id).pins] == [(text, "person"),
                                                                     ("Summarize the decisions", "person")]


@pytest.mark.parametrize("body, status, code, message", [
    ({"text": "   "}, 400, "empty_pin", "Type the decision to pin first."),
    ({"text": "x" * 301}, 400, "pin_too_long", "A pin can be at most 300 characters (this one has 301)."),
    ({"text": 42}, 400, "bad_request", "The pin text must be a string."),
    ({}, 400, "bad_request", 'Send either "text" or "messageId".'),
    ({"text": "a", "messageId": "m_1"}, 400, "bad_request", 'Send either "text" or "messageId".'),
    ({"messageId": "no spaces allowed"}, 400, "bad_request", "That message id is not valid."),
    ({"messageId": "m_0123456789abcdef"}, 404, "unknown_message",
     "That message is no longer in memory, so it can't be pinned."),
])
def test_pin_refusals_say_what_is_wrong(web, body, status, code, message):
    response = post_pin(web, **body)
    assert response.status_code == status
    assert response.get_json() == {"error": {"code": code, "message": message}}
    assert hydrated(web)["pinnedDecisions"] == []


def test_pin_needs_a_json_object(web):
    for response in (web.post("/api/chat/pins", data="text=hello"), web.post("/api/chat/pins", json=["hello"])):
        assert response.status_code == 400
        assert response.get_json()["error"]["code"] == "bad_request"


def test_pin_limit_is_a_clear_409(make_web_client, app_settings):
    web = make_web_client(app_settings.with_overrides(limits=MemoryLimits(pinned_max=3)))
    for i in range(3):
        assert post_pin(web, text=f"decision number {i}").status_code == 201
    response = post_pin(web, text="one too many")
    assert response.status_code == 409
    assert response.get_json() == {"error": {"code": "pin_limit",
                                             "message": "You can pin at most 3 decisions. Unpin one to make room."}}
    assert hydrated(web)["pinnedDecisions"] == ["decision number 0", "decision number 1", "decision number 2"]
    assert delete_pin(web, 1).status_code == 200
    assert post_pin(web, text="one too many").status_code == 201


def test_pins_that_would_crowd_out_the_conversation_are_refused(chat):
    """Pins are never cut from a prompt, so together they may take at most a quarter of the budget."""
    long_chinese = ("我们决定把年度团队活动安排在里斯本的河边场地举行并预留工作坊房间" * 10)[:300]
    accepted = 0
    response = None
    for i in range(20):
        response = pin(chat, text=f"{i} {long_chinese}"[:300])
        if response.status_code != 201:
            break
        accepted += 1
    assert response.status_code == 409 and response.json()["error"]["code"] == "pin_limit"
    assert "too long to fit" in response.json()["error"]["message"]
    kept = chat.thread()["pinnedDecisions"]
    assert len(kept) == accepted and 1 <= accepted < 20
    counter = TokenCounter()
    assert pins_prompt_tokens(kept, counter) <= int((8192 - 1024) * PINS_MAX_PROMPT_SHARE)
    # the thread still takes turns
    assert chat.turn("还记得吗？")[-1]["status"] == "completed"


def test_duplicates_are_refused_and_a_model_pin_becomes_the_persons(web, store):
    thread_id = hydrated(web)["threadId"]
    assert store.set_pins(thread_id, expected_gen=0, pins=[Pin("travel by train", "model")])
    response = post_pin(web, text="Travel by train.")
    assert response.status_code == 201 and response.get_json() == {"pinnedDecisions": ["Travel by train."]}
    assert store.load(thread_id).pins == (Pin("Travel by train.", "person"),)
    response = post_pin(web, text="TRAVEL BY TRAIN")
    assert response.status_code == 409
    assert response.get_json() == {"error": {"code": "already_pinned",
                                             "message": "That decision is already pinned."}}


def test_unpin_by_position(web):
    for text in ("first", "second", "third"):
        assert post_pin(web, text=text).status_code == 201
    response = delete_pin(web, 2)
    assert response.status_code == 200 and response.get_json() == {"pinnedDecisions": ["first", "third"]}
    for n in (0, 3, "abc", -1):
        response = delete_pin(web, n)
        assert response.status_code == 404
        assert response.get_json() == {"error": {"code": "pin_not_found",
                                                 "message": "There is no such pin (it may have been removed already)."}}
    assert delete_pin(web, 1).get_json() == {"pinnedDecisions": ["third"]}
    assert delete_pin(web, 1).get_json() == {"pinnedDecisions": []}
    assert hydrated(web)["pinnedDecisions"] == []


def test_concurrent_pins_all_land_through_the_compare_and_set(chat):
    texts = [f"parallel decision {i}" for i in range(5)]
    barrier = threading.Barrier(len(texts))
    results = {}

    def go(text):
        barrier.wait()
        results[text] = pin(chat, text=text).status_code

    threads = [threading.Thread(target=go, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert results == dict.fromkeys(texts, 201)
    assert sorted(chat.thread()["pinnedDecisions"]) == texts


def test_pins_of_one_session_are_out_of_reach_of_another(web):
    assert post_pin(web, text="Alice's private decision").status_code == 201
    other = web.application.test_client()
    assert delete_pin(other, 1).status_code == 404
    response = post_pin(other, text="Bob's decision")
    assert response.get_json() == {"pinnedDecisions": ["Bob's decision"]}
    assert find_forbidden_key(response.get_json()) is None
    assert hydrated(web)["pinnedDecisions"] == ["Alice's private decision"]
    assert hydrated(other)["pinnedDecisions"] == ["Bob's decision"]


def test_pins_from_another_site_are_refused(web):
    response = web.post("/api/chat/pins", json={"text": "x"}, headers={"Origin": "https://evil.example"})
    assert response.status_code == 403
    assert response.get_json()["error"]["code"] == "forbidden"
    response = web.post("/api/chat/pins", json={"text": "same origin"}, headers={"Origin": "http://localhost"})
    assert response.status_code == 201
    assert hydrated(web)["pinnedDecisions"] == ["same origin"]


def test_pins_answer_503_when_the_store_is_down(make_web_client, app_settings, own_redis):
    web = make_web_client(app_settings.with_overrides(redis_url=own_redis.url, redis_socket_timeout=0.5))
    hydrated(web)
    own_redis.stop()
    for response in (post_pin(web, text="a decision"), delete_pin(web, 1)):
        assert response.status_code == 503
        assert response.get_json()["error"]["code"] == "store_unavailable"


PERSON_PIN = "Use PostgreSQL 16, not MySQL, for the billing service; never drop the audit table."


REPLY = ("that is a lovely number indeed, people have liked it for a very long time and it is easy to "
         "remember when you count things on your fingers with friends, " * 3).strip(", ")


def test_a_persons_pin_survives_five_compactions_word_for_word(make_compaction_rig, fake_llm):
    """Each turn from the second on folds a turn through the real worker; the model paraphrases the pin."""
    rig = make_compaction_rig(limits=MemoryLimits(recent_turns=1))
    server = LiveServer(rig.app)
    rig.worker()
    client = ChatClient(server).connect()
    try:
        rounds = itertools.count(1)

        def compaction_answer(body):
            n = next(rounds)
            return Reply(json={
                "summary": f"the person keeps asking about nice numbers, most recently {WORDS[n % 20]}.",
                "pinnedDecisions": [
                    "use postgresql 16, not mysql, for the billing service; never drop the audit table",
                    f"billing runs on postgres version sixteen (wording {WORDS[n % 20]})",
                ]})

        fake_llm.add_rule(compaction_answer, model="fake-compact")
        fake_llm.default = lambda body: Reply(text=REPLY)
        thread_id = client.thread()["threadId"]
        assert pin(client, text=PERSON_PIN).json() == {"pinnedDecisions": [PERSON_PIN]}

        assert client.turn(user_text(1))[-1]["status"] == "completed"
        for n in range(2, 7):
            assert client.turn(user_text(n))[-1]["status"] == "completed"
            rig.wait_outcome(thread_id, "applied", count=n - 1)
            rig.wait_idle(thread_id)
            pins = client.thread()["pinnedDecisions"]
            assert pins[0] == PERSON_PIN, f"after compaction {n - 1}: {pins}"
            assert pins.count(PERSON_PIN) == 1
            assert not any(p.lower().startswith("use postgresql 16") and p != PERSON_PIN for p in pins)
        state = rig.store.load(thread_id)
        assert state.pins[0] == Pin(PERSON_PIN, "person")
        assert [m.text for m in state.messages] == [user_text(6), REPLY]
        assert state.notes == ()  # the model's paraphrases are not grounded in the person's words

        compactions = client.http.get(server.url + "/api/chat/stats", timeout=10).json()["compactions"]
        applied = [c for c in compactions if c["outcome"] == "applied"]
        assert len(applied) == 5 and all(c["turnsFolded"] == 1 for c in applied)

        position = client.thread()["pinnedDecisions"].index(PERSON_PIN) + 1
        response = unpin(client, position)
        assert response.status_code == 200 and PERSON_PIN not in response.json()["pinnedDecisions"]
        assert PERSON_PIN not in client.thread()["pinnedDecisions"]
        assert all(p.text != PERSON_PIN for p in rig.store.load(thread_id).pins)
        assert client.turn(user_text(7))[-1]["status"] == "completed"
        chat_request = fake_llm.last_request(lambda r: r.model == "fake-chat")
        assert PERSON_PIN not in (pins_message(chat_request.messages) or "")
    finally:
        client.close()
        server.stop()


# -- the model's notes: promote to a pinned decision, remove; a clear is final --------------------------

def seed_notes(store, thread_id: str, notes: list[str], pins: tuple[str, ...] = ()) -> None:
    """A stored turn, then ``notes`` (as a compaction would leave them) and the person's ``pins``."""
    from app.memory.final_turn import FinalTurn

    assert store.commit_final_turn(thread_id, FinalTurn("We move the launch to May 4.", "Noted.", "completed")).appended
    state = store.load(thread_id)
    assert store.set_pins_and_notes(thread_id, expected_gen=state.gen, pins=[Pin(p) for p in pins], notes=notes)


def test_a_note_is_promoted_to_the_persons_pinned_decision(web, store):
    thread_id = hydrated(web)["threadId"]
    seed_notes(store, thread_id, ["Launch moves to May 4.", "Use the staging cluster."], pins=("Budget 9000 EUR",))
    assert hydrated(web)["modelNotes"] == ["Launch moves to May 4.", "Use the staging cluster."]
    response = web.post("/api/chat/notes/1/pin")
    assert response.status_code == 201
    assert response.get_json() == {"pinnedDecisions": ["Budget 9000 EUR", "Launch moves to May 4."],
                                   "modelNotes": ["Use the staging cluster."]}
    state = store.load(thread_id)
    assert state.pins == (Pin("Budget 9000 EUR", "person"), Pin("Launch moves to May 4.", "person"))
    assert state.notes == ("Use the staging cluster.",)


def test_promoting_a_note_already_pinned_only_removes_the_note(web, store):
    thread_id = hydrated(web)["threadId"]
    seed_notes(store, thread_id, ["launch moves to may 4"], pins=("Launch moves to May 4.",))
    response = web.post("/api/chat/notes/1/pin")
    assert response.status_code == 201
    assert response.get_json() == {"pinnedDecisions": ["Launch moves to May 4."], "modelNotes": []}


def test_a_note_is_removed_by_position_and_a_missing_one_is_a_404(web, store):
    thread_id = hydrated(web)["threadId"]
    seed_notes(store, thread_id, ["first note", "second note"])
    response = web.delete("/api/chat/notes/1")
    assert response.status_code == 200
    assert response.get_json() == {"pinnedDecisions": [], "modelNotes": ["second note"]}
    for n in (0, 2, "x"):
        for response in (web.delete(f"/api/chat/notes/{n}"), web.post(f"/api/chat/notes/{n}/pin")):
            assert response.status_code == 404
            assert response.get_json() == {"error": {"code": "note_not_found", "message":
                                                     "There is no such note (it may have been removed already)."}}
    assert store.load(thread_id).notes == ("second note",)


def test_note_writes_from_another_site_are_refused(web, store):
    thread_id = hydrated(web)["threadId"]
    seed_notes(store, thread_id, ["a note"])
    for response in (web.post("/api/chat/notes/1/pin", headers={"Origin": "https://evil.example"}),
                     web.delete("/api/chat/notes/1", headers={"Origin": "https://evil.example"})):
        assert response.status_code == 403 and response.get_json()["error"]["code"] == "forbidden"
    assert store.load(thread_id).notes == ("a note",)


def test_a_pin_that_started_before_a_clear_writes_nothing(web, monkeypatch):
    """The thread is cleared between the pin request's read and its write: the retry finds it cleared."""
    services = web.application.extensions["chat"]
    thread_id = hydrated(web)["threadId"]
    assert post_pin(web, text="from the old chat").status_code == 201
    real_set_pins = services.store.set_pins
    cleared = []

    def clear_first(tid, **kwargs):
        if not cleared:
            cleared.append(services.store.clear(tid))  # a New chat lands between the read and the write
        return real_set_pins(tid, **kwargs)

    monkeypatch.setattr(services.store, "set_pins", clear_first)
    response = post_pin(web, text="pinned while the chat was being cleared")
    assert response.status_code == 409
    assert response.get_json() == {"error": {"code": "thread_cleared",
                                             "message": "A new chat was started meanwhile, so nothing was changed."}}
    assert hydrated(web) == {"threadId": thread_id, "messages": [], "pinnedDecisions": [], "restored": False}
