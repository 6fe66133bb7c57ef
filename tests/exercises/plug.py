"""The reference solutions plugged into the chapters (issue 25, point 2): each chapter run as a learner who
solved everything would run it.

A chapter's exercise cells are of two shapes (notebooks/02_aligned_offsets.py, "Exercises"): a prediction
`answer("NN.K", ...)`, whose `...` the learner replaces, and a stub cell whose first line is
`# exercise NN.K`. The solutions live in appendices A8, A9 and A10: `answer("NN.K", VALUE, record_done=False)`
and a cell holding the line `# solution NN.K`. `plugged(chapter)` is the chapter with every `...` replaced by
the solution's VALUE and every stub cell replaced by its solution cell, whole.
"""

import ast
import re
import tempfile
from pathlib import Path

import jupytext
from jupyter_client.manager import KernelManager

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
SOLUTION_BOOKS = ("A8_exercises", "A9_exercises", "A10_exercises")
STUB = re.compile(r"^# exercise (\d\d\.\d+)\b", re.M)
SOLUTION = re.compile(r"^# solution (\d\d\.\d+)\b", re.M)
PLACEHOLDER = re.compile(r'answer\("(\d\d\.\d+)", \.\.\.\)')


def chapters() -> list[Path]:
    """The chapters with exercises, 02 to 12."""
    return [p for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py")) if "02" <= p.name[:2] <= "12"]


def solutions() -> tuple[dict[str, str], dict[str, str]]:
    """({implement id: solution cell source}, {predict id: the answer's source text}) of A8 and A9."""
    cells: dict[str, str] = {}
    answers: dict[str, str] = {}
    for name in SOLUTION_BOOKS:
        for cell in jupytext.read(NOTEBOOKS / f"{name}.py").cells:
            if cell.cell_type != "code":
                continue
            for m in SOLUTION.finditer(cell.source):
                cells[m.group(1)] = cell.source
            for node in ast.walk(ast.parse(cell.source)):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "answer"
                        and len(node.args) == 2 and isinstance(node.args[0], ast.Constant)):
                    answers[str(node.args[0].value)] = ast.get_source_segment(cell.source, node.args[1]) or ""
    return cells, answers


def exercise_cells(nb) -> tuple[dict[str, int], dict[str, int]]:
    """({implement id: index of its stub cell}, {predict id: index of its answer cell}) of a chapter."""
    stubs, predicts = {}, {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            stubs.update({m.group(1): i for m in STUB.finditer(cell.source)})
            predicts.update({m.group(1): i for m in PLACEHOLDER.finditer(cell.source)})
    return stubs, predicts


def plug(source: str, cells: dict[str, str], answers: dict[str, str]) -> str:
    """A code cell's source with the solutions in: a stub cell becomes its solution cell, whole; each `...` of a
    prediction becomes the solution's value."""
    stub = STUB.search(source)
    if stub:
        return cells[stub.group(1)]
    return PLACEHOLDER.sub(lambda m: f'answer("{m.group(1)}", {answers[m.group(1)]}, record_done=False)', source)


def plugged(path: Path):
    """The chapter at `path` (a jupytext notebook) with the solutions plugged in, and the ids plugged."""
    cells, answers = solutions()
    nb = jupytext.read(path)
    stubs, predicts = exercise_cells(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = plug(cell.source, cells, answers)
    return nb, sorted(stubs), sorted(predicts)


def plugged_ipynb(path: Path):
    """The committed, executed `.ipynb` of the chapter at `path` with the same replacements as `plugged`: the
    chapter's other cells keep their recorded outputs (what nbval compares), the replaced cells lose theirs."""
    import nbformat

    cells, answers = solutions()
    nb = nbformat.read(path.with_suffix(".ipynb"), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and (new := plug(cell.source, cells, answers)) != cell.source:
            cell.source, cell.outputs, cell.execution_count = new, [], None
    return nb


# Kernels talk over IPC sockets (files), not TCP ports: several test processes starting kernels at once race
# for free ports (jupyter_client issue 487), which can stall a run for minutes; files cannot collide. The
# sockets' path is absolute: a relative one would be taken from the kernel's working directory by the kernel
# and from the client's by the client. The manager that started a kernel removes its socket files.
class IPCKernelManager(KernelManager):
    """A kernel manager whose kernel listens on IPC sockets under the temporary folder."""

    def __init__(self, **kwargs):
        super().__init__(transport="ipc", ip=tempfile.mktemp(prefix="ggml-lite-kernel-"), **kwargs)


# For nbval in a subprocess: a conftest.py that makes nbval start its kernels with IPCKernelManager.
IPC_CONFTEST = f"""
import sys

import nbval.kernel

sys.path.insert(0, {str(ROOT / "tests")!r})
from exercises.plug import IPCKernelManager  # noqa: E402

nbval.kernel.KernelManager = IPCKernelManager
"""
