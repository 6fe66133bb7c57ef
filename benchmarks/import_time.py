#!/usr/bin/env python3
"""How long `import ggml_lite` takes, and what it loads: each import runs in a fresh interpreter, `--runs`
times, and the median wall time is printed beside the interpreter's own start-up (`python -c pass`), with
the count of modules loaded and whether plotly or ipywidgets were among them. `import ggml_lite.viz.timeline`
is timed too: the price of the pictures, paid only by those who draw.

    python benchmarks/import_time.py [--runs 15]
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import json, sys
{statement}
print(json.dumps({{"modules": len(sys.modules),
                  "pictures": sorted({{m.split(".")[0] for m in sys.modules}} & {{"plotly", "ipywidgets"}})}}))
"""


def timed(statement: str, runs: int) -> tuple:
    """(median seconds, what the last run printed) over `runs` fresh interpreters."""
    times, out = [], {}
    for _ in range(runs):
        t0 = time.perf_counter()
        run = subprocess.run([sys.executable, "-c", PROBE.format(statement=statement)], cwd=ROOT,
                             capture_output=True, text=True, check=True)
        times.append(time.perf_counter() - t0)
        out = json.loads(run.stdout)
    return statistics.median(times), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15, help="fresh interpreters per statement (default 15)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    base, _ = timed("pass", args.runs)
    print(f"{'statement':36} {'median':>8} {'minus start-up':>15} {'modules':>8}  pictures loaded")
    for statement in ("pass", "import ggml_lite", "import ggml_lite.viz.timeline"):
        t, out = timed(statement, args.runs)
        print(f"{statement:36} {t * 1e3:6.0f} ms {(t - base) * 1e3:12.0f} ms {out['modules']:8d}  "
              f"{', '.join(out['pictures']) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
