"""End to end with the bundled local model: ``scripts/dev.py`` as a newcomer runs it.

The launcher starts the development Procfile's processes as real subprocesses:
the embedded Valkey store (data in a temporary folder), the bundled
Qwen2.5-Coder-0.5B-Instruct behind two llama.cpp OpenAI-compatible servers from the
prebuilt xllamacpp wheel (``scripts/model_server.py``; one for chat, one for compaction),
gunicorn, a Celery worker and Flower, each on a free port.  Both model servers must pass
their one-token start check with the pinned xllamacpp version.  Through the
websocket, two short turns get real tokens from the real model; with
``MEMORY_RECENT_TURNS=1`` the second one passes the compaction threshold, so the
worker folds the first turn (no model) into a record that ``GET /api/chat/thread`` shows and the open
socket hears the fold's ``memory`` ``succeeded``; once the thread has been quiet for
``COMPACTION_IDLE_SECONDS`` (the bundled model refines only a quiet thread) the worker refines it with
the same model, on the compaction server only, and the socket hears that refinement ``started`` and
``succeeded``.  Flower's API lists the ``workers.compact_thread`` and ``workers.refine_thread`` tasks.
The refinement's structured answer goes through llama.cpp's native ``json_schema`` response format: no
model server logs an error or an HTTP 5xx, and no response format is refused.  Then
Ctrl+C (SIGINT to the launcher's process group, as a terminal sends it) must
stop every process the launcher started.

What is asserted is what the system guarantees, not what a sampled 0.5B model happens to say: the turns
stream real tokens and are stored as streamed, the thread folds, the model servers log no error, everything
stops.  The chat turns sample as a person's turns do (the server's default temperature and a random seed), so
their content is not checked.  The one content check asks the chat server directly with fixed sampling
(temperature 0, seed 7: greedy decoding, the same answer on every run of the pinned model and server) a question
whose answer is one word, and tolerates any wording around it ("Paris.", "The capital of France is Paris").

``RESERVED_OUTPUT_TOKENS=64`` keeps answers short (the model decodes about 20
tokens/s on 2 cores).  Needs the verified GGUF file (``make test`` fetches it
first; ``scripts/dev.py`` fetches it otherwise).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from chat_support.live_app import ChatClient, answer_text
from chat_support.polling import wait_until
from chat_support.processes import descendants
from chat_support.servers import free_ports, port_open
from tests.fixtures.lanes import starts_processes

ROOT = Path(__file__).resolve().parent.parent

MODEL_NAME = "qwen2.5-coder-0.5b-instruct"
TASK = "workers.compact_thread"
REFINE_TASK = "workers.refine_thread"
# The first turn is long enough that folding it leaves room for the model's gist under the gain rule (docs/memory.md: A
# compaction): it only asks (questions, requests, an instruction for this reply), so the record keeps no statement
# of it, only the question and the answer's sentence.
FIRST = ("Could you help me plan a relaxed weekend away with a few friends and give some ideas about where to go and "
         "what to see and how much walking is reasonable for a group that does not hike much? "
         "Can you also tell me which season is best for a city trip in Europe and whether trains or flights are "
         "usually easier between the big cities? Please keep all of that for later and start with something simple. "
         "What is the capital of France? Answer in one short sentence.")
SECOND = "Name one colour of the French flag, in one word."


def lines_by_process(log: str) -> dict[str, list[str]]:
    """Each honcho process's lines (``"18:08:07 model            | text"``), by process name."""
    lines: dict[str, list[str]] = {}
    for line in log.splitlines():
        match = re.match(r"^\S+ (\S+)\s*\| (.*)$", line)
        if match:
            lines.setdefault(match.group(1), []).append(match.group(2))
    return lines


def tasks_by_process(log: str) -> dict[str, int]:
    """How many requests each model server processed (llama.cpp logs ``processing task`` once per completion)."""
    return {name: sum("launch_slot_" in line and "processing task" in line for line in lines)
            for name, lines in lines_by_process(log).items() if name in ("model", "compaction-model")}


def pinned_xllamacpp() -> str:
    """The xllamacpp version ``requirements-local.txt`` pins."""
    return re.search(r"^xllamacpp==(\S+)$", (ROOT / "requirements-local.txt").read_text(), re.M).group(1)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"





@pytest.fixture
@starts_processes()
def dev_system(tmp_path):
    """``python scripts/dev.py`` running on free ports; yields ``(launcher, env, log path)``; stopped after."""
    web, flower, store, model, compaction = free_ports(5)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("REDIS", "OPENAI", "CHAT_MODEL", "COMPACTION_", "MEMORY_", "FLOWER", "SECRET_KEY",
                                "BUNDLED", "TOOLS", "PROMETHEUS", "RESERVED", "MODEL_CONTEXT", "APP_ENV", "DEV_",
                                "LOCAL_MODEL"))}
    env.update({
        "APP_ENV": "development", "PORT": str(web), "FLOWER_PORT": str(flower), "DEV_STORE_PORT": str(store),
        "LOCAL_MODEL_PORT": str(model), "LOCAL_COMPACTION_MODEL_PORT": str(compaction),
        "DEV_STORE_DIR": str(tmp_path / "store"), "WEB_THREADS": "8",
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
    assert requests.get(web + "/healthz", timeout=10).json() == {"status": "ok", "store": "up", "model": "up"}
    # Both servers passed the one-token check, served by the pinned prebuilt llama.cpp server.
    expected = pinned_xllamacpp()
    ready = re.findall(r"ready at http://127\.0\.0\.1:(\d+)/v1 for (\w+) \(llama\.cpp server, xllamacpp (\S+);",
                       log_path.read_text())
    assert sorted(ready) == sorted([(str(env["LOCAL_MODEL_PORT"]), "chat", expected),
                                    (str(env["LOCAL_COMPACTION_MODEL_PORT"]), "compaction", expected)])
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
            if len(answer.split()) >= 3:  # a sentence streams in pieces (an answer may be one word: one token)
                assert len([f for f in frames if f["type"] == "delta"]) >= 2, frames
            answers.append(answer.strip())
        # content, with fixed sampling: asked of the chat server directly (through its slot proxy, no thread key)
        fixed = requests.post(f"http://127.0.0.1:{env['LOCAL_MODEL_PORT']}/v1/chat/completions", timeout=180, json={
            "model": MODEL_NAME, "temperature": 0, "seed": 7, "max_tokens": 16,
            "messages": [{"role": "user", "content": "What is the capital of France? Answer in one word."}]})
        assert fixed.status_code == 200, fixed.text
        assert "paris" in fixed.json()["choices"][0]["message"]["content"].lower()

        # The second turn made the thread due: the worker folds the first turn, without a model, once the
        # second turn's done is sent.
        fold = client.recv_until(lambda f: f["type"] == "memory", timeout=60)
        assert [f["type"] for f in fold] == ["memory"]
        assert (fold[0]["status"], fold[0]["step"], fold[0]["message"]) == (
            "succeeded", "fold", "Older turns were moved to the record.")
        folded = client.thread()
        assert folded["summaryPreview"].strip() and folded["messages"][0]["text"] == SECOND
        # Quiet for COMPACTION_IDLE_SECONDS (20): the worker refines the folded turn with the compaction model.
        # (a failed attempt is retried after 1 s, so wait for the success itself)
        memory = client.recv_until(lambda f: f["type"] == "memory" and f["status"] == "succeeded", timeout=240)
        assert [f["type"] for f in memory] == ["memory"] * len(memory)
        assert all(f["step"] == "refine" for f in memory)
        assert memory[0]["status"] == "started" and memory[-1]["message"] == "Older turns were summarized."
        thread = client.thread()
    finally:
        client.close()
    assert thread["restored"] is True
    assert 0 < len(thread["summaryPreview"]) <= 240 and thread["summaryPreview"].strip()
    assert [(m["role"], m["text"]) for m in thread["messages"]] == [("user", SECOND), ("assistant", answers[1])]
    assert len(thread["pinnedDecisions"]) <= 20

    # Flower (events from the worker) lists the fold and the refinement of this thread.
    def listed_task(name: str, result: str):
        def find():
            tasks = requests.get(flower + "/api/tasks", timeout=5).json()
            done = [t for t in tasks.values() if t["name"] == name and thread["threadId"] in (t.get("args") or "")
                    and t["state"] == "SUCCESS" and t.get("result") == result]
            return done or None
        return find
    wait_until(listed_task(TASK, "'fold applied'"), 30, "Flower to list the fold")
    wait_until(listed_task(REFINE_TASK, "'refined'"), 30, "Flower to list the refinement")
    print(f"\ne2e: up, two turns, a fold and a refinement in {time.monotonic() - started:.1f} s")

    # Chat turns went to the chat server, the refinement to the compaction server (llama.cpp's task lines).
    log = log_path.read_text(errors="replace")
    tasks = tasks_by_process(log)
    # the start check, the base state of the system prompt (scripts/slot_cache.py), the two turns, the fixed-sampling
    # question, and at most one warm-up of the thread's new prefix after the fold and one after the refinement
    # (each skipped when a turn was in flight)
    assert 1 + 1 + 2 + 1 <= tasks["model"] <= 1 + 1 + 2 + 1 + 2
    assert tasks["compaction-model"] >= 1 + 1  # the start check and the refinement
    # No server error: llama.cpp logs a failed request as a warning or error with its JSON error (code 500
    # for a refused response format), and the app logs a refused format; none of that happened.
    for name in ("model", "compaction-model"):
        lines = lines_by_process(log)[name]
        assert [line for line in lines if re.search(r'"code":\s*5\d\d|Traceback|^\S+ E ', line)] == [], name
        assert [line for line in lines if "got exception" in line] == [], name
    assert "refused response_format" not in log and "model provider refuses" not in log

    # Ctrl+C: SIGINT to the launcher's process group, as a terminal does.
    children = descendants(launcher.pid)
    assert len(children) >= 8  # store, 2 x model (+ its server), web (+ worker), worker, flower
    os.killpg(launcher.pid, signal.SIGINT)
    launcher.wait(60)
    wait_until(lambda: not any(alive(pid) for pid in children), 15, "every child to exit")
    assert [pid for pid in children if alive(pid)] == []
    ports = [int(env[k]) for k in ("PORT", "FLOWER_PORT", "DEV_STORE_PORT", "LOCAL_MODEL_PORT",
                                   "LOCAL_COMPACTION_MODEL_PORT")]
    assert [p for p in ports if port_open(p)] == []
    assert "store: valkey on redis://127.0.0.1:" in log_path.read_text()
