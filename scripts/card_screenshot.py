"""Open an audit's card.html in headless Chromium, check its console, and save a screenshot (docs/images/card.png).

Run from the repository root, after an audit (the page is the one a user opens)::

    contllm audit smollm2-135m --budget 3m --out audits/smollm2
    python -m scripts.card_screenshot audits/smollm2 docs/images/card.png

Exits with status 1 and lists the messages when the page logs anything at level WARNING
or above in the browser's console. Uses the browser helper of the integration tests
(Debian's chromium and chromium-driver, and selenium).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.integration.browser import chromium, missing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("audit", type=Path, help="the audit directory (holding card.html), or a page")
    parser.add_argument("png", type=Path, help="where to save the screenshot")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1100)
    args = parser.parse_args()
    page = args.audit / "card.html" if args.audit.is_dir() else args.audit
    if not page.is_file():
        parser.error(f"{page} does not exist")
    why = missing()
    if why is not None:
        parser.error(why)
    with chromium(args.width, args.height) as driver:
        driver.get(page.resolve().as_uri())
        problems = [m for m in driver.get_log("browser") if m.get("level") in ("WARNING", "SEVERE")]
        args.png.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(args.png))
    for message in problems:
        print(f"console {message['level']}: {message['message']}", file=sys.stderr)
    print(args.png)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
