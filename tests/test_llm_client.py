"""The streaming LLM client against the fake OpenAI-compatible server, over real HTTP.

The real ``openai`` SDK talks to ``tests.fake_llm`` on loopback; nothing of the SDK is mocked.
"""

from __future__ import annotations

import threading
import time

import pytest

from app.llm.client import CancelEvent, LLMClient, SSEDecoder, StreamStats, http_parser
from app.llm.provider import LLMError, map_error
from chat_support.fake_llm import Reply, words

SECRET = "UPSTREAM-SECRET-7f3a: redis://admin:hunter2@10.0.0.5 Traceback"
PEOPLE_MESSAGES = {
    "The model provider is busy right now. Please try again in a moment.",
    "The model took too long to answer. Please try again.",
    "The model provider refused the request.",
    "The model is unavailable right now. Please try again.",
    "The model did not start answering within 6 s. Please try again.",  # first_token_error(6.0)
    "The model stopped answering: no text for 1 s. The part shown was not saved.",  # token_gap_error(1.0)
}


@pytest.fixture
def llm_settings(settings, fake_llm):
    return settings.with_overrides(openai_base_url=fake_llm.url, llm_connect_timeout=2.0, llm_read_timeout=1.0,
                                   llm_first_token_timeout=6.0, llm_token_gap_timeout=1.0, llm_max_retries=1)


def run(client: LLMClient, *, deadline_s: float = 6.0, cancel_after: int | None = None):
    """Stream one answer; returns ``(text, stats, error, elapsed_s)``: the deltas' text joined."""
    cancelled = threading.Event()
    stats = StreamStats()
    pieces: list[str] = []
    error = None
    started = time.monotonic()
    try:
        for delta in client.stream_chat([{"role": "user", "content": "hi"}], cancelled=cancelled,
                                        deadline=started + deadline_s, stats=stats):
            if delta.text:
                pieces.append(delta.text)
                if cancel_after is not None and len("".join(pieces).split()) >= cancel_after:
                    cancelled.set()
    except LLMError as exc:
        error = exc
    return "".join(pieces), stats, error, time.monotonic() - started


def assert_clean(error: LLMError) -> None:
    """The error is a contract code with a fixed message for people: no exception text anywhere in it."""
    assert error.code in {"llm_unavailable", "rate_limited"}
    assert error.message in PEOPLE_MESSAGES
    for text in (error.message, str(error), repr(error.args)):
        assert "SECRET" not in text and "hunter2" not in text and "Traceback" not in text


def test_streams_pieces_in_order_and_reports_stats(llm_settings, fake_llm):
    fake_llm.default = Reply(tokens=words(12), token_delay=0.005)
    text, stats, error, _ = run(LLMClient(llm_settings))
    assert error is None
    assert text == "".join(words(12))
    assert stats.attempts == 1
    assert stats.first_token_at is not None
    assert stats.completion_tokens == 12 and stats.prompt_tokens > 0
    assert stats.finish_reason == "stop"
    request = fake_llm.last_request()
    assert request.stream and request.model == "fake-chat" and request.messages == [{"role": "user", "content": "hi"}]
    assert request.body["max_tokens"] == llm_settings.reserved_output_tokens == 1024  # the room the prompt left


@pytest.mark.parametrize("reply, code, attempts", [
    (Reply(status=429, error_message=SECRET, retry_after=0), "rate_limited", 2),
    (Reply(status=500, error_message=SECRET), "llm_unavailable", 2),
    (Reply(status=503, error_message=SECRET, retry_after=0), "llm_unavailable", 2),
    (Reply(status=400, error_message=SECRET), "llm_unavailable", 1),  # a refused request is not retried
    (Reply(status=401, error_message=SECRET), "llm_unavailable", 1),
], ids=["429", "500", "503", "400", "401"])
def test_http_errors_map_to_contract_codes_without_exception_text(llm_settings, fake_llm, reply, code, attempts):
    fake_llm.default = reply
    text, stats, error, _ = run(LLMClient(llm_settings))
    assert text == ""
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
    text, stats, error, _ = run(LLMClient(llm_settings))
    assert text == "".join(words(3))  # what was already streamed, once
    assert error is not None and error.code == "llm_unavailable"
    assert_clean(error)
    assert stats.attempts == 1
    assert len(fake_llm.chat_requests()) == 1


def test_retry_before_first_token_gives_one_answer(llm_settings, fake_llm):
    fake_llm.default = Reply(tokens=words(5))
    fake_llm.enqueue(Reply(status=500), Reply(tokens=words(5), drop_after=0))
    settings = llm_settings.with_overrides(llm_max_retries=2)
    text, stats, error, _ = run(LLMClient(settings))
    assert error is None
    assert text == "".join(words(5))
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
    text, stats, error, elapsed = run(client, deadline_s=deadline_s)
    assert error is not None and error.code == "llm_unavailable"
    assert_clean(error)
    assert elapsed <= deadline_s + 0.3, f"took {elapsed:.2f} s past a {deadline_s} s deadline"
    assert 1 <= stats.attempts < 50
    assert stats.attempts == len(fake_llm.chat_requests())


def test_cancel_closes_the_upstream_stream(llm_settings, fake_llm):
    fake_llm.default = Reply(tokens=words(200), token_delay=0.01)
    text, _, error, elapsed = run(LLMClient(llm_settings), cancel_after=5)
    assert error is None
    assert len(text.split()) <= 6
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
    for delta in client.stream_chat([{"role": "user", "content": "hi"}], cancelled=cancelled,
                                    deadline=started + 20, stats=stats):
        pieces += delta.text.split()
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"the blocked read returned {elapsed:.2f} s after start (cancel at 0.4 s)"
    assert stats.attempts == 1  # a cancel is never retried
    record = fake_llm.last_request()
    assert record.wait(2.0) and record.outcome == "aborted"
    assert len(pieces) == record.tokens_sent <= 3


# ------------------------------------------------------------------------------------------ reading the stream


SSE_BODY = ('data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
            ': keep-alive comment\n\n'
            'data: {"choices":[{"index":0,"delta":{"content":"Grüß "}}]}\r\n\r\n'
            'event: message\ndata:{"choices":[{"index":0,"delta":{"content":"你好 🙂"}}]}\n\n'
            'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
            'data: [DONE]\n\n'
            'data: {"choices":[{"index":0,"delta":{"content":"after the end"}}]}\n\n').encode()


def decoded_text(parts: list[bytes]) -> tuple[str, bool]:
    decoder = SSEDecoder()
    text = "".join(c.get("delta", {}).get("content") or "" for part in parts for event in decoder.feed(part)
                   for c in event["choices"])
    return text, decoder.done


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, len(SSE_BODY)])
def test_sse_decoder_reads_events_split_anywhere(step):
    """Body bytes cut at every position (inside lines, CRLF pairs and UTF-8 sequences) give the same events."""
    parts = [SSE_BODY[i:i + step] for i in range(0, len(SSE_BODY), step)]
    assert decoded_text(parts) == ("Grüß 你好 🙂", True)


@pytest.mark.parametrize("body", [b'data: {"choices": [\n', b"data: [1, 2]\n", b'data: {"error": {"message": "x"}}\n'],
                         ids=["unreadable", "not-an-object", "error-event"])
def test_sse_decoder_refuses_bad_events(body):
    with pytest.raises(LLMError) as info:
        SSEDecoder().feed(body)
    assert info.value.code == "llm_unavailable"


def test_flush_interval_reads_what_arrived_in_one_value(llm_settings, fake_llm):
    """With an interval the tokens come a few per value, all of them in order; the first one alone and at once."""
    tokens = words(40)
    fake_llm.default = Reply(tokens=tokens, first_token_delay=0.0, token_delay=0.005)
    fake_llm.enqueue(Reply(tokens=tokens, stall_after=1, stall_max=0.6))
    client = LLMClient(llm_settings)

    # the model sends its first token and then nothing: that token is yielded while the model is silent
    stats = StreamStats()
    stream = client.stream_chat([{"role": "user", "content": "hi"}], cancelled=CancelEvent(),
                                deadline=time.monotonic() + 6, stats=stats, flush_interval=0.25)
    first = next(stream)
    record = fake_llm.last_request()
    assert first.text == tokens[0] and not record.finished and record.tokens_sent <= 1  # counted after its write
    stream.close()

    interval = 0.05
    started = time.monotonic()
    values = [d for d in client.stream_chat([{"role": "user", "content": "hi"}], cancelled=CancelEvent(),
                                            deadline=started + 6, stats=stats, flush_interval=interval)]
    elapsed = time.monotonic() - started
    assert "".join(d.text for d in values) == "".join(tokens)
    assert all(d.text for d in values)
    # one value at once, then at most one per interval (and far fewer than the 40 tokens)
    assert len(values) <= 2 + elapsed / interval and len(values) < len(tokens) / 2, (len(values), elapsed)
    assert stats.finish_reason == "stop" and stats.completion_tokens == len(tokens)


def test_the_http_parser_is_reachable_for_the_coalescing_probe(llm_settings, fake_llm):
    """Coalescing asks httpx's HTTP/1.1 parser whether body bytes are already buffered (no system call).
    If an upgrade of httpx2/httpcore2 moved it, reads still work but poll the socket: this test says so."""
    fake_llm.default = Reply(tokens=words(3))
    client = LLMClient(llm_settings)
    with client.client.chat.completions.with_streaming_response.create(
            model="fake-chat", messages=[{"role": "user", "content": "hi"}], stream=True) as response:
        parser = http_parser(response.http_response)
        assert parser is not None and isinstance(parser.trailing_data, tuple)
