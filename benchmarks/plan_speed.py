"""How fast ggml_lite plans compared with the real ggml, and how tight the plans are.

    python benchmarks/plan_speed.py [--repeat 25]

Part 1 — planning time, for fixture 07 (07_llama4_kvcache, 138 nodes) and fixture 13
(13_llama7b_ctx512_all_outputs, 1,062 nodes). Medians over `--repeat` runs of CPU time (`time.process_time`), in µs:

* ggml_lite `GAllocr(...)` + `reserve(gf)` (a new allocator, like the C "fresh" column), and
  `GAllocr.alloc_graph(gf)` right after it (the plan is kept, so this is the needs-realloc check plus
  placing every tensor). `alloc_graph` gives tensors their `data`, and a second call on the same
  tensors would find them placed and do almost nothing, so every repeat plans a fresh graph: the
  fixture is loaded again (and its weights and KV cache allocated) outside the timed region. The
  timed region runs with Python's cyclic garbage collector off, as `timeit` does by default: its
  pauses depend on everything else the process holds (here, the fixtures loaded so far), not on the
  planner. Each repeat starts with `gc.collect()`, and the collector is on again after it.
* ggml (C, through ggml-python) on the same graph, mirrored by ggml_oracle outside the timed
  region: `ggml_gallocr_reserve` repeated on one allocator, "fresh" (`ggml_gallocr_new` + reserve; the
  free is not timed), and `ggml_gallocr_alloc_graph` after a reserve, on freshly mirrored tensors each
  time. The ratio column is ggml_lite / C (reserve against C fresh, alloc_graph against alloc_graph).
  The C numbers include one ctypes call (about a microsecond).

Part 2 — plan quality, for every single-graph fixture (01-10, 13, 14): the compute buffer size (as
the reference and ggml_lite report it: the allocator's peak + 32) over a peak-live lower bound.

The peak-live lower bound, precisely. Steps are the node indices 0..N-1 (execution order).
* The tensors counted are those the graph allocator must place in the compute buffer: every node,
  leaf or node source that is not a view (`view_src is None`) and has no memory before planning
  (weights and the KV cache are pre-allocated elsewhere). Each counts `GGML_PAD(nbytes, 32)` bytes, the
  block the allocator gives it.
* Birth `a(t)`: 0 for a leaf or an INPUT tensor (the user fills them before the graph runs, and the
  allocator places them first); otherwise the index of the node `t`.
* Death `d(t)`: N (past the end) when `t` is an OUTPUT, or when a view of `t` is an OUTPUT (the view
  reads `t`'s memory after the graph ran); otherwise the largest index of a node that reads `t` —
  that has `t` as a source, has as a source a view of `t`, or is itself a view of `t`. A tensor nobody
  reads has `d(t) = a(t)`.
* `t` is live at step `s` when `a(t) <= s < d(t)`: it was allocated at or before step `s` and is still
  needed after it. The end is exclusive on purpose: a tensor read for the last time at step `s` may
  give its memory to the result of step `s` (in-place reuse), so it does not have to coexist with it.
* The lower bound is the maximum over steps of the summed sizes of the live tensors. Any allocator
  that keeps disjoint blocks for tensors that are needed at the same time needs at least that much.
  ggml's allocator holds every live tensor of step `s` right after it placed node `s` — with one
  exception: it does not keep the source of an OUTPUT view (a non-OUTPUT tensor is freed after the
  last user of its views, see tests/differential/test_differential.py::
  test_an_output_view_does_not_keep_its_source_alive), so only a graph with such a view can show a
  ratio below 1 (none of the fixtures has one; 7 of the first 3,000 random graphs of
  ggml_oracle do, and they are exactly the ones whose peak is below this bound).
The ratio printed is buffer size / bound (peak / bound in the last column, without the CPU buffer's
32 bytes).
"""

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import ggml_lite as gl
import ggml_oracle as O
from ggml_lite.graphio import allocate_external

ROOT = Path(__file__).resolve().parents[1]

FIXTURES = ROOT / "tests" / "fixtures" / "ggml-seed"
TIMED = ["07_llama4_kvcache", "13_llama7b_ctx512_all_outputs"]
SINGLE = ["01_mlp_small", "02_elementwise_inplace", "03_views_layout", "04_outputs_middle", "05_inputs_flagged",
          "06_llama_block", "07_llama4_kvcache", "08_random_dag_chain_s1234", "09_random_dag_wide_s42",
          "10_random_dag_wide_s7", "13_llama7b_ctx512_all_outputs", "14_llama7b_ctx512_one_output"]


def load(name):
    """A freshly loaded fixture with its external contexts allocated (ggml_lite), and its roots and
    pre-allocated contexts for the oracle."""
    gf = gl.read_graph_file(FIXTURES / f"{name}.json")
    allocate_external(gf)
    labels = [e["ctx"] for e in gf.doc.get("external_buffers", [])]
    pre = [gf.contexts[label] for label in labels if label in gf.contexts]
    roots = [gf.tensors[i] for i in gf.expand_roots]
    return gf, roots, pre


# CPU time of this process, not wall time: these machines are shared, and a neighbour's load or a
# descheduled moment would count in wall time. (Resolution: about a microsecond on Linux.)
cpu_clock = time.process_time


def median_us(samples) -> float:
    return statistics.median(samples) * 1e6


def time_lite(name, repeat, collect_garbage=False):
    reserve, alloc = [], []
    for _ in range(repeat):
        gf, _, _ = load(name)  # fresh tensors: not timed
        gc.collect()
        if not collect_garbage:
            gc.disable()  # timeit's convention: the collector's pauses depend on the whole heap
        try:
            t0 = cpu_clock()
            galloc = gl.GAllocr(gl.cpu_buffer_type())  # like ggml_gallocr_new in the C "fresh" column
            ok = galloc.reserve(gf.graph)
            t1 = cpu_clock()
            ok = galloc.alloc_graph(gf.graph) and ok
            t2 = cpu_clock()
        finally:
            gc.enable()
        assert ok, name
        reserve.append(t1 - t0)
        alloc.append(t2 - t1)
        galloc.free()
        del galloc, gf  # torn down here, not inside the next repeat's timed region
    return median_us(reserve), median_us(alloc)


def time_c(name, repeat):
    g = O.need_ggml()
    buft = g.ggml_backend_cpu_buffer_type()
    gf, roots, pre = load(name)  # the ggml_lite side is only the blueprint here

    # reserve, repeated on one allocator; and fresh allocators
    same, fresh = [], []
    with O.mirror(gf.graph, roots, pre) as m:
        galloc = g.ggml_gallocr_new(buft)
        g.ggml_gallocr_reserve(galloc, m.gf)  # the first call allocates the buffer: not counted
        for _ in range(repeat):
            t0 = cpu_clock()
            g.ggml_gallocr_reserve(galloc, m.gf)
            same.append(cpu_clock() - t0)
        g.ggml_gallocr_free(galloc)
        for _ in range(repeat):
            t0 = cpu_clock()
            galloc = g.ggml_gallocr_new(buft)
            g.ggml_gallocr_reserve(galloc, m.gf)
            fresh.append(cpu_clock() - t0)
            g.ggml_gallocr_free(galloc)

    # alloc_graph after reserve, on fresh tensors each time
    alloc = []
    for _ in range(repeat):
        with O.mirror(gf.graph, roots, pre, check=False) as m:
            galloc = g.ggml_gallocr_new(buft)
            g.ggml_gallocr_reserve(galloc, m.gf)
            t0 = cpu_clock()
            ok = g.ggml_gallocr_alloc_graph(galloc, m.gf)
            alloc.append(cpu_clock() - t0)
            g.ggml_gallocr_free(galloc)
            assert ok, name
    return median_us(same), median_us(fresh), median_us(alloc)


def peak_live_bound(graph):
    """(bound in bytes, step of the peak) — see the module docstring for the definition."""
    nodes, leafs = graph.nodes, graph.leafs
    n = len(nodes)
    index = {t: i for i, t in enumerate(nodes)}
    leaf_set = set(leafs)
    counted = {}
    for t in (*leafs, *nodes, *(s for node in nodes for s in node.src if s is not None)):
        if t.view_src is None and t.data is None and t not in counted:
            counted[t] = gl.GGML_PAD(gl.nbytes(t), O.ALIGNMENT)
    death = {t: -1 for t in counted}

    def read(t, step):
        root = t.view_src if t.view_src is not None else t
        if root in death and step > death[root]:
            death[root] = step

    for i, node in enumerate(nodes):
        for s in node.src:
            if s is not None:
                read(s, i)
        if node.view_src is not None:
            read(node, i)
    for t in (*nodes, *leafs):
        if t.flags & gl.TensorFlag.OUTPUT:
            root = t.view_src if t.view_src is not None else t
            if root in death:
                death[root] = n
    delta = [0] * (n + 1)
    for t, size in counted.items():
        born = 0 if (t in leaf_set or t.flags & gl.TensorFlag.INPUT or t not in index) else index[t]
        dies = max(death[t], born)
        if born < dies:  # live at steps born .. dies-1
            delta[born] += size
            delta[min(dies, n)] -= size
    best, at, cur = 0, 0, 0
    for s in range(n):
        cur += delta[s]
        if cur > best:
            best, at = cur, s
    return best, at


def quality(name):
    gf, _, _ = load(name)
    bound, at = peak_live_bound(gf.graph)  # before planning: `data is None` marks what gallocr places
    galloc = gl.GAllocr(gl.cpu_buffer_type())
    assert galloc.reserve(gf.graph) and galloc.alloc_graph(gf.graph)
    size = galloc.get_buffer_size(0)
    galloc.free()
    return gf.graph.n_nodes, size, bound, at


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=25, help="timed runs per measurement (median reported)")
    args = ap.parse_args(argv)
    if not FIXTURES.is_dir():
        print(f"{FIXTURES} is absent: the fixtures live beside the project", file=sys.stderr)
        return 2
    have_c = O.available()
    if have_c:
        O.apply_ctypes_fixes()
    else:
        print(f"(ggml-python is not importable, C timings skipped: {O.IMPORT_ERROR})")

    goals = []
    print(f"Planning time (CPU time of this process), median of {args.repeat} runs (µs)")
    head = (f"{'fixture':32} {'nodes':>5} {'lite reserve':>13} {'C reserve':>10} {'C fresh':>9} {'ratio':>7} "
            f"{'lite alloc':>11} {'C alloc':>9} {'ratio':>7}")
    print(head)
    print("-" * len(head))
    for name in TIMED:
        n = load(name)[0].graph.n_nodes
        lr, la = time_lite(name, args.repeat)
        if have_c:
            cs, cf, ca = time_c(name, args.repeat)
            print(f"{name:32} {n:5d} {lr:13.0f} {cs:10.1f} {cf:9.1f} {lr / cf:7.1f} "
                  f"{la:11.0f} {ca:9.1f} {la / ca:7.1f}")
            goals.append(f"  {name}: ggml_lite reserve + alloc_graph = {lr + la:.0f} µs = {(lr + la) / cf:.1f}x "
                         f"C fresh reserve ({cf:.1f} µs), {(lr + la) / cs:.1f}x C repeated reserve ({cs:.1f} µs)")
        else:
            print(f"{name:32} {n:5d} {lr:13.0f} {'-':>10} {'-':>9} {'-':>7} {la:11.0f} {'-':>9} {'-':>7}")
    print("ratio = ggml_lite / C (reserve: against C fresh = ggml_gallocr_new + reserve)")
    if goals:
        print("The goal (issue 4): ggml_lite reserve + alloc_graph of fixture 13 within 30x of the C reserve.")
        print("\n".join(goals))
    print()
    print("Plan quality: compute buffer size / peak-live lower bound (definition in the docstring)")
    head = (f"{'fixture':32} {'nodes':>5} {'buffer size':>12} {'lower bound':>12} {'at step':>7} {'ratio':>7} "
            f"{'peak/LB':>8}")
    print(head)
    print("-" * len(head))
    for name in SINGLE:
        n, size, bound, at = quality(name)
        ratio = size / bound if bound else float("nan")
        peak = (size - 32) / bound if bound else float("nan")
        print(f"{name:32} {n:5d} {size:12d} {bound:12d} {at:7d} {ratio:7.3f} {peak:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
