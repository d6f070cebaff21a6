"""Pages that are doctests: their ``pycon`` blocks run on SmolLM2, in order, and print what the page shows.

docs/python.md (the Python API, with an nnsight trace) and docs/from-transformerlens.md (a
TransformerLens notebook's habits, side by side).
"""

from __future__ import annotations

import doctest
import importlib.util
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

DOCS = Path(__file__).resolve().parents[2] / "docs"


def page_examples(text: str) -> str:
    """The page's ``pycon`` code blocks, one after another (the fences are markdown, not expected output)."""
    return "\n\n".join(re.findall(r"```pycon\n(.*?)```", text, flags=re.DOTALL))


@pytest.mark.parametrize(
    ("page", "at_least", "needs"),
    [("python.md", 30, "nnsight"), ("from-transformerlens.md", 40, None)],
    ids=["python", "from-transformerlens"],
)
def test_the_page_runs_and_prints_what_it_shows(page: str, at_least: int, needs: str | None) -> None:
    if needs is not None and importlib.util.find_spec(needs) is None:
        pytest.skip(f"the page needs {needs}")
    path = DOCS / page
    test = doctest.DocTestParser().get_doctest(page_examples(path.read_text()), {}, f"docs/{page}", str(path), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted >= at_least
    assert result.failed == 0, f"{result.failed} of the page's {result.attempted} examples print something else"
