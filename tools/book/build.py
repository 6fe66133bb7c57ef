#!/usr/bin/env python3
"""`make book`: the course as a static web site in `_build/book/`, from the committed, executed notebooks.

    python tools/book/build.py [--out DIR]

Nothing runs a kernel and nothing is fetched: the pages show the outputs the notebooks were committed with
(`make sync` wrote them), and everything a page loads is a file of the site. Two steps:

1. Stage the sources in `_build/book-src/` (made anew each time):
   * `index.md`: the README (the two commands, the tour, whose chapter names link to their pages), with a
     "Where to start" section before the tour, and the tables of contents: chapters 00 to 12, appendices A1 to
     A11, the API reference, the contributor's guide (`contributing.md`, from CONTRIBUTING.md);
   * every notebook, its outputs made for a page: a plotly figure becomes an interactive figure drawn by the
     site's own copy of plotly.js (`conf.py` adds it to the pages that have one); a widget's live view, which
     needs a kernel, is dropped, and its first frame stays as the committed picture under the line that says
     to run the notebook; a note under the title says how to run the chapter; each predict and implement
     exercise gets its solution from appendix A8, A9 or A10 folded under it;
   * `api/`: a page per module from its docstrings (`api.py`).
2. Sphinx (with myst-nb, execution off; `conf.py` beside this file) writes the HTML, two processes.

It prints the time, the pages and the site's size. `tests/ui/test_book.py` opens every page in Chromium.
"""

from __future__ import annotations

import argparse
import copy
import html
import json
import re
import shutil
import sys
import time
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
sys.path.append(str(ROOT / "tests"))  # tests/exercises/plug.py: where the solutions are (after the installed packages)

from book import api  # noqa: E402  (tools/ on the path: `python tools/book/build.py` from anywhere)
from exercises.plug import PLACEHOLDER, SOLUTION, SOLUTION_BOOKS, STUB, solutions  # noqa: E402

NOTEBOOKS = ROOT / "notebooks"
BUILD = ROOT / "_build"
STAGE = BUILD / "book-src"
DOCTREES = BUILD / "book-doctrees"
OUT = BUILD / "book"

PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
FIGURE_CLASS = "book-figure"  # conf.py loads plotly.js on the pages that have one; the test counts them


def read(stem: str):
    """A committed notebook as nbformat's node, unvalidated (`make sync` wrote it; the tests check it)."""
    return nbformat.v4.reads((NOTEBOOKS / f"{stem}.ipynb").read_text())


def reading_order() -> tuple[list[str], list[str]]:
    """(chapters 00..12, appendices A1..A11) as notebook stems."""
    chapters = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    appendices = sorted((p.stem for p in NOTEBOOKS.glob("A[0-9]*_*.ipynb")), key=lambda s: int(s[1:].split("_")[0]))
    return chapters, appendices


def title_of(nb) -> str:
    """The notebook's first heading, without its '#'."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    raise SystemExit("a notebook without a '# ' title")


def figure_html(fig: dict) -> str:
    """A plotly figure as a div holding its JSON; `static/book-figures.js` draws it with the site's plotly.js."""
    data = json.dumps(fig, separators=(",", ":"))
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<div class="{FIGURE_CLASS}"><script type="application/json">{data}</script></div>'


def web_outputs(outputs: list) -> list:
    """A code cell's outputs for a page: plotly figures interactive, a widget's view dropped and its first frame
    (the outputs before it, as `make sync` committed them) kept as pictures."""
    widget = any(WIDGET in o.get("data", {}) for o in outputs)
    out = []
    for o in outputs:
        data = o.get("data", {})
        if WIDGET in data:
            continue
        if PLOTLY in data:
            o = copy.deepcopy(o)
            fig = o.data.pop(PLOTLY)
            if widget:  # a widget's first frame: the picture the line above it announces
                o.data = {"image/png": data["image/png"]}
            else:
                o.data = {"text/html": figure_html(fig)}
        out.append(o)
    return out


def run_note(stem: str) -> str:
    return "\n".join([
        "```{admonition} Run this chapter",
        ":class: tip",
        "",
        f"This page is `notebooks/{stem}.ipynb` as it is committed, executed, with its outputs; nothing ran to make "
        "it, so a widget shows its first frame. To run the chapter and move its widgets: in a clone of the project, "
        "`make lab` (the first time it also installs everything; see [the two commands](index.md#the-two-commands)), "
        f"then open `{stem}.ipynb` in JupyterLab's file browser and run all cells.",
        "```",
    ])


def fenced(text: str, lang: str) -> str:
    fence = api.fence(text)
    return f"{fence}{lang}\n{text.rstrip()}\n{fence}"


class Solutions:
    """The solutions of appendices A8-A10: a solution cell's source and what the grader printed for it."""

    def __init__(self) -> None:
        self.cells, self.answers = solutions()  # {id: solution cell source}, {id: the answer's source text}
        self.book: dict[str, str] = {}  # id -> the appendix that solves it
        self.said: dict[str, str] = {}  # id -> the committed output of the appendix's cell, for that id
        for stem in SOLUTION_BOOKS:
            for cell in read(stem).cells:
                if cell.cell_type != "code":
                    continue
                text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
                for ex_id in [m.group(1) for m in SOLUTION.finditer(cell.source)]:
                    self.book[ex_id], self.said[ex_id] = stem, text
                for ex_id in re.findall(r'answer\("(\d\d\.\d+)"', cell.source):
                    self.book[ex_id] = stem  # its lines: "NN.K · title: right." and the "Why: ..." after it
                    self.said[ex_id] = "\n".join(re.findall(rf"^{re.escape(ex_id)} · .*\n(?:Why: .*)?", text, re.M))

    def fold(self, ex_id: str, titles: dict[str, str]) -> str:
        stem = self.book[ex_id]
        if ex_id in self.cells:
            source = "\n".join(line for line in self.cells[ex_id].splitlines() if line != "# NBVAL_CHECK_OUTPUT")
            shown = fenced(source, "python")
        else:
            shown = fenced(f'answer("{ex_id}", {self.answers[ex_id]})', "python")
        return "\n".join([
            f'<details class="book-solution"><summary>Solution {html.escape(ex_id)} (try it first)</summary>', "",
            f"From [{titles[stem]}]({stem}.ipynb), with what the grader printed for it:", "",
            shown, "", fenced(self.said[ex_id], "text"), "", "</details>"])


def stage_notebook(nb, stem: str, titles: dict[str, str], sol: Solutions) -> int:
    """Write the page's notebook `nb` into the stage; return its figure count."""
    cells, figures = [], 0
    for i, cell in enumerate(nb.cells):
        if i == 0 and cell.cell_type == "markdown":  # the note right under the title
            head, _, rest = cell.source.partition("\n")
            cell = copy.deepcopy(cell)
            cell.source = f"{head}\n\n{run_note(stem)}\n{rest}"
        cells.append(cell)
        if cell.cell_type != "code":
            continue
        cell.outputs = web_outputs(cell.outputs)
        figures += sum(FIGURE_CLASS in o.get("data", {}).get("text/html", "") for o in cell.outputs)
        ids = [m.group(1) for m in STUB.finditer(cell.source)] + [m.group(1) for m in PLACEHOLDER.finditer(cell.source)]
        for ex_id in ids:
            cells.append(nbformat.v4.new_markdown_cell(sol.fold(ex_id, titles)))
    nb.cells = cells
    nb.metadata = {"kernelspec": nb.metadata.get("kernelspec", {}), "language_info": {"name": "python"}}
    (STAGE / f"{stem}.ipynb").write_text(nbformat.v4.writes(nb))
    return figures


def where_to_start(chapters: list[str], appendices: list[str], titles: dict[str, str]) -> str:
    first, exercises = chapters[0], next(c for c in chapters if c.startswith("02_"))
    return "\n".join([
        "## Where to start", "",
        f"Read the chapters in order, from [{titles[first]}]({first}.ipynb): each page is one notebook of the "
        "course with the outputs it was committed with, and the sidebar lists them all, then the appendices, which "
        "go deeper and which nothing in chapters 00 to 12 needs. Previous and next are at the bottom of each "
        "page; the search box finds a C function by its name (`ggml_gallocr_alloc_graph`) in the chapters and in "
        "the [API reference](api/index.md), which lists every module's classes and functions with the C they "
        f"port. Exercises start in [{titles[exercises]}]({exercises}.ipynb); each one's solution is folded under "
        f"it (try first), and appendices {SOLUTION_BOOKS[0].split('_')[0]} to {SOLUTION_BOOKS[-1].split('_')[0]} grade "
        "and solve them all. To run a chapter, and to use its widgets, clone the project and run `make lab`.", ""])


def stage_home(chapters: list[str], appendices: list[str], titles: dict[str, str], api_pages: list[str]) -> None:
    readme = (ROOT / "README.md").read_text()
    readme = readme.replace("](CONTRIBUTING.md)", "](contributing.md)")
    # the tour's rows name a notebook in their first column: link it to its page
    readme = re.sub(r"^\| `(\w+)` \|", lambda m: (f"| [`{m.group(1)}`]({m.group(1)}.ipynb) |"
                                                  if (NOTEBOOKS / f"{m.group(1)}.ipynb").exists() else m.group(0)),
                    readme, flags=re.M)
    tour = "\n## A tour\n"
    assert readme.count(tour) == 1, "README.md: no '## A tour' section to put 'Where to start' before"
    readme = readme.replace(tour, "\n" + where_to_start(chapters, appendices, titles) + tour)

    def toc(caption: str, names: list[str]) -> str:
        return "\n".join(["", "```{toctree}", f":caption: {caption}", ":hidden:", "", *names, "```"])

    readme += toc("Chapters", chapters) + toc("Appendices", appendices)
    readme += toc("Reference", [api_pages[0], "contributing"])
    (STAGE / "index.md").write_text(readme + "\n")
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    (STAGE / "contributing.md").write_text(contributing.replace("](README.md)", "](index.md)"))


def stage() -> dict:
    """Write the Sphinx sources into STAGE; return what was staged (pages, figures)."""
    shutil.rmtree(STAGE, ignore_errors=True)
    STAGE.mkdir(parents=True)
    chapters, appendices = reading_order()
    notebooks = {stem: read(stem) for stem in chapters + appendices}
    titles = {stem: title_of(nb) for stem, nb in notebooks.items()}
    sol = Solutions()
    figures = {stem: stage_notebook(nb, stem, titles, sol) for stem, nb in notebooks.items()}
    api_pages = api.write(STAGE, titles, chapters + appendices)
    stage_home(chapters, appendices, titles, api_pages)
    return {"notebooks": chapters + appendices, "figures": figures, "api": api_pages}


def build(out: Path = OUT, jobs: int = 2, quiet: bool = True) -> dict:
    """Stage, then run Sphinx into `out` (made anew). Return what was staged and the seconds it took."""
    from sphinx.cmd.build import build_main

    t0 = time.perf_counter()
    staged = stage()
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(DOCTREES, ignore_errors=True)
    args = ["-b", "html", "-c", str(HERE), "-d", str(DOCTREES), "-j", str(jobs), "--keep-going",
            *(["-q"] if quiet else []), str(STAGE), str(out)]
    if build_main(args) != 0:
        raise SystemExit("make book: sphinx-build failed (its messages are above)")
    staged["seconds"] = time.perf_counter() - t0
    return staged


def size_mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT, help="where the site goes (default: _build/book)")
    ap.add_argument("--verbose", action="store_true", help="Sphinx's progress messages too")
    args = ap.parse_args(argv)
    staged = build(args.out, quiet=not args.verbose)
    pages = len(list(args.out.rglob("*.html")))
    print(f"make book: {len(staged['notebooks'])} notebooks ({sum(staged['figures'].values())} interactive figures), "
          f"{len(staged['api'])} API pages, {pages} HTML files, {size_mib(args.out):.1f} MiB in "
          f"{args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}, "
          f"built in {staged['seconds']:.1f} s; open {args.out / 'index.html'} through a local server, "
          f"e.g. python -m http.server -b 127.0.0.1 -d {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
