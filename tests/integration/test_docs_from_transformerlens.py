"""docs/from-transformerlens.md is a doctest: its ``pycon`` blocks run on SmolLM2, in order, and print what the page shows."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PAGE = Path(__file__).resolve().parents[2] / "docs" / "from-transformerlens.md"


def page_examples(text: str) -> str:
    """The page's ``pycon`` code blocks, one after another (the fences are markdown, not expected output)."""
    return "\n\n".join(re.findall(r"```pycon\n(.*?)```", text, flags=re.DOTALL))


def test_the_transformer_lens_page_runs_and_prints_what_it_shows() -> None:
    examples = page_examples(PAGE.read_text())
    test = doctest.DocTestParser().get_doctest(examples, {}, "docs/from-transformerlens.md", str(PAGE), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted >= 40
    assert result.failed == 0, f"{result.failed} of the page's {result.attempted} examples print something else"
