"""`gallocr_today.chunk_lifetimes`, the analysis chapter 12's pictures draw (`viz.chunks`): chapter 05's
lifetimes of a chunked plan, per chunk. On random graphs of the differential generator planned in chunks:
every tensor block lies at the (chunk, offset) the allocator gave its tensor and inside that chunk, and
no two blocks alive at the same node share a byte of one chunk; an in-place child whose parent's tail
was handed back (`ggml_gallocr_free_extra_space`) ends at its own aligned size."""

import random

import pytest

import ggml_lite as gl
import ggml_oracle as O
from ggml_lite.buffer import BufferType
from ggml_lite.gallocr_today import GAllocr2026, chunk_lifetimes
from ggml_lite.schema import RecordedBufferType
from ggml_lite.tensor import Op


@pytest.mark.parametrize("seed", range(8))
def test_blocks_lie_where_the_plan_put_them_and_never_overlap(seed):
    rg = O.random_graph(seed)
    unlimited: list = []
    GAllocr2026(RecordedBufferType("CPU", 32), trace=unlimited.append).reserve(rg.graph)
    peak = GAllocr2026(RecordedBufferType("CPU", 32)).reserve_n_size(rg.graph)[0]
    limit = random.Random(seed).randint(max(peak // 4, 32), max(peak // 2, 64))
    events: list = []
    galloc = GAllocr2026(RecordedBufferType("CPU", 32, limit), trace=events.append)
    assert galloc.reserve(rg.graph)
    sizes = galloc.chunk_sizes(0)
    blocks = [(c, lt) for c, lt in chunk_lifetimes(rg.graph, events) if lt.kind == "tensor" and not lt.superseded]
    assert blocks
    for c, lt in blocks:
        assert tuple(galloc.hash_get(lt.tensor).offset) == (c, lt.offset), lt.tensor.name
        assert lt.offset + lt.size <= sizes[c] and lt.size % 32 == 0
    for i, (c, a) in enumerate(blocks):
        for d, b in blocks[i + 1:]:
            a_end = a.end if a.handed_at is None else a.handed_at - 1
            b_end = b.end if b.handed_at is None else b.handed_at - 1
            live_together = a.start <= b_end and b.start <= a_end
            if c == d and live_together:
                assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset, (a.tensor.name, b.tensor.name)


def test_a_handed_back_tail_ends_the_child_block():
    w, ctx = gl.Context(), gl.Context()
    W, x, bias = w.new_tensor_2d(gl.F32, 64, 64), w.new_tensor_1d(gl.F32, 64), w.new_tensor_1d(gl.F32, 64)
    gl.alloc_ctx_tensors_from_buft(w, gl.cpu_buffer_type())
    m = gl.mul_mat(ctx, W, x)
    y = gl.add(ctx, m, bias)
    gl.set_output(y)
    events: list = []
    metal_like = BufferType("Metal-like", 32, alloc_size=lambda t: gl.nbytes(t) + (100 if t.op == Op.MUL_MAT else 0))
    assert GAllocr2026(metal_like, trace=events.append).reserve(gl.build_forward(y))
    size = {lt.tensor: lt.size for _, lt in chunk_lifetimes(gl.build_forward(y), events) if lt.kind == "tensor"}
    assert size[m] == 384 and size[y] == 256  # 256 + 100 aligned to 32; the child keeps its own 256


def test_the_chunk_map_draws_a_box_per_chunk_and_the_2024_buffer_beside():
    from ggml_lite.viz.chunks import chunk_map

    rg = O.random_graph(3)
    old: list = []
    new: list = []
    assert gl.GAllocr(RecordedBufferType("CPU", 32), trace=old.append).reserve(rg.graph)
    galloc = GAllocr2026(RecordedBufferType("CPU", 32, 4096), trace=new.append)
    assert galloc.reserve(rg.graph)
    sizes = galloc.chunk_sizes(0)
    fig = chunk_map((rg.graph, new), sizes, 4096, old=(rg.graph, old))
    assert sum(s.type == "rect" for s in fig.layout.shapes) == len(sizes)
    assert [a.text for a in fig.layout.annotations if a.text.startswith("chunk")] == \
        [f"chunk {c}: {size:,} B" for c, size in enumerate(sizes)]
    assert fig.layout.annotations[0].text.startswith("2024: one buffer of")
