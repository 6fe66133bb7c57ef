"""The ops of a mixture of experts and ggml_cast against the real ggml (ggml-python 0.0.45, ggml 0.15.3,
through the oracle's mirror): ARGSORT, top_k (ARGSORT and a VIEW), MUL_MAT_ID and ggml_cast (a CPY whose
src[1] is itself) give the same type, shape, strides, op_params, sources, view offsets and automatic names,
graph order and plan (the cast's self-edge counted as ggml counts it).

Where ggml 0.15.3 differs from mid-2024's (1d1ccce): `ggml_top_k` became an op of its own (TOP_K, a
contiguous `[k, ...]` tensor); the 2024 form lives on as `ggml_argsort_top_k`, which is what ggml_lite's
`top_k` is compared with. `ggml_argsort` now asserts `ne[0] <= INT32_MAX` (no 2024 shape reaches it)."""

import ctypes

import numpy as np
import pytest

import ggml_lite as gl
import ggml_oracle as O
from ggml_lite.exact import libm_exact
from ggml_lite.quants import quantize_row_q4_0_ref, quantize_row_q8_0_ref
from ggml_oracle import normwise_error
from ggml_oracle.bindings import _type_code
from ggml_oracle.mirror import mirror

pytestmark = pytest.mark.skipif(
    not O.available(), reason=f"the real ggml is not available: `import ggml` (ggml-python) failed: {O.IMPORT_ERROR}")


def moe_block(ctx, n_embd, n_ff, n_expert, n_used, n_tokens, types, norm_w=True, name="cur"):
    """llama.cpp's `llm_build_moe_ffn` (1d1ccce, SiLU, weights normalised): gate logits, softmax, top-k,
    the weights by get_rows (summed and divided), three MUL_MAT_IDs, and the experts' weighted sum by views.
    `types` = (gate_inp, up_exps, gate_exps, down_exps). Returns (moe_out, {name: tensor})."""
    t_inp, t_up, t_gate, t_down = types
    cur = ctx.new_tensor_2d(gl.F32, n_embd, n_tokens, name=name)
    w = {"cur": cur,
         "ffn_gate_inp": ctx.new_tensor_2d(t_inp, n_embd, n_expert, name="ffn_gate_inp"),
         "ffn_up_exps": ctx.new_tensor_3d(t_up, n_embd, n_ff, n_expert, name="ffn_up_exps"),
         "ffn_gate_exps": ctx.new_tensor_3d(t_gate, n_embd, n_ff, n_expert, name="ffn_gate_exps"),
         "ffn_down_exps": ctx.new_tensor_3d(t_down, n_ff, n_embd, n_expert, name="ffn_down_exps")}
    logits = gl.mul_mat(ctx, w["ffn_gate_inp"], cur).set_name("ffn_moe_logits")
    probs = gl.soft_max(ctx, logits).set_name("ffn_moe_probs")
    sel = gl.top_k(ctx, probs, n_used).set_name("ffn_moe_topk")
    sel.src[0].set_name("ffn_moe_argsort")
    weights = gl.get_rows(ctx, gl.reshape_3d(ctx, probs, 1, n_expert, n_tokens), sel).set_name("ffn_moe_weights")
    if norm_w:
        weights = gl.reshape_2d(ctx, weights, n_used, n_tokens)
        wsum = gl.sum_rows(ctx, weights).set_name("ffn_moe_weights_sum")
        weights = gl.div(ctx, weights, wsum).set_name("ffn_moe_weights_norm")
        weights = gl.reshape_3d(ctx, weights, 1, n_used, n_tokens)
    cur3 = gl.reshape_3d(ctx, cur, n_embd, 1, n_tokens)
    up = gl.mul_mat_id(ctx, w["ffn_up_exps"], cur3, sel).set_name("ffn_moe_up")
    gate = gl.mul_mat_id(ctx, w["ffn_gate_exps"], cur3, sel).set_name("ffn_moe_gate")
    gate = gl.silu(ctx, gate).set_name("ffn_moe_silu")
    par = gl.mul(ctx, up, gate).set_name("ffn_moe_gate_par")
    experts = gl.mul_mat_id(ctx, w["ffn_down_exps"], par, sel).set_name("ffn_moe_down")
    experts = gl.mul(ctx, experts, weights)
    out = None
    for i in range(n_used):
        e = gl.view_2d(ctx, experts, n_embd, n_tokens, experts.nb[2], i * experts.nb[1])
        out = e if out is None else gl.add(ctx, out, e)
    if n_used == 1:
        out = gl.cont(ctx, out)
    w.update(logits=logits, probs=probs, sel=sel, experts=experts)
    return out, w


# n_embd, n_ff, n_expert, n_used, n_tokens, (gate_inp, up_exps, gate_exps, down_exps)
MOE_CASES = [
    (64, 96, 8, 2, 5, (gl.F32, gl.F16, gl.F16, gl.F16)),  # Mixtral's 2 of 8
    (64, 64, 4, 1, 3, (gl.F16, gl.Q8_0, gl.Q8_0, gl.Q8_0)),  # one expert per token: the cont at the end
    (32, 64, 6, 3, 7, (gl.F32, gl.Q4_0, gl.Q4_0, gl.Q8_0)),
    (64, 32, 8, 8, 1, (gl.F32, gl.F32, gl.F32, gl.F32)),  # every expert used, one token
]


@pytest.mark.parametrize("case", MOE_CASES, ids=[f"moe{i}" for i in range(len(MOE_CASES))])
def test_an_moe_block_mirrors_and_plans_as_ggml(case):
    """Every tensor of the block (types, ne, nb, op, op_params, src, view root and offset), the node and leaf
    order, and the graph allocator's plan equal ggml's."""
    n_embd, n_ff, n_expert, n_used, n_tokens, types = case
    ctx = gl.Context("moe")
    out, _ = moe_block(ctx, n_embd, n_ff, n_expert, n_used, n_tokens, types)
    gl.set_output(out)
    gf = gl.build_forward(out)
    ref = O.ggml_plan(gf, [out])
    mine = O.lite_plan(gf, list(ref["offsets"]))
    assert O.compare_plans(mine, ref) == []
    assert {t.op for t in gf.nodes} >= {gl.Op.ARGSORT, gl.Op.MUL_MAT_ID, gl.Op.GET_ROWS, gl.Op.VIEW}


@pytest.mark.parametrize("ne,order", [([8, 5, 1, 1], 1), ([7, 3, 2, 1], 0), ([33, 2, 2, 2], 1), ([1, 4, 1, 1], 0)])
def test_argsort_mirrors(ne, order):
    ctx = gl.Context("argsort")
    a = ctx.new_tensor(gl.F32, ne, name="a")
    s = gl.argsort(ctx, a, order)
    mirror([s]).close()  # raises MirrorMismatch on any difference
    assert s.op_params[0] == order and s.type is gl.I32


@pytest.mark.parametrize("ids_kind", ["top_k", "contiguous"])
@pytest.mark.parametrize("b_cols", [1, 2, 4])
def test_mul_mat_id_mirrors(ids_kind, b_cols):
    """b with one column per token (broadcast over the used experts) or one per used expert (or a divisor)."""
    ctx = gl.Context("mmid")
    ex = ctx.new_tensor_3d(gl.Q8_0, 64, 48, 8, name="exps")
    b = ctx.new_tensor_3d(gl.F32, 64, b_cols, 6, name="b")
    ids = (gl.top_k(ctx, ctx.new_tensor_2d(gl.F32, 8, 6, name="probs"), 4) if ids_kind == "top_k"
           else ctx.new_tensor_2d(gl.I32, 4, 6, name="ids"))
    r = gl.mul_mat_id(ctx, ex, b, ids)
    mirror([r]).close()
    assert r.ne == [48, 4, 6, 1]


@pytest.mark.parametrize("to", [gl.F16, gl.F32, gl.Q8_0, gl.Q4_0])
def test_cast_mirrors_with_its_self_edge(to):
    ctx = gl.Context("cast")
    m = ctx.new_tensor_2d(gl.F32, 64, 32, name="KQ_mask")
    c = gl.cast(ctx, m, to)
    mm = mirror([c])
    try:  # the mirror compares src[1] too: ggml's points at the result itself
        p = mm.ptr[c].contents
        assert ctypes.cast(p.src[1], ctypes.c_void_p).value == ctypes.cast(mm.ptr[c], ctypes.c_void_p).value
    finally:
        mm.close()


def _ggml_ctx(g):
    params = g.ggml_init_params(mem_size=64 * g.ggml_tensor_overhead(), mem_buffer=None, no_alloc=True)
    return g.ggml_init(params)


def _name(p) -> str:
    return bytes(p.contents.name).split(b"\0")[0].decode()


def test_automatic_names_views_and_today_s_top_k():
    """What the constructors name and lay out, called directly in ggml (the mirror sets names itself):
    ggml_cast's "<a> (copy)", ggml_argsort_top_k's unnamed ARGSORT and its " (view)" (offset 0, the
    argsort's strides) — ggml_lite's top_k — and today's ggml_top_k, an op TOP_K of its own."""
    g = O.need_ggml()
    ctx = _ggml_ctx(g)
    lite = gl.Context("names")
    try:
        m = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 64, 32)
        g.ggml_set_name(m, b"KQ_mask")
        c = g.ggml_cast(ctx, m, g.GGML_TYPE_F16)
        lc = gl.cast(lite, lite.new_tensor_2d(gl.F32, 64, 32, name="KQ_mask"), gl.F16)
        assert _name(c) == lc.name == "KQ_mask (copy)" and not c.contents.view_src
        probs = g.ggml_new_tensor_3d(ctx, g.GGML_TYPE_F32, 8, 5, 3)
        lp = lite.new_tensor_3d(gl.F32, 8, 5, 3)
        v, lv = g.ggml_argsort_top_k(ctx, probs, 2), gl.top_k(lite, lp, 2)
        s, ls = v.contents.src[0], lv.src[0]
        assert (_name(v), list(v.contents.ne), list(v.contents.nb), v.contents.view_offs) == \
               (lv.name, lv.ne, lv.nb, lv.view_offs) == (" (view)", [2, 5, 3, 1], [4, 32, 160, 480], 0)
        assert (_name(s), s.contents.op, s.contents.op_params[0]) == (ls.name, g.GGML_OP_ARGSORT, 1)
        assert ls.name == "" and ls.op is gl.Op.ARGSORT and ls.op_params[0] == 1
        today = g.ggml_top_k(ctx, probs, 2).contents  # 2025: an op of its own, contiguous, no view
        assert (today.op, list(today.ne), list(today.nb), bool(today.view_src)) == \
               (g.GGML_OP_TOP_K, [2, 5, 3, 1], [4, 8, 40, 120], False)
        ex = g.ggml_new_tensor_3d(ctx, _type_code(gl.Q4_0), 64, 48, 8)
        b = g.ggml_new_tensor_3d(ctx, g.GGML_TYPE_F32, 64, 1, 5)
        ids = g.ggml_argsort_top_k(ctx, g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 8, 5), 2)
        r = g.ggml_mul_mat_id(ctx, ex, b, ids).contents
        lids = gl.top_k(lite, lite.new_tensor_2d(gl.F32, 8, 5), 2)
        lr = gl.mul_mat_id(lite, lite.new_tensor_3d(gl.Q4_0, 64, 48, 8), lite.new_tensor_3d(gl.F32, 64, 1, 5), lids)
        assert (_name(ctypes.pointer(r)), list(r.ne), list(r.nb), r.type) == (lr.name, lr.ne, lr.nb, 0)
    finally:
        g.ggml_free(ctx)


def _cast_graph(self_edge: bool = True):
    """A cast nothing reads (expanded first, not an output), then scale and mul_mat; inputs pre-allocated."""
    wctx, ctx = gl.Context("inputs"), gl.Context("compute")
    mask = wctx.new_tensor_2d(gl.F32, 64, 32, name="KQ_mask")
    x = wctx.new_tensor_2d(gl.F32, 64, 32, name="x")
    w = wctx.new_tensor_2d(gl.F16, 64, 16, name="w")
    lone = gl.cast(ctx, mask, gl.F16)
    b = gl.mul_mat(ctx, w, gl.scale(ctx, x, 2.0))
    gl.set_output(b)
    if not self_edge:
        lone.src = lone.src[:1]
    gf = gl.Graph()
    for r in (lone, b):
        gl.build_forward_expand(gf, r)
    gl.alloc_ctx_tensors(wctx, gl.cpu_buffer_type())
    return gf, [lone, b], wctx, ctx


def test_the_cast_s_self_edge_frees_it_at_its_own_step_as_in_ggml():
    """The graph allocator counts src[1] = itself as a child, which the cast's own step takes back: a cast
    nothing else reads is freed right after it is computed (it would never be, without the edge), and the
    next tensor reuses its bytes — in ggml and in ggml_lite alike."""
    gf, roots, wctx, ctx = _cast_graph()
    ref = O.ggml_plan(gf, roots, [wctx])
    mine = O.lite_plan(gf, list(ref["offsets"]))
    assert O.compare_plans(mine, ref) == []
    lone, scaled, b = gf.nodes
    assert (ref["offsets"][lone], ref["offsets"][scaled], ref["offsets"][b]) == (0, 0, 8192)
    assert ref["reference_buffer_size"] == 10240 + 32
    gf2, _, _, ctx2 = _cast_graph(self_edge=False)  # the counterfactual: the cast kept, the buffer larger
    assert O.lite_plan(gf2, list(ctx2.tensors))["buffer_size"] == 14336 + 32


# -- the CPU kernels (appendix A7) against ggml's -----------------------------------------------------

EXACT_ORDER = O.sums_in_reproduced_order()  # the oracle built as the exact tier reproduces (test_compute_differential)
WORST: dict = {}  # case -> figures, printed with -s


def _values(t, rng, lo=-1.0, hi=1.0) -> bytes:
    """Seeded bytes for a data tensor of type f32, f16, q8_0 or q4_0 (quantized by ggml's reference quantizers)."""
    v = rng.uniform(lo, hi, t.nelements).astype(np.float32)
    if t.type is gl.F32:
        return v.tobytes()
    if t.type is gl.F16:
        return v.astype(np.float16).tobytes()
    quantize = quantize_row_q8_0_ref if t.type is gl.Q8_0 else quantize_row_q4_0_ref
    return quantize(v.reshape(-1, t.ne[0])).tobytes()


def _lite(gf, ctx, data, exact=False):
    """Compute `gf` with ggml_lite's CPU backend (numpy tier, or the exact tier of appendix A2)."""
    cpu = gl.cpu_init(exact=exact)
    buf = gl.alloc_ctx_tensors(ctx, cpu)
    for t, raw in data.items():
        gl.tensor_set(t, raw)
    with libm_exact():
        cpu.graph_compute(gf)
    return buf


def _f32(t) -> np.ndarray:
    return gl.tensor_get(t).astype(np.float64).reshape(-1)


def _exchange_sort(row, desc: bool) -> list:
    """ggml_compute_forward_argsort_f32's loop of 1d1ccce, transcribed literally (the reference for ties)."""
    d = list(range(len(row)))
    for j in range(len(row)):
        for k in range(j + 1, len(row)):
            if (not desc and row[d[j]] > row[d[k]]) or (desc and row[d[j]] < row[d[k]]):
                d[j], d[k] = d[k], d[j]
    return d


@pytest.mark.parametrize("ne,order", [([8, 5, 1, 1], 1), ([7, 3, 2, 1], 0), ([33, 6, 2, 2], 1), ([1, 4, 1, 1], 0),
                                      ([128, 3, 1, 1], 0)])
def test_argsort_computes_what_ggml_computes(ne, order):
    """Distinct values: the same indices as ggml, exactly (every sort agrees there)."""
    ctx = gl.Context("argsort")
    a = ctx.new_tensor(gl.F32, ne, name="a")
    s = gl.argsort(ctx, a, order)
    gf = gl.build_forward(s)
    rng = np.random.default_rng(ne[0] * 10 + order)
    data = {a: rng.permutation(a.nelements).astype(np.float32).tobytes()}  # distinct values
    buf = _lite(gf, ctx, data)
    (theirs,) = O.run_isolated(O.ggml_compute, gf, [s], (), data, [s])
    assert gl.tensor_get(s).tobytes() == theirs
    del buf


def test_argsort_ties_and_nan_as_1d1ccce_sorts_them():
    """Equal values and NaNs: the exchange sort of 1d1ccce, position by position (a literal transcription of
    its loop is the reference); ggml 0.15.3's std::sort puts ties elsewhere ([1, 1, 2] descending: 2024
    [2, 1, 0], ggml 0.15.3 [2, 0, 1]) and is compared only where the rows have no ties."""
    rows = [[1, 1, 2, 0], [0.25, 0.25, 0.5, 0.0], [3, 1, 3, 2], [2, 2, 2, 2], [1, np.nan, 0, 2], [-0.0, 0.0, 1, -1],
            [np.nan, np.nan, 1, 1], [5, 4, 3, 2]]
    rng = np.random.default_rng(26)
    rows += [list(rng.integers(0, 4, 12).astype(float)) for _ in range(40)]  # many ties
    for order in (gl.SortOrder.ASC, gl.SortOrder.DESC):
        ctx = gl.Context("ties")
        a = ctx.new_tensor_2d(gl.F32, 4, len(rows[:8]), name="a")
        b = ctx.new_tensor_2d(gl.F32, 12, 40, name="b")
        sa, sb = gl.argsort(ctx, a, order), gl.argsort(ctx, b, order)
        gf = gl.Graph()
        for r in (sa, sb):
            gl.build_forward_expand(gf, r)
        data = {a: np.array(rows[:8], np.float32).tobytes(), b: np.array(rows[8:], np.float32).tobytes()}
        buf = _lite(gf, ctx, data)
        got = [*gl.tensor_get(sa).reshape(8, 4).tolist(), *gl.tensor_get(sb).reshape(40, 12).tolist()]
        assert got == [_exchange_sort(np.array(r, np.float32), order == gl.SortOrder.DESC) for r in rows]
        del buf
    ctx = gl.Context("today")
    a = ctx.new_tensor_1d(gl.F32, 3, name="a")
    s = gl.argsort(ctx, a, gl.SortOrder.DESC)
    data = {a: np.array([1, 1, 2], np.float32).tobytes()}
    (theirs,) = O.run_isolated(O.ggml_compute, gl.build_forward(s), [s], (), data, [s])
    assert np.frombuffer(theirs, np.int32).tolist() == [2, 0, 1] and _exchange_sort([1, 1, 2], True) == [2, 1, 0]


# experts type, b columns per token (1: broadcast; n_used: one per slot), b type, ids as a top-k view
MMID_CASES = [(t, cols, bt, view) for t in (gl.F32, gl.F16, gl.Q8_0, gl.Q4_0) for cols, view in ((1, True), (3, False))
              for bt in (gl.F32,)] + [(gl.F16, 3, gl.F16, True), (gl.Q8_0, 1, gl.Q8_0, False)]


@pytest.mark.parametrize("case", MMID_CASES, ids=[f"{c[0].name}-b{c[1]}-{c[2].name}-{'view' if c[3] else 'ids'}"
                                                  for c in MMID_CASES])
def test_mul_mat_id_computes_what_ggml_computes(case):
    """MUL_MAT_ID: src1 converted to the experts' dot type (or given in it), columns per expert, ids a
    strided top-k view or a plain i32 matrix: within the stated tolerance of ggml (numpy tier), and the
    exact tier bit for bit where the oracle sums in the reproduced order."""
    etype, cols, btype, view = case
    n_embd, n_out, n_expert, n_used, n_tok = 64, 40, 6, 3, 7
    ctx = gl.Context("mmid")
    ex = ctx.new_tensor_3d(etype, n_embd, n_out, n_expert, name="exps")
    b = ctx.new_tensor_3d(btype, n_embd, cols, n_tok, name="b")
    probs = ctx.new_tensor_2d(gl.F32, n_expert, n_tok, name="probs")
    ids = gl.top_k(ctx, probs, n_used) if view else ctx.new_tensor_2d(gl.I32, n_used, n_tok, name="ids")
    r = gl.mul_mat_id(ctx, ex, b, ids)
    gl.set_output(r)
    gf = gl.build_forward(r)
    rng = np.random.default_rng(len(WORST) + 7)
    data = {ex: _values(ex, rng), b: _values(b, rng)}
    if view:
        data[probs] = rng.permutation(probs.nelements).astype(np.float32).tobytes()
    else:  # repeated experts in a row are allowed too
        data[ids] = rng.integers(0, n_expert, ids.nelements).astype(np.int32).tobytes()
    (theirs,) = O.run_isolated(O.ggml_compute, gf, [r], (), data, [r])
    ref = np.frombuffer(theirs, np.float32).astype(np.float64)
    buf = _lite(gf, ctx, data)
    err = normwise_error(_f32(r), ref)
    buf2 = _lite(gf, ctx, data, exact=True)
    exact_same = gl.tensor_get(r).tobytes() == theirs
    WORST[case] = (err, exact_same)
    print(f"MUL_MAT_ID {case}: normwise error {err:.2e} (numpy tier), exact tier bit-identical: {exact_same}")
    mixed = etype is not gl.F32 or btype is not gl.F32
    assert err <= (gl.cpu.Arithmetic.TOLERANCE_MIXED if mixed else gl.cpu.Arithmetic.TOLERANCE_F32), err
    assert exact_same or not EXACT_ORDER
    del buf, buf2


@pytest.mark.parametrize("to", [gl.F16, gl.Q8_0])
def test_cast_computes_what_ggml_computes(to):
    """ggml_cast's CPY (chapter 07's copy kernel, the node its own destination): the same bytes as ggml —
    the f16 causal mask of flash attention (-inf kept), and a q8_0 cast with the exact tier's quantizer."""
    ctx = gl.Context("cast")
    m = ctx.new_tensor_2d(gl.F32, 64, 32, name="KQ_mask")
    c = gl.cast(ctx, m, to)
    gf = gl.build_forward(c)
    if to is gl.F16:
        v = np.where(np.arange(64)[None, :] <= 30 + np.arange(32)[:, None], 0, -np.inf).astype(np.float32)
    else:
        v = np.random.default_rng(1).uniform(-2, 2, (32, 64)).astype(np.float32)
    data = {m: v.tobytes()}
    (theirs,) = O.run_isolated(O.ggml_compute, gf, [c], (), data, [c])
    buf = _lite(gf, ctx, data, exact=to is gl.Q8_0)
    assert gl.tensor_get(c).tobytes() == theirs
    del buf


@pytest.mark.parametrize("case", MOE_CASES, ids=[f"moe{i}" for i in range(len(MOE_CASES))])
def test_an_moe_block_computes_what_ggml_computes(case):
    """llama.cpp's MoE FFN end to end (gate logits -> soft_max -> top_k -> get_rows of the weights ->
    sum_rows/div -> three MUL_MAT_IDs -> mul -> views -> add): ggml_lite's numpy tier within the stated
    tolerance of ggml, and the same experts chosen."""
    n_embd, n_ff, n_expert, n_used, n_tokens, types = case
    ctx = gl.Context("moe")
    out, w = moe_block(ctx, n_embd, n_ff, n_expert, n_used, n_tokens, types)
    gl.set_output(out)
    gl.set_output(w["sel"].view_src)  # (an OUTPUT view would not keep the argsort alive, in ggml either)
    gf = gl.Graph()
    for r in (w["sel"], out):
        gl.build_forward_expand(gf, r)
    rng = np.random.default_rng(sum(case[:5]))
    data = {t: _values(t, rng, -0.5, 0.5) for name, t in w.items() if name.startswith("ffn_") and t.op is gl.Op.NONE}
    data[w["cur"]] = _values(w["cur"], rng, -2, 2)
    sel_theirs, theirs = O.run_isolated(O.ggml_compute, gf, [w["sel"], out], (), data, [w["sel"], out])
    buf = _lite(gf, ctx, data)
    sel = w["sel"]  # a strided view: ggml's bytes span its rows, n_expert ids apart
    picked = np.frombuffer(sel_theirs, np.int32)[np.arange(n_tokens)[:, None] * n_expert + np.arange(n_used)]
    assert gl.tensor_get(sel).reshape(n_tokens, n_used).tolist() == picked.tolist()  # the same experts
    err = normwise_error(_f32(out), np.frombuffer(theirs, np.float32).astype(np.float64))
    mixed = any(t is not gl.F32 for t in types)
    buf2 = _lite(gf, ctx, data, exact=True)
    exact_same = gl.tensor_get(out).tobytes() == theirs
    WORST[("moe", case)] = (err, exact_same)
    print(f"MoE block {case}: normwise error {err:.2e} (numpy tier), exact tier bit-identical: {exact_same}")
    assert err <= (gl.cpu.Arithmetic.TOLERANCE_MIXED if mixed else gl.cpu.Arithmetic.TOLERANCE_F32), err
    assert exact_same or not EXACT_ORDER
    del buf, buf2
