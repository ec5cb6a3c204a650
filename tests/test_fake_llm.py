"""The fake OpenAI-compatible server, exercised through the real ``openai`` SDK over loopback HTTP."""

from __future__ import annotations

import json
import threading
import time

import openai
import pytest

from tests.fake_llm import DEFAULT_TEXT, FakeLLM, FakeLLMProcess, Reply, split_tokens, words

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
