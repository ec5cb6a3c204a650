"""The installed llama-cpp-python runs on any x86-64 CPU (README: Two commands; ``scripts/install_llama.py``).

These look at the real install, so a later change cannot bring a native (build-machine) build back silently:

- it is llama.cpp's runtime-dispatch build: one ``libggml-cpu-<variant>.so`` per x86-64 level, no single
  ``libggml-cpu.so``, installed by ``scripts/install_llama.py`` from the wheel of the configured build;
- each variant holds only the instructions of its level: AMX tile instructions only in ``sapphirerapids``,
  AVX-512 registers only in the AVX-512 variants (``objdump -d``);
- the variant llama.cpp really loads on this machine (read from ``/proc/self/maps`` of a process that ran
  ``llama_backend_init`` in the folder ``scripts/local_model.py serve`` prepares) is the expected one, needs
  only what this machine's CPU and kernel grant, and contains no instruction family this machine lacks.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
from scripts import install_llama  # noqa: E402
from scripts import local_model as lm  # noqa: E402

LIB = lm.llama_lib_dir()
INSTALLED = lm.installed_variants(LIB)
AMX_MNEMONICS = re.compile(r"\s(tileloadd\w*|tilestored|tdpb[a-z]{2}d|tdpbf16ps|tdpfp16ps|ldtilecfg|sttilecfg|"
                           r"tilerelease|tilezero)\s")
AVX512_VARIANTS = {v for v, feats in lm.VARIANT_FEATURES.items() if "AVX512" in feats}


def instruction_families(path: Path) -> dict[str, int]:
    """How many AMX tile instructions and AVX-512 (zmm) operands ``objdump -d`` finds in ``path``.

    (binutils' objdump comes with the C/C++ toolchain the build needs.)
    """
    proc = subprocess.Popen(["objdump", "-d", "--no-show-raw-insn", str(path)], stdout=subprocess.PIPE, text=True)
    counts = {"amx": 0, "zmm": 0}
    for line in proc.stdout:
        if AMX_MNEMONICS.search(line):
            counts["amx"] += 1
        if "%zmm" in line:
            counts["zmm"] += 1
    assert proc.wait() == 0
    return counts


def test_the_install_is_the_runtime_dispatch_build_of_the_configured_wheel():
    # (the marker is written by scripts/install_llama.py after installing the wheel of that build key)
    assert not (LIB / "libggml-cpu.so").exists()  # a native build has this one library instead
    assert set(INSTALLED) == set(lm.VARIANT_FEATURES)  # every level, and serve's table knows each of them
    key = install_llama.build_key(install_llama.pinned_version())
    assert install_llama.marker().read_text().strip() == key
    assert "-DGGML_NATIVE=OFF" in install_llama.CMAKE_ARGS and "-DGGML_CPU_ALL_VARIANTS=ON" in install_llama.CMAKE_ARGS


@pytest.mark.slow
def test_each_variant_holds_only_the_instructions_of_its_level():
    found = {name: instruction_families(path) for name, path in INSTALLED.items()}
    with_amx = {name for name, c in found.items() if c["amx"]}
    with_zmm = {name for name, c in found.items() if c["zmm"]}
    assert with_amx <= {"sapphirerapids"}, found
    assert with_zmm <= AVX512_VARIANTS, found
    assert with_zmm, found  # (the check can see AVX-512 where it is compiled in)


def test_the_variant_loaded_here_needs_only_what_this_machine_grants():
    backends = lm.prepare_backends()
    probe = ("import json, re, llama_cpp\n"
             "llama_cpp.llama_backend_init()\n"
             "print(json.dumps(sorted(set(re.findall(r'libggml-cpu-(\\w+)\\.so', open('/proc/self/maps').read())))))\n")
    result = subprocess.run([sys.executable, "-c", probe], cwd=backends.folder, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded == [backends.expected]  # exactly one CPU backend, the one llama.cpp's score picks here
    flags, mask = lm.read_cpu_flags(), lm.read_xcomp_mask()
    amx = mask is not None and bool(mask & (1 << lm.XTILEDATA)) and lm.request_amx_permission()
    assert lm.variant_granted(loaded[0], flags, mask, amx)
    assert set(backends.variants) == set(lm.usable_variants(INSTALLED, flags, mask, amx))


def test_the_loaded_variant_contains_no_instruction_family_this_machine_lacks():
    expected = lm.prepare_backends().expected
    counts = instruction_families(INSTALLED[expected])
    flags = lm.read_cpu_flags()
    if "avx512f" not in flags:
        assert counts["zmm"] == 0
    if "amx_tile" not in flags or lm.read_xcomp_mask() is None:
        assert counts["amx"] == 0
