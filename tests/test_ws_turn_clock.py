"""A turn's clock measures silence, not length, and the page is told why a turn waits and which memory turn
it became (docs/contract.md: WebSocket, the ``waiting`` and ``done`` frames; Configuration,
``LLM_FIRST_TOKEN_TIMEOUT_SECONDS`` / ``LLM_TOKEN_GAP_TIMEOUT_SECONDS``).

Over a real socket to the real app, the real store and the fake model server; limits are small (first
token 2 s, gap 1 s) so a "long" answer takes 6 s.
"""

from __future__ import annotations

import pytest

from chat_support.fake_llm import Reply, progress_events, split_tokens, wait_events, words
from chat_support.live_app import ChatClient, answer_text, frame_kinds

FIRST, GAP = 2.0, 1.0
STEADY = words(13)  # 0.5 s apart: 6 s, three times the first-token limit and six times the gap limit


@pytest.fixture
def server(make_live_app, app_settings):
    return make_live_app(app_settings.with_overrides(llm_first_token_timeout=FIRST, llm_token_gap_timeout=GAP,
                                                     llm_max_retries=1))


@pytest.fixture
def client(server):
    chat = ChatClient(server).connect()
    yield chat
    chat.close()


def stored(client) -> list[str]:
    return [m["text"] for m in client.thread()["messages"]]


def test_a_steady_answer_longer_than_the_limits_completes_and_is_stored(client, fake_llm):
    fake_llm.default = Reply(tokens=STEADY, first_token_delay=0.5, token_delay=0.5)
    frames = client.turn("tell me slowly", timeout=30)
    assert frames[-1]["type"] == "done" and frames[-1]["status"] == "completed"
    assert "saved" not in frames[-1] and frames[-1]["turn"] == 1
    assert answer_text(frames) == "".join(STEADY)
    assert stored(client) == ["tell me slowly", "".join(STEADY)]


def test_a_stall_after_text_fails_plainly_and_stores_nothing(client, fake_llm):
    fake_llm.default = Reply(tokens=words(10), token_delay=0.05, stall_after=4, stall_max=30)
    frames = client.turn("start and stop", timeout=30)
    assert answer_text(frames) == "".join(words(4))  # the person saw this much
    errors = [f for f in frames if f["type"] == "error"]
    assert errors == [{"type": "error", "code": "llm_unavailable",
                       "message": "The model stopped answering: no text for 1 s. The part shown was not saved."}]
    assert frames[-1] == {"type": "done", "status": "failed", "messageId": frames[0]["messageId"],
                          "code": "llm_unavailable"}
    assert stored(client) == []
    # the failed turn was no turn of memory: the next one is turn 1
    fake_llm.default = Reply(text="Fine now.")
    again = client.turn("again", timeout=30)
    assert again[-1]["status"] == "completed" and again[-1]["turn"] == 1
    assert stored(client) == ["again", "Fine now."]


def test_a_failure_after_text_says_the_part_shown_was_not_saved(client, fake_llm):
    fake_llm.default = Reply(tokens=words(10), stream_error_after=3, stream_error_status=500)
    frames = client.turn("hello", timeout=30)
    errors = [f["message"] for f in frames if f["type"] == "error"]
    assert errors == ["The model is unavailable right now. Please try again. The part shown was not saved."]
    assert frames[-1]["status"] == "failed" and stored(client) == []


def test_a_first_token_later_than_its_limit_fails(client, fake_llm):
    fake_llm.default = Reply(tokens=words(3), first_token_delay=FIRST + 3)
    frames = client.turn("anyone?", timeout=30)
    assert [f["message"] for f in frames if f["type"] == "error"] == [
        "The model did not start answering within 2 s. Please try again."]
    assert answer_text(frames) == "" and frames[-1]["status"] == "failed"
    assert len(fake_llm.chat_requests()) == 1 and stored(client) == []


def test_an_error_event_after_200_fails_the_turn_like_an_http_error(client, fake_llm):
    fake_llm.default = Reply(tokens=words(3), before_first=wait_events(0.3, 0.1), stream_error_after=0,
                             stream_error_status=503, error_message="slot proxy: upstream died")
    frames = client.turn("hi", timeout=30)
    assert [f["message"] for f in frames if f["type"] == "error"] == [
        "The model is unavailable right now. Please try again."]
    assert frames[-1]["status"] == "failed" and frames[-1]["code"] == "llm_unavailable"
    assert len(fake_llm.chat_requests()) == 2  # retried before any text, as a 503 is
    assert stored(client) == []


def test_x_wait_events_become_one_another_turn_waiting_frame(client, fake_llm):
    fake_llm.default = Reply(tokens=split_tokens("Here you are."), first_token_delay=1.2,
                             before_first=wait_events(1.2, 0.3))
    frames = client.turn("my turn?", timeout=30)
    assert frame_kinds(frames)[:3] == ["start", "waiting", "delta"]
    assert frames[1] == {"type": "waiting", "for": "another_turn",
                         "message": "The model is answering another visitor first."}
    assert frames[-1]["status"] == "completed" and answer_text(frames) == "Here you are."


def test_prompt_progress_becomes_reading_frames_at_most_about_once_a_second(make_live_app, app_settings, fake_llm):
    server = make_live_app(app_settings.with_overrides(bundled_model=True, llm_first_token_timeout=FIRST,
                                                       llm_token_gap_timeout=GAP))
    chat = ChatClient(server).connect()
    try:
        fake_llm.default = Reply(tokens=split_tokens("Read it."), first_token_delay=1.9,
                                 before_first=progress_events(2200, 1.9, every=0.1, cache=200))
        frames = chat.turn("a long conversation", timeout=30)
    finally:
        chat.close()
    assert fake_llm.last_request().body["return_progress"] is True
    waiting = [f for f in frames if f["type"] == "waiting"]
    assert 2 <= len(waiting) <= 3, waiting  # 19 progress events over 1.9 s
    assert {(f["for"], f["message"]) for f in waiting} == {("reading", "Reading the conversation again…")}
    percents = [f["percent"] for f in waiting]
    assert percents[0] == 0 and percents == sorted(percents) and percents[-1] >= 50
    first_delta = frame_kinds(frames).index("delta")
    assert all(frames.index(f) < first_delta for f in waiting)
    assert frames[-1]["status"] == "completed"


def test_an_answer_at_its_token_limit_is_stored_and_says_so(client, fake_llm):
    fake_llm.default = Reply(tokens=words(6), finish_reason="length")
    frames = client.turn("write a lot", timeout=30)
    assert frames[-1]["status"] == "completed" and frames[-1]["finish"] == "length" and frames[-1]["turn"] == 1
    assert stored(client) == ["write a lot", "".join(words(6))]
    fake_llm.default = Reply(text="Short.")
    assert "finish" not in client.turn("and short?", timeout=30)[-1]


def test_done_numbers_the_turns_memory_holds(client, fake_llm):
    """Turn numbers count written turns only (docs/contract.md: "Turn numbers"): a cancelled or failed turn
    takes none."""
    fake_llm.default = Reply(text="One.")
    assert client.turn("first", timeout=30)[-1]["turn"] == 1
    fake_llm.default = Reply(status=400)
    failed = client.turn("refused", timeout=30)[-1]
    assert failed["status"] == "failed" and "turn" not in failed
    fake_llm.default = Reply(text="Two.")
    assert client.turn("second", timeout=30)[-1]["turn"] == 2


def test_a_long_answer_keeps_its_thread_marked_streaming(client, fake_llm, redis_client, monkeypatch):
    """An answer has no total-time limit, so the thread's ``streaming`` mark (it lives the first-token limit
    plus 30 s) is renewed while text flows: no refinement of the thread starts under a long answer."""
    from app.chat import turn as turn_module
    from app.store.keys import ThreadKeys

    monkeypatch.setattr(turn_module, "STREAMING_MARK_EVERY_SECONDS", 1.0)
    fake_llm.default = Reply(tokens=STEADY, first_token_delay=0.2, token_delay=0.5)
    thread_id = client.thread()["threadId"]
    client.send({"type": "message", "text": "go on"})
    client.recv_until(lambda f: f["type"] == "delta")
    key = ThreadKeys(thread_id).active
    lifetime_ms = (FIRST + 30) * 1000
    client.recv_until(lambda f: f["type"] == "delta" and f["text"] == STEADY[8], timeout=10)  # ~4 s in
    assert redis_client.get(key) in ("streaming", b"streaming")
    assert redis_client.pttl(key) > lifetime_ms - 1600  # renewed within the last second or so, not 4 s ago
    assert client.recv_until(lambda f: f["type"] == "done", timeout=10)[-1]["status"] == "completed"
