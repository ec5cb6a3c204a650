"""Background work yields the CPUs to people (``scripts/cpu_yield.py``; docs/bundled-model.md: The bundled model).

Both supervisors run for real (``scripts/model_server.py``, the chat one with its slot proxy), each with the
stand-in server process (``chat_support.llama_standin``: what is tested is the supervisors' and the proxy's
process handling, not llama.cpp): while a chat turn is in the proxy the compaction server's process is stopped
(state ``T``), it runs again when the turn ends, and when the chat supervisor is killed mid-turn its stale pause
lease lets the compaction supervisor continue it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from chat_support.servers import free_ports
from scripts import cpu_yield
from tests.fixtures.lanes import starts_processes
from tests.helpers.model_server import server_pids

ROOT = Path(__file__).resolve().parent.parent
KEY = "a" * 64


def start(role: str, port: int, run_dir: Path, **extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCAL_MODEL", "LOCAL_COMPACTION", "STANDIN"))}
    env.update({"LOCAL_MODEL_SERVER_MODULE": "chat_support.llama_standin", "STANDIN_MODE": "ok",
                "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "DEV_RUN_DIR": str(run_dir), **extra})
    proc = subprocess.Popen([sys.executable, "scripts/model_server.py", "--role", role, "--port", str(port)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    assert f"ready at http://127.0.0.1:{port}/v1 for {role}" in line, line
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain
    return proc




def turn(port: int) -> dict:
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json", "X-Model-Cache-Key": KEY})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return json.loads(resp.read())


def states_until(pid: int, wanted, timeout: float) -> list[str]:
    """The process's states seen every 20 ms until ``wanted(state)`` or ``timeout`` seconds."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen.append(cpu_yield.process_state(pid))
        if wanted(seen[-1]):
            break
        time.sleep(0.02)
    return seen


@pytest.fixture
@starts_processes()
def stack(tmp_path):
    """``(chat supervisor, chat port, compaction server pid, run dir, started)``; every process is stopped after."""
    chat_port, compaction_port = free_ports(2)
    started: list[subprocess.Popen] = []
    try:
        compaction = start("compaction", compaction_port, tmp_path)
        started.append(compaction)
        pid = int(cpu_yield.pid_file(compaction_port, tmp_path).read_text())
        assert server_pids(compaction.pid) == [pid]
        chat = start("chat", chat_port, tmp_path, STANDIN_TOKEN_DELAY="3.0",
                     LOCAL_COMPACTION_MODEL_PORT=str(compaction_port))
        started.append(chat)
        yield chat, chat_port, pid, tmp_path, compaction_port
    finally:
        for proc in reversed(started):
            for child in server_pids(proc.pid):
                os.kill(child, signal.SIGCONT)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()


@pytest.mark.timeout(120)
def test_the_compaction_server_is_stopped_during_a_chat_turn_and_runs_again_after_it(stack):
    chat, port, pid, run_dir, compaction_port = stack
    assert cpu_yield.process_state(pid) in ("S", "R")
    answer: list[dict] = []
    worker = threading.Thread(target=lambda: answer.append(turn(port)))
    worker.start()
    assert states_until(pid, lambda s: s == "T", 10)[-1] == "T"  # paused while the turn runs
    assert cpu_yield.lease_file(compaction_port, run_dir).exists()
    worker.join(30)
    assert answer and answer[0]["choices"][0]["message"]["content"] == "Hi there."
    # running again as the turn ended: well before a stale lease (5 s) could have done it
    assert states_until(pid, lambda s: s != "T", 1.0)[-1] not in ("T", None)
    assert not cpu_yield.lease_file(compaction_port, run_dir).exists()


@pytest.mark.timeout(120)
def test_a_chat_supervisor_killed_mid_turn_never_leaves_the_compaction_server_stopped(stack):
    chat, port, pid, run_dir, compaction_port = stack
    def doomed():
        try:
            turn(port)
        except OSError:  # its proxy is killed
            pass

    threading.Thread(target=doomed, daemon=True).start()
    assert states_until(pid, lambda s: s == "T", 10)[-1] == "T"
    for child in server_pids(chat.pid):
        os.kill(child, signal.SIGKILL)
    chat.kill()
    chat.wait(10)
    # its lease goes stale: the compaction supervisor's watchdog continues the server
    seen = states_until(pid, lambda s: s != "T", cpu_yield.LEASE_SECONDS + 5)
    assert seen[0] == "T" and seen[-1] not in ("T", None)


def test_a_pause_needs_a_compaction_server_by_its_pid_file(tmp_path):
    """A pid file naming another kind of process (a reused pid) is never signalled."""
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        cpu_yield.pid_file(9, tmp_path).write_text(f"{sleeper.pid}\n")
        pauser = cpu_yield.Pauser(9, tmp_path)
        pauser.begin()
        assert cpu_yield.process_state(sleeper.pid) != "T" and pauser.pauses == 0
        pauser.end()
    finally:
        sleeper.kill()
        sleeper.wait()
