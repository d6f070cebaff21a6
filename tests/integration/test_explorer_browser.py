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
from contllm.rundir.report import write_report
from contllm.rundir.runner import run
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
    check_durations_drawn(browser)
    # what the page is, the true count green, E[k] under the curves beside n x c, the true count dashed
    from contllm.experiments.counting import EXPERIMENT

    assert browser.find_element(By.ID, "about").text.startswith(EXPERIMENT.explorer_text[:60])
    assert [r.get_attribute("data-label") for r in browser.find_elements(By.CSS_SELECTOR, ".bar-row.truth")] == [
        record["truth"]
    ]
    expected = browser.find_element(By.CSS_SELECTOR, "#expected polyline.expected-line")
    assert len(expected.get_attribute("points").split()) == len(record["x"])
    assert browser.find_elements(By.CSS_SELECTOR, "#expected polyline.proportional-line")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#expected line.truth-line")) == 1
    assert "E[k]" in browser.find_element(By.ID, "expected-title").text
    knob.send_keys(Keys.HOME)  # the shortest words: their boxes the narrowest
    check_durations_drawn(browser)
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


def check_durations_drawn(driver: object) -> None:
    """Every token box of the strip is as wide as its duration (the strip's unit per step), to half a pixel."""
    from selenium.webdriver.common.by import By

    unit = float(driver.find_element(By.ID, "strip").get_attribute("data-unit"))
    widths = driver.execute_script(
        "return [...document.querySelectorAll('#strip .tok')].map((t) => [t.getBoundingClientRect().width,"
        " Number(t.dataset.duration)])"
    )
    assert widths
    for width, duration in widths:
        assert abs(width - duration * unit) <= 0.5, (width, duration, unit)


def test_a_boolean_page_shows_each_ends_prompt_and_truth(smollm: ContinuousLM, browser: object, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    out = run(
        "boolean",
        options={"samples": 5, "operators": "AND,OR"},
        lm=smollm,
        model="smollm2-135m",
        items="AND-OR-01",
        out=tmp_path / "run",
        device="cpu",
        item_figures=False,
    )
    record = json.loads((out / "results.json").read_text())["sweeps"][0]
    browser.get((out / "explorer.html").as_uri())
    knob = browser.find_element(By.ID, "knob")
    knob.send_keys(Keys.HOME)

    def truth_rows() -> list[str]:
        return [r.get_attribute("data-label") for r in browser.find_elements(By.CSS_SELECTOR, ".bar-row.truth")]

    prompt = browser.find_element(By.ID, "prompt")
    assert prompt.get_attribute("data-end") == "first" and prompt.text.strip() == record["meta"]["prompt"].strip()
    assert [m.text for m in prompt.find_elements(By.TAG_NAME, "mark")] == ["AND"]
    assert truth_rows() == ["0"]  # 0 AND 1
    knob.send_keys(Keys.ARROW_RIGHT)
    assert truth_rows() == []  # a blend of two operators has no truth value
    knob.send_keys(Keys.END)
    prompt = browser.find_element(By.ID, "prompt")
    assert prompt.get_attribute("data-end") == "second"
    assert prompt.text.strip() == record["meta"]["prompt_second"].strip()
    assert [m.text for m in prompt.find_elements(By.TAG_NAME, "mark")] == ["OR"]
    assert truth_rows() == ["1"]  # 0 OR 1
    assert "the second prompt" in browser.find_element(By.ID, "strip-note").text
    rings = browser.find_elements(By.CSS_SELECTOR, "#expected circle.truth-ring")
    assert len(rings) == 2  # the correct answer ringed at both ends
    assert browser.find_element(By.ID, "expected-title").text.endswith("P(1) / (P(0) + P(1))")
    check_durations_drawn(browser)


def test_hostile_strings_in_every_field_are_text_in_the_browser(browser: object, tmp_path: Path) -> None:
    """A run page and a report page whose ids, prompt, labels and model names try to break out of the page."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    from typer.testing import CliRunner

    from contllm.cli.commands import app
    from contllm.experiments.counting import CountingConfig
    from tests.unit.test_hostile_data import HOSTILE, counting_rows
    from tests.unit.test_sums import digit_tokenizer
    from tests.unit.tiny import tiny_model

    lm = ContinuousLM(tiny_model("llama"), digit_tokenizer())
    hostile = "".join(HOSTILE)
    data = counting_rows(tmp_path / "t.jsonl", [f"a{h}" for h in HOSTILE], word=f"w{hostile}")
    out = run("counting", options={"data": str(data), "samples": "2"}, lm=lm, model=f"m{hostile}", out=tmp_path / "o",
              item_figures=False)
    browser.get((out / "explorer.html").as_uri())
    assert browser.execute_script("return window.pwned === undefined && document.images.length === 0")
    options = [o.get_attribute("value") for o in Select(browser.find_element(By.ID, "item")).options]
    assert options == [f"a{h}" for h in HOSTILE]
    Select(browser.find_element(By.ID, "item")).select_by_value(f"a{HOSTILE[1]}")
    assert f"w{hostile}" in browser.find_element(By.ID, "prompt").get_attribute("textContent")
    assert len(browser.find_elements(By.CSS_SELECTOR, ".bar-row")) == 10  # the script ran and drew the digits

    # the report page: labels and the run's name (its model) from an edited run
    results = json.loads((out / "results.json").read_text())
    for sweep in results["sweeps"]:
        sweep["labels"] = [label if k % 2 == 0 else f"{label}{hostile}" for k, label in enumerate(sweep["labels"])]
    (out / "results.json").write_text(json.dumps(results))
    # one item of the same file: a report compares runs on the items they share
    second = run("counting", config=CountingConfig(data=str(data), samples=2, low=0.5, high=1.0), lm=lm,
                 model=f"n{hostile}", items="1", out=tmp_path / "o2", item_figures=False)
    assert CliRunner().invoke(app, ["report", str(out), str(second), "--out", str(tmp_path / "r")]).exit_code == 0
    browser.get((tmp_path / "r" / "explorer.html").as_uri())
    assert browser.execute_script("return window.pwned === undefined && document.images.length === 0")
    labels = {label for _, label in shown(browser)}
    assert f"1{hostile}" in labels and "0" in labels
    names = [e.get_attribute("textContent") for e in browser.find_elements(By.CSS_SELECTOR, ".run-name")]
    assert names and names[0].startswith(f"m{hostile} (")
