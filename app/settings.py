"""Every environment variable of the contract, read and validated once (docs/contract.md: Configuration).

``Settings.from_env()`` is the only place that reads ``os.environ`` for the
application; the web app, the Celery worker and the scripts all take a
``Settings`` value.  ``Settings(...)`` with keyword arguments (field names)
reads no environment: it takes its arguments and the defaults, and validates
them.  Invalid configuration raises ``ConfigError`` with one line that says
what to set.

Each field declares its variable, its one default and its bounds; to add a
setting, add a field (and, for a bound of ThreadState, a ``MemoryLimits`` field
in ``app/memory/limits.py`` plus its line in ``LIMIT_VARIABLES``).
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from app.memory.limits import MemoryLimits

log = logging.getLogger(__name__)

DEPRECATED_TURN_TIMEOUT = "LLM_TURN_TIMEOUT_SECONDS"
"""Read as ``LLM_FIRST_TOKEN_TIMEOUT_SECONDS`` (with a logged warning) when that one is not set."""

__all__ = ["DOCUMENTED", "GROUPS", "ConfigError", "DEV_REDIS_URL", "Documented", "LIMIT_VARIABLES", "LOCAL_DIR",
           "MemoryLimits", "ROOT", "Settings", "dev_secret_key", "mask_url"]

ROOT = Path(__file__).resolve().parent.parent
LOCAL_DIR = ROOT / ".local"
DEV_REDIS_URL = "redis://127.0.0.1:6380/0"  # the embedded store that `make run` starts

# MemoryLimits field -> its variable (defaults and minimums live in MemoryLimits).
LIMIT_VARIABLES = {
    "recent_turns": "MEMORY_RECENT_TURNS",
    "summary_max_chars": "MEMORY_SUMMARY_MAX_CHARS",
    "pinned_max": "MEMORY_PINNED_MAX",
    "pinned_max_chars": "MEMORY_PINNED_MAX_CHARS",
    "delivery_final_max_chars": "DELIVERY_FINAL_MAX_CHARS",
    "compact_batch_turns": "MEMORY_COMPACT_BATCH_TURNS",
    "archive_max_turns": "MEMORY_ARCHIVE_MAX_TURNS",
    "archive_max_bytes": "MEMORY_ARCHIVE_MAX_BYTES",
    "recall_share": "MEMORY_RECALL_SHARE",
}

BUNDLED_FOLD_STEP = 4
"""``MEMORY_PROMPT_FOLD_STEP=auto`` with the bundled model: folded turns enter the prompt's record 4 at a time."""

BUNDLED_RECALL_MAX_TOKENS = 160
"""Recall's cap with the bundled model (``MEMORY_RECALL_MAX_TOKENS=auto``): on this project's 2-core machine the
chat server reads about 140 prompt tokens a second, so 160 recalled tokens add about a second before the first
token (docs/bundled-model.md: The bundled model)."""

BUNDLED_ANSWER_MAX_TOKENS = 224
"""An answer's token cap with the bundled model (``ANSWER_MAX_TOKENS=auto``): an answer should end within about
15 s on this project's 2-core machine.  Measured on a quiet machine, the chat server writes about 26 tokens a
second with 1 decode thread at a short context and about 16 at 2,500 tokens of context (about 44 and 27 with 2
decode threads), so 224 tokens take at most about 14 s (1 thread, long context), 8.6 s at a short one, and 5-8 s
with 2 decode threads; the system prompt asks for short answers, so most end well before the cap."""

BUNDLED_PROMPT_ANSWER_MAX_TOKENS = 96
"""How much of each earlier answer the prompt shows with the bundled model (``MEMORY_PROMPT_ANSWER_MAX_TOKENS=auto``):
a longer answer is shown as its beginning and `` […]`` (``app.memory.context.shorten_answer``; the stored turn
and the archive keep every word).  With up to 7 answers in a prompt (4 recent turns, 3 held back by the fold
step) that bounds them at about 670 tokens, about 5 s of reading at 140 prompt tokens a second, where 7 capped
answers of 224 tokens would take about 11 s after a fold rebuilds the prompt."""

DEFAULT_SYSTEM_PROMPT = (
    "You are a friendly assistant in a chat. Reply to the person's latest message directly and briefly: usually "
    "one to three sentences, a short list only when they ask for one. Write in the language of their latest "
    "message. Never repeat yourself and never quote earlier messages back. "
    "Decisions the person pinned are theirs: keep to them."
)
"""The chat's system prompt (docs/memory.md: A turn).  Short answers in the person's language, and nothing about
memory: the record and the recalled excerpts frame themselves as data in their own messages
(``app.memory.context.RECORD_HEADER``, ``app.memory.recall.RECALL_HEADER``).  With the bundled 0.5B model, talk of
"a record of earlier parts of the conversation" was echoed as its answer ("Here's a record of what I wrote ..."),
and naming the memory tags here made some conversations answer every turn as "Record: ... Recalled: ..." from the
first turn on, copying that form ever after (docs/benchmarks.md: Performance, 6 Dec)."""


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable to set."""


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


def _checked_url(url: str, schemes: set[str]) -> str:
    """``url`` unchanged, or ``PydanticCustomError`` (``url_invalid``, ``url_port``, ``url_database``;
    the context holds the masked URL) unless it has one of ``schemes``, a host and a valid port."""
    masked = mask_url(url)
    allowed = " or ".join(sorted(f"{s}://" for s in schemes))
    parsed = urlparse(url)
    if parsed.scheme not in schemes or not parsed.hostname or any(c.isspace() for c in url):
        raise PydanticCustomError("url_invalid", "not a valid URL ({masked})", {"masked": masked, "allowed": allowed})
    try:
        _ = parsed.port  # raises ValueError for a non-numeric or out-of-range port
    except ValueError:
        raise PydanticCustomError("url_port", "invalid port ({masked})", {"masked": masked}) from None
    path = parsed.path.strip("/")
    if parsed.scheme in {"redis", "rediss"} and path and not path.isdigit():
        raise PydanticCustomError("url_database", "invalid database number ({masked})", {"masked": masked})
    return url


# Error type -> the one line of ConfigError; {variable} is the variable's name, {input} the raw value.
# Errors of other types (model-level checks) carry their line as their message.
_MESSAGES = {
    "int_parsing": "{variable} must be an integer, got {input!r}",
    "int_from_float": "{variable} must be an integer, got {input!r}",
    "greater_than_equal": "{variable} must be at least {ge}, got {input}",
    "float_parsing": "{variable} must be a number, got {input!r}",
    "greater_than": "{variable} must be positive, got {input!r}",
    "bool_parsing": "{variable} must be true or false (1/0, yes/no, on/off), got {input!r}",
    "literal_error": "{variable} must be {choices}, got {input!r}",
    "url_invalid": "{variable} is not a valid URL ({masked!r}): set {variable} to a URL starting with {allowed} "
                   "that names a host",
    "url_port": "{variable} has an invalid port ({masked!r}): set {variable} with a port between 1 and 65535",
    "url_database": "{variable} has an invalid database number ({masked!r}): the path must be empty or "
                    "/<number>, for example redis://host:6379/0",
}


def _config_error(error: Mapping[str, Any]) -> ConfigError:
    """The ``ConfigError`` for one pydantic error of ``Settings.from_env`` (its location names the variable)."""
    loc = error["loc"]
    variable = LIMIT_VARIABLES.get(str(loc[1]), "") if loc[:1] == ("limits",) and len(loc) > 1 \
        else (str(loc[0]) if loc else "")
    template = _MESSAGES.get(error["type"])
    if template is None or not variable:
        return ConfigError(error["msg"])
    ctx = dict(error.get("ctx") or {})
    if error["type"] == "literal_error":
        ctx["choices"] = str(ctx.get("expected", "")).replace("'", "")
    return ConfigError(template.format(variable=variable, input=error.get("input"), **ctx))


def _variables(field: FieldInfo) -> list[str]:
    """The environment variables a field reads, first match wins (none: not configurable)."""
    alias = field.validation_alias
    if isinstance(alias, str):
        return [alias]
    if isinstance(alias, AliasChoices):
        return [choice for choice in alias.choices if isinstance(choice, str)]
    return []


class EnvironmentSource(PydanticBaseSettingsSource):
    """The configuration variables of one environment mapping, by the fields' aliases.

    Values are stripped and a blank value counts as unset; ``LIMIT_VARIABLES`` become
    the ``limits`` field.  Variables the settings do not declare are ignored.
    """

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]):
        super().__init__(settings_cls)
        self.variables = {name: value.strip() for name, value in environ.items()
                          if isinstance(value, str) and value.strip()}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        for name in _variables(field):
            if name in self.variables:
                return self.variables[name], name, False
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for field_name, field in self.settings_cls.model_fields.items():
            value, key, _complex = self.get_field_value(field, field_name)
            if value is not None:
                values[key] = value
        limits = {name: self.variables[var] for name, var in LIMIT_VARIABLES.items() if var in self.variables}
        if limits:
            values["limits"] = limits
        return values


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


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")

# Production defaults of the per-client budgets (docs/deployment.md: "Budgets").
QUOTA_DEFAULTS = {
    "ws_max_per_client": 16,            # open websockets of one network address, over every web process
    "ws_new_per_minute": 30,            # new websockets of one address per minute
    "turns_per_minute_per_client": 30,  # turns of one address per minute
    "turns_per_minute_per_session": 12,  # turns of one session per minute
    "sessions_per_hour_per_client": 60,  # new sessions (cookies) handed to one address per hour
    "api_writes_per_minute": 120,       # pin, note, feedback and clear requests of one address per minute
}


@dataclass(frozen=True)
class ClientQuotas:
    """The per-client budgets in force (``Settings.client_quotas``); 0 is no limit."""

    ws_max_per_client: int
    ws_new_per_minute: int
    turns_per_minute_per_client: int
    turns_per_minute_per_session: int
    sessions_per_hour_per_client: int
    api_writes_per_minute: int


def _host_name(host: str) -> str:
    """A ``Host`` header's name: lowercase, without the port (an IPv6 literal keeps its brackets)."""
    host = (host or "").strip().lower()
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class Settings(BaseSettings):
    """The application's configuration: build it with ``Settings.from_env()`` (or keyword arguments in tests).

    Frozen and hashable.  Durations are seconds, sizes characters or tokens as named.

    Raises:
        pydantic.ValidationError: a keyword argument is malformed (``from_env`` raises ``ConfigError``).
    """

    model_config = SettingsConfigDict(frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True,
                                      hide_input_in_errors=True)

    env: Literal["development", "production", "test"] = Field("development", validation_alias="APP_ENV")
    redis_url: str = Field(DEV_REDIS_URL, validation_alias=AliasChoices("REDIS_TLS_URL", "REDIS_URL"), repr=False)
    # REDIS_URL names one seed node of a Redis Cluster (docs/scale-out.md).
    redis_cluster: bool = Field(False, validation_alias="REDIS_CLUSTER")
    # The Celery broker; None: the store's Redis (not allowed with REDIS_CLUSTER).
    celery_broker_url: str | None = Field(None, validation_alias="CELERY_BROKER_URL", repr=False)
    # After a memory write, WAIT for this many replicas, at most MEMORY_WAIT_TIMEOUT_MS milliseconds.
    memory_wait_replicas: int = Field(0, validation_alias="MEMORY_WAIT_REPLICAS", ge=0)
    memory_wait_timeout_ms: int = Field(100, validation_alias="MEMORY_WAIT_TIMEOUT_MS", ge=1)
    secret_key: str = Field("", validation_alias="SECRET_KEY", repr=False)
    openai_api_key: str | None = Field(None, validation_alias="OPENAI_API_KEY", repr=False)
    openai_base_url: str | None = Field(None, validation_alias="OPENAI_BASE_URL")
    # Where compaction calls go (the bundled model's second server); None: OPENAI_BASE_URL.
    compaction_base_url: str | None = Field(None, validation_alias="COMPACTION_BASE_URL")
    chat_model: str = Field("gpt-4o-mini", validation_alias="CHAT_MODEL")
    compaction_model: str = Field("gpt-4o-mini", validation_alias="COMPACTION_MODEL")  # from_env: CHAT_MODEL
    tokenizer_encoding: str | None = Field(None, validation_alias="TOKENIZER_ENCODING")
    model_context_tokens: int = Field(8192, validation_alias="MODEL_CONTEXT_TOKENS", ge=256)
    reserved_output_tokens: int = Field(1024, validation_alias="RESERVED_OUTPUT_TOKENS", ge=1)
    # Most tokens an answer may take (``answer_max_tokens``); None: auto = BUNDLED_ANSWER_MAX_TOKENS with the
    # bundled model, RESERVED_OUTPUT_TOKENS otherwise; never above RESERVED_OUTPUT_TOKENS.
    answer_max_tokens_setting: int | None = Field(None, validation_alias="ANSWER_MAX_TOKENS", ge=16)
    # How much of each earlier answer a prompt shows (``prompt_answer_max_tokens``); None: auto =
    # BUNDLED_PROMPT_ANSWER_MAX_TOKENS with the bundled model, no limit otherwise; 0: no limit.
    prompt_answer_max_tokens_setting: int | None = Field(None, validation_alias="MEMORY_PROMPT_ANSWER_MAX_TOKENS",
                                                         ge=0)
    limits: MemoryLimits = Field(default_factory=MemoryLimits)  # from LIMIT_VARIABLES
    memory_ttl_seconds: int = Field(604800, validation_alias="MEMORY_TTL_SECONDS", ge=60)
    # Each process's memory (docs/benchmarks.md: Performance): caches bounded in bytes; 0 keeps nothing.
    # The token-count cache (texts at most 64 KiB each are kept; a refused input never) and the tokenised
    # archives (a full archive of MEMORY_ARCHIVE_MAX_BYTES=2000000 takes about 30 MB).
    token_cache_max_bytes: int = Field(16 * 1024 * 1024, validation_alias="TOKEN_CACHE_MAX_BYTES", ge=0)
    archive_cache_max_bytes: int = Field(64 * 1024 * 1024, validation_alias="ARCHIVE_CACHE_MAX_BYTES", ge=0)
    max_input_chars: int = Field(12000, validation_alias="MAX_INPUT_CHARS", ge=1)
    allowed_origins: tuple[str, ...] = Field((), validation_alias="ALLOWED_ORIGINS")  # comma-separated
    port: int = Field(5000, validation_alias="PORT", ge=1)
    flower_basic_auth: str | None = Field(None, validation_alias="FLOWER_BASIC_AUTH", repr=False)
    system_prompt: str = DEFAULT_SYSTEM_PROMPT  # not configurable
    llm_connect_timeout: float = Field(5.0, validation_alias="LLM_CONNECT_TIMEOUT_SECONDS", gt=0)
    llm_read_timeout: float = Field(30.0, validation_alias="LLM_READ_TIMEOUT_SECONDS", gt=0)
    # A turn's clock measures silence, not length (docs/contract.md: Configuration): the wait for the answer's
    # first text (through retries; keep-alive, progress and wait events do not count as text)...
    # LLM_TURN_TIMEOUT_SECONDS (once a total-time limit) is read as a deprecated alias of it, with a warning.
    llm_first_token_timeout: float = Field(90.0, validation_alias=AliasChoices(
        "LLM_FIRST_TOKEN_TIMEOUT_SECONDS", "LLM_TURN_TIMEOUT_SECONDS"), gt=0, le=3600)
    # ...and, once text flows, the longest silence between two pieces of it.  The answer's length is bounded
    # by tokens only (``app.llm.sampling.answer_options``).
    llm_token_gap_timeout: float = Field(30.0, validation_alias="LLM_TOKEN_GAP_TIMEOUT_SECONDS", gt=0, le=3600)
    llm_max_retries: int = Field(2, validation_alias="LLM_MAX_RETRIES", ge=0)
    # Least time between two delta frames of one answer (the first token is sent at once); 0: one frame per read.
    stream_flush_interval: float = Field(0.02, validation_alias="STREAM_FLUSH_INTERVAL_SECONDS", ge=0, le=1)
    compaction_time_limit: int = Field(120, validation_alias="COMPACTION_TIME_LIMIT_SECONDS", ge=5)
    # llm: the model writes the summary; extractive: no model call.
    compaction_strategy: Literal["llm", "extractive"] = Field("llm", validation_alias="COMPACTION_STRATEGY")
    compaction_llm_timeout: float = Field(90.0, validation_alias="COMPACTION_LLM_TIMEOUT_SECONDS", gt=0)
    compaction_max_retries: int = Field(3, validation_alias="COMPACTION_MAX_RETRIES", ge=0)
    compaction_retry_backoff: float = Field(10.0, validation_alias="COMPACTION_RETRY_BACKOFF_SECONDS", gt=0)
    # How long a requested compaction's marker outlives a task lost before it started (docs/deployment.md).
    compaction_queued_ttl: int = Field(60, validation_alias="COMPACTION_QUEUED_TTL_SECONDS", ge=1)
    # The broker's visibility timeout; 0 derives it from the time limit and the retries.
    compaction_visibility_timeout: int = Field(0, validation_alias="COMPACTION_VISIBILITY_TIMEOUT_SECONDS", ge=0)
    # The model's part of a compaction (docs/memory.md: A compaction) waits until the thread had no turn for this long...
    compaction_idle_seconds: float = Field(20.0, validation_alias="COMPACTION_IDLE_SECONDS", ge=1)
    # ...or until this many folds went without it (never while a turn of the thread streams).
    compaction_refine_after_folds: int = Field(8, validation_alias="COMPACTION_REFINE_AFTER_FOLDS", ge=1)
    # A thread whose fold failed for a reason a retry will not fix is not asked again for this long.
    compaction_blocked_seconds: int = Field(3600, validation_alias="COMPACTION_BLOCKED_SECONDS", ge=60)
    web_threads: int = Field(64, validation_alias="WEB_THREADS", ge=1)
    # A websocket that sends no frame for this long, with no turn in flight, is closed (code 4408).
    ws_idle_timeout: float = Field(300.0, validation_alias="WS_IDLE_TIMEOUT_SECONDS", gt=0)
    # Open websockets of one session across every web process (code 4429 beyond it).
    ws_max_per_session: int = Field(8, validation_alias="WS_MAX_PER_SESSION", ge=1)
    # Open websockets per web worker process (code 1013 beyond it); 0: derived from WEB_THREADS
    # (``ws_per_worker_limit``), always below it so HTTP requests keep a connection slot.
    ws_max_per_worker: int = Field(0, validation_alias="WS_MAX_PER_WORKER", ge=0)
    # -- Clients and their budgets (docs/deployment.md: "Budgets"); a quota of 0 is no limit.  Unset quotas
    # take ``QUOTA_DEFAULTS`` in production and 0 elsewhere (``client_quotas``).
    # Proxies in front of the web whose X-Forwarded-For is trusted (werkzeug's ProxyFix); unset: 1 in
    # production (the platform's router), 0 elsewhere.
    trusted_proxies: int | None = Field(None, validation_alias="TRUSTED_PROXIES", ge=0, le=8)
    # Host names requests may name (comma-separated; a leading "." allows subdomains); unset: in production
    # the hosts of ALLOWED_ORIGINS (any host when none), elsewhere loopback names only (``host_allowed``).
    trusted_hosts: tuple[str, ...] = Field((), validation_alias="TRUSTED_HOSTS")
    # Leading bits of an IPv6 address that name one client in every per-client budget (a /64 is one home or
    # one host's whole range); IPv4 addresses, IPv4-mapped ones included, count one by one.
    client_ipv6_prefix: int = Field(64, validation_alias="CLIENT_IPV6_PREFIX", ge=16, le=128)
    ws_max_per_client: int | None = Field(None, validation_alias="WS_MAX_PER_CLIENT", ge=0)
    ws_new_per_minute: int | None = Field(None, validation_alias="WS_NEW_PER_MINUTE", ge=0)
    turns_per_minute_per_client: int | None = Field(None, validation_alias="TURNS_PER_MINUTE_PER_CLIENT", ge=0)
    turns_per_minute_per_session: int | None = Field(None, validation_alias="TURNS_PER_MINUTE_PER_SESSION", ge=0)
    sessions_per_hour_per_client: int | None = Field(None, validation_alias="SESSIONS_PER_HOUR_PER_CLIENT", ge=0)
    api_writes_per_minute: int | None = Field(None, validation_alias="API_WRITES_PER_MINUTE", ge=0)
    # New threads are refused (store_full) while the store's used memory is past this share of its maxmemory.
    store_full_fraction: float = Field(0.9, validation_alias="STORE_FULL_FRACTION", gt=0, le=1)
    # A frame not written within this many seconds closes its socket (a peer that stopped reading).
    ws_send_timeout: float = Field(10.0, validation_alias="WS_SEND_TIMEOUT_SECONDS", gt=0)
    # Bytes of frames waiting to go out on one socket; past it the socket is closed (1008).
    ws_send_queue_bytes: int = Field(1 << 20, validation_alias="WS_SEND_QUEUE_BYTES", ge=4096)
    # How long /healthz trusts its last store write probe (seconds; 0: probe on every call).
    health_write_probe_interval: float = Field(10.0, validation_alias="HEALTH_WRITE_PROBE_SECONDS", ge=0)
    redis_socket_timeout: float = Field(2.0, validation_alias="REDIS_SOCKET_TIMEOUT_SECONDS", gt=0)
    debug_log_content: bool = Field(False, validation_alias="MEMORY_DEBUG_LOG_CONTENT")
    bundled_model: bool = Field(False, validation_alias="BUNDLED_MODEL")
    # After a compaction, prefill the chat server's prompt cache with the thread's new prompt prefix
    # (docs/bundled-model.md: The bundled model): auto = on with the bundled model, off with a remote provider.
    prompt_warmup: Literal["auto", "on", "off"] = Field("auto", validation_alias="PROMPT_WARMUP")
    # When archived turns are recalled into a turn's prompt (docs/memory.md: Recall): every message ("always"), or only a
    # message that asks or requests something ("asks"); auto = asks with the bundled model (each recalled token
    # is read by the CPU before the first token), always with a remote provider.
    recall_when: Literal["auto", "always", "asks"] = Field("auto", validation_alias="MEMORY_RECALL_WHEN")
    # Most prompt tokens the recalled excerpts may take, beside MEMORY_RECALL_SHARE (None: auto = 160 with the
    # bundled model, no cap beyond the share otherwise; 0: no cap).
    recall_max_tokens: int | None = Field(None, validation_alias="MEMORY_RECALL_MAX_TOKENS", ge=0)
    # Folded turns enter the prompt's record this many at a time; the ones in between are shown verbatim from the
    # archive (docs/bundled-model.md: The bundled model). None: auto = 4 with the bundled model, 1 otherwise.
    prompt_fold_step: int | None = Field(None, validation_alias="MEMORY_PROMPT_FOLD_STEP", ge=1, le=16)
    metrics_token: str | None = Field(None, validation_alias="METRICS_TOKEN", repr=False)
    # Offer the built-in tools to the chat model; a provider that rejects tools gets plain chat whatever this says.
    tools_enabled: bool = Field(True, validation_alias="TOOLS_ENABLED")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments only: the environment is read by ``from_env`` and nowhere else."""
        return (init_settings,)

    @field_validator("env", "compaction_strategy", "prompt_warmup", "recall_when", mode="before")
    @classmethod
    def _lowercase(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        return _checked_url(value, {"redis", "rediss"})

    @field_validator("celery_broker_url")
    @classmethod
    def _broker_url(cls, value: str | None) -> str | None:
        return None if value is None else _checked_url(value, {"redis", "rediss", "amqp", "amqps"})

    @field_validator("openai_base_url", "compaction_base_url")
    @classmethod
    def _openai_base_url(cls, value: str | None) -> str | None:
        return None if value is None else _checked_url(value, {"http", "https"})

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, (list, tuple)):
            return tuple(o.strip().rstrip("/") for o in value if isinstance(o, str) and o.strip())
        return value

    @field_validator("trusted_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, (list, tuple)):
            return tuple(h.strip().lower() for h in value if isinstance(h, str) and h.strip())
        return value

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_checked_url(origin, {"http", "https"}) for origin in value)

    @field_validator("flower_basic_auth")
    @classmethod
    def _basic_auth(cls, value: str | None) -> str | None:
        if value is not None and ":" not in value:
            raise PydanticCustomError("basic_auth", "FLOWER_BASIC_AUTH must look like user:password")
        return value

    @model_validator(mode="after")
    def _output_fits(self) -> "Settings":
        if self.reserved_output_tokens >= self.model_context_tokens:
            raise PydanticCustomError("reserved_output",
                                      "RESERVED_OUTPUT_TOKENS must be smaller than MODEL_CONTEXT_TOKENS")
        return self

    @model_validator(mode="after")
    def _answer_fits(self) -> "Settings":
        if self.answer_max_tokens_setting is not None and self.answer_max_tokens_setting > self.reserved_output_tokens:
            raise PydanticCustomError("answer_max_tokens",
                                      "ANSWER_MAX_TOKENS must not be larger than RESERVED_OUTPUT_TOKENS")
        if self.prompt_answer_max_tokens_setting and self.prompt_answer_max_tokens_setting < 16:
            raise PydanticCustomError("prompt_answer_max_tokens",
                                      "MEMORY_PROMPT_ANSWER_MAX_TOKENS must be 0 (no limit) or at least 16")
        return self

    @model_validator(mode="after")
    def _sockets_fit(self) -> "Settings":
        if self.ws_max_per_worker and self.ws_max_per_worker >= self.web_threads:
            raise PydanticCustomError(
                "ws_per_worker", "WS_MAX_PER_WORKER must be smaller than WEB_THREADS (idle websockets would "
                "otherwise take every connection of a worker and leave none for /healthz and page loads)")
        return self

    @model_validator(mode="after")
    def _wait_fits(self) -> "Settings":
        if self.memory_wait_replicas and self.memory_wait_timeout_ms >= 1000 * self.redis_socket_timeout:
            raise PydanticCustomError(
                "wait_timeout", "MEMORY_WAIT_TIMEOUT_MS must be shorter than REDIS_SOCKET_TIMEOUT_SECONDS "
                "(a commit's WAIT would otherwise time out as a store failure)")
        return self

    @model_validator(mode="after")
    def _cluster_needs(self) -> "Settings":
        if not self.redis_cluster:
            return self
        if urlparse(self.redis_url).path.strip("/") not in ("", "0"):
            raise PydanticCustomError(
                "cluster_database", "REDIS_URL names a database other than 0: a Redis Cluster has only "
                "database 0, so drop the /<number> from REDIS_URL when REDIS_CLUSTER=1")
        if not self.celery_broker_url:
            raise PydanticCustomError(
                "broker_required", "CELERY_BROKER_URL is not set: Celery's Redis transport cannot use a Redis "
                "Cluster, so set CELERY_BROKER_URL to amqp://... (RabbitMQ) or to a separate redis:// when "
                "REDIS_CLUSTER=1")
        return self

    @property
    def broker_url(self) -> str:
        """Celery's broker: ``CELERY_BROKER_URL``, else the store's Redis URL."""
        return self.celery_broker_url or self.redis_url

    @property
    def production(self) -> bool:
        """True when ``APP_ENV=production``."""
        return self.env == "production"

    @property
    def ws_per_worker_limit(self) -> int:
        """Open websockets one web worker serves: ``WS_MAX_PER_WORKER``, or else ``WEB_THREADS`` minus a
        quarter of it (at least 2 kept for HTTP), at least 1.  64 threads: 48 sockets."""
        if self.ws_max_per_worker:
            return self.ws_max_per_worker
        return max(1, self.web_threads - max(2, self.web_threads // 4))

    @property
    def client_quotas(self) -> "ClientQuotas":
        """The per-client budgets in force: each variable as set, else ``QUOTA_DEFAULTS`` in production and
        0 (no limit) elsewhere."""
        def pick(name: str) -> int:
            value = getattr(self, name)
            if value is not None:
                return value
            return QUOTA_DEFAULTS[name] if self.production else 0
        return ClientQuotas(**{name: pick(name) for name in QUOTA_DEFAULTS})

    @property
    def proxies_trusted(self) -> int:
        """``TRUSTED_PROXIES``, else 1 in production and 0 elsewhere."""
        if self.trusted_proxies is not None:
            return self.trusted_proxies
        return 1 if self.production else 0

    def host_allowed(self, host: str) -> bool:
        """True when a request's ``Host`` (port stripped, lowercase) may be served: in ``TRUSTED_HOSTS`` (an
        entry ``.example.com`` also allows its subdomains); with none set, in production a host of
        ``ALLOWED_ORIGINS`` (any host when none is set), elsewhere a loopback name only."""
        name = _host_name(host)
        trusted = self.trusted_hosts
        if not trusted:
            if not self.production:
                trusted = LOOPBACK_HOSTS
            elif self.allowed_origins:
                trusted = tuple(_host_name(urlparse(o).netloc) for o in self.allowed_origins)
            else:
                return bool(name)
        for entry in trusted:
            if name == entry or (entry.startswith(".") and (name.endswith(entry) or name == entry[1:])):
                return True
        return False

    @property
    def warms_prompts(self) -> bool:
        """True when a compaction's new prompt prefix is sent to the chat server ahead of the next turn
        (``PROMPT_WARMUP``: ``on``, or ``auto`` with the bundled model)."""
        return self.prompt_warmup == "on" or (self.prompt_warmup == "auto" and self.bundled_model)

    @property
    def fold_step(self) -> int:
        """``MEMORY_PROMPT_FOLD_STEP``, auto resolved: 4 with the bundled model (its chat server then reads a fold's
        new prompt layout once per 4 folds, not after every one), else 1."""
        if self.prompt_fold_step is not None:
            return self.prompt_fold_step
        return BUNDLED_FOLD_STEP if self.bundled_model else 1

    @property
    def recall_asks_only(self) -> bool:
        """True when only a message that asks or requests something recalls archived turns
        (``MEMORY_RECALL_WHEN``: ``asks``, or ``auto`` with the bundled model)."""
        return self.recall_when == "asks" or (self.recall_when == "auto" and self.bundled_model)

    @property
    def recall_share_cap(self) -> float:
        """``MEMORY_RECALL_SHARE`` limited by ``MEMORY_RECALL_MAX_TOKENS`` (auto: 160 tokens with the bundled
        model), as a share of ``prompt_budget``; 0.0 means no recall."""
        share = self.limits.recall_share
        cap = self.recall_max_tokens if self.recall_max_tokens is not None else (
            BUNDLED_RECALL_MAX_TOKENS if self.bundled_model else 0)
        if cap and share > 0:
            share = min(share, cap / max(1, self.prompt_budget))
        return share

    @property
    def answer_max_tokens(self) -> int:
        """Most tokens an answer may take (``ANSWER_MAX_TOKENS``), auto resolved: ``BUNDLED_ANSWER_MAX_TOKENS``
        with the bundled model, else ``RESERVED_OUTPUT_TOKENS``; never above ``RESERVED_OUTPUT_TOKENS``."""
        if self.answer_max_tokens_setting is not None:
            return self.answer_max_tokens_setting
        cap = BUNDLED_ANSWER_MAX_TOKENS if self.bundled_model else self.reserved_output_tokens
        return min(cap, self.reserved_output_tokens)

    @property
    def prompt_answer_max_tokens(self) -> int:
        """Tokens of each earlier answer a prompt shows (``MEMORY_PROMPT_ANSWER_MAX_TOKENS``), auto resolved:
        ``BUNDLED_PROMPT_ANSWER_MAX_TOKENS`` with the bundled model, else 0 (no limit)."""
        if self.prompt_answer_max_tokens_setting is not None:
            return self.prompt_answer_max_tokens_setting
        return BUNDLED_PROMPT_ANSWER_MAX_TOKENS if self.bundled_model else 0

    @property
    def prompt_budget(self) -> int:
        """Tokens the assembled prompt may use: context window minus reserved output."""
        return self.model_context_tokens - self.reserved_output_tokens

    def with_overrides(self, **changes: Any) -> "Settings":
        """Return a validated copy with some fields (by name) replaced (used by tests and scripts).

        Raises:
            pydantic.ValidationError: an unknown field or a malformed value.
        """
        return type(self)(**{**dict(self), **changes})

    @property
    def llm_turn_timeout(self) -> float:
        """Seconds one non-streamed runtime model call may take, and the deprecated name of
        ``llm_first_token_timeout`` (a streamed answer has no total-time limit)."""
        return self.llm_first_token_timeout

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """Read and validate the contract's variables (an empty value means unset).

        Beyond each variable's own checks: ``REDIS_TLS_URL`` wins over ``REDIS_URL``;
        ``COMPACTION_MODEL`` defaults to ``CHAT_MODEL``; outside production a missing
        ``SECRET_KEY`` is generated once into ``.local/secret_key``; production needs a
        store URL, a ``SECRET_KEY`` of at least 32 characters and a model provider.

        Args:
            environ: mapping to read instead of ``os.environ``.

        Raises:
            ConfigError: a variable is malformed, or production lacks one it needs.
        """
        source = EnvironmentSource(cls, os.environ if environ is None else environ)
        values = source()
        if DEPRECATED_TURN_TIMEOUT in source.variables:
            log.warning("%s is deprecated: it is read as LLM_FIRST_TOKEN_TIMEOUT_SECONDS (the wait for an answer's "
                        "first text%s); an answer is no longer cut by its total time (docs/contract.md: "
                        "Configuration)", DEPRECATED_TURN_TIMEOUT,
                        ", which is set and wins" if "LLM_FIRST_TOKEN_TIMEOUT_SECONDS" in source.variables else "")
        if "CHAT_MODEL" in values:
            values.setdefault("COMPACTION_MODEL", values["CHAT_MODEL"])
        try:
            settings = cls(**values)
        except ValidationError as exc:
            raise _config_error(exc.errors(include_url=False)[0]) from None
        if settings.production:
            _require_production_variables(settings)
        elif not settings.secret_key:
            settings = settings.with_overrides(secret_key=dev_secret_key())
        return settings


def _require_production_variables(settings: Settings) -> None:
    """Raise ``ConfigError`` unless production names its store, a long secret and a model provider."""
    if "redis_url" not in settings.model_fields_set:
        raise ConfigError("REDIS_URL is not set: set REDIS_TLS_URL or REDIS_URL in production "
                          "(for example rediss://:password@host:6380)")
    if len(settings.secret_key) < 32:
        raise ConfigError(("SECRET_KEY is not set" if not settings.secret_key else "SECRET_KEY is too short") +
                          ": set SECRET_KEY to at least 32 random characters in production "
                          "(python -c 'import secrets; print(secrets.token_hex(32))')")
    if not settings.openai_base_url and not settings.openai_api_key:
        # No model process runs in production: without a provider every turn would fail.
        raise ConfigError("OPENAI_API_KEY is not set: set OPENAI_API_KEY (and OPENAI_BASE_URL for a "
                          "provider other than OpenAI) in production")


# -- How a deployer reads the variables (docs/settings.md and .env.example, written by scripts/settings_doc.py) ----

GROUPS = ("web", "store", "model", "compaction", "budgets")
"""The groups of ``Settings``' variables, in the order docs/settings.md shows them (the local stack's variables,
read by scripts/ only, come after them: ``scripts/settings_doc.py``)."""


@dataclass(frozen=True)
class Documented:
    """How docs/settings.md and .env.example describe one variable of ``Settings``.

    Attributes:
        group: one of ``GROUPS``.
        meaning: one line (docs/contract.md: Configuration has the whole text).
        unit: the value's unit (``s``, ``ms``, ``tokens``, ``chars``, ``bytes``, ...; empty: none).
        default: the default in words, for a variable whose field default stands for a rule (``None``, ``0``:
            derived from another setting or from ``APP_ENV``); ``None``: the field's own default.
    """

    group: str
    meaning: str
    unit: str = ""
    default: str | None = None


_PRODUCTION_QUOTA = "production {}, elsewhere 0 (no limit)"

DOCUMENTED: dict[str, Documented] = {
    # web
    "APP_ENV": Documented("web", "production requires a store, a secret and a model provider"),
    "SECRET_KEY": Documented("web", "signs the session cookie and keys the thread ids; at least 32 characters in "
                                    "production", default="development: generated once into .local/secret_key"),
    "PORT": Documented("web", "the web's port (the platform sets it)", "port"),
    "WEB_THREADS": Documented("web", "connections (threads or greenlets) each web process serves", "connections"),
    "ALLOWED_ORIGINS": Documented("web", "websocket Origin allow-list, comma-separated",
                                  default="the app's own origin"),
    "TRUSTED_PROXIES": Documented("web", "proxies in front of the web whose X-Forwarded-For entry is trusted",
                                  default="production 1, elsewhere 0"),
    "TRUSTED_HOSTS": Documented("web", "host names a request's Host may name, comma-separated (.example.com: and "
                                       "its subdomains)",
                                default="production: the hosts of ALLOWED_ORIGINS; elsewhere loopback names"),
    "MAX_INPUT_CHARS": Documented("web", "longest accepted person message", "chars"),
    "WS_IDLE_TIMEOUT_SECONDS": Documented("web", "a websocket silent this long with no turn in flight is closed "
                                                 "(4408)", "s"),
    "WS_MAX_PER_SESSION": Documented("web", "open websockets of one session over every web process (4429 beyond)",
                                     "sockets"),
    "WS_MAX_PER_WORKER": Documented("web", "open websockets per web process (1013 beyond); below WEB_THREADS",
                                    "sockets", default="WEB_THREADS minus a quarter of it (64: 48)"),
    "WS_SEND_TIMEOUT_SECONDS": Documented("web", "a frame not written to its socket within this time drops the "
                                                 "connection", "s"),
    "WS_SEND_QUEUE_BYTES": Documented("web", "frames waiting to go out on one socket; past it the socket is closed",
                                      "bytes"),
    "STREAM_FLUSH_INTERVAL_SECONDS": Documented("web", "least time between two delta frames of one answer (0: one "
                                                       "frame per read)", "s"),
    "HEALTH_WRITE_PROBE_SECONDS": Documented("web", "how long /healthz reuses its last store write probe (0: probe "
                                                    "every time)", "s"),
    "METRICS_TOKEN": Documented("web", "bearer token /metrics asks for in production (unset: 404 there)"),
    "FLOWER_BASIC_AUTH": Documented("web", "user:password of Flower; Flower refuses to start without it outside "
                                           "development"),
    "MEMORY_DEBUG_LOG_CONTENT": Documented("web", "log message texts at debug level"),
    # store
    "REDIS_URL": Documented("store", "the store: threads, pub/sub, and the Celery broker unless CELERY_BROKER_URL",
                            default="redis://127.0.0.1:6380/0 (the embedded store of make run)"),
    "REDIS_TLS_URL": Documented("store", "the store over TLS (rediss://); wins over REDIS_URL when set",
                                default="unset"),
    "REDIS_CLUSTER": Documented("store", "REDIS_URL names a seed node of a Redis Cluster (7+, database 0)"),
    "CELERY_BROKER_URL": Documented("store", "Celery broker: redis://, rediss://, amqp:// or amqps://",
                                    default="the store's URL (required with REDIS_CLUSTER)"),
    "REDIS_SOCKET_TIMEOUT_SECONDS": Documented("store", "the longest one store command may take", "s"),
    "MEMORY_WAIT_REPLICAS": Documented("store", "replicas each memory write waits for (WAIT)", "replicas"),
    "MEMORY_WAIT_TIMEOUT_MS": Documented("store", "the longest that wait; shorter than the socket timeout", "ms"),
    "MEMORY_TTL_SECONDS": Documented("store", "sliding expiry of a thread's keys, refreshed by every write", "s"),
    "MEMORY_RECENT_TURNS": Documented("store", "whole person+assistant turns kept verbatim", "turns"),
    "MEMORY_SUMMARY_MAX_CHARS": Documented("store", "longest record of the folded turns, as rendered", "chars"),
    "MEMORY_PINNED_MAX": Documented("store", "most pinned decisions of one thread", "pins"),
    "MEMORY_PINNED_MAX_CHARS": Documented("store", "longest pinned decision", "chars"),
    "DELIVERY_FINAL_MAX_CHARS": Documented("store", "longest final workflow report kept in memory", "chars"),
    "MEMORY_ARCHIVE_MAX_TURNS": Documented("store", "most folded turns a thread's archive keeps (oldest out)",
                                           "turns"),
    "MEMORY_ARCHIVE_MAX_BYTES": Documented("store", "most bytes a thread's archive keeps (oldest out; the newest "
                                                    "folded turn stays)", "bytes"),
    "TOKEN_CACHE_MAX_BYTES": Documented("store", "each process's cache of token counts (0: keeps nothing)", "bytes"),
    "ARCHIVE_CACHE_MAX_BYTES": Documented("store", "each web process's cache of tokenised archives for recall (0: "
                                                   "keeps nothing)", "bytes"),
    # model
    "OPENAI_API_KEY": Documented("model", "the provider's key", default="unset: the bundled model (make run)"),
    "OPENAI_BASE_URL": Documented("model", "any OpenAI-compatible endpoint (OpenAI, DeepSeek, Ollama, vLLM, "
                                           "llama.cpp)", default="unset: the bundled model (make run)"),
    "COMPACTION_BASE_URL": Documented("model", "where compaction calls go", default="OPENAI_BASE_URL"),
    "CHAT_MODEL": Documented("model", "the chat model's name"),
    "COMPACTION_MODEL": Documented("model", "the compaction model's name", default="CHAT_MODEL"),
    "TOKENIZER_ENCODING": Documented("model", "tiktoken encoding that counts prompt tokens",
                                     default="chosen from the model's name"),
    "BUNDLED_MODEL": Documented("model", "the provider is the bundled llama.cpp model (make run sets it)"),
    "MODEL_CONTEXT_TOKENS": Documented("model", "the model's window; a prompt plus RESERVED_OUTPUT_TOKENS fits in it",
                                       "tokens"),
    "RESERVED_OUTPUT_TOKENS": Documented("model", "tokens of the window kept for the answer", "tokens"),
    "ANSWER_MAX_TOKENS": Documented("model", "most tokens one answer may take (max_tokens); at most "
                                             "RESERVED_OUTPUT_TOKENS", "tokens",
                                    default="auto: 224 with the bundled model, else RESERVED_OUTPUT_TOKENS"),
    "MEMORY_PROMPT_ANSWER_MAX_TOKENS": Documented("model", "most tokens of each earlier answer a prompt shows (0: "
                                                           "no limit)", "tokens",
                                                  default="auto: 96 with the bundled model, else no limit"),
    "LLM_CONNECT_TIMEOUT_SECONDS": Documented("model", "the longest a connection to the model may take", "s"),
    "LLM_READ_TIMEOUT_SECONDS": Documented("model", "the longest wait for one read from the model", "s"),
    "LLM_FIRST_TOKEN_TIMEOUT_SECONDS": Documented("model", "the longest a streamed answer may wait for its first "
                                                           "text, retries included", "s"),
    "LLM_TURN_TIMEOUT_SECONDS": Documented("model", "deprecated: read as LLM_FIRST_TOKEN_TIMEOUT_SECONDS when that "
                                                    "one is unset", "s", default="unset"),
    "LLM_TOKEN_GAP_TIMEOUT_SECONDS": Documented("model", "once text flows, the longest silence between two pieces "
                                                         "of it", "s"),
    "LLM_MAX_RETRIES": Documented("model", "retries of a model call before its first text", "retries"),
    "PROMPT_WARMUP": Documented("model", "after a compaction, prefill the chat server's prompt cache (auto: on with "
                                         "the bundled model)"),
    "MEMORY_RECALL_SHARE": Documented("model", "share of the prompt budget recalled excerpts may use (0: no "
                                               "recall)", "share"),
    "MEMORY_RECALL_WHEN": Documented("model", "which messages recall: always, asks (questions and requests), auto "
                                              "(asks with the bundled model)"),
    "MEMORY_RECALL_MAX_TOKENS": Documented("model", "most prompt tokens recalled excerpts may take (0: no cap)",
                                           "tokens", default="auto: 160 with the bundled model, else no cap"),
    "MEMORY_PROMPT_FOLD_STEP": Documented("model", "folded turns enter the prompt's record this many at a time",
                                          "turns", default="auto: 4 with the bundled model, else 1"),
    "TOOLS_ENABLED": Documented("model", "offer the built-in tools to the chat model"),
    # compaction
    "MEMORY_COMPACT_BATCH_TURNS": Documented("compaction", "turns beyond the recent window that make a fold due",
                                             "turns"),
    "COMPACTION_STRATEGY": Documented("compaction", "llm: the model refines the record; extractive: no model call"),
    "COMPACTION_TIME_LIMIT_SECONDS": Documented("compaction", "a compaction task's time limit", "s"),
    "COMPACTION_LLM_TIMEOUT_SECONDS": Documented("compaction", "the longest one compaction model call may take", "s"),
    "COMPACTION_MAX_RETRIES": Documented("compaction", "retries of a failed compaction model call", "retries"),
    "COMPACTION_RETRY_BACKOFF_SECONDS": Documented("compaction", "the first retry's wait (doubled each time, with "
                                                                 "jitter)", "s"),
    "COMPACTION_QUEUED_TTL_SECONDS": Documented("compaction", "how long a requested compaction's marker outlives a "
                                                              "task lost before it started", "s"),
    "COMPACTION_VISIBILITY_TIMEOUT_SECONDS": Documented("compaction", "the broker's visibility timeout", "s",
                                                        default="derived from the time limit and the retries"),
    "COMPACTION_IDLE_SECONDS": Documented("compaction", "a refinement waits until the thread had no turn for this "
                                                        "long", "s"),
    "COMPACTION_REFINE_AFTER_FOLDS": Documented("compaction", "...or until this many folds went without one "
                                                              "(ignored with the bundled model)", "folds"),
    "COMPACTION_BLOCKED_SECONDS": Documented("compaction", "a thread whose fold cannot succeed is not asked again "
                                                           "for this long", "s"),
    # budgets
    "CLIENT_IPV6_PREFIX": Documented("budgets", "leading bits of an IPv6 address that name one client", "bits"),
    "WS_MAX_PER_CLIENT": Documented("budgets", "open websockets of one address over every web process (4429 "
                                               "beyond)", "sockets", default=_PRODUCTION_QUOTA.format(16)),
    "WS_NEW_PER_MINUTE": Documented("budgets", "new websockets of one address per minute (4430 beyond)",
                                    "sockets/min", default=_PRODUCTION_QUOTA.format(30)),
    "TURNS_PER_MINUTE_PER_SESSION": Documented("budgets", "turns one session may start per minute", "turns/min",
                                               default=_PRODUCTION_QUOTA.format(12)),
    "TURNS_PER_MINUTE_PER_CLIENT": Documented("budgets", "turns one address may start per minute", "turns/min",
                                              default=_PRODUCTION_QUOTA.format(30)),
    "SESSIONS_PER_HOUR_PER_CLIENT": Documented("budgets", "new sessions (cookies) handed to one address per hour",
                                               "sessions/h", default=_PRODUCTION_QUOTA.format(60)),
    "API_WRITES_PER_MINUTE": Documented("budgets", "state-changing HTTP requests of one address per minute",
                                        "requests/min", default=_PRODUCTION_QUOTA.format(120)),
    "STORE_FULL_FRACTION": Documented("budgets", "past this share of the store's maxmemory no new thread starts",
                                      "share"),
}
"""Every variable ``Settings.from_env`` reads, with its group, unit and one-line meaning (tests/test_settings_doc.py
checks that this and the fields name the same variables)."""
