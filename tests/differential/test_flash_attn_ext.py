"""FLASH_ATTN_EXT against the real ggml (ggml-python, through the oracle's mirror): the same call gives
the same type, shape, strides, op_params (the precision word included), sources and name, for several
q/k/v/mask shapes, grouped-query attention among them. The shapes keep V's head size equal to K's and the
mask f16, where mid-2024 ggml (the result's ne[0] from q) and today's (from v, mask f16 asserted) agree."""

import pytest

import ggml_lite as gl
import ggml_oracle as O
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
