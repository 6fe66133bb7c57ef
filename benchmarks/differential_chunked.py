"""Differential sweep of today's chunked allocator: N random chunked plans by ggml_lite and by the real ggml.

    python benchmarks/differential_chunked.py --count 100000 [--seed 0] [--per-graph 6] [--max-ops 40]
                                              [--stop-after 10] [--progress N]

`make test-long` runs it over 100,000 plans. Graph k is `ggml_oracle.random_graph(seed * 1_000_000 + k)`;
it is mirrored once and planned without a limit (one chunk, also compared with ggml_lite's 2024
allocator; not counted) and at `--per-graph` limits drawn from `random.Random(graph seed)` relative to its
unbounded peak and its largest tensor (`ggml_oracle.chunked_check.draw_max_sizes`: 2 to 16 chunks), on
ggml_lite's `GAllocr2026` and on ggml 0.15.3 through ggml-python. Compared at every limit: every
tensor's (chunk, offset), views included, every chunk's size, the buffer size (ggml_lite's CPU buffers
keep the 2024 padding: ggml's + 32 per chunk) and the ok flags. A mismatch prints the graph seed and the
limit, so that

    import ggml_oracle as O; from ggml_oracle import chunked_check as K
    K.check_chunked_graph(O.random_graph(GRAPH_SEED), max_sizes=[MAX_SIZE])

reproduces it. The summary gives the plans, the histogram of chunk counts, the mismatches and the time;
the exit code is 1 when any plan differs (or could not be made), 0 otherwise.
"""

import argparse
import collections
import resource
import sys
import time
import traceback

import ggml_oracle as O
from ggml_oracle import chunked_check as K


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, required=True, help="how many chunked plans (limits), in all")
    ap.add_argument("--seed", type=int, default=0, help="sweep seed (graph k uses seed*1_000_000 + k)")
    ap.add_argument("--per-graph", type=int, default=6, help="limits per mirrored graph")
    ap.add_argument("--max-ops", type=int, default=40, help="at most this many random ops per graph")
    ap.add_argument("--stop-after", type=int, default=0, help="stop after this many mismatching plans (0: never)")
    ap.add_argument("--show", type=int, default=5, help="differences printed per mismatching plan")
    ap.add_argument("--progress", type=int, default=0, help="a progress line every this many plans (default: 20 lines)")
    args = ap.parse_args(argv)

    if not O.available():
        print(f"ggml-python is not importable: {O.IMPORT_ERROR}", file=sys.stderr)
        return 2
    step = args.progress or max(1, args.count // 20)
    hist: collections.Counter = collections.Counter()
    plans = graphs = bad = errors = unlimited_bad = 0
    next_report = step
    rss0, t0 = _peak_rss_mib(), time.perf_counter()
    k = 0
    while plans < args.count:
        seed = args.seed * 1_000_000 + k
        k += 1
        want = min(args.per_graph, args.count - plans)
        try:
            rg = O.random_graph(seed, max_ops=args.max_ops)
            results = K.check_chunked_graph(rg, want, seed=seed)
        except Exception as err:  # a graph neither side could plan, or a mirror mismatch
            errors += 1
            print(f"graph seed {seed}: ERROR {type(err).__name__}: {err}")
            traceback.print_exc(limit=3)
            continue
        graphs += 1
        unlimited_bad += bool(results[0].diffs)
        bad += sum(1 for r in results[1:] if r.diffs)
        for r in results:
            if r.diffs:
                what = "unlimited" if r is results[0] else f"max_size {r.max_size}"
                print(f"graph seed {seed}, {what}: MISMATCH ({r.n_chunks} chunks) — {rg.describe()}")
                for d in r.diffs[:args.show]:
                    print(f"    {d}")
        for r in results[1:]:
            hist[r.n_chunks] += 1
        plans += len(results) - 1
        if plans >= next_report or plans >= args.count:
            next_report += step
            el = time.perf_counter() - t0
            print(f"[{plans}/{args.count}] {bad} mismatching plan(s), {plans / el:.0f} plans/s, "
                  f"peak RSS {_peak_rss_mib():.0f} MiB", flush=True)
        if args.stop_after and bad + unlimited_bad + errors >= args.stop_after:
            print(f"stopping after {bad + unlimited_bad + errors} mismatching plans")
            break
    el = time.perf_counter() - t0
    counts = " ".join(f"{n}:{hist[n]}" for n in sorted(hist))
    print(f"chunks per plan (count: plans): {counts}")
    print(f"SUMMARY: {plans} chunked plans of {graphs} graphs, {plans - bad} identical, {bad} mismatching "
          f"(+ {graphs} unlimited plans, {unlimited_bad} mismatching), {errors} errors; {el:.1f} s, "
          f"{plans / el:.0f} plans/s; peak RSS {rss0:.0f} -> {_peak_rss_mib():.0f} MiB")
    return 1 if bad or unlimited_bad or errors else 0


if __name__ == "__main__":
    sys.exit(main())
