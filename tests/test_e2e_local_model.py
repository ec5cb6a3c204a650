"""End to end with the bundled local model (issue 5, Tests): ``scripts/dev.py`` as a newcomer runs it.

The launcher starts the development Procfile's processes as real subprocesses:
the embedded Valkey store (data in a temporary folder), the bundled
Qwen2.5-Coder-0.5B-Instruct behind llama-cpp-python's OpenAI-compatible server,
gunicorn, a Celery worker and Flower, each on a free port.  Through the
websocket, two short turns get real tokens from the real model; with
``MEMORY_RECENT_TURNS=1`` the second one passes the compaction threshold, so the
worker folds the first turn with the same model into a summary that
``GET /api/chat/thread`` shows, the open socket hears ``memory`` ``succeeded``,
and Flower's API lists the ``workers.compaction.compact_thread`` task.  Then
Ctrl+C (SIGINT to the launcher's process group, as a terminal sends it) must
stop every process the launcher started.

``RESERVED_OUTPUT_TOKENS=64`` keeps answers short (the model decodes about 20
tokens/s on 2 cores).  Needs the verified GGUF file (``make test`` fetches it
first; ``scripts/dev.py`` fetches it otherwise).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.fixtures.live_app import ChatClient, answer_text
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parent.parent
MODEL_NAME = "qwen2.5-coder-0.5b-instruct"
TASK = "workers.compaction.compact_thread"
FIRST = "What is the capital of France? Answer in one short sentence."
SECOND = "Name one colour of the French flag, in one word."


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def descendants(root: int) -> set[int]:
    """Every live process under ``root`` (from /proc: ppid links), zombies excluded."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"





@pytest.fixture
def dev_system(tmp_path):
    """``python scripts/dev.py`` running on free ports; yields ``(launcher, env, log path)``; stopped after."""
    web, flower, store, model = free_ports(4)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("REDIS", "OPENAI", "CHAT_MODEL", "COMPACTION_", "MEMORY_", "FLOWER", "SECRET_KEY",
                                "BUNDLED", "TOOLS", "PROMETHEUS", "RESERVED", "MODEL_CONTEXT", "APP_ENV", "DEV_"))}
    env.update({
        "APP_ENV": "development", "PORT": str(web), "FLOWER_PORT": str(flower), "DEV_STORE_PORT": str(store),
        "LOCAL_MODEL_PORT": str(model), "DEV_STORE_DIR": str(tmp_path / "store"), "WEB_THREADS": "8",
        "SECRET_KEY": "e2e-" + "k" * 60,
        "MEMORY_RECENT_TURNS": "1",           # the second turn passes the compaction threshold
        "RESERVED_OUTPUT_TOKENS": "64",       # short answers
        "COMPACTION_RETRY_BACKOFF_SECONDS": "1",
        "PYTHONUNBUFFERED": "1",
    })
    log_path = tmp_path / "dev.log"
    with open(log_path, "w") as log:
        launcher = subprocess.Popen([sys.executable, "scripts/dev.py"], cwd=ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield launcher, env, log_path
    finally:
        if launcher.poll() is None:
            for pid in descendants(launcher.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            launcher.kill()
            launcher.wait(10)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dev_system_chats_with_the_local_model_compacts_and_stops_on_ctrl_c(dev_system):
    launcher, env, log_path = dev_system
    started = time.monotonic()
    web = f"http://127.0.0.1:{env['PORT']}"
    flower = f"http://127.0.0.1:{env['FLOWER_PORT']}"

    def log_tail() -> str:
        return log_path.read_text(errors="replace")[-4000:]

    def healthy():
        assert launcher.poll() is None, f"dev.py exited with {launcher.returncode}:\n{log_tail()}"
        try:
            return requests.get(web + "/healthz", timeout=5).status_code == 200
        except requests.RequestException:  # not listening yet, or its worker still booting
            return False

    wait_until(healthy, 300, "/healthz")
    wait_until(lambda: f"open {web}/" in log_path.read_text(), 10, "the address to open")
    page = requests.get(web + "/", timeout=10)
    assert page.status_code == 200 and MODEL_NAME in page.text and "bundled local model" in page.text

    server = type("Server", (), {"url": web, "ws_url": f"ws://127.0.0.1:{env['PORT']}/ws/chat"})
    client = ChatClient(server).connect(timeout=120)
    try:
        answers = []
        for n, text in enumerate((FIRST, SECOND), start=1):
            frames = client.turn(text, message_id=f"client-{n}", timeout=180)
            start, done = frames[0], frames[-1]
            assert (start["type"], done["type"], done["status"]) == ("start", "done", "completed"), frames
            assert done["messageId"] == start["messageId"]
            answer = answer_text(frames)
            assert answer.strip() != "", frames  # real tokens from the real model
            assert len([f for f in frames if f["type"] == "delta"]) >= 2  # streamed, not one block
            answers.append(answer.strip())
        assert "paris" in answers[0].lower()

        # The second turn made the thread due: the worker folds the first turn with the same model.
        # (a failed attempt is retried after 1 s, so wait for the success itself)
        memory = client.recv_until(lambda f: f["type"] == "memory" and f["status"] == "succeeded", timeout=240)
        assert [f["type"] for f in memory] == ["memory"] * len(memory)
        assert memory[0]["status"] == "started" and memory[-1]["message"] == "Older turns were summarized."
        thread = wait_until(lambda: (lambda t: t if t.get("summaryPreview") else None)(client.thread()), 30,
                            "summaryPreview")
    finally:
        client.close()
    assert thread["restored"] is True
    assert 0 < len(thread["summaryPreview"]) <= 240 and thread["summaryPreview"].strip()
    assert [(m["role"], m["text"]) for m in thread["messages"]] == [("user", SECOND), ("assistant", answers[1])]
    assert len(thread["pinnedDecisions"]) <= 20

    # Flower (events from the worker) lists the compaction task of this thread.
    def compaction_task():
        tasks = requests.get(flower + "/api/tasks", timeout=5).json()
        done = [t for t in tasks.values() if t["name"] == TASK and thread["threadId"] in (t.get("args") or "")
                and t["state"] == "SUCCESS"]
        return done or None
    listed = wait_until(compaction_task, 30, "Flower to list the compaction task")
    assert listed[0]["result"] == "'applied'"
    print(f"\ne2e: up, two turns and a compaction in {time.monotonic() - started:.1f} s")

    # Ctrl+C: SIGINT to the launcher's process group, as a terminal does.
    children = descendants(launcher.pid)
    assert len(children) >= 6  # store, model (+ its server), web (+ worker), worker, flower
    os.killpg(launcher.pid, signal.SIGINT)
    launcher.wait(60)
    wait_until(lambda: not any(alive(pid) for pid in children), 15, "every child to exit")
    assert [pid for pid in children if alive(pid)] == []
    ports = [int(env[k]) for k in ("PORT", "FLOWER_PORT", "DEV_STORE_PORT", "LOCAL_MODEL_PORT")]
    assert [p for p in ports if port_open(p)] == []
    assert "store: valkey on redis://127.0.0.1:" in log_path.read_text()
