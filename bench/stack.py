"""The local stack as ``make run`` starts it, for the paced benchmarks: ``scripts/dev.py``'s own plan (its
environment and process names) and ``Procfile.dev``'s own command lines, on free loopback ports, with the
embedded store's data and the run files in a temporary folder.

Nothing is hard-coded here but the ports and folders: a process line added to ``Procfile.dev`` and to the
plan (e.g. a separate ``refiner`` worker) is started too.  ``--skip`` leaves out named processes (``flower``
costs CPU on a 2-core machine; it is started by default because ``make run`` starts it).  Each process runs
in its own process group, logging to ``<log_dir>/<name>.log``; ``stop()`` (also on Ctrl+C or SIGTERM of the
benchmark: the caller's ``finally``) sends SIGTERM to every group, web first, store last, and SIGKILL to what
is left after 5 s.  The environment the bench passes is the environment ``make run`` would see, without any
``OPENAI_*`` / ``REDIS_URL`` / ``COMPACTION_BASE_URL`` / model names of the caller's shell (so the bundled
model is used) and with a fresh ``SECRET_KEY``; ``--env KEY=VALUE`` on the benchmarks adds a setting (for
trying one; the real case passes none).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
DROP_PREFIXES = ("APP_ENV", "OPENAI", "COMPACTION_BASE", "CHAT_MODEL", "COMPACTION_MODEL", "REDIS_URL", "REDIS_TLS_URL",
                 "PROMETHEUS", "DEV_")
STOP_FIRST = ("web", "flower")
STOP_LAST = ("compaction-model", "model", "store")


def _dev_module():
    """``scripts/dev.py`` as the module ``scripts.dev`` (imported on first use: it needs honcho)."""
    from scripts import dev

    return dev


def _free_port() -> int:
    from chat_support.servers import free_port
    return free_port()


class Stack:
    """``make run``'s processes on free ports; ``start()``, then ``url``, ``env``, ``log(name)``; ``stop()``."""

    def __init__(self, log_dir: Path, *, skip: tuple[str, ...] = (), extra_env: dict[str, str] | None = None):
        self.log_dir = log_dir
        self.skip = set(skip)
        self.extra_env = dict(extra_env or {})
        self.procs: dict[str, subprocess.Popen] = {}
        self.env: dict[str, str] = {}
        self.names: list[str] = []
        self.not_started: list[str] = []
        self.web_port = 0

    def plan(self) -> tuple[dict[str, str], list[str], dict[str, str]]:
        dev = _dev_module()
        from honcho.environ import parse_procfile

        environ = {k: v for k, v in os.environ.items() if not k.startswith(DROP_PREFIXES)}
        run_dir = self.log_dir / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        store_dir = self.log_dir / "store"
        store_dir.mkdir(exist_ok=True)
        environ.update(PORT=str(_free_port()), FLOWER_PORT=str(_free_port()), DEV_STORE_PORT=str(_free_port()),
                       LOCAL_MODEL_PORT=str(_free_port()), LOCAL_COMPACTION_MODEL_PORT=str(_free_port()),
                       DEV_STORE_DIR=str(store_dir), SECRET_KEY=secrets.token_hex(32))
        environ.update(self.extra_env)
        env, names, _notes = dev.plan(environ, run_dir)
        commands = parse_procfile(dev.PROCFILE.read_text()).processes
        self.not_started = [n for n in commands if n not in names or n in self.skip]
        return env, [n for n in names if n not in self.skip], commands

    def start(self, timeout: float = 600.0) -> "Stack":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env, names, commands = self.plan()
        self.env, self.names = env, names
        self.web_port = int(env["PORT"])
        if "model" in names:
            _dev_module().local_model.fetch()  # as make run: the GGUF file, verified
        for name in names:
            with open(self.log_dir / f"{name}.log", "w") as log:
                self.procs[name] = subprocess.Popen(commands[name], shell=True, cwd=ROOT, env=env, stdout=log,
                                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                    start_new_session=True)
        deadline = time.monotonic() + timeout
        workers = [n for n in names if "celery" in commands[n] and " worker" in commands[n]]
        while True:
            self._check_alive()
            ok = all(" ready." in self.log(n) for n in workers)
            if ok:
                try:
                    ok = requests.get(self.url + "/healthz", timeout=5).status_code == 200
                except requests.RequestException:
                    ok = False
            if ok:
                return self
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: the stack was not ready after {timeout:.0f} s (logs in {self.log_dir})")
            time.sleep(0.5)

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise SystemExit(f"bench: {name} exited ({proc.returncode}):\n{self.log(name)[-3000:]}")

    def log(self, name: str) -> str:
        try:
            return (self.log_dir / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.web_port}/ws/chat"

    def describe(self) -> str:
        left = f"; not started: {', '.join(self.not_started)}" if self.not_started else ""
        return f"processes (Procfile.dev, scripts/dev.py's plan): {', '.join(self.names)}{left}"

    def stop(self) -> None:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl+C does not cut the shutdown short
        try:
            self._stop()
        finally:
            signal.signal(signal.SIGINT, previous)

    def _stop(self) -> None:
        order = ([n for n in STOP_FIRST if n in self.procs]
                 + [n for n in self.procs if n not in STOP_FIRST and n not in STOP_LAST]
                 + [n for n in STOP_LAST if n in self.procs])
        last = [n for n in order if n in STOP_LAST]
        for group in ([n for n in order if n not in last], last):  # the app's processes, then models and store
            for name in group:
                self._signal(name, signal.SIGTERM)
            deadline = time.monotonic() + 5
            for name in group:
                proc = self.procs[name]
                try:
                    proc.wait(max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    self._signal(name, signal.SIGKILL)
                    try:
                        proc.wait(5)
                    except subprocess.TimeoutExpired:
                        pass
        for name in self.procs:  # a child left behind in a group whose leader exited
            self._signal(name, signal.SIGKILL)
        self.procs.clear()

    def _signal(self, name: str, sig: int) -> None:
        proc = self.procs[name]
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def terminate_on_sigterm() -> None:
    """Make SIGTERM and SIGHUP end the benchmark like Ctrl+C (so every ``finally`` stops what it started)."""
    def handler(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def parse_env(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"bench: --env wants KEY=VALUE, got {pair!r}")
        out[key] = value
    return out
