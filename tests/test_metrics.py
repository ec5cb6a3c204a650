"""``/metrics`` for Prometheus.

The exposition is parsed with ``prometheus_client.parser.text_string_to_metric_families``
and its counters must move with the actions taken: turns, feedback, pins, compactions
run by a real Celery worker (counted through Redis), store errors, open websockets.
The multiprocess test runs gunicorn with two worker processes and the repository's
``gunicorn.conf.py``.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis
import requests
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.parser import text_string_to_metric_families
from redis.backoff import NoBackoff
from redis.retry import Retry

from app.observability import metrics
from app.settings import MemoryLimits
from app.store.keys import WORKER_METRICS_KEY
from chat_support.fake_llm import Reply
from chat_support.live_app import ChatClient, LiveServer
from chat_support.servers import free_port, stop
from tests.fixtures.celery_worker import history, seed_turns, wait_no_refinement, wait_until

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = {
    "chat_turns": "counter", "chat_first_token_seconds": "histogram", "chat_prompt_tokens": "histogram",
    "chat_prompt_section_tokens": "counter", "chat_completion_tokens": "counter", "chat_open_websockets": "gauge",
    "chat_feedback": "counter", "chat_pin_requests": "counter", "chat_memory_store_errors": "counter",
    "chat_compactions": "counter", "chat_compaction_duration_seconds": "histogram",
    "chat_compaction_fact_retention_ratio": "histogram",
}


class Scrape:
    """One parsed ``/metrics`` answer: ``value(sample_name, **labels)`` (0.0 when absent)."""

    def __init__(self, text: str):
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples = {}
        for family in self.families.values():
            for s in family.samples:
                self.samples[(s.name, tuple(sorted(s.labels.items())))] = s.value

    def value(self, name: str, **labels) -> float:
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)


def checked_scrape(status: int, headers, text: str) -> Scrape:
    """A ``/metrics`` answer: 200, Prometheus text, no cookie."""
    assert status == 200, text
    assert headers["Content-Type"].startswith("text/plain")
    assert "Set-Cookie" not in headers
    return Scrape(text)


def scrape(base_url: str, **headers) -> Scrape:
    response = requests.get(base_url + "/metrics", headers=headers, timeout=10)
    return checked_scrape(response.status_code, response.headers, response.text)


def scrape_test_client(web, **headers) -> Scrape:
    """``scrape`` through Flask's test client."""
    response = web.get("/metrics", headers=headers)
    return checked_scrape(response.status_code, response.headers, response.get_data(as_text=True))


def post(client: ChatClient, path: str, body: dict):
    return client.http.post(client.server.url + path, json=body, timeout=10)


def test_metrics_parse_and_move_with_a_turn_a_feedback_and_a_pin(chat, fake_llm):
    base = chat.server.url
    before = scrape(base)
    assert {name: before.families[name].type for name in FAMILIES} == FAMILIES

    fake_llm.default = Reply(text="The answer, in five tokens", usage=(50, 5), first_token_delay=0.3)
    frames = chat.turn("What is the answer?")
    answer_id = frames[0]["messageId"]
    turn = chat.http.get(base + "/api/chat/stats", timeout=10).json()["turns"][-1]
    after_turn = scrape(base)
    assert after_turn.value("chat_turns_total", status="completed") == \
        before.value("chat_turns_total", status="completed") + 1
    assert after_turn.value("chat_prompt_tokens_count") == before.value("chat_prompt_tokens_count") + 1
    assert after_turn.value("chat_prompt_tokens_sum") == before.value("chat_prompt_tokens_sum") + turn["promptTokens"]
    for section in ("system", "input"):
        assert after_turn.value("chat_prompt_section_tokens_total", section=section) == \
            before.value("chat_prompt_section_tokens_total", section=section) + turn["sections"][section]
    assert after_turn.value("chat_completion_tokens_total") == before.value("chat_completion_tokens_total") + 5
    assert after_turn.value("chat_first_token_seconds_count") == before.value("chat_first_token_seconds_count") + 1
    first_token = after_turn.value("chat_first_token_seconds_sum") - before.value("chat_first_token_seconds_sum")
    assert first_token == pytest.approx(turn["firstTokenMs"] / 1000, abs=0.001) and first_token >= 0.3
    assert after_turn.value("chat_first_token_seconds_bucket", le="0.25") == \
        before.value("chat_first_token_seconds_bucket", le="0.25")

    assert post(chat, "/api/chat/feedback", {"messageId": answer_id, "rating": "down",
                                             "reason": "forgot something I said"}).status_code == 201
    assert post(chat, "/api/chat/feedback", {"messageId": answer_id, "rating": "up"}).status_code == 201
    assert post(chat, "/api/chat/pins", {"text": "Answer in five tokens"}).status_code == 201
    assert post(chat, "/api/chat/pins", {"text": "answer in five tokens."}).status_code == 409
    assert post(chat, "/api/chat/pins", {"text": "   "}).status_code == 400
    assert chat.http.delete(base + "/api/chat/pins/1", timeout=10).status_code == 200
    after = scrape(base)
    moved = {
        ("chat_feedback_total", (("rating", "down"), ("reason", "forgot"))): 1,
        ("chat_feedback_total", (("rating", "up"), ("reason", "none"))): 1,
        ("chat_pin_requests_total", (("action", "pin"), ("result", "ok"))): 1,
        ("chat_pin_requests_total", (("action", "pin"), ("result", "already_pinned"))): 1,
        ("chat_pin_requests_total", (("action", "pin"), ("result", "empty_pin"))): 1,
        ("chat_pin_requests_total", (("action", "unpin"), ("result", "ok"))): 1,
    }
    for (name, labels), delta in moved.items():
        assert after.value(name, **dict(labels)) == before.value(name, **dict(labels)) + delta, (name, labels)
    assert after.value("chat_turns_total", status="completed") == after_turn.value("chat_turns_total",
                                                                                     status="completed")


def test_failed_turns_are_counted_by_status(chat, fake_llm):
    before = scrape(chat.server.url)
    fake_llm.default = Reply(status=400)
    assert chat.turn("fails")[-1]["status"] == "failed"
    after = scrape(chat.server.url)
    assert after.value("chat_turns_total", status="failed") == before.value("chat_turns_total", status="failed") + 1
    assert after.value("chat_turns_total", status="completed") == before.value("chat_turns_total",
                                                                                 status="completed")


def test_open_websockets_gauge_follows_connections(live_app):
    base = live_app.url
    start = scrape(base).value("chat_open_websockets")
    clients = [ChatClient(live_app).connect() for _ in range(3)]
    wait_until(lambda: scrape(base).value("chat_open_websockets") == start + 3, 5, message="3 more sockets")
    for client in clients:
        client.close()
    wait_until(lambda: scrape(base).value("chat_open_websockets") == start, 5, message="sockets closed")


def test_compactions_run_by_a_real_worker_are_counted_through_redis(make_compaction_rig, fake_llm):
    rig = make_compaction_rig(limits=MemoryLimits(recent_turns=1), compaction_max_retries=0,
                              compaction_refine_after_folds=1)
    server = LiveServer(rig.app)
    try:
        assert scrape(server.url).value("chat_compactions_total", outcome="applied", reason="llm") == 0
        fake_llm.add_rule(Reply(json={"summary": "the person said hello twice.", "pinnedDecisions": []}),
                          model="fake-compact", times=1)
        rig.worker()
        applied_thread = "chat:" + "a" * 64
        rig.request(applied_thread, seed_turns(rig.store, applied_thread, 3))  # two turns to fold
        rig.wait_outcome(applied_thread, "applied", count=2)  # the fold, then its refinement
        wait_no_refinement(rig, applied_thread)

        fake_llm.add_rule(Reply(status=400, error_message="no"), model="fake-compact")
        failed_thread = "chat:" + "b" * 64
        rig.request(failed_thread, seed_turns(rig.store, failed_thread, 3))
        [failed, _fold] = rig.wait_outcome(failed_thread, "failed")  # the fold applied; the refinement failed
        wait_no_refinement(rig, failed_thread)

        entries = history(rig.client, applied_thread) + history(rig.client, failed_thread)
        applied = [e for e in entries if e["outcome"] == "applied"]
        result = scrape(server.url)
        assert result.value("chat_compactions_total", outcome="applied", reason="llm") == 1
        assert result.value("chat_compactions_total", outcome="applied", reason="extractive") == 2  # the folds
        assert result.value("chat_compactions_total", outcome="failed", reason=failed["reason"]) == 1
        assert result.value("chat_compaction_duration_seconds_count", outcome="applied") == len(applied) == 3
        assert result.value("chat_compaction_duration_seconds_sum", outcome="applied") == \
            pytest.approx(sum(e["durationMs"] for e in applied) / 1000)
        assert result.value("chat_compaction_duration_seconds_count", outcome="failed") == 1
        assert result.value("chat_compaction_duration_seconds_bucket", outcome="applied", le="+Inf") == 3
        assert result.value("chat_compaction_fact_retention_ratio_count") == 3
        assert result.value("chat_compaction_fact_retention_ratio_sum") == \
            pytest.approx(sum(e["factRetention"] for e in applied))
    finally:
        server.stop()


def test_compaction_histogram_buckets_are_cumulative(live_app, redis_client):
    for ms, retention in ((80, 1.0), (700, 0.85), (45_000, 0.55), (400_000, None)):
        assert metrics.observe_compaction(redis_client, {"outcome": "applied", "reason": "llm", "durationMs": ms,
                                                         "factRetention": retention})
    result = scrape(live_app.url)
    buckets = {le: result.value("chat_compaction_duration_seconds_bucket", outcome="applied", le=le)
               for le in ("0.1", "0.5", "1.0", "60.0", "300.0", "+Inf")}
    assert buckets == {"0.1": 1, "0.5": 1, "1.0": 2, "60.0": 3, "300.0": 3, "+Inf": 4}
    assert result.value("chat_compaction_duration_seconds_sum", outcome="applied") == pytest.approx(445.78)
    assert result.value("chat_compaction_fact_retention_ratio_bucket", le="0.6") == 1
    assert result.value("chat_compaction_fact_retention_ratio_bucket", le="0.9") == 2
    assert result.value("chat_compaction_fact_retention_ratio_count") == 3
    assert result.value("chat_compactions_total", outcome="applied", reason="llm") == 4


def test_store_errors_are_counted_and_metrics_still_answer(make_live_app, app_settings, own_redis):
    server = make_live_app(app_settings.with_overrides(redis_url=own_redis.url, redis_socket_timeout=0.5))
    before = scrape(server.url).value("chat_memory_store_errors_total", operation="load", process="web")
    client = ChatClient(server)
    own_redis.stop()
    hydration = client.thread()
    assert hydration["restored"] is False
    after = scrape(server.url)  # the workers' part is unavailable; the rest is served
    assert after.value("chat_memory_store_errors_total", operation="load", process="web") == before + 1
    assert after.families["chat_compactions"].samples == []


@pytest.fixture
def worker_sink_reset(own_redis):
    """After the test, store errors are counted locally again and no count is left in memory from an outage.

    Counts kept while Redis was unreachable go with the next write that succeeds: a compaction counted on a
    throwaway Redis (``own_redis``) takes them, so a failed test cannot add them to a later one's figures.
    """
    yield
    metrics.use_worker_sink(None)
    scratch = own_redis.client()
    try:
        assert metrics.observe_compaction(scratch, {"outcome": "applied"})
    finally:
        scratch.close()


def test_worker_store_errors_reach_redis_even_after_an_outage(live_app, redis_client, worker_sink_reset):
    dead_port = free_port()
    try:
        metrics.use_worker_sink(redis.Redis(port=dead_port, socket_connect_timeout=0.2, socket_timeout=0.2,
                                            retry=Retry(NoBackoff(), 0)))
        metrics.count_store_error("apply_compaction")  # Redis unreachable: kept in memory
        assert redis_client.hget(WORKER_METRICS_KEY, "store_errors|apply_compaction") is None
        metrics.use_worker_sink(redis_client)
        metrics.count_store_error("apply_compaction")
        assert redis_client.hget(WORKER_METRICS_KEY, "store_errors|apply_compaction") == "2"
    finally:
        metrics.use_worker_sink(None)
    result = scrape(live_app.url)
    assert result.value("chat_memory_store_errors_total", operation="apply_compaction", process="worker") == 2


def test_a_celery_worker_process_sends_its_store_errors_to_redis(live_app, redis_client):
    """A real Celery ``WorkController`` (it sends ``worker_init``) switches the process to the Redis sink."""
    from celery.worker import WorkController

    try:
        # before: a store error is counted in this process's registry, nothing goes to Redis
        before = scrape(live_app.url).value("chat_memory_store_errors_total", operation="load", process="web")
        metrics.count_store_error("load")
        assert scrape(live_app.url).value("chat_memory_store_errors_total", operation="load",
                                          process="web") == before + 1
        assert redis_client.hget(WORKER_METRICS_KEY, "store_errors|load") is None
        WorkController(app=live_app.app.extensions["celery"], pool_cls="solo", concurrency=1)
        # after: the worker's sink sends it to Redis, and the process's own counter stays as it was
        metrics.count_store_error("load")
        assert redis_client.hget(WORKER_METRICS_KEY, "store_errors|load") == "1"
        assert scrape(live_app.url).value("chat_memory_store_errors_total", operation="load",
                                          process="web") == before + 1
    finally:
        metrics.use_worker_sink(None)


def test_metrics_need_the_token_in_production(make_web_client, app_settings):
    closed = make_web_client(app_settings.with_overrides(env="production"))
    response = closed.get("/metrics")
    assert response.status_code == 404 and "chat_turns" not in response.get_data(as_text=True)

    guarded = make_web_client(app_settings.with_overrides(env="production", metrics_token="m-token-0123456789"))
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic m-token-0123456789"}):
        response = guarded.get("/metrics", headers=headers)
        assert response.status_code == 401 and "chat_turns" not in response.get_data(as_text=True)
        assert response.headers["WWW-Authenticate"] == 'Bearer realm="metrics"'
    result = scrape_test_client(guarded, Authorization="Bearer m-token-0123456789")
    assert "chat_turns" in result.families

    open_in_dev = make_web_client(app_settings.with_overrides(env="development"))
    assert "chat_turns" in scrape_test_client(open_in_dev).families


# ------------------------------------------------------------------------------- several gunicorn processes


def _per_pid(prom_dir: Path, prefix: str, sample: str, **labels) -> dict[int, float]:
    """``{pid: value}`` of one sample from the multiprocess files (``prefix``: ``counter``, ``gauge_livesum``)."""
    out = {}
    for path in glob.glob(str(prom_dir / f"{prefix}_*.db")):
        pid = int(Path(path).stem.rsplit("_", 1)[1])
        for key, value, _ts, _pos in MmapedDict.read_all_values_from_file(path):
            _metric, name, key_labels, _help = json.loads(key)
            if name == sample and key_labels == labels:
                out[pid] = out.get(pid, 0) + value
    return out


@pytest.mark.slow
def test_metrics_add_up_across_gunicorn_processes(redis_url, fake_llm, tmp_path):
    prom = tmp_path / "prom"
    prom.mkdir()
    stale = MmapedDict(str(prom / "counter_999999.db"))  # left by an earlier run: wiped at start
    stale.write_value(mmap_key("chat_turns", "chat_turns_total", ["status"], ["completed"], "old"), 50.0, 0.0)
    stale.close()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, APP_ENV="test", REDIS_URL=redis_url, SECRET_KEY="g" * 64, OPENAI_API_KEY="test-key",
               OPENAI_BASE_URL=fake_llm.url, CHAT_MODEL="fake-chat", PROMETHEUS_MULTIPROC_DIR=str(prom),
               WEB_THREADS="8")
    log_file = open(tmp_path / "gunicorn.log", "w")
    # as the Procfile runs it: the repository's config, the app preloaded in the master, two gthread workers
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "wsgi:app", "-c", "gunicorn.conf.py", "--preload",
                             "--worker-class", "gthread",
                             "--workers", "2", "--threads", "8", "--bind", f"127.0.0.1:{port}",
                             "--graceful-timeout", "2"], cwd=ROOT, env=env, stdout=log_file,
                            stderr=subprocess.STDOUT)
    server = SimpleNamespace(url=base, ws_url=f"ws://127.0.0.1:{port}/ws/chat")
    held: list[ChatClient] = []
    try:
        wait_until(lambda: _healthy(base), 20, message="gunicorn to answer", interval=0.1)
        assert not (prom / "counter_999999.db").exists()
        fake_llm.default = Reply(text="hello from one of the processes", first_token_delay=0.05)

        turns = 0
        while len(_per_pid(prom, "counter", "chat_turns_total", status="completed")) < 2 and turns < 48:
            results = []

            def one_turn(results: list = results) -> None:
                client = ChatClient(server).connect()
                try:
                    results.append(client.turn("hello")[-1]["status"])
                finally:
                    client.close()

            threads = [threading.Thread(target=one_turn) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert results == ["completed"] * 4
            turns += 4
        per_pid = _per_pid(prom, "counter", "chat_turns_total", status="completed")
        assert len(per_pid) == 2 and sum(per_pid.values()) == turns  # both processes counted turns

        for _ in range(6):  # whichever process answers, the totals are the same
            result = scrape(base)
            assert result.value("chat_turns_total", status="completed") == turns
            assert result.value("chat_prompt_tokens_count") == turns
            assert result.value("chat_first_token_seconds_count") == turns

        held = [ChatClient(server).connect() for _ in range(6)]
        wait_until(lambda: scrape(base).value("chat_open_websockets") == 6, 10, message="6 open sockets")
        sockets = _per_pid(prom, "gauge_livesum", "chat_open_websockets")
        victim = max(sockets, key=lambda pid: sockets[pid])
        expected = 6 - sockets[victim]
        os.kill(victim, signal.SIGKILL)  # gunicorn's child_exit marks it dead; a new worker is started
        wait_until(lambda: not (prom / f"gauge_livesum_{victim}.db").exists(), 15,
                   message="the dead worker's live gauge to be dropped")
        for _ in range(4):
            result = scrape(base)
            assert result.value("chat_open_websockets") == expected
            assert result.value("chat_turns_total", status="completed") == turns  # a dead worker's counts stay
    finally:
        for client in held:
            try:
                client.close()
            except Exception:
                pass
        stop(proc)
        log_file.close()


def _healthy(base: str) -> bool:
    try:
        return requests.get(base + "/healthz", timeout=1).status_code == 200
    except requests.RequestException:
        return False
