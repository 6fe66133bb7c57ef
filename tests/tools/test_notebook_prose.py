"""The notebooks' prose renders as prose: a markdown heading (`# # Title`, `# ## 3 · Title`, ...) in a
code cell of a notebook source is only a comment in the rendered notebook, so a section would vanish
from the reader's outline. Each notebook source is parsed as jupytext parses it."""

import re
from pathlib import Path

import jupytext
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.py"))
HEADING = re.compile(r"^#\s?#{1,6}\s+\S")  # a commented markdown heading: "# # Title", "# ### 6.1 · Title"


def headings_in_code(text: str) -> list:
    """(cell number, line) of every markdown heading in a code cell of a jupytext percent source;
    cells are counted from 1, as a reader counts them."""
    nb = jupytext.reads(text, fmt="py:percent")
    return [(k, line) for k, cell in enumerate(nb.cells, 1) if cell.cell_type == "code"
            for line in cell.source.splitlines() if HEADING.match(line)]


def test_the_check_finds_a_heading_in_a_code_cell_and_nothing_else():
    text = ("# %% [markdown]\n# # Title\n#\n# ## 1 · A section\n\n"
            "# %%\nimport numpy as np\n\n# ## 2 · Lost in code\n\n"
            "# %%\nx = 1  # ## not a heading: code before it\n# #include is C, not a heading\n# | export\n")
    assert headings_in_code(text) == [(2, "# ## 2 · Lost in code")]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_markdown_heading_in_a_code_cell(path):
    found = headings_in_code(path.read_text())
    assert not found, f"{path.name}: markdown heading(s) in code cells (put them in a `# %% [markdown]` cell): " + \
        "; ".join(f"cell {k}: {line!r}" for k, line in found)
