"""explorer.html of a real small counting run, in a real headless Chromium driven by selenium.

Skipped, with the reason, where selenium, Chromium or its driver is missing; CI installs
Debian's chromium and chromium-driver (.ci/run) and selenium (the test extra).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from contllm import ContinuousLM
from contllm.report import write_report
from contllm.runner import run
from tests.integration.browser import chromium, missing

pytestmark = pytest.mark.integration

if missing() is not None:
    pytest.skip(missing(), allow_module_level=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with chromium() as driver:
        yield driver


def shown(driver: object) -> dict[tuple[str, str], tuple[str, float]]:
    """(run index, label) -> (the value as displayed, the exact value behind the bar)."""
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, ".bar-row")
    return {
        (r.get_attribute("data-run"), r.get_attribute("data-label")): (
            r.find_element(By.CSS_SELECTOR, ".bar-value").text,
            float(r.get_attribute("data-p")),
        )
        for r in rows
    }


def test_the_slider_shows_results_json_and_the_page_draws(
    smollm: ContinuousLM, browser: object, tmp_path: Path
) -> None:
    from PIL import Image
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    out = run(
        "counting",
        options={"samples": 5},
        lm=smollm,
        model="smollm2-135m",
        items="2",
        out=tmp_path / "run",
        device="cpu",
        item_figures=False,
    )
    page = out / "explorer.html"
    assert page.is_file()
    sweeps = json.loads((out / "results.json").read_text())["sweeps"]
    browser.get(page.as_uri())
    Select(browser.find_element(By.ID, "item")).select_by_value(sweeps[1]["item_id"])
    record = sweeps[1]
    knob = browser.find_element(By.ID, "knob")
    knob.send_keys(Keys.HOME)  # the way a user drags to the start: factor x[0]
    for k in range(len(record["x"])):
        if k:
            knob.send_keys(Keys.ARROW_RIGHT)
        assert float(browser.find_element(By.ID, "knob-value").text) == record["x"][k]
        values = shown(browser)
        assert len(values) == len(record["labels"])
        for label, p in zip(record["labels"], record["probs"][k]):
            text, exact = values[("0", label)]
            assert exact == p and text == f"{p:.4f}"
        cursor = float(browser.find_element(By.ID, "cursor").get_attribute("x1"))
        assert cursor > 0
    edited = browser.find_elements(By.CSS_SELECTOR, ".tok.edited")
    assert len(edited) == len(record["meta"]["edited"])
    assert all(float(t.get_attribute("data-duration")) == record["x"][-1] for t in edited)
    image = Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    inked = sum(n for n, rgb in colours if sum(rgb) < 600) / (image.width * image.height)
    assert len(colours) > 20 and inked > 0.01, (len(colours), inked)

    second = run(
        "counting",
        options={"samples": 3},
        lm=smollm,
        model="smollm2-135m",
        items="1",
        out=tmp_path / "run2",
        device="cpu",
        item_figures=False,
    )
    write_report([out, second], tmp_path / "report")
    browser.get((tmp_path / "report" / "explorer.html").as_uri())
    assert {run for run, _ in shown(browser)} == {"0", "1"}  # the first item: both runs' bars, one curve each
    assert len(browser.find_elements(By.CSS_SELECTOR, "polyline.curve")) == 2
