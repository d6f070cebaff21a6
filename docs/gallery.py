"""The docs' gallery: every experiment's summary figure and the explorer pages, drawn from small SmolLM2 runs.

Three steps, each one command (run from the repository root, with the project installed)::

    python docs/gallery.py runs   --dir build/gallery/runs            # small runs of every experiment (CPU, minutes)
    python docs/gallery.py draw   --dir build/gallery/runs --to docs/images/gallery
    python docs/gallery.py shots  --dir build/gallery/runs --to docs/images/gallery

``runs`` makes one small run per registered experiment on SmolLM2-135M (:data:`RUNS`;
a run directory already finished is kept). ``draw`` saves each run's summary figure as
``<experiment>.png``; it reads the runs through ``contllm.load_run`` and
``contllm.experiments.figure`` only, so the same command under another checkout of the
code draws that checkout's figures of the same runs (how the before/after pairs of a
figure change are made). ``shots`` opens the ``explorer.html`` of :data:`EXPLORED` in
headless Chromium (the browser tests' starter, tests/integration/browser.py: selenium with
Debian's ``chromium`` and ``chromium-driver``) and saves a screenshot of each as
``explorer-<experiment>.png``. ``tests/integration/test_gallery.py``
runs the same functions on smaller runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script from the repository root: the browser starter lives in tests/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "smollm2-135m"

#: experiment -> (options, items) of its gallery run: small enough for a CPU, large enough to show the experiment.
RUNS: dict[str, tuple[dict[str, Any], str | None]] = {
    "counting": ({}, None),
    "events": ({}, "24"),
    "boolean": ({"operators": "AND,OR,XOR,NAND", "samples": "11"}, None),
    "depth": ({"eps": "1e-2", "alphas": "0,0.5,1,1.5"}, "1"),
    "pde": ({"times": "0,1,16", "prompts": "2"}, None),
    "equivalence": ({"per_category": "1", "samples": "6", "max_copies": "5"}, None),
    "attribution": ({"first": "3", "steps": "16"}, None),
    "interpolation": ({"samples": "11"}, "24"),
    "linearity": ({"per_source": "2", "samples": "11"}, None),
    "sums": ({"samples": "8"}, "8"),
    "tokens": ({"samples": "11"}, "4"),
    "scaling": ({"samples": "9"}, "4"),
    "translation": ({"samples": "9"}, "4"),
    "patching": ({"first": "2"}, None),
    "lens": ({"first": "3", "samples": "6"}, None),
    "attention-mass": ({"first": "3", "samples": "6"}, None),
    "counting-interpolation": ({"samples": "11"}, None),
    "circuit": ({"first": "2"}, None),
}

#: The experiments whose explorer page the docs show.
EXPLORED = ("counting", "events", "boolean", "interpolation")


def make_runs(
    directory: str | Path,
    runs: Mapping[str, tuple[dict[str, Any], str | None]] = RUNS,
    *,
    model: str = MODEL,
    lm: Any = None,
) -> dict[str, Path]:
    """One run directory per experiment of ``runs`` under ``directory`` (finished ones are kept); name -> path."""
    from contllm import load
    from contllm.rundir.report import load_run
    from contllm.rundir.runner import run

    out: dict[str, Path] = {}
    for name, (options, items) in runs.items():
        path = Path(directory) / name
        try:
            load_run(path)
        except Exception:
            lm = lm if lm is not None else load(model, device="cpu")
            run(
                name,
                options=dict(options),
                lm=lm,
                model=model,
                items=items,
                out=path,
                force=True,
                device="cpu",
                item_figures=False,
            )
        out[name] = path
    return out


def draw(run_dirs: Mapping[str, Path], to: str | Path) -> list[Path]:
    """Each run's summary figure (its experiment's first figure) as ``<to>/<experiment>.png`` (100 dpi); the paths
    written."""
    from contllm import load_run, registry
    from contllm.plotting import plt

    target = Path(to)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, path in run_dirs.items():
        run = load_run(path)
        _, fig = next(iter(registry.get(run.experiment).figures(run.result, per_item=False)))
        fig.savefig(target / f"{name}.png", dpi=100)
        plt.close(fig)
        written.append(target / f"{name}.png")
    return written


def no_browser() -> str | None:
    """None when a headless Chromium can start here, else why not."""
    from tests.integration.browser import missing

    return missing()


@contextmanager
def browser(width: int = 1300, height: int = 1000) -> Iterator[Any]:
    """The headless Chromium of the browser tests (tests/integration/browser.py), without scroll bars."""
    from tests.integration import browser as starter

    why = starter.missing()
    if why is not None:
        raise RuntimeError(why)
    with starter.chromium(width, height, hide_scrollbars=True) as driver:
        yield driver


def screenshot(driver: Any, page: Path, target: Path, *, item: str | None = None, at: float | None = None) -> Path:
    """A screenshot of the whole explorer ``page``: the item ``item`` chosen, the slider at the value nearest ``at``
    (None: where the page starts)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    driver.get(page.resolve().as_uri())
    if item is not None:
        Select(driver.find_element(By.ID, "item")).select_by_value(item)
    if at is not None:
        driver.execute_script(
            "const knob = document.getElementById('knob');"
            "const x = JSON.parse(document.getElementById('explorer-data').textContent).runs[0].items"
            ".find((it) => it.id === document.getElementById('item').value).x;"
            "let best = 0; x.forEach((v, i) => { if (Math.abs(v - arguments[0]) < Math.abs(x[best] - arguments[0])) best = i; });"
            "knob.value = String(best); knob.dispatchEvent(new Event('input'));",
            at,
        )
    # The whole page in one picture: the viewport made as tall as the page (a window is capped by the screen).
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    metrics = {"width": 1300, "height": max(600, height + 20), "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    target.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(target))
    return target


#: experiment -> (the item to show, where the slider stands; None: the page's first item, its own start).
SHOWN: dict[str, tuple[str | None, float | None]] = {
    "counting": ("count-004", 0.4),
    "events": (None, 0.4),
    "boolean": ("AND-OR-01", 1.0),
    "interpolation": (None, 1.0),
}


def explorer_page(run_dir: Path, target: Path) -> Path:
    """The explorer page of a finished run, drawn by this checkout's code (not the one the run wrote) at ``target``."""
    from contllm import load_run
    from contllm.rundir.explorer import explorer_data, page

    run = load_run(run_dir)
    data = explorer_data([(run.model, run.result)])
    if data is None:
        raise ValueError(f"{run_dir}: a {run.experiment} run has no explorer page")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page(data), encoding="utf-8")
    return target


def shots(run_dirs: Mapping[str, Path], to: str | Path, names: Sequence[str] = EXPLORED) -> list[Path]:
    """``<to>/explorer-<experiment>.png`` for each experiment of ``names`` among ``run_dirs``; the paths written."""
    written = []
    with tempfile.TemporaryDirectory(prefix="contllm-gallery-") as pages, browser() as driver:
        for name in names:
            if name not in run_dirs:
                continue
            item, at = SHOWN.get(name, (None, None))
            html = explorer_page(run_dirs[name], Path(pages) / f"{name}.html")
            written.append(screenshot(driver, html, Path(to) / f"explorer-{name}.png", item=item, at=at))
    return written


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=("runs", "draw", "shots"))
    parser.add_argument("--dir", type=Path, default=Path("build/gallery/runs"), help="the runs' directory")
    parser.add_argument("--to", type=Path, default=Path("docs/images/gallery"), help="where images go")
    parser.add_argument("--only", default="", help="comma-separated experiments (default: all)")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(RUNS)
    if args.step == "runs":
        for name, path in make_runs(args.dir, {n: RUNS[n] for n in names}).items():
            print(name, path)
        return
    found = {n: args.dir / n for n in names if (args.dir / n / "results.json").is_file()}
    done = draw(found, args.to) if args.step == "draw" else shots(found, args.to, [n for n in EXPLORED if n in names])
    for path in done:
        print(path)


if __name__ == "__main__":
    main()
