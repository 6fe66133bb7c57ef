"""Chapter 12's worked examples against the real ggml 0.15.3 (the oracle's chunked buffer type, whose
`get_max_size` is the limit): the numbers the chapter prints from ggml_lite's `GAllocr2026` are the
ones the real allocator gives.

* Best fit chunk by chunk: a graph allocating a (256 B), b (512), d (384), e (384), freeing a and d,
  then z (256) in 1 KiB chunks puts z in chunk 1's 384-B hole (1:0), not in chunk 0's exact 256-B one.
* Four reserves on one allocator (fixture 06, 06, 03, 06 in 20 KiB chunks): the same chunk sizes after
  each, and the buffer replaced exactly when a chunk grew — by fewer chunks when the new plan needs fewer.
* The dry run (`ggml_gallocr_reserve_n_size`) of fixture 06: 40,704 B and no buffer allocated.
* Fixture 09 in 8 KiB chunks: 16 chunks, the 16th unbounded (161,600 B), every (chunk, offset) the same.
"""

import pytest

import ggml_lite as gl
import ggml_oracle as O
from ggml_lite.gallocr_today import GAllocr2026
from ggml_lite.graphio import allocate_external
from ggml_lite.schema import RecordedBufferType
from ggml_oracle import chunked as C
from ggml_oracle.mirror import mirror
from helpers import recorded_graph

pytestmark = pytest.mark.skipif(
    not O.available(), reason=f"the real ggml is not available: `import ggml` (ggml-python) failed: {O.IMPORT_ERROR}")


def quirk_graph():
    """Nodes a, b, d, e, z (chapter 12 section 2.4): a, b, d negate weights, e = a @ d (the last use of
    a and d), z after it; b, e, z are outputs. Returns (graph, roots, weight contexts)."""
    w, ctx = gl.Context(), gl.Context()
    x1, x2, x3 = w.new_tensor_2d(gl.F32, 8, 8), w.new_tensor_1d(gl.F32, 128), w.new_tensor_2d(gl.F32, 8, 12)
    gl.alloc_ctx_tensors_from_buft(w, gl.cpu_buffer_type())
    a, b, d = gl.neg(ctx, x1), gl.neg(ctx, x2), gl.neg(ctx, x3)
    e = gl.mul_mat(ctx, a, d)
    z = gl.neg(ctx, x1)
    for t, name in zip((a, b, d, e, z), "abdez"):
        t.name = name
    for t in (b, e, z):
        gl.set_output(t)
    gf, roots = gl.Graph(64), [a, b, e, z]
    for t in roots:
        gl.build_forward_expand(gf, t)
    return gf, roots, [w]


def recorded(name):
    """A seed fixture's graph, roots and pre-allocated contexts, its weights placed as recorded."""
    f, roots, pre = recorded_graph(name)
    allocate_external(f)
    return f.graph, roots, pre


def test_best_fit_is_chunk_by_chunk():
    graph, roots, pre = quirk_graph()
    ref = C.chunked_plan(graph, roots, pre, max_size=1024)
    assert {t.name: p for t, p in ref["placements"].items() if t in graph.nodes} == \
        {"a": (0, 0), "b": (0, 256), "d": (1, 0), "e": (1, 384), "z": (1, 0)}
    galloc = GAllocr2026(RecordedBufferType("CPU", 32, 1024))
    assert galloc.reserve(graph) and galloc.alloc_graph(graph)
    assert {t.name: tuple(galloc.hash_get(t).offset) for t in graph.nodes} == \
        {t.name: p for t, p in ref["placements"].items() if t in graph.nodes}
    assert galloc.chunk_sizes(0) == ref["planned_chunk_sizes"] == [768, 768]


def test_reserves_replace_the_buffer_when_a_chunk_grows():
    names = ["06_llama_block", "06_llama_block", "03_views_layout", "06_llama_block"]
    galloc = GAllocr2026(RecordedBufferType("CPU", 32, 20480))
    seen = []
    with C.RealGAllocr(20480) as real:
        for name in names:
            graph, roots, pre = recorded(name)
            before = galloc.buffers[0]
            assert galloc.reserve(graph)
            m = mirror(graph, roots, pre)
            try:
                assert real.reserve(m)
                assert real.chunks().planned_sizes == galloc.chunk_sizes(0)
                assert real.replaced == (galloc.buffers[0] is not before)
            finally:
                m.close()
            seen.append((galloc.chunk_sizes(0), real.replaced))
    assert seen == [([16704, 10240, 13760], True), ([16704, 10240, 13760], False), ([16352, 12288], True),
                    ([16704, 10240, 13760], True)]


def test_dry_run_sizes_without_a_buffer():
    graph, roots, pre = recorded("06_llama_block")
    galloc = GAllocr2026(RecordedBufferType("CPU", 32, 20480))
    assert galloc.reserve_n_size(graph) == [40704] and galloc.buffers == [None]
    with C.RealGAllocr(20480) as real:
        m = mirror(graph, roots, pre)
        try:
            assert real.reserve_n_size(m) == 40704 and not real.buffer_allocated()
        finally:
            m.close()


def test_sixteen_chunks_the_last_unbounded():
    graph, roots, pre = recorded("09_random_dag_wide_s42")
    ref = C.chunked_plan(graph, roots, pre, max_size=8192)
    galloc = GAllocr2026(RecordedBufferType("CPU", 32, 8192))
    assert galloc.reserve(graph) and galloc.alloc_graph(graph)
    assert galloc.chunk_sizes(0) == ref["planned_chunk_sizes"]
    assert len(ref["planned_chunk_sizes"]) == 16 and ref["planned_chunk_sizes"][-1] == 161600
    vb = galloc.buffers[0]
    for t, where in ref["placements"].items():
        if where is not None and t.view_src is None:
            c = next(i for i, b in enumerate(vb.chunks) if b is t.buffer)
            assert (c, t.data - vb.chunks[c].get_base()) == where, t.name
