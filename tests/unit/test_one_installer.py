"""One hook installer: only contllm.internals.hooks registers hooks on modules or patches them; each patch is undone."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from contllm.internals.hooks import input_hook, output_hook, replaced_forward, replaced_module, replaced_parameter

PACKAGE = Path(__file__).resolve().parents[2] / "contllm"

#: The raw-layer API: the one module that registers hooks on a module and patches modules.
RAW = PACKAGE / "internals" / "hooks.py"
REGISTERING = {"register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook"}


def _offences(path: Path, root: Path = PACKAGE) -> list[str]:
    found = []
    for node in sorted(ast.walk(ast.parse(path.read_text())), key=lambda n: getattr(n, "lineno", 0)):
        where = f"{path.relative_to(root.parent)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in REGISTERING:
            found.append(f"{where}: {node.func.attr}")
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr == "forward":
                found.append(f"{where}: assigns a module's forward")
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute):
                if target.value.attr == "_parameters":
                    found.append(f"{where}: swaps a module's parameter")
    return found


def test_only_the_raw_layer_api_registers_hooks_or_patches_modules() -> None:
    offences = [o for path in sorted(PACKAGE.rglob("*.py")) if path != RAW for o in _offences(path)]
    assert offences == [], "\n".join(offences)


def test_the_check_sees_what_it_looks_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "handle = module.register_forward_hook(fn)\n"
        "handle = module.register_forward_pre_hook(fn, with_kwargs=True)\n"
        "layer.forward = replay\n"
        "module._parameters[name] = copy\n"
        "x.forward_ids = 3\n"  # not a forward
    )
    kinds = [f.split(": ", 1)[1] for f in _offences(sample, tmp_path)]
    assert kinds == [
        "register_forward_hook",
        "register_forward_pre_hook",
        "assigns a module's forward",
        "swaps a module's parameter",
    ]


def _bare(module: torch.nn.Module) -> bool:
    return not module._forward_hooks and not module._forward_pre_hooks and "forward" not in vars(module)


def test_every_raw_patch_is_undone_also_on_an_exception() -> None:
    parent = torch.nn.Sequential(torch.nn.Linear(2, 2))
    layer = parent[0]
    weight = layer.weight
    x = torch.ones(1, 2)
    want = parent(x)

    def doubled(module: torch.nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
        return 2 * output

    def zeroed(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return (torch.zeros_like(args[0]),), kwargs

    patches = [
        lambda: output_hook(layer, doubled),
        lambda: input_hook(layer, zeroed),
        lambda: replaced_forward(layer, lambda h: h),
        lambda: replaced_module(parent, "0", torch.nn.Identity()),
        lambda: replaced_parameter(layer, "weight", torch.nn.Parameter(torch.zeros(2, 2))),
    ]
    for make in patches:
        with make():
            assert not torch.equal(parent(x), want)
        assert torch.equal(parent(x), want) and _bare(layer) and parent[0] is layer and layer.weight is weight
        with pytest.raises(RuntimeError, match="boom"), make():
            raise RuntimeError("boom")
        assert torch.equal(parent(x), want) and _bare(layer) and parent[0] is layer and layer.weight is weight


def test_a_replaced_forward_gives_back_the_one_before_it() -> None:
    layer = torch.nn.Linear(2, 2)
    x = torch.ones(1, 2)
    with replaced_forward(layer, lambda h: h + 1), replaced_forward(layer, lambda h: h + 2):
        assert torch.equal(layer(x), x + 2)
    assert "forward" not in vars(layer)
    with replaced_forward(layer, lambda h: h + 1):
        with replaced_forward(layer, lambda h: h + 2):
            pass
        assert torch.equal(layer(x), x + 1)
