"""Differential tests: ggml_lite's graph allocator against the real ggml, through ggml-python 0.0.45.

The oracle (the `ggml_oracle` package, oracle/) re-creates a ggml_lite graph in ggml with the same op calls, runs
the real `ggml_gallocr_reserve` / `ggml_gallocr_alloc_graph`, and reads every tensor's offset in the
compute buffer. First the oracle is checked against the recorded fixtures (it must reproduce them);
then random graphs — hypothesis-generated, and a seeded sweep — must get identical plans from both:
the same offset for every tensor, and the same buffer size once ggml-python's CPU buffer, which
reports 32 bytes less than the reference (see the oracle's docstring), is accounted for. Then one
allocator across several graphs (kept plans, re-plans). The last tests pin down two ggml behaviours
the sweeps ran into: a kept plan too small for a leaf (the reference asserts, ggml_lite raises,
ggml 0.15.3 overlaps tensors) and an OUTPUT view that does not keep its source alive (both agree).

Everything is deterministic: hypothesis runs derandomized without an example database; a failure
message includes the graph as ggml_lite code.
"""

import ctypes

import pytest
from hypothesis import given

import ggml_lite as gl
import ggml_oracle as O
from ggml_lite.tensor import Op
from ggml_oracle import bindings
from helpers import fixture_path

pytestmark = pytest.mark.skipif(
    not O.available(), reason=f"the real ggml is not available: `import ggml` (ggml-python) failed: {O.IMPORT_ERROR}")

SINGLE_GRAPH_FIXTURES = [
    "01_mlp_small", "02_elementwise_inplace", "03_views_layout", "04_outputs_middle", "05_inputs_flagged",
    "06_llama_block", "07_llama4_kvcache", "08_random_dag_chain_s1234", "09_random_dag_wide_s42",
    "10_random_dag_wide_s7", "13_llama7b_ctx512_all_outputs", "14_llama7b_ctx512_one_output",
]


def _report(rg, diffs) -> str:
    """A failure message that is a reproducer: the differences and the graph as ggml_lite code."""
    lines = [rg.describe(), f"{len(diffs)} difference(s):"] + [f"  {d}" for d in diffs[:15]]
    return "\n".join(lines + ["reproducer:", rg.source()])


# -- the ctypes fixes ------------------------------------------------------------------------------

def test_ctypes_fixes_make_pointer_results_pointer_wide():
    import ggml

    O.apply_ctypes_fixes()
    for name in bindings.FIXED:
        fn = getattr(ggml, name)
        assert fn.restype is ctypes.c_void_p, name
        assert all(bindings.is_pointer_wide(a) for a in fn.argtypes), (name, fn.argtypes)
    buft = ggml.ggml_backend_cpu_buffer_type()
    assert isinstance(buft, int) and ggml.ggml_backend_buft_name(buft) == b"CPU"
    assert O.apply_ctypes_fixes() == []  # idempotent


def test_no_other_ggml_function_returns_a_truncated_pointer():
    """The four fixed functions are the only ones ggml-python 0.0.45 declares with an `int` NewType
    (a C int) as the result type; a new one would need the same fix."""
    import typing

    import ggml

    O.apply_ctypes_fixes()
    suspicious = sorted(n for n in dir(ggml) if isinstance(getattr(ggml, n), ctypes._CFuncPtr)
                        and isinstance(getattr(ggml, n).restype, typing.NewType))
    assert suspicious == []


# -- the oracle against the recorded fixtures --------------------------------------------------------

def _fixture_plan(name, ext_alloc="malloc"):
    gf = gl.read_graph_file(fixture_path("ggml-seed", name))
    pre = []
    for i, rec in gf.records.items():  # contexts of the pre-allocated tensors (views of them follow)
        t = gf.tensors[i]
        if rec.get("preallocated") and t.view_src is None and not any(t.ctx is c for c in pre):
            pre.append(t.ctx)
    roots = [gf.tensors[i] for i in gf.expand_roots]
    return gf, O.ggml_plan(gf.graph, roots, pre, ext_alloc=ext_alloc)


@pytest.mark.parametrize("name", SINGLE_GRAPH_FIXTURES)
def test_oracle_reproduces_fixture(name):
    """The real ggml, driven by the oracle, puts every tensor where the recorded reference run did;
    its compute buffer (and each pre-allocated buffer) reports exactly 32 bytes less."""
    gf, res = _fixture_plan(name)
    doc = gf.doc
    assert res["reserve_ok"] and res["alloc_ok"]
    want = {i: r["offset"] for i, r in gf.records.items()}
    got = {i: res["offsets"][t] for i, t in gf.tensors.items()}
    assert got == want
    want_ext = {i: r["ext_offset"] for i, r in gf.records.items() if r.get("ext_offset") is not None}
    got_ext = {i: res["ext_offsets"][t] for i, t in gf.tensors.items() if t in res["ext_offsets"]}
    assert got_ext == want_ext
    assert res["buffer_size"] + O.CPU_BUFFER_SIZE_DELTA == doc["buffer_size"] == res["reference_buffer_size"]
    assert [s + O.CPU_BUFFER_SIZE_DELTA for s in res["ext_buffer_sizes"]] == \
        [e["size"] for e in doc.get("external_buffers", [])]


def test_reserved_address_space_gives_the_same_plan():
    """The fallback for weights too large to malloc lays them out as ggml_backend_alloc_ctx_tensors does."""
    gf, a = _fixture_plan("07_llama4_kvcache", "malloc")
    gf2, b = _fixture_plan("07_llama4_kvcache", "reserve")
    by_id = lambda gfx, r, key: {gfx.id_of(t): v for t, v in r[key].items()}  # noqa: E731
    assert by_id(gf, a, "offsets") == by_id(gf2, b, "offsets")
    assert by_id(gf, a, "ext_offsets") == by_id(gf2, b, "ext_offsets")
    assert a["buffer_size"] == b["buffer_size"]


# -- the mirror ------------------------------------------------------------------------------------

def _small_graph():
    ctx = gl.Context("compute")
    x = ctx.new_tensor_2d(gl.F32, 64, 8, name="x")
    gl.set_input(x)
    w = ctx.new_tensor_2d(gl.F16, 64, 128, name="w")
    h = gl.mul_mat(ctx, w, x)
    y = gl.soft_max(ctx, h)
    gl.set_output(y)
    z = gl.scale(ctx, h, 0.5)
    return ctx, x, w, h, y, z


def test_mirror_builds_the_same_graph_and_infers_roots():
    ctx, x, w, h, y, z = _small_graph()
    gf = gl.Graph()
    gl.build_forward_expand(gf, y)
    gl.build_forward_expand(gf, z)
    with O.mirror(gf) as m:  # roots inferred: y, z
        assert m.roots == [y, z]
        assert m.nodes() == gf.nodes and m.leafs() == gf.leafs
        c = m.ptr[y].contents
        assert list(c.ne) == [128, 8, 1, 1] and c.flags & 2 and m.ptr[x].contents.flags & 1


def test_mirror_reports_a_different_graph_order():
    """Expanding the roots in another order than ggml_lite did gives another node order: reported."""
    ctx, x, w, h, y, z = _small_graph()
    gf = gl.Graph()
    gl.build_forward_expand(gf, y)
    gl.build_forward_expand(gf, z)
    with pytest.raises(O.MirrorMismatch, match="order differs"):
        O.mirror(gf, roots=[z, y])


def test_offsets_are_none_outside_the_compute_buffer_and_sizes_keep_the_delta():
    """A graph whose only tensors are views of pre-allocated weights places nothing: ggml-python
    reports an empty compute buffer (0), the reference and ggml_lite 32 bytes."""
    wctx, ctx = gl.Context("weights"), gl.Context("compute")
    w = wctx.new_tensor_2d(gl.F32, 16, 4, name="w")
    v = gl.view_1d(ctx, w, 16, 64)
    gf = gl.build_forward(v)
    gl.alloc_ctx_tensors(wctx, gl.cpu_buffer_type())
    ref = O.ggml_plan(gf, [v], [wctx])
    assert ref["buffer_size"] == 0 and ref["reference_buffer_size"] == 32
    assert ref["offsets"] == {w: None, v: None} and ref["ext_offsets"] == {w: 0, v: 64}
    mine = O.lite_plan(gf, [w, v])
    assert O.compare_plans(mine, ref) == []


# -- random graphs -----------------------------------------------------------------------------------

@O.oracle_settings(max_examples=300)
@given(O.graphs())
def test_random_graph_plans_are_identical(rg):
    diffs = O.check_random_graph(rg)
    assert not diffs, _report(rg, diffs)


def test_shrinking_is_bounded():
    """`oracle_settings` bounds hypothesis's shrinking through its engine's constant (no public setting
    exists): the constant must still be there and lowered, else a failure could shrink for 5 minutes."""
    from hypothesis import Phase
    from hypothesis.internal.conjecture import engine

    s = O.oracle_settings(10)
    assert engine.MAX_SHRINKING_SECONDS <= O.SHRINK_SECONDS
    assert Phase.explain not in s.phases and s.database is None and s.derandomize


@pytest.mark.parametrize("first, count, max_ops", [(0, 1500, 40), (100_000, 100, 200)])
def test_seeded_random_graph_plans_are_identical(first, count, max_ops, long_run):
    """A seeded sweep (`random_graph(seed)` reproduces any failure; x20 with --long;
    `benchmarks/differential.py` runs any length). The second row builds larger graphs, with more
    fragmentation."""
    failures = []
    count *= 20 if long_run else 1
    for seed in range(first, first + count):
        rg = O.random_graph(seed, max_ops=max_ops)
        diffs = O.check_random_graph(rg)
        if diffs:
            failures.append(_report(rg, diffs))
    assert not failures, f"{len(failures)} of {count} graphs differ; the first:\n{failures[0]}"


def test_the_random_builder_covers_the_ops_and_flags():
    """The sweep above is only worth something if the graphs hold what they claim."""
    ops, flags, pre, multi_root, inplace = set(), 0, 0, 0, 0
    for seed in range(200):
        rg = O.random_graph(seed)
        pre += bool(rg.preallocated)
        multi_root += len(rg.roots) > 1
        for t in (*rg.graph.nodes, *rg.graph.leafs):
            ops.add(t.op.name if t.op is not Op.UNARY else t.unary_op.name)
            flags |= int(t.flags)
            inplace += t.view_src is not None and t.op not in gl.VIEW_OPS and t.op is not Op.CPY
        mid = [t for t in rg.graph.nodes[:-1] if t.flags & (gl.TensorFlag.INPUT | gl.TensorFlag.OUTPUT)]
        flags |= 8 if mid else 0
    assert {"ADD", "SUB", "MUL", "DIV", "SCALE", "SQR", "SQRT", "SILU", "GELU", "RELU", "RMS_NORM", "NORM",
            "SOFT_MAX", "MUL_MAT", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "CONT", "CPY", "GET_ROWS",
            "ROPE", "DIAG_MASK_INF"} <= ops
    assert flags & 15 == 15  # INPUT, OUTPUT, PARAM, and flags on tensors in the middle of graphs
    assert pre > 30 and multi_root > 100 and inplace > 50
    types = {t.type.name for seed in range(50) for t in O.random_graph(seed).tensors}
    assert {"f32", "f16", "q8_0", "i32"} <= types


def test_the_reproducer_rebuilds_the_graph():
    """`RandomGraph.source()` (printed with every failure) builds the same graph, and plans the same."""
    for seed in range(40):
        rg = O.random_graph(seed)
        ns = {}
        exec(rg.source(), ns)
        sig = lambda g: [(t.name, t.op.name, list(t.ne), list(t.nb), int(t.flags), t.type.name)  # noqa: E731
                         for t in (*g.nodes, *g.leafs)]
        assert sig(ns["gf"]) == sig(rg.graph), seed
    mine = O.lite_plan(ns["gf"], list(ns["gf"].nodes))
    theirs = O.lite_plan(rg.graph, list(rg.graph.nodes))
    assert [mine["offsets"][t] for t in ns["gf"].nodes] == [theirs["offsets"][t] for t in rg.graph.nodes]


def test_a_broken_allocator_is_caught(monkeypatch):
    """The comparison can fail: without in-place reuse for ADD, ggml_lite's plans differ from ggml's."""
    import ggml_lite.gallocr as gallocr

    monkeypatch.setattr(gallocr, "CAN_INPLACE", gallocr.CAN_INPLACE - {Op.ADD})
    differing = [seed for seed in range(100) if O.check_random_graph(O.random_graph(seed))]
    assert len(differing) > 5


def test_one_allocator_across_graphs():
    """An allocator reused across graphs (as between evaluations): the same graph again keeps the
    plan, another graph is planned again; offsets equal after every call, buffer sizes as modelled
    (`ggml_oracle.check_sequence`)."""
    failures = []
    for s in range(100):
        a, b = 3 * s, 3 * s + 1
        seq = [O.random_graph(x) for x in (a, a, b, a, b, b)]
        diffs = O.check_sequence(seq, "reserve" if s % 2 else "alloc_graph")
        if diffs:
            failures.append(f"sequence of seeds {a}, {a}, {b}, {a}, {b}, {b}: "
                            + "; ".join(f"step {k}: {d}" for k, d in diffs[:5]))
    assert not failures, "\n".join(failures[:5])


def test_one_allocator_two_graphs_with_the_same_counts():
    """Graph B after graph A with the same node and leaf counts: both allocators decide alike whether
    A's plan still fits B (`needs_realloc` compares sizes by position) and place B alike. The one
    allowed difference is the reference's assert, see the next test."""
    by_counts = {}
    for seed in range(1500):
        rg = O.random_graph(seed)
        by_counts.setdefault((rg.graph.n_nodes, rg.graph.n_leafs), []).append(seed)
    pairs = [(v[i], v[i + 1]) for v in by_counts.values() for i in range(len(v) - 1)]
    assert len(pairs) > 500
    failures, asserted = [], []
    for a, b in pairs:
        diffs = O.check_sequence([O.random_graph(a), O.random_graph(b)])
        if any(d.what == "PlanMismatchError" for _, d in diffs):
            asserted.append((a, b))
        elif diffs:
            failures.append(f"seeds {a} then {b}: " + "; ".join(f"step {k}: {d}" for k, d in diffs[:5]))
    assert not failures, "\n".join(failures[:5])
    assert len(asserted) <= 3, asserted  # rare: seeds (1381, 1384) is one


def _graph(names, sizes, ops):
    """Two INPUT leafs `names` of f32 `sizes`; node 0 = ops[0](leaf0), node 1 = ops[1](leaf1, leaf0)."""
    ctx = gl.Context("compute")
    l0, l1 = (ctx.new_tensor_1d(gl.F32, n, name=s) for s, n in zip(names, sizes))
    gl.set_input(l0)
    gl.set_input(l1)
    n0 = ops[0](ctx, l0)
    n1 = ops[1](ctx, l1, l0)
    gf = gl.Graph()
    gl.build_forward_expand(gf, n0)
    gl.build_forward_expand(gf, n1)
    return O.RandomGraph(gf, [n0, n1], [ctx], [])


def test_a_kept_plan_too_small_for_a_leaf():
    """A ggml bug the differential sweep found, and where ggml_lite and ggml 0.15.3 part ways.

    Graph A: leafs x (256 B), p (4 B); node_0 = sqr(x), node_1 = mul(x, p).
    Graph B: leafs y (4 B), q (256 B); node_0 = sqr(y), node_1 = add(q, y).
    Same counts, and every node and node source fits A's plan position by position, so
    `ggml_gallocr_needs_realloc` keeps the plan — it never looks at `leaf_allocs`. `alloc_graph`
    then places leaf q in p's 32-byte slot at offset 256, overlapping node_0 at 288, which is written
    (step 0) before q is read (step 1). The reference, built with asserts, stops in
    `ggml_gallocr_init_tensor`; ggml_lite raises `PlanMismatchError` there; ggml-python's release
    build places q anyway."""
    A = _graph(("x", "p"), (64, 1), (gl.sqr, lambda c, a, b: gl.mul(c, b, a)))
    B = _graph(("y", "q"), (1, 64), (gl.sqr, lambda c, a, b: gl.add(c, a, b)))
    lite = gl.GAllocr(gl.cpu_buffer_type())
    assert lite.alloc_graph(A.graph)
    with pytest.raises(gl.PlanMismatchError, match="'q' .* needs 256 bytes, but the plan reserved 4 bytes"):
        lite.alloc_graph(B.graph)

    g = O.need_ggml()
    galloc = g.ggml_gallocr_new(g.ggml_backend_cpu_buffer_type())
    with O.mirror(A.graph, A.roots) as ma, O.mirror(B.graph, B.roots) as mb:
        assert g.ggml_gallocr_alloc_graph(galloc, ma.gf) and g.ggml_gallocr_alloc_graph(galloc, mb.gf)
        base = g.ggml_backend_buffer_get_base(mb.ptr[B.roots[0]].contents.buffer)
        off = {t.name: mb.ptr[t].contents.data - base for t in (*B.graph.leafs, *B.graph.nodes)}
        assert off == {"y": 0, "q": 256, "node_0": 288, "node_1": 0}  # q = [256, 512) holds node_0
    g.ggml_gallocr_free(galloc)


def test_an_output_view_does_not_keep_its_source_alive():
    """Both allocators agree on a ggml quirk: OUTPUT on a view does not keep the viewed tensor. `a` is
    freed after the last user of its OUTPUT view `v`, and `c` is then placed over it, so reading `v`
    after the graph ran gives `c`'s values (`ggml_gallocr_free_node` only looks at the flags of the
    tensor it frees)."""
    wctx, ctx = gl.Context("weights"), gl.Context("compute")
    x = wctx.new_tensor_1d(gl.F32, 64, name="x")
    a = gl.sqr(ctx, x).set_name("a")
    v = gl.view_1d(ctx, a, 64, 0).set_name("v")
    gl.set_output(v)
    b = gl.cont(ctx, v).set_name("b")
    c = gl.cont(ctx, b).set_name("c")
    gf = gl.build_forward(c)
    gl.alloc_ctx_tensors(wctx, gl.cpu_buffer_type())
    ref = O.ggml_plan(gf, [c], [wctx])
    mine = O.lite_plan(gf, list(ref["offsets"]))
    assert O.compare_plans(mine, ref) == []
    assert {t.name: off for t, off in ref["offsets"].items()} == {"x": None, "a": 0, "v": 0, "b": 256, "c": 0}
