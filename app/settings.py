"""Every environment variable of the contract, read and validated once.

``Settings.from_env()`` is the only place that reads ``os.environ`` for the
application; the web app, the Celery worker and the scripts all take a
``Settings`` value.  Invalid configuration raises ``ConfigError`` with one line
that says what to set (contract: Configuration).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
LOCAL_DIR = ROOT / ".local"
DEV_REDIS_URL = "redis://127.0.0.1:6380/0"  # the embedded store that `make run` starts


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable to set."""


def _int(env: dict, name: str, default: int, *, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def _float(env: dict, name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be positive, got {raw!r}")
    return value


def _flag(env: dict, name: str) -> bool:
    return env.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def mask_url(url: str) -> str:
    """``url`` with any password (everything between the user name and ``@``) replaced by ``***``.

    Works on malformed URLs too, so a message about a bad URL never shows its password::

        mask_url("rediss://:s3cret@host:6380")      == "rediss://:***@host:6380"
        mask_url("redis://user:s3cret@host/0")      == "redis://user:***@host/0"
        mask_url("redis://s3cret@host")             == "redis://***@host"   (a lone token may be a password)
    """
    head, at, rest = url.rpartition("@")
    if not at:
        return url
    scheme, slashes, userinfo = head.rpartition("//")
    user, colon, _password = userinfo.partition(":")
    return f"{scheme}{slashes}{user + ':***' if colon else '***'}@{rest}"


def _check_url(name: str, url: str, schemes: set[str]) -> str:
    """Raise ``ConfigError`` (password masked) unless ``url`` has one of ``schemes``, a host and a valid port."""
    allowed = " or ".join(sorted(f"{s}://" for s in schemes))
    parsed = urlparse(url)
    if parsed.scheme not in schemes or not parsed.hostname or any(c.isspace() for c in url):
        raise ConfigError(f"{name} is not a valid URL ({mask_url(url)!r}): set {name} to a URL starting "
                          f"with {allowed} that names a host")
    try:
        parsed.port  # raises ValueError for a non-numeric or out-of-range port
    except ValueError:
        raise ConfigError(f"{name} has an invalid port ({mask_url(url)!r}): set {name} with a port "
                          "between 1 and 65535") from None
    if parsed.scheme in {"redis", "rediss"} and parsed.path.strip("/") and not parsed.path.strip("/").isdigit():
        raise ConfigError(f"{name} has an invalid database number ({mask_url(url)!r}): the path must be "
                          "empty or /<number>, for example redis://host:6379/0")
    return url


def _compaction_strategy(env: dict) -> str:
    """``COMPACTION_STRATEGY``: ``llm`` (default) or ``extractive`` (no model call; issue 4 item 7)."""
    value = (env.get("COMPACTION_STRATEGY") or "llm").strip().lower() or "llm"
    if value not in {"llm", "extractive"}:
        raise ConfigError(f"COMPACTION_STRATEGY must be llm or extractive, got {value!r}")
    return value


def dev_secret_key() -> str:
    """Return the development secret (64 hex characters), generating it once into ``.local/secret_key`` (mode 0600)."""
    path = LOCAL_DIR / "secret_key"
    try:
        existing = path.read_text().strip()
        if len(existing) >= 32:
            return existing
    except OSError:
        pass
    key = secrets.token_hex(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(key)
    path.chmod(0o600)
    return key


@dataclass(frozen=True)
class MemoryLimits:
    """Bounds of one ThreadState (contract: ThreadState, Configuration).

    Attributes:
        recent_turns: whole user+assistant turns kept verbatim (default 4 = 8 messages).
        summary_max_chars: longest summary, in characters (2500).
        pinned_max: most pinned decisions (20).
        pinned_max_chars: longest pinned decision, in characters (300).
        delivery_final_max_chars: longest delivery-chain final report kept, in characters (8000).
        compact_batch_turns: whole turns beyond the recent window that must accumulate
            before a compaction is due (1, the seed's behaviour).
    """

    recent_turns: int = 4
    summary_max_chars: int = 2500
    pinned_max: int = 20
    pinned_max_chars: int = 300
    delivery_final_max_chars: int = 8000
    compact_batch_turns: int = 1


@dataclass(frozen=True)
class Settings:
    """The application's configuration; build it with ``Settings.from_env()``."""

    env: str = "development"
    redis_url: str = DEV_REDIS_URL
    secret_key: str = ""
    openai_api_key: str | None = None
    openai_base_url: str | None = None
    chat_model: str = "gpt-4o-mini"
    compaction_model: str = "gpt-4o-mini"
    tokenizer_encoding: str | None = None
    model_context_tokens: int = 8192
    reserved_output_tokens: int = 1024
    limits: MemoryLimits = field(default_factory=MemoryLimits)
    memory_ttl_seconds: int = 604800
    max_input_chars: int = 12000
    allowed_origins: tuple[str, ...] = ()
    port: int = 5000
    flower_basic_auth: str | None = None
    system_prompt: str = (
        "You are a helpful assistant. Answer in the language the person writes in. "
        "Earlier parts of the conversation may be given to you as a summary and as pinned decisions; "
        "treat them as things the person already told you."
    )
    llm_connect_timeout: float = 5.0
    llm_read_timeout: float = 30.0
    llm_turn_timeout: float = 60.0
    llm_max_retries: int = 2
    compaction_time_limit: int = 120
    # Compaction (issue 4): strategy, the model call's timeout (seconds), bounded retries with
    # exponential backoff (base seconds), and an optional broker visibility timeout (seconds; 0 = derived).
    compaction_strategy: str = "llm"
    compaction_llm_timeout: float = 90.0
    compaction_max_retries: int = 3
    compaction_retry_backoff: float = 10.0
    compaction_visibility_timeout: int = 0
    web_threads: int = 64
    redis_socket_timeout: float = 2.0
    debug_log_content: bool = False
    bundled_model: bool = False
    metrics_token: str | None = None
    # Issue 6: offer the built-in tools to the chat model (TOOLS_ENABLED, default on; "0"/"false"/"no"/"off"
    # turn them off).  A provider that rejects tools gets plain chat whatever this says.
    tools_enabled: bool = True

    @property
    def production(self) -> bool:
        """True when ``APP_ENV=production``."""
        return self.env == "production"

    @property
    def prompt_budget(self) -> int:
        """Tokens the assembled prompt may use: context window minus reserved output."""
        return self.model_context_tokens - self.reserved_output_tokens

    def with_overrides(self, **changes) -> "Settings":
        """Return a copy with some fields replaced (used by tests and scripts)."""
        return replace(self, **changes)

    @classmethod
    def from_env(cls, environ: dict | None = None) -> "Settings":
        """Read and validate the contract's variables.

        Args:
            environ: mapping to read instead of ``os.environ``.

        Raises:
            ConfigError: a variable is malformed, or production lacks ``SECRET_KEY``.
        """
        env = dict(os.environ if environ is None else environ)
        app_env = env.get("APP_ENV", "development").strip().lower() or "development"
        if app_env not in {"development", "production", "test"}:
            raise ConfigError(f"APP_ENV must be development, production or test, got {app_env!r}")
        production = app_env == "production"

        redis_url = (env.get("REDIS_TLS_URL") or env.get("REDIS_URL") or "").strip() or None
        if redis_url:
            name = "REDIS_TLS_URL" if env.get("REDIS_TLS_URL") else "REDIS_URL"
            _check_url(name, redis_url, {"redis", "rediss", "unix"} - {"unix"})
        elif production:
            raise ConfigError("REDIS_URL is not set: set REDIS_TLS_URL or REDIS_URL in production "
                              "(for example rediss://:password@host:6380)")
        else:
            redis_url = DEV_REDIS_URL

        secret = env.get("SECRET_KEY", "").strip()
        if production and len(secret) < 32:
            raise ConfigError(("SECRET_KEY is not set" if not secret else "SECRET_KEY is too short") +
                              ": set SECRET_KEY to at least 32 random characters in production "
                              "(python -c 'import secrets; print(secrets.token_hex(32))')")
        if not secret:
            secret = dev_secret_key()

        base_url = (env.get("OPENAI_BASE_URL") or "").strip() or None
        if base_url:
            _check_url("OPENAI_BASE_URL", base_url, {"http", "https"})
        elif production and not (env.get("OPENAI_API_KEY") or "").strip():
            # No model process runs in production: without a provider every turn would fail.
            raise ConfigError("OPENAI_API_KEY is not set: set OPENAI_API_KEY (and OPENAI_BASE_URL for a "
                              "provider other than OpenAI) in production")

        context_tokens = _int(env, "MODEL_CONTEXT_TOKENS", 8192, minimum=256)
        reserved = _int(env, "RESERVED_OUTPUT_TOKENS", 1024, minimum=1)
        if reserved >= context_tokens:
            raise ConfigError("RESERVED_OUTPUT_TOKENS must be smaller than MODEL_CONTEXT_TOKENS")

        limits = MemoryLimits(
            recent_turns=_int(env, "MEMORY_RECENT_TURNS", 4, minimum=1),
            summary_max_chars=_int(env, "MEMORY_SUMMARY_MAX_CHARS", 2500, minimum=100),
            pinned_max=_int(env, "MEMORY_PINNED_MAX", 20, minimum=1),
            pinned_max_chars=_int(env, "MEMORY_PINNED_MAX_CHARS", 300, minimum=10),
            delivery_final_max_chars=_int(env, "DELIVERY_FINAL_MAX_CHARS", 8000, minimum=200),
            compact_batch_turns=_int(env, "MEMORY_COMPACT_BATCH_TURNS", 1, minimum=1),
        )
        port = _int(env, "PORT", 5000, minimum=1)
        origins = tuple(o.strip().rstrip("/") for o in env.get("ALLOWED_ORIGINS", "").split(",") if o.strip())
        for origin in origins:
            _check_url("ALLOWED_ORIGINS", origin, {"http", "https"})

        flower_auth = (env.get("FLOWER_BASIC_AUTH") or "").strip() or None
        if flower_auth and ":" not in flower_auth:
            raise ConfigError("FLOWER_BASIC_AUTH must look like user:password")

        default_model = "gpt-4o-mini"
        chat_model = (env.get("CHAT_MODEL") or "").strip() or default_model
        return cls(
            env=app_env,
            redis_url=redis_url,
            secret_key=secret,
            openai_api_key=(env.get("OPENAI_API_KEY") or "").strip() or None,
            openai_base_url=base_url,
            chat_model=chat_model,
            compaction_model=(env.get("COMPACTION_MODEL") or "").strip() or chat_model,
            tokenizer_encoding=(env.get("TOKENIZER_ENCODING") or "").strip() or None,
            model_context_tokens=context_tokens,
            reserved_output_tokens=reserved,
            limits=limits,
            memory_ttl_seconds=_int(env, "MEMORY_TTL_SECONDS", 604800, minimum=60),
            max_input_chars=_int(env, "MAX_INPUT_CHARS", 12000, minimum=1),
            allowed_origins=origins,
            port=port,
            flower_basic_auth=flower_auth,
            llm_connect_timeout=_float(env, "LLM_CONNECT_TIMEOUT_SECONDS", 5.0),
            llm_read_timeout=_float(env, "LLM_READ_TIMEOUT_SECONDS", 30.0),
            llm_turn_timeout=_float(env, "LLM_TURN_TIMEOUT_SECONDS", 60.0),
            llm_max_retries=_int(env, "LLM_MAX_RETRIES", 2),
            compaction_time_limit=_int(env, "COMPACTION_TIME_LIMIT_SECONDS", 120, minimum=5),
            compaction_strategy=_compaction_strategy(env),
            compaction_llm_timeout=_float(env, "COMPACTION_LLM_TIMEOUT_SECONDS", 90.0),
            compaction_max_retries=_int(env, "COMPACTION_MAX_RETRIES", 3),
            compaction_retry_backoff=_float(env, "COMPACTION_RETRY_BACKOFF_SECONDS", 10.0),
            compaction_visibility_timeout=_int(env, "COMPACTION_VISIBILITY_TIMEOUT_SECONDS", 0),
            web_threads=_int(env, "WEB_THREADS", 64, minimum=1),
            redis_socket_timeout=_float(env, "REDIS_SOCKET_TIMEOUT_SECONDS", 2.0),
            debug_log_content=_flag(env, "MEMORY_DEBUG_LOG_CONTENT"),
            bundled_model=_flag(env, "BUNDLED_MODEL"),
            metrics_token=(env.get("METRICS_TOKEN") or "").strip() or None,
            tools_enabled=env.get("TOOLS_ENABLED", "").strip().lower() not in {"0", "false", "no", "off"},
        )
