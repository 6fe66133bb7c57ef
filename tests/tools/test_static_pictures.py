"""The committed notebooks read without a kernel (GitHub, nbviewer): every plotly figure carries a PNG,
every widget is preceded by its first frame, no notebook is over 1 MB; and `tools/nbsync.py` adds the
pictures deterministically (an unchanged figure keeps its bytes; only new figures are drawn).

The drawing itself needs a Chromium (kaleido); these tests do not: they read the committed files and
drive `add_pictures` with a stand-in painter."""

import base64
import importlib.util
import json
import os
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _nbsync():
    spec = importlib.util.spec_from_file_location("nbsync_static", ROOT / "tools" / "nbsync.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


nbsync = _nbsync()


def outputs(path):
    """(cell index, output) of every code cell output of the notebook at `path`."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [(ci, out) for ci, cell in enumerate(nb["cells"]) if cell["cell_type"] == "code" for out in cell["outputs"]]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_figure_carries_a_png(path):
    for ci, out in outputs(path):
        data = out.get("data", {})
        if nbsync.PLOTLY in data:
            assert "image/png" in data, f"{path.name} cell {ci}: a plotly figure without a PNG (run `make sync`)"
            png = base64.b64decode(data["image/png"])
            assert png.startswith(PNG_MAGIC) and len(png) > 1000, f"{path.name} cell {ci}: not a PNG picture"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_widget_shows_its_first_frame_as_a_picture(path):
    cells = {}
    for ci, out in outputs(path):
        cells.setdefault(ci, []).append(out)
    for ci, outs in cells.items():
        views = [k for k, o in enumerate(outs) if nbsync.WIDGET_VIEW in o.get("data", {})]
        for k in views:
            before = outs[:k]
            said = [o for o in before if o["output_type"] == "stream" and "first frame" in "".join(o["text"])]
            pictures = [o for o in before if "image/png" in o.get("data", {})]
            assert said, f"{path.name} cell {ci}: a widget without the line saying its first frame follows"
            assert pictures, f"{path.name} cell {ci}: a widget without a picture of its first frame"
            assert "Run the notebook" in "".join(said[-1]["text"])


def test_the_course_has_figures_and_widgets_to_check():
    """The two tests above must have something to look at (a sync that dropped every figure would pass them)."""
    figures = sum(nbsync.PLOTLY in o.get("data", {}) for p in NOTEBOOKS for _, o in outputs(p))
    widgets = sum(nbsync.WIDGET_VIEW in o.get("data", {}) for p in NOTEBOOKS for _, o in outputs(p))
    assert figures >= 15 and widgets >= 4, (figures, widgets)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebooks_stay_lean(path):
    assert path.stat().st_size < 1_000_000, f"{path.name}: {path.stat().st_size} bytes"


class CountingPainter:
    """Stands in for kaleido: a distinct fake PNG per call, and a count of the calls."""

    def __init__(self):
        self.calls = 0

    def png(self, spec):
        self.calls += 1
        return base64.b64encode(PNG_MAGIC + f"drawing {self.calls}".encode()).decode()


def _notebook(*figures):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("fig")
    cell.outputs = [nbformat.v4.new_output("display_data", data={nbsync.PLOTLY: f}) for f in figures]
    nb.cells = [cell]
    return nb


def test_an_unchanged_figure_keeps_its_png_bytes_and_a_new_one_is_drawn(tmp_path):
    fig_a = {"data": [{"type": "bar", "y": [1, 2]}], "layout": {"title": {"text": "a"}}}
    fig_b = {"data": [{"type": "bar", "y": [3, 4]}], "layout": {"title": {"text": "b"}}}
    first, painter = _notebook(fig_a), CountingPainter()
    assert nbsync.add_pictures(first, {}, painter) == 1
    committed = tmp_path / "x.ipynb"
    nbformat.write(first, committed)
    png_a = first.cells[0].outputs[0]["data"]["image/png"]

    again = _notebook(dict(reversed(list(fig_a.items()))), fig_b)  # the same figure (keys reordered) and a new one
    assert nbsync.add_pictures(again, nbsync.previous_pictures(committed), painter) == 1
    got = [o["data"]["image/png"] for o in again.cells[0].outputs]
    assert got[0] == png_a and got[1] != png_a and painter.calls == 2
    assert "text/plain" not in again.cells[0].outputs[0]["data"]  # nbval compares text/plain with the live run


def test_static_frames_only_when_asked(capsys, monkeypatch):
    from ggml_lite.viz.memory import STATIC_FRAMES_ENV, show_static_frame

    assert STATIC_FRAMES_ENV == nbsync.STATIC_FRAMES_ENV
    drawn = []
    monkeypatch.delenv(STATIC_FRAMES_ENV, raising=False)
    show_static_frame("a stepper over 3 steps", lambda: drawn.append(0))
    assert drawn == [] and capsys.readouterr().out == ""
    monkeypatch.setenv(STATIC_FRAMES_ENV, "1")
    show_static_frame("a stepper over 3 steps", lambda: drawn.append(0))
    assert drawn == [0] and "a stepper over 3 steps: its first frame" in capsys.readouterr().out
    assert os.environ[STATIC_FRAMES_ENV] == "1"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_empty_cells(path):
    """An empty cell is a stray `# %%` (or blank lines after the jupytext header) in the source."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    empty = [i for i, c in enumerate(nb["cells"]) if not "".join(c["source"]).strip()]
    assert not empty, f"{path.name}: empty cells {empty}; remove them from {path.with_suffix('.py').name}"
