"""Chapter 01's op table (`ops.OPS`): every op has a row, and the call it decodes from a tensor rebuilds
that tensor exactly (shape, strides, type, op_params, view root and offset), in place or not; the C
function it names exists in ggml-python when that is importable."""

import importlib.util

import pytest

import ggml_lite as gl
from ggml_lite import ops
from ggml_lite.tensor import Op


def _every_op(c: gl.Context) -> list:
    a = c.new_tensor_2d(gl.F32, 8, 4, name="a")
    b = c.new_tensor_2d(gl.F32, 8, 4, name="b")
    s = c.new_tensor_1d(gl.F32, 1, name="s")
    mask = c.new_tensor_2d(gl.F32, 8, 4, name="mask")
    rows = c.new_tensor_1d(gl.I32, 2, name="rows")
    pos = c.new_tensor_1d(gl.I32, 4, name="pos")
    a3 = gl.reshape_3d(c, a, 8, 1, 4)
    rope = (8, 0, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    fa = gl.flash_attn_ext(c, a3, a3, a3, c.new_tensor_2d(gl.F16, 1, 32, name="fa_mask"), 0.5, 2.0, 0.0)
    gl.flash_attn_ext_set_prec(fa, gl.GGML_PREC_F32)  # word 3: rebuilt by the table's setter
    experts = c.new_tensor_3d(gl.Q8_0, 32, 6, 4, name="experts")
    ids = gl.top_k(c, a, 2)  # ARGSORT (DESC) and a VIEW of it
    return [
        gl.dup(c, a), gl.dup(c, a, inplace=True), gl.add(c, a, b), gl.add_inplace(c, a, b), gl.sub(c, a, b),
        gl.mul_inplace(c, a, b), gl.div(c, a, b, inplace=True), gl.add1(c, a, s), gl.add1(c, a, s, inplace=True),
        gl.sqr(c, a), gl.sqrt(c, a, True), gl.log(c, a), gl.sum(c, a), gl.sum_rows(c, a), gl.mean(c, a),
        gl.concat(c, a, b, 1), gl.norm(c, a, 1e-5), gl.rms_norm(c, a, 1e-6, True), gl.mul_mat(c, a, b),
        gl.scale(c, a, 0.5), gl.scale_inplace(c, a, 2.0), gl.cpy(c, a, b), gl.cont(c, gl.transpose(c, a)),
        gl.cont_2d(c, a, 4, 8), gl.reshape_2d(c, a, 4, 8), gl.view_2d(c, a, 4, 2, a.nb[1], 16),
        gl.permute(c, a3, 0, 2, 1, 3), gl.transpose(c, a), gl.get_rows(c, a, rows), gl.diag_mask_inf(c, a, 1),
        gl.diag_mask_zero(c, a, 2, True), gl.soft_max(c, a), gl.soft_max_ext(c, a, mask, 0.125, 0.0, True),
        gl.rope_ext(c, a3, pos, None, *rope), gl.rope_ext(c, a3, pos, None, *rope, inplace=True),
        gl.leaky_relu(c, a, 0.1), gl.leaky_relu(c, a, 0.1, True), gl.silu(c, a), gl.gelu(c, a, True),
        gl.unary(c, a, gl.UnaryOp.TANH), fa, gl.flash_attn_ext(c, a3, a3, a3, None, 1.0, 0.0, 30.0),
        gl.argsort(c, a, gl.SortOrder.ASC), ids.view_src, ids, gl.cast(c, mask, gl.F16),
        gl.cast(c, c.new_tensor_2d(gl.F32, 32, 2, name="w"), "q8_0"),
        gl.mul_mat_id(c, experts, c.new_tensor_3d(gl.F32, 32, 1, 4, name="cur"), ids),
    ]


def _layout(t) -> tuple:
    return t.op, t.type, t.ne, t.nb, t.op_params, t.view_src, t.view_offs


def test_every_op_has_a_row_and_every_call_rebuilds_its_tensor():
    c = gl.Context("table")
    built = _every_op(c)
    assert {t.op for t in built} == set(Op) - {Op.NONE} == set(ops.OPS)
    for t in built:
        call = ops.op_call(t)
        assert _layout(ops.build(c, call)) == _layout(t), call
        assert call.inplace == (t.view_src is not None and not ops.OPS[t.op].view)


def test_the_c_names_and_arguments():
    c = gl.Context("names")
    a = c.new_tensor_2d(gl.F32, 8, 4, name="a")
    big = c.new_tensor_1d(gl.F32, 2**32, name="big")  # (16 GiB of metadata: no bytes are allocated)
    view = ops.op_call(gl.view_1d(c, big, 8, 2**33))  # an offset past 32 bits: two op_params words
    assert (view.c_name, view.args[-1]) == ("ggml_view_4d", 2**33)
    assert ops.op_call(gl.scale_inplace(c, a, 0.5)).c_name == "ggml_scale_inplace"
    leaky = ops.op_call(gl.leaky_relu(c, a, 0.25, True))
    assert (leaky.c_name, leaky.c_args) == ("ggml_leaky_relu", (0.25, True))
    assert ops.op_call(gl.soft_max(c, a)).sources == (a, None)  # the optional mask slot, passed as None
    cast = ops.op_call(gl.cast(c, a, gl.F16))  # a CPY that is no view: ggml_cast, its src[1] (itself) not passed
    assert (cast.c_name, cast.sources, cast.c_args) == ("ggml_cast", (a,), (gl.F16,))
    assert ops.op_call(gl.cpy(c, a, c.new_tensor_2d(gl.F16, 8, 4))).c_name == "ggml_cpy"
    top = ops.op_call(gl.top_k(c, a, 3).view_src)
    assert (top.c_name, top.c_args) == ("ggml_argsort", (1,))


@pytest.mark.skipif(importlib.util.find_spec("ggml") is None, reason="ggml-python is not importable")
def test_every_c_name_exists_in_ggml_python():
    import ggml

    missing = [call.c_name for call in map(ops.op_call, _every_op(gl.Context("c"))) if not hasattr(ggml, call.c_name)]
    assert not missing, missing


def test_an_op_without_a_row_is_refused():
    with pytest.raises(gl.errors.UnknownOpError, match="NONE"):
        ops.decode_op(Op.NONE, [], [], [1, 1, 1, 1], [4, 4, 4, 4], False)
