"""Debian's headless Chromium driven by selenium: what the browser tests and scripts/card_screenshot.py share.

:func:`chromium` starts one (no network of its own, a throw-away profile) and quits it on
exit; :func:`missing` says why none can start here (None where one can).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

BROWSER = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
DRIVER = shutil.which("chromedriver")


def missing() -> str | None:
    """Why no headless Chromium can start here, or None."""
    try:
        import selenium.webdriver  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    if BROWSER is None or DRIVER is None:
        return "Chromium or chromedriver is missing (apt-get install chromium chromium-driver)"
    return None


@contextmanager
def chromium(width: int = 1300, height: int = 1000, *, hide_scrollbars: bool = False) -> Iterator[Any]:
    """A headless Chromium (a selenium driver) whose window is ``width`` x ``height``; quits on exit, errors included.

    The browser's console messages are kept (``driver.get_log("browser")``). hide_scrollbars:
    pictures without scroll bars (the docs' gallery). The one starter of the repository:
    the browser tests, scripts/card_screenshot.py and docs/gallery.py take it.
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = BROWSER
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    profile = tempfile.mkdtemp(prefix="contllm-chromium-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        *(["--hide-scrollbars"] if hide_scrollbars else []),
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
