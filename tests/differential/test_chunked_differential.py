"""Differential tests of today's chunked allocator: ggml_lite's `GAllocr2026` against the real ggml 0.15.3
(ggml-python 0.0.45) on buffer types with a `max_size`, chunk for chunk.

* Random graphs of the differential generator, each planned without a limit (one chunk, the 2024 plan)
  and at several limits drawn relative to its unbounded peak and its largest tensor
  (`chunked_check.draw_max_sizes`), so that plans of 2 to 16 chunks occur (the test checks that each
  count does): every tensor's (chunk, offset), views included, every chunk's size and the buffer size
  identical. A few hundred graphs here; x20 with `--long`, and `benchmarks/differential_chunked.py`
  (100,000 plans in `make test-long`).
* One allocator, two graphs: reserve A, alloc_graph A, reserve B, alloc_graph B, alloc_graph A — chunk
  sizes after every step, whether the buffer was reallocated (a chunk grew), placements after every
  alloc_graph. B is another random graph, or the same model with another batch (fixture 11's steps).
* The dry run (`ggml_gallocr_reserve_n_size`): the same size, no buffer allocated on either side.
* `ggml_op_can_inplace` as the library exports it, for every op, against `op_can_inplace_today`.
* The checks can fail: the allocator of September 2025 (`last_block="first"`) differs from today's.
"""

import collections
import functools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ggml_lite as gl
import ggml_oracle as O
from ggml_lite.gallocr_today import CAN_INPLACE_TODAY_ONLY, GAllocr2026, op_can_inplace_today
from ggml_lite.graphio import allocate_external, load_document
from ggml_lite.tensor import Op
from ggml_oracle import chunked as C
from ggml_oracle import chunked_check as K
from helpers import fixture_path

pytestmark = pytest.mark.skipif(
    not O.available(), reason=f"the real ggml is not available: `import ggml` (ggml-python) failed: {O.IMPORT_ERROR}")

LIMITS_PER_GRAPH = 6  # two of each kind of `draw_max_sizes`


def _report(rg, results) -> str:
    lines = [rg.describe()]
    for r in results:
        if r.diffs:
            lines.append(f"max_size {r.max_size} ({r.n_chunks} chunks): {len(r.diffs)} difference(s)")
            lines += [f"  {d}" for d in r.diffs[:10]]
    return "\n".join(lines + ["reproducer:", rg.source()])


def _sweep(seeds, max_ops=40):
    failures, hist = [], collections.Counter()
    for seed in seeds:
        rg = O.random_graph(seed, max_ops=max_ops)
        results = K.check_chunked_graph(rg, LIMITS_PER_GRAPH, seed=seed)
        hist.update(r.n_chunks for r in results)
        if any(r.diffs for r in results):
            failures.append(_report(rg, results))
    return failures, hist


@pytest.mark.parametrize("first, count, max_ops", [(0, 300, 40), (100_000, 40, 200)])
def test_random_chunked_plans_are_identical(first, count, max_ops, long_run):
    """Every (chunk, offset) and chunk size of ggml_lite's plan equals the real ggml's, at every limit
    (the second row builds larger graphs); and the limits reach every chunk count from 1 to 16."""
    count *= 20 if long_run else 1
    failures, hist = _sweep(range(first, first + count), max_ops)
    assert not failures, f"{len(failures)} of {count} graphs differ; the first:\n{failures[0]}"
    if max_ops == 40:
        assert set(hist) == set(range(1, C.VBUFFER_MAX_CHUNKS + 1)), sorted(hist.items())
        assert hist[C.VBUFFER_MAX_CHUNKS] >= 5, sorted(hist.items())


@O.oracle_settings(max_examples=60)
@given(O.graphs(), st.integers(1, 1 << 20), st.randoms(use_true_random=False))
def test_hypothesis_graphs_and_limits(rg, max_size, rnd):
    """Hypothesis draws the graph and a limit (which it can shrink), plus two limits of its kinds."""
    results = K.check_chunked_graph(rg, max_sizes=[max_size])
    whole = C.chunked_plan(rg.graph, rg.roots, rg.preallocated)
    more = K.draw_max_sizes(whole["buffer_size"], K.largest_tensor(whole), rnd, 2)
    results += K.check_chunked_graph(rg, max_sizes=more)[1:]
    assert not any(r.diffs for r in results), _report(rg, results)


def test_unlimited_is_one_chunk_and_the_2024_plan_on_the_fixtures():
    """(d) without a limit, on the recorded 2024 graphs too: one chunk, ggml_lite's 2026 and 2024
    allocators and the real ggml all agree (a compute buffer of ggml-python's size + 32)."""
    for name in ("01_mlp_small", "03_views_layout", "06_llama_block", "07_llama4_kvcache", "10_random_dag_wide_s7"):
        rg = _fixture_graph(name)
        (r,) = K.check_chunked_graph(rg, max_sizes=[])
        assert r.n_chunks == 1 and not r.diffs, (name, [str(d) for d in r.diffs[:5]])


def _fixture_graph(name, step=None):
    """A recorded graph (or one step of a sequence file) as a `RandomGraph`, its external contexts
    allocated on ggml_lite's side (`allocate_external`) and listed as pre-allocated for the mirror."""
    gf = gl.read_graph_file(fixture_path("ggml-seed", name), step)
    allocate_external(gf)
    pre = []
    for i, rec in gf.records.items():
        t = gf.tensors[i]
        if rec.get("preallocated") and t.view_src is None and not any(t.ctx is c for c in pre):
            pre.append(t.ctx)
    contexts = []
    for t in gf.tensors.values():
        if not any(t.ctx is c for c in contexts):
            contexts.append(t.ctx)
    return O.RandomGraph(gf.graph, [gf.tensors[i] for i in gf.expand_roots], contexts, pre, label=name)


def test_fixture_graphs_at_limits():
    """The recorded 2024 graphs at a few limits each (between a quarter of the largest tensor and the
    peak): chunk for chunk identical."""
    failures = []
    for name in ("01_mlp_small", "02_elementwise_inplace", "03_views_layout", "04_outputs_middle",
                 "05_inputs_flagged", "06_llama_block", "07_llama4_kvcache", "08_random_dag_chain_s1234",
                 "09_random_dag_wide_s42", "10_random_dag_wide_s7"):
        rg = _fixture_graph(name)
        for r in K.check_chunked_graph(rg, 9, seed=len(name)):
            if r.diffs:
                failures.append(f"{name} max_size {r.max_size}: " + "; ".join(str(d) for d in r.diffs[:5]))
    assert not failures, "\n".join(failures[:5])


# -- one allocator, two graphs ----------------------------------------------------------------------

def _steps(a, b, a_again) -> list:
    """reserve A, alloc_graph A, reserve B, alloc_graph B, then A rebuilt (`a_again`) on the kept plan or anew."""
    return [("reserve", a), ("alloc_graph", a), ("reserve", b), ("alloc_graph", b), ("alloc_graph", a_again)]


def _limit(rgs, rnd) -> int:
    """A limit for a sequence: drawn (`draw_max_sizes`) from the larger graph's peak and largest tensor."""
    plans = [C.chunked_plan(rg.graph, rg.roots, rg.preallocated) for rg in rgs]
    big = max(plans, key=lambda p: p["buffer_size"])
    limits = K.draw_max_sizes(big["buffer_size"], K.largest_tensor(big), rnd, 3) or [C.UNLIMITED]  # (tiny graphs)
    return limits[rnd.randrange(len(limits))]


def test_one_allocator_two_random_graphs(long_run) -> None:
    """(a) A then B on ONE allocator per side: chunk sizes, reallocation and placements after each step.
    B is a bigger or a smaller graph (or the same): the buffer is kept while no chunk grows."""
    failures: list = []
    outcomes: collections.Counter = collections.Counter()
    count = 150 * (20 if long_run else 1)
    for s in range(count):
        rnd = random.Random(s)
        sa, sb = 2 * s + 500_000, 2 * s + 500_001 if s % 5 else 2 * s + 500_000  # every 5th: B is A rebuilt
        a, b = O.random_graph(sa), O.random_graph(sb)
        max_size = _limit([a, b], rnd)
        seen: list = []
        diffs = K.check_chunked_sequence(_steps(a, b, O.random_graph(sa)), max_size, seen)
        outcomes.update([("reserve B", seen[2].replaced), ("A again", seen[4].replaced),
                         ("B kept a bigger buffer", seen[2].planned_chunks != seen[2].buffer_chunks)])
        if diffs:
            failures.append(f"seeds {sa}, {sb} max_size {max_size}: "
                            + "; ".join(f"step {k}: {d}" for k, d in diffs[:5]))
    assert not failures, f"{len(failures)} of {count} sequences differ:\n" + "\n".join(failures[:5])
    # both outcomes of every decision occur (150 sequences: 91/59 reallocated at B, 29 kept A's bigger chunks)
    for key in ("reserve B", "A again", "B kept a bigger buffer"):
        assert outcomes[(key, True)] >= 10 and outcomes[(key, False)] >= 10, sorted(outcomes.items(), key=str)


def test_one_allocator_the_same_model_with_other_batches():
    """(a) The same LLaMA-style model with other batches (fixture 11's graphs: 8, 16, 1, ... tokens),
    one after the other on one allocator per side, at limits that give several chunks."""
    n = len(load_document(fixture_path("ggml-seed", "11_realloc_sequence_grow"))["steps"])
    for max_size in (4096, 12_000, 30_000):
        steps = [("alloc_graph", _fixture_graph("11_realloc_sequence_grow", k)) for k in range(n)]
        steps = [("reserve", steps[0][1])] + steps
        diffs = K.check_chunked_sequence(steps, max_size)
        assert not diffs, f"max_size {max_size}: " + "; ".join(f"step {k}: {d}" for k, d in diffs[:5])


def test_the_sequence_check_sees_a_reallocation():
    """The C side's `replaced` is read right: a bigger graph after a small one reallocates, the same
    graph again does not (and ggml_lite agrees, else the check above would fail)."""
    small, big = O.random_graph(15), O.random_graph(11)  # 64 B and 643,072 B unbounded
    with C.RealGAllocr(4096) as real, O.mirror(small.graph, small.roots, small.preallocated) as ms, \
            O.mirror(big.graph, big.roots, big.preallocated) as mb:
        assert real.reserve(ms) and real.replaced
        assert real.reserve(ms) and real.replaced is False
        assert real.reserve(mb) and real.replaced and len(real.chunks().chunks) > 1
        assert real.reserve(ms) and real.replaced is False  # smaller: every chunk still fits


# -- the dry run ------------------------------------------------------------------------------------

def test_reserve_n_size_is_the_same_and_allocates_nothing():
    """(b) `ggml_gallocr_reserve_n_size` against `GAllocr2026.reserve_n_size`: same bytes, no buffer."""
    failures, checked = [], 0
    for seed in range(120):
        rg = O.random_graph(seed)
        whole = C.chunked_plan(rg.graph, rg.roots, rg.preallocated)
        limits = K.draw_max_sizes(whole["buffer_size"], K.largest_tensor(whole), random.Random(seed), 3)
        for ms in [C.UNLIMITED, *limits]:
            diffs = K.check_reserve_n_size(rg, ms)
            checked += 1
            if diffs:
                failures.append(f"seed {seed} max_size {ms}: " + "; ".join(map(str, diffs)))
    assert not failures, "\n".join(failures[:5])
    assert checked > 300


def test_reserve_n_size_after_a_reserve_keeps_or_drops_the_buffer_alike():
    """The dry run on an allocator that has a buffer: a graph that fits every chunk keeps it, a bigger
    one frees it without allocating another (`no_alloc`: `galloc->buffers[i] = NULL`), on both sides."""
    small, big = O.random_graph(15), O.random_graph(11)  # 64 B and 643,072 B unbounded
    for second, kept in ((small, True), (big, False)):
        lite = GAllocr2026(K.lite_buffer_type(4096))
        with C.RealGAllocr(4096) as real, O.mirror(small.graph, small.roots, small.preallocated) as ms, \
                O.mirror(second.graph, second.roots, second.preallocated) as m2:
            assert real.reserve(ms) and lite.reserve(small.graph)
            sizes = (real.reserve_n_size(m2), lite.reserve_n_size(second.graph)[0])
            assert sizes[0] == sizes[1] and real.buffer_allocated() is kept and (lite.buffers[0] is not None) is kept
        lite.free()


# -- the in-place op list -----------------------------------------------------------------------------

def test_op_can_inplace_as_the_library_exports_it():
    """(c) The real `ggml_op_can_inplace` for every op: ggml_lite agrees on every op it has, and the
    library's in-place ops it lacks are exactly `CAN_INPLACE_TODAY_ONLY`."""
    table = C.op_can_inplace_table()
    assert len(table) == O.need_ggml().GGML_OP_COUNT and "ADD" in table and "NONE" in table
    mine = {op.name for op in Op}
    assert mine <= set(table), mine - set(table)
    assert {name: op_can_inplace_today(Op[name]) for name in mine} == {name: table[name] for name in mine}
    assert {name for name, yes in table.items() if yes} - mine == CAN_INPLACE_TODAY_ONLY
    assert all(op_can_inplace_today(name) for name in CAN_INPLACE_TODAY_ONLY)


# -- the checks can fail ----------------------------------------------------------------------------

def test_the_first_chunked_version_is_caught(monkeypatch):
    """With the September 2025 rule for a chunk's last block (`last_block="first"`) ggml_lite's plans
    differ from today's ggml on many graphs: the comparison sees chunk sizes and placements."""
    monkeypatch.setattr(K, "GAllocr2026", functools.partial(GAllocr2026, last_block="first"))
    differing = 0
    for seed in range(60):
        results = K.check_chunked_graph(O.random_graph(seed), LIMITS_PER_GRAPH, seed=seed)
        differing += any(r.diffs for r in results)
        assert not results[0].diffs  # one chunk: the rule never applies
    assert differing >= 5
