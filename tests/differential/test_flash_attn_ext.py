"""FLASH_ATTN_EXT against the real ggml (ggml-python, through the oracle's mirror): the same call gives
the same type, shape, strides, op_params (the precision word included), sources and name, for several
q/k/v/mask shapes, grouped-query attention among them; and appendix A7's CPU kernel computes what ggml's
computes on the same cases, within `Arithmetic.TOLERANCE_MIXED` (5e-3 normwise: Q rounded to f16 for the
dot products and V summed in an f16 accumulator, as ggml does, leave summation order and exp's last bits),
and what plain numpy's softmax(k·q·scale + slope·mask)·v computes in float64, within the same (with f32
K and V, `TOLERANCE_F32`, 1e-4). The
shapes keep V's head size equal to K's and the mask f16, where mid-2024 ggml (the result's ne[0] from q)
and today's (from v, mask f16 asserted) agree."""

import numpy as np
import pytest

import ggml_lite as gl
import ggml_oracle as O
from ggml_lite.backend import tensor_get, tensor_set
from ggml_oracle import normwise_error
from ggml_oracle.mirror import mirror

pytestmark = pytest.mark.skipif(
    not O.available(), reason=f"the real ggml is not available: `import ggml` (ggml-python) failed: {O.IMPORT_ERROR}")

#  head, queries, heads, kv cells, kv heads, mask rows (None: no mask), scale, max_bias, softcap, prec
CASES = [
    (64, 7, 8, 256, 8, 32, 0.125, 0.0, 0.0, None),
    (64, 7, 8, 256, 2, 32, 0.125, 0.0, 0.0, gl.GGML_PREC_F32),  # GQA 4:1, f32 precision
    (128, 1, 32, 512, 8, 32, 0.0884, 0.0, 0.0, None),  # one token of a 70B-like layer
    (32, 33, 4, 96, 1, 64, 0.25, 8.0, 0.0, None),  # multi-query, ALiBi, 33 queries padded to 64 rows
    (16, 40, 6, 48, 3, 96, 1.0, 0.0, 30.0, gl.GGML_PREC_DEFAULT),  # softcap, a mask with more rows than needed
    (80, 5, 4, 40, 2, None, 0.5, 0.0, 0.0, None),  # no mask
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_flash_attn_ext_matches_ggml(case):
    head, n_q, n_head, n_kv, n_head_kv, mask_rows, scale, max_bias, softcap, prec = case
    ctx = gl.Context("fa")
    q = ctx.new_tensor_3d(gl.F32, head, n_q, n_head, name="q")
    k = ctx.new_tensor_3d(gl.F16, head, n_kv, n_head_kv, name="k")
    v = ctx.new_tensor_3d(gl.F16, head, n_kv, n_head_kv, name="v")
    mask = None if mask_rows is None else ctx.new_tensor_2d(gl.F16, n_kv, mask_rows, name="KQ_mask")
    fa = gl.flash_attn_ext(ctx, q, k, v, mask, scale, max_bias, softcap)
    if prec is not None:
        gl.flash_attn_ext_set_prec(fa, prec)
    out = gl.reshape_2d(ctx, fa, head * n_head, n_q)
    m = mirror([out])  # raises MirrorMismatch on any difference of type, ne, nb, op, op_params, src, view
    try:
        p = m.ptr[fa].contents
        assert list(p.ne) == [head, n_head, n_q, 1] and p.type == 0  # f32, permuted
        assert bytes(p.name).split(b"\0")[0].decode() == fa.name == "node_0"  # the graph names it as ggml does
        assert gl.ops.op_call(fa).then == (("flash_attn_ext_set_prec", prec or 0),)
    finally:
        m.close()


def test_views_of_a_cache_as_k_and_v():
    """K and V as views of a cache (llama.cpp's path): strided views are accepted and mirrored."""
    ctx = gl.Context("fa_cache")
    cache = ctx.new_tensor_1d(gl.F16, 64 * 2 * 128, name="cache_k")
    q = ctx.new_tensor_3d(gl.F32, 64, 3, 4, name="q")
    kv = gl.view_3d(ctx, cache, 64, 96, 2, 64 * 2 * 2, 64 * 2, 0)
    mask = ctx.new_tensor_2d(gl.F16, 96, 32, name="KQ_mask")
    fa = gl.flash_attn_ext(ctx, q, kv, kv, mask, 0.125, 0.0, 0.0)
    mirror([fa]).close()
    assert fa.ne == [64, 4, 3, 1]


# -- the CPU kernel (appendix A7) against ggml's and against plain numpy ------------------------------

TOL = gl.cpu.Arithmetic.TOLERANCE_MIXED  # normwise, max |ours - theirs| / max |theirs|
WORST: dict = {}  # case -> (error against ggml, error against numpy): printed with -s


def _graph(case, kv_type=gl.F16):
    """The case's graph, its data (seeded; a causal mask of -inf past each query's position) and its
    context (its tensors allocated by the caller): (fa, graph, data, ctx)."""
    head, n_q, n_head, n_kv, n_head_kv, mask_rows, scale, max_bias, softcap, prec = case
    rng = np.random.default_rng(n_q * 1000 + n_kv)
    ctx = gl.Context("fa_compute")
    if case is CACHE_CASE:  # K and V as views of one cache (llama.cpp's path), D 64, 4 heads of q, 2 of KV
        cache = ctx.new_tensor_1d(kv_type, 64 * 2 * 128, name="cache_k")
        es = 2 if kv_type is gl.F16 else 4
        k = v = gl.view_3d(ctx, cache, 64, 96, 2, 64 * 2 * es, 64 * es, 0)
        leaves = [cache]
    else:
        k = ctx.new_tensor_3d(kv_type, head, n_kv, n_head_kv, name="k")
        v = ctx.new_tensor_3d(kv_type, head, n_kv, n_head_kv, name="v")
        leaves = [k, v]
    q = ctx.new_tensor_3d(gl.F32, head, n_q, n_head, name="q")
    mask = None if mask_rows is None else ctx.new_tensor_2d(gl.F16, n_kv, mask_rows, name="KQ_mask")
    fa = gl.flash_attn_ext(ctx, q, k, v, mask, scale, max_bias, softcap)
    if prec is not None:
        gl.flash_attn_ext_set_prec(fa, prec)
    gl.set_output(fa)
    data = {t: rng.standard_normal(t.nelements).astype(np.float16 if t.type is gl.F16 else np.float32).tobytes()
            for t in leaves}
    data[q] = (2 * rng.standard_normal(q.nelements)).astype(np.float32).tobytes()
    m = None
    if mask is not None:
        past = n_kv - n_q  # query i sees positions 0 .. past + i
        m = np.where(np.arange(n_kv)[None, :] <= past + np.arange(mask_rows)[:, None], 0, -np.inf)
        m = (m + rng.uniform(-1, 0, m.shape)).astype(np.float16)  # a little bias where visible
        data[mask] = m.tobytes()
    return fa, gl.build_forward(fa), data, ctx


def _numpy_reference(fa) -> np.ndarray:
    """softmax(k·q·scale [softcapped] + slope·mask)·v per head in float64, from the tensors' values;
    (n_q, n_head, D), the layout of the permuted result."""
    q, k, v = (tensor_get(t).astype(np.float64).reshape(t.ne[2], t.ne[1], t.ne[0]) for t in fa.src[:3])
    mask = fa.src[3] if len(fa.src) > 3 else None
    scale, max_bias, softcap = (gl.tensor.word_to_float(w) for w in fa.op_params[:3])
    r = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, r, axis=0), np.repeat(v, r, axis=0)
    w = q @ k.transpose(0, 2, 1) * scale
    if softcap:
        w = softcap * np.tanh(w / softcap)
    if mask is not None:
        slopes = gl.cpu._alibi_slopes(gl.cpu.NUMPY, q.shape[0], max_bias).astype(np.float64)
        m = tensor_get(mask).astype(np.float64).reshape(mask.ne[1], mask.ne[0])[: q.shape[1], : k.shape[1]]
        w = w + slopes[:, None, None] * m
    p = np.exp(w - w.max(axis=-1, keepdims=True))
    return ((p / p.sum(axis=-1, keepdims=True)) @ v).transpose(1, 0, 2)


CACHE_CASE = (64, 3, 4, 96, 2, 32, 0.125, 0.0, 0.0, None)  # the shape of test_views_of_a_cache_as_k_and_v


@pytest.mark.parametrize("kv_type", [gl.F16, gl.F32], ids=["f16", "f32"])
@pytest.mark.parametrize("case", [*CASES, CACHE_CASE], ids=[f"case{i}" for i in range(len(CASES))] + ["cache"])
def test_the_cpu_kernel_computes_what_ggml_computes(case, kv_type):
    # ggml 0.15.3 numbers GGML_PREC_F32 10, not 2024's 1, and aborts on 1; both precisions run the same
    # kernel (ggml.c:15898-15917), so ggml computes the same graph and data with the default precision
    fa_c, gf_c, data_c, _ = _graph(case if case[-1] != gl.GGML_PREC_F32 else (*case[:-1], None), kv_type)
    (theirs,) = O.run_isolated(O.ggml_compute, gf_c, [fa_c], (), data_c, [fa_c])
    fa, gf, data, ctx = _graph(case, kv_type)
    cpu = gl.cpu_init()
    buf = gl.alloc_ctx_tensors(ctx, cpu)
    for t, raw in data.items():
        tensor_set(t, np.frombuffer(raw, np.float16 if t.type is gl.F16 else np.float32))
    cpu.graph_compute(gf)
    mine = tensor_get(fa).reshape(fa.ne[2], fa.ne[1], fa.ne[0]).astype(np.float64)
    ref = np.frombuffer(theirs, np.float32).reshape(mine.shape).astype(np.float64)
    e_ggml, e_numpy = normwise_error(mine, ref), normwise_error(mine, _numpy_reference(fa))
    WORST[case, kv_type.name] = (e_ggml, e_numpy)
    print(f"{case} {kv_type.name} K/V: normwise error against ggml {e_ggml:.2e}, against numpy (float64) {e_numpy:.2e}")
    assert np.isfinite(mine).all()
    tol = TOL if kv_type is gl.F16 else gl.cpu.Arithmetic.TOLERANCE_F32  # f32 K/V: an f32-only graph, 1e-4
    assert e_ggml <= tol, f"normwise error {e_ggml:.3g} against ggml > {tol}"
    assert e_numpy <= tol, f"normwise error {e_numpy:.3g} against numpy > {tol}"
    del buf


def test_quantized_k_or_v_plans_but_is_refused_by_the_kernel():
    """A q8_0 V (llama.cpp's quantized V cache): built and planned, then refused by the kernel by name."""
    ctx = gl.Context("fa_q8")
    q = ctx.new_tensor_3d(gl.F32, 32, 2, 4, name="q")
    k = ctx.new_tensor_3d(gl.F16, 32, 64, 2, name="k")
    v = ctx.new_tensor_3d(gl.Q8_0, 32, 64, 2, name="v_q8")
    fa = gl.flash_attn_ext(ctx, q, k, v, ctx.new_tensor_2d(gl.F16, 64, 32, name="KQ_mask"), 0.2, 0.0, 0.0)
    gf = gl.build_forward(fa)
    cpu = gl.cpu_init()
    galloc = gl.GAllocr([cpu.get_default_buffer_type()])
    assert galloc.reserve(gf) and galloc.get_buffer_size(0) > 0
    with pytest.raises(gl.errors.UnsupportedOpError, match="q8_0 V .*'v_q8'"):
        gl.cpu.compute_forward(fa)
