"""The bundled model servers' CPU settings (docs/bundled-model.md): the chat server reads prompts with every
CPU, the compaction server with half and at a lower priority, so a chat turn's prompt is read first."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import model_server
from tests.helpers.model_server import server_pids

ROOT = Path(__file__).resolve().parent.parent


def test_chat_reads_prompts_with_every_cpu_and_decodes_with_every_cpu_while_compaction_yields():
    cpus = os.cpu_count() or 2
    chat = model_server.server_settings("chat", environ={})
    assert chat["yield"] is True and chat["threads"] == cpus  # the compaction server is paused during turns
    assert chat["batch_threads"] == cpus
    assert chat["nice"] == 0
    for off in ({"LOCAL_MODEL_YIELD": "off"}, {"LOCAL_MODEL_SLOT_FILES": "0"}):  # (yielding needs the proxy)
        chat = model_server.server_settings("chat", environ=off)
        assert chat["yield"] is False and chat["threads"] == max(1, cpus // 2)
    assert model_server.server_settings("compaction", environ={})["yield"] is False
    with pytest.raises(ValueError):
        model_server.server_settings("chat", environ={"LOCAL_MODEL_YIELD": "maybe"})


def test_both_servers_read_in_small_batches_so_a_cancel_stops_within_one():
    for role in ("chat", "compaction"):
        assert model_server.server_settings(role, environ={})["batch"] == 128
    assert model_server.server_settings("chat", environ={"LOCAL_MODEL_BATCH": "64"})["batch"] == 64


def test_compaction_reads_with_half_the_cpus_at_niceness_ten():
    compaction = model_server.server_settings("compaction", environ={})
    assert compaction["batch_threads"] == compaction["threads"] == max(1, (os.cpu_count() or 2) // 2)
    assert compaction["nice"] == 10
    assert compaction["n_cache_reuse"] == 0


def test_the_environment_overrides_threads_and_niceness():
    env = {"LOCAL_MODEL_THREADS": "3", "LOCAL_MODEL_BATCH_THREADS": "1", "LOCAL_COMPACTION_NICE": "0"}
    assert model_server.server_settings("chat", environ=env)["batch_threads"] == 1
    compaction = model_server.server_settings("compaction", environ=env)
    assert (compaction["threads"], compaction["batch_threads"], compaction["nice"]) == (3, 1, 0)




@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("role, niceness", [("compaction", 10), ("chat", 0)])
def test_the_supervisor_starts_the_compaction_server_at_niceness_ten(tmp_path, role, niceness):
    """``scripts/model_server.py`` run for real (with the stand-in server process, which the command line
    reaches as the real child would): the server process it starts has the role's niceness."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCAL_MODEL", "LOCAL_COMPACTION", "STANDIN"))}
    env.update({"LOCAL_MODEL_SERVER_MODULE": "chat_support.llama_standin", "STANDIN_MODE": "ok",
                "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
    with socket.socket() as sock:  # a free loopback port, closed so the server may bind it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "scripts/model_server.py", "--role", role, "--port", str(port)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert f"ready at http://127.0.0.1:{port}/v1 for {role}" in line, line
        (server,) = server_pids(proc.pid)
        assert os.getpriority(os.PRIO_PROCESS, server) == os.getpriority(os.PRIO_PROCESS, 0) + niceness
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0



def test_only_the_chat_server_keeps_slot_files_within_their_bounds():
    chat = model_server.server_settings("chat", environ={})
    assert (chat["slot_files"], chat["slot_mib"]) == (64, 1024)
    compaction = model_server.server_settings("compaction", environ={})
    assert (compaction["slot_files"], compaction["slot_mib"]) == (0, 0)  # each compaction prompt is new
    env = {"LOCAL_MODEL_SLOT_FILES": "8", "LOCAL_MODEL_SLOT_MIB": "100"}
    assert [model_server.server_settings("chat", environ=env)[k] for k in ("slot_files", "slot_mib")] == [8, 100]
    assert model_server.server_settings("chat", environ={"LOCAL_MODEL_SLOT_FILES": "0"})["slot_files"] == 0
