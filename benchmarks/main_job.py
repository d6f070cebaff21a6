"""Main-job benchmark: the default counting run of the default model, end to end, against its evaluation.

Usage:
    OMP_WAIT_POLICY=PASSIVE python benchmarks/main_job.py [--model smollm2-135m]

It runs ``contllm run counting`` in this process, through :func:`contllm.runner.run`
with the command line's defaults (every item, the experiment's default options, the
model loaded by the runner from the converted cache, a fresh run directory), and prints

  end to end   the wall time of that call: loading the model, opening the run directory,
               evaluating every item, writing the records, results, tables, summary,
               figures and explorer page;
  evaluation   the wall time of the item loop as the run itself recorded it
               (manifest.json's ``seconds.evaluation``), with the model load and the
               outputs beside it (``seconds.load``, ``seconds.outputs``);
  overhead     end to end / evaluation (``overhead: N.NNx``; the target is <= 1.30x);
  FLOP efficiency of the evaluation: useful FLOPs of every engine call of the run
               (counted as in sweep.py) / evaluation wall / the dense float32 matmul rate
               measured after the run in the same process (as runs.py does).

The interpreter's start and the imports of torch and transformers are not counted: any
command pays them, and they are printed apart. ``--formats`` and ``--item-figures``
pass through to the run (``--item-figures --formats png,pdf`` writes what a run wrote by
default before figures left the critical path). The load average is printed before and
after, since other processes only ever add time.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

started = time.perf_counter()

import torch  # noqa: E402
import transformers  # noqa: E402,F401
from sweep import engine_flops, matmul_rate  # noqa: E402

from contllm.engine import Engine, EngineStats  # noqa: E402
from contllm.hardware import describe  # noqa: E402
from contllm.models import DEFAULT_MODEL  # noqa: E402
from contllm.runner import run  # noqa: E402

IMPORTS = time.perf_counter() - started
#: What the issue asks of the main job: end to end at most this multiple of its evaluation.
TARGET = 1.30


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Recorder:
    """Every engine call of the run: the engine (its model) and what each call computed."""

    def __init__(self) -> None:
        self.stats: list[EngineStats] = []
        self.lm: Any = None

    def __enter__(self) -> Recorder:
        original = self.original = Engine.probs

        def probs(engine: Engine, *args: Any, **kwargs: Any) -> Any:
            out = original(engine, *args, **kwargs)
            self.lm = engine.lm
            if engine.last_stats is not None:
                self.stats.append(engine.last_stats)
            return out

        Engine.probs = probs  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        Engine.probs = self.original  # type: ignore[method-assign]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"model to run (default: {DEFAULT_MODEL}, the default model)")
    parser.add_argument("--experiment", default="counting", help="experiment to run (default: counting)")
    parser.add_argument("--formats", default=None, help="figure formats of the run (default: the run's own)")
    parser.add_argument("--item-figures", dest="item_figures", action="store_true", default=None,
                        help="draw every item's figure during the run")
    parser.add_argument("--no-item-figures", dest="item_figures", action="store_false")
    parser.add_argument("--out", default=None, help="keep the run directory here (default: a temporary one)")
    args = parser.parse_args(argv)

    settings: dict[str, Any] = {"model": args.model}
    if args.formats is not None:
        settings["formats"] = args.formats
    if args.item_figures is not None:
        settings["item_figures"] = args.item_figures
    print(describe())
    print(f"load average before: {load_average()} on {os.cpu_count()} cores; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    print(f"imports (torch, transformers, contllm; not counted): {IMPORTS:.1f} s")

    with tempfile.TemporaryDirectory() as root, Recorder() as recorder:
        out = Path(args.out) if args.out else Path(root) / "run"
        start = time.perf_counter()
        run(args.experiment, out=out, device="cpu", progress=False, say=lambda line: None, **settings)
        wall = time.perf_counter() - start
        manifest = json.loads((out / "manifest.json").read_text())
        figures = sorted(p for p in manifest.get("outputs", []) if p.startswith("figures/"))
    seconds = manifest["seconds"]
    evaluation = seconds["evaluation"]
    other = wall - sum(v for v in seconds.values() if v is not None)

    lm = recorder.lm
    config = lm.model.config.get_text_config()
    rate = matmul_rate(4096, int(config.hidden_size), int(config.intermediate_size))
    flops = sum(engine_flops(lm, s) for s in recorder.stats)
    tokens = sum(s.tokens_computed for s in recorder.stats)
    forwards = sum(len(s.chunks) for s in recorder.stats)

    print(f"model {args.model} ({manifest['dtype']}, {manifest['device']}), {args.experiment}, "
          f"{manifest['items']} items, default options; figure files written: {len(figures)}")
    print(f"end to end {wall:.1f} s: model load {seconds['load']:.1f} s, evaluation {evaluation:.1f} s, "
          f"outputs {seconds['outputs']:.1f} s, the rest {other:.1f} s")
    print(f"evaluation: {tokens} tokens in {forwards} forwards, {flops / 1e12:.2f} TFLOP useful, "
          f"{flops / evaluation / 1e9:.0f} GFLOP/s; dense float32 matmul rate {rate / 1e9:.0f} GFLOP/s; "
          f"FLOP efficiency {flops / evaluation / rate:.2f}")
    overhead = wall / evaluation
    print(f"overhead: {overhead:.2f}x ({'within' if overhead <= TARGET else 'above'} the {TARGET:.2f}x target)")
    print(f"load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    torch.manual_seed(0)
    raise SystemExit(main())
