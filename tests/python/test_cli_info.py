"""`deepinfer info`: the backends compiled in, the CPU's vector units and the
kernels the CPU backend runs on them; DI_CPU_AVX512=0 keeps a CPU with
AVX-512 on the 256-bit kernels, DI_CPU_AVX_VNNI=0 one on them with
AVX-VNNI off its byte sums, DI_CPU_VNNI=0 one with AVX-512 VNNI off
its VNNI sums, DI_CPU_VBMI=0 one with AVX-512 VBMI off vpermb in them,
DI_CPU_AMX=0 one with AMX-BF16 off its tiles for the MXFP4 prefill,
DI_CPU_PREFETCH=0 the FP8 decode rows off their software prefetches."""
import os
import re

import pytest

from cli_lib import run


def _cpu_line(env=None):
    p = run("info", env=env)
    assert "backends compiled: cpu" in p.stdout
    lines = [l for l in p.stdout.splitlines() if l.startswith("cpu:")]
    assert len(lines) == 1, p.stdout
    m = re.match(r"cpu: avx2 (yes|no), fma (yes|no), avx512 (yes|no) "
                 r"\(kernels: (avx2|scalar)(, 512-bit vectors)?(?P<avx_vnni>, AVX-VNNI)?(, VNNI)?(, VBMI)?"
                 r"(, AMX tiles)?(, no prefetch)?\)$",
                 lines[0])
    assert m, lines[0]
    return _Line(m)


class _Line:
    """The match with the groups numbered as before AVX-VNNI's (1-9), that
    one by name."""

    def __init__(self, m):
        self.m = m

    def group(self, i):
        return self.m.group(i if i <= 5 else i + 1)

    def avx_vnni(self):
        return self.m.group("avx_vnni") is not None


def _default_env():
    return {k: v for k, v in os.environ.items()
            if k not in ("DI_CPU_AVX512", "DI_CPU_AVX_VNNI", "DI_CPU_VNNI", "DI_CPU_VBMI", "DI_CPU_AMX",
                         "DI_CPU_PREFETCH")}


def _cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def test_info_names_the_kernels():
    m = _cpu_line(env=_default_env())
    avx2, avx512, kernels, wide = m.group(1), m.group(3), m.group(4), m.group(5)
    assert kernels == ("avx2" if avx2 == "yes" else "scalar")
    # 512-bit kernels exactly where the CPU has AVX-512 (F/DQ/BW/VL)
    assert (wide is not None) == (avx2 == "yes" and avx512 == "yes")
    # VNNI sums exactly where those run and the CPU has AVX-512 VNNI
    assert (m.group(6) is not None) == (wide is not None and "avx512_vnni" in _cpu_flags())
    # vpermb in them exactly where they run and the CPU has AVX-512 VBMI
    # (Linux names the flag without an underscore)
    assert (m.group(7) is not None) == (m.group(6) is not None and "avx512vbmi" in _cpu_flags())
    # AMX tiles where the 512-bit kernels run and the CPU has AMX-TILE and
    # AMX-BF16 (Linux grants the tile state on request unless a process's
    # signal stacks are too small, which this CLI's are not)
    assert (m.group(8) is not None) == (wide is not None and {"amx_tile", "amx_bf16"} <= _cpu_flags())
    # AVX-VNNI's byte sums exactly where the 256-bit kernels run and the
    # CPU has it
    assert m.avx_vnni() == (kernels == "avx2" and wide is None and "avx_vnni" in _cpu_flags())


def test_avx_vnni_on_the_256bit_kernels():
    narrow = _cpu_line(env=dict(_default_env(), DI_CPU_AVX512="0"))
    if narrow.group(4) != "avx2" or "avx_vnni" not in _cpu_flags():
        pytest.skip("this CPU has no AVX-VNNI for the 256-bit kernels")
    assert narrow.avx_vnni() and narrow.group(5) is None and narrow.group(6) is None
    off = _cpu_line(env=dict(_default_env(), DI_CPU_AVX512="0", DI_CPU_AVX_VNNI="0"))
    assert not off.avx_vnni() and off.group(4) == "avx2"


def test_avx512_switch_off():
    m = _cpu_line(env=_default_env())
    if not m.group(5):
        pytest.skip("this CPU runs no 512-bit kernels: nothing to switch off")
    off = _cpu_line(env=dict(_default_env(), DI_CPU_AVX512="0"))
    assert off.group(4) == "avx2" and off.group(5) is None


def test_vnni_switch_off():
    m = _cpu_line(env=_default_env())
    if not m.group(6):
        pytest.skip("this CPU runs no VNNI sums: nothing to switch off")
    off = _cpu_line(env=dict(_default_env(), DI_CPU_VNNI="0"))
    assert off.group(5) is not None and off.group(6) is None
    assert off.group(7) is None


def test_vbmi_switch_off():
    m = _cpu_line(env=_default_env())
    if not m.group(7):
        pytest.skip("this CPU's VNNI sums take no vpermb: nothing to switch off")
    off = _cpu_line(env=dict(_default_env(), DI_CPU_VBMI="0"))
    assert off.group(6) is not None and off.group(7) is None


def test_amx_switch_off():
    m = _cpu_line(env=_default_env())
    if not m.group(8):
        pytest.skip("this CPU runs no AMX tiles: nothing to switch off")
    off = _cpu_line(env=dict(_default_env(), DI_CPU_AMX="0"))
    assert off.group(8) is None
    assert off.group(5) == m.group(5) and off.group(6) == m.group(6) and off.group(7) == m.group(7)


def test_prefetch_switch_off():
    m = _cpu_line(env=_default_env())
    assert m.group(9) is None  # on by default
    if m.group(4) != "avx2":
        pytest.skip("the scalar kernels prefetch nothing: nothing to switch off")
    off = _cpu_line(env=dict(_default_env(), DI_CPU_PREFETCH="0"))
    assert off.group(9) is not None
    assert off.group(4) == m.group(4) and off.group(5) == m.group(5) and off.group(6) == m.group(6)
