"""The fake OpenAI-compatible server (``chat_support.fake_llm``), exercised through the real ``openai`` SDK over
loopback HTTP, in each of its modes: echo, cut streams, slow tokens, recording (and forwarding), replay, structured
answers, failures, and llama.cpp's endpoints (health, text completions, slots) and its stand-in process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from chat_support.fake_llm import (
    DEFAULT_TEXT,
    CutPlan,
    FakeLLM,
    FakeLLMProcess,
    Replay,
    Reply,
    answer_of,
    plan_pieces,
    progress_events,
    split_tokens,
    wait_events,
    words,
)
from chat_support.polling import wait_until
from chat_support.servers import free_port, port_open

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "system", "content": "Summary: the user likes tea."},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "what do I like?"},
]


@pytest.fixture
def llm():
    with FakeLLM() as fake:
        yield fake


@pytest.fixture(params=[True, False], ids=["pacer", "thread-per-stream"])
def any_llm(request):
    """Both ways of pacing tokens: the shared scheduler thread and the per-handler-thread loop."""
    with FakeLLM(pacer=request.param) as fake:
        assert fake.use_pacer is request.param
        yield fake


def client(llm_or_url, **kw) -> openai.OpenAI:
    url = llm_or_url if isinstance(llm_or_url, str) else llm_or_url.url
    kw.setdefault("timeout", 5.0)
    return openai.OpenAI(base_url=url, api_key="test", max_retries=0, **kw)


def stream_chat(c: openai.OpenAI, **kw):
    kw.setdefault("model", "fake-chat")
    kw.setdefault("messages", MESSAGES)
    return c.chat.completions.create(stream=True, **kw)


def test_split_tokens_preserves_whitespace():
    assert split_tokens("Hello  big world ") == ["Hello", "  big", " world", " "]
    assert "".join(split_tokens(" a\nb ")) == " a\nb "
    assert words(3) == ["word0", " word1", " word2"]


def test_streaming_tokens_and_usage(any_llm):
    any_llm.default = Reply(tokens=["Hel", "lo", " there", "!"], usage=(42, 4))
    chunks = list(stream_chat(client(any_llm), stream_options={"include_usage": True}))

    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert contents == ["Hel", "lo", " there", "!"]
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].model == "fake-chat"
    assert len({c.id for c in chunks}) == 1
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["stop"]
    assert chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens, chunks[-1].usage.total_tokens) == (42, 4, 46)
    assert all(c.usage is None for c in chunks[:-1])

    rec = any_llm.last_request()
    assert rec.wait(2)
    assert (rec.outcome, rec.tokens_sent, rec.status, rec.kind) == ("completed", 4, 200, "stream")


def test_streaming_without_include_usage_has_no_usage_chunk_and_splits_text(llm):
    llm.default = Reply(text="one two three")
    chunks = list(stream_chat(client(llm)))
    assert [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content] == ["one", " two", " three"]
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_request_log_holds_exactly_what_the_model_saw(llm):
    c = client(llm)
    list(stream_chat(c, temperature=0.2))
    c.chat.completions.create(model="fake-compact", messages=[{"role": "user", "content": "compact json"}],
                              response_format={"type": "json_object"})

    first, second = llm.chat_requests()
    assert first.messages == MESSAGES
    assert [m["role"] for m in first.messages] == ["system", "system", "user", "assistant", "user"]
    assert first.body["temperature"] == 0.2 and first.model == "fake-chat" and first.stream is True
    assert first.headers["authorization"] == "Bearer test"
    assert first.path == "/v1/chat/completions"
    assert second.kind == "structured" and second.response_format == {"type": "json_object"}
    assert [r.model for r in llm.chat_requests("stream")] == ["fake-chat"]
    assert [r.model for r in llm.chat_requests("nonstream")] == ["fake-compact"]
    assert llm.last_request() is second
    assert llm.last_request("stream") is first
    assert first.time <= second.time

    llm.reset()
    assert llm.requests == []
    with pytest.raises(LookupError):
        llm.last_request()


def test_non_streaming_json_content_and_usage(llm):
    llm.default = Reply(json={"summary": "likes tea", "pinnedDecisions": ["use Redis"]})
    resp = client(llm).chat.completions.create(model="fake-compact", messages=MESSAGES,
                                               response_format={"type": "json_object"})
    assert resp.object == "chat.completion"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].message.role == "assistant"
    assert json.loads(resp.choices[0].message.content) == {"summary": "likes tea", "pinnedDecisions": ["use Redis"]}
    assert resp.usage.completion_tokens == len(split_tokens(resp.choices[0].message.content))
    assert resp.usage.prompt_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_rules_route_chat_and_compaction_differently(llm):
    llm.default = Reply(text="default")
    llm.add_rule(Reply(text="streamed"), stream=True)
    llm.add_rule(Reply(json={"summary": "s"}), stream=False, model="fake-compact")
    llm.enqueue(Reply(status=503), stream=False)  # appended last: the model rule above wins for fake-compact
    c = client(llm)

    text = "".join(ch.choices[0].delta.content or "" for ch in stream_chat(c))
    compaction = c.chat.completions.create(model="fake-compact", messages=MESSAGES)
    with pytest.raises(openai.InternalServerError):
        c.chat.completions.create(model="other", messages=MESSAGES)
    plain = c.chat.completions.create(model="other", messages=MESSAGES)  # the one-shot rule is used up

    assert text == "streamed"
    assert json.loads(compaction.choices[0].message.content) == {"summary": "s"}
    assert plain.choices[0].message.content == "default"
    assert [r.rule for r in llm.chat_requests()] == ["rule#0", "rule#1", "rule#2", "default"]


def test_callable_reply_echo_and_predicate(llm):
    llm.default = lambda body: Reply(text="echo: " + body["messages"][-1]["content"])
    llm.add_rule(lambda body: {"n": len(body["messages"])}, when=lambda b: "count" in b["messages"][-1]["content"])
    c = client(llm)
    r1 = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "ping"}])
    r2 = c.chat.completions.create(model="m", messages=[{"role": "system", "content": "x"},
                                                        {"role": "user", "content": "count"}])
    llm.default = Reply(echo=True)
    r3 = "".join(ch.choices[0].delta.content or "" for ch in stream_chat(c))
    assert r1.choices[0].message.content == "echo: ping"
    assert json.loads(r2.choices[0].message.content) == {"n": 2}
    assert r3 == "what do I like?"


def test_rate_limit_429_with_retry_after(llm):
    llm.default = Reply(status=429, retry_after=7)
    with pytest.raises(openai.RateLimitError) as ei:
        list(stream_chat(client(llm)))
    assert ei.value.status_code == 429
    assert ei.value.response.headers["retry-after"] == "7"
    assert ei.value.code == "rate_limit_exceeded"
    assert llm.last_request().outcome == "error" and llm.last_request().status == 429


def test_500_and_503_map_to_internal_server_error(llm):
    llm.enqueue(Reply(status=500, error_message="boom"), Reply(status=503))
    c = client(llm)
    with pytest.raises(openai.InternalServerError) as e500:
        c.chat.completions.create(model="m", messages=MESSAGES)
    with pytest.raises(openai.InternalServerError) as e503:
        list(stream_chat(c))
    assert e500.value.status_code == 500 and e500.value.message.endswith("boom")
    assert e500.value.body == {"message": "boom", "type": "server_error", "param": None, "code": None}
    assert e503.value.status_code == 503 and e503.value.response.headers["retry-after"] == "1"


def test_dropped_stream_raises_on_iteration(any_llm):
    any_llm.default = Reply(text="a b c d e f", drop_after=2)
    got = []
    with pytest.raises(openai.APIConnectionError):
        for ch in stream_chat(client(any_llm)):
            if ch.choices and ch.choices[0].delta.content:
                got.append(ch.choices[0].delta.content)
    assert got == ["a", " b"]
    rec = any_llm.last_request()
    assert rec.wait(2) and (rec.outcome, rec.tokens_sent) == ("dropped", 2)


def test_stream_error_event_raises_api_error(llm):
    llm.default = Reply(text="a b c", stream_error_after=1, error_message="model crashed")
    got = []
    with pytest.raises(openai.APIError) as ei:
        for ch in stream_chat(client(llm)):
            got.append(ch.choices[0].delta.content)
    assert got == ["", "a"]  # the role chunk, then one token
    assert "model crashed" in str(ei.value)


def test_stall_after_tokens_times_out_and_is_recorded_aborted(any_llm):
    any_llm.default = Reply(text="x y z", stall_after=2)
    got = []
    t0 = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        for ch in stream_chat(client(any_llm, timeout=0.4)):
            if ch.choices[0].delta.content:
                got.append(ch.choices[0].delta.content)
    assert 0.35 < time.monotonic() - t0 < 2.0
    assert got == ["x", " y"]
    rec = any_llm.last_request()
    assert rec.wait(2) and (rec.outcome, rec.tokens_sent) == ("aborted", 2)


def test_stall_non_streaming_and_delay_before_headers_time_out(llm):
    llm.enqueue(Reply(stall=True), Reply(delay=3.0))
    c = client(llm, timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        c.chat.completions.create(model="m", messages=MESSAGES)
    with pytest.raises(openai.APITimeoutError):
        c.chat.completions.create(model="m", messages=MESSAGES)
    a, b = llm.chat_requests()
    assert a.wait(2) and b.wait(2)
    assert (a.outcome, a.status) == ("aborted", 200)  # headers were sent, then nothing
    assert (b.outcome, b.status) == ("aborted", None)  # nothing was sent


def test_stall_expires_after_stall_max(llm):
    llm.default = Reply(text="a b", stall_after=1, stall_max=0.2)
    with pytest.raises(openai.APIConnectionError):
        list(stream_chat(client(llm)))
    rec = llm.last_request()
    assert rec.wait(2) and (rec.outcome, rec.tokens_sent) == ("stall_expired", 1)


def test_first_token_and_token_delays(any_llm):
    any_llm.default = Reply(text="a b c d", first_token_delay=0.2, token_delay=0.05)
    times = []
    t0 = time.monotonic()
    for ch in stream_chat(client(any_llm)):
        if ch.choices and ch.choices[0].delta.content:
            times.append(time.monotonic() - t0)
    assert len(times) == 4
    # Lower bounds only hold whatever the machine's load: a token can arrive late, never early.
    assert 0.18 <= times[0] < 1.5  # the first token after 0.2 s
    assert times[-1] >= 0.33  # the last after 0.2 + 3 x 0.05 s
    assert times[-1] < 2.0


def test_client_close_after_three_tokens_is_recorded_promptly(any_llm):
    any_llm.default = Reply(tokens=words(40), token_delay=0.05)
    stream = stream_chat(client(any_llm))
    got = []
    for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            got.append(ch.choices[0].delta.content)
        if len(got) == 3:
            break
    stream.close()
    closed_at = time.time()
    rec = any_llm.last_request()
    assert rec.wait(2)
    assert got == ["word0", " word1", " word2"]
    assert rec.outcome == "aborted" and rec.aborted
    assert 3 <= rec.tokens_sent <= 4
    assert rec.end_time - closed_at < 0.5  # far less than the 1.85 s the 37 unsent tokens would take


def test_reject_json_schema_like_llama_cpp_python():
    schema_rf = {"type": "json_schema",
                 "json_schema": {"name": "memory", "strict": True,
                                 "schema": {"type": "object", "properties": {"summary": {"type": "string"}},
                                            "required": ["summary"], "additionalProperties": False}}}
    with FakeLLM(Reply(json={"summary": "ok"}), reject_json_schema=True) as llm:
        c = client(llm)
        with pytest.raises(openai.InternalServerError) as ei:
            c.chat.completions.create(model="m", messages=MESSAGES, response_format=schema_rf)
        assert "json_schema" in ei.value.message
        ok = c.chat.completions.create(model="m", messages=MESSAGES,
                                       response_format={"type": "json_object", "schema": schema_rf["json_schema"]["schema"]})
        assert json.loads(ok.choices[0].message.content) == {"summary": "ok"}
        assert [r.status for r in llm.chat_requests()] == [500, 200]
    with FakeLLM(reject_json_schema=400) as llm:
        with pytest.raises(openai.BadRequestError):
            client(llm).chat.completions.create(model="m", messages=MESSAGES, response_format=schema_rf)


def test_json_schema_accepted_and_auto_answer_follows_schema(llm):
    schema = {"type": "object",
              "properties": {"summary": {"type": "string"}, "pinned": {"type": "array", "items": {"type": "string"}},
                             "kind": {"enum": ["a", "b"]}},
              "required": ["summary", "pinned", "kind"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "memory", "strict": True, "schema": schema}}
    resp = client(llm).chat.completions.create(model="m", messages=MESSAGES, response_format=rf)
    assert json.loads(resp.choices[0].message.content) == {"summary": "fake", "pinned": [], "kind": "a"}
    with pytest.raises(openai.BadRequestError) as ei:  # malformed response_format is rejected like OpenAI does
        client(llm).chat.completions.create(model="m", messages=MESSAGES, response_format={"type": "json_schema"})
    assert "response_format.json_schema" in ei.value.message


def test_tool_calls_streaming_and_non_streaming(llm):
    calls = [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}, "id": "call_1"},
             {"name": "lookup", "arguments": "{}"}]
    llm.default = Reply(tool_calls=calls)
    c = client(llm)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]

    acc: dict[int, dict] = {}
    finish = []
    for ch in stream_chat(c, tools=tools):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        for tc in d.tool_calls or []:
            slot = acc.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                slot["id"] = tc.id
            if tc.function and tc.function.name:
                slot["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                slot["arguments"] += tc.function.arguments
        if ch.choices[0].finish_reason:
            finish.append(ch.choices[0].finish_reason)
    assert finish == ["tool_calls"]
    assert acc[0] == {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'}
    assert acc[1]["name"] == "lookup" and acc[1]["arguments"] == "{}" and acc[1]["id"].startswith("call_")
    assert llm.last_request().tools == tools

    resp = c.chat.completions.create(model="m", messages=MESSAGES, tools=tools)
    msg = resp.choices[0].message
    assert resp.choices[0].finish_reason == "tool_calls"
    assert msg.content is None
    assert [(t.id, t.function.name, json.loads(t.function.arguments)) for t in msg.tool_calls][0] == \
        ("call_1", "get_weather", {"city": "Paris", "unit": "C"})


def test_models_endpoint_and_api_key_check():
    with FakeLLM(api_key="secret", models=["fake-chat", "fake-compact"]) as llm:
        assert [m.id for m in openai.OpenAI(base_url=llm.url, api_key="secret", max_retries=0).models.list()] == \
            ["fake-chat", "fake-compact"]
        with pytest.raises(openai.AuthenticationError):
            client(llm).chat.completions.create(model="m", messages=MESSAGES)


def test_default_text_and_keep_alive_reuse(llm):
    c = client(llm)
    texts = ["".join(ch.choices[0].delta.content or "" for ch in stream_chat(c)) for _ in range(3)]
    texts += [c.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content for _ in range(3)]
    assert texts == [DEFAULT_TEXT] * 6
    assert [r.outcome for r in llm.chat_requests()] == ["completed"] * 6


def test_concurrent_streams(llm):
    """50 concurrent streaming clients x 20 tokens 10 ms apart finish in well under the serial time."""
    llm.default = Reply(tokens=words(20), token_delay=0.01)
    c = client(llm)
    results: list = [None] * 50

    def run(i: int) -> None:
        results[i] = sum(1 for ch in stream_chat(c) if ch.choices and ch.choices[0].delta.content)

    t0 = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [20] * 50
    assert time.monotonic() - t0 < 5.0  # serial would be 50 * 0.19 s = 9.5 s
    assert [r.outcome for r in llm.chat_requests()] == ["completed"] * 50


def test_subprocess_mode_ready_line_and_control_endpoints():
    with FakeLLMProcess(tokens=5, token_delay=0.001) as proc:
        assert proc.url.startswith("http://127.0.0.1:") and proc.url.endswith("/v1")
        c = client(proc.url)
        text = "".join(ch.choices[0].delta.content or "" for ch in stream_chat(c))
        assert text == "word0 word1 word2 word3 word4"

        assert proc.script(text="scripted answer") == {"ok": True, "target": "default"}
        assert proc.script(json={"summary": "s"}, match={"stream": False}, times=1) == {"ok": True, "target": "rule"}
        text = "".join(ch.choices[0].delta.content or "" for ch in stream_chat(c))
        compaction = c.chat.completions.create(model="fake-compact", messages=MESSAGES).choices[0].message.content
        assert text == "scripted answer"
        assert json.loads(compaction) == {"summary": "s"}

        reqs = proc.requests()
        assert [(r["kind"], r["outcome"], r["tokens_sent"]) for r in reqs] == \
            [("stream", "completed", 5), ("stream", "completed", 2), ("plain", "completed", 2)]
        assert reqs[0]["body"]["messages"] == MESSAGES

        proc.reset()
        assert proc.requests() == []
        text = "".join(ch.choices[0].delta.content or "" for ch in stream_chat(c))
        assert text == "word0 word1 word2 word3 word4"
        # Structured requests get a JSON instance of their schema by default in standalone mode.
        rf = {"type": "json_schema", "json_schema": {"name": "mem", "schema": {
            "type": "object", "properties": {"summary": {"type": "string"}, "pinned": {"type": "array"}}}}}
        resp = c.chat.completions.create(model="fake-compact", messages=MESSAGES, response_format=rf)
        assert json.loads(resp.choices[0].message.content) == {"summary": "fake", "pinned": []}
        assert [r["rule"] for r in proc.requests()] == ["default", "structured-default"]


def test_stop_ends_in_flight_streams_quickly(any_llm):
    any_llm.default = Reply(tokens=words(100), token_delay=0.05)
    c = client(any_llm)
    stream = stream_chat(c)
    first = next(ch for ch in stream if ch.choices and ch.choices[0].delta.content)
    t0 = time.monotonic()
    any_llm.stop()
    assert time.monotonic() - t0 < 1.5
    rec = any_llm.last_request()
    assert rec.wait(2)
    assert first.choices[0].delta.content == "word0"
    assert rec.outcome == "server_stopped" and rec.tokens_sent < 20
    with pytest.raises(openai.APIConnectionError):
        list(stream)


# -- the modes added for the fakes the tests and benchmarks used to have ------------------------------------------

def raw_post(url: str, body: dict, timeout: float = 10) -> tuple[int, bytes]:
    """``(status, raw body)`` of a POST of ``body`` as JSON (HTTP errors included)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def raw_exchange(port: int, body: dict) -> tuple[bytes, bytes]:
    """``(head, body bytes)`` of a streamed chat request read until the server closes the connection."""
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(payload), payload))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def events(raw: bytes) -> list:
    """The SSE ``data:`` payloads of a close-delimited body, JSON-decoded (``"[DONE]"`` as it is)."""
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: "):
            out.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
    return out


def test_echo_mode_answers_the_last_user_message_streamed_and_whole(llm):
    llm.default = Reply(echo=True)
    c = client(llm)
    streamed = [ch.choices[0].delta.content for ch in stream_chat(c) if ch.choices and ch.choices[0].delta.content]
    whole = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "say it back"}])
    assert streamed == ["what", " do", " I", " like?"]
    assert whole.choices[0].message.content == "say it back"
    assert [r.answer for r in llm.chat_requests()] == ["what do I like?", "say it back"]


def test_close_framing_ends_the_body_at_the_close_and_done_can_be_left_out(llm):
    llm.default = Reply(tokens=["a", " b", " c"], framing="close", done=False)
    head, body = raw_exchange(llm.port, {"model": "m", "messages": MESSAGES, "stream": True})
    assert b"Transfer-Encoding" not in head and b"Content-Length" not in head and b"Connection: close" in head
    got = events(body)
    assert [e["choices"][0]["delta"].get("content") for e in got] == ["", "a", " b", " c", None]
    assert got[-1]["choices"][0]["finish_reason"] == "stop" and "[DONE]" not in got
    llm.default = Reply(tokens=["a", " b", " c"], framing="close")
    assert events(raw_exchange(llm.port, {"model": "m", "messages": MESSAGES, "stream": True})[1])[-1] == "[DONE]"


def test_cut_plan_cuts_hangs_or_leaves_out_done_as_the_message_says(llm):
    llm.default = CutPlan(tokens=6, token_delay=0.0)
    texts = {}
    for text in ("hi", "hi [cut 2]", "hi [nodone 3]", "hi [hang 1]"):
        if "hang" in text:
            llm.stall_max = 0.3
        got = events(raw_exchange(llm.port, {"model": "m", "messages": [{"role": "user", "content": text}],
                                             "stream": True})[1])
        texts[text] = ("".join(e["choices"][0]["delta"].get("content") or "" for e in got if e != "[DONE]"),
                       [e["choices"][0]["finish_reason"] for e in got if e != "[DONE]"][-1], got[-1] == "[DONE]")
    assert plan_pieces(3) == ["Echo:", " t1", " t2"]
    assert texts == {"hi": ("Echo: t1 t2 t3 t4 t5", "stop", True), "hi [cut 2]": ("Echo: t1", None, False),
                     "hi [nodone 3]": ("Echo: t1 t2", "stop", False), "hi [hang 1]": ("Echo:", None, False)}
    assert [r.outcome for r in llm.chat_requests()] == ["completed", "dropped", "completed", "stall_expired"]


def test_cut_plan_as_its_own_process_and_a_kill_mid_answer(tmp_path):
    with open(tmp_path / "err.log", "w") as log, FakeLLMProcess(tokens=40, token_delay=0.05,
                                                                extra_args=["--cut-plan"], stderr=log) as proc:
        c = client(proc.url)
        assert "".join(ch.choices[0].delta.content or "" for ch in stream_chat(c, messages=[
            {"role": "user", "content": "hi [nodone 4]"}])) == "Echo: t1 t2 t3"
        stream = stream_chat(c, messages=[{"role": "user", "content": "hi [hang 3]"}])
        got = []
        for ch in stream:
            got += [ch.choices[0].delta.content] if ch.choices and ch.choices[0].delta.content else []
            if len(got) == 3:
                break
        proc.proc.kill()  # the model server dies mid-answer
        assert proc.proc.wait(5) == -signal.SIGKILL
        rest = list(stream)  # the body ends at the close: no more text, and no finish_reason
        assert got == plan_pieces(40)[:3]
        assert [(ch.choices[0].delta.content, ch.choices[0].finish_reason) for ch in rest if ch.choices] == []


def test_slow_mode_paces_the_tokens_from_the_command_line():
    with FakeLLMProcess(tokens=5, token_delay=0.1, first_token_delay=0.2) as proc:
        t0 = time.monotonic()
        stamps = [time.monotonic() - t0 for ch in stream_chat(client(proc.url))
                  if ch.choices and ch.choices[0].delta.content]
    assert len(stamps) == 5
    assert stamps[0] >= 0.18 and stamps[-1] - stamps[0] >= 0.38  # 0.2 s to the first, 4 x 0.1 s after it


def test_recording_forwarding_and_replay_answer_the_same(tmp_path):
    with FakeLLM(Reply(echo=True, usage=(5, 3))) as upstream, FakeLLM(upstream=f"http://127.0.0.1:{upstream.port}") as rec:
        c = client(rec)
        said = [c.chat.completions.create(model="m", messages=[{"role": "user", "content": f"turn {n}"}]
                                          ).choices[0].message.content for n in range(2)]
        said.append("".join(ch.choices[0].delta.content or "" for ch in stream_chat(
            c, messages=[{"role": "user", "content": "streamed turn"}], stream_options={"include_usage": True})
            if ch.choices))
        assert [m.id for m in c.models.list()] == ["fake-chat", "fake-compact"]  # forwarded too
        for r in rec.requests:
            assert r.wait(2)
        assert said == ["turn 0", "turn 1", "streamed turn"]
        assert [(r.answer, r.usage["prompt_tokens"], r.rule) for r in rec.chat_requests()] == [
            ("turn 0", 5, "upstream"), ("turn 1", 5, "upstream"), ("streamed turn", 5, "upstream")]
        assert [r.path for r in upstream.requests] == ["/v1/chat/completions"] * 3 + ["/v1/models"]
        assert rec.save_recording(tmp_path / "rec.json") == 3

    replay = Replay.load(tmp_path / "rec.json")
    with FakeLLM(replay) as llm:
        c = client(llm)
        again = [c.chat.completions.create(model="m", messages=[{"role": "user", "content": "anything"}]
                                           ).choices[0].message.content for _ in range(3)]
        with pytest.raises(openai.InternalServerError) as left:
            c.chat.completions.create(model="m", messages=MESSAGES)
    assert again == said
    assert "no recorded answer left" in left.value.message and replay.missed == 1

    by_messages = Replay(json.loads((tmp_path / "rec.json").read_text()), match="messages")
    with FakeLLMProcess(extra_args=["--replay", str(tmp_path / "rec.json"), "--replay-match", "messages"]) as proc:
        c = client(proc.url)
        assert c.chat.completions.create(model="m", messages=[{"role": "user", "content": "turn 1"}]
                                         ).choices[0].message.content == "turn 1"
        with pytest.raises(openai.InternalServerError):
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "never said"}])
    assert by_messages({"messages": [{"role": "user", "content": "turn 0"}]}).text == "turn 0"


def test_answer_of_reads_streams_and_whole_answers():
    stream = (b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"choices":[{"delta":{"content":" b"}}]}\n\n'
              b'data: {"choices":[],"usage":{"prompt_tokens":3}}\n\ndata: [DONE]\n\n')
    assert answer_of(stream) == ("a b", {"prompt_tokens": 3})
    assert answer_of(b'{"choices":[{"message":{"content":"whole"}}],"usage":{"completion_tokens":1}}') == (
        "whole", {"completion_tokens": 1})


def test_structured_answers_are_scripted_per_request_and_chat_is_left_alone(llm, tmp_path):
    llm.answer_structured({"summary": "first"}, {"summary": "second"})
    c = client(llm)
    rf = {"type": "json_object"}
    chat = "".join(ch.choices[0].delta.content or "" for ch in stream_chat(c))
    answers = [json.loads(c.chat.completions.create(model="fake-compact", messages=MESSAGES, response_format=rf)
                          .choices[0].message.content) for _ in range(3)]
    assert chat == DEFAULT_TEXT
    assert answers == [{"summary": "first"}, {"summary": "second"}, {}]  # then a minimal instance of no schema

    (tmp_path / "answers.json").write_text(json.dumps([{"summary": "from a file"}]))
    with FakeLLMProcess(extra_args=["--structured", str(tmp_path / "answers.json")]) as proc:
        c = client(proc.url)
        got = [json.loads(c.chat.completions.create(model="fake-compact", messages=MESSAGES, response_format=rf)
                          .choices[0].message.content) for _ in range(2)]
    assert got == [{"summary": "from a file"}, {}]


def test_path_rules_answer_the_models_endpoint_and_malformed_requests():
    with FakeLLM() as llm:
        llm.add_rule(Reply(status=503), path="/v1/models", times=1)
        llm.add_rule(Reply(text="even so"), path="/v1/chat/completions", times=1)
        with pytest.raises(openai.InternalServerError):
            client(llm).models.list()
        assert [m.id for m in client(llm).models.list()] == ["fake-chat", "fake-compact"]
        status, body = raw_post(llm.url + "/chat/completions", {"messages": []})  # no model, no message
        assert (status, json.loads(body)["choices"][0]["message"]["content"]) == (200, "even so")
        status, body = raw_post(llm.url + "/chat/completions", {"messages": []})
        assert status == 400
        assert [r.rule for r in llm.requests] == ["rule#0", None, "rule#0", None]  # None: no reply was chosen


def test_llama_cpp_health_text_completions_and_optional_model():
    with FakeLLM(Reply(text="Hi", finish_reason="length"), require_model=False) as llm:
        with urllib.request.urlopen(llm.base_url + "/health", timeout=5) as resp:
            assert json.loads(resp.read()) == {"status": "ok"}
        status, body = raw_post(llm.url + "/completions", {"prompt": "Hello", "max_tokens": 1})
        answer = json.loads(body)
        assert (status, answer["object"], answer["choices"][0]["text"], answer["choices"][0]["finish_reason"]) == (
            200, "text_completion", "Hi", "length")
        status, body = raw_post(llm.url + "/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
        assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "Hi"
    with FakeLLM() as strict:
        assert raw_post(strict.url + "/completions", {"prompt": "Hello"})[0] == 400


def test_slots_hold_the_last_request_and_save_restore_erase_files(tmp_path):
    with FakeLLM(Reply(text="ok"), slot_dir=tmp_path, require_model=False) as llm:
        def chat(*texts: str, stream: bool = False) -> list:
            body = {"messages": [{"role": "user", "content": t} for t in texts], "stream": stream}
            status, raw = raw_post(llm.url + "/chat/completions", body)
            assert status == 200
            return events(raw)[-2]["slot_before"] if stream else json.loads(raw)["slot_before"]

        assert chat("a") == []
        assert chat("b") == ["a", "ok"]
        assert raw_post(llm.base_url + "/slots/0?action=save", {"filename": "b.bin"}) [0] == 200
        assert raw_post(llm.base_url + "/slots/0?action=erase", {})[0] == 200
        assert chat("c", stream=True) == []
        assert raw_post(llm.base_url + "/slots/0?action=restore", {"filename": "b.bin"})[0] == 200
        assert chat("d") == ["b", "ok"]
        assert raw_post(llm.base_url + "/slots/0?action=restore", {"filename": "none.bin"})[0] == 404
        assert json.loads((tmp_path / "b.bin").read_text()) == ["b", "ok"]
        assert [r.path for r in llm.requests if r.path.startswith("/slots")] == [
            "/slots/0?action=save", "/slots/0?action=erase", "/slots/0?action=restore", "/slots/0?action=restore"]


@pytest.mark.parametrize("mode, path, signal_number", [("sigill", "/v1/completions", signal.SIGILL),
                                                       ("segv-chat", "/v1/chat/completions", signal.SIGSEGV)])
def test_the_llama_standin_crashes_with_its_signal_and_answers_otherwise(tmp_path, mode, path, signal_number):
    port = free_port()
    env = {**os.environ, "STANDIN_MODE": mode, "STANDIN_STARTS": str(tmp_path / "starts")}
    env.pop("STANDIN_FAIL_PORT", None)
    proc = subprocess.Popen([sys.executable, "-m", "chat_support.llama_standin", "--model", "m.gguf", "--port",
                             str(port), "--role", "chat"], env=env)
    try:
        wait_until(lambda: port_open(port), 15, "the stand-in to listen")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as resp:
            assert [m["id"] for m in json.loads(resp.read())["data"]] == ["qwen2.5-coder-0.5b-instruct"]
        if mode == "segv-chat":  # the start check's text completion passes
            status, body = raw_post(f"http://127.0.0.1:{port}/v1/completions", {"prompt": "Hello", "max_tokens": 1})
            assert (status, json.loads(body)["choices"][0]["text"]) == (200, "Hi")
        with pytest.raises((ConnectionError, urllib.error.URLError, http_client_errors())):
            raw_post(f"http://127.0.0.1:{port}{path}", {"messages": []})
        assert proc.wait(10) == -signal_number
        assert (tmp_path / "starts").read_text() == f"{port}\n"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def http_client_errors():
    import http.client

    return http.client.HTTPException


def raw_events(llm, timeout: float = 10.0) -> list[tuple[float, str]]:
    """One streamed request's body as ``(seconds since the request, line)`` for each non-empty line."""
    body = json.dumps({"model": "fake-chat", "messages": MESSAGES, "stream": True}).encode()
    request = urllib.request.Request(llm.url + "/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    started, lines = time.monotonic(), []
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for line in response:
            if line.strip():
                lines.append((time.monotonic() - started, line.decode().strip()))
    return lines


@pytest.mark.parametrize("pacer", [True, False], ids=["pacer", "thread-per-stream"])
def test_events_before_the_first_token_come_at_their_times(pacer):
    """``before_first``: the slot proxy's x.wait events, llama.cpp's progress chunks and a keep-alive comment,
    each at its time, all before the first token (which keeps its own delay)."""
    with FakeLLM(pacer=pacer) as llm:
        llm.default = Reply(tokens=["Hi", "!"], first_token_delay=0.6,
                            before_first=[[0, ":"], *wait_events(0.5, every=0.25),
                                          [0.5, progress_events(1000, 1)[0][1]]])
        lines = raw_events(llm)
    kinds = []
    for at, line in lines:
        if line == ":":
            kinds.append("comment")
            continue
        event = json.loads(line[len("data: "):]) if line != "data: [DONE]" else "[DONE]"
        if event == "[DONE]":
            kinds.append("done")
        elif event.get("object") == "x.wait":
            assert event["reason"] == "another_turn"
            kinds.append(("wait", at))
        elif "prompt_progress" in event:
            assert event["prompt_progress"] == {"total": 1000, "cache": 0, "processed": 0, "time_ms": 0}
            kinds.append("progress")
        elif event["choices"] and event["choices"][0]["delta"].get("content"):
            assert at >= 0.55
            kinds.append("text")
    assert kinds[0] == "comment" and [k[0] for k in kinds[1:3]] == ["wait", "wait"]
    assert kinds[1][1] < 0.15 and 0.2 <= kinds[2][1] < 0.45  # at once, then 0.25 s later
    assert kinds[3] == "progress" and kinds[4:] == ["text", "text", "done"]


def test_an_error_event_with_an_http_status_code():
    """``stream_error_status``: the error event llama.cpp's server and the slot proxy send after a 200."""
    with FakeLLM() as llm:
        llm.default = Reply(tokens=words(4), stream_error_after=1, stream_error_status=503, error_message="gone")
        lines = [line for _, line in raw_events(llm)]
    assert json.loads(lines[-1][len("data: "):]) == {"error": {"message": "gone", "code": 503}}
    assert sum('"content":"word0"' in line for line in lines) == 1 and "data: [DONE]" not in lines
