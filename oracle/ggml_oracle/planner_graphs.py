"""Graphs of the shapes that stress the offline planners (chapter 11): a fan-out, a chain of matrix
products, a chain of in-place adds (the planners' tests and `benchmarks/budget.py`)."""

from __future__ import annotations

import ggml_lite as gl


def fan_out_graph(n: int):
    """One INPUT tensor read by `n` SCALE ops, every one an OUTPUT (10,000 of them took 112 s at
    `--budget 1` once: every planner's work grew with n squared). Returns (graph, contexts, expand
    roots), what `graphio.graph_document` wants (benchmarks/budget.py writes it to a file)."""
    ctx = gl.Context("compute")
    x = ctx.new_tensor_1d(gl.F32, 64, name="x")
    gl.set_input(x)
    graph, outs = gl.graph.Graph(n + 1), []
    for i in range(n):
        y = gl.scale(ctx, x, 2.0)
        y.set_name(f"y{i}")
        gl.set_output(y)
        gl.graph.build_forward_expand(graph, y)
        outs.append(y)
    return graph, [ctx], outs


def chain_graph(n: int):
    """`n` matrix products in a row, y = w_k y, of widths cycling through 48, 80, 16, 112 and 32
    (the weights in a buffer of their own): ggml's plan is above the lower bound."""
    widths = (48, 80, 16, 112, 32)
    wctx, ctx = gl.Context("weights"), gl.Context("compute")
    ws = [wctx.new_tensor_2d(gl.F32, widths[k % 5], widths[(k + 1) % 5], name=f"w{k}") for k in range(n)]
    gl.alloc_ctx_tensors(wctx, gl.cpu_buffer_type())
    y = ctx.new_tensor_2d(gl.F32, widths[0], 8, name="x")
    gl.set_input(y)
    for w in ws:
        y = gl.mul_mat(ctx, w, y)
    gl.set_output(y)
    return gl.graph.build_forward(y, n + 1)


def add_chain(n: int):
    """y = x + x + ... (`n` adds): ggml computes every add in place, so all of it is one block.
    Returns (graph, contexts, expand roots), as `fan_out_graph` does."""
    ctx = gl.Context("chain")
    x = ctx.new_tensor_1d(gl.F32, 64, name="x")
    gl.set_input(x)
    y = x
    for _ in range(n):
        y = gl.add(ctx, y, x)
    gl.set_output(y)
    return gl.graph.build_forward(y, n + 1), [ctx], [y]
