"""The plan `GAllocr` keeps between `reserve` and `alloc_graph`: one record per placed tensor plus the
graph's slots (chapter 04, section 2.2), read back as the C's `node_allocs` / `leaf_allocs`, used by
position, and checked by `ggml_gallocr_needs_realloc` — including the slots whose tensor is the one
the plan was made for, which the check passes without measuring them."""

import logging

import pytest

import ggml_lite as gl
from ggml_lite.gallocr import NOT_PLACED, NodeAlloc


def _block(n: int = 8, weight_data: bool = True):
    """x (INPUT) -> mul_mat(w, x) -> add(., b) -> view -> sqr (OUTPUT); `w` and `b` pre-allocated."""
    wctx, ctx = gl.Context("weights"), gl.Context("compute")
    w = wctx.new_tensor_2d(gl.F32, n, n, name="w")
    b = wctx.new_tensor_1d(gl.F32, n, name="b")
    if weight_data:
        gl.alloc_ctx_tensors_from_buft(wctx, gl.cpu_buffer_type())
    x = ctx.new_tensor_2d(gl.F32, n, 3, name="x")
    gl.set_input(x)
    h = gl.add(ctx, gl.mul_mat(ctx, w, x), b).set_name("h")
    v = gl.reshape_1d(ctx, h, 3 * n).set_name("h_view")
    out = gl.sqr(ctx, v).set_name("out")
    gl.set_output(out)
    return gl.build_forward(out), {t.name: t for t in (w, b, x, h, v, out)}


def _as_tuple(rec) -> tuple:
    """A `tensor_alloc` (a hash node or NOT_PLACED) as the C's value: (buffer_id, offset, size_max)."""
    return (rec.buffer_id, rec.offset, rec.size_max)


def test_node_allocs_read_the_records_by_slot():
    graph, t = _block()
    galloc = gl.GAllocr(gl.cpu_buffer_type())
    assert galloc.reserve(graph)
    na = galloc.node_allocs
    assert len(na) == len(graph.nodes) and all(isinstance(a, NodeAlloc) for a in na)
    for node, a in zip(graph.nodes, na):
        assert a.dst == _as_tuple(galloc.planned_alloc(node))
        assert a.src == tuple(_as_tuple(galloc.planned_alloc(s)) for s in node.src)
    assert galloc.planned_alloc(t["w"]) is NOT_PLACED and galloc.planned_alloc(t["h_view"]) is NOT_PLACED
    rec = galloc.planned_alloc(t["h"])
    assert rec.buffer_id == 0 and rec.size_max == gl.nbytes(t["h"])
    assert rec is galloc.hash_values[t["h"]]  # one record per tensor: its hash node carries the plan
    assert [la.leaf for la in galloc.leaf_allocs] == [_as_tuple(galloc.planned_alloc(leaf)) for leaf in graph.leafs]


def test_a_graph_of_the_same_shape_is_placed_from_the_kept_plan(caplog):
    first, _ = _block()
    galloc = gl.GAllocr(gl.cpu_buffer_type())
    assert galloc.reserve(first) and galloc.alloc_graph(first)
    kept = galloc.planned_nodes
    offsets = [n.data - galloc.buffers[0].get_base() for n in first.nodes if n.view_src is None]
    second, _ = _block()  # new tensor objects in the same slots
    with caplog.at_level(logging.INFO, logger="ggml_lite"):
        assert galloc.alloc_graph(second)
    assert galloc.planned_nodes is kept and "needs_realloc" not in caplog.text
    assert [n.data - galloc.buffers[0].get_base() for n in second.nodes if n.view_src is None] == offsets


def test_a_larger_tensor_in_a_kept_slot_is_not_valid(caplog):
    small, _ = _block(8)
    galloc = gl.GAllocr(gl.cpu_buffer_type())
    assert galloc.reserve(small)
    large, _ = _block(16)
    with caplog.at_level(logging.INFO, logger="ggml_lite"):
        assert galloc.alloc_graph(large)
    assert "is not valid" in caplog.text and "reallocating buffers automatically" in caplog.text
    assert galloc.planned_nodes == large.nodes


def test_the_planned_tensor_that_lost_its_memory_is_not_valid(caplog):
    """The shortcut for "this slot still holds the tensor the plan placed" must not hide a tensor that
    was pre-allocated when planned (so the plan has no record for it) and has no memory now."""
    graph, t = _block(weight_data=False)
    galloc = gl.GAllocr(gl.cpu_buffer_type())
    b = t["b"]
    b.data, b.buffer = 4096, None  # "pre-allocated" outside ggml-backend while planning
    assert galloc.reserve(graph)
    assert galloc.planned_alloc(b) is NOT_PLACED
    b.data = None  # ... and gone by the time the graph is placed
    with caplog.at_level(logging.INFO, logger="ggml_lite"):
        assert galloc.alloc_graph(graph)
    assert "src 1 (b) of node h is not valid" in caplog.text
    assert galloc.planned_alloc(b) is not NOT_PLACED and b.data is not None


def test_multi_buffer_allocator_refuses_to_replan():
    small, _ = _block(8)
    galloc = gl.GAllocr([gl.cpu_buffer_type(), gl.cpu_buffer_type()])
    assert galloc.reserve_n(small, [0] * len(small.nodes), [0] * len(small.leafs))
    large, _ = _block(16)
    assert galloc.alloc_graph(large) is False


@pytest.mark.parametrize("kind", ["default", "hook", "subclass"])
def test_alloc_size_fn_is_get_alloc_size(kind):
    ctx = gl.Context()
    t = ctx.new_tensor_2d(gl.F32, 5, 3)
    if kind == "default":
        buft = gl.cpu_buffer_type()
    elif kind == "hook":
        buft = gl.BufferType("padded", 32, alloc_size=lambda x: gl.nbytes(x) + 64)
    else:
        class Padded(gl.BufferType):
            def get_alloc_size(self, tensor):
                return gl.nbytes(tensor) + 128
        buft = Padded("sub", 32)
    fn = buft.alloc_size_fn()
    assert fn(t) == buft.get_alloc_size(t)
    assert (fn is gl.nbytes) == (kind == "default")


def _two_sqr(name_b: str = "b"):
    ctx = gl.Context()
    x = ctx.new_tensor_1d(gl.F32, 16, name="x")
    gl.set_input(x)
    out = gl.sqr(ctx, gl.sqr(ctx, x).set_name(name_b)).set_name("out")
    gl.set_output(out)
    return gl.build_forward(out)


def test_a_plan_that_fails_half_way_leaves_no_plan():
    """A `reserve` that raises forgets the previous plan, so the next `alloc_graph` plans again rather
    than placing tensors from a mix of the two plans."""
    def size(t):
        if t.name == "boom":
            raise RuntimeError("no size for boom")
        return gl.nbytes(t)
    galloc = gl.GAllocr(gl.BufferType("DEV", 32, is_host=True, alloc_size=size))
    g1 = _two_sqr()
    assert galloc.reserve(g1)
    with pytest.raises(RuntimeError, match="boom"):
        galloc.reserve(_two_sqr("boom"))
    assert galloc.planned_nodes == [] and galloc.node_allocs == []
    g1_again = _two_sqr()
    assert galloc.alloc_graph(g1_again)
    assert all(n.data is not None for n in g1_again.nodes)


@pytest.mark.parametrize("how", ["hook", "instance"])
def test_a_buffer_type_changed_after_the_allocator_was_made_is_seen(how):
    buft = gl.BufferType("DEV", 32, is_host=True)
    galloc = gl.GAllocr(buft)
    if how == "hook":
        buft._alloc_size = lambda t: gl.nbytes(t) + 64
    else:
        buft.get_alloc_size = lambda t: gl.nbytes(t) + 64
    assert galloc.reserve(_two_sqr())
    # each sqr takes its source's memory in place, so the plan holds one tensor: 64 bytes + the hook's 64
    assert galloc.buf_tallocs[0].get_max_size() == 128


def test_free_node_of_a_tensor_placed_by_set_node_offset():
    """`ggml_gallocr_set_node_offset` (never called by ggml) marks a tensor placed without a plan
    record; freeing it measures its size, as the C does."""
    ctx = gl.Context()
    t = ctx.new_tensor_1d(gl.F32, 100, name="t")
    galloc = gl.GAllocr(gl.cpu_buffer_type())
    galloc.buf_tallocs[0].alloc(1024)  # [0, 1024) in use
    galloc.set_node_offset(t, 0, 512)
    galloc.free_node(t)
    assert galloc.buf_tallocs[0].free_blocks[0] == (512, 416)  # 400 bytes, aligned to 416
    assert not galloc.is_own(t)
