"""Benchmark of the compaction store path (docs/benchmarks.md: Performance): prints figures, asserts nothing.

1. Compactions applied per second by one worker (embedded Celery worker, solo pool)
   with a zero-latency fake model: the cost of re-reading, planning, validating,
   the Lua compare-and-set, the event and the history entry.
2. The stale-discard rate under 20 concurrent writers: 20 threads commit turns to
   one chat thread as fast as they can and request compactions the way the turn
   runner does, while one worker compacts; then the same with two compaction
   runners racing (what a duplicate delivery or a second worker would do).

Usage::

    python -m bench.compaction_store [--threads 200] [--seconds 5]

Uses ``REDIS_URL`` when set (its database is flushed!), else an embedded Valkey.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("APP_ENV", "test")

import redis  # noqa: E402
from celery.contrib.testing.worker import start_worker  # noqa: E402

import app.compaction.service as service_module  # noqa: E402
from app import create_app  # noqa: E402
from app.compaction.service import run_compaction  # noqa: E402
from app.memory.compaction import uncompacted_tokens  # noqa: E402
from app.memory.final_turn import FinalTurn  # noqa: E402
from app.settings import Settings  # noqa: E402
from app.store.keys import ThreadKeys  # noqa: E402
from chat_support.fake_llm import FakeLLM, Reply  # noqa: E402
from chat_support.redis_server import configured_or_embedded  # noqa: E402
from chat_support.threads import history, thread_id_for  # noqa: E402

ANSWER = {"summary": "They chatted about small things.", "pinnedDecisions": ["Keep answers short"]}
ANSWER_TAIL = ", and a few more words about it so that folding the turn frees room in the prompt" * 2


def word(k: int) -> str:
    """A lower-case word for ``k`` (message texts carry no digits, so the fact guard stays idle)."""
    return "".join(chr(97 + (k // 26 ** i) % 26) for i in range(4))


def commit(store, tid: str, n: int, tag: str = ""):
    return store.commit_final_turn(tid, FinalTurn(f"question {word(n)}", f"answer {word(n)}" + ANSWER_TAIL,
                                                  "completed", "chat", user_id=f"u{tag}{n}",
                                                  assistant_id=f"a{tag}{n}"))


def request(services, tid: str, result) -> bool:
    state = services.store.load(tid)
    return services.compaction_requests.after_commit(
        tid, message_count=result.message_count, uncompacted_tokens=uncompacted_tokens(state.messages, services.counter),
        version=result.version)


def applied_per_second(app, services, client, threads: int) -> tuple[float, int]:
    """Seed ``threads`` threads of 6 turns, enqueue their compactions, time one worker draining them."""
    tids = [thread_id_for(f"bench-rate-{i}") for i in range(threads)]
    for tid in tids:
        for n in range(1, 7):
            result = commit(services.store, tid, n)
        assert request(services, tid, result)
    celery = app.extensions["celery"]
    with start_worker(celery, pool="solo", perform_ping_check=False, loglevel="ERROR", shutdown_timeout=30):
        started = time.perf_counter()
        while sum(client.llen(ThreadKeys(t).compactions) for t in tids) < threads:
            time.sleep(0.01)
        elapsed = time.perf_counter() - started
    applied = sum(1 for t in tids for e in history(client, t) if e["outcome"] == "applied")
    return applied / elapsed, applied


def writers_scenario(app, services, client, seconds: float, writers: int, racing_runners: int) -> dict:
    """``writers`` threads commit to one thread for ``seconds``; compactions run meanwhile."""
    tid = thread_id_for(f"bench-writers-{racing_runners}")
    stop = threading.Event()
    committed = []
    lock = threading.Lock()

    def writer(w: int):
        n = 0
        while not stop.is_set():
            n += 1
            result = commit(services.store, tid, n, tag=f"w{w}x")
            with lock:
                committed.append((f"uw{w}x{n}", f"aw{w}x{n}"))
            if racing_runners == 0:
                request(services, tid, result)

    def runner():
        while not stop.is_set():
            version = services.store.load(tid).version
            if run_compaction(services, tid, version).outcome == "skipped":
                time.sleep(0.001)

    workers = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    runners = [threading.Thread(target=runner) for _ in range(racing_runners)]
    celery = app.extensions["celery"]
    if racing_runners == 0:
        context = start_worker(celery, pool="solo", perform_ping_check=False, loglevel="ERROR", shutdown_timeout=30)
    else:
        from contextlib import nullcontext
        context = nullcontext()
    with context:
        for t in workers + runners:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in workers + runners:
            t.join()
        if racing_runners == 0:
            deadline = time.monotonic() + 30
            while client.exists(ThreadKeys(tid).compacting) and time.monotonic() < deadline:
                time.sleep(0.01)
    outcomes = [e["outcome"] for e in history(client, tid)]
    applied, stale = outcomes.count("applied"), outcomes.count("stale")
    stored = [m.id for m in services.store.load(tid).messages]
    # Every committed message is either stored or was folded by an applied compaction; none twice.
    assert len(stored) == len(set(stored))
    return {"turns": len(committed), "applied": applied, "stale": stale,
            "stale_rate": stale / (applied + stale) if applied + stale else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=200, help="threads compacted for the rate figure")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each writers scenario")
    parser.add_argument("--writers", type=int, default=20)
    args = parser.parse_args()
    service_module.HISTORY_MAX = 1_000_000  # count every outcome (the service keeps the last 50)

    url, server = configured_or_embedded()
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    try:
        with FakeLLM(Reply(json=ANSWER)) as llm:
            settings = Settings(env="test", redis_url=url, secret_key="b" * 64, openai_api_key="bench",
                                openai_base_url=llm.url, chat_model="fake-chat", compaction_model="fake-compact",
                                compaction_retry_backoff=0.1)
            app = create_app(settings)
            logging.getLogger().setLevel(logging.WARNING)
            services = app.extensions["chat"]
            rate, applied = applied_per_second(app, services, client, args.threads)
            print(f"compactions applied per second, one worker, zero-latency model: {rate:.1f} "
                  f"({applied} threads)")
            for runners in (0, 2):
                figures = writers_scenario(app, services, client, args.seconds, args.writers, runners)
                label = "one worker" if runners == 0 else f"{runners} racing runners"
                print(f"stale-discard rate, {args.writers} concurrent writers, {label}: "
                      f"{figures['stale_rate']:.1%} ({figures['stale']} stale / {figures['applied']} applied; "
                      f"{figures['turns']} turns committed)")
    finally:
        client.close()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
