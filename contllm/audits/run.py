"""``contllm audit MODEL``: the paper's results on one model, within a time budget, as one card.

An audit directory holds::

    audit.json     the audit's settings and its plan (item counts, the calibration that chose them)
    counting/      one run directory per experiment (contllm run's layout), written by the runner
    events/ ...
    card.json      the card (:class:`~contllm.audits.card.Card`)
    card.html      the card as one self-contained page

The plan is made once (:mod:`contllm.audits.budget`) and written before the first run; a
resumed audit reads it back, skips the runs that finished, resumes the others through
the runner (``resume=True``: their finished items are kept) and builds the card again,
so an interrupted audit ends with the card an uninterrupted one would have written.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from contllm.audits.budget import (
    CARD_S,
    DEFAULT_BUDGET,
    MARGIN,
    OUTPUT_S,
    DryEvaluator,
    Estimate,
    Plan,
    Probe,
    Share,
    allocate,
    budget_text,
    calibrate,
    least_budget,
    parse_budget,
)
from contllm.audits.studies import PROTOCOLS, STUDIES, Study, study
from contllm.errors import ExperimentError, RunDirectoryError
from contllm.rundir.files import atomic_write_json, atomic_write_text, read_json

AUDIT = "audit.json"
CARD_JSON = "card.json"
CARD_HTML = "card.html"
#: The files an audit writes at the top of its directory (besides one run directory per experiment).
OWN_FILES = (AUDIT, CARD_JSON, CARD_HTML)

Say = Callable[[str], None]


def default_out(model: str) -> Path:
    """runs/audit-<model>-<local time>: where an audit goes when no --out is given (beside the runs)."""
    from contllm.rundir.runs import default_out as run_out

    return run_out("audit", model)


def check_protocol(protocol: Any) -> str:
    if protocol not in PROTOCOLS:
        raise ExperimentError(f"--protocol must be {' or '.join(PROTOCOLS)}, got {protocol!r}")
    return str(protocol)


def check_counts(counts: Mapping[str, int] | None) -> dict[str, int] | None:
    """Counts given instead of a budget: experiment -> count (items, or paths per source for linearity)."""
    if counts is None:
        return None
    if not isinstance(counts, Mapping) or not counts:
        raise ExperimentError("counts must map audited experiments to counts, e.g. {'counting': 20}")
    out = {}
    for name, count in counts.items():
        study(name)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ExperimentError(f"the count of {name} must be an integer >= 1, got {count!r}")
        out[name] = count
    missing = [s.experiment for s in STUDIES if not s.optional and s.experiment not in out]
    if missing:
        raise ExperimentError(f"counts must give every experiment of the audit; missing: {', '.join(missing)}")
    return {s.experiment: out[s.experiment] for s in STUDIES if s.experiment in out}


def check_include(include: Any) -> list[str]:
    """Optional studies to run whatever the budget (``include``: names, or one comma-separated text), in the
    card's order; ExperimentError for a name that is no optional study."""
    names = include.split(",") if isinstance(include, str) else list(include or [])
    optional = [s.experiment for s in STUDIES if s.optional]
    for name in names:
        if name not in optional:
            study(name)  # an unknown name is refused with the audited ones
            raise ExperimentError(
                f"--include takes the studies that run where the budget allows ({', '.join(optional)}); "
                f"{name} always runs"
            )
    return [name for name in optional if name in names]


def read_audit(out: Path) -> dict[str, Any] | None:
    """The audit.json of ``out``, or None where there is none; RunDirectoryError for one that cannot be read or that
    does not hold to :data:`contllm.rundir.schemas.AUDIT` (naming the field)."""
    path = out / AUDIT
    if not path.is_file():
        return None
    from contllm.rundir import schemas

    data: dict[str, Any] = read_json(path, schema=schemas.AUDIT)  # settings, and a plan Plan.from_dict reads back
    return data


def check_out(out: Path, *, resume: bool, force: bool, locked: bool = False) -> dict[str, Any] | None:
    """Check the audit directory before anything loads; the audit.json to resume from (None: a new audit).

    Model-free and quick (the command line calls it before torch loads). Refused: a place
    where no directory can be made or written (a file, /proc, read-only), a directory that
    another process holds (its lock, :data:`contllm.rundir.locks.LOCK`), --resume where there is no
    audit to resume. A directory that holds files needs --resume (it must be an audit's) or
    --force (it must be an audit's, which is replaced run by run). ``locked``: this process
    holds the directory's lock (the checks are made again under it).
    """
    from contllm.rundir.locks import LOCK, lock_holder
    from contllm.rundir.runs import check_place, describe_folder

    if resume and force:
        raise RunDirectoryError("--resume and --force contradict each other; give one")
    check_place(out)
    holder = None if locked else lock_holder(out)
    if holder is not None:
        raise RunDirectoryError(
            f"{out} is being written by another contllm audit (pid {holder}); wait for it to finish or give another --out"
        )
    occupied = out.is_dir() and any(p.name != LOCK for p in out.iterdir())
    if not occupied:
        if resume:
            raise RunDirectoryError(f"cannot resume: {out} holds no audit (no {AUDIT}); start it without --resume")
        return None
    stored = read_audit(out)
    if stored is None:
        raise RunDirectoryError(
            f"{out} already holds files and is not an audit directory (no {AUDIT}){describe_folder(out)}; "
            "give another --out"
        )
    if not (resume or force):
        raise RunDirectoryError(f"{out} already holds an audit; use --resume to continue it or --force to replace it")
    return stored if resume else None


def check_resumed(
    stored: Mapping[str, Any],
    model: str,
    protocol: str,
    budget: float | None,
    dtype: str | None = None,
    seed: int = 0,
    include: Sequence[str] | None = None,
) -> None:
    """RunDirectoryError where a resumed audit is asked for another model, protocol, budget (None: the stored one),
    dtype (None: the stored one), seed or included studies (None: the stored ones) than it was started with."""
    given = (("model", model), ("protocol", protocol), ("dtype", dtype), ("seed", seed), ("include", include))
    changed = [
        f"{key} (was {stored.get(key, [] if key == 'include' else None)!r}, now {value!r})"
        for key, value in given
        if stored.get(key, [] if key == "include" else None) != value
        and not (key in ("dtype", "include") and value is None)
    ]
    was = stored.get("budget")
    if budget is not None and was != budget:
        changed.append(f"budget (was {budget_text(was) if was else 'counts'}, now {budget_text(budget)})")
    if changed:
        raise RunDirectoryError(
            f"cannot resume the audit: it differs in {'; '.join(changed)}; give the same, or --force"
        )


# ---------------------------------------------------------------------------- planning


def recorded_choice(out: Path) -> Mapping[str, Any] | None:
    """The dtype choice of ``--dtype auto`` that the audit in ``out`` recorded in its runs' manifests (None: no run
    has recorded one yet), so that a resumed audit loads the model in that dtype instead of timing it again."""
    from contllm.rundir.runner import recorded_dtype_choice

    return recorded_dtype_choice(out / s.experiment for s in STUDIES)


def study_config(s: Study, protocol: str, count: int) -> tuple[Any, Any, str | None]:
    """(the experiment, its config, the run's items setting) of ``count`` units of study ``s``."""
    from contllm import registry

    experiment = registry.get(s.experiment)
    config = experiment.config(s.options(protocol, count))
    ids = [item.id for item in experiment.items(config)]
    return experiment, config, s.items(ids, count)


def size(s: Study, protocol: str) -> int:
    """How many units the study's dataset holds (paths per source: the study's maximum)."""
    if s.per_source:
        return int(s.maximum or 1)
    _, _, items = study_config(s, protocol, 10**9)
    return int(str(items))


def dry_run(lm: Any, engine: Any, s: Study, protocol: str, count: int, group_bytes: int) -> tuple[Probe, list[Any]]:
    """What ``count`` units of ``s`` compute, without the model: their :class:`~contllm.audits.budget.Probe`, and the
    signals of the first evaluation they make (what the calibration forward times). An experiment that runs the
    model outside the run's evaluator (circuit: hooks and a backward) does that work here for real, and the
    probe's seconds hold it (its study declares small ``probes``)."""
    from contllm.data import select_items
    from contllm.rundir.runner import compute_records, context_for

    experiment, config, items = study_config(s, protocol, count)
    chosen = select_items(experiment.items(config), items)
    evaluate = DryEvaluator(lm, engine)
    started = time.perf_counter()
    compute_records(lm, experiment, config, chosen, context_for(lm, evaluate=evaluate, group_bytes=group_bytes))
    return Probe(count, evaluate.tokens, time.perf_counter() - started), evaluate.first


def make_plan(
    lm: Any,
    protocol: str,
    budget: float,
    started: float,
    say: Say,
    *,
    group_bytes: int | None = None,
    include: Sequence[str] = (),
) -> Plan:
    """Calibrate, estimate every study and share the budget (``started``: the audit's start, time.perf_counter());
    the optional studies named in ``include`` run as the others do."""
    from contllm.core.engine import Engine
    from contllm.settings import group_bytes_from_env

    group_bytes = group_bytes_from_env() if group_bytes is None else group_bytes
    engine = Engine(lm)
    estimates: dict[str, Estimate] = {}
    bounds = {}
    calibration_signals: list[Any] = []
    for s in STUDIES:
        bound = s.bounds(size(s, protocol))
        if s.experiment in include:
            bound = replace(bound, optional=False)
        bounds[s.experiment] = bound
        (small, first), (large, _) = (dry_run(lm, engine, s, protocol, n, group_bytes) for n in s.probe_counts(bound))
        estimates[s.experiment] = Estimate(s.experiment, (small, large))
        calibration_signals = calibration_signals or first  # the first study's first call: a counting sweep
    calibration = calibrate(lm, engine, calibration_signals)
    say(
        f"calibration: one forward of {calibration.signals} signals ({calibration.tokens} tokens) took "
        f"{calibration.seconds:.2f} s ({1000 * calibration.rate:.2f} ms per token)"
    )
    spent = time.perf_counter() - started
    reserved = CARD_S
    available = max(0.0, (budget - spent - reserved) * MARGIN)

    def seconds(name: str, count: int) -> float:
        return estimates[name].seconds(count, calibration.rate) + OUTPUT_S

    counts, left_out = allocate(available, bounds, seconds, least=lambda needed: least_budget(spent, reserved, needed))
    shares = [Share(name, count, round(seconds(name, count), 3)) for name, count in counts.items()]
    return Plan(budget, round(spent, 3), reserved, round(available, 3), shares, left_out, calibration)


def fixed_plan(counts: Mapping[str, int]) -> Plan:
    """A plan of given counts (no budget, no calibration)."""
    return Plan(None, 0.0, 0.0, 0.0, [Share(name, count, 0.0) for name, count in counts.items()])


# ---------------------------------------------------------------------------- running


def _finished(path: Path, resolved: Mapping[str, Any]) -> bool:
    """Whether ``path`` holds a finished run of exactly the ``resolved`` config (a resumed audit skips it)."""
    from contllm.rundir.runs import CONFIG, MANIFEST

    if not (path / CONFIG).is_file() or not (path / MANIFEST).is_file():
        return False
    try:
        manifest, config = read_json(path / MANIFEST), read_json(path / CONFIG)
    except RunDirectoryError:
        return False
    return isinstance(manifest, dict) and manifest.get("status") == "finished" and config == dict(resolved)


def run_studies(
    lm: Any,
    out: Path,
    plan: Plan,
    *,
    model: str,
    protocol: str,
    resume: bool,
    force: bool,
    seed: int,
    dtype: str | None,
    device: str,
    say: Say,
    progress: bool,
    on_finished: Callable[[str, float], None] | None = None,
) -> dict[str, float | None]:
    """Run every share of the plan into out/<experiment> through the runner; seconds per run (None: skipped, finished).

    on_finished(experiment, seconds): called as each run finishes (an audit records its times as it goes).
    """
    from contllm.rundir.runner import check_run, run

    seconds: dict[str, float | None] = {}
    every_run: dict[str, Any] = dict(lm=lm, resume=resume, force=force, device=device, say=say, progress=progress)
    for share in plan.shares:
        s = study(share.experiment)
        _, _, items = study_config(s, protocol, share.count)
        values: dict[str, Any] = dict(
            model=model, items=items, seed=seed, dtype=dtype, item_figures=False, formats=("png",)
        )
        path = out / s.experiment
        options = s.options(protocol, share.count)
        checked = check_run(s.experiment, options=options, **values)
        if resume and _finished(path, checked.resolved):
            say(f"{s.experiment}: finished already ({path})")
            seconds[s.experiment] = None
            continue
        started = time.perf_counter()
        run(s.experiment, out=path, options=options, **every_run, **values)
        seconds[s.experiment] = round(time.perf_counter() - started, 3)
        if on_finished is not None:
            on_finished(s.experiment, seconds[s.experiment] or 0.0)
    return seconds


def audit(
    lm: Any,
    *,
    budget: str | float | None = None,
    out: str | Path | None = None,
    protocol: str = "contllm",
    counts: Mapping[str, int] | None = None,
    include: Sequence[str] | str | None = None,
    resume: bool = False,
    force: bool = False,
    model: str | None = None,
    device: str = "auto",
    dtype: str | None = None,
    seed: int = 0,
    resamples: int = 1000,
    say: Say | None = None,
    progress: bool = False,
) -> Any:
    """Audit a model: the paper's results within a time budget, as a :class:`~contllm.audits.card.Card`::

        card = contllm.audit(contllm.load("smollm2-135m"), budget="3m", out="audits/smollm2")
        card.to_pandas()

    lm: a loaded :class:`~contllm.lm.ContinuousLM`, or a model name to load (then ``device``
    and ``dtype`` apply, and the load counts against the budget). budget: the whole audit's
    time ("10m", "90s", or seconds), its calibration, runs and card included (None:
    :data:`~contllm.audits.budget.DEFAULT_BUDGET`, or the budget a resumed audit was
    started with). counts: experiment -> count instead of a budget (items; linearity:
    paths per source; sums runs when named). include: the optional studies (sums, circuit)
    to run whatever the budget, at their smallest count at least. out: the audit directory (default
    runs/audit-<model>-<time>); resume: continue the audit there (its plan is kept); force:
    replace it. protocol: "contllm" or "paper" (the experiments' --protocol). model: the
    name the runs record (default: the model's own). resamples: bootstrap resamples per
    confidence interval. say: where news lines go (default: the ``contllm`` logger).

    Writes out/audit.json, one run directory per experiment, card.json and card.html, and
    returns the card. Raises a ContllmError subclass for bad input before anything is
    loaded or written (a budget too small for the smallest audit: once the machine is measured).
    """
    from contllm.logs import note

    started = time.perf_counter()
    say = say or note
    protocol = check_protocol(protocol)
    counts = check_counts(counts)
    if counts is not None and budget is not None:
        raise ExperimentError("give a budget or counts, not both")
    included = None if include is None else check_include(include)
    if counts is not None and included:
        raise ExperimentError("include applies to a budget; with counts, name the optional studies among them")
    seconds_budget = None if budget is None else parse_budget(budget)
    if isinstance(lm, str):
        model = model or lm
    name = model or str(getattr(getattr(lm, "info", None), "name", None) or "model")
    out = Path(out) if out is not None else default_out(name)
    check_out(out, resume=resume, force=force)
    _refuse_launch()
    from contllm.rundir.locks import Reservation

    with Reservation(out) as reservation:  # held until the card is written: a second audit here is refused at once
        from contllm.audits.card import build_card
        from contllm.audits.page import card_page

        stored = check_out(out, resume=resume, force=force, locked=True)
        if stored is not None:
            check_resumed(stored, name, protocol, seconds_budget, dtype, seed, included)
            dtype = stored.get("dtype")
        elif counts is None and seconds_budget is None:
            seconds_budget = parse_budget(DEFAULT_BUDGET)
        if isinstance(lm, str):
            from contllm.rundir.runner import load_for_run

            picked = recorded_choice(out) if stored is not None and str(dtype).lower() == "auto" else None
            lm = load_for_run(lm, device=device, dtype=dtype if picked is None else picked["dtype"], say=say)
            if picked is not None:  # the dtype --dtype auto picked when the audit started, not a second timing
                from contllm.rundir.runner import keep_choice

                say(f"dtype auto: resuming in {picked['dtype']}, as picked when the audit started")
                keep_choice(lm, picked)
        if stored is not None:
            plan = Plan.from_dict(stored["plan"])
            say(f"resuming the audit in {out}: {_counts_text(plan)}")
        else:
            if counts is not None:
                plan = fixed_plan(counts)
            else:
                assert seconds_budget is not None
                plan = make_plan(lm, protocol, seconds_budget, started, say, include=included or ())
            say(f"audit plan ({budget_text(plan.budget) if plan.budget else 'given counts'}): {_counts_text(plan)}")
            for left, why in plan.left_out.items():
                say(f"  {left}: {why}")
            settings = {
                "model": name,
                "protocol": protocol,
                "budget": plan.budget,
                "seed": seed,
                "dtype": dtype,
                "include": included or [],
            }
            reservation.keep()
            atomic_write_json(out / AUDIT, {**settings, "plan": plan.to_dict()})
        times = _Times(out, started, resumed=stored is not None)
        try:
            runs = run_studies(
                lm,
                out,
                plan,
                model=name,
                protocol=protocol,
                resume=times.resumed,
                force=force,
                seed=seed,
                dtype=dtype,
                device=device,
                say=say,
                progress=progress,
                on_finished=times.finished,
            )
        finally:  # an interrupted audit keeps the times of what it did, for the card of its resumed end
            times.save()
        card = build_card(
            out, plan, model=name, protocol=protocol, run_seconds=times.runs(runs), resamples=resamples, seed=seed
        )
        card.seconds.update(total=times.total(), resumed=times.resumed)
        atomic_write_json(out / CARD_JSON, card.to_dict())
        atomic_write_text(out / CARD_HTML, card_page(card, out))
        say(f"card: {out / CARD_HTML} ({card.seconds['total']:.0f} s)")
        return card


class _Times:
    """An audit's times across interruptions: kept in audit.json's "seconds" ({"runs": experiment -> seconds, "spent":
    seconds of the earlier sessions}), written as each run finishes and when the audit stops, so that a resumed
    audit's card keeps the times of the runs finished before the interruption and counts the whole time spent."""

    def __init__(self, out: Path, started: float, *, resumed: bool) -> None:
        self.out, self.started, self.resumed = out, started, resumed
        self.settings = read_audit(out) or {}
        held = self.settings.get("seconds")
        held = held if isinstance(held, dict) else {}
        runs = held.get("runs")
        self.earlier = {k: float(v) for k, v in (runs if isinstance(runs, dict) else {}).items() if _is_seconds(v)}
        self.spent = float(held["spent"]) if _is_seconds(held.get("spent")) else 0.0
        self.now: dict[str, float] = {}

    def finished(self, experiment: str, seconds: float) -> None:
        self.now[experiment] = seconds
        self.save()

    def save(self) -> None:
        runs = {**self.earlier, **self.now}
        atomic_write_json(self.out / AUDIT, {**self.settings, "seconds": {"runs": runs, "spent": self.total()}})

    def runs(self, ran: Mapping[str, float | None]) -> dict[str, float | None]:
        """Seconds per run: this session's, else an earlier session's (None: finished in an audit that kept no times)."""
        return {name: value if value is not None else self.earlier.get(name) for name, value in ran.items()}

    def total(self) -> float:
        return round(self.spent + time.perf_counter() - self.started, 3)


def _is_seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _counts_text(plan: Plan) -> str:
    return ", ".join(f"{s.experiment} {s.count}" for s in plan.shares)


def _refuse_launch() -> None:
    from contllm.rundir.distributed import launch_size

    if launch_size() > 1:
        raise ExperimentError("an audit runs in one process; start it without a launcher")


COMPARE_HTML = "compare.html"


def compare(cards: Sequence[str | Path], out: str | Path, *, force: bool = False) -> Path:
    """Set several cards side by side in out/compare.html, with the atlas of their numbers against model size; returns
    the page's path.

    cards: card.json files or audit directories (at least two, each once). out: created if
    needed; an existing compare.html there is replaced only with ``force``. The atlas
    (:mod:`contllm.audits.atlas`) draws one figure per number into out/atlas/, shown on the
    page (an existing figure of the same name is replaced only with ``force``, too).
    Everything is read and checked before anything is written; RunDirectoryError names
    what is wrong.
    """
    from collections import Counter

    from contllm.audits import atlas
    from contllm.audits.card import load_card
    from contllm.audits.page import compare_page

    if isinstance(cards, (str, Path)) or len(cards) < 2:
        raise RunDirectoryError("--compare takes two or more cards (card.json files or audit directories)")
    files = [Path(c) / CARD_JSON if Path(c).is_dir() else Path(c) for c in cards]
    seen: dict[Path, str] = {}
    for given, file in zip(cards, files):
        key = file.resolve()
        if key in seen:
            raise RunDirectoryError(f"{given} is given twice (also as {seen[key]}); give each card once")
        seen[key] = str(given)
    loaded = [load_card(c) for c in cards]
    models = Counter(card.model for card in loaded)
    pairs = Counter((card.model, card.protocol) for card in loaded)
    labels = [
        card.model
        if models[card.model] == 1
        else f"{card.model} ({card.protocol})"
        if pairs[(card.model, card.protocol)] == 1
        else f"{card.model} ({file.parent.name})"
        for card, file in zip(loaded, files)
    ]
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RunDirectoryError(f"--out {out} exists and is not a directory")
    target = out / COMPARE_HTML
    if target.exists() and not force:
        raise RunDirectoryError(f"{target} exists; use --force to replace it")
    folder = out / atlas.ATLAS
    if folder.exists() and not folder.is_dir():
        raise RunDirectoryError(f"{folder} exists and is not a directory; the atlas's figures go there")
    compared = [(label, card, file.parent) for label, card, file in zip(labels, loaded, files)]
    entries = atlas.entries(compared)
    drawn = [folder / f"{e.name}.png" for e in entries if e.plotted]
    held = next((path for path in drawn if path.exists()), None)
    if held is not None and not force:
        raise RunDirectoryError(f"{held} exists; use --force to replace it")
    out.mkdir(parents=True, exist_ok=True)
    page = compare_page(compared, out, atlas.write(entries, folder))
    return atomic_write_text(target, page)
