"""Inside the model on SmolLM2: a continuous input inside a real nnsight trace, the patching, lens and
attention-mass experiments end to end (run, resume, report), and patching's per-head path."""

from __future__ import annotations

import copy
import csv
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from contllm import ContinuousLM, wrap

pytestmark = pytest.mark.integration

HAS_NNSIGHT = importlib.util.find_spec("nnsight") is not None


@pytest.mark.skipif(not HAS_NNSIGHT, reason="nnsight is not installed (pip install 'contllm[nnsight]')")
def test_a_continuous_input_inside_an_nnsight_trace_gives_contllms_activations_and_logits(smollm: ContinuousLM) -> None:
    import nnsight

    # nnsight replaces the forward of every module of the model it wraps, for good: wrap a copy.
    lm = wrap(copy.deepcopy(smollm.model), smollm.tokenizer)
    base = lm.signal('"apple apple apple apple" contains ')
    words = base.token_indices([(1, 24)])
    signals = [base.scale_tokens(words, 0.4), base]
    inputs = lm.forward_kwargs(signals)
    traced = nnsight.TransformersModel(lm.model, tokenizer=lm.tokenizer)
    with inputs.context(), torch.no_grad(), traced.trace(**inputs):
        attn = traced.model.layers[3].self_attn.output[0].save()
        resid = traced.model.layers[5].output.save()
        logits = traced.output.logits.save()
    names = ["blocks.3.hook_attn_out", "blocks.5.hook_resid_post"]
    cache = smollm.run_with_cache(signals, names=names)
    for b, s in enumerate(signals):
        columns = inputs.columns(0)[b] + torch.arange(len(s))
        assert torch.equal(attn[b, columns], cache.rows(names[0])[b])
        assert torch.equal(resid[b, columns], cache.rows(names[1])[b])
        assert torch.equal(logits[b, columns], cache.logits[b])
    # The scaled words moved the count: the two rows differ where it is read.
    assert float((logits[0, -1] - logits[1, -1]).abs().max()) > 0.1
    assert float((logits[:, -1] - smollm.logits(signals)).abs().max()) <= 1e-4


@pytest.mark.skipif(not HAS_NNSIGHT, reason="nnsight is not installed (pip install 'contllm[nnsight]')")
def test_lm_trace_reads_and_edits_smollm_under_a_continuous_input(smollm: ContinuousLM) -> None:
    # lm.trace leaves nnsight's controllers on the model it traces: trace a copy of the shared one.
    lm = wrap(copy.deepcopy(smollm.model), smollm.tokenizer)
    base = lm.signal('"apple apple apple apple" contains ')
    words = base.token_indices([(1, 24)])
    signals = [base.scale_tokens(words, 0.4), base]
    with lm.trace(signals) as tr:
        pattern_input = tr.model.model.layers[3].self_attn.o_proj.input.save()
        resid = tr.model.model.layers[5].output.save()
        logits = tr.model.output.logits.save()
    last = tr.columns(-1)
    cache = lm.run_with_cache(signals, names=["blocks.3.attn.hook_z", "blocks.5.hook_resid_post"], positions="last")
    for b in range(len(signals)):
        z = pattern_input[b, last[b]].view(9, 64)  # 9 heads of width 64
        assert float((z - cache.rows("blocks.3.attn.hook_z")[b][0]).abs().max()) <= 1e-4
        assert float((resid[b, last[b]] - cache.rows("blocks.5.hook_resid_post")[b][0]).abs().max()) <= 1e-4
    assert float((logits[:, -1] - smollm.logits(signals)).abs().max()) <= 1e-4
    # An edit in the trace equals the same edit as a hook function: zero head 2 of layer 3.
    with lm.trace(signals) as tr:
        z = tr.model.model.layers[3].self_attn.o_proj.input
        tr.model.model.layers[3].self_attn.o_proj.input = torch.cat([z[..., :128], torch.zeros_like(z[..., 128:192]), z[..., 192:]], -1)
        edited = tr.model.output.logits.save()

    def zero_head(z: torch.Tensor, hook) -> torch.Tensor:
        z = z.clone()
        z[:, :, 2] = 0
        return z

    hooked = lm.run_with_hooks(signals, fwd_hooks=[("blocks.3.attn.hook_z", zero_head)])
    assert float((edited[:, -1] - hooked).abs().max()) <= 1e-4
    assert float((edited[:, -1] - logits[:, -1]).abs().max()) > 1e-3
    assert lm.to_str_tokens(base)[1:5] == ["apple", " apple", " apple", " apple"]


def test_patching_lens_and_attention_mass_run_resume_and_report(smollm: ContinuousLM, tmp_path) -> None:
    import json

    from contllm.rundir.report import write_report
    from contllm.rundir.runner import run

    settings = {
        "patching": {"heads": False},
        "lens": {"samples": "3"},
        "attention-mass": {"samples": "3"},
    }
    summaries = {}
    for name, options in settings.items():
        out = tmp_path / name
        run(name, options=options, lm=smollm, model="smollm2-135m", items="2", out=out, item_figures=False)
        first = (out / "results.json").read_text()
        # Resumed with every record there: nothing is recomputed and the results are the same.
        run(name, options=options, lm=smollm, model="smollm2-135m", items="2", out=out, item_figures=False,
            resume=True)
        assert (out / "results.json").read_text() == first
        assert (out / "figures" / "summary.png").stat().st_size > 1000
        summaries[name] = json.loads((out / "summary.json").read_text())
        assert summaries[name]["items"] == 2
        paths = write_report([out], tmp_path / f"report-{name}")
        assert any(p.name == "summary.md" for p in paths)
    patching = summaries["patching"]
    # Acceptance: a run patched with its own activations is unchanged, and the c = 1 run's last-layer
    # residual at every position gives the c = 1 output, both exactly.
    assert patching["self_patch_max_dp"] == 0.0 and patching["last_layer_max_dp"] == 0.0
    assert patching["mean_change"] > 0.1  # shrinking the word lowers the implied count
    assert summaries["lens"]["lens_max_dp"] <= 1e-4  # the last layer's lens is the model's output
    assert summaries["lens"]["output_spearman"] > 0.5
    assert 0.0 <= summaries["attention-mass"]["share_following"] <= 1.0


# ---------------------------------------------------------------- patching's per-head path


def first_layers(lm: ContinuousLM, count: int) -> ContinuousLM:
    """SmolLM2 cut to its first ``count`` decoder layers (same weights, same tokenizer): the whole patching
    path, with heads, at a tenth of the layers' cost and a tenth of the head rows."""
    import transformers

    config = copy.deepcopy(lm.model.config)
    config.num_hidden_layers = count
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:count]
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=config._attn_implementation)
    missing, _ = model.load_state_dict(lm.model.state_dict(), strict=False)
    assert not missing
    return wrap(model.eval(), lm.tokenizer)


@pytest.fixture(scope="module")
def smollm3(smollm: ContinuousLM) -> ContinuousLM:
    return first_layers(smollm, 3)


def test_every_head_of_a_layer_patched_is_the_attention_output_patched_on_smollm2(smollm3: ContinuousLM) -> None:
    """SmolLM2's attention (9 query heads on 3 key/value heads, head_dim 64; its first 3 layers) on count-001's
    prompt: each head of hook_z patched in turn, as the patching experiment builds them, with the run's own
    values change nothing, and with the c = 1 run's give the c = 1 run's attention output."""
    from contllm.core.families import head_counts
    from contllm.experiments.inside import prompt_of
    from contllm.experiments.patching import PatchingConfig
    from contllm.internals.activations import Patch, patch, run_with_cache

    config = PatchingConfig()
    item = prompt_of(smollm3, config.counting_items()[0], config)
    plain, scaled = item.signal, item.at(0.5)
    tail = list(range(min(item.scaled), len(plain)))
    heads, _ = head_counts(smollm3)
    z, out = "blocks.1.attn.hook_z", "blocks.1.hook_attn_out"
    base = run_with_cache(smollm3, scaled, names=[z, out], positions=tail)
    other = run_with_cache(smollm3, plain, names=[z, out], positions=tail)
    own, theirs = base.rows(z)[0], other.rows(z)[0]
    assert own.shape == (len(tail), heads, 64)
    mixed = own.clone()
    for h in range(heads):
        mixed[:, h] = own[:, h]
    with patch(smollm3, scaled, Patch(z, tail, mixed)):
        same = run_with_cache(smollm3, scaled, names=[out], positions=tail)
    assert torch.equal(same.logits[0][-1], base.logits[0][-1])
    for h in range(heads):
        mixed[:, h] = theirs[:, h]
    with patch(smollm3, scaled, Patch(z, tail, mixed)):
        by_heads = run_with_cache(smollm3, scaled, names=[out], positions=tail)
    with patch(smollm3, scaled, Patch(out, tail, other.rows(out)[0])):
        by_output = run_with_cache(smollm3, scaled, names=[out], positions=tail)
    assert float((by_heads.rows(out)[0] - other.rows(out)[0]).abs().max()) <= 1e-4
    assert float((by_heads.logits[0][-1] - by_output.logits[0][-1]).abs().max()) <= 1e-4
    assert float((by_heads.logits[0][-1] - base.logits[0][-1]).abs().max()) > 1e-3


def test_patching_with_heads_runs_resumes_and_reports(smollm3: ContinuousLM, tmp_path) -> None:
    from contllm.rundir.report import write_report
    from contllm.rundir.runner import run

    lm, layers = smollm3, 3
    out = tmp_path / "patching"
    run("patching", options={}, lm=lm, model="smollm2-135m", items="1", out=out, item_figures=False)
    first = (out / "results.json").read_text()
    run("patching", options={}, lm=lm, model="smollm2-135m", items="1", out=out, item_figures=False, resume=True)
    assert (out / "results.json").read_text() == first
    config = json.loads((out / "config.json").read_text())
    assert config["options"]["heads"] is True
    (record,) = json.loads(first)["items"]
    heads = np.asarray(record["heads"])
    assert heads.shape == (layers, 9) and np.isfinite(heads).all()
    assert np.asarray(record["resid"]).shape == (layers, len(record["positions"]))
    assert record["self_max_dp"] == 0.0 and record["last_layer_max_dp"] == 0.0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["max_head_share"] == pytest.approx(float(np.nanmax(heads)))
    assert summary["strongest_head"] == "L{}H{}".format(*np.unravel_index(int(np.nanargmax(heads)), heads.shape))
    with open(out / "results.csv", newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["site"] == "head"]
    assert sorted((int(r["layer"]), int(r["head"])) for r in rows) == [(i, h) for i in range(layers) for h in range(9)]
    paths = write_report([out], tmp_path / "report")
    assert any(p.name == "summary.md" for p in paths)
    assert "max_head_share" in "".join(p.read_text() for p in paths if p.suffix == ".md")


@pytest.mark.slow
def test_the_patching_command_with_heads_on_smollm2(tmp_path) -> None:
    """``contllm run patching --model smollm2-135m --items 1``, heads included (the default), then --resume and report:
    every record holds a restored share for each of SmolLM2's 30 x 9 heads. Minutes on a 2-core CPU."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "patching"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "contllm.cli.commands", *args], capture_output=True, text=True, timeout=1800, env=env
        )

    done = cli("run", "patching", "--model", "smollm2-135m", "--items", "1", "--no-item-figures", "--out", str(out))
    assert done.returncode == 0, done.stderr
    first = (out / "results.json").read_text()
    (record,) = json.loads(first)["items"]
    heads = np.asarray(record["heads"])
    assert heads.shape == (30, 9) and np.isfinite(heads).all()
    assert record["self_max_dp"] == 0.0 and record["last_layer_max_dp"] == 0.0
    again = cli("run", "patching", "--model", "smollm2-135m", "--items", "1", "--no-item-figures", "--out", str(out), "--resume")
    assert again.returncode == 0, again.stderr
    assert (out / "results.json").read_text() == first
    report = cli("report", str(out), "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
