"""Random ggml_lite graphs: `build_random_graph(choose)` takes every decision from `choose(n)`;
`random_graph(seed)` feeds it from `random.Random`, `graphs()` is the hypothesis strategy (so hypothesis
can shrink a failing graph); `compute_graph` restricts the op mix to ops ggml 0.15.3 computes exactly like
the reference."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import ggml_lite as gl
from ggml_lite.tensor import Op


@dataclass
class RandomGraph:
    """A random ggml_lite graph and what a planner needs to know about it."""

    graph: gl.Graph
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
        from .source import graph_to_code

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
        self.pool: list[gl.Tensor] = []  # f32 compute values (nodes and inputs) that ops may consume
        self.ops: list[str] = []
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

    def weight_type(self, x):
        """The type of a weight that multiplies `x` (q8_0 only when its rows hold whole blocks)."""
        if x.ne[0] % 32 == 0 and self.coin(1, 2):
            return self.pick((F32, F16, Q8_0))
        return self.pick((F32, F16))

    def multiplies(self, a, x) -> bool:
        """Can the activation `a` be mul_mat's src0 for `x` (broadcast over dims 2, 3)?"""
        return (a.ne[0] == x.ne[0] and not gl.is_transposed(a)
                and x.ne[2] % a.ne[2] == 0 and x.ne[3] % a.ne[3] == 0)

    def mul_mat(self, x):
        type = self.weight_type(x)
        if self.coin(1, 5):
            # activation x activation (like K*Q): `a` from the pool
            cands = [t for t in self.pool if self.multiplies(t, x)]
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

    def ropes(self, a) -> bool:
        """Can `a` be roped as it is (else a fresh input is roped)?"""
        return a.ne[0] >= 2

    def rope_mode(self, drawn: int) -> int:
        """The rope mode used when `drawn` (0 normal, 2 NeoX) was drawn."""
        return drawn

    def rope(self, a):
        if not self.ropes(a):
            a = self.new_input([self.pick((8, 16, 64)), self.pick((1, 2, 4)), self.pick((1, 3)), 1])
        # positions: reuse an i32 input of the right length now and then, like llama.cpp's inp_pos
        pos = next((t for t in reversed(self.cctx.tensors)
                    if t.type is I32 and t.op is Op.NONE and list(t.ne) == [a.ne[2], 1, 1, 1]), None)
        if pos is None or self.coin(1, 3):
            pos = self.new_input([a.ne[2]], I32)
        n_dims = 2 * (1 + self.pick_index(a.ne[0] // 2))
        mode = self.rope_mode(self.pick((0, 2)))
        return gl.rope_ext(self.cctx, a, pos, None, n_dims, mode, self.pick((0, 512, 4096)), 10000.0, 1.0,
                           0.0, 1.0, 32.0, 1.0, inplace=self.coin(1, 5))


def build_random_graph(choose, max_ops: int = 40, label: str = "",
                       builder: type[_Builder] | None = None) -> RandomGraph:
    """A random ggml_lite graph, every decision taken by `choose(n)` (an int in `[0, n)`), by `builder`
    (`_Builder`, or `_ComputeBuilder` for `build_compute_graph`).

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
    b = (builder or _Builder)(choose, max_ops)
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

    def weight_type(self, x):
        type = super().weight_type(x)
        return F16 if x.ne[0] % 32 else type  # (q8_0 is drawn only when x.ne[0] % 32 == 0)

    def multiplies(self, a, x) -> bool:
        return x.ne[0] % 32 == 0 and a.nb[0] == a.type.type_size and super().multiplies(a, x)

    def ropes(self, a) -> bool:
        return a.ne[0] >= 2 and a.ne[0] % 2 == 0  # an odd row cannot be roped (ggml would write past it)

    def rope_mode(self, drawn: int) -> int:
        return 2  # the mode is drawn, NeoX is used


def build_compute_graph(choose, max_ops: int = 40, label: str = "compute") -> RandomGraph:
    """`build_random_graph` with `_ComputeBuilder`'s restricted op mix (see its docstring)."""
    return build_random_graph(choose, max_ops, label, _ComputeBuilder)


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

