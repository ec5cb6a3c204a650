"""``COMPACTION_BASE_URL``: compaction calls may go to an endpoint of their own (docs/bundled-model.md).

With the bundled model, ``make run`` points it at a second model server so chat turns never queue behind a
compaction; unset, compaction uses ``OPENAI_BASE_URL`` as before.  Two fake OpenAI-compatible servers over real
HTTP stand for the two endpoints.
"""

from __future__ import annotations

import pytest

from app.llm.structured import StructuredClient, compaction_endpoint
from app.settings import ConfigError, Settings
from app.store.provider_caps import ProviderCaps
from app.store.redis_client import make_redis
from chat_support.fake_llm import FakeLLM, Reply

ANSWER = {"summary": "They talked.", "pinnedDecisions": []}
PROMPT = [{"role": "user", "content": "fold these"}]
SCHEMA = {"type": "object", "properties": {"summary": {"type": "string"},
                                          "pinnedDecisions": {"type": "array", "items": {"type": "string"}}},
          "required": ["summary", "pinnedDecisions"], "additionalProperties": False}


def call(settings: Settings):
    """One compaction call as the worker makes it: the compaction client, its record of refused modes in Redis."""
    record = ProviderCaps(make_redis(settings.redis_url), compaction_endpoint(settings))
    return StructuredClient.for_compaction(settings, record).complete_json(PROMPT, schema=SCHEMA, strict_schema=SCHEMA)


def test_compaction_calls_go_to_the_compaction_endpoint_only(settings):
    with FakeLLM(Reply(text="chat")) as chat, FakeLLM(Reply(json=ANSWER)) as compaction:
        answer = call(settings.with_overrides(openai_base_url=chat.url, compaction_base_url=compaction.url))
        assert answer.data == ANSWER
        assert (len(chat.chat_requests()), len(compaction.chat_requests())) == (0, 1)


def test_without_it_compaction_uses_the_chat_endpoint(settings):
    with FakeLLM(Reply(json=ANSWER)) as chat:
        assert call(settings.with_overrides(openai_base_url=chat.url)).data == ANSWER
        assert len(chat.chat_requests()) == 1


def test_the_setting_is_read_and_checked():
    base = {"APP_ENV": "test", "SECRET_KEY": "s" * 64, "OPENAI_BASE_URL": "http://127.0.0.1:8089/v1"}
    assert Settings.from_env(base).compaction_base_url is None
    assert Settings.from_env({**base, "COMPACTION_BASE_URL": " "}).compaction_base_url is None
    assert Settings.from_env({**base, "COMPACTION_BASE_URL": "http://127.0.0.1:8090/v1"}).compaction_base_url == \
        "http://127.0.0.1:8090/v1"
    with pytest.raises(ConfigError, match=r"^COMPACTION_BASE_URL is not a valid URL \('ftp://x'\)"):
        Settings.from_env({**base, "COMPACTION_BASE_URL": "ftp://x"})
