"""Coalesced deltas on ``/ws/chat``: the real app served on loopback, the fake model over real HTTP.

The answer goes out one frame for whatever arrived since the last frame, at most one per
``STREAM_FLUSH_INTERVAL_SECONDS`` (docs/benchmarks.md: Performance).  The first token is never held back, no text
is lost, doubled or reordered, the last text comes before ``done``, and after a cancel nothing follows
``done``.  Nothing here depends on timing: each bound is computed from the run's own elapsed time.
"""

from __future__ import annotations

import time

import pytest

from chat_support.fake_llm import Reply, split_tokens, words
from chat_support.live_app import ChatClient, answer_text, frame_kinds

INTERVAL = 0.1  # seconds: long, so that coalescing is visible even on a fast machine


@pytest.fixture
def coalescing_chat(make_live_app, app_settings):
    """A connected client of the app served with a 100 ms flush interval."""
    server = make_live_app(app_settings.with_overrides(stream_flush_interval=INTERVAL))
    client = ChatClient(server).connect()
    yield client
    client.close()


def test_first_token_goes_out_while_the_model_is_still_silent(coalescing_chat, fake_llm):
    """The model sends one token and then nothing: the person has that token anyway (no wait for more)."""
    tokens = words(30)
    fake_llm.default = Reply(tokens=tokens, stall_after=1, stall_max=20)
    coalescing_chat.send({"type": "message", "text": "think slowly"})
    start, first = coalescing_chat.recv(), coalescing_chat.recv()
    assert start["type"] == "start"
    assert first == {"type": "delta", "text": tokens[0]}
    record = fake_llm.last_request()
    assert not record.finished and record.tokens_sent <= 1  # the model is still stalled after its first token
    coalescing_chat.send({"type": "cancel"})
    done = coalescing_chat.recv_until(lambda f: f["type"] == "done")[-1]
    assert done["status"] == "cancelled"


def test_coalesced_frames_carry_every_token_once_in_order_before_done(coalescing_chat, fake_llm):
    answer = "**Plan**: 先坐火车去里斯本 🚆, then ferry.\n\n- day 1: museum \"MAAT\"\n- day 2: Sintra\\Cascais"
    tokens = split_tokens(answer) * 8
    fake_llm.default = Reply(tokens=tokens, token_delay=0.004)
    started = time.monotonic()
    frames = coalescing_chat.turn("plan the trip", timeout=30)
    elapsed = time.monotonic() - started

    assert frame_kinds(frames) == ["start", "delta", "done"] and frames[-1]["status"] == "completed"
    deltas = frames[1:-1]
    assert all(f["text"] for f in deltas)
    assert answer_text(frames) == "".join(tokens)  # nothing lost, doubled or reordered; the end before done
    # the first at once, then at most one frame per interval: far fewer frames than tokens
    assert len(deltas) <= 2 + elapsed / INTERVAL and len(deltas) < len(tokens) / 4, (len(deltas), elapsed)
    assert [m["text"] for m in coalescing_chat.thread()["messages"]] == ["plan the trip", "".join(tokens).strip()]


def test_cancel_while_coalescing_sends_nothing_after_done(coalescing_chat, fake_llm):
    """What was shown before ``done`` cancelled is a gap-free start of the answer; no delta follows it."""
    tokens = words(400)
    fake_llm.default = Reply(tokens=tokens, token_delay=0.005)
    coalescing_chat.send({"type": "message", "text": "a long one"})
    frames = []
    while answer_text(frames).count("word") < 20:
        frames.append(coalescing_chat.recv())
    sent_at = time.time()
    coalescing_chat.send({"type": "cancel"})
    frames += coalescing_chat.recv_until(lambda f: f["type"] == "done")
    frames = [f for f in frames if f["type"] != "memory"]
    assert frame_kinds(frames) == ["start", "delta", "done"] and frames[-1]["status"] == "cancelled"
    shown = answer_text(frames)
    assert "".join(tokens).startswith(shown) and len(shown) < len("".join(tokens))

    record = fake_llm.last_request()  # the reader's wait between reads ends at the cancel
    assert record.wait(3.0) and record.outcome == "aborted" and record.end_time - sent_at < 1.0

    fake_llm.default = Reply(text="next answer")
    coalescing_chat.send({"type": "message", "text": "next"})
    after = coalescing_chat.recv_until(lambda f: f["type"] == "start")
    assert [f["type"] for f in after if f["type"] != "memory"] == ["start"]  # no late delta of the cancelled turn
    rest = coalescing_chat.recv_until(lambda f: f["type"] == "done")
    assert answer_text(rest) == "next answer" and rest[-1]["status"] == "completed"
    assert [m["text"] for m in coalescing_chat.thread()["messages"]] == ["next", "next answer"]


def test_tool_answer_streams_coalesced_after_the_tool_frames(coalescing_chat, fake_llm):
    """A tool round and then the answer: the tool frames keep their place, the answer text arrives whole."""
    answer = " ".join(f"result{i}" for i in range(60))

    def reply(body):
        if body["messages"][-1]["role"] == "tool":
            return Reply(tokens=split_tokens(answer), token_delay=0.003)
        return Reply(tool_calls=[{"name": "calculator", "arguments": {"expression": "6*7"}}])

    fake_llm.default = reply
    frames = coalescing_chat.turn("what is 6*7?", timeout=30)
    kinds = frame_kinds(frames)
    assert kinds[0] == "start" and kinds[-2:] == ["delta", "done"] and frames[-1]["status"] == "completed"
    assert [f["status"] for f in frames if f["type"] == "tool"] == ["started", "finished"]
    assert answer_text(frames) == answer
