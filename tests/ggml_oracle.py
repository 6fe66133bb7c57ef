"""The real ggml as an oracle for ggml_lite's graph allocator, through ggml-python (a helper module).

Four things live here:

* **The C side.** `mirror(...)` re-creates ggml_lite tensors in a ggml-python `no_alloc` context by
  calling the same ggml op constructors, copies names and flags, and replays
  `ggml_build_forward_expand` on the same roots in the same order. It checks that ggml built exactly
  the tensors and the graph ggml_lite built (type, ne, nb, op, op_params, sources, view source and
  offset; node and leaf order) and raises `MirrorMismatch` otherwise — a mismatch there is a finding,
  not something to paper over. `ggml_plan(...)` then runs the real `ggml_gallocr_new`,
  `ggml_gallocr_reserve` and `ggml_gallocr_alloc_graph` and reports the compute buffer's size and
  every tensor's offset in it.
* **The Python side.** `lite_plan(...)` does the same with `ggml_lite.GAllocr`, in the same format,
  and `compare_plans` lists the differences.
* **Random graphs.** `build_random_graph(choose)` builds a random graph with the public ggml_lite API
  from a `choose(n) -> int in [0, n)` callable; `random_graph(seed)` feeds it from `random.Random`,
  `graphs()` is the hypothesis strategy (same builder, so hypothesis can shrink a failing graph).
* **Whole numeric graphs.** `mlp_graph` and `attention_graph` build MLPs and attention stacks with
  softmax heads as the `numerics` files record them; `numeric_corpus` is the seeded corpus the numpy
  tier's tolerance is measured on (`benchmarks/numerics_tolerance.py`); `ggml_results` computes one
  with the real ggml, `lite_numeric_results` with ggml_lite's tiers, and `numerics_document` writes
  it as a fixture-schema file with ggml's plan and results (`tests/differential/test_numerics_graphs.py`).

What ggml-python 0.0.45 needs, and how its ggml differs from the recorded reference
-------------------------------------------------------------------------------------
* ggml-python 0.0.45 wraps ggml 0.15.3 (`ggml.ggml_version()`). Four of its ctypes declarations give
  a pointer-returning function a `typing.NewType` (i.e. `int`) as `restype`, so ctypes returns a C
  `int` and the 64-bit pointer is cut to 32 bits — the next call with it crashes. `apply_ctypes_fixes`
  sets `restype = c_void_p` on `ggml_backend_cpu_buffer_type`, `ggml_backend_alloc_buffer`,
  `ggml_backend_cpu_buffer_from_ptr` and `ggml_backend_sched_get_tensor_backend` and checks that
  none of their arguments is declared narrower than a pointer. (A scan of every ctypes function the
  package exports finds exactly these four.)
* **Buffer size: ggml-python reports 32 bytes less.** The reference (llama.cpp `daa9623`, mid-2024)
  CPU buffer type allocates `size + TENSOR_ALIGNMENT` and reports that larger size; ggml 0.15.3
  reports the size it was asked for (and a zero-size request gives a zero-size buffer). The planned
  offsets are the same, so `reference buffer size == ggml-python's + 32` (`CPU_BUFFER_SIZE_DELTA`).
  `tests/differential/test_differential.py::test_oracle_reproduces_fixture` checks this on the 12 single-graph
  fixtures (every offset equal, every buffer size exactly 32 larger). The same holds for buffers
  made by `ggml_backend_alloc_ctx_tensors` (weights, KV cache).
* ggml 0.15.3 plans with "chunks" (a virtual buffer of up to 16 backend buffers); for the CPU buffer
  type (no maximum size) there is always a single chunk, and its best-fit search, block merging and
  in-place rules are those of the reference. Newer ggml also tags every graph node with a COMPUTE
  flag (16); only INPUT, OUTPUT and PARAM (1, 2, 4) are compared.
* ggml aborts the process (GGML_ASSERT) on arguments it rejects. ggml_lite raises on the same
  conditions, and the mirror only replays tensors ggml_lite built, so a valid ggml_lite graph is a
  valid ggml graph; the random builder stays inside the rules both versions share.
* Two ggml behaviours the sweeps ran into (details where they are handled):
  - a graph with a zero-size tensor and an otherwise empty compute buffer aborts ggml 0.15.3 in
    `ggml_gallocr_alloc_graph` (see `build_random_graph`); the reference and ggml_lite give the buffer
    its 32 spare bytes and carry on;
  - `ggml_gallocr_needs_realloc` (every version) never checks the leafs' planned slots, so a kept
    plan can be too small for a leaf of the next graph; the reference's debug build asserts, ggml_lite
    raises `PlanMismatchError`, a release build of ggml overlaps tensors (see `check_sequence` and
    `tests/differential/test_differential.py::test_a_kept_plan_too_small_for_a_leaf`).
"""

from __future__ import annotations

import ctypes
import math
import random
from dataclasses import dataclass, field

import numpy as np

import ggml_lite as gl
from ggml_lite.tensor import Op, TensorFlag, word_to_float

try:  # ggml-python is a test dependency; tests skip when it is missing
    import ggml as _g
    IMPORT_ERROR = None
except Exception as err:  # pragma: no cover - depends on the environment
    _g = None
    IMPORT_ERROR = err

CPU_BUFFER_SIZE_DELTA = 32  # reference CPU buffer size - ggml-python's (see the module docstring)
FLAG_MASK = int(TensorFlag.INPUT | TensorFlag.OUTPUT | TensorFlag.PARAM)
ALIGNMENT = 32


def available() -> bool:
    """Can the real ggml be used here?"""
    return _g is not None


# ---------------------------------------------------------------------------------------------
# ctypes fixes
# ---------------------------------------------------------------------------------------------

# function -> the C argument kinds ("p": pointer, "z": size_t)
_FIXED = {
    "ggml_backend_cpu_buffer_type": (),
    "ggml_backend_alloc_buffer": ("p", "z"),
    "ggml_backend_cpu_buffer_from_ptr": ("p", "z"),
    "ggml_backend_sched_get_tensor_backend": ("p", "p"),
}
_POINTER_WIDE = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_ssize_t, ctypes.c_uint64,
                 ctypes.c_int64)
_fixed = False


def _is_pointer_wide(argtype) -> bool:
    if argtype in _POINTER_WIDE:
        return True
    return isinstance(argtype, type) and issubclass(argtype, (ctypes._Pointer, ctypes.c_void_p))


def apply_ctypes_fixes() -> list:
    """Make ggml-python 0.0.45 safe to call for the functions this module (or a caller) uses: set
    `restype = c_void_p` on the four pointer-returning functions it declares with an `int` restype,
    and make sure each of their arguments is declared pointer-wide (a pointer argument declared
    `c_int` would be truncated too). Idempotent; returns the names of the functions it changed."""
    global _fixed
    if _g is None:
        raise RuntimeError(f"ggml-python is not importable: {IMPORT_ERROR}")
    changed = []
    lib = _g.lib  # the shared-library proxy; its functions are the objects the `ggml` module exports
    for name, kinds in _FIXED.items():
        # the module's function is the library's (ggml-python's decorator returns the ctypes object);
        # fix both should that ever change
        for fn in {id(f): f for f in (getattr(lib, name), getattr(_g, name))}.values():
            if fn.restype is not ctypes.c_void_p:
                fn.restype = ctypes.c_void_p
                changed.append(name)
            args = list(fn.argtypes or [])
            if len(args) != len(kinds):
                raise RuntimeError(f"{name}: ggml-python declares {len(args)} arguments, the C function has {len(kinds)}")
            fixed_args = [a if _is_pointer_wide(a) else (ctypes.c_void_p if k == "p" else ctypes.c_size_t)
                          for a, k in zip(args, kinds)]
            if fixed_args != args:
                fn.argtypes = fixed_args
                changed.append(name + " (argtypes)")
    _fixed = True
    return changed


def _need_ggml():
    if _g is None:
        raise RuntimeError(f"ggml-python is not importable: {IMPORT_ERROR}")
    if not _fixed:
        apply_ctypes_fixes()
    return _g


# ---------------------------------------------------------------------------------------------
# how the oracle was built: bit-exact comparisons only where it sums in the reproduced order
# ---------------------------------------------------------------------------------------------

# `ggml_cpu_has_*` report the instruction sets ggml was *compiled* for (compile-time macros), which
# fix the SIMD width and so the order in which dot products, silu's and soft_max's vectorised exp and
# the row sums are evaluated. ggml_lite's exact kernels reproduce the build of the recorded fixtures:
# x86-64 with AVX2, FMA and F16C, no AVX-512, no llamafile sgemm. `make setup` builds ggml-python that
# way (GGML_NATIVE=OFF ...), but a user's own install may be native: then the comparisons below the
# exact ones fall back to the documented tolerance (`tests/differential/test_compute_differential.py`).
REPRODUCED_BUILD = {"avx2": True, "fma": True, "f16c": True, "avx512": False, "llamafile": False}
_BUILD_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512", "avx512_vnni", "neon", "arm_fma", "sve", "llamafile")


def build_info() -> dict:
    """{flag: bool} for the instruction sets the installed ggml was compiled with (`ggml_cpu_has_avx2`,
    `ggml_cpu_has_avx512`, ...); a flag ggml-python does not export is False."""
    g = _need_ggml()
    info = {}
    for flag in _BUILD_FLAGS:
        try:
            info[flag] = bool(getattr(g, f"ggml_cpu_has_{flag}")())
        except (AttributeError, RuntimeError):  # not exported by this ggml-python / this library
            info[flag] = False
    return info


def sums_in_reproduced_order() -> bool:
    """Does the installed ggml evaluate in the order ggml_lite's exact kernels reproduce?"""
    info = build_info()
    return all(info[k] == v for k, v in REPRODUCED_BUILD.items())


def describe_build() -> str:
    """One line for the test report: which ggml, built with what, compared how."""
    if _g is None:
        return f"ggml-python is not importable ({IMPORT_ERROR}): the differential tests skip"
    info = build_info()
    flags = " ".join(k.upper() for k, v in info.items() if v) or "no SIMD"
    mode = ("bit-exact comparisons (the build of the recorded fixtures)" if sums_in_reproduced_order() else
            "comparisons within the documented tolerance (another summation order than the fixtures' build)")
    return f"ggml {_g.ggml_version().decode()} via ggml-python, built with {flags}: {mode}"


# ---------------------------------------------------------------------------------------------
# hypothesis settings of the oracle tests: a failure is reported in seconds
# ---------------------------------------------------------------------------------------------

SHRINK_SECONDS = 10  # the most time hypothesis may spend shrinking one failure (its default is 300)


def oracle_settings(max_examples: int):
    """Settings for the random-graph tests: derandomized, no example database, no deadline; phases
    without `explain` (it re-runs the failing example many times to annotate lines); shrinking bounded
    to `SHRINK_SECONDS` (hypothesis exposes no setting for it, so its engine's constant is lowered here;
    `tests/differential/test_differential.py` checks that the constant still exists)."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.internal.conjecture import engine

    engine.MAX_SHRINKING_SECONDS = min(engine.MAX_SHRINKING_SECONDS, SHRINK_SECONDS)
    return settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
                    print_blob=False, suppress_health_check=list(HealthCheck),
                    phases=(Phase.explicit, Phase.generate, Phase.shrink))


# ---------------------------------------------------------------------------------------------
# name <-> value maps, read from the shared library itself
# ---------------------------------------------------------------------------------------------

_TYPE_CODES = {}
_UNARY_CODES = {}
_OP_NAMES = {}


def _type_code(t) -> int:
    code = _TYPE_CODES.get(t.name)
    if code is None:
        g = _need_ggml()
        code = getattr(g, "GGML_TYPE_" + t.name.upper())
        got = g.ggml_type_name(code).decode()
        if got != t.name:
            raise RuntimeError(f"ggml-python's GGML_TYPE_{t.name.upper()} = {code} is {got!r} in the library")
        _TYPE_CODES[t.name] = code
    return code


def _unary_code(u) -> int:
    code = _UNARY_CODES.get(u.name)
    if code is None:
        g = _need_ggml()
        code = getattr(g, "GGML_UNARY_OP_" + u.name)
        got = g.ggml_unary_op_name(code).decode()
        if got != u.name:
            raise RuntimeError(f"ggml-python's GGML_UNARY_OP_{u.name} = {code} is {got!r} in the library")
        _UNARY_CODES[u.name] = code
    return code


def _op_name(code: int) -> str:
    name = _OP_NAMES.get(code)
    if name is None:
        name = _OP_NAMES[code] = _need_ggml().ggml_op_name(code).decode()
    return name


# ---------------------------------------------------------------------------------------------
# mirror: ggml_lite tensors -> ggml tensors
# ---------------------------------------------------------------------------------------------

class MirrorMismatch(AssertionError):
    """ggml built something other than ggml_lite from the same calls (a tensor field or the graph order)."""


def _addr(p) -> int:
    """The address of a ggml tensor (a ctypes pointer), 0 for NULL."""
    return ctypes.cast(p, ctypes.c_void_p).value or 0


def _f(words, i) -> float:
    return word_to_float(words[i])


def _size_t(words, i) -> int:
    return (words[i] & 0xFFFFFFFF) | ((words[i + 1] & 0xFFFFFFFF) << 32)


_VIEW_LIKE = frozenset({Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE, Op.CPY})


def _call_op(g, ctx, t, s):
    """Call the ggml constructor that builds `t` (a ggml_lite tensor) from the mirrored sources `s`."""
    op, p, ne = t.op, t.op_params, t.ne
    inplace = t.view_src is not None and op not in _VIEW_LIKE
    a = s[0] if s else None
    b = s[1] if len(s) > 1 else None
    if op is Op.DUP:
        return (g.ggml_dup_inplace if inplace else g.ggml_dup)(ctx, a)
    if op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.ADD1):
        fn = getattr(g, f"ggml_{op.name.lower()}{'_inplace' if inplace else ''}")
        return fn(ctx, a, b)
    if op in (Op.SQR, Op.SQRT, Op.LOG):
        return getattr(g, f"ggml_{op.name.lower()}{'_inplace' if inplace else ''}")(ctx, a)
    if op is Op.SUM_ROWS:
        return g.ggml_sum_rows(ctx, a)
    if op is Op.CONCAT:
        return g.ggml_concat(ctx, a, b, p[0])
    if op in (Op.NORM, Op.RMS_NORM):
        return getattr(g, f"ggml_{op.name.lower()}{'_inplace' if inplace else ''}")(ctx, a, _f(p, 0))
    if op is Op.MUL_MAT:
        return g.ggml_mul_mat(ctx, a, b)
    if op is Op.SCALE:
        return (g.ggml_scale_inplace if inplace else g.ggml_scale)(ctx, a, _f(p, 0))
    if op is Op.CPY:
        return g.ggml_cpy(ctx, a, b)
    if op is Op.CONT:
        return g.ggml_cont_4d(ctx, a, *ne)
    if op is Op.RESHAPE:
        return g.ggml_reshape_4d(ctx, a, *ne)
    if op is Op.VIEW:
        return g.ggml_view_4d(ctx, a, *ne, *t.nb[1:], _size_t(p, 0))
    if op is Op.PERMUTE:
        return g.ggml_permute(ctx, a, *p[:4])
    if op is Op.TRANSPOSE:
        return g.ggml_transpose(ctx, a)
    if op is Op.GET_ROWS:
        return g.ggml_get_rows(ctx, a, b)
    if op in (Op.DIAG_MASK_INF, Op.DIAG_MASK_ZERO):
        return getattr(g, f"ggml_{op.name.lower()}{'_inplace' if inplace else ''}")(ctx, a, p[0])
    if op is Op.SOFT_MAX:
        return (g.ggml_soft_max_ext_inplace if inplace else g.ggml_soft_max_ext)(ctx, a, b, _f(p, 0), _f(p, 1))
    if op is Op.ROPE:
        c = s[2] if len(s) > 2 else None
        fn = g.ggml_rope_ext_inplace if inplace else g.ggml_rope_ext
        return fn(ctx, a, b, c, p[1], p[2], p[4], *(_f(p, i) for i in range(5, 11)))
    if op is Op.UNARY:
        return (g.ggml_unary_inplace if inplace else g.ggml_unary)(ctx, a, _unary_code(t.unary_op))
    raise NotImplementedError(f"the oracle cannot mirror op {op.name} ({t!r})")


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
    roots += [l for l in graph.leafs if l not in used]
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
        g = _g
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
        g, gf = _g, self.gf
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


def mirror(graph_or_tensors, roots=None, preallocated=(), graph_size: int = None, check: bool = True,
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
    g = _need_ggml()
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
    contexts, loose = [], []
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
    n_by_ctx = {}
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
                deps = [d for d in (*u.src, u.view_src) if d is not None and d not in m.ptr]
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

        problems = []
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
        p = _call_op(g, ctx, t, [m.ptr[s] if s is not None else None for s in t.src])
    if not p:
        raise MirrorMismatch(f"ggml returned NULL for {t!r}")
    g.ggml_set_name(p, t.name.encode("utf-8"))
    p.contents.flags |= int(t.flags) & FLAG_MASK
    return p


# ---------------------------------------------------------------------------------------------
# plans
# ---------------------------------------------------------------------------------------------

def ggml_plan(graph_or_tensors, roots=None, preallocated=(), graph_size: int = None, mirrored: Mirror = None,
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
    g = _need_ggml()
    m = mirrored or mirror(graph_or_tensors, roots, preallocated, graph_size, ext_alloc=ext_alloc)
    galloc = None
    try:
        galloc = g.ggml_gallocr_new(g.ggml_backend_cpu_buffer_type())
        reserve_ok = bool(g.ggml_gallocr_reserve(galloc, m.gf))
        alloc_ok = bool(g.ggml_gallocr_alloc_graph(galloc, m.gf)) if reserve_ok else False
        size = int(g.ggml_gallocr_get_buffer_size(galloc, 0))
        ext = {buf for buf in m.ext_buffers if buf}
        bases, offsets, ext_offsets = {}, {}, {}
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
# random graphs
# ---------------------------------------------------------------------------------------------

@dataclass
class RandomGraph:
    """A random ggml_lite graph and what a planner needs to know about it."""

    graph: object
    roots: list
    contexts: list  # creation order: [weights (if separate), compute]
    preallocated: list  # the contexts allocated before planning (ggml_lite: already allocated)
    ops: list = field(default_factory=list)  # the op kinds used, in order
    label: str = ""

    @property
    def tensors(self) -> list:
        """Every tensor of the graph's contexts, in creation order."""
        return [t for c in self.contexts for t in c.tensors]

    def describe(self) -> str:
        g = self.graph
        pre = " (weights pre-allocated)" if self.preallocated else ""
        return (f"{self.label}: {g.n_nodes} nodes, {g.n_leafs} leafs, {len(self.roots)} root(s){pre}; "
                f"ops {' '.join(self.ops)}")

    def source(self) -> str:
        """The graph as ggml_lite code (for a minimal reproducer)."""
        return graph_to_code(self)


F32, F16, Q8_0, I32 = gl.F32, gl.F16, gl.Q8_0, gl.I32
NE0 = (1, 3, 8, 16, 32, 33, 64, 96, 100, 128, 256)  # row lengths of activations
NE0_Q = (32, 64, 96, 128, 256)  # row lengths that q8_0 (32 elements a block) accepts
NE_REST = (1, 1, 2, 3, 4, 5, 8, 16)
MAX_TENSOR_BYTES = 16 << 20  # larger results are left out of the graph
OP_KINDS = (
    "binary", "binary", "binary", "scale", "elementwise", "unary", "unary", "norm", "soft_max", "mul_mat",
    "mul_mat", "view", "view", "reshape", "permute", "transpose", "cont", "cpy", "get_rows", "rope",
    "diag_mask_inf", "sum_rows", "concat", "dup", "add1", "new_input",
)


class _Builder:
    """The state of one random graph under construction (see `build_random_graph`)."""

    def __init__(self, choose, max_ops: int):
        self.choose = choose
        self.max_ops = max_ops
        self.prealloc = self.coin(1, 3)
        self.wctx = gl.Context("weights") if self.prealloc else None
        self.cctx = gl.Context("compute")
        self.pool = []  # f32 compute values (nodes and inputs) that ops may consume
        self.ops = []
        self.n = 0

    # -- randomness -------------------------------------------------------------------------
    def pick_index(self, n: int) -> int:
        return self.choose(n) if n > 1 else 0

    def pick(self, seq):
        return seq[self.pick_index(len(seq))]

    def coin(self, num: int, den: int) -> bool:
        return self.pick_index(den) < num

    def name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    # -- tensors ------------------------------------------------------------------------------
    def shape(self, ne0=None) -> list:
        ne0 = ne0 if ne0 is not None else self.pick(NE0)
        nd = 1 + self.pick_index(4)
        return [ne0] + [self.pick(NE_REST) for _ in range(nd - 1)] + [1] * (4 - nd)

    def weight(self, type, ne, name="w"):
        """A weight-like leaf: in the weights context when it is pre-allocated, else in the compute one."""
        ctx = self.wctx if self.wctx is not None and self.coin(4, 5) else self.cctx
        t = ctx.new_tensor(type, ne, name=self.name(name))
        if ctx is self.cctx and self.coin(1, 30):
            gl.set_param(t)  # a PARAM leaf becomes a graph node (still op NONE)
        return t

    def new_input(self, ne=None, type=F32):
        t = self.cctx.new_tensor(type, ne or self.shape(), name=self.name("inp"))
        if self.coin(3, 4):
            gl.set_input(t)
        return t

    def value(self):
        """An f32 value to feed an op: from the pool, now and then a fresh input."""
        if not self.pool or self.coin(1, 12):
            t = self.new_input()
            self.pool.append(t)
            return t
        # prefer recent values (graphs then look like chains with side branches)
        k, r = len(self.pool), self.pick_index(5)
        i = k - 1 if r < 3 else k - 1 - self.pick_index(min(k, 6)) if r == 3 else self.pick_index(k)
        return self.pool[i]

    def keep(self, t):
        if t.type is F32:
            self.pool.append(t)
        return t

    # -- ops -------------------------------------------------------------------------------------
    def op(self, kind: str):
        a = self.value()
        if kind == "binary":
            fn = self.pick(("add", "sub", "mul", "div"))
            b = self.broadcastable(a)
            inplace = self.coin(1, 5)
            return getattr(gl, fn + ("_inplace" if inplace else ""))(self.cctx, a, b)
        if kind == "scale":
            if not gl.is_padded_1d(a):
                a = gl.cont(self.cctx, a)
            return gl.scale(self.cctx, a, self.pick((0.5, 0.125, 2.0)), inplace=self.coin(1, 4))
        if kind == "elementwise":
            fn = self.pick((gl.sqr, gl.sqrt, gl.log))
            return fn(self.cctx, a, inplace=self.coin(1, 4))
        if kind == "unary":
            if not gl.is_contiguous_1(a):
                a = gl.cont(self.cctx, a)
            fn = self.pick((gl.silu, gl.gelu, gl.relu, gl.tanh, gl.neg))
            return fn(self.cctx, a, inplace=self.coin(1, 4))
        if kind == "norm":
            fn = self.pick((gl.rms_norm, gl.norm))
            return fn(self.cctx, a, self.pick((1e-5, 1e-6)), inplace=self.coin(1, 4))
        if kind == "soft_max":
            if not gl.is_contiguous(a):
                a = gl.cont(self.cctx, a)
            if self.coin(1, 2):
                return gl.soft_max(self.cctx, a, inplace=self.coin(1, 4))
            mask = None
            if self.coin(3, 4):
                ne1 = a.ne[1] + self.pick((0, 0, 1, 7))
                mask_type = self.pick((F32, F16))
                if self.coin(1, 2):
                    mask = self.new_input([a.ne[0], ne1], mask_type)
                else:
                    mask = self.weight(mask_type, [a.ne[0], ne1], "mask")
            max_bias = self.pick((0.0, 0.0, 8.0)) if mask is not None else 0.0
            return gl.soft_max_ext(self.cctx, a, mask, self.pick((1.0, 0.125)), max_bias, inplace=self.coin(1, 4))
        if kind == "mul_mat":
            return self.mul_mat(a)
        if kind == "view":
            return self.view(a if self.coin(4, 5) else self.some_weight())
        if kind == "reshape":
            if not gl.is_contiguous(a):
                a = gl.cont(self.cctx, a)
            return self.reshape(a)
        if kind == "permute":
            axes = [0, 1, 2, 3]
            for i in range(3, 0, -1):  # Fisher-Yates with `choose`
                j = self.pick_index(i + 1)
                axes[i], axes[j] = axes[j], axes[i]
            return gl.permute(self.cctx, a, *axes)
        if kind == "transpose":
            return gl.transpose(self.cctx, a)
        if kind == "cont":
            if self.coin(1, 2):
                return gl.cont(self.cctx, a)
            ne = self.refactor(a.ne, a.type)
            return gl.cont_4d(self.cctx, a, *ne)
        if kind == "cpy":
            return self.cpy(a)
        if kind == "get_rows":
            return self.get_rows()
        if kind == "rope":
            return self.rope(a)
        if kind == "diag_mask_inf":
            return gl.diag_mask_inf(self.cctx, a, self.pick((0, 1, 3)), inplace=self.coin(1, 4))
        if kind == "sum_rows":
            return gl.sum_rows(self.cctx, a)
        if kind == "concat":
            dim = self.pick_index(4)
            ne = list(a.ne)
            ne[dim] = self.pick((1, 2, 5))
            b = self.new_input(ne) if self.coin(1, 2) else self.weight(F32, ne, "c")
            return gl.concat(self.cctx, a, b, dim) if self.coin(1, 2) else gl.concat(self.cctx, b, a, dim)
        if kind == "dup":
            return gl.dup(self.cctx, a, inplace=self.coin(1, 5))
        if kind == "add1":
            if not gl.is_padded_1d(a):
                a = gl.cont(self.cctx, a)
            return gl.add1(self.cctx, a, self.weight(F32, [1], "one"), inplace=self.coin(1, 4))
        if kind == "new_input":
            return self.new_input()
        raise ValueError(kind)

    def broadcastable(self, a):
        """A second operand that broadcasts to `a`: same shape, one row, a plane, or a scalar."""
        choice = self.pick_index(5)
        same = [t for t in self.pool if list(t.ne) == list(a.ne)]  # `a` itself too: x*x
        if choice == 0 and same:
            return self.pick(same)
        if choice <= 1:
            return self.new_input(list(a.ne)) if self.coin(1, 2) else self.weight(F32, list(a.ne), "b")
        ne = {2: [a.ne[0], 1, 1, 1], 3: [a.ne[0], a.ne[1], 1, 1], 4: [1, 1, 1, 1]}[choice]
        return self.weight(F32, ne, "b") if self.coin(2, 3) else self.new_input(ne)

    def some_weight(self):
        type = self.pick((F32, F16, Q8_0))
        ne0 = self.pick(NE0_Q) if type is Q8_0 else self.pick(NE0)
        return self.weight(type, [ne0, self.pick((1, 4, 16, 33)), self.pick((1, 1, 2)), 1])

    def mul_mat(self, x):
        if x.ne[0] % 32 == 0 and self.coin(1, 2):
            type = self.pick((F32, F16, Q8_0))
        else:
            type = self.pick((F32, F16))
        if self.coin(1, 5):
            # activation x activation (like K*Q): `a` from the pool, broadcast over dims 2, 3
            cands = [t for t in self.pool if t.ne[0] == x.ne[0] and not gl.is_transposed(t)
                     and x.ne[2] % t.ne[2] == 0 and x.ne[3] % t.ne[3] == 0]
            if cands:
                return gl.mul_mat(self.cctx, self.pick(cands), x)
        ne2 = self.pick([d for d in (1, x.ne[2]) if x.ne[2] % d == 0])
        w = self.weight(type, [x.ne[0], self.pick((1, 8, 16, 32, 64, 100)), ne2, 1])
        return gl.mul_mat(self.cctx, w, x)

    def view(self, a):
        """A view_1d..view_4d inside `a`: a sub-block with `a`'s strides (1d: a contiguous run)."""
        blk = a.type.blck_size
        nd = 1 + self.pick_index(4)
        if nd == 1:
            if gl.is_contiguous(a):
                n = a.nelements // blk
                cnt = 1 + self.pick_index(n)
                start = self.pick_index(n - cnt + 1)
                return gl.view_1d(self.cctx, a, cnt * blk, start * a.type.type_size)
            nd = 2
        ne, offs = [], 0
        for d in range(4):
            full = a.ne[d]
            if d == 0 and blk > 1:
                ne.append(full)  # keep whole rows of a quantized tensor
                continue
            k = full if self.coin(1, 2) else 1 + self.pick_index(full)
            start = self.pick_index(full - k + 1)
            ne.append(k)
            offs += start * a.nb[d] if d > 0 else start * a.nb[0]
        for d in range(nd, 4):  # fold the dimensions the view does not have
            ne[d] = 1
        nb = list(a.nb)
        if nd == 2:
            return gl.view_2d(self.cctx, a, ne[0], ne[1], nb[1], offs)
        if nd == 3:
            return gl.view_3d(self.cctx, a, ne[0], ne[1], ne[2], nb[1], nb[2], offs)
        return gl.view_4d(self.cctx, a, ne[0], ne[1], ne[2], ne[3], nb[1], nb[2], nb[3], offs)

    def refactor(self, ne, type) -> list:
        """Another shape with as many elements (rows of a quantized type stay whole)."""
        ne = list(ne)
        n = ne[0] * ne[1] * ne[2] * ne[3]
        options = [[n, 1, 1, 1], [ne[0], n // ne[0], 1, 1], [ne[0] * ne[1], ne[2], ne[3], 1],
                   [ne[0], ne[1] * ne[2], ne[3], 1], [ne[0], ne[1], ne[2] * ne[3], 1]]
        for f in (2, 4):
            if ne[0] % f == 0:
                options.append([ne[0] // f, ne[1] * f, ne[2], ne[3]])
            if ne[1] % f == 0:
                options.append([ne[0] * f, ne[1] // f, ne[2], ne[3]])
        options = [o for o in options if o[0] % type.blck_size == 0]
        return self.pick(options)

    def reshape(self, a):
        ne = self.refactor(a.ne, a.type)
        nd = max([1] + [d + 1 for d in range(4) if ne[d] != 1])
        if nd == 1:
            return gl.reshape_1d(self.cctx, a, ne[0])
        if nd == 2:
            return gl.reshape_2d(self.cctx, a, ne[0], ne[1])
        if nd == 3:
            return gl.reshape_3d(self.cctx, a, ne[0], ne[1], ne[2])
        return gl.reshape_4d(self.cctx, a, *ne)

    def cpy(self, a):
        n = a.nelements
        choice = self.pick_index(3)
        if choice == 0 and self.wctx is not None:
            # into a view of a pre-allocated cache, like llama.cpp's KV cache writes
            cache = self.wctx.new_tensor(self.pick((F16, F32)), [n * self.pick((1, 2, 3))], name=self.name("cache"))
            slot = self.pick_index(cache.ne[0] // n)
            dst = gl.view_1d(self.cctx, cache, n, slot * n * cache.type.type_size)
        elif choice == 1:
            dst = self.cctx.new_tensor(self.pick((F32, F16)), self.refactor(a.ne, F32), name=self.name("dst"))
        else:
            dst = self.new_input(list(a.ne), self.pick((F32, F16)))
        return gl.cpy(self.cctx, a, dst)

    def get_rows(self):
        type = self.pick((F32, F16, Q8_0))
        ne0 = self.pick(NE0_Q) if type is Q8_0 else self.pick(NE0)
        k = self.pick((1, 1, 2))
        if self.coin(1, 4) and self.pool:
            cands = [t for t in self.pool if t.ne[3] == 1]
            if cands:
                a = self.pick(cands)
                k = a.ne[2]
            else:
                a = self.weight(type, [ne0, self.pick((4, 16, 50)), k, 1], "emb")
        else:
            a = self.weight(type, [ne0, self.pick((4, 16, 50)), k, 1], "emb")
        idx = self.new_input([self.pick((1, 3, 8)), k], I32)
        return gl.get_rows(self.cctx, a, idx)

    def rope(self, a):
        if a.ne[0] < 2:
            a = self.new_input([self.pick((8, 16, 64)), self.pick((1, 2, 4)), self.pick((1, 3)), 1])
        # positions: reuse an i32 input of the right length now and then, like llama.cpp's inp_pos
        pos = next((t for t in reversed(self.cctx.tensors)
                    if t.type is I32 and t.op is Op.NONE and list(t.ne) == [a.ne[2], 1, 1, 1]), None)
        if pos is None or self.coin(1, 3):
            pos = self.new_input([a.ne[2]], I32)
        n_dims = 2 * (1 + self.pick_index(a.ne[0] // 2))
        mode = self.pick((0, 2))
        return gl.rope_ext(self.cctx, a, pos, None, n_dims, mode, self.pick((0, 512, 4096)), 10000.0, 1.0,
                           0.0, 1.0, 32.0, 1.0, inplace=self.coin(1, 5))


def build_random_graph(choose, max_ops: int = 40, label: str = "") -> RandomGraph:
    """A random ggml_lite graph, every decision taken by `choose(n)` (an int in `[0, n)`).

    The graph mixes element-wise ops (add/sub/mul/div with broadcasting, scale, sqr, sqrt, log,
    add1, silu/gelu/relu/tanh/neg, in place now and then), rms_norm/norm, soft_max/soft_max_ext (with
    f32/f16 masks and ALiBi bias), mul_mat (f32/f16/q8_0 weights, and activation x activation), views
    (view_1d..view_4d of activations and weights), reshape, permute, transpose, cont/cont_4d, cpy
    (into fresh tensors, inputs or views of a pre-allocated cache), get_rows, rope_ext (shared
    positions), diag_mask_inf, sum_rows, concat and dup. INPUT and OUTPUT flags also land on tensors
    in the middle of the graph, rarely PARAM on a leaf. In one graph out of three the weights live in a
    separate context that is allocated (`gl.alloc_ctx_tensors`) before planning. The expand roots,
    in random order, are the last result, most results nothing uses, and now and then an
    intermediate tensor (which changes the visiting order).

    Left out on purpose: results over `MAX_TENSOR_BYTES` (the real ggml mallocs the compute buffer;
    chained mul_mat/concat can reach hundreds of GB), and tensors with a zero dimension: ggml 0.15.3
    aborts on them (`GGML_ASSERT(tensor->buffer == NULL)` in `ggml_backend_tensor_alloc`, called by
    `ggml_gallocr_alloc_graph`) when the whole compute buffer is empty — its zero-size buffer has a
    NULL base, so a zero-size tensor gets a buffer but no data and is "allocated" twice."""
    b = _Builder(choose, max_ops)
    n_ops = 1 + b.pick_index(max_ops)
    results = []
    for _ in range(n_ops):
        kind = b.pick(OP_KINDS)
        t = b.op(kind)
        b.ops.append(kind)
        if gl.nbytes(t) > MAX_TENSOR_BYTES:
            continue  # products of products grow fast: left out of the graph (ggml mallocs for real)
        b.keep(t)
        if t.op is not Op.NONE:
            results.append(t)
        if b.coin(1, 10):  # flags in the middle of the graph
            gl.set_output(t)
        elif b.coin(1, 25):
            gl.set_input(t)
    results = results or [b.pool[-1]]
    final = results[-1]
    if b.coin(3, 4):
        gl.set_output(final)
    # roots: the last result, most results nobody uses (so that most ops end up in the graph), and
    # now and then an intermediate tensor, which changes the visiting order; all in random order
    used = {s for t in b.cctx.tensors for s in t.src if s is not None}
    extra = [t for t in results if t not in used and t is not final and b.coin(3, 4)]
    extra += [b.pick(results) for _ in range(b.pick_index(3))]
    roots = [final]
    for r in extra:
        if r not in roots:
            roots.insert(b.pick_index(len(roots) + 1), r)
    graph = gl.Graph()
    for r in roots:
        gl.build_forward_expand(graph, r)
    contexts = [c for c in (b.wctx, b.cctx) if c is not None]
    pre = []
    if b.wctx is not None:
        gl.alloc_ctx_tensors(b.wctx, gl.cpu_buffer_type())
        pre.append(b.wctx)
    return RandomGraph(graph, roots, contexts, pre, b.ops, label)


def random_graph(source, max_ops: int = 40) -> RandomGraph:
    """`build_random_graph` driven by `source`: an int seed, a `random.Random`, or hypothesis's `draw`
    (inside a `@st.composite`). The same seed always gives the same graph."""
    if isinstance(source, int):
        label, rng = f"seed {source}", random.Random(source)
    elif hasattr(source, "randrange"):
        label, rng = "random.Random", source
    else:
        from hypothesis import strategies as st

        draw = source
        return build_random_graph(lambda n: draw(st.integers(0, n - 1)), max_ops, "hypothesis")
    return build_random_graph(lambda n: rng.randrange(n), max_ops, label)


def graphs(max_ops: int = 40):
    """The hypothesis strategy of random graphs (`build_random_graph` fed by `draw`)."""
    from hypothesis import strategies as st

    @st.composite
    def _graphs(draw):
        return random_graph(draw, max_ops)

    return _graphs()


def graph_to_code(rg: RandomGraph) -> str:
    """ggml_lite code that rebuilds `rg` (tensors in creation order), for bug reports."""
    lines = ["import ggml_lite as gl", "from ggml_lite.tensor import word_to_float"]
    names = {}
    for c in rg.contexts:
        v = "wctx" if c is not rg.contexts[-1] else "ctx"
        lines.append(f"{v} = gl.Context({c.name!r})")
        for i, t in enumerate(c.tensors):
            var = f"t{len(names)}"
            names[t] = var
            lines.append(f"{var} = {_tensor_code(t, v, names)}")
            if t.name:
                lines.append(f"{var}.set_name({t.name!r})")
            if t.flags:
                lines.append(f"{var}.flags = {int(t.flags)}")
    lines.append("gf = gl.Graph()")
    for r in rg.roots:
        lines.append(f"gl.build_forward_expand(gf, {names[r]})")
    for c in rg.preallocated:
        lines.append("gl.alloc_ctx_tensors(wctx, gl.cpu_buffer_type())")
    return "\n".join(lines)


def _tensor_code(t, ctx: str, names: dict) -> str:
    s = [names[x] if x is not None else "None" for x in t.src]
    p = t.op_params
    f = lambda i: repr(word_to_float(p[i]))  # noqa: E731
    ip = t.view_src is not None and t.op not in _VIEW_LIKE
    op = t.op
    if op is Op.NONE:
        return f"{ctx}.new_tensor(gl.{t.type.name.upper()}, {list(t.ne)})"
    if op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV):
        return f"gl.{op.name.lower()}{'_inplace' if ip else ''}({ctx}, {s[0]}, {s[1]})"
    if op is Op.ADD1:
        return f"gl.add1({ctx}, {s[0]}, {s[1]}, inplace={ip})"
    if op in (Op.SQR, Op.SQRT, Op.LOG, Op.DUP):
        return f"gl.{op.name.lower()}({ctx}, {s[0]}, inplace={ip})"
    if op is Op.SUM_ROWS:
        return f"gl.sum_rows({ctx}, {s[0]})"
    if op is Op.CONCAT:
        return f"gl.concat({ctx}, {s[0]}, {s[1]}, {p[0]})"
    if op in (Op.NORM, Op.RMS_NORM):
        return f"gl.{op.name.lower()}({ctx}, {s[0]}, {f(0)}, inplace={ip})"
    if op is Op.MUL_MAT:
        return f"gl.mul_mat({ctx}, {s[0]}, {s[1]})"
    if op is Op.SCALE:
        return f"gl.scale({ctx}, {s[0]}, {f(0)}, inplace={ip})"
    if op is Op.CPY:
        return f"gl.cpy({ctx}, {s[0]}, {s[1]})"
    if op is Op.CONT:
        return f"gl.cont_4d({ctx}, {s[0]}, {', '.join(map(str, t.ne))})"
    if op is Op.RESHAPE:
        return f"gl.reshape_4d({ctx}, {s[0]}, {', '.join(map(str, t.ne))})"
    if op is Op.VIEW:
        return (f"gl.view_4d({ctx}, {s[0]}, {', '.join(map(str, t.ne))}, {', '.join(map(str, t.nb[1:]))}, "
                f"{_size_t(p, 0)})")
    if op is Op.PERMUTE:
        return f"gl.permute({ctx}, {s[0]}, {', '.join(map(str, p[:4]))})"
    if op is Op.TRANSPOSE:
        return f"gl.transpose({ctx}, {s[0]})"
    if op is Op.GET_ROWS:
        return f"gl.get_rows({ctx}, {s[0]}, {s[1]})"
    if op in (Op.DIAG_MASK_INF, Op.DIAG_MASK_ZERO):
        return f"gl.{op.name.lower()}({ctx}, {s[0]}, {p[0]}, inplace={ip})"
    if op is Op.SOFT_MAX:
        mask = s[1] if len(s) > 1 else "None"
        return f"gl.soft_max_ext({ctx}, {s[0]}, {mask}, {f(0)}, {f(1)}, inplace={ip})"
    if op is Op.ROPE:
        c = s[2] if len(s) > 2 else "None"
        return (f"gl.rope_ext({ctx}, {s[0]}, {s[1]}, {c}, {p[1]}, {p[2]}, {p[4]}, "
                f"{', '.join(f(i) for i in range(5, 11))}, inplace={ip})")
    if op is Op.UNARY:
        return f"gl.unary({ctx}, {s[0]}, gl.UnaryOp.{t.unary_op.name}, inplace={ip})"
    return f"None  # {op.name}"


def check_random_graph(rg: RandomGraph) -> list:
    """Plan `rg` with ggml (first: the mirror reads only structure) and with ggml_lite; return the
    differences (`compare_plans`)."""
    ref = ggml_plan(rg.graph, rg.roots, rg.preallocated)
    mine = lite_plan(rg.graph, list(ref["offsets"]))
    return compare_plans(mine, ref)


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
    g = _need_ggml()
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


# ---------------------------------------------------------------------------------------------
# compute: run mirrored graphs on ggml's CPU backend (the CPU kernels' differential tests)
# ---------------------------------------------------------------------------------------------

def graph_data_tensors(graph) -> list:
    """The tensors whose contents a caller provides before computing `graph` (chapter 11's
    `planners.data_tensors`: leafs and op-NONE nodes, views excluded, in graph order)."""
    from ggml_lite.planners import data_tensors

    return data_tensors(graph)


class _Computation:
    """A mirrored graph planned by ggml (`ggml_gallocr_alloc_graph` on the CPU buffer type), its data
    tensors filled, and a CPU backend (`ggml_backend_cpu_init`, `n_threads` threads)."""

    def __init__(self, graph, roots, preallocated, data, n_threads: int):
        g = self.g = _need_ggml()
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


class GGMLAbort(RuntimeError):
    """The real ggml aborted (a `GGML_ASSERT` failed) in an isolated run; the message has its stderr."""


def run_isolated(fn, *args, timeout: float = 120.0, **kwargs):
    """`fn(*args, **kwargs)` in a forked child process; its (picklable) result comes back through a
    pipe. A `GGML_ASSERT` in ggml aborts only the child and becomes `GGMLAbort` here; an exception in
    the child becomes `GGMLAbort` with its text. POSIX only."""
    import os
    import pickle
    import select
    import signal
    import time

    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, send the pickled result, leave without cleanup
        code = 0
        try:
            os.close(r_out)
            os.close(r_err)
            os.dup2(w_err, 2)
            os.environ["GGML_NO_BACKTRACE"] = "1"  # no gdb backtrace on abort
            payload = pickle.dumps(fn(*args, **kwargs))
            with os.fdopen(w_out, "wb") as f:
                f.write(payload)
        except BaseException as err:  # noqa: BLE001 - everything goes to the parent
            try:
                os.write(w_err, f"{type(err).__name__}: {err}\n".encode())
            except OSError:
                pass
            code = 3
        os._exit(code)
    os.close(w_out)
    os.close(w_err)
    chunks = {r_out: [], r_err: []}
    open_fds = set(chunks)
    deadline = time.monotonic() + timeout
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                raise GGMLAbort(f"{getattr(fn, '__name__', fn)} did not finish within {timeout} s")
            ready, _, _ = select.select(list(open_fds), [], [], left)
            for fd in ready:
                b = os.read(fd, 1 << 20)
                if b:
                    chunks[fd].append(b)
                else:
                    os.close(fd)
                    open_fds.discard(fd)
    finally:
        for fd in open_fds:
            os.close(fd)
        _, status = os.waitpid(pid, 0)
    err_text = b"".join(chunks[r_err]).decode(errors="replace").strip()
    if os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0:
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit status {os.WEXITSTATUS(status)}"
        raise GGMLAbort(f"{getattr(fn, '__name__', fn)} failed in the child ({how}): {err_text[-2000:]}")
    return pickle.loads(b"".join(chunks[r_out]))


def run_batch(fn, arg_tuples: list, timeout: float = 600.0) -> list:
    """`[fn(*args) for args in arg_tuples]` in ONE forked child (a process per batch, not per graph).
    Each entry of the result is the value, or a `GGMLAbort` when that call raised. Should ggml abort
    the child (a failed `GGML_ASSERT` kills the whole process), the batch is run again one child per
    call, so the abort is pinned on the call that caused it."""
    def each():
        out = []
        for args in arg_tuples:
            try:
                out.append(fn(*args))
            except Exception as err:  # noqa: BLE001 - reported per call
                out.append(GGMLAbort(f"{type(err).__name__}: {err}"))
        return out

    try:
        return run_isolated(each, timeout=timeout)
    except GGMLAbort:
        out = []
        for args in arg_tuples:
            try:
                out.append(run_isolated(fn, *args))
            except GGMLAbort as err:
                out.append(err)
        return out


# -- random graphs whose values can be compared with ggml 0.15.3 exactly ---------------------------

class _ComputeBuilder(_Builder):
    """`_Builder` with the op mix restricted to ops whose values ggml 0.15.3 computes exactly like the
    reference (for whole-graph value comparisons):

    * rope in NeoX mode only: ggml 0.15.3's normal-mode rope rounds some rotated pairs differently
      (its C++ `rotate_pairs` is compiled with another FMA contraction); NeoX is bit-identical;
    * rms_norm instead of norm: ggml 0.15.3 computes norm's mean and variance another way
      (`ggml_vec_cvar_f32`);
    * f32 mul_mat only when K is a multiple of 32: the leftover elements of ggml 0.15.3's
      `ggml_vec_dot_f32` are summed differently (f16 weights instead);
    * an operand whose elements are not contiguous (nb[0] != element size, e.g. a transposed view) is
      made contiguous first: most kernels assert nb[0] == element size (ggml aborts, ggml_lite raises);
    * rope gets a fresh input when the row length is odd (ggml would copy the unrotated tail in pairs,
      one element past the row).

    The decisions consume the same `choose` calls as `_Builder`, so graphs stay shrinkable."""

    def value(self):
        t = super().value()
        if t.nb[0] != t.type.type_size:
            t = gl.cont(self.cctx, t)
            self.pool.append(t)
        return t

    def op(self, kind: str):
        if kind == "norm":
            a = self.value()
            self.pick((gl.rms_norm, gl.norm))  # the choice is drawn, rms_norm is used
            return gl.rms_norm(self.cctx, a, self.pick((1e-5, 1e-6)), inplace=self.coin(1, 4))
        return super().op(kind)

    def mul_mat(self, x):
        if x.ne[0] % 32 == 0 and self.coin(1, 2):
            type = self.pick((F32, F16, Q8_0))
        else:
            type = self.pick((F32, F16))
            if x.ne[0] % 32:
                type = F16
        if self.coin(1, 5) and x.ne[0] % 32 == 0:
            cands = [t for t in self.pool if t.ne[0] == x.ne[0] and not gl.is_transposed(t)
                     and t.nb[0] == t.type.type_size and x.ne[2] % t.ne[2] == 0 and x.ne[3] % t.ne[3] == 0]
            if cands:
                return gl.mul_mat(self.cctx, self.pick(cands), x)
        ne2 = self.pick([d for d in (1, x.ne[2]) if x.ne[2] % d == 0])
        w = self.weight(type, [x.ne[0], self.pick((1, 8, 16, 32, 64, 100)), ne2, 1])
        return gl.mul_mat(self.cctx, w, x)

    def rope(self, a):
        if a.ne[0] < 2 or a.ne[0] % 2:  # an odd row cannot be roped (ggml would write past it)
            a = self.new_input([self.pick((8, 16, 64)), self.pick((1, 2, 4)), self.pick((1, 3)), 1])
        pos = next((t for t in reversed(self.cctx.tensors)
                    if t.type is I32 and t.op is Op.NONE and list(t.ne) == [a.ne[2], 1, 1, 1]), None)
        if pos is None or self.coin(1, 3):
            pos = self.new_input([a.ne[2]], I32)
        n_dims = 2 * (1 + self.pick_index(a.ne[0] // 2))
        self.pick((0, 2))  # the mode is drawn, NeoX (2) is used
        return gl.rope_ext(self.cctx, a, pos, None, n_dims, 2, self.pick((0, 512, 4096)), 10000.0, 1.0,
                           0.0, 1.0, 32.0, 1.0, inplace=self.coin(1, 5))


def build_compute_graph(choose, max_ops: int = 40, label: str = "compute") -> RandomGraph:
    """`build_random_graph` with `_ComputeBuilder`'s restricted op mix (see its docstring)."""
    global _Builder
    saved = _Builder
    _Builder = _ComputeBuilder  # build_random_graph looks the builder class up by name
    try:
        return build_random_graph(choose, max_ops, label)
    finally:
        _Builder = saved


def compute_graph(seed: int, max_ops: int = 40) -> RandomGraph:
    """`build_compute_graph` fed by `random.Random(seed)`."""
    rng = random.Random(seed)
    return build_compute_graph(lambda n: rng.randrange(n), max_ops, f"compute seed {seed}")


def compute_graphs(max_ops: int = 40):
    """The hypothesis strategy of `build_compute_graph` graphs."""
    from hypothesis import strategies as st

    @st.composite
    def _graphs(draw):
        return build_compute_graph(lambda n: draw(st.integers(0, n - 1)), max_ops, "hypothesis compute")

    return _graphs()


# -- whole numeric graphs: MLPs and attention stacks with softmax heads (issue 22) -------------------
#
# The default (numpy) tier states a tolerance against ggml for whole graphs. These builders make the
# graphs that tolerance is measured on (`benchmarks/numerics_tolerance.py`) and tested with
# (`tests/differential/test_numerics_graphs.py`): graphs of the kind the `numerics` files record (every leaf of one
# compute context flagged INPUT and filled by the numerics generator of tests/fixtures/README.md),
# weights as leafs of that context, uniform [-1, 1) data, unscaled, as the generator gives it.

@dataclass
class NumericGraph:
    """A whole graph to compute: one compute context, its leafs filled by the numerics generator
    (`ranges`: [lo, hi) of the integer leafs by name), `roots` as given to build_forward_expand."""

    graph: object
    roots: list
    ctx: object
    ranges: dict
    label: str

    @property
    def weight_types(self) -> set:
        """The types of the mul_mat weights (src0 leafs)."""
        return {n.src[0].type.name for n in self.graph.nodes if n.op is Op.MUL_MAT and n.src[0].op is Op.NONE}

    def results(self) -> list:
        """What a `numerics` file records: every OUTPUT node and the final node, in node order."""
        nodes = self.graph.nodes
        return [t for t in nodes if t.flags & TensorFlag.OUTPUT or t is nodes[-1]]

    def mixed(self) -> bool:
        """Does an f16 or quantized tensor take part (`numerics.verify_numerics`'s test)?"""
        return any(t.type.name != "f32" and t.type is not I32 for t in self.ctx.tensors)


def _leaf(ctx, type, ne, name):
    t = ctx.new_tensor(type, ne, name=name)
    gl.set_input(t)  # numeric graphs flag every leaf INPUT (tests/fixtures/README.md)
    return t


def _finish(ctx, out, ranges, label, outputs=()) -> NumericGraph:
    for t in (*outputs, out):
        gl.set_output(t)
    graph = gl.build_forward(out)
    return NumericGraph(graph, [out], ctx, ranges, label)


def mlp_graph(width: int, n_layers: int, n_tokens: int, wtype, act: str = "gelu", n_out: int = 32,
              scaled: bool = False) -> NumericGraph:
    """x [width, n_tokens] -> n_layers x (act(W·h + b)) -> soft_max(W_out·h): an MLP with a softmax
    head (as fixture 01); `scaled`: each pre-activation scaled by 1/sqrt(width)."""
    ctx = gl.Context("compute")
    h = _leaf(ctx, F32, [width, n_tokens], "x")
    for i in range(n_layers):
        w = _leaf(ctx, wtype, [width, width], f"w{i}")
        b = _leaf(ctx, F32, [width, 1], f"b{i}")
        z = gl.mul_mat(ctx, w, h)
        if scaled:
            z = gl.scale(ctx, z, 1.0 / math.sqrt(width))
        h = getattr(gl, act)(ctx, gl.add(ctx, z, b))
        h.set_name(f"h{i}")
    logits = gl.mul_mat(ctx, _leaf(ctx, wtype, [width, n_out], "w_out"), h).set_name("logits")
    probs = gl.soft_max(ctx, logits).set_name("probs")
    label = f"mlp {n_layers}x{width} {act} tokens={n_tokens} w={wtype.name}{' scaled' if scaled else ''}"
    return _finish(ctx, probs, {}, label, [logits])


def attention_graph(n_embd: int, n_head: int, n_head_kv: int, n_tokens: int, n_layers: int, wtype,
                    kv_type=F32, mask_type=F32, rope_mode: int = 2, n_ff: int = None, n_vocab: int = 64) -> NumericGraph:
    """A LLaMA-like stack without a KV cache: per layer rms_norm·g, Q/K/V mul_mats (`wtype`), rope_ext
    (`rope_mode`: 0 normal, 2 NeoX) on Q and K, K and V stored as `kv_type` (a cpy, as into a cache),
    KQ = mul_mat(K, Q) (GQA when n_head_kv < n_head), soft_max_ext with a `mask_type` mask and scale
    1/sqrt(head_dim), KQV, the output projection and residual, a SiLU-gated FFN and residual; then a
    rms_norm'd vocabulary projection and its soft_max."""
    ctx = gl.Context("compute")
    hd = n_embd // n_head
    n_ff = n_ff or 2 * n_embd
    T = n_tokens
    x = _leaf(ctx, F32, [n_embd, T], "inp_embd")
    pos = _leaf(ctx, I32, [T], "inp_pos")
    mask = _leaf(ctx, mask_type, [T, T], "kq_mask")

    def w(name, n_in, n_out):
        return _leaf(ctx, wtype, [n_in, n_out], name)

    def normed(h, name):
        return gl.mul(ctx, gl.rms_norm(ctx, h, 1e-5), _leaf(ctx, F32, [n_embd, 1], name))

    def rope(t):
        return gl.rope_ext(ctx, t, pos, None, hd, rope_mode, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)

    def stored(t):  # K and V as a cache holds them
        return t if kv_type is F32 else gl.cpy(ctx, t, ctx.new_tensor(kv_type, list(t.ne[:3]), name=f"{t.name}_cache"))

    for il in range(n_layers):
        cur = normed(x, f"blk.{il}.attn_norm")
        q = rope(gl.reshape_3d(ctx, gl.mul_mat(ctx, w(f"blk.{il}.wq", n_embd, n_embd), cur), hd, n_head, T))
        k = rope(gl.reshape_3d(ctx, gl.mul_mat(ctx, w(f"blk.{il}.wk", n_embd, hd * n_head_kv), cur), hd, n_head_kv, T))
        v = gl.reshape_3d(ctx, gl.mul_mat(ctx, w(f"blk.{il}.wv", n_embd, hd * n_head_kv), cur), hd, n_head_kv, T)
        k, v = stored(k.set_name(f"k{il}")), stored(v.set_name(f"v{il}"))
        kq = gl.mul_mat(ctx, gl.permute(ctx, k, 0, 2, 1, 3), gl.permute(ctx, q, 0, 2, 1, 3))
        kq = gl.soft_max_ext(ctx, kq, mask, 1.0 / math.sqrt(hd), 0.0).set_name(f"kq_soft_max{il}")
        vt = gl.cont(ctx, gl.permute(ctx, v, 1, 2, 0, 3))
        kqv = gl.mul_mat(ctx, vt, kq)
        cur = gl.cont_2d(ctx, gl.permute(ctx, kqv, 0, 2, 1, 3), n_embd, T)
        x = gl.add(ctx, x, gl.mul_mat(ctx, w(f"blk.{il}.wo", n_embd, n_embd), cur))
        cur = normed(x, f"blk.{il}.ffn_norm")
        gate = gl.silu(ctx, gl.mul_mat(ctx, w(f"blk.{il}.ffn_gate", n_embd, n_ff), cur))
        up = gl.mul_mat(ctx, w(f"blk.{il}.ffn_up", n_embd, n_ff), cur)
        x = gl.add(ctx, x, gl.mul_mat(ctx, w(f"blk.{il}.ffn_down", n_ff, n_embd), gl.mul(ctx, gate, up)))
        x.set_name(f"l_out{il}")
    logits = gl.mul_mat(ctx, w("output", n_embd, n_vocab), normed(x, "output_norm")).set_name("logits")
    probs = gl.soft_max(ctx, logits).set_name("probs")
    label = (f"attention {n_layers}x{n_embd} heads={n_head}/{n_head_kv} tokens={T} w={wtype.name} "
             f"kv={kv_type.name} mask={mask_type.name} rope={'neox' if rope_mode & 2 else 'normal'}")
    return _finish(ctx, probs, {"inp_pos": (0, 512)}, label, [logits])


def numeric_corpus(n_mlp: int = 48, n_attention: int = 48, seed: int = 22) -> list:
    """A seeded corpus of whole graphs: MLPs of 1-4 layers (widths 32-512, gelu/relu/silu, f32/f16/
    q8_0/q4_0 weights, one in four scaled) and attention stacks of 1-2 layers (widths 64-512, GQA or
    not, f32/f16/q8_0/q4_0 weights, f32/f16 K and V, f32/f16 masks, NeoX or normal rope)."""
    rng = random.Random(seed)
    wtypes = (F32, F16, Q8_0, gl.Q4_0)
    out = []
    for i in range(n_mlp):
        out.append(mlp_graph(rng.choice((32, 64, 128, 256, 512)), 1 + i % 4, rng.choice((1, 4, 8, 16)),
                             wtypes[(i // 4) % 4], rng.choice(("gelu", "relu", "silu")), scaled=rng.random() < 0.25))
    for i in range(n_attention):
        n_embd = rng.choice((64, 128, 256, 512))
        n_head = rng.choice([h for h in (2, 4, 8) if n_embd // h >= 16])
        out.append(attention_graph(n_embd, n_head, rng.choice([d for d in (1, 2, n_head) if n_head % d == 0]),
                                   rng.choice((1, 7, 16, 32)), 1 + i % 2, wtypes[i % 4],
                                   kv_type=rng.choice((F32, F16)), mask_type=rng.choice((F32, F16)),
                                   rope_mode=rng.choice((0, 2))))
    return out


def numerics_data(ng: NumericGraph, seed: int) -> dict:
    """{tensor: bytes} for every tensor the graph reads without computing it, as the numerics generator
    of tests/fixtures/README.md fills it: the fixture id is the tensor's index in its context (the ids
    `graphio.graph_document` gives), f16 rounded, q8_0 by the reference quantizer; q4_0 (which the
    file layout does not cover) by q4_0's reference quantizer."""
    from ggml_lite.numerics import leaf_values
    from ggml_lite.quants import quantize_row_q4_0_ref

    ids = {t: i for i, t in enumerate(ng.ctx.tensors)}
    data = {}
    for t in graph_data_tensors(ng.graph):
        rng = ng.ranges.get(t.name)
        values = leaf_values(seed, ids[t], t.nelements, "int" if t.type is I32 else "float", rng)
        if t.type is gl.Q4_0:
            raw = quantize_row_q4_0_ref(values.reshape(-1, t.ne[0])).tobytes()
        elif t.type is Q8_0:
            from ggml_lite.quants import quantize_q8_0
            raw = quantize_q8_0(values).tobytes()
        else:
            raw = values.astype(np.float16 if t.type is F16 else values.dtype).tobytes()
        data[t] = raw
    return data


def result_values(t, raw: bytes) -> np.ndarray:
    """The f32 values of a result's bytes (f32 or f16 results), in memory order."""
    return np.frombuffer(raw, np.float16 if t.type is F16 else np.float32).astype(np.float32)


def ggml_results(ng: NumericGraph, seed: int) -> list:
    """The bytes of `ng.results()` computed by the real ggml from `numerics_data(ng, seed)` (call it
    through `run_isolated` / `run_batch`: ggml aborts on what it refuses)."""
    return ggml_compute(ng.graph, ng.roots, (), numerics_data(ng, seed), ng.results())


def numerics_document(ng: NumericGraph, seed: int, results: list, fixture: str = "numeric") -> dict:
    """A fixture-schema file of `ng` with the plan the real ggml made and a `numerics` block recording
    `results` (the bytes `ggml_results` returned): the layout of tests/fixtures/README.md."""
    from ggml_lite.graphio import graph_document

    doc = graph_document(ng.graph, [ng.ctx], ng.roots, fixture=fixture, description=ng.label)
    plan = ggml_plan(ng.graph, ng.roots)
    size = plan["reference_buffer_size"]
    # what the reference's debug build logs (ggml-alloc.c:770): the allocator's peak, ggml-python's size
    realloc = (f"ggml_gallocr_reserve_n: reallocating CPU buffer from size 0.00 MiB to "
               f"{plan['buffer_size'] / 1024.0 / 1024.0:.2f} MiB")
    ids = {t: i for i, t in enumerate(ng.ctx.tensors)}
    for entry in doc["graph"]["tensors"]:
        t = ng.ctx.tensors[entry["id"]]
        off = plan["offsets"].get(t)
        # every tensor is the compute context's (ggml_lite may have planned `ng` already: not pre-allocated)
        entry.update(preallocated=False, buffer="compute" if off is not None else None, offset=off)
    doc.update(buffer_type={"name": "CPU", "alignment": ALIGNMENT, "max_size": None, "alloc_size": "ggml_nbytes"},
               external_buffers=[], reserve={"ok": plan["reserve_ok"], "buffer_size": size, "log": [realloc]},
               alloc_graph={"ok": plan["alloc_ok"], "buffer_size": size, "log": []}, buffer_size=size, numeric=True,
               data_generator={"kind": "lcg32", "data_seed": seed})
    leaf_data = []
    for t in graph_data_tensors(ng.graph):
        rng = ng.ranges.get(t.name)
        leaf_data.append({"id": ids[t], "name": t.name, "type": t.type.name,
                          "kind": "int" if t.type is I32 else "float", **({"range": list(rng)} if rng else {})})
    entries = [result_entry(ids[t], t, result_values(t, raw)) for t, raw in zip(ng.results(), results)]
    doc["numerics"] = {"leaf_data": leaf_data, "results": entries}
    return doc


def result_entry(i: int, t, v) -> dict:
    """One `numerics.results` entry (tests/fixtures/README.md) for tensor `t` of fixture id `i` whose
    f32 values are `v`: the values, or past 4096 of them a summary (sums and the first 256)."""
    entry = {"id": i, "name": t.name, "reason": "output" if t.flags & TensorFlag.OUTPUT else "final",
             "type": t.type.name, "ne": list(t.ne), "n_elements": int(v.size)}
    if v.size > 4096:
        v64 = v.astype(np.float64)
        entry.update(summary=True, sum=float(v64.sum()), sum_sq=float((v64 * v64).sum()),
                     first=[float(x) for x in v[:256]])
    else:
        entry["values"] = [float(x) for x in v]
    return entry


class UnconvertedArithmetic(gl.Arithmetic):
    """The numpy tier as it was before issue 22: mul_mat multiplied an f32 src1 in f32, without the
    conversion to the weight's dot type (for measurements and for tests that must see the difference)."""

    name = "numpy-unconverted"

    def to_vec_dot(self, type, y):
        return y


def lite_numeric_results(ng: NumericGraph, seed: int, tiers: dict) -> dict:
    """`ng`'s results computed by ggml_lite as `check` computes them, once per tier: planned once by a
    `GAllocr`, then for each tier ({name: Arithmetic}) the leafs filled from `numerics_data(ng, seed)`
    and the graph computed on a CPU backend with that tier (the exact tier's libm under
    `libm_exact`). Returns {name: [float64 arrays]} in `ng.results()` order; frees the plan."""
    from ggml_lite.exact import ExactArithmetic, libm_exact

    galloc = gl.GAllocr(gl.cpu_buffer_type())
    if not (galloc.reserve(ng.graph) and galloc.alloc_graph(ng.graph)):
        raise RuntimeError(f"{ng.label}: the graph allocator failed")
    data = numerics_data(ng, seed)
    out = {}
    try:
        for name, arith in tiers.items():
            for t, raw in data.items():
                holder = t.view_src.buffer if t.view_src is not None else t.buffer
                holder.set_tensor(t, raw, 0, len(raw))
            with libm_exact(isinstance(arith, ExactArithmetic)):
                gl.CPUBackend(arith=arith).graph_compute(ng.graph)
            out[name] = [gl.tensor_get(t).astype(np.float64).reshape(-1) for t in ng.results()]
    finally:
        galloc.free()
    return out
