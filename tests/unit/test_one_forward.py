"""One forward: only contllm.core.forward builds the continuous mask and calls the stock model on continuous inputs."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "contllm"

#: The module that builds the stock model's continuous inputs and calls it.
FORWARD = PACKAGE / "core" / "forward.py"
#: Where model_masks is defined.
MASKS = PACKAGE / "core" / "attention.py"
#: Keywords of a stock forward that carry a continuous input.
CONTINUOUS = {"inputs_embeds", "attention_mask", "position_ids"}


def _called(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _offences(path: Path, root: Path = PACKAGE) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = _called(node)
        keywords = {k.arg for k in node.keywords}
        spread = None in keywords  # model(**kwargs)
        where = f"{path.relative_to(root.parent)}:{node.lineno}"
        if name == "model_masks" and path not in (FORWARD, MASKS):
            found.append(f"{where}: model_masks(")
        elif name == "model" and path != FORWARD and (keywords & CONTINUOUS or spread):
            found.append(f"{where}: a call of the stock model with continuous inputs")
    return found


def test_only_the_forward_module_builds_masks_and_calls_the_model_on_continuous_inputs() -> None:
    offences = [o for path in sorted(PACKAGE.rglob("*.py")) for o in _offences(path)]
    assert offences == [], "\n".join(offences)


def test_the_check_sees_what_it_looks_for(tmp_path: Path) -> None:
    # The patterns the check exists for, in a file outside contllm.core.forward.
    sample = tmp_path / "sample.py"
    sample.write_text(
        "mask = model_masks(family, config, t, t, d, dtype=None, device='cpu')\n"
        "out = self.model(inputs_embeds=e, attention_mask=mask)\n"
        "out = lm.model(**inputs)\n"
        "out = model(input_ids=ids)\n"  # discrete ids: not a continuous forward
    )
    found = _offences(sample, tmp_path)
    assert [f.split(": ", 1)[1] for f in found] == ["model_masks("] + [
        "a call of the stock model with continuous inputs"
    ] * 2
