"""Wait for the local store and model to answer, then become the given command.

``Procfile.dev`` prefixes ``web``, ``worker`` and ``flower`` with this so they
start only once the processes they need are up. ``DEV_WAIT_FOR`` holds the
space-separated addresses to wait for (``scripts/dev.py`` sets it to the
embedded store and the local model server it starts; empty means no wait):

- ``redis://...``: answers PING;
- ``http://...``: answers GET with status 200;
- ``/a/path``: the file exists (``scripts/local_model.py serve`` creates
  ``$DEV_RUN_DIR/model-<port>.ready`` once its server passed the start check).

Usage::

    DEV_WAIT_FOR="redis://127.0.0.1:6380/0 /tmp/chat-memory-dev-x/model-8089.ready" \\
        python scripts/wait_ready.py gunicorn wsgi:app ...
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import urllib.request

DEFAULT_TIMEOUT = 180.0  # seconds; DEV_WAIT_TIMEOUT overrides


def answers(url: str) -> bool:
    """True if the service at ``url`` answers right now (1-2 s timeout)."""
    try:
        if url.startswith("/"):
            return os.path.exists(url)
        if url.startswith(("redis://", "rediss://")):
            import redis

            client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
            try:
                return bool(client.ping())
            finally:
                client.close()
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except Exception:  # not up yet: refused, reset, loading, 503 ...
        return False


def wait_for(urls: list[str], timeout: float) -> list[str]:
    """Poll every 0.25 s until all ``urls`` answer or ``timeout`` seconds pass; return those that never did."""
    deadline = time.monotonic() + timeout
    pending = list(urls)
    while pending and time.monotonic() < deadline:
        pending = [u for u in pending if not answers(u)]
        if pending:
            time.sleep(0.25)
    return pending


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: wait_ready.py COMMAND [ARGS...]", file=sys.stderr)
        return 2
    urls = os.environ.get("DEV_WAIT_FOR", "").split()
    timeout = float(os.environ.get("DEV_WAIT_TIMEOUT", DEFAULT_TIMEOUT))
    missing = wait_for(urls, timeout)
    if missing:
        print(f"wait_ready: no answer after {timeout:.0f} s from {' '.join(missing)}", file=sys.stderr)
        return 1
    program = shutil.which(argv[0]) or argv[0]
    os.execv(program, argv)
    return 0  # not reached


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
