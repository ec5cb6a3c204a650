"""Prometheus metrics of the chat service, correct under several gunicorn processes and from Celery workers.

Web processes (gunicorn) count with ``prometheus_client`` metrics.  With
``PROMETHEUS_MULTIPROC_DIR`` set (``gunicorn.conf.py`` sets it and marks exited
workers dead) every process writes its values to that directory and a scrape of
any process adds them all up; without it (tests, ``flask run``) the values live
in this process.

Celery workers may run on other machines, so what they count (compactions,
their duration and fact retention, memory-store errors seen by a worker) is
added to one Redis hash (``keys.WORKER_METRICS_KEY``) by ``observe_compaction``
and ``count_store_error``; ``/metrics`` of the web app reads it back through
``WorkerMetricsCollector``.

Exposed families (``_total`` / ``_bucket`` suffixes as Prometheus writes them):

| name | type | labels | unit |
| --- | --- | --- | --- |
| ``chat_turns_total`` | counter | status | turns |
| ``chat_first_token_seconds`` | histogram | | seconds |
| ``chat_prompt_tokens`` | histogram | | tokens per prompt |
| ``chat_prompt_section_tokens_total`` | counter | section | tokens |
| ``chat_completion_tokens_total`` | counter | | tokens |
| ``chat_open_websockets`` | gauge (live sum) | | connections |
| ``chat_feedback_total`` | counter | rating, reason | ratings |
| ``chat_pin_requests_total`` | counter | action, result | requests |
| ``chat_memory_store_errors_total`` | counter | operation, process (web/worker) | errors |
| ``chat_compactions_total`` | counter | outcome, reason | compactions |
| ``chat_compaction_duration_seconds`` | histogram | outcome | seconds |
| ``chat_compaction_fact_retention_ratio`` | histogram | | ratio 0..1 |
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import redis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from app.store.keys import WORKER_METRICS_KEY

if TYPE_CHECKING:
    from app.store.redis_client import StoreClient

log = logging.getLogger(__name__)

# Metrics of this process (the values go to PROMETHEUS_MULTIPROC_DIR files when it is set).
REGISTRY = CollectorRegistry(auto_describe=True)

FIRST_TOKEN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 30.0, 60.0)
PROMPT_TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 16384, 32768, 65536, 131072)
COMPACTION_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
RETENTION_BUCKETS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)

TURNS = Counter("chat_turns", "Finished turns by done status (interrupted: the socket closed).",
                ["status"], registry=REGISTRY)
FIRST_TOKEN = Histogram("chat_first_token_seconds", "Time from the start of streaming to the first text delta.",
                        buckets=FIRST_TOKEN_BUCKETS, registry=REGISTRY)
PROMPT_TOKENS = Histogram("chat_prompt_tokens", "Tokens of each assembled prompt.",
                          buckets=PROMPT_TOKEN_BUCKETS, registry=REGISTRY)
SECTION_TOKENS = Counter("chat_prompt_section_tokens", "Prompt tokens spent per memory section.",
                         ["section"], registry=REGISTRY)
COMPLETION_TOKENS = Counter("chat_completion_tokens", "Completion tokens (provider usage, else counted).",
                            registry=REGISTRY)
OPEN_WEBSOCKETS = Gauge("chat_open_websockets", "Open chat websockets.", multiprocess_mode="livesum",
                        registry=REGISTRY)
FEEDBACK = Counter("chat_feedback", "Feedback on assistant messages.", ["rating", "reason"], registry=REGISTRY)
PIN_REQUESTS = Counter("chat_pin_requests", "Pin and unpin requests by the person, by result.",
                       ["action", "result"], registry=REGISTRY)
REFUSALS = Counter("chat_client_refusals", "Requests refused by a client budget (docs/deployment.md: Budgets).",
                   ["budget"], registry=REGISTRY)
STORE_ERRORS = Counter("chat_memory_store_errors", "Memory-store (Redis) errors.", ["operation", "process"],
                       registry=REGISTRY)

FEEDBACK_REASONS = ("forgot", "incorrect", "not_helpful")
_CATEGORY_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def category(value: object, default: str = "other") -> str:
    """A bounded label value: lowercase ``[a-z0-9_]`` up to 32 characters, else ``default``."""
    if isinstance(value, str):
        value = value.strip().lower().replace("-", "_").replace(" ", "_")
        if _CATEGORY_RE.match(value):
            return value
    return default


# --------------------------------------------------------------------------- web-side observations


def observe_turn(record: dict) -> None:
    """Count a finished turn from its accounting record (``accounting.turn_record``)."""
    TURNS.labels(category(record.get("status"), "unknown")).inc()
    prompt = record.get("promptTokens")
    if isinstance(prompt, int):
        PROMPT_TOKENS.observe(prompt)
    for section, tokens in (record.get("sections") or {}).items():
        if isinstance(tokens, int) and tokens > 0:
            SECTION_TOKENS.labels(category(section)).inc(tokens)
    completion = record.get("completionTokens")
    if isinstance(completion, int) and completion > 0:
        COMPLETION_TOKENS.inc(completion)
    first_ms = record.get("firstTokenMs")
    if isinstance(first_ms, (int, float)):
        FIRST_TOKEN.observe(first_ms / 1000.0)


def feedback_reason_category(reason: str | None) -> str:
    """``none``, ``forgot``, ``incorrect``, ``not_helpful`` or ``other`` for a free-text reason."""
    if not reason:
        return "none"
    text = reason.casefold()
    if "forg" in text or "remember" in text:
        return "forgot"
    if "incorrect" in text or "wrong" in text:
        return "incorrect"
    if "not helpful" in text or "unhelpful" in text:
        return "not_helpful"
    return "other"


def observe_feedback(rating: str, reason: str | None) -> None:
    """Count one feedback submission."""
    FEEDBACK.labels(category(rating), feedback_reason_category(reason)).inc()


def count_refusal(budget: str) -> None:
    """Count one request refused by a client budget: ``untrusted_host``, ``no_session``, ``api_writes``,
    ``sessions``, ``ws_new``, ``ws_client``, ``ws_session``, ``ws_worker``, ``turns_session``, ``turns_client``,
    ``store_full``, or a dropped socket (``queue_full``, ``send_timeout``, ``close_timeout``)."""
    REFUSALS.labels(category(budget)).inc()


def observe_pin_request(action: str, result: str) -> None:
    """Count a pin request (``pin``, ``unpin``, ``promote_note``, ``remove_note``) by its result (``ok`` or the error code)."""
    PIN_REQUESTS.labels(category(action), category(result)).inc()


def websocket_opened() -> None:
    """One more open websocket in this process."""
    OPEN_WEBSOCKETS.inc()


def websocket_closed() -> None:
    """One websocket fewer in this process."""
    OPEN_WEBSOCKETS.dec()


# --------------------------------------------------------------------------- worker-side (Redis)

_worker: dict = {"client": None, "url": None}
_pending: dict[str, float] = {}
_pending_lock = threading.Lock()


def use_worker_sink(client: StoreClient | None) -> None:
    """Send this process's store errors to Redis (a Celery worker, whose own registry nobody scrapes).

    Args:
        client: a ``redis.Redis``; None switches back to local counting.
    """
    _worker["client"] = client


def _hincr(client: StoreClient, fields: dict[str, int | float]) -> bool:
    """Add ``fields`` (and anything kept from an earlier outage) to the worker hash; False on failure.

    ``int`` amounts are counts (HINCRBY), ``float`` amounts are sums (HINCRBYFLOAT).
    """
    with _pending_lock:
        for name, amount in fields.items():
            _pending[name] = _pending.get(name, 0) + amount
        batch = dict(_pending)
        _pending.clear()
    try:
        pipe = client.pipeline(transaction=True)
        for name, amount in batch.items():
            if isinstance(amount, float):  # sums: seconds, ratios
                pipe.hincrbyfloat(WORKER_METRICS_KEY, name, amount)
            else:  # counts
                pipe.hincrby(WORKER_METRICS_KEY, name, amount)
        pipe.execute()
        return True
    except (redis.ConnectionError, redis.TimeoutError) as exc:  # Redis unreachable: keep them for next time
        with _pending_lock:
            for name, amount in batch.items():
                _pending[name] = _pending.get(name, 0) + amount
        log.debug("worker metrics not stored: %s", type(exc).__name__)
        return False
    except Exception as exc:  # anything else would fail again: drop the batch
        log.warning("worker metrics dropped: %s", type(exc).__name__)
        return False


def count_store_error(operation: str) -> None:
    """Count a memory-store error (called by ``ThreadStore`` on every Redis failure).

    In a web process it is a local counter; in a Celery worker (``use_worker_sink``)
    it goes to the Redis hash, kept in memory and retried while Redis is down.
    """
    operation = category(operation)
    client = _worker["client"]
    if client is None:
        STORE_ERRORS.labels(operation, "web").inc()
    else:
        _hincr(client, {f"store_errors|{operation}": 1})


def _bucket_for(value: float, buckets: tuple) -> str:
    for upper in buckets:
        if value <= upper:
            return repr(float(upper))
    return "+Inf"


def observe_compaction(client: StoreClient, record: dict) -> bool:
    """Count one compaction from its history record (call it where the history is written).

    Args:
        client: a ``redis.Redis`` (the store's).
        record: ``{"outcome": "applied"|"stale"|"failed", "reason"?: str, "durationMs": number,
            "factRetention"?: number 0..1 | None, ...}`` as kept in ``ThreadKeys.compactions``.

    Returns:
        True when the counts reached Redis (else they are kept and sent with the next call).
    """
    outcome = category(record.get("outcome"), "unknown")
    reason = category(record.get("reason"), "other") if record.get("reason") else "none"
    fields: dict[str, int | float] = {f"compactions|{outcome}|{reason}": 1}
    duration = record.get("durationMs")
    if isinstance(duration, (int, float)) and math.isfinite(duration) and duration >= 0:
        seconds = duration / 1000.0
        fields[f"compaction_seconds_bucket|{outcome}|{_bucket_for(seconds, COMPACTION_SECONDS_BUCKETS)}"] = 1
        fields[f"compaction_seconds_count|{outcome}"] = 1
        fields[f"compaction_seconds_sum|{outcome}"] = float(round(seconds, 6))
    retention = record.get("factRetention")
    if isinstance(retention, (int, float)) and math.isfinite(retention) and 0 <= retention <= 1:
        fields[f"fact_retention_bucket|{_bucket_for(float(retention), RETENTION_BUCKETS)}"] = 1
        fields["fact_retention_count"] = 1
        fields["fact_retention_sum"] = float(round(float(retention), 6))
    return _hincr(client, fields)


def remember_redis_url(url: str, cluster: bool = False) -> None:
    """The store's URL (a cluster's seed with ``cluster``), for the worker sink (set when the Flask app
    registers the API blueprint)."""
    _worker["url"] = url
    _worker["cluster"] = cluster


def _connect_worker_signal() -> None:
    """In a Celery worker, count store errors in Redis (connected when this module is imported).

    A worker started inside a test process (``celery.contrib.testing``) shares the web
    app's process and registry, so it keeps counting locally.
    """
    try:
        from celery.signals import worker_init
    except ImportError:  # pragma: no cover - celery is a dependency
        return

    @worker_init.connect(weak=False)
    def _on_worker_init(sender: object = None, **_kwargs: object) -> None:
        if type(sender).__name__ == "TestWorkController" or not _worker.get("url"):
            return
        try:
            from app.store.redis_client import make_redis
            use_worker_sink(make_redis(_worker["url"], cluster=_worker.get("cluster", False), max_connections=4,
                                       socket_timeout=2.0))
        except Exception:
            log.warning("worker metrics sink not configured", exc_info=True)


_connect_worker_signal()


# --------------------------------------------------------------------------- the scrape


def _cumulative(counts: dict[str, float], buckets: tuple) -> tuple[list[tuple[str, float]], float]:
    """Non-cumulative bucket counts keyed by ``repr(upper)`` -> Prometheus cumulative buckets and total."""
    running = 0.0
    out = []
    for upper in buckets:
        running += counts.get(repr(float(upper)), 0)
        out.append((str(float(upper)), running))
    running += counts.get("+Inf", 0)
    out.append(("+Inf", running))
    return out, running


class WorkerMetricsCollector:
    """Exposes what Celery workers added to the Redis hash (see ``observe_compaction``)."""

    def __init__(self, client: StoreClient) -> None:
        self.client = client

    def read(self) -> dict[str, float]:
        """The hash as numbers (empty when Redis does not answer)."""
        try:
            raw = self.client.hgetall(WORKER_METRICS_KEY)
        except Exception as exc:
            log.warning("worker metrics unavailable: %s", type(exc).__name__)
            return {}
        out = {}
        for key, value in raw.items():
            key = key.decode() if isinstance(key, bytes) else key
            try:
                out[key] = float(value)
            except (TypeError, ValueError):
                continue
        return out

    def collect(self) -> Iterator[Metric]:
        """Yield the compaction families (always present, possibly without samples)."""
        data = self.read()
        compactions = CounterMetricFamily("chat_compactions", "Compactions by outcome (from the workers).",
                                          labels=["outcome", "reason"])
        duration = HistogramMetricFamily("chat_compaction_duration_seconds",
                                         "Compaction duration by outcome (from the workers).", labels=["outcome"])
        retention = HistogramMetricFamily("chat_compaction_fact_retention_ratio",
                                          "Share of expected facts kept by an applied compaction (0..1).")
        buckets: dict[str, dict[str, float]] = {}
        sums: dict[str, float] = {}
        retention_buckets: dict[str, float] = {}
        for key, value in sorted(data.items()):
            parts = key.split("|")
            if parts[0] == "compactions" and len(parts) == 3:
                compactions.add_metric(parts[1:], value)
            elif parts[0] == "compaction_seconds_bucket" and len(parts) == 3:
                buckets.setdefault(parts[1], {})[parts[2]] = value
            elif parts[0] == "compaction_seconds_sum" and len(parts) == 2:
                sums[parts[1]] = value
            elif parts[0] == "fact_retention_bucket" and len(parts) == 2:
                retention_buckets[parts[1]] = value
        for outcome, counts in sorted(buckets.items()):
            cumulative, _total = _cumulative(counts, COMPACTION_SECONDS_BUCKETS)
            duration.add_metric([outcome], cumulative, sums.get(outcome, 0.0))
        if retention_buckets:
            cumulative, _total = _cumulative(retention_buckets, RETENTION_BUCKETS)
            retention.add_metric([], cumulative, data.get("fact_retention_sum", 0.0))
        yield compactions
        yield duration
        yield retention

    def store_errors(self, data: dict[str, float] | None = None) -> list[tuple[str, float]]:
        """``[(operation, count)]`` of store errors the workers saw."""
        data = self.read() if data is None else data
        return [(k.split("|", 1)[1], v) for k, v in sorted(data.items()) if k.startswith("store_errors|")]


class _ScrapeCollector:
    """This process (or all gunicorn processes) plus the workers' Redis counters, as one exposition."""

    def __init__(self, worker: WorkerMetricsCollector) -> None:
        self.worker = worker

    def _local(self) -> Iterable[Metric]:
        path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if path and os.path.isdir(path):
            from prometheus_client import multiprocess
            return multiprocess.MultiProcessCollector(None, path=path).collect()
        return REGISTRY.collect()

    def collect(self) -> Iterator[Metric]:
        worker_errors = self.worker.store_errors()
        seen_store_errors = False
        for family in self._local():
            if family.name == "chat_memory_store_errors":
                seen_store_errors = True
                for operation, value in worker_errors:
                    family.add_sample("chat_memory_store_errors_total",
                                      {"operation": operation, "process": "worker"}, value)
            yield family
        if not seen_store_errors:
            family = CounterMetricFamily("chat_memory_store_errors", "Memory-store (Redis) errors.",
                                         labels=["operation", "process"])
            for operation, value in worker_errors:
                family.add_metric([operation, "worker"], value)
            yield family
        yield from self.worker.collect()


def render_metrics(redis_client: StoreClient) -> bytes:
    """The Prometheus text exposition of every metric above."""
    worker = WorkerMetricsCollector(redis_client)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ScrapeCollector(worker))
    return generate_latest(registry)
