#!/usr/bin/env python3
"""Keep every `notebooks/NN_x.ipynb` paired with its `NN_x.py`, the `.py` always being the source.

Why the `.py` is the source: the percent-format `.py` is what people edit, review and merge (it diffs
like code and carries no outputs); the `.ipynb` is its executed rendering, committed so that readers
see the outputs and pictures without running anything. jupytext's own `--sync` picks whichever file is
newer, and on a fresh clone every file has the same age, so it could overwrite the source with a stale
rendering. This tool never writes a `.py`:

* sync (default): build the notebook from the `.py` with jupytext, execute it with nbclient (a kernel
  of this very interpreter, working directory notebooks/), normalize it and write the `.ipynb`:
  outputs and execution counts kept; no widget state, no jupytext metadata, a generic kernelspec,
  cell metadata reduced to `tags`, no cell ids, stream outputs merged, deterministic JSON.
  A cell that raises: report it and leave that `.ipynb` alone (exit 1).
  Executed with `GGML_LITE_STATIC_FRAMES=1`, so every widget also shows its first frame as ordinary
  outputs (`ggml_lite.viz.memory.show_static_frame`). Every plotly figure then gets a PNG beside its
  JSON (`image/png`), so GitHub and nbviewer, which cannot run plotly, show a picture; JupyterLab still
  prefers the interactive figure. A figure whose JSON is unchanged keeps the PNG bytes the previous
  `.ipynb` held (rendering is not byte-stable across machines, so only changed figures are redrawn);
  new ones are drawn by kaleido in a headless Chromium (`BROWSER_PATH`, else Debian's
  /usr/bin/chromium, else the Chrome kaleido finds).
* `--no-execute`: the same without running (no outputs), for a quick pairing.
* `--check`: write nothing; each `.ipynb` must exist and hold exactly the cells the `.py` gives (type,
  source, tags; outputs ignored), and (with no arguments) no `.ipynb` may lack its `.py`. Exit 1 when not.

    python tools/nbsync.py [--check] [--no-execute] [NOTEBOOK.py ...]   (default: every notebooks/*.py)
"""

import argparse
import base64
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
PLOTLY = "application/vnd.plotly.v1+json"
STATIC_FRAMES_ENV = "GGML_LITE_STATIC_FRAMES"  # ggml_lite.viz.memory reads it (not imported: tools stand alone)
PNG_WIDTH, PNG_HEIGHT = 900, 450  # when a figure's layout gives none (plotly's notebook height is 450)


def resolve_notebook(arg: str) -> Path:
    """A command-line path: relative to the repository root (or else to the cwd)."""
    for candidate in (ROOT / arg, Path.cwd() / arg):
        if candidate.is_file():
            return candidate.resolve()
    raise FileNotFoundError(f"{arg}: no such notebook")


def from_source(py: Path):
    """The notebook that the percent-format `py` describes, normalized, without outputs."""
    return normalize(jupytext.read(py))


def normalize(nb):
    """Drop what varies between machines and runs: widget state, jupytext and kernel details, timings,
    cell ids; merge consecutive stream outputs (their chunking depends on timing); make sure every
    widget view has a text/plain fallback (the committed notebook has no widget state to render it)
    and a model id that depends only on its place (a fresh kernel draws random ids: without state to
    point at, they would only churn the diffs)."""
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    nb.nbformat, nb.nbformat_minor = 4, 4
    for ci, cell in enumerate(nb.cells):
        cell.pop("id", None)
        cell.metadata = {"tags": cell.metadata["tags"]} if cell.metadata.get("tags") else {}
        if cell.cell_type == "code":
            cell.outputs = merge_streams(cell.outputs)
            for oi, out in enumerate(cell.outputs):
                data = out.get("data", {})
                if WIDGET_VIEW in data:
                    data[WIDGET_VIEW] = dict(data[WIDGET_VIEW], model_id=f"{ci:016x}{oi:016x}")
                    if "text/plain" not in data:
                        data["text/plain"] = "A Jupyter widget: run the notebook to use it."
    return nb


def merge_streams(outputs: list) -> list:
    """`outputs` with consecutive stream outputs of the same name joined into one."""
    merged: list = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if out.output_type == "stream" and prev is not None and prev.output_type == "stream" and prev.name == out.name:
            prev.text += out.text
        else:
            merged.append(out)
    return merged


def figure_key(spec: dict) -> str:
    """A digest of a plotly output's JSON: equal digests, equal pictures."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def previous_pictures(ipynb: Path) -> dict:
    """The PNGs the committed `.ipynb` holds, by `figure_key` of the figure they show."""
    if not ipynb.exists():
        return {}
    try:
        nb = nbformat.read(ipynb, as_version=4)
    except Exception:  # unreadable: draw everything again
        return {}
    return {figure_key(out.data[PLOTLY]): out.data["image/png"]
            for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
            if PLOTLY in out.get("data", {}) and "image/png" in out.data}


class Painter:
    """Draws plotly JSON as PNG with kaleido, one headless Chromium for the whole run."""

    def __init__(self):
        self.started, self.drawn = False, 0

    def png(self, spec: dict) -> str:
        import kaleido
        import plotly.io as pio

        if not self.started:
            browser = os.environ.get("BROWSER_PATH") or shutil.which("chromium")
            if browser:
                os.environ["BROWSER_PATH"] = browser
            kaleido.start_sync_server(silence_warnings=True)
            self.started = True
        fig = pio.from_json(json.dumps(spec))
        layout = fig.layout
        opts = {"format": "png", "width": layout.width or PNG_WIDTH, "height": layout.height or PNG_HEIGHT}
        self.drawn += 1
        return base64.b64encode(kaleido.calc_fig_sync(fig, opts=opts)).decode()

    def close(self):
        if self.started:
            import kaleido

            kaleido.stop_sync_server(silence_warnings=True)


def add_pictures(nb, previous: dict, painter: Painter) -> int:
    """Give every plotly output of `nb` an `image/png` (reused from `previous` when its figure is
    unchanged, else drawn); return how many were drawn."""
    drawn = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = out.get("data", {})
            if PLOTLY in data:
                key = figure_key(data[PLOTLY])
                if key not in previous:
                    previous[key] = painter.png(data[PLOTLY])
                    drawn += 1
                data["image/png"] = previous[key]  # no text/plain: nbval would compare it with the live output
    return drawn


def execute(nb, cwd: Path) -> None:
    """Run every cell in place, in a kernel started as `sys.executable -m ipykernel_launcher`.

    The kernel spec is given explicitly rather than looked up by name, so an installed `python3` spec
    pointing at another interpreter can never be picked: the notebooks run in this environment."""
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    class ThisInterpreter(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
            return KernelSpec(argv=argv, display_name=KERNELSPEC["display_name"], language="python")

    km = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ThisInterpreter())
    client = NotebookClient(nb, km=km, kernel_name="python3", timeout=300,
                            resources={"metadata": {"path": str(cwd)}})
    client.execute(env={**os.environ, STATIC_FRAMES_ENV: "1"})  # the kernel's: widgets show their first frame too


def failure(nb, error: Exception) -> str:
    """A one-line account of a failed execution: the cell that raised and the error."""
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                return f"cell {index} raised {out.ename}: {out.evalue}"
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"


def cell_key(cell) -> tuple:
    """What pairing compares: type, source, tags."""
    return cell.cell_type, cell.source, list(cell.get("metadata", {}).get("tags", []))


def check(py: Path) -> str:
    """'' when the `.ipynb` of `py` holds the cells of `py`, else a short reason."""
    ipynb = py.with_suffix(".ipynb")
    if not ipynb.exists():
        return "no .ipynb (run `make sync`)"
    try:
        have = [cell_key(c) for c in nbformat.read(ipynb, as_version=4).cells]
    except Exception as e:  # not JSON, not a notebook
        return f"unreadable .ipynb ({type(e).__name__})"
    want = [cell_key(c) for c in from_source(py).cells]
    for index, (w, h) in enumerate(zip(want, have)):
        if w != h:
            what = "cell type" if w[0] != h[0] else "source" if w[1] != h[1] else "tags"
            return f"cell {index} differs ({what})"
    if len(want) != len(have):
        return f"cell {min(len(want), len(have))}: the .py has {len(want)} cells, the .ipynb {len(have)}"
    return ""


def run_check(sources: list, orphans: bool) -> int:
    """Print every notebook out of sync with its `.py` (and orphaned `.ipynb`s); 1 if any."""
    bad = [f"out of sync: {py.with_suffix('.ipynb').name}: {reason}" for py in sources if (reason := check(py))]
    if orphans:
        bad += [f"orphan: {nb.name} has no .py source" for nb in sorted(NOTEBOOKS.glob("*.ipynb"))
                if not nb.with_suffix(".py").exists()]
    print("\n".join(bad) if bad else f"{len(sources)} notebooks paired")
    return 1 if bad else 0


def sync(py: Path, run: bool, painter: Painter) -> str:
    """Write the `.ipynb` of `py` (executed when `run`, its figures with pictures); return '' or why it
    was not written."""
    nb = from_source(py)
    ipynb = py.with_suffix(".ipynb")
    drawn = 0
    if run:
        try:
            execute(nb, py.parent)
        except Exception as e:  # a failing cell, a dead kernel, a timeout
            return failure(nb, e)
        try:
            drawn = add_pictures(nb, previous_pictures(ipynb), painter)
        except Exception as e:  # no Chromium, kaleido missing or failing
            return (f"a figure could not be drawn as PNG ({type(e).__name__}: {str(e).strip()[:300]}); "
                    "install Chromium (Debian: apt-get install chromium) or set BROWSER_PATH to a Chrome")
    text = nbformat.writes(normalize(nb)) + "\n"
    if ipynb.exists() and ipynb.read_text(encoding="utf-8") == text:
        print(f"unchanged {ipynb.name}")
    else:
        ipynb.write_bytes(text.encode("utf-8"))
        print(f"wrote {ipynb.name}{' (executed' if run else ' (not executed'}"
              f"{f', {drawn} figure(s) drawn' if drawn else ''})")
    return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a pair is out of sync")
    ap.add_argument("--no-execute", action="store_true", help="write the notebooks without running them")
    ap.add_argument("notebooks", nargs="*", help="percent-format notebooks (default: notebooks/*.py)")
    args = ap.parse_args(argv)
    try:
        sources = [resolve_notebook(a) for a in args.notebooks] or sorted(NOTEBOOKS.glob("*.py"))
    except FileNotFoundError as e:
        print(f"nbsync: error: {e}", file=sys.stderr)
        return 2
    if args.check:
        return run_check(sources, orphans=not args.notebooks)
    failed, painter = 0, Painter()
    try:
        for py in sources:
            reason = sync(py, run=not args.no_execute, painter=painter)
            if reason:
                print(f"nbsync: {py.name}: .ipynb not written: {reason}", file=sys.stderr)
                failed += 1
    finally:
        painter.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
