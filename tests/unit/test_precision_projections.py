"""float32_state keeps each family's query/key projections (fused qkv included) in float32; restored on exit."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

import contllm.core.precision as precision
from contllm import ContinuousLM
from contllm.core.engine import Engine
from contllm.core.families import FAMILIES, attention_modules, family_of
from contllm.core.precision import MATMUL_MODULES, float32_state, projection_modules
from contllm.errors import UnsupportedModelError
from tests.unit.test_engine import sweep
from tests.unit.test_precision import half_lm, snapshot
from tests.unit.tiny import backends

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

#: Every family that lists projections, on its sdpa backend where it has one.
FAMILIES_WITH = [(f.name, backends(f.name)[-1]) for f in FAMILIES if f.float32_projections]


def test_every_family_lists_projections_and_fused_ones_are_covered() -> None:
    names = {f.name: f.float32_projections for f in FAMILIES}
    assert all(names.values())
    assert names["llama"] == ("q_proj", "k_proj")
    assert names["phi3"] == ("qkv_proj",) and names["gpt_neox"] == ("query_key_value",) and names["gpt2"] == ("c_attn",)


def mean_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().mean())


def record_matmuls(model: nn.Module, seen: dict[int, set[tuple[torch.dtype, ...]]]) -> list[Any]:
    """Forward hooks recording (input, weight, output) dtypes of every matmul module, by id."""

    def hook(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> None:
        seen.setdefault(id(module), set()).add((args[0].dtype, module.weight.dtype, output.dtype))

    return [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, MATMUL_MODULES)]


@pytest.mark.parametrize("family,impl", FAMILIES_WITH)
def test_listed_projections_compute_in_float32_and_are_restored(family: str, impl: str) -> None:
    lm = half_lm(family, impl)
    projections = projection_modules(lm.model)
    names = family_of(lm.model).float32_projections
    assert len(projections) == len(attention_modules(lm.model)) * len(names)
    assert all(getattr(a, n) in projections for a in attention_modules(lm.model) for n in names)
    listed = {id(m) for m in projections}
    before = snapshot(lm.model)
    seen: dict[int, set[tuple[torch.dtype, ...]]] = {}
    with lm.patched(), float32_state(lm):
        assert all(p.dtype == torch.float32 for m in projections for p in m.parameters())
        handles = record_matmuls(lm.model, seen)
        try:
            logits = lm.logits(sweep(3), positions="last", batch_size=3)
        finally:
            for h in handles:
                h.remove()
    assert torch.isfinite(logits).all()
    f32, bf16 = torch.float32, torch.bfloat16
    assert {key for key in seen if key in listed} == listed  # every listed projection ran
    assert set().union(*(seen[key] for key in listed)) == {(f32, f32, f32)}
    others = [seen[key] for key in seen if key not in listed]
    assert others and set().union(*others) == {(bf16, bf16, bf16)}
    assert snapshot(lm.model) == before
    assert all(p.dtype == bf16 for m in projections for p in m.parameters())


def test_switched_off_by_keyword_and_by_the_module_default(monkeypatch: pytest.MonkeyPatch) -> None:
    lm = half_lm("phi3", "sdpa")  # a fused query/key/value projection
    projections = projection_modules(lm.model)
    with float32_state(lm, float32_projections=False):
        assert all(m.weight.dtype == torch.bfloat16 for m in projections)
    signals = sweep(5)
    with_projections = Engine(lm).probs(signals)
    monkeypatch.setattr(precision, "FLOAT32_PROJECTIONS", False)
    with float32_state(lm):
        assert all(m.weight.dtype == torch.bfloat16 for m in projections)
    without = Engine(lm).probs(signals)
    with float32_state(lm, float32_projections=True):
        assert all(m.weight.dtype == torch.float32 for m in projections)
    assert float((with_projections - without).abs().max()) > 0  # the setting changes what runs
    # The engine's own keyword overrides the module default either way.
    assert torch.equal(Engine(lm, float32_projections=True).probs(signals), with_projections)
    monkeypatch.setattr(precision, "FLOAT32_PROJECTIONS", True)
    assert torch.equal(Engine(lm, float32_projections=False).probs(signals), without)


def test_restored_after_an_error() -> None:
    lm = half_lm("gpt2", "sdpa")  # fused, and a Conv1D rather than a Linear
    projections = projection_modules(lm.model)
    weights = [m.weight for m in projections]
    before = snapshot(lm.model)
    with pytest.raises(RuntimeError, match="boom"):
        with float32_state(lm):
            assert all(m.weight.dtype == torch.float32 for m in projections)
            raise RuntimeError("boom")
    assert snapshot(lm.model) == before and lm.state_dtype == torch.bfloat16
    assert all(m.weight is w for m, w in zip(projections, weights))


def test_a_missing_projection_is_an_error_before_anything_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    lm = half_lm("llama", "sdpa")
    before = snapshot(lm.model)
    wrong = dataclasses.replace(family_of(lm.model), float32_projections=("q_proj", "nope"))
    monkeypatch.setattr(precision, "family_of", lambda model: wrong)
    with pytest.raises(UnsupportedModelError, match="'nope'"):
        with float32_state(lm):
            pass
    assert snapshot(lm.model) == before and lm.state_dtype == torch.bfloat16
    with float32_state(lm, float32_projections=False):  # not looked up when switched off
        pass


@pytest.mark.parametrize("family,impl", FAMILIES_WITH)
def test_float32_projections_bring_the_logits_closer_to_float32(
    family: str, impl: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against the same bfloat16 weights run in float32, so only the engine's rounding is measured.

    Measured on these seeded models (mean |logit difference|, with / without): 0.63 (phi3)
    to 0.97 (gemma) of the distance without.
    """
    lm = half_lm(family, impl)
    reference = Engine(ContinuousLM(copy.deepcopy(lm.model).float())).logits(sweep(9))
    got = Engine(lm).logits(sweep(9))
    monkeypatch.setattr(precision, "FLOAT32_PROJECTIONS", False)
    without = Engine(lm).logits(sweep(9))
    assert mean_diff(got, reference) < mean_diff(without, reference)
