"""Plan quality of the offline planners (chapter 11) on the recorded fixtures, on random graphs, and on
problems whose optimum is known (appendix A6's `problem_gen`), beside the `omnimalloc` package's allocators.

    python benchmarks/planners.py [--count 300] [--seed 0] [--max-ops 40] [--budget 1.0] [--max-gib 16]
                                  [--sizes 50,150,300,450,1000] [--seeds 3] [--known-budget 5.0]
                                  [--only graphs|known]

Every graph is planned by ggml (its own plan, re-expressed as offsets of the blocks), greedy by size,
greedy by breadth, the exact search (at most --budget seconds) and best (`planners.all_plans`). Printed
per planner: the ratio of its peak to the peak-live lower bound (geometric mean and max), how often it
reaches the lower bound, and the planning time per graph (mean and max); then how often greedy by size
is worse than ggml, how often best is better than ggml, and the slowest exact search.

Every plan is verified by computing (`verify.verify_plans`: the graph computed in the plan on the CPU
backend, bit for bit against the graph computed with every tensor in memory of its own); identical plans
of one graph are computed once. The 7B fixtures (13, 14) need about 13.2 GiB and some minutes each to
verify: with --max-gib below that, they are planned and reported unverified. Random graph k is
`ggml_oracle.random_graph(seed * 1_000_000 + k)` (the differential generator) with the tensors the
caller fills flagged INPUT (ggml's contract for data set before computing). Graphs the CPU kernels
refuse to compute (a unary op on a permuted tensor, ...) are skipped and counted, until --count graphs
that compute were planned, so that every plan of the sweep is verified by the CPU kernels; their plans
are verified by the data-flow run instead (`compute="dataflow"`: each node writes a digest of the bytes
it reads), as are those of the fixtures the kernels refuse (09, 10: random DAGs recorded for planning).

Problems with a known optimum (`--only known` runs just these): for each size of `--sizes` and each seed
below `--seeds`, `problem_gen.perfect_problem` (a rectangle cut like a guillotine) and
`challenging_problem` (laid like a brick wall, many blocks alive at once), whose optimum is their capacity.
Each planner gets `--known-budget` seconds and the capacity, as `solve --capacity` gives it; printed per
kind, size and planner: how often it reaches the optimum, its peak's ratio to it (mean and max), and its
time. Where the `omnimalloc` package is installed (`pip install ggml_lite[bench]`), its `greedy_by_size`,
`telamalloc` and `supermalloc` (timeout `--known-budget`; they minimise the peak, no capacity) plan the same
problems, side by side. Every placement, ours and theirs, is checked (`planners.check_placement`).

The script prints figures and never asserts on time. Exit code 1 when a plan fails verification, a
placement is invalid, or best is worse than ggml, else 0.
"""

import argparse
import gc
import math
import sys
import time
from pathlib import Path

import ggml_lite as gl
import ggml_oracle as O
from ggml_lite import planners, problem_gen, verify

ROOT = Path(__file__).resolve().parents[1]

NAMES = ("ggml", "greedy-size", "greedy-breadth", "exact", "best")
NOT_COMPUTABLE = (gl.TensorError, gl.UnsupportedOpError)


def random_graph(seed: int, max_ops: int):
    """The random graph of `seed` with every tensor the caller fills flagged INPUT."""
    rg = O.random_graph(seed, max_ops=max_ops)
    for t in verify.data_tensors(rg.graph):
        if t.data is None:
            gl.set_input(t)
    return rg.graph


def fixture_graphs():
    """(label, build) for every recorded graph: each single-graph fixture, each step of a sequence."""
    import json

    for path in sorted((ROOT / "tests" / "fixtures" / "ggml-seed").glob("*.json")):
        doc = json.loads(path.read_text())
        for step in [i for i, s in enumerate(doc.get("steps", [])) if "graph" in s] or [None]:
            def build(path=path, step=step):
                gf = gl.read_graph_file(path, step)
                gl.graphio.allocate_external(gf)
                return gf.graph
            yield path.stem + ("" if step is None else f" step {step}"), build


class Tally:
    """Per planner: ratios to the lower bound, hits, times; and the verification counts."""

    def __init__(self):
        self.ratio = {n: [] for n in NAMES}
        self.hits = {n: 0 for n in NAMES}
        self.time = {n: [] for n in NAMES}
        self.blocks_time = []
        self.graphs = self.size_worse = self.best_better = self.best_worse = 0
        self.searches = self.searches_done = self.searches_lb = 0
        self.verified = self.dataflow = self.failures = 0
        self.unverified = []
        self.slowest = (0.0, None, None, 0)  # seconds, label, result, blocks

    def add(self, label: str, problem, plans: dict) -> None:
        self.graphs += 1
        for n in NAMES:
            r = plans[n]
            self.ratio[n].append(r.peak / r.lower_bound if r.lower_bound else 1.0)
            self.hits[n] += r.peak == r.lower_bound
            self.time[n].append(r.seconds)
        self.size_worse += plans["greedy-size"].peak > plans["ggml"].peak
        self.best_better += plans["best"].peak < plans["ggml"].peak
        self.best_worse += plans["best"].peak > plans["ggml"].peak
        ran = min(plans[n].peak for n in ("ggml", "greedy-size", "greedy-breadth")) > problem.lower_bound
        self.searches += ran
        self.searches_done += ran and plans["exact"].optimal is True
        self.searches_lb += ran and plans["exact"].peak == problem.lower_bound
        if plans["exact"].seconds > self.slowest[0]:
            self.slowest = (plans["exact"].seconds, label, plans["exact"], len(problem.blocks))


def verify_all(label: str, problem, plans: dict, tally: Tally, max_bytes: int, compute: str = "cpu") -> None:
    """Verify every plan of one graph (`verify_plans` on the graph the problem was made from: it checks
    each placement, then computes each distinct one); a graph the kernels refuse, or one that needs more
    than `max_bytes`, raises (the caller counts it as not verified)."""
    t0 = time.perf_counter()
    checks = verify.verify_plans(problem.graph, [plans[n] for n in NAMES], problem, max_bytes=max_bytes,
                                   compute=compute)
    seconds = time.perf_counter() - t0
    for n, v in zip(NAMES, checks):
        if not v.ok:
            print(f"  {label}: the {n} plan FAILED verification: {v.conflicts[:1] or v.differing or v.error}")
        if compute == "cpu":
            tally.verified += v.ok
        else:
            tally.dataflow += v.ok
        tally.failures += not v.ok
    if seconds > 10:
        distinct = len({id(v) for v in checks})
        print(f"  {label}: {len(checks)} plans verified by computing ({distinct} distinct placements) "
              f"in {seconds:.0f} s")


def report(title: str, tally: Tally) -> None:
    print(f"\n{title}: {tally.graphs} graphs")
    print(f"  {'planner':15s} {'ratio to LB: geo-mean':>21s} {'max':>7s} {'at LB':>14s} "
          f"{'time/graph: mean':>17s} {'max':>9s}")
    for n in NAMES:
        rs = tally.ratio[n]
        geo = math.exp(sum(map(math.log, rs)) / len(rs))
        ts = tally.time[n]
        print(f"  {n:15s} {geo:21.4f} {max(rs):7.4f} {tally.hits[n]:6d} ({100 * tally.hits[n] / len(rs):5.1f} %)"
              f" {1e3 * sum(ts) / len(ts):14.2f} ms {1e3 * max(ts):6.1f} ms")
    bt = tally.blocks_time
    print(f"  blocks from ggml's trace (blocks_of): mean {1e3 * sum(bt) / len(bt):.2f} ms, max {1e3 * max(bt):.1f} ms")
    print(f"  greedy-size worse than ggml: {tally.size_worse} graphs; best better than ggml: {tally.best_better}, "
          f"worse: {tally.best_worse}")
    print(f"  exact searches run (no plan at the lower bound before them): {tally.searches}, "
          f"finished: {tally.searches_done}, reached the lower bound: {tally.searches_lb}")
    sec, label, r, nblocks = tally.slowest
    if label is not None:
        print(f"  slowest exact search: {label} ({nblocks} blocks): {1e3 * sec:.1f} ms, {r.nodes} steps, "
              f"{'finished (optimal proven)' if r.optimal else 'out of time (its best plan returned)'}")
    flow = f", by the data-flow run (the CPU kernels refuse the graph): {tally.dataflow}" if tally.dataflow else ""
    print(f"  plans verified by computing on the CPU backend: {tally.verified}{flow}; failures: {tally.failures}")
    for what in tally.unverified:
        print(f"  not verified: {what}")


KNOWN_PLANNERS = ("greedy-size", "greedy-breadth", "exact", "best")
OMNIMALLOC = ("greedy_by_size", "telamalloc", "supermalloc")


def ours(problem, name: str, budget: float, capacity: int) -> tuple:
    """(offsets, seconds) of our planner `name`, given the capacity (as `solve --capacity`)."""
    t0 = time.perf_counter()
    r = planners.run_planner(problem, name, budget, capacity=capacity)
    return list(r.offsets), time.perf_counter() - t0


def theirs(rows, name: str, budget: float) -> tuple:
    """(offsets, seconds) of omnimalloc's allocator `name` on the same rows (its time includes building them)."""
    import omnimalloc as om

    make = {"greedy_by_size": lambda: om.allocators.GreedyBySizeAllocator(),
            "telamalloc": lambda: om.allocators.TelamallocAllocator(timeout=budget),
            "supermalloc": lambda: om.allocators.SupermallocAllocator(timeout=budget)}[name]
    t0 = time.perf_counter()
    placed = om.allocate([om.Allocation(k, size, lo, up) for k, (_, lo, up, size) in enumerate(rows)], make())
    seconds = time.perf_counter() - t0
    offsets = [0] * len(rows)
    for a in placed:
        assert isinstance(a.id, int) and a.offset is not None  # (ours, as given; and placed)
        offsets[a.id] = a.offset
    return offsets, seconds


def known_optimum(sizes: list, seeds: int, budget: float) -> int:
    """The table of the problems with a known optimum; returns the count of invalid placements."""
    try:
        import omnimalloc as om
        names = [*KNOWN_PLANNERS, *(f"omnimalloc:{n}" for n in OMNIMALLOC)]
        note = f"omnimalloc {om.__version__} beside ours ({om.max_threads()} threads; ours: one)"
    except ImportError:
        names, note = list(KNOWN_PLANNERS), "omnimalloc is not installed (pip install ggml_lite[bench]): ours only"
    print(f"\nproblems with a known optimum (appendix A6's problem_gen; seeds 0..{seeds - 1} per size; "
          f"{budget:g} s per planner call)\n  {note}")
    print(f"  {'kind':12s} {'blocks':>6s}  {'planner':25s} {'at optimum':>10s} {'ratio: mean':>12s} {'max':>7s} "
          f"{'time: mean':>11s} {'max':>7s}")
    invalid = 0
    for kind, make in (("guillotine", problem_gen.perfect_problem), ("wall", problem_gen.challenging_problem)):
        for n in sizes:
            runs: dict = {name: [] for name in names}  # name -> [(ratio, seconds)]
            for seed in range(seeds):
                rows, capacity = make(n, seed)
                problem = planners.problem_from_intervals(rows, alignment=1)
                assert problem.lower_bound == capacity  # (by construction; not a timing)
                for name in names:
                    offsets, seconds = (theirs(rows, name.split(":")[1], budget) if name.startswith("omnimalloc:")
                                        else ours(problem, name, budget, capacity))
                    bad = planners.check_placement(problem, offsets)
                    if bad:
                        invalid += 1
                        print(f"  {kind} {n} seed {seed}: the {name} placement is INVALID: {bad[0]}")
                    runs[name].append((planners.peak_of(problem, offsets) / capacity, seconds))
            for name in names:
                ratios, times = [r for r, _ in runs[name]], [t for _, t in runs[name]]
                hits = sum(r == 1.0 for r in ratios)
                print(f"  {kind:12s} {n:6d}  {name:25s} {f'{hits}/{len(ratios)}':>10s} "
                      f"{sum(ratios) / len(ratios):12.4f} {max(ratios):7.4f} {sum(times) / len(times):9.2f} s "
                      f"{max(times):5.2f} s")
    return invalid


def sizes_list(text: str) -> list:
    """An argparse type: block counts separated by commas, each at least 1."""
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text}: give block counts separated by commas, e.g. 50,150")
    return sizes


def positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text}: give at least 1")
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=positive, default=300, help="random graphs that compute (default 300)")
    ap.add_argument("--seed", type=int, default=0, help="sweep seed (graph k uses seed*1_000_000 + k)")
    ap.add_argument("--max-ops", type=int, default=40, help="at most this many random ops per graph")
    ap.add_argument("--budget", type=float, default=planners.DEFAULT_BUDGET, help="seconds for each exact search")
    ap.add_argument("--max-gib", type=float, default=16.0,
                    help="memory verifying one graph may use (default 16; the 7B fixtures need about 13.2)")
    ap.add_argument("--sizes", type=sizes_list, default=[50, 150, 300, 450, 1000],
                    help="block counts of the problems with a known optimum (default 50,150,300,450,1000)")
    ap.add_argument("--seeds", type=positive, default=3, help="problems of each kind and size (default 3)")
    ap.add_argument("--known-budget", type=float, default=5.0,
                    help="seconds for each planner call on a problem with a known optimum (default 5)")
    ap.add_argument("--only", choices=("graphs", "known"), default=None,
                    help="run only the graphs (fixtures and random) or only the problems with a known optimum")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    if args.only == "known":
        invalid = known_optimum(args.sizes, args.seeds, args.known_budget)
        print(f"\n{time.perf_counter() - t_start:.1f} s in all")
        return 1 if invalid else 0
    max_bytes = int(args.max_gib * 2**30)

    fixtures = Tally()
    for label, build in fixture_graphs():
        t0 = time.perf_counter()
        problem = planners.blocks_of(build())
        fixtures.blocks_time.append(time.perf_counter() - t0)
        plans = planners.all_plans(problem, args.budget)
        fixtures.add(label, problem, plans)
        try:
            verify_all(label, problem, plans, fixtures, max_bytes)
        except NOT_COMPUTABLE as err:
            print(f"  {label}: the CPU kernels refuse it ({type(err).__name__}): verified by the data-flow run")
            verify_all(label, problem, plans, fixtures, max_bytes, compute="dataflow")
        except gl.AllocationError as err:
            fixtures.unverified.append(f"{label}: {err} (--max-gib)")
        del problem, plans
        gc.collect()  # a 7B graph's 12.8 GiB of weights must be gone before the next one is filled
    report("recorded fixtures (tests/fixtures/ggml-seed, each step of a sequence)", fixtures)

    rand, refused = Tally(), Tally()  # refused: planned only (the kernels refuse to compute them)
    skipped, k = 0, 0
    while rand.graphs < args.count:
        seed = args.seed * 1_000_000 + k
        k += 1
        t0 = time.perf_counter()
        problem = planners.blocks_of(random_graph(seed, args.max_ops))
        blocks_time = time.perf_counter() - t0
        plans = planners.all_plans(problem, args.budget)
        before = (rand.verified, rand.failures)
        try:
            verify_all(f"graph seed {seed}", problem, plans, rand, max_bytes)
        except NOT_COMPUTABLE:
            rand.verified, rand.failures = before
            skipped += 1
            refused.add(f"graph seed {seed}", problem, plans)
            verify_all(f"graph seed {seed}", problem, plans, refused, max_bytes, compute="dataflow")
            continue
        rand.blocks_time.append(blocks_time)
        rand.add(f"graph seed {seed}", problem, plans)
    first = args.seed * 1_000_000
    report(f"random graphs (ggml_oracle.random_graph of seeds {first}..{first + k - 1}, at most {args.max_ops} ops;\n"
           f"  {skipped} skipped because the CPU kernels refuse them)", rand)
    if refused.graphs:
        print(f"  the {refused.graphs} skipped graphs: best at the lower bound on {refused.hits['best']} "
              f"({100 * refused.hits['best'] / refused.graphs:.1f} %), better than ggml on {refused.best_better}, "
              f"worse on {refused.best_worse}; greedy-size worse than ggml on {refused.size_worse};\n"
              f"  their plans verified by the data-flow run: {refused.dataflow}, failures: {refused.failures}")
    invalid = 0 if args.only == "graphs" else known_optimum(args.sizes, args.seeds, args.known_budget)
    print(f"\n{time.perf_counter() - t_start:.1f} s in all (exact search budget {args.budget} s)")
    bad = (fixtures.failures + rand.failures + refused.failures
           + fixtures.best_worse + rand.best_worse + refused.best_worse + invalid)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
