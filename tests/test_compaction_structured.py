"""The structured compaction call (``app.llm.structured``) against the fake LLM over real HTTP."""

from __future__ import annotations

import pytest

from app.llm.provider import LLMError
from app.llm.structured import (StructuredClient, compaction_json_schema, forget_modes, parse_json_answer,
                                response_format_for)
from app.settings import MemoryLimits
from tests.fake_llm import FakeLLM, Reply

LIMITS = MemoryLimits()
ANSWER = {"summary": "They talked.", "pinnedDecisions": ["Use tea"]}
PROMPT = [{"role": "system", "content": "Answer JSON."}, {"role": "user", "content": "fold these"}]


@pytest.fixture(autouse=True)
def _fresh_modes():
    forget_modes()
    yield
    forget_modes()


def make_client(settings, llm: FakeLLM, **overrides) -> StructuredClient:
    values = {"openai_base_url": llm.url, "compaction_llm_timeout": 2.0, **overrides}
    return StructuredClient(settings.with_overrides(**values))


def call(client: StructuredClient):
    return client.complete_json(PROMPT, schema=compaction_json_schema(LIMITS),
                                strict_schema=compaction_json_schema(LIMITS, with_lengths=False))


def test_json_schema_mode_at_temperature_zero_without_streaming(settings, fake_llm):
    fake_llm.add_rule(Reply(json=ANSWER))
    answer = call(make_client(settings, fake_llm))
    assert (answer.data, answer.mode) == (ANSWER, "json_schema")
    body = fake_llm.last_request().body
    assert (body["model"], body["temperature"], body.get("stream", False)) == ("fake-compact", 0, False)
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "compaction", "strict": True, "schema": {
            "type": "object", "required": ["summary", "pinnedDecisions"], "additionalProperties": False,
            "properties": {"summary": {"type": "string"},
                           "pinnedDecisions": {"type": "array", "items": {"type": "string"}}}}}}
    assert body["messages"] == PROMPT


@pytest.mark.parametrize("status", [500, 400, 422])
def test_a_provider_rejecting_json_schema_gets_json_object_with_the_schema_and_it_is_remembered(settings, status):
    with FakeLLM(Reply(json=ANSWER), reject_json_schema=status) as llm:
        client = make_client(settings, llm)
        assert call(client).mode == "json_object_schema"
        assert call(client).mode == "json_object_schema"
        formats = [r.response_format for r in llm.chat_requests()]
    assert [f["type"] for f in formats] == ["json_schema", "json_object", "json_object"]
    # maxLength 2500 is left out (llama.cpp refuses such a grammar); the pins' 300 stays
    assert formats[1]["schema"]["properties"]["summary"] == {"type": "string"}
    assert formats[1]["schema"]["properties"]["pinnedDecisions"]["items"] == {"type": "string", "maxLength": 300}
    assert formats[1]["schema"]["properties"]["pinnedDecisions"]["maxItems"] == 20


def test_a_provider_taking_only_plain_json_mode_gets_it(settings, fake_llm):
    def schema_refused(body):
        rf = body.get("response_format") or {}
        return rf.get("type") == "json_schema" or "schema" in rf
    fake_llm.add_rule(Reply(status=400, error_message="response_format: unsupported field 'schema'"),
                      when=schema_refused)
    fake_llm.add_rule(Reply(json=ANSWER))
    client = make_client(settings, fake_llm)
    assert call(client).mode == "json_object"
    assert call(client).data == ANSWER
    assert [r.response_format for r in fake_llm.chat_requests()][-1] == {"type": "json_object"}
    assert len(fake_llm.chat_requests()) == 4  # 3 for the first call, 1 for the remembered mode


def test_an_unrelated_bad_request_is_not_a_format_rejection(settings, fake_llm):
    fake_llm.add_rule(Reply(status=400, error_message="context length exceeded"))
    with pytest.raises(LLMError) as info:
        call(make_client(settings, fake_llm))
    assert (info.value.category, info.value.retryable) == ("bad_request", False)
    assert len(fake_llm.chat_requests()) == 1


@pytest.mark.parametrize("reply, category", [
    (Reply(status=429), "rate_limited"),
    (Reply(status=503), "unavailable"),
    (Reply(text="this is not json {"), "invalid_answer"),
    (Reply(text=""), "invalid_answer"),
    (Reply(stall=True), "timeout"),
])
def test_provider_failures_are_mapped_without_provider_text(settings, fake_llm, reply, category):
    fake_llm.add_rule(reply)
    with pytest.raises(LLMError) as info:
        call(make_client(settings, fake_llm, compaction_llm_timeout=0.5))
    assert info.value.category == category
    assert info.value.retryable is True
    assert "Rate limit" not in info.value.message and "json" not in info.value.message.lower()


def test_a_fenced_json_answer_is_parsed():
    assert parse_json_answer('```json\n{"summary": "s", "pinnedDecisions": []}\n```') == \
        {"summary": "s", "pinnedDecisions": []}


def test_response_formats_of_each_mode():
    schema = {"type": "object"}
    assert response_format_for("json_object_schema", schema, schema, "n") == {"type": "json_object", "schema": schema}
    assert response_format_for("json_object", schema, schema, "n") == {"type": "json_object"}
