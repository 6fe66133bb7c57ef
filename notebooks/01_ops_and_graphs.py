# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Ops and graphs — what to compute, and in which order
#
# Chapter 00 gave tensors their shapes and strides. Here they get an *origin*: an op constructor
# (`ggml_add`, `ggml_mul_mat`, `ggml_view_2d`, ...) creates its result tensor with ggml's shape,
# strides and name and records the op and its sources — it computes nothing. Then
# `ggml_build_forward_expand` walks the sources and lists what a backend must compute, in order.
# The memory planner of chapters 02–05 reads nothing else.
#
# **Learning goals**
#
# 1. Predict an op's result: `ne`, `nb`, type and automatic name, and whether it is a *view* (no
#    memory of its own) or a fresh tensor.
# 2. Know the in-place variants: the result is a view of the first source, so the op overwrites it.
# 3. Understand a graph: `build_forward_expand` visits sources depth-first and lists **nodes**
#    (things to compute) in execution order and **leafs** (inputs, weights, constants) in the order
#    they were first reached; the order of `expand` calls matters.
# 4. Go back from a tensor to the call that made it: one declarative table of ops (`ops.OPS`) says
#    which constructor builds each op and how its recorded `op_params` become arguments — the graph
#    files of appendix A1 and the test oracle both replay tensors through it.
#
# Modules exported here: `ggml_lite.ops`, `ggml_lite.graph`.

# %%
# | default_exp ops

# %%
import numpy as np

from ggml_lite.errors import ViewBoundsError
from ggml_lite.tensor import F16, F32, I32, Q4_0, Q8_0, Context, Op, Tensor, TensorFlag, set_input, set_output

# %% [markdown]
# ## 1 · Ops: shapes, strides, names and parameters
#
# A ggml op does not compute: it creates the result tensor, records the op and its sources, and
# returns. The rules below follow the op constructors of `ggml.c`. Three families:
#
# * **fresh results** (`ggml_dup_tensor` or `ggml_new_tensor`): add, mul, mul_mat, soft_max, ... —
#   new memory, contiguous strides;
# * **views** (`ggml_new_tensor_impl` with a `view_src`): view_Nd, reshape, permute, transpose and
#   cpy — no memory of their own; they get automatic names: `" (view)"`, `" (reshaped)"`,
#   `" (permuted)"`, `" (transposed)"`, `" (copy of X)"`, and cont gets `" (cont)"`;
# * **in-place** variants (`ggml_add_inplace`, ...): the result is `ggml_view_tensor(a)`, a view
#   of the first source, so the op writes over its input.
#
# The binary element-wise ops broadcast `b` over `a` (`ggml_can_repeat(b, a)`: each `a.ne[i]` is a
# multiple of `b.ne[i]`) and the result has `a`'s shape. `mul_mat(a, b)` contracts `ne[0]` of both
# and gives `[a.ne[1], b.ne[1], b.ne[2], b.ne[3]]` in f32 — in numpy terms `b @ a.T`.

# %%
# | export
"""ggml's op constructors (ggml.c): each creates the result tensor with ggml's shape, strides,
op_params and automatic name, and records its sources. No arithmetic happens here."""

import enum
from collections.abc import Callable
from typing import NamedTuple

from ggml_lite import tensor  # (its layout predicates and op-parameter bits: tensor.is_contiguous, ...)
from ggml_lite.errors import (
    DataTypeError,
    LayoutError,
    PermuteAxisError,
    ReshapeError,
    ShapeError,
    TensorError,
    UnknownOpError,
)
from ggml_lite.tensor import F16, F32, GGML_MAX_DIMS, GGML_MAX_OP_PARAMS, I32, Op, Tensor, UnaryOp, describe


def _result(ctx, a: Tensor, inplace: bool) -> Tensor:
    """The result tensor of an element-wise op: `ggml_view_tensor(a)` in place, else `ggml_dup_tensor(a)`."""
    return ctx.view_tensor(a) if inplace else ctx.dup_tensor(a)


def _set(t: Tensor, op: Op, *srcs) -> Tensor:
    t.op = op
    for i, s in enumerate(srcs):
        if s is not None:
            t.set_src(i, s)
    return t


def _binary(ctx, op: Op, a: Tensor, b: Tensor, inplace: bool) -> Tensor:
    # ggml_add_impl / ggml_sub_impl / ggml_mul_impl / ggml_div_impl
    if not tensor.can_repeat(b, a):
        raise ShapeError(
            f"ggml_{op.name.lower()}: {describe(b)} does not broadcast to {describe(a)} "
            f"(each ne of the first must be a multiple of the second's)"
        )
    return _set(_result(ctx, a, inplace), op, a, b)


# %% [markdown]
# The four arithmetic ops share that one rule, so one small function makes each of them and its
# in-place twin: `add(ctx, a, b, inplace=True)` is `ggml_add_inplace`, and the `*_inplace` names exist
# as well because ggml's users call them by those names. Each constructor's docstring names its C
# function, as everywhere in the package.

# %%
# | export
def _arithmetic(op: Op, c_name: str, what: str) -> tuple:
    """The constructors `c_name` and `c_name`_inplace of the element-wise `op` (`ggml_add`, `ggml_sub`,
    `ggml_mul`, `ggml_div` and their `_inplace` forms): `what`, b broadcast over a."""

    def constructor(ctx, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
        return _binary(ctx, op, a, b, inplace)

    def constructor_inplace(ctx, a: Tensor, b: Tensor) -> Tensor:
        return _binary(ctx, op, a, b, True)

    name = c_name.removeprefix("ggml_")
    constructor.__name__ = constructor.__qualname__ = name
    constructor.__doc__ = f"`{c_name}` (`{c_name}_inplace` with inplace=True): {what}, b broadcast over a."
    constructor_inplace.__name__ = constructor_inplace.__qualname__ = f"{name}_inplace"
    constructor_inplace.__doc__ = f"`{c_name}_inplace`: {what}, the result a view of `a`."
    return constructor, constructor_inplace


add, add_inplace = _arithmetic(Op.ADD, "ggml_add", "a + b")
sub, sub_inplace = _arithmetic(Op.SUB, "ggml_sub", "a - b")
mul, mul_inplace = _arithmetic(Op.MUL, "ggml_mul", "a * b")
div, div_inplace = _arithmetic(Op.DIV, "ggml_div", "a / b")


# %% [markdown]
# Next the ops of one source. `ggml_sqr`, `ggml_sqrt`, `ggml_log` and `ggml_dup` keep the shape and
# type of `a`, so their result is `ggml_dup_tensor(a)` (or, in place, a view of it). `ggml_add1` adds a
# *scalar* tensor and refuses anything else. The reductions make a smaller tensor instead:
# `ggml_sum_rows` keeps one value per row (`ne[0]` becomes 1), `ggml_sum` one value in all, and
# `ggml_mean` is a row reduction that is always f32. `ggml_scale` is the first op with a parameter:
# the factor is a float, and ggml stores it in `op_params[0]` as its 32 bits — which is why a
# recorded file shows `scale` 0.125 as the integer 1040187392.

# %%
# | export
def add1(ctx, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_add1` (`ggml_add1_inplace` with inplace=True): a + the scalar b."""
    if not tensor.is_scalar(b):
        raise ShapeError(f"ggml_add1: {describe(b)} must be a scalar (ne = [1, 1, 1, 1])")
    if not tensor.is_padded_1d(a):
        raise LayoutError(f"ggml_add1: {describe(a)} must have contiguous rows (nb = {a.nb})")
    return _set(_result(ctx, a, inplace), Op.ADD1, a, b)


def _elementwise(ctx, op: Op, a: Tensor, inplace: bool) -> Tensor:
    # ggml_sqr_impl / ggml_sqrt_impl / ggml_log_impl / ggml_dup_impl
    return _set(_result(ctx, a, inplace), op, a)


def sqr(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_sqr` (`ggml_sqr_inplace`): a²."""
    return _elementwise(ctx, Op.SQR, a, inplace)


def sqrt(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_sqrt` (`ggml_sqrt_inplace`)."""
    return _elementwise(ctx, Op.SQRT, a, inplace)


def log(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_log` (`ggml_log_inplace`)."""
    return _elementwise(ctx, Op.LOG, a, inplace)


def dup(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_dup` (`ggml_dup_inplace`): a copy of `a` (contiguous)."""
    return _elementwise(ctx, Op.DUP, a, inplace)


def sum_rows(ctx, a: Tensor) -> Tensor:
    """`ggml_sum_rows`: the sum of every row; the result has `ne = [1, ne1, ne2, ne3]`."""
    return _set(ctx.new_tensor(a.type, [1, a.ne[1], a.ne[2], a.ne[3]]), Op.SUM_ROWS, a)


def sum(ctx, a: Tensor) -> Tensor:  # ggml's name; it shadows the builtin only in this module
    """`ggml_sum`: the sum of all elements, a 1-element tensor of `a`'s type."""
    return _set(ctx.new_tensor(a.type, [1, 1, 1, 1]), Op.SUM, a)


def mean(ctx, a: Tensor) -> Tensor:
    """`ggml_mean`: the mean of every row, f32 `[1, ne1, ne2, ne3]`."""
    return _set(ctx.new_tensor(F32, [1, a.ne[1], a.ne[2], a.ne[3]]), Op.MEAN, a)


def scale(ctx, a: Tensor, s: float, inplace: bool = False) -> Tensor:
    """`ggml_scale` (`ggml_scale_inplace`): a·s; `op_params[0]` holds s as f32 bits."""
    if not tensor.is_padded_1d(a):
        raise LayoutError(f"ggml_scale: {describe(a)} must have contiguous rows (nb = {a.nb})")
    t = _set(_result(ctx, a, inplace), Op.SCALE, a)
    t.set_op_params(tensor.float_to_word(s))
    return t


def scale_inplace(ctx, a: Tensor, s: float) -> Tensor:
    """`ggml_scale_inplace`."""
    return scale(ctx, a, s, inplace=True)


# %% [markdown]
# The activation functions are not ops of their own in ggml: `ggml_silu`, `ggml_gelu`, `ggml_relu`,
# `ggml_tanh`, `ggml_neg` and `ggml_exp` all make op `UNARY`, and the function is a number in
# `op_params[0]` (`enum ggml_unary_op`), so a backend that supports `UNARY` must still check which one.
# `ggml_leaky_relu` is the odd one out: an op of its own, its slope a float parameter, and its
# in-place choice a `bool` argument rather than a separate `_inplace` function. `ggml_norm` and
# `ggml_rms_norm` normalize each row and keep their `eps` as a float parameter.

# %%
# | export
def unary(ctx, a: Tensor, op, inplace: bool = False) -> Tensor:
    """`ggml_unary` (`ggml_unary_inplace`, `ggml_unary_impl`): op UNARY, `op_params[0]` = the unary op."""
    op = UnaryOp[op] if isinstance(op, str) else UnaryOp(op)
    if not tensor.is_contiguous_1(a):
        raise LayoutError(f"ggml_unary({op.name.lower()}): {describe(a)} must have contiguous rows (nb = {a.nb})")
    t = _set(_result(ctx, a, inplace), Op.UNARY, a)
    t.set_op_params(int(op))
    return t


def _unary_constructor(op: UnaryOp) -> Callable[..., Tensor]:
    """The constructor `ggml_<op>` (`ggml_<op>_inplace` with inplace=True) of one unary op: `ggml_silu`,
    `ggml_gelu`, `ggml_relu`, `ggml_tanh`, `ggml_neg`, `ggml_exp` are each `ggml_unary` with that op."""

    def constructor(ctx, a: Tensor, inplace: bool = False) -> Tensor:
        return unary(ctx, a, op, inplace)

    name = op.name.lower()
    constructor.__name__ = constructor.__qualname__ = name
    constructor.__doc__ = f"`ggml_{name}` (`ggml_{name}_inplace`): `ggml_unary` with UnaryOp.{op.name}."
    return constructor


silu, gelu, relu = (_unary_constructor(UnaryOp.SILU), _unary_constructor(UnaryOp.GELU),
                    _unary_constructor(UnaryOp.RELU))
tanh, neg, exp = _unary_constructor(UnaryOp.TANH), _unary_constructor(UnaryOp.NEG), _unary_constructor(UnaryOp.EXP)


def leaky_relu(ctx, a: Tensor, negative_slope: float, inplace: bool = False) -> Tensor:
    """`ggml_leaky_relu` (`ggml_leaky_relu_impl`): op LEAKY_RELU, `op_params[0]` = the slope as f32 bits."""
    t = _set(_result(ctx, a, inplace), Op.LEAKY_RELU, a)
    t.set_op_params(tensor.float_to_word(negative_slope))
    return t


def _norm(ctx, op: Op, a: Tensor, eps: float, inplace: bool) -> Tensor:
    # ggml_norm_impl / ggml_rms_norm_impl
    t = _set(_result(ctx, a, inplace), op, a)
    t.set_op_params(tensor.float_to_word(eps))
    return t


def norm(ctx, a: Tensor, eps: float, inplace: bool = False) -> Tensor:
    """`ggml_norm` (`ggml_norm_inplace`): normalize each row; `op_params[0]` = eps."""
    return _norm(ctx, Op.NORM, a, eps, inplace)


def rms_norm(ctx, a: Tensor, eps: float, inplace: bool = False) -> Tensor:
    """`ggml_rms_norm` (`ggml_rms_norm_inplace`): RMS-normalize each row; `op_params[0]` = eps."""
    return _norm(ctx, Op.RMS_NORM, a, eps, inplace)


# %% [markdown]
# Ops whose result has a shape of its own. `ggml_concat` adds the sizes along one dimension and needs
# the others equal. `ggml_mul_mat` is the one to remember: the result is always f32, whatever the
# weights' type, and `a` may be broadcast over `b`'s dimensions 2 and 3 (attention heads sharing keys).
# `ggml_get_rows` picks rows by i32 indices — how token ids become embeddings. The two diagonal masks
# keep the shape and store `n_past`, the number of positions already in the cache.

# %%
# | export
def concat(ctx, a: Tensor, b: Tensor, dim: int) -> Tensor:
    """`ggml_concat`: join along `dim`; every other dimension must match; `op_params[0]` = dim."""
    if not 0 <= dim < GGML_MAX_DIMS:
        raise ShapeError(f"ggml_concat: dim {dim} of {describe(a)} is out of range 0..3")
    if a.type is not b.type:
        raise DataTypeError(f"ggml_concat: {describe(a)} and {describe(b)} must have the same type")
    ne = []
    for d in range(GGML_MAX_DIMS):
        if d != dim and a.ne[d] != b.ne[d]:
            raise ShapeError(f"ggml_concat along dim {dim}: {describe(a)} and {describe(b)} differ in dim {d}")
        ne.append(a.ne[d] + b.ne[d] if d == dim else a.ne[d])
    t = _set(ctx.new_tensor(a.type, ne), Op.CONCAT, a, b)
    t.set_op_params(dim)
    return t


def mul_mat(ctx, a: Tensor, b: Tensor) -> Tensor:
    """`ggml_mul_mat`: contracts `ne[0]`; result f32 `[a.ne1, b.ne1, b.ne2, b.ne3]` (numpy: `b @ a.T`),
    `a` broadcast over dims 2 and 3 (`ggml_can_mul_mat`)."""
    if not (a.ne[0] == b.ne[0] and b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0):
        raise ShapeError(
            f"ggml_mul_mat: cannot multiply {describe(a)} by {describe(b)} (need equal ne[0] and "
            f"b.ne[2], b.ne[3] multiples of a's)"
        )
    if tensor.is_transposed(a):
        raise LayoutError(f"ggml_mul_mat: {describe(a)} must not be transposed (nb = {a.nb})")
    return _set(ctx.new_tensor(F32, [a.ne[1], b.ne[1], b.ne[2], b.ne[3]]), Op.MUL_MAT, a, b)


def get_rows(ctx, a: Tensor, b: Tensor) -> Tensor:
    """`ggml_get_rows`: rows of `a` picked by the i32 indices `b`; result `[a.ne0, b.ne0, b.ne1, b.ne2]`,
    f32 (i32 when `a` is i32)."""
    if b.type is not I32:
        raise DataTypeError(f"ggml_get_rows: the indices {describe(b)} must be i32")
    if a.ne[2] != b.ne[1] or b.ne[3] != 1:
        raise ShapeError(f"ggml_get_rows: indices {describe(b)} do not fit rows of {describe(a)} "
                         "(a.ne[2] == b.ne[1], b.ne[3] == 1)")
    type = I32 if a.type is I32 else F32
    return _set(ctx.new_tensor(type, [a.ne[0], b.ne[0], b.ne[1], b.ne[2]]), Op.GET_ROWS, a, b)


def diag_mask_inf(ctx, a: Tensor, n_past: int, inplace: bool = False) -> Tensor:
    """`ggml_diag_mask_inf` (`_inplace`): -inf above the diagonal shifted by n_past; `op_params[0]` = n_past."""
    t = _set(_result(ctx, a, inplace), Op.DIAG_MASK_INF, a)
    t.set_op_params(n_past)
    return t


def diag_mask_zero(ctx, a: Tensor, n_past: int, inplace: bool = False) -> Tensor:
    """`ggml_diag_mask_zero` (`_inplace`): 0 above the diagonal shifted by n_past."""
    t = _set(_result(ctx, a, inplace), Op.DIAG_MASK_ZERO, a)
    t.set_op_params(n_past)
    return t


# %% [markdown]
# The two ops of attention that carry the most parameters. `ggml_soft_max_ext` takes an optional mask
# (the causal mask, in `src[1]`) with a scale and an ALiBi bias, both floats; `ggml_soft_max` is the
# same op with scale 1 and no mask. `ggml_rope_ext` rotates pairs of values by their position: the
# positions are an i32 tensor in `src[1]`, optional frequency factors in `src[2]`, and eleven words of
# parameters, two of them left at zero (the slots of the former `n_past` and `n_ctx`).

# %%
# | export
def soft_max_ext(ctx, a: Tensor, mask, scale: float, max_bias: float, inplace: bool = False) -> Tensor:
    """`ggml_soft_max_ext` (`ggml_soft_max_impl`): softmax(a·scale + mask) per row; `op_params` =
    (scale, max_bias) as f32 bits; `src[1]` = mask."""
    if not tensor.is_contiguous(a):
        raise LayoutError(f"ggml_soft_max: {describe(a)} must be contiguous (nb = {a.nb})")
    if mask is not None:
        if mask.type not in (F16, F32):
            raise DataTypeError(f"ggml_soft_max: the mask {describe(mask)} must be f16 or f32")
        if not tensor.is_contiguous(mask) or not tensor.is_matrix(mask):
            raise LayoutError(f"ggml_soft_max: the mask {describe(mask)} must be a contiguous matrix")
        if mask.ne[0] != a.ne[0] or mask.ne[1] < a.ne[1]:
            raise ShapeError(f"ggml_soft_max: the mask {describe(mask)} does not cover {describe(a)}")
    if max_bias > 0 and mask is None:
        raise ShapeError(f"ggml_soft_max: max_bias > 0 needs a mask ({describe(a)})")
    t = _set(_result(ctx, a, inplace), Op.SOFT_MAX, a, mask)
    t.set_op_params(tensor.float_to_word(scale), tensor.float_to_word(max_bias))
    return t


def soft_max(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_soft_max` (`ggml_soft_max_inplace`): softmax of each row (scale 1, no mask)."""
    return soft_max_ext(ctx, a, None, 1.0, 0.0, inplace)


def rope_ext(ctx, a: Tensor, pos: Tensor, freq_factors, n_dims: int, mode: int, n_ctx_orig: int,
             freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
             beta_fast: float, beta_slow: float, inplace: bool = False) -> Tensor:
    """`ggml_rope_ext` (`ggml_rope_impl`): rotary embedding; `op_params` = (0, n_dims, mode, 0,
    n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow), floats as bits."""
    if mode & 1:
        raise ShapeError(f"ggml_rope: mode & 1 is no longer supported ({describe(a)})")
    if pos.type is not I32:
        raise DataTypeError(f"ggml_rope: the positions {describe(pos)} must be i32")
    if not tensor.is_vector(pos) or a.ne[2] != pos.ne[0]:
        raise ShapeError(f"ggml_rope: positions {describe(pos)} must be a vector of a.ne[2] = {a.ne[2]} "
                         f"for {describe(a)}")
    if freq_factors is not None and (freq_factors.type is not F32 or freq_factors.ne[0] < n_dims // 2):
        raise ShapeError(f"ggml_rope: freq_factors {describe(freq_factors)} must be f32 with ne[0] >= {n_dims // 2}")
    t = _set(_result(ctx, a, inplace), Op.ROPE, a, pos, freq_factors)
    floats = (freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)
    t.set_op_params(0, n_dims, mode, 0, n_ctx_orig, *(tensor.float_to_word(v) for v in floats))
    return t



# %% [markdown]
# Flash attention folds the three steps of attention — `kq = mul_mat(k, q)`, the masked softmax, and
# `mul_mat(v, kq)` — into one op, `ggml_flash_attn_ext(ctx, q, k, v, mask, scale, max_bias,
# logit_softcap)`, so the `n_kv × n_queries × n_head` matrix of scores never becomes a tensor. Its
# sources are `q`, `k`, `v` and the optional mask in slots 0-3; V comes *untransposed*, laid out like K.
# The result is f32 and permuted: `ne = {q->ne[0], q->ne[2], q->ne[1], q->ne[3]}` — head size, heads,
# queries — where `mul_mat(v, kq)` gave head size, queries, heads. (In mid-2024 ggml the first
# dimension is `q->ne[0]`; ggml later takes `v->ne[0]`, which differs only when K and V have different
# head sizes.) The asserts are few: K must multiply Q as in `ggml_can_mul_mat` (equal `ne[0]`, and
# Q's heads a multiple of K's: grouped-query attention), and a mask must be contiguous, one matrix,
# and have at least `GGML_PAD(n_queries, GGML_KQ_MASK_PAD)` rows, `GGML_KQ_MASK_PAD` being 32 (so that
# GPU kernels need no bounds checks, says llama.cpp). An ALiBi bias (`max_bias > 0`) needs a mask. The three
# floats are words 0-2 of `op_params`; `ggml_flash_attn_ext_set_prec` writes an `enum ggml_prec` as
# the int32 word 3 (`GGML_PREC_F32` is 1 in 2024's ggml.h, 10 in today's). `ggml_op_can_inplace`
# does not list the op: the graph allocator never reuses a parent's memory for it.

# %%
# | export
GGML_KQ_MASK_PAD = 32  # ggml.h: the rows of a flash-attention mask are padded to a multiple of this
GGML_PREC_DEFAULT, GGML_PREC_F32 = 0, 1  # `enum ggml_prec` (ggml.h of 2024)


def flash_attn_ext(ctx, q: Tensor, k: Tensor, v: Tensor, mask, scale: float, max_bias: float,
                   logit_softcap: float) -> Tensor:
    """`ggml_flash_attn_ext`: softmax(k·q·scale + mask)·v per head in one op; result f32
    `[q.ne0, q.ne2, q.ne1, q.ne3]` (permuted); `op_params` = (scale, max_bias, logit_softcap) as f32
    bits; `src` = (q, k, v, mask)."""
    if not (k.ne[0] == q.ne[0] and q.ne[2] % k.ne[2] == 0 and q.ne[3] % k.ne[3] == 0):
        raise ShapeError(f"ggml_flash_attn_ext: k {describe(k)} cannot multiply q {describe(q)} (need equal "
                         "ne[0] and q.ne[2], q.ne[3] multiples of k's)")
    if mask is not None:
        if not tensor.is_contiguous(mask):
            raise LayoutError(f"ggml_flash_attn_ext: the mask {describe(mask)} must be contiguous (nb = {mask.nb})")
        if mask.ne[2] != 1 or mask.ne[3] != 1:
            raise ShapeError(f"ggml_flash_attn_ext: the mask {describe(mask)} must be a matrix (ne[2] = ne[3] = 1)")
        rows = -(-q.ne[1] // GGML_KQ_MASK_PAD) * GGML_KQ_MASK_PAD  # GGML_PAD(q->ne[1], GGML_KQ_MASK_PAD)
        if mask.ne[1] < rows:
            raise ShapeError(f"ggml_flash_attn_ext: the mask {describe(mask)} has {mask.ne[1]} rows; the "
                             f"{q.ne[1]} queries of {describe(q)} need at least {rows} (padded to "
                             f"GGML_KQ_MASK_PAD = {GGML_KQ_MASK_PAD})")
    if max_bias > 0 and mask is None:
        raise ShapeError(f"ggml_flash_attn_ext: max_bias > 0 needs a mask ({describe(q)})")
    t = _set(ctx.new_tensor(F32, [q.ne[0], q.ne[2], q.ne[1], q.ne[3]]), Op.FLASH_ATTN_EXT, q, k, v, mask)
    t.set_op_params(*(tensor.float_to_word(x) for x in (scale, max_bias, logit_softcap)))
    return t


def flash_attn_ext_set_prec(a: Tensor, prec: int) -> None:
    """`ggml_flash_attn_ext_set_prec`: the precision (`enum ggml_prec`) as the int32 `op_params[3]`."""
    if a.op is not Op.FLASH_ATTN_EXT:
        raise TensorError(f"ggml_flash_attn_ext_set_prec: {describe(a)} is a {a.op.name}, not FLASH_ATTN_EXT")
    a.op_params[3] = int(prec)


# %% [markdown]
# ### Views, reshapes, permutes, copies
#
# These make a tensor that **shares memory** with its source. ggml keeps `view_src` pointing at the
# root and accumulates `view_offs`, so a view of a view of `h` still names `h`. `view_2d(a, ne0, ne1,
# nb1, offset)` takes the row stride from the caller — that is how llama.cpp cuts heads out of a
# KV cache. `permute(a, 0, 2, 1, 3)` sends dimension `i` of `a` to position `axis_i` of the result
# and swaps the strides with it; nothing moves in memory. `cont` makes a permuted view contiguous
# again (a real copy, a new tensor). `cpy(a, b)` writes `a` into `b`'s memory: its result is a view
# of `b`.

# %%
# | export
def _view_impl(ctx, a: Tensor, ne, offset: int) -> Tensor:
    # ggml_view_impl: op VIEW, op_params = the byte offset as a size_t (two int32 words)
    t = ctx._new_tensor_impl(a.type, ne, a, offset)
    t.format_name("%s (view)", a.name)
    t.set_op_params(*_size_t_words(offset))
    return _set(t, Op.VIEW, a)


def _size_t_words(v: int):
    """A size_t as the two int32 words `memcpy` puts in op_params (little-endian)."""
    lo, hi = v & 0xFFFFFFFF, (v >> 32) & 0xFFFFFFFF
    return (lo - (1 << 32) if lo >= 1 << 31 else lo), (hi - (1 << 32) if hi >= 1 << 31 else hi)


def view_1d(ctx, a: Tensor, ne0: int, offset: int) -> Tensor:
    """`ggml_view_1d`: `ne0` elements of `a` from byte `offset`."""
    return _view_impl(ctx, a, [ne0], offset)


def view_2d(ctx, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int) -> Tensor:
    """`ggml_view_2d`: `ne1` rows of `ne0` elements, `nb1` bytes apart, from byte `offset`."""
    t = _view_impl(ctx, a, [ne0, ne1], offset)
    t.nb[1] = nb1
    t.nb[2] = t.nb[3] = nb1 * ne1
    return t


def view_3d(ctx, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int) -> Tensor:
    """`ggml_view_3d`."""
    t = _view_impl(ctx, a, [ne0, ne1, ne2], offset)
    t.nb[1], t.nb[2] = nb1, nb2
    t.nb[3] = nb2 * ne2
    return t


def view_4d(ctx, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int, nb3: int,
            offset: int) -> Tensor:
    """`ggml_view_4d`."""
    t = _view_impl(ctx, a, [ne0, ne1, ne2, ne3], offset)
    t.nb[1], t.nb[2], t.nb[3] = nb1, nb2, nb3
    return t


def _check_reshape(fn: str, a: Tensor, ne) -> None:
    if not tensor.is_contiguous(a):
        raise LayoutError(f"ggml_{fn}: {describe(a)} must be contiguous to reshape (nb = {a.nb})")
    n = 1
    for x in ne:
        n *= x
    if n != a.nelements:
        raise ReshapeError(f"ggml_{fn}: cannot reshape {describe(a)} ({a.nelements} elements) "
                           f"to {list(ne)} ({n} elements)")


def _reshape_impl(ctx, a: Tensor, ne, fn: str) -> Tensor:
    _check_reshape(fn, a, ne)
    t = ctx._new_tensor_impl(a.type, ne, a, 0)
    t.format_name("%s (reshaped)", a.name)
    return _set(t, Op.RESHAPE, a)


def reshape(ctx, a: Tensor, b: Tensor) -> Tensor:
    """`ggml_reshape`: `a` with the shape of `b` (only `b.ne` is used)."""
    return _reshape_impl(ctx, a, b.ne, "reshape")


def reshape_1d(ctx, a: Tensor, ne0: int) -> Tensor:
    """`ggml_reshape_1d`."""
    return _reshape_impl(ctx, a, [ne0], "reshape_1d")


# %% [markdown]
# The rest of the reshapes, and the two ops that only move strides. `ggml_permute` and
# `ggml_transpose` change no byte: they exchange entries of `ne` and `nb`, so the result is usually
# *not* contiguous, and an op that needs contiguous rows must be given `ggml_cont` of it — a real copy
# into a fresh tensor, the one op here that turns a view back into memory of its own. `ggml_cont_4d`
# copies and reshapes in one step.

# %%
# | export
def reshape_2d(ctx, a: Tensor, ne0: int, ne1: int) -> Tensor:
    """`ggml_reshape_2d`."""
    return _reshape_impl(ctx, a, [ne0, ne1], "reshape_2d")


def reshape_3d(ctx, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    """`ggml_reshape_3d`."""
    return _reshape_impl(ctx, a, [ne0, ne1, ne2], "reshape_3d")


def reshape_4d(ctx, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """`ggml_reshape_4d`."""
    return _reshape_impl(ctx, a, [ne0, ne1, ne2, ne3], "reshape_4d")


def permute(ctx, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    """`ggml_permute`: dimension i of `a` goes to position `axis_i`; strides move with it;
    `op_params` = the four axes."""
    axes = (axis0, axis1, axis2, axis3)
    if any(not 0 <= x < GGML_MAX_DIMS for x in axes) or len(set(axes)) != GGML_MAX_DIMS:
        raise PermuteAxisError(f"ggml_permute of {describe(a)}: axes {list(axes)} must be a permutation of 0..3")
    t = ctx.view_tensor(a)
    t.format_name("%s (permuted)", a.name)
    ne, nb = [0] * 4, [0] * 4
    for i, ax in enumerate(axes):
        ne[ax], nb[ax] = a.ne[i], a.nb[i]
    t.ne, t.nb = ne, nb
    t.set_op_params(*axes)
    return _set(t, Op.PERMUTE, a)


def transpose(ctx, a: Tensor) -> Tensor:
    """`ggml_transpose`: swap dimensions 0 and 1 (a view: only `ne` and `nb` change)."""
    t = ctx.view_tensor(a)
    t.format_name("%s (transposed)", a.name)
    t.ne[0], t.ne[1] = a.ne[1], a.ne[0]
    t.nb[0], t.nb[1] = a.nb[1], a.nb[0]
    return _set(t, Op.TRANSPOSE, a)


def cont(ctx, a: Tensor) -> Tensor:
    """`ggml_cont` (`ggml_cont_impl`): a contiguous copy of `a`, named "<a> (cont)"."""
    t = ctx.dup_tensor(a)
    t.format_name("%s (cont)", a.name)
    return _set(t, Op.CONT, a)


def cont_4d(ctx, a: Tensor, ne0: int, ne1: int = 1, ne2: int = 1, ne3: int = 1) -> Tensor:
    """`ggml_cont_4d` (and `ggml_cont_1d/2d/3d`): a contiguous copy of `a` with a new shape of the same size."""
    if ne0 * ne1 * ne2 * ne3 != a.nelements:
        raise ReshapeError(f"ggml_cont_4d: {describe(a)} has {a.nelements} elements, "
                           f"not {ne0 * ne1 * ne2 * ne3} = {[ne0, ne1, ne2, ne3]}")
    t = ctx.new_tensor(a.type, [ne0, ne1, ne2, ne3])
    t.format_name("%s (cont)", a.name)
    return _set(t, Op.CONT, a)


def cont_2d(ctx, a: Tensor, ne0: int, ne1: int) -> Tensor:
    """`ggml_cont_2d`."""
    return cont_4d(ctx, a, ne0, ne1)


def cont_3d(ctx, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    """`ggml_cont_3d`."""
    return cont_4d(ctx, a, ne0, ne1, ne2)


# %% [markdown]
# `ggml_cpy(a, b)` is the op that writes into existing memory: its result is a view of `b`, so the
# allocator gives it no bytes, and computing it fills `b` with `a` converted to `b`'s type. llama.cpp
# stores the new keys and values into the KV cache this way.

# %%
# | export
def cpy(ctx, a: Tensor, b: Tensor) -> Tensor:
    """`ggml_cpy` (`ggml_cpy_impl`): copy (and convert) `a` into `b`'s memory; the result is a view of
    `b` named "<b> (copy of <a>)" (or "<a> (copy)" when `b` has no name)."""
    if a.nelements != b.nelements:
        raise ShapeError(f"ggml_cpy: {describe(a)} has {a.nelements} elements but {describe(b)} has {b.nelements}")
    t = ctx.view_tensor(b)
    if b.name:
        t.format_name("%s (copy of %s)", b.name, a.name)
    else:
        t.format_name("%s (copy)", a.name)
    return _set(t, Op.CPY, a, b)


# %% [markdown]
# `ggml_cast(a, type)` converts without a destination: a *fresh* tensor of `type` and `a`'s shape, op
# `CPY`, named "<a> (copy)" — and its `src[1]` is the result itself (`result->src[1] = result`,
# ggml.c:5785-5800), a quirk that backends reading a CPY's destination from `src[1]`, where `ggml_cpy` puts
# it, rely on (the CPU kernel writes the result). llama.cpp casts the f32 mask to f16 this way for flash
# attention. The self-edge is harmless where ggml walks sources:
# the graph walk has marked the tensor visited before it reads `src`, and the graph allocator counts it
# as one more child that the cast's own step takes back.

# %%
# | export
def cast(ctx, a: Tensor, type) -> Tensor:
    """`ggml_cast`: `a` converted to `type` in a fresh tensor (op CPY), named "<a> (copy)";
    `src` = (a, the result itself)."""
    t = ctx.new_tensor(type, a.ne)
    t.format_name("%s (copy)", a.name)
    return _set(t, Op.CPY, a, t)


# %% [markdown]
# ### The ops of a mixture of experts
#
# An MoE layer sends each token to its `k` best experts. `ggml_argsort(a, order)` gives, per row, the
# indices that sort it: an i32 tensor of `a`'s shape, the order (`GGML_SORT_ORDER_ASC` 0, `_DESC` 1) in
# word 0. `ggml_top_k(a, k)` is no op of its own in 2024 (ggml.c:7228-7242): it asserts `a->ne[0] >= k`,
# argsorts descending and returns a `view_4d` of the first `k` columns, row strides kept — two
# tensors, the unnamed ARGSORT and its view " (view)" (llama.cpp then names them `ffn_moe_argsort` and
# `ffn_moe_topk`). `ggml_mul_mat_id(as, b, ids)` multiplies each column of `b` by the expert matrix
# that `ids` picks: `as` holds `n_expert` matrices `[cols, rows]`, `ids` is `[n_used, n_tokens]` (i32)
# and the result f32 `{as->ne[1], ids->ne[0], b->ne[2], 1}`. Its eight asserts (ggml.c:5564-5571): `as` not
# transposed, `ids` i32 and a matrix, `as` and `b` 3-d, one id row per token of `b`, equal `ne[0]`,
# and `b`'s columns per token dividing `n_used` (one column serves all experts, as llama.cpp's
# `[n_embd, 1, n_tokens]` input does). Neither op can run in place.

# %%
# | export
class SortOrder(enum.IntEnum):
    """`enum ggml_sort_order`: the word 0 of an ARGSORT."""

    ASC = 0
    DESC = 1


def argsort(ctx, a: Tensor, order) -> Tensor:
    """`ggml_argsort`: per row, the i32 indices that sort `a` (`order`: a `SortOrder`), `a`'s shape."""
    if order not in (SortOrder.ASC, SortOrder.DESC):
        raise TensorError(f"ggml_argsort of {describe(a)}: order {order!r} is neither ASC (0) nor DESC (1)")
    t = _set(ctx.new_tensor(I32, a.ne), Op.ARGSORT, a)
    t.set_op_params(int(order))
    return t


def top_k(ctx, a: Tensor, k: int) -> Tensor:
    """`ggml_top_k` (2024): `argsort(a, DESC)` and a view of its first `k` columns, row strides kept."""
    if a.ne[0] < k:
        raise ShapeError(f"ggml_top_k: {describe(a)} has {a.ne[0]} columns, fewer than k = {k}")
    r = argsort(ctx, a, SortOrder.DESC)
    return view_4d(ctx, r, k, r.ne[1], r.ne[2], r.ne[3], r.nb[1], r.nb[2], r.nb[3], 0)


def mul_mat_id(ctx, as_: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """`ggml_mul_mat_id`: column `e` of token `t` is `as_[:, :, ids[e, t]] · b[:, e % b.ne1, t]`; result
    f32 `[as_.ne1, ids.ne0, b.ne2, 1]`; `src` = (as_, b, ids)."""
    if tensor.is_transposed(as_):
        raise LayoutError(f"ggml_mul_mat_id: the experts {describe(as_)} must not be transposed (nb = {as_.nb})")
    if ids.type is not I32:
        raise DataTypeError(f"ggml_mul_mat_id: the expert ids {describe(ids)} must be i32")
    checks = ((as_.ne[3] == 1, f"the experts {describe(as_)} must be 3-d (ne[3] = 1)"),
              (b.ne[3] == 1, f"{describe(b)} must be 3-d (ne[3] = 1)"),
              (ids.ne[2] == 1 and ids.ne[3] == 1, f"the expert ids {describe(ids)} must be a matrix"),
              (ids.ne[1] == b.ne[2], f"the ids {describe(ids)} need one row per token of {describe(b)} (ne[2])"),
              (as_.ne[0] == b.ne[0], f"the experts {describe(as_)} cannot multiply {describe(b)} (ne[0])"),
              (b.ne[1] > 0 and ids.ne[0] % b.ne[1] == 0,
               f"{describe(b)} has {b.ne[1]} columns per token, which do not divide the {ids.ne[0]} ids per token"))
    for ok, why in checks:
        if not ok:
            raise ShapeError(f"ggml_mul_mat_id: {why}")
    t = ctx.new_tensor(F32, [as_.ne[1], ids.ne[0], b.ne[2], 1])
    return _set(t, Op.MUL_MAT_ID, as_, b, ids)



# %% [markdown]
# A worked example: the attention-head reshuffle of a LLaMA block. `q` is `[n_embd, n_tokens]`,
# reshaped to `[head_dim, n_head, n_tokens]`, then permuted so heads come last but one. The
# permute changes no byte: look at its strides.

# %%
ctx = Context("demo")
q = ctx.new_tensor_2d(F32, 64, 16, name="Qcur")
q3 = reshape_3d(ctx, q, 16, 4, 16)
qp = permute(ctx, q3, 0, 2, 1, 3)
qc = cont(ctx, qp)
for t in (q, q3, qp, qc):
    print(f"{t.name:24s} op={t.op.name:9s} ne={t.ne} nb={t.nb} view_src={t.view_src.name if t.view_src else None}")

# %% [markdown]
# `Qcur (reshaped) (permuted)` views **`Qcur`** directly — not the reshape — because ggml resolves
# `view_src` to the root. Offsets accumulate the same way: a row view into a row view.

# %%
h = ctx.new_tensor_2d(F32, 48, 64, name="h")
rows = view_2d(ctx, h, 48, 8, h.nb[1], 4 * h.nb[1])  # rows 4..11
row = view_1d(ctx, rows, 48, 2 * h.nb[1])  # row 2 of that = row 6 of h
print(rows, "\n", row, "op_params", row.op_params[:2])
try:
    view_1d(ctx, h, 48, 64 * h.nb[1])  # one row past the end
except ViewBoundsError as e:
    print("ViewBoundsError:", e)

# %% [markdown]
# ### One table of ops: how to build a tensor again from what it records
#
# Every constructor above leaves the same trace on its result: the op, the sources in slot order,
# the `op_params` words, the shape, and — for in-place variants and views — a `view_src`. Three
# places of the project must go the other way, from a recorded tensor back to the call that made it:
# the graph-file reader of appendix A1 replays a file through these constructors, and the test
# oracle mirrors a ggml_lite graph into the real ggml, once by calling `ggml_<name>` through
# ggml-python and once by writing ggml_lite code for a bug report. Rather than three hand-written
# dispatchers that can drift apart, one declarative table says, for every op, which constructor
# builds it and how the recorded words turn back into that constructor's arguments.
#
# A row (`OpSpec`) holds:
#
# * `ctor`: the constructor's name — `ggml_<ctor>` in ggml.c, `ops.<ctor>` here (always the most
#   general one: `view_4d`, `reshape_4d`, `cont_4d`, `soft_max_ext`, `rope_ext`);
# * `n_src` and `required`: how many sources it takes in slot order and how many of them must be
#   tensors (`soft_max_ext`'s mask and `rope_ext`'s frequency factors may be NULL);
# * `shape`: arguments read from the result itself, first — `ne` for reshape and cont, `ne` then
#   `nb[1:]` for a view (ggml does not record them in `op_params`), the type for `ggml_cast` (a `CPY`
#   that is no view: its own row, `CAST`, outside the table keyed by op);
# * `params`: the arguments read from `op_params`, each as (decoder, word index): `"f32"` is a
#   bit-cast float, `"size_t"` two words, `"unary"` a `UnaryOp`;
# * `inplace`: `"variant"` when ggml has `ggml_<ctor>_inplace`, `"argument"` when the in-place choice
#   is a trailing `bool` (`ggml_leaky_relu`), empty when the op has no in-place form;
# * `view`: the result is a view by nature (view, reshape, permute, transpose, cpy). For any other op
#   a `view_src` means the tensor was made in place;
# * `setters`: words that no constructor argument writes but a setter called afterwards does, each as
#   (setter, decoder, word index): `FLASH_ATTN_EXT`'s precision, word 3, is written by
#   `ggml_flash_attn_ext_set_prec`.
#
# `ROPE` shows why the table is worth it: its eleven words are `(0, n_dims, mode, 0, n_ctx_orig,
# freq_base, …, beta_slow)`, and `ggml_rope_ext` takes them in a different order, skipping words 0
# and 3. That knowledge now lives in one row.

# %%
# | export
def param_i32(words, i: int) -> int:
    """`op_params[i]` as the int32 it is (`ggml_get_op_params_i32`)."""
    return words[i]


def param_f32(words, i: int) -> float:
    """`op_params[i]` read as the f32 whose bits it holds (`ggml_get_op_params_f32`)."""
    return tensor.word_to_float(words[i])


def param_size_t(words, i: int) -> int:
    """The size_t that `memcpy` spread over `op_params[i]` and `op_params[i + 1]` (little-endian), as
    `ggml_view_impl` stores a view's offset; the inverse of `_size_t_words`."""
    return (words[i] & 0xFFFFFFFF) | ((words[i + 1] & 0xFFFFFFFF) << 32)


def param_unary(words, i: int) -> UnaryOp:
    """`op_params[i]` as the `enum ggml_unary_op` it holds (`ggml_get_unary_op`)."""
    return UnaryOp(words[i])


PARAM_DECODERS = {"i32": param_i32, "f32": param_f32, "size_t": param_size_t, "unary": param_unary}


class OpSpec(NamedTuple):
    """One row of the op table `OPS`: the constructor that builds a tensor of this op and how its
    arguments are read back from the tensor (see `decode_op`)."""

    ctor: str  # ggml_<ctor> in ggml.c, ops.<ctor> in ggml_lite
    n_src: int = 1  # sources passed, in slot order (an absent optional one as None)
    required: int = -1  # how many of them must be tensors (-1: all n_src)
    params: tuple = ()  # op_params -> arguments: ((decoder name, word index), ...), in argument order
    shape: str = ""  # arguments from the result, before params: "ne", "ne nb" (ne, then nb[1:]) or "type"
    inplace: str = ""  # "variant": ggml_<ctor>_inplace exists; "argument": a trailing bool; "": none
    view: bool = False  # a view by nature; for other ops a view_src means "built in place"
    setters: tuple = ()  # calls after the constructor: ((ggml_<setter> on the result, decoder, word), ...)

    @property
    def n_required(self) -> int:
        return self.n_src if self.required < 0 else self.required


# %% [markdown]
# The table itself. Read a row as a sentence: "a `SOFT_MAX` tensor is built by `soft_max_ext` from
# `a` and an optional mask, with `scale` and `max_bias` from words 0 and 1 as floats; ggml has an
# in-place variant."

# %%
# | export
_F0, _I0 = (("f32", 0),), (("i32", 0),)

OPS: dict = {
    Op.DUP: OpSpec("dup", inplace="variant"),
    Op.ADD: OpSpec("add", 2, inplace="variant"),
    Op.ADD1: OpSpec("add1", 2, inplace="variant"),
    Op.SUB: OpSpec("sub", 2, inplace="variant"),
    Op.MUL: OpSpec("mul", 2, inplace="variant"),
    Op.DIV: OpSpec("div", 2, inplace="variant"),
    Op.SQR: OpSpec("sqr", inplace="variant"),
    Op.SQRT: OpSpec("sqrt", inplace="variant"),
    Op.LOG: OpSpec("log", inplace="variant"),
    Op.SUM: OpSpec("sum"),
    Op.SUM_ROWS: OpSpec("sum_rows"),
    Op.MEAN: OpSpec("mean"),
    Op.CONCAT: OpSpec("concat", 2, params=_I0),
    Op.NORM: OpSpec("norm", params=_F0, inplace="variant"),
    Op.RMS_NORM: OpSpec("rms_norm", params=_F0, inplace="variant"),
    Op.MUL_MAT: OpSpec("mul_mat", 2),
    Op.MUL_MAT_ID: OpSpec("mul_mat_id", 3),
    Op.SCALE: OpSpec("scale", params=_F0, inplace="variant"),
    Op.CPY: OpSpec("cpy", 2, view=True),
    Op.CONT: OpSpec("cont_4d", shape="ne"),
    Op.RESHAPE: OpSpec("reshape_4d", shape="ne", view=True),
    Op.VIEW: OpSpec("view_4d", shape="ne nb", params=(("size_t", 0),), view=True),
    Op.PERMUTE: OpSpec("permute", params=tuple(("i32", i) for i in range(4)), view=True),
    Op.TRANSPOSE: OpSpec("transpose", view=True),
    Op.GET_ROWS: OpSpec("get_rows", 2),
    Op.DIAG_MASK_INF: OpSpec("diag_mask_inf", params=_I0, inplace="variant"),
    Op.DIAG_MASK_ZERO: OpSpec("diag_mask_zero", params=_I0, inplace="variant"),
    Op.SOFT_MAX: OpSpec("soft_max_ext", 2, required=1, params=(("f32", 0), ("f32", 1)), inplace="variant"),
    Op.ROPE: OpSpec("rope_ext", 3, required=2, inplace="variant",
                    params=(("i32", 1), ("i32", 2), ("i32", 4), *(("f32", i) for i in range(5, 11)))),
    Op.ARGSORT: OpSpec("argsort", params=_I0),
    Op.LEAKY_RELU: OpSpec("leaky_relu", params=_F0, inplace="argument"),
    Op.FLASH_ATTN_EXT: OpSpec("flash_attn_ext", 4, required=3, params=tuple(("f32", i) for i in range(3)),
                              setters=(("flash_attn_ext_set_prec", "i32", 3),)),
    Op.UNARY: OpSpec("unary", params=(("unary", 0),), inplace="variant"),
}
CAST = OpSpec("cast", shape="type")  # a CPY that is no view: `ggml_cast` (its src[1], itself, is not passed)

# %% [markdown]
# The decoder turns what a tensor records into a call, `OpCall(op, ctor, inplace, sources, args)`.
# It takes the fields rather than a tensor so that a JSON entry (appendix A1) and a live `Tensor`
# (`op_call`) go through the same code. Each dispatcher then only knows how to *call*:
#
# ```python
# call = op_call(t)                                        # or decode_op(...) for a recorded entry
# ops.build(ctx, call)                                     # ggml_lite: ops.<ctor>(ctx, *sources, *args, inplace=...)
# getattr(ggml, call.c_name)(ctx, *srcs, *call.c_args)     # ggml-python: ggml_<ctor>[_inplace](...)
# for setter, value in call.then: ...                      # then ggml_<setter>(t, value) on the result
# f"gl.{call.ctor}(ctx, {', '.join(names + [repr(a) for a in call.args])})"   # code (UnaryOp: gl.UnaryOp.X)
# ```

# %%
# | export
class OpCall(NamedTuple):
    """A constructor call that rebuilds one tensor: `ops.<ctor>(ctx, *sources, *args)` with
    `inplace=True` when `inplace`; in C, `<c_name>(ctx, *sources, *c_args)`.

    How a dispatcher uses it (sources already mapped to its own tensors):

        call = op_call(t)                                  # a Tensor; decode_op(...) for recorded fields
        ops.build(ctx, call)                               # ggml_lite
        getattr(ggml, call.c_name)(ctx, *srcs, *call.c_args)   # ggml-python (map UnaryOp args to its codes)
        for setter, value in call.then: ...                # then `setter` on the result, in ggml as ggml_<setter>
        f"gl.{call.ctor}(ctx, {args}{', inplace=True' if call.inplace else ''})"   # ggml_lite source code
    """

    op: Op
    ctor: str
    inplace: bool
    sources: tuple
    args: tuple
    then: tuple = ()  # setters to call on the result: ((setter, value), ...); in C, ggml_<setter>(t, value)

    @property
    def c_name(self) -> str:
        """The C function: `ggml_<ctor>`, or `ggml_<ctor>_inplace` for an in-place variant."""
        suffix = "_inplace" if self.inplace and OPS[self.op].inplace == "variant" else ""
        return f"ggml_{self.ctor}{suffix}"

    @property
    def c_args(self) -> tuple:
        """The C arguments after the sources: `args`, plus the in-place bool where C takes one."""
        return (*self.args, self.inplace) if OPS[self.op].inplace == "argument" else self.args


def decode_op(op: Op, op_params, src, ne, nb, has_view_src: bool, type=None) -> OpCall:
    """The call that rebuilds a tensor from what it records: its op, op_params words, sources (any
    objects: tensors, ids, names; missing slots padded with None), shape `ne`, strides `nb`, whether
    it has a `view_src` (which, for an op that is no view by nature, means "in place"), and its type
    (needed only by a CPY without `view_src`: `ggml_cast`)."""
    spec = CAST if op is Op.CPY and not has_view_src else OPS.get(op)
    if spec is None:
        raise UnknownOpError(f"ggml_lite has no constructor for op {op.name} (not in ops.OPS)")
    words = [*op_params, *[0] * (GGML_MAX_OP_PARAMS // 4)]
    shape = {"ne nb": [*ne, *nb[1:]], "ne": list(ne), "type": [type], "": []}[spec.shape]
    args = (*shape, *(PARAM_DECODERS[d](words, i) for d, i in spec.params))
    sources = (*src, *[None] * spec.n_src)[: spec.n_src]
    inplace = has_view_src and not spec.view and spec.inplace != ""
    then = tuple((setter, PARAM_DECODERS[d](words, i)) for setter, d, i in spec.setters)
    return OpCall(op, spec.ctor, inplace, sources, args, then)


def op_call(t: Tensor, src=None) -> OpCall:
    """`decode_op` of a tensor (with its own sources, or `src` in their place)."""
    return decode_op(t.op, t.op_params, t.src if src is None else src, t.ne, t.nb, t.view_src is not None, t.type)


def build(ctx, call: OpCall) -> Tensor:
    """Make the call with ggml_lite's constructors: `ops.<ctor>(ctx, *sources, *args[, inplace=True])`,
    then each setter of `call.then` on the result."""
    fn = globals()[call.ctor]
    t = fn(ctx, *call.sources, *call.args, inplace=True) if call.inplace else fn(ctx, *call.sources, *call.args)
    for setter, value in call.then:
        globals()[setter](t, value)
    return t


# %% [markdown]
# The table is checked against the constructors: rebuilding every tensor of the examples above from its
# own record gives the same shape, strides, view and parameters.

# %%
def same(a: Tensor, b: Tensor) -> bool:
    return (a.op, a.ne, a.nb, a.op_params, a.view_src, a.view_offs) == (b.op, b.ne, b.nb, b.op_params, b.view_src, b.view_offs)


for t in (q3, qp, qc, rows, row, scale_inplace(ctx, h, 0.5), soft_max_ext(ctx, qc, None, 0.125, 0.0)):
    call = op_call(t)
    assert same(build(ctx, call), t), call
print(op_call(rows))
print(op_call(rows).c_name, op_call(rows).c_args)


# %% [markdown]
# A worked example of flash attention's shapes: 7 queries of 8 heads of size 64 against a cache of 256
# cells with 2 KV heads (grouped-query attention, 4 query heads per KV head), and an f16 mask of 256 ×
# 32 rows (7 queries padded to `GGML_KQ_MASK_PAD`). The result is `[64, 8, 7, 1]`, f32, 14,336 bytes,
# with words 0-2 the scale 1/8 and two zeros; `ggml_flash_attn_ext_set_prec(fa, GGML_PREC_F32)` makes
# word 3 a 1, and the op table's call sets it again. The unfused path's `kq = mul_mat(k, q)` alone is
# `[256, 7, 8, 1]`: 57,344 bytes that flash attention never holds. A mask of 8 rows is refused.

# %%
# NBVAL_CHECK_OUTPUT
fq = ctx.new_tensor_3d(F32, 64, 7, 8, name="fa_q")
fk = ctx.new_tensor_3d(F16, 64, 256, 2, name="fa_k")
fv = ctx.new_tensor_3d(F16, 64, 256, 2, name="fa_v")
fmask = ctx.new_tensor_2d(F16, 256, 32, name="fa_mask")
fa = flash_attn_ext(ctx, fq, fk, fv, fmask, 0.125, 0.0, 0.0)
flash_attn_ext_set_prec(fa, GGML_PREC_F32)
print(fa.op.name, fa.type.name, fa.ne, fa.nb, fa.nbytes, fa.op_params[:4])
print(op_call(fa).c_name, op_call(fa).args, op_call(fa).then)
assert same(build(ctx, op_call(fa)), fa)
print("unfused kq:", mul_mat(ctx, fk, fq).ne, mul_mat(ctx, fk, fq).nbytes, "bytes")
try:
    flash_attn_ext(ctx, fq, fk, fv, ctx.new_tensor_2d(F16, 256, 8, name="short_mask"), 0.125, 0.0, 0.0)
except ShapeError as err:
    print(err)


# %% [markdown]
# A worked example of an MoE layer's routing: 5 tokens, 8 experts, the top 2. `top_k` returns a view of
# 2 columns of an i32 argsort of 8: its row stride stays 32 bytes, so the view is not contiguous, and
# its source is the unnamed ARGSORT with word 0 = 1 (descending). `mul_mat_id` of 8 expert matrices
# `[64, 96]` (q4_0) by a `[64, 1, 5]` input gives `[96, 2, 5, 1]`: one column per token and chosen
# expert. Last, `ggml_cast` of the mask: f16, named "KQ_mask (copy)", its own `src[1]`; the op table
# rebuilds it as `ggml_cast(ctx, a, F16)`.

# %%
# NBVAL_CHECK_OUTPUT
probs = ctx.new_tensor_2d(F32, 8, 5, name="ffn_moe_probs")
sel = top_k(ctx, probs, 2)
for t in (sel.src[0], sel):
    print(f"{t.op.name:8s} {t.name!r:10s} ne={t.ne} nb={t.nb} op_params={t.op_params[:2]} contiguous={tensor.is_contiguous(t)}")
up = mul_mat_id(ctx, ctx.new_tensor_3d(Q4_0, 64, 96, 8, name="ffn_up_exps"),
                reshape_3d(ctx, ctx.new_tensor_2d(F32, 64, 5, name="cur"), 64, 1, 5), sel)
print(up.op.name, up.ne, [s.name for s in up.src])
kq_mask = cast(ctx, ctx.new_tensor_2d(F32, 256, 32, name="KQ_mask"), F16)
print(kq_mask.name, kq_mask.type.name, kq_mask.src[1] is kq_mask, op_call(kq_mask).c_name, op_call(kq_mask).args)
assert all(same(build(ctx, op_call(t)), t) for t in (sel.src[0], sel, up, kq_mask))


# %% [markdown]
# ## 2 · Graphs: nodes in execution order, leafs in first-use order
#
# `ggml_build_forward_expand(gf, t)` calls `ggml_visit_parents` (ggml.c), a depth-first walk:
#
# ```c
# if (ggml_hash_insert(&cgraph->visited_hash_set, node) == GGML_HASHSET_ALREADY_EXISTS) return;
# for (int i = 0; i < GGML_MAX_SRC; ++i) {           // sources in slot order
#     if (node->src[k]) ggml_visit_parents(cgraph, node->src[k]);
# }
# if (node->op == GGML_OP_NONE && node->grad == NULL) {   // data: a leaf
#     if (strlen(node->name) == 0) ggml_format_name(node, "leaf_%d", cgraph->n_leafs);
#     cgraph->leafs[cgraph->n_leafs++] = node;
# } else {                                                // an op (or a parameter): a node
#     if (strlen(node->name) == 0) ggml_format_name(node, "node_%d", cgraph->n_nodes);
#     cgraph->nodes[cgraph->n_nodes++] = node;
# }
# ```
#
# Three consequences the planner depends on: a node always comes after all of its sources (the node
# list *is* the execution order); a tensor reached twice is listed once, where it was first
# finished; and the order of `expand` calls matters — llama.cpp expands the KV-cache copies first so
# that they run before attention reads the cache. Only `src` is followed, never `view_src`: every
# view op has its source in `src[0]`, but a bare `ggml_view_tensor` (op NONE) is a leaf.
#
# The C recursion goes as deep as the longest chain of sources. Python's default limit is 1,000
# frames, and chapter 10's LLaMA graph is 645 nodes deep with 32 layers and 1,605 with 80, so the
# port walks with an explicit stack in exactly the same order.

# %%
# | export graph
"""`struct ggml_cgraph` and `ggml_build_forward_expand` (ggml.c), forward graphs only."""

from ggml_lite.errors import GraphFullError
from ggml_lite.tensor import Op, Tensor, TensorFlag, describe

GGML_DEFAULT_GRAPH_SIZE = 2048


class Graph:
    """`struct ggml_cgraph` for forward graphs (`ggml_new_graph`, `ggml_new_graph_custom` with
    `grads = false`): `nodes` in execution order, `leafs` in first-visit order, at most `size` of each,
    and the visited set (`visited_hash_set`, here a set keyed by tensor identity)."""

    __slots__ = ("size", "nodes", "leafs", "visited")

    def __init__(self, size: int = GGML_DEFAULT_GRAPH_SIZE):
        self.size = size
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self.visited: set[Tensor] = set()

    @property
    def n_nodes(self) -> int:
        """`ggml_graph_n_nodes`."""
        return len(self.nodes)

    @property
    def n_leafs(self) -> int:
        """`cgraph->n_leafs`."""
        return len(self.leafs)

    def node(self, i: int) -> Tensor:
        """`ggml_graph_node`: node `i`; a negative `i` counts from the end."""
        return self.nodes[i]

    def get_tensor(self, name: str):
        """`ggml_graph_get_tensor`: the first node, then leaf, called `name`, or None."""
        return next((t for t in (*self.nodes, *self.leafs) if t.name == name), None)

    def clear(self) -> None:
        """`ggml_graph_clear`: no nodes, no leafs, nothing visited."""
        self.nodes.clear()
        self.leafs.clear()
        self.visited.clear()

    def __repr__(self):
        return f"Graph({self.n_nodes} nodes, {self.n_leafs} leafs, size {self.size})"


def _add(graph: Graph, t: Tensor) -> None:
    """The tail of `ggml_visit_parents`: append `t` to the leafs (op NONE, not PARAM) or the nodes,
    naming it `leaf_N` / `node_N` when it has no name."""
    if t.op is Op.NONE and not t.flags & TensorFlag.PARAM:
        lst, kind = graph.leafs, "leaf"
    else:
        lst, kind = graph.nodes, "node"
    if len(lst) >= graph.size:
        raise GraphFullError(f"cannot add {describe(t)}: the graph already holds {graph.size} {kind}s (its size)")
    if not t.name:
        t.format_name("%s_%d", kind, len(lst))
    lst.append(t)


# %% [markdown]
# The walk itself, `ggml_visit_parents`, with the explicit stack: each stack entry remembers the next
# source slot to look at, so a tensor is appended only when all its sources have been. Then the three
# entry points: `build_forward_expand` adds a root to an existing graph, `build_forward` starts a new
# one, and `graph_view` takes a slice of the nodes — what the scheduler of chapter 09 hands to a backend.

# %%
# | export graph
def visit_parents(graph: Graph, root: Tensor) -> None:
    """`ggml_visit_parents`: depth-first over `src` in slot order, each tensor once, appending each
    tensor after its sources. Iterative (an explicit stack) but in exactly the recursive order."""
    visited = graph.visited
    if root in visited:
        return
    visited.add(root)
    stack = [(root, 0)]
    while stack:
        t, i = stack[-1]
        src = t.src
        n = len(src)
        while i < n:
            s = src[i]
            i += 1
            if s is not None and s not in visited:
                visited.add(s)
                stack[-1] = (t, i)
                stack.append((s, 0))
                break
        else:
            stack.pop()
            _add(graph, t)


def build_forward_expand(graph: Graph, tensor: Tensor) -> Graph:
    """`ggml_build_forward_expand` (`ggml_build_forward_impl` with expand): add `tensor` and every
    tensor it depends on that the graph does not hold yet."""
    visit_parents(graph, tensor)
    return graph


def build_forward(tensor: Tensor, size: int = GGML_DEFAULT_GRAPH_SIZE) -> Graph:
    """A new graph (`ggml_new_graph_custom`) expanded from `tensor` (`ggml_build_forward_expand`)."""
    return build_forward_expand(Graph(size), tensor)


def graph_view(graph: Graph, i0: int, i1: int) -> Graph:
    """`ggml_graph_view`: the nodes `i0..i1-1` of `graph` as a graph of their own — no leafs, nothing
    visited, size `i1 - i0`. The scheduler hands such slices (splits) to backends."""
    g = Graph(i1 - i0)
    g.nodes = graph.nodes[i0:i1]
    return g



# %% [markdown]
# A small MLP: `y = softmax(W2 · silu(W1 · x + b1))`. Watch the order. The walk starts at the
# output and always takes `src[0]` first, so the first leaf it *reaches* is `W2` (`src[0]` of the
# last mul_mat) — leafs are listed in first-reached order, not in creation order. Nodes are listed
# when *finished*, so they come out in a valid execution order. The unnamed add becomes `node_1`.

# %%
# NBVAL_CHECK_OUTPUT
ctx = Context("mlp")
x = ctx.new_tensor_2d(F32, 64, 8, name="x")
set_input(x)
W1 = ctx.new_tensor_2d(F16, 64, 128, name="W1")
b1 = ctx.new_tensor_1d(F32, 128, name="b1")
W2 = ctx.new_tensor_2d(F16, 128, 32, name="W2")
h = mul_mat(ctx, W1, x).set_name("h")
hb = add(ctx, h, b1)  # unnamed: the graph will call it node_1
y = soft_max(ctx, mul_mat(ctx, W2, silu(ctx, hb)).set_name("logits")).set_name("probs")
set_output(y)
gf = build_forward(y)
print(gf)
print("nodes:", [t.name for t in gf.nodes])
print("leafs:", [t.name for t in gf.leafs])

# %% [markdown]
# ### A picture of a graph
#
# Columns are execution steps: leafs on the left, then each node in graph order. Edges run from a
# source to its consumer; views are drawn hollow because they own no memory — exactly the
# distinction the allocator will make.

# %%
import plotly.graph_objects as go


def graph_figure(gf: Graph, title: str = "") -> go.Figure:
    """Leafs in column 0, node i in column i+1; an edge per source slot; views hollow."""
    pos = {}
    for j, t in enumerate(gf.leafs):
        pos[t] = (0, -j)
    for i, t in enumerate(gf.nodes):
        pos[t] = (i + 1, -(i % 4) - 0.5 * (i // 4 % 2))
    ex, ey = [], []
    for t in gf.nodes:
        for s in t.src:
            if s is not None and s in pos:
                ex += [pos[s][0], pos[t][0], None]
                ey += [pos[s][1], pos[t][1], None]
    fig = go.Figure(go.Scatter(x=ex, y=ey, mode="lines", line=dict(color="#bbb", width=1), hoverinfo="skip",
                               showlegend=False))  # the edges: no legend entry of their own
    kinds = {
        "leaf": [t for t in gf.leafs],
        "op": [t for t in gf.nodes if t.view_src is None],
        "view": [t for t in gf.nodes if t.view_src is not None],
    }
    style = {"leaf": ("square", "#636efa"), "op": ("circle", "#ef553b"), "view": ("circle-open", "#00cc96")}
    for kind, ts in kinds.items():
        sym, col = style[kind]
        fig.add_trace(go.Scatter(
            x=[pos[t][0] for t in ts], y=[pos[t][1] for t in ts], mode="markers+text", name=kind,
            marker=dict(symbol=sym, size=14, color=col, line=dict(width=2, color=col)),
            text=[t.name for t in ts], textposition="top center", textfont=dict(size=9),
            hovertext=[f"{t.name}<br>{t.op.name} {t.type.name} ne={t.ne}<br>{t.nbytes} B" for t in ts],
            hoverinfo="text"))
    fig.update_layout(title=title or f"{gf.n_nodes} nodes, {gf.n_leafs} leafs", height=360,
                      xaxis=dict(title="leafs | node index + 1 (execution order)", dtick=1),
                      yaxis=dict(visible=False), margin=dict(l=20, r=20, t=50, b=40))
    return fig


graph_figure(gf, "y = softmax(W2 · silu(W1 · x + b1))")

# %% [markdown]
# ### Expand order matters, and `graph_view` slices
#
# Expanding a second root only adds what the graph does not hold yet. A KV-cache write is its own
# root: expanded first, its copy runs before anything that reads the cache.

# %%
# NBVAL_CHECK_OUTPUT
ctx = Context("kv")
cache = ctx.new_tensor_1d(F16, 4 * 64, name="cache_k")
k = ctx.new_tensor_2d(F32, 64, 2, name="k")
k_view = view_1d(ctx, cache, 128, 2 * 64 * 2).set_name("k_cache_view")
store = cpy(ctx, k, k_view)
keys = view_2d(ctx, cache, 64, 4, 128, 0).set_name("k_all")
qv = ctx.new_tensor_2d(F32, 64, 2, name="q")
kq = mul_mat(ctx, keys, qv).set_name("kq")
gf2 = Graph()
build_forward_expand(gf2, store)
build_forward_expand(gf2, kq)
print([t.name for t in gf2.nodes], [t.name for t in gf2.leafs])
print("a view of nodes 1..3:", [t.name for t in graph_view(gf2, 1, 3).nodes])

# %% [markdown]
# ## 3 · Check
#
# The facts this chapter established, as asserts. The fixture tests in `tests/` replay 14 graphs
# recorded from the real ggml and compare every name, shape, stride, size, view offset and the node
# and leaf order.

# %%
import ggml_lite as gl

c = gl.Context()
t = c.new_tensor_3d(gl.F32, 32, 16, 4)
assert t.nb == [4, 128, 2048, 8192] and t.nbytes == 8192 and t.shape == (4, 16, 32)
assert c.new_tensor_2d(gl.Q8_0, 64, 8).nbytes == 8 * 2 * 34
assert c.new_tensor_2d(gl.Q4_0, 64, 8).nb == [18, 36, 288, 288]
p = gl.permute(c, t, 2, 0, 1, 3)
assert p.ne == [16, 4, 32, 1] and p.nb == [128, 2048, 4, 8192] and p.nbytes == 8192
assert p.view_src is t and p.name == " (permuted)"  # an unnamed source gives " (permuted)"
v = gl.view_1d(c, gl.view_1d(c, t, 64, 256), 16, 64)
assert v.view_src is t and v.view_offs == 320 and v.op_params[:2] == [64, 0]
assert gl.transpose(c, t).nb[:2] == [128, 4]
assert gl.mul_mat(c, c.new_tensor_2d(gl.F16, 32, 10), t).ne == [10, 16, 4, 1]
assert gl.soft_max(c, t).op_params[:2] == [1065353216, 0]
fa = gl.flash_attn_ext(c, c.new_tensor_3d(gl.F32, 32, 5, 4), c.new_tensor_3d(gl.F16, 32, 64, 2),
                       c.new_tensor_3d(gl.F16, 32, 64, 2), c.new_tensor_2d(gl.F16, 64, 32), 0.5, 0.0, 0.0)
assert fa.ne == [32, 4, 5, 1] and fa.type is gl.F32 and fa.op_params[:3] == [1056964608, 0, 0] and fa.view_src is None
cp = gl.cpy(c, t, c.new_tensor_1d(gl.F16, 2048, name="dst"))
assert cp.name == "dst (copy of )" and cp.view_src.name == "dst" and cp.op is gl.Op.CPY
cast_t = gl.cast(c, t, gl.F16)
assert cast_t.src == [t, cast_t] and cast_t.view_src is None and cast_t.name == " (copy)" and cast_t.nbytes == 4096
tk = gl.top_k(c, c.new_tensor_2d(gl.F32, 8, 5), 2)
assert tk.op is gl.Op.VIEW and tk.nb[1] == 32 and tk.src[0].op is gl.Op.ARGSORT and tk.src[0].op_params[0] == 1
assert gl.mul_mat_id(c, c.new_tensor_3d(gl.F16, 32, 10, 8), c.new_tensor_3d(gl.F32, 32, 1, 5), tk).ne == [10, 2, 5, 1]
for bad in (lambda: gl.add(c, t, c.new_tensor_1d(gl.F32, 5)),
            lambda: gl.reshape_2d(c, t, 7, 7),
            lambda: gl.permute(c, t, 0, 0, 1, 2)):
    try:
        bad()
        raise AssertionError("expected an error")
    except gl.errors.TensorError:
        pass
assert [x.name for x in gf.nodes] == ["h", "node_1", "node_2", "logits", "probs"]
assert [x.name for x in gf.leafs] == ["W2", "W1", "x", "b1"]
print("chapter 01: all checks passed")