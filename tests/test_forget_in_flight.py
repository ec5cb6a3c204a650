"""A forget is final for turns in flight, as a clear is (docs/contract.md: Forget and provenance, "Turns in
flight"): a turn that read memory before a forget and streams across it writes nothing; the person still receives
the whole answer and ``done`` says it was not saved (``turn_forgotten``).

Real Redis, the app served on loopback, the fake LLM streaming slowly; the forget comes from the HTTP route (as
another tab would send it) while the answer streams."""

from __future__ import annotations

from chat_support.fake_llm import Reply, words
from chat_support.live_app import ChatClient, answer_text
from tests.test_forget_api import PLANTED, WORD, everything_in_redis, fold_all, seed_with_planted, served  # noqa: F401


def test_a_turn_streaming_across_a_forget_commits_nothing_of_the_forgotten_turn(served, fake_llm):  # noqa: F811
    rig, server = served
    chat = ChatClient(server).connect()
    try:
        tid = chat.thread()["threadId"]
        seed_with_planted(rig, tid)
        fold_all(rig, tid)  # turn 3 (the planted code) archived; recall brings it into the next prompt
        # The model read the forgotten turn and quotes it, slowly.
        tokens = [f"Your locker code is {WORD}-4471. ", *words(30)]
        fake_llm.default = Reply(tokens=tokens, token_delay=0.05)
        chat.send({"type": "message", "id": "in-flight-1", "text": "What is my locker code?"})
        frames = chat.recv_until(lambda f: f["type"] == "delta")
        assert WORD in str(fake_llm.requests[-1].body)  # the turn read the turn about to be forgotten
        other_tab = ChatClient(server, session=chat.http)  # the same browser session, another tab
        assert other_tab.http.delete(server.url + "/api/chat/turns/3", timeout=10).status_code == 200
        frames += chat.recv_until(lambda f: f["type"] == "done", timeout=20)

        frames = [f for f in frames if f["type"] != "memory"]
        start, done = frames[0], frames[-1]
        assert answer_text(frames) == "".join(tokens)  # the person still receives the whole answer
        assert done == {"type": "done", "status": "completed", "messageId": start["messageId"],
                        "saved": False, "reason": "turn_forgotten"}
        assert WORD not in everything_in_redis(rig.client, tid).lower()
        assert "What is my locker code?" not in [m["text"] for m in chat.thread()["messages"]]  # nothing committed

        fake_llm.default = Reply(text="A fresh answer.")  # the next turn reads the new counter and is kept
        frames = chat.turn("After the forget")
        assert frames[-1] == {"type": "done", "status": "completed", "messageId": frames[0]["messageId"],
                              "turn": rig.store.load(tid).turn_numbers()[-1]}
        assert [m["text"] for m in chat.thread()["messages"]][-2:] == ["After the forget", "A fresh answer."]
    finally:
        chat.close()


def test_a_turn_that_started_after_the_forget_is_kept(served, fake_llm):  # noqa: F811
    rig, server = served
    chat = ChatClient(server).connect()
    try:
        tid = chat.thread()["threadId"]
        seed_with_planted(rig, tid)
        assert chat.http.delete(server.url + "/api/chat/turns/3", timeout=10).status_code == 200
        fake_llm.default = Reply(tokens=words(10), token_delay=0.01)
        frames = chat.turn("Started after the forget")
        assert frames[-1] == {"type": "done", "status": "completed", "messageId": frames[0]["messageId"],
                              "turn": rig.store.load(tid).turn_numbers()[-1]}
        assert rig.store.load(tid).messages[-2].text == "Started after the forget"
    finally:
        chat.close()
