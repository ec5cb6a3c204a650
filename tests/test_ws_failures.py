"""``/ws/chat`` when a turn does not complete: cancel, upstream errors, retries, a closed socket.

Contract: a ``cancelled`` or ``failed`` turn leaves the thread exactly as before; error frames carry a contract
code and a message for people, never an exception's text; retries happen only before the first token.
"""

from __future__ import annotations

import json
import time

import pytest

from chat_support.fake_llm import Reply, words
from chat_support.live_app import ChatClient, answer_text, frame_kinds
from tests.fixtures.streamed_chat import wait_for

SECRET = "UPSTREAM-SECRET-91c2 Traceback (most recent call last) redis://:pw@10.1.2.3"


def assert_no_leak(frames: list[dict]) -> None:
    blob = json.dumps(frames)
    assert "SECRET" not in blob and "Traceback" not in blob and "redis://" not in blob


def test_cancel_mid_stream(chat, fake_llm):
    tokens = words(300)
    fake_llm.default = Reply(tokens=tokens, token_delay=0.02)  # 6 s of answer
    chat.send({"type": "message", "text": "tell me a long story"})
    head = []
    while tokens[4] not in answer_text(head):
        head.append(chat.recv())
    sent_at, sent_wall = time.monotonic(), time.time()
    chat.send({"type": "cancel"})
    rest = chat.recv_until(lambda f: f["type"] == "done", timeout=5)
    cancel_latency = time.monotonic() - sent_at
    frames = [f for f in head + rest if f["type"] != "memory"]

    assert frames[-1] == {"type": "done", "status": "cancelled", "messageId": frames[0]["messageId"]}
    assert cancel_latency < 0.5, f"done cancelled after {cancel_latency:.2f} s"
    assert not [f for f in frames if f["type"] == "error"]

    # the upstream stream was closed by the app: the fake stopped generating shortly after
    record = fake_llm.last_request()
    assert record.wait(3.0), "the upstream stream never ended"
    assert record.outcome == "aborted"
    assert record.tokens_sent < 60, f"the model kept generating: {record.tokens_sent} of {len(tokens)} tokens"
    assert record.end_time - sent_wall < 1.0, f"upstream closed {record.end_time - sent_wall:.2f} s after cancel"

    assert chat.thread()["messages"] == []
    # the same connection takes the next turn; nothing of the cancelled one leaks into it
    fake_llm.default = Reply(text="fresh answer")
    nxt = chat.turn("new question")
    assert nxt[0]["type"] == "start" and nxt[-1]["status"] == "completed"
    assert answer_text(nxt) == "fresh answer"
    assert [m["role"] for m in fake_llm.last_request().messages] == ["system", "user"]
    assert [(m["role"], m["text"]) for m in chat.thread()["messages"]] == [
        ("user", "new question"), ("assistant", "fresh answer")]


def test_cancel_before_the_first_token(chat, fake_llm):
    """Cancel while the model is still thinking: done cancelled at once, the request abandoned, nothing stored."""
    fake_llm.default = Reply(tokens=words(50), first_token_delay=2.0, token_delay=0.01)
    chat.send({"type": "message", "text": "slow one"})
    start = chat.recv()
    assert start["type"] == "start"
    request = fake_llm.wait_for_requests(1)[0]
    sent_at = time.time()
    chat.send({"type": "cancel"})
    done = chat.recv_until(lambda f: f["type"] == "done", timeout=3)[-1]
    assert done["status"] == "cancelled" and time.time() - sent_at < 0.5
    assert request.wait(4.0)
    assert request.outcome == "aborted"
    assert request.end_time - sent_at < 0.75, f"upstream closed {request.end_time - sent_at:.2f} s after cancel"
    assert request.tokens_sent <= 1
    assert chat.thread()["messages"] == []


def test_closing_the_socket_mid_stream_stops_the_model_and_stores_nothing(live_app, fake_llm):
    client = ChatClient(live_app).connect()
    fake_llm.default = Reply(tokens=words(300), token_delay=0.01)
    client.send({"type": "message", "text": "going away"})
    client.recv_until(lambda f: f["type"] == "delta")
    client.close()
    record = fake_llm.last_request()
    assert record.wait(3.0) and record.outcome == "aborted"
    assert record.tokens_sent < 100
    assert client.thread()["messages"] == []


@pytest.mark.parametrize("reply, code, deltas, requests", [
    (Reply(status=500, error_message=SECRET), "llm_unavailable", 0, 2),
    (Reply(status=429, error_message=SECRET, retry_after=0), "rate_limited", 0, 2),
    (Reply(status=400, error_message=SECRET), "llm_unavailable", 0, 1),
    (Reply(tokens=words(10), token_delay=0.01, drop_after=4), "llm_unavailable", 4, 1),
    (Reply(tokens=words(10), token_delay=0.01, stream_error_after=4, error_message=SECRET), "llm_unavailable", 4, 1),
], ids=["500", "429", "400", "dropped-mid-stream", "error-event-mid-stream"])
def test_upstream_failure_fails_the_turn_and_stores_nothing(chat, fake_llm, reply, code, deltas, requests):
    fake_llm.default = reply
    frames = chat.turn("hello")
    start, *middle, error, done = frames
    assert start["type"] == "start"
    assert all(f["type"] == "delta" for f in middle) and answer_text(middle) == "".join(words(deltas))
    assert error["type"] == "error" and error["code"] == code
    assert error["message"] and len(error["message"]) < 200
    assert done["type"] == "done" and done["status"] == "failed" and done["messageId"] == start["messageId"]
    assert_no_leak(frames)
    assert len(fake_llm.chat_requests()) == requests  # retried only before any token
    assert chat.thread()["messages"] == []

    # the connection is still usable and the next prompt holds nothing of the failed turn
    fake_llm.default = Reply(text="recovered")
    assert chat.turn("again")[-1]["status"] == "completed"
    assert [m["role"] for m in fake_llm.last_request().messages] == ["system", "user"]


@pytest.mark.parametrize("first", [Reply(status=500), Reply(status=503, retry_after=0), Reply(drop_after=0)],
                         ids=["500", "503", "headers-then-drop"])
def test_retry_before_the_first_token_gives_one_answer(chat, fake_llm, first):
    tokens = words(8)
    fake_llm.default = Reply(tokens=tokens)
    fake_llm.enqueue(first)
    frames = chat.turn("hi")
    assert frame_kinds(frames) == ["start", "delta", "done"]
    assert answer_text(frames) == "".join(tokens)  # no duplicated text
    assert frames[-1]["status"] == "completed"
    assert len(fake_llm.chat_requests()) == 2
    assert [m["text"] for m in chat.thread()["messages"]] == ["hi", "".join(tokens)]


def test_no_retry_after_tokens_were_sent(chat, fake_llm):
    fake_llm.default = Reply(tokens=words(8))
    fake_llm.enqueue(Reply(tokens=words(8), drop_after=3))
    frames = chat.turn("hi")
    assert answer_text(frames) == "".join(words(3))
    assert frames[-1]["status"] == "failed"
    assert len(fake_llm.chat_requests()) == 1
    assert chat.thread()["messages"] == []


def test_empty_answer_fails_and_stores_nothing(chat, fake_llm):
    fake_llm.default = Reply(tokens=["", "  "])
    frames = chat.turn("hi")
    assert frames[-1]["status"] == "failed"
    assert [f["code"] for f in frames if f["type"] == "error"] == ["llm_unavailable"]
    assert chat.thread()["messages"] == []


def test_failed_turn_then_cancel_frame_is_harmless(chat, fake_llm):
    """A cancel after ``done`` (a late click on stop) changes nothing and sends nothing."""
    fake_llm.default = Reply(text="quick")
    assert chat.turn("one")[-1]["status"] == "completed"
    chat.send({"type": "cancel"})
    chat.send({"type": "cancel"})
    assert chat.turn("two")[0]["type"] == "start"
    wait_for(lambda: len(chat.thread()["messages"]) == 4)
