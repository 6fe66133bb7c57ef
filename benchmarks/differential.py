"""Differential sweep: N random graphs planned by ggml_lite and by the real ggml (ggml-python).

    python benchmarks/differential.py --count 2000 [--seed 0] [--max-ops 40] [--stop-after 10] [--progress N]

`make test-long` runs it over 100,000 graphs.

Graph k is `ggml_oracle.random_graph(seed * 1_000_000 + k)`; a mismatch prints that graph seed, the
tensor and both offsets (and the buffer sizes when they differ), so that

    import ggml_oracle as O; rg = O.random_graph(GRAPH_SEED); print(rg.source())

reproduces it. The last line is a summary with counts and graphs per second; the exit code is 1
when any graph differs (or could not be planned), 0 otherwise. Buffer sizes are compared after the
documented difference: ggml-python's CPU buffer reports 32 bytes less than the reference C and
ggml_lite (see the ggml_oracle package, oracle/). Also printed: the process's resident memory, so that a leak
in the oracle would show over long runs.
"""

import argparse
import resource
import sys
import time
import traceback
from pathlib import Path

import ggml_oracle as O


def _rss_mib() -> float:
    """The resident memory now (Linux /proc), else the peak."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * resource.getpagesize() / 2**20
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, required=True, help="how many random graphs")
    ap.add_argument("--seed", type=int, default=0, help="sweep seed (graph k uses seed*1_000_000 + k)")
    ap.add_argument("--max-ops", type=int, default=40, help="at most this many random ops per graph")
    ap.add_argument("--stop-after", type=int, default=0, help="stop after this many mismatching graphs (0: never)")
    ap.add_argument("--show", type=int, default=5, help="differences printed per mismatching graph")
    ap.add_argument("--progress", type=int, default=0,
                    help="a progress line every this many graphs (default: 20 lines)")
    args = ap.parse_args(argv)

    if not O.available():
        print(f"ggml-python is not importable: {O.IMPORT_ERROR}", file=sys.stderr)
        return 2
    O.apply_ctypes_fixes()

    step = args.progress or max(1, args.count // 20)
    bad_graphs = bad_tensors = bad_sizes = errors = nodes = 0
    rss0 = _rss_mib()
    t0 = time.perf_counter()
    done = 0
    for k in range(args.count):
        seed = args.seed * 1_000_000 + k
        try:
            rg = O.random_graph(seed, max_ops=args.max_ops)
            nodes += rg.graph.n_nodes
            diffs = O.check_random_graph(rg)
        except Exception as err:  # a graph neither side could plan, or a mirror mismatch
            errors += 1
            bad_graphs += 1
            print(f"graph seed {seed}: ERROR {type(err).__name__}: {err}")
            traceback.print_exc(limit=3)
            diffs = []
        if diffs:
            bad_graphs += 1
            bad_tensors += sum(1 for d in diffs if d.tensor is not None)
            bad_sizes += sum(1 for d in diffs if d.what.startswith("buffer size"))
            print(f"graph seed {seed}: MISMATCH — {rg.describe()}")
            for d in diffs[:args.show]:
                print(f"    {d}")
            if len(diffs) > args.show:
                print(f"    ... and {len(diffs) - args.show} more")
        done = k + 1
        if done % step == 0 or done == args.count:
            el = time.perf_counter() - t0
            print(f"[{done}/{args.count}] {bad_graphs} mismatching graph(s), {done / el:.0f} graphs/s, "
                  f"RSS {_rss_mib():.0f} MiB", flush=True)
        if args.stop_after and bad_graphs >= args.stop_after:
            print(f"stopping after {bad_graphs} mismatching graphs")
            break
    el = time.perf_counter() - t0
    print(f"SUMMARY: {done} graphs ({nodes} nodes), {done - bad_graphs} identical, {bad_graphs} mismatching "
          f"({bad_tensors} tensor offsets, {bad_sizes} buffer sizes, {errors} errors); {el:.1f} s, "
          f"{done / el:.0f} graphs/s; RSS {rss0:.0f} -> {_rss_mib():.0f} MiB")
    return 1 if bad_graphs else 0


if __name__ == "__main__":
    sys.exit(main())
