"""``scripts/install_llama.py``: a wheel folder keyed by the build configuration, and only usable wheels in it.

pip's own cache keys a built wheel by its source distribution, not by ``CMAKE_ARGS``; here every change of the
configuration names another folder, so an earlier, differently configured build is never reinstalled.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
from scripts import install_llama as il  # noqa: E402


def make_wheel(folder: Path, names: list[str]) -> Path:
    wheel = folder / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name in names:
            zf.writestr(name, b"\x7fELF")
    return wheel


def test_the_key_changes_with_the_version_and_the_build_flags(monkeypatch):
    key = il.build_key("0.3.36")
    assert len(key) == 16 and key == il.build_key("0.3.36")
    assert il.build_key("0.3.37") != key
    monkeypatch.setattr(il, "CMAKE_ARGS", il.CMAKE_ARGS[:-1] + ("-DGGML_NATIVE=ON",))
    assert il.build_key("0.3.36") != key


def test_the_wheel_folder_is_under_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert il.wheel_dir("abc") == tmp_path / "chat-memory" / "wheels" / "abc"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert il.wheel_dir("abc") == Path.home() / ".cache" / "chat-memory" / "wheels" / "abc"


def test_the_version_comes_from_requirements_local():
    assert il.pinned_version() == "0.3.36"


def test_the_build_is_never_native():
    assert "-DGGML_NATIVE=OFF" in il.CMAKE_ARGS and "-DGGML_CPU_ALL_VARIANTS=ON" in il.CMAKE_ARGS
    assert "-DGGML_BACKEND_DIR:STRING=llama_cpp/lib" in il.CMAKE_ARGS  # typed: see the comment there


def test_a_wheel_without_the_cpu_variants_is_refused(tmp_path):
    lost = make_wheel(tmp_path, ["llama_cpp/lib/libllama.so", "lib/libggml-base.so"])  # variants left out
    with pytest.raises(il.InstallError, match="installs no llama.cpp CPU backend variants"):
        il.check_wheel(lost)
    (tmp_path / "native").mkdir()
    native = make_wheel(tmp_path / "native", ["llama_cpp/lib/libllama.so", "llama_cpp/lib/libggml-cpu.so"])
    with pytest.raises(il.InstallError, match="single-CPU backend"):
        il.check_wheel(native)
    (tmp_path / "good").mkdir()
    good = make_wheel(tmp_path / "good", ["llama_cpp/lib/libggml-cpu-x64.so", "llama_cpp/lib/libggml-cpu-haswell.so"])
    il.check_wheel(good)
    assert il.wheel_variants(good) == ["haswell", "x64"]
    assert il.cached_wheel(tmp_path / "good", "0.3.36") == good
    assert il.cached_wheel(tmp_path / "good", "0.3.35") is None
