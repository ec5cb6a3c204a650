"""The bundled model's real llama.cpp server (``scripts/model_server.py``), started and stopped by a test.

Needs the verified GGUF file (``make test`` fetches it first).
"""

from __future__ import annotations

import signal
import subprocess
import sys
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
