"""The worked circuit example of docs/inside.md: which attention heads carry the count when the words are shortened.

Usage:
    python scripts/inside_circuit.py --model qwen2.5-coder-0.5b --factor 0.5 --out docs/images/inside-circuit

A few-shot counting prompt (``--text``; its last line holds the counted word, ``--word``,
four times) runs with every occurrence of the word on the last line at duration c (the
*short* run) and at duration 1 (the *plain* run). For every attention head (layer l,
head h), three numbers, each the share of the change in the implied count E[k] (plain
minus short) that it accounts for:

- z patched: the short run with the head's output (``attn.hook_z``) taken from the plain
  run at every position: everything the head passes on;
- bias restored: the short run with the head's duration bias (``attn.hook_duration_bias``)
  at the word's tokens put back to the plain run's, log 1 = 0: the head weighs the words as
  full-length ones, everything else (the times, every other head) stays short;
- bias gradient: the first-order estimate of the latter from one backward pass,
  sum over queries and the word's keys of dE[k]/d bias x (-log c), divided by the change.

Two more shares split the change between the two ways a duration enters the model: every
head's duration bias restored at once (the words weigh as full-length ones everywhere, at
the short run's times), and the times restored alone (the plain run's times with the short
durations). Heads run in batches: one row per head, each row's hook edits only its own
head. Writes OUT.png (the figure) and OUT.json (every share, the counts, the strongest heads).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import contllm
from contllm.core.families import decoder_layers, head_counts
from contllm.core.readout import digits
from contllm.plotting import plt, save_figure

#: Rows (heads) per forward.
ROWS = 48

TEXT = '"cat cat" contains 2 words.\n"dog dog dog" contains 3 words.\n"apple apple apple apple" contains '


def expected_count(logits: torch.Tensor, sets: Any) -> torch.Tensor:
    """E[k] over the digits 0-9, renormalised over them: [...] from logits [..., vocab] (differentiable)."""
    probs = sets.gather(torch.softmax(logits.double(), dim=-1))
    return (probs * torch.arange(10, dtype=probs.dtype)).sum(-1) / probs.sum(-1)


def by_head(lm: Any, signal: Any, heads: list[tuple[int, int]], name: str, edit: Any, sets: Any) -> np.ndarray:
    """E[k] of ``signal`` with ``edit(values, row, head)`` applied at ``name`` of one head per row, for every head."""
    out = []
    for start in range(0, len(heads), ROWS):
        rows = heads[start : start + ROWS]

        def fn(x: torch.Tensor, hook: Any, rows: list[tuple[int, int]] = rows) -> torch.Tensor:
            x = x.clone()
            for r, (layer, head) in enumerate(rows):
                if layer == hook.layer:
                    edit(x, r, layer, head)
            return x

        logits = lm.run_with_hooks([signal] * len(rows), fwd_hooks=[(lambda n: n.endswith(name), fn)])
        out.append(expected_count(logits, sets).numpy())
    return np.concatenate(out)


def head_shares(lm: Any, text: str, word: str, factor: float) -> dict[str, Any]:
    """The three per-head shares (see the module docstring), as arrays [layers, heads], with the counts."""
    plain = lm.signal(text)
    spans = [s for s in plain.find(word) if s[0] >= text.rindex("\n")]
    scaled = plain.token_indices(spans)
    short = plain.scale(spans, factor)
    sets = digits(lm.tokenizer)
    layers, (heads, _) = len(decoder_layers(lm)), head_counts(lm)
    pairs = [(layer, head) for layer in range(layers) for head in range(heads)]
    counts = expected_count(lm.logits([plain, short]), sets)
    e_plain, e_short = float(counts[0]), float(counts[1])
    change = e_plain - e_short
    z_plain = lm.run_with_cache(plain, names=lambda n: n.endswith("attn.hook_z"))

    def patch_z(z: torch.Tensor, row: int, layer: int, head: int) -> None:
        z[row, :, head] = z_plain[("z", layer)][0][:, head].to(z.dtype)

    def restore_bias(bias: torch.Tensor, row: int, layer: int, head: int) -> None:
        keys = bias[row, head][:, scaled]
        bias[row, head][:, scaled] = torch.where(keys > -1e30, keys - math.log(factor), keys)

    def every_head(bias: torch.Tensor, hook: Any) -> torch.Tensor:
        bias = bias.clone()
        for row in range(len(bias)):
            for head in range(heads):
                restore_bias(bias, row, hook.layer, head)
        return bias

    unbiased = lm.run_with_hooks(short, fwd_hooks=[(lambda n: n.endswith("hook_duration_bias"), every_head)])
    timed = short.with_times(plain.times)
    e_bias, e_times = (float(expected_count(x, sets)) for x in (unbiased, lm.logits(timed)))
    z_patched = by_head(lm, short, pairs, "attn.hook_z", patch_z, sets)
    restored = by_head(lm, short, pairs, "attn.hook_duration_bias", restore_bias, sets)
    grads = lm.gradients(
        short, lambda logits: expected_count(logits, sets), wrt=lambda n: n.endswith("hook_duration_bias")
    )
    estimate = np.array(
        [
            float(grads.activations[f"blocks.{layer}.attn.hook_duration_bias"][0][head][:, scaled].sum())
            * -math.log(factor)
            for layer, head in pairs
        ]
    )
    shape = (layers, heads)
    return {
        "model": getattr(lm.info, "alias", None) or getattr(lm.info, "name", None),
        "text": text,
        "factor": factor,
        "words": lm.to_str_tokens(plain)[scaled[0] : scaled[-1] + 1],
        "plain": e_plain,
        "short": e_short,
        "every_bias_restored": (e_bias - e_short) / change,
        "times_restored": (e_times - e_short) / change,
        "z_patched": ((z_patched - e_short) / change).reshape(shape),
        "bias_restored": ((restored - e_short) / change).reshape(shape),
        "bias_gradient": (estimate / change).reshape(shape),
    }


def strongest(values: np.ndarray, k: int = 5) -> list[tuple[str, float]]:
    order = np.argsort(values, axis=None)[::-1][:k]
    return [(f"L{i}H{h}", float(values[i, h])) for i, h in zip(*np.unravel_index(order, values.shape))]


def figure(result: dict[str, Any]) -> Any:
    """Two maps (layers x heads) of the restored shares and the gradient estimate against the restoration."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 5), layout="constrained")
    for ax, key, title in (
        (axes[0], "z_patched", "head output (hook_z) from the c = 1 run"),
        (axes[1], "bias_restored", "the head's duration bias of the words back to c = 1"),
    ):
        values = 100 * result[key]
        top = float(np.abs(values).max())
        image = ax.imshow(values, aspect="auto", origin="lower", cmap="RdBu_r", vmin=-top, vmax=top)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        fig.colorbar(image, ax=ax, label="% of the change in E[k] restored")
        for label, value in strongest(result[key], 3):
            layer, head = (int(x) for x in label[1:].split("H"))
            color = "white" if abs(100 * value) > top / 2 else "black"
            ax.text(head, layer, label, ha="center", va="center", fontsize=7, color=color)
    ax = axes[2]
    x, y = 100 * result["bias_gradient"].ravel(), 100 * result["bias_restored"].ravel()
    ax.scatter(x, y, s=10, alpha=0.6)
    lo, hi = float(min(x.min(), y.min())), float(max(x.max(), y.max()))
    ax.plot([lo, hi], [lo, hi], color="gray", lw=0.8, ls=":")
    ax.set_xlabel("gradient estimate, % (one backward pass)")
    ax.set_ylabel("bias restored, % (one forward per head)")
    ax.set_title("per head: first order against the real thing", fontsize=10)
    fig.suptitle(
        f"{result['model']}: the last line's {''.join(result['words']).strip()!r} at c = {result['factor']:g}; "
        f"E[k] {result['short']:.2f} (c = {result['factor']:g}) and {result['plain']:.2f} (c = 1); every head's "
        f"bias restored: {result['every_bias_restored']:.0%}, the times restored: {result['times_restored']:.0%}",
        fontsize=11,
    )
    return fig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="alias, local directory or hub id")
    parser.add_argument("--text", default=TEXT, help="few-shot counting prompt; its last line holds the counted word")
    parser.add_argument("--word", default="apple", help="the counted word (its occurrences on the last line)")
    parser.add_argument("--factor", type=float, default=0.5, help="duration factor c of the short run")
    parser.add_argument("--out", default="docs/images/inside-circuit", help="output path without extension")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    lm = contllm.load(args.model)
    result = head_shares(lm, args.text, args.word, args.factor)
    seconds = time.perf_counter() - started
    save_figure(figure(result), args.out, formats=("png",))
    arrays = ("z_patched", "bias_restored", "bias_gradient")
    summary = {k: v for k, v in result.items() if k not in arrays}
    summary |= {f"strongest_{k}": strongest(result[k]) for k in arrays}
    x, y = result["bias_gradient"].ravel(), result["bias_restored"].ravel()
    summary["gradient_restored_correlation"] = float(np.corrcoef(x, y)[0, 1])
    summary["bias_restored_sum"] = float(y.sum())
    summary["seconds"] = round(seconds)
    Path(f"{args.out}.json").write_text(
        json.dumps({**summary, **{k: np.round(result[k], 4).tolist() for k in arrays}}, indent=1) + "\n"
    )
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
