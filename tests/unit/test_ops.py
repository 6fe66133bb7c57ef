"""Shape, stride, op_params and naming rules of every op, and the errors users can reach."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ggml_lite as gl
from ggml_lite import errors


@pytest.fixture
def ctx():
    return gl.Context("test")


def words(*floats):
    return [gl.float_to_word(f) for f in floats]


# -- types and sizes -------------------------------------------------------------------------------

@pytest.mark.parametrize("type,ts,bs",
                         [(gl.F32, 4, 1), (gl.F16, 2, 1), (gl.I32, 4, 1), (gl.Q8_0, 34, 32), (gl.Q4_0, 18, 32)])
def test_type_table(type, ts, bs):
    assert (type.type_size, type.blck_size) == (ts, bs)
    assert gl.type_by_name(type.name) is type


def test_unknown_type_names_the_type():
    with pytest.raises(errors.UnknownTypeError, match="'f65'"):
        gl.type_by_name("f65")
    with pytest.raises(errors.UnknownTypeError, match="bf17"):
        gl.Context().new_tensor_1d("bf17", 4)
    assert gl.Context().new_tensor_1d("bf16", 4).nbytes == 8  # known since every ggml type is


def test_unknown_op():
    with pytest.raises(errors.UnknownOpError, match="CONV_2D"):
        gl.op_by_name("CONV_2D")


def test_new_tensor_strides_and_nbytes(ctx):
    t = ctx.new_tensor_4d(gl.F16, 8, 3, 2, 5)
    assert t.nb == [2, 16, 48, 96] and t.nbytes == 8 * 3 * 2 * 5 * 2 == t.nelements * 2
    q = ctx.new_tensor_3d(gl.Q4_0, 64, 3, 2)
    assert q.nb == [18, 36, 108, 216] and q.nbytes == 216
    assert gl.nrows(q) == 6 and q.shape == (2, 3, 64)


def test_quantized_row_must_be_whole_blocks(ctx):
    with pytest.raises(errors.ShapeError, match="33 q8_0"):
        ctx.new_tensor_2d(gl.Q8_0, 33, 2)


def test_negative_dimension(ctx):
    with pytest.raises(errors.ShapeError, match="non-negative"):
        ctx.new_tensor_2d(gl.F32, 4, -1)


def test_nbytes_of_strided_view_is_its_span(ctx):
    a = ctx.new_tensor_2d(gl.F32, 10, 6)
    v = gl.view_2d(ctx, a, 4, 3, a.nb[1] * 2, 8)  # every other row, 4 columns
    assert v.nbytes == 4 + 3 * 4 + 2 * 80  # one element + spans
    assert not gl.is_contiguous(v) and gl.is_padded_1d(v)


def test_name_is_truncated_to_63_bytes(ctx):
    t = ctx.new_tensor_1d(gl.F32, 1, name="x" * 100)
    assert len(t.name) == 63
    a, b = ctx.new_tensor_1d(gl.F32, 1, name="a" * 40), ctx.new_tensor_1d(gl.F32, 1, name="b" * 40)
    assert len(gl.cpy(ctx, a, b).name) == 63


# -- element-wise ops --------------------------------------------------------------------------------

@pytest.mark.parametrize("fn,op", [(gl.add, "ADD"), (gl.sub, "SUB"), (gl.mul, "MUL"), (gl.div, "DIV")])
def test_binary_broadcast(ctx, fn, op):
    a = ctx.new_tensor_3d(gl.F32, 8, 4, 2, name="a")
    b = ctx.new_tensor_1d(gl.F32, 8, name="b")
    r = fn(ctx, a, b)
    assert r.op.name == op and r.ne == a.ne and r.nb == a.nb and r.src == [a, b] and r.view_src is None
    assert r.name == ""


@pytest.mark.parametrize("fn", [gl.add, gl.sub, gl.mul, gl.div])
def test_binary_shape_mismatch_names_both(ctx, fn):
    a = ctx.new_tensor_2d(gl.F32, 8, 4, name="act")
    b = ctx.new_tensor_1d(gl.F32, 3, name="bias")
    with pytest.raises(errors.ShapeError, match=r"'bias'.*'act'"):
        fn(ctx, a, b)


@pytest.mark.parametrize("fn", [gl.add_inplace, gl.sub_inplace, gl.mul_inplace, gl.div_inplace])
def test_inplace_result_is_a_view_of_a(ctx, fn):
    a = ctx.new_tensor_2d(gl.F32, 8, 4, name="a")
    r = fn(ctx, a, ctx.new_tensor_1d(gl.F32, 8))
    assert r.view_src is a and r.view_offs == 0 and r.name == "a (view)" and r.nb == a.nb


def test_unary_family(ctx):
    a = ctx.new_tensor_2d(gl.F32, 8, 4, name="a")
    for fn, u in [(gl.silu, 10), (gl.gelu, 8), (gl.relu, 6), (gl.tanh, 4), (gl.neg, 2)]:
        r = fn(ctx, a)
        assert r.op is gl.Op.UNARY and r.op_params[0] == u and r.unary_op == gl.UnaryOp(u) and r.ne == a.ne
    assert gl.silu(ctx, a, inplace=True).view_src is a


def test_unary_needs_contiguous_rows(ctx):
    a = ctx.new_tensor_2d(gl.F32, 8, 4, name="a")
    with pytest.raises(errors.LayoutError, match="a \\(transposed\\)"):
        gl.silu(ctx, gl.transpose(ctx, a))


@pytest.mark.parametrize("fn,op", [(gl.sqr, "SQR"), (gl.sqrt, "SQRT"), (gl.log, "LOG"), (gl.dup, "DUP")])
def test_elementwise(ctx, fn, op):
    a = ctx.new_tensor_2d(gl.F16, 8, 4)
    r = fn(ctx, a)
    assert r.op.name == op and r.type is gl.F16 and r.ne == a.ne


def test_add1_and_sum_rows(ctx):
    a = ctx.new_tensor_3d(gl.F32, 8, 4, 3)
    one = ctx.new_tensor_1d(gl.F32, 1)
    assert gl.add1(ctx, a, one).op is gl.Op.ADD1
    with pytest.raises(errors.ShapeError, match="scalar"):
        gl.add1(ctx, a, a)
    s = gl.sum_rows(ctx, a)
    assert s.ne == [1, 4, 3, 1] and s.nb == [4, 4, 16, 48]


def test_scale_norm_params(ctx):
    a = ctx.new_tensor_2d(gl.F32, 8, 4)
    assert gl.scale(ctx, a, 0.125).op_params[0] == 1040187392
    assert gl.scale_inplace(ctx, a, 2.0).view_src is a
    assert gl.rms_norm(ctx, a, 1e-5).op_params[0] == 925353388
    assert gl.norm(ctx, a, 1e-5).op is gl.Op.NORM


def test_concat(ctx):
    a = ctx.new_tensor_2d(gl.F32, 5, 8, name="a")
    b = ctx.new_tensor_2d(gl.F32, 5, 3, name="b")
    r = gl.concat(ctx, a, b, 1)
    assert r.ne == [5, 11, 1, 1] and r.op_params[0] == 1 and r.nb == [4, 20, 220, 220]
    with pytest.raises(errors.ShapeError, match="differ in dim 1"):
        gl.concat(ctx, a, b, 0)
    with pytest.raises(errors.DataTypeError):
        gl.concat(ctx, a, ctx.new_tensor_2d(gl.F16, 5, 3), 1)


# -- matrix product, rows, masks, softmax, rope ------------------------------------------------------

def test_mul_mat_shape_and_broadcast(ctx):
    w = ctx.new_tensor_3d(gl.Q8_0, 64, 10, 2, name="w")
    x = ctx.new_tensor_4d(gl.F32, 64, 7, 4, 3, name="x")
    r = gl.mul_mat(ctx, w, x)
    assert r.type is gl.F32 and r.ne == [10, 7, 4, 3] and r.nb == [4, 40, 280, 1120]


def test_mul_mat_mismatch_names_tensors(ctx):
    w = ctx.new_tensor_2d(gl.F32, 64, 10, name="w")
    x = ctx.new_tensor_2d(gl.F32, 32, 7, name="x")
    with pytest.raises(errors.ShapeError, match=r"'w'.*'x'"):
        gl.mul_mat(ctx, w, x)
    with pytest.raises(errors.LayoutError, match="transposed"):
        gl.mul_mat(ctx, gl.transpose(ctx, ctx.new_tensor_2d(gl.F32, 7, 32)), x)


def test_get_rows(ctx):
    a = ctx.new_tensor_2d(gl.F16, 16, 100, name="emb")
    idx = ctx.new_tensor_1d(gl.I32, 5, name="ids")
    r = gl.get_rows(ctx, a, idx)
    assert r.ne == [16, 5, 1, 1] and r.type is gl.F32
    with pytest.raises(errors.DataTypeError, match="'ids_f'"):
        gl.get_rows(ctx, a, ctx.new_tensor_1d(gl.F32, 5, name="ids_f"))
    assert gl.get_rows(ctx, ctx.new_tensor_2d(gl.I32, 4, 9), idx).type is gl.I32


def test_soft_max_ext_and_masks(ctx):
    kq = ctx.new_tensor_3d(gl.F32, 32, 16, 4, name="kq")
    mask = ctx.new_tensor_2d(gl.F32, 32, 32, name="mask")
    r = gl.soft_max_ext(ctx, kq, mask, 0.25, 0.0)
    assert r.src == [kq, mask] and r.op_params[:2] == words(0.25, 0.0)
    assert gl.soft_max(ctx, kq).src == [kq] and gl.soft_max(ctx, kq).op_params[:2] == [1065353216, 0]
    with pytest.raises(errors.ShapeError, match="'short'"):
        gl.soft_max_ext(ctx, kq, ctx.new_tensor_2d(gl.F32, 32, 8, name="short"), 1.0, 0.0)
    with pytest.raises(errors.ShapeError, match="max_bias"):
        gl.soft_max_ext(ctx, kq, None, 1.0, 8.0)
    assert gl.diag_mask_inf(ctx, kq, 3).op_params[0] == 3
    assert gl.diag_mask_zero(ctx, kq, 1, inplace=True).view_src is kq


def test_rope_ext_params(ctx):
    q = ctx.new_tensor_3d(gl.F32, 16, 4, 7, name="q")
    pos = ctx.new_tensor_1d(gl.I32, 7, name="pos")
    r = gl.rope_ext(ctx, q, pos, None, 16, 0, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    assert r.op_params[:11] == [0, 16, 0, 0, 4096, 1176256512, 1065353216, 0, 1065353216, 1107296256, 1065353216]
    assert r.src == [q, pos]
    with pytest.raises(errors.ShapeError, match="'pos8'"):
        gl.rope_ext(ctx, q, ctx.new_tensor_1d(gl.I32, 8, name="pos8"), None, 16, 0, 0, 1e4, 1, 0, 1, 32, 1)


def test_flash_attn_ext_shape_params_and_sources(ctx):
    q = ctx.new_tensor_3d(gl.F32, 64, 7, 8, name="q")
    k = ctx.new_tensor_3d(gl.F16, 64, 256, 2, name="k")  # 2 KV heads for 8 query heads (GQA)
    v = ctx.new_tensor_3d(gl.F16, 64, 256, 2, name="v")
    mask = ctx.new_tensor_2d(gl.F16, 256, 32, name="mask")
    r = gl.flash_attn_ext(ctx, q, k, v, mask, 0.125, 0.0, 0.0)
    assert (r.type, r.ne, r.nb, r.op) == (gl.F32, [64, 8, 7, 1], [4, 256, 2048, 14336], gl.Op.FLASH_ATTN_EXT)
    assert r.src == [q, k, v, mask] and r.view_src is None and r.name == ""
    assert r.op_params[:4] == [*words(0.125, 0.0, 0.0), 0]
    gl.flash_attn_ext_set_prec(r, gl.GGML_PREC_F32)
    assert r.op_params[:4] == [*words(0.125, 0.0, 0.0), 1]
    assert gl.flash_attn_ext(ctx, q, k, v, None, 1.0, 0.0, 50.0).src == [q, k, v]
    # mid-2024 ggml takes the result's ne[0] from q, not v (a V head size other than K's is not checked)
    v32 = ctx.new_tensor_3d(gl.F16, 32, 256, 2, name="v32")
    assert gl.flash_attn_ext(ctx, q, k, v32, mask, 1.0, 0.0, 0.0).ne == [64, 8, 7, 1]
    assert not gl.gallocr.op_can_inplace(gl.Op.FLASH_ATTN_EXT)  # not in ggml_op_can_inplace (ggml-alloc.c)


def test_flash_attn_ext_refusals(ctx):
    q = ctx.new_tensor_3d(gl.F32, 64, 33, 8, name="q")
    k = ctx.new_tensor_3d(gl.F16, 64, 256, 2, name="k")
    mask64 = ctx.new_tensor_2d(gl.F16, 256, 64, name="mask64")
    assert gl.flash_attn_ext(ctx, q, k, k, mask64, 1.0, 8.0, 0.0).ne == [64, 8, 33, 1]
    with pytest.raises(errors.ShapeError, match=r"'mask32'.*need at least 64"):  # 33 queries pad to 64 rows
        gl.flash_attn_ext(ctx, q, k, k, ctx.new_tensor_2d(gl.F16, 256, 32, name="mask32"), 1.0, 0.0, 0.0)
    with pytest.raises(errors.ShapeError, match="'k48'"):
        gl.flash_attn_ext(ctx, q, ctx.new_tensor_3d(gl.F16, 48, 256, 2, name="k48"), k, mask64, 1.0, 0.0, 0.0)
    with pytest.raises(errors.ShapeError, match="'k3'"):  # 8 query heads are no multiple of 3 KV heads
        gl.flash_attn_ext(ctx, q, ctx.new_tensor_3d(gl.F16, 64, 256, 3, name="k3"), k, mask64, 1.0, 0.0, 0.0)
    with pytest.raises(errors.ShapeError, match="must be a matrix"):
        gl.flash_attn_ext(ctx, q, k, k, ctx.new_tensor_3d(gl.F16, 256, 64, 2, name="m3"), 1.0, 0.0, 0.0)
    with pytest.raises(errors.LayoutError, match="contiguous"):
        gl.flash_attn_ext(ctx, q, k, k, gl.transpose(ctx, ctx.new_tensor_2d(gl.F16, 64, 256)), 1.0, 0.0, 0.0)
    with pytest.raises(errors.ShapeError, match="max_bias"):
        gl.flash_attn_ext(ctx, q, k, k, None, 1.0, 8.0, 0.0)
    with pytest.raises(errors.TensorError, match="not FLASH_ATTN_EXT"):
        gl.flash_attn_ext_set_prec(gl.scale(ctx, q, 2.0), gl.GGML_PREC_F32)


def test_flash_attn_ext_quantized_v_is_planned_but_not_computed(ctx):
    """The CPU kernel (appendix A7) computes f16 and f32 K/V; a q8_0 V builds and plans, and computing it
    is refused with a clear error naming the tensor. f32 K/V give softmax(k·q·scale)·v per head."""
    q = ctx.new_tensor_3d(gl.F32, 32, 2, 2, name="q")
    k = ctx.new_tensor_3d(gl.F32, 32, 8, 2, name="k")
    v8 = ctx.new_tensor_3d(gl.Q8_0, 32, 8, 2, name="v8")
    r = gl.flash_attn_ext(ctx, q, k, k, None, 0.5, 0.0, 0.0)
    r8 = gl.flash_attn_ext(ctx, q, k, v8, None, 0.5, 0.0, 0.0)
    galloc = gl.GAllocr([gl.cpu_init().get_default_buffer_type()])
    assert galloc.reserve(gl.build_forward(r8))
    gl.alloc_ctx_tensors(ctx, gl.cpu_init())
    rng = np.random.default_rng(26)
    Q, K = rng.standard_normal((2, 2, 32)).astype(np.float32), rng.standard_normal((2, 8, 32)).astype(np.float32)
    gl.backend.tensor_set(q, Q)
    gl.backend.tensor_set(k, K)
    gl.cpu.compute_forward(r)
    w = 0.5 * Q.astype(np.float64) @ K.astype(np.float64).transpose(0, 2, 1)
    p = np.exp(w - w.max(axis=-1, keepdims=True))
    want = ((p / p.sum(axis=-1, keepdims=True)) @ K).transpose(1, 0, 2)  # permuted: (query, head, D)
    got = gl.backend.tensor_get(r).reshape(2, 2, 32)
    assert np.abs(got - want).max() <= gl.cpu.Arithmetic.TOLERANCE_F32 * np.abs(want).max()
    with pytest.raises(errors.UnsupportedOpError, match="FLASH_ATTN_EXT .*q8_0 V .*'v8'"):
        gl.cpu.compute_forward(r8)


# -- the ops of a mixture of experts, and ggml_cast ----------------------------------------------------

def test_cast_is_a_fresh_cpy_whose_src1_is_itself(ctx):
    m = ctx.new_tensor_2d(gl.F32, 64, 32, name="KQ_mask")
    c = gl.cast(ctx, m, gl.F16)
    assert (c.type, c.ne, c.nb, c.op, c.name) == (gl.F16, [64, 32, 1, 1], [2, 128, 4096, 4096], gl.Op.CPY,
                                                 "KQ_mask (copy)")
    assert c.src == [m, c] and c.view_src is None and c.op_params == [0] * 16
    assert gl.cast(ctx, ctx.new_tensor_1d(gl.F32, 64), "q8_0").name == " (copy)"  # type by name, as new_tensor
    g = gl.build_forward(c)  # the self-edge: the walk has marked the cast visited before it reads src[1]
    assert g.nodes == [c] and g.leafs == [m]
    with pytest.raises(errors.ShapeError, match="whole number of blocks"):
        gl.cast(ctx, ctx.new_tensor_1d(gl.F32, 40), gl.Q8_0)


def test_argsort_and_top_k(ctx):
    p = ctx.new_tensor_3d(gl.F32, 8, 5, 2, name="probs")
    a = gl.argsort(ctx, p, gl.SortOrder.ASC)
    assert (a.type, a.ne, a.nb, a.op, a.src, a.name) == (gl.I32, [8, 5, 2, 1], [4, 32, 160, 320], gl.Op.ARGSORT,
                                                       [p], "")
    assert a.op_params[:2] == [0, 0] and gl.argsort(ctx, p, 1).op_params[0] == 1
    with pytest.raises(errors.TensorError, match="'probs'.*order 2"):
        gl.argsort(ctx, p, 2)
    t = gl.top_k(ctx, p, 2)  # argsort DESC, then a view of its first 2 columns (row strides kept)
    s = t.src[0]
    assert (s.op, s.op_params[0], s.name, s.ne) == (gl.Op.ARGSORT, 1, "", [8, 5, 2, 1])
    assert (t.op, t.type, t.ne, t.nb, t.name) == (gl.Op.VIEW, gl.I32, [2, 5, 2, 1], [4, 32, 160, 320], " (view)")
    assert t.view_src is s and t.view_offs == 0 and not gl.tensor.is_contiguous(t)
    assert gl.top_k(ctx, p, 8).ne == [8, 5, 2, 1]
    with pytest.raises(errors.ShapeError, match="'probs'.*8 columns, fewer than k = 9"):
        gl.top_k(ctx, p, 9)


def test_mul_mat_id_shape_and_sources(ctx):
    ex = ctx.new_tensor_3d(gl.Q4_0, 64, 96, 8, name="ffn_up_exps")  # 8 experts [64 -> 96]
    cur = ctx.new_tensor_3d(gl.F32, 64, 1, 5, name="cur")  # one column per token, shared by the experts
    sel = gl.top_k(ctx, ctx.new_tensor_2d(gl.F32, 8, 5, name="probs"), 2)
    r = gl.mul_mat_id(ctx, ex, cur, sel)
    assert (r.type, r.ne, r.nb, r.op, r.name) == (gl.F32, [96, 2, 5, 1], [4, 384, 768, 3840], gl.Op.MUL_MAT_ID, "")
    assert r.src == [ex, cur, sel] and r.view_src is None and r.op_params == [0] * 16
    par = ctx.new_tensor_3d(gl.F32, 96, 2, 5, name="par")  # a column per used expert (the down projection)
    assert gl.mul_mat_id(ctx, ctx.new_tensor_3d(gl.F16, 96, 64, 8), par, sel).ne == [64, 2, 5, 1]
    assert not gl.gallocr.op_can_inplace(gl.Op.MUL_MAT_ID) and not gl.gallocr.op_can_inplace(gl.Op.ARGSORT)


@pytest.mark.parametrize("change,error,match", [
    (dict(ex=("transpose",)), errors.LayoutError, "'ex.*transposed"),
    (dict(ids=(gl.F32, 2, 5)), errors.DataTypeError, "must be i32"),
    (dict(ex=(gl.F16, 64, 96, 8, 2)), errors.ShapeError, "must be 3-d"),
    (dict(b=(gl.F32, 64, 1, 5, 2)), errors.ShapeError, "'b'.*must be 3-d"),
    (dict(ids=(gl.I32, 2, 5, 2)), errors.ShapeError, "must be a matrix"),
    (dict(ids=(gl.I32, 2, 4)), errors.ShapeError, "one row per token"),
    (dict(b=(gl.F32, 32, 1, 5)), errors.ShapeError, "cannot multiply.*ne\\[0\\]"),
    (dict(b=(gl.F32, 64, 3, 5)), errors.ShapeError, "3 columns per token.*2 ids"),
    (dict(b=(gl.F32, 64, 0, 5)), errors.ShapeError, "0 columns per token"),
])
def test_mul_mat_id_refusals(ctx, change, error, match):
    """The eight asserts of `ggml_mul_mat_id`, in its order (b.ne[1] = 0 would divide by zero in C)."""
    shapes = dict(ex=(gl.F16, 64, 96, 8), b=(gl.F32, 64, 1, 5), ids=(gl.I32, 2, 5))
    shapes.update(change)
    t = {}
    for name, (typ, *ne) in ((k, v) for k, v in shapes.items() if v != ("transpose",)):
        t[name] = ctx.new_tensor(typ, ne, name=name)
    if "ex" not in t:
        t["ex"] = gl.transpose(ctx, ctx.new_tensor_2d(gl.F16, 96, 64, name="ex"))
    with pytest.raises(error, match=match):
        gl.mul_mat_id(ctx, t["ex"], t["b"], t["ids"])


# -- views ---------------------------------------------------------------------------------------------

def test_views_accumulate_offsets_and_point_at_root(ctx):
    h = ctx.new_tensor_2d(gl.F32, 48, 16, name="h")
    v1 = gl.view_2d(ctx, h, 48, 8, h.nb[1], 4 * h.nb[1])
    v2 = gl.view_1d(ctx, v1, 48, 2 * h.nb[1])
    assert v1.view_src is h and v2.view_src is h
    assert (v1.view_offs, v2.view_offs) == (768, 1152)
    assert v2.name == "h (view) (view)" and v2.op_params[:2] == [384, 0] and v2.src == [v1]
    v3 = gl.view_3d(ctx, h, 8, 6, 2, 32, 192, 0)
    assert v3.nb == [4, 32, 192, 384]
    v4 = gl.view_4d(ctx, h, 4, 2, 2, 2, 16, 32, 64, 4)
    assert v4.nb == [4, 16, 32, 64] and v4.view_offs == 4


def test_view_beyond_its_source(ctx):
    h = ctx.new_tensor_2d(gl.F32, 48, 16, name="h")
    with pytest.raises(errors.ViewBoundsError, match=r"'h'.*3072 bytes"):
        gl.view_1d(ctx, h, 48, 15 * 192 + 4)
    with pytest.raises(errors.ViewBoundsError, match="'h'"):
        gl.view_2d(ctx, gl.view_1d(ctx, h, 48, 0), 48, 17, 192, 0)  # view of a view, checked against the root


def test_large_view_offset_is_two_words(ctx):
    big = ctx.new_tensor_1d(gl.F32, 2**31)
    v = gl.view_1d(ctx, big, 4, 5 * 2**30)
    assert v.op_params[:2] == [1073741824, 1]


def test_reshape(ctx):
    a = ctx.new_tensor_2d(gl.F32, 64, 16, name="Qcur")
    r = gl.reshape_3d(ctx, a, 16, 4, 16)
    assert r.ne == [16, 4, 16, 1] and r.nb == [4, 64, 256, 4096] and r.name == "Qcur (reshaped)"
    assert r.view_src is a and r.op is gl.Op.RESHAPE
    assert gl.reshape(ctx, a, ctx.new_tensor_1d(gl.F32, 1024)).ne == [1024, 1, 1, 1]
    assert gl.reshape_4d(ctx, a, 2, 32, 4, 4).ne == [2, 32, 4, 4]
    assert gl.reshape_1d(ctx, a, 1024).ne == [1024, 1, 1, 1]


def test_reshape_changing_element_count(ctx):
    a = ctx.new_tensor_2d(gl.F32, 64, 16, name="Qcur")
    with pytest.raises(errors.ReshapeError, match=r"'Qcur'.*1024 elements.*1050"):
        gl.reshape_2d(ctx, a, 50, 21)
    with pytest.raises(errors.LayoutError, match="contiguous"):
        gl.reshape_2d(ctx, gl.transpose(ctx, a), 16, 64)


def test_permute(ctx):
    a = ctx.new_tensor_3d(gl.F32, 16, 4, 7, name="q")
    p = gl.permute(ctx, a, 0, 2, 1, 3)
    assert p.ne == [16, 7, 4, 1] and p.nb == [4, 256, 64, 1792] and p.name == "q (permuted)"
    assert p.op_params[:4] == [0, 2, 1, 3] and p.view_src is a


@pytest.mark.parametrize("axes", [(0, 0, 1, 2), (0, 1, 2, 4), (-1, 0, 1, 2)])
def test_permute_bad_axes(ctx, axes):
    a = ctx.new_tensor_3d(gl.F32, 16, 4, 7, name="q")
    with pytest.raises(errors.PermuteAxisError, match="'q'"):
        gl.permute(ctx, a, *axes)


def test_transpose_cont_cpy(ctx):
    a = ctx.new_tensor_2d(gl.F32, 5, 8, name="m")
    t = gl.transpose(ctx, a)
    assert t.ne == [8, 5, 1, 1] and t.nb == [20, 4, 160, 160] and t.name == "m (transposed)"
    c = gl.cont(ctx, t)
    assert c.nb == [4, 32, 160, 160] and c.name == "m (transposed) (cont)" and c.view_src is None
    c2 = gl.cont_2d(ctx, t, 40, 1)
    assert c2.ne == [40, 1, 1, 1] and c2.op is gl.Op.CONT
    assert gl.cont_3d(ctx, t, 2, 4, 5).ne == [2, 4, 5, 1]
    with pytest.raises(errors.ReshapeError, match="'m \\(transposed\\)'"):
        gl.cont_2d(ctx, t, 41, 1)
    dst = ctx.new_tensor_1d(gl.F16, 40, name="dst")
    cp = gl.cpy(ctx, a, dst)
    assert cp.view_src is dst and cp.name == "dst (copy of m)" and cp.src == [a, dst] and cp.type is gl.F16
    assert gl.cpy(ctx, a, ctx.new_tensor_1d(gl.F16, 40)).name == "m (copy)"
    with pytest.raises(errors.ShapeError, match="'dst'"):
        gl.cpy(ctx, a, ctx.new_tensor_1d(gl.F16, 41, name="dst"))


def test_view_tensor_is_a_leaf_with_view_src(ctx):
    a = ctx.new_tensor_2d(gl.F32, 5, 8, name="a")
    v = ctx.view_tensor(a)
    assert v.op is gl.Op.NONE and v.view_src is a and v.name == "a (view)"
    g = gl.build_forward(v)
    assert g.leafs == [v] and g.nodes == []


# -- properties ------------------------------------------------------------------------------------------

dims = st.lists(st.integers(1, 6), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(ne=dims, perm=st.permutations([0, 1, 2, 3]))
def test_permute_matches_numpy_transpose(ne, perm):
    """A permuted view addresses the same bytes numpy's transpose does, and spans the same bytes."""
    ctx = gl.Context()
    a = ctx.new_tensor(gl.F32, ne)
    p = gl.permute(ctx, a, *perm)
    arr = np.zeros(tuple(reversed(a.ne)), dtype=np.float32)  # numpy axes reversed w.r.t. ne
    inv = [perm.index(i) for i in range(4)]  # result dim j comes from source dim inv[j]
    np_axes = [3 - inv[3 - k] for k in range(4)]
    view = arr.transpose(np_axes)
    assert list(reversed(view.shape)) == p.ne
    assert list(reversed(view.strides)) == p.nb
    assert p.nbytes == a.nbytes and p.nelements == a.nelements


@settings(max_examples=200, deadline=None)
@given(ne=dims, data=st.data())
def test_view_offsets_accumulate(ne, data):
    """Views of views always point at the root with the summed offset, and stay in bounds."""
    ctx = gl.Context()
    root = ctx.new_tensor(gl.F32, ne)
    t, total = root, 0
    for _ in range(data.draw(st.integers(1, 4))):
        n = t.nelements
        k = data.draw(st.integers(1, n))
        off = 4 * data.draw(st.integers(0, n - k))
        t = gl.view_1d(ctx, t, k, off)
        total += off
        assert t.view_src is root and t.view_offs == total
        assert t.view_offs + t.nbytes <= root.nbytes
