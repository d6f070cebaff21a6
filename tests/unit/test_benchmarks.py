"""The benchmarks' bf16 sections: decided by the matmul probe, said in the output, forced by a flag."""

from __future__ import annotations

import re
from types import ModuleType

import pytest

from contllm import hardware
from tests.unit.scripts import BENCHMARKS, import_benchmark

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def sweep() -> ModuleType:
    return import_benchmark("sweep")


@pytest.mark.parametrize(
    ("speedup", "runs", "said"),
    [
        (1 / 60, False, "bf16 sections skipped: bfloat16 matmul 60.0x slower than float32 on this CPU (probe)"),
        (1.2, False, "bf16 sections skipped: bfloat16 matmul 1.20x as fast as float32 on this CPU (probe)"),
        (3.6, True, "bf16 sections run: bfloat16 matmul 3.60x as fast as float32 on this CPU (probe)"),
    ],
)
def test_the_probe_decides_and_the_output_says_why(
    sweep: ModuleType, monkeypatch: pytest.MonkeyPatch, speedup: float, runs: bool, said: str
) -> None:
    monkeypatch.setattr(hardware, "half_matmul_speedup", lambda *a, **k: speedup)
    go, line = sweep.bf16_sections("auto")
    assert go is runs and line.startswith(said) and "\n" not in line
    if not runs:
        assert "--bf16 on" in line
    monkeypatch.setattr(hardware, "half_matmul_speedup", lambda *a, **k: pytest.fail("probed though told"))
    assert sweep.bf16_sections("on") == (True, "bf16 sections run: --bf16 on (not probed)")
    assert sweep.bf16_sections("off") == (False, "bf16 sections skipped: --bf16 off")
    with pytest.raises(ValueError):
        sweep.bf16_sections("maybe")


def test_a_bf16_dtype_is_refused_where_the_probe_skips_bf16(
    sweep: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(hardware, "half_matmul_speedup", lambda *a, **k: 0.02)
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["--dtype", "bfloat16", "--workloads", "counting"])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert "bf16 sections skipped" in out and "--dtype bfloat16 is a bf16 section" in err


def test_every_benchmark_with_bf16_work_asks_the_probe() -> None:
    """A benchmark that loads or casts to bfloat16 takes --bf16 and decides by bf16_sections (main_job.py aside)."""
    for script in sorted(BENCHMARKS.glob("*.py")):
        if script.name == "main_job.py":
            continue
        text = script.read_text()
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        if re.search(r"torch\.bfloat16|\"bfloat16\"", code):
            assert "add_bf16_flags(" in code and "bf16_sections(" in code, script.name
