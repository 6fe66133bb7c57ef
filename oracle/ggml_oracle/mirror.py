"""mirror: ggml_lite tensors and graph re-created in ggml (no_alloc contexts) by the same op calls, and checked
field by field against ggml_lite's (`MirrorMismatch` lists what differs)."""

from __future__ import annotations

import ctypes

import ggml_lite as gl
from ggml_lite.ops import op_call
from ggml_lite.tensor import GGMLType, Op, UnaryOp

from .bindings import ALIGNMENT, FLAG_MASK, _op_name, _type_code, _unary_code, need_ggml


class MirrorMismatch(AssertionError):
    """ggml built something other than ggml_lite from the same calls (a tensor field or the graph order)."""


def _addr(p) -> int:
    """The address of a ggml tensor (a ctypes pointer), 0 for NULL."""
    return ctypes.cast(p, ctypes.c_void_p).value or 0


def _call_op(g, ctx, t, s):
    """Call the ggml constructor that builds `t` (a ggml_lite tensor) from the mirrored sources `s`: the
    call the op table gives (`ops.op_call`: `ggml_<ctor>[_inplace](ctx, *sources, *args)`), with a
    `UnaryOp` or type argument (`ggml_cast`) mapped to ggml's code; then the table's setters on the result
    (`call.then`: `ggml_<setter>(t, value)`, e.g. `ggml_flash_attn_ext_set_prec`)."""
    call = op_call(t, s)
    args = [_unary_code(a) if isinstance(a, UnaryOp) else _type_code(a) if isinstance(a, GGMLType) else a
            for a in call.c_args]
    p = getattr(g, call.c_name)(ctx, *call.sources, *args)
    for setter, value in call.then:
        if p:
            getattr(g, f"ggml_{setter}")(p, value)
    return p


def _trimmed(words) -> list:
    """op_params without the trailing zero words (as the fixtures record them)."""
    words = list(words)
    while words and words[-1] == 0:
        words.pop()
    return words


def reachable(tensors) -> list:
    """Every tensor `tensors` depend on through `src` and `view_src` (themselves included), in
    first-seen order."""
    seen, out, stack = set(), [], list(reversed(list(tensors)))
    while stack:
        t = stack.pop()
        if t is None or t in seen:
            continue
        seen.add(t)
        out.append(t)
        stack.extend(reversed([*t.src, t.view_src]))
    return out


def infer_roots(graph) -> list:
    """Expand roots that rebuild `graph` (a gl.Graph built with `build_forward_expand`) when the caller
    did not record them: the nodes no later node uses, in node order. Checked by rebuilding the graph
    with ggml_lite; raises ValueError when that does not give the same order (pass `roots=` then)."""
    used = {s for n in graph.nodes for s in n.src if s is not None}
    roots = [n for n in graph.nodes if n not in used]
    roots += [leaf for leaf in graph.leafs if leaf not in used]
    check = gl.Graph(graph.size)
    for r in roots:
        gl.build_forward_expand(check, r)
    if check.nodes != graph.nodes or check.leafs != graph.leafs:
        raise ValueError("cannot infer the expand roots of this graph; pass roots= (the tensors given to "
                         "build_forward_expand, in call order)")
    return roots


class Mirror:
    """ggml copies of ggml_lite tensors and graph, owned until `close()` (also a context manager).

    `ptr[t]` is the ggml tensor (a ctypes pointer) of the ggml_lite tensor `t`; `lite_of[address]` the
    reverse; `gf` the ggml graph; `ext_buffers` the buffers of the pre-allocated contexts."""

    def __init__(self):
        self.ctxs = []
        self.ptr = {}
        self.lite_of = {}
        self.gf = None
        self.graph = None
        self.roots = []
        self.tensors = []
        self.ext_buffers = []
        self.preallocated = []
        self.reservations = []
        self.op_params_differences = []

    def close(self) -> None:
        """Free the ggml contexts and the pre-allocated buffers (idempotent)."""
        g = need_ggml()
        for buf in self.ext_buffers:
            if buf:
                g.ggml_backend_buffer_free(buf)
        self.ext_buffers = []
        for res in self.reservations:
            res.free()
        self.reservations = []
        for ctx in self.ctxs:
            g.ggml_free(ctx)
        self.ctxs = []
        self.ptr, self.lite_of, self.gf = {}, {}, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if self.ctxs or self.ext_buffers or self.reservations:
            self.close()

    def nodes(self) -> list:
        """The ggml graph's nodes, as the ggml_lite tensors they mirror (None for an unknown tensor)."""
        g, gf = need_ggml(), self.gf
        return [self.lite_of.get(_addr(g.ggml_graph_node(gf, i))) for i in range(g.ggml_graph_n_nodes(gf))]

    def leafs(self) -> list:
        """The ggml graph's leafs (read from `struct ggml_cgraph`; ggml has no accessor for them)."""
        c = self.gf.contents
        return [self.lite_of.get(_addr(c.leafs[i])) for i in range(c.n_leafs)]


def _new_ctx(g, n_tensors: int, extra: int = 0):
    params = g.ggml_init_params(mem_size=(n_tensors + 4) * g.ggml_tensor_overhead() + extra + 1024,
                                mem_buffer=None, no_alloc=True)
    ctx = g.ggml_init(params)
    if not ctx:
        raise MemoryError("ggml_init failed")
    return ctx


def _check_tensor(m: Mirror, t, p, problems: list) -> None:
    """Compare the ggml tensor `p` with the ggml_lite tensor `t` it mirrors."""
    c = p.contents
    what = f"{t.name or '<unnamed>'!r} ({t.op.name})"
    if c.type != _type_code(t.type):
        problems.append(f"{what}: type {c.type} in ggml, {t.type.name} in ggml_lite")
    if list(c.ne) != list(t.ne):
        problems.append(f"{what}: ne {list(c.ne)} in ggml, {list(t.ne)} in ggml_lite")
    if list(c.nb) != list(t.nb):
        problems.append(f"{what}: nb {list(c.nb)} in ggml, {list(t.nb)} in ggml_lite")
    if _op_name(c.op) != t.op.name:
        problems.append(f"{what}: op {_op_name(c.op)} in ggml")
    want_vs = m.ptr[t.view_src] if t.view_src is not None else None
    if _addr(c.view_src) != (_addr(want_vs) if want_vs is not None else 0) or c.view_offs != t.view_offs:
        got = m.lite_of.get(_addr(c.view_src))
        problems.append(f"{what}: view of {getattr(got, 'name', None)!r}+{c.view_offs} in ggml, "
                        f"of {getattr(t.view_src, 'name', None)!r}+{t.view_offs} in ggml_lite")
    for j in range(gl.GGML_MAX_SRC):
        s = t.src[j] if j < len(t.src) else None
        want = _addr(m.ptr[s]) if s is not None else 0
        if _addr(c.src[j]) != want:
            problems.append(f"{what}: src[{j}] differs")
    theirs, ours = _trimmed(c.op_params), _trimmed(t.op_params)
    if theirs != ours:
        m.op_params_differences.append((t, theirs, ours))
        problems.append(f"{what}: op_params {theirs} in ggml, {ours} in ggml_lite")


def mirror(graph_or_tensors, roots=None, preallocated=(), graph_size: int | None = None, check: bool = True,
           ext_alloc: str = "malloc") -> Mirror:
    """Re-create ggml_lite tensors and their graph in ggml (no_alloc contexts, one per ggml_lite
    Context, plus one for the graph) and return the `Mirror` (call `close()` when done).

    `graph_or_tensors` is a `gl.Graph`, or the tensors to expand (a graph is then built with ggml_lite
    too, which names unnamed tensors the way ggml does). `roots` are the tensors given to
    `build_forward_expand`, in call order (inferred for a graph when omitted, see `infer_roots`).
    `preallocated` lists the ggml_lite Contexts whose tensors were allocated before planning (weights,
    KV cache): their ggml copies are allocated with `ggml_backend_alloc_ctx_tensors_from_buft` on the
    CPU buffer type before the graph is built. Every tensor of an involved Context is mirrored, in
    creation order, so the pre-allocated buffers have the reference's layout.

    `ext_alloc="malloc"` allocates those contexts with `ggml_backend_alloc_ctx_tensors_from_buft` (the
    memory is malloc'ed and never touched); when that fails, or with `ext_alloc="reserve"`, the tensors
    are laid out the same way (`ggml_tallocr` in creation order, `ggml_backend_view_init` for views)
    in a CPU buffer over reserved, inaccessible address space (`mmap(PROT_NONE, MAP_NORESERVE)`), so
    that a 13 GB weights context costs no memory. Nothing reads or writes tensor data here.

    With `check` (the default) every mirrored tensor and the node and leaf order are compared with
    ggml_lite's; `MirrorMismatch` lists the differences."""
    g = need_ggml()
    if isinstance(graph_or_tensors, gl.Graph):
        graph = graph_or_tensors
        roots = list(roots) if roots is not None else infer_roots(graph)
    else:
        roots = list(graph_or_tensors) if roots is None else list(roots)
        graph = gl.Graph(graph_size or gl.GGML_DEFAULT_GRAPH_SIZE)
        for r in roots:
            gl.build_forward_expand(graph, r)
    size = graph_size or graph.size
    pre_ctxs = list(preallocated)

    # every tensor to mirror: the graph's (and what they depend on), and all tensors of their contexts
    wanted = reachable([*graph.nodes, *graph.leafs, *roots])
    contexts: list[gl.Context] = []
    loose: list[gl.Tensor] = []
    for c in pre_ctxs:
        if not any(c is x for x in contexts):
            contexts.append(c)
    for t in wanted:
        if t.ctx is None:
            loose.append(t)
        elif not any(t.ctx is x for x in contexts):
            contexts.append(t.ctx)
    order = []
    seen = set()
    for c in contexts:
        for t in c.tensors:
            if t not in seen:
                seen.add(t)
                order.append(t)
    for t in loose:
        if t not in seen:
            seen.add(t)
            order.append(t)
    order = reachable(order)  # views/sources living outside the listed contexts, if any
    n_by_ctx: dict[int, int] = {}
    for t in order:
        n_by_ctx[id(t.ctx)] = n_by_ctx.get(id(t.ctx), 0) + 1

    m = Mirror()
    m.graph, m.roots, m.preallocated = graph, roots, pre_ctxs
    try:
        gctx = {}

        def ctx_of(t):
            key = id(t.ctx)
            if key not in gctx:
                gctx[key] = _new_ctx(g, n_by_ctx.get(key, 0))
                m.ctxs.append(gctx[key])
            return gctx[key]

        def make(t):
            # sources first (they normally come earlier in creation order already)
            stack = [t]
            while stack:
                u = stack[-1]
                if u in m.ptr:
                    stack.pop()
                    continue
                # (not u itself: ggml_cast's src[1] is its own result)
                deps = [d for d in (*u.src, u.view_src) if d is not None and d is not u and d not in m.ptr]
                if deps:
                    stack.extend(deps)
                    continue
                stack.pop()
                p = _create(g, ctx_of(u), u, m)
                m.ptr[u] = p
                m.lite_of[_addr(p)] = u

        for t in order:
            make(t)
        m.tensors = order

        problems: list[str] = []
        if check:
            for t in order:
                _check_tensor(m, t, m.ptr[t], problems)

        # pre-allocated contexts: ggml_backend_alloc_ctx_tensors on the CPU buffer type
        buft = g.ggml_backend_cpu_buffer_type()
        for c in pre_ctxs:
            key = id(c)
            if key not in gctx:
                continue
            members = [m.ptr[t] for t in c.tensors if t in m.ptr]
            buf = None
            if ext_alloc == "malloc":
                buf = g.ggml_backend_alloc_ctx_tensors_from_buft(gctx[key], buft)
            if not buf and any(not p.contents.data and not p.contents.view_src for p in members):
                # malloc refused (a 13 GB weights context on a small machine) or asked for: reserve
                # address space only and lay the tensors out as ggml_backend_alloc_ctx_tensors does
                buf = _alloc_reserved(g, m, members)
            m.ext_buffers.append(buf)

        # the graph
        graph_ctx = _new_ctx(g, 0, g.ggml_graph_overhead_custom(size, False))
        m.ctxs.append(graph_ctx)
        m.gf = g.ggml_new_graph_custom(graph_ctx, size, False)
        for r in roots:
            g.ggml_build_forward_expand(m.gf, m.ptr[r])
        if check:
            got_nodes, got_leafs = m.nodes(), m.leafs()
            for kind, got, want in (("node", got_nodes, graph.nodes), ("leaf", got_leafs, graph.leafs)):
                if got != want:
                    k = next((k for k, (a, b) in enumerate(zip(got, want)) if a is not b), min(len(got), len(want)))
                    name = lambda x: getattr(x, "name", None)  # noqa: E731
                    problems.append(f"{kind} order differs at {k}: ggml {[name(x) for x in got[k:k + 3]]}, "
                                    f"ggml_lite {[name(x) for x in want[k:k + 3]]} ({len(got)} vs {len(want)} {kind}s)")
        if problems:
            raise MirrorMismatch(f"{len(problems)} difference(s) between ggml and ggml_lite:\n  "
                                 + "\n  ".join(problems[:20]))
    except BaseException:
        m.close()
        raise
    return m


_PROT_NONE, _MAP_PRIVATE, _MAP_ANONYMOUS, _MAP_NORESERVE = 0, 0x02, 0x20, 0x4000


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


class _Reservation:
    """Address space reserved with mmap (no memory behind it), released by `free()`."""

    def __init__(self, size: int):
        self.libc = _libc()
        self.size = max(size, 1)
        addr = self.libc.mmap(None, self.size, _PROT_NONE, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise MemoryError(f"mmap of {self.size} bytes of address space failed (errno {ctypes.get_errno()})")
        self.addr = addr

    def free(self) -> None:
        if self.addr is not None:
            self.libc.munmap(self.addr, self.size)
            self.addr = None


def _alloc_reserved(g, m: Mirror, members: list):
    """`ggml_backend_alloc_ctx_tensors` for the ggml tensors `members` (one context, creation order),
    over reserved address space: one CPU buffer (`ggml_backend_cpu_buffer_from_ptr`), tensors placed
    by a `ggml_tallocr`, views initialised after their source, as `alloc_tensor_range` does."""
    size = sum(gl.GGML_PAD(g.ggml_nbytes(p), ALIGNMENT) for p in members
               if not p.contents.data and not p.contents.view_src)
    res = _Reservation(size)
    m.reservations.append(res)
    buf = g.ggml_backend_cpu_buffer_from_ptr(res.addr, size)
    talloc = g.ggml_tallocr_new(buf)
    for p in members:
        c = p.contents
        if not c.data:
            if not c.view_src:
                g.ggml_tallocr_alloc(ctypes.byref(talloc), p)
            elif not c.buffer:
                g.ggml_backend_view_init(p)
        elif c.view_src and not c.buffer:
            g.ggml_backend_view_init(p)
    return buf


def _create(g, ctx, t, m: Mirror):
    """The ggml copy of one ggml_lite tensor (its sources already mirrored): name and flags copied."""
    if t.op is Op.NONE:
        if t.view_src is None:
            p = g.ggml_new_tensor_4d(ctx, _type_code(t.type), *t.ne)
        else:
            # a bare view (ggml_view_tensor, op NONE): ggml has no call that takes an offset and leaves
            # the op NONE, so make a 4-d view of the root and clear what ggml_view_4d set
            p = g.ggml_view_4d(ctx, m.ptr[t.view_src], *t.ne, *t.nb[1:], t.view_offs)
            c = p.contents
            c.op = 0
            c.src[0] = None
            for i in range(len(c.op_params)):
                c.op_params[i] = 0
            c.nb[0] = t.nb[0]
    else:
        p = _call_op(g, ctx, t, [m.ptr[s] if s is not None and s is not t else None for s in t.src])
    if not p:
        raise MirrorMismatch(f"ggml returned NULL for {t!r}")
    g.ggml_set_name(p, t.name.encode("utf-8"))
    p.contents.flags |= int(t.flags) & FLAG_MASK
    return p
