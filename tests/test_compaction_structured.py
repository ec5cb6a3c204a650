"""The structured compaction call (``app.llm.structured``) against the fake LLM over real HTTP and a real Redis."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from app.llm.provider import LLMError
from app.llm.structured import StructuredClient, parse_json_answer, response_format_for
from app.settings import MemoryLimits
from app.store.keys import provider_caps_key
from app.store.provider_caps import CAPS_TTL_SECONDS, ProviderCaps
from app.store.redis_client import make_redis
from chat_support.fake_llm import FakeLLM, Reply

LIMITS = MemoryLimits()
ANSWER = {"summary": "They talked.", "pinnedDecisions": ["Use tea"]}
PROMPT = [{"role": "system", "content": "Answer JSON."}, {"role": "user", "content": "fold these"}]


def make_client(settings, llm: FakeLLM, **overrides) -> StructuredClient:
    """A compaction client of its own (as another process would have); its record of refused modes is
    the provider's ``ProviderCaps`` in the test Redis."""
    values = {"openai_base_url": llm.url, "compaction_llm_timeout": 2.0, **overrides}
    client_settings = settings.with_overrides(**values)
    record = ProviderCaps(make_redis(client_settings.redis_url), client_settings.openai_base_url)
    return StructuredClient.for_compaction(client_settings, record)


def schema(*, with_lengths: bool = True) -> dict:
    """A ``{summary, pinnedDecisions}`` schema with lengths as large as a ThreadState's (2500, 20 of 300)."""
    summary: dict = {"type": "string"}
    item: dict = {"type": "string"}
    pins: dict = {"type": "array", "items": item}
    if with_lengths:
        summary["maxLength"], item["maxLength"], pins["maxItems"] = 2500, 300, 20
    return {"type": "object", "properties": {"summary": summary, "pinnedDecisions": pins},
            "required": ["summary", "pinnedDecisions"], "additionalProperties": False}


def call(client: StructuredClient):
    return client.complete_json(PROMPT, schema=schema(), strict_schema=schema(with_lengths=False))


def test_json_schema_mode_at_temperature_zero_without_streaming(settings, fake_llm):
    fake_llm.add_rule(Reply(json=ANSWER))
    answer = call(make_client(settings, fake_llm))
    assert (answer.data, answer.mode) == (ANSWER, "json_schema")
    body = fake_llm.last_request().body
    assert (body["model"], body["temperature"], body.get("stream", False)) == ("fake-compact", 0, False)
    assert "max_tokens" not in body
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


# ------------------------------------------------------------------------------------------ one record, one ladder


def test_what_one_process_learned_is_known_to_another(settings, fake_llm, redis_client):
    fake_llm.reject_json_schema = True
    fake_llm.add_rule(Reply(json=ANSWER))
    assert call(make_client(settings, fake_llm)).mode == "json_object_schema"
    assert redis_client.hgetall(provider_caps_key(fake_llm.url)) == {"json_schema": "1"}
    assert 0 < redis_client.ttl(provider_caps_key(fake_llm.url)) <= CAPS_TTL_SECONDS
    # a client of another process, with its own connections, starts where the first one ended
    assert call(make_client(settings, fake_llm)).mode == "json_object_schema"
    # and so does a client of another model on the same provider (the runtime's)
    runtime = StructuredClient(make_client(settings, fake_llm).client, model="fake-chat",
                               record=ProviderCaps(redis_client, fake_llm.url))
    assert runtime.complete_json(PROMPT, schema={"type": "object"}, strict_schema={"type": "object"}).mode == \
        "json_object_schema"
    assert [(r.model, r.response_format["type"]) for r in fake_llm.chat_requests()] == [
        ("fake-compact", "json_schema"), ("fake-compact", "json_object"), ("fake-compact", "json_object"),
        ("fake-chat", "json_object")]


def test_with_redis_down_the_ladder_starts_at_the_top_and_still_answers(settings, fake_llm):
    fake_llm.reject_json_schema = True
    fake_llm.add_rule(Reply(json=ANSWER))
    down = make_redis("redis://127.0.0.1:9/0", socket_timeout=0.5)  # nothing listens there
    client = StructuredClient.for_compaction(settings.with_overrides(openai_base_url=fake_llm.url),
                                             ProviderCaps(down, fake_llm.url))
    assert call(client).data == ANSWER
    assert call(client).mode == "json_object_schema"
    assert [r.response_format["type"] for r in fake_llm.chat_requests()] == ["json_schema", "json_object"] * 2


class Verdict(BaseModel):
    verdict: Literal["yes", "no"]
    note: str = Field(max_length=5000)


def test_ask_sends_the_models_schema_and_validates_with_it(settings, fake_llm):
    fake_llm.reject_json_schema = True
    fake_llm.add_rule(Reply(json={"verdict": "maybe", "note": "n"}), times=1)
    fake_llm.add_rule(Reply(text='```json\n{"verdict": "yes", "note": "fine"}\n```'))
    client = make_client(settings, fake_llm)
    assert client.ask(PROMPT, Verdict, name="verdict") == Verdict(verdict="yes", note="fine")
    first, second, third = fake_llm.chat_requests()
    schema = {"type": "object", "required": ["verdict", "note"], "additionalProperties": False,
              "properties": {"verdict": {"type": "string", "enum": ["yes", "no"]},
                             "note": {"type": "string", "maxLength": 5000}}}
    assert first.response_format["json_schema"] == {"name": "verdict", "strict": True, "schema": {
        **schema, "properties": {**schema["properties"], "note": {"type": "string"}}}}
    # the grammar mode leaves out a maxLength llama.cpp would refuse; the prompt names the real limit
    assert second.response_format == {"type": "json_object", "schema": {
        **schema, "properties": {**schema["properties"], "note": {"type": "string"}}}}
    assert json.loads(second.messages[-1]["content"].split("\n", 1)[1]) == schema
    assert third.messages[-1]["role"] == "user" and "verdict: Input should be 'yes' or 'no'" in \
        third.messages[-1]["content"]


def test_ask_fails_after_two_unusable_answers(settings, fake_llm):
    fake_llm.add_rule(Reply(text="I would rather not."))
    with pytest.raises(LLMError) as info:
        make_client(settings, fake_llm).ask(PROMPT, Verdict)
    assert (info.value.category, info.value.message) == (
        "invalid_answer", "The model's answer could not be used. Please try again.")
    assert len(fake_llm.chat_requests()) == 2
    assert "the answer is not JSON" in fake_llm.chat_requests()[1].messages[-1]["content"]


def test_an_answer_may_be_capped_in_tokens(settings, fake_llm):
    fake_llm.add_rule(Reply(json={"verdict": "no", "note": "short"}))
    client = make_client(settings, fake_llm)
    client.complete_json(PROMPT, schema={"type": "object"}, strict_schema={"type": "object"}, max_tokens=700)
    assert client.ask(PROMPT, Verdict, max_tokens=50) == Verdict(verdict="no", note="short")
    assert [r.body["max_tokens"] for r in fake_llm.chat_requests()] == [700, 50]


def test_the_services_compaction_and_runtime_clients_share_the_providers_record(settings, fake_llm):
    from app.extensions import Services

    services = Services(settings.with_overrides(openai_base_url=fake_llm.url, compaction_llm_timeout=2.0))
    fake_llm.reject_json_schema = True
    fake_llm.add_rule(Reply(json={"verdict": "yes", "note": "ok"}))
    assert call(services.compaction_llm).mode == "json_object_schema"
    assert services.provider_caps.refused() == {"json_schema"}
    assert services.structured.ask(PROMPT, Verdict) == Verdict(verdict="yes", note="ok")
    assert [(r.model, r.response_format["type"]) for r in fake_llm.chat_requests()] == [
        ("fake-compact", "json_schema"), ("fake-compact", "json_object"), ("fake-chat", "json_object")]
    services.redis.close()
