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
# # 07 · The CPU backend
#
# Chapter 06 defined what a backend is. The CPU backend fills that table with the simplest answers:
# its memory is host memory (the CPU buffer type of chapter 03), it has no queue and no events, and
# `graph_compute` runs the nodes in order. What it adds is arithmetic: one numpy function per op,
# reading the sources through their strides and writing into the node's own bytes. That makes every
# memory plan of chapters 03–05 **proven by results**: a plan that overlaps two live tensors now
# corrupts a number (§4).
#
# **Learning goals**
#
# 1. `ggml_backend_cpu_*`: what the CPU backend supports (every op, but one rule for `MUL_MAT`), and
#    the kernels a LLaMA graph computes (appendix A7 ports the rest: ADD1, SQR, SUM, NORM, ...).
# 2. How a kernel sees a tensor: a numpy view over the buffer's bytes, any strides, any view.
# 3. The details that make ggml's numbers what they are: sums in double, src1 converted to the
#    weight's *dot type*, f16 rounding, q8_0 and q4_0 blocks, rope's angles.
# 4. Why the graph allocator's reuse is safe — and what happens when it is not.
#
# Exported: `ggml_lite.cpu`, and `ggml_lite.quants` (ggml-quants.c's reference part, §2).

# %%
# | default_exp cpu

import numpy as np

import ggml_lite as gl
from ggml_lite.backend import tensor_get, tensor_set

# %% [markdown]
# ## 1 · The C
#
# The backend itself is small (`ggml-backend.c:547-945`; no queue, no events, no async copies: their
# entries are `NULL`; threads and abort callbacks have no meaning here). The work is in the kernels,
# `ggml_compute_forward_*` in `ggml.c`, and the quantized types of `ggml-quants.c`. Every code cell
# follows the C it ports: `ggml-backend.c` lines at daa9623, `ggml.c` and `ggml-quants.c` lines at
# llama.cpp 1d1ccce (2024-08-29, vendored by llama-cpp-python 0.2.90; the reference folder lacks them).

# %% [markdown]
# ## 2 · Quantization: ggml-quants.c
#
# A q8_0 block is an f16 scale `d` and 32 int8 values (34 bytes); a q4_0 block an f16 `d` and 16
# bytes of nibbles. Scales are stored as f16, eight at a time with F16C, ggml.c:445-447:
# ```c
# for (; i + 7 < n; i += 8) {
#     __m256 x_vec = _mm256_loadu_ps(x + i);
#     __m128i y_vec = _mm256_cvtps_ph(x_vec, _MM_FROUND_TO_NEAREST_INT);
# ```
# Notice `_MM_FROUND_TO_NEAREST_INT`: f32 → f16 rounds to nearest even, as numpy's `astype` does;
# f16 → f32 is exact. q4_0's quantizer also needs a fused multiply-add: it computes `x·id` and adds
# 8.5 in two statements, which gcc `-O3` fuses into one FMA, rounding once. numpy has none, so
# `fma_f32` adds in float64 and repairs the rare double rounding (a float64 sum exactly on a float32
# midpoint), nudging it one float64 ulp towards the exact sum.

# %%
# | export quants
"""ggml-quants.c's reference part (llama.cpp 1d1ccce, as chapter 07 cites it) that this port computes
with: the q8_0 and q4_0 blocks, their quantizers (the reference ones that store a model's weights, and
the CPU backend's `quantize_row_q8_0`) and dequantizers, with the f16 conversions and the FMA they round with."""

import numpy as np

from ggml_lite.errors import ShapeError
from ggml_lite.tensor import Q4_0, Q8_0

F4, F8 = np.float32, np.float64
QK = 32  # elements per q8_0 / q4_0 block (`QK8_0`, `QK4_0`)


def fp32_to_fp16(x) -> np.ndarray:
    """`GGML_FP32_TO_FP16` / `ggml_fp32_to_fp16_row` (F16C `_mm256_cvtps_ph`): round to nearest even."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=F4).astype(np.float16)


def fp16_to_fp32(h) -> np.ndarray:
    """`GGML_FP16_TO_FP32` / `ggml_fp16_to_fp32_row`: exact widening."""
    return np.asarray(h, dtype=np.float16).astype(F4)


def fma_f32(a, b, c) -> np.ndarray:
    """`fmaf(a, b, c)` / `_mm256_fmadd_ps`: a·b + c for float32 operands, rounded once to float32."""
    with np.errstate(invalid="ignore", over="ignore"):  # (a signalling NaN warns when widened)
        a64 = np.asarray(a, dtype=F4).astype(F8)
        b64 = np.asarray(b, dtype=F4).astype(F8)
        c64 = np.asarray(c, dtype=F4).astype(F8)
        shape = np.broadcast_shapes(a64.shape, b64.shape, c64.shape)
        p = np.broadcast_to(a64 * b64, shape).reshape(-1)
        c64 = np.broadcast_to(c64, shape).reshape(-1)
        s = p + c64
    bits = s.view(np.int64)
    mag = np.abs(s)
    mid = ((bits & 0x1FFFFFFF) == 0x10000000) & (mag >= 2.0 ** -126)
    tiny = (mag < 2.0 ** -126) & (s != 0)
    if tiny.any():  # float32 subnormal range: test for an exact midpoint directly
        st = s[tiny]
        r = st.astype(F4)
        toward = np.where(st > r.astype(F8), F4(np.inf), F4(-np.inf)).astype(F4)
        midpoint = (r.astype(F8) + np.nextafter(r, toward).astype(F8)) / 2
        mid[tiny] = st == midpoint
    if mid.any():
        pb, cb, sm = p[mid], c64[mid], s[mid]
        with np.errstate(invalid="ignore"):
            bb = sm - pb
            err = (pb - (sm - bb)) + (cb - bb)  # TwoSum: exact sum = sm + err
        s[mid] = np.where(err > 0, np.nextafter(sm, np.inf), np.where(err < 0, np.nextafter(sm, -np.inf), sm))
    with np.errstate(over="ignore"):
        return s.astype(F4).reshape(shape)

# %% [markdown]
# The reference quantizers store the weights of a model file (`ggml_quantize_chunk`); q8_0's,
# ggml-quants.c:858-861:
# ```c
# for (int j = 0; j < QK8_0; ++j) {
#     const float x0 = x[i*QK8_0 + j]*id;
#
#     y[i].qs[j] = roundf(x0);
# ```
# Notice that `x` is scaled by `id = 1/d` of the *unrounded* f32 `d = max|x| / 127` (a C `MAX`
# scan; only the stored scale is rounded to f16), and `roundf` rounds halves away from zero; a
# non-finite `x·id` converts to 0 (the low byte of `cvttss2si`'s 0x80000000). q4_0's scale is the
# element of largest magnitude, sign included, the first on ties (a strict `<` scan), over −8; element
# `j` goes to the low nibble of byte `j`, element `j + 16` to its high nibble, as
# `MIN(15, (int8_t)(x0 + 8.5f))` with the FMA above (ggml-python's build does not fuse it, which
# changes a nibble only when that sum is within an ulp of an integer; the fixtures cannot tell).

# %%
# | export quants
Q8_0_DTYPE = np.dtype([("d", "<f2"), ("qs", "i1", 32)])
Q4_0_DTYPE = np.dtype([("d", "<f2"), ("qs", "u1", 16)])


def _blocks(x) -> np.ndarray:
    x = np.asarray(x, dtype=F4)
    if x.shape[-1] % QK:
        raise ShapeError(f"a row of {x.shape[-1]} values is not a whole number of {QK}-element blocks")
    return x.reshape(x.shape[:-1] + (x.shape[-1] // QK, QK))


def _c_max(a, b):
    """`MAX(a, b)` / `_mm_max_ps(a, b)`: a > b ? a : b (a NaN in either place yields b)."""
    return np.where(a > b, a, b)


def quantize_row_q8_0_ref(x) -> np.ndarray:
    """`quantize_row_q8_0_ref`: rows on the last axis of `x` -> q8_0 blocks (last axis = blocks per row)."""
    xb = _blocks(x)
    amax = np.zeros(xb.shape[:-1], dtype=F4)
    for j in range(QK):
        amax = _c_max(amax, np.abs(xb[..., j]))
    with np.errstate(all="ignore"):
        d = amax / F4(127)
        idv = np.where(d != 0, F4(1) / np.where(d != 0, d, F4(1)), F4(0)).astype(F4)
        v = (xb * idv[..., None]).astype(F8)
        q = np.trunc(v + np.copysign(0.5, v))
        q = np.where(np.isfinite(q) & (np.abs(q) < 2.0 ** 31), q, 0).astype(np.int64)
    out = np.empty(xb.shape[:-1], dtype=Q8_0_DTYPE)
    out["d"] = fp32_to_fp16(d)
    out["qs"] = (q & 0xFF).astype(np.uint8).view(np.int8)
    return out


def quantize_q8_0(values) -> np.ndarray:
    """The q8_0 blocks of `values` (memory order, a multiple of 32 values) as ggml stores quantized
    data it is given (`ggml_quantize_chunk` -> `quantize_row_q8_0_ref`): a 1-d array of blocks, so
    `.view(np.uint8)` gives the bytes."""
    return quantize_row_q8_0_ref(np.asarray(values, dtype=F4).reshape(-1))


def quantize_row_q4_0_ref(x) -> np.ndarray:
    """`quantize_row_q4_0_ref` (also q4_0's from_float): q = min(15, (int8_t)(x·id + 8.5)), fused."""
    xb = _blocks(x)
    k = np.argmax(np.where(np.isnan(xb), F4(-1), np.abs(xb)), axis=-1)  # the first maximum (the C's strict `<` scan)
    m = np.take_along_axis(xb, k[..., None], axis=-1)[..., 0]
    d = (m / F4(-8)).astype(F4)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, F4(1) / np.where(d != 0, d, F4(1)), F4(0)).astype(F4)
    v = fma_f32(xb, idv[..., None], F4(8.5))
    with np.errstate(invalid="ignore"):  # (int8_t) of a float: cvttss2si (0x80000000 if out of range), low byte
        t = np.where(np.isfinite(v) & (np.abs(v) < 2.0 ** 31), np.trunc(v), -(2.0 ** 31)).astype(np.int64)
    q = np.minimum(15, (t & 0xFF).astype(np.uint8).view(np.int8)).astype(np.uint8)
    out = np.empty(xb.shape[:-1], dtype=Q4_0_DTYPE)
    out["d"] = fp32_to_fp16(d)
    out["qs"] = q[..., :16] | (q[..., 16:] << 4)
    return out

# %% [markdown]
# The CPU backend's own q8_0 `from_float`, `quantize_row_q8_0`, converts data while computing
# (`mul_mat`'s src1, `cpy` into q8_0). Its x86 path, ggml-quants.c:958-960:
# ```c
# const float d = maxScalar / 127.f;
# y[i].d = GGML_FP32_TO_FP16(d);
# const float id = ( maxScalar != 0.0f ) ? 127.f / maxScalar : 0.0f;
# ```
# Notice `id = 127 / max`, not `1 / d`, and the rounding further on, `_mm256_round_ps(v,
# _MM_ROUND_NEAREST)`: halves go **to even** (2.5 becomes 2, where the reference gives 3); NaN and
# out-of-range values give -128 (`_mm256_cvtps_epi32` returns 0x80000000, the packs saturate). The
# block maximum is numpy's, equal to ggml's 8-lane max tree unless the block holds a NaN (appendix A2
# reproduces the tree through `q8_0_from_amax`). Dequantizing is exact in f32: element `j` of a q4_0
# block is `((qs[j] & 15) − 8)·d`, element `j + 16` is `((qs[j] >> 4) − 8)·d`. The two tables at the
# end are the CPU's `type_traits`: each type's `to_float` and `from_float`.

# %%
# | export quants
def q8_0_from_amax(xb, amax) -> np.ndarray:
    """The body of `quantize_row_q8_0` (x86 path) once each block's max|x| is known (`amax`, one per block)."""
    with np.errstate(all="ignore"):
        d = amax / F4(127)
        idv = np.where(amax != 0, F4(127) / np.where(amax != 0, amax, F4(1)), F4(0)).astype(F4)
        q = np.rint(xb * idv[..., None])
        q = np.where(np.isfinite(q) & (np.abs(q) < 2.0 ** 31), np.clip(q, -128, 127), -128)
    out = np.empty(xb.shape[:-1], dtype=Q8_0_DTYPE)
    out["d"] = fp32_to_fp16(d)
    out["qs"] = q.astype(np.int8)
    return out


def quantize_row_q8_0(x) -> np.ndarray:
    """`quantize_row_q8_0`, the CPU backend's q8_0 `from_float`, as ggml's x86 build computes it."""
    xb = _blocks(x)
    with np.errstate(invalid="ignore"):
        return q8_0_from_amax(xb, np.max(np.abs(xb), axis=-1))


def dequantize_row_q8_0(blocks) -> np.ndarray:
    """`dequantize_row_q8_0`: element j of a block is qs[j]·d (exact in f32)."""
    y = blocks["qs"].astype(F4) * blocks["d"].astype(F4)[..., None]
    return y.reshape(y.shape[:-2] + (-1,))


def dequantize_row_q4_0(blocks) -> np.ndarray:
    """`dequantize_row_q4_0`: element j is ((qs[j] & 15) - 8)·d, element j+16 is ((qs[j] >> 4) - 8)·d."""
    qs = blocks["qs"]
    lo, hi = (qs & 0x0F).astype(np.int16) - 8, (qs >> 4).astype(np.int16) - 8
    y = np.concatenate([lo, hi], axis=-1).astype(F4) * blocks["d"].astype(F4)[..., None]
    return y.reshape(y.shape[:-2] + (-1,))


_DEQUANT = {Q8_0.name: dequantize_row_q8_0, Q4_0.name: dequantize_row_q4_0}  # type_traits[type].to_float
FROM_FLOAT = {Q8_0.name: quantize_row_q8_0, Q4_0.name: quantize_row_q4_0_ref}  # the CPU's from_float

# %% [markdown]
# One tie shows both q8_0 quantizers: the block's maximum is 127, so `d = 1` and 2.5 is a tie.

# %%
tie = np.zeros(32, np.float32)
tie[:2] = 127, 2.5
print("reference (roundf):", quantize_row_q8_0_ref(tie)["qs"][0, :2], " CPU (to even):", quantize_row_q8_0(tie)["qs"][0, :2])

# %% [markdown]
# ## 3 · How the CPU computes
#
# Each op is a numpy kernel that reads its sources through `tensor_array` (the bytes of chapter 03,
# seen with `ne`/`nb`) and writes into the node's own bytes. Nothing is returned: if the graph
# allocator put two live tensors at the same offset, one overwrites the other, exactly as in ggml.
# What the backend accepts is `ggml_backend_cpu_supports_op`, ggml-backend.c:827-829:
# ```c
#         op->type != GGML_TYPE_IQ1_M; // missing type_traits.from_float
# case GGML_OP_MUL_MAT:
#     return op->src[1]->type == GGML_TYPE_F32 || op->src[1]->type == ggml_internal_get_type_traits(op->src[0]->type).vec_dot_type;
# ```
# Notice the one rule (CPY's other rule concerns types without `from_float`, none of them here): src1
# is f32, or already src0's *dot type* (`VEC_DOT_TYPE`): f16 for f16 weights, q8_0 for q8_0 and q4_0.

# %%
# | export
"""The CPU backend (ggml-backend.c:547-945) and the numpy kernels it computes with.

`compute_forward(node)` computes one graph node from its sources as ggml's CPU backend does
(`ggml_compute_forward` of llama.cpp 1d1ccce): the same types, shapes and checks, f16 results rounded
to nearest even, rope's float32 angle recurrence. How each order- or rounding-dependent step is done is
the numerics tier's choice (`params.arith`): `Arithmetic`, the default, within its stated tolerance of
ggml (`TOLERANCE_F32`, `TOLERANCE_MIXED`), or appendix A2's bit-exact tier. Every kernel reads its
sources before it writes its destination, so in-place ops and memory reuse are safe; where ggml's kernel
asserts or would read memory the wrong way, it raises a `ggml_lite.errors` exception instead.

This module mirrors the CPU compute part of one C file, ggml.c (22,600 lines: its
`ggml_compute_forward_*` kernels, those a LLaMA graph computes), and the CPU backend of ggml-backend.c;
the other kernels are `ggml_lite.cpu_kernels_more` (added to `FORWARD`), the quantized types
`ggml_lite.quants`.
"""

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ggml_lite.backend import Backend, GraphPlan, Status
from ggml_lite.bind import method_of
from ggml_lite.buffer import cpu_buffer_type, tensor_array
from ggml_lite.errors import (
    DataTypeError,
    LayoutError,
    ShapeError,
    TensorBoundsError,
    UnknownOpError,
    UnsupportedOpError,
)
from ggml_lite.quants import _DEQUANT, F4, F8, FROM_FLOAT, Q8_0_DTYPE, QK, fp16_to_fp32, fp32_to_fp16
from ggml_lite.registry import declare_builtin
from ggml_lite.tensor import F16, F32, I32, Q4_0, Q8_0, Op, UnaryOp, describe, is_contiguous, word_to_float

# ggml.c constants
GELU_COEF_A = F4(0.044715)
GELU_QUICK_COEF = F4(-1.702)
SQRT_2_OVER_PI = F4(0.79788456080286535587989211986876)

# `type_traits[type].vec_dot_type`: what src1 of a MUL_MAT is converted to before the dot products
VEC_DOT_TYPE = {"f32": F32, "f16": F16, "q8_0": Q8_0, "q4_0": Q8_0}


def mul_mat_supported(op) -> bool:
    """The MUL_MAT clause of `ggml_backend_cpu_supports_op`: src1 is f32 or already src0's dot type."""
    return op.src[1].type is F32 or op.src[1].type is VEC_DOT_TYPE.get(op.src[0].type.name)

# %% [markdown]
# #### Two numerics tiers
# Every step whose result depends on *how* it is computed — a sum's order, a fused multiply-add, the
# C library's `expf`, ggml's vectorised kernels — goes through one small object, the **tier**, so one
# kernel serves both tiers: `Arithmetic` (the default) is plain numpy, BLAS for `mul_mat`, and agrees
# with ggml to float32 rounding; `ExactArithmetic` (appendix A2, `cpu_init(exact=True)`) is ggml's
# AVX2 build bit for bit. Each method stands for a C function, such as `ggml_vec_soft_max_f32`,
# ggml.c:2667-2669:
# ```c
# float val = expf(x[i] - max);
# sum += (ggml_float)val;
# y[i] = val;
# ```
# Notice the `ggml_float` (double) sum of float32 exponentials. Both tiers convert what ggml converts:
# `MUL_MAT` turns an f32 src1 into src0's dot type before any dot product. Skipping that rounding missed
# ggml by up to 0.55 of the largest value on the graphs of `benchmarks/numerics_tolerance.py`; converting
# brings the median of its 158 graphs with f16 or quantized tensors to 5.3e-7. What remains is the order
# of the sums, which on graphs that amplify rounding moves ggml's own results as much as a change of its
# build. The tolerances come from those 192 graphs (MLPs and attention stacks, f32/f16/q8_0/q4_0
# weights, a softmax head each): **1e-4** of the largest value with f32 tensors only (worst: 3.0e-5),
# **5e-3** with f16 or quantized ones (worst: 2.1e-3, on the 143 graphs whose results two dot-product
# orders of ggml agree on; on the other 15 only `check --exact` can tell).

# %%
# | export
class Arithmetic:
    """The default numerics tier: every order- or rounding-dependent step of the kernels, the plain numpy
    way. Methods named after their C (`ggml_vec_dot_f16`, ...) compute the same quantity, not the same bits."""

    name = "numpy"
    # stated tolerance, max|ours - ggml's| / max|ggml's| over a result: f32-only graphs, and graphs with f16
    # or quantized tensors; measured by benchmarks/numerics_tolerance.py (the prose above)
    TOLERANCE_F32, TOLERANCE_MIXED = 1e-4, 5e-3
    _MATH = {"expf": np.exp, "expm1f": np.expm1, "logf": np.log, "tanhf": np.tanh, "cosf": np.cos, "sinf": np.sin}

    def sum_f64(self, v) -> np.ndarray:
        """A sum in `ggml_float` (double) along the last axis (`ggml_vec_sum_f32_ggf`)."""
        return np.asarray(np.sum(v, axis=-1, dtype=F8))

    def fma(self, a, b, c) -> np.ndarray:
        """`a·b + c` where gcc fuses it into one FMA: here two float32 roundings."""
        return a * b + c

    def scalar(self, name: str, *args) -> np.float32:
        """A C library float function (`powf`, `logf`, ...) of float32 scalars, once per op: in double."""
        try:
            return F4(C_MATH[name](*(float(F4(a)) for a in args)))
        except (OverflowError, ValueError):
            return F4(np.nan)

    def math(self, name: str, x) -> np.ndarray:
        """`expf`, `expm1f`, `logf`, `tanhf`, `cosf`, `sinf` on a float32 array: numpy's float32 functions."""
        return self._MATH[name](x)

    def silu(self, x) -> np.ndarray:
        """`ggml_vec_silu_f32`: x / (1 + e^-x)."""
        return x / (F4(1) + np.exp(-x))

    def soft_max(self, w, mx) -> tuple:
        """`ggml_vec_soft_max_f32`: (e^(w - max) per row, the row sums in double)."""
        e = np.exp(w - mx[..., None])
        return e, np.sum(e, axis=-1, dtype=F8)

    def gelu(self, x) -> np.ndarray:
        """`ggml_vec_gelu_f32`: ggml's f16 table (GGML_GELU_FP16) of the tanh approximation of h = f16(x),
        computed without the table; 0 for x <= -10 and x for x >= 10."""
        h = fp16_to_fp32(fp32_to_fp16(x))
        t = np.tanh(SQRT_2_OVER_PI * h * (F4(1) + GELU_COEF_A * h * h))
        g = fp16_to_fp32(fp32_to_fp16(F4(0.5) * h * (F4(1) + t)))
        return np.where(x <= F4(-10), F4(0), np.where(x >= F4(10), x, g))

    def gelu_quick(self, x) -> np.ndarray:
        """`ggml_vec_gelu_quick_f32`: h·sigmoid(1.702h) of h = f16(x), rounded to f16 (ggml's f16 table)."""
        h = fp16_to_fp32(fp32_to_fp16(x))
        return fp16_to_fp32(fp32_to_fp16(h / (F4(1) + np.exp(GELU_QUICK_COEF * h))))

    def from_float(self, type, rows) -> np.ndarray:
        """The type's `from_float` on f32 rows: `quantize_row_q8_0` or `quantize_row_q4_0_ref`."""
        return FROM_FLOAT[type.name](rows)

    def to_vec_dot(self, type, y) -> np.ndarray:
        """src1 rows `y` converted to the vec_dot type of a `type` src0, as `ggml_compute_forward_mul_mat`
        does: f16 for f16 weights, `from_float` q8_0 for q8_0 and q4_0; else (or if converted) unchanged."""
        if y.dtype != F4 or type is F32:
            return y
        return fp32_to_fp16(y) if type is F16 else self.from_float(Q8_0, y)

    def mul_mat(self, type, x, y) -> np.ndarray:
        """The dot products of `ggml_compute_forward_mul_mat`: src0 planes x (.., .., M, K) in `type`, src1 planes
        y (.., .., N, K) -> (.., .., N, M) float32, one batched matmul after `to_vec_dot`. src1 is copied when it
        shares src0's memory: numpy computes `A @ A.T` on one buffer with `syrk`, rounding unlike `gemm`."""
        y = self.to_vec_dot(type, y)
        xf = _DEQUANT[type.name](x) if type.is_quantized else x.astype(F4, copy=False)
        yf = _DEQUANT[Q8_0.name](y) if y.dtype == Q8_0_DTYPE else y.astype(F4, copy=False)
        if np.may_share_memory(xf, yf):
            yf = yf.copy()
        return np.matmul(yf, np.swapaxes(xf, -1, -2))

# %% [markdown]
# The conversion on a small case: four q8_0 weight rows of 256 values times two f32 rows of src1. The
# tier's product (src1 quantized to q8_0 first, as ggml does) and a product with the f32 src1 differ
# by 3.6e-3 of the largest value, before any softmax amplifies it.

# %%
demo_rng = np.random.default_rng(7)
w_q8 = quantize_row_q8_0_ref(demo_rng.uniform(-1, 1, (4, 256)).astype(np.float32))  # weights, as stored
src1 = demo_rng.uniform(-1, 1, (2, 256)).astype(np.float32)
converted = Arithmetic().mul_mat(Q8_0, w_q8[None, None], src1[None, None])[0, 0]
in_f32 = src1 @ dequantize_row_q8_0(w_q8).T
print(f"max |converted - f32 src1| / max |converted| = {np.abs(converted - in_f32).max() / np.abs(converted).max():.1e}")

# %% [markdown]
# #### Reading and writing tensors
# ggml hands every kernel a `struct ggml_compute_params`, ggml.c:1895-1897:
# ```c
# struct ggml_compute_params {
#     // ith = thread index, nth = number of threads
#     int ith, nth;
# ```
# Notice that it says nothing about *how* to compute: threads (and a scratch buffer). This port has
# none, so its `ComputeParams` carries the tier, whether the bytes are a device's (SIM, chapter 08, runs
# these kernels on its memory), and the 4-d numpy view (`ne3, ne2, ne1, ne0`) of each tensor, made
# once per graph over the buffer's bytes, any strides: a view of a view, a permuted cache.

# %%
# | export
class ComputeParams:
    """`struct ggml_compute_params`, as this port needs it: the numerics tier (`arith`), whether the
    tensors' bytes are a device's (`device`), and the numpy view of every tensor seen so far (`views`)."""

    def __init__(self, arith, device: bool = False):
        self.arith, self.device = arith, device
        self.views: dict[int, np.ndarray] = {}

    def view(self, t) -> np.ndarray:
        """The numpy view of `t` with 4 axes (ne3, ne2, ne1, ne0) (blocks on the last axis when quantized)."""
        a = self.views.get(id(t))
        if a is None:
            a = tensor_array(t, device=self.device)
            a = a.reshape((1,) * (4 - a.ndim) + a.shape)
            self.views[id(t)] = a
        return a

    def read_f32(self, t) -> np.ndarray:
        """A fresh float32 (ne3, ne2, ne1, ne0) array of `t`'s values (f16 widened, q8_0/q4_0 dequantized)."""
        a = self.view(t)
        if t.type is F32:
            return a.copy()
        if t.type is F16:
            return a.astype(F4)
        if t.type.name in _DEQUANT:
            return _DEQUANT[t.type.name](a)
        raise DataTypeError(f"{describe(t)}: cannot read {t.type.name} values as f32")

    def write(self, t, values) -> None:
        """Store float32 (or same-type) values into `t` through its strides (f16 rounded to nearest even)."""
        dst = self.view(t)
        if t.type is F32:
            dst[...] = np.asarray(values, dtype=F4).reshape(dst.shape)
        elif t.type is F16:
            dst[...] = fp32_to_fp16(values).reshape(dst.shape)
        elif t.type is I32:
            dst[...] = np.asarray(values).reshape(dst.shape)
        else:
            raise DataTypeError(f"{describe(t)}: cannot store values into a {t.type.name} tensor element-wise")

# %% [markdown]
# What a kernel assumes, it asserts, ggml.c:9280-9283 (`ggml_compute_forward_add_f32`):
# ```c
# GGML_TENSOR_BINARY_OP_LOCALS
#
# GGML_ASSERT( nb0 == sizeof(float));
# GGML_ASSERT(nb00 == sizeof(float));
# ```
# Notice: elements contiguous, rows anywhere. Where a kernel only `assert`s (debug builds), a release
# build reads element 0 of each row, well defined for one-element rows (`strict=False`); kernels that
# find row `i` at `i*nb[1]` need evenly spaced rows. Each check names the op, the tensor and the rule.

# %%
# | export
def _need_type(node, t, types, what="source") -> None:
    if t.type not in types:
        names = "/".join(x.name for x in types)
        raise DataTypeError(f"{node.op.name} {describe(node)}: {what} {describe(t)} must be {names} "
                            f"(ggml's CPU kernel has no {t.type.name} variant here)")


def _need_nb0(node, t, what: str, strict: bool = True) -> None:
    """nb[0] must be the element size: always when ggml checks it with GGML_ASSERT (`strict`), only for
    rows of more than one element when it is a debug-only `assert`."""
    if t.nb[0] != t.type.type_size and (strict or t.ne[0] > 1):
        raise LayoutError(f"{node.op.name} {describe(node)}: {what} {describe(t)} must have contiguous "
                          f"elements (nb[0] = {t.nb[0]}, need {t.type.type_size}); ggml's kernel asserts or "
                          f"reads it the wrong way")


def _rows_uniform(t) -> bool:
    """Does row i of `t` (flat row index) start at i·nb[1], as the kernels that loop `i*nb[1]` assume?"""
    stride = t.nb[1]
    for d in (2, 3):
        stride *= t.ne[d - 1]
        if t.ne[d] > 1 and t.nb[d] != stride:
            return False
    return True


def _need_rows(node, t, what: str, strict: bool = False) -> None:
    _need_nb0(node, t, what, strict)
    if not _rows_uniform(t):
        raise LayoutError(f"{node.op.name} {describe(node)}: ggml's kernel finds row i of {what} {describe(t)} "
                          f"at i*nb[1], but its rows are not evenly spaced (nb = {list(t.nb)})")


def _same_shape(node, a, b) -> None:
    if list(a.ne) != list(b.ne):
        raise ShapeError(f"{node.op.name} {describe(node)}: {describe(a)} and {describe(b)} must have the same shape")


def _need_contiguous(node, *named) -> None:
    """ggml asserts `ggml_is_contiguous` of each (tensor, what) in `named`."""
    for t, what in named:
        if not is_contiguous(t):
            raise LayoutError(f"{node.op.name} {describe(node)}: {what} {describe(t)} must be contiguous (asserted)")

# %% [markdown]
# #### One function per op
# `compute_forward` (the end of this section) dispatches on the op as `ggml_compute_forward` does; each
# kernel ports one `ggml_compute_forward_<op>`. Copies first, ggml.c:9239-9242:
# ```c
# if (src0->type == dst->type) {
#     ggml_compute_forward_dup_bytes(params, dst);
#     return;
# }
# ```
# Notice: the same type is copied byte for byte (whole blocks for q8_0/q4_0); otherwise only f16/f32
# sources convert, element by element (f16 rounded to nearest even) or to q8_0/q4_0 row by row with
# `from_float` into a contiguous destination. Elements go in ggml order (i0 fastest) into the
# destination's order; for CPY the destination is the node, a view of src[1].

# %%
# | export
def compute_forward_dup(params, node) -> None:
    """`ggml_compute_forward_dup` (DUP, CONT, CPY): `_dup_bytes`, `_dup_f16`, `_dup_f32`."""
    src = node.src[0]
    if src.nelements != node.nelements:
        raise ShapeError(f"{node.op.name} {describe(node)}: {describe(src)} has {src.nelements} elements, "
                         f"the destination {node.nelements}")
    st, dt = src.type, node.type
    if st is dt:  # byte for byte; quantized blocks must stay whole
        if st.is_quantized and not (is_contiguous(src) and is_contiguous(node)) and src.ne[0] != node.ne[0]:
            raise LayoutError(f"{node.op.name} {describe(node)}: a {st.name} copy between differently shaped, "
                              f"non-contiguous tensors would split blocks")
        dst = params.view(node)
        dst[...] = np.array(params.view(src), copy=True).reshape(dst.shape)
        return
    if st not in (F32, F16):
        raise DataTypeError(f"{node.op.name} {describe(node)}: ggml cannot convert {st.name} to {dt.name} "
                            f"(ggml_compute_forward_dup handles f16/f32 sources)")
    if dt in (F32, F16):
        params.write(node, params.read_f32(src).reshape(-1))
        return
    if dt.is_quantized:
        if not is_contiguous(node):
            raise LayoutError(f"{node.op.name} {describe(node)}: ggml quantizes only into a contiguous destination")
        _need_nb0(node, src, "src0")
        if src.ne[0] % QK:
            raise ShapeError(f"{node.op.name} {describe(node)}: rows of {src.ne[0]} elements of {describe(src)} "
                             f"are not whole {dt.name} blocks")
        rows = params.read_f32(src).reshape(-1, src.ne[0])
        dst = params.view(node)
        dst[...] = params.arith.from_float(dt, rows).reshape(dst.shape)
        return
    raise DataTypeError(f"{node.op.name} {describe(node)}: no conversion from {st.name} to {dt.name}")

# %% [markdown]
# add, sub, mul and div share one shape, ggml.c:9299-9301 (`ggml_compute_forward_add_f32`):
# ```c
# const int64_t i13 = i03 % ne13;
# const int64_t i12 = i02 % ne12;
# const int64_t i11 = i01 % ne11;
# ```
# Notice the `%`: src1 is *repeated* over src0 in every dimension (`np.tile`). ADD also has f16 kernels
# and `ggml_compute_forward_add_q_f32`: dequantize src0's row, add, quantize with `from_float`.

# %%
# | export
def _broadcast_src1(node, a_shape, b) -> np.ndarray:
    """src1 repeated to src0's shape (`ggml_can_repeat`)."""
    reps = tuple(a // n for a, n in zip(a_shape, b.shape))
    return np.tile(b, reps)


_BINARY = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.divide}


def compute_forward_binary(params, node) -> None:
    """`ggml_compute_forward_add_f32` / `_sub_f32` / `_mul_f32` / `_div_f32`; `ggml_compute_forward_add_f16_f32`,
    `_add_f16_f16` and `ggml_compute_forward_add_q_f32`."""
    a, b = node.src[0], node.src[1]
    op = node.op
    if a.type is F32:
        _need_type(node, b, (F32,), "src1")
        _need_type(node, node, (F32,), "the result")
        _need_nb0(node, a, "src0")
        _need_nb0(node, node, "the result")
        if any(a.ne[i] % b.ne[i] for i in range(4)):
            raise ShapeError(f"{op.name} {describe(node)}: {describe(b)} does not broadcast to {describe(a)}")
        x = params.read_f32(a)
        y = _broadcast_src1(node, x.shape, params.read_f32(b))
        params.write(node, _BINARY[op](x, y).astype(F4))
        return
    if op is not Op.ADD:
        raise DataTypeError(f"{op.name} {describe(node)}: ggml's {op.name.lower()} kernel takes f32 src0 only, "
                            f"not {describe(a)}")
    _same_shape(node, a, b)
    _need_nb0(node, a, "src0")
    if a.type is F16:
        _need_type(node, b, (F16, F32), "src1")
        _need_type(node, node, (F16,) if b.type is F16 else (F16, F32), "the result")
        _need_nb0(node, b, "src1")
        _need_nb0(node, node, "the result")
        params.write(node, params.read_f32(a) + params.read_f32(b))
        return
    if a.type.is_quantized:
        _need_type(node, b, (F32,), "src1")
        _need_nb0(node, b, "src1")
        _need_type(node, node, (a.type,), "the result")
        if not (node.nb[0] <= node.nb[1] <= node.nb[2] <= node.nb[3]):
            raise LayoutError(f"ADD {describe(node)}: the destination cannot be transposed or permuted")
        rows = (params.read_f32(a) + params.read_f32(b)).astype(F4)
        params.view(node)[...] = params.arith.from_float(node.type, rows)
        return
    raise DataTypeError(f"ADD {describe(node)}: no kernel for {a.type.name} + {b.type.name}")

# %% [markdown]
# UNARY picks its vector function by op_params[0], in loops like ggml.c:11794-11796 (`ggml_compute_forward_silu_f32`):
# ```c
# for (int i1 = ir0; i1 < ir1; i1++) {
#     ggml_vec_silu_f32(nc,
#             (float *) ((char *) dst->data  + i1*( dst->nb[1])),
# ```
# Notice `i1*nb[1]` with a flat row index: rows must be evenly spaced (`_need_rows`); `_unary_rows`
# holds that shape (appendix A7's sqr, sqrt, log and leaky_relu use it too). The vector function is the
# whole difference: abs, sgn, neg, step, relu, hardswish and hardsigmoid are exact; tanh, elu, sigmoid,
# exp, gelu, gelu_quick and silu go through the tier.

# %%
# | export
def _unary_rows(params, node, fn, strict: bool = False) -> None:
    """f32 rows found at i·nb[1], same shape; `strict`: ggml checks nb[0] with GGML_ASSERT (as for log)."""
    a = node.src[0]
    _need_type(node, a, (F32,), "src0")
    _need_type(node, node, (F32,), "the result")
    _same_shape(node, a, node)
    _need_rows(node, a, "src0", strict)
    _need_rows(node, node, "the result", strict)
    params.write(node, fn(params.read_f32(a)))


def _hard(x):
    return np.fmin(F4(1), np.fmax(F4(0), (x + F4(3)) / F4(6)))


_UNARY_FN = {  # each takes the tier (for the C library's functions and ggml's vector kernels) and x
    UnaryOp.ABS: lambda ar, x: np.abs(x),                                     # fabsf
    UnaryOp.SGN: lambda ar, x: np.where(x > 0, F4(1), np.where(x < 0, F4(-1), F4(0))),
    UnaryOp.NEG: lambda ar, x: np.negative(x),
    UnaryOp.STEP: lambda ar, x: np.where(x > 0, F4(1), F4(0)),
    UnaryOp.TANH: lambda ar, x: ar.math("tanhf", x),
    UnaryOp.ELU: lambda ar, x: np.where(x > 0, x, ar.math("expm1f", x)),
    UnaryOp.RELU: lambda ar, x: np.where(x > 0, x, F4(0)),
    UnaryOp.SIGMOID: lambda ar, x: F4(1) / (F4(1) + ar.math("expf", -x)),
    UnaryOp.GELU: lambda ar, x: ar.gelu(x),
    UnaryOp.GELU_QUICK: lambda ar, x: ar.gelu_quick(x),
    UnaryOp.SILU: lambda ar, x: ar.silu(x),
    UnaryOp.HARDSWISH: lambda ar, x: x * _hard(x),
    UnaryOp.HARDSIGMOID: lambda ar, x: _hard(x),
    UnaryOp.EXP: lambda ar, x: ar.math("expf", x),
}


def compute_forward_unary(params, node) -> None:
    """`ggml_compute_forward_unary`: the unary op in op_params[0], row by row with its `ggml_vec_<op>_f32`."""
    try:
        u = UnaryOp(node.op_params[0])
    except ValueError:
        raise UnknownOpError(f"UNARY {describe(node)}: unknown unary op {node.op_params[0]}") from None
    _unary_rows(params, node, lambda x: np.asarray(_UNARY_FN[u](params.arith, x), dtype=F4))

# %% [markdown]
# ggml.c:13234-13238 (`ggml_compute_forward_scale_f32`):
# ```c
# if (dst->data != src0->data) {
#     // src0 is same shape as dst => same indices
#     memcpy((char *)dst->data + i1*nb1, (char *)src0->data + i1*nb01, nc * sizeof(float));
# }
# ggml_vec_scale_f32(nc, (float *) ((char *) dst->data + i1*nb1), v);
# ```
# Notice the row `memcpy`: ggml asserts both tensors contiguous, then scales in place (float32).

# %%
# | export
def compute_forward_scale(params, node) -> None:
    """`ggml_compute_forward_scale_f32`: every element times op_params[0] (float32 multiply)."""
    a = node.src[0]
    _need_type(node, a, (F32,), "src0")
    _same_shape(node, a, node)
    _need_contiguous(node, (a, "src0"), (node, "the result"))
    s = F4(word_to_float(node.op_params[0]))
    params.write(node, params.read_f32(a) * s)

# %% [markdown]
# ggml.c:12125-12127 (`ggml_compute_forward_rms_norm_f32`):
# ```c
# for (int64_t i00 = 0; i00 < ne00; i00++) {
#     sum += (ggml_float)(x[i00] * x[i00]);
# }
# ```
# Notice `x·x` rounded to float32 before it joins the double sum; `y = x·(1/sqrtf(mean + eps))`.

# %%
# | export
def _norm_input(params, node) -> tuple:
    """The checks and inputs shared by rms_norm and norm (appendix A7): src0's f32 values, eps, the row length."""
    a = node.src[0]
    _need_type(node, a, (F32,), "src0")
    _same_shape(node, a, node)
    _need_nb0(node, a, "src0")
    return params.read_f32(a), F4(word_to_float(node.op_params[0])), a.ne[0]


def compute_forward_rms_norm(params, node) -> None:
    """`ggml_compute_forward_rms_norm_f32`: y = x·(1/sqrtf(mean(x·x) + eps)) per row."""
    x, eps, n = _norm_input(params, node)
    mean = (params.arith.sum_f64((x * x).astype(F8)) / n).astype(F4)
    scale = F4(1) / np.sqrt(mean + eps)
    params.write(node, x * scale[..., None])

# %% [markdown]
# ggml.c:12615-12617 (`ggml_compute_forward_mul_mat`), when src1 is not yet of the dot type:
# ```c
# from_float((float *)((char *) src1->data + i13*nb13 + i12*nb12 + i11*nb11),
#        (void *)               (wdata + i13*nbw3 + i12*nbw2 + i11*nbw1),
#        ne10);
# ```
# Notice that every src1 row is converted *before* any dot product. Then row i01 of src0's plane
# (i12 / r2, i13 / r3) meets each src1 row, r2 = ne12/ne02 and r3 = ne13/ne03: src0 is broadcast over
# dims 2 and 3 (grouped-query attention). No llamafile sgemm, no BLAS.

# %%
# | export
def compute_forward_mul_mat(params, node) -> None:
    """`ggml_compute_forward_mul_mat`: the tier converts src1 (`Arithmetic.to_vec_dot`) and multiplies."""
    a, b = node.src[0], node.src[1]
    vdt = VEC_DOT_TYPE.get(a.type.name)
    if vdt is None:
        raise DataTypeError(f"MUL_MAT {describe(node)}: no vec_dot for a {a.type.name} src0")
    if a.nb[0] != a.type.type_size or b.nb[0] != b.type.type_size:
        raise LayoutError(f"MUL_MAT {describe(node)}: ggml does not support permuted src0 or src1 "
                          f"(nb00 = {a.nb[0]}, nb10 = {b.nb[0]})")
    if not (node.nb[0] == 4 and node.nb[0] <= node.nb[1] <= node.nb[2] <= node.nb[3]):
        raise LayoutError(f"MUL_MAT {describe(node)}: the destination cannot be transposed or permuted")
    ne0, ne1 = a.ne, b.ne
    if ne0[0] != ne1[0] or ne1[2] % ne0[2] or ne1[3] % ne0[3]:
        raise ShapeError(f"MUL_MAT {describe(node)}: cannot multiply {describe(a)} by {describe(b)}")
    if b.type is vdt:
        y = params.view(b)  # already in the dot type
    else:
        _need_type(node, b, (F32,), "src1")
        if vdt is Q8_0 and b.ne[0] % QK:
            raise ShapeError(f"MUL_MAT {describe(node)}: rows of {describe(b)} are not whole q8_0 blocks")
        y = params.read_f32(b)
    x = params.view(a)
    r2, r3 = ne1[2] // ne0[2], ne1[3] // ne0[3]
    if r2 > 1 or r3 > 1:  # plane (i12, i13) of src1 meets plane (i12 / r2, i13 / r3) of src0
        x = np.repeat(np.repeat(x, r3, axis=0), r2, axis=1)
    params.write(node, params.arith.mul_mat(a.type, x, y))

# %% [markdown]
# ggml.c:13590-13593 (`ggml_compute_forward_get_rows_f32`):
# ```c
# const int64_t i10 = (i - i12*ne11*ne10 - i11*ne10);
# const int64_t i01 = *(int32_t *) ((char *) src1->data + i10*nb10 + i11*nb11 + i12*nb12);
#
# assert(i01 >= 0 && i01 < ne01);
# ```
# Notice the debug-only `assert`: a release build reads any row. Here an index outside src0 raises;
# f16 and quantized rows convert with `to_float`, i32 rows are copied.

# %%
# | export
def compute_forward_get_rows(params, node) -> None:
    """`ggml_compute_forward_get_rows` (`_f32`, `_f16`, `_q`): dst row (i10, i11, i12) = row ids[i10, i11, i12]."""
    a, ids = node.src[0], node.src[1]
    _need_type(node, ids, (I32,), "the indices")
    _need_type(node, a, (F32, F16, Q8_0, Q4_0, I32), "src0")
    _need_nb0(node, a, "src0")
    idx = np.array(params.view(ids), copy=True)[0]  # (ne12, ne11, ne10)
    if idx.size and (idx.min() < 0 or idx.max() >= a.ne[1]):
        bad = int(idx.min()) if idx.min() < 0 else int(idx.max())
        raise TensorBoundsError(f"GET_ROWS {describe(node)}: row index {bad} "
                                f"is outside the {a.ne[1]} rows of {describe(a)}")
    src = np.array(params.view(a), copy=True) if a.type is I32 else params.read_f32(a)
    i12, i11 = np.arange(idx.shape[0])[:, None, None], np.arange(idx.shape[1])[None, :, None]
    params.write(node, src[i12, i11, idx])  # (ne12, ne11, ne10, ne00)

# %% [markdown]
# ggml.c:13884-13886 (`ggml_compute_forward_diag_mask_f32`):
# ```c
# if (i > n_past + j) {
#     *(float *)((char *) dst->data + k*dst->nb[2] + j*dst->nb[1] + i*dst->nb[0]) = value;
# }
# ```
# Notice `k*nb[2]` for every plane k (planes of dim 3 must follow those of dim 2), and that src0 is
# first copied with one `memcpy` unless in place, so both must be contiguous then.

# %%
# | export
def compute_forward_diag_mask(params, node) -> None:
    """`ggml_compute_forward_diag_mask_f32`: element (row j, column i) of every plane set where i > n_past + j."""
    a = node.src[0]
    _need_type(node, a, (F32,), "src0")
    n_past = node.op_params[0]
    if n_past < 0:
        raise ShapeError(f"{node.op.name} {describe(node)}: n_past {n_past} must be >= 0")
    _need_nb0(node, a, "src0")
    _need_nb0(node, node, "the result")
    inplace = a.data == node.data
    if not inplace and not (is_contiguous(a) and is_contiguous(node)):
        raise LayoutError(f"{node.op.name} {describe(node)}: ggml copies src0 with memcpy, so both tensors must "
                          f"be contiguous")
    if node.ne[3] > 1 and node.nb[3] != node.nb[2] * node.ne[2]:
        raise LayoutError(f"{node.op.name} {describe(node)}: ggml addresses the planes as k*nb[2]")
    value = F4(-np.inf) if node.op is Op.DIAG_MASK_INF else F4(0)
    x = params.read_f32(a)
    i, j = np.arange(a.ne[0])[None, :], np.arange(a.ne[1])[:, None]
    params.write(node, np.where((i >= n_past) & (i > n_past + j), value, x))

# %% [markdown]
# ggml.c:14013-14017 (`ggml_compute_forward_soft_max_f32`), once a row holds `x·scale + slope·mask`:
# ```c
# ggml_float sum = ggml_vec_soft_max_f32(nc, dp, wp, max);
# assert(sum > 0.0);
#
# sum = 1.0/sum;
# ggml_vec_scale_f32(nc, dp, sum);
# ```
# Notice `1.0/sum` in double, rounded to float32 by `ggml_vec_scale_f32`; masked `−inf` entries give
# exactly 0. The mask row is `i1 % ne01`; the ALiBi slope of head h is `powf(m0, h + 1)` for the first
# `n_head_log2` heads, then `powf(m1, 2(h − n_head_log2) + 1)` (1 without ALiBi).

# %%
# | export
def _alibi_slopes(arith, n_head: int, max_bias: float) -> np.ndarray:
    """The ALiBi slope of each head in `ggml_compute_forward_soft_max_f32` (1 when max_bias = 0)."""
    if not max_bias > 0:
        return np.ones(n_head, dtype=F4)
    n_head_log2 = 1 << int(math.floor(math.log2(n_head)))
    mb = F4(max_bias)
    m0 = arith.scalar("powf", 2.0, F4(-mb) / F4(n_head_log2))
    m1 = arith.scalar("powf", 2.0, F4(-(mb / F4(2))) / F4(n_head_log2))
    return np.array([arith.scalar("powf", m0, h + 1) if h < n_head_log2 else
                     arith.scalar("powf", m1, 2 * (h - n_head_log2) + 1) for h in range(n_head)], dtype=F4)


def compute_forward_soft_max(params, node) -> None:
    """`ggml_compute_forward_soft_max_f32`: per row w = x·scale + slope·mask, then the tier's
    `ggml_vec_soft_max_f32` from the row's max, times f32(1/sum)."""
    a = node.src[0]
    mask = node.src[1] if len(node.src) > 1 else None
    _need_type(node, a, (F32,), "src0")
    _same_shape(node, a, node)
    _need_contiguous(node, (a, "src0"), (node, "the result"))
    scale, max_bias = F4(word_to_float(node.op_params[0])), word_to_float(node.op_params[1])
    x = params.read_f32(a)  # (ne03, ne02, ne01, ne00)
    ne00, ne01, ne02 = a.ne[0], a.ne[1], a.ne[2]
    w = x * scale
    if mask is not None:
        _need_type(node, mask, (F32, F16), "the mask")
        if not is_contiguous(mask) or mask.ne[0] != ne00 or mask.ne[1] < ne01:
            raise LayoutError(f"SOFT_MAX {describe(node)}: the mask {describe(mask)} must be a contiguous "
                              f"[{ne00}, >= {ne01}] matrix")
        m = params.read_f32(mask)[0, 0, :ne01, :]  # row i1 % ne01 of the mask
        slopes = _alibi_slopes(params.arith, ne02, max_bias)[None, :, None, None]
        w = params.arith.fma(slopes, m, w) if max_bias > 0 else w + m  # slope 1 without ALiBi
    mx = np.max(w, axis=-1) if ne00 else np.full(w.shape[:-1], -np.inf, F4)
    y, s = params.arith.soft_max(w, mx.astype(F4))
    inv = (1.0 / s).astype(F4)
    params.write(node, y * inv[..., None])

# %% [markdown]
# Rope rotates pairs by angles computed once per position, ggml.c:14271-14277 (`ggml_rope_cache_init`):
# ```c
# const float ff = freq_factors ? freq_factors[i0/2] : 1.0f;
# rope_yarn(
#     theta/ff, freq_scale, corr_dims, i0, ext_factor, mscale, &cache[i0 + 0], &cache[i0 + 1]
# );
# cache[i0 + 1] *= sin_sign;
#
# theta *= theta_scale;
# ```
# Notice `theta *= theta_scale`: a float32 recurrence from `theta = p`, not a `pow` per pair, so its
# rounding accumulates as in C. `rope_yarn` mixes `freq_scale·theta/ff` and `theta/ff` by YaRN's ramp
# between the correction dims (`ggml_rope_yarn_corr_dims`) and scales by `mscale` when `ext_factor ≠ 0`.

# %%
# | export
def rope_yarn_corr_dims(arith, n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float, beta_slow: float):
    """`ggml_rope_yarn_corr_dims` (with `ggml_rope_yarn_corr_dim`): YaRN's first and last ramped pair, float32."""
    def corr_dim(n_rot):
        arg = F4(n_ctx_orig) / (F4(n_rot) * F4(2) * F4(math.pi))
        return F4(n_dims) * arith.scalar("logf", arg) / (F4(2) * arith.scalar("logf", freq_base))
    start, end = np.floor(corr_dim(beta_fast)), np.ceil(corr_dim(beta_slow))
    # MAX(0, start) and MIN(n_dims - 1, end) as the C macros evaluate them (a NaN stays NaN)
    return (F4(0) if F4(0) > start else start), (F4(n_dims - 1) if F4(n_dims - 1) < end else end)


def rope_cache(arith, pos, n_dims: int, freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
               corr_dims, freq_factors=None) -> tuple:
    """`ggml_rope_cache_init` + `rope_yarn` for positions `pos` (int array) and pairs k < n_dims/2:
    (cos, sin), each (len(pos), n_dims/2)."""
    half = n_dims // 2
    theta_scale = arith.scalar("powf", freq_base, F4(-2.0) / F4(n_dims))
    p = np.asarray(pos, dtype=np.int64).astype(F4)
    steps = np.empty((p.size, max(half, 1)), dtype=F4)
    steps[:, 0] = p
    steps[:, 1:] = theta_scale
    theta = np.multiply.accumulate(steps, axis=1, dtype=F4)[:, :half]
    ff = np.ones(half, dtype=F4) if freq_factors is None else np.asarray(freq_factors, dtype=F4)[:half]
    fs, ef, mscale = F4(freq_scale), F4(ext_factor), F4(attn_factor)
    theta_extrap = theta / ff[None, :]
    theta_interp = fs * theta_extrap
    if ef != 0:
        low, high = corr_dims
        i0 = np.arange(half) * 2
        yv = ((i0 // 2).astype(F4) - F4(low)) / max(F4(0.001), F4(high) - F4(low))
        ramp = F4(1) - np.minimum(F4(1), np.maximum(F4(0), yv))
        ramp_mix = (ramp * ef).astype(F4)
        th = arith.fma(theta_interp, (F4(1) - ramp_mix)[None, :], theta_extrap * ramp_mix[None, :])
        mscale = mscale * arith.fma(F4(0.1), arith.scalar("logf", F4(1) / fs), F4(1))
    else:
        th = theta_interp
    return arith.math("cosf", th) * F4(mscale), arith.math("sinf", th) * F4(mscale)

# %% [markdown]
# ggml.c:14380-14384 (`ggml_compute_forward_rope_f32`):
# ```c
# const float x0 = src[0];
# const float x1 = src[1];
#
# dst_data[0] = x0*cos_theta - x1*sin_theta;
# dst_data[1] = x0*sin_theta + x1*cos_theta;
# ```
# Notice that gcc fuses the first product of each line into an FMA (the tier's `fma`). NeoX mode
# (`mode & 2`) pairs x[k] with x[k + n_dims/2]. The tail from n_dims on is copied in pairs, so an odd
# `ne0 − n_dims` (ggml would write past the row) and an odd or out-of-range n_dims are refused here.

# %%
# | export
def compute_forward_rope(params, node) -> None:
    """`ggml_compute_forward_rope_f32` / `_rope_f16` (forward)."""
    a, pos = node.src[0], node.src[1]
    ff_t = node.src[2] if len(node.src) > 2 else None
    _need_type(node, a, (F32, F16), "src0")
    _need_type(node, pos, (I32,), "the positions")
    _same_shape(node, a, node)
    _need_nb0(node, a, "src0")
    _need_nb0(node, node, "the result")
    p = node.op_params
    n_dims, mode, n_ctx_orig = p[1], p[2], p[4]
    freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow = (word_to_float(w) for w in p[5:11])
    ne0 = a.ne[0]
    if not 0 <= n_dims <= ne0 or n_dims % 2:
        raise ShapeError(f"ROPE {describe(node)}: n_dims {n_dims} must be even and in 0..ne0 = {ne0}")
    if (ne0 - n_dims) % 2:
        raise ShapeError(f"ROPE {describe(node)}: ne0 - n_dims = {ne0 - n_dims} is odd; ggml copies the unrotated "
                         f"tail in pairs and would write one element past every row (past the tensor for the last)")
    if pos.nelements < a.ne[2]:
        raise ShapeError(f"ROPE {describe(node)}: {describe(pos)} has fewer than ne2 = {a.ne[2]} positions")
    ff = None
    if ff_t is not None:
        _need_type(node, ff_t, (F32,), "freq_factors")
        if ff_t.ne[0] < n_dims // 2:
            raise ShapeError(f"ROPE {describe(node)}: freq_factors {describe(ff_t)} needs >= {n_dims // 2} values")
        ff = params.read_f32(ff_t).reshape(-1)
    positions = np.array(params.view(pos), copy=True).reshape(-1)[:a.ne[2]]
    corr = rope_yarn_corr_dims(params.arith, n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    cos, sin = rope_cache(params.arith, positions, n_dims, freq_base, freq_scale, ext_factor, attn_factor, corr, ff)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # (1, ne2, 1, n_dims/2)
    x = params.read_f32(a)
    y = x.copy()
    half = n_dims // 2
    if mode & 2:
        x0, x1 = x[..., :half], x[..., half:n_dims]
    else:
        x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
    r0 = params.arith.fma(x0, cos, -(x1 * sin))
    r1 = params.arith.fma(x0, sin, x1 * cos)
    if mode & 2:
        y[..., :half], y[..., half:n_dims] = r0, r1
    else:
        y[..., 0:n_dims:2], y[..., 1:n_dims:2] = r0, r1
    params.write(node, y)  # f16: the rotated values are rounded to f16, the copied tail is unchanged

# %% [markdown]
# The dispatcher, ggml.c:17112-17114 (`ggml_compute_forward`):
# ```c
# if (tensor->op == GGML_OP_NONE || ggml_is_empty(tensor)) {
#     return;
# }
# ```
# Notice: leafs and empty tensors compute nothing, and neither do the view ops, whose cases are empty.
# Floating-point warnings are off, as C arithmetic has none. The switch is a table, `FORWARD`, so that
# appendix A7 can add the kernels a LLaMA does not need (ADD1, SQR, SUM, NORM, ...) the way a backend's
# op table grows; `import ggml_lite` brings them, so every user has every kernel.

# %%
# | export
def compute_forward_none(params, node) -> None:
    """NONE, VIEW, RESHAPE, PERMUTE, TRANSPOSE: nothing to compute (`ggml_compute_forward` skips them)."""


# The kernel table (`ggml_compute_forward`'s switch): the ops a LLaMA graph computes. Appendix A7
# (`ggml_lite.cpu_kernels_more`, imported by `import ggml_lite`) adds the others to it.
FORWARD: dict[Op, Callable] = {
    Op.NONE: compute_forward_none, Op.VIEW: compute_forward_none, Op.RESHAPE: compute_forward_none,
    Op.PERMUTE: compute_forward_none, Op.TRANSPOSE: compute_forward_none,
    Op.DUP: compute_forward_dup, Op.CONT: compute_forward_dup, Op.CPY: compute_forward_dup,
    Op.ADD: compute_forward_binary, Op.SUB: compute_forward_binary, Op.MUL: compute_forward_binary,
    Op.DIV: compute_forward_binary, Op.UNARY: compute_forward_unary, Op.SCALE: compute_forward_scale,
    Op.RMS_NORM: compute_forward_rms_norm, Op.MUL_MAT: compute_forward_mul_mat, Op.GET_ROWS: compute_forward_get_rows,
    Op.DIAG_MASK_INF: compute_forward_diag_mask, Op.DIAG_MASK_ZERO: compute_forward_diag_mask,
    Op.SOFT_MAX: compute_forward_soft_max, Op.ROPE: compute_forward_rope,
}


def _kernel(node):
    """The kernel of `node`'s op (`ggml_compute_forward`'s switch), or None when there is nothing to compute."""
    fn = FORWARD.get(node.op)
    if fn is None:
        raise UnsupportedOpError(f"no CPU kernel for op {node.op.name} ({describe(node)})")
    return None if fn is compute_forward_none or node.nelements == 0 else fn


def compute_forward(node, params: ComputeParams | None = None) -> None:
    """`ggml_compute_forward`: compute `node` from `node.src` into the node's memory; `params` says how
    (default: the numpy tier on host memory). A graph passes one `ComputeParams` to all of its nodes."""
    fn = _kernel(node)
    if fn is not None:
        with np.errstate(all="ignore"):
            fn(params or ComputeParams(NUMPY), node)

# %% [markdown]
# #### The backend
# ggml-backend.c:814-817 (`ggml_backend_cpu_graph_compute`):
# ```c
# cplan.abort_callback      = cpu_ctx->abort_callback;
# cplan.abort_callback_data = cpu_ctx->abort_callback_data;
#
# return ggml_graph_compute(cgraph, &cplan);
# ```
# Notice that the backend only prepares a plan and hands the graph to `ggml_graph_compute`, which runs
# the nodes in order; here one `ComputeParams` per graph plays the plan. An optional `clock` (chapter
# 08's `SimClock`) advances the host's simulated time, so that the CPU shows on the SIM timelines.

# %%
# | export
class CPUBackend(Backend):
    """The CPU backend (`ggml_backend_cpu_init`; `ggml_backend_cpu_name`, `ggml_backend_cpu_free`,
    `ggml_backend_cpu_get_default_buffer_type`); `clock` (a `sim.SimClock`) and `cost` are optional."""

    name = "CPU"

    def __init__(self, clock=None, cost=None, arith=None):
        super().__init__()
        self.clock, self.cost = clock, cost
        self.arith = arith or NUMPY


@method_of(CPUBackend)
def free(cpu) -> None:
    """`ggml_backend_cpu_free` (its work buffer is numpy's here)."""
    Backend.free(cpu)


@method_of(CPUBackend, "_get_default_buffer_type")
def get_default_buffer_type(cpu):
    """`ggml_backend_cpu_get_default_buffer_type`: the CPU buffer type (chapter 03)."""
    return cpu_buffer_type()


@method_of(CPUBackend, "_graph_plan_create")
def graph_plan_create(cpu, graph) -> GraphPlan:
    """`ggml_backend_cpu_graph_plan_create`: a plan holding a shallow copy of the graph."""
    cpu._alive()
    return GraphPlan(cpu, graph)


@method_of(CPUBackend, "_graph_plan_free")
def graph_plan_free(cpu, plan: GraphPlan) -> None:
    """`ggml_backend_cpu_graph_plan_free`."""
    plan.freed = True


@method_of(CPUBackend, "_graph_plan_compute")
def graph_plan_compute(cpu, plan: GraphPlan) -> Status:
    """`ggml_backend_cpu_graph_plan_compute`: compute the plan's graph."""
    return cpu._graph_compute(plan.graph)


@method_of(CPUBackend, "_graph_compute")
def graph_compute(cpu, graph) -> Status:
    """`ggml_backend_cpu_graph_compute` (`ggml_graph_compute`): every node in order, on this thread."""
    params = ComputeParams(cpu.arith)  # one per graph: its tier, and the views made so far
    with np.errstate(all="ignore"):
        for node in graph.nodes:
            if not cpu._supports_op(node):
                raise UnsupportedOpError(f"CPU cannot compute {describe(node)} ({node.op.name}): src1 "
                                         f"{node.src[1].type.name} is neither f32 nor the dot type of "
                                         f"{node.src[0].type.name}")
            fn = _kernel(node)
            if fn is not None:
                fn(params, node)
    if cpu.clock is not None and graph.nodes:
        cpu.clock.host_work(cpu.name, "compute", graph_label(graph), cpu.cost.graph_seconds(graph))
    return Status.SUCCESS


@method_of(CPUBackend, "_supports_op")
def supports_op(cpu, op) -> bool:
    """`ggml_backend_cpu_supports_op`: everything, but a MUL_MAT whose src1 is neither f32 nor src0's dot type."""
    return op.op is not Op.MUL_MAT or mul_mat_supported(op)


@method_of(CPUBackend, "_supports_buft")
def supports_buft(cpu, buft) -> bool:
    """`ggml_backend_cpu_supports_buft`: any host buffer type."""
    return buft.is_host()


# %% [markdown]
# ggml-backend.c:938-941 (`ggml_backend_reg_cpu_init`):
# ```c
# GGML_CALL static ggml_backend_t ggml_backend_reg_cpu_init(const char * params, void * user_data) {
#     return ggml_backend_cpu_init();
#
#     GGML_UNUSED(params);
# ```
# Notice that the registry's init ignores its parameters. `cpu_init` takes one of its own, the tier,
# which registers under a name as a backend does (appendix A2 declares `"exact"`).

# %%
# | export
C_MATH: dict[str, Callable[..., float]] = {
    "expf": math.exp, "expm1f": math.expm1, "logf": math.log, "tanhf": math.tanh, "cosf": math.cos, "sinf": math.sin,
    "powf": math.pow}
NUMPY = Arithmetic()
_TIERS = {NUMPY.name: NUMPY}


def declare_tier(arith) -> None:
    """Makes a numerics tier available by its name (appendix A2 declares `"exact"`)."""
    _TIERS[arith.name] = arith


def tier(name: str):
    """The numerics tier called `name`."""
    if name not in _TIERS:
        raise UnsupportedOpError(f"no numerics tier {name!r}; declared: {', '.join(_TIERS)} "
                                 f"(the exact tier comes with `import ggml_lite`, appendix A2)")
    return _TIERS[name]


def cpu_init(clock=None, cost=None, exact: bool = False) -> CPUBackend:
    """`ggml_backend_cpu_init`; `exact=True` computes with the bit-exact tier of appendix A2."""
    return CPUBackend(clock, cost, tier("exact" if exact else "numpy"))


def is_cpu(backend) -> bool:
    """`ggml_backend_is_cpu` (the C compares GUIDs; here, the class)."""
    return isinstance(backend, CPUBackend)


def reg_cpu_init(params: str, user_data) -> CPUBackend:
    """`ggml_backend_reg_cpu_init`: the registry's init function (params are ignored, as in the C)."""
    return cpu_init()


declare_builtin("CPU", reg_cpu_init, cpu_buffer_type)  # the registry's first entry (chapter 06)


def graph_label(graph) -> str:
    """A graph as the timelines label it: its node count and first/last node names."""
    n = len(graph.nodes)
    if n > 1:
        return f"{n} nodes: {graph.nodes[0].name} .. {graph.nodes[-1].name}"
    return graph.nodes[0].name

# %% [markdown]
# ## 4 · A plan proven by results
#
# A small graph whose plan reuses memory: `scale` may overwrite its parent `h` (SCALE can work in
# place, `h` has no other child), and `sq` takes the block of the input `x`, free once `h` was
# computed. The numpy tier computes it as plain numpy does: here they agree exactly (the check allows
# 1e-6 of the largest value: BLAS may block a sum differently between calls). ggml would differ in the
# last bits: its AVX2 build adds a dot product in 32 partial sums, BLAS in its own order.

# %%
rng = np.random.default_rng(0)
cpu = cpu_init()
wctx = gl.Context("weights")
w_cpu = wctx.new_tensor_2d(gl.F32, 64, 48, name="w")
gl.alloc_ctx_tensors(wctx, cpu)
W = rng.standard_normal((48, 64)).astype(np.float32)
tensor_set(w_cpu, W)


def small_graph(w):
    c = gl.Context("compute")
    x = c.new_tensor_2d(gl.F32, 64, 8, name="x")
    gl.set_input(x)
    h = gl.mul_mat(c, w, x).set_name("h")
    s = gl.scale(c, h, 0.25).set_name("s")
    q = gl.mul(c, s, s).set_name("sq")
    out = gl.add(c, q, s).set_name("out")
    gl.set_output(out)
    return gl.build_forward(out), x, out


graph, x, out = small_graph(w_cpu)
galloc = gl.GAllocr(cpu.get_default_buffer_type())
galloc.alloc_graph(graph)
base = galloc.buffers[0].get_base()
print({t.name: t.data - base for t in graph.nodes}, "buffer", galloc.get_buffer_size(0))
X = rng.standard_normal((8, 64)).astype(np.float32)
tensor_set(x, X)
cpu.graph_compute(graph)
cpu_result = tensor_get(out)
S = 0.25 * (X @ W.T)
reference = S * S + S
print("max |ggml_lite - numpy| / max |numpy| =", np.abs(tensor_get(out) - reference).max() / np.abs(reference).max())

# %% [markdown]
# Now break the plan on purpose: give `sq` the memory of `s`, still needed by `out`. The allocator
# never would (`s` has two children), and the result shows why: `out` becomes `sq + sq`.

# %%
graph2, x2, out2 = small_graph(w_cpu)
galloc2 = gl.GAllocr(cpu.get_default_buffer_type())
galloc2.reserve(graph2)
by_name = {t.name: t for t in graph2.nodes}  # the plan's records (chapter 05, section 2.2):
galloc2.planned_alloc(by_name["sq"]).offset = galloc2.planned_alloc(by_name["s"]).offset  # two live tensors overlap
galloc2.alloc_graph(graph2)
tensor_set(x2, X)
cpu.graph_compute(graph2)
broken = tensor_get(out2)
print("corrupted plan: max |out - numpy| =", np.abs(broken - reference).max())
sq2 = tensor_get(by_name["sq"])
print("and out == sq + sq exactly:", np.array_equal(broken, 2 * sq2))

# %% [markdown]
# ## 5 · Check

# %%
# the numpy tier and plain numpy both use BLAS: equal here, within 1e-6 of the largest value anywhere
assert np.abs(cpu_result - reference).max() <= 1e-6 * np.abs(reference).max()
assert not np.allclose(broken, reference, atol=1e-3) and np.array_equal(broken, 2 * sq2)
assert cpu.supports_buft(gl.cpu_buffer_type())
print("chapter 07: all checks passed")

# %% [markdown]
# ## 6 · Exercises
#
# Three exercises, about 45 minutes. Predictions are answered with `answer(id, value)`: replace the `...`
# and run the cell; it says right or wrong, then why. An implementation is graded with `check(id, fn)`
# against the port on the chapter's cases, the rows ggml quantized for the recorded op fixtures and 300
# random rows; a failure shows the smallest case where your function and ggml disagree and the rule it
# breaks. `python -m ggml_lite exercises` lists what you have done. Solutions are in appendix A9; try first.

# %%
from ggml_lite.exercises import answer, check, done  # noqa: E402

# %% [markdown]
# **07.1 · Predict** (easy, 5 min). A q4_0 weight `w` with ne = [4096, 11008] meets an f32 `x` with
# ne = [4096, 8] in `mul_mat(w, x)`. Before the first dot product, the CPU backend converts all of `x`.
# How many bytes does the converted `x` take?

# %%
answer("07.1", ...)

# %% [markdown]
# **07.2 · Implement** `quantize_row_q8_0_ref` (medium, 25 min). Write the reference q8_0 quantizer, the
# one that stores a model's weights, without scrolling up, from the C (`ggml-quants.c:841-864`, llama.cpp
# 1d1ccce):
#
# ```c
# void quantize_row_q8_0_ref(const float * restrict x, block_q8_0 * restrict y, int64_t k) {
#     assert(k % QK8_0 == 0);
#     const int nb = k / QK8_0;
#
#     for (int i = 0; i < nb; i++) {
#         float amax = 0.0f; // absolute max
#
#         for (int j = 0; j < QK8_0; j++) {
#             const float v = x[i*QK8_0 + j];
#             amax = MAX(amax, fabsf(v));
#         }
#
#         const float d = amax / ((1 << 7) - 1);
#         const float id = d ? 1.0f/d : 0.0f;
#
#         y[i].d = GGML_FP32_TO_FP16(d);
#
#         for (int j = 0; j < QK8_0; ++j) {
#             const float x0 = x[i*QK8_0 + j]*id;
#
#             y[i].qs[j] = roundf(x0);
#         }
#     }
# }
# ```
#
# `x` is a list of floats, each a float32 value, and its length a multiple of 32 (`QK8_0`). Return a list
# with one `(d, qs)` per block: `d` the scale as stored, as a Python float (the f16 value), and `qs` the 32
# stored values as ints. Every `float` of the C is a float32: compute with `np.float32` as the C does.

# %%
# exercise 07.2
def quantize_row_q8_0_ref(x):
    """x: a list of float32 values (a multiple of 32 of them) -> [(d, [32 ints]), ...], one tuple per block."""
    raise NotImplementedError  # your code here


check("07.2", quantize_row_q8_0_ref)

# %% [markdown]
# **07.3 · Explore** (medium, 15 min). `MUL_MAT` rounds an f32 src1 to q8_0 before it meets a q4_0 or q8_0
# weight (§3). How much error does that add, next to the error the weight's own quantization made? Measure
# it on random matrices with `quantize_row_q4_0_ref`, `quantize_row_q8_0_ref`, `quantize_row_q8_0` and the
# dequantizers of §2 (import them from `ggml_lite.quants`: 07.2's stub took one of their names), and say why
# ggml pays it. Run `done("07.3")` when you have an answer.
#
# <details><summary>A worked answer</summary>
#
# Take W, 256 rows of 4096 standard normal values, and x, 8 rows (numpy seed 0), and compare three products
# with the exact one in float64: the quantized weight times the f32 x, the same with x rounded to q8_0 as
# ggml does, and the error of each, as the RMS of the difference over the RMS of the exact product.
#
# | weight | error of the weight alone | added by converting x | both |
# |---|---|---|---|
# | q4_0 | 8.8 % | 0.53 % | 8.85 % |
# | q8_0 | 0.52 % | 0.53 % | 0.74 % |
#
# The two errors are independent, so they add in squares. A q8_0 block's step is max|x|/127, and rounding
# to it costs about 0.5 % of the values' RMS, whatever the weight's type; a q4_0 step is 16 times coarser
# (max/8). Next to a q4_0 weight, converting x is lost in the weight's own error; next to a q8_0 weight, it
# makes the error √2 times larger. What it buys: both sides of a dot product are small integers, so the
# 32 products of a block are summed as integers in SIMD registers and scaled once, by d_w·d_x; and x,
# converted once and then read by every row of the weight, shrinks from 128 to 34 bytes per 32 values.
#
# </details>
