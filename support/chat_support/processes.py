"""The Procfile's process types run the way a Heroku-style platform runs them, and process trees.

- ``PROCFILE``: the production ``Procfile``'s commands by process type (run from ``ROOT``, the repository).
- ``prod_env(settings, **values)``: a production environment on the test Redis and the fake LLM.
- ``start(name, env, log)``: ``bash -c`` the command in a new process group, output to ``log``.
- ``stop_group(proc)``: signal the whole group (as a restart does) and return the exit code.
- ``descendants(pid)``: every live process under ``pid`` (from /proc).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from honcho.environ import parse_procfile

from chat_support import ROOT
from chat_support.config_env import SECRET, clean_env

PROCFILE = parse_procfile((ROOT / "Procfile").read_text()).processes


def prod_env(settings: Any, **values: str) -> dict[str, str]:
    """A production environment on the test Redis and the fake LLM."""
    env = clean_env(APP_ENV="production", REDIS_URL=settings.redis_url, SECRET_KEY=SECRET,
                    OPENAI_BASE_URL=settings.openai_base_url, OPENAI_API_KEY="test-key", CHAT_MODEL="fake-chat",
                    COMPACTION_MODEL="fake-compact")
    env.update(values)
    return env


def start(name: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    """Run the Procfile's ``name`` command as the platform does (``bash -c``, own process group)."""
    with open(log, "w") as out:
        return subprocess.Popen(["bash", "-c", PROCFILE[name]], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    """Send ``sig`` to the process group (as the platform does at a restart); return the exit code."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        except ProcessLookupError:
            pass
    return proc.wait(5)


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
