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
# # A2 · Exact arithmetic — ggml's AVX2 build, bit for bit
#
# Chapter 07's CPU backend computes with plain numpy and agrees with ggml to float32 rounding. That
# is enough to prove a memory plan by its results, and it is what `cpu_init()` gives. Some questions
# need more: *is this the very number the real ggml printed?* — the recorded logits of the scheduler
# scenarios (appendix A3), a node-by-node comparison with the real ggml where a single differing bit
# must be explained. For those, this appendix reproduces how ggml's x86-64 build with AVX2, FMA and
# F16C (the build that recorded the fixtures) computes, bit for bit, and declares it as the numerics
# tier `"exact"`: `cpu_init(exact=True)`.
#
# **What decides the bits**
#
# 1. **Order.** ggml's dot products keep 4 × 8 float lanes of accumulators and reduce them at the
#    end; its double sums are sequential. numpy's matmul and sums use their own orders.
# 2. **Fused multiply-adds.** gcc `-O3` fuses `a·b + c`, which rounds once (`fma_f32`, chapter 07).
# 3. **The C library and ggml's own exp.** `expf`, `tanhf`, `cosf` from glibc; `ggml_v_expf`, a
#    vectorised polynomial exp, for silu and soft_max; GELU through f16 tables built at `ggml_init`.
# 4. **The AVX2 quantizer** that converts `mul_mat`'s src1 to q8_0 rounds halves to even.
#
# These kernels are exact for *that* build only: a build with AVX-512, or for ARM, sums in another
# order. The differential tests therefore compare bits only when the installed ggml-python was built
# like the fixtures, and compare within chapter 07's tolerance otherwise.
#
# Exported: `ggml_lite.exact`.

# %%
# | default_exp exact

# %%
# | export
"""The bit-exact numerics tier of the CPU backend (appendix A2): ggml's x86-64 AVX2/FMA/F16C build
reproduced bit for bit -- SIMD lanes, fused multiply-adds, `ggml_v_expf`, the GELU tables, the AVX2
q8_0 quantizer. One caveat: the C library's `expf`, `tanhf`, ... on arrays are the correctly rounded
values, which equal glibc's almost always; inside `libm_exact()` they are glibc's own. Importing the
module declares the tier `"exact"` (`cpu_init(exact=True)`)."""

import contextlib
import ctypes
import ctypes.util
import functools

import numpy as np

from ggml_lite.cpu import (
    C_MATH,
    GELU_COEF_A,
    GELU_QUICK_COEF,
    SQRT_2_OVER_PI,
    Arithmetic,
    ComputeParams,
    compute_forward,
    declare_tier,
)
from ggml_lite.quants import F4, F8, _blocks, _c_max, fma_f32, fp32_to_fp16, q8_0_from_amax, quantize_row_q4_0_ref
from ggml_lite.tensor import F16, F32, Q4_0, Q8_0

# %% [markdown]
# ## 1 · The C library
#
# numpy cannot call glibc's `expf` on an array. By default an array's `expf`, `expm1f`, `logf`,
# `tanhf`, `sinf`, `cosf` are evaluated in float64 and rounded once to float32 — the correctly rounded
# value, which glibc's results equal almost always (they are within 1 ulp). Inside `libm_exact()` they
# call the C library itself through ctypes, one element at a time (about 0.5 µs per value), and match
# a glibc build of ggml bit for bit. Scalars that ggml computes once per op (rope's `theta_scale`,
# ALiBi slopes, YaRN's `mscale`) always come from the C library when it loads (`libm_f32`).

# %%
# | export
@contextlib.contextmanager
def libm_exact(enabled: bool = True):
    """Within the block, array math uses the C library per element (`LIBM_EXACT`)."""
    global LIBM_EXACT
    saved, LIBM_EXACT = LIBM_EXACT, enabled
    try:
        yield
    finally:
        LIBM_EXACT = saved


LIBM_EXACT = False  # True: array math calls the C library per element (bit-exact with glibc, slow)


def _math_f32(name: str, f64, x) -> np.ndarray:
    """The C library's float function `name` on an array: the C function itself per element when
    `LIBM_EXACT` (and libm loads), else `f64` evaluated in float64 and rounded once to float32."""
    x = np.asarray(x, dtype=F4)
    if LIBM_EXACT and _libm() is not None:
        return _libm_vec(name, x)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return f64(x.astype(F8)).astype(F4)


def expf(x) -> np.ndarray:
    """`expf` (libm) on an array (see `LIBM_EXACT`)."""
    return _math_f32("expf", np.exp, x)


def _expm1f(x):
    return _math_f32("expm1f", np.expm1, x)


def _logf(x):
    return _math_f32("logf", np.log, x)


def _tanhf(x):
    return _math_f32("tanhf", np.tanh, x)


def _cosf(x):
    return _math_f32("cosf", np.cos, x)


def _sinf(x):
    return _math_f32("sinf", np.sin, x)


@functools.lru_cache(maxsize=None)
def _libm():
    """The C math library, if ctypes can load it (None otherwise)."""
    name = ctypes.util.find_library("m")
    try:
        lib = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if lib is None:
        return None
    for fn, nargs in (("expf", 1), ("expm1f", 1), ("logf", 1), ("tanhf", 1), ("powf", 2), ("cosf", 1), ("sinf", 1)):
        f = getattr(lib, fn)
        f.restype = ctypes.c_float
        f.argtypes = [ctypes.c_float] * nargs
    return lib



# %%
# | export
def libm_f32(name: str, *args) -> np.float32:
    """One scalar call of the C library's float function `name` (expf, logf, tanhf, powf, cosf, sinf),
    through ctypes; without a loadable libm, the float64 function rounded to float32."""
    lib = _libm()
    vals = [float(F4(a)) for a in args]
    if lib is not None:
        return F4(getattr(lib, name)(*vals))
    try:
        return F4(C_MATH[name](*vals))
    except (OverflowError, ValueError):
        return F4(np.nan)


def _libm_vec(name: str, x: np.ndarray) -> np.ndarray:
    """The C library's float function `name` applied element by element through ctypes (float64
    stand-in when libm does not load)."""
    lib = _libm()
    x = np.asarray(x, dtype=F4)
    if lib is None:
        with np.errstate(all="ignore"):
            return np.vectorize(C_MATH[name], otypes=[F8])(x.astype(F8)).astype(F4)
    f = getattr(lib, name)
    return np.fromiter((f(v) for v in x.ravel().tolist()), dtype=F4, count=x.size).reshape(x.shape)



# %% [markdown]
# ## 2 · Sums in ggml's order
#
# `GGML_F32x8_REDUCE` folds four 8-lane accumulators pairwise, then adds the lanes with two
# `_mm_hadd_ps`; `hsum_float_8` adds 8 lanes as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)); a C loop
# `sum += x[i]` in double is a sequential sum (numpy's `sum` is pairwise: a cumulative sum is not).

# %%
# | export
def _hsum8(v: np.ndarray) -> np.ndarray:
    """`hsum_float_8` (and the inline sum in `ggml_vec_soft_max_f32`): 8 float32 lanes (last axis)
    added as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))."""
    with np.errstate(all="ignore"):
        r = v[..., 4:8] + v[..., 0:4]
        r0 = r[..., 0] + r[..., 2]
        r1 = r[..., 1] + r[..., 3]
        return r0 + r1


def _reduce_f32x8(acc: np.ndarray) -> np.ndarray:
    """`GGML_F32x8_REDUCE` on four 8-lane accumulators (last axis = 32 = 4 x 8): x0+=x2, x1+=x3,
    x0+=x1, then ((l0+l4)+(l1+l5)) + ((l2+l6)+(l3+l7)) (two `_mm_hadd_ps`)."""
    x = acc.reshape(acc.shape[:-1] + (4, 8))
    with np.errstate(all="ignore"):
        x0 = x[..., 0, :] + x[..., 2, :]
        x1 = x[..., 1, :] + x[..., 3, :]
        x0 = x0 + x1
        t0 = x0[..., 0:4] + x0[..., 4:8]
        return (t0[..., 0] + t0[..., 1]) + (t0[..., 2] + t0[..., 3])


def _seq_sum_f64(v: np.ndarray) -> np.ndarray:
    """A float64 sum along the last axis, one element after the other (a C loop `sum += x[i]`;
    numpy's own sum is pairwise)."""
    if v.shape[-1] == 0:
        return np.zeros(v.shape[:-1], dtype=F8)
    with np.errstate(all="ignore"):
        return np.cumsum(v, axis=-1, dtype=F8)[..., -1]


# %% [markdown]
# ## 3 · The AVX2 q8_0 quantizer
#
# `type_traits[q8_0].from_float` in the AVX2 build — what `mul_mat` converts src1 with, and what
# `cpy` into q8_0 uses — multiplies by `127 / amax` and rounds halves **to even**
# (`_mm256_round_ps`): a tie such as 2.5 becomes 2 here and 3 in the reference quantizer. Chapter 07's
# `quantize_row_q8_0` computes the same blocks with numpy's maximum; here the maximum is ggml's tree
# of 8-lane `max` operations, whose NaN rule (`a > b ? a : b`) decides which value a NaN block reports.

# %%
# | export
def quantize_row_q8_0(x) -> np.ndarray:
    """`quantize_row_q8_0`, the AVX2 path (type_traits[q8_0].from_float: `mul_mat`'s conversion of
    src1, `cpy` into q8_0): amax by the 8-lane max tree, then d = amax/127 stored as f16, id = 127/amax
    and q = x·id rounded to nearest *even* (`_mm256_round_ps(v, _MM_ROUND_NEAREST)`, `q8_0_from_amax`)."""
    xb = _blocks(x)
    ax = np.abs(xb).reshape(xb.shape[:-1] + (4, 8))  # four 8-lane registers v0..v3
    m = _c_max(_c_max(_c_max(ax[..., 0, :], ax[..., 1, :]), ax[..., 2, :]), ax[..., 3, :])
    m4 = _c_max(m[..., 4:8], m[..., 0:4])                        # extractf128 hi, lo
    m2 = _c_max(m4[..., 0:2], m4[..., 2:4])                      # movehl
    amax = _c_max(m2[..., 0], m2[..., 1])                        # max_ss with movehdup
    return q8_0_from_amax(xb, amax)                              # chapter 07: scale, round to even



def _q_ints(blocks, type) -> np.ndarray:
    """The 32 small integers of each block, in element order (int8 for q8_0, nibble - 8 for q4_0)."""
    if type is Q8_0:
        return blocks["qs"].astype(np.int8)
    qs = blocks["qs"]
    lo = (qs & 0x0F).astype(np.int8) - 8
    hi = (qs >> 4).astype(np.int8) - 8
    return np.concatenate([lo, hi], axis=-1)


# %% [markdown]
# #### The SIMD kernels, lane by lane
# ggml's dot products are not sequential sums: `ggml_vec_dot_f32` keeps 4 × 8 float lanes of FMA
# accumulators and reduces them at the end; the q8_0 dot product sums 8-lane blocks. A sequential
# numpy sum differs in the last bits — about 100 ulp on the f32 matrix products of the op fixtures —
# so the lanes are emulated. The same holds for `ggml_v_expf`, the vectorised exponential that silu
# and soft_max use for blocks of 8 (`expf` for the tail), and for the f16 tables of GELU and
# GELU-quick: for −10 < x < 10 the result is the table entry of `f16(x)`, the tanh-approximation
# GELU of that f16 value rounded to f16 — within 4e-3 of the true GELU, and exactly ggml's.

# %%
# | export
def _c(h: str) -> np.float32:
    return F4(float.fromhex(h))


_EXP_C = {k: _c(v) for k, v in dict(
    shift="0x1.8p23", invln2="0x1.715476p+0", ln2hi="0x1.62e4p-1", ln2lo="0x1.7f7d1cp-20",
    p0="0x1.0e4020p-7", p1="0x1.573e2ep-5", p2="0x1.555e66p-3", p3="0x1.fffdb6p-2", p4="0x1.ffffecp-1").items()}


def v_expf(x) -> np.ndarray:
    """`ggml_v_expf` (AVX2 + FMA): ggml's vectorised exp (max error 1.5 ulp), every step emulated
    lane by lane: n = round(x/ln2) via the 1.5·2^23 shift, b = x - n·ln2 (two FMAs), a degree-5
    polynomial j in b (FMAs), 2^n built in the exponent bits; |n| > 126 and |n| > 192 are handled
    with the split scale s1·s2 and the overflow/underflow branch, as in the C. The C's "all lanes
    small" shortcut computes the same value per lane, so it needs no emulation."""
    C = _EXP_C
    x = np.asarray(x, dtype=F4)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        z = fma_f32(x, C["invln2"], C["shift"])
        n = z - C["shift"]
        b = fma_f32(-n, C["ln2lo"], fma_f32(-n, C["ln2hi"], x))
        zb = np.ascontiguousarray(z).view(np.uint32)
        e = (zb << np.uint32(23)).astype(np.uint32)
        k = (e + np.uint32(0x3F800000)).view(F4)
        an = np.abs(n)
        c = an > F4(126)
        u = b * b
        j = fma_f32(fma_f32(fma_f32(C["p0"], b, C["p1"]), u, fma_f32(C["p2"], b, C["p3"])), u, C["p4"] * b)
        small = fma_f32(k, j, k)
        if not c.any():
            return small
        g = np.where(n <= F4(0), np.uint32(0x82000000), np.uint32(0)).astype(np.uint32)
        s1 = (g + np.uint32(0x7F000000)).astype(np.uint32).view(F4)
        s2 = (e - g).astype(np.uint32).view(F4)
        d = an > F4(192)
        big = fma_f32(s2, j, s2) * s1
        return np.where(d, s1 * s1, np.where(c, big, small)).astype(F4)


def _silu_tail(x):
    """`ggml_silu_f32`: x/(1 + expf(-x))."""
    with np.errstate(over="ignore", invalid="ignore"):
        return x / (F4(1) + expf(-x))


def vec_silu_f32(x) -> np.ndarray:
    """`ggml_vec_silu_f32` on rows (last axis): blocks of 8 from the row start go through
    `ggml_v_silu` (x / (1 + ggml_v_expf(0 - x))), the remaining n % 8 through `ggml_silu_f32`."""
    x = np.asarray(x, dtype=F4)
    n = x.shape[-1]
    nv = n - n % 8
    y = np.empty_like(x)
    with np.errstate(over="ignore", invalid="ignore"):
        xv = x[..., :nv]
        y[..., :nv] = xv / (F4(1) + v_expf(F4(0) - xv))
        y[..., nv:] = _silu_tail(x[..., nv:])
    return y


def vec_soft_max_f32(w, mx) -> tuple:
    """`ggml_vec_soft_max_f32` on rows (last axis): y = exp(w - max) -- `ggml_v_expf` on blocks of 8
    from the row start, `expf` on the tail -- and the row sum in double: each block's 8 values
    added as in `hsum_float_8` (float32), then block sums and tail values added one by one in
    float64. Returns (y float32, sum float64)."""
    w = np.asarray(w, dtype=F4)
    n = w.shape[-1]
    nv = n - n % 8
    with np.errstate(invalid="ignore", over="ignore"):
        diff = w - mx[..., None]
    y = np.empty_like(w)
    y[..., :nv] = v_expf(diff[..., :nv])
    y[..., nv:] = expf(diff[..., nv:])
    blocks = y[..., :nv].reshape(w.shape[:-1] + (nv // 8, 8))
    parts = np.concatenate([_hsum8(blocks).astype(F8), y[..., nv:].astype(F8)], axis=-1)
    return y, _seq_sum_f64(parts)


# %% [markdown]
# GELU and GELU-quick go through f16 tables that `ggml_init` fills once: for −10 < x < 10 the result
# is the table entry of `f16(x)`.

# %%
# | export
def _gelu_f32(x, tanh):
    """`ggml_gelu_f32` as gcc -O3 compiles it: 0.5x·(1 + tanhf(√(2/π)x·(1 + 0.044715x·x))), the
    inner 1 + (0.044715x)·x fused into one FMA."""
    inner = fma_f32(GELU_COEF_A * x, x, F4(1))
    arg = (SQRT_2_OVER_PI * x) * inner
    return (F4(0.5) * x) * (F4(1) + tanh(arg))


@functools.lru_cache(maxsize=None)
def gelu_table() -> np.ndarray:
    """`ggml_table_gelu_f16` (filled in `ggml_init`): for each of the 65536 f16 bit patterns h,
    f16(`ggml_gelu_f32`(h)). tanhf is the C library's (ctypes) when available."""
    with np.errstate(all="ignore"):
        x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(F4)
        return fp32_to_fp16(_gelu_f32(x, lambda a: _libm_vec("tanhf", a)))


@functools.lru_cache(maxsize=None)
def gelu_quick_table() -> np.ndarray:
    """`ggml_table_gelu_quick_f16`: f16(`ggml_gelu_quick_f32`(h)) = f16(h·(1/(1 + expf(-1.702·h))))
    for each f16 bit pattern h."""
    with np.errstate(all="ignore"):
        x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(F4)
        e = _libm_vec("expf", GELU_QUICK_COEF * x)
        return fp32_to_fp16(x * (F4(1) / (F4(1) + e)))


def _table_lookup(table, x):
    idx = fp32_to_fp16(x).view(np.uint16)
    return table[idx].astype(F4)


def vec_gelu_f32(x) -> np.ndarray:
    """`ggml_vec_gelu_f32` with GGML_GELU_FP16: 0 for x <= -10, x for x >= 10, otherwise the f16
    table entry of f16(x)."""
    x = np.asarray(x, dtype=F4)
    with np.errstate(invalid="ignore"):
        return np.where(x <= F4(-10), F4(0), np.where(x >= F4(10), x, _table_lookup(gelu_table(), x))).astype(F4)


def vec_gelu_quick_f32(x) -> np.ndarray:
    """`ggml_vec_gelu_quick_f32` with GGML_GELU_QUICK_FP16: the f16 table entry of f16(x) for every x
    (no range guards)."""
    return _table_lookup(gelu_quick_table(), np.asarray(x, dtype=F4))


# %% [markdown]
# The dot products: f32 and f16 rows in 4 × 8 lanes; q8_0 and q4_0 blocks against q8_0 blocks in
# 8-lane block sums, one FMA per block.

# %%
# | export
def vec_dot_f32(x, y) -> np.ndarray:
    """`ggml_vec_dot_f32` (AVX2/FMA) for every pair of rows: x (M, K), y (N, K) float32 -> (N, M).
    The first K & ~31 elements go to 4 accumulators of 8 lanes (one FMA per element,
    `GGML_F32_VEC_FMA`), reduced by `GGML_F32x8_REDUCE`; the leftovers are added to the float32
    result one by one, `sumf += x[i]*y[i]` with the product rounded first (gcc did not fuse this
    loop-carried sum: the fixtures K = 16 and K = 200 match only unfused)."""
    x = np.asarray(x, dtype=F4)
    y = np.asarray(y, dtype=F4)
    K = x.shape[-1]
    npk = K & ~31
    acc = np.zeros((y.shape[0], x.shape[0], 32), dtype=F4)
    for i in range(0, npk, 32):
        acc = fma_f32(x[None, :, i:i + 32], y[:, None, i:i + 32], acc)
    res = _reduce_f32x8(acc)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(npk, K):
            res = res + x[None, :, i] * y[:, None, i]
    return res.astype(F4)


def vec_dot_f16(x, y) -> np.ndarray:
    """`ggml_vec_dot_f16` (AVX2/F16C) for every pair of rows: x (M, K), y (N, K) float16 -> (N, M).
    Same 4 x 8 accumulators as `ggml_vec_dot_f32` (the f16·f16 products are exact in f32, so each
    FMA is one rounded add), reduced to a double; leftovers added in double; the result is
    rounded to float32 at the end."""
    xf = np.asarray(x, dtype=np.float16).astype(F4)
    yf = np.asarray(y, dtype=np.float16).astype(F4)
    K = xf.shape[-1]
    npk = K & ~31
    acc = np.zeros((yf.shape[0], xf.shape[0], 32), dtype=F4)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(0, npk, 32):
            acc = acc + xf[None, :, i:i + 32] * yf[:, None, i:i + 32]
        res = _reduce_f32x8(acc).astype(F8)
        if npk < K:
            tail = (xf[None, :, npk:] * yf[:, None, npk:]).astype(F8)
            res = _seq_sum_f64(np.concatenate([res[..., None], tail], axis=-1))
        return res.astype(F4)


def _vec_dot_q_q8_0(xd, xq, yd, yq) -> np.ndarray:
    """The AVX2 loop shared by `ggml_vec_dot_q8_0_q8_0` and `ggml_vec_dot_q4_0_q8_0`: per block,
    the scale d = f32(dx·dy) and 8 lanes q (lane k = integer sum of the products of elements
    4k..4k+3, `mul_sum_i8_pairs_float`), acc = fma(d, q, acc) block after block; then `hsum_float_8`.
    xd (M, nb) / xq (M, nb, 32) are src0's scales and integers, yd (N, nb) / yq (N, nb, 32) src1's."""
    M, nb = xd.shape
    N = yd.shape[0]

    def lanes(a, b):  # (M, nb, 32) x (N, nb, 32) -> (N, M, nb, 8): sums of 4 products, exact in f32
        ag = a.astype(F4).reshape(M, nb * 8, 4).transpose(1, 0, 2)  # (G, M, 4)
        bg = b.astype(F4).reshape(N, nb * 8, 4).transpose(1, 2, 0)  # (G, 4, N)
        return np.matmul(ag, bg).reshape(nb, 8, M, N).transpose(3, 2, 0, 1)

    q = lanes(xq, yq)
    # `_mm256_sign_epi8(y, x)` negates y where x < 0, and -(-128) wraps to -128: such a product comes
    # out as |x|·(-128) instead of x·(-128), i.e. 256·x lower (no int16 saturation is possible)
    wrap = yq == -128
    if wrap.any():
        q = q + lanes(np.where(xq < 0, xq, 0), np.where(wrap, 256, 0))
    d = (yd.astype(F4)[:, None, :] * xd.astype(F4)[None, :, :]).astype(F4)  # (N, M, nb)
    acc = np.zeros((N, M, 8), dtype=F4)
    for b in range(nb):
        acc = fma_f32(d[:, :, b, None], q[:, :, b, :], acc)
    return _hsum8(acc).astype(F4)


def vec_dot_q8_0_q8_0(x, y) -> np.ndarray:
    """`ggml_vec_dot_q8_0_q8_0` (AVX2) for every pair of rows: x (M, nb), y (N, nb) q8_0 blocks -> (N, M)."""
    return _vec_dot_q_q8_0(x["d"], _q_ints(x, Q8_0), y["d"], _q_ints(y, Q8_0))


def vec_dot_q4_0_q8_0(x, y) -> np.ndarray:
    """`ggml_vec_dot_q4_0_q8_0` (AVX2) for every pair of rows: x (M, nb) q4_0 blocks, y (N, nb) q8_0
    blocks -> (N, M). The nibbles are unpacked to -8..7 (`bytes_from_nibbles_32`) in element order."""
    return _vec_dot_q_q8_0(x["d"], _q_ints(x, Q4_0), y["d"], _q_ints(y, Q8_0))


# %% [markdown]
# `mul_mat` computes every pair of rows of a plane with one of these, in chunks that bound the
# temporary arrays.

# %%
# | export
MUL_MAT_CHUNK = 1 << 21  # outputs x lanes per numpy step (bounds the temporaries)


def _mul_mat_rows(type, x, y) -> np.ndarray:
    """`vec_dot` of src0 rows x (M, ...) with converted src1 rows y (N, ...) -> (N, M) float32,
    in chunks of src1 rows."""
    M, N = x.shape[0], y.shape[0]
    fn = {F32.name: vec_dot_f32, F16.name: vec_dot_f16, Q8_0.name: vec_dot_q8_0_q8_0,
          Q4_0.name: vec_dot_q4_0_q8_0}[type.name]
    step = max(1, MUL_MAT_CHUNK // max(1, 32 * M))
    if N <= step:
        return fn(x, y)
    return np.concatenate([fn(x, y[i:i + step]) for i in range(0, N, step)], axis=0)


# %% [markdown]
# ## 4 · The tier
#
# `ExactArithmetic` answers chapter 07's `Arithmetic` method for method with the functions above.
# Importing this module declares it as `"exact"`; `ggml_lite` imports it, so `cpu_init(exact=True)`
# always finds it.

# %%
# | export
class ExactArithmetic(Arithmetic):
    """The bit-exact numerics tier: each step as ggml's AVX2/FMA/F16C build computes it."""

    name = "exact"
    _LIBM = {"expf": expf, "expm1f": _expm1f, "logf": _logf, "tanhf": _tanhf, "cosf": _cosf, "sinf": _sinf}

    def sum_f64(self, v):
        """`ggml_vec_sum_f32_ggf` and the C loops over `ggml_float`: sequential double sums."""
        return _seq_sum_f64(v)

    def fma(self, a, b, c):
        """What gcc fused: one rounding (`fma_f32`)."""
        return fma_f32(a, b, c)

    def scalar(self, name, *args):
        """The C library's own function, through ctypes (`libm_f32`)."""
        return libm_f32(name, *args)

    def math(self, name, x):
        """The C library's float functions on arrays (see `libm_exact`)."""
        return self._LIBM[name](x)

    def silu(self, x):
        """`ggml_vec_silu_f32` (`ggml_v_silu` on blocks of 8)."""
        return vec_silu_f32(x)

    def soft_max(self, w, mx):
        """`ggml_vec_soft_max_f32` (`ggml_v_expf`, `hsum_float_8`, a double sum)."""
        return vec_soft_max_f32(w, mx)

    def gelu(self, x):
        """`ggml_vec_gelu_f32` through `ggml_table_gelu_f16`."""
        return vec_gelu_f32(x)

    def gelu_quick(self, x):
        """`ggml_vec_gelu_quick_f32` through `ggml_table_gelu_quick_f16`."""
        return vec_gelu_quick_f32(x)

    def from_float(self, type, rows):
        """`from_float` of the AVX2 build: `quantize_row_q8_0` (halves to even), `quantize_row_q4_0_ref`."""
        return quantize_row_q8_0(rows) if type is Q8_0 else quantize_row_q4_0_ref(rows)

    def mul_mat(self, type, x, y):
        """`ggml_compute_forward_mul_mat` plane by plane: an f32 src1 converted to the dot type first
        (`from_float`: f16 for f16 weights, the AVX2 q8_0 quantizer for q8_0 and q4_0), then each pair
        of rows with the type's `vec_dot`."""
        y = self.to_vec_dot(type, y)  # chapter 07's conversion, with this tier's `from_float`
        out = np.empty(y.shape[:2] + (y.shape[2], x.shape[2]), dtype=F4)
        for i3 in range(y.shape[0]):
            for i2 in range(y.shape[1]):
                out[i3, i2] = _mul_mat_rows(type, x[i3, i2], y[i3, i2])
        return out


EXACT = ExactArithmetic()
declare_tier(EXACT)


def exact_params(device: bool = False) -> ComputeParams:
    """`ComputeParams` for one graph (or one node) computed with the exact tier."""
    return ComputeParams(EXACT, device)


def compute_forward_exact(node, device: bool = False) -> None:
    """`ggml_compute_forward` of one node with the exact tier (the tests that compare bits use it)."""
    compute_forward(node, exact_params(device))


# %% [markdown]
# ## 5 · One dot product, three orders
#
# The same 256 products summed three ways: in ggml's 4 × 8 FMA lanes (`vec_dot_f32`), one after the
# other in float32, and by numpy's BLAS. All three are correct to float32 rounding; only the first is
# the number ggml computes. (The BLAS line depends on the machine's BLAS; here the lanes gave
# `3f7095a0`, the sequential sum `3f70959a`, BLAS `3f7095b0`.)

# %%
rng = np.random.default_rng(1)
xr = rng.standard_normal((1, 256)).astype(F4)
yr = rng.standard_normal((1, 256)).astype(F4)
lanes = vec_dot_f32(xr, yr)[0, 0]
sequential = np.cumsum(xr[0] * yr[0], dtype=F4)[-1]
blas = (yr @ xr.T)[0, 0]
exact64 = float(np.dot(xr[0].astype(F8), yr[0].astype(F8)))
for label, v in (("ggml's lanes", lanes), ("sequential", sequential), ("numpy BLAS", blas)):
    print(f"{label:13s} {float(v):+.9g}  bits {F4(v).view(np.uint32):08x}  error {float(v) - exact64:+.2e}")

# %% [markdown]
# ## 6 · The two tiers on a recorded graph
#
# Fixture 07 (a 4-layer LLaMA, 138 nodes, f16 weights and KV cache), planned by the graph allocator,
# its leafs filled by the recorded generator, computed by both tiers. Both convert src1 to f16 as
# ggml does; they differ by summation order only, an ulp here and there, which the f16 roundings that
# follow and the softmax carry to the logits. That stays within the numpy tier's stated tolerance,
# and the exact tier costs several times the time.

# %%
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import ggml_lite as gl  # noqa: E402
from ggml_lite.plancheck import run_plan  # noqa: E402
from ggml_lite.numerics import fill_leaf  # noqa: E402

doc = json.loads(Path("../tests/fixtures/ggml-seed/07_llama4_kvcache.json").read_text())
RANGES = {"inp_tokens": (0, 256), "inp_pos": (0, 64), "inp_out_ids": (0, 16)}


def logits(exact: bool):
    """Fixture 07 computed with one tier: (its last node's values, seconds)."""
    gf, _, _ = run_plan(doc)
    for t in [*gf.graph.leafs, *(n for n in gf.graph.nodes if n.op is gl.Op.NONE)]:
        if t.view_src is None:
            fill_leaf(t, 1234, gf.id_of(t), "int" if t.type is gl.I32 else "float", RANGES.get(t.name))
    start = time.perf_counter()
    gl.cpu_init(exact=exact).graph_compute(gf.graph)
    return gl.tensor_get(gf.graph.nodes[-1]).astype(F8), time.perf_counter() - start


(l_np, t_np), (l_ex, t_ex) = logits(False), logits(True)
tier_diff = float(np.abs(l_np - l_ex).max() / np.abs(l_ex).max())
print(f"max |numpy tier - exact tier| / max |exact| = {tier_diff:.1e} (tolerance {Arithmetic.TOLERANCE_MIXED:g})")
print(f"time: numpy tier {t_np * 1e3:.1f} ms, exact tier {t_ex * 1e3:.1f} ms")

# %% [markdown]
# On the machine that wrote this page: 2.7e-4 (2.6e-3 before the numpy tier converted src1), and
# 5 ms against 18 ms.

# %% [markdown]
# ## 7 · Check

# %%
assert F4(lanes) != F4(blas) or F4(lanes) != F4(sequential)  # the order shows in the last bits
assert max(abs(float(v) - exact64) for v in (lanes, sequential, blas)) < 1e-4
assert tier_diff <= Arithmetic.TOLERANCE_MIXED
assert np.array_equal(logits(True)[0], l_ex)  # the exact tier is deterministic
assert gl.cpu_init(exact=True).arith is EXACT and gl.cpu_init().arith.name == "numpy"
print("appendix A2: all checks passed")
