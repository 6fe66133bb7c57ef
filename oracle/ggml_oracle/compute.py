"""Compute mirrored graphs on ggml's CPU backend (the CPU kernels' differential tests)."""

from __future__ import annotations

import ctypes

import ggml_lite as gl

from .bindings import need_ggml
from .mirror import mirror


def graph_data_tensors(graph) -> list:
    """The tensors whose contents a caller provides before computing `graph` (chapter 11's
    `verify.data_tensors`: leafs and op-NONE nodes, views excluded, in graph order)."""
    from ggml_lite.verify import data_tensors

    return data_tensors(graph)


class _Computation:
    """A mirrored graph planned by ggml (`ggml_gallocr_alloc_graph` on the CPU buffer type), its data
    tensors filled, and a CPU backend (`ggml_backend_cpu_init`, `n_threads` threads)."""

    def __init__(self, graph, roots, preallocated, data, n_threads: int):
        g = self.g = need_ggml()
        self.m = mirror(graph, roots, preallocated)
        self.galloc = self.backend = None
        try:
            self.galloc = g.ggml_gallocr_new(g.ggml_backend_cpu_buffer_type())
            if not g.ggml_gallocr_alloc_graph(self.galloc, self.m.gf):
                raise RuntimeError("ggml_gallocr_alloc_graph failed")
            for t, raw in (data or {}).items():
                raw = bytes(raw)
                p = self.m.ptr[t]
                if len(raw) != g.ggml_nbytes(p):
                    raise ValueError(f"{t.name!r}: {len(raw)} bytes given, the tensor has {g.ggml_nbytes(p)}")
                if raw:
                    buf = ctypes.create_string_buffer(raw, len(raw))
                    g.ggml_backend_tensor_set(p, ctypes.cast(buf, ctypes.c_void_p), 0, len(raw))
            self.backend = g.ggml_backend_cpu_init()
            if not self.backend:
                raise RuntimeError("ggml_backend_cpu_init failed")
            g.ggml_backend_cpu_set_n_threads(self.backend, n_threads)
        except BaseException:
            self.close()
            raise

    def compute(self, gf_ref) -> None:
        status = self.g.ggml_backend_graph_compute(self.backend, gf_ref)
        if status != self.g.GGML_STATUS_SUCCESS:
            raise RuntimeError(f"ggml_backend_graph_compute returned status {status}")

    def tensor_bytes(self, t) -> bytes:
        """The bytes of the ggml copy of `t` (`ggml_backend_tensor_get`)."""
        p = self.m.ptr[t]
        n = self.g.ggml_nbytes(p)
        buf = ctypes.create_string_buffer(n)
        if n:
            self.g.ggml_backend_tensor_get(p, ctypes.cast(buf, ctypes.c_void_p), 0, n)
        return buf.raw

    def close(self) -> None:
        g = self.g
        if self.backend:
            g.ggml_backend_free(self.backend)
            self.backend = None
        if self.galloc:
            g.ggml_gallocr_free(self.galloc)
            self.galloc = None
        self.m.close()


def ggml_compute(graph, roots=None, preallocated=(), data=None, read=None, n_threads: int = 1) -> list:
    """Compute a ggml_lite graph with the real ggml: mirror it, plan it with `ggml_gallocr_alloc_graph`,
    copy `data` ({ggml_lite tensor: bytes}, normally every tensor of `graph_data_tensors`) into the
    ggml copies, run `ggml_backend_graph_compute` on a CPU backend, and return the bytes of the
    tensors in `read` (default: every node), in that order.

    ggml aborts the whole process on a failed `GGML_ASSERT`: use `run_isolated(ggml_compute, ...)`
    for graphs that ggml may refuse."""
    c = _Computation(graph, roots, preallocated, data, n_threads)
    try:
        c.compute(c.m.gf)
        return [c.tensor_bytes(t) for t in (read if read is not None else graph.nodes)]
    finally:
        c.close()


def ggml_lockstep(graph, roots, preallocated, data, compute_node, n_threads: int = 1) -> list:
    """Compute `graph` one node at a time on both sides, from identical memory: for node i, copy the
    current ggml bytes of its sources and of itself into the ggml_lite tensors (both plans are the
    same, so they overlap the same way), call `compute_node(node)` (ggml_lite's kernel), compute the
    one-node graph view `ggml_graph_view(gf, i, i+1)` in ggml, and record both results. The caller
    has planned and allocated `graph` with ggml_lite. Returns [(node index, ggml_lite bytes, ggml
    bytes)]; ggml_lite errors propagate."""
    c = _Computation(graph, roots, preallocated, data, n_threads)
    try:
        out = []
        for i, node in enumerate(graph.nodes):
            for t in [*(s for s in node.src if s is not None), node]:
                raw = c.tensor_bytes(t)
                holder = t.view_src.buffer if t.view_src is not None else t.buffer
                holder.set_tensor(t, raw, 0, len(raw))
            compute_node(node)
            holder = node.view_src.buffer if node.view_src is not None else node.buffer
            mine = holder.get_tensor(node, 0, gl.nbytes(node))
            view = c.g.ggml_graph_view(c.m.gf, i, i + 1)
            c.compute(ctypes.byref(view))
            out.append((i, mine, c.tensor_bytes(node)))
        return out
    finally:
        c.close()
