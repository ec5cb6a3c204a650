"""Run the whole system locally: ``make run`` calls ``python scripts/dev.py`` in the virtualenv.

It decides the configuration, then starts the processes of ``Procfile.dev``
with honcho (used as a library) and prints the address to open:

- store: ``REDIS_TLS_URL``/``REDIS_URL`` when set, otherwise the embedded Valkey
  (``scripts/devstore.py``) at ``redis://127.0.0.1:6380/0``, data in ``.local/store/``;
- model: ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` when set, otherwise the bundled
  Qwen2.5-Coder-0.5B-Instruct served by llama.cpp's own server from the prebuilt
  xllamacpp wheel (``scripts/model_server.py``; the GGUF file is fetched and verified
  first by ``scripts/local_model.py``) twice: ``model`` for chat turns on
  127.0.0.1:8089 and ``compaction-model`` for compaction on 127.0.0.1:8090
  (``COMPACTION_BASE_URL``), so a turn never waits for a compaction. Each server
  passes a one-token completion before the others start; if one fails, everything
  stops and the last line names the cause (e.g. a crash with SIGILL) and what to do;
- ``SECRET_KEY``: when unset, generated once into ``.local/secret_key``;
- ``web`` (gunicorn, gthread) on 127.0.0.1:$PORT (5000), ``worker`` (Celery, the folds'
  ``compaction`` queue, events on), ``refiner`` (Celery, the refinements' ``refine`` queue, one at
  a time, so a fold never waits behind one) and ``flower`` on 127.0.0.1:5555. They wait
  (``scripts/wait_ready.py``) until the store answers and the model servers passed
  their start check (``DEV_RUN_DIR/model-<port>.ready``).

Values come from the environment, then from ``.env`` if present; an empty
value counts as unset. Ctrl+C (or SIGTERM) stops every process: honcho sends
SIGTERM to each process group, and SIGKILL to what is left after 5 seconds.

Usage::

    python scripts/dev.py            # start everything
    python scripts/dev.py --dry-run  # print the plan and exit
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

from honcho.environ import parse as parse_dotenv, parse_procfile
from honcho.manager import Manager
from honcho.printer import Message, Printer

from app.settings import dev_secret_key  # the same file app/settings.py reads

if __package__:  # imported as scripts.dev (bench/stack.py reads its plan)
    from scripts import local_model
else:  # run as `python scripts/dev.py` (make run): its own folder is sys.path[0]
    import local_model  # type: ignore[no-redef]  # the same file as scripts.local_model

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ROOT / ".local"
PROCFILE = ROOT / "Procfile.dev"

DEFAULTS = {
    "APP_ENV": "development",
    "PORT": "5000",
    "FLOWER_PORT": "5555",
    "DEV_STORE_PORT": "6380",
    "LOCAL_MODEL_PORT": str(local_model.DEFAULT_PORT),
    "LOCAL_COMPACTION_MODEL_PORT": str(local_model.DEFAULT_COMPACTION_PORT),
    "WEB_THREADS": "64",
}


class DevError(Exception):
    """A problem the user must fix, told in one line."""


def load_env(environ: dict[str, str], dotenv: Path = ROOT / ".env") -> dict[str, str]:
    """Merge defaults < ``.env`` < ``environ``; drop empty values (they mean unset)."""
    merged = dict(DEFAULTS)
    if dotenv.is_file():
        merged.update(parse_dotenv(dotenv.read_text()))
    merged.update(environ)
    return {k: v for k, v in merged.items() if v.strip() != ""}


def port_free(port: int) -> bool:
    """True if nothing accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def plan(environ: dict[str, str], run_dir: Path | None = None) -> tuple[dict[str, str], list[str], list[str]]:
    """Decide what to run. Returns (environment for the processes, process names, notes to print).

    ``run_dir`` (``DEV_RUN_DIR``) is where the model servers report readiness and failure; without one the
    others wait for ``/v1/models`` instead. Does not fetch the model or start anything.
    """
    env = load_env(environ)
    names, notes, wait_for = [], [], []

    if env.get("REDIS_TLS_URL") or env.get("REDIS_URL"):
        notes.append("store: " + ("REDIS_TLS_URL" if env.get("REDIS_TLS_URL") else "REDIS_URL"))
    else:
        env["REDIS_URL"] = f"redis://127.0.0.1:{env['DEV_STORE_PORT']}/0"
        names.append("store")
        wait_for.append(env["REDIS_URL"])
        notes.append(f"store: embedded Valkey at {env['REDIS_URL']} "
                     f"(data in {env.get('DEV_STORE_DIR', '.local/store/')})")

    if env.get("OPENAI_BASE_URL") or env.get("OPENAI_API_KEY"):
        notes.append(f"model: {env.get('OPENAI_BASE_URL', 'OpenAI')}, "
                     f"chat model {env.get('CHAT_MODEL', '(default)')}")
    else:
        base_url = f"http://127.0.0.1:{env['LOCAL_MODEL_PORT']}/v1"
        env.update({
            "OPENAI_BASE_URL": base_url,
            "OPENAI_API_KEY": "local",  # the local server checks no key; the client wants one
            "CHAT_MODEL": local_model.MODEL_NAME,
            "COMPACTION_MODEL": local_model.MODEL_NAME,
            "BUNDLED_MODEL": "1",
        })
        # Offered tools, the 0.5B model answers every message with a tool-call JSON
        # text (the server does not parse tool calls for this template): off unless asked.
        env.setdefault("TOOLS_ENABLED", "0")
        servers = [("model", "LOCAL_MODEL_PORT")]
        # Each model server has one slot (one request at a time): compaction gets a server of its own
        # (unless COMPACTION_BASE_URL already names an endpoint), so chat turns never queue behind it.
        if not env.get("COMPACTION_BASE_URL"):
            servers.append(("compaction-model", "LOCAL_COMPACTION_MODEL_PORT"))
            env["COMPACTION_BASE_URL"] = f"http://127.0.0.1:{env['LOCAL_COMPACTION_MODEL_PORT']}/v1"
        for name, port_var in servers:
            names.append(name)
            port = int(env[port_var])
            wait_for.append(str(local_model.ready_file(run_dir, port)) if run_dir
                            else f"http://127.0.0.1:{port}/v1/models")
        notes.append(f"model: bundled {local_model.MODEL_NAME} at {base_url}, compaction at "
                     f"{env['COMPACTION_BASE_URL']} (small: answers will be modest; set "
                     "OPENAI_API_KEY/OPENAI_BASE_URL for a real provider)")

    if not env.get("SECRET_KEY"):
        env["SECRET_KEY"] = dev_secret_key()
    if not env.get("FLOWER_BASIC_AUTH"):
        env["FLOWER_UNAUTHENTICATED_API"] = "true"  # loopback only, development only
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", os.defpath)
    env["PYTHONUNBUFFERED"] = "1"
    env["DEV_WAIT_FOR"] = " ".join(wait_for)
    if run_dir:
        env["DEV_RUN_DIR"] = str(run_dir)
    names += ["web", "worker", "refiner", "flower"]
    return env, names, notes


def check_ports(env: dict[str, str], names: list[str]) -> None:
    """Raise DevError if a port this run needs is taken."""
    needed = {"web": "PORT", "flower": "FLOWER_PORT", "store": "DEV_STORE_PORT",
              "model": "LOCAL_MODEL_PORT", "compaction-model": "LOCAL_COMPACTION_MODEL_PORT"}
    for name in names:
        var = needed.get(name)
        if var and not port_free(int(env[var])):
            raise DevError(f"127.0.0.1:{env[var]} ({name}) is already in use: stop what runs "
                           f"there or set {var}")


def announce_when_up(url: str, say, stop: threading.Event, timeout: float = 600.0) -> None:
    """Call ``say(text)`` once ``url`` gives any HTTP answer; poll every 0.5 s for ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).close()
        except urllib.error.HTTPError:
            pass  # 503 "degraded" still means the web process is up
        except OSError:
            stop.wait(0.5)
            continue
        say(url.rsplit("/", 1)[0])
        return


def failures(run_dir: Path) -> list[str]:
    """The one-line causes the model servers wrote to ``run_dir`` when they gave up (``model-<port>.error``)."""
    lines = []
    for path in sorted(run_dir.glob("model-*.error")):
        text = path.read_text(errors="replace").strip()
        prefix = "local model: error: "
        lines.append(text[len(prefix):] if text.startswith(prefix) else text)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = parser.parse_args(argv)
    run_dir = None if args.dry_run else Path(tempfile.mkdtemp(prefix="chat-memory-dev-"))
    try:
        return run(args, run_dir)
    finally:
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)


def run(args, run_dir: Path | None) -> int:
    try:
        env, names, notes = plan(dict(os.environ), run_dir)
        check_ports(env, names)
        if "model" in names:
            if not env.get("LOCAL_MODEL_SERVER_MODULE"):  # (tests run stand-in servers)
                try:
                    import xllamacpp  # noqa: F401
                except ImportError:
                    raise DevError("xllamacpp (the bundled model's server) is not installed: run `make install` "
                                   "(pip install -r requirements-local.txt)") from None
            if not args.dry_run:
                local_model.fetch()
    except (DevError, local_model.ModelError) as exc:
        print(f"dev: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130

    for note in notes:
        print(f"dev: {note}")
    commands = parse_procfile(PROCFILE.read_text()).processes
    if args.dry_run:
        for name in names:
            print(f"dev: {name}: {commands[name]}")
        return 0

    printer = Printer(sys.stdout)
    manager = Manager(printer=printer)
    for name in names:
        manager.add_process(name, commands[name], env=env, cwd=str(ROOT))

    def say(base: str) -> None:
        text = f"open {base}/  (Flower: http://127.0.0.1:{env['FLOWER_PORT']}/; Ctrl+C stops all)\n"
        printer.write(Message(type="line", data=text, time=datetime.now(), name="dev", colour=None))

    stop = threading.Event()
    threading.Thread(target=announce_when_up, daemon=True,
                     args=(f"http://127.0.0.1:{env['PORT']}/healthz", say, stop)).start()
    try:
        manager.loop()
    finally:
        stop.set()
    causes = failures(run_dir) if run_dir else []
    sys.stdout.flush()
    for cause in causes:  # repeated last, below the other processes' shutdown messages
        print(f"dev: error: {cause}", file=sys.stderr, flush=True)
    if causes:
        return 1
    return manager.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
