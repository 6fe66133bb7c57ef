"""How values computed by ggml_lite and by ggml are compared: the normwise error, and the op families in
which ggml 0.15.3 legitimately differs from the reference ggml_lite follows (the differential tests' and
`benchmarks/numerics_tolerance.py`'s)."""

from __future__ import annotations

import numpy as np

import ggml_lite as gl
from ggml_lite.tensor import Op


def normwise_error(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| over the finite values / max |b|; inf when the non-finite values differ."""
    fa, fb = np.isfinite(a), np.isfinite(b)
    inf_a, inf_b = a[~fa & ~np.isnan(a)], b[~fb & ~np.isnan(b)]
    if not (np.array_equal(fa, fb) and np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(inf_a, inf_b)):
        return np.inf
    if not fa.any():
        return 0.0
    scale = np.max(np.abs(b[fb]))
    diff = np.max(np.abs(a[fa] - b[fb]))
    return 0.0 if diff == 0 else (diff / scale if scale > 0 else np.inf)


def version_dependent(node) -> str:
    """The op family (or '') for which ggml 0.15.3 legitimately differs from the reference."""
    if node.op is Op.ROPE and not node.op_params[2] & 2:
        return "rope (normal mode)"
    if node.op is Op.NORM:
        return "norm"
    if node.op is Op.MUL_MAT and node.src[0].type is gl.F32 and node.src[0].ne[0] % 32:
        return "mul_mat f32, K % 32 != 0"
    return ""
