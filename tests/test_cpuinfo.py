"""The one reader of /proc/cpuinfo (zoo.cpuinfo), and its two readers: the C kernels' CPU check and a store's
``machine``, on made-up cpuinfo files."""

import platform

import pytest

from zoo import cbuild, cpuinfo
from zoo.store.manifest import machine_description

TWO_PROCESSORS = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 167
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx2 fma avx512f amx_tile

processor\t: 1
model\t\t: 99
model name\t: another one
flags\t\t: fpu
"""


@pytest.fixture
def fake_cpuinfo(tmp_path, monkeypatch):
    def write(text: str | None):
        path = tmp_path / "cpuinfo"
        if text is not None:
            path.write_text(text)
        monkeypatch.setattr(cpuinfo, "CPUINFO", path)
    return write


def test_the_first_processor_alone_in_its_order(fake_cpuinfo):
    fake_cpuinfo(TWO_PROCESSORS)
    first = cpuinfo.first_processor()
    assert list(first) == ["processor", "vendor_id", "cpu family", "model", "model name", "flags"]
    assert first["model"] == "167" and first["model name"] == "Intel(R) Xeon(R) Processor"
    assert cpuinfo.flags() == {"fpu", "sse2", "avx2", "fma", "avx512f", "amx_tile"}
    assert machine_description()["cpu"] == {"cpu family": 6, "model": 167, "model name": "Intel(R) Xeon(R) Processor",
                                            "flags": ["avx2", "fma", "avx512f", "amx_tile"]}


@pytest.mark.parametrize("text, supported", [(TWO_PROCESSORS, True), (TWO_PROCESSORS.replace(" fma", ""), False),
                                             ("processor\t: 0\n", False), (None, False)])
def test_the_kernels_need_avx2_and_fma_on_x86_64(fake_cpuinfo, monkeypatch, text, supported):
    fake_cpuinfo(text)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert cbuild.cpu_supported() is supported
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert cbuild.cpu_supported() is False


def test_no_cpuinfo_leaves_the_platform_name(fake_cpuinfo, monkeypatch):
    fake_cpuinfo(None)
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    assert cpuinfo.first_processor() == {} and cpuinfo.flags() == set()
    assert machine_description()["cpu"] == {"machine": "riscv64"}


@pytest.mark.parametrize("flags, slow", [("fpu avx2 fma", True), ("avx2 avx512f avx512_bf16", False),
                                         ("avx2 amx_tile amx_bf16", False), (None, False)])
def test_bf16_is_said_slow_on_a_cpu_without_native_bfloat16_only(fake_cpuinfo, flags, slow):
    """``zoo train --precision bf16``'s CPU check: slow where the CPU names no native bfloat16 (an AVX2 EPYC:
    7.8x ng-gnn's fp32 step); not with AVX512-BF16 or AMX, not where /proc/cpuinfo is missing (unknown),
    never for fp32 or on a GPU."""
    from dws.tasks.trainer import slow_precision

    fake_cpuinfo(None if flags is None else f"processor\t: 0\nflags\t\t: {flags}\n")
    said = slow_precision("bf16", "cpu")
    assert (said is not None) == slow
    if slow:
        assert said.startswith("--precision bf16 on a CPU without native bfloat16 (no AVX512-BF16 or AMX)")
    assert slow_precision("fp32", "cpu") is None and slow_precision("bf16", "cuda:0") is None
