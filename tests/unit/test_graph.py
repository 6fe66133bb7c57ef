"""build_forward_expand: ggml's visiting order, node/leaf split, automatic names, size limit, graph_view."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ggml_lite as gl
from ggml_lite import errors


def test_order_sources_in_slot_order_and_names():
    ctx = gl.Context()
    a = ctx.new_tensor_1d(gl.F32, 4, name="a")
    b = ctx.new_tensor_1d(gl.F32, 4)
    c = ctx.new_tensor_1d(gl.F32, 4, name="c")
    s1 = gl.add(ctx, a, b)
    s2 = gl.mul(ctx, c, s1)
    out = gl.sub(ctx, s2, a).set_name("out")
    g = gl.build_forward(out)
    assert g.nodes == [s1, s2, out] and g.leafs == [c, a, b]
    assert [t.name for t in g.leafs] == ["c", "a", "leaf_2"]
    assert [t.name for t in g.nodes] == ["node_0", "node_1", "out"]


def test_expand_twice_adds_only_new_tensors():
    ctx = gl.Context()
    a = ctx.new_tensor_1d(gl.F32, 4, name="a")
    x = gl.sqr(ctx, a)
    y = gl.sqrt(ctx, x)
    g = gl.Graph()
    gl.build_forward_expand(g, x)
    gl.build_forward_expand(g, y)
    gl.build_forward_expand(g, y)
    assert g.nodes == [x, y] and g.leafs == [a]


def test_param_tensor_is_a_node():
    ctx = gl.Context()
    w = ctx.new_tensor_1d(gl.F32, 4, name="w")
    gl.set_param(w)
    g = gl.build_forward(gl.sqr(ctx, w))
    assert g.nodes[0] is w and g.leafs == []


def test_empty_slot_is_skipped():
    ctx = gl.Context()
    q = ctx.new_tensor_3d(gl.F32, 8, 2, 3, name="q")
    pos = ctx.new_tensor_1d(gl.I32, 3, name="pos")
    r = gl.rope_ext(ctx, q, pos, None, 8, 0, 0, 1e4, 1, 0, 1, 32, 1)
    s = gl.soft_max_ext(ctx, r, None, 1.0, 0.0)
    assert gl.build_forward(s).leafs == [q, pos]


def test_graph_full_names_the_tensor():
    ctx = gl.Context()
    t = ctx.new_tensor_1d(gl.F32, 4, name="x")
    for i in range(3):
        t = gl.sqr(ctx, t).set_name(f"sq{i}")
    with pytest.raises(errors.GraphFullError, match="'sq2'.*2 nodes"):
        gl.build_forward(t, size=2)


def test_deep_chain_needs_no_recursion():
    ctx = gl.Context()
    t = ctx.new_tensor_1d(gl.F32, 4, name="x")
    for _ in range(5000):
        t = gl.sqr(ctx, t)
    g = gl.build_forward(t, size=6000)
    assert g.n_nodes == 5000 and g.n_leafs == 1 and g.node(-1) is t


def test_graph_view():
    ctx = gl.Context()
    t = ctx.new_tensor_1d(gl.F32, 4, name="x")
    ts = []
    for _ in range(5):
        t = gl.sqr(ctx, t)
        ts.append(t)
    g = gl.build_forward(t)
    v = gl.graph_view(g, 1, 4)
    assert v.nodes == ts[1:4] and v.leafs == [] and v.size == 3 and not v.visited
    assert g.get_tensor("node_2") is ts[2] and g.get_tensor("x") is g.leafs[0]


# A random DAG: every op picks earlier tensors as sources; the order must be a topological order
# that lists each reachable tensor exactly once, and must equal a direct recursive implementation.
def _recursive_order(roots):
    visited, nodes, leafs = set(), [], []

    def visit(t):
        if t in visited:
            return
        visited.add(t)
        for s in t.src:
            if s is not None:
                visit(s)
        (leafs if t.op is gl.Op.NONE else nodes).append(t)

    for r in roots:
        visit(r)
    return nodes, leafs


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_random_dag_order(data):
    ctx = gl.Context()
    pool = [ctx.new_tensor_2d(gl.F32, 8, 4, name=f"in{i}") for i in range(data.draw(st.integers(1, 4)))]
    for _ in range(data.draw(st.integers(1, 30))):
        kind = data.draw(st.sampled_from(["add", "mul", "sqr", "silu", "view"]))
        a = data.draw(st.sampled_from(pool))
        if kind in ("add", "mul"):
            b = data.draw(st.sampled_from(pool))
            pool.append(getattr(gl, kind)(ctx, a, b))
        elif kind == "view":
            pool.append(gl.reshape_2d(ctx, gl.cont(ctx, a), 8, 4) if a.view_src
                        else gl.view_2d(ctx, a, 8, 4, a.nb[1], 0))
        else:
            pool.append(getattr(gl, kind)(ctx, a))
    roots = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
    g = gl.Graph()
    for r in roots:
        gl.build_forward_expand(g, r)
    nodes, leafs = _recursive_order(roots)
    assert g.nodes == nodes and g.leafs == leafs
    pos = {t: i for i, t in enumerate(g.nodes)}
    for i, t in enumerate(g.nodes):
        assert all(s is None or s.op is gl.Op.NONE or pos[s] < i for s in t.src)


def test_every_ggml_type_has_ggmls_block_and_type_size():
    """The type table of chapter 00 against the real ggml's (`ggml_type_name/size/blck_size` through
    ggml-python): every type both know by name and code has the same block and byte counts. The
    newer ggml has removed the interleaved q4_0 variants (31-33), which daa9623 still had."""
    import ggml_oracle as O
    from ggml_lite.tensor import TYPES

    if not O.available():
        pytest.skip(f"the real ggml is not available: {O.IMPORT_ERROR}")
    g = O.need_ggml()
    compared = 0
    for t in TYPES.values():
        name = g.ggml_type_name(t.code).decode()
        if "REMOVED" in name:
            assert t.code in (31, 32, 33), t
            continue
        assert (name, g.ggml_type_size(t.code), g.ggml_blck_size(t.code)) == (t.name, t.type_size, t.blck_size)
        compared += 1
    assert compared == 31 and len(TYPES) == 34


def test_types_by_name_and_code():
    from ggml_lite.tensor import TYPES, type_by_code

    assert gl.type_by_name("Q4_K") is gl.type_by_name("q4_k") is TYPES["q4_K"] is type_by_code(12)
    assert gl.Context().new_tensor_2d(TYPES["q4_K"], 4096, 4096).nbytes == 4096 * 4096 * 9 // 16  # 4.5 bits
    with pytest.raises(gl.errors.UnknownTypeError, match="code 4"):
        type_by_code(4)  # GGML_TYPE_Q4_2: removed from ggml long ago
