"""The example notebooks run top to bottom, and are stored without outputs.

Each notebook in ``examples/`` is executed with nbclient in a ``python3`` kernel that runs
*this* interpreter (a kernelspec written to a temporary ``JUPYTER_PATH`` entry, so a user's own
``python3`` kernelspec cannot point the test elsewhere), with ``MPLBACKEND=Agg``. A cell that
raises fails the test, and so does a warning: a first injected cell turns warnings into errors,
as ``filterwarnings = error`` does for the rest of the suite. A last injected cell draws every
figure the notebook made, so that errors that only show at draw time (labels, layouts) fail too.
Anything a cell writes to stderr fails the test as well.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
CELL_TIMEOUT = 180  # seconds per cell; the slowest cell (side_by_side's timings) takes ~10 s

SETUP_CELL = """\
import warnings
warnings.simplefilter("error")
# ipykernel's own shutdown path warns (PendingDeprecationWarning, "do_shutdown ... awaitable");
# it is not the notebook's code, and an error there would keep the kernel from exiting cleanly
warnings.filterwarnings(
    "ignore", message="For consistency across implementations", category=PendingDeprecationWarning
)
"""

DRAW_CELL = """\
import matplotlib.pyplot as _plt
_figures = [_plt.figure(n) for n in _plt.get_fignums()]
for _fig in _figures:
    _fig.canvas.draw()
print("figures drawn:", len(_figures))
_plt.close("all")
warnings.resetwarnings()
"""


def test_examples_present() -> None:
    names = {p.name for p in NOTEBOOKS}
    assert {
        "quickstart.ipynb",
        "attention_explained.ipynb",
        "side_by_side.ipynb",
        "chat_and_inspect.ipynb",
    } <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_stored_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"cell {i} of {path.name} has stored outputs"
            assert cell.execution_count is None, f"cell {i} of {path.name} has an execution count"


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A ``python3`` kernelspec for this interpreter, found first on JUPYTER_PATH."""
    root = tmp_path_factory.mktemp("jupyter")
    spec_dir = root / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (llmkernels tests)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    return {"JUPYTER_PATH": str(root), "MPLBACKEND": "Agg"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(
    path: Path, kernel_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in kernel_env.items():
        monkeypatch.setenv(key, value)  # read by the kernel-spec lookup and the kernel
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(SETUP_CELL))
    nb.cells.append(nbformat.v4.new_code_cell(DRAW_CELL))
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT,
        resources={"metadata": {"path": str(EXAMPLES)}},
    )
    client.execute()  # raises CellExecutionError (with the traceback) if a cell fails

    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for out in cell.outputs:
            assert out.output_type != "error", f"cell {i}: {out.get('ename')}"
            if out.output_type == "stream" and out.name == "stderr":
                pytest.fail(f"{path.name} cell {i} wrote to stderr:\n{out.text}")
    last = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert "figures drawn:" in last
    if path.stem in ("attention_explained", "side_by_side"):
        assert int(last.split("figures drawn:")[1]) >= 3, last
    if path.stem == "chat_and_inspect":  # the head grid and the residual-stream RMS
        assert int(last.split("figures drawn:")[1]) >= 2, last
        # it reads the shipped example model (no checkpoint built on the spot), chats, checks
        # the layer-by-layer logits against the fused forward and classifies the trained heads
        printed = "".join(
            out.get("text", "")
            for cell in nb.cells
            if cell.cell_type == "code"
            for out in cell.outputs
            if out.output_type == "stream"
        )
        for needed in ("model.safetensors", "tokens prefilled", "largest difference:",
                       "trained:", "layer 5:", "final norm:"):  # fmt: skip
            assert needed in printed, f"{needed!r} not printed by {path.name}"
        source = "".join(cell.source for cell in nb.cells)
        assert "lk.example_model()" in source and "import torch" not in source
