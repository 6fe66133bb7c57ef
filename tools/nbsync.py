#!/usr/bin/env python3
"""Keep every `notebooks/NN_x.ipynb` paired with its `NN_x.py`, the `.py` always being the source.

jupytext's own `--sync` picks the newer file by timestamp and can overwrite the `.py` with a stale
notebook (a fresh clone gives every file the same age). This tool never writes the `.py`:

* sync (default): build the notebook from the `.py`, execute it (kernel = this interpreter), strip
  widget state and machine-specific metadata, and write the `.ipynb`;
* `--check`: the `.ipynb` must hold exactly the cells the `.py` gives (type, source, tags); outputs
  are not compared. Exit 1, naming the first differing cell, when it does not.

Usage: python tools/nbsync.py [--check] [--no-execute] [NOTEBOOK.py ...]   (default: notebooks/*.py)
"""

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parents[1]
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def from_source(py: Path):
    """The notebook that the percent-format `.py` describes, without outputs."""
    nb = jupytext.read(py)
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    for cell in nb.cells:
        cell.metadata = {k: v for k, v in cell.metadata.items() if k == "tags"}
        cell.pop("id", None)
    return nb


def execute(nb, cwd: Path):
    """Run every cell with a kernel of this interpreter (so the project's .venv is used)."""
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    km = KernelManager(kernel_cmd=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"])
    NotebookClient(nb, km=km, timeout=300, resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def normalize(nb):
    """Drop what varies between machines and runs: widget state, timings, cell ids."""
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    for cell in nb.cells:
        cell.metadata = {k: v for k, v in cell.metadata.items() if k == "tags"}
        cell.pop("id", None)
    nb.nbformat, nb.nbformat_minor = 4, 4
    return nb


def cell_key(cell):
    return cell.cell_type, cell.source, list(cell.get("metadata", {}).get("tags", []))


def check(py: Path) -> str:
    """'' when `py`'s notebook is in sync, else the reason."""
    ipynb = py.with_suffix(".ipynb")
    if not ipynb.exists():
        return "no .ipynb (run `make sync`)"
    want = [cell_key(c) for c in from_source(py).cells]
    have = [cell_key(c) for c in nbformat.read(ipynb, as_version=4).cells]
    for i, (w, h) in enumerate(zip(want, have)):
        if w != h:
            what = "type" if w[0] != h[0] else "source" if w[1] != h[1] else "tags"
            return f"cell {i} differs ({what})"
    if len(want) != len(have):
        return f"{len(have)} cells in the .ipynb, {len(want)} in the .py"
    return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a pair is out of sync")
    ap.add_argument("--no-execute", action="store_true", help="write the notebooks without running them")
    ap.add_argument("notebooks", nargs="*", type=Path)
    args = ap.parse_args(argv)
    folder = ROOT / "notebooks"
    sources = [p.resolve() for p in args.notebooks] or sorted(folder.glob("*.py"))
    bad = []
    if args.check:
        for py in sources:
            reason = check(py)
            if reason:
                bad.append(f"out of sync: {py.name}: {reason}")
        if not args.notebooks:
            bad += [f"orphan: {nb.name} has no .py source" for nb in sorted(folder.glob("*.ipynb"))
                    if not nb.with_suffix(".py").exists()]
        print("\n".join(bad) if bad else f"nbsync: {len(sources)} notebooks paired")
        return 1 if bad else 0
    for py in sources:
        nb = from_source(py)
        if not args.no_execute:
            try:
                execute(nb, py.parent)
            except Exception as e:  # a failing cell: report it and leave the old .ipynb alone
                bad.append(f"{py.name}: execution failed: {str(e).strip().splitlines()[-1] if str(e).strip() else e!r}")
                continue
        nbformat.write(normalize(nb), py.with_suffix(".ipynb"))
        print(f"wrote {py.with_suffix('.ipynb').name}{'' if args.no_execute else ' (executed)'}")
    for line in bad:
        print(line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
