"""The bundled model's real llama.cpp server (``scripts/model_server.py``), started and stopped by a test.

Needs the verified GGUF file (``make test`` fetches it first).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from chat_support.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]


def start_model_server(port: int, log: Path) -> subprocess.Popen:
    """``scripts/model_server.py`` (the real llama.cpp server); returns once it passed its start check."""
    out = open(log, "a")
    proc = subprocess.Popen([sys.executable, "scripts/model_server.py", "--port", str(port)], cwd=ROOT,
                            stdout=out, stderr=subprocess.STDOUT)
    out.close()

    def ready():
        assert proc.poll() is None, log.read_text()[-3000:]
        return log.read_text().count(f"ready at http://127.0.0.1:{port}/v1")

    before = log.read_text().count(f"ready at http://127.0.0.1:{port}/v1") if log.exists() else 0
    wait_until(lambda: ready() > before, 240, "the model server's start check", interval=0.25)
    return proc


def stop_model_server(proc: subprocess.Popen) -> None:
    """SIGTERM, then expect a clean exit (status 0) within 60 s."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


def server_pids(supervisor: int) -> list[int]:
    """The live processes whose parent is ``supervisor`` (from /proc)."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == supervisor and fields[0] != "Z":
            pids.append(int(entry))
    return pids


@contextlib.contextmanager
def slot_proxy(upstream: str, directory: Path):
    """``(proxy url, SlotCache)``: ``scripts/slot_cache.py``'s proxy on a free loopback port in front of
    ``upstream`` (``host:port``), keeping slot files in ``directory``; stopped on exit."""
    from chat_support.servers import free_ports
    from scripts import slot_cache

    cache = slot_cache.SlotCache(upstream, directory, max_files=64)
    (port,) = free_ports(1)
    server = slot_cache.make_proxy(cache, "127.0.0.1", port)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{port}", cache
    finally:
        cache.stop()
        server.shutdown()
        server.server_close()
