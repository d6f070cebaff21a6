"""The experiments inside the model (patching, lens, attention-mass): configs, records and the slope, without a model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from contllm import ExperimentError, registry
from contllm.core.readout import TokenSets
from contllm.experiments.attention_mass import EXPERIMENT as MASS
from contllm.experiments.attention_mass import MassRecord, log_odds_slopes
from contllm.experiments.inside import SweepInsideConfig, implied_counts
from contllm.experiments.lens import EXPERIMENT as LENS
from contllm.experiments.lens import LensRecord
from contllm.experiments.patching import EXPERIMENT as PATCHING
from contllm.experiments.patching import PatchingConfig, PatchRecord

pytestmark = pytest.mark.unit


def test_registered_under_their_names() -> None:
    for name, experiment in (("patching", PATCHING), ("lens", LENS), ("attention-mass", MASS)):
        assert registry.get(name) is experiment and experiment.engine and experiment.metrics


@pytest.mark.parametrize("given,match", [
    ({"factor": "1"}, "other than 1"),
    ({"factor": "-0.5"}, "positive"),
    ({"first": "-1"}, "--first"),
    ({"template": "no field here"}, "words"),
])
def test_patching_refuses_bad_options(given: dict[str, str], match: str) -> None:
    with pytest.raises(ExperimentError, match=match):
        PATCHING.config(given)


@pytest.mark.parametrize("given,match", [({"range": "0,1"}, "positive"), ({"range": "1,0.5"}, "larger"),
                                         ({"samples": "0"}, "samples")])
def test_sweeps_refuse_bad_options(given: dict[str, str], match: str) -> None:
    for experiment in (LENS, MASS):
        with pytest.raises(ExperimentError, match=match):
            experiment.config(given)


def test_defaults_are_small_and_include_factor_one() -> None:
    config = LENS.config({})
    assert isinstance(config, SweepInsideConfig) and config.first == 2
    assert np.isclose(config.factors(), 1.0).any() and len(config.factors()) == 7
    assert len(PATCHING.items(PATCHING.config({}))) == 2
    assert PATCHING.config({"heads": False}).heads is False


def test_a_head_that_only_takes_the_bias_has_slope_one_and_a_fixed_one_zero() -> None:
    factors = np.array([0.1, 0.3, 1.0, 2.0])
    odds = 0.2 / 0.8
    follows = factors * odds / (1 + factors * odds)
    mass = np.stack([follows, np.full(4, 0.2), factors**2 * odds / (1 + factors**2 * odds)], axis=-1)
    assert np.allclose(log_odds_slopes(factors, mass), [1.0, 0.0, 2.0])


def test_implied_count_is_the_expectation_over_the_digits() -> None:
    sets = TokenSets(tuple(str(k) for k in range(10)), tuple((k,) for k in range(10)))
    logits = torch.full((2, 12), -1e9)
    logits[0, 3] = 0.0
    logits[1, 2] = logits[1, 4] = 0.0
    logits[1, 11] = 0.0  # a non-digit token: renormalised away
    counts, probs = implied_counts(logits, sets)
    assert np.allclose(counts, [3.0, 3.0]) and probs.shape == (2, 10)


def test_records_round_trip() -> None:
    patched = PatchRecord("count-001", 0.5, [5, 6], ["a", " b"], 3.0, 2.0, [0.1] * 10, [0.1] * 10,
                          np.array([[0.0, 0.5]]), np.array([[0.25]]), 0.0, 0.0, 2, {"word": "a"})
    assert PatchRecord.from_dict(patched.to_dict()).to_dict() == patched.to_dict()
    lens = LensRecord("count-001", np.array([0.5, 1.0]), np.ones((3, 2)), np.ones((3, 2), dtype=int), 1e-7, 2)
    assert LensRecord.from_dict(lens.to_dict()).to_dict() == lens.to_dict()
    mass = MassRecord("count-001", np.array([0.5, 1.0]), np.ones((2, 3, 4)) / 4, np.ones((3, 4)), [4, 5], 2)
    assert MassRecord.from_dict(mass.to_dict()).to_dict() == mass.to_dict()
    with pytest.raises(ExperimentError, match="malformed"):
        PatchRecord.from_dict({"item_id": "x"})
    assert isinstance(PATCHING.config({"factor": "0.25"}), PatchingConfig)


# ---------------------------------------------------------------- the per-head patching path, on tiny models
#
# Tiny random models (tests/unit/tiny.py) with a made-up prompt: the digits are token ids 10-19.
# llama has grouped key/value heads (4 query heads on 2) and an nn.Linear output projection,
# gpt2 a Conv1D one.

HEAD_FAMILIES = ["llama", "gpt2"]
N_TOKENS = 9
SCALED = [3, 5]  # the tail patched runs from token 3 to the read position (token 8): 6 positions
DIGIT_IDS = TokenSets(tuple(str(k) for k in range(10)), tuple((10 + k,) for k in range(10)))


def tiny_prompt():
    from contllm import Signal
    from contllm.experiments.inside import Prompt
    from tests.unit.tiny import prompt

    signal = Signal(
        durations=torch.ones(N_TOKENS, dtype=torch.float64),
        token_ids=prompt(N_TOKENS, 29),
        text="abcdefghi",
        offsets=tuple((i, i + 1) for i in range(N_TOKENS)),
    )
    return Prompt(signal, SCALED, 2, {"word": "w"})


def expected_count(lm, signal, patches=()) -> float:
    """E[k] at the last token of ``signal`` from one full forward (no shared prefix), patched as given."""
    from contllm.internals.activations import patch, run_with_cache

    with patch(lm, signal, list(patches)):
        logits = run_with_cache(lm, signal, names="blocks.0.hook_resid_post", positions="last").logits[0]
    return float(implied_counts(logits, DIGIT_IDS)[0][0])


@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_every_head_of_a_layer_patched_is_its_attention_output_patched(family: str) -> None:
    from contllm.core.families import decoder_layers, head_counts
    from contllm.internals.activations import Patch, patch, run_with_cache
    from tests.unit.tiny import tiny_lm

    lm, item = tiny_lm(family), tiny_prompt()
    plain, scaled = item.signal, item.at(0.2)
    tail = list(range(SCALED[0], N_TOKENS))
    layers, (heads, _) = len(decoder_layers(lm)), head_counts(lm)
    names = [f"blocks.{i}.{p}" for i in range(layers) for p in ("attn.hook_z", "hook_attn_out")]
    cached = run_with_cache(lm, [scaled, plain], names=names, positions=tail)
    base = run_with_cache(lm, scaled, names=names, positions=tail)
    for i in range(layers):
        z, out = f"blocks.{i}.attn.hook_z", f"blocks.{i}.hook_attn_out"
        # Own values from the very forward they go back into (a batch of two rounds differently).
        own, other = base.rows(z)[0], cached.rows(z)[1]
        width = own.shape[-1] // heads
        assert own.shape[-1] == heads * width
        # Every head's output with the run's own values, head by head as patching builds them: nothing moves.
        mixed = own.clone()
        for h in range(heads):
            mixed[:, h * width : (h + 1) * width] = own[:, h * width : (h + 1) * width]
        with patch(lm, scaled, Patch(z, tail, mixed)):
            same = run_with_cache(lm, scaled, names=names, positions=tail)
        assert torch.equal(same.logits[0], base.logits[0])
        # Every head, one after the other, with the c = 1 run's: the same as its attention output patched.
        for h in range(heads):
            mixed[:, h * width : (h + 1) * width] = other[:, h * width : (h + 1) * width]
        assert torch.equal(mixed, other)
        with patch(lm, scaled, Patch(z, tail, mixed)):
            by_heads = run_with_cache(lm, scaled, names=[out], positions=tail)
        with patch(lm, scaled, Patch(out, tail, cached.rows(out)[1])):
            by_output = run_with_cache(lm, scaled, names=[out], positions=tail)
        assert float((by_heads.rows(out)[0] - cached.rows(out)[1]).abs().max()) <= 1e-5
        assert float((by_heads.logits[0] - by_output.logits[0]).abs().max()) <= 1e-5
        # And it moved something: the patch is not a no-op.
        assert float((by_heads.logits[0] - base.logits[0]).abs().max()) > 1e-3


def test_head_h_is_the_columns_patching_takes_for_it() -> None:
    """Head h's output is hook_z's columns h x head_dim to (h + 1) x head_dim: changing only head h's
    queries changes only those columns (llama: q_proj rows in head order)."""
    import copy

    from contllm import ContinuousLM
    from contllm.core.families import head_counts
    from contllm.internals.activations import run_with_cache
    from tests.unit.tiny import tiny_model

    model = tiny_model("llama", "eager")
    heads, _ = head_counts(model)
    width = model.config.hidden_size // heads
    signal = tiny_prompt().at(0.2)
    name = "blocks.1.attn.hook_z"
    base = run_with_cache(ContinuousLM(model), signal, names=name)[name][0]
    for h in (0, heads - 1):
        changed = copy.deepcopy(model)
        with torch.no_grad():
            changed.model.layers[1].self_attn.q_proj.weight[h * width : (h + 1) * width] *= 3.0
        z = run_with_cache(ContinuousLM(changed), signal, names=name)[name][0]
        moved = (z - base).abs().amax(dim=0).reshape(heads, width).amax(dim=-1)
        assert moved[h] > 1e-3 and float(moved.sum() - moved[h]) == 0.0


@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_patch_item_with_heads_restores_what_each_head_patched_alone_restores(family: str, monkeypatch) -> None:
    from contllm.core.families import decoder_layers, head_counts
    from contllm.experiments import patching
    from contllm.internals.activations import Patch, run_with_cache
    from tests.unit.tiny import tiny_lm

    monkeypatch.setattr(patching, "digit_sets", lambda lm: DIGIT_IDS)
    monkeypatch.setattr(patching, "ROWS", 7)  # several batches, one holding residual and head rows
    lm, item = tiny_lm(family), tiny_prompt()
    layers, (heads, _) = len(decoder_layers(lm)), head_counts(lm)
    record = patching.patch_item(lm, "tiny-001", item, 0.2, heads=True)
    tail = list(range(SCALED[0], N_TOKENS))
    assert record.positions == tail and record.tokens == list("defghi")
    assert record.resid.shape == (layers, len(tail)) and record.heads.shape == (layers, heads)
    assert np.isfinite(record.resid).all() and np.isfinite(record.heads).all()
    # The checks, now with every head output patched too: own values change nothing, exactly.
    assert record.self_max_dp == 0.0 and record.last_layer_max_dp == 0.0
    plain, scaled = item.signal, item.at(0.2)
    e_plain, e_scaled = expected_count(lm, plain), expected_count(lm, scaled)
    assert abs(record.plain - e_plain) <= 1e-4 and abs(record.scaled - e_scaled) <= 1e-4
    assert abs(e_plain - e_scaled) > 0.05  # a change to locate
    # Each head's share, recomputed with full forwards (no shared prefix, one row at a time).
    names = [f"blocks.{i}.attn.hook_z" for i in range(layers)]
    cached = run_with_cache(lm, [scaled, plain], names=names, positions=tail)
    want = np.zeros((layers, heads))
    for i, name in enumerate(names):
        for h in range(heads):
            mixed = cached.rows(name)[0].clone()  # [positions, heads, head_dim]
            mixed[:, h] = cached.rows(name)[1][:, h]
            want[i, h] = (expected_count(lm, scaled, [Patch(name, tail, mixed)]) - e_scaled) / (e_plain - e_scaled)
    assert np.abs(record.heads - want).max() <= 1e-4
    assert np.abs(record.heads).max() > 0.01  # the heads do carry some of the change
    # Without --heads the residual part is the same and the heads' is empty.
    without = patching.patch_item(lm, "tiny-001", item, 0.2, heads=False)
    assert without.heads.shape == (0, 0) and np.abs(without.resid - record.resid).max() <= 1e-4
    # The residual stream at the read position after the last layer carries the whole change.
    assert abs(record.resid[-1, -1] - 1.0) <= 1e-4


def test_patching_tables_and_summary_hold_every_head() -> None:
    from contllm.experiments.patching import PatchingResult

    heads = np.arange(6, dtype=np.float64).reshape(2, 3) / 10
    record = PatchRecord("count-001", 0.5, [5, 6], ["a", " b"], 3.0, 2.0, [0.1] * 10, [0.1] * 10,
                         np.array([[0.1, 0.2], [0.4, 0.9]]), heads, 0.0, 0.0, 2, {})
    result = PatchingResult(experiment="patching", model="tiny", config={"heads": True}, records=[record])
    rows = PATCHING.tables(result)["results"][1]
    assert [(r["layer"], r["head"], r["share"]) for r in rows if r["site"] == "head"] == [
        (i, h, heads[i, h]) for i in range(2) for h in range(3)
    ]
    summary = PATCHING.summary(result)
    assert summary["max_head_share"] == pytest.approx(0.5) and summary["strongest_head"] == "L1H2"
