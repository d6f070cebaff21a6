"""``contllm audit MODEL`` and ``contllm audit --compare CARD...`` (registered in :data:`contllm.cli.commands.COMMANDS`).

Everything the command line alone decides (the budget, the protocol, the options that go
together, the audit directory and, for a resumed audit, its settings) is checked before
torch is imported, so a usage error answers at once with one line and exit status 2.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import typer

from contllm import logs
from contllm.cli.errors import fail, guarded
from contllm.settings import AUTO_DTYPE_HELP, DTYPE_METAVAR


def audit(
    targets: list[str] | None = typer.Argument(
        None,
        metavar="MODEL | CARD...",
        help="The model to audit (embedded alias, Hugging Face id or local directory); with --compare, "
        "the cards to set side by side (card.json files or audit directories).",
    ),
    budget: str | None = typer.Option(
        None,
        "--budget",
        metavar="TIME",
        help="The whole audit's time, the model's load included: 90s, 10m, 1h30m. "
        "[default: 10m; a resumed audit keeps its own]",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        metavar="DIR",
        help="The audit directory; with --compare, the directory of compare.html. [default: runs/audit-<model>-<time>]",
    ),
    protocol: str = typer.Option(
        "contllm",
        "--protocol",
        metavar="[contllm|paper]",
        help="The experiments' protocol: contllm (their own prompts and read-outs) or paper (the paper's; "
        "see docs/paper.md).",
    ),
    device: str = typer.Option(
        "auto", "--device", metavar="DEVICE", help="auto (CUDA when available), cpu, cuda:1, ..."
    ),
    dtype: str | None = typer.Option(
        None,
        "--dtype",
        metavar=DTYPE_METAVAR,
        help=f"Precision of the model; {AUTO_DTYPE_HELP} (the card states the choice and why). [default: float32]",
    ),
    include: str | None = typer.Option(
        None,
        "--include",
        metavar="STUDIES",
        help="Studies that run only where the budget allows (sums, circuit; comma-separated) made to run: "
        "each gets its smallest count at least, and the others share what is left. [default: none]",
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue the audit in --out (its plan is kept)."),
    force: bool = typer.Option(False, "--force", help="Replace the audit in --out."),
    compare: bool = typer.Option(
        False, "--compare", help="Set the given cards side by side in one page, compare.html in --out."
    ),
) -> None:
    """How continuous is a model? The paper's results on it within a time budget, as one card.

    Runs counting, events, boolean, interpolation and linearity (and sums and circuit where
    the budget allows, or --include) at item counts chosen to fit --budget on this machine: a short timed calibration
    forward, stated on the card, sets them. Each experiment is a run directory under --out
    (contllm run's layout, resumable); beside them card.json and card.html, one self-contained
    page: per result what was found, the headline number with a 95% bootstrap interval over
    items, the paper's metrics, the summary figure, a link to the run's explorer and the
    numbers of the embedded reference models. Interrupted, it continues with --resume.

    \b
      contllm audit smollm2-135m --budget 3m --out audits/smollm2
      contllm audit qwen2.5-coder-0.5b --protocol paper
      contllm audit --compare audits/smollm2 audits/qwen --out audits/compared
    """
    given = list(targets or [])
    if compare:
        _compare(
            given,
            out,
            force,
            budget=budget,
            protocol=protocol,
            device=device,
            dtype=dtype,
            resume=resume,
            include=include,
        )
        return
    if len(given) != 1:
        fail(
            "give one model to audit (or --compare with two or more cards); see 'contllm audit --help'",
            exit_with=typer.Exit,
        )
    model = given[0]
    if out is None:
        from contllm.audits.run import default_out

        out = default_out(model)
    hint = f"contllm audit {model} --out {out} --resume"
    guarded(lambda: _check(model, budget, out, protocol, resume, force, dtype), typer.Exit, hint)

    def start() -> Any:
        from contllm.audits.run import audit as run_audit

        return run_audit(
            model,
            budget=budget,
            out=out,
            protocol=protocol,
            include=include,
            resume=resume,
            force=force,
            device=device,
            dtype=dtype,
            progress=logs.LOGGER.isEnabledFor(logging.INFO),
        )

    guarded(start, typer.Exit, hint)
    typer.echo(str(out / "card.html"))


def _check(
    model: str, budget: str | None, out: Path, protocol: str, resume: bool, force: bool, dtype: str | None
) -> None:
    """Every check of an audit that needs neither torch nor the model (the audit repeats them, at no cost)."""
    from contllm.audits.budget import parse_budget
    from contllm.audits.run import check_out, check_protocol, check_resumed
    from contllm.cli.index import check_cache
    from contllm.errors import ExperimentError
    from contllm.settings import is_dtype_setting

    seconds = None if budget is None else parse_budget(budget)
    check_protocol(protocol)
    if dtype is not None and not is_dtype_setting(dtype):
        raise ExperimentError(
            f"--dtype must be float32, bfloat16, float16 or auto (or fp32, bf16, fp16), got {dtype!r}"
        )
    check_cache(model)
    stored = check_out(out, resume=resume, force=force)
    if stored is not None:
        check_resumed(stored, model, protocol, seconds, dtype)


def _compare(cards: list[str], out: Path | None, force: bool, **others: Any) -> None:
    """``contllm audit --compare CARD... --out DIR``: the comparison page."""
    defaults = {
        "budget": None,
        "protocol": "contllm",
        "device": "auto",
        "dtype": None,
        "resume": False,
        "include": None,
    }
    unused = [f"--{name}" for name, value in others.items() if value != defaults[name]]
    if unused:
        fail(f"{', '.join(unused)} do not apply to --compare, which reads finished cards", exit_with=typer.Exit)
    if out is None:
        fail("--compare needs --out, the directory for compare.html", exit_with=typer.Exit)
    from contllm.audits.run import compare as write_compare

    path = guarded(lambda: write_compare(cards, out, force=force), typer.Exit)
    typer.echo(str(path))
