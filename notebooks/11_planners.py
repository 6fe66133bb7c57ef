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
# # 11 · Beyond ggml — offline planners against the lower bound
#
# ggml plans *online*. The graph allocator of chapter 05 visits the nodes in order, and each new
# tensor takes the free block that fits it best at that moment. It cannot know what comes later. A
# block freed now may be too small for the big tensor two nodes on, which then goes on top. On the
# 7B one-output graph (fixture 14) the compute buffer is 65.00 MiB. Yet at no node are more than
# 60.00 MiB alive at once. The other 5 MiB are holes.
#
# An *offline* planner sees every tensor's lifetime first and only then chooses offsets. That is
# what compilers for accelerators do: TFLite's greedy planners (Pisarchyk & Lee, 2020), XLA's heap
# simulator, MiniMalloc's exact search (ASPLOS 2023). This chapter builds three such planners in
# plain Python, the two TFLite ones and an exact search, and runs them on ggml's own graphs, with
# ggml's plan and the lower bound as yardsticks. Offline is not always better: greedy by size loses to
# ggml on some graphs, and §11 shows one.
#
# **Learning goals**
#
# 1. The planning problem ggml solves, stated offline: *blocks* with a size and a range of nodes,
#    taken from ggml's own trace. The in-place and freeing rules are those of chapter 05, so every
#    comparison is fair.
# 2. The peak-live **lower bound**: no placement of these blocks can use less memory. §2 shows the node
#    where it is reached.
# 3. Greedy by size, greedy by breadth, and an exact branch-and-bound search. The search proves a
#    plan optimal when it finishes within its time budget.
# 4. Plans that run. A planner's offsets go into the graph allocator's records, and the graph computes
#    there. Its results must equal, bit for bit, those of a copy in which no two tensors share memory
#    (the check is appendix A6's).
#
# Exported: `ggml_lite.planners`, the exact search's state and loop to `ggml_lite.exact_search`, and the
# figure to `ggml_lite.viz.planners`. Nothing here ports C, because ggml has no offline planner. The chapter
# reuses chapter 05: `ggml_gallocr_reserve`'s trace gives the blocks, and `ggml_gallocr_alloc_graph` places
# a plan. Appendix A6 runs the exact search by hand and builds the check of a plan by computing it
# (`ggml_lite.verify`), which this chapter uses without showing its code.

# %%
# | default_exp planners

# %% [markdown]
# ## 1 · The problem: blocks and their lifetimes
#
# Which tensors need memory, when, and how much? ggml's own trace answers all three (chapter 05's
# `trace_plan` and `lifetimes`). We keep every rule of the graph allocator and change only one
# decision: *where* each piece of memory goes.
#
# * A tensor that gets **new memory** from the dynamic allocator opens a **block**. Its size is the
#   size the allocator used, rounded up to the alignment (32 bytes on the CPU buffer type).
# * A child that takes its parent's memory **in place** joins the parent's block: the same bytes
#   under a new name. A chain such as `ffn_gate → ffn_silu → ffn_gate_par` is one block.
# * A block starts at the node where its first tensor is placed. Leafs and INPUT tensors are placed
#   before node 0, so their blocks start at node 0.
# * A block ends at the node that frees its chain's last tensor. Outputs, and tensors that nothing
#   frees, keep their block to the last node.
# * Views own nothing. They live in their root's block.
#
# Two blocks **conflict** when their node ranges meet, even at a single node. At node *i*, ggml places
# the node's memory *before* it frees the parents the node was the last to read. A node is computed
# from its parents, so it must not land on them.
#
# The trace has one quirk of ggml to respect. An INPUT *node* is placed in the counting loop
# (chapter 05, §1), before its own sources are counted. If exactly one reader of its parent has been
# counted so far, the in-place test passes, although that reader is another node. The child takes the
# parent's block and keeps it from node 0 on. When the parent is INPUT as well, ggml then finds it
# unplaced and places it a second time, in new memory, where it really lives. So a tensor lives where
# it was placed *last*, and the blocks follow that. Six of the first 2,000 random graphs of the
# differential generator do this.

# %%
# | export
"""Offline memory planners for a ggml graph (chapter 11; not a port of C: ggml has none): the blocks
ggml's graph allocator needs and their lifetimes, the peak-live lower bound, greedy-by-size and
greedy-by-breadth (TFLite), an exact branch and bound (its search: `exact_search`), and the
best of them and ggml's own plan. `alloc_planned` places a plan through the graph allocator; `verify`
(appendix A6) checks it by computing."""

import bisect
import itertools
import numbers
import time
from dataclasses import dataclass, field, replace

import numpy as np

from ggml_lite.errors import GraphError, PlanMismatchError, PlannerError
from ggml_lite.exact_search import ExactSearch
from ggml_lite.gallocr import NOT_PLACED, GAllocr, PlaceEvent
from ggml_lite.tensor import describe
from ggml_lite.trace import lifetimes, trace_plan

PLANNER_NAMES = ("ggml", "greedy-size", "greedy-breadth", "exact", "best")
DEFAULT_BUDGET = 1.0  # seconds the exact search may take before it returns its best placement


@dataclass
class Block:
    """One piece of memory a plan must provide: `tensors` use it in turn (an in-place chain: the tensor
    that got new memory, then each child that took it over), `size` bytes (aligned), from node `start`
    to node `end` inclusive; ggml put it at `ggml_offset` (None in a problem made by hand)."""

    index: int
    tensors: tuple
    size: int
    start: int
    end: int
    ggml_offset: int | None = None

    def overlaps(self, other) -> bool:
        """Are both blocks needed at some common node?"""
        return self.start <= other.end and other.start <= self.end

    @property
    def name(self) -> str:
        return " > ".join(t.name or "<unnamed>" for t in self.tensors) or f"block {self.index}"


@dataclass
class Problem:
    """A graph's planning problem: its `blocks`, the bytes `live` at each node, the `lower_bound` (the
    highest of them) and `lb_step`, the first node that reaches it; ggml's plan of the same graph
    (`ggml_peak`, its allocator `galloc`, the `ggml_seconds` it took, its trace `events`); `slack`, the
    bytes the buffer type adds to a peak (32 on the CPU buffer type, chapter 03). `block_of` maps each
    planned tensor to its block's index, `place_block` each `PlaceEvent` of the trace to its block."""

    graph: object
    blocks: list
    alignment: int
    live: list
    lower_bound: int
    lb_step: int
    ggml_peak: int | None = None
    slack: int = 0
    galloc: GAllocr | None = None
    ggml_seconds: float = 0.0
    events: list = field(default_factory=list, repr=False)
    block_of: dict = field(default_factory=dict, repr=False)
    place_block: list = field(default_factory=list, repr=False)

    def buffer_size(self, peak: int) -> int:
        """What the buffer type reports for a buffer made for `peak` bytes (`ggml_gallocr_get_buffer_size`)."""
        return peak + self.slack


# %% [markdown]
# `blocks_of` reads the trace in order. It reuses chapter 05's `lifetimes`, which gives one record
# per placement and says whether the placement was in place and of which parent. `problem_from_blocks`
# makes a problem by hand, with no graph and no ggml plan; the small examples and the tests use it.

# %%
# | export
def _live(blocks, n_steps: int) -> list:
    """The bytes of the blocks alive at each of the `n_steps` nodes: each block adds its size at its
    first node and takes it back after its last, and a running sum adds up the changes (one pass over
    the blocks, however long they live)."""
    change = [0] * (max(n_steps, 1) + 1)
    for b in blocks:
        change[b.start] += b.size
        change[b.end + 1] -= b.size
    return list(itertools.accumulate(change[:-1]))


def blocks_of(graph, buft=None) -> Problem:
    """The planning problem of `graph`: plan it with ggml's graph allocator (`ggml_gallocr_reserve`,
    through chapter 05's `trace_plan`; CPU buffer type unless `buft`) and turn the trace into blocks.
    The graph must not be allocated yet: a placed tensor counts as external, and its block vanishes."""
    own = [t for t in graph.nodes if t.view_src is None]
    if own and all(t.data is not None for t in own):  # (some nodes placed beforehand are external: fine)
        raise GraphError(f"every node of this graph already has memory ({describe(own[0])}, ...): it was planned "
                         f"or computed before, and would leave no block to plan; load or build the graph again")
    t0 = time.perf_counter()
    galloc, events = trace_plan(graph, buft)
    seconds = time.perf_counter() - t0
    if galloc.n_buffers != 1:
        raise PlanMismatchError(f"the planners plan one buffer; this allocator has {galloc.n_buffers}")
    chain: dict = {}  # tensor -> the block of its latest placement
    blocks: list = []
    place_block: list = []
    members: list = []  # members[k]: the tensors of block k, a list while it grows (a tuple's += copies it)
    for lt in lifetimes(graph, events):
        if lt.kind != "tensor":
            continue  # a view lives in its root's block
        b = chain.get(lt.parent) if lt.how.startswith("inplace") else None
        if b is None:  # new memory: a new block (lifetimes gives the aligned size)
            b = Block(len(blocks), (), lt.size, lt.start, lt.end, lt.offset)
            blocks.append(b)
            members.append([])
        members[b.index].append(lt.tensor)
        b.end = max(b.end, lt.end, b.start)
        chain[lt.tensor] = b
        place_block.append(b.index)
    for b, tensors in zip(blocks, members):  # a tensor placed twice lives where it was placed last
        b.tensors = tuple(t for t in tensors if chain[t] is b)
    live = _live(blocks, len(graph.nodes))
    lb = max(live)
    peak = galloc.buf_tallocs[0].get_max_size()
    return Problem(graph, blocks, galloc.bufts[0].get_alignment(), live, lb, live.index(lb), peak,
                   galloc.get_buffer_size(0) - peak, galloc, seconds, events,
                   {t: b.index for t, b in chain.items()}, place_block)


def problem_from_blocks(specs, alignment: int = 32) -> Problem:
    """A problem made by hand: `specs` lists `(size, start, end)` per block (sizes are rounded up to
    `alignment`). There is no graph and no ggml plan."""
    for k, spec in enumerate(specs):
        if (len(spec) != 3 or not all(isinstance(v, numbers.Integral) for v in spec) or spec[0] < 0
                or not 0 <= spec[1] <= spec[2]):
            raise PlannerError(f"block {k}: {spec!r} is not (size, start, end) with size >= 0 and "
                               f"0 <= start <= end, all integers")
    if not isinstance(alignment, numbers.Integral) or alignment < 1:
        raise PlannerError(f"alignment must be a positive integer, got {alignment!r}")
    blocks = [Block(k, (), -(-size // alignment) * alignment, start, end) for k, (size, start, end) in enumerate(specs)]
    live = _live(blocks, max([b.end + 1 for b in blocks], default=1))
    lb = max(live)
    return Problem(None, blocks, alignment, live, lb, live.index(lb))


# %% [markdown]
# ### A worked example: one LLaMA block
#
# Fixture 06 is chapter 05's LLaMA block of 10 tokens: 29 nodes, with the weights in a buffer of
# their own. ggml's compute buffer is 42,912 bytes, so its peak is 42,880 (the CPU buffer type adds
# 32). There are 18 blocks, and six are in-place chains. Two norms are multiplied by their weights over
# themselves: `norm-0 > attn_norm-0` and `norm_ffn-0 > ffn_norm-0`. The soft-max writes over the scores
# (`kq-0 > kq_soft_max_ext-0`). The residual adds write over their first operand: `kqv_out-0 >
# ffn_inp-0` and `ffn_down-0 > l_out-0`. The feed-forward's `ffn_gate-0 > ffn_silu-0 > ffn_gate_par-0`
# is a chain of three. The three INPUT leafs live from node 0 on. `l_out-0`, the OUTPUT, keeps its block
# to the last node, 28.

# %%
# NBVAL_CHECK_OUTPUT
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import ggml_lite as gl  # noqa: E402

SEED = Path("../tests/fixtures/ggml-seed")


def load(name: str, step: int = None):
    """A recorded graph, its weights (and KV cache) placed in buffers of their own, not yet planned."""
    gf = gl.read_graph_file(SEED / f"{name}.json", step)
    gl.graphio.allocate_external(gf)
    return gf


block06 = blocks_of(load("06_llama_block").graph)
peak06 = block06.ggml_peak
print(f"{len(block06.blocks)} blocks; ggml's peak {peak06} B, buffer {block06.buffer_size(peak06)} B")
print(f"{'#':>2} {'size':>6} {'nodes':>7} {'ggml offset':>11}  tensors")
for b in block06.blocks:
    print(f"{b.index:2d} {b.size:6d} {b.start:3d}..{b.end:<3d} {b.ggml_offset:11d}  {b.name}")

# %% [markdown]
# ggml's plan is one placement of these blocks, so it must be a valid one. The check below looks for two
# blocks that share a node and overlap in bytes, and finds none. The highest block ends at 42,880, ggml's
# peak. `check_placement` also checks that every offset is a multiple of the alignment.
#
# Comparing every pair of blocks that share a node would take n² steps on a graph whose n outputs all
# live to the end: 1.8 billion pairs for 60,000 of them. The check sweeps the nodes instead. Blocks
# enter in order of their first node and leave after their last, and the blocks alive at the sweep's
# node are kept by offset in a small max-tree (`LiveBytes`): each leaf is one offset of the placement
# and holds the highest end of the live blocks placed there, each inner node the highest end below it.
# A block entering at `[lo, hi)` meets the live blocks that start below `hi` and end above `lo`. The
# tree finds them by descending only into the subtrees whose highest end is above `lo`. A valid
# placement costs O(n log n) in all, and each overlap found adds O(log n).

# %%
# | export
class LiveBytes:
    """The blocks alive at one node of `check_placement`'s sweep, by offset: a max-tree over `keys`,
    the placement's distinct offsets, sorted. Leaf k holds the live blocks at offset `keys[k]` (block
    index -> its end) and their highest end; each inner node the highest end of its leaves (-1: none).
    `visits` counts the tree nodes looked at (a test counts them)."""

    def __init__(self, keys: list):
        self.keys, self.pos = keys, {o: k for k, o in enumerate(keys)}
        self.n = 1 << max(len(keys) - 1, 0).bit_length()  # leaves: a power of two
        self.top = [-1] * (2 * self.n)
        self.at: list[dict] = [{} for _ in keys]
        self.visits = 0

    def _set(self, k: int) -> None:
        """Leaf k's highest end changed: update it and its ancestors, up to the first one it leaves as is."""
        i = k + self.n
        self.top[i] = max(self.at[k].values(), default=-1)
        i //= 2
        while i:
            high = max(self.top[2 * i], self.top[2 * i + 1])
            if self.top[i] == high:
                return
            self.top[i], i = high, i // 2
            self.visits += 1

    def add(self, index: int, lo: int, hi: int) -> None:
        """Block `index`, at bytes [lo, hi), becomes live."""
        k = self.pos[lo]
        self.at[k][index] = hi
        self._set(k)

    def remove(self, index: int, lo: int) -> None:
        """Block `index`, at offset `lo`, is no longer live."""
        k = self.pos[lo]
        del self.at[k][index]
        self._set(k)

    def meeting(self, lo: int, hi: int) -> list:
        """The indices of the live blocks whose bytes meet [lo, hi): placed below `hi`, ending above `lo`."""
        limit, out, stack = bisect.bisect_left(self.keys, hi), [], [(1, 0, self.n)]
        while stack:
            i, first, last = stack.pop()  # tree node i covers the leaves first..last-1
            self.visits += 1
            if first >= limit or self.top[i] <= lo:
                continue
            if i >= self.n:
                out += [b for b, end in self.at[i - self.n].items() if end > lo]
            else:
                mid = (first + last) // 2
                stack += [(2 * i + 1, mid, last), (2 * i, first, mid)]
        return out


# %%
# | export
def check_placement(problem: Problem, offsets, live: LiveBytes | None = None) -> list:
    """What is wrong with `offsets` (one per block) as a placement (empty: nothing): an offset that is
    negative or not a multiple of the alignment, or two blocks needed at a common node whose bytes
    overlap (the earlier-starting one first). Blocks of zero bytes overlap nothing. A sweep over the
    nodes with the live blocks in a `LiveBytes` (`live`: a fresh one over the offsets of `offsets`;
    a test passes its own to count the work)."""
    out = []
    for b, o in zip(problem.blocks, offsets):
        if o < 0 or o % problem.alignment:
            out.append(f"block {b.index} ({b.name}) at offset {o}: not a multiple of {problem.alignment}")
    order = sorted((b for b in problem.blocks if b.size), key=lambda b: (b.start, b.index))
    leaving = sorted(order, key=lambda b: b.end)
    live = live if live is not None else LiveBytes(sorted({offsets[b.index] for b in order}))
    gone = 0
    for b in order:
        while leaving[gone].end < b.start:  # (it started before b, so it is in the tree)
            live.remove(leaving[gone].index, offsets[leaving[gone].index])
            gone += 1
        ob = offsets[b.index]
        met = [problem.blocks[k] for k in live.meeting(ob, ob + b.size)]
        for a in sorted(met, key=lambda a: (a.start, a.index)):
            oa = offsets[a.index]
            out.append(f"blocks {a.index} ({a.name}; nodes {a.start}..{a.end}; [{oa}, {oa + a.size})) and "
                       f"{b.index} ({b.name}; nodes {b.start}..{b.end}; [{ob}, {ob + b.size})) overlap")
        live.add(b.index, ob, ob + b.size)
    return out


def peak_of(problem: Problem, offsets) -> int:
    """The memory a placement needs: the highest end of a block."""
    return max([o + b.size for o, b in zip(offsets, problem.blocks)], default=0)


# %%
# NBVAL_CHECK_OUTPUT
ggml06 = [b.ggml_offset for b in block06.blocks]
print("conflicts in ggml's plan:", check_placement(block06, ggml06), "; its peak:", peak_of(block06, ggml06))

# %% [markdown]
# ## 2 · The lower bound
#
# Take any node. The blocks alive there are all needed at once, so they need disjoint bytes. Their total
# is therefore a floor for every placement. The highest such total over all nodes, the **peak live**,
# is the lower bound. Chapter 05 drew it as the dashed line of its memory timeline. Nothing guarantees
# it can be reached: blocks of awkward sizes can force a hole that no placement avoids (§6 has seven
# such blocks). On ggml's graphs it usually can be reached.
#
# In the LLaMA block the peak live is 37,760 bytes at node 25, `ffn_up-0`. Four blocks are alive
# there: the residual `ffn_inp-0` (5,120), `ffn_norm-0` (5,120), the gate chain (13,760) and `ffn_up-0`
# itself (13,760). The attention's blocks and the inputs are gone by then. ggml needs 42,880 B, which is
# 13.6 % more.

# %%
# NBVAL_CHECK_OUTPUT
at = block06.lb_step
print(f"lower bound {block06.lower_bound} B at node {at} ({block06.graph.nodes[at].name}); alive there:")
for b in block06.blocks:
    if b.start <= at <= b.end:
        print(f"  {b.size:6d}  {b.name}")
print(f"ggml: {block06.ggml_peak} B = {block06.ggml_peak / block06.lower_bound:.3f} x the lower bound")

# %% [markdown]
# ## 3 · What a planner returns
#
# Every planner returns a `PlanResult`. It holds an offset per block, the peak those offsets need, the
# lower bound, whether the plan is **optimal**, and how long planning took. `optimal` is True when it is
# proven: the peak equals the lower bound, or the exact search finished. It is False when a smaller plan
# is known, for instance ggml's own. Otherwise it is None. `buffer_size` is what the CPU buffer type
# would report: the peak plus 32. `ggml_plan` re-expresses ggml's own placement in this form.

# %%
# | export
@dataclass
class PlanResult:
    """A planner's decision: `offsets[k]` for block k; the `peak` they need and the problem's
    `lower_bound`; `optimal` True (proven), False (a smaller plan is known) or None (unknown); the
    planning time in `seconds`; `buffer_size` as the buffer type reports the peak; `source`, the
    planner whose plan `best` took; `nodes`, the steps of the exact search; `stopped`, True when the
    planner's deadline passed before it finished (see `Deadline`)."""

    planner: str
    offsets: tuple
    peak: int
    lower_bound: int
    optimal: bool | None
    seconds: float
    buffer_size: int
    source: str | None = None
    nodes: int = 0
    stopped: bool = False

    def describe(self) -> str:
        """One line: planner, peak, ratio to the lower bound, optimality, time (and a stop by the budget)."""
        opt = {True: "optimal", False: "not optimal", None: "optimality unknown"}[self.optimal]
        src = f" ({self.source}'s plan)" if self.source else ""
        ratio = self.peak / self.lower_bound if self.lower_bound else 1.0
        stop = ", stopped by its budget" if self.stopped else ""
        return (f"{self.planner}{src}: {self.peak} B, {ratio:.4f} x the lower bound, {opt}, "
                f"{self.seconds * 1e3:.1f} ms{stop}")


def plan_result(problem: Problem, planner: str, offsets, seconds: float, optimal=None, nodes: int = 0,
                stopped: bool = False) -> PlanResult:
    """A PlanResult; a peak at the lower bound is optimal, one above ggml's is not."""
    peak = peak_of(problem, offsets)
    if peak == problem.lower_bound:
        optimal = True
    elif optimal is None and problem.ggml_peak is not None and peak > problem.ggml_peak:
        optimal = False
    return PlanResult(planner, tuple(offsets), peak, problem.lower_bound, optimal, seconds,
                      problem.buffer_size(peak), nodes=nodes, stopped=stopped)


def ggml_plan(problem: Problem) -> PlanResult:
    """ggml's own plan (the offsets `ggml_gallocr_reserve` chose) as offsets of the blocks."""
    if problem.ggml_peak is None:
        raise PlanMismatchError("this problem was made by hand: it has no ggml plan")
    return plan_result(problem, "ggml", [b.ggml_offset if b.size else 0 for b in problem.blocks], problem.ggml_seconds)


# %% [markdown]
# ggml's plan costs nothing more: the trace already holds it. The other planners work against a
# **budget** of seconds, so that `plan --planner exact --budget 1` returns after about a second on a
# graph of any size. A `Deadline` is made when a planning call starts and shared by every phase of it:
# the greedy plans, the exact search's setup and its search. Each loop whose length grows with the graph
# asks it whether time is up. A planner stopped by it still returns a valid plan and says so
# (`stopped`). A test gives it a fake clock that advances at every reading, so the stop is checked
# without measuring time.

# %%
# | export
class Deadline:
    """When a planning call must stop: `budget` seconds (None: never) after the deadline was made, as
    read on `clock` (`time.perf_counter`; a test passes a fake clock)."""

    def __init__(self, budget: float | None = None, clock=time.perf_counter):
        self.clock, self.start = clock, clock()
        self.at = None if budget is None else self.start + budget

    def passed(self) -> bool:
        """Is the time up? (Never, without a budget.)"""
        return self.at is not None and self.clock() > self.at


# %% [markdown]
# ## 4 · Greedy by size
#
# The first TFLite planner sorts the blocks by size, largest first, and places them one at a time. Each
# block looks at the blocks already placed that share a node with it. Sorted by offset, they leave gaps
# between them, starting from offset 0. The block takes the *smallest* gap that holds it (best fit), or
# goes above all of them when no gap is large enough. The idea is that big blocks are the hard ones, so
# they choose first and the small ones fill in around them. Lifetimes play no part in the order, and
# §11 shows what that costs.
#
# `_lowest_gap` is the shared step, and `_fill` places the blocks in a planner's order with it. Both
# greedy planners use them. When the deadline passes, `_fill` puts every block still to place above all
# the others, one on top of the next: a valid plan, not a small one.

# %%
# | export
def _lowest_gap(block: Block, busy: list) -> int:
    """The offset for `block` among the bytes `busy` ([lo, hi) of each placed block it shares a node
    with): the start of the smallest gap between them that holds it (the lowest of equal gaps), else
    above the highest."""
    best, best_gap, top = None, None, 0
    for lo, hi in sorted(busy):
        gap = lo - top
        if gap >= block.size and (best_gap is None or gap < best_gap):
            best, best_gap = top, gap
        top = max(top, hi)
    return top if best is None else best


def _fill(problem: Problem, order: list, deadline: Deadline) -> tuple:
    """Place the blocks of `order` in turn, each at `_lowest_gap` among those placed before it that
    share a node with it (found by one numpy comparison). Once `deadline` has passed, the blocks left
    go above all others, stacked. Returns (offsets, stopped)."""
    offsets, top = [0] * len(problem.blocks), 0
    start = np.array([b.start for b in order], dtype=np.int64)
    end = np.array([b.end for b in order], dtype=np.int64)
    for k, b in enumerate(order):
        if deadline.passed():
            for rest in order[k:]:
                offsets[rest.index], top = top, top + rest.size
            return offsets, True
        meet = np.flatnonzero((start[:k] <= b.end) & (b.start <= end[:k]))
        offsets[b.index] = _lowest_gap(b, [(offsets[order[j].index], offsets[order[j].index] + order[j].size)
                                           for j in meet])
        top = max(top, offsets[b.index] + b.size)
    return offsets, False


def greedy_by_size(problem: Problem, deadline: Deadline | None = None) -> PlanResult:
    """Greedy by size (TFLite's offset planner; Pisarchyk & Lee, 2020; not a C port): blocks from the
    largest (ties: earlier start, then index), each into the smallest gap that holds it; stopped by
    `deadline` (default: none), the blocks left go on top."""
    deadline = deadline or Deadline()
    t0 = deadline.clock()
    order = sorted((b for b in problem.blocks if b.size), key=lambda b: (-b.size, b.start, b.index))
    offsets, stopped = _fill(problem, order, deadline)
    return plan_result(problem, "greedy-size", offsets, deadline.clock() - t0, stopped=stopped)


# %% [markdown]
# On the LLaMA block, the two 13,760-byte feed-forward blocks go first, at 0 and 13,760. Every block
# that shares a node with one of them has to fit in the bytes the two leave free. The 5,120-byte blocks
# come next and fill the gaps. The result reaches the lower bound, 37,760 B. `offsets` lists every
# block's place:

# %%
# NBVAL_CHECK_OUTPUT
size06 = greedy_by_size(block06)
print(size06.describe().rsplit(",", 1)[0])
print("offsets:", size06.offsets)
print("valid:", not check_placement(block06, size06.offsets))

# %% [markdown]
# ## 5 · Greedy by breadth
#
# The second TFLite planner starts from the nodes instead. A node's *breadth* is the bytes alive there,
# the `live` profile of §2. The planner visits the nodes from the broadest down. At each node it places
# the blocks alive there that still have no offset, largest first, with the same smallest-gap rule. The
# crowded nodes, where the lower bound is decided, are settled first. Blocks that live only at quiet
# nodes are placed last, into whatever room is left. The order depends on sizes and nodes alone, so it
# is decided first and `_fill` places the blocks in it. Finding the blocks alive at a node is one numpy
# comparison over all blocks, not a list per node: a block alive at 10,000 nodes would sit in 10,000
# lists.

# %%
# | export
def greedy_by_breadth(problem: Problem, deadline: Deadline | None = None) -> PlanResult:
    """Greedy by breadth (TFLite's offset planner; Pisarchyk & Lee, 2020; not a C port): nodes from the
    most live bytes down (ties: earlier node); at each, its unplaced live blocks, largest first (ties:
    index), each into the smallest gap that holds it; stopped by `deadline` (default: none), the
    blocks left go on top."""
    deadline = deadline or Deadline()
    t0 = deadline.clock()
    start = np.array([b.start for b in problem.blocks], dtype=np.int64)
    end = np.array([b.end for b in problem.blocks], dtype=np.int64)
    todo = np.array([b.size > 0 for b in problem.blocks], dtype=bool)  # not in `order` yet
    order, left = [], int(todo.sum())
    for step in sorted(range(len(problem.live)), key=lambda i: (-problem.live[i], i)):
        if not left or deadline.passed():
            break
        alive = np.flatnonzero(todo & (start <= step) & (step <= end))  # the unplaced blocks alive here
        todo[alive], left = False, left - len(alive)
        order += sorted((problem.blocks[k] for k in alive), key=lambda b: (-b.size, b.index))
    order += [problem.blocks[k] for k in np.flatnonzero(todo)]  # (when the deadline passed: stacked)
    offsets, stopped = _fill(problem, order, deadline)
    return plan_result(problem, "greedy-breadth", offsets, deadline.clock() - t0, stopped=stopped)


# %% [markdown]
# On the LLaMA block, node 25 is the broadest (37,760 B), and its four blocks are placed first, which
# is the lower bound already. Every later block fits around them:

# %%
# NBVAL_CHECK_OUTPUT
breadth06 = greedy_by_breadth(block06)
print(breadth06.describe().rsplit(",", 1)[0], "; valid:", not check_placement(block06, breadth06.offsets))

# %% [markdown]
# ## 6 · An exact search
#
# Both greedy planners decide each block once and never go back. An exact planner must consider every
# placement, or at least enough of them to be sure that none is better. Two observations cut the search
# down to something that can finish.
#
# **Canonical placements** (the idea behind MiniMalloc). Take any valid placement and let every block
# fall as far as it can, the lowest block first, until it rests on a block it shares a node with or
# on offset 0. Nothing rises, so the peak does not grow, and the result is still valid. Now list the
# fallen blocks by offset. Each one sits exactly at the highest end among the blocks *before it in the
# list* that share a node with it. The list therefore fixes the placement. The search only has to choose
# orders, place each block on the "skyline" of those before it, and keep orders whose offsets never
# decrease. Blocks at equal offsets never share a node, so they are taken in index order. Identical
# blocks (same size, same nodes) are interchangeable and are also taken in index order.
#
# **Bounds.** Work in *sections*: stretches of nodes in which the same blocks are alive. For each
# section keep its *floor* (the highest end of the blocks placed there so far) and the units still to
# place there. Every block still to come goes at or above the last offset. All blocks left in one
# section share a node, so they stack, and `max(floor, last) + left` is a floor for the final peak.
# When that exceeds the target, the branch is cut. A block that can no longer go at or above the last
# offset has to rest on a block not yet placed. If no such block is left in its sections, the branch
# is dead.
#
# The search first asks for a placement *at the lower bound*, where these bounds cut hardest. If one is
# found, it is optimal. If the search proves there is none, it asks for anything below the best plan
# known so far (the incumbent: ggml's or a greedy plan) and tightens the target after each find. When
# the search finishes, the answer is proven optimal. When the time budget runs out first, it returns the
# best placement found, which is never worse than the incumbent.

# %% [markdown]
# The search's state is a class, `ExactSearch`, and everything in it is counted in units of the alignment,
# so every offset it produces is aligned. Block i spans sections `s0[i]` to `s1[i] - 1`. Per section the
# state keeps the `floor`, and the units (`rem`) and blocks (`cnt`) still to place there. `twin[i]` is the
# previous block identical to block i: of two twins, the later is tried only once the earlier is placed.
# The steps that change the state are functions attached to it with `@method_of` (chapter 00), as the
# ported C functions are. The exceptions `_Timeout` and `_Found` end a search from any depth.

# %%
# | export exact_search
"""The exact planner's search (chapter 11; not a port of C): branch and bound over canonical
placements, in the spirit of MiniMalloc, in units of the alignment. `planners.exact` drives it."""

import itertools
import sys
from typing import TYPE_CHECKING

from ggml_lite.bind import method_of


class _Timeout(Exception):
    """The exact search ran out of time."""


class _Found(Exception):
    """The exact search found a placement it can stop at (one at the lower bound)."""


# %% [markdown]
# `bound(last)` is the floor for any completion described above: the blocks left in a section stack
# above its floor and above `last`, the offset of the block placed last. `candidates` lists the blocks
# that may come next, lowest offset first. It returns None for a dead branch: a block below `last` that
# no block still to come shares a section with.

# %%
# | export exact_search
class ExactSearch:
    """The state of `exact`'s search (not a C port), in units of the alignment. Section s is a stretch
    of nodes with the same live blocks; `floor[s]` is the highest end of the blocks placed so far that
    live there, `rem[s]` the units of those still to place, `cnt[s]` how many they are. `twin[i]` is the
    previous block identical to block i (same size and sections), or -1. `problem` is a
    `planners.Problem` (its `blocks` and `alignment`); the search stops when `deadline.passed()` (a
    `planners.Deadline`)."""

    def __init__(self, problem, deadline):
        self.blocks = [b for b in problem.blocks if b.size]
        cuts = sorted({b.start for b in self.blocks} | {b.end + 1 for b in self.blocks})
        at = {c: k for k, c in enumerate(cuts)}
        self.size = [b.size // problem.alignment for b in self.blocks]
        self.s0 = [at[b.start] for b in self.blocks]
        self.s1 = [at[b.end + 1] for b in self.blocks]  # one past the block's last section
        n = max(len(cuts) - 1, 0)
        rem, cnt = [0] * (n + 1), [0] * (n + 1)  # changes where blocks start and end (as in `_live`)
        for i, u in enumerate(self.size):
            rem[self.s0[i]] += u
            rem[self.s1[i]] -= u
            cnt[self.s0[i]] += 1
            cnt[self.s1[i]] -= 1
        self.rem, self.cnt = list(itertools.accumulate(rem))[:n], list(itertools.accumulate(cnt))[:n]
        self.floor = [0] * n
        self.twin: list[int] = []
        last_seen: dict[tuple, int] = {}
        for i, key in enumerate(zip(self.size, self.s0, self.s1)):
            self.twin.append(last_seen.get(key, -1))
            last_seen[key] = i
        self.unplaced = set(range(len(self.blocks)))
        self.offset = [0] * len(self.blocks)
        self.deadline, self.nodes = deadline, 0
        self.target = self.stop_at = 0
        self.solution = None  # (peak, offsets), in units

    def bound(self, last: int) -> int:
        """A floor for any completion: the blocks left in a section stack above its floor and `last`."""
        m = 0
        for f, r in zip(self.floor, self.rem):
            if r and (f if f > last else last) + r > m:
                m = (f if f > last else last) + r
        return m

    def candidates(self, last: int, last_i: int):
        """`(offset, -sections, -size, block)` of each block that may come next, in the order to try
        them: lowest offset first, then the longest-lived, then the largest. None when a block below
        `last` can never be placed (no block left to place shares a section with it). On thousands of
        long-lived blocks this one step can take seconds: it looks at the clock every 64 blocks."""
        out, floor, s0, s1, cnt = [], self.floor, self.s0, self.s1, self.cnt
        for k, i in enumerate(self.unplaced):
            if k % 64 == 63 and self.deadline.passed():
                raise _Timeout
            p = max(floor[s0[i]:s1[i]])
            if p < last or (p == last and i < last_i):
                if all(cnt[s] == 1 for s in range(s0[i], s1[i])):
                    return None
                continue
            if self.twin[i] < 0 or self.twin[i] not in self.unplaced:
                out.append((p, s0[i] - s1[i], -self.size[i], i))
        out.sort()
        return out


# %% [markdown]
# Placing a block raises the floor of its sections to its end, and taking it back restores them. `dfs`
# tries the candidates in order, and every complete placement it reaches becomes the solution and lowers
# the target below itself. `run(target, stop_at)` returns True when the search is complete, because it
# found a placement of at most `stop_at` units or proved that none of at most `target` exists, and False
# when the deadline passed first. `exact` asks twice: first for the lower bound, then for anything below
# the incumbent. Appendix A6 (§1) runs the search by hand.

# %%
# | export exact_search
@method_of(ExactSearch)
def place(search, i: int, p: int) -> list:
    """Put block i at offset p; returns the floors it covered (for `unplace`)."""
    saved = search.floor[search.s0[i]:search.s1[i]]
    for s in range(search.s0[i], search.s1[i]):
        search.floor[s] = p + search.size[i]
        search.rem[s] -= search.size[i]
        search.cnt[s] -= 1
    search.unplaced.discard(i)
    search.offset[i] = p
    return saved


@method_of(ExactSearch)
def unplace(search, i: int, saved: list) -> None:
    """Take block i back out: its sections get their floors `saved` and its units back."""
    search.floor[search.s0[i]:search.s1[i]] = saved
    for s in range(search.s0[i], search.s1[i]):
        search.rem[s] += search.size[i]
        search.cnt[s] += 1
    search.unplaced.add(i)


@method_of(ExactSearch)
def dfs(search, last: int, last_i: int, top: int) -> None:
    """Place the blocks left, in canonical order after block `last_i` at offset `last`; `top` is the
    highest end so far. A complete placement becomes the solution and lowers the target below it."""
    search.nodes += 1
    if search.deadline.passed():
        raise _Timeout
    if not search.unplaced:
        search.solution = (top, list(search.offset))
        if top <= search.stop_at:
            raise _Found
        search.target = top - 1
        return
    if max(top, search.bound(last)) > search.target:
        return
    for p, _, _, i in search.candidates(last, last_i) or ():
        end = p + search.size[i]
        if end <= search.target:
            saved = place(search, i, p)
            dfs(search, p, i, max(top, end))
            unplace(search, i, saved)


@method_of(ExactSearch)
def run(search, target: int, stop_at: int) -> bool:
    """Search for placements with a peak of at most `target` units, stopping at one of at most
    `stop_at`. True when the search is complete: such a placement was found, or none exists."""
    search.target, search.stop_at = target, stop_at
    limit = sys.getrecursionlimit()  # one level per block
    sys.setrecursionlimit(max(limit, len(search.blocks) + 200))
    try:
        dfs(search, 0, -1, 0)
    except _Found:
        return True
    except _Timeout:
        return False
    finally:
        sys.setrecursionlimit(limit)
    return True


# %%
# | export
def _cheap_plans(problem: Problem, deadline: Deadline) -> dict:
    """ggml's plan (when the problem has one) and both greedy plans, by name, the greedy ones within
    `deadline`."""
    out = {"ggml": ggml_plan(problem)} if problem.ggml_peak is not None else {}
    out["greedy-size"] = greedy_by_size(problem, deadline)
    out["greedy-breadth"] = greedy_by_breadth(problem, deadline)
    return out


def exact(problem: Problem, budget: float = DEFAULT_BUDGET, incumbent: PlanResult | None = None,
          deadline: Deadline | None = None) -> PlanResult:
    """The exact planner (branch and bound over canonical placements, in the spirit of MiniMalloc; not
    a C port). It looks for a placement at the lower bound and, when none exists, for one below
    `incumbent` (default: the best of ggml's plan and the greedy planners, ggml's first of equals).
    `optimal` is True when the search finished in time; otherwise it returns the best placement it
    knows (`stopped`). Time runs out at `deadline`, by default `budget` seconds after this call: the
    starting plans, the search's setup and the search itself all count."""
    deadline = deadline or Deadline(budget)
    t0 = deadline.clock()
    if incumbent is None:
        incumbent = min(_cheap_plans(problem, deadline).values(), key=lambda r: r.peak)
    a = problem.alignment
    lb, inc = -(-problem.lower_bound // a), incumbent.peak // a
    search = ExactSearch(problem, deadline)
    proven = inc <= lb or search.run(lb, lb) and (search.solution is not None or search.run(inc - 1, lb))
    offsets = list(incumbent.offsets)
    if search.solution is not None and search.solution[0] < inc:
        offsets = [0] * len(problem.blocks)
        for b, u in zip(search.blocks, search.solution[1]):
            offsets[b.index] = u * a
    return plan_result(problem, "exact", offsets, deadline.clock() - t0, True if proven else None,
                       nodes=search.nodes, stopped=not proven)


# %% [markdown]
# ### A worked example the greedy planner gets wrong
#
# Four blocks over nodes 0 to 5: two of 64 bytes that live one node each (block 0 at node 3, block 1
# at node 5), and two of 32 bytes, block 2 at nodes 4..5 and block 3 at nodes 0..4. At most 96 bytes
# are alive at once. Greedy by size places block 0 at 0, then block 1 at 0 as well, since they never
# meet. Of the small blocks, block 3 starts earlier and goes first, above block 0 at 64. Block 2 meets
# block 1 at node 5 and block 3 at node 4, so it has to go on top, at 96, and the peak is 128. Greedy
# by breadth settles node 3 first (96 bytes: blocks 0 and 3), then node 5, and ends up the same. The
# exact search finds 96. It puts block 2 at 0 with block 1 on top of it at 32, and block 3 at 64 above
# block 0. Because 96 is the lower bound, that answer is proven optimal. A greedy planner on its own
# cannot tell whether 128 is optimal, so it says None. `all_plans` (§7) compares the plans and marks
# it False.

# %%
# NBVAL_CHECK_OUTPUT
four = problem_from_blocks([(64, 3, 3), (64, 5, 5), (32, 4, 5), (32, 0, 4)])
for planner in (greedy_by_size, greedy_by_breadth, exact):
    r = planner(four)
    print(f"{r.planner:15s} offsets {r.offsets}  peak {r.peak}  optimal {r.optimal}")
print("lower bound", four.lower_bound)

# %% [markdown]
# ### When the lower bound cannot be reached
#
# Seven blocks over nodes 0 to 4, in units of 32 bytes: A (3 units) at node 0, B (2) at nodes 0..1,
# C (1) at 1..2, D (2) at 1..3, E (1) at 2..3, F (2) at 3..4 and G (3) at node 4. At most five units are
# alive at once (nodes 0, 1, 3 and 4), so the lower bound is 160 bytes, yet no placement fits in five
# units (appendix A6 argues it by hand). The search's first phase finds no placement at 160 bytes and
# ends, which proves that none exists. The second phase finds 192 and finishes, so the answer is proven
# optimal although it lies above the lower bound.

# %%
# NBVAL_CHECK_OUTPUT
seven = problem_from_blocks([(96, 0, 0), (64, 0, 1), (32, 1, 2), (64, 1, 3), (32, 2, 3), (64, 3, 4), (96, 4, 4)])
exact7 = exact(seven)
print(f"lower bound {seven.lower_bound}; exact: peak {exact7.peak}, optimal {exact7.optimal}, offsets {exact7.offsets}")

# %% [markdown]
# ## 7 · The best plan
#
# `best` runs every planner and keeps the smallest plan, and ggml's own plan takes part. `best` can
# therefore never be worse than ggml. On a tie, ggml's plan is kept, so `best` only moves tensors when
# doing so saves memory. The exact search starts from the best of the other three, which makes it the
# smallest by construction, and the search runs only when no plan is at the lower bound yet.
# `all_plans` returns every result, so a comparison runs each planner once. Each result's `optimal`
# then takes the others into account: a plan larger than another one is not optimal.
#
# One deadline covers the whole call. On small graphs the greedy plans take milliseconds and the
# search has the budget to itself. On a graph whose output fans out to 10,000 tensors, each greedy
# step compares a block with thousands of placed ones, and the greedy plans alone would take 18 s
# each. They stop at the deadline, and `best` returns ggml's plan (already at the lower bound
# there) about a second after the call (`benchmarks/budget.py`; 46 s before the deadline was shared).

# %%
# | export
def all_plans(problem: Problem, budget: float = DEFAULT_BUDGET, deadline: Deadline | None = None) -> dict:
    """Every planner's result on `problem`, by name (PLANNER_NAMES; no "ggml" for a problem made by
    hand): ggml's plan, the two greedy plans, the exact search started from the best of them, and
    `best`, the smallest (the first of equals: ggml's plan first). All of it within `deadline`, by
    default `budget` seconds after this call."""
    deadline = deadline or Deadline(budget)
    t0 = deadline.clock()
    out = _cheap_plans(problem, deadline)
    out["exact"] = exact(problem, incumbent=min(out.values(), key=lambda r: r.peak), deadline=deadline)
    win = min(out.values(), key=lambda r: r.peak)
    proven = any(r.optimal for r in out.values() if r.peak == win.peak)
    for name, r in out.items():
        if r.peak > win.peak:
            out[name] = replace(r, optimal=False)
        elif proven:
            out[name] = replace(r, optimal=True)
    out["best"] = replace(out[win.planner], planner="best", source=win.planner, seconds=deadline.clock() - t0,
                          stopped=any(r.stopped for r in out.values()))
    return out


def best(problem: Problem, budget: float = DEFAULT_BUDGET, deadline: Deadline | None = None) -> PlanResult:
    """The smallest of ggml's plan, both greedy plans and the exact search's (see `all_plans`)."""
    return all_plans(problem, budget, deadline)["best"]


def run_planner(problem: Problem, planner: str = "best", budget: float = DEFAULT_BUDGET,
                deadline: Deadline | None = None) -> PlanResult:
    """The plan of the planner called `planner`, one of PLANNER_NAMES, made within `deadline` (default:
    `budget` seconds from this call). Its `optimal` is also False when ggml's plan or a greedy plan,
    cheap to make, is smaller (exact and best: `all_plans`, which compares them all, and the time and
    stop of all of it)."""
    if planner not in PLANNER_NAMES:
        raise PlannerError(f"unknown planner {planner!r}; the planners are {', '.join(PLANNER_NAMES)}")
    deadline = deadline or Deadline(budget)
    if planner in ("exact", "best"):  # (exact's time and stop include the plans it starts from)
        plans = all_plans(problem, deadline=deadline)
        return replace(plans[planner], seconds=plans["best"].seconds, stopped=plans["best"].stopped)
    greedy = {"greedy-size": greedy_by_size, "greedy-breadth": greedy_by_breadth}
    result = greedy[planner](problem, deadline) if planner in greedy else ggml_plan(problem)
    if result.optimal is None:  # (the planner asked for ran first: the others get what time is left)
        others = [make(problem, deadline) for name, make in greedy.items() if name != planner]
        others += [ggml_plan(problem)] if planner != "ggml" and problem.ggml_peak is not None else []
        if min(r.peak for r in others) < result.peak:
            result = replace(result, optimal=False)
    return result


# %%
# NBVAL_CHECK_OUTPUT
for name, r in all_plans(block06).items():
    print(f"{name:15s} {r.peak:6d} B  optimal {r.optimal}" + (f"  (the plan of {r.source})" if r.source else ""))

# %% [markdown]
# ## 8 · Plans that run
#
# A plan is only worth something if the graph computes in it. The graph allocator already holds its
# plan as a table: one record per placed tensor, with buffer, offset and reserved size (chapter 05,
# §2.2), and `alloc_graph` places every tensor from that table without asking why. Chapter 07 (§4)
# broke a plan by changing one record. Here every record changes. `alloc_planned` calls `reserve`, which
# decides *which* tensors the allocator places (external and pre-allocated tensors stay where they are).
# It then gives each placed tensor the offset of its block, remakes the buffer at the planner's peak,
# and lets `alloc_graph` place the graph. Views follow their roots, because `ggml_gallocr_init_tensor`
# initializes a view from its source. The result is a normal ggml allocation with other offsets.

# %%
# | export
def alloc_planned(graph, result: PlanResult, problem: Problem | None = None) -> GAllocr:
    """Place `graph`'s tensors at `result`'s offsets through the graph allocator: `ggml_gallocr_reserve`
    (which tensors it places), each placed tensor's record set to its block's offset, the buffer made
    at the plan's peak, then `ggml_gallocr_alloc_graph`. `problem` is `blocks_of(graph)` (made when
    None). Returns the allocator; its buffer reports `result.buffer_size`."""
    problem = problem if problem is not None else blocks_of(graph)
    if problem.galloc is None:
        raise PlanMismatchError("this problem was made by hand: it has no graph allocator to place a plan with")
    if len(result.offsets) != len(problem.blocks):
        raise PlanMismatchError(f"the {result.planner} plan has {len(result.offsets)} blocks, this graph "
                                f"needs {len(problem.blocks)}: the plan was made for another graph")
    galloc = GAllocr(problem.galloc.bufts[0])
    galloc.reserve(graph)
    for t, k in problem.block_of.items():
        rec = galloc.planned_alloc(t)  # the tensor's record in the kept plan (its hash node)
        if rec is NOT_PLACED:
            raise PlanMismatchError(f"{describe(t)}: the graph allocator does not place it, the plan does "
                                    f"(the graph changed since the plan was made?)")
        rec.offset = result.offsets[k]
    galloc.buffers[0].free()
    galloc.buffers[0] = galloc.bufts[0].alloc_buffer(result.peak)
    if not galloc.alloc_graph(graph):
        raise PlanMismatchError(f"the graph allocator could not place the {result.planner} plan")
    return galloc


# %% [markdown]
# **Does the graph compute right there?** Appendix A6 builds the check, `verify_plan` of
# `ggml_lite.verify`. It computes the graph twice with the same seeded data: once in the plan, and once as
# a reference in which no two tensors alive at the same node share a byte. The results every plan keeps
# to the end (OUTPUT nodes and the nodes no other node reads) must be equal, bit for bit. The check also
# runs `check_placement`: numpy's kernels read all of a node's sources before they write, so computing
# alone would not notice a node placed over a source it reads. Both runs place twins of the graph, and the
# loaded graph stays unplanned. For graphs the CPU kernels refuse, `compute="dataflow"` computes instead a
# digest of every byte each node reads (A6, §3); §11 uses it.
#
# The LLaMA block passes in its best plan, in a buffer of 37,792 B (the lower bound and the CPU buffer
# type's 32 bytes). Appendix A6 (§2) breaks that plan, one block moved onto another alive at the same
# nodes, and the check catches it.

# %%
# NBVAL_CHECK_OUTPUT
from ggml_lite.verify import verify_plan, verify_plans  # noqa: E402  (appendix A6)

best06 = best(block06)
check06 = verify_plan(block06.graph, best06, block06)
base = check06.galloc.buffers[0].get_base()
print(f"buffer {check06.galloc.get_buffer_size(0)} B; compared {check06.compared}: ok = {check06.ok}")
print("where the plan put the last five nodes:", {t.name: t.data - base for t in check06.graph.nodes[-5:]})

# %% [markdown]
# ## 9 · ggml against the best plan, on the 7B graph
#
# Fixture 14 is a Llama-2 7B graph at n_ctx 512 with one output row, recorded from the real ggml with
# the recorded variant of chapter 10's builder (§3 there): 1,062 nodes, 33 per layer, where llama.cpp's
# own graph has 1,030 (the extra node per layer is a RESHAPE of Vcur, a view). It has 456 blocks.
# ggml's buffer is 65.00 MiB (68,161,600 B with the 32 spare bytes). The lower bound is 60.00 MiB
# (62,916,640 B), reached at node 30, `ffn_up-0`. Alive there are the residual `ffn_inp-0` and
# `ffn_norm-0` (8 MiB each: 512 tokens × 4,096 × 4 bytes), the gate chain and `ffn_up-0` (21.5 MiB each:
# 512 × 11,008 × 4), the 1 MiB `KQ_mask`, and 2,080 bytes of positions and output ids.
#
# Where do ggml's extra 5 MiB come from? At node 19 the attention scores `kq-0` need 32 MiB (512 × 512
# × 32 heads × 4 bytes). The blocks freed so far have left a 16 MiB hole between `inp_embd` (1 to
# 9 MiB) and `Qcur_rope-0` (25 to 33 MiB). Best fit finds no hole large enough and puts `kq-0` at the
# top, at 33 MiB, which makes the peak 65 MiB. An offline planner knows at node 0 that a 32 MiB block
# is coming and leaves room for it. Both greedy planners reach the lower bound here. `best` keeps
# greedy by size's plan.
#
# These plans run, too. A6's `verify_plans(graph, plans, max_bytes=16 << 30)` computes the 7B graph in the
# reference and in each of the three distinct placements of the five planners, and all results agree bit
# for bit. That takes about 5.5 minutes and 14 GiB, too much for this notebook; the benchmark of §12 does
# it.
#
# To draw a planner's plan, `planned_events` rewrites ggml's trace as if the allocator had chosen the
# planner's offsets. Chapter 05's `memory_timeline` then draws it as it draws ggml's plan: placements in
# colour (orange for in place), the lower bound dashed and the plan's peak solid. The picture shows the
# first two of the 32 layers, since the rest repeats (zoom out to see them). On the left, `kq-0` sits on
# top at node 19. On the right, `kq-0` takes offsets 0 to 32 MiB, and the blocks that live across node 19
# (`inp_embd` and `Qcur_rope-0`) sit above it, from 32 MiB.

# %%
# | export
def planned_events(problem: Problem, result: PlanResult) -> list:
    """ggml's trace (`problem.events`) with every placement moved to its block's offset in `result`:
    the trace ggml would have left had its allocator chosen these offsets (for chapter 05's pictures)."""
    out, k = [], 0
    for ev in problem.events:
        if isinstance(ev, PlaceEvent):
            ev = replace(ev, offset=result.offsets[problem.place_block[k]])
            k += 1
        out.append(ev)
    return out


# %%
# | export viz.planners
"""The figure of chapter 11: several plans of one graph side by side, each drawn as chapter 05's memory
timeline. Drawing only: the plans and their traces come from `ggml_lite.planners`."""

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ggml_lite.planners import Problem, planned_events
from ggml_lite.viz.timeline import memory_timeline


def _size(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB" if n >= 10 * 2**10 else f"{n:,} B"


def _clipped(trace, first: int, last: int):
    """A timeline trace without the rectangles (5 corners and a gap each) or hover points outside the
    nodes `first..last`, so a figure of a window of a large graph carries only that window."""
    x, y = list(trace.x), list(trace.y)
    if trace.mode == "markers":
        keep = [k for k, v in enumerate(x) if first - 1 <= v <= last + 1]
        text = list(trace.hovertext) if trace.hovertext is not None else None
        return trace.update(x=[x[k] for k in keep], y=[y[k] for k in keep],
                            hovertext=[text[k] for k in keep] if text else None)
    rects = [k for k in range(0, len(x), 6) if min(x[k:k + 5]) <= last + 1 and max(x[k:k + 5]) >= first - 1]
    return trace.update(x=[v for k in rects for v in x[k:k + 6]], y=[v for k in rects for v in y[k:k + 6]])


def compare_timelines(problem: Problem, results: list, title: str = "", height: int = 520,
                      views: bool = False, nodes: tuple | None = None) -> go.Figure:
    """Memory timelines of several plans of one graph side by side (chapter 05's `memory_timeline` of
    each `planned_events`), sharing the offset axis; the lower bound dashed and each plan's peak solid.
    Views (dotted outlines) only with `views=True`; `nodes=(first, last)` shows only those nodes."""
    fig = make_subplots(rows=1, cols=len(results), shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=[f"{r.planner}{' (' + r.source + ')' if r.source else ''}: {_size(r.peak)}"
                                        for r in results])
    for col, r in enumerate(results, 1):
        for trace in memory_timeline(problem.graph, planned_events(problem, r), r.peak).data:
            if views or trace.name != "view":
                trace.showlegend = col == 1 and trace.showlegend is not False
                fig.add_trace(trace if nodes is None else _clipped(trace, *nodes), row=1, col=col)
        fig.add_hline(y=problem.lower_bound, line=dict(color="crimson", dash="dash"), row=1, col=col,
                      annotation_text=f"lower bound {_size(problem.lower_bound)}",
                      annotation_position="bottom right")
        fig.add_hline(y=r.peak, line=dict(color="crimson"), row=1, col=col,
                      annotation_text=f"peak {_size(r.peak)}", annotation_position="top left")
        fig.update_xaxes(title_text="node (execution order)", row=1, col=col,
                         range=None if nodes is None else [nodes[0] - 0.5, nodes[1] + 0.5])
    fig.update_yaxes(title_text="offset (bytes)", row=1, col=1)
    fig.update_layout(title=title, height=height, plot_bgcolor="white", margin=dict(l=60, r=20, t=70, b=90),
                      legend=dict(orientation="h", y=-0.2, x=0, yanchor="top"))
    return fig


# %%
# NBVAL_CHECK_OUTPUT
llama14 = blocks_of(load("14_llama7b_ctx512_one_output").graph)
plans14 = all_plans(llama14)
at14 = llama14.lb_step
print(f"{len(llama14.graph.nodes)} nodes, {len(llama14.blocks)} blocks; lower bound {llama14.lower_bound} B "
      f"({llama14.lower_bound / 2**20:.2f} MiB) at node {at14} ({llama14.graph.nodes[at14].name})")
for name, r in plans14.items():
    print(f"  {name:15s} buffer {r.buffer_size:10d} B = {r.buffer_size / 2**20:6.2f} MiB; optimal {r.optimal}")

# %%
compare_timelines(llama14, [plans14["ggml"], plans14["best"]], nodes=(0, 70),
                  title="Llama-2 7B, n_ctx 512, one output (fixture 14), the first two of 32 layers").show()

# %% [markdown]
# ## 10 · Every recorded graph
#
# The same comparison runs over every graph the project recorded from ggml: the 12 single-graph
# fixtures and each step of the two sequences. Each planner column shows how far the plan is above the
# lower bound ("LB" when it reaches it). The planners reach the lower bound on every graph but
# two, the large random DAGs 09 and 10. On those, greedy by breadth is 0.40 % and 3.18 % above it, ggml
# 1.83 % and 0.45 %, and greedy by size 3.20 % and 8.82 %. Their 295 and 375 blocks are too many for the
# exact search to finish within its second. It returns the best plan it knows and does not claim
# optimality. Greedy by size loses to ggml on three graphs (08, 09, 10). ggml reaches the lower bound on
# its own on 01, 03, 04, 05 and 13.
#
# The exact column depends on how far the search gets in its second on the machine that runs it, so
# this cell's output is not compared by the tests.

# %% tags=["nbval-ignore-output"]
def recorded_graphs():
    """(label, GraphFile) for every recorded graph: each single-graph fixture, each step of a sequence."""
    for path in sorted(SEED.glob("*.json")):
        doc = json.loads(path.read_text())
        for step in [i for i, st in enumerate(doc.get("steps", [])) if "graph" in st] or [None]:
            yield path.stem + ("" if step is None else f" step {step}"), load(path.stem, step)


def over(r: PlanResult) -> str:
    return "LB" if r.peak == r.lower_bound else f"+{100 * (r.peak / r.lower_bound - 1):.2f} %"


table = {}
print(f"{'graph':40s} {'nodes':>5} {'blocks':>6} {'lower bound':>12} {'ggml':>8} {'greedy-size':>11} "
      f"{'greedy-br.':>10} {'exact':>8}")
for label, gf in recorded_graphs():
    problem = blocks_of(gf.graph)
    plans = all_plans(problem)
    table[label] = problem, plans
    print(f"{label:40s} {len(gf.graph.nodes):5d} {len(problem.blocks):6d} {problem.lower_bound:12d} "
          + " ".join(f"{over(plans[n]):>{w}}" for n, w in (("ggml", 8), ("greedy-size", 11),
                                                            ("greedy-breadth", 10), ("exact", 8))))

# %% [markdown]
# ## 11 · When greedy by size loses to ggml
#
# Sorting by size alone ignores *when* a block lives. Graph 87 of the differential generator
# (`ggml_oracle.random_graph(87)`, the oracle package in `oracle/ggml_oracle/`) is the smallest of its
# first 300 graphs on which this costs more than ggml's online best fit. It is written out below with the
# public API, its data tensors flagged INPUT as the benchmark does: 11 nodes, 10 blocks. At most 3,040
# bytes are alive at once, at the last node. ggml needs 3,072, greedy by breadth 3,040, and greedy by
# size 3,552. (It is a graph for planning only: its `node_7` subtracts from a transposed view, which
# ggml's kernel would read the wrong way, so the CPU backend refuses it. Its plans are verified by
# appendix A6's data-flow run, which writes into each node a digest of the bytes it reads.)

# %%
def graph87():
    """`ggml_oracle.random_graph(87)` (oracle/ggml_oracle/), its data tensors flagged INPUT (as the benchmark)."""
    w = gl.Context("weights")
    c4, b6 = w.new_tensor(gl.F32, [3, 5, 5, 2], name="c4"), w.new_tensor(gl.F32, [5, 5, 1, 1], name="b6")
    ctx = gl.Context("compute")
    inp1 = ctx.new_tensor(gl.F32, [3, 5, 5, 1], name="inp1")
    dst2 = ctx.new_tensor(gl.F32, [15, 5, 1, 1], name="dst2")
    copied = gl.cpy(ctx, inp1, dst2)
    b3 = ctx.new_tensor(gl.F32, [3, 1, 1, 1], name="b3")
    node_3 = gl.sub(ctx, inp1, b3).set_name("node_3")
    node_10 = gl.concat(ctx, c4, inp1, 3).set_name("node_10")
    node_4 = gl.sum_rows(ctx, node_3).set_name("node_4")
    node_5 = gl.mul_mat(ctx, node_4, node_4).set_name("node_5")
    transposed = gl.transpose(ctx, node_5)
    gl.cpy(ctx, transposed, ctx.new_tensor(gl.F16, [5, 25, 1, 1], name="dst5"))  # (not in the graph)
    node_7 = gl.sub(ctx, transposed, b6).set_name("node_7")
    normed = gl.norm(ctx, node_7, 1e-5, inplace=True)
    node_9 = gl.soft_max_ext(ctx, normed, None, 1.0, 0.0).set_name("node_9")
    ctx.new_tensor(gl.F32, [64, 5, 1, 1], name="inp7")  # (not in the graph)
    inp8 = ctx.new_tensor(gl.F32, [128, 1, 1, 1], name="inp8")
    logged = gl.log(ctx, inp8, inplace=True)
    last = gl.transpose(ctx, logged)
    for t in (node_3, node_4, transposed, normed, logged, last):
        gl.set_output(t)
    for t in (inp1, dst2, b3, inp8):
        gl.set_input(t)
    graph = gl.Graph()
    for root in (copied, last, node_9, node_10):
        gl.build_forward_expand(graph, root)
    gl.alloc_ctx_tensors(w, gl.cpu_buffer_type())
    return graph


g87 = blocks_of(graph87())
plans87 = all_plans(g87)
print(f"{len(g87.graph.nodes)} nodes, {len(g87.blocks)} blocks, lower bound {g87.lower_bound} B at node {g87.lb_step}")
print("  ".join(f"{n} {plans87[n].peak}" for n in ("ggml", "greedy-size", "greedy-breadth", "exact")))
print(f"{'#':>2} {'size':>5} {'nodes':>7} {'ggml':>6} {'greedy-size':>11}  tensors")
for b in g87.blocks:
    print(f"{b.index:2d} {b.size:5d} {b.start:3d}..{b.end:<3d} {plans87['ggml'].offsets[b.index]:6d} "
          f"{plans87['greedy-size'].offsets[b.index]:11d}  {b.name}")

# %% [markdown]
# Read the greedy-size column from the largest block down. `node_10`, the concat (928 B), is the largest
# block, and it lives at one node only, the last one. Greedy by size places it first, at offset 0. Next
# come the 512-byte blocks. `inp8` lives from the start to the end and meets `node_10`, so it goes above
# it at 928. The chain `node_5` → `node_7` → `node_9` meets `inp8` everywhere and each block meets its
# neighbour in the chain. `node_5` fits below `inp8` at 0 (it dies before node 10). `node_7` meets
# `node_5`, and the 416 bytes left below `inp8` are too few, so it goes above `inp8` at 1,440. `node_9`
# meets `node_7` at node 9 and `node_10` at node 10, so it goes above `node_7` at 1,952, although
# `node_7` is gone by node 10. Last come the long-lived 320- and 128-byte blocks (`inp1`, `dst2`,
# `node_3`, `node_4`, all kept to the end). They meet everything and stack on top, from 2,464 to
# 3,552. At node 10, the 512 bytes at [1,440, 1,952) that `node_7` held are empty: 3,552 − 3,040 = 512
# bytes lost.
#
# ggml works in time order and sees the long-lived INPUTs first. It puts them at the bottom (0 to 1,632),
# and the short-lived blocks come and go above them. The big concat arrives last and fits at 2,144, 32
# bytes above the lower bound. Greedy by breadth starts at node 10, the broadest node, places exactly the
# blocks alive there, and reaches the lower bound. Greedy by size has no notion of which node is crowded.
# That is why it loses to ggml on fixtures 08, 09 and 10 too, and on 11 of the benchmark's 300 random
# graphs (§12).

# %%
compare_timelines(g87, [plans87["ggml"], plans87["greedy-size"]], views=True, height=460,
                  title="random_graph(87): ggml's online best fit against greedy by size").show()

# %%
# NBVAL_CHECK_OUTPUT
checks87 = verify_plans(g87.graph, list(plans87.values()), g87, compute="dataflow")
print("random_graph(87), data-flow run:", {name: c.ok for name, c in zip(plans87, checks87)})

# %% [markdown]
# ## 12 · Across random graphs: the benchmark
#
# `benchmarks/planners.py` runs the planners over the recorded graphs of §10 and over 300 random graphs
# of the differential generator (`--count`). The random graphs have at most 40 ops, and their data
# tensors are flagged INPUT. Graphs the CPU kernels refuse are skipped and counted. Every plan of every
# graph is then computed and compared as in §8 (by appendix A6's check): on the CPU backend, or by the
# data-flow run when the kernels refuse the graph. Appendix A6 (§4) shows its whole output on the machine
# that wrote this chapter, with the default settings, and what verifying costs.
#
# On random graphs ggml reaches the lower bound on 44 % of them. Its worst plan needs 1.95 times the
# lower bound, and its geometric mean is 4.2 % above it. Each greedy planner alone reaches the lower bound
# on about nine graphs in ten, and each has graphs where it is far off (greedy by size up to 26 %, greedy
# by breadth up to 40 %). The exact search ran on the 21 graphs that neither greedy planner nor ggml had
# solved. It finished on all of them, the slowest in about a millisecond (graph seed 139, 37 blocks), and
# each time it found a placement at the lower bound. So `best` reaches the lower bound on every one of
# the 300 graphs, is smaller than ggml on 168 and never larger, and all 1,500 plans compute on the CPU
# backend exactly what the reference computes. The 135 graphs the kernels refuse tell the same story, and
# their 675 plans pass the data-flow run.
#
# On the recorded graphs the exact search ran twice, on fixtures 09 and 10 (295 and 375 blocks), and
# both times it used its whole second without a proof. On 09 the best it knows is greedy by breadth's
# plan, 0.40 % above the lower bound. On 10 it returns ggml's plan, 0.45 % above. Whether those two graphs
# admit a placement at the lower bound is open. Every plan of the 23 recorded graphs is verified: 105 by
# the CPU backend, the 10 of fixtures 09 and 10 by the data-flow run.
#
# With `--count 2000 --max-gib 2` (30 s here) the picture holds. `best` reaches the lower bound on all
# 2,000 random graphs and all 10,000 plans verify; the 1,041 graphs the kernels refuse on the way are at
# the lower bound too, and their 5,205 plans pass the data-flow run. The exact search ran on 108 graphs
# and finished on every one. The slowest took half a second: graph seed 1138, 34 blocks, 113,113 steps.

# %% [markdown]
# ## 13 · Check

# %%
from ggml_lite.trace import live_bytes  # noqa: E402

assert (len(block06.blocks), block06.lower_bound, block06.lb_step, block06.ggml_peak) == (18, 37760, 25, 42880)
assert check_placement(block06, ggml06) == [] and peak_of(block06, ggml06) == block06.ggml_peak
assert size06.peak == breadth06.peak == 37760 and size06.optimal and not check_placement(block06, size06.offsets)
assert [r.peak for r in (greedy_by_size(four), exact(four))] == [128, 96] and exact(four).optimal
assert (seven.lower_bound, exact7.peak, exact7.optimal) == (160, 192, True) and not check_placement(seven, exact7.offsets)
assert check06.ok and check06.galloc.get_buffer_size(0) == 37760 + 32
# fixture 14: ggml 65.00 MiB, the lower bound 60.00 MiB, and best reaches it (buffer = lower bound + 32 B)
assert plans14["ggml"].buffer_size == 68161600 and f"{llama14.lower_bound / 2**20:.2f}" == "60.00"
assert plans14["best"].buffer_size == llama14.lower_bound + 32 and plans14["best"].optimal
assert max(live_bytes(lifetimes(llama14.graph, llama14.events), len(llama14.graph.nodes))) == llama14.lower_bound
for label, (problem, plans) in table.items():  # every plan valid, none below the lower bound, best <= ggml
    assert all(r.peak >= problem.lower_bound and not check_placement(problem, r.offsets) for r in plans.values()), label
    assert plans["best"].peak <= plans["ggml"].peak and plans["exact"].peak <= plans["greedy-breadth"].peak, label
assert sum(p["greedy-size"].peak > p["ggml"].peak for _, p in table.values()) == 3
assert [plans87[n].peak for n in ("ggml", "greedy-size", "greedy-breadth")] == [3072, 3552, 3040]
assert all(c.ok for c in checks87)
print("chapter 11: all checks passed")

# %% [markdown]
# ## 14 · Exercises
#
# Four exercises, about 75 minutes. Predictions are answered with `answer(id, value)`: replace the `...` and
# run the cell; it says right or wrong, then why. An implementation is graded with `check(id, fn)` against
# the planners of this chapter on small block sets made by hand, on the blocks of the recorded graphs
# (fixtures 01 to 12 and 14) and on 300 random block sets; a failure shows the smallest block set where your
# function and the port disagree and the rule it breaks. `python -m ggml_lite exercises` lists what you have
# done. Solutions are in appendix A10; try first.

# %%
from ggml_lite.exercises import answer, check, done  # noqa: E402

# %% [markdown]
# **11.1 · Predict** (medium, 8 min). Four blocks, each `(size, first node, last node)`: block 0 is
# `(64, 1, 1)`, block 1 `(64, 0, 1)`, block 2 `(64, 0, 2)` and block 3 `(96, 2, 2)`. What is their lower
# bound, and what peak does greedy by size (§4) reach? Answer with the pair `(lower_bound, peak)`.

# %%
answer("11.1", ...)

# %% [markdown]
# **11.2 · Implement** the peak-live lower bound (easy, 15 min). ggml has no offline planner, so there is no
# C to port here: the rules are those of §1 and §2. A block `(size, start, end)` is alive at every node from
# `start` to `end`, both included. At each node, the blocks alive there need their sizes added up; the lower
# bound is the highest of these totals. Return it with the first node that reaches it, as `Problem` keeps
# them (`lower_bound`, `lb_step`). With no blocks, nothing is alive: `(0, 0)`.

# %%
# exercise 11.2
def peak_live(blocks):
    """`blocks`: a list of `(size, start, end)`, nodes `start..end` included. Returns `(bound, node)`: the
    most bytes alive at one node and the first node where that many are alive."""
    raise NotImplementedError  # your code here


check("11.2", peak_live)

# %% [markdown]
# **11.3 · Implement** greedy by size (medium, 30 min). Again no C: the planner of §4, on plain tuples. The
# rules, in full:
#
# - blocks of 0 bytes need no memory: they keep offset 0 and take no part;
# - the others are placed one at a time, the largest first; of equal sizes, the one starting earlier, then
#   the one given first;
# - a block looks at the blocks placed before it that are alive at a common node (§1: ends included). Sorted
#   by offset, those leave gaps between them, from offset 0 up to the highest end seen so far. The block
#   takes the *smallest* gap that holds it, the lowest of equal ones, else goes at the highest end of them
#   all (0 when there are none).
#
# Sizes are given already aligned. Return the offsets in the order of `blocks`.

# %%
# exercise 11.3
def greedy_offsets(blocks):
    """`blocks`: a list of `(size, start, end)` as in 11.2. Returns a list with each block's offset, in the
    order of `blocks`, as greedy by size places them."""
    raise NotImplementedError  # your code here


check("11.3", greedy_offsets)

# %% [markdown]
# **11.4 · Explore** (hard, 20 min). ggml plans *online*: blocks in the order of their first node, each
# placed by chapter 04's best fit (`DynTAllocr`) and freed after its last node. Greedy by size sees every
# lifetime first, yet §11 showed it losing to ggml on a graph of 10 blocks. Make a set of four blocks on
# which greedy by size needs more bytes than the online rule. (To try one, `problem_from_blocks` and
# `greedy_by_size` give greedy's peak; for the online rule, loop over the nodes calling a `DynTAllocr(32)`'s
# `alloc` for the blocks starting there, then `free_tensor` for those ending there.) Run `done("11.4")` when
# you have an answer.
#
# <details><summary>A worked answer</summary>
#
# Take A `(64, 0, 0)`, B `(32, 0, 2)`, C `(32, 1, 3)` and D `(64, 3, 5)`. At most 96 bytes are alive at once
# (A and B at node 0, C and D at node 3), so 96 is the lower bound.
#
# Greedy by size places the two 64-byte blocks first. A and D never meet, so both go at offset 0. B meets A
# and goes above it, at 64. Then C meets B at nodes 1 and 2 (bytes 64 to 96) and D at node 3 (bytes 0 to 64):
# no gap is left below 96, so C goes on top, at 96, and the peak is 128.
#
# Online, node 0 places A at 0 and B at 64, then frees A. At node 1, C takes the best-fitting hole, A's bytes,
# at 0; 32 bytes of that hole stay free. After node 2, B's bytes are freed and merge with them and with the
# open end, so at node 3 D goes at 32, and the peak is 96, the lower bound.
#
# Sharing offset 0 between A and D was right for the two of them and wrong for C, which meets both: greedy
# by size decides the big blocks alone, before it knows where the small ones must go. Online, C came first
# and D fitted around it. Greedy by breadth also ends at 128 here; the exact search finds 96. §11's graph 87
# loses the same way, at a larger scale.
#
# </details>
