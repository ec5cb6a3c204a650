"""Clear wins over a turn in flight (docs/memory.md: "New chat: clearing is final"; docs/contract.md: WebSocket,
the done frame).

The real app on loopback, real Redis, the fake model streaming slowly: ``DELETE /api/chat/thread`` lands
while the answer streams; the person still receives the whole answer, ``done`` says it was not saved, and
the thread stays empty.
"""

from __future__ import annotations

from chat_support.fake_llm import Reply, words
from chat_support.live_app import answer_text


def test_a_turn_in_flight_when_the_thread_is_cleared_is_not_saved(chat, fake_llm):
    fake_llm.default = Reply(text="An earlier answer.")
    assert chat.turn("Before the new chat")[-1]["status"] == "completed"
    tokens = words(30)
    fake_llm.default = Reply(tokens=tokens, token_delay=0.05)

    chat.send({"type": "message", "id": "in-flight-1", "text": "Started before the new chat"})
    frames = chat.recv_until(lambda f: f["type"] == "delta")
    assert chat.clear() == 204  # New chat, while the answer streams
    frames += chat.recv_until(lambda f: f["type"] == "done", timeout=20)

    start, done = frames[0], frames[-1]
    assert answer_text(frames) == "".join(tokens)  # the person still receives the whole answer
    assert done == {"type": "done", "status": "completed", "messageId": start["messageId"],
                    "saved": False, "reason": "thread_cleared"}
    thread = chat.thread()
    assert (thread["messages"], thread["pinnedDecisions"], thread["restored"]) == ([], [], False)

    fake_llm.default = Reply(text="A fresh answer.")  # the next turn reads the new counter and is kept
    frames = chat.turn("After the new chat")
    assert frames[-1] == {"type": "done", "status": "completed", "messageId": frames[0]["messageId"], "turn": 1}
    assert [m["text"] for m in chat.thread()["messages"]] == ["After the new chat", "A fresh answer."]
