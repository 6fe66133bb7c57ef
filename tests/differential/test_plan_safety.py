"""The proof that graph-allocator plans are safe: a graph computed in the memory `GAllocr` planned (with
its reuse and in-place decisions) gives exactly the results of the same graph computed with every
tensor in memory of its own. And the comparison can fail: a plan corrupted so that two live tensors
overlap is caught.

Graphs are the random graphs of `ggml_oracle` (the same generator as the differential plan tests), built
twice from one seed: one copy is planned by `GAllocr`, the other laid out by `alloc_ctx_tensors` (every
tensor of the compute context in a region of its own). Leafs get the same deterministic data in both;
both are computed by the CPU backend; the results compared are the tensors whose memory a plan must
keep: non-view OUTPUT tensors, and nodes nothing consumes. (An OUTPUT *view* does not keep its source
alive — the ggml quirk of tests/differential/test_differential.py — so views are not compared.) Same kernels, same
inputs: the comparison is exact (NaN equal to NaN)."""

import pytest

import ggml_lite as gl
import ggml_oracle as O
from helpers import NOT_COMPUTABLE, fill, kept, same

MAX_OPS = 24
N_GRAPHS = 200  # computable graphs the property must see


def _graph(seed):
    """The random graph of `seed`, with every tensor the user fills before computing flagged INPUT —
    ggml's contract: only INPUT tensors are placed before the nodes and kept until their last use (a
    plain leaf's memory may go to a later op-NONE node, e.g. a PARAM tensor, both filled up front)."""
    rg = O.random_graph(seed, max_ops=MAX_OPS)
    for t in O.graph_data_tensors(rg.graph):
        if t.data is None:
            gl.set_input(t)
    return rg


def _results(rg) -> list:
    return [gl.tensor_get(rg.graph.nodes[k]) for k in kept(rg)]


def _compute_planned(seed, corrupt=None):
    rg = _graph(seed)
    galloc = gl.GAllocr(gl.cpu_buffer_type())
    assert galloc.reserve(rg.graph)
    if corrupt is not None and not corrupt(rg, galloc):
        return None
    assert galloc.alloc_graph(rg.graph)
    fill(rg)
    gl.cpu_init().graph_compute(rg.graph)
    return _results(rg)


def _compute_separate(seed):
    rg = _graph(seed)
    gl.alloc_ctx_tensors(rg.contexts[-1], gl.cpu_buffer_type())  # every compute tensor in its own region
    for t in rg.contexts[-1].tensors:
        if t.view_src is not None and t.buffer is None and t.view_src.buffer is not None:
            gl.view_init(t)
    fill(rg)
    gl.cpu_init().graph_compute(rg.graph)
    return _results(rg)


def _computable_separate(seed):
    try:
        return _compute_separate(seed)
    except NOT_COMPUTABLE:
        return None


def test_planned_memory_computes_what_separate_memory_computes(long_run):
    """Over at least `N_GRAPHS` computable graphs (x50 with --long), the planned memory gives exactly
    the results of separate memory. Graph k is `random_graph(k)`: a failure names k, which reproduces
    it. Graphs the kernels refuse are counted apart."""
    computed, refused = 0, 0
    n = N_GRAPHS * (50 if long_run else 1)
    seed = 0
    while computed < n:
        assert seed < 20 * n, (computed, refused)
        separate = _computable_separate(seed)
        if separate is None:
            refused += 1
        else:
            planned = _compute_planned(seed)
            computed += 1
            assert same(planned, separate), f"graph seed {seed}: the planned memory changed a result\n" + \
                O.random_graph(seed, max_ops=MAX_OPS).source()
        seed += 1


def _overlap_live_pair(rg, galloc) -> bool:
    """Corrupt the plan: place a node `m` on the memory of a result `p` that must survive the graph (an
    OUTPUT, or a node nothing consumes), computed before `m` — two live tensors now overlap."""
    nodes, keep = rg.graph.nodes, set(kept(rg))
    end = galloc.buffers[0].get_size() - 32
    plan = galloc.planned_alloc  # the plan's record of each placed tensor (its hash node; node_allocs[i].dst)
    for p_idx in sorted(keep):
        p_rec = plan(nodes[p_idx])
        if p_rec.size_max == 0:
            continue
        for m_idx in range(p_idx + 1, len(nodes)):
            m_rec = plan(nodes[m_idx])
            if m_rec.size_max and m_rec.offset != p_rec.offset and p_rec.offset + m_rec.size_max <= end:
                m_rec.buffer_id, m_rec.offset = p_rec.buffer_id, p_rec.offset
                return True
    return False


def test_a_corrupted_plan_is_caught():
    """Two live tensors made to overlap change the results, and the comparison above sees it."""
    tried = caught = 0
    for seed in range(80):
        separate = _computable_separate(seed)
        if separate is None:
            continue
        corrupted = _compute_planned(seed, corrupt=_overlap_live_pair)
        if corrupted is None:
            continue
        tried += 1
        caught += not same(corrupted, separate)
    assert tried >= 20, tried
    assert caught >= 0.9 * tried, (caught, tried)


@pytest.mark.parametrize("seed", range(5))
def test_separate_memory_has_no_reuse(seed):
    """The reference side really keeps every tensor apart (else the proof would prove nothing)."""
    rg = O.random_graph(seed, max_ops=MAX_OPS)
    gl.alloc_ctx_tensors(rg.contexts[-1], gl.cpu_buffer_type())
    spans = sorted((t.data, t.data + gl.nbytes(t)) for t in rg.contexts[-1].tensors
                   if t.view_src is None and t.data is not None and gl.nbytes(t))
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
