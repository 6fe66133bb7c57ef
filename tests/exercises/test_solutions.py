"""Every chapter 02-12 runs top to bottom with the reference solutions plugged in (tests/exercises/plug.py),
and every check passes and every prediction is right; as committed (stubs unfilled), every exercise cell
says "not done yet" or "not answered yet", never an error (nbval runs them; this reads what they printed)."""

import json
import os
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from exercises.plug import (
    IPC_CONFTEST,
    NOTEBOOKS,
    ROOT,
    IPCKernelManager,
    chapters,
    exercise_cells,
    plugged,
    plugged_ipynb,
    solutions,
)

CHAPTERS = chapters()


def texts(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def test_every_exercise_has_a_solution_and_every_solution_an_exercise():
    import jupytext

    cells, answers = solutions()
    stubs, predicts = set(), set()
    for path in CHAPTERS:
        s, p = exercise_cells(jupytext.read(path))
        stubs |= set(s)
        predicts |= set(p)
    assert stubs == set(cells), (sorted(stubs ^ set(cells)))
    assert predicts == set(answers), (sorted(predicts ^ set(answers)))


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_runs_with_the_solutions_plugged_in(path):
    nb, stubs, predicts = plugged(path)
    NotebookClient(nb, kernel_manager_class=IPCKernelManager, timeout=600,
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    outputs = {i: texts(c) for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    s, p = exercise_cells(nb)  # the plugged cells still carry their ids (the solution cell's own marker)
    checks = [t for t in outputs.values() if ": passed. Your " in t]
    rights = [t for t in outputs.values() for line in t.split("\n") if line.endswith(": right.")]
    assert len(checks) >= len(stubs), (path.name, stubs, [t[:200] for t in outputs.values() if "disagree" in t])
    assert len(rights) >= len(predicts), (path.name, predicts)
    wrong = [t for t in outputs.values() if "disagree with ggml" in t or "not quite" in t or "not done yet" in t]
    assert not wrong, wrong
    print(f"{path.stem}: {len(stubs)} implement-exercises passed, {len(predicts)} predictions right")


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_committed_chapter_shows_every_exercise_unfinished(path):
    import jupytext

    stubs, predicts = exercise_cells(jupytext.read(path))
    nb = json.loads(path.with_suffix(".ipynb").read_text(encoding="utf-8"))
    said = ["".join(o.get("text", "")) if isinstance(o.get("text"), str) else "".join(o.get("text", []))
            for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    for ex_id in stubs:
        assert any(t.startswith(f"{ex_id} ") and "not done yet" in t for t in said), (path.name, ex_id)
    for ex_id in predicts:
        assert any(t.startswith(f"{ex_id} ") and "not answered yet" in t for t in said), (path.name, ex_id)
    assert stubs or predicts, f"{path.name} has no exercises"


def test_nbval_passes_with_the_solutions_plugged_in(tmp_path):
    """nbval itself on the chapters with the solutions plugged in: every cell runs without an error, and the
    cells whose printed output is a chapter's result (NBVAL_CHECK_OUTPUT) still print what was recorded. The
    copies sit in a notebooks/ folder beside a link to tests/, so that their `../tests/fixtures` paths hold; a
    conftest.py there starts nbval's kernels on IPC sockets (plug.py)."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    (tmp_path / "conftest.py").write_text(IPC_CONFTEST)
    for path in CHAPTERS:
        nbformat.write(plugged_ipynb(path), tmp_path / "notebooks" / path.with_suffix(".ipynb").name)
    run = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-q", "-p",
                          "no:cacheprovider", "notebooks"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, timeout=1200)
    print(run.stdout.strip().split("\n")[-1])
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
