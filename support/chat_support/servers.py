"""Loopback ports and subprocesses for the servers that the tests and the benchmarks start.

- ``free_ports(n)`` / ``free_port()``: TCP ports on 127.0.0.1 that were free a moment ago.
- ``port_open(port)``: whether something accepts connections there.
- ``wait_http(url, proc)``: GET ``url`` until a started process answers.
- ``stop(proc)``: terminate a process, then kill it if it does not exit.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import requests

LOOPBACK = "127.0.0.1"


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports, bound together (so never the same one twice) and released before returning."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            sock = socket.socket()
            socks.append(sock)
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port() -> int:
    """One port that nothing listens on (until someone binds it)."""
    return free_ports(1)[0]


def port_open(port: int, timeout: float = 0.5) -> bool:
    """True when a TCP connection to ``127.0.0.1:port`` is accepted within ``timeout`` seconds."""
    with socket.socket() as sock:
        sock.settimeout(timeout)
        return sock.connect_ex((LOOPBACK, port)) == 0


def wait_http(url: str, proc: subprocess.Popen, log: Path | None = None, timeout: float = 30.0,
              **kwargs: Any) -> requests.Response:
    """GET ``url`` until it answers (any status) and return the answer.

    Fails (``AssertionError``, with the end of ``log`` when given) if ``proc`` exits first or
    nothing answers within ``timeout`` seconds.  ``kwargs`` go to ``requests.get``.
    """
    def tail() -> str:
        return f": {log.read_text()[-2000:]}" if log is not None else ""

    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"process exited with {proc.returncode}{tail()}"
        try:
            return requests.get(url, timeout=3, **kwargs)
        except requests.ConnectionError:
            assert time.monotonic() < deadline, f"no answer from {url}{tail()}"
            time.sleep(0.2)


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """Terminate ``proc`` and wait ``timeout`` seconds, then kill it; a no-op when it has exited."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
