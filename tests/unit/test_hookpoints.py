"""The hook vocabulary (contllm.internals.hookpoints) on every family: each point equals what the stock model computes there.

References come from the stock Hugging Face forward of a copy of the model: plain torch
hooks on its modules, and an attention function that records what the family's attention
module hands to the stock eager attention (queries and keys after the rotary embedding,
values, the mask, the rotary cos/sin) before calling it. Unit durations throughout, so the
continuous model is the stock one.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from contllm import ContinuousLM, Signal
from contllm.core.attention import stock_eager
from contllm.core.families import FAMILIES, family_of, parallel_blocks
from contllm.errors import SignalError
from contllm.internals.activations import run_with_cache
from contllm.internals.hookpoints import act_name, hook_names, points, resolve_names
from tests.unit.tiny import FAMILY_NAMES, backends, prompt, tiny_model

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

CASES = [(f, b) for f in FAMILY_NAMES for b in backends(f)]
N = 10
RECORD = "contllm_test_record"
SEEN: dict[int, dict[str, Any]] = {}


def _record(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, **kw: Any):
    out, weights = stock_eager(module)(module, query, key, value, mask, **kw)
    SEEN[module.layer_idx] = dict(q=query, k=key, v=value, mask=mask, pattern=weights, **kw)
    return out, weights


AttentionInterface.register(RECORD, _record)
AttentionMaskInterface.register(RECORD, eager_mask)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of [batch, heads, pos, d] values: rotate-half pairs over the first cos.shape[-1] dims."""
    r = cos.shape[-1]
    xr, rest = x[..., :r], x[..., r:]
    half = torch.cat((-xr[..., r // 2 :], xr[..., : r // 2]), dim=-1)
    return torch.cat((xr * cos[:, None] + half * sin[:, None], rest), dim=-1)


def stock_reference(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, Any]:
    """Every module input and output the vocabulary reads, from a plain forward of a copy (eager, recorded)."""
    net = copy.deepcopy(model)
    family = family_of(net)
    net.config._attn_implementation = RECORD
    names = {m: n for n, m in net.named_modules()}
    got: dict[str, Any] = {}
    handles = []
    for module, name in names.items():

        def after(m: Any, args: tuple, kwargs: dict, output: Any, name: str = name) -> None:
            got[name] = (args, kwargs, output)

        handles.append(module.register_forward_hook(after, with_kwargs=True))
    SEEN.clear()
    try:
        with torch.no_grad():
            net(ids[None])
    finally:
        for h in handles:
            h.remove()
    return {"modules": got, "attention": dict(SEEN), "family": family, "net": net}


def first(x: Any) -> torch.Tensor:
    return x[0] if isinstance(x, (tuple, list)) else x


@pytest.mark.parametrize("family,impl", CASES)
@torch.no_grad()
def test_every_point_equals_the_stock_forward_at_unit_durations(family: str, impl: str) -> None:
    model = tiny_model(family, impl)
    lm = ContinuousLM(model)
    ids = prompt(N, 3)
    ref = stock_reference(model, ids)
    net, fam, mods = ref["net"], ref["family"], ref["modules"]
    cache = run_with_cache(lm, Signal.from_ids(ids))
    assert cache.names == hook_names(lm)
    inner = {n: m for m, n in ((m, n) for n, m in net.named_modules())}

    def output(path: str) -> torch.Tensor:
        return first(mods[path][2])[0]

    def inp(path: str) -> torch.Tensor:
        args, kwargs, _ = mods[path]
        return (args[0] if args else next(kwargs[k] for k in ("hidden_states", "input", "x") if k in kwargs))[0]

    def c(name: str) -> torch.Tensor:
        return cache[name][0]

    prefix = fam.layers
    emb_path = next(n for n, m in net.named_modules() if m is net.get_input_embeddings())
    assert max_diff(c("hook_embed"), output(emb_path)) <= 1e-6
    if fam.position_table:
        assert max_diff(c("hook_pos_embed"), output(fam.position_table)) <= 1e-6
    layers = len(net.get_submodule(prefix))
    for i in range(layers):
        b = f"blocks.{i}"
        lay = f"{prefix}.{i}"
        att = f"{lay}.{fam.attention}"
        seen = ref["attention"][i]
        assert max_diff(c(f"{b}.hook_resid_pre"), inp(lay)) <= 1e-5
        assert max_diff(c(f"{b}.hook_resid_post"), output(lay)) <= 1e-5
        attn_out = f"{lay}.{fam.attention_out_norm}" if fam.attention_out_norm else att
        mlp_out = f"{lay}.{fam.mlp_out_norm}" if fam.mlp_out_norm else f"{lay}.{fam.mlp}"
        assert max_diff(c(f"{b}.hook_attn_out"), output(attn_out)) <= 1e-5
        assert max_diff(c(f"{b}.hook_mlp_out"), output(mlp_out)) <= 1e-5
        # The residual stream is the sum of what the sub-blocks add to it.
        if parallel_blocks(net):
            assert f"{b}.hook_resid_mid" not in cache
            total = c(f"{b}.hook_resid_pre") + c(f"{b}.hook_attn_out") + c(f"{b}.hook_mlp_out")
        else:
            assert max_diff(c(f"{b}.hook_resid_mid"), inp(f"{lay}.{fam.ln2}")) <= 1e-5
            assert max_diff(c(f"{b}.hook_resid_mid"), c(f"{b}.hook_resid_pre") + c(f"{b}.hook_attn_out")) <= 1e-5
            total = c(f"{b}.hook_resid_mid") + c(f"{b}.hook_mlp_out")
        assert max_diff(c(f"{b}.hook_resid_post"), total) <= 1e-5
        # Norms: normalized x (weight + offset) (+ bias) is the stock norm's output; the scale divides the input.
        for ln, path in (("ln1", fam.ln1), ("ln2", fam.ln2)):
            if path is None:
                continue
            norm = inner[f"{lay}.{path}"]
            rebuilt = c(f"{b}.{ln}.hook_normalized") * (norm.weight + fam.norm_offset)
            if getattr(norm, "bias", None) is not None:
                rebuilt = rebuilt + norm.bias
            assert max_diff(rebuilt, output(f"{lay}.{path}")) <= 1e-5
            x = inp(f"{lay}.{path}")
            x = x - x.mean(-1, keepdim=True) if fam.norm_kind == "layer" else x
            assert max_diff(c(f"{b}.{ln}.hook_normalized") * c(f"{b}.{ln}.hook_scale"), x) <= 1e-5
        # Attention internals against what the stock attention function received.
        q, k, v = (seen[x].transpose(1, 2)[0] for x in "qkv")
        assert max_diff(c(f"{b}.attn.hook_v"), v) <= 1e-6
        if fam.rotary:
            assert max_diff(c(f"{b}.attn.hook_rot_q"), q) <= 1e-5
            assert max_diff(c(f"{b}.attn.hook_rot_k"), k) <= 1e-5
            cos, sin = mods[att][1]["position_embeddings"]
            attention = inner[att]
            pre_q, pre_k = c(f"{b}.attn.hook_q")[None], c(f"{b}.attn.hook_k")[None]
            if hasattr(attention, "q_norm"):
                pre_q, pre_k = attention.q_norm(pre_q), attention.k_norm(pre_k)
            assert max_diff(rotate(pre_q.transpose(1, 2), cos, sin).transpose(1, 2)[0], q) <= 1e-5
            assert max_diff(rotate(pre_k.transpose(1, 2), cos, sin).transpose(1, 2)[0], k) <= 1e-5
        else:
            assert max_diff(c(f"{b}.attn.hook_q"), q) <= 1e-6 and max_diff(c(f"{b}.attn.hook_k"), k) <= 1e-6
        mask = seen["mask"][0]
        heads = seen["q"].shape[1]
        assert torch.equal(c(f"{b}.attn.hook_duration_bias"), mask.expand(heads, -1, -1).float())
        keys = seen["k"].repeat_interleave(heads // seen["k"].shape[1], dim=1)
        raw = seen["q"] @ keys.transpose(-1, -2) * (seen.get("scaling") or seen["q"].shape[-1] ** -0.5)
        if seen.get("softcap"):
            raw = torch.tanh(raw / seen["softcap"]) * seen["softcap"]
        visible = mask.expand(heads, -1, -1) > -1.0
        assert max_diff(c(f"{b}.attn.hook_attn_scores")[visible], (raw[0] + mask)[visible]) <= 1e-5
        assert bool((c(f"{b}.attn.hook_attn_scores")[~visible] < -1e30).all())
        assert max_diff(c(f"{b}.attn.hook_pattern"), seen["pattern"][0]) <= 1e-5
        # z is the output projection's input per head; the results add up to its output.
        o_path = f"{att}.{fam.attention_output}"
        z = c(f"{b}.attn.hook_z")
        assert z.shape == (N, heads, seen["q"].shape[-1])
        assert max_diff(z.flatten(1), inp(o_path)) <= 1e-6
        bias = getattr(inner[o_path], "bias", None)
        result = c(f"{b}.attn.hook_result")
        assert max_diff(result.sum(1) + (0 if bias is None else bias), output(o_path)) <= 1e-5
        # MLP: pre-activation, (gated) linear input, and the activation feeding the last projection.
        mlp = f"{lay}.{fam.mlp}"
        assert max_diff(c(f"{b}.mlp.hook_post"), inp(f"{mlp}.{fam.mlp_out}")) <= 1e-6
        pre = output(f"{mlp}.{fam.mlp_in}")
        act = next(m for n, m in inner[mlp].named_children() if "act" in n)
        if fam.mlp_up is None:
            assert max_diff(c(f"{b}.mlp.hook_pre"), pre) <= 1e-6
            assert max_diff(act(c(f"{b}.mlp.hook_pre")), c(f"{b}.mlp.hook_post")) <= 1e-5
        else:
            gate, up = pre.chunk(2, -1) if fam.mlp_up == fam.mlp_in else (pre, output(f"{mlp}.{fam.mlp_up}"))
            assert max_diff(c(f"{b}.mlp.hook_pre"), gate) <= 1e-6
            assert max_diff(c(f"{b}.mlp.hook_pre_linear"), up) <= 1e-6
            product = act(c(f"{b}.mlp.hook_pre")) * c(f"{b}.mlp.hook_pre_linear")
            assert max_diff(product, c(f"{b}.mlp.hook_post")) <= 1e-5
    norm = inner[fam.norm]
    assert max_diff(c("ln_final.hook_out"), output(fam.norm)) <= 1e-5
    rebuilt = c("ln_final.hook_normalized") * (norm.weight + fam.norm_offset)
    if getattr(norm, "bias", None) is not None:
        rebuilt = rebuilt + norm.bias
    assert max_diff(rebuilt, output(fam.norm)) <= 1e-5


def test_every_family_in_the_table_has_a_vocabulary() -> None:
    # Derived from the family table: a new family without its paths fails here.
    for family in FAMILIES:
        names = hook_names(tiny_model(family.name))
        assert {"hook_embed", "blocks.0.attn.hook_duration_bias", "ln_final.hook_scale"} <= set(names)


def test_short_forms_and_predicates_resolve_to_full_names() -> None:
    lm = ContinuousLM(tiny_model("llama"))
    assert act_name(("resid_post", 2)) == "blocks.2.hook_resid_post"
    assert act_name("pattern", 1) == "blocks.1.attn.hook_pattern"
    assert act_name(("scale", 0, "ln2")) == "blocks.0.ln2.hook_scale"
    assert act_name("scale") == "ln_final.hook_scale"
    assert resolve_names(lm, lambda n: n.endswith("hook_z")) == [f"blocks.{i}.attn.hook_z" for i in range(3)]
    assert resolve_names(lm, [("q", 1), "hook_embed"]) == ["hook_embed", "blocks.1.attn.hook_q"]
    with pytest.raises(SignalError, match="no activation named 'blocks.9.hook_resid_post'"):
        resolve_names(lm, ("resid_post", 9))
    with pytest.raises(SignalError, match="selects no activation"):
        resolve_names(lm, lambda n: False)
    with pytest.raises(SignalError, match="needs a layer"):
        act_name("z")
    shapes = {n: p.shape for n, p in points(lm).items() if n.startswith("blocks.0.")}
    assert shapes["blocks.0.attn.hook_k"] == (2, 16) and shapes["blocks.0.attn.hook_q"] == (4, 16)
    assert shapes["blocks.0.attn.hook_result"] == (4, 64) and shapes["blocks.0.mlp.hook_post"] == (128,)
