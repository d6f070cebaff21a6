"""contllm audit on SmolLM2: the card in a real headless Chromium, and an audit killed midway resumed to the same card."""

from __future__ import annotations

import io
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

import contllm
from contllm import ContinuousLM
from contllm.audits import Card, compare
from tests.integration.browser import chromium, missing
from tests.integration.test_kill_resume import environment

pytestmark = pytest.mark.integration

#: A small audit: every experiment, a few items each.
COUNTS = {"counting": 4, "events": 3, "boolean": 4, "interpolation": 4, "linearity": 1}
#: Fields that say when or how long, not what was found.
TIMES = {"created", "seconds"}


def without_times(value: object) -> object:
    if isinstance(value, dict):
        return {k: without_times(v) for k, v in value.items() if k not in TIMES}
    if isinstance(value, list):
        return [without_times(v) for v in value]
    return value


@pytest.fixture(scope="module")
def audited(smollm: ContinuousLM, tmp_path_factory: pytest.TempPathFactory) -> tuple[Card, Path]:
    out = tmp_path_factory.mktemp("audit") / "smollm2"
    return contllm.audit(smollm, counts=COUNTS, out=out, model="smollm2-135m", device="cpu"), out


def links(driver: object) -> list[str]:
    from selenium.webdriver.common.by import By

    return [a.get_attribute("href") for a in driver.find_elements(By.CSS_SELECTOR, "a[href]")]


@pytest.mark.skipif(missing() is not None, reason=str(missing()))
def test_the_card_and_the_comparison_open_in_chromium_without_console_messages(
    audited: tuple[Card, Path], tmp_path: Path
) -> None:
    from PIL import Image
    from selenium.webdriver.common.by import By

    card, out = audited
    other = tmp_path / "copy"
    shutil.copytree(out, other)  # a second audit, as a user would compare
    page = compare([out, other], tmp_path / "compared")
    numbers = sum(len(f.numbers) for f in card.findings)  # the atlas: one part per number,
    drawn = sum(n.value is not None for f in card.findings for n in f.numbers)  # a figure for each with a value
    with chromium() as driver:
        for html in (out / "card.html", page):
            driver.get(html.as_uri())
            assert driver.get_log("browser") == [], html
            fetched = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
            assert [url for url in fetched if not url.startswith(("file:", "data:"))] == [], html  # nothing from afar
            sources = driver.execute_script(
                "return [...document.querySelectorAll('[src],[href]')].map(e => e.getAttribute('src') || e.href)"
            )
            assert [url for url in sources if url.startswith(("http:", "https:", "//"))] == [], html
            images = driver.find_elements(By.TAG_NAME, "img")
            loaded = [i for i in images if driver.execute_script("return arguments[0].naturalWidth", i) > 0]
            expected = len(card.findings) if html.name == "card.html" else 2 * len(card.findings) + drawn
            assert len(loaded) == len(images) == expected, html
            for href in links(driver):
                if href.startswith("file:"):
                    target = Path(unquote(urlparse(href).path))
                    assert target.exists(), f"{html}: a link to {target}, which does not exist"
            shot = Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("RGB")
            colours = shot.getcolors(maxcolors=1 << 20)
            inked = sum(n for n, rgb in colours if sum(rgb) < 600) / (shot.width * shot.height)
            assert len(colours) > 20 and inked > 0.01, (html, len(colours), inked)
        driver.get(page.as_uri())
        atlas = driver.find_elements(By.CSS_SELECTOR, "#atlas .atlas-entry")
        assert len(atlas) == numbers and drawn == len(list((tmp_path / "compared" / "atlas").glob("*.png"))) > 0
        shown = 0
        for entry in atlas:  # each figure shown under its sentence, with the item counts of its points
            figures = entry.find_elements(By.CSS_SELECTOR, "img.atlas")
            if not figures:  # a number undefined on the card (n/a): said, not drawn
                assert "No figure" in entry.text and "left out of this figure" in entry.text, entry.text
                continue
            figure = figures[0]
            assert figure.is_displayed() and figure.size["width"] > 300, figure.size
            assert driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth", figure) > 0
            assert "One model size only: no trend with scale to read" in entry.text  # the same model, twice
            assert "n=" in entry.text and "Not resolved:" in entry.text, entry.text
            shown += 1
        assert shown == drawn
        assert driver.get_log("browser") == []
        driver.get((out / "card.html").as_uri())
        text = driver.find_element(By.TAG_NAME, "body").text
        for finding in card.findings:
            assert finding.sentence in text
        assert json.loads(driver.execute_script("return document.getElementById('card-data').textContent")) == (
            json.loads(json.dumps(card.to_dict()))
        )


AUDIT = [sys.executable, "-m", "contllm", "audit", "smollm2-135m", "--device", "cpu"]


def _start(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*AUDIT, "--out", str(out), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=environment())


def _stop_inside_the_second_run(proc: subprocess.Popen, out: Path, how: signal.Signals) -> None:
    """Send ``how`` once counting has finished and events has saved some of its items; wait for the process."""
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if (out / "counting" / "summary.json").exists() and any((out / "events" / "items").glob("*.json")):
            break
        if proc.poll() is not None:
            pytest.fail(f"the audit ended before it could be stopped: {proc.stderr.read().decode()[-1000:]}")
        time.sleep(0.02)
    proc.send_signal(how)
    _, err = proc.communicate(timeout=120)
    if how == signal.SIGINT:  # Ctrl-C: one line saying how to continue, status 130
        assert proc.returncode == 130, err.decode()[-2000:]
        assert f"contllm audit smollm2-135m --out {out} --resume" in err.decode() and b"Traceback" not in err
    assert not (out / "card.json").exists() and not (out / "events" / "summary.json").exists()


def _resume(out: Path) -> dict:
    done = subprocess.run([*AUDIT, "--out", str(out), "--resume"], capture_output=True, text=True,
                          env=environment(), timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(out / "card.html")
    return json.loads((out / "card.json").read_text())


def _plan_only(source: Path, target: Path) -> None:
    """A new audit directory holding ``source``'s audit.json without its times: the same plan, run from the start."""
    target.mkdir()
    settings = json.loads((source / "audit.json").read_text())
    settings.pop("seconds", None)
    (target / "audit.json").write_text(json.dumps(settings))


@pytest.mark.slow
def test_an_audit_stopped_midway_resumes_to_the_card_of_an_uninterrupted_one(tmp_path: Path) -> None:
    """SIGKILL (nothing runs after it) and SIGINT (Ctrl-C), each once counting has finished, then --resume: the card
    equals the one-pass audit of the same plan but for times, every results.csv is byte-equal, and the card keeps
    the time of the run finished before the stop."""
    killed, interrupted, whole = tmp_path / "killed", tmp_path / "interrupted", tmp_path / "whole"
    _stop_inside_the_second_run(_start(killed, "--budget", "2m"), killed, signal.SIGKILL)
    for out in (whole, interrupted):  # the same plan (audit.json), run from the start
        _plan_only(killed, out)
    _stop_inside_the_second_run(_start(interrupted, "--resume"), interrupted, signal.SIGINT)
    kept = {out: json.loads((out / "audit.json").read_text()).get("seconds", {}) for out in (killed, interrupted)}
    assert kept[interrupted]["runs"]["counting"] > 0  # written as counting finished; Ctrl-C saved the time spent
    assert kept[interrupted]["spent"] >= kept[interrupted]["runs"]["counting"]
    cards = {out: _resume(out) for out in (killed, interrupted, whole)}
    for out in (killed, interrupted):
        assert without_times(cards[out]) == without_times(cards[whole]), out.name
        for finding in cards[whole]["findings"]:
            table = Path(finding["run"]) / "results.csv"
            assert (out / table).read_bytes() == (whole / table).read_bytes(), f"{out.name}: {table}"
        runs = cards[out]["seconds"]["runs"]
        assert runs["counting"] is not None and runs["counting"] > 0  # finished before the stop: its time is kept
        assert all(value is not None for value in runs.values()), runs
        assert cards[out]["seconds"]["total"] >= sum(runs.values())  # both parts of the audit counted
        assert cards[out]["seconds"]["resumed"] is True
    assert cards[interrupted]["seconds"]["runs"]["counting"] == kept[interrupted]["runs"]["counting"]


@pytest.mark.slow
def test_two_audits_into_one_directory_leave_one_whole_audit(tmp_path: Path) -> None:
    """Started together: the second is refused in one line naming the holder, before its model loads and before it
    writes anything; the first's card and audit.json are whole, and it resumes (finding everything finished)."""
    out = tmp_path / "audit"
    procs = [_start(out, "--budget", "2m") for _ in range(2)]
    started = time.monotonic()
    outcomes = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=900)
        outcomes.append((proc.returncode, stdout.decode(), stderr.decode(), time.monotonic() - started))
    assert sorted(code for code, *_ in outcomes) == [0, 2], outcomes
    (_, stdout, _, _), (_, _, refused, _) = sorted(outcomes, key=lambda o: o[0])
    errors = [line for line in refused.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "another contllm" in errors[0] and "pid " in errors[0], refused
    assert "loaded" not in refused and "calibration" not in refused and "Traceback" not in refused
    assert stdout.strip() == str(out / "card.html")
    settings = json.loads((out / "audit.json").read_text())
    card = json.loads((out / "card.json").read_text())
    assert [s["experiment"] for s in settings["plan"]["shares"]] == [f["experiment"] for f in card["findings"]]
    again = _resume(out)
    assert without_times(again) == without_times(card)
    assert not (out / ".lock").exists()
