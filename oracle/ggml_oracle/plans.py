"""Plans: the real `ggml_gallocr` and ggml_lite's `GAllocr` on the same graph, in one format, and their
differences; one allocator on each side over a sequence of graphs (`check_sequence`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import ggml_lite as gl

from .bindings import CPU_BUFFER_SIZE_DELTA, need_ggml
from .mirror import Mirror, mirror

if TYPE_CHECKING:
    from .random_graphs import RandomGraph

def ggml_plan(graph_or_tensors, roots=None, preallocated=(), graph_size: int | None = None,
              mirrored: Mirror | None = None,
              ext_alloc: str = "malloc") -> dict:
    """Plan a ggml_lite graph with the real ggml: mirror it (or use `mirrored`, which is then left open),
    run `ggml_gallocr_new(ggml_backend_cpu_buffer_type())`, `ggml_gallocr_reserve` and
    `ggml_gallocr_alloc_graph`, free everything, and return

    ``{"buffer_size": ggml_gallocr_get_buffer_size(galloc, 0),      # as ggml-python reports it
       "reference_buffer_size": buffer_size + CPU_BUFFER_SIZE_DELTA, # as the reference C reports it
       "offsets": {ggml_lite tensor: data - base of the compute buffer, or None when not in it},
       "ext_offsets": {ggml_lite tensor: offset in its pre-allocated buffer},
       "ext_buffer_sizes": [size of each pre-allocated buffer, as ggml-python reports it],
       "reserve_ok": bool, "alloc_ok": bool}``

    for every tensor the mirror holds (the graph's and all tensors of their contexts)."""
    g = need_ggml()
    m = mirrored or mirror(graph_or_tensors, roots, preallocated, graph_size, ext_alloc=ext_alloc)
    galloc = None
    try:
        galloc = g.ggml_gallocr_new(g.ggml_backend_cpu_buffer_type())
        reserve_ok = bool(g.ggml_gallocr_reserve(galloc, m.gf))
        alloc_ok = bool(g.ggml_gallocr_alloc_graph(galloc, m.gf)) if reserve_ok else False
        size = int(g.ggml_gallocr_get_buffer_size(galloc, 0))
        ext = {buf for buf in m.ext_buffers if buf}
        bases: dict[int, int] = {}
        offsets: dict[gl.Tensor, int | None] = {}
        ext_offsets: dict[gl.Tensor, int] = {}
        compute = set()
        for t in m.tensors:
            c = m.ptr[t].contents
            buf = c.buffer
            if buf and buf not in ext and c.data:
                compute.add(buf)
        if len(compute) > 1:
            raise RuntimeError(f"ggml spread the compute tensors over {len(compute)} buffers (chunks); "
                               "the oracle expects one")
        for t in m.tensors:
            c = m.ptr[t].contents
            buf, data = c.buffer, c.data
            if not buf or not data:
                offsets[t] = None
                continue
            base = bases.get(buf)
            if base is None:
                base = bases[buf] = g.ggml_backend_buffer_get_base(buf)
            if buf in compute:
                offsets[t] = data - base
            else:
                offsets[t] = None
                ext_offsets[t] = data - base
        return {
            "buffer_size": size,
            "reference_buffer_size": size + CPU_BUFFER_SIZE_DELTA,
            "offsets": offsets,
            "ext_offsets": ext_offsets,
            "ext_buffer_sizes": [int(g.ggml_backend_buffer_get_size(b)) if b else 0 for b in m.ext_buffers],
            "reserve_ok": reserve_ok,
            "alloc_ok": alloc_ok,
        }
    finally:
        if galloc:
            g.ggml_gallocr_free(galloc)
        if mirrored is None:
            m.close()


def lite_plan(graph, tensors, galloc=None) -> dict:
    """Plan `graph` with ggml_lite's `GAllocr` on the CPU buffer type (reserve, then alloc_graph) and
    return, like `ggml_plan`, ``{"buffer_size", "offsets", "reserve_ok", "alloc_ok"}`` for `tensors`
    (offset = data - base of `galloc.buffers[0]`, None when the tensor is not in that buffer).
    ggml_lite's CPU buffer keeps the reference's +32 bytes, so its `buffer_size` compares with
    `ggml_plan(...)["reference_buffer_size"]`."""
    own = galloc is None
    galloc = galloc or gl.GAllocr(gl.cpu_buffer_type())
    reserve_ok = bool(galloc.reserve(graph))
    alloc_ok = bool(galloc.alloc_graph(graph)) if reserve_ok else False
    buf = galloc.buffers[0]
    base = buf.get_base() if buf is not None else None
    offsets = {}
    for t in tensors:
        holder = t.view_src.buffer if t.view_src is not None else t.buffer
        offsets[t] = t.data - base if buf is not None and holder is buf and t.data is not None else None
    size = galloc.get_buffer_size(0)
    if own:
        galloc.free()
    return {"buffer_size": size, "offsets": offsets, "reserve_ok": reserve_ok, "alloc_ok": alloc_ok}


@dataclass
class Difference:
    """One way two plans differ: `tensor` is None for the buffer size or an ok flag."""

    what: str
    tensor: object
    lite: object
    ggml: object

    def __str__(self):
        if self.tensor is None:
            return f"{self.what}: ggml_lite {self.lite}, ggml {self.ggml}"
        t = self.tensor
        return (f"tensor {t.name!r} ({t.op.name}, {t.type.name} {list(t.ne)}, {gl.nbytes(t)} B): "
                f"ggml_lite offset {self.lite}, ggml offset {self.ggml}")


def compare_plans(lite: dict, ref: dict) -> list:
    """The differences between a `lite_plan` and a `ggml_plan` result (empty: identical): the ok flags,
    the buffer size (ggml_lite's against ggml's + `CPU_BUFFER_SIZE_DELTA`), every tensor's offset."""
    out = []
    for key in ("reserve_ok", "alloc_ok"):
        if lite[key] != ref[key]:
            out.append(Difference(key, None, lite[key], ref[key]))
    if lite["buffer_size"] != ref["reference_buffer_size"]:
        out.append(Difference("buffer size (ggml: ggml-python's + 32)", None, lite["buffer_size"],
                              ref["reference_buffer_size"]))
    for t, off in ref["offsets"].items():
        mine = lite["offsets"].get(t, "missing")
        if mine != off:
            out.append(Difference("offset", t, mine, off))
    return out

# ---------------------------------------------------------------------------------------------
# one allocator, several graphs
# ---------------------------------------------------------------------------------------------

def check_sequence(rgs, first_call: str = "alloc_graph") -> list:
    """Plan the graphs `rgs` one after the other on ONE allocator on each side (`ggml_gallocr_alloc_graph`
    / `GAllocr.alloc_graph`; with `first_call="reserve"` the first graph is reserved first), as an
    application does between evaluations: a graph with the shape of the last plan reuses it, another
    one is planned again. Returns `[(step, Difference), ...]`: ok flags and every offset must be equal.

    Buffer sizes differ by more than the fixed 32 bytes here, by design of the two versions: the
    reference re-allocates the buffer only when a new plan's peak exceeds the buffer's size, which
    includes its 32 spare bytes, while ggml 0.15.3 compares with the peak itself. So the buffer size
    ggml reports is checked against a model of that rule (`expected`: the peak of the last plan that
    exceeded the current buffer), fed with the peaks ggml_lite planned.

    When ggml_lite raises `PlanMismatchError` (the reference's `assert` in `ggml_gallocr_init_tensor`:
    the kept plan reserved fewer bytes than a tensor needs) the sequence stops with a difference whose
    `what` is "PlanMismatchError". That happens when a leaf outgrew its planned slot:
    `ggml_gallocr_needs_realloc` checks nodes and node sources by position but not `leaf_allocs`, so
    a graph with the same node and leaf counts keeps the plan, and ggml 0.15.3 (a release build, no
    asserts) places the leaf in the smaller slot, overlapping other tensors."""
    g = need_ggml()
    mirrors = []
    out = []
    galloc = g.ggml_gallocr_new(g.ggml_backend_cpu_buffer_type())
    lite = gl.GAllocr(gl.cpu_buffer_type())
    expected = None  # ggml 0.15.3's buffer size: the peak it last (re)allocated for
    try:
        for k, rg in enumerate(rgs):
            m = mirror(rg.graph, rg.roots, rg.preallocated)
            mirrors.append(m)
            plans_before = lite.planned_nodes
            c_ok = lite_ok = True
            if k == 0 and first_call == "reserve":
                c_ok = bool(g.ggml_gallocr_reserve(galloc, m.gf))
                lite_ok = bool(lite.reserve(rg.graph))
                expected = _replanned(lite, expected)
                plans_before = lite.planned_nodes
            c_ok = c_ok and bool(g.ggml_gallocr_alloc_graph(galloc, m.gf))
            try:
                lite_ok = lite_ok and bool(lite.alloc_graph(rg.graph))
            except gl.PlanMismatchError as err:
                # a kept plan whose slot is too small for a tensor of this graph: the reference asserts
                # (debug build), ggml_lite raises, a release build of ggml places the tensor anyway
                out.append((k, Difference("PlanMismatchError", None, str(err), c_ok)))
                break
            if lite.planned_nodes is not plans_before:  # alloc_graph planned again (reserve_n notes new slots)
                expected = _replanned(lite, expected)
            if c_ok != lite_ok:
                out.append((k, Difference("ok", None, lite_ok, c_ok)))
            size = int(g.ggml_gallocr_get_buffer_size(galloc, 0))
            if size != expected:
                out.append((k, Difference("buffer size (ggml, against the model)", None, expected, size)))
            buf = lite.buffers[0]
            base = buf.get_base() if buf is not None else None
            ext = set(m.ext_buffers)
            for t in m.tensors:
                c = m.ptr[t].contents
                c_off = None
                if c.buffer and c.data and c.buffer not in ext:
                    c_off = c.data - g.ggml_backend_buffer_get_base(c.buffer)
                holder = t.view_src.buffer if t.view_src is not None else t.buffer
                mine = t.data - base if buf is not None and holder is buf and t.data is not None else None
                if mine != c_off:
                    out.append((k, Difference("offset", t, mine, c_off)))
    finally:
        g.ggml_gallocr_free(galloc)
        lite.free()
        for m in mirrors:
            m.close()
    return out


def _replanned(lite, expected):
    """ggml 0.15.3's buffer size after a plan whose peak is ggml_lite's (one chunk: peak = max_size)."""
    peak = lite.buf_tallocs[0].get_max_size()
    return peak if expected is None or peak > expected else expected


def check_random_graph(rg: RandomGraph) -> list:
    """Plan `rg` with ggml (first: the mirror reads only structure) and with ggml_lite; return the
    differences (`compare_plans`)."""
    ref = ggml_plan(rg.graph, rg.roots, rg.preallocated)
    mine = lite_plan(rg.graph, list(ref["offsets"]))
    return compare_plans(mine, ref)

