"""Background work yields the CPUs to people: the compaction server is paused while a chat turn runs
(docs/bundled-model.md: The bundled model; docs/contract.md: ``LOCAL_MODEL_YIELD``).

Both model servers run on the same cores.  While a chat turn is in the chat server's proxy
(``scripts/slot_cache.py``), the proxy's ``Pauser`` stops the compaction server's llama.cpp process (SIGSTOP) and
continues it (SIGCONT) when the last turn ends; a compaction request in flight then simply takes longer.  The two
servers are paired by the compaction server's port (``LOCAL_COMPACTION_MODEL_PORT``) in a private run directory
(``run_dir``):

- ``model-<port>.pid``: the compaction server's process id, written by its supervisor (``scripts/model_server.py``)
  when the process starts, removed when it ends;
- ``model-<port>.pause``: the pause lease, touched by the proxy at least every ``LEASE_REFRESH_SECONDS`` while it
  holds the server stopped, removed when it continues it.

The safety: the compaction supervisor's ``watchdog`` continues its process whenever it is stopped and the lease
is missing or older than ``LEASE_SECONDS``; so a proxy that crashes or is killed leaves it stopped for at most
that long.  A supervisor that stops its process continues it first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

LEASE_SECONDS = 5.0  # a pause whose lease is older than this is ended by the compaction supervisor
LEASE_REFRESH_SECONDS = 1.0


def run_dir(environ=os.environ) -> Path:
    """The directory of the pid and lease files: ``DEV_RUN_DIR`` (``make run``), else
    ``<tmp>/chat-memory-models-<uid>`` (made mode 0700; refused if another user owns it)."""
    if environ.get("DEV_RUN_DIR"):
        return Path(environ["DEV_RUN_DIR"])
    path = Path(tempfile.gettempdir()) / f"chat-memory-models-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.stat().st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to another user")
    return path


def pid_file(port: int, directory: Path | None = None) -> Path:
    return (directory or run_dir()) / f"model-{port}.pid"


def lease_file(port: int, directory: Path | None = None) -> Path:
    return (directory or run_dir()) / f"model-{port}.pause"


def process_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (``"T"``: stopped), or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _compaction_pid(path: Path) -> int | None:
    """The pid in ``path`` when that process is a compaction model server (its command line says
    ``--role compaction``), else None (no file, or a pid reused by another process)."""
    try:
        pid = int(path.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if b"--role" in cmdline and b"compaction" in cmdline else None


class Pauser:
    """Holds the compaction server stopped while at least one turn runs (``begin``/``end`` counted).

    Args:
        port: the compaction server's public port (names its pid and lease files).
        directory: the run directory (default ``run_dir()``).
    """

    def __init__(self, port: int, directory: Path | None = None):
        self.pid_path = pid_file(port, directory)
        self.lease_path = lease_file(port, directory)
        self._lock = threading.Lock()
        self._count = 0
        self._pid: int | None = None
        self._wake = threading.Event()
        self.pauses = 0  # for tests and logs

    def begin(self) -> None:
        with self._lock:
            self._count += 1
            if self._count > 1:
                return
            self._pid = _compaction_pid(self.pid_path)
            if self._pid is None:
                return
            self.lease_path.touch()
            with contextlib.suppress(OSError):
                os.kill(self._pid, signal.SIGSTOP)
                self.pauses += 1
            self._wake.clear()
            threading.Thread(target=self._refresh, args=(self._pid,), name="pause-lease", daemon=True).start()

    def end(self) -> None:
        with self._lock:
            self._count = max(0, self._count - 1)
            if self._count == 0:
                self._resume()

    def close(self) -> None:
        """Continue the server now, whatever turns still count (the proxy stops)."""
        with self._lock:
            self._count = 0
            self._resume()

    def _resume(self) -> None:
        pid, self._pid = self._pid, None
        self._wake.set()
        with contextlib.suppress(OSError):
            self.lease_path.unlink(missing_ok=True)
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)

    def _refresh(self, pid: int) -> None:
        while not self._wake.wait(LEASE_REFRESH_SECONDS):
            with self._lock:
                if self._pid != pid:
                    return
                with contextlib.suppress(OSError):
                    os.utime(self.lease_path)


def watchdog(pid: int, lease: Path, done: threading.Event, every: float = 1.0) -> None:
    """Until ``done``: continue process ``pid`` whenever it is stopped and ``lease`` is missing or older than
    ``LEASE_SECONDS`` (run by the compaction supervisor in a thread)."""
    while not done.wait(every):
        if process_state(pid) != "T":
            continue
        try:
            fresh = time.time() - lease.stat().st_mtime < LEASE_SECONDS
        except OSError:
            fresh = False
        if not fresh:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
