#!/usr/bin/env python3
"""`make test` (and `make test-long`): run every part of the test suite, then print how long each took.

    python tools/run_tests.py [--long]

The parts, in order: the static checks (`make lint`: ruff and mypy, whose files and rules pyproject.toml sets), the
notebook/package sync check (the `.ipynb` and `ggml_lite/` are up to date with `notebooks/*.py`), `pytest
tests/` (without tests/ui), the notebooks executed under nbval, and the browser test `tests/ui` (every
notebook run in JupyterLab under headless Chromium). The browser test needs a Chromium (Debian's
`chromium`, or `$CHROMIUM`) and the `playwright` package; without them it is skipped, and the summary says
so, unless `GGML_LITE_REQUIRE_BROWSER=1` (set by `.ci/run`), which makes it fail. pytest, nbval and the
browser test each run in two processes (pytest-xdist). Then the book (`tests/ui/test_book.py`): `make book` builds
the site from the committed notebooks (its time is printed), and headless Chromium opens every page from a
local server: no console error, no request off 127.0.0.1, every figure drawn, the search and every link checked;
without a Chromium only its build is tested, as the browser test skips (or fails under the same variable).
Every part runs even when an earlier one fails, so
one run shows everything that is wrong; the exit status is 1 when any part failed.
`--long` runs pytest with `--long` (the random-graph sweeps over many more graphs), then
`benchmarks/differential.py` over 100,000 random graphs against the real ggml, which prints the
mismatch count and the time, then `benchmarks/differential_chunked.py` over 100,000 random chunked plans
(today's allocator on buffer types with a `max_size`, 2 to 16 chunks) against ggml 0.15.3, which prints
the same and the histogram of chunk counts.
"""

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# pytest-xdist: two processes, the cores CI has (nbval keeps a notebook's cells in one: --dist loadfile).
WORKERS = ["-n", "2"]
BROWSER = "browser test: notebooks in JupyterLab under headless Chromium (tests/ui)"
BOOK = "book: `make book`, then every page of the site in headless Chromium (tests/ui/test_book.py)"


def browser_missing() -> str:
    """'' when the browser test can run here, else what is missing."""
    spec = importlib.util.spec_from_file_location("ui_lab", ROOT / "tests" / "ui" / "lab.py")
    assert spec is not None and spec.loader is not None, "tests/ui/lab.py is missing"
    lab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab)
    if lab.find_chromium() is None:
        return "no Chromium (Debian: apt-get install chromium; or set CHROMIUM to a Chromium binary)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (make setup installs it)"
    return ""


def parts(long: bool) -> list:
    py = sys.executable
    return [
        ("lint (ruff, mypy)", [[py, "-m", "ruff", "check"], [py, "-m", "mypy"]]),
        ("sync check (notebooks -> package, .py -> .ipynb)",
         [[py, "tools/nbexport.py", "--check"], [py, "tools/nbsync.py", "--check"]]),
        ("pytest tests/" + (" --long" if long else ""),
         [[py, "-m", "pytest", "tests/", "--ignore=tests/ui", *WORKERS, *(["--long"] if long else [])]]),
        ("notebooks under nbval",
         [[py, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "notebooks/", *WORKERS, "--dist", "loadfile"]]),
        (BROWSER, [[py, "-m", "pytest", "tests/ui", "-q", "--ignore=tests/ui/test_book.py", *WORKERS]]),
        (BOOK, [[py, "-m", "pytest", "tests/ui/test_book.py", "-q"]]),  # builds once, then reads every page
    ] + ([("differential run: 100,000 random graphs against the real ggml (benchmarks/differential.py)",
           [[py, "benchmarks/differential.py", "--count", "100000", "--progress", "10000"]]),
          ("differential run: 100,000 random chunked plans against the real ggml (benchmarks/differential_chunked.py)",
           [[py, "benchmarks/differential_chunked.py", "--count", "100000", "--progress", "10000"]])] if long else [])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--long", action="store_true", help="the long sweeps (make test-long)")
    args = ap.parse_args(argv)
    rows, t_all = [], time.perf_counter()
    # The exercises' progress record (ggml_lite.exercises) of every notebook and test run goes to a temporary
    # file: running the course's solutions must not mark the learner's own exercises done.
    progress = tempfile.TemporaryDirectory(prefix="ggml_lite-progress-")
    env = {**os.environ, "GGML_LITE_PROGRESS": os.path.join(progress.name, "progress.json")}
    for label, commands in parts(args.long):
        print(f"\n=== {label} ===", flush=True)
        t0, ok = time.perf_counter(), True
        if label == BROWSER and (missing := browser_missing()):
            required = os.environ.get("GGML_LITE_REQUIRE_BROWSER") == "1"
            print(f"{'FAILED' if required else 'SKIPPED'}: {missing}"
                  + (" (GGML_LITE_REQUIRE_BROWSER=1)" if required else ""), flush=True)
            rows.append((label, 0.0, "FAIL" if required else "SKIP"))
            continue
        for cmd in commands:
            ok = subprocess.run(cmd, cwd=ROOT, env=env).returncode == 0 and ok
        rows.append((label, time.perf_counter() - t0, "ok  " if ok else "FAIL"))
    print("\n=== make test: time per part ===")
    for label, seconds, status in rows:
        print(f"  {status}  {seconds:7.1f} s  {label}")
    print(f"        {time.perf_counter() - t_all:7.1f} s  in all")
    skipped = [label for label, _, status in rows if status == "SKIP"]
    if skipped:
        print(f"  NOTE: skipped: {'; '.join(skipped)}: {browser_missing()}")
    return 0 if all(status != "FAIL" for *_, status in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
