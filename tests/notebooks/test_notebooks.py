"""Every notebook in notebooks/ runs top to bottom, and is stored without outputs.

The kernel is this interpreter (``sys.executable -m ipykernel_launcher``) through a kernel
spec written for the test, so the notebooks run on the same environment as pytest whether
or not a virtual environment is activated, and whatever "python3" kernel a user has
installed elsewhere.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

pytestmark = pytest.mark.notebook

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
#: Where each executed notebook is written, outputs and figures included: the documentation
#: site shows these (docs/hooks.py), so the notebooks run once per CI run, not twice.
EXECUTED = Path(__file__).resolve().parents[2] / "build" / "notebooks"
EXPECTED = {
    "explore.ipynb", "counting.ipynb", "events.ipynb", "boolean.ipynb", "equivalence.ipynb",
    "interpolation.ipynb", "tokens.ipynb", "sums.ipynb", "attribution.ipynb",
}
KERNEL = "contllm-test"
#: Seconds a single cell may take; each notebook as a whole runs in well under 3 minutes.
CELL_TIMEOUT = 240


def notebook_paths() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


@pytest.fixture(scope="session")
def kernel_specs(tmp_path_factory: pytest.TempPathFactory) -> KernelSpecManager:
    root = tmp_path_factory.mktemp("kernels")
    spec = root / KERNEL
    spec.mkdir()
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "contllm (test)", "language": "python"})
    )
    return KernelSpecManager(kernel_dirs=[str(root)], ensure_native_kernel=False)


def test_the_notebooks_are_there() -> None:
    assert EXPECTED <= {p.name for p in notebook_paths()}


@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.stem)
def test_stored_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {index} is stored with outputs"
            assert cell.execution_count is None, f"{path.name} cell {index} is stored with an execution count"


@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.stem)
def test_runs_top_to_bottom(path: Path, kernel_specs: KernelSpecManager) -> None:
    nb = nbformat.read(path, as_version=4)
    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=kernel_specs)
    assert km.kernel_spec.argv[0] == sys.executable
    client = NotebookClient(
        nb,
        km=km,
        timeout=CELL_TIMEOUT,
        allow_errors=False,  # a failing cell raises CellExecutionError naming the cell
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    try:
        # The client does not own a kernel manager it is given, and would leave the kernel
        # (about 1 GB) running until pytest exits: have it shut the kernel down, also on an error.
        client.execute(cleanup_kc=True)
    finally:
        if km.has_kernel:  # the kernel never started its client: nbclient's cleanup did not run
            km.shutdown_kernel(now=True)
    assert not km.is_alive(), f"the kernel of {path.name} is still running"
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name} drew no figure"
    EXECUTED.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, EXECUTED / path.name)
