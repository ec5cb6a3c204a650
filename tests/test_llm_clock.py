"""A streamed answer's clock measures silence, not length (docs/contract.md: Configuration,
``LLM_FIRST_TOKEN_TIMEOUT_SECONDS`` / ``LLM_TOKEN_GAP_TIMEOUT_SECONDS``), and the events without text that
say why the first token waits: the real client against the fake model server over real HTTP.

Limits are small here (first token 2 s, gap 1 s) so the tests take seconds; the shapes are the same.
"""

from __future__ import annotations

import threading
import time

import pytest

from app.llm.client import LLMClient, StreamStats
from app.llm.provider import LLMError
from app.settings import Settings
from chat_support.fake_llm import Reply, progress_events, wait_events, words

FIRST, GAP = 2.0, 1.0


@pytest.fixture
def clock_settings(settings, fake_llm):
    return settings.with_overrides(openai_base_url=fake_llm.url, llm_connect_timeout=2.0, llm_max_retries=1,
                                   llm_first_token_timeout=FIRST, llm_token_gap_timeout=GAP)


def stream(client: LLMClient):
    """One answer; returns ``(text, stats, error, elapsed_s, waits)``: ``waits`` the ``on_wait`` calls."""
    waits: list[tuple[str, int | None, float]] = []
    started = time.monotonic()
    stats = StreamStats(on_wait=lambda reason, percent: waits.append((reason, percent, time.monotonic() - started)))
    pieces, error = [], None
    try:
        for delta in client.stream_chat([{"role": "user", "content": "hi"}], cancelled=threading.Event(),
                                        stats=stats):
            pieces.append(delta.text)
    except LLMError as exc:
        error = exc
    return "".join(pieces), stats, error, time.monotonic() - started, waits


def test_a_steady_stream_longer_than_both_limits_completes(clock_settings, fake_llm):
    """12 tokens 0.5 s apart: 6 s in total, three times the first-token limit, six times the gap limit."""
    fake_llm.default = Reply(tokens=words(13), first_token_delay=0.5, token_delay=0.5)
    text, stats, error, elapsed, _ = stream(LLMClient(clock_settings))
    assert error is None
    assert text == "".join(words(13))
    assert stats.finish_reason == "stop" and stats.attempts == 1
    assert elapsed >= 6.0


def test_a_stall_after_text_fails_plainly_once_the_gap_passes(clock_settings, fake_llm):
    fake_llm.default = Reply(tokens=words(10), token_delay=0.05, stall_after=3, stall_max=20)
    text, stats, error, elapsed, _ = stream(LLMClient(clock_settings))
    assert text == "".join(words(3))
    assert error is not None and error.code == "llm_unavailable" and error.category == "token_gap_timeout"
    assert error.message == "The model stopped answering: no text for 1 s. The part shown was not saved."
    assert GAP <= elapsed < GAP + 1.5, elapsed  # the gap, not the socket's or the server's stall_max
    assert stats.attempts == 1 and len(fake_llm.chat_requests()) == 1
    request = fake_llm.last_request()
    deadline = time.monotonic() + 3
    while request.outcome not in ("aborted", "stall_expired") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert request.outcome == "aborted"  # the provider saw the client go away


def test_a_first_token_later_than_its_limit_fails(clock_settings, fake_llm):
    fake_llm.default = Reply(tokens=words(3), first_token_delay=FIRST + 2)
    text, stats, error, elapsed, _ = stream(LLMClient(clock_settings))
    assert text == ""
    assert error is not None and error.category == "first_token_timeout"
    assert error.message == "The model did not start answering within 2 s. Please try again."
    assert FIRST - 0.1 <= elapsed < FIRST + 1.0, elapsed
    assert stats.attempts == 1  # the limit covers the retries: none starts after it


def test_wait_events_keep_the_connection_but_not_the_first_token_clock(clock_settings, fake_llm):
    """x.wait events every 0.5 s do not count as text: a first token after the limit still fails."""
    fake_llm.default = Reply(tokens=words(3), first_token_delay=FIRST + 2,
                             before_first=wait_events(FIRST + 2, every=0.5))
    text, _, error, elapsed, waits = stream(LLMClient(clock_settings))
    assert text == "" and error is not None and error.category == "first_token_timeout"
    assert FIRST - 0.1 <= elapsed < FIRST + 1.0, elapsed
    assert waits and {w[0] for w in waits} == {"another_turn"} and waits[0][2] < 0.5


def test_wait_then_answer_reports_the_reason_and_completes(clock_settings, fake_llm):
    fake_llm.default = Reply(tokens=words(4), first_token_delay=1.5, before_first=[[0, ":"], *wait_events(1.5, 0.5)])
    text, _, error, _, waits = stream(LLMClient(clock_settings))
    assert error is None and text == "".join(words(4))
    assert [w[0] for w in waits] == ["another_turn"] * 3


def test_prompt_progress_reports_reading_with_its_percent(clock_settings, fake_llm):
    fake_llm.default = Reply(tokens=words(3), first_token_delay=1.0,
                             before_first=progress_events(1200, 1.0, every=0.25, cache=200))
    text, _, error, _, waits = stream(LLMClient(clock_settings))
    assert error is None and text == "".join(words(3))
    assert [(w[0], w[1]) for w in waits] == [("reading", 0), ("reading", 25), ("reading", 50), ("reading", 75)]


def test_a_small_prompt_to_read_is_not_told(clock_settings, fake_llm):
    """200 tokens or fewer left to read (the rest cached): no "reading" notice."""
    fake_llm.default = Reply(tokens=words(3), first_token_delay=0.6,
                             before_first=progress_events(1200, 0.5, every=0.25, cache=1000))
    _, _, error, _, waits = stream(LLMClient(clock_settings))
    assert error is None and waits == []


@pytest.mark.parametrize("status, category, attempts", [(503, "unavailable", 2), (500, "unavailable", 2),
                                                        (400, "bad_request", 1), (429, "rate_limited", 2)])
def test_an_error_event_after_200_is_an_http_error(clock_settings, fake_llm, status, category, attempts):
    """The slot proxy's (and llama.cpp's) ``{"error": {"message", "code": <status>}}`` before any text: mapped
    like that HTTP status, retried when it would be."""
    fake_llm.default = Reply(tokens=words(5), before_first=wait_events(0.2, 0.1), stream_error_after=0,
                             stream_error_status=status, error_message="upstream gone: Traceback")
    text, stats, error, _, _ = stream(LLMClient(clock_settings))
    assert text == "" and error is not None and error.category == category
    assert error.status_code == status and "Traceback" not in error.message
    assert stats.attempts == attempts == len(fake_llm.chat_requests())


def test_an_error_event_after_200_is_retried_into_an_answer(clock_settings, fake_llm):
    fake_llm.default = Reply(tokens=words(5))
    fake_llm.enqueue(Reply(tokens=words(5), stream_error_after=0, stream_error_status=502))
    text, stats, error, _, _ = stream(LLMClient(clock_settings))
    assert error is None and text == "".join(words(5)) and stats.attempts == 2


def test_an_error_event_after_text_fails_without_a_retry(clock_settings, fake_llm):
    fake_llm.default = Reply(tokens=words(5), stream_error_after=2, stream_error_status=500)
    text, stats, error, _, _ = stream(LLMClient(clock_settings))
    assert text == "".join(words(2)) and error is not None and error.category == "unavailable"
    assert stats.attempts == 1


def test_an_answer_that_reaches_its_token_limit_is_complete(clock_settings, fake_llm):
    fake_llm.default = Reply(tokens=words(6), finish_reason="length")
    text, stats, error, _, _ = stream(LLMClient(clock_settings))
    assert error is None and text == "".join(words(6)) and stats.finish_reason == "length"


def test_prompt_progress_is_asked_of_the_bundled_model_only(clock_settings, fake_llm):
    fake_llm.default = Reply(tokens=words(2))
    stream(LLMClient(clock_settings))
    assert "return_progress" not in fake_llm.last_request().body


def test_the_old_turn_limit_is_read_as_the_first_token_limit(caplog):
    with caplog.at_level("WARNING", logger="app.settings"):
        old = Settings.from_env({"APP_ENV": "test", "LLM_TURN_TIMEOUT_SECONDS": "45"})
    assert (old.llm_first_token_timeout, old.llm_token_gap_timeout) == (45.0, 30.0)
    assert "LLM_TURN_TIMEOUT_SECONDS is deprecated" in caplog.text
    both = Settings.from_env({"APP_ENV": "test", "LLM_TURN_TIMEOUT_SECONDS": "45",
                              "LLM_FIRST_TOKEN_TIMEOUT_SECONDS": "80"})
    assert both.llm_first_token_timeout == 80.0
    default = Settings.from_env({"APP_ENV": "test"})
    assert (default.llm_first_token_timeout, default.llm_token_gap_timeout) == (90.0, 30.0)


@pytest.mark.parametrize("name, value, message", [
    ("LLM_TOKEN_GAP_TIMEOUT_SECONDS", "0", "LLM_TOKEN_GAP_TIMEOUT_SECONDS must be positive, got '0'"),
    ("LLM_FIRST_TOKEN_TIMEOUT_SECONDS", "soon", "LLM_FIRST_TOKEN_TIMEOUT_SECONDS must be a number, got 'soon'"),
    ("LLM_TURN_TIMEOUT_SECONDS", "-1", "LLM_TURN_TIMEOUT_SECONDS must be positive, got '-1'"),
])
def test_bad_limits_are_refused_by_name(name, value, message):
    from app.settings import ConfigError
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"APP_ENV": "test", name: value})
    assert str(info.value) == message
