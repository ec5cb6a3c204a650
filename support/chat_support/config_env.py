"""Environments for the app's entry points run as subprocesses (``python -c "import wsgi"``, ``celery -A
celery_app ...``), and the check that a bad configuration gives one ``config error`` line.

- ``clean_env(**values)``: this process's environment without the app's variables, plus ``values``.
- ``production(redis_url, **values)``: a complete production environment with ``values`` on top.
- ``run`` / ``import_wsgi`` / ``celery``: run an entry point from the repository root.
- ``assert_config_error(result, line)``: exit status 3 and exactly that one stderr line, never ``PASSWORD``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from chat_support import ROOT

BIN = Path(sys.executable).parent
SECRET = "s" * 40
PASSWORD = "hunter2-Pa55"  # must never appear in any output
OWN_PREFIXES = ("REDIS", "OPENAI", "SECRET_KEY", "FLOWER", "APP_ENV", "CHAT_MODEL", "COMPACTION_", "MEMORY_",
                "PORT", "WEB_", "PROMETHEUS", "METRICS", "BUNDLED", "TOOLS", "REMAP", "CELERY_BROKER")


def clean_env(**values: str) -> dict[str, str]:
    """This process's environment without any of the app's variables, plus ``values``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(OWN_PREFIXES)}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1")
    env.update(values)
    return env


def production(redis_url: str, **values: str) -> dict[str, str]:
    """A complete production environment (store, secret, provider) with ``values`` on top."""
    base = {"APP_ENV": "production", "REDIS_URL": redis_url, "SECRET_KEY": SECRET, "OPENAI_API_KEY": "sk-test"}
    base.update(values)
    return clean_env(**{k: v for k, v in base.items() if v is not None})


def run(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``args`` from the repository root with ``env``; the completed process with its text output."""
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def import_wsgi(env: dict[str, str]) -> subprocess.CompletedProcess:
    """``python -c "import wsgi"`` (what gunicorn imports) with ``env``."""
    return run([sys.executable, "-c", "import wsgi"], env)


def celery(*args: str) -> list[str]:
    """The command line ``celery -A celery_app <args>`` with this virtualenv's ``celery``."""
    return [str(BIN / "celery"), "-A", "celery_app", *args]


def assert_config_error(result: subprocess.CompletedProcess, line: str) -> None:
    """Exit status 3 and stderr exactly ``config error: <line>`` (one line, no traceback, no password)."""
    assert (result.returncode, result.stderr) == (3, f"config error: {line}\n")
    assert PASSWORD not in result.stdout + result.stderr
