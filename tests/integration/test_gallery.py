"""The docs' pictures, drawn as docs/gallery.py draws them, on small SmolLM2 runs.

Every registered experiment's summary figure reads without the paper (tests/unit/readable.py:
a finding first, legends off the data, one y-axis a panel), and the explorer pages of
counting, events, boolean and interpolation are screenshotted in headless Chromium and the
pictures hold what the page shows. Skipped, with the reason, without selenium or Chromium.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from contllm import ContinuousLM, registry
from tests.unit.readable import check_readable
from tests.unit.scripts import ROOT, load_script

pytestmark = pytest.mark.integration

gallery = load_script(ROOT / "docs" / "gallery.py", "contllm_docs_gallery")

#: The smallest run of each experiment that still has something to show: (options, items).
SMALL: dict[str, tuple[dict[str, Any], str | None]] = {
    "counting": ({"samples": "4"}, "count-001,count-002,count-003,count-004"),
    "events": ({"samples": "3"}, "2"),
    "boolean": ({"operators": "AND,OR", "samples": "3"}, None),
    "depth": ({"eps": "1e-2", "alphas": "0,1"}, "1"),
    "pde": ({"times": "0,1", "prompts": "1"}, None),
    "equivalence": ({"per_category": "1", "samples": "3", "max_copies": "3"}, "2"),
    "attribution": ({"first": "1", "steps": "8"}, None),
    "interpolation": ({"samples": "3"}, "4"),
    "linearity": ({"per_source": "1", "samples": "3"}, None),
    "sums": ({"samples": "3"}, "2"),
    "tokens": ({"samples": "3"}, "2"),
    "scaling": ({"samples": "3"}, "2"),
    "translation": ({"samples": "3"}, "2"),
    "patching": ({"first": "1"}, None),
    "lens": ({"first": "1", "samples": "3"}, None),
    "attention-mass": ({"first": "1", "samples": "3"}, None),
    "counting-interpolation": ({"samples": "3"}, "2"),
    "circuit": ({"first": "1", "top": "2"}, None),
}


def test_every_registered_experiment_has_a_small_run_here() -> None:
    assert set(SMALL) == set(registry.names()) == set(gallery.RUNS)


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gallery")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SMALL))
def test_every_summary_figure_reads_without_the_paper(
    smollm: ContinuousLM, runs_dir: Path, name: str, tmp_path: Path
) -> None:
    from contllm import load_run
    from contllm.experiments import figure
    from contllm.plotting import plt

    runs = gallery.make_runs(runs_dir, {name: SMALL[name]}, lm=smollm)
    fig = figure(load_run(runs[name]).result)
    try:
        sentence = check_readable(fig)
        assert sentence.rstrip()[-1] not in ",;"
    finally:
        plt.close(fig)
    (path,) = gallery.draw({name: runs[name]}, tmp_path)
    assert path.stat().st_size > 20_000


def test_the_explorer_pictures_of_the_docs(smollm: ContinuousLM, tmp_path: Path) -> None:
    if gallery.no_browser() is not None:
        pytest.skip("Chromium or chromedriver is missing (apt-get install chromium chromium-driver)")
    pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
    from PIL import Image

    small = {name: SMALL[name] for name in gallery.EXPLORED}
    small["counting"] = ({"samples": "4"}, gallery.SHOWN["counting"][0])
    small["boolean"] = ({"operators": "AND,OR", "samples": "3"}, gallery.SHOWN["boolean"][0])
    made = gallery.make_runs(tmp_path / "runs", small, lm=smollm)
    pictures = gallery.shots(made, tmp_path / "shots")
    assert [p.name for p in pictures] == [f"explorer-{name}.png" for name in gallery.EXPLORED]
    for path in pictures:
        image = Image.open(io.BytesIO(path.read_bytes())).convert("RGB")
        assert image.width == 1300 and image.height > 900  # the whole page, strip and all
        colours = image.getcolors(maxcolors=1 << 20)
        inked = sum(n for n, rgb in colours if sum(rgb) < 600) / (image.width * image.height)
        assert len(colours) > 20 and inked > 0.01, (path.name, len(colours), inked)
        # the highlighted tokens of the strip (#ffd27a) are in the picture
        assert any(rgb == (255, 210, 122) for _, rgb in colours), path.name
