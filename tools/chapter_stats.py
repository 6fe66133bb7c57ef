#!/usr/bin/env python3
"""Print, per chapter, what the course promises about its shape (CONTRIBUTING.md, "Chapters"):

- lines of the `.py` source before its "Exercises" section (at most 1,300 per notebook: what a reader
  reads), and of that section, the chapter's last (at most 160: what a learner does);
- prose words per code word (at least 0.3): words of the markdown cells against words of the code
  cells (directive lines left out), a word being what whitespace separates;
- code cells over 80 lines;
- export cells not preceded by a cited C excerpt, in the chapters that promise one (05, 07, 09): the
  markdown cell right before an export cell must hold a fenced ```c block and cite `file.c:line`.

    python tools/chapter_stats.py [--check] [NOTEBOOK.py ...]     (default: every notebooks/*.py)

Exit 1 with --check when a chapter breaks a promise (each is named), 2 for a notebook that is not one of
the repository's, else 0.
"""

import re
import sys
from pathlib import Path

import jupytext

from nbexport import ExportError, notebook_parser, resolve_notebook

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 1300
MAX_EXERCISE_LINES = 160
EXERCISES = re.compile(r"^# %% \[markdown\]\n# ## \d+ · Exercises$", re.M)  # the cell that opens the exercises
MIN_RATIO = 0.3
MAX_CELL_LINES = 80
C_BESIDE_PORT = ("05_", "07_", "09_")  # chapters whose every export cell follows the C it ports
DIRECTIVE = re.compile(r"^#\s*\|")
CITATION = re.compile(r"[\w.-]+\.(c|h|cpp):\d+")


def words(text: str) -> int:
    return len(text.split())


def is_export(cell) -> bool:
    """A code cell whose leading directives include `# | export` (not only `# | default_exp`)."""
    for line in cell.source.split("\n"):
        if not DIRECTIVE.match(line):
            return False
        if re.match(r"^#\s*\|\s*export\b", line):
            return True
    return False


def has_c_excerpt(cell) -> bool:
    return cell.cell_type == "markdown" and "```c" in cell.source and bool(CITATION.search(cell.source))


def stats(path: Path) -> dict:
    nb = jupytext.read(path)
    prose = sum(words(c.source) for c in nb.cells if c.cell_type == "markdown")
    code = sum(words("\n".join(line for line in c.source.split("\n") if not DIRECTIVE.match(line)))
               for c in nb.cells if c.cell_type == "code")
    long_cells = [i for i, c in enumerate(nb.cells)
                  if c.cell_type == "code" and c.source.count("\n") + 1 > MAX_CELL_LINES]
    bare = []
    if path.name.startswith(C_BESIDE_PORT):
        bare = [i for i, c in enumerate(nb.cells)
                if c.cell_type == "code" and is_export(c) and not (i > 0 and has_c_excerpt(nb.cells[i - 1]))]
    text = path.read_text(encoding="utf-8")
    heading = EXERCISES.search(text)
    n_lines = (text[:heading.start()] if heading else text).count("\n")
    return {"lines": n_lines, "exercise_lines": text.count("\n") - n_lines,
            "prose": prose, "code": code, "ratio": prose / code if code else float("inf"),
            "long_cells": long_cells, "export_cells_without_c": bare}


def problems(name: str, s: dict) -> list:
    out = []
    if s["lines"] > MAX_LINES:
        out.append(f"{name}: {s['lines']} lines (at most {MAX_LINES})")
    if s["exercise_lines"] > MAX_EXERCISE_LINES:
        out.append(f"{name}: an Exercises section of {s['exercise_lines']} lines (at most {MAX_EXERCISE_LINES})")
    if s["ratio"] < MIN_RATIO:
        out.append(f"{name}: {s['ratio']:.2f} prose words per code word (at least {MIN_RATIO})")
    if s["long_cells"]:
        out.append(f"{name}: code cells over {MAX_CELL_LINES} lines: {s['long_cells']}")
    if s["export_cells_without_c"]:
        out.append(f"{name}: export cells without a cited C excerpt right before them: {s['export_cells_without_c']}")
    return out


def main(argv=None) -> int:
    args = notebook_parser(__doc__, "exit 1 when a chapter breaks a promise").parse_args(argv)
    try:  # the notebooks are named as the exporter names them: relative to the repository or the cwd
        paths = [resolve_notebook(a) for a in args.notebooks] or sorted((ROOT / "notebooks").glob("*.py"))
    except ExportError as e:
        print(f"chapter_stats: error: {e}", file=sys.stderr)
        return 2
    print(f"{'chapter':28} {'lines':>6} {'exer.':>5} {'prose':>7} {'code':>7} {'ratio':>6} {'cells>80':>8} {'no C':>5}")
    found = []
    for path in paths:
        s = stats(path)
        print(f"{path.stem:28} {s['lines']:6d} {s['exercise_lines']:5d} {s['prose']:7d} {s['code']:7d} "
              f"{s['ratio']:6.2f} {len(s['long_cells']):8d} {len(s['export_cells_without_c']):5d}")
        found += problems(path.stem, s)
    for line in found:
        print(line)
    return 1 if args.check and found else 0


if __name__ == "__main__":
    sys.exit(main())
