"""Shared fixtures: a real Redis, settings, the store.  More fixtures live in ``tests/fixtures/``."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("APP_ENV", "test")

# Helpers imported by the test modules get pytest's assertion messages too (fixture plugins get them anyway).
pytest.register_assert_rewrite("tests.helpers", "tests.fixtures.deployed_web", "chat_support")

pytest_plugins = [
    "tests.fixtures.lanes",  # first: the other fixture modules import it
    "tests.fixtures.redis_server",
    "tests.fixtures.live_app",
    "tests.fixtures.streamed_chat",
    "tests.fixtures.celery_worker",
    "tests.fixtures.redis_cluster",
    "tests.fixtures.own_redis",
    "tests.fixtures.redis_proxy",
    "tests.fixtures.processes",
    "pytester",  # tests/test_lanes.py runs a small suite of its own
]

from app.settings import MemoryLimits, Settings  # noqa: E402


@pytest.fixture
def settings(redis_url, tmp_path):
    """Test settings: the test Redis, a fixed secret, a fake model name (cl100k_base tokenizer)."""
    return Settings(
        env="test",
        redis_url=redis_url,
        secret_key="t" * 64,
        openai_api_key="test-key",
        openai_base_url="http://127.0.0.1:9/v1",
        chat_model="fake-chat",
        compaction_model="fake-compact",
        limits=MemoryLimits(),
    )


@pytest.fixture
def store(settings):
    """A ThreadStore on the flushed test database."""
    from app.store.redis_client import make_redis
    from app.store.thread_store import ThreadStore

    client = make_redis(settings.redis_url)
    yield ThreadStore(client, settings.limits, settings.memory_ttl_seconds)
    client.close()
