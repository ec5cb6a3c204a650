"""Which llama.cpp CPU backend variants the bundled model server may load (``scripts/local_model.py``).

The decision is tested on the flags and kernel answers of machines this project meets, including the one
this machine cannot reproduce: a CPU listing AMX whose kernel does not grant AMX tile data
(``ARCH_GET_XCOMP_SUPP`` = ``0x202e7``, bit 18 clear), where the AMX variant would win llama.cpp's
CPUID-only score and die with SIGILL.  The real install is checked in ``tests/test_portable_build.py``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
from scripts import local_model as lm  # noqa: E402

BASE = {"fpu", "sse", "sse2", "ssse3", "sse4_1", "sse4_2", "popcnt", "xsave", "osxsave"}
HASWELL_FLAGS = BASE | {"avx", "f16c", "fma", "avx2", "bmi1", "bmi2"}
ZEN3 = HASWELL_FLAGS | {"vaes", "vpclmulqdq", "sha_ni"}  # AMD EPYC Milan: AVX2, no AVX-512
SAPPHIRE_RAPIDS = HASWELL_FLAGS | {
    "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512ifma", "avx512vbmi", "avx512_vbmi2",
    "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq", "avx512_bf16", "avx512_fp16", "avx_vnni",
    "amx_bf16", "amx_tile", "amx_int8"}
ZEN4 = HASWELL_FLAGS | {"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512vbmi", "avx512_vnni",
                        "avx512_bf16"}
QEMU64 = {"fpu", "sse", "sse2", "ssse3"}  # a default virtual CPU: not even SSE4.2

XCOMP_NO_AMX_DATA = 0x202E7  # the machine: x87, SSE, AVX, AVX-512 (5, 6, 7), PKRU, XTILECFG; no XTILEDATA
XCOMP_WITH_AMX = XCOMP_NO_AMX_DATA | (1 << 18)
XCOMP_NO_AVX512 = 0x207  # x87, SSE, AVX, PKRU: a hypervisor that keeps AVX-512 state off
ALL = list(lm.VARIANT_FEATURES)


def pick(flags, mask, amx_permitted):
    usable = lm.usable_variants(ALL, flags, mask, amx_permitted)
    return usable, lm.expected_variant(usable, flags)


def test_amx_listed_but_not_granted_drops_only_the_amx_variant():
    usable, expected = pick(SAPPHIRE_RAPIDS, XCOMP_NO_AMX_DATA, amx_permitted=False)
    assert "sapphirerapids" not in usable
    assert expected == "zen4"  # the best AVX-512 variant this CPU runs; AVX-512 is granted there
    assert set(ALL) - set(usable) == {"sapphirerapids"}
    # llama.cpp alone (CPUID only) would have chosen the AMX variant on that machine:
    assert lm.expected_variant(ALL, SAPPHIRE_RAPIDS) == "sapphirerapids"


def test_amx_granted_and_permitted_keeps_the_amx_variant():
    usable, expected = pick(SAPPHIRE_RAPIDS, XCOMP_WITH_AMX, amx_permitted=True)
    assert (set(usable), expected) == (set(ALL), "sapphirerapids")


def test_amx_supported_but_permission_refused_drops_it():
    usable, expected = pick(SAPPHIRE_RAPIDS, XCOMP_WITH_AMX, amx_permitted=False)
    assert ("sapphirerapids" in usable, expected) == (False, "zen4")


def test_kernel_without_the_xcomp_request_never_gets_amx():
    # Linux before 5.16 has no ARCH_GET_XCOMP_SUPP (and no AMX support): the flags decide the rest
    usable, expected = pick(SAPPHIRE_RAPIDS, None, amx_permitted=True)
    assert ("sapphirerapids" in usable, expected) == (False, "zen4")


def test_zen3_gets_haswell_and_nothing_with_avx512():
    usable, expected = pick(ZEN3, 0x207, amx_permitted=False)
    assert expected == "haswell"
    assert usable == sorted(["x64", "sse42", "sandybridge", "ivybridge", "piledriver", "haswell"])


def test_avx512_flags_without_the_register_state_drop_every_avx512_variant():
    usable, expected = pick(ZEN4, XCOMP_NO_AVX512, amx_permitted=False)
    assert expected == "haswell"
    assert not any("AVX512" in f for v in usable for f in lm.VARIANT_FEATURES[v])


def test_zen4_gets_its_own_variant():
    assert pick(ZEN4, XCOMP_NO_AMX_DATA & ~(1 << 17), amx_permitted=False)[1] == "zen4"


def test_a_cpu_without_sse42_gets_the_x64_baseline():
    assert pick(QEMU64, 0x3, amx_permitted=False) == (["x64"], "x64")


def test_an_unknown_variant_is_never_used():
    assert lm.usable_variants(["haswell", "zen9"], ZEN3, 0x207, False) == ["haswell"]


def test_the_backend_folder_links_only_the_usable_variants(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ALL:
        (lib / f"libggml-cpu-{name}.so").write_bytes(b"\x7fELF")
    (lib / "libllama.so").write_bytes(b"\x7fELF")
    backends = lm.prepare_backends(lib, flags=SAPPHIRE_RAPIDS, xcomp_mask=XCOMP_NO_AMX_DATA, amx_permitted=False,
                                   root=tmp_path / "backends")
    links = sorted(p.name for p in backends.folder.iterdir())
    assert links == sorted(f"libggml-cpu-{v}.so" for v in ALL if v != "sapphirerapids")
    assert all((backends.folder / n).resolve().parent == lib.resolve() for n in links)
    assert backends.expected == "zen4"
    # the same answer twice reuses the folder; another answer gets another one
    again = lm.prepare_backends(lib, flags=SAPPHIRE_RAPIDS, xcomp_mask=XCOMP_NO_AMX_DATA, amx_permitted=False,
                                root=tmp_path / "backends")
    granted = lm.prepare_backends(lib, flags=SAPPHIRE_RAPIDS, xcomp_mask=XCOMP_WITH_AMX, amx_permitted=True,
                                  root=tmp_path / "backends")
    assert again.folder == backends.folder != granted.folder
    assert "libggml-cpu-sapphirerapids.so" in {p.name for p in granted.folder.iterdir()}
    assert sorted(p.name for p in (tmp_path / "backends").iterdir()) == sorted([backends.folder.name,
                                                                               granted.folder.name])


def test_the_manual_override_uses_exactly_that_variant(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("x64", "haswell"):
        (lib / f"libggml-cpu-{name}.so").write_bytes(b"\x7fELF")
    backends = lm.prepare_backends(lib, flags=ZEN3, only="x64", root=tmp_path / "b")
    assert ([p.name for p in backends.folder.iterdir()], backends.expected) == (["libggml-cpu-x64.so"], "x64")
    with pytest.raises(lm.ModelError, match=r"LOCAL_MODEL_CPU_BACKEND=zen4 is not an installed CPU backend; "
                                            r"choose one of haswell, x64"):
        lm.prepare_backends(lib, flags=ZEN3, only="zen4", root=tmp_path / "b")


def test_a_native_single_cpu_build_is_refused_with_what_to_run(tmp_path):
    (tmp_path / "libggml-cpu.so").write_bytes(b"\x7fELF")
    with pytest.raises(lm.ModelError) as caught:
        lm.prepare_backends(tmp_path, flags=ZEN3, root=tmp_path / "b")
    assert "compiled for one CPU" in str(caught.value) and "scripts/install_llama.py" in str(caught.value)


def test_this_machine_reports_its_kernel_state():
    mask = lm.read_xcomp_mask()  # Linux >= 5.16 answers ARCH_GET_XCOMP_SUPP (this machine runs 6.x)
    assert mask is not None and mask & 0x3 == 0x3  # x87 and SSE state are always offered
    flags = lm.read_cpu_flags()
    assert ("avx" in flags) == (mask & 0x6 == 0x6)  # Linux lists AVX only with its register state
    assert ("avx512f" in flags) == (mask & 0xE0 == 0xE0)


@pytest.mark.parametrize("sig, words", [
    (signal.SIGILL, "crashed with an illegal instruction (SIGILL) at its first completion, in the llama.cpp CPU "
                    "backend 'haswell': it uses an instruction this machine does not allow; set "
                    "LOCAL_MODEL_CPU_BACKEND=x64"),
    (signal.SIGSEGV, "crashed with a segmentation fault (SIGSEGV) at its first completion"),
    (signal.SIGKILL, "crashed with SIGKILL (killed, often by the kernel when memory runs out)"),
])
def test_a_crash_is_named_by_its_signal(sig, words):
    text = lm.describe_exit(-sig, "haswell", " at its first completion")
    assert text.startswith(words)
    assert "\n" not in text and "OPENAI_BASE_URL" in text


def test_loaded_variant_reads_the_process_maps():
    assert lm.loaded_variant(os.getpid()) is None  # this test process loads no CPU backend
    assert lm.loaded_variant(2 ** 22 + 12345) is None  # no such process
