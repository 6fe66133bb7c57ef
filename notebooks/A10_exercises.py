# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # A10 · Exercises graded and solved: chapters 09–12 (spoilers)
#
# Appendix A8 explains the grader and holds chapters 02–04's exercises; this appendix does the same for
# chapters 09 to 12. For each chapter: the module that registers its exercises
# (`ggml_lite.graders.chNN`), with how each prediction's answer is computed with the port and how each
# implement-exercise's cases are built and which rule each one exercises; then the reference solutions,
# each checked. **This notebook holds the solutions**: come here after trying, not before.
#
# **Learning goals**
#
# 1. How a grader for a scheduler pass, llama.cpp's layer placement, a planner or today's chunked allocator
#    builds cases from the chapter, from the recorded runs and at random, so that each plausible mistake
#    fails on a small case naming its rule.
# 2. The reference solutions of chapters 09–12, each passing its check.
#
# Exported: `ggml_lite.graders.ch09` to `ch12`, one section each.

# %%
from ggml_lite.exercises import answer, check  # noqa: F401

# %% [markdown]
# ## 1 · Chapter 09: the backend scheduler
#
# Four exercises. 09.1 asks for the backends of the MLP's splits once two weights have moved; its answer is the
# port's split of that graph. 09.2 (pass 1 for one tensor) and 09.3 (the splits of pass 5) take plain data, the
# named tuples `Node`, `GNode` and `Src` below, so that a learner needs neither tensors nor backends; their
# references build stand-ins from that data and run the port's own code on them.
#
# 09.2's cases: 14 small ones; the tensors of the 14 recorded scenarios of `tests/fixtures/ggml-seed-sched`, pins
# left out, each different one once (31); 300 random ones. 09.3's: 11 small ones; three recorded scenarios after
# passes 1-4, whole and in 70 windows each; 300 random graphs. A case's rule is the one a mistake on it breaks
# first; sizes put the small cases first, then the recorded ones, then the random ones.
#
# | mistake | smallest failing case | rule |
# |---|---|---|
# | 09.2: offload to a backend that does not run the op, or a weight that is not on the CPU | a weight in the CPU's buffer, the GPU wants the op but cannot run it (ggml keeps it on the CPU); a weight on the second of three backends while the first wants the op (ggml leaves it where the weight is) | offload |
# | 09.2: look at the next weight when no backend can run the op where the first one lives | weights in G's and in C's buffer, G does not run the op: ggml answers -1 and lets the later passes decide | first weight only |
# | 09.2: move a pre-allocated tensor instead of aborting | a tensor in G's buffer whose op G does not run: no other backend may take it, its memory is there | pre-allocated |
# | 09.3: the node that changes backend ends the old split | two nodes, the first on the GPU, the second on the CPU: the second split starts at node 1, not 2 | backend change |
# | 09.3: views start splits like other nodes | a view assigned to the CPU, then a GPU node: one split, on the GPU, from node 0 | views skipped |
# | 09.3: copy every source of another backend | one GPU node reading a CPU tensor the GPU can use (a host buffer): no input at all | copy needed |
# | 09.3: copy again in each split that reads a tensor | GPU, CPU, GPU nodes, the first and the last reading the CPU's `x`: the copy made for the first split serves the third | copy once |
# | 09.3: no split at a weight of another backend | two GPU nodes, the first with an input, the second reading a CPU weight: two GPU splits | weight split |
# | 09.3: no split when full, or a full split that counts tensors already copied, or one that ends before a source the backend can use | `max_inputs` 1, the second node needing a new copy (a new split), or only the same `x` again, or a `y` in memory the GPU can use (no split) | inputs full |
#
# The module's head, then 09.1's answer: chapter 09's MLP (§5) with `b1` in a CPU weight buffer and `w2` in SIM's,
# split by the port; the answer is the names of the splits' backends, in order.

# %%
# | export graders.ch09
"""Chapter 09's exercises (appendix A10): the backend scheduler, `ggml_backend_sched_backend_id_from_cur` and
`ggml_backend_sched_split_graph`."""

import json
import logging
import random
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any, NamedTuple

from ggml_lite.buffer import BufferUsage
from ggml_lite.cpu import cpu_init
from ggml_lite.errors import SchedulerError
from ggml_lite.exercises import Case, Chapter, Explore, Implement, Predict, register
from ggml_lite.graph import build_forward
from ggml_lite.ops import add, mul_mat, silu, soft_max
from ggml_lite.scenario import built_scenario, load_scenario
from ggml_lite.sched import PASSES, BackendSched, backend_id_from_cur, split_graph
from ggml_lite.sim import sim_init
from ggml_lite.tallocr import alloc_ctx_tensors
from ggml_lite.tensor import F16, F32, Context, Op, TensorFlag, is_view_op, set_input

REPO = Path(split_graph.__code__.co_filename).resolve().parents[1]  # (ggml_lite/sched.py's: no __file__ here)
FIXTURES = REPO / "tests" / "fixtures" / "ggml-seed-sched"
SCENARIOS = ("03_partial_offload", "07_op_offload_mul_mat", "12_deny_mul_mat_weights_in_fake")  # 09.3's


def mlp_split_backends() -> tuple:
    """09.1's answer: the backends' names of the splits of chapter 09's MLP (§5) with b1 on the CPU, w2 on SIM."""
    backends = [sim_init("SIM", asynchronous=False), cpu_init()]
    weights = [Context("w:SIM"), Context("w:CPU")]
    w1 = weights[0].new_tensor_2d(F16, 64, 128, name="w1")
    w2 = weights[0].new_tensor_2d(F16, 128, 32, name="w2")
    b1 = weights[1].new_tensor_1d(F32, 128, name="b1")
    for ctx, backend in zip(weights, backends):
        alloc_ctx_tensors(ctx, backend).set_usage(BufferUsage.WEIGHTS)
    c = Context("compute")
    x = c.new_tensor_2d(F32, 64, 8, name="x")
    set_input(x)
    h0 = mul_mat(c, w1, x).set_name("h0")
    h1 = add(c, h0, b1).set_name("h1")
    h2 = silu(c, h1).set_name("h2")
    logits = mul_mat(c, w2, h2).set_name("logits")
    graph = build_forward(soft_max(c, logits).set_name("probs"))
    sched = BackendSched(backends, debug=False)
    split_graph(sched, graph)
    return tuple(backends[split.backend_id].get_name() for split in sched.splits)


def load_recorded(name: str) -> tuple:
    """A recorded scenario of FIXTURES: (backends, round-0 graph, the file's document); for scenario 13, which
    aborts before recording a graph, the graph built from its model."""
    doc = json.loads((FIXTURES / f"{name}.json").read_text())
    if "graph" in doc:
        scenario = load_scenario(doc, fill=False)
        return scenario.backends, scenario.gf.graph, doc
    backends, graph = built_scenario(doc)
    return backends, graph, doc

# %% [markdown]
# 09.2's tensor comes as a `Node` (the stub's docstring describes its fields; the defaults make a small case
# short to write). The reference builds stand-ins with only what `ggml_backend_sched_backend_id_from_cur` reads:
# a scheduler whose backends answer `supports_buft`, `supports_op` and `offload_op` from the plain data, and
# a tensor whose buffers are named by their buffer type.

# %%
# | export graders.ch09
class Node(NamedTuple):
    """09.2's tensor: the buffer types (names) of its buffer and of its view_src's (None: none), whether it is a
    graph INPUT, the buffer type of each source in a WEIGHTS buffer (None for the others), and what each backend
    says of its op (`supports_op`, `offload_op`)."""
    buffer: str | None = None
    view_src: str | None = None
    is_input: bool = False
    weights: tuple = ()
    runs: tuple = (True, True)
    offloads: tuple = (False, False)


class Stand:
    """A stand-in for a tensor: the attributes the port reads (`fields`), hashed by identity as a tensor is."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def stand_in(buft: str | None, usage: BufferUsage = BufferUsage.ANY, **fields) -> Stand:
    """A tensor in a buffer of type `buft` (None: no buffer) used as `usage`, op NONE, with `fields`."""
    buffer = None if buft is None else NS(buft=buft, usage=usage, get_name=lambda: buft)
    return Stand(buffer=buffer, op=Op.NONE, name="t", **fields)


def pass1_reference(can_use: tuple, node: Node) -> int:
    """09.2's reference: `ggml_backend_sched_backend_id_from_cur` (the port) on stand-ins of the plain data.
    Takes `can_use` (per backend, the names of the buffer types it can use) and a `Node`; returns the backend id
    pass 1 gives, or -1, and raises SchedulerError where the C aborts."""
    backends = [NS(supports_buft=uses.__contains__, supports_op=lambda op, r=runs: r,
                   offload_op=lambda op, o=offloads: o)
                for uses, runs, offloads in zip(can_use, node.runs, node.offloads, strict=True)]
    sched: Any = NS(n_backends=len(backends), backends=backends, causes={})
    view_src = None if node.view_src is None else stand_in(node.view_src)
    weights = [None if w is None else stand_in(w, BufferUsage.WEIGHTS) for w in node.weights]
    flags = int(TensorFlag.INPUT) if node.is_input else 0
    tensor = stand_in(node.buffer, view_src=view_src, flags=flags, src=weights)
    log = logging.getLogger("ggml_lite")
    was_disabled, log.disabled = log.disabled, True  # the port's "no backend supports op ..." is not for the grader
    try:
        return backend_id_from_cur(sched, tensor)
    finally:
        log.disabled = was_disabled

# %% [markdown]
# 09.2's rules follow the questions of pass 1 in order; a case's rule is the first question that decides it,
# with three refinements where a plausible mistake answers differently: a first weight no backend can run next
# to a later one that could (`first weight only`), and a weight with a backend before its own that wants to
# offload (`offload`). The size counts backends ten times, then weights, offloads and buffers.

# %%
# | export graders.ch09
PASS1_RULES = {
    "own buffer": "a tensor with a buffer goes to the first backend that can use its buffer type and runs the op",
    "view": "else a view goes to the first backend that can use its view_src's buffer type and runs the op",
    "pre-allocated": "a tensor (or view) in a buffer no backend both uses and runs cannot move: SchedulerError",
    "input": "else a graph INPUT goes to the last backend (the CPU)",
    "weight": "else the first source in a WEIGHTS buffer decides: the first backend that uses it and runs the op",
    "first weight only": "only the first weight is looked at: -1 if no backend runs the op there, whatever follows",
    "offload": "a weight on the last backend (only there) goes to the first backend before it that runs and offloads",
    "unassigned": "no buffer, no allocated view_src, not an input, no weight source: -1 (the later passes decide)",
}


def pass1_rule(can_use: tuple, node: Node) -> str:
    """The rule of PASS1_RULES that a mistake on this case (`can_use`, `node`) breaks first."""
    def first_backend(buft):  # ggml_backend_sched_backend_from_buffer
        return next((i for i, uses in enumerate(can_use) if buft in uses and node.runs[i]), -1)

    if node.buffer and first_backend(node.buffer) != -1:
        return "own buffer"
    if node.view_src and first_backend(node.view_src) != -1:
        return "view"
    if node.buffer or node.view_src:
        return "pre-allocated"
    if node.is_input:
        return "input"
    weights = [w for w in node.weights if w is not None]
    if not weights:
        return "unassigned"
    b = first_backend(weights[0])
    if b == -1 and any(first_backend(w) != -1 for w in weights[1:]):
        return "first weight only"
    if b > 0 and any(node.offloads[:b]):
        return "offload"
    return "weight"


def pass1_case(can_use: tuple, node: Node, source: str, size: int = 0) -> Case:
    """A case of 09.2 with its rule; `size` is added to the case's own (0 for the small cases)."""
    size += 10 * len(can_use) + len(node.weights) + sum(node.offloads) + bool(node.buffer) + bool(node.view_src)
    return Case((can_use, node), pass1_rule(can_use, node), source, size)

# %% [markdown]
# The small cases of 09.2, each rule among them (`G`: a GPU that uses only its own buffer type, `C`: the CPU).
# Then the recorded tensors as plain data, with what their scenario's backends can use and say of their op.
# Scenario 13 gives a `pre-allocated` case: it aborts in pass 1 at a copy into the KV cache, which lives in
# FAKE's buffer while FAKE refuses CPY.

# %%
# | export graders.ch09
GC, GGC = (("G",), ("C",)), (("G",), ("G1",), ("C",))  # can_use: a GPU and the CPU; two GPUs and the CPU
FT, TF = (False, True), (True, False)
SMALL_PASS1 = (
    (GC, Node()), (GC, Node(buffer="G")), ((("G", "C"), ("C",)), Node(buffer="C")), (GC, Node(is_input=True)),
    (GC, Node(buffer="G", runs=FT)), (GC, Node(view_src="C")), (GC, Node(view_src="G", runs=FT)),
    (GC, Node(weights=("G",))), (GC, Node(weights=(None, "C"))), (GC, Node(weights=("G",), runs=FT)),
    (GC, Node(weights=("G", "C"), runs=FT)), (GC, Node(weights=("C",), offloads=TF)),
    (GC, Node(weights=("C",), runs=FT, offloads=TF)),
    (GGC, Node(weights=("G1",), runs=(True,) * 3, offloads=(True, False, False))),
)


def buft_name(tensor) -> str | None:
    """The name of the buffer type of `tensor`'s buffer (None: no tensor, or no buffer)."""
    return None if tensor is None or tensor.buffer is None else tensor.buffer.buft.get_name()


def plain_node(tensor, backends) -> Node:
    """A real tensor as 09.2's `Node`, its op judged by each of `backends`."""
    weights = [buft_name(s) if s is not None and s.buffer is not None and s.buffer.usage == BufferUsage.WEIGHTS
               else None for s in tensor.src]
    while weights and weights[-1] is None:
        weights.pop()
    return Node(buft_name(tensor), buft_name(tensor.view_src), bool(tensor.flags & TensorFlag.INPUT),
                tuple(weights), tuple(b.supports_op(tensor) for b in backends),
                tuple(b.offload_op(tensor) for b in backends))


def plain_can_use(backends, graph) -> tuple:
    """09.2's `can_use` of a scenario: per backend, the names of the buffer types of `graph` it can use."""
    bufts = {b.get_default_buffer_type() for b in backends}
    for t in (*graph.leafs, *graph.nodes):
        bufts |= {x.buffer.buft for x in (t, t.view_src, *t.src) if x is not None and x.buffer is not None}
    return tuple(tuple(sorted(buft.get_name() for buft in bufts if b.supports_buft(buft))) for b in backends)


def pass1_fixture_cases():
    """09.2's cases of the recorded scenarios (none without FIXTURES): each tensor pass 1 decides (not pinned),
    each different case once, named by the first scenario that has it."""
    seen = set()
    for path in sorted(FIXTURES.glob("*.json")):
        backends, graph, doc = load_recorded(path.stem)
        can_use = plain_can_use(backends, graph)
        pinned = {pin["tensor"] for pin in doc.get("pins", [])}
        for tensor in (*graph.leafs, *graph.nodes):
            node = plain_node(tensor, backends)
            if tensor.name not in pinned and (can_use, node) not in seen:
                seen.add((can_use, node))
                yield pass1_case(can_use, node, f"fixture {path.stem}", 100)

# %% [markdown]
# The random cases of 09.2: 2-4 backends, GPUs `G0`, `G1`, … that each use their own buffer type and at times
# another, the CPU last with only its own (`C`); a tensor that at times has a buffer, a view_src, the INPUT flag,
# and up to three sources, most of them weights. Each backend runs the op four times in five and wants to
# offload it two times in five.

# %%
# | export graders.ch09
def pass1_random_case(rng: random.Random) -> Case:
    """A random case of 09.2, drawn from `rng`."""
    n = rng.randrange(2, 5)
    bufts = [f"G{i}" for i in range(n - 1)] + ["C"]
    can_use = [tuple(sorted({bufts[i]} | {b for b in bufts if rng.random() < 0.2})) for i in range(n - 1)]
    buffer = rng.choice(bufts) if rng.random() < 0.15 else None
    view_src = rng.choice(bufts) if rng.random() < 0.2 else None
    is_input = rng.random() < 0.15
    weights = tuple(rng.choice(bufts) if rng.random() < 0.6 else None for _ in range(rng.randrange(4)))
    runs = tuple(rng.random() < 0.8 for _ in range(n))
    offloads = tuple(rng.random() < 0.4 for _ in range(n))
    node = Node(buffer, view_src, is_input, weights, runs, offloads)
    return pass1_case((*can_use, ("C",)), node, "random", 1000)


def pass1_cases():
    """09.2's cases: the small ones, the recorded ones, 300 random ones."""
    for can_use, node in SMALL_PASS1:
        yield pass1_case(can_use, node, "chapter")
    yield from pass1_fixture_cases()
    rng = random.Random(9)
    for _ in range(300):
        yield pass1_random_case(rng)

# %% [markdown]
# 09.3's graph comes as `GNode`s whose sources are `Src`s (the stub's docstring describes the fields). The
# reference makes one tensor per name, gives each its backend, marks the weights and lets the port's pass 5
# (`ggml_backend_sched_split_graph`'s last pass) split them, on a scheduler that holds only what that pass reads.

# %%
# | export graders.ch09
class Src(NamedTuple):
    """A source of a 09.3 node: its name, backend, whether it is in a WEIGHTS buffer, the backends that can use
    its memory."""
    name: str
    backend: int
    weight: bool = False
    usable: tuple = ()


class GNode(NamedTuple):
    """A node of 09.3's graph: its name, backend, whether it is a view, its sources (`Src`)."""
    name: str
    backend: int
    view: bool = False
    srcs: tuple = ()


def splits_reference(nodes, max_inputs: int = 10) -> list:
    """09.3's reference: pass 5 of `ggml_backend_sched_split_graph` (the port's `_pass5`) on tensors built from the
    plain `nodes` (GNode, ...), at most `max_inputs` inputs a split. Returns [(backend, i_start, i_end, (input
    names, ...)), ...] and raises SchedulerError where the C asserts."""
    ctx = Context("plain")
    tensors: dict[str, Any] = {}  # name -> tensor
    usable: dict[Any, tuple] = {}  # tensor -> the backends that can use its memory
    sched = BackendSched.__new__(BackendSched)  # what pass 5 reads, no more: no backends, no buffers
    sched.__dict__.update(ids={}, copies={}, causes={}, splits=[], graph_inputs=[], ctx=Context("sched"),
                          n_copies=1, cur_copy=0, max_split_inputs=max_inputs,
                          backends=[NS(get_name=lambda: "B")] * 16, buffer_supported=lambda t, b: b in usable[t])

    def tensor(name):  # the tensor of that name, made on first use
        if name not in tensors:
            tensors[name] = ctx.new_tensor_1d(F32, 1, name=name)
        return tensors[name]

    for node in nodes:
        t = tensor(node.name)
        for j, src in enumerate(node.srcs):
            s = tensor(src.name)
            usable.setdefault(s, src.usable)
            sched.ids.setdefault(s, src.backend)
            if src.weight:
                s.buffer = NS(usage=BufferUsage.WEIGHTS)
            t.set_src(j, s)
        t.op = Op.VIEW if node.view else Op.ADD
        sched.ids[t] = node.backend
    PASSES[4](sched, NS(nodes=[tensors[node.name] for node in nodes]))
    return [(s.backend_id, s.i_start, s.i_end, tuple(t.name for t in s.inputs)) for s in sched.splits]

# %% [markdown]
# 09.3's rules. A case's rule is read off the right splits: which conditions of pass 5 the case involves (a view
# on another backend than its split or reading from one, a weight of another backend, a source another backend
# can use, a tensor copied by an earlier split and read again, a full split or two splits of one backend in a
# row), the first of them in the order of SPLIT_ORDER, else `backend change`. The size counts nodes ten times,
# then sources, and one for a small `max_inputs`.

# %%
# | export graders.ch09
SPLIT_RULES = {
    "backend change": "a split ends (exclusive i_end) where a non-view node of another backend starts the next",
    "views skipped": "views start no split and bring no input; the first split has the first non-view node's backend",
    "copy needed": "a source is an input only if it is on another backend and the split's backend cannot use it",
    "copy once": "a tensor is copied to a backend once: a later split of that backend that reads it does not list it",
    "weight split": "once the split has inputs, a node reading a weight of another backend starts a new split",
    "inputs full": "a split holding max_inputs inputs ends before a node that needs a copy not yet made",
    "too many inputs": "a node needing more new copies than its split has room left for: SchedulerError (C: abort)",
}
SPLIT_ORDER = ("too many inputs", "weight split", "inputs full", "copy once", "views skipped", "copy needed")


def split_flags(nodes: tuple, max_inputs: int, splits: list) -> set:
    """The rules of SPLIT_RULES whose conditions a case (`nodes`, `max_inputs`, its right `splits`) involves."""
    flags: set[str] = set()
    copied: set[tuple] = set()  # (tensor name, backend): the copies the splits before made
    for k, (b, i0, i1, inputs) in enumerate(splits):
        if max_inputs < 10 and len(inputs) == max_inputs:
            flags.add("inputs full")
        if k > 0 and b == splits[k - 1][0]:
            flags.add("inputs full")  # two splits of one backend in a row: a weight or a full split cut them
        for node in nodes[i0:i1]:
            if node.view:
                if node.backend != b or any(s.backend != b for s in node.srcs):
                    flags.add("views skipped")
                continue
            for s in node.srcs:
                if s.weight and s.backend != b:
                    flags.add("weight split")
                if s.backend != b and b in s.usable:
                    flags.add("copy needed")
                if (s.name, b) in copied and s.name not in inputs:
                    flags.add("copy once")
        copied |= {(name, b) for name in inputs}
    return flags


def split_case(nodes, max_inputs: int, source: str, size: int = 0) -> Case:
    """A case of 09.3 with its rule; `size` is added to the case's own (0 for the small cases)."""
    nodes = tuple(nodes)
    try:
        flags = split_flags(nodes, max_inputs, splits_reference(nodes, max_inputs))
    except SchedulerError:
        flags = {"too many inputs"}
    rule = next((r for r in SPLIT_ORDER if r in flags), "backend change")
    size += 10 * len(nodes) + sum(len(n.srcs) for n in nodes) + (max_inputs < 10)
    return Case((nodes, max_inputs), rule, source, size)

# %% [markdown]
# The small cases of 09.3, written with two helpers: `_s(name, backend, *usable, weight=...)` for a source (by
# default usable only by its own backend) and `_n(name, backend, *srcs, view=...)` for a node; backend 0 is a
# GPU, 1 the CPU. Each is the smallest graph on which one of the table's mistakes shows.

# %%
# | export graders.ch09
def _s(name: str, backend: int, *usable: int, weight: bool = False) -> Src:
    """A source on `backend` whose memory the backends `usable` can use (none given: only its own)."""
    return Src(name, backend, weight, usable or (backend,))


def _n(name: str, backend: int, *srcs: Src, view: bool = False) -> GNode:
    """A node on `backend` reading `srcs`."""
    return GNode(name, backend, view, srcs)


SMALL_SPLITS = (  # (nodes, max_inputs)
    ([_n("n0", 0, _s("x", 1, 0, 1))], 10),
    ([_n("n0", 0, _s("w", 1, weight=True))], 10),
    ([_n("n0", 0, _s("x", 1)), _n("n1", 1, _s("n0", 0))], 10),
    ([_n("v0", 1, view=True), _n("n1", 0, _s("v0", 1, 0, 1))], 10),
    ([_n("n0", 0, _s("x", 1)), _n("v1", 1, _s("n0", 0), view=True)], 10),
    ([_n("n0", 0, _s("x", 1)), _n("n1", 0, _s("n0", 0), _s("w", 1, weight=True))], 10),
    ([_n("n0", 0, _s("x", 1)), _n("n1", 0, _s("n0", 0), _s("w", 1, 0, 1, weight=True))], 10),
    ([_n("n0", 0, _s("x", 1)), _n("n1", 0, _s("n0", 0), _s("y", 1))], 1),
    ([_n("n0", 0, _s("x", 1)), _n("n1", 0, _s("y", 1, 0, 1))], 1),
    ([_n("n0", 0, _s("x", 1)), _n("n1", 0, _s("n0", 0), _s("x", 1))], 1),
    ([_n("n0", 0, _s("x", 1)), _n("n1", 0, _s("y", 1), _s("z", 1))], 2),
    ([_n("n0", 0, _s("x", 1)), _n("n1", 1, _s("n0", 0)), _n("n2", 0, _s("x", 1), _s("n1", 1))], 10),
)

# %% [markdown]
# The recorded graphs of 09.3: each of `SCENARIOS` split by the port's passes 1-4, read back as plain nodes (every
# tensor's backend, whether it is a weight, which backends can use its memory), then cut into windows of 3-12
# nodes with `max_inputs` 2, 3 or 10, so that full splits occur. And 300 random graphs: 2-10 nodes on two or
# three backends, each node on its predecessor's backend half the time, one in seven a view, each reading one to
# three earlier tensors (nodes, inputs `x0`…, weights `w0`…) whose memory another backend can use one time in
# seven; `max_inputs` 1, 2, 3 or 10.

# %%
# | export graders.ch09
def scenario_nodes(name: str) -> list:
    """A recorded scenario's graph after passes 1-4 as 09.3's plain nodes (its tensor names are unique)."""
    backends, graph, _ = load_recorded(name)
    sched = BackendSched(backends, debug=False)
    for run in PASSES[:4]:
        run(sched, graph)

    def plain_src(s):
        weight = s.buffer is not None and s.buffer.usage == BufferUsage.WEIGHTS
        usable = tuple(b for b in range(len(backends)) if sched.buffer_supported(s, b))
        return Src(s.name, sched.ids.get(s, -1), weight, usable)

    return [GNode(n.name, sched.ids[n], is_view_op(n.op), tuple(plain_src(s) for s in n.src if s is not None))
            for n in graph.nodes]


def split_fixture_cases():
    """Each of SCENARIOS whole, then in 70 random windows (none without FIXTURES)."""
    rng = random.Random(9)
    for name in SCENARIOS if FIXTURES.is_dir() else ():
        nodes = scenario_nodes(name)
        yield split_case(nodes, 10, f"fixture {name}", 1000)
        for _ in range(70):
            start, length = rng.randrange(len(nodes) - 3), rng.randrange(3, 13)
            window, max_inputs = nodes[start:start + length], rng.choice([2, 3, 10, 10])
            if not all(n.view for n in window):  # (a window of views alone has no split backend to ask for)
                yield split_case(window, max_inputs, f"fixture {name}", 100)


def split_random_case(rng: random.Random) -> Case:
    """A random case of 09.3, drawn from `rng`."""
    n_backends = rng.choice([2, 2, 3])

    def usable(b):
        return tuple(sorted({b} | {other for other in range(n_backends) if rng.random() < 0.15}))

    pool = []  # what a node may read: inputs, weights and the nodes before it
    for k in range(rng.randrange(1, 5)):
        b, weight = rng.randrange(n_backends), rng.random() < 0.5
        pool.append(Src(f"w{k}" if weight else f"x{k}", b, weight, usable(b)))
    nodes, backend = [], rng.randrange(n_backends)
    for i in range(rng.randrange(2, 11)):
        if rng.random() < 0.5:
            backend = rng.randrange(n_backends)
        view = rng.random() < 0.15
        srcs = rng.sample(pool, min(len(pool), 1 if view else rng.randrange(1, 4)))
        nodes.append(GNode(f"n{i}", backend, view, tuple(srcs)))
        pool.append(Src(f"n{i}", backend, False, usable(backend)))
    return split_case(nodes, rng.choice([1, 2, 3, 10, 10]), "random", 1000)


def split_cases():
    """09.3's cases: the small ones, the recorded ones, 300 random ones."""
    for nodes, max_inputs in SMALL_SPLITS:
        yield split_case(nodes, max_inputs, "chapter")
    yield from split_fixture_cases()
    rng = random.Random(9)
    for _ in range(300):
        case = split_random_case(rng)
        if not all(n.view for n in case.args[0]):
            yield case

# %% [markdown]
# The chapter's four exercises, registered.

# %%
# | export graders.ch09
register(
    Chapter("09", "The backend scheduler", "09_scheduler"),
    Predict(id="09.1", title="the splits of the MLP, weights moved", minutes=5, level="medium",
            expected=mlp_split_backends,
            reasoning="h0 and logits follow their weight to SIM (1.wgt0), h1 its first weight, b1, to the CPU "
                      "(1.wgt1). Pass 2 spreads SIM first, down then up, never the CPU: probs gets SIM from logits "
                      "going down, h2 from logits going up. So two changes: {expected}; x, h0 and h1 are copied."),
    Implement(id="09.2", title="pass 1 for one tensor", minutes=20, level="medium", function="pass1_backend",
              c_name="ggml_backend_sched_backend_id_from_cur", reference=pass1_reference, cases=pass1_cases,
              rules=PASS1_RULES),
    Implement(id="09.3", title="the splits of pass 5", minutes=35, level="hard", function="make_splits",
              c_name="ggml_backend_sched_split_graph", reference=splits_reference, cases=split_cases,
              rules=SPLIT_RULES),
    Explore(id="09.4", title="why pipeline parallelism quadruples the input copies", minutes=15, level="medium"),
)

# %% [markdown]
# ### Solutions to chapter 09
#
# 09.1: `("SIM", "CPU", "SIM")`, checked below.

# %%
# NBVAL_CHECK_OUTPUT
answer("09.1", ("SIM", "CPU", "SIM"), record_done=False)

# %% [markdown]
# 09.2, the C written out: the tensor's own buffer, then its view_src's, each with
# `ggml_backend_sched_backend_from_buffer`; the abort for a pre-allocated tensor; the INPUT rule; then the first
# weight only, and the offload question only when that weight is on the CPU.

# %%
# NBVAL_CHECK_OUTPUT
# solution 09.2
from ggml_lite.errors import SchedulerError  # noqa: E402


def pass1_backend(can_use, node):
    cpu = len(can_use) - 1

    def from_buffer(buft):  # ggml_backend_sched_backend_from_buffer
        return next((i for i, uses in enumerate(can_use) if buft in uses and node.runs[i]), -1)

    for buft in (node.buffer, node.view_src):
        if buft is not None and from_buffer(buft) != -1:
            return from_buffer(buft)
    if node.buffer is not None or node.view_src is not None:
        raise SchedulerError("pre-allocated tensor in a backend that cannot run the operation")
    if node.is_input:
        return cpu
    for buft in node.weights:
        if buft is None:
            continue
        b = from_buffer(buft)
        if b == cpu:  # does a backend before the CPU want the op?
            for k in range(b):
                if node.runs[k] and node.offloads[k]:
                    return k
        return b
    return -1


assert check("09.2", pass1_backend, record_done=False)

# %% [markdown]
# 09.3, the C written out. It keeps the set of (tensor, backend) copies made so far, by any split: that set is
# what lets a copy serve later splits, and what the full-split test asks about.

# %%
# NBVAL_CHECK_OUTPUT
# solution 09.3
from ggml_lite.errors import SchedulerError  # noqa: E402


def make_splits(nodes, max_inputs=10):
    copied = set()  # (tensor name, backend) of every copy made so far

    def needs_copy(src, backend):
        return src.backend != backend and backend not in src.usable and (src.name, backend) not in copied

    def starts_split(node, backend, inputs):
        if node.backend != backend:
            return True
        if not inputs:
            return False
        for src in node.srcs:
            if src.weight and src.backend != backend:
                return True  # a weight on another backend
            if len(inputs) == max_inputs and needs_copy(src, backend):
                return True  # the split is full
        return False

    first = next((n.backend for n in nodes if not n.view), -1)
    splits = [[first, 0, len(nodes), []]]
    for i, node in enumerate(nodes):
        if node.view:
            continue
        backend, _, _, inputs = splits[-1]
        if starts_split(node, backend, inputs):
            splits[-1][2] = i
            backend, inputs = node.backend, []
            splits.append([backend, i, len(nodes), inputs])
        for src in node.srcs:
            if needs_copy(src, backend):
                if len(inputs) >= max_inputs:
                    raise SchedulerError(f"a split needs more than {max_inputs} inputs")
                copied.add((src.name, backend))
                inputs.append(src.name)
    return [(b, i0, i1, tuple(inputs)) for b, i0, i1, inputs in splits]


assert check("09.3", make_splits, record_done=False)

# %% [markdown]
# ## 2 · Chapter 10: a LLaMA's memory
#
# Three exercises. 10.1 plans Mistral 7B with the chapter's `plan_memory`. 10.2's reference is `layer_placement`;
# cases: small ones per rule, the chapter's setups, 300 random ones (1-80 layers, 0-4 GPUs, `tensor_split` absent,
# short, zeros or uneven). Fractions and split points are float32, as in the C.
#
# | mistake | smallest failing case | rule |
# |---|---|---|
# | offload the first layers, not the last | 2 layers, 1 offloaded: llama.cpp keeps layer 0 on the host and gives layer 1 to the GPU | cpu layers |
# | offload the output as soon as every layer is offloaded | 2 layers, 2 offloaded: the output goes to a GPU only from `n_layer + 1` on | output |
# | divide by `n_gpu_layers`, not `min(n_gpu_layers, n_layer + 1)` | 3 layers, 9 offloaded, 2 GPUs: act is 4, so layer 2 (2/4) goes to GPU1; over 9 no layer would reach it | act |
# | lower bound: a fraction equal to a split point stays on the GPU before it | 2 layers on 2 GPUs with `[0, 0]` (an even split): layer 1's fraction is 0.5, which goes to GPU1 | upper bound |
# | offload although there is no GPU | 2 layers, 1 offloaded, 0 GPUs: everything stays on the CPU | no devices |
# | ignore `tensor_split` and split evenly | 3 layers on 2 GPUs with `[1.0]`: the list is short, so GPU1 gets 0 and every layer goes to GPU0 | split points |

# %%
# | export graders.ch10
"""Chapter 10's exercises (appendix A10): a LLaMA's memory, `llama_kv_cache_init` and `llm_load_tensors`."""

import random

import numpy as np

from ggml_lite.exercises import Case, Chapter, Explore, Implement, Predict, register
from ggml_lite.models.llama import PRESETS, layer_placement, plan_memory


def gpu_layers_reference(n_layer, n_gpu_layers, n_devices, tensor_split=None):
    """`llm_load_tensors`' placement of the layers and the output (the port, `layer_placement`)."""
    return tuple(layer_placement(n_layer, n_gpu_layers, n_devices, tensor_split)[k] for k in ("layers", "output"))


PLACEMENT_RULES = {
    "cpu layers": "the first n_layer - n_gpu_layers layers stay on the CPU (i_gpu_start); the last go to the GPUs",
    "no devices": "without a GPU (n_devices 0) every layer and the output stay on the CPU, whatever n_gpu_layers is",
    "output": "the output goes to a GPU only when n_gpu_layers > n_layer, the GPU of the fraction (act - 1) / act",
    "act": "a layer's fraction is (i - i_gpu_start) / act with act = min(n_gpu_layers, n_layer + 1), in float32 "
           "as llama.cpp computes it (a float64 fraction can fall on the other side of a split point)",
    "upper bound": "a layer goes to the first GPU whose split point is above its fraction: equal goes to the next",
    "split points": "split points: running sums of tensor_split over their total (None or zeros: even; short: 0s)",
}


def placement_case(n_layer, ngl, n_dev, ts, source, size=0):
    i0, act = max(n_layer - ngl, 0), min(ngl, n_layer + 1)
    w = np.asarray((list(ts or []) + [0.0] * n_dev)[:n_dev], dtype=np.float32)
    points = np.cumsum(w if w.any() else np.ones(n_dev, np.float32), dtype=np.float32)
    fractions = [np.float32(i - i0) / np.float32(act) for i in range(i0, n_layer + (ngl > n_layer))]
    rule = ("no devices" if n_dev == 0 and ngl else "cpu layers" if n_dev == 0 or ngl == 0 else
            "act" if ngl > n_layer + 1 and n_dev > 1 else
            "upper bound" if n_dev > 1 and any(x in points[:-1] / points[-1] for x in fractions) else
            "split points" if n_dev > 1 and ts and any(ts) else
            "output" if ngl in (n_layer, n_layer + 1) else "cpu layers")
    return Case((n_layer, ngl, n_dev, ts), rule, source, size + 10 * n_layer + ngl + 3 * n_dev + len(ts or ()))


def placement_cases():
    rng = random.Random(10)
    yield from (placement_case(n_layer, ngl, n_dev, ts, "chapter") for n_layer, ngl, n_dev, ts in (
        (2, 1, 1, None), (2, 2, 1, None), (2, 3, 1, None), (2, 1, 0, None), (3, 2, 2, None), (3, 9, 2, None),
        (2, 2, 2, [0.0, 0.0]), (3, 3, 2, [1.0]), (3, 3, 2, [3.0, 1.0]), (4, 5, 3, [1.0, 1.0, 1.0]),
        (32, 33, 1, None), (32, 20, 1, None), (80, 81, 2, None)))
    for _ in range(300):
        n_layer = rng.randrange(1, 81)
        ngl = rng.choice([rng.randrange(n_layer + 1), n_layer, n_layer + 1, rng.randrange(n_layer, 2 * n_layer + 3)])
        n_dev = rng.choice([0, 1, 1, 2, 2, 3, 4])
        weights = [rng.choice([0.0, 0.1, 0.5, 0.7, 1.0, 2.0, 3.0]) for _ in range(rng.randrange(n_dev + 1))]
        yield placement_case(n_layer, ngl, n_dev, rng.choice([None, weights]), "random", 1000)


register(
    Chapter("10", "A LLaMA's memory", "10_llama"),
    Predict(id="10.1", title="Mistral 7B's KV cache at n_ctx 3000", minutes=5, level="easy",
            expected=lambda: plan_memory(PRESETS["mistral-7b"], 3000)["devices"]["CPU"]["kv"] / 2**20,
            reasoning="n_ctx is padded to a multiple of 32: 3008 cells. Each layer keeps K and V for the 8 KV heads "
                      "only (grouped-query attention): n_embd_k_gqa = 4096 / 32 × 8 = 1024 values per cell each. "
                      "2 × 32 layers × 1024 × 3008 cells × 2 bytes (f16) = {expected} MiB — a quarter of a "
                      "Llama-2 7B's, which has as many KV heads as heads."),
    Implement(id="10.2", title="which layers go to which GPU", minutes=20, level="medium", function="gpu_layers",
              c_name="llm_load_tensors", reference=gpu_layers_reference, cases=placement_cases, rules=PLACEMENT_RULES,
              against="llama.cpp"),
    Explore(id="10.3", title="32 layers or 33: what keeping the output on the host costs", minutes=15, level="medium"),
)

# %% [markdown]
# ### Solutions to chapter 10: 10.1, 376 MiB; 10.2, the C (float32 for `float`, `bisect_right` for `upper_bound`).

# %%
# NBVAL_CHECK_OUTPUT
answer("10.1", 376, record_done=False)

# %%
# NBVAL_CHECK_OUTPUT
# solution 10.2
import bisect  # noqa: E402

import numpy as np  # noqa: E402


def gpu_layers(n_layer, n_gpu_layers, n_devices, tensor_split=None):
    n_gpu_layers, n_dev = n_gpu_layers if n_devices else 0, max(n_devices, 1)
    i_gpu_start, act = max(n_layer - n_gpu_layers, 0), min(n_gpu_layers, n_layer + 1)
    splits = (list(tensor_split or []) + [0.0] * n_dev)[:n_dev]
    splits = splits if any(splits) else [1.0] * n_dev  # the default split (by free memory): here equal
    points = np.cumsum(np.array(splits, dtype=np.float32), dtype=np.float32)
    points = list(points / points[-1])

    def gpu(k):
        return f"GPU{bisect.bisect_right(points, np.float32(k) / np.float32(act))}"
    return [gpu(i - i_gpu_start) if i >= i_gpu_start else "CPU" for i in range(n_layer)], \
        gpu(act - 1) if n_gpu_layers > n_layer else "CPU"


assert check("10.2", gpu_layers, record_done=False)

# %% [markdown]
# ## 3 · Chapter 11: offline planners
#
# Four exercises. 11.1 is computed with `problem_from_blocks` and `greedy_by_size`. 11.2 and 11.3 are graded
# against the port (no C: ggml has no offline planner) on sets made by hand (the smallest breaking each rule,
# shown first), §6's examples, 300 seeded random sets and the blocks of `tests/fixtures/ggml-seed`'s graphs
# (not 13: 14's shape, twice the loading time); those get the first rule that their structure involves.
#
# | mistake | smallest failing case | rule |
# |---|---|---|
# | 11.2: ends exclusive, or nodes `range(max end)` | `[(32, 0, 0)]`: `(32, 0)`, not `(0, 0)` | inclusive end |
# | 11.2: the last node reaching the peak | `[(32, 0, 1)]`: node 0, not 1 | first node |
# | 11.2: `max()` of no nodes at all | `[]`: `(0, 0)` | no blocks |
# | 11.3: blocks touching at a node taken as apart | `[(96, 0, 0), (64, 0, 0)]`: 96, not 0 | shares a node |
# | 11.3: the blocks in the order given | `[(32, 0, 1), (96, 0, 1)]` | largest first |
# | 11.3: ties of size by index, not by start | `[(64, 1, 1), (64, 0, 2)]` | ties |
# | 11.3: blocks of 0 bytes placed too | four blocks, the last `(0, 1, 1)`: 96, not 0 | zero bytes |
# | 11.3: above the last block met, not the highest | four blocks: 64, inside a 96-byte one | above the highest |
# | 11.3: first fit instead of the smallest gap | five blocks, of three sizes | smallest gap |

# %%
# | export graders.ch11
"""Chapter 11's exercises (appendix A10): the lower bound and greedy by size, graded with `ggml_lite.planners`."""

import itertools
import random
from functools import cache
from pathlib import Path

from ggml_lite import planners
from ggml_lite.exercises import Case, Chapter, Explore, Implement, Predict, register
from ggml_lite.graphio import allocate_external, load_document, read_graph_file
from ggml_lite.planners import blocks_of, greedy_by_size, problem_from_blocks

SEED = Path(planners.__file__).resolve().parents[1] / "tests" / "fixtures" / "ggml-seed"
PREDICTED = [(64, 1, 1), (64, 0, 1), (64, 0, 2), (96, 2, 2)]  # 11.1's blocks: (size, start, end)
CHAPTER = ([(64, 3, 3), (64, 5, 5), (32, 4, 5), (32, 0, 4)],  # §6's four blocks and seven blocks
           [(96, 0, 0), (64, 0, 1), (32, 1, 2), (64, 1, 3), (32, 2, 3), (64, 3, 4), (96, 4, 4)])
PEAK_RULES = {"no blocks": "with no blocks nothing is alive: the bound is 0, at node 0",
              "inclusive end": "a block is alive from its start to its end, both included: blocks ending and "
                               "starting at node i are both alive at i",
              "first node": "when several nodes reach the highest total, the node given is the first of them"}
GREEDY_RULES = {"zero bytes": "a block of 0 bytes needs no memory: it is left out and keeps offset 0",
                "shares a node": "blocks ending and starting at the same node meet, and must not overlap",
                "largest first": "blocks are placed from the largest down",
                "ties": "of equal sizes, the block starting earlier goes first, then the one given first",
                "smallest gap": "a block takes the smallest gap that holds it (the lowest of equals), not the first",
                "above the highest": "when no gap holds it, a block goes at the highest end of all those it meets"}


def port_peak_live(blocks) -> tuple:
    """`Problem.lower_bound` and `lb_step`."""
    return (p := problem_from_blocks(blocks, alignment=1)).lower_bound, p.lb_step


def port_greedy_offsets(blocks) -> list:
    """`planners.greedy_by_size`'s offsets."""
    return list(greedy_by_size(problem_from_blocks(blocks, alignment=1)).offsets)


@cache
def recorded_blocks() -> tuple:
    """(name, blocks) of each recorded graph (a sequence's first)."""
    out = []
    for path in (p for p in sorted(SEED.glob("*.json")) if not p.stem.startswith("13_")):
        gf = read_graph_file(doc := load_document(path), 0 if "steps" in doc else None, validate=False)
        allocate_external(gf)
        out.append((path.stem, [(b.size, b.start, b.end) for b in blocks_of(gf.graph).blocks]))
    return tuple(out)


def sources():
    yield from ((b, "chapter", 10 * len(b)) for b in CHAPTER)
    rng = random.Random(11)
    for _ in range(300):
        blocks = [(32 * rng.randrange(0 if rng.random() < 0.1 else 1, 6), s := rng.randrange(6), s + rng.randrange(4))
                  for _ in range(rng.randrange(1, 8))]
        yield blocks, "random", 1000 + 10 * len(blocks)
    yield from ((b, f"fixture {name}", 10**5 + len(b)) for name, b in recorded_blocks())

# %%
# | export graders.ch11
def peak_rule(blocks) -> str:
    exclusive = port_peak_live([(s, a, e - 1) for s, a, e in blocks if e > a])  # ends taken as exclusive
    return "no blocks" if not blocks else "first node" if exclusive == port_peak_live(blocks) else "inclusive end"


def peak_cases():
    for k, blocks in enumerate(([], [(32, 0, 1)], [(32, 0, 0)], [(32, 0, 1), (32, 1, 2)])):
        yield Case((blocks,), peak_rule(blocks), "chapter", k)
    yield from (Case((b,), peak_rule(b), src, size) for b, src, size in sources())


def greedy_rule(blocks) -> str:
    pairs = list(itertools.combinations(blocks, 2))
    if any(s == 0 for s, _, _ in blocks):
        return "zero bytes"
    if any((a <= f and c <= e) != (a < f and c < e) for (_, a, e), (_, c, f) in pairs):
        return "shares a node"
    return "ties" if any(s == t and c < a for (s, a, _), (t, c, _) in pairs) else "smallest gap"


def greedy_cases():
    for k, (blocks, rule) in enumerate((
            ([(96, 0, 0), (64, 0, 0)], "shares a node"), ([(32, 0, 1), (96, 0, 1)], "largest first"),
            ([(64, 1, 1), (64, 0, 2)], "ties"), ([(64, 0, 0), (32, 0, 1), (32, 0, 1), (0, 1, 1)], "zero bytes"),
            ([(32, 0, 1), (96, 2, 4), (32, 0, 1), (32, 1, 3)], "above the highest"),
            ([(64, 4, 4), (96, 2, 5), (128, 1, 3), (64, 2, 5), (64, 1, 3)], "smallest gap"))):
        yield Case((blocks,), rule, "chapter", k)
    yield from (Case((b,), greedy_rule(b), src, size) for b, src, size in sources())


register(
    Chapter("11", "Offline planners", "11_planners"),
    Predict(id="11.1", title="the lower bound and greedy by size", minutes=8, level="medium",
            expected=lambda: (port_peak_live(PREDICTED)[0], greedy_by_size(problem_from_blocks(PREDICTED)).peak),
            reasoning="at node 1 blocks 0, 1 and 2 are alive (block 1 to node 1 included): 192 bytes, the most at "
                      "any node. Greedy by size places the 96-byte block first, at 0. Block 1 (start 0) meets "
                      "nothing placed: at 0 too; block 2 meets both: at 96; block 0 meets block 1 [0, 64) and "
                      "block 2 [96, 160), and the 32-byte gap between is too small: on top, at 160. {expected}."),
    Implement(id="11.2", title="the peak-live lower bound", minutes=15, level="easy", function="peak_live",
              c_name="", reference=port_peak_live, cases=peak_cases, rules=PEAK_RULES, against="chapter 11"),
    Implement(id="11.3", title="greedy by size", minutes=30, level="medium", function="greedy_offsets",
              c_name="", reference=port_greedy_offsets, cases=greedy_cases, rules=GREEDY_RULES,
              against="chapter 11"),
    Explore(id="11.4", title="when greedy by size loses to ggml's online rule", minutes=20, level="hard"),
)

# %% [markdown]
# ### Solutions to chapter 11
#
# 11.1: `(192, 224)`. 11.2 counts each node's bytes; 11.3 is §4's `_lowest_gap` and `_fill` on plain tuples.

# %%
# NBVAL_CHECK_OUTPUT
answer("11.1", (192, 224), record_done=False)

# %%
# NBVAL_CHECK_OUTPUT
# solution 11.2
def peak_live(blocks):
    live = [0] * (max((end for _, _, end in blocks), default=0) + 1)
    for size, start, end in blocks:
        for node in range(start, end + 1):
            live[node] += size
    return max(live), live.index(max(live))


assert check("11.2", peak_live, record_done=False)

# %%
# NBVAL_CHECK_OUTPUT
# solution 11.3
def greedy_offsets(blocks):
    offsets, placed = [0] * len(blocks), []
    for k in sorted((k for k, b in enumerate(blocks) if b[0]), key=lambda k: (-blocks[k][0], blocks[k][1], k)):
        size, start, end = blocks[k]
        busy = sorted((offsets[j], offsets[j] + blocks[j][0]) for j in placed
                      if blocks[j][1] <= end and start <= blocks[j][2])
        best, best_gap, top = None, None, 0
        for lo, hi in busy:
            if lo - top >= size and (best_gap is None or lo - top < best_gap):
                best, best_gap = top, lo - top
            top = max(top, hi)
        offsets[k] = top if best is None else best
        placed.append(k)
    return offsets


assert check("11.3", greedy_offsets, record_done=False)

# %% [markdown]
# ## 4 · Chapter 12: ggml today
#
# Three exercises on today's chunked allocator. 12.1 runs its calls on `ChunkedDynTAllocr`; 12.2's reference is
# a `ChunkedDynTAllocr` of `DynTAllocr` chunks made from the pairs, and the chunk of its `alloc`. Cases: nine made
# by hand (two are §2.4's `z` and `r`), the smallest breaking each rule, first; the state before each of the
# ~1,100 allocations of today's allocator on `tests/fixtures/ggml-today`'s single graphs (replayed from its
# trace); 40 seeded random sequences, 1,024-B limit. Those get the rule of the step of the C that decides them.
#
# | mistake | smallest failing case | rule |
# |---|---|---|
# | a last block taken without checking that it fits | one chunk with 224 B left, 256 asked | must fit |
# | the last blocks in the best-fit loop | chunk 0 with a 256-B hole, chunk 1 empty | holes first |
# | one best fit over all chunks (`best_fit_size` not reset) | §2.4's `z`: holes of 256 B and 384 B | chunk by chunk |
# | the first chunk whose last block fits (September 2025) | §2.4's `r` | no growth first |
# | the largest `reuse_factor` | two chunks that need not grow, 768 and 256 B to spare | least waste |
# | ties to the last chunk | two equal chunks | first of equals |

# %%
# | export graders.ch12
"""Chapter 12's exercises (appendix A10): today's chunked allocator, graded with `ggml_lite.gallocr_today`."""

import random
from functools import cache
from pathlib import Path

from ggml_lite import gallocr_today
from ggml_lite.dyn_tallocr import DynTAllocr
from ggml_lite.exercises import Case, Chapter, Explore, Implement, Predict, register
from ggml_lite.gallocr_today import BufferAddress, ChunkAllocEvent, ChunkedDynTAllocr, ChunkFreeEvent, GAllocr2026
from ggml_lite.graphio import allocate_external, load_document, read_graph_file
from ggml_lite.schema import buffer_type_of

TODAY = Path(gallocr_today.__file__).resolve().parents[1] / "tests" / "fixtures" / "ggml-today"
CHOOSE_CHUNK_RULES = {
    "holes first": "a hole (a free block besides a chunk's last) that holds the tensor beats every last block",
    "chunk by chunk": "best_fit_size restarts per chunk: the last chunk with a fitting hole wins, not the tightest",
    "must fit": "a last block that cannot hold the tensor is no candidate; with none, a new chunk: len(chunks)",
    "no growth first": "a chunk that need not grow (reuse_factor = max_size - offset - size >= 0) beats all that must",
    "least waste": "of the chunks that need not grow, the one with the smallest reuse_factor wins",
    "least growth": "when every chunk must grow, the one with the largest (least negative) reuse_factor wins",
    "first of equals": "of equal reuse_factors, the first chunk wins (the comparisons are strict)",
}


def port_choose_chunk(chunks, size: int) -> int:
    """The chunk of the port of `ggml_dyn_tallocr_alloc`."""
    dyn = ChunkedDynTAllocr(32)
    for blocks, max_size in chunks:
        dyn.chunks.append(chunk := DynTAllocr(32))
        chunk.blocks, chunk.max_size = [list(b) for b in blocks], max_size
    return dyn.alloc(size).chunk


def state(dyn: ChunkedDynTAllocr) -> list:
    return [([tuple(b) for b in c.blocks], c.max_size) for c in dyn.chunks]


def chunk_rule(chunks, size: int) -> str:
    """The rule of the step that decides the case."""
    if holes := {c for c, (blocks, _) in enumerate(chunks) for _, b in blocks[:-1] if b >= size}:
        return "chunk by chunk" if len(holes) > 1 else "holes first"
    lasts = [(m - blocks[-1][0] - size, blocks[-1][1] >= size) for blocks, m in chunks if blocks]
    fit = [r for r, ok in lasts if ok]
    if not fit or any(not ok and r > max(fit) for r, ok in lasts):
        return "must fit"
    if fit.count(min((r for r in fit if r >= 0), default=max(fit))) > 1:
        return "first of equals"
    return "no growth first" if min(fit) < 0 <= max(fit) else "least waste" if min(fit) >= 0 else "least growth"


def chunk_case(chunks, size: int, source: str, order: int = 0) -> Case:
    size_of = order if source == "chapter" else 100 + len(chunks) + sum(len(b) for b, _ in chunks)
    return Case((chunks, size), chunk_rule(chunks, size), source, size_of)

# %%
# | export graders.ch12
@cache
def recorded_calls() -> tuple:
    """(chunks, size, fixture) before each allocation."""
    out = []
    for doc in (d for d in map(load_document, sorted(TODAY.glob("*.json"))) if "steps" not in d):
        allocate_external(gf := read_graph_file(doc, validate=False))
        events: list = []
        GAllocr2026(buft := buffer_type_of(doc), trace=events.append).reserve(gf.graph)
        replica = ChunkedDynTAllocr(buft.get_alignment(), buft.get_max_size())
        for ev in events:
            if isinstance(ev, ChunkAllocEvent):
                out.append((state(replica), ev.size, doc["fixture"]))
                replica.alloc(ev.size)
            elif isinstance(ev, ChunkFreeEvent):
                replica.free_tensor(BufferAddress(ev.chunk, ev.offset), ev.size)
    return tuple(out)


def choose_chunk_cases():
    for k, (chunks, size) in enumerate((
            ([], 256), ([([(800, 224)], 992)], 256), ([([(800, 224)], 992), ([(512, 512)], 512)], 256),
            ([([(0, 256), (512, 512)], 512), ([(0, 1024)], 768)], 256),
            ([([(0, 256), (768, 256)], 768), ([(0, 384), (768, 256)], 768)], 256),
            ([([(512, 512)], 512), ([(0, 1024)], 768)], 256), ([([(0, 1024)], 1024), ([(256, 768)], 768)], 256),
            ([([(768, 256)], 768), ([(384, 640)], 512)], 256), ([([(0, 1024)], 512), ([(0, 1024)], 512)], 256))):
        yield chunk_case(chunks, size, "chapter", k)
    for chunks, size, name in recorded_calls():
        yield chunk_case(chunks, size, f"fixture {name}")
    rng = random.Random(12)
    for _ in range(40):
        dyn, live = ChunkedDynTAllocr(32, 1024), list[tuple]()
        for _ in range(rng.randrange(2, 16)):
            if live and rng.random() < 0.4:
                dyn.free_tensor(*live.pop(rng.randrange(len(live))))
                continue
            yield chunk_case(state(dyn), size := 32 * rng.choice([1, 2, 4, 8, 12, 16, 24, 40]), "random")
            live.append((dyn.alloc(size), size))


def predicted_sizes() -> list:
    dyn = ChunkedDynTAllocr(32, 1024)
    _, b, _ = dyn.alloc(300), dyn.alloc(900), dyn.alloc(2000)
    dyn.free_tensor(b, 900)
    dyn.alloc(100)
    return [chunk.max_size for chunk in dyn.chunks]


register(
    Chapter("12", "ggml today", "12_ggml_today"),
    Predict(id="12.1", title="chunk sizes after a free", minutes=5, level="medium", expected=predicted_sizes,
            reasoning="sizes round up to 32: 320, 928, 2,016, 128 B. b does not fit chunk 0's last 704 B: chunk 1, "
                      "1,024 B of room, of which b uses 928, and a chunk's size is its high-water mark. c opens "
                      "chunk 2, its own size, and fills it. Freeing b empties chunk 1. d finds no hole; of the last "
                      "blocks, chunk 0's reuse_factor is 320 - 320 - 128 = -128 (it must grow), chunk 1's 928 - 0 "
                      "- 128 = 800 (it need not): d goes to 1:0 and no chunk grows. {expected}."),
    Implement(id="12.2", title="which chunk", minutes=25, level="medium", function="choose_chunk",
              c_name="ggml_dyn_tallocr_alloc", reference=port_choose_chunk, cases=choose_chunk_cases,
              rules=CHOOSE_CHUNK_RULES),
    Explore(id="12.3", title="when reuse_factor costs", minutes=15, level="medium"),
)

# %% [markdown]
# ### Solutions to chapter 12
#
# 12.1: `[320, 928, 2016]`. 12.2: the best fit besides the last blocks, chunk by chunk; else the last block
# with the best `reuse_factor`; else a new chunk. `record_done=False`: reading a solution marks nothing done.

# %%
# NBVAL_CHECK_OUTPUT
answer("12.1", [320, 928, 2016], record_done=False)

# %%
# NBVAL_CHECK_OUTPUT
# solution 12.2
def choose_chunk(chunks, size):
    best = -1
    for c, (blocks, _) in enumerate(chunks):
        best_fit_size = 2**64 - 1
        for _, bsize in blocks[:-1]:
            if size <= bsize <= best_fit_size:
                best, best_fit_size = c, bsize
    if best != -1:
        return best
    best_reuse = -(2**63)
    for c, (blocks, max_size) in enumerate(chunks):
        if blocks and blocks[-1][1] >= size:
            reuse_factor = max_size - blocks[-1][0] - size
            if (best_reuse < 0 and reuse_factor > best_reuse) or 0 <= reuse_factor < best_reuse:
                best, best_reuse = c, reuse_factor
    return len(chunks) if best == -1 else best


assert check("12.2", choose_chunk, record_done=False)
