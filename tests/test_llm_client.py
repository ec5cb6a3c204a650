"""The streaming LLM client against the fake OpenAI-compatible server, over real HTTP (issue 3 item 1).

The real ``openai`` SDK talks to ``tests.fake_llm`` on loopback; nothing of the SDK is mocked.
"""

from __future__ import annotations

import threading
import time

import pytest

from app.llm.client import CancelEvent, LLMClient, StreamStats
from app.llm.provider import LLMError, map_error
from tests.fake_llm import Reply, words

SECRET = "UPSTREAM-SECRET-7f3a: redis://admin:hunter2@10.0.0.5 Traceback"
PEOPLE_MESSAGES = {
    "The model provider is busy right now. Please try again in a moment.",
    "The model took too long to answer. Please try again.",
    "The model provider refused the request.",
    "The model is unavailable right now. Please try again.",
}


@pytest.fixture
def llm_settings(settings, fake_llm):
    return settings.with_overrides(openai_base_url=fake_llm.url, llm_connect_timeout=2.0, llm_read_timeout=1.0,
                                   llm_turn_timeout=6.0, llm_max_retries=1)


def run(client: LLMClient, *, deadline_s: float = 6.0, cancel_after: int | None = None):
    """Stream one answer; returns ``(pieces, stats, error, elapsed_s)``."""
    cancelled = threading.Event()
    stats = StreamStats()
    pieces: list[str] = []
    error = None
    started = time.monotonic()
    try:
        for chunk in client.stream_chat([{"role": "user", "content": "hi"}], cancelled=cancelled,
                                        deadline=started + deadline_s, stats=stats):
            for choice in chunk.choices:
                if choice.delta and choice.delta.content:
                    pieces.append(choice.delta.content)
                    if cancel_after is not None and len(pieces) >= cancel_after:
                        cancelled.set()
    except LLMError as exc:
        error = exc
    return pieces, stats, error, time.monotonic() - started


def assert_clean(error: LLMError) -> None:
    """The error is a contract code with a fixed message for people: no exception text anywhere in it."""
    assert error.code in {"llm_unavailable", "rate_limited"}
    assert error.message in PEOPLE_MESSAGES
    for text in (error.message, str(error), repr(error.args)):
        assert "SECRET" not in text and "hunter2" not in text and "Traceback" not in text


def test_streams_pieces_in_order_and_reports_stats(llm_settings, fake_llm):
    fake_llm.default = Reply(tokens=words(12), token_delay=0.005)
    pieces, stats, error, _ = run(LLMClient(llm_settings))
    assert error is None
    assert pieces == words(12)
    assert stats.attempts == 1
    assert stats.first_token_at is not None
    assert stats.completion_tokens == 12 and stats.prompt_tokens > 0
    assert stats.finish_reason == "stop"
    request = fake_llm.last_request()
    assert request.stream and request.model == "fake-chat" and request.messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("reply, code, attempts", [
    (Reply(status=429, error_message=SECRET, retry_after=0), "rate_limited", 2),
    (Reply(status=500, error_message=SECRET), "llm_unavailable", 2),
    (Reply(status=503, error_message=SECRET, retry_after=0), "llm_unavailable", 2),
    (Reply(status=400, error_message=SECRET), "llm_unavailable", 1),  # a refused request is not retried
    (Reply(status=401, error_message=SECRET), "llm_unavailable", 1),
], ids=["429", "500", "503", "400", "401"])
def test_http_errors_map_to_contract_codes_without_exception_text(llm_settings, fake_llm, reply, code, attempts):
    fake_llm.default = reply
    pieces, stats, error, _ = run(LLMClient(llm_settings))
    assert pieces == []
    assert error is not None and error.code == code
    assert_clean(error)
    assert stats.attempts == attempts == len(fake_llm.chat_requests())


@pytest.mark.parametrize("reply", [
    Reply(tokens=words(10), drop_after=3),
    Reply(tokens=words(10), stream_error_after=3, error_message=SECRET),
    Reply(tokens=words(10), stall_after=3, stall_max=5),
], ids=["dropped", "sse-error", "stalled"])
def test_failure_after_tokens_is_not_retried(llm_settings, fake_llm, reply):
    fake_llm.default = reply
    pieces, stats, error, _ = run(LLMClient(llm_settings))
    assert pieces == words(3)  # what was already streamed, once
    assert error is not None and error.code == "llm_unavailable"
    assert_clean(error)
    assert stats.attempts == 1
    assert len(fake_llm.chat_requests()) == 1


def test_retry_before_first_token_gives_one_answer(llm_settings, fake_llm):
    fake_llm.default = Reply(tokens=words(5))
    fake_llm.enqueue(Reply(status=500), Reply(tokens=words(5), drop_after=0))
    settings = llm_settings.with_overrides(llm_max_retries=2)
    pieces, stats, error, _ = run(LLMClient(settings))
    assert error is None
    assert pieces == words(5)
    assert stats.attempts == 3
    outcomes = [r.outcome for r in fake_llm.chat_requests()]
    assert outcomes == ["error", "dropped", "completed"]


@pytest.mark.parametrize("reply, deadline_s", [
    (Reply(status=500), 2.8),  # backoff 0.25, 0.5, 1, 2 s: the 2 s wait must not carry a retry past the deadline
    (Reply(delay=30), 2.0),  # accepts the connection, sends nothing
    (Reply(stall=True, stall_max=30), 2.0),  # headers, then nothing
], ids=["500", "silent", "stall"])
def test_retries_stop_at_the_deadline(llm_settings, fake_llm, reply, deadline_s):
    """Many retries allowed, but none starts or runs past the turn's deadline."""
    fake_llm.default = reply
    client = LLMClient(llm_settings.with_overrides(llm_max_retries=50, llm_read_timeout=0.6))
    pieces, stats, error, elapsed = run(client, deadline_s=deadline_s)
    assert error is not None and error.code == "llm_unavailable"
    assert_clean(error)
    assert elapsed <= deadline_s + 0.3, f"took {elapsed:.2f} s past a {deadline_s} s deadline"
    assert 1 <= stats.attempts < 50
    assert stats.attempts == len(fake_llm.chat_requests())


def test_cancel_closes_the_upstream_stream(llm_settings, fake_llm):
    fake_llm.default = Reply(tokens=words(200), token_delay=0.01)
    pieces, _, error, elapsed = run(LLMClient(llm_settings), cancel_after=5)
    assert error is None
    assert len(pieces) <= 6
    record = fake_llm.last_request()
    assert record.wait(2.0), "the fake never saw the stream end"
    assert record.outcome == "aborted"
    assert record.tokens_sent < 50
    assert elapsed < 1.0


@pytest.mark.parametrize("exc", [
    ValueError(SECRET), RuntimeError(SECRET), TimeoutError(SECRET), ConnectionResetError(SECRET), KeyError(SECRET),
])
def test_map_error_never_carries_exception_text(exc):
    error = map_error(exc)
    assert_clean(error)


@pytest.mark.parametrize("reply", [Reply(tokens=words(5), first_token_delay=5.0), Reply(tokens=words(50), stall_after=3)],
                         ids=["before-first-token", "mid-stream-stall"])
def test_cancel_event_aborts_a_blocked_read_at_once(llm_settings, fake_llm, reply):
    """With a ``CancelEvent`` the upstream connection is shut down even while no chunk arrives."""
    fake_llm.default = reply
    client = LLMClient(llm_settings.with_overrides(llm_read_timeout=10.0))
    cancelled = CancelEvent()
    stats = StreamStats()
    pieces: list[str] = []
    timer = threading.Timer(0.4, cancelled.set)
    started = time.monotonic()
    timer.start()
    for chunk in client.stream_chat([{"role": "user", "content": "hi"}], cancelled=cancelled,
                                    deadline=started + 20, stats=stats):
        pieces += [c.delta.content for c in chunk.choices if c.delta and c.delta.content]
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"the blocked read returned {elapsed:.2f} s after start (cancel at 0.4 s)"
    assert stats.attempts == 1  # a cancel is never retried
    record = fake_llm.last_request()
    assert record.wait(2.0) and record.outcome == "aborted"
    assert len(pieces) == record.tokens_sent <= 3
