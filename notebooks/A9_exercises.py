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
# # A9 · Exercises graded and solved: chapters 05–08 (spoilers)
#
# Appendix A8 explains the grader and holds chapters 02–04's exercises; this appendix does the same for
# chapters 05 to 08. For each chapter: the module that registers its exercises
# (`ggml_lite.graders.chNN`), with how each prediction's answer is computed with the port and how each
# implement-exercise's cases are built and which rule each one exercises; then the reference solutions,
# each checked. **This notebook holds the solutions**: come here after trying, not before.
#
# Reading a section: its table lists, for each implement-exercise, the mistakes a learner plausibly makes
# and the smallest case that catches each. Those mistakes are also the wrong solutions the tests hand to
# the grader, in `tests/exercises/wrong_chNN.py`, and each must be rejected naming its rule. A grader is
# only as good as the mistakes it has been shown to catch.
#
# **Learning goals**
#
# 1. How a grader for the graph allocator, a backend's copies, a kernel or a simulated queue builds cases from the
#    chapter, from the recorded runs of the real ggml and at random, so that each plausible mistake fails on
#    a small case naming its rule.
# 2. The reference solutions of chapters 05–08, each passing its check.
#
# Exported: `ggml_lite.graders.ch05` to `ch08`, one section each.

# %%
from ggml_lite.exercises import answer, check  # noqa: F401

# %% [markdown]
# ## 1 · Chapter 05: the graph allocator
#
# 05.1's answer is the port's plan. 05.2 and 05.3's references set up tensors and hash nodes with the facts
# given and ask the port. Cases: the chapter's, one per rule; what the graph allocator saw while planning the 14
# `ggml-seed` fixtures as ggml did (each placement of a node with sources; each `ggml_gallocr_needs_realloc` call,
# to the first slot not valid), each set of facts once; random ones. A 05.2 case's rule is the first condition
# whose omission changes its answer; 05.3's are ordered by rule.
#
# | exercise: mistake | smallest failing case | rule |
# |---|---|---|
# | 05.2: the last passing source instead of the first | two sources that pass | first wins |
# | 05.2: only `src[0]` looked at | `src[0]` has a second child, `src[1]` passes | any slot |
# | 05.2: `n_views` or OUTPUT not tested | a source whose view has not run; an OUTPUT | views; output |
# | 05.3: True when the tensor outgrew its slot (the name read literally) | 2,048 B in a 5,120 B slot | fits |
# | 05.3: `>` instead of `>=` | 5,120 B in a 5,120 B slot | equal fits |
# | 05.3: a pre-allocated tensor compared by its size | 4,096 B in a 1,024 B slot | view or data |
# | 05.3: a slot the plan did not place taken as fine | 64 B, `buffer_id` -1 | not placed |

# %%
# | export graders.ch05
"""Chapter 05's exercises (appendix A9): the graph allocator, graded with `ggml_lite.gallocr`: where the tensors
of a small graph land, the in-place rule of `ggml_gallocr_allocate_node`, `ggml_gallocr_node_needs_realloc`."""

import functools
import random
from pathlib import Path
from typing import NamedTuple

from ggml_lite.buffer import cpu_buffer_type
from ggml_lite.exercises import Case, Chapter, Explore, Implement, Predict, register
from ggml_lite.gallocr import CAN_INPLACE, NOT_PLACED, OUTPUT, GAllocr, PlaceEvent, TensorAlloc
from ggml_lite.graph import build_forward
from ggml_lite.graphio import load_document
from ggml_lite.ops import add, scale, sqr
from ggml_lite.plancheck import run_plan
from ggml_lite.schema import CALLS
from ggml_lite.tensor import F32, TYPES, Context, Op, are_same_layout, set_input

SEED = Path(globals().get("__file__", "graders/ch05.py")).resolve().parents[2] / "tests/fixtures/ggml-seed"
Parent = NamedTuple("Parent", [("own", bool), ("output", bool), ("same_layout", bool), ("n_children", int),
                               ("n_views", int)])


def predicted_offsets() -> tuple:
    """05.1: the offsets of a, b, c in the plan of `c = add(x, b = sqr(a = scale(x)))`, x an INPUT of 1 KiB."""
    ctx = Context("05.1")
    set_input(x := ctx.new_tensor_1d(F32, 256, name="x"))
    c = add(ctx, x, b := sqr(ctx, a := scale(ctx, x, 2.0)))
    (galloc := GAllocr(cpu_buffer_type())).reserve(build_forward(c))
    return tuple(galloc.hash_values[t].offset for t in (a, b, c))


def inplace_parent_port(can_inplace: bool, parents: list):
    """The port's `ggml_gallocr_allocate_node` placing a node with these sources: the slot it takes, or None."""
    ctx, events = Context("05.2"), list[object]()
    galloc = GAllocr(cpu_buffer_type(), trace=events.append)
    node = ctx.new_tensor_1d(F32, 16, name="node")
    node.op = Op.ADD if can_inplace else Op.MUL_MAT
    for i, p in enumerate(parents):
        t = None if p is None else ctx.new_tensor_1d(F32, 16 if p.same_layout else 8)
        if t is not None and p is not None:
            t.flags, hn = OUTPUT if p.output else 0, galloc.hash_get(t)
            hn.allocated, hn.offset, hn.n_children, hn.n_views = p.own, 64 * (i + 1), p.n_children, p.n_views
        node.set_src(i, t)
    galloc.allocate_node(node, 0)
    placed = next(e for e in events if isinstance(e, PlaceEvent) and e.tensor is node)
    return None if placed.parent is None else next(i for i, s in enumerate(node.src) if s is placed.parent)


def node_needs_realloc_port(data, view_src, alloc_size: int, talloc: TensorAlloc) -> bool:
    """The port's `ggml_gallocr_node_needs_realloc` on a tensor with these facts (an i8 tensor: nbytes = size)."""
    t = (ctx := Context("05.3")).new_tensor_1d(TYPES["i8"], alloc_size)
    t.view_src = None if view_src is None else ctx.new_tensor_1d(TYPES["i8"], alloc_size, name=view_src)
    t.data = data
    return GAllocr(cpu_buffer_type()).node_needs_realloc(t, talloc)

# %%
# | export graders.ch05
class _Recorder(GAllocr):
    """Notes each placement's facts, and the `node_needs_realloc` calls ggml makes (in order, to the first False)."""
    placements: list
    checks: list

    def allocate_node(self, node, buffer_id: int, node_index: int = -1, phase: str = "node") -> None:
        hv = self.hash_values
        if node.data is None and node.view_src is None and not (node in hv and hv[node].allocated) and node.src:
            self.placements.append((node.op in CAN_INPLACE, [None if p is None else Parent(
                p in hv and hv[p].allocated, bool((p.flags | (p.view_src.flags if p.view_src else 0)) & OUTPUT),
                are_same_layout(node, p), hv[p].n_children if p in hv else 0, hv[p].n_views if p in hv else 0)
                for p in node.src]))
        GAllocr.allocate_node(self, node, buffer_id, node_index, phase)

    def needs_realloc(self, graph) -> bool:
        if len(self.planned_nodes) == len(graph.nodes) and len(self.planned_leafs) == len(graph.leafs):
            for t, rec in ((t, rec) for node, alloc in zip(graph.nodes, self.node_allocs)
                           for t, rec in [(node, alloc.dst), *zip(node.src, alloc.src)] if t is not None):
                name = None if t.view_src is None else t.view_src.name or "(unnamed)"
                self.checks.append((t.data, name, self._alloc_size[0](t), rec))
                if not self.node_needs_realloc(t, rec):
                    break
        return GAllocr.needs_realloc(self, graph)


@functools.cache
def recorded_calls() -> tuple:
    """((fixture, placement), ...), ((fixture, needs_realloc call), ...) of the ggml-seed fixtures planned as ggml
    did, each set of facts once (none without tests/fixtures beside the package)."""
    placements, checks = dict[str, tuple](), dict[tuple, tuple]()
    for path in sorted(SEED.glob("*.json")) if SEED.is_dir() else ():
        doc, galloc = load_document(path), _Recorder(cpu_buffer_type())
        galloc.placements, galloc.checks = [], []
        if "graph" in doc:
            run_plan(doc, galloc=galloc, call="reserve", validate=False)
        for k, step in enumerate(doc.get("steps", [])):
            run_plan(doc, k, galloc, CALLS[step["call"]], validate=False)
        for args in galloc.placements:
            placements.setdefault(repr(args), (path.stem, args))
        for args in galloc.checks:
            checks.setdefault((args[0] is None, args[1] is None, *args[2:]), (path.stem, args))
    return tuple(placements.values()), tuple(checks.values())

# %%
# | export graders.ch05
INPLACE_RULES = {
    "reuse": "a node whose op can work in place takes the memory of a source that passes every test",
    "op": "only the ops of ggml_op_can_inplace (SCALE, ADD, MUL, ..., SOFT_MAX) look at their sources at all",
    "own memory": "a source the allocator does not hold (pre-allocated, a view, freed, given away) is skipped",
    "output": "an OUTPUT source (or a view of one) is never overwritten",
    "layout": "the source must have the node's layout (type, ne, nb): ggml_are_same_layout",
    "last user": "the node must be the source's last consumer: n_children == 1 (this node still counted)",
    "views": "a source with views still to run (n_views > 0) is kept",
    "first wins": "of several sources that pass, the first in slot order is taken",
    "any slot": "any slot may be taken, not only src[0]: the loop goes on past an empty slot or a failing source",
    "new block": "when no source passes, the node gets a new block: None",
}


def _omitting(rule: str, can_inplace: bool, parents: list):
    """The in-place rule with one condition left out, or its loop changed (to name a case's rule)."""
    hits = [i for i, p in enumerate(parents) if p is not None and (can_inplace or rule == "op")
            and (p.own or rule == "own memory") and (not p.output or rule == "output")
            and (p.same_layout or rule == "layout") and (p.n_children == 1 or rule == "last user")
            and (p.n_views == 0 or rule == "views") and (i == 0 or rule != "any slot")]
    return (hits[-1] if rule == "first wins" else hits[0]) if hits else None


def inplace_case(can_inplace: bool, parents: list, source: str, size: int, rule: str = "") -> Case:
    """A case of 05.2; its rule, unless given, is the first condition whose omission changes the answer."""
    want = inplace_parent_port(can_inplace, parents)
    rule = rule or next((r for r in list(INPLACE_RULES)[1:9] if _omitting(r, can_inplace, parents) != want),
                        "new block" if want is None else "reuse")
    return Case((can_inplace, parents), rule, source, size)


def inplace_cases():
    ok, p = Parent(True, False, True, 1, 0), Parent
    chapter: tuple[tuple[str, list], ...] = (  # one rule each, in the rules' order
            ("reuse", [ok]), ("op", [ok]), ("own memory", [p(False, False, True, 1, 0)]),
            ("output", [p(True, True, True, 1, 0)]), ("layout", [p(True, False, False, 1, 0)]),
            ("last user", [p(True, False, True, 2, 0)]), ("views", [p(True, False, True, 1, 1)]),
            ("first wins", [ok, ok]), ("any slot", [p(True, False, True, 2, 0), ok]), ("any slot", [None, ok]),
            ("new block", [p(True, True, True, 1, 0), p(True, False, True, 3, 0)]))
    for k, (rule, parents) in enumerate(chapter):
        yield inplace_case(rule != "op", parents, "chapter", k, rule)
    for name, (can, parents) in recorded_calls()[0]:
        yield inplace_case(can, parents, f"fixture {name}", 100 + len(parents))
    rng = random.Random(5)
    for _ in range(300):
        yield inplace_case(rng.random() < 0.85, [None if rng.random() < 0.1 else p(
            rng.random() < 0.8, rng.random() < 0.15, rng.random() < 0.8, rng.choice((1, 1, 2, 3)),
            rng.choice((0, 0, 0, 1))) for _ in range(rng.randint(1, 4))], "random", 1000)

# %%
# | export graders.ch05
NEEDS_REALLOC_RULES = {
    "fits": "True means the tensor FITS its slot (size_max >= its size): the name says the opposite",
    "equal fits": "a tensor exactly as large as its slot fits: >=, not >",
    "grew": "a tensor larger than its slot does not fit: False (alloc_graph then plans again)",
    "view or data": "a view or a pre-allocated tensor needs 0 bytes of the plan: it fits whatever the record says",
    "not placed": "the plan placed nothing in this slot (buffer_id -1); a tensor that needs memory there: False",
}


def needs_realloc_case(data, view_src, alloc_size: int, talloc, source: str, base: int) -> Case:
    """A case of 05.3, its size ordered by rule (so a mistake's smallest failing case names its rule)."""
    fit = "fits" if alloc_size < talloc.size_max else "equal fits" if alloc_size == talloc.size_max else "grew"
    rule = "view or data" if data is not None or view_src is not None else "not placed" if talloc.buffer_id < 0 else fit
    size = list(NEEDS_REALLOC_RULES).index(rule) * 10**9 + base + min(alloc_size, 10**8)
    return Case((data, view_src, alloc_size, talloc), rule, source, size)


def needs_realloc_cases():
    for data, view_src, size, rec in ((None, None, 2048, TensorAlloc(0, 0, 5120)), (None, None, 5120, TensorAlloc(
            0, 0, 5120)), (None, None, 8192, TensorAlloc(0, 0, 5120)), (None, "Qcur-0", 5120, NOT_PLACED),
            (0x10000, None, 4096, TensorAlloc(0, 0, 1024)), (None, None, 64, NOT_PLACED)):
        yield needs_realloc_case(data, view_src, size, rec, "chapter", 0)
    for name, (data, view_src, size, rec) in recorded_calls()[1]:
        yield needs_realloc_case(data, view_src, size, rec, f"fixture {name}", 10**8)
    rng = random.Random(5)
    for _ in range(300):
        size, data = rng.choice((4, 32, 100, 4096, 5120, 1 << 20)), rng.choice((None,) * 6 + (0x10000,))
        rec = TensorAlloc(0, 32 * rng.randrange(1000), max(0, size + rng.choice((-4, 0, 0, 32))))
        yield needs_realloc_case(data, rng.choice((None,) * 6 + ("v",)), size, rng.choice((rec, NOT_PLACED)),
                                 "random", 2 * 10**8)


register(
    Chapter("05", "The graph allocator", "05_gallocr"),
    Predict(id="05.1", title="where three tensors land", minutes=5, level="medium", expected=predicted_offsets,
            reasoning="x has two children (a, c), so a may not overwrite it: a gets a new block after x's 1,024 "
                      "bytes. b is a's only child: it takes a's block. c is x's last child, x the allocator's own "
                      "(INPUT only places it early): c takes x's block, slot 0, before b is looked at: {expected}."),
    Implement(id="05.2", title="in place or a new block", minutes=15, level="medium", function="inplace_parent",
              c_name="ggml_gallocr_allocate_node", reference=inplace_parent_port, cases=inplace_cases,
              rules=INPLACE_RULES),
    Implement(id="05.3", title="node_needs_realloc", minutes=10, level="easy", function="node_needs_realloc",
              c_name="ggml_gallocr_node_needs_realloc", reference=node_needs_realloc_port, cases=needs_realloc_cases,
              rules=NEEDS_REALLOC_RULES),
    Explore(id="05.4", title="the view-parent branch", minutes=15, level="hard"),
)

# %% [markdown]
# ### Solutions to chapter 05
#
# 05.1: (1024, 1024, 0). 05.2: the C's loop without its view branch. 05.3: the C's two lines, after a check.

# %%
# NBVAL_CHECK_OUTPUT
answer("05.1", (1024, 1024, 0), record_done=False)

# %%
# NBVAL_CHECK_OUTPUT
# solution 05.2
def inplace_parent(can_inplace, parents):
    for i, parent in enumerate(parents if can_inplace else []):
        if parent is not None and parent.own and not parent.output and parent.same_layout:
            if parent.n_children == 1 and parent.n_views == 0:
                return i
    return None


assert check("05.2", inplace_parent, record_done=False)

# %%
# NBVAL_CHECK_OUTPUT
# solution 05.3
def node_needs_realloc(data, view_src, alloc_size, talloc):
    if data is not None or view_src is not None:
        return True  # its size counts as 0
    return talloc.buffer_id != -1 and talloc.size_max >= alloc_size  # -1: nothing placed there


assert check("05.3", node_needs_realloc, record_done=False)

# %% [markdown]
# ## 2 · Chapter 06: backends
#
# 06.1's answer is read with the port's `tensor_get`. 06.2's reference gives two tensors buffers that note each
# call made on them and runs the port's `tensor_copy`. Its cases: the chapter's, one per rule; the input copies
# the real ggml's scheduler made in the 14 `ggml-seed-sched` scenarios (with `ggml_backend_tensor_copy`: CPU to
# FAKE, FAKE to CPU, FAKE to FAKE1, traced as `FAKE.set_tensor`, `FAKE.get_tensor`, `FAKE1.cpy_tensor`; as each
# scenario's `backends[i].cpy_tensor` says, a FAKE buffer copies from another FAKE buffer and the CPU's from host
# memory), each set of facts once; 100 random ones. Sizes follow the rules' order: a mistake fails on its rule.
#
# | mistake | smallest failing case | rule |
# |---|---|---|
# | the destination tested for host memory first | CPU to CPU | host source |
# | no `cpy_tensor` asked, the slow copy at once | device to device, the buffer copies | device copy |
# | a declined `cpy_tensor` taken as done | device to device, the buffer declines | slow copy |
# | a tensor copied onto itself | `src is dst` | same tensor |

# %%
# | export graders.ch06
"""Chapter 06's exercises (appendix A9): backends, graded with `ggml_lite.backend`: a partial read of a view, and
the calls `ggml_backend_tensor_copy` makes on its two buffers."""

import random
from pathlib import Path

import numpy as np

from ggml_lite.backend import tensor_copy, tensor_get, tensor_set
from ggml_lite.buffer import Buffer, BufferType, cpu_buffer_type
from ggml_lite.dyn_tallocr import captured_log
from ggml_lite.exercises import Case, Chapter, Explore, Implement, Predict, register
from ggml_lite.ops import transpose
from ggml_lite.tallocr import alloc_ctx_tensors
from ggml_lite.tensor import F32, Context
from ggml_lite.untrusted import read_json

SCHED = Path(globals().get("__file__", "graders/ch06.py")).resolve().parents[2] / "tests/fixtures/ggml-seed-sched"


def partial_read() -> float:
    """06.1: the float in bytes 16..19 of the transposed view of §1.1's 4×3 matrix, filled with 0..11."""
    ctx = Context("06.1")
    a = ctx.new_tensor_2d(F32, 4, 3)
    a_t = transpose(ctx, a)
    alloc_ctx_tensors(ctx, cpu_buffer_type())
    tensor_set(a, np.arange(12, dtype=np.float32))
    return float(np.frombuffer(tensor_get(a_t, 16, 4), np.float32)[0])


class _NotingBuffer(Buffer):
    """A buffer that notes each call made on it, as "src.get_tensor"."""

    def __init__(self, role: str, host: bool, copies: bool, calls: list):
        super().__init__(BufferType(role, 32, is_host=host), 64, 0x1000, owns_memory=False)
        self.role, self.copies, self.calls = role, copies, calls

    def set_tensor(self, tensor, data, offset: int, size: int) -> None:
        self.calls.append(f"{self.role}.set_tensor")

    def get_tensor(self, tensor, offset: int, size: int) -> bytes:
        self.calls.append(f"{self.role}.get_tensor")
        return bytes(size)

    def cpy_tensor(self, src, dst) -> bool:
        self.calls.append(f"{self.role}.cpy_tensor")
        return self.copies


def tensor_copy_port(same_layout: bool, same_tensor: bool, src_host: bool, dst_host: bool, dst_copies: bool) -> list:
    """The port's `ggml_backend_tensor_copy` between two tensors with these facts: the buffer calls it makes."""
    calls: list = []
    ctx = Context("06.2")
    src = ctx.new_tensor_1d(F32, 4)
    dst = src if same_tensor else ctx.new_tensor_1d(F32, 4 if same_layout else 8)
    for t, role, host in ((dst, "dst", dst_host), (src, "src", src_host)):
        t.buffer = _NotingBuffer(role, host, dst_copies, calls)
        t.data = t.buffer.data
    with captured_log():
        tensor_copy(src, dst)
    return calls

# %%
# | export graders.ch06
TENSOR_COPY_RULES = {
    "layout": "different layouts are refused before anything is done (the C asserts; here LayoutMismatchError)",
    "same tensor": "a tensor copied onto itself: nothing to do, no call",
    "host source": "a source in host memory: the destination's set_tensor from its bytes, whatever the destination",
    "host destination": "else, a destination in host memory: the source's get_tensor into its bytes",
    "device copy": "else the destination buffer's cpy_tensor is asked first; when it copies, that is all",
    "slow copy": "when cpy_tensor declines: the source's get_tensor to a host array, then the destination's set_tensor",
}


def tensor_copy_case(facts: tuple, source: str, base: int) -> Case:
    """A case of 06.2, its rule the first one its facts reach, its size ordered by rule."""
    same_layout, same_tensor, src_host, dst_host, dst_copies = facts
    rule = ("layout" if not same_layout else "same tensor" if same_tensor else "host source" if src_host
            else "host destination" if dst_host else "device copy" if dst_copies else "slow copy")
    return Case(facts, rule, source, base + list(TENSOR_COPY_RULES).index(rule))


def recorded_copies():
    """(scenario, facts) of the input copies the scheduler made in the recorded scenarios, each set once."""
    seen: dict = {}
    for path in sorted(SCHED.glob("*.json")) if SCHED.is_dir() else ():
        doc = read_json(path)
        host = {b["name"]: b["is_host"] for b in doc["backends"]}
        for split in (split for step in doc["steps"] for split in step.get("splits", [])):
            for src_host, dst_host in ((host[i["from_backend"]], host[split["backend"]]) for i in split["inputs"]):
                seen.setdefault((True, False, src_host, dst_host, src_host == dst_host), path.stem)
    return [(name, facts) for facts, name in seen.items()]


def tensor_copy_cases():
    for bits in ("00111", "11111", "10111", "10010", "10001", "10000"):  # one rule each, in the rules' order
        yield tensor_copy_case(tuple(bit == "1" for bit in bits), "chapter", 0)
    for name, facts in recorded_copies():
        yield tensor_copy_case(facts, f"fixture {name}", 100)
    rng = random.Random(6)
    for _ in range(100):
        same_layout, src_host = rng.random() < 0.9, rng.random() < 0.5
        same_tensor = same_layout and rng.random() < 0.1
        dst_host = src_host if same_tensor else rng.random() < 0.5
        yield tensor_copy_case((same_layout, same_tensor, src_host, dst_host, rng.random() < 0.5), "random", 200)


register(
    Chapter("06", "Backends", "06_backends"),
    Predict(id="06.1", title="a partial read of a view", minutes=5, level="medium", expected=partial_read,
            reasoning="with an offset, tensor_get returns raw bytes from the tensor's data + offset, in memory order; "
                      "only a whole read follows the view's strides. The transposed view starts where a does, so "
                      "bytes 16..19 are a's fifth float, {expected}, not the view's element [1, 1] (5.0)."),
    Implement(id="06.2", title="the calls of a tensor copy", minutes=15, level="medium", function="tensor_copy_calls",
              c_name="ggml_backend_tensor_copy", reference=tensor_copy_port, cases=tensor_copy_cases,
              rules=TENSOR_COPY_RULES),
    Explore(id="06.3", title="why an async copy waits for both backends", minutes=10, level="medium"),
)

# %% [markdown]
# ### Solutions to chapter 06
#
# 06.1: 4.0. 06.2: the C's branches in their order, each returning its calls. The order is the lesson: the host
# tests come before the destination buffer is asked anything, so a copy between the CPU and a device never
# reaches `cpy_tensor`, and a `cpy_tensor` that declines still counts as a call before the slow copy's two.

# %%
# NBVAL_CHECK_OUTPUT
answer("06.1", 4.0, record_done=False)

# %%
# NBVAL_CHECK_OUTPUT
# solution 06.2
from ggml_lite.errors import LayoutMismatchError  # noqa: E402


def tensor_copy_calls(same_layout, same_tensor, src_host, dst_host, dst_copies):
    if not same_layout:
        raise LayoutMismatchError("cannot copy tensors with different layouts")
    if same_tensor:
        return []
    if src_host:
        return ["dst.set_tensor"]
    if dst_host:
        return ["src.get_tensor"]
    if dst_copies:
        return ["dst.cpy_tensor"]
    return ["dst.cpy_tensor", "src.get_tensor", "dst.set_tensor"]


assert check("06.2", tensor_copy_calls, record_done=False)

# %% [markdown]
# ## 3 · Chapter 07: the CPU backend
#
# Three exercises. 07.1's bytes come from the port's `VEC_DOT_TYPE` (q4_0's dot type is q8_0) and `row_size`.
# 07.2's `quantize_row_q8_0_ref` is compared block by block with the port's, scale and 32 ints, so exactly
# the bytes, on the chapter's rows (one per rule, built so that only that rule is at stake), the rows ggml
# quantized for the q8_0 inputs of the op fixtures (`ggml-seed-ops`, 64 values a row) and 300 random rows;
# those get the first rule whose situation they hold (`q8_rule`: a zero block, an exact half, ...).
#
# | mistake | smallest failing case | rule |
# |---|---|---|
# | id = 1/d without the zero check (0·inf is NaN) | a block of zeros | zero block |
# | rounding halves to even (`np.rint`, `round`) | 2.5 and -2.5 on d = 1 | halves away |
# | `roundf` as `trunc(v ± 0.5)` computed in float32 | 0.49999997 on d = 1 | below a half |
# | the largest value instead of the largest magnitude | a block whose extreme is -127 | absmax |
# | storing the f32 d | max\|x\| = 1, d = 1/127 | f16 scale |
# | id from the stored f16 d | 0.49998 next to 1 (63.4975 against 63.501) | unrounded id |
# | x/d, or the CPU quantizer's 127/max\|x\| | a row found by search where the last bit crosses a half | 1/d |
# | one d for the whole row | two blocks of different scales | blocks |

# %%
# | export graders.ch07
"""Chapter 07's exercises (appendix A9): the CPU backend's dot types and ggml-quants.c's reference q8_0
quantizer, graded with `ggml_lite.cpu` and `ggml_lite.quants`."""

import json
from pathlib import Path

import numpy as np

from ggml_lite import quants
from ggml_lite.cpu import VEC_DOT_TYPE
from ggml_lite.exercises import Case, Chapter, Explore, Implement, Predict, register
from ggml_lite.tensor import Q4_0, row_size

OPS_FIXTURES = Path(quants.__file__).resolve().parents[1] / "tests" / "fixtures" / "ggml-seed-ops"
F4 = np.float32
Q8_RULES = {
    "zero block": "a block of zeros has d = 0 and id = 0 (`d ? 1.0f/d : 0.0f`): its values are 0, no NaN",
    "halves away": "`roundf` rounds a half away from zero: 2.5 gives 3 and -2.5 gives -3 (not to even)",
    "below a half": "`roundf` rounds the value itself: 0.49999997 gives 0, though 0.49999997 + 0.5 in float32 is 1.0",
    "absmax": "d is the largest *magnitude* over 127: max|x|, even when that value is negative",
    "f16 scale": "the stored d is the f32 d rounded to f16 (to nearest even), `GGML_FP32_TO_FP16`",
    "unrounded id": "the values are scaled by id = 1/d of the f32 d, not of the f16 d that is stored",
    "1/d": "x·id with id = 1.0f/d, all in float32: not x/d, not x·(127/max|x|); the last bit decides a half",
    "blocks": "every block of 32 values has its own d",
}


def q8_0_blocks(x) -> list:
    """07.2's reference: `quantize_row_q8_0_ref` of the row `x`, as [(d, [32 ints]), ...], one per block."""
    return [(float(b["d"]), [int(q) for q in b["qs"]]) for b in quants.quantize_row_q8_0_ref(np.asarray(x, F4))]


def same_blocks(expected, got) -> bool:
    """Blocks agree when every scale is the same number and every block holds the same 32 ints."""
    try:
        return [(float(d), [int(q) for q in qs]) for d, qs in got] == expected
    except (TypeError, ValueError, OverflowError):
        return False


def q8_rule(x) -> str:
    """The rule a row exercises: the first of `Q8_RULES` whose situation it holds."""
    xb = np.asarray(x, F4).reshape(-1, 32)
    amax = np.abs(xb).max(axis=1)
    d = amax / F4(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        _round = lambda v: np.trunc(v.astype(np.float64) + np.copysign(0.5, v))  # noqa: E731 (roundf)
        v = (xb * np.where(d != 0, F4(1) / d, F4(0)).astype(F4)[:, None]).astype(F4)
        dh = d.astype(np.float16).astype(F4)
        q, q16 = _round(v), _round(xb * np.where(dh != 0, F4(1) / dh, F4(0)).astype(F4)[:, None])
        up = np.trunc((np.abs(v) + F4(0.5)).astype(F4)) != np.trunc(np.abs(v).astype(np.float64) + 0.5)
        seen = {"zero block": (amax == 0).any(), "halves away": (np.abs(v) % 1 == 0.5).any(), "below a half": up.any(),
                "absmax": (xb.max(axis=1) < amax).any(), "f16 scale": (dh != d).any(),
                "unrounded id": (q16 != q).any(),
                "1/d": ((_round(xb * (F4(127) / amax)[:, None]) != q) | (_round(xb / d[:, None]) != q)).any()}
    return next((rule for rule, hit in seen.items() if hit), "blocks")

# %%
# | export graders.ch07
def _block(*head) -> np.ndarray:
    x = np.zeros(32, F4)
    x[:len(head)] = head
    return x


Q8_CHAPTER_CASES = (  # (rule, row), each built so that only its rule is at stake (the 1/d rows found by search)
    ("zero block", _block()), ("halves away", _block(127, 2.5, -2.5, 0.5, -0.5, 1.5, 63.5, -100)),
    ("below a half", _block(127, 0.49999997, -0.49999997)),
    ("absmax", _block(-127, 100, 3, -7, 12.25)), ("f16 scale", _block(1, 0.25, -0.75)),
    ("unrounded id", _block(1, 0.49998)), ("1/d", _block(0.9214553833007812, 0.4389610290527344)),
    ("1/d", _block(1.134989619255066, 0.344071626663208)),
    ("blocks", np.concatenate([_block(127, -50, 3), _block(63.5, -20, 10)])))


def _fixture_rows():
    """The f32 rows ggml quantized to q8_0 for the op fixtures, one case per 64-value row (none without them)."""
    for name in ("ops_mul_mat", "ops_get_rows"):
        try:
            doc = json.loads((OPS_FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        for case in doc.get("cases", []):
            for t in case.get("inputs", []):
                if t.get("type") == "q8_0" and t.get("source_f32"):
                    for i, row in enumerate(np.asarray(t["source_f32"], F4).reshape(-1, t["ne"][0])):
                        yield f"fixture ggml-seed-ops/{name}.json {case['name']} row {i}", row


def q8_cases():
    for i, (rule, x) in enumerate(Q8_CHAPTER_CASES):
        yield Case((x.tolist(),), rule, "chapter", i + 1 + 8 * (x.size // 32 - 1))
    for source, row in _fixture_rows():
        yield Case((row.tolist(),), q8_rule(row), source, 50 + row.size // 32)
    rng = np.random.default_rng(7)
    for _ in range(300):
        nb, kind = int(rng.integers(1, 4)), int(rng.integers(0, 4))
        n = 32 * nb  # uniform, normal of any scale, integers and halves (d = 1 below), mostly zeros
        x = (rng.uniform(-1, 1, n), rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4),
             rng.integers(-254, 255, n) / 2, np.where(rng.random(n) < 0.7, 0.0, rng.uniform(-3, 3, n)))[kind].astype(F4)
        if kind == 2:
            x[::32] = 127 * rng.choice([-1, 1], nb)
        x[:32] *= kind != 3 or rng.random() < 0.8  # now and then a whole zero block
        yield Case((x.tolist(),), q8_rule(x), "random", 100 + nb)


register(
    Chapter("07", "The CPU backend", "07_cpu_backend"),
    Predict(id="07.1", title="the bytes of a converted src1", minutes=5, level="easy",
            expected=lambda: 8 * row_size(VEC_DOT_TYPE[Q4_0.name], 4096),
            reasoning="x becomes the weight's dot type, and q4_0's is q8_0 (not q4_0, not f16): a row of 4096 values "
                      "is 128 q8_0 blocks of 34 bytes (an f16 scale, 32 int8s), 4352 bytes; 8 rows take {expected}. "
                      "w's 11008 rows do not enter: x is converted once, and every row of w meets it."),
    Implement(id="07.2", title="quantize_row_q8_0_ref", minutes=25, level="medium",
              function="quantize_row_q8_0_ref", c_name="quantize_row_q8_0_ref", reference=q8_0_blocks,
              cases=q8_cases, rules=Q8_RULES, same=same_blocks),
    Explore(id="07.3", title="what converting src1 to q8_0 costs", minutes=15, level="medium"),
)

# %% [markdown]
# ### Solutions to chapter 07
#
# 07.1: 34816 bytes (8 rows of 128 q8_0 blocks of 34 bytes). 07.2: the C with float32 numpy scalars; `roundf`
# is a truncation of x0 ± 0.5, exact in float64 for any float32 x0.

# %%
# NBVAL_CHECK_OUTPUT
answer("07.1", 34816, record_done=False)

# %%
# NBVAL_CHECK_OUTPUT
# solution 07.2
import numpy as np  # noqa: E402


def quantize_row_q8_0_ref(x):
    x = np.asarray(x, dtype=np.float32)
    blocks = []
    for i in range(0, len(x), 32):
        block = x[i:i + 32]
        amax = np.abs(block).max()
        d = amax / np.float32(127)
        inv = np.float32(1) / d if d else np.float32(0)
        qs = []
        for v in block:
            x0 = float(v * inv)  # the float32 product, widened exactly
            qs.append(int(np.trunc(x0 + np.copysign(0.5, x0))))
        blocks.append((float(np.float16(d)), qs))
    return blocks


assert check("07.2", quantize_row_q8_0_ref, record_done=False)

# %% [markdown]
# ## 4 · Chapter 08: a simulated accelerator
#
# Three exercises. 08.2's `simulate` is compared with the same calls played on the port (`simulate_on_sim`: one
# `SimBackend` per device name, all on one `SimClock`): the spans in the order they ran and the host's time, exactly,
# as all times are integers. 08.1 is the port's host time on its calls, each copy timed by SIM's cost model. Cases:
# the chapter's, one per rule, and 250 random ones on 2-3 devices, waiting only for recorded events of earlier devices.
#
# | mistake | smallest failing case (calls) | rule |
# |---|---|---|
# | running work as soon as it is queued | one work item and no synchronize: it never runs, so no span | lazy |
# | host = the device's time, even when the host is later | sync, 10 µs of host work, sync: never back | host waits |
# | items of one device overlapping | two items on one device, the second starting when the first ends | in order |
# | ignoring when an item was queued | 10 µs of host work, then work queued: it starts at 10, not 0 | issued |
# | skipping waits | SIM1 waits for SIM0's record, queued after 10 µs of work, then works: at 10 µs, not 0 | wait |
# | a wait draining the other queue whole | SIM0 has more work after its record: that stays queued | up to the record |
# | waiting for the event's latest record | SIM0 records the event again after the wait was queued | which record |

# %%
# | export graders.ch08
"""Chapter 08's exercises (appendix A9): SIM's queue, events and simulated clock, graded with `ggml_lite.sim`."""

import random
from typing import Any

from ggml_lite.exercises import Case, Chapter, Explore, Implement, Predict, register
from ggml_lite.sim import CostModel, SimClock, _Item, sim_init


def simulate_on_sim(calls):
    """08.2's reference: `calls` on SIM backends sharing a `SimClock` (`ggml_backend_event_wait`, `..._record`,
    `ggml_backend_synchronize`, `ggml_backend_event_synchronize`): (the work's spans in the order it ran, host time)."""
    clock, devices, events = SimClock(), dict[str, Any](), dict[str, Any]()
    for kind, *args in calls:
        if kind in ("work", "record", "wait", "sync") and args[0] not in devices:
            devices[args[0]] = sim_init(args[0], clock=clock)
        if kind == "work":
            devices[args[0]]._enqueue(_Item("compute", args[1], args[2]))
        elif kind == "host":
            clock.host += args[0]
        elif kind == "record":
            events.setdefault(args[1], devices[args[0]].event_new()).record()
        elif kind == "wait":
            devices[args[0]].event_wait(events[args[1]])
        else:  # "sync" a device, or "event_sync"
            (devices[args[0]] if kind == "sync" else events[args[0]]).synchronize()
    return [(s.lane, s.label, s.start, s.end) for s in clock.spans], clock.host


def event_wait_host_time() -> float:
    """08.1: the host's time (µs) at the end of its calls, each copy timed by SIM's `CostModel.copy_seconds`."""
    us = CostModel(copy_bw=1e9, latency=0.0).copy_seconds(1_000_000) * 1e6  # per MB
    calls = [("work", "SIM1", "y up", 2 * us), ("work", "SIM0", "x up", 3 * us), ("record", "SIM0", "e"),
             ("wait", "SIM1", "e"), ("work", "SIM1", "y down", 2 * us), ("sync", "SIM1")]
    return round(simulate_on_sim(calls)[1], 6)

# %%
# | export graders.ch08
QUEUE_RULES = {
    "lazy": "work runs only when needed: by a synchronize of its device, or a wait or event synchronize needing it",
    "host waits": "synchronize and event synchronize set the host's time to max(host, when the device got there)",
    "in order": "a device runs its queue one item after another: an item starts when the one before has ended",
    "issued": "an item starts no earlier than the host's time when it was queued",
    "wait": "after a wait, a device starts no earlier than the other device ran the record (run it that far)",
    "up to the record": "a wait runs the other queue only as far as the record it needs; the rest stays queued",
    "which record": "a wait is for the event's last record queued before the wait; a later record does not count",
    "together": "a longer mix of the calls: the rules above, together",
}
A, B, C = DEVICES = ("SIM0", "SIM1", "SIM2")
QUEUE_CHAPTER_CASES = (  # (rule, calls): each small enough to trace by hand
    ("lazy", [("work", A, "a", 5)]), ("host waits", [("work", A, "a", 5), ("sync", A)]),
    ("in order", [("work", A, "a", 5), ("work", A, "b", 3), ("sync", A)]),
    ("issued", [("host", 10), ("work", A, "a", 5), ("sync", A)]),
    ("host waits", [("work", A, "a", 5), ("sync", A), ("host", 10), ("sync", A)]),
    ("host waits", [("work", A, "a", 5), ("record", A, "e"), ("event_sync", "e"), ("host", 1)]),
    ("wait", [("work", A, "a", 10), ("record", A, "e"), ("wait", B, "e"), ("work", B, "b", 5), ("sync", B)]),
    ("up to the record", [("work", A, "a", 10), ("record", A, "e"), ("work", A, "c", 7), ("wait", B, "e"),
                          ("work", B, "b", 5), ("sync", B)]),
    ("which record", [("work", A, "a", 5), ("record", A, "e"), ("wait", B, "e"), ("work", A, "c", 10),
                      ("record", A, "e"), ("work", B, "b", 1), ("sync", B)]))


def random_calls(rng: random.Random) -> list:
    """4-21 calls on 2-3 devices; a device waits only for recorded events of a device before it (no cycle)."""
    devices, calls, owner = list(DEVICES[:rng.randint(2, 3)]), list[tuple](), dict[str, str]()  # event -> its device
    for i in range(rng.randint(4, 20)):
        r, d = rng.random(), rng.choice(devices)
        earlier = [e for e, o in owner.items() if devices.index(o) < devices.index(d)]
        if r < 0.4:
            calls.append(("work", d, f"w{i}", rng.randint(1, 20)))
        elif r < 0.5:
            calls.append(("host", rng.randint(1, 30)))
        elif r < 0.65:  # a new event, or one of this device's again
            owner[event := rng.choice([e for e, o in owner.items() if o == d] + [f"e{i}"])] = d
            calls.append(("record", d, event))
        elif r < 0.8 and earlier:
            calls.append(("wait", d, rng.choice(earlier)))
        elif 0.8 <= r < 0.92:
            calls.append(("sync", d))
        elif r >= 0.92 and owner:
            calls.append(("event_sync", rng.choice(sorted(owner))))
    return calls + ([("sync", rng.choice(devices))] if rng.random() < 0.8 else [])


def same_run(expected, got) -> bool:
    """Two runs agree when they hold the same spans in any order (two devices run at once, so "the order they
    ran" is not one order) and the same host time, times compared as numbers (2 == 2.0)."""
    def plain(run):
        spans, host = run
        return sorted((str(d), str(label), float(t0), float(t1)) for d, label, t0, t1 in spans), float(host)
    try:
        return plain(expected) == plain(got)
    except (TypeError, ValueError):
        return False


def queue_cases():
    yield from (Case((calls,), rule, "chapter", len(calls)) for rule, calls in QUEUE_CHAPTER_CASES)
    rng = random.Random(8)
    yield from (Case((calls,), "together", "random", 100 + len(calls)) for calls in
                (random_calls(rng) for _ in range(250)))


register(
    Chapter("08", "SIM, a simulated accelerator", "08_sim"),
    Predict(id="08.1", title="an event between two devices", minutes=5, level="easy", expected=event_wait_host_time,
            reasoning="the async calls only queue, all at host time 0. synchronize runs SIM1's queue: y's upload, 0 → "
                      "2000 µs; the wait needs SIM0's record, so SIM0 runs up to it: x's upload, 0 → 3000 µs, at the "
                      "same time on its own device. The download starts at max(2000, 3000), ends at 5000, the host "
                      "waits for it: {expected} µs. Not 4000 (the wait holds it back), not 7000 (both run at once)."),
    Implement(id="08.2", title="SIM's queue and events", minutes=35, level="hard", function="simulate",
              c_name="ggml_backend_event_wait", reference=simulate_on_sim, cases=queue_cases, rules=QUEUE_RULES,
              same=same_run, against="SIM"),
    Explore(id="08.3", title="a blocking copy after a queued one", minutes=15, level="medium"))

# %% [markdown]
# ### Solutions to chapter 08
#
# 08.1: 5000 µs. 08.2: per device a queue and its free time; per event its records and when each ran (`reach`).

# %%
# NBVAL_CHECK_OUTPUT
answer("08.1", 5000, record_done=False)

# %%
# NBVAL_CHECK_OUTPUT
# solution 08.2
def simulate(calls):
    host, queue, free, spans = 0, {}, {}, []
    owner, records, times = {}, {}, {}  # event -> its device, records queued; (event, n) -> when record n ran

    def execute(dev, item):
        kind, issued, arg = item
        start = max(free.get(dev, 0), issued, reach(*arg) if kind == "wait" else 0)
        if kind == "record":
            times[arg] = start
        free[dev] = start + (arg[1] if kind == "work" else 0)
        if kind == "work":
            spans.append((dev, arg[0], start, free[dev]))

    def reach(event, n):  # run the event's device until its record n has run
        dev = owner[event]
        while (event, n) not in times and queue.get(dev):
            execute(dev, queue[dev].pop(0))
        return times.get((event, n), 0)

    for kind, *args in calls:
        if kind == "record":
            owner[args[1]], records[args[1]] = args[0], records.get(args[1], 0) + 1
        if kind in ("work", "record", "wait"):
            arg = (args[1], args[2]) if kind == "work" else (args[1], records[args[1]])
            queue.setdefault(args[0], []).append((kind, host, arg))
        elif kind == "host":
            host += args[0]
        elif kind == "sync":
            while queue.get(args[0]):
                execute(args[0], queue[args[0]].pop(0))
            host = max(host, free.get(args[0], 0))
        else:
            host = max(host, reach(args[0], records[args[0]]))
    return spans, host


assert check("08.2", simulate, record_done=False)
