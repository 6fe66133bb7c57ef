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
# # A7 · More CPU kernels: the ops a LLaMA does not need
#
# Chapter 07 ported the CPU backend and the kernels a LLaMA graph computes: copies, the four binary
# ops, the unary ops, scale, rms_norm, mul_mat, get_rows, the causal mask, softmax and rope. Chapter 01
# builds more ops than that, and ggml's CPU backend computes all of them. This appendix ports the
# rest — ADD1, SQR, SQRT, LOG, LEAKY_RELU, SUM, SUM_ROWS, MEAN, CONCAT, NORM, FLASH_ATTN_EXT, and the two
# ops of a mixture of experts, ARGSORT and MUL_MAT_ID — each after the few lines of `ggml.c` it follows, and adds them to the backend's kernel table, the way a backend's op
# table grows: one case per op, nothing else touched.
#
# Why an appendix: none of these is on the path from a token to its logits, and a reader of chapter 07
# should meet the backend and the kernels that matter before the ones that complete the set. But the
# package has them all: `import ggml_lite` imports this appendix's module, so every graph the graph
# allocator plans, the oracle compares or a benchmark times is computed by the same kernels, and
# `supports_op` answers as before (everything but one `MUL_MAT` rule, chapter 07 §3).
#
# **Learning goals**
#
# 1. How the CPU backend's op table grows: a table of kernels registered into `ggml_lite.cpu.FORWARD`.
# 2. Where ggml sums in double and where it rounds: SUM (two levels of `ggml_float`), SUM_ROWS and MEAN
#    (one rounding per row), NORM (float32 deviations, a double sum of their squares).
# 3. Which checks are `GGML_ASSERT` (every build) and which a debug-only `assert` (log against sqrt).
# 4. Where ties go: ARGSORT's exchange sort (not stable), the top-k of a mixture of experts, and MUL_MAT_ID.
#
# Exported: `ggml_lite.cpu_kernels_more`. Lines of `ggml.c` are llama.cpp 1d1ccce's, as in chapter 07
# (§1 there says why).

# %%
# | default_exp cpu_kernels_more

import numpy as np

import ggml_lite as gl
from ggml_lite.backend import tensor_get, tensor_set

# %% [markdown]
# ## 1 · The kernels' common ground
#
# Every kernel below is a `ggml_compute_forward_<op>` with the signature of chapter 07's: it gets the
# `ComputeParams` (the numerics tier and the numpy views over the buffers' bytes) and the node, reads
# its sources before it writes, and raises a `ggml_lite.errors` exception where ggml's kernel would
# assert or read memory the wrong way. So they reuse chapter 07's checks (`_need_type`, `_need_nb0`,
# `_same_shape`), its row loop (`_unary_rows`) and its norm input (`_norm_input`), and the tier's sums
# in double (`sum_f64`). A kernel is found through `FORWARD`, ggml.c:17125-17128, one case of the
# switch in `ggml_compute_forward`:
# ```c
# case GGML_OP_ADD1:
#     {
#         ggml_compute_forward_add1(params, tensor);
#     } break;
# ```
# Notice that the case only names the kernel: adding an op to the CPU backend is one kernel and one
# entry in the table (§4).

# %%
# | export
"""The CPU kernels a dense LLaMA graph does not need (appendix A7): ADD1, SQR, SQRT, LOG, LEAKY_RELU, SUM,
SUM_ROWS, MEAN, CONCAT, NORM, FLASH_ATTN_EXT, ARGSORT and MUL_MAT_ID, ports of ggml.c's
`ggml_compute_forward_*` (llama.cpp 1d1ccce lines), registered into the CPU backend's kernel table
`ggml_lite.cpu.FORWARD` when this module is imported (`import ggml_lite` imports it)."""

import numpy as np

from ggml_lite.cpu import (
    FORWARD,
    VEC_DOT_TYPE,
    _alibi_slopes,
    _need_nb0,
    _need_rows,
    _need_type,
    _norm_input,
    _unary_rows,
)
from ggml_lite.errors import DataTypeError, LayoutError, ShapeError, TensorBoundsError, UnsupportedOpError
from ggml_lite.ops import GGML_PREC_DEFAULT, GGML_PREC_F32, SortOrder
from ggml_lite.quants import F4, F8, QK, fp16_to_fp32, fp32_to_fp16
from ggml_lite.tensor import F16, F32, I32, Q8_0, Op, describe, is_contiguous, word_to_float

# %% [markdown]
# ## 2 · Element-wise kernels
#
# ADD1 adds a scalar, ggml.c:9788-9791 (`ggml_compute_forward_add1_f32`):
# ```c
# ggml_vec_add1_f32(ne0,
#         (float *) ((char *) dst->data  + i3*nb3  + i2*nb2  + i1*nb1 ),
#         (float *) ((char *) src0->data + i3*nb03 + i2*nb02 + i1*nb01),
#        *(float *) src1->data);
# ```
# Notice `*(float *) src1->data`: one value for every row; the f16 variants round the sum to f16.

# %%
# | export
def compute_forward_add1(params, node) -> None:
    """`ggml_compute_forward_add1_f32` / `_add1_f16_f32` / `_add1_f16_f16`."""
    a, b = node.src[0], node.src[1]
    if b.nelements != 1:
        raise ShapeError(f"ADD1 {describe(node)}: {describe(b)} must be a scalar")
    if a.type is F32:
        _need_type(node, b, (F32,), "src1")
    elif a.type is F16:
        _need_type(node, b, (F16, F32), "src1")
        _need_type(node, node, (F16,), "the result")
    else:
        raise DataTypeError(f"ADD1 {describe(node)}: no kernel for a {a.type.name} src0 here")
    _need_nb0(node, a, "src0")
    _need_nb0(node, node, "the result")
    v = params.read_f32(b).reshape(())
    params.write(node, params.read_f32(a) + v)

# %% [markdown]
# Element-wise kernels call one vector function per row, ggml.c:10547-10550 (`ggml_compute_forward_sqr_f32`):
# ```c
# for (int i = 0; i < n; i++) {
#     ggml_vec_sqr_f32(nc,
#             (float *) ((char *) dst->data  + i*( dst->nb[1])),
#             (float *) ((char *) src0->data + i*(src0->nb[1])));
# ```
# Notice `i*nb[1]` with a flat row index: rows must be evenly spaced. Chapter 07's `_unary_rows`,
# written for UNARY, holds that shape (f32 in and out, same shape, rows checked by `_need_rows`), so
# each of these four kernels only says which function a row goes through.

# %%
# | export
def compute_forward_sqr(params, node) -> None:
    """`ggml_compute_forward_sqr_f32`: x·x."""
    _unary_rows(params, node, lambda x: x * x)

# %% [markdown]
# SQRT, ggml.c:10592-10594 (`ggml_compute_forward_sqrt_f32`):
# ```c
# for (int i = 0; i < n; i++) {
#     ggml_vec_sqrt_f32(nc,
#             (float *) ((char *) dst->data  + i*( dst->nb[1])),
# ```
# Notice nothing but the vector function changes; `sqrtf` is correctly rounded, so numpy's gives its bits.

# %%
# | export
def compute_forward_sqrt(params, node) -> None:
    """`ggml_compute_forward_sqrt_f32`: sqrtf (IEEE, exact rounding)."""
    _unary_rows(params, node, np.sqrt)

# %% [markdown]
# LOG, ggml.c:10634-10637 (`ggml_compute_forward_log_f32`):
# ```c
# GGML_ASSERT( dst->nb[0] == sizeof(float));
# GGML_ASSERT(src0->nb[0] == sizeof(float));
#
# for (int i = 0; i < n; i++) {
# ```
# Notice `GGML_ASSERT` where sqr and sqrt only `assert`: log checks nb[0] in release builds too
# (`strict=True`); `logf` comes from the tier.

# %%
# | export
def compute_forward_log(params, node) -> None:
    """`ggml_compute_forward_log_f32`: logf."""
    _unary_rows(params, node, lambda x: params.arith.math("logf", x), strict=True)

# %% [markdown]
# LEAKY_RELU, ggml.c:11846-11850 (`ggml_compute_forward_leaky_relu_f32`), then `ggml_vec_leaky_relu_f32` per row:
# ```c
# float negative_slope;
# memcpy(&negative_slope, dst->op_params, sizeof(float));
#
# assert(dst->nb[0]  == sizeof(float));
# assert(src0->nb[0] == sizeof(float));
# ```
# Notice the slope read from `op_params` as a float; the vector function computes
# `(x > 0 ? x : 0) + slope·(x < 0 ? x : 0)`.

# %%
# | export
def compute_forward_leaky_relu(params, node) -> None:
    """`ggml_compute_forward_leaky_relu_f32` (`ggml_vec_leaky_relu_f32`); the slope is op_params[0]."""
    ns = F4(word_to_float(node.op_params[0]))
    _unary_rows(params, node, lambda x: np.where(x > 0, x, F4(0)) + ns * np.where(x < 0, x, F4(0)))

# %% [markdown]
# ## 3 · Reductions
#
# SUM adds every element, ggml.c:10779-10782 (`ggml_compute_forward_sum_f32`):
# ```c
# ggml_vec_sum_f32_ggf(ne00,
#         &row_sum,
#         (float *) ((char *) src0->data + i01*nb01 + i02*nb02 + i03*nb03));
# sum += row_sum;
# ```
# Notice two levels of double (`ggml_float`): rows, then their sum; one rounding at the end. The f16
# kernel sums in float32.

# %%
# | export
def compute_forward_sum(params, node) -> None:
    """`ggml_compute_forward_sum_f32` (row sums in double, added in double) and `_sum_f16` (float32)."""
    a = node.src[0]
    _need_nb0(node, a, "src0", strict=False)
    x = params.read_f32(a)
    if a.type is F32:
        rows = params.arith.sum_f64(x.astype(F8))
        total = params.arith.sum_f64(rows.reshape(-1))
        params.write(node, np.asarray(total, dtype=F8).astype(F4))
        return
    if a.type is F16:
        rows = np.cumsum(x, axis=-1, dtype=F4)[..., -1] if x.shape[-1] else np.zeros(x.shape[:-1], F4)
        flat = rows.reshape(-1)
        total = np.cumsum(flat, dtype=F4)[-1] if flat.size else F4(0)
        params.write(node, np.asarray(total, dtype=F4))
        return
    raise DataTypeError(f"SUM {describe(node)}: no kernel for {a.type.name}")

# %% [markdown]
# SUM_ROWS, ggml.c:10908-10910 (`ggml_compute_forward_sum_rows_f32`):
# ```c
# float row_sum = 0;
# ggml_vec_sum_f32(ne00, &row_sum, src_row);
# dst_row[0] = row_sum;
# ```
# Notice `float row_sum`: `ggml_vec_sum_f32` adds in double inside, then rounds each row once.

# %%
# | export
def compute_forward_sum_rows(params, node) -> None:
    """`ggml_compute_forward_sum_rows_f32`: each row summed in double (`ggml_vec_sum_f32`), stored as f32."""
    a = node.src[0]
    _need_type(node, a, (F32,), "src0")
    _need_nb0(node, a, "src0")
    _need_nb0(node, node, "the result")
    params.write(node, params.arith.sum_f64(params.read_f32(a).astype(F8)).astype(F4)[..., None])

# %% [markdown]
# MEAN, ggml.c:10963-10967 (`ggml_compute_forward_mean_f32`): the row sum is stored in dst, then divided:
# ```c
# ggml_vec_sum_f32(ne00,
#         (float *) ((char *)  dst->data + i01*nb1  + i02*nb2  + i03*nb3),
#         (float *) ((char *) src0->data + i01*nb01 + i02*nb02 + i03*nb03));
#
# *(float *) ((char *) dst->data + i01*nb1 + i02*nb2 + i03*nb3) /= (float) ne00;
# ```
# Notice the order: the sum is rounded to f32 first, then divided by `(float) ne00` in float32.

# %%
# | export
def compute_forward_mean(params, node) -> None:
    """`ggml_compute_forward_mean_f32`: the row sum rounded to f32, divided by (float) ne00."""
    a = node.src[0]
    _need_type(node, a, (F32,), "src0")
    _need_nb0(node, a, "src0", strict=False)
    s = params.arith.sum_f64(params.read_f32(a).astype(F8)).astype(F4)
    params.write(node, (s / F4(a.ne[0]))[..., None])

# %% [markdown]
# ## 4 · Concatenation and normalisation
#
# CONCAT, ggml.c:11265-11268 (`ggml_compute_forward_concat_f32`):
# ```c
# if (i0 < ne00 && i1 < ne01 && i2 < ne02 && i3 < ne03) {
#     x = (const float *) ((const char *)src0->data + (i0       )*nb00 + (i1       )*nb01 + (i2       )*nb02 + (i3       )*nb03);
# } else {
#     x = (const float *) ((const char *)src1->data + (i0 - o[0])*nb10 + (i1 - o[1])*nb11 + (i2 - o[2])*nb12 + (i3 - o[3])*nb13);
# ```
# Notice that nothing checks src1's shape: sources that do not make the result are refused here.

# %%
# | export
def compute_forward_concat(params, node) -> None:
    """`ggml_compute_forward_concat_f32` (f32, i32): src0 then src1 along dim op_params[0]."""
    a, b = node.src[0], node.src[1]
    _need_type(node, a, (F32, I32), "src0")
    for t, what in ((a, "src0"), (b, "src1"), (node, "the result")):
        _need_nb0(node, t, what)
    dim = node.op_params[0]
    if not 0 <= dim < 4:
        raise ShapeError(f"CONCAT {describe(node)}: dim {dim} out of range")
    _need_type(node, b, (a.type,), "src1")
    want = [a.ne[d] + b.ne[d] if d == dim else a.ne[d] for d in range(4)]
    if any(b.ne[d] != a.ne[d] for d in range(4) if d != dim) or list(node.ne) != want:
        raise ShapeError(f"CONCAT {describe(node)}: {describe(a)} then {describe(b)} along dim {dim} do not make "
                         f"the result (ne {want} expected): ggml would read outside src1")
    x = np.array(params.view(a), copy=True)
    y = np.array(params.view(b), copy=True)
    params.view(node)[...] = np.concatenate([x, y], axis=3 - dim)

# %% [markdown]
# NORM, ggml.c:12064-12066 (`ggml_compute_forward_norm_f32`), after `mean = sum/ne00` from a double sum:
# ```c
# float v = x[i00] - mean;
# y[i00] = v;
# sum2 += (ggml_float)(v*v);
# ```
# Notice where float32 and double meet: `v` and `v*v` are float32, their sum double, the variance
# float32 again; `y = v·(1/sqrtf(variance + eps))`.

# %%
# | export
def compute_forward_norm(params, node) -> None:
    """`ggml_compute_forward_norm_f32`: y = (x - mean)·(1/sqrtf(variance + eps)) per row."""
    x, eps, n = _norm_input(params, node)
    mean = (params.arith.sum_f64(x.astype(F8)) / n).astype(F4)
    v = x - mean[..., None]
    var = (params.arith.sum_f64((v * v).astype(F8)) / n).astype(F4)
    scale = F4(1) / np.sqrt(var + eps)
    params.write(node, v * scale[..., None])

# %% [markdown]
# ## 5 · Flash attention
#
# FLASH_ATTN_EXT (chapter 01 builds it) is attention in one op: per query row and head, the scores
# k·q, the softmax and the weighted sum of V, without the `[n_kv, n_q, n_head]` matrix of scores. The
# CPU kernel, `ggml_compute_forward_flash_attn_ext_f16` (ggml.c:15686-15896, for both precisions:
# ggml.c:15898-15917), first converts the query row to K's dot type, ggml.c:15806-15807:
# ```c
# const float * pq = (const float *) ((char *) q->data + (iq1*nbq1 + iq2*nbq2 + iq3*nbq3));
# q_to_vec_dot(pq, Q_q, D);
# ```
# Notice that with an f16 K the dot products see Q rounded to f16, as MUL_MAT's src1 is (chapter 07):
# the tier's `mul_mat` does that conversion. Then each KV position `ic` in order, ggml.c:15813-15826:
# the mask times the head's ALiBi slope (`-INFINITY` skips the position), `s = k·q·scale`, and with a
# softcap `s = softcap·tanhf(s)`, the scale having been divided by the softcap beforehand
# (ggml.c:15757-15759). The slopes are SOFT_MAX's (chapter 07's `_alibi_slopes`, ggml.c:15780). Heads
# broadcast: K and V head `iq2 / (neq2/nek2)`, so grouped-query and multi-query attention need no copy.
#
# The softmax is online, ggml.c:15839-15852 (the f16 V branch):
# ```c
# if (s > M) {
#     M = s;
#     ms = expf(Mold - M);
#     ggml_vec_scale_f16(D, VKQ16, ms);
# } else {
#     vs = expf(s - M);
# }
# ggml_vec_mad_f16(D, VKQ16, (const ggml_fp16_t *) v_data, vs);
# ```
# Notice where the sum of V lives: with an f16 V the accumulator `VKQ16` is f16, rounded after every
# position (`ggml_vec_mad_f16` stores f16); with an f32 V it is float32. The kernel below keeps that,
# and walks the positions in order for all rows at once (one numpy step per position). `S = S·ms + vs`
# (ggml.c:15872) sums the weights, and the row is `VKQ·(1/S)`, stored permuted: query `iq1` of head
# `iq2` lands at `[:, iq2, iq1, iq3]` of the `[D, n_head, n_q, ne3]` result (ggml.c:15893-15894). K or V
# quantized (a q8_0 cache) is refused: ggml converts such rows with `to_float` per position, which
# this port does not do yet. Planning such a graph still works; only computing it raises.

# %%
# | export
def compute_forward_flash_attn_ext(params, node) -> None:
    """`ggml_compute_forward_flash_attn_ext_f16` (both precisions, as `ggml_compute_forward_flash_attn_ext`):
    per query row and head, s = k·q·scale (Q converted to K's dot type), softcap, + slope·mask, the online
    softmax over the KV positions in order (f16 accumulator for an f16 V), result permuted [D, head, row, ne3]."""
    q, k, v = node.src[0], node.src[1], node.src[2]
    mask = node.src[3] if len(node.src) > 3 else None
    if node.op_params[3] not in (GGML_PREC_DEFAULT, GGML_PREC_F32):
        raise UnsupportedOpError(f"FLASH_ATTN_EXT {describe(node)}: precision {node.op_params[3]} (op_params[3]) "
                                 "is neither GGML_PREC_DEFAULT nor GGML_PREC_F32: ggml aborts")
    for t, what in ((k, "K"), (v, "V")):
        if t.type not in (F16, F32):
            raise UnsupportedOpError(f"FLASH_ATTN_EXT {describe(node)}: no CPU kernel here for a {t.type.name} "
                                     f"{what} ({describe(t)}); only f16 and f32 K/V are computed")
    _need_type(node, q, (F32,), "q")
    for t, what in ((q, "q"), (k, "k"), (v, "v"), (node, "the result")):
        _need_nb0(node, t, what)
    D, N = q.ne[0], q.ne[1]
    if k.ne[0] != D or v.ne[0] != D or list(node.ne) != [D, q.ne[2], N, q.ne[3]] or v.ne[1] != k.ne[1] or \
            q.ne[2] % v.ne[2] or q.ne[3] % v.ne[3] or q.ne[2] % k.ne[2] or q.ne[3] % k.ne[3]:
        raise ShapeError(f"FLASH_ATTN_EXT {describe(node)}: q {describe(q)}, k {describe(k)}, v {describe(v)} "
                         "do not make the result (equal ne[0], V's positions K's, heads multiples)")
    scale, max_bias, softcap = (F4(word_to_float(w)) for w in node.op_params[:3])
    if softcap != 0:
        scale = scale / softcap
    n3, nh, n_kv = q.ne[3], q.ne[2], k.ne[1]
    i3, i2 = np.arange(n3)[:, None], np.arange(nh)[None, :]
    kb = params.view(k)[i3 // (n3 // k.ne[3]), i2 // (nh // k.ne[2])]  # (n3, nh, n_kv, D): K's head per q head
    vb = params.view(v)[i3 // (n3 // v.ne[3]), i2 // (nh // v.ne[2])]
    s = params.arith.mul_mat(k.type, kb, params.read_f32(q)) * scale  # (n3, nh, N, n_kv)
    if softcap != 0:
        s = softcap * params.arith.math("tanhf", s)
    mv = np.zeros_like(s)
    if mask is not None:
        _need_type(node, mask, (F16, F32), "the mask")
        if not is_contiguous(mask) or mask.ne[0] < n_kv or mask.ne[1] < N:
            raise LayoutError(f"FLASH_ATTN_EXT {describe(node)}: the mask {describe(mask)} must be a contiguous "
                              f"[>= {n_kv}, >= {N}] matrix")
        slopes = _alibi_slopes(params.arith, nh, float(max_bias))[None, :, None, None]
        mv = slopes * params.read_f32(mask)[0, 0, :N, :n_kv]  # row iq1 of the mask, slope 1 without ALiBi
    s = s + mv
    rows = n3 * nh * N
    s, mv = s.reshape(rows, n_kv), mv.reshape(rows, n_kv)
    acc = np.zeros((rows, D), dtype=np.float16 if v.type is F16 else F4)  # VKQ16 or VKQ32
    M, S = np.full(rows, -np.inf, F4), np.zeros(rows, F4)
    for ic in range(n_kv):
        si, live = s[:, ic], mv[:, ic] != -np.inf
        new = live & (si > M)
        ms = np.where(new, params.arith.math("expf", M - si), F4(1))  # ms = 1, no scaling, when not new
        vs = np.where(new, F4(1), np.where(live, params.arith.math("expf", si - M), F4(0)))
        M = np.where(new, si, M)
        a = acc.astype(F4) * ms[:, None]  # ggml_vec_scale_f16 / _f32 (stored as f16 for an f16 V)
        a = fp16_to_fp32(fp32_to_fp16(a)) if v.type is F16 else a
        vi = np.broadcast_to(vb[:, :, None, ic], (n3, nh, N, D)).reshape(rows, D).astype(F4)
        a = params.arith.fma(vi, vs[:, None], a)  # ggml_vec_mad_f16 / _f32: V += v·vs
        acc = np.where(live[:, None], fp32_to_fp16(a) if v.type is F16 else a, acc)
        S = np.where(live, S * ms + vs, S)
    out = acc.astype(F4) * (F4(1) / S)[:, None]  # 1/S = inf (NaN row) when every position is masked, as ggml
    params.write(node, out.reshape(n3, nh, N, D).transpose(0, 2, 1, 3))

# %% [markdown]
# ## 6 · A mixture of experts: ARGSORT and MUL_MAT_ID
#
# An MoE layer (chapter 01's `top_k` and `mul_mat_id`) needs two more kernels. ARGSORT sorts each row's
# indices by value, `ggml_compute_forward_argsort_f32` (ggml.c:15627-15664), and the sort is no library
# sort, ggml.c:15653-15662:
# ```c
# for (int64_t j = 0; j < ne0; j++) {
#     for (int64_t k = j + 1; k < ne0; k++) {
#         if ((order == GGML_SORT_ORDER_ASC  && src_data[dst_data[j]] > src_data[dst_data[k]]) ||
#             (order == GGML_SORT_ORDER_DESC && src_data[dst_data[j]] < src_data[dst_data[k]])) {
#             /* swap dst_data[j] and dst_data[k] */
# ```
# Notice that it swaps position `j` with every later better one: an exchange sort, which is not stable.
# Equal values come out in an order the swaps decide — `[1, 1, 2]` descending gives `[2, 1, 0]` where a
# stable sort gives `[2, 0, 1]`, so of two experts with equal probability the top 2 take the later one —
# and a NaN compares false, so it stays where the swaps leave it. Today's ggml sorts with `std::sort`
# (the oracle's ggml 0.15.3 gives `[2, 0, 1]` there). The kernel takes a stable numpy
# sort for the rows without ties (there every sort agrees) and runs the exchange sort itself, one numpy
# step per pair `(j, k)` over all the other rows, so ties come out as in 2024. Rows are read at
# `i·nb01` and written at `i·nb1`, elements contiguous.

# %%
# | export
def compute_forward_argsort(params, node) -> None:
    """`ggml_compute_forward_argsort_f32`: per row, the i32 indices sorted by value (`op_params[0]`: ASC or
    DESC), with ggml's exchange sort where a row has equal values or a NaN; another order leaves 0..n-1."""
    src = node.src[0]
    _need_type(node, src, (F32,), "src0")
    _need_nb0(node, node, "the result")
    _need_rows(node, src, "src0")
    _need_rows(node, node, "the result")
    n = src.ne[0]
    vals = params.read_f32(src).reshape(-1, n)
    idx = np.tile(np.arange(n, dtype=np.int32), (vals.shape[0], 1))
    order = node.op_params[0]
    if order in (SortOrder.ASC, SortOrder.DESC) and n > 1:
        s = np.sort(vals, axis=1)
        ties = (s[:, 1:] == s[:, :-1]).any(axis=1) | np.isnan(vals).any(axis=1)
        plain = np.argsort(vals if order == SortOrder.ASC else -vals, axis=1, kind="stable")
        idx[~ties] = plain[~ties]
        v, p = vals[ties], idx[ties]
        r = np.arange(len(v))
        for j in range(n):
            for k in range(j + 1, n):
                vj, vk = v[r, p[:, j]], v[r, p[:, k]]
                swap = vj > vk if order == SortOrder.ASC else vj < vk
                p[swap, j], p[swap, k] = p[swap, k], p[swap, j]
        idx[ties] = p
    params.write(node, idx)

# %% [markdown]
# MUL_MAT_ID, `ggml_compute_forward_mul_mat_id` (ggml.c:12742-12947), is MUL_MAT with a lookup: the
# column for slot `id` of token `i12` is multiplied by expert `ids[id, i12]`. As in MUL_MAT, src1 is
# first converted to the expert type's dot type (f16 for f16 experts, q8_0 for q8_0 and q4_0), then the
# columns are grouped by expert, ggml.c:12818-12829, and each expert multiplies its group,
# ggml.c:12915-12930:
# ```c
# const int64_t i11 = id % ne11;
# const int64_t i12 = row_mapping.i2; // row index in src1
# ...
# float * dst_col = (float *) ((char *) dst->data + (i1*nb1 + i2*nb2));
# ```
# Notice `id % ne11`: with one src1 column per token (llama.cpp's `[n_embd, 1, n_tokens]` input) every
# slot reads that column; with `n_used` columns (the down projection) slot `id` reads its own. Each
# result column is a set of dot products of its own, so the grouping changes no value, and the tier's
# `mul_mat` computes each group (the exact tier of appendix A2 dot by dot, bit for bit). An id outside
# the experts is an out-of-bounds read in ggml (a debug-only `assert`); here it is refused.

# %%
# | export
def compute_forward_mul_mat_id(params, node) -> None:
    """`ggml_compute_forward_mul_mat_id`: dst[:, id, t] = as[:, :, ids[id, t]] · b[:, id % b.ne1, t], src1 in
    the experts' dot type, each expert's columns multiplied by the tier's `mul_mat`."""
    a, b, ids = node.src[0], node.src[1], node.src[2]
    vdt = VEC_DOT_TYPE.get(a.type.name)
    if vdt is None:
        raise DataTypeError(f"MUL_MAT_ID {describe(node)}: no vec_dot for {a.type.name} experts {describe(a)}")
    _need_type(node, ids, (I32,), "the expert ids")
    if a.nb[0] != a.type.type_size or b.nb[0] != b.type.type_size:
        raise LayoutError(f"MUL_MAT_ID {describe(node)}: ggml does not support permuted src0 or src1 "
                          f"(nb00 = {a.nb[0]}, nb10 = {b.nb[0]})")
    if not (node.nb[0] == 4 and node.nb[0] <= node.nb[1] <= node.nb[2] <= node.nb[3]):
        raise LayoutError(f"MUL_MAT_ID {describe(node)}: the destination cannot be transposed or permuted")
    if a.ne[0] != b.ne[0] or ids.ne[1] != b.ne[2] or b.ne[1] == 0 or list(node.ne) != [a.ne[1], ids.ne[0], b.ne[2], 1]:
        raise ShapeError(f"MUL_MAT_ID {describe(node)}: experts {describe(a)}, {describe(b)} and ids "
                         f"{describe(ids)} do not make the result")
    if b.type is not vdt:
        _need_type(node, b, (F32,), "src1")
        if vdt is Q8_0 and b.ne[0] % QK:
            raise ShapeError(f"MUL_MAT_ID {describe(node)}: rows of {describe(b)} are not whole q8_0 blocks")
    sel = np.array(params.view(ids), copy=True)[0, 0]  # (n_tokens, n_used)
    if sel.size and (sel.min() < 0 or sel.max() >= a.ne[2]):
        bad = int(sel.min()) if sel.min() < 0 else int(sel.max())
        raise TensorBoundsError(f"MUL_MAT_ID {describe(node)}: expert id {bad} of {describe(ids)} is outside "
                                f"the {a.ne[2]} experts of {describe(a)}")
    y = params.view(b) if b.type is vdt else params.read_f32(b)  # (1, n_tokens, ne11, K)
    x = params.view(a)  # (1, n_expert, rows, K)
    out = np.zeros((b.ne[2], ids.ne[0], a.ne[1]), F4)
    for e in range(a.ne[2]):  # the experts in order, each with the columns that picked it
        tok, slot = np.nonzero(sel == e)
        if len(tok):
            cols = y[0, tok, slot % b.ne[1]]
            out[tok, slot] = params.arith.mul_mat(a.type, x[0, e][None, None], cols[None, None])[0, 0]
    params.write(node, out)

# %% [markdown]
# ## 7 · The op table grows
#
# A backend's op table grows one case at a time: ggml added ADD1's case beside ADD's, and a port adds
# a kernel and its entry. Here the thirteen kernels are one table, `MORE_KERNELS`, and `register_kernels`
# adds it to chapter 07's `FORWARD` when the module is imported. Nothing else changes: `supports_op`
# still accepts every op but a `MUL_MAT` whose src1 is neither f32 nor src0's dot type, and an op
# without a kernel still raises `UnsupportedOpError` when a graph reaches it — an op that could only
# be missing if this module were not imported, which `ggml_lite/__init__.py` makes sure of. Chapter
# 08's SIM backend and appendix A2's exact tier compute through the same `FORWARD`, so they get the
# thirteen kernels too. (`ggml_cast`'s CPY needs nothing new: chapter 07's copy kernel reads `src[0]` and
# writes the node, which for a cast is a tensor of its own rather than a view of `src[1]`.) The case the table stands for, ggml.c:17197-17200:
# ```c
# case GGML_OP_NORM:
#     {
#         ggml_compute_forward_norm(params, tensor);
#     } break;
# ```
# Notice that one C function serves each op whatever its types; the type switch is inside it, as in
# `compute_forward_sum` above (f32 sums in double, f16 sums in float32).

# %%
# | export
MORE_KERNELS = {  # op -> kernel, the cases of `ggml_compute_forward`'s switch that chapter 07 leaves out
    Op.ADD1: compute_forward_add1, Op.SQR: compute_forward_sqr, Op.SQRT: compute_forward_sqrt,
    Op.LOG: compute_forward_log, Op.LEAKY_RELU: compute_forward_leaky_relu,
    Op.SUM: compute_forward_sum, Op.SUM_ROWS: compute_forward_sum_rows, Op.MEAN: compute_forward_mean,
    Op.CONCAT: compute_forward_concat, Op.NORM: compute_forward_norm, Op.FLASH_ATTN_EXT: compute_forward_flash_attn_ext,
    Op.ARGSORT: compute_forward_argsort, Op.MUL_MAT_ID: compute_forward_mul_mat_id,
}


def register_kernels(table: dict | None = None) -> None:
    """Adds kernels (default: `MORE_KERNELS`) to the CPU backend's table, `ggml_lite.cpu.FORWARD`: the
    cases of `ggml_compute_forward`'s switch."""
    for op, fn in (MORE_KERNELS if table is None else table).items():
        FORWARD[op] = fn


register_kernels()

# %% [markdown]
# ## 8 · A worked example
#
# One graph computes all ten ops on the CPU backend — two small f32 matrices `a` and `b` (`b` positive,
# for SQRT and LOG) and a scalar `k` — and each result is compared with numpy's. The tensors live in
# one context, allocated as chapter 03 does (`alloc_ctx_tensors`); `tensor_get` returns ggml's `ne`
# in reverse, rows last, as numpy writes them.

# %%
rng = np.random.default_rng(3)
cpu = gl.cpu_init()
ctx = gl.Context("A7")
a = ctx.new_tensor_2d(gl.F32, 8, 4, name="a")
b = ctx.new_tensor_2d(gl.F32, 8, 4, name="b")
k = ctx.new_tensor_1d(gl.F32, 1, name="k")
results = {
    "add1": gl.add1(ctx, a, k), "sqr": gl.sqr(ctx, a), "sqrt": gl.sqrt(ctx, b), "log": gl.log(ctx, b),
    "leaky_relu": gl.leaky_relu(ctx, a, 0.1), "sum": gl.sum(ctx, a), "sum_rows": gl.sum_rows(ctx, a),
    "mean": gl.mean(ctx, a), "concat": gl.concat(ctx, a, b, 1), "norm": gl.norm(ctx, a, 1e-5),
}
graph = gl.Graph(64)
for name, t in results.items():
    t.set_name(name)
    gl.build_forward_expand(graph, t)
gl.alloc_ctx_tensors(ctx, cpu)
A = rng.standard_normal((4, 8)).astype(np.float32)
B = rng.uniform(0.5, 2.0, (4, 8)).astype(np.float32)
K = np.float32(0.75)
tensor_set(a, A)
tensor_set(b, B)
tensor_set(k, np.array([K]))
cpu.graph_compute(graph)

centred = A - A.mean(axis=1, keepdims=True)
expected = {
    "add1": A + K, "sqr": A * A, "sqrt": np.sqrt(B), "log": np.log(B), "leaky_relu": np.where(A > 0, A, 0.1 * A),
    "sum": A.sum(), "sum_rows": A.sum(axis=1, keepdims=True), "mean": A.mean(axis=1, keepdims=True),
    "concat": np.concatenate([A, B], axis=0),
    "norm": centred / np.sqrt((centred * centred).mean(axis=1, keepdims=True) + np.float32(1e-5)),
}
errors = {}
for name, t in results.items():
    got, want = tensor_get(t), np.asarray(expected[name], dtype=np.float32)
    errors[name] = float(np.abs(got.reshape(want.shape) - want).max() / np.abs(want).max())
    print(f"{name:>10}  ne {list(t.ne)}  max |ggml_lite - numpy| / max |numpy| = {errors[name]:.1e}")

# %% [markdown]
# The sums are where ggml's choices show. SUM adds in double (`ggml_float`) and rounds once; adding
# the same float32 values one by one in float32 loses the small one:

# %%
s_ctx = gl.Context("sum")
v = s_ctx.new_tensor_1d(gl.F32, 4, name="v")
total = gl.sum(s_ctx, v)
gl.alloc_ctx_tensors(s_ctx, cpu)
V = np.array([1e8, 1, -1e8, 0], dtype=np.float32)
tensor_set(v, V)
cpu.graph_compute(gl.build_forward(total))
in_f32 = np.cumsum(V, dtype=np.float32)[-1]
print("SUM, double as ggml:", tensor_get(total).item(), "  float32 one by one:", in_f32.item())

# %% [markdown]
# Flash attention on a small grouped-query case: 3 queries of 4 heads of size 16 against 24 cached
# positions of 2 KV heads (f16), a causal mask and ALiBi (max_bias 8). The reference is plain numpy in
# float64, the textbook way: all scores, softmax, then times V. The kernel's f16 accumulator and f16
# query keep the two within `Arithmetic.TOLERANCE_MIXED` (5e-3 of the largest value); the run prints
# 1.5e-3, a few f16 roundings of the accumulator. A q8_0 V builds and plans, but computing it is refused, naming the tensor.

# %%
f_ctx = gl.Context("fa")
fq = f_ctx.new_tensor_3d(gl.F32, 16, 3, 4, name="q")
fk = f_ctx.new_tensor_3d(gl.F16, 16, 24, 2, name="k")
fv = f_ctx.new_tensor_3d(gl.F16, 16, 24, 2, name="v")
fm = f_ctx.new_tensor_2d(gl.F16, 24, 32, name="KQ_mask")
fa = gl.flash_attn_ext(f_ctx, fq, fk, fv, fm, 0.25, 8.0, 0.0)
gl.alloc_ctx_tensors(f_ctx, cpu)
Q = rng.standard_normal((4, 3, 16)).astype(np.float32)
KK, VV = (rng.standard_normal((2, 24, 16)).astype(np.float16) for _ in range(2))
Mask = np.where(np.arange(24)[None, :] <= 21 + np.arange(32)[:, None], 0, -np.inf).astype(np.float16)
for t, x in ((fq, Q), (fk, KK), (fv, VV), (fm, Mask)):
    tensor_set(t, x)
cpu.graph_compute(gl.build_forward(fa))
slopes = gl.cpu._alibi_slopes(gl.cpu.NUMPY, 4, 8.0).astype(np.float64)
w = 0.25 * Q.astype(np.float64) @ np.repeat(KK, 2, axis=0).astype(np.float64).transpose(0, 2, 1)
w = w + slopes[:, None, None] * Mask[:3].astype(np.float64)
p = np.exp(w - w.max(axis=-1, keepdims=True))
ref = (p / p.sum(axis=-1, keepdims=True)) @ np.repeat(VV, 2, axis=0).astype(np.float64)  # (head, query, D)
got = tensor_get(fa).reshape(3, 4, 16).transpose(1, 0, 2)  # the result is permuted: [D, head, query]
fa_error = float(np.abs(got - ref).max() / np.abs(ref).max())
print(f"flash_attn_ext ne {fa.ne}: max |ggml_lite - numpy| / max |numpy| = {fa_error:.1e}")
fv8 = f_ctx.new_tensor_3d(gl.Q8_0, 32, 24, 2, name="v_q8_0")
fk32 = f_ctx.new_tensor_3d(gl.F16, 32, 24, 2, name="k32")
fa8 = gl.flash_attn_ext(f_ctx, f_ctx.new_tensor_3d(gl.F32, 32, 3, 4, name="q32"), fk32, fv8, fm, 0.25, 0.0, 0.0)
try:
    gl.cpu.compute_forward(fa8)
    refused = ""
except gl.errors.UnsupportedOpError as e:
    refused = str(e)
print(refused)

# %% [markdown]
# A mixture of experts in miniature: 3 tokens choose 2 of 4 experts (f16 matrices `[8, 6]`) from their
# gate probabilities, and `mul_mat_id` multiplies each token's input by its two experts. The reference
# is plain numpy, one expert matrix per chosen slot. Token 2's first two probabilities tie (0.25, 0.25,
# 0.4, 0.1): the exchange sort takes experts 2 and 1, where a stable sort would take 2 and 0. The product
# agrees to 1.9e-4 of its largest value: the input rounded to f16 (the experts' dot type), as ggml does.

# %%
m_ctx = gl.Context("moe")
probs = m_ctx.new_tensor_2d(gl.F32, 4, 3, name="probs")
sel = gl.top_k(m_ctx, probs, 2)
exps = m_ctx.new_tensor_3d(gl.F16, 8, 6, 4, name="exps")
cur = m_ctx.new_tensor_3d(gl.F32, 8, 1, 3, name="cur")
up = gl.mul_mat_id(m_ctx, exps, cur, sel)
gl.alloc_ctx_tensors(m_ctx, cpu)
P = np.array([[0.1, 0.6, 0.2, 0.1], [0.5, 0.1, 0.1, 0.3], [0.25, 0.25, 0.4, 0.1]], np.float32)
E = rng.standard_normal((4, 6, 8)).astype(np.float16)
X = rng.standard_normal((3, 1, 8)).astype(np.float32)
for t, x in ((probs, P), (exps, E), (cur, X)):
    tensor_set(t, x)
m_graph = gl.build_forward(up)
cpu.graph_compute(m_graph)
chosen = tensor_get(sel).reshape(3, 2)
want = np.stack([[E[e].astype(np.float64) @ X[i, 0] for e in chosen[i]] for i in range(3)])
moe_error = float(np.abs(tensor_get(up).reshape(3, 2, 6) - want).max() / np.abs(want).max())
print("experts chosen:", chosen.tolist(), " a stable sort:", np.argsort(-P, axis=1, kind="stable")[:, :2].tolist())
print(f"mul_mat_id ne {up.ne}: max |ggml_lite - numpy| / max |numpy| = {moe_error:.1e}")

# %% [markdown]
# ## 9 · Check

# %%
assert all(e <= 1e-6 for e in errors.values()), errors
assert tensor_get(total).item() == 1.0 and in_f32.item() == 0.0
assert set(gl.Op) <= set(FORWARD), "every op of chapter 01 has a CPU kernel"
assert fa_error <= gl.cpu.Arithmetic.TOLERANCE_MIXED, fa_error
assert refused.startswith("FLASH_ATTN_EXT") and "q8_0" in refused
assert chosen.tolist() == [[1, 2], [0, 3], [2, 1]] and moe_error <= gl.cpu.Arithmetic.TOLERANCE_MIXED, moe_error
assert {gl.Op.ARGSORT, gl.Op.MUL_MAT_ID} <= set(MORE_KERNELS) and all(cpu.supports_op(t) for t in m_graph.nodes)
assert all(cpu.supports_op(t) for t in results.values())
print("appendix A7: all checks passed")
