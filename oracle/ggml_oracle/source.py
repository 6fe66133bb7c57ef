"""A random graph as ggml_lite source code (a minimal reproducer for a bug report)."""

from __future__ import annotations

import ggml_lite as gl
from ggml_lite.ops import op_call
from ggml_lite.tensor import Op, UnaryOp

from .random_graphs import RandomGraph


def graph_to_code(rg: RandomGraph) -> str:
    """ggml_lite code that rebuilds `rg` (tensors in creation order), for bug reports."""
    lines = ["import ggml_lite as gl", "from ggml_lite.tensor import word_to_float"]
    names: dict[gl.Tensor, str] = {}
    for c in rg.contexts:
        v = "wctx" if c is not rg.contexts[-1] else "ctx"
        lines.append(f"{v} = gl.Context({c.name!r})")
        for t in c.tensors:
            var = f"t{len(names)}"
            names[t] = var
            lines.append(f"{var} = {_tensor_code(t, v, names)}")
            if t.op is not Op.NONE:
                lines += [f"gl.{setter}({var}, {value!r})" for setter, value in op_call(t).then]
            if t.name:
                lines.append(f"{var}.set_name({t.name!r})")
            if t.flags:
                lines.append(f"{var}.flags = {int(t.flags)}")
    lines.append("gf = gl.Graph()")
    for r in rg.roots:
        lines.append(f"gl.build_forward_expand(gf, {names[r]})")
    lines += ["gl.alloc_ctx_tensors(wctx, gl.cpu_buffer_type())"] * len(rg.preallocated)
    return "\n".join(lines)


def _arg_code(a) -> str:
    if isinstance(a, gl.GGMLType):  # ggml_cast's type
        return f"gl.{a.name.upper()}"
    return f"gl.UnaryOp.{a.name}" if isinstance(a, UnaryOp) else repr(a)


def _tensor_code(t, ctx: str, names: dict) -> str:
    """The ggml_lite call that makes `t`: `ctx.new_tensor(...)` for a leaf, else the op table's call
    (`ops.op_call`: `gl.<ctor>(ctx, *sources, *args[, inplace=True])`)."""
    if t.op is Op.NONE:
        return f"{ctx}.new_tensor(gl.{t.type.name.upper()}, {list(t.ne)})"
    call = op_call(t, [names[x] if x is not None else "None" for x in t.src])
    args = [ctx, *(x if x is not None else "None" for x in call.sources), *map(_arg_code, call.args)]
    return f"gl.{call.ctor}({', '.join(args)}{', inplace=True' if call.inplace else ''})"
