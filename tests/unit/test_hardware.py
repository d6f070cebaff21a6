"""cpu_capability: what the CPU offers torch, from /proc/cpuinfo or, without it, torch's probe."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from contllm import hardware
from contllm.hardware import cpu_capability, describe

pytestmark = pytest.mark.unit

SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480C
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480C
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
"""

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni
"""

SKYLAKE = """processor\t: 0
model name\t: Intel(R) Xeon(R) CPU @ 2.00GHz
flags\t\t: fpu sse2 avx2 avx512f avx512bw
"""


def test_the_machine_as_torch_sees_it() -> None:
    cap = cpu_capability()
    assert cap["capability"] == torch.backends.cpu.get_cpu_capability()
    assert cap["cores"] == os.cpu_count() and cap["threads"] == torch.get_num_threads()
    assert isinstance(cap["amx"], bool) and isinstance(cap["avx512_bf16"], bool)
    assert json.loads(json.dumps(cap)) == cap  # goes into a manifest as is


def test_threads_are_read_when_asked() -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert cpu_capability()["threads"] == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    "text,name,amx,bf16",
    [
        (SAPPHIRE_RAPIDS, "Intel(R) Xeon(R) Platinum 8480C", True, True),
        (ZEN4, "AMD EPYC 9R14", False, True),
        (SKYLAKE, "Intel(R) Xeon(R) CPU @ 2.00GHz", False, False),
    ],
)
def test_flags_from_proc_cpuinfo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, name: str, amx: bool, bf16: bool
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(text)
    monkeypatch.setattr(hardware, "CPUINFO", cpuinfo)
    monkeypatch.setattr(hardware, "_torch_says", lambda probe: pytest.fail("torch probed with /proc/cpuinfo present"))
    cap = cpu_capability()
    assert (cap["name"], cap["amx"], cap["avx512_bf16"], cap["flags_source"]) == (name, amx, bf16, str(cpuinfo))
    line = describe(cap)
    assert line.startswith(f"cpu: {name}, {cap['capability']}, ")
    assert ("no AMX" in line) != amx and ("no avx512_bf16" in line) != bf16


def test_without_proc_cpuinfo_torch_is_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "CPUINFO", tmp_path / "absent")  # macOS, Windows
    asked: list[str] = []

    def probe(name: str) -> bool:
        asked.append(name)
        return name == "_is_avx512_bf16_supported"

    monkeypatch.setattr(hardware, "_torch_says", probe)
    cap = cpu_capability()
    assert (cap["amx"], cap["avx512_bf16"], cap["flags_source"]) == (False, True, "torch.cpu")
    assert sorted(asked) == ["_is_amx_tile_supported", "_is_avx512_bf16_supported"]
    assert cap["name"] and cap["capability"] == torch.backends.cpu.get_cpu_capability()


def test_a_missing_torch_probe_is_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    assert hardware._torch_says("_is_amx_tile_supported") is False
    assert hardware._torch_says("_no_such_probe") is False


def test_half_matmul_speedup_is_a_measured_ratio() -> None:
    for dtype in (torch.bfloat16, torch.float16):
        speedup = hardware.half_matmul_speedup(dtype, repeats=1)
        assert isinstance(speedup, float) and 0 < speedup < float("inf")


@pytest.mark.parametrize("speedup,expected", [(0.5, "2.00x slower"), (1.2, "only 1.20x faster"), (3.0, None)])
def test_half_precision_note_only_where_half_is_no_faster(monkeypatch: pytest.MonkeyPatch, speedup: float,
                                                           expected: str | None) -> None:
    # The decision on a given measurement; the measurement itself is the CPU's (test above).
    monkeypatch.setattr(hardware, "half_matmul_speedup", lambda dtype: speedup)
    note = hardware.half_precision_note(torch.bfloat16)
    if expected is None:
        assert note is None
    else:
        assert note is not None and expected in note and "bfloat16" in note and "\n" not in note


def test_a_run_notes_slow_half_precision_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    from contllm.rundir import runner

    monkeypatch.setattr(hardware, "half_matmul_speedup", lambda dtype: 0.5)
    said: list[str] = []
    runner._note_half_precision("bf16", "cpu", said.append)
    runner._note_half_precision("float32", "cpu", said.append)
    runner._note_half_precision("not-a-dtype", "cpu", said.append)
    assert len(said) == 1 and said[0].startswith("note: bfloat16 matmuls run 2.00x slower")


@pytest.mark.parametrize("speedup, runs", [(0.2, False), (1.49, False), (1.5, True), (3.6, True)])
def test_benchmarks_run_their_bf16_sections_only_where_bf16_pays(
    monkeypatch: pytest.MonkeyPatch, speedup: float, runs: bool
) -> None:
    monkeypatch.setattr(hardware, "half_matmul_speedup", lambda dtype=None, **_: speedup)
    go, why = hardware.half_sections("auto")
    assert go is runs and (why is None) is runs
    if not runs:
        assert f"{speedup:.2f}x" in why and "--bf16 on" in why  # type: ignore[operator]
    monkeypatch.setattr(hardware, "half_matmul_speedup", lambda *a, **k: pytest.fail("probed though told"))
    assert hardware.half_sections("on") == (True, None) and hardware.half_sections("off") == (False, None)
    with pytest.raises(ValueError):
        hardware.half_sections("maybe")
