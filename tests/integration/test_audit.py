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
from contllm.cards import Card, compare
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
    with chromium() as driver:
        for html in (out / "card.html", page):
            driver.get(html.as_uri())
            assert driver.get_log("browser") == [], html
            images = driver.find_elements(By.TAG_NAME, "img")
            loaded = [i for i in images if driver.execute_script("return arguments[0].naturalWidth", i) > 0]
            assert len(loaded) == len(images) == len(card.findings) * (1 if html.name == "card.html" else 2), html
            for href in links(driver):
                if href.startswith("file:"):
                    target = Path(unquote(urlparse(href).path))
                    assert target.exists(), f"{html}: a link to {target}, which does not exist"
            shot = Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("RGB")
            colours = shot.getcolors(maxcolors=1 << 20)
            inked = sum(n for n, rgb in colours if sum(rgb) < 600) / (shot.width * shot.height)
            assert len(colours) > 20 and inked > 0.01, (html, len(colours), inked)
        driver.get((out / "card.html").as_uri())
        text = driver.find_element(By.TAG_NAME, "body").text
        for finding in card.findings:
            assert finding.sentence in text
        assert json.loads(driver.execute_script("return document.getElementById('card-data').textContent")) == (
            json.loads(json.dumps(card.to_dict()))
        )


@pytest.mark.slow
def test_an_audit_killed_midway_resumes_to_the_card_of_an_uninterrupted_one(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "contllm", "audit", "smollm2-135m", "--budget", "2m", "--device", "cpu"]
    killed = tmp_path / "killed"
    proc = subprocess.Popen([*command, "--out", str(killed)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=environment())
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:  # kill it inside its second run, with some of that run's items saved
        if (killed / "counting" / "summary.json").exists() and any((killed / "events" / "items").glob("*.json")):
            break
        if proc.poll() is not None:
            pytest.fail(f"the audit ended before it could be killed: {proc.stderr.read().decode()[-1000:]}")
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "card.json").exists() and not (killed / "events" / "summary.json").exists()
    # The uninterrupted audit of the same plan: audit.json alone, resumed, runs every experiment from the start.
    whole = tmp_path / "whole"
    whole.mkdir()
    shutil.copy(killed / "audit.json", whole / "audit.json")
    for out in (killed, whole):
        done = subprocess.run([*command[:-4], "--out", str(out), "--resume"], capture_output=True, text=True,
                              env=environment(), timeout=1200)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == str(out / "card.html")
    ours, theirs = (json.loads((out / "card.json").read_text()) for out in (killed, whole))
    assert without_times(ours) == without_times(theirs)
    assert ours["seconds"]["runs"]["counting"] is None  # finished before the kill: read back, not run again
