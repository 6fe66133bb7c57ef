"""Differential tests: the CPU kernels against the real ggml, through ggml-python 0.0.45 (ggml 0.15.3),
on seeded random graphs.

**Which comparison runs depends on how the oracle was built** (`ggml_oracle.build_info`, which asks
`ggml_cpu_has_avx2`, `ggml_cpu_has_avx512`, ...; the pytest header line says which mode ran).
`make setup` builds ggml-python like the recorded fixtures' ggml (AVX2, FMA, F16C, no AVX-512, no
llamafile), so on any x86-64 machine it sums in the order the exact kernels reproduce and values are
compared bit for bit. An oracle built otherwise (a native build on an AVX-512 machine, arm64) rounds
dot products, silu's and soft_max's vectorised exp and row sums differently in the last bits; then
every comparison below is made within `BUILD_TOL` (normwise: max |a - b| / max |ggml|) instead, and
still fails on any real difference.

Two comparisons, each over at least `N_GRAPHS` graphs (seeds 0, 1, 2, ...; x50 with `--long`). The
graphs go to ggml in batches of `BATCH` per forked child process (`ggml_oracle.run_batch`), so a
GGML_ASSERT fails the test instead of killing it, without a process per graph. A failure names the
seed and prints the graph as ggml_lite code.

* **Lockstep** (`test_lockstep_each_node_matches_ggml`, the full op mix of `ggml_oracle.random_graph`):
  the graph is computed one node at a time on both sides from identical memory (before node i,
  ggml's current bytes of the node's sources and destination are copied into ggml_lite's tensors;
  both planners place tensors identically), so each node is compared on identical inputs and
  nothing accumulates. Bit-exact mode: identical values (NaN matches NaN) for every op, except three
  op families that ggml 0.15.3 computes differently from the reference (llama.cpp daa9623, which the
  kernels follow and the recorded fixtures confirm bit for bit): normal-mode rope (another FMA
  contraction in its C++ `rotate_pairs`), norm (mean and variance via `ggml_vec_cvar_f32`), and f32
  mul_mat whose K is not a multiple of 32 (the leftovers of `ggml_vec_dot_f32`). For those the
  difference must stay within `VERSION_TOL` of the tensor's largest magnitude (normwise: a few ulp of
  the largest value; an elementwise relative bound is meaningless for outputs near zero, which these
  ops produce by cancellation), and a NORM within `norm_tolerance`, which grows with its worst row's
  |mean| / std (one rounding of the mean, amplified by that ratio).

* **Whole graphs** (`test_whole_graphs_match_ggml`, `ggml_oracle.compute_graph`): both sides compute
  the whole graph (ggml_lite: `GAllocr` reserve + alloc_graph, `compute_forward` over `gf.nodes`;
  ggml: `ggml_backend_graph_compute`), with the graph allocator's memory reuse and in-place ops, and
  every result (OUTPUT-flagged nodes and nodes nothing consumes) is compared. Bit-exact mode:
  identical values. Justification: the op mix is restricted to the ops the lockstep test finds
  bit-identical (the three families above are left out or replaced, see `_ComputeBuilder`), so by
  induction over the nodes identical inputs give identical results and no error can accumulate. With
  the full mix a whole graph cannot have a finite tolerance: one 1-ulp difference from norm becomes a
  13 % difference in log(sum_rows(norm(x))) (cancellation). For the same reason, in tolerance mode a
  result beyond `BUILD_TOL` is accepted only when the lockstep of that graph finds every node within
  it (counted in the report).

Transcendental functions are evaluated with the C library (`libm_exact`), as the real ggml does on
this machine, so they are part of the exact comparison. Graphs that the reference ggml could not
compute (a kernel raises: ggml would abort) or that ggml 0.15.3 refuses (its element-wise kernels
assert nb[0] == sizeof(float) even for one-element rows; the reference only did so in debug builds;
and a node computing into a destination whose elements overlap, which ggml leaves undefined: its
threads write the overlapping rows in no order) are counted and skipped.
"""

import collections
import math
import time
import zlib
from collections.abc import Callable

import numpy as np
import pytest

import ggml_lite as gl
import ggml_oracle as O
from ggml_lite.exact import compute_forward_exact as compute_forward  # bit-exact where the build matches
from ggml_lite.exact import libm_exact
from ggml_lite.quants import Q8_0_DTYPE, dequantize_row_q8_0, quantize_row_q4_0_ref, quantize_row_q8_0_ref
from ggml_lite.tensor import VIEW_OPS, Op, TensorFlag
from ggml_oracle import normwise_error, version_dependent
from helpers import leaf_data

pytestmark = pytest.mark.skipif(
    not O.available(), reason=f"the real ggml is not available: `import ggml` (ggml-python) failed: {O.IMPORT_ERROR}")

N_GRAPHS = 200          # graphs that must be compared (not skipped) per test
LONG_FACTOR = 50        # `--long` (make test-long) compares 50x as many
BATCH = 25              # graphs computed by ggml in one forked child
MAX_SEED = 10**7        # seeds tried before a test gives up finding enough comparable graphs
VERSION_TOL = 1e-6      # normwise tolerance of the three version-dependent op families (worst seen: 5.9e-7)
ELEMENTWISE = frozenset({Op.SQR, Op.SQRT, Op.LOG, Op.UNARY, Op.LEAKY_RELU})
REPORT: dict = {}       # test name -> counters and worst errors (printed by `python test_compute_differential.py`)


# What the comparison may expect of the installed oracle (ggml_oracle.build_info). Built like
# the recorded fixtures (AVX2/FMA/F16C, no AVX-512: `make setup` pins that build), ggml sums in the
# order the exact kernels reproduce and values must be identical. Built otherwise (a native AVX-512
# build, arm64 NEON, ...), every node is compared within BUILD_TOL instead, normwise (max |a - b| over
# max |ggml|) on identical inputs: dot products, the vectorised exp of silu and soft_max and other row
# reductions round differently in the last bits (worst node seen with a native AVX-512 build: 1.2e-6).
EXACT_ORDER = O.available() and O.sums_in_reproduced_order()
BUILD_TOL = 1e-5
ORACLE_MODE = "oracle sums in the reproduced order: bit-exact" if EXACT_ORDER else \
    f"oracle built otherwise: within {BUILD_TOL:g} normwise"


# -- data -------------------------------------------------------------------------------------------

def self_overlapping(t) -> bool:
    """Do two elements (blocks, when quantized) of `t` share a byte? (a view with nb[1] < ne[0]*nb[0],
    say: a [3, 12] view with nb = [4, 4, ...] maps its 36 elements onto 14 floats)."""
    ne0 = t.ne[0] // t.type.blck_size
    offs = np.zeros(1, np.int64)
    for n, nb in zip((ne0, *t.ne[1:]), t.nb):
        offs = (offs[:, None] + np.arange(n, dtype=np.int64)[None, :] * nb).reshape(-1)
    offs.sort()
    return bool(np.any(np.diff(offs) < t.type.type_size))


def ggml_accepts(graph) -> bool:
    """ggml 0.15.3 asserts nb[0] == sizeof(float) in its element-wise kernels (unary-ops.cpp) even
    for rows of one element; the reference checked that only in debug builds."""
    return not any(n.op in ELEMENTWISE and (n.nb[0] != 4 or n.src[0].nb[0] != 4) for n in graph.nodes)


def ggml_defines(graph) -> bool:
    """False when a node computes into a destination whose elements overlap each other. ggml leaves
    that undefined: its kernels split the rows among the threads, which write them in no order, so
    the bytes depend on the thread count and the race (and, with one thread, on each kernel's loop
    order: an in-place ADD1 adds the scalar once per row that covers a float), while ggml_lite's
    kernels read every source before they write (seed 519 of the --long lockstep sweep)."""
    return not any(n.op not in VIEW_OPS and self_overlapping(n) for n in graph.nodes)


def results_of(graph) -> list:
    """The nodes whose final bytes are results: OUTPUT-flagged nodes and nodes that nothing consumes."""
    used = {s for n in graph.nodes for s in (*n.src, n.view_src) if s is not None}
    return [n for n in graph.nodes if (n.flags & TensorFlag.OUTPUT) or n not in used]


def values(t, raw: bytes) -> np.ndarray:
    if t.type is gl.F32:
        with np.errstate(invalid="ignore"):  # a signalling NaN raises FE_INVALID when widened
            return np.frombuffer(raw, np.float32).astype(np.float64)
    if t.type is gl.F16:
        return np.frombuffer(raw, np.float16).astype(np.float64)
    if t.type is gl.I32:
        return np.frombuffer(raw, np.int32).astype(np.float64)
    if t.type is gl.Q8_0:
        return dequantize_row_q8_0(np.frombuffer(raw, Q8_0_DTYPE)[None]).astype(np.float64).reshape(-1)
    raise TypeError(t.type.name)


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


def op_label(node) -> str:
    return node.unary_op.name.lower() if node.op is Op.UNARY else node.op.name.lower()


# -- ggml_lite side ---------------------------------------------------------------------------------

def plan_and_fill(rg, data):
    galloc = gl.GAllocr(gl.cpu_buffer_type())
    assert galloc.reserve(rg.graph) and galloc.alloc_graph(rg.graph)
    for t, raw in data.items():
        holder = t.view_src.buffer if t.view_src is not None else t.buffer
        holder.set_tensor(t, raw, 0, len(raw))
    return galloc


def lite_bytes(t) -> bytes:
    holder = t.view_src.buffer if t.view_src is not None else t.buffer
    return holder.get_tensor(t, 0, gl.nbytes(t))


def lite_compute(rg, data):
    """Plan, fill and compute the whole graph with ggml_lite; returns the allocator (to free)."""
    galloc = plan_and_fill(rg, data)
    try:
        for node in rg.graph.nodes:
            compute_forward(node)
    except BaseException:
        galloc.free()
        raise
    return galloc


# -- the tests --------------------------------------------------------------------------------------

def _report(rg, lines) -> str:
    return "\n".join([rg.describe(), *lines, "reproducer:", rg.source()])


def _prepared(build, seed, stats):
    """(graph, data, allocator) of the graph `build(seed)` planned, filled and (whole graphs) computed
    by ggml_lite, or None (counted) when ggml 0.15.3 would assert on it, leaves its result undefined
    (`ggml_defines`), or the kernels refuse it, as the reference ggml would abort on it."""
    rg = build(seed)
    stats["graphs built"] += 1
    if not ggml_accepts(rg.graph):
        stats["skipped: ggml 0.15.3 asserts"] += 1
        return None
    if not ggml_defines(rg.graph):
        stats["skipped: a destination overlaps itself (undefined in ggml)"] += 1
        return None
    data = leaf_data(rg.graph, seed)
    try:
        galloc = lite_compute(rg, data)
    except gl.GGMLLiteError as err:
        stats[f"skipped: {type(err).__name__}"] += 1
        return None
    return rg, data, galloc


def _batches(build, n_wanted, stats, call_ggml):
    """Yield (seed, rg, data, ggml's answer) for seeded graphs `build(0)`, `build(1)`, ... until
    `n_wanted` graphs could be compared: ggml_lite plans and computes `BATCH` graphs, then one forked
    child runs ggml on all of them (`ggml_oracle.run_batch`). ggml_lite's allocators are freed after
    the batch. A graph on which ggml aborts fails the test with its reproducer."""
    seed = compared = 0
    while compared < n_wanted:
        batch = []
        with libm_exact():
            while len(batch) < BATCH and seed < MAX_SEED:
                got = _prepared(build, seed, stats)
                if got is not None:
                    batch.append((seed, *got))
                seed += 1
            answers = O.run_batch(call_ggml, [(rg, data) for _, rg, data, _ in batch])
        try:
            for (sd, rg, data, _), answer in zip(batch, answers):
                assert not isinstance(answer, O.GGMLAbort), _report(rg, [f"seed {sd}: ggml failed: {answer}"])
                yield sd, rg, data, answer
                compared += 1
        finally:
            for *_, galloc in batch:
                galloc.free()
        assert seed < MAX_SEED, f"only {compared} of {n_wanted} graphs were comparable: {dict(stats)}"


def norm_tolerance(node, source_bytes) -> float:
    """The version tolerance of a NORM node given its input's bytes: ggml 0.15.3 and the reference
    compute the mean and variance in other orders, and one rounding of the mean (relative 2^-23) moves
    the output of a row by about 2^-23 · |mean| / std of that row; the mean is a sum of ne0 roundings, whose
    error grows like sqrt(ne0) of them; so the tolerance is `max(VERSION_TOL, 2^-23 · sqrt(ne0) · max over
    rows of |mean| / std)`. (Seed 827 under --long: a row of mean 0.69 and std 0.009, |mean| / std = 84,
    differs by 1.9e-6 where 1e-6 held for every well-conditioned row; seed 4284: 50 values, |mean| / std
    = 52, 2.25e-5, 3.6 roundings of the mean.) `source_bytes` are the bytes of the input's root tensor (its
    view source, or itself); `VERSION_TOL` alone when they are unknown or the input is not f32."""
    src = node.src[0]
    off = src.view_offs if src.view_src is not None else 0
    end = off + sum((n - 1) * b for n, b in zip(src.ne, src.nb)) + 4
    if source_bytes is None or src.type is not gl.F32 or end > len(source_bytes):
        return VERSION_TOL
    x = np.ndarray(tuple(reversed(src.ne)), np.float32, source_bytes, off, tuple(reversed(src.nb)))
    x = x.astype(np.float64).reshape(-1, src.ne[0])
    with np.errstate(all="ignore"):  # rows with inf or NaN: their condition is NaN, left out below
        mean, std = x.mean(axis=1), x.std(axis=1)
        # a row whose values are all equal (std 0, mean not 0) normalizes to rounding noise on both sides:
        # its condition is infinite and any output is ggml's (seed 14099: six equal values)
        cond = np.where(std > 0, np.abs(mean) / std, np.where(mean != 0, np.inf, 0.0))
    cond = cond[~np.isnan(cond)]
    worst = float(cond.max()) if cond.size else 0.0
    return max(VERSION_TOL, 2.0**-23 * math.sqrt(src.ne[0]) * worst)


def _node_problem(node, mine, theirs, stats, worst, version_tol: float = VERSION_TOL) -> str:
    """'' when ggml_lite's bytes of `node` are acceptable against ggml's, else what is wrong. Bit-exact
    oracle: identical values, except the version-dependent families within `version_tol` (`VERSION_TOL`,
    or a NORM's `norm_tolerance`). Another oracle build: every node within `BUILD_TOL` (normwise, on
    identical inputs)."""
    if mine == theirs:
        return ""
    a, b = values(node, mine), values(node, theirs)
    if same_values(a, b):
        return ""  # NaN payloads may differ
    family = version_dependent(node) if EXACT_ORDER else "build order"
    tol = version_tol if EXACT_ORDER else BUILD_TOL
    err = normwise_error(a, b)
    if family and err <= tol:
        worst[family] = max(worst[family], err)
        stats[f"nodes within tolerance: {family}"] += 1
        return ""
    n_diff = int(np.sum(~((a == b) | (np.isnan(a) & np.isnan(b)))))
    limit = f"tolerance {tol}" if family else "must be identical"
    return (f"node {op_label(node)} {gl.describe(node)}: {n_diff} of {a.size} values differ, "
            f"normwise error {err:.3g} ({limit})")


def _lockstep_in_ggml(rg, data):
    return O.ggml_lockstep(rg.graph, rg.roots, rg.preallocated, data, compute_forward)


def _whole_in_ggml(rg, data):
    return O.ggml_compute(rg.graph, rg.roots, rg.preallocated, data, results_of(rg.graph))


def test_lockstep_each_node_matches_ggml(long_run):
    """Every node of `N_GRAPHS` random graphs (the full op mix), computed on identical inputs on both
    sides, agrees with ggml (see the module docstring for the tolerances)."""
    stats, worst = collections.Counter(), collections.defaultdict(float)
    t0 = time.perf_counter()
    n = N_GRAPHS * (LONG_FACTOR if long_run else 1)
    for seed, rg, data, steps in _batches(O.random_graph, n, stats, _lockstep_in_ggml):
        bad, seen = [], {}  # seen: ggml's bytes of each node computed so far (a later node's input)
        for i, mine, theirs in steps:
            stats["nodes"] += 1
            node = rg.graph.nodes[i]
            tol = VERSION_TOL
            if node.op is Op.NORM:
                root = node.src[0].view_src or node.src[0]
                tol = norm_tolerance(node, seen.get(root, data.get(root)))
            problem = _node_problem(node, mine, theirs, stats, worst, tol)
            seen[node] = theirs
            if problem:
                bad.append(f"node {i}: {problem}")
        stats["graphs compared"] += 1
        assert not bad, _report(rg, [f"seed {seed} ({ORACLE_MODE}):", *bad])
    REPORT["lockstep"] = dict(stats, seconds=round(time.perf_counter() - t0, 1), worst=dict(worst), mode=ORACLE_MODE)


def test_whole_graphs_match_ggml(long_run):
    """The results of `N_GRAPHS` random graphs of the restricted mix, each computed whole on both sides
    (memory reuse and in-place ops included), agree with ggml. Bit-exact oracle: identical values.
    Another build: within `BUILD_TOL`; a result beyond it must be explained by the lockstep of the same
    graph (every node within `BUILD_TOL` on identical inputs: the difference grew by cancellation)."""
    stats, worst = collections.Counter(), collections.defaultdict(float)
    t0 = time.perf_counter()
    n = N_GRAPHS * (LONG_FACTOR if long_run else 1)
    for seed, rg, data, theirs in _batches(O.compute_graph, n, stats, _whole_in_ggml):
        res = results_of(rg.graph)
        bad = []
        for t, a_raw, b_raw in zip(res, [lite_bytes(t) for t in res], theirs):
            stats["results"] += 1
            if a_raw == b_raw:
                stats["results bit-identical"] += 1
                continue
            a, b = values(t, a_raw), values(t, b_raw)
            err = normwise_error(a, b)
            if same_values(a, b) or (not EXACT_ORDER and err <= BUILD_TOL):
                worst["results"] = max(worst["results"], 0 if same_values(a, b) else err)
                continue
            limit = "must be identical" if EXACT_ORDER else f"tolerance {BUILD_TOL}"
            bad.append(f"result {op_label(t)} {gl.describe(t)}: normwise error {err:.3g} ({limit})")
        if bad and not EXACT_ORDER:
            bad = _unexplained(rg, data, bad, stats)
        stats["graphs compared"] += 1
        stats["nodes"] += rg.graph.n_nodes
        assert not bad, _report(rg, [f"seed {seed} ({ORACLE_MODE}):", *bad])
    REPORT["whole graphs"] = dict(stats, seconds=round(time.perf_counter() - t0, 1), worst=dict(worst),
                                  mode=ORACLE_MODE)


def _unexplained(rg, data, bad, stats) -> list:
    """`bad` unless the lockstep of the same graph finds every node within `BUILD_TOL` (the graph is
    still planned in ggml_lite's memory: the lockstep copies ggml's bytes in before every node)."""
    with libm_exact():
        steps = O.run_isolated(_lockstep_in_ggml, rg, data)
    node_bad = [p for i, mine, theirs in steps
                if (p := _node_problem(rg.graph.nodes[i], mine, theirs, collections.Counter(),
                                       collections.defaultdict(float)))]
    if node_bad:
        return bad + ["the lockstep of this graph finds:", *node_bad]
    stats["graphs whose results grew beyond the tolerance by cancellation (lockstep within it)"] += 1
    return []


def test_a_wrong_node_fails_in_either_mode():
    """The node comparison rejects a result 1e-4 off (relative) whichever way the oracle was built: the
    tolerance of the other-build mode is 10x below that."""
    ctx = gl.Context("cmp")
    y = gl.silu(ctx, _x(ctx, [64, 2]))
    theirs = np.linspace(-1, 1, 128, dtype=np.float32)
    mine = theirs * np.float32(1 + 1e-4)
    stats, worst = collections.Counter(), collections.defaultdict(float)
    assert _node_problem(y, theirs.tobytes(), theirs.tobytes(), stats, worst) == ""
    assert "values differ" in _node_problem(y, mine.tobytes(), theirs.tobytes(), stats, worst)
    assert BUILD_TOL < 1e-4


def test_whole_graph_comparison_can_fail():
    """The whole-graph check notices a one-ulp change: give ggml_lite one input value one ulp larger
    than ggml gets, and some result differs."""
    for seed in range(50):
        rg = O.compute_graph(seed)
        gf = rg.graph
        data = leaf_data(gf, seed)
        f32_inputs = [t for t in data if t.type is gl.F32 and t.nelements]
        if not ggml_accepts(gf) or not f32_inputs:
            continue
        bumped = dict(data)
        v = np.frombuffer(data[f32_inputs[0]], np.float32).copy()
        v[0] = np.nextafter(v[0], np.float32(2))
        bumped[f32_inputs[0]] = v.tobytes()
        res = results_of(gf)
        with libm_exact():
            try:
                galloc = lite_compute(rg, bumped)
            except gl.GGMLLiteError:
                continue
        mine = [lite_bytes(x) for x in res]
        galloc.free()
        theirs = O.run_isolated(O.ggml_compute, gf, rg.roots, rg.preallocated, data, res)
        if any(not same_values(values(x, a), values(x, b)) for x, a, b in zip(res, mine, theirs)):
            return
    pytest.fail("no graph showed the perturbation")


def test_q8_0_conversion_is_the_simd_one():
    """mul_mat converts f32 src1 rows to q8_0 with `quantize_row_q8_0` (AVX2: id = 127/amax, ties to
    even), not with the reference quantizer (id = 1/d, ties away from zero), and so does cpy into a
    q8_0 tensor. A block whose amax is 127 has id = 1 in both, so 2.5 becomes 2 (even) in the SIMD
    quantizer and 3 in the reference; the real ggml's results show which one ran."""
    ctx = gl.Context("q8")
    w = ctx.new_tensor_2d(gl.Q8_0, 32, 1, name="w")
    x = ctx.new_tensor_2d(gl.F32, 32, 1, name="x")
    y = gl.mul_mat(ctx, w, x)
    gf = gl.build_forward(y)
    wv = np.zeros(32, np.float32)
    wv[1] = 1.0  # w = e1 after quantization (d = 1/127, q[1] = 127)
    xv = np.zeros(32, np.float32)
    xv[0], xv[1] = 127.0, 2.5
    data = {w: quantize_row_q8_0_ref(wv[None]).tobytes(), x: xv.tobytes()}
    (theirs,) = O.run_isolated(O.ggml_compute, gf, [y], (), data, [y])
    galloc = lite_compute(O.RandomGraph(gf, [y], [ctx], []), data)
    mine = lite_bytes(y)
    galloc.free()
    got = np.frombuffer(theirs, np.float32)[0]
    if EXACT_ORDER:
        assert np.frombuffer(mine, np.float32)[0] == got
    assert abs(np.frombuffer(mine, np.float32)[0] - got) <= BUILD_TOL * abs(got)
    assert abs(got - 2.0) < 0.01, got  # the reference quantizer would give 3.0

    # cpy into a q8_0 tensor uses the same from_float
    ctx = gl.Context("q8cpy")
    a = ctx.new_tensor_1d(gl.F32, 32, name="a")
    q = gl.cpy(ctx, a, ctx.new_tensor_1d(gl.Q8_0, 32, name="q"))
    gf = gl.build_forward(q)
    data = {a: xv.tobytes(), q.src[1]: bytes(gl.nbytes(q))}
    (theirs,) = O.run_isolated(O.ggml_compute, gf, [q], (), data, [q])
    galloc = lite_compute(O.RandomGraph(gf, [q], [ctx], []), data)
    mine = lite_bytes(q)
    galloc.free()
    assert mine == theirs and np.frombuffer(theirs, Q8_0_DTYPE)["qs"][0, 1] == 2


# -- single ops the random mix does not reach ---------------------------------------------------------

def _x(ctx, ne, type=gl.F32, name="x"):
    t = ctx.new_tensor(type, ne, name=name)
    gl.set_input(t)
    return t


def _rope(ctx, x, n_dims, mode, ff=None, n_ctx_orig=4096, freq_scale=1.0, ext_factor=0.0):
    pos = _x(ctx, [x.ne[2]], gl.I32, "pos")
    return gl.rope_ext(ctx, x, pos, ff, n_dims, mode, n_ctx_orig, 10000.0, freq_scale, ext_factor, 1.0, 32.0, 1.0)


def _unary(u: gl.UnaryOp) -> Callable[[gl.Context], gl.Tensor]:
    return lambda ctx: gl.unary(ctx, _x(ctx, [37, 3]), u)


# name -> (builder(ctx) -> result, value range of the f32/f16 inputs)
ZOO: dict[str, tuple[Callable[[gl.Context], gl.Tensor], tuple[float, float]]] = {
    f"unary_{u.name.lower()}": (_unary(u), (-12, 12)) for u in gl.UnaryOp}
ZOO.update({
    "silu_long_rows": (lambda ctx: gl.silu(ctx, _x(ctx, [1003, 4])), (-30, 30)),
    "sqr": (lambda ctx: gl.sqr(ctx, _x(ctx, [37, 3])), (-3, 3)),
    "sqrt": (lambda ctx: gl.sqrt(ctx, _x(ctx, [37, 3])), (0.01, 4)),
    "log": (lambda ctx: gl.log(ctx, _x(ctx, [37, 3])), (0.01, 4)),
    "scale_nonpow2": (lambda ctx: gl.scale(ctx, _x(ctx, [37, 3]), 0.17677669), (-4, 4)),
    "add_f16_f32": (lambda ctx: gl.add(ctx, _x(ctx, [40, 3], gl.F16), _x(ctx, [40, 3], name="y")), (-4, 4)),
    "add_f16_f16": (lambda ctx: gl.add(ctx, _x(ctx, [40, 3], gl.F16), _x(ctx, [40, 3], gl.F16, "y")), (-4, 4)),
    "add_q8_0_f32": (lambda ctx: gl.add(ctx, _x(ctx, [64, 3], gl.Q8_0), _x(ctx, [64, 3], name="y")), (-4, 4)),
    "add1_f16_f32": (lambda ctx: gl.add1(ctx, _x(ctx, [33, 3], gl.F16), _x(ctx, [1], name="y")), (-4, 4)),
    "cpy_f32_q8_0": (lambda ctx: gl.cpy(ctx, _x(ctx, [64, 4]), ctx.new_tensor(gl.Q8_0, [64, 4], name="q")), (-3, 3)),
    "cpy_f16_q8_0": (lambda ctx: gl.cpy(ctx, _x(ctx, [64, 4], gl.F16), ctx.new_tensor(gl.Q8_0, [64, 4], name="q")),
                     (-3, 3)),
    "cpy_f32_q4_0": (lambda ctx: gl.cpy(ctx, _x(ctx, [64, 4]), ctx.new_tensor(gl.Q4_0, [64, 4], name="q")), (-3, 3)),
    "cpy_f16_transposed": (lambda ctx: gl.cpy(ctx, gl.transpose(ctx, _x(ctx, [6, 5], gl.F16)),
                                              ctx.new_tensor(gl.F16, [5, 6], name="d")), (-3, 3)),
    "dup_permuted": (lambda ctx: gl.dup(ctx, gl.permute(ctx, _x(ctx, [8, 4, 3]), 2, 0, 1, 3)), (-3, 3)),
    "get_rows_q4_0": (lambda ctx: gl.get_rows(ctx, _x(ctx, [64, 10], gl.Q4_0), _x(ctx, [5], gl.I32, "ids")), (-3, 3)),
    "get_rows_f16_3d": (lambda ctx: gl.get_rows(ctx, _x(ctx, [16, 10, 2], gl.F16), _x(ctx, [4, 2], gl.I32, "ids")),
                        (-3, 3)),
    "mul_mat_q4_0": (lambda ctx: gl.mul_mat(ctx, _x(ctx, [64, 8], gl.Q4_0), _x(ctx, [64, 5], name="y")), (-1, 1)),
    "mul_mat_f16_f16": (lambda ctx: gl.mul_mat(ctx, _x(ctx, [64, 8], gl.F16), _x(ctx, [64, 5], gl.F16, "y")), (-1, 1)),
    "mul_mat_f32_gqa_k96": (lambda ctx: gl.mul_mat(ctx, _x(ctx, [96, 8, 2]), _x(ctx, [96, 5, 4], name="y")), (-1, 1)),
    "mul_mat_f16_k200": (lambda ctx: gl.mul_mat(ctx, _x(ctx, [200, 6], gl.F16), _x(ctx, [200, 3], name="y")), (-1, 1)),
    "soft_max_f16_mask_alibi": (lambda ctx: gl.soft_max_ext(ctx, _x(ctx, [37, 5, 4]), _x(ctx, [37, 8], gl.F16, "m"),
                                                            0.25, 8.0), (-6, 6)),
    "soft_max_f32_mask": (lambda ctx: gl.soft_max_ext(ctx, _x(ctx, [24, 5, 2]), _x(ctx, [24, 5], name="m"),
                                                      0.5, 0.0), (-6, 6)),
    "rope_neox_f16": (lambda ctx: _rope(ctx, _x(ctx, [16, 4, 3], gl.F16), 16, 2), (-2, 2)),
    "rope_neox_freq_factors": (lambda ctx: _rope(ctx, _x(ctx, [16, 4, 3]), 16, 2, _x(ctx, [8], name="ff")), (0.5, 2)),
    "rope_neox_yarn": (lambda ctx: _rope(ctx, _x(ctx, [16, 4, 5]), 16, 2, None, 64, 0.25, 1.0), (-2, 2)),
    "rope_neox_partial": (lambda ctx: _rope(ctx, _x(ctx, [64, 2, 3]), 32, 2), (-2, 2)),
    "rope_normal": (lambda ctx: _rope(ctx, _x(ctx, [16, 4, 3]), 16, 0), (-2, 2)),
    "diag_mask_inf": (lambda ctx: gl.diag_mask_inf(ctx, _x(ctx, [8, 8, 2]), 2), (-2, 2)),
    "diag_mask_zero": (lambda ctx: gl.diag_mask_zero(ctx, _x(ctx, [8, 6, 2]), 1), (-2, 2)),
    "concat_dim3": (lambda ctx: gl.concat(ctx, _x(ctx, [6, 4, 2, 1]), _x(ctx, [6, 4, 2, 2], name="y"), 3), (-2, 2)),
    "norm": (lambda ctx: gl.norm(ctx, _x(ctx, [37, 4]), 1e-5), (-2, 2)),
    "rms_norm": (lambda ctx: gl.rms_norm(ctx, _x(ctx, [37, 4]), 1e-6), (-2, 2)),
    "sum_rows": (lambda ctx: gl.sum_rows(ctx, _x(ctx, [37, 3, 2])), (-2, 2)),
})


@pytest.mark.parametrize("name", sorted(ZOO))
def test_op_zoo_matches_ggml(name):
    """One op (an op/type combination the random graphs do not reach) on both sides, identical values
    required (normwise `VERSION_TOL` for the version-dependent families)."""
    build, (lo, hi) = ZOO[name]
    ctx = gl.Context("zoo")
    y = build(ctx)
    gl.set_output(y)
    gf = gl.build_forward(y)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    data = leaf_data(gf, int(rng.integers(2**32)))
    for t in list(data):  # the case's value range
        if t.type in (gl.F32, gl.F16, gl.Q8_0, gl.Q4_0):
            v = rng.uniform(lo, hi, t.nelements).astype(np.float32)
            if t.type is gl.F32:
                data[t] = v.tobytes()
            elif t.type is gl.F16:
                data[t] = v.astype(np.float16).tobytes()
            else:
                quantize = quantize_row_q8_0_ref if t.type is gl.Q8_0 else quantize_row_q4_0_ref
                data[t] = quantize(v.reshape(-1, t.ne[0])).tobytes()
    rg = O.RandomGraph(gf, [y], [ctx], [])
    with libm_exact():
        galloc = lite_compute(rg, data)
    mine = lite_bytes(y)
    galloc.free()
    (theirs,) = O.run_isolated(O.ggml_compute, gf, [y], (), data, [y])
    zoo = REPORT.setdefault("op zoo", {})
    if mine == theirs:
        zoo[name] = "bit-identical"
        return
    if y.type.is_quantized:  # quantized results: the blocks must be identical
        assert mine == theirs, f"{name}: {y.type.name} blocks differ"
    a, b = values(y, mine), values(y, theirs)
    err = normwise_error(a, b)
    zoo[name] = "same values" if same_values(a, b) else f"normwise {err:.2g}"
    tol = (VERSION_TOL if version_dependent(y) else 0.0) if EXACT_ORDER else BUILD_TOL
    assert same_values(a, b) or err <= tol, f"{name}: normwise error {err:.3g} ({ORACLE_MODE}, tolerance {tol:g})"


@pytest.mark.parametrize("op", [gl.UnaryOp.GELU, gl.UnaryOp.GELU_QUICK])
def test_gelu_tables_match_ggml_on_every_f16_input(op):
    """The f16 tables of `ggml_init`, entry by entry: every finite f16 value in (-10, 10) (gelu's
    table range; gelu_quick has no range guard) through ggml's and ggml_lite's kernel. The one gelu
    entry where the FMA in `1 + 0.044715x·x` matters agrees too."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    x = h[np.isfinite(h) & (h > -10) & (h < 10)]
    ctx = gl.Context("gelu")
    a = _x(ctx, [x.size])
    y = gl.unary(ctx, a, op)
    gf = gl.build_forward(y)
    data = {a: x.tobytes()}
    galloc = lite_compute(O.RandomGraph(gf, [y], [ctx], []), data)
    mine = lite_bytes(y)
    galloc.free()
    (theirs,) = O.run_isolated(O.ggml_compute, gf, [y], (), data, [y])
    if EXACT_ORDER:
        assert mine == theirs
    else:
        assert normwise_error(values(y, mine), values(y, theirs)) <= BUILD_TOL, ORACLE_MODE


def summary() -> str:
    lines = []
    for name, st_ in REPORT.items():
        lines.append(f"{name}: " + ", ".join(f"{k} {v}" for k, v in st_.items()))
    return "\n".join(lines)


def test_a_self_overlapping_destination_is_skipped():
    """Seed 519 (--long): an in-place ADD1 on a [3, 12] view with nb = [4, 4, 48, 48] of a transposed
    tensor writes 36 elements into 14 floats. ggml's rows race over them (its result depends on the
    thread split and, with one thread, on the loop order), so the sweep skips the graph, not fails it."""
    stats = collections.Counter()
    with libm_exact():
        assert _prepared(O.random_graph, 519, stats) is None
    assert stats["skipped: a destination overlaps itself (undefined in ggml)"] == 1
    src = O.random_graph(519).graph
    add1 = [n for n in src.nodes if n.op is Op.ADD1 and n.view_src is not None]
    assert add1 and self_overlapping(add1[0]) and not self_overlapping(add1[0].view_src)


if __name__ == "__main__":
    print(O.describe_build())
    test_lockstep_each_node_matches_ggml(False)
    test_whole_graphs_match_ggml(False)
    for case in sorted(ZOO):
        test_op_zoo_matches_ggml(case)
    print(summary())

