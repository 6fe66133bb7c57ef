#!/usr/bin/env python3
"""`make test` (and `make test-long`): run every part of the test suite, then print how long each took.

    python tools/run_tests.py [--long]

The parts, in order: the notebook/package sync check (the `.ipynb` and `ggml_lite/` are up to date with
`notebooks/*.py`), `pytest tests/`, and the notebooks executed under nbval. Every part runs even when an
earlier one fails, so one run shows everything that is wrong; the exit status is 1 when any part failed.
`--long` runs pytest with `--long` (the random-graph sweeps over many more graphs), then
`benchmarks/differential.py` over 100,000 random graphs against the real ggml, which prints the
mismatch count and the time.
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parts(long: bool) -> list:
    py = sys.executable
    return [
        ("sync check (notebooks -> package, .py -> .ipynb)",
         [[py, "tools/nbexport.py", "--check"], [py, "tools/nbsync.py", "--check"]]),
        ("pytest tests/" + (" --long" if long else ""), [[py, "-m", "pytest", "tests/", *(["--long"] if long else [])]]),
        ("notebooks under nbval", [[py, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "notebooks/"]]),
    ] + ([("differential run: 100,000 random graphs against the real ggml (benchmarks/differential.py)",
           [[py, "benchmarks/differential.py", "--count", "100000", "--progress", "10000"]])] if long else [])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--long", action="store_true", help="the long sweeps (make test-long)")
    args = ap.parse_args(argv)
    rows, t_all = [], time.perf_counter()
    for label, commands in parts(args.long):
        print(f"\n=== {label} ===", flush=True)
        t0, ok = time.perf_counter(), True
        for cmd in commands:
            ok = subprocess.run(cmd, cwd=ROOT).returncode == 0 and ok
        rows.append((label, time.perf_counter() - t0, ok))
    print("\n=== make test: time per part ===")
    for label, seconds, ok in rows:
        print(f"  {'ok  ' if ok else 'FAIL'}  {seconds:7.1f} s  {label}")
    print(f"        {time.perf_counter() - t_all:7.1f} s  in all")
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
