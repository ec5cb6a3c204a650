"""The bundled model's start check (docs/bundled-model.md): a server that cannot complete stops the run.

``scripts/model_server.py`` and ``make run`` (``scripts/dev.py`` with honcho) are run for real, with a
stand-in model server (``chat_support.llama_standin``: the fake model server) that answers ``/v1/models`` and then kills
itself with SIGILL at its first completion, as a llama.cpp build with an instruction the machine lacks does.
Expected: one line naming the signal and what to do, a non-zero exit, and no restart.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from chat_support.processes import descendants
from chat_support.servers import free_ports, port_open

# Every test runs scripts/model_server.py (the bundled model's supervisor) or scripts/dev.py as a process of its own.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
STANDIN = "chat_support.llama_standin"


def standin_env(tmp_path: Path, mode: str, fail_port: int | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("REDIS", "OPENAI", "CHAT_MODEL", "COMPACTION_", "BUNDLED", "DEV_", "LOCAL_MODEL",
                                "STANDIN", "SECRET_KEY", "APP_ENV"))}
    env.update({"LOCAL_MODEL_SERVER_MODULE": STANDIN, "STANDIN_MODE": mode, "PYTHONPATH": str(ROOT),
                "STANDIN_STARTS": str(tmp_path / "starts.txt"), "PYTHONUNBUFFERED": "1",
                "LOCAL_MODEL_SLOT_FILES": "0"})  # no slot proxy: the stand-in itself serves the announced port
    if fail_port is not None:
        env["STANDIN_FAIL_PORT"] = str(fail_port)
    env.update(extra)
    return env


def starts(tmp_path: Path) -> list[int]:
    path = tmp_path / "starts.txt"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


@pytest.mark.timeout(120)
def test_serve_reports_a_sigill_at_the_first_completion_and_exits(tmp_path):
    (port,) = free_ports(1)
    result = subprocess.run([sys.executable, "scripts/model_server.py", "--port", str(port)], cwd=ROOT,
                            env=standin_env(tmp_path, "sigill"), capture_output=True, text=True, timeout=90)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("local model:")]
    assert errors == [f"local model: error: the chat model server (127.0.0.1:{port}) crashed with an illegal "
                      "instruction (SIGILL) at its first completion: the prebuilt llama.cpp (xllamacpp) needs an "
                      "x86-64 CPU with AVX2, AVX, FMA and F16C, which this machine does not allow; or use a hosted "
                      "provider (set OPENAI_BASE_URL and/or OPENAI_API_KEY)"], result.stderr
    assert "ready at" not in result.stdout and "restarting" not in result.stdout
    assert starts(tmp_path) == [port]  # started once, never restarted


@pytest.mark.timeout(120)
def test_serve_reports_an_http_error_of_the_first_completion(tmp_path):
    (port,) = free_ports(1)
    result = subprocess.run([sys.executable, "scripts/model_server.py", "--role", "compaction",
                             "--port", str(port)], cwd=ROOT, env=standin_env(tmp_path, "http500"),
                            capture_output=True, text=True, timeout=90)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"local model: error: the compaction model server (127.0.0.1:{port}) answered HTTP 500 to a one-token "
        "completion: see its messages above, or use a hosted provider (set OPENAI_BASE_URL and/or OPENAI_API_KEY)")
    assert starts(tmp_path) == [port]


@pytest.mark.timeout(120)
def test_serve_announces_only_after_the_one_token_completion_and_stops_on_sigterm(tmp_path):
    (port,) = free_ports(1)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "scripts/model_server.py", "--port", str(port)], cwd=ROOT,
                            env=standin_env(tmp_path, "ok", DEV_RUN_DIR=str(run_dir)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"local model: qwen2.5-coder-0.5b-instruct ready at http://127.0.0.1:{port}/v1 "
                               "for chat (llama.cpp server, xllamacpp "), line
        assert "; one-token check " in line, line
        assert (run_dir / f"model-{port}.ready").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert not (run_dir / f"model-{port}.ready").exists()


@pytest.mark.timeout(180)
def test_a_crash_after_the_check_is_restarted_with_a_line_each_time_then_given_up(tmp_path):
    (port,) = free_ports(1)
    proc = subprocess.Popen([sys.executable, "scripts/model_server.py", "--port", str(port)], cwd=ROOT,
                            env=standin_env(tmp_path, "segv-chat"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for crash in range(1, lm_max_crashes() + 2):
            while "ready at" not in (line := proc.stdout.readline()):
                assert line, "".join(lines)
                lines.append(line)
            lines.append(line)
            with pytest.raises(requests.ConnectionError):  # the stand-in dies answering this request
                requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"messages": []}, timeout=30)
            if crash <= lm_max_crashes():
                assert proc.poll() is None
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines += proc.stdout.readlines()
    said = [line.strip() for line in lines if line.startswith("local model:") and "ready at" not in line]
    restarts = [f"local model: the chat model server (127.0.0.1:{port}) crashed with a segmentation fault "
                f"(SIGSEGV) after {s} s of service; restarting it and checking it again ({n} of 3 restarts allowed "
                "in 300 s)" for n, s in ((1, 0), (2, 0), (3, 0))]
    assert code == 1
    assert [re.sub(r"after \d+ s", "after 0 s", line) for line in said[:3]] == restarts
    assert re.sub(r"after \d+ s", "after 0 s", said[3]) == (
        f"local model: error: the chat model server (127.0.0.1:{port}) crashed with a segmentation fault (SIGSEGV) "
        "after 0 s of service, the 4th time in 300 s; giving up: see its messages above, or use a hosted provider "
        "(set OPENAI_BASE_URL and/or OPENAI_API_KEY)")
    assert starts(tmp_path) == [port] * 4


def lm_max_crashes() -> int:
    from scripts import model_server

    return model_server.MAX_CRASHES


@pytest.mark.timeout(240)
def test_make_run_stops_with_the_one_line_cause(tmp_path):
    """``scripts/dev.py`` (what ``make run`` runs): the chat model server dies with SIGILL at its start check."""
    web, flower, store, model, compaction = free_ports(5)
    env = standin_env(tmp_path, "sigill", fail_port=model)
    env.update({"APP_ENV": "development", "PORT": str(web), "FLOWER_PORT": str(flower),
                "DEV_STORE_PORT": str(store), "LOCAL_MODEL_PORT": str(model),
                "LOCAL_COMPACTION_MODEL_PORT": str(compaction), "DEV_STORE_DIR": str(tmp_path / "store"),
                "SECRET_KEY": "s" * 64, "WEB_THREADS": "4"})
    log_path = tmp_path / "dev.log"
    with open(log_path, "w") as log:
        launcher = subprocess.Popen([sys.executable, "scripts/dev.py"], cwd=ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = launcher.wait(180)
    finally:
        if launcher.poll() is None:
            for pid in descendants(launcher.pid):
                os.kill(pid, signal.SIGKILL)
            launcher.kill()
            launcher.wait(10)
    text = log_path.read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    expected = (f"dev: error: the chat model server (127.0.0.1:{model}) crashed with an illegal instruction "
                "(SIGILL) at its first completion")
    assert code == 1, text
    assert lines[-1].startswith(expected), text  # the last line says why
    assert [line for line in lines if line.startswith("dev: error:")] == [lines[-1]]
    assert "restarting" not in text and "open http://" not in text
    # Neither server restarted. The compaction server may be stopped before it records its start: the
    # launcher stops every process as soon as the chat server's start check fails.
    started = starts(tmp_path)
    assert started.count(model) == 1 and started.count(compaction) <= 1, started
    assert set(started) <= {model, compaction}, started
    assert [p for p in (web, flower, store, model, compaction) if port_open(p)] == []  # nothing left running
