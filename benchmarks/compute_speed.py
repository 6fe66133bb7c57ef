"""How fast the CPU backend computes, against the same graph in plain numpy.

    python benchmarks/compute_speed.py [--repeat 5]

The graph is fixture 07 (07_llama4_kvcache: a 4-layer LLaMA, 138 nodes, f16 weights and KV cache),
the largest graph the tests compute. It is planned by `GAllocr` and its leafs are filled with the
NUMERICS.md generator. Two ways to compute it, medians of `--repeat` runs, in ms:

* ggml_lite's CPU backend, default tier (`cpu_init().graph_compute`): plain numpy kernels (BLAS
  matmul, numpy sums and exp) with ggml's types, conversions and checks;
* plain numpy: the same nodes on the same memory, each op written the obvious way (`@` for mul_mat,
  `np.exp` for soft_max, a cos/sin table for rope), without any of the backend's checks;
* for reference, the exact tier (`cpu_init(exact=True)`, appendix A2), which reproduces ggml's AVX2
  summation order bit for bit and is not meant to be fast.

Printed: both times, their ratio, the time per node of each op kind, and the largest difference of the
result. Times are figures, never assertions.
"""

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "ggml-seed" / "07_llama4_kvcache.json"

import ggml_lite as gl  # noqa: E402
from ggml_lite.buffer import tensor_array  # noqa: E402
from ggml_lite.numerics import fill_leaf  # noqa: E402
from ggml_lite.plancheck import run_plan  # noqa: E402
from ggml_lite.tensor import Op, word_to_float  # noqa: E402

RANGES = {"inp_tokens": (0, 256), "inp_pos": (0, 64), "inp_out_ids": (0, 16)}


def planned_graph():
    """Fixture 07 planned and allocated, its leafs filled (seed 1234)."""
    gf, _, _ = run_plan(str(FIXTURE))
    for t in [*gf.graph.leafs, *(n for n in gf.graph.nodes if n.op is Op.NONE)]:
        if t.view_src is None:
            i = gf.id_of(t)
            fill_leaf(t, 1234, i, "int" if t.type is gl.I32 else "float", RANGES.get(t.name))
    return gf


def _f32(t):
    return np.asarray(tensor_array(t), dtype=np.float32)


def _rope(node, x, pos):
    p = node.op_params
    n_dims, base = p[1], word_to_float(p[5])
    theta = pos[:, None].astype(np.float64) * base ** (-np.arange(0, n_dims, 2) / n_dims)  # [tokens, pairs]
    c, s = np.cos(theta)[None, :, None, :], np.sin(theta)[None, :, None, :]            # x: [1, tokens, heads, ne0]
    out = x.copy()
    x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
    out[..., 0:n_dims:2] = x0 * c - x1 * s
    out[..., 1:n_dims:2] = x0 * s + x1 * c
    return out


def plain_forward(node) -> None:
    """One node the obvious numpy way, into the node's memory."""
    op, src = node.op, node.src
    if op in gl.VIEW_OPS or op is Op.NONE:
        return
    out = tensor_array(node)
    if op is Op.MUL_MAT:
        a, b = _f32(src[0]), _f32(src[1])
        if a.ndim == 3 and b.ndim == 3 and a.shape[0] != b.shape[0]:  # GQA: heads share a K/V head
            a = np.repeat(a, b.shape[0] // a.shape[0], axis=0)
        r = b @ np.swapaxes(a, -1, -2)
    elif op in (Op.MUL, Op.ADD):
        r = (np.multiply if op is Op.MUL else np.add)(_f32(src[0]), _f32(src[1]))
    elif op is Op.RMS_NORM:
        x = _f32(src[0])
        r = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + word_to_float(node.op_params[0]))
    elif op is Op.ROPE:
        x = _f32(src[0])
        r = _rope(node, x.reshape((1,) * (4 - x.ndim) + x.shape), tensor_array(src[1])).reshape(x.shape)
    elif op is Op.SOFT_MAX:
        x = _f32(src[0]) * word_to_float(node.op_params[0])
        if len(src) > 1 and src[1] is not None:
            x = x + _f32(src[1])[: x.shape[-2]]
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        r = e / e.sum(axis=-1, keepdims=True)
    elif op is Op.UNARY:  # silu in this graph
        x = _f32(src[0])
        r = x / (1 + np.exp(-x))
    elif op is Op.GET_ROWS:
        r = _f32(src[0])[tensor_array(src[1])]
    elif op in (Op.CPY, Op.CONT, Op.DUP):
        r = _f32(src[0]).reshape(out.shape) if op is not Op.CPY else _f32(src[0])
    else:
        raise NotImplementedError(op.name)
    out[...] = np.asarray(r).reshape(out.shape).astype(out.dtype)


def time_backend(repeat, exact=False):
    samples, result = [], None
    for _ in range(repeat):
        gf = planned_graph()
        t0 = time.perf_counter()
        gl.cpu_init(exact=exact).graph_compute(gf.graph)
        samples.append(time.perf_counter() - t0)
        result = gl.tensor_get(gf.graph.nodes[-1]).astype(np.float64)
    return statistics.median(samples), result, gf


def time_plain(repeat):
    samples, result = [], None
    for _ in range(repeat):
        gf = planned_graph()
        t0 = time.perf_counter()
        for node in gf.graph.nodes:
            plain_forward(node)
        samples.append(time.perf_counter() - t0)
        result = gl.tensor_get(gf.graph.nodes[-1]).astype(np.float64)
    return statistics.median(samples), result


def per_op_backend():
    """Time of each node on the CPU backend, summed per op kind (one run)."""
    from ggml_lite.cpu import compute_forward

    gf = planned_graph()
    totals, counts = collections.Counter(), collections.Counter()
    for node in gf.graph.nodes:
        a = time.perf_counter()
        compute_forward(node)
        totals[node.op.name] += time.perf_counter() - a
        counts[node.op.name] += 1
    return totals, counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    if not FIXTURE.is_file():
        print(f"{FIXTURE} is absent: the fixtures live beside the project", file=sys.stderr)
        return 2
    t_lite, r_lite, gf = time_backend(args.repeat)
    t_plain, r_plain = time_plain(args.repeat)
    t_exact, _, _ = time_backend(args.repeat, exact=True)
    n = gf.graph.n_nodes
    print(f"fixture 07_llama4_kvcache: {n} nodes, median of {args.repeat} runs")
    print(f"  ggml_lite CPU backend : {t_lite * 1e3:8.1f} ms")
    print(f"  plain numpy           : {t_plain * 1e3:8.1f} ms")
    print(f"  ratio                 : {t_lite / t_plain:8.1f}x")
    print(f"  exact tier (A2)       : {t_exact * 1e3:8.1f} ms ({t_exact / t_plain:.1f}x plain numpy)")
    diff = np.abs(r_lite - r_plain).max() / np.abs(r_lite).max()
    print(f"  result: max |backend - plain| / max |backend| = {diff:.2e}")
    totals, counts = per_op_backend()
    print("  CPU backend time per op kind (one run):")
    for op, sec in totals.most_common():
        print(f"    {op:10s} {counts[op]:4d} nodes {sec * 1e3:8.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
