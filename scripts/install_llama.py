"""Install llama-cpp-python built to run on any x86-64 CPU, from a wheel folder keyed by its build configuration.

``make install`` (and so ``make run`` / ``make test``) calls this before ``pip install -r
requirements-local.txt``; that second step then finds llama-cpp-python already installed at the pinned
version and only adds the server's dependencies.

Why not a plain ``pip install llama-cpp-python``: PyPI has only its source distribution, and the default
build compiles llama.cpp for the build machine's CPU (``GGML_NATIVE``). Such a library dies with SIGILL on a
machine whose CPU or kernel lacks one of those instructions (seen: a CPU listing AMX whose kernel does not
grant AMX tile state). Here llama.cpp is built with its runtime CPU dispatch instead (``CMAKE_ARGS``
below): one CPU backend per x86-64 level, ``libggml-cpu-<variant>.so`` next to ``libllama.so``, and at
start llama.cpp loads the best variant for the CPU it runs on (``scripts/local_model.py serve`` first
hides the variants the operating system does not grant, see there).

Why a wheel folder of our own: pip's wheel cache is keyed by the source distribution, not by
``CMAKE_ARGS``, so a machine that once built a differently configured wheel would keep reinstalling it.
The wheel is built with ``pip wheel --no-cache-dir`` into
``${XDG_CACHE_HOME:-~/.cache}/chat-memory/wheels/<key>/``, where ``<key>`` hashes the version, the CMake
arguments, the Python tag and the machine type, and installed from there with ``pip install --no-index
--find-links``. The folder lives outside the clone, so a fresh clone (CI) or ``make clean`` reuses it: only
the first install on a machine compiles (about 16 minutes on 2 cores, see the README).

Usage::

    python scripts/install_llama.py            # build if needed, install into this interpreter's environment
    python scripts/install_llama.py --print-key
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements-local.txt"
PACKAGE = "llama-cpp-python"
WHEEL_PREFIX = "llama_cpp_python-"

# The build configuration; any change here changes the key, so a new wheel is built.
CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF",              # never compile for the build machine's CPU
    "-DGGML_BACKEND_DL=ON",           # backends as modules llama.cpp loads at start ...
    "-DGGML_CPU_ALL_VARIANTS=ON",     # ... one CPU backend per x86-64 level (x64 .. sapphirerapids)
    # Installed next to libllama.so (the default, bin/, is outside the package). ":STRING" matters: ggml declares
    # this a PATH cache entry, and CMake turns an untyped relative -D value of a PATH entry into an absolute path
    # under the build folder, so the variants would be installed there and left out of the wheel.
    "-DGGML_BACKEND_DIR:STRING=llama_cpp/lib",
    "-DLLAVA_BUILD=OFF",              # no multimodal library: this project sends text only
)
BUILD_SCHEME = 1  # bump to force a rebuild for a reason CMAKE_ARGS does not show


class InstallError(Exception):
    """A failure told in one line."""


def pinned_version(requirements: Path = REQUIREMENTS) -> str:
    """The version pinned for llama-cpp-python in ``requirements-local.txt`` (``name[extras]==X``)."""
    for line in requirements.read_text().splitlines():
        match = re.match(r"\s*llama[-_]cpp[-_]python(\[[^\]]*\])?\s*==\s*([^\s;#]+)", line, re.IGNORECASE)
        if match:
            return match.group(2)
    raise InstallError(f"{requirements.name} pins no {PACKAGE}==<version>")


def build_key(version: str) -> str:
    """16 hex digits naming one build configuration: version, CMake arguments, Python tag, machine type."""
    config = {
        "package": PACKAGE, "version": version, "cmake_args": list(CMAKE_ARGS), "scheme": BUILD_SCHEME,
        "python": f"cp{sys.version_info.major}{sys.version_info.minor}",
        "machine": platform.machine(), "system": platform.system(), "libc": list(platform.libc_ver()),
    }
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def wheel_dir(key: str) -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/chat-memory/wheels/<key>/``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "chat-memory" / "wheels" / key


def cached_wheel(folder: Path, version: str) -> Path | None:
    """The built wheel of ``version`` in ``folder``, if there is one."""
    found = sorted(folder.glob(f"{WHEEL_PREFIX}{version}-*.whl")) if folder.is_dir() else []
    return found[0] if found else None


def build_wheel(folder: Path, version: str) -> Path:
    """Compile llama-cpp-python ``version`` with ``CMAKE_ARGS`` into ``folder``; return the wheel.

    The wheel is built in a temporary folder beside ``folder`` and moved in only when complete, so an
    interrupted build leaves nothing that looks usable. Raises ``InstallError`` if pip fails.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CMAKE_ARGS=" ".join(CMAKE_ARGS))
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
    print(f"llama-cpp-python {version}: compiling llama.cpp with runtime CPU dispatch (the first install on "
          f"this machine only; about 16 minutes on 2 cores) ...", flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}-") as tmp:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-cache-dir", "--no-deps", "--no-binary", PACKAGE,
               "--disable-pip-version-check", "-w", tmp, f"{PACKAGE}=={version}"]
        if subprocess.run(cmd, env=env).returncode != 0:
            raise InstallError(f"building {PACKAGE}=={version} failed (see pip's messages above; it needs a C/C++ "
                               "compiler, e.g. apt-get install build-essential)")
        built = cached_wheel(Path(tmp), version)
        if built is None:
            raise InstallError(f"pip reported success but left no {PACKAGE} wheel in {tmp}")
        check_wheel(built)
        folder.mkdir(exist_ok=True)
        target = folder / built.name
        shutil.move(str(built), target)
    seconds = time.monotonic() - started
    (folder / "build.json").write_text(json.dumps(
        {"version": version, "cmake_args": list(CMAKE_ARGS), "seconds": round(seconds, 1),
         "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1))
    print(f"llama-cpp-python {version}: compiled in {seconds / 60:.1f} min into {folder}", flush=True)
    return target


def wheel_variants(wheel: Path) -> list[str]:
    """The CPU backend variants a wheel installs (``llama_cpp/lib/libggml-cpu-<variant>.so``)."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    if "llama_cpp/lib/libggml-cpu.so" in names:
        raise InstallError(f"{wheel.name} holds a single-CPU backend (llama_cpp/lib/libggml-cpu.so), not the "
                           "runtime-dispatch build")
    prefix = "llama_cpp/lib/libggml-cpu-"
    return sorted(n[len(prefix):-len(".so")] for n in names if n.startswith(prefix) and n.endswith(".so"))


def check_wheel(wheel: Path) -> None:
    """Raise ``InstallError`` unless ``wheel`` installs the baseline ``x64`` CPU backend among its variants."""
    variants = wheel_variants(wheel)
    if "x64" not in variants:
        raise InstallError(f"{wheel.name} installs no llama.cpp CPU backend variants ({variants or 'none'}): "
                           "the build configuration is wrong")


def marker() -> Path:
    """The file in this environment that records which build is installed."""
    return Path(sys.prefix) / ".llama-cpp-build"


def installed_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return None


def install(version: str, key: str) -> None:
    """Make this environment hold llama-cpp-python ``version`` of build ``key`` (build it if no wheel is cached)."""
    if installed_version() == version and marker().is_file() and marker().read_text().strip() == key:
        print(f"llama-cpp-python {version}: the portable build {key} is installed", flush=True)
        return
    folder = wheel_dir(key)
    wheel = cached_wheel(folder, version) or build_wheel(folder, version)
    check_wheel(wheel)
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-index", "--find-links",
           str(folder), "--force-reinstall", "--no-deps", f"{PACKAGE}=={version}"]
    if subprocess.run(cmd).returncode != 0:
        raise InstallError(f"installing {wheel} failed (see pip's messages above)")
    marker().write_text(key + "\n")
    print(f"llama-cpp-python {version}: installed the portable build from {wheel}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--print-key", action="store_true", help="print the build key and the wheel folder")
    args = parser.parse_args(argv)
    try:
        version = pinned_version()
        key = build_key(version)
        if args.print_key:
            print(key, wheel_dir(key))
            return 0
        install(version, key)
    except InstallError as exc:
        print(f"install_llama: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
