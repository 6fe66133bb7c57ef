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
# # 05 · The graph allocator
#
# A 7B LLaMA's compute graph has a thousand intermediate tensors, but only a handful are alive at
# any moment: each dies once its last consumer has run. ggml's graph allocator `ggml_gallocr` walks
# the graph in execution order, gives each node memory from chapter 04's dynamic allocator, lets a
# node **overwrite its parent** when that is safe, and frees a parent once its last child has run.
# The highest offset handed out becomes the compute buffer's size: 70.50 MiB for Llama-2 7B on one
# GPU (`n_gpu_layers` 33, `n_ctx` 512, batches of 512 tokens), where one buffer per tensor would
# take gigabytes. This chapter plans one LLaMA block; chapter 10 explains the 70.50 MiB.
#
# **Learning goals**
#
# 1. The two phases: `reserve` *plans* (offsets only, buffers grown when needed); `alloc_graph`
#    *places* a graph's tensors from the kept plan, and plans again only when the graph outgrew it.
# 2. The per-tensor bookkeeping (children and views not yet run) and the exact rules for freeing and
#    for in-place reuse, quirks included.
# 3. Reading a plan: a memory timeline of a LLaMA block, and a stepper that replays each decision.
#
# Exported: `ggml_lite.gallocr`; `ggml_lite.trace`, the analysis of a plan; `ggml_lite.viz.timeline`.

# %% [markdown]
# ## 1 · The C
#
# `ggml-alloc.c:330-930`. One dynamic allocator per *distinct* buffer type; `ggml_gallocr_alloc_graph_impl`
# plans in three loops: (1) every leaf gets memory; (2) children and views are counted, INPUT tensors
# placed early; (3) in execution order, each node's parents and the node are placed, then every
# parent whose last child has run is freed — unless a child took its memory in place. Section 2
# ports each function right after the C it follows.
#
# **INPUT and OUTPUT, the one rule.** Only OUTPUT keeps a tensor's memory: never freed, never
# overwritten in place. INPUT decides only *when* a tensor is placed (loops 1-2, before any node is
# computed, so nothing computed earlier sits in its memory when the user fills it); after that its
# last consumer frees it, or takes it in place. Below, the INPUT `x` is scaled in place by its only
# child `s`, and `y` then takes the same block: all three at offset 0.

# %%
# NBVAL_CHECK_OUTPUT
import ggml_lite as gl

c = gl.Context("input rule")
x = c.new_tensor_1d(gl.F32, 64, name="x")
gl.set_input(x)
s = gl.scale(c, x, 2.0).set_name("s")
y = gl.add(c, s, c.new_tensor_1d(gl.F32, 64, name="b")).set_name("y")
gl.set_output(y)
g_rule = gl.build_forward(y)
ga_rule = gl.GAllocr(gl.cpu_buffer_type())
ga_rule.alloc_graph(g_rule)
print({t.name: t.data - ga_rule.buffers[0].get_base() for t in (x, s, y)})

# %%
# | default_exp gallocr

# %% [markdown]
# ## 2 · The port
#
# ### 2.1 · Which ops may write over a source (one module, `ggml_lite.gallocr`, in the C's order)
#
# ```c
# static bool ggml_op_can_inplace(enum ggml_op op) {
#     switch (op) {
#         case GGML_OP_SCALE:
#         case GGML_OP_DIAG_MASK_ZERO:
# ```
#
# (`ggml-alloc.c:40-43`; the list goes on to `GGML_OP_SOFT_MAX` at :56.) Notice what the ops share:
# each kernel reads a source element before it writes the same element of the result, so result and
# source may share memory. MUL_MAT, CPY and CONT are not on the list.

# %%
# | export
"""The graph allocator `ggml_gallocr`, mirroring ggml-alloc.c (lines 327-930): plan the memory of every tensor of a
graph with one dynamic allocator per buffer type, keep the plan, and place the tensors from it."""

import logging
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, NamedTuple

from ggml_lite.bind import method_of
from ggml_lite.buffer import SIZE_MAX, tensor_alloc, view_init
from ggml_lite.dyn_tallocr import DynTAllocr
from ggml_lite.errors import BufferIdError, PlanMismatchError
from ggml_lite.tensor import Op, Tensor, TensorFlag, are_same_layout, describe

log = logging.getLogger("ggml_lite")

INPUT = int(TensorFlag.INPUT)
OUTPUT = int(TensorFlag.OUTPUT)
MiB = 1024.0 * 1024.0

CAN_INPLACE = frozenset({Op.SCALE, Op.DIAG_MASK_ZERO, Op.DIAG_MASK_INF, Op.ADD, Op.ADD1, Op.SUB, Op.MUL, Op.DIV,
                         Op.SQR, Op.SQRT, Op.LOG, Op.UNARY, Op.ROPE, Op.RMS_NORM, Op.SOFT_MAX})


def op_can_inplace(op: Op) -> bool:
    """`ggml_op_can_inplace`."""
    return op in CAN_INPLACE


def is_view(t) -> bool:
    """`ggml_is_view` (ggml-alloc.c:21): `t` lives in another tensor's memory (inlined in hot loops)."""
    return t.view_src is not None

# %% [markdown]
# ### 2.2 · The bookkeeping
#
# ```c
# struct hash_node {
#     int n_children;
#     int n_views;
#     int buffer_id;
#     size_t offset; // offset within the buffer
#     bool allocated;
# };
# ```
#
# (`ggml-alloc.c:330-336`.) What the allocator knows of a tensor *while planning*. The plan it *keeps*
# is a `tensor_alloc` `{buffer_id, offset, size_max}` per node slot, source slot and leaf (:338-352;
# `size_max` 0: not placed by it): a tensor read by five nodes fills six slots. The port keeps one record
# (the hash node, with `size_max`, *is* its `tensor_alloc`) and which tensor sat in each slot, so lookups
# stay by *position*, as in the C: a later graph with new tensors in the same slots is placed from them.

# %%
# | export
class HashNode:
    """`struct hash_node`; with `size_max` (the size planned) also the tensor's `struct tensor_alloc`."""

    __slots__ = ("n_children", "n_views", "buffer_id", "offset", "allocated", "size_max")

    def __init__(self):
        self.n_children = self.n_views = self.buffer_id = self.offset = 0  # calloc'ed in the C
        self.allocated = False
        self.size_max = None  # not placed by this plan (yet)

    def __repr__(self):
        return (f"HashNode(children={self.n_children}, views={self.n_views}, buffer={self.buffer_id}, "
                f"offset={self.offset}, allocated={self.allocated}, size_max={self.size_max})")


class TensorAlloc(NamedTuple):
    """`struct tensor_alloc`: `size_max == 0` means pre-allocated, unused, or a view."""

    buffer_id: int
    offset: int
    size_max: int


NOT_PLACED = TensorAlloc(-1, SIZE_MAX, 0)


class NodeAlloc(NamedTuple):
    """`struct node_alloc`: the node's own placement and one per source slot."""

    dst: TensorAlloc
    src: tuple


class LeafAlloc(NamedTuple):
    """`struct leaf_alloc`."""

    buffer_id: int
    leaf: TensorAlloc


def _name(t) -> str:
    return t.name or "<unnamed>"

# %% [markdown]
# ### 2.3 · Trace events
#
# ```c
# #define AT_PRINTF(...)
#         AT_PRINTF("exec: %s (%s) <= ", ggml_op_desc(node), node->name);
# ```
#
# (`ggml-alloc.c:18` and :625.) The C explains its decisions only in debug prints, compiled out by
# default. Each becomes an event here, sent to an optional `trace` callable (none, no cost); the
# dynamic allocators report to the same sink (chapter 04).

# %%
# | export
@dataclass(frozen=True)
class PlaceEvent:
    """A tensor got memory, `how`: "new", "inplace" (`parent`'s) or "inplace_view"; `phase`: the loop
    that asked ("leaf", "input", "parent", "node"); `node_index`: the node visited (-1: leaf loop)."""

    tensor: object
    node_index: int
    phase: str
    buffer_id: int
    offset: int
    size: int
    how: str
    parent: object = None

    def describe(self) -> str:
        if self.how == "new":
            return f"allocated {_name(self.tensor)} ({self.size} B) at offset {self.offset}"
        kind = "view parent" if self.how == "inplace_view" else "parent"
        return f"reused {kind} {_name(self.parent)} in place for {_name(self.tensor)} (offset {self.offset})"


@dataclass(frozen=True)
class RejectEvent:
    """`node` could have taken `parent`'s memory but did not, for `reason`."""

    tensor: object
    parent: object
    reason: str

    def describe(self) -> str:
        return f"not reusing {_name(self.parent)} for {_name(self.tensor)}: {self.reason}"


@dataclass(frozen=True)
class FreeNodeEvent:
    """`ggml_gallocr_free_node` gave `tensor`'s memory back (`via`: the view freed through, or None);
    `kept_output`: an OUTPUT, nothing freed."""

    tensor: object
    node_index: int
    buffer_id: int
    offset: int
    size: int
    via: object = None
    kept_output: bool = False

    def describe(self) -> str:
        if self.kept_output:
            return f"kept output {_name(self.tensor)}"
        via = f" (last user of its view {_name(self.via)})" if self.via is not None else ""
        return f"freed {_name(self.tensor)} ({self.size} B at {self.offset}){via}"


@dataclass(frozen=True)
class PhaseEvent:
    """A loop of `ggml_gallocr_alloc_graph_impl` begins: "leafs", "count" or "allocate"."""

    phase: str

    def describe(self) -> str:
        return {"leafs": "place the leafs", "count": "count children and views; place INPUT tensors",
                "allocate": "visit the nodes in execution order"}[self.phase]


@dataclass(frozen=True)
class ExecEvent:
    """Node `index` was visited; its parents after it, `(parent, n_children, n_views, allocated)`."""

    index: int
    node: Tensor
    parents: tuple

    def describe(self) -> str:
        ps = ", ".join(f"{_name(p)} ({c} {'child' if c == 1 else 'children'} left)" for p, c, _, _ in self.parents)
        return f"exec {self.index}: {_name(self.node)} ({self.node.op.name}) <= {ps or 'nothing'}"

# %% [markdown]
# ### 2.4 · The allocator
#
# ```c
#         for (int j = 0; j < i; j++) {
#             if (bufts[i] == bufts[j]) {
#                 galloc->buf_tallocs[i] = galloc->buf_tallocs[j];
#                 break;
# ```
#
# (`ggml-alloc.c:388-391`, in `ggml_gallocr_new_n`.) Notice the pointer comparison: a buffer type
# listed twice shares one dynamic allocator, and later one buffer; identity (`is`) does the same here.

# %%
# | export
class GAllocr:
    """`struct ggml_gallocr` — `ggml_gallocr_new` (one buffer type) or `ggml_gallocr_new_n` (a list);
    `trace` receives the events above and the dynamic allocators'."""

    def __init__(self, bufts, trace=None) -> None:
        bufts = list(bufts) if isinstance(bufts, (list, tuple)) else [bufts]
        if not bufts:
            raise BufferIdError("a graph allocator needs at least one buffer type")
        self.bufts = bufts
        self.buffers: list = [None] * len(bufts)
        self.buf_tallocs: list[DynTAllocr] = []
        self.trace = trace
        for i, buft in enumerate(bufts):  # :379-395
            shared = next((self.buf_tallocs[j] for j in range(i) if bufts[j] is buft), None)
            self.buf_tallocs.append(shared or DynTAllocr(buft.get_alignment(), trace=trace))
        self.n_buffers = len(bufts)
        self.hash_values: dict[Tensor, HashNode] = {}
        self._take_size_fns()
        # the kept plan (section 2.2): the hash nodes above, and the graph's slots when planned
        self.planned_nodes: list[Tensor] = []
        self.planned_srcs: list[list] = []
        self.planned_leafs: list[Tensor] = []

    def _take_size_fns(self) -> None:
        """`ggml_backend_buft_get_alloc_size` per buffer type, taken again at every reserve and alloc_graph."""
        self._alloc_size = [buft.alloc_size_fn() for buft in self.bufts]

    @property
    def node_allocs(self) -> list:
        """`galloc->node_allocs` as the C lays it out, rebuilt from the hash nodes on each read."""
        rec = self._record
        return [NodeAlloc(rec(node), tuple(map(rec, srcs)))
                for node, srcs in zip(self.planned_nodes, self.planned_srcs)]

    @property
    def leaf_allocs(self) -> list:
        """`galloc->leaf_allocs`: per leaf the buffer id of its hash node and its record."""
        hv = self.hash_values
        return [LeafAlloc(hv[leaf].buffer_id if leaf in hv else 0, self._record(leaf)) for leaf in self.planned_leafs]

    def __repr__(self):
        names = ", ".join(b.get_name() for b in self.bufts)
        return f"GAllocr([{names}], {len(self.planned_nodes)} nodes planned)"

# %% [markdown]
# ```c
# static struct hash_node * ggml_gallocr_hash_get(ggml_gallocr_t galloc, struct ggml_tensor * t) {
#     size_t i = ggml_hash_find_or_insert(&galloc->hash_set, t);
#     return &galloc->hash_values[i];
# }
# ```
#
# (`ggml-alloc.c:455-458`.) A record is created zeroed on first use; the table is cleared before
# every plan (:566). Here it is a dict keyed by the tensor object, made anew. Then the plan's records.

# %%
# | export
@method_of(GAllocr)
def hash_get(galloc, t) -> HashNode:
    """`ggml_gallocr_hash_get`: the record of `t`, created (zeroed) on first use."""
    hn = galloc.hash_values.get(t)
    if hn is None:
        hn = galloc.hash_values[t] = HashNode()
    return hn


@method_of(GAllocr)
def is_own(galloc, t) -> bool:
    """`ggml_gallocr_is_own`: `t`'s memory comes from this plan and is still held."""
    return galloc.hash_get(t).allocated


@method_of(GAllocr)
def is_allocated(galloc, t) -> bool:
    """`ggml_gallocr_is_allocated`: pre-allocated (`data`) or placed by this plan."""
    return t.data is not None or galloc.hash_get(t).allocated


@method_of(GAllocr)
def set_node_offset(galloc, node, buffer_id: int, offset: int) -> None:
    """`ggml_gallocr_set_node_offset` (defined but never called in the reference)."""
    hn = galloc.hash_get(node)
    hn.buffer_id, hn.offset, hn.allocated = buffer_id, offset, True


@method_of(GAllocr)
def _known_size(galloc, buffer_id: int, t) -> int:
    """`ggml_backend_buft_get_alloc_size(galloc->bufts[buffer_id], t)`: `t`'s record when the plan
    placed `t` in that buffer (a tensor in a graph keeps its shape), computed otherwise."""
    hn = galloc.hash_values.get(t)
    if hn is not None and hn.size_max is not None and hn.buffer_id == buffer_id:
        return hn.size_max
    return galloc._alloc_size[buffer_id](t)


@method_of(GAllocr)
def planned_alloc(galloc, t):
    """The plan's `struct tensor_alloc` for `t`: its hash node when the plan placed it, else NOT_PLACED."""
    hn = galloc.hash_values.get(t)
    return hn if hn is not None and hn.size_max is not None else NOT_PLACED


@method_of(GAllocr)
def _record(galloc, t) -> TensorAlloc:
    """`t`'s `tensor_alloc` as the C's value type, for reading."""
    rec = galloc.planned_alloc(t)
    return TensorAlloc(rec.buffer_id, rec.offset, rec.size_max)

# %% [markdown]
# ```c
#                         AT_PRINTF("reusing parent %s for %s\n", parent->name, node->name);
#                         hn->buffer_id = p_hn->buffer_id;
#                         hn->offset = p_hn->offset;
#                         p_hn->allocated = false; // avoid freeing the parent
# ```
#
# (`ggml-alloc.c:522-525`, in `ggml_gallocr_allocate_node`.) An op that can work in place takes the
# first source (in slot order) whose memory is the allocator's own, not an OUTPUT (nor a view of
# one), of the same layout, with this node as its last user; otherwise a new block. Notice
# `allocated = false`: the parent's later free does nothing, the block is the child's.
# `ggml_gallocr_free_node` gives a block back, never an OUTPUT's (:543-547).

# %%
# | export
@method_of(GAllocr)
def allocate_node(galloc, node, buffer_id: int, node_index: int = -1, phase: str = "node") -> None:
    """`ggml_gallocr_allocate_node` (:475-540): place `node` unless it is pre-allocated, already
    placed, or a view — in a parent's memory when the in-place rules allow, else in a new block."""
    hv = galloc.hash_values
    hn = hv.get(node)
    if hn is None:
        hn = hv[node] = HashNode()
    if node.data is not None or hn.allocated or node.view_src is not None:
        return
    hn.allocated = True
    trace = galloc.trace
    reused = None  # the parent whose memory `node` takes over, if any (the C returns at once)
    if node.op in CAN_INPLACE:  # try to reuse a parent's buffer (inplace)
        for parent in node.src:
            if parent is None:
                continue
            p_hn = galloc.hash_get(parent)
            if not p_hn.allocated:  # "if the node's data is external, then we cannot re-use it"
                if trace is not None:
                    trace(RejectEvent(node, parent, "its memory is not the allocator's (external, a view, or freed)"))
                continue
            vsrc = parent.view_src
            if parent.flags & OUTPUT or (vsrc is not None and vsrc.flags & OUTPUT):  # outputs cannot be reused
                if trace is not None:
                    trace(RejectEvent(node, parent, "it is an output"))
                continue
            if not are_same_layout(node, parent):
                if trace is not None:
                    trace(RejectEvent(node, parent, "the layouts are different"))
                continue
            if p_hn.n_children == 1 and p_hn.n_views == 0:
                if vsrc is not None:  # the view-parent branch: unreachable, see the text
                    vs_hn = galloc.hash_get(vsrc)
                    if vs_hn.n_views == 1 and vs_hn.n_children == 0 and vsrc.data == parent.data:
                        vs_hn.allocated = False
                        galloc.take_parent(node, parent, vsrc)
                        reused, how = parent, "inplace_view"
                        break
                else:
                    galloc.take_parent(node, parent, parent)
                    reused, how = parent, "inplace"
                    break
            elif trace is not None:
                trace(RejectEvent(node, parent, f"it still has {p_hn.n_children} children and {p_hn.n_views} views"))
    if reused is None:  # allocate tensor from the buffer
        size = galloc._alloc_size[buffer_id](node)
        hn.offset = galloc.buf_tallocs[buffer_id].alloc(size, node)
        hn.buffer_id = buffer_id
        how = "new"
    else:
        size = galloc._alloc_size[hn.buffer_id](node)
    hn.size_max = size  # the plan's record of `node` (section 2.2): its buffer and offset are final
    if trace is not None:
        trace(PlaceEvent(node, node_index, phase, hn.buffer_id, hn.offset, size, how, reused))


@method_of(GAllocr)
def take_parent(galloc, node, parent, owner) -> None:
    """`ggml_gallocr_allocate_node`'s in-place step (`owner`: whose memory; chapter 12 frees its tail)."""
    hn, p_hn = galloc.hash_values[node], galloc.hash_values[parent]
    hn.buffer_id, hn.offset = p_hn.buffer_id, p_hn.offset
    p_hn.allocated = False  # avoid freeing the parent


@method_of(GAllocr)
def free_node(galloc, node, node_index: int = -1, via=None) -> None:
    """`ggml_gallocr_free_node` (:542-557): give the memory back — never for an OUTPUT."""
    hn = galloc.hash_get(node)
    if node.flags & OUTPUT:  # graph outputs are never freed
        if galloc.trace is not None:
            galloc.trace(FreeNodeEvent(node, node_index, hn.buffer_id, hn.offset, 0, via, kept_output=True))
        return
    size = galloc._known_size(hn.buffer_id, node)  # get_alloc_size(bufts[hn->buffer_id], node)
    galloc.buf_tallocs[hn.buffer_id].free_tensor(hn.offset, size, node)
    hn.allocated = False
    if galloc.trace is not None:
        galloc.trace(FreeNodeEvent(node, node_index, hn.buffer_id, hn.offset, size, via))


# %% [markdown]
# ### 2.5 · Planning a graph
#
# ```c
#                         ggml_gallocr_free_node(galloc, view_src);
#                 else if (p_hn->allocated) {
#                     ggml_gallocr_free_node(galloc, parent);
# ```
#
# (`ggml-alloc.c:661-665`, the end of the third loop of `ggml_gallocr_alloc_graph_impl`.) A block is
# freed two ways: a parent whose last child has run, or the root of a view whose last user has;
# `allocated`, false for a block already handed to a child in place, guards both.

# %%
# | export
def _buffer_id(ids, i: int) -> int:
    """`get_node_buffer_id`: buffer 0 when no ids are given."""
    return ids[i] if ids is not None else 0


@method_of(GAllocr)
def alloc_graph_impl(galloc, graph, node_buffer_ids=None, leaf_buffer_ids=None) -> None:
    """`ggml_gallocr_alloc_graph_impl` (:563-668): plan `graph` into `galloc.hash_values` in three
    loops. For speed, `allocate_node`'s first test is also made before each call (same result)."""
    hv: dict[Tensor, HashNode] = {}
    galloc.hash_values = hv  # "clear hash tables": the previous plan's records go
    OP_NONE = Op.NONE  # a local for the loop
    allocate_node, free_node, trace = galloc.allocate_node, galloc.free_node, galloc.trace

    # allocate leafs: "these may be tensors that the application is not using in the graph,
    # but may still want to allocate for other purposes"
    if trace is not None:
        trace(PhaseEvent("leafs"))
    for i, leaf in enumerate(graph.leafs):
        if leaf.data is None and leaf.view_src is None:
            allocate_node(leaf, _buffer_id(leaf_buffer_ids, i), -1, "leaf")

    # count number of children and views; allocate other graph inputs and leafs first
    if trace is not None:
        trace(PhaseEvent("count"))
    for i, node in enumerate(graph.nodes):
        # GGML_OP_NONE "is used by ggml-backend to add dependencies": such a node is not a view user
        view_src = node.view_src
        if view_src is not None and node.op is not OP_NONE:
            hn = galloc.hash_get(view_src)
            hn.n_views += 1
        if node.flags & INPUT:
            allocate_node(node, _buffer_id(node_buffer_ids, i), i, "input")
        for src in node.src:
            if src is None:
                continue
            hn = galloc.hash_get(src)
            hn.n_children += 1
            if src.flags & INPUT:  # allocate explicit inputs
                allocate_node(src, _buffer_id(node_buffer_ids, i), i, "input")

    # allocate tensors
    if trace is not None:
        trace(PhaseEvent("allocate"))
    for i, node in enumerate(graph.nodes):
        buffer_id = node_buffer_ids[i] if node_buffer_ids is not None else 0  # get_node_buffer_id
        srcs = node.src
        for parent in srcs:  # allocate parents (only leafs need to be allocated at this point)
            if parent is not None and parent.data is None and parent.view_src is None and not hv[parent].allocated:
                allocate_node(parent, buffer_id, i, "parent")
        if node.data is None and node.view_src is None:  # allocate node
            allocate_node(node, buffer_id, i, "node")
        for parent in srcs:  # update parents
            if parent is None:
                continue
            p_hn = hv[parent]  # counted in the second loop
            p_hn.n_children -= 1
            if p_hn.n_children == 0 and p_hn.n_views == 0:
                view_src = parent.view_src
                if view_src is not None:
                    vs_hn = galloc.hash_get(view_src)
                    vs_hn.n_views -= 1
                    if vs_hn.n_views == 0 and vs_hn.n_children == 0 and vs_hn.allocated:
                        free_node(view_src, i, parent)
                elif p_hn.allocated:
                    free_node(parent, i)
        if trace is not None:
            trace(ExecEvent(i, node, tuple((p, hv[p].n_children, hv[p].n_views, hv[p].allocated)
                                           for p in srcs if p is not None)))

# %% [markdown]
# ```c
#         size_t cur_size = galloc->buffers[i] ? ggml_backend_buffer_get_size(galloc->buffers[i]) : 0;
#         size_t new_size = ggml_dyn_tallocr_max_size(galloc->buf_tallocs[i]);
#         if (new_size > cur_size || galloc->buffers[i] == NULL) {
# ```
#
# (`ggml-alloc.c:759-763`, in `ggml_gallocr_reserve_n`.) Notice `new_size > cur_size`: after
# planning, a buffer grows when the plan needs more than it has, and never shrinks.

# %%
# | export
def _check_ids(galloc: GAllocr, ids, n: int, what: str) -> None:
    if ids is None:
        return
    if len(ids) < n:
        raise BufferIdError(f"{what}: {len(ids)} buffer ids given for {n} tensors")
    bad = next((i for i in range(n) if not 0 <= ids[i] < galloc.n_buffers), None)
    if bad is not None:
        raise BufferIdError(f"{what}[{bad}] = {ids[bad]}, the allocator has {galloc.n_buffers} buffer(s)")


_SRC = attrgetter("src")


@method_of(GAllocr)
def plan_and_keep(galloc, graph, node_buffer_ids=None, leaf_buffer_ids=None) -> None:
    """`ggml_gallocr_reserve_n` up to its reallocation loop (lines 670-745), shared with chapter 12's
    allocator: reset the dynamic allocators, plan `graph`, keep which tensor sat in each slot."""
    _check_ids(galloc, node_buffer_ids, len(graph.nodes), "node_buffer_ids")
    _check_ids(galloc, leaf_buffer_ids, len(graph.leafs), "leaf_buffer_ids")
    for talloc in galloc.buf_tallocs:  # reset allocators (a shared one is reset twice, as in C)
        talloc.reset()
    # forget the previous plan first: a plan that fails half-way (an exception) leaves none, which
    # the next alloc_graph sees as a graph of another size (the C aborts instead)
    galloc.planned_nodes, galloc.planned_srcs, galloc.planned_leafs = [], [], []  # (the records: alloc_graph_impl)
    galloc._take_size_fns()
    alloc_graph_impl(galloc, graph, node_buffer_ids, leaf_buffer_ids)

    # set the node_allocs and leaf_allocs: which tensor sat in each slot (copies, as the C's are)
    galloc.planned_nodes = list(graph.nodes)
    galloc.planned_srcs = list(map(list.copy, map(_SRC, graph.nodes)))  # [node.src.copy() for node in nodes]
    galloc.planned_leafs = list(graph.leafs)


@method_of(GAllocr)
def reserve_n(galloc, graph, node_buffer_ids=None, leaf_buffer_ids=None) -> bool:
    """`ggml_gallocr_reserve_n` (:670-779): plan `graph` from scratch, keep the plan, and grow every
    buffer the plan outgrew."""
    plan_and_keep(galloc, graph, node_buffer_ids, leaf_buffer_ids)
    # reallocate buffers if needed
    for i in range(galloc.n_buffers):
        for j in range(i):  # if the buffer type is used multiple times, we reuse the same buffer
            if galloc.buf_tallocs[j] is galloc.buf_tallocs[i]:
                galloc.buffers[i] = galloc.buffers[j]
                break
        buf = galloc.buffers[i]
        cur_size = buf.get_size() if buf is not None else 0
        new_size = galloc.buf_tallocs[i].get_max_size()
        # "even if there are no tensors allocated in this buffer, we still need to allocate it to initialize views"
        if new_size > cur_size or buf is None:
            name = galloc.bufts[i].get_name()
            log.info("ggml_gallocr_reserve_n: reallocating %s buffer from size %.02f MiB to %.02f MiB",
                     name, cur_size / MiB, new_size / MiB)
            if buf is not None:
                buf.free()
            galloc.buffers[i] = galloc.bufts[i].alloc_buffer(new_size)
            if galloc.buffers[i] is None:
                log.error("ggml_gallocr_reserve_n: failed to allocate %s buffer of size %d", name, new_size)
                return False
    return True


@method_of(GAllocr)
def reserve(galloc, graph) -> bool:
    """`ggml_gallocr_reserve` (:781-783): `reserve_n` with every tensor in buffer 0."""
    return galloc.reserve_n(graph, None, None)

# %% [markdown]
# ### 2.6 · From the plan to the tensors
#
# ```c
# static bool ggml_gallocr_node_needs_realloc(ggml_gallocr_t galloc, struct ggml_tensor * node, struct tensor_alloc * talloc) {
#     size_t node_size = (node->data || node->view_src) ? 0 : ggml_backend_buft_get_alloc_size(galloc->bufts[talloc->buffer_id], node);
#     return talloc->size_max >= node_size;
# }
# ```
#
# (`ggml-alloc.c:814-817`.) Notice the name: it returns true when the tensor *fits* its record. The
# port skips a slot that still holds the very tensor the plan placed (its `size_max` fits by construction).

# %%
# | export
@method_of(GAllocr)
def init_tensor(galloc, tensor, talloc) -> None:
    """`ggml_gallocr_init_tensor` (:785-812): a view takes its root's buffer, a planned tensor its
    offset; `talloc` is the tensor's record in the plan (its hash node) or NOT_PLACED."""
    if tensor.view_src is not None:
        if tensor.buffer is None:
            if tensor.view_src.buffer is None:
                return  # this tensor was allocated without ggml-backend
            view_init(tensor)
        return
    if tensor.data is not None:
        return  # pre-allocated (with or without ggml-backend)
    buffer_id = talloc.buffer_id
    buffer = galloc.buffers[buffer_id] if buffer_id >= 0 else None
    # ggml_backend_buffer_get_alloc_size(buffer, tensor): the buffer's type is bufts[buffer_id]
    need = galloc._known_size(buffer_id, tensor) if buffer is not None else None
    placed = talloc.size_max is not None  # (a hash node the plan did not place has none)
    if buffer is None or need is None or not placed or talloc.offset == SIZE_MAX or need > talloc.size_max:  # asserts
        unplaced = "" if placed and talloc.size_max else " (it was not placed at all)"
        raise PlanMismatchError(
            f"{describe(tensor)} needs {need if need is not None else '?'} bytes, but the plan reserved "
            f"{talloc.size_max or 0} bytes for it{unplaced}: call reserve() with this graph")
    galloc.place(buffer, tensor, talloc.offset, need)


@method_of(GAllocr)
def place(galloc, buffer, tensor, offset: int, need: int) -> None:
    """`ggml_gallocr_init_tensor`'s last step, `ggml_backend_tensor_alloc` (chapter 12: into a chunk)."""
    tensor_alloc(buffer, tensor, buffer.get_base() + offset, need)


@method_of(GAllocr)
def node_needs_realloc(galloc, node, talloc) -> bool:
    """`ggml_gallocr_node_needs_realloc` (:814-817): despite its name, True when the tensor *fits*.
    A tensor the plan did not place that now needs memory is not valid (the C would crash)."""
    if node.data is not None or node.view_src is not None:
        return True  # node_size is 0
    if talloc.buffer_id == -1 or talloc.size_max is None:  # not placed by the plan
        return False
    return talloc.size_max >= galloc._known_size(talloc.buffer_id, node)


@method_of(GAllocr)
def needs_realloc(galloc, graph) -> bool:
    """`ggml_gallocr_needs_realloc` (:819-860): plan again when the counts differ or a tensor outgrew its slot."""
    if len(galloc.planned_nodes) != len(graph.nodes):
        log.info("ggml_gallocr_needs_realloc: graph has different number of nodes")
        return True
    if len(galloc.planned_leafs) != len(graph.leafs):
        log.info("ggml_gallocr_needs_realloc: graph has different number of leafs")
        return True
    # `fits` is asked only when its answer is not known already (neither shortcut changes a result)
    fits = node_needs_realloc  # True = it fits (see its name)
    records = galloc.hash_values  # the plan: a placed tensor's hash node is its tensor_alloc (section 2.2)
    for node, planned_node, planned_srcs in zip(graph.nodes, galloc.planned_nodes, galloc.planned_srcs):
        if node.data is None and node.view_src is None:
            rec = records.get(planned_node, NOT_PLACED)
            if (node is not planned_node or rec.size_max is None) and not fits(galloc, node, rec):
                log.info("ggml_gallocr_needs_realloc: node %s is not valid", node.name)
                return True
        j = 0
        for src in node.src:
            if src is not None and src.data is None and src.view_src is None:
                planned_src = planned_srcs[j] if j < len(planned_srcs) else None
                rec = NOT_PLACED if planned_src is None else records.get(planned_src, NOT_PLACED)
                if (src is not planned_src or rec.size_max is None) and not fits(galloc, src, rec):
                    log.info("ggml_gallocr_needs_realloc: src %d (%s) of node %s is not valid", j, src.name, node.name)
                    return True
            j += 1
    return False

# %% [markdown]
# ```c
# bool ggml_gallocr_alloc_graph(ggml_gallocr_t galloc, struct ggml_cgraph * graph) {
#     if (ggml_gallocr_needs_realloc(galloc, graph)) {
#         if (galloc->n_buffers == 1) {
# ```
#
# (`ggml-alloc.c:862-864`.) It places a graph from the kept plan, so the next batch (new tensors,
# same shape) is placed without planning; only a single-buffer allocator plans again by itself.
# `ggml_gallocr_get_buffer_size` counts a buffer shared by two buffer ids once.

# %%
# | export
@method_of(GAllocr)
def alloc_graph(galloc, graph) -> bool:
    """`ggml_gallocr_alloc_graph` (:862-908): plan again if needed (single buffer only), reset the
    buffers, then place every leaf, node source and node from the kept plan."""
    galloc._take_size_fns()
    if galloc.needs_realloc(graph):
        if galloc.n_buffers == 1:
            log.info("ggml_gallocr_alloc_graph: reallocating buffers automatically")
            if not galloc.reserve_n(graph):
                return False
        else:
            log.info("ggml_gallocr_alloc_graph: cannot reallocate multi buffer graph automatically, call reserve")
            return False
    for buf in galloc.buffers:  # reset buffers
        if buf is not None:
            buf.reset()
    init, records = type(galloc).init_tensor, galloc.hash_values  # the plan's records (section 2.2)
    for leaf, planned_leaf in zip(graph.leafs, galloc.planned_leafs):
        if leaf.data is None or (leaf.view_src is not None and leaf.buffer is None):  # else init does nothing
            init(galloc, leaf, records.get(planned_leaf, NOT_PLACED))
    for node, planned_node, planned_srcs in zip(graph.nodes, galloc.planned_nodes, galloc.planned_srcs):
        j = 0
        for src in node.src:
            # init_tensor does nothing to a source already placed (most are: earlier nodes)
            if src is not None and (src.data is None if src.view_src is None else src.buffer is None):
                init(galloc, src, records.get(planned_srcs[j], NOT_PLACED) if j < len(planned_srcs) else NOT_PLACED)
            j += 1
        if node.data is None or (node.view_src is not None and node.buffer is None):
            init(galloc, node, records.get(planned_node, NOT_PLACED))
    return True


@method_of(GAllocr)
def free(galloc) -> None:
    """`ggml_gallocr_free`: free each distinct buffer once."""
    seen: list = []
    for buf in galloc.buffers:
        if buf is not None and not any(buf is s for s in seen):
            buf.free()
            seen.append(buf)
    galloc.buffers = [None] * galloc.n_buffers


@method_of(GAllocr)
def get_buffer_size(galloc, buffer_id: int) -> int:
    """`ggml_gallocr_get_buffer_size`: a shared buffer counts once, at its first id."""
    if not 0 <= buffer_id < galloc.n_buffers:
        raise BufferIdError(f"buffer id {buffer_id} asked, the allocator has {galloc.n_buffers} buffer(s)")
    buf = galloc.buffers[buffer_id]
    if buf is None:
        return 0
    if any(galloc.buffers[i] is buf for i in range(buffer_id)):
        return 0  # the same buffer type used several times: only count it once
    return buf.get_size()


# %% [markdown]
# ## 3 · A worked example: one LLaMA block
#
# The block llama.cpp built in mid-2024, at toy size (n_embd 128, 4 heads, n_ff 344, 10 tokens, no
# KV cache). The weights live in their own buffer, as llama.cpp loads a model, so the graph
# allocator plans only the compute tensors. Fixture 06 recorded real ggml doing exactly this.

# %%
# NBVAL_CHECK_OUTPUT
import json  # noqa: E402
import math  # noqa: E402
from pathlib import Path  # noqa: E402

from ggml_lite.dyn_tallocr import captured_log  # noqa: E402


def llama_block(n_tokens=10, n_embd=128, n_head=4, n_ff=344, eps=1e-5):
    """One transformer block as llama.cpp's build_llama wrote it in mid-2024; returns (graph, weights ctx)."""
    wctx, ctx = gl.Context("weights"), gl.Context("compute")

    def weight(name, *ne):
        return wctx.new_tensor(gl.F32, list(ne), name=f"blk.0.{name}.weight")

    attn_norm, wq, wk = weight("attn_norm", n_embd), weight("attn_q", n_embd, n_embd), weight("attn_k", n_embd, n_embd)
    wv, wo, ffn_norm = weight("attn_v", n_embd, n_embd), weight("attn_output", n_embd, n_embd), weight("ffn_norm", n_embd)
    w_gate, w_up, w_down = weight("ffn_gate", n_embd, n_ff), weight("ffn_up", n_embd, n_ff), weight("ffn_down", n_ff, n_embd)
    x = ctx.new_tensor_2d(gl.F32, n_embd, n_tokens, name="inp_x")
    pos = ctx.new_tensor_1d(gl.I32, n_tokens, name="inp_pos")
    mask = ctx.new_tensor_2d(gl.F32, n_tokens, gl.GGML_PAD(n_tokens, 32), name="KQ_mask")
    for t in (x, pos, mask):
        gl.set_input(t)
    hd = n_embd // n_head

    def rope(t):
        return gl.rope_ext(ctx, gl.reshape_3d(ctx, t, hd, n_head, n_tokens), pos, None, hd, 0, 4096,
                           10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)

    cur = gl.mul(ctx, gl.rms_norm(ctx, x, eps).set_name("norm-0"), attn_norm).set_name("attn_norm-0")
    q = gl.mul_mat(ctx, wq, cur).set_name("Qcur-0")
    k = gl.mul_mat(ctx, wk, cur).set_name("Kcur-0")
    v = gl.mul_mat(ctx, wv, cur).set_name("Vcur-0")
    q, k = rope(q).set_name("Qcur_rope-0"), rope(k).set_name("Kcur_rope-0")
    roots = [q, k, v]
    q = gl.permute(ctx, q, 0, 2, 1, 3).set_name("q-0")
    k = gl.permute(ctx, k, 0, 2, 1, 3).set_name("k-0")
    v = gl.cont(ctx, gl.permute(ctx, gl.reshape_3d(ctx, v, hd, n_head, n_tokens), 1, 2, 0, 3)).set_name("v-0")
    kq = gl.soft_max_ext(ctx, gl.mul_mat(ctx, k, q).set_name("kq-0"), mask, 1.0 / math.sqrt(hd), 0.0)
    kqv = gl.mul_mat(ctx, v, kq.set_name("kq_soft_max_ext-0")).set_name("kqv-0")
    cur = gl.cont_2d(ctx, gl.permute(ctx, kqv, 0, 2, 1, 3).set_name("kqv_merged-0"), n_embd, n_tokens)
    roots.append(cur.set_name("kqv_merged_cont-0"))
    ffn_inp = gl.add(ctx, gl.mul_mat(ctx, wo, cur).set_name("kqv_out-0"), x).set_name("ffn_inp-0")
    cur = gl.mul(ctx, gl.rms_norm(ctx, ffn_inp, eps).set_name("norm_ffn-0"), ffn_norm).set_name("ffn_norm-0")
    up = gl.mul_mat(ctx, w_up, cur).set_name("ffn_up-0")
    gate = gl.silu(ctx, gl.mul_mat(ctx, w_gate, cur).set_name("ffn_gate-0")).set_name("ffn_silu-0")
    par = gl.mul(ctx, gate, up).set_name("ffn_gate_par-0")
    out = gl.add(ctx, gl.mul_mat(ctx, w_down, par).set_name("ffn_down-0"), ffn_inp).set_name("l_out-0")
    gl.set_output(out)
    roots.append(out)
    graph = gl.Graph()
    for r in roots:  # the builder's ggml_build_forward_expand calls, in its order
        gl.build_forward_expand(graph, r)
    return graph, wctx


graph, wctx = llama_block()
wbuf = gl.alloc_ctx_tensors(wctx, gl.cpu_buffer_type())  # the weights: 791,584 bytes, outside the plan
galloc = GAllocr(gl.cpu_buffer_type())
with captured_log() as lines:
    assert galloc.reserve(graph) and galloc.alloc_graph(graph)
base = galloc.buffers[0].get_base()
print(f"{len(graph.nodes)} nodes, {len(graph.leafs)} leafs; compute buffer {galloc.get_buffer_size(0)} bytes")
print("log:", *lines, sep="\n  ")
for i, node in enumerate(graph.nodes):  # where everything went (a view: the offset it points at)
    kind = "view" if node.view_src is not None else ""
    print(f"{i:2d} {node.name:28s} {node.op.name:9s} {node.nbytes:6d} B  offset {node.data - base:6d} {kind}")

# %% [markdown]
# Read a few lines against the rules. The INPUT leafs `inp_x`, `inp_pos`, `KQ_mask` are placed with the
# other leafs, before any node (0, 5120, 5184). `attn_norm-0` (MUL, `norm-0`'s only child) **takes
# `norm-0`'s memory**. `Qcur-0` is read only through its reshape view, never the allocator's own, so
# `Qcur_rope-0` (ROPE) refuses it and gets a new block. The OUTPUT `l_out-0` takes `ffn_down-0`'s block
# (offset 0), never freed. Against what ggml recorded (`tests/fixtures/ggml-seed/06_llama_block.json`):

# %%
rec = json.loads(Path("../tests/fixtures/ggml-seed/06_llama_block.json").read_text())
want = {t["name"]: t["offset"] for t in rec["graph"]["tensors"] if t["ctx"] == "compute"}
got = {t.name: t.data - base for t in graph.nodes + graph.leafs if t.name in want}
assert got == want and rec["buffer_size"] == galloc.get_buffer_size(0)
print(f"fixture 06: all {len(want)} compute tensors at ggml's offsets; buffer size {rec['buffer_size']} as recorded")

# %% [markdown]
# ## 4 · The memory timeline
#
# Each rectangle is a block of the plan: x from the node that places it to the node that frees it
# (or hands it to an in-place child, orange), y its offsets; views are dotted outlines inside their
# root's block. The dashed line is the peak of bytes live at once — no placement of these lifetimes
# needs less — and the solid line the buffer the plan needs: the gap is what best fit loses to
# fragmentation. The analysis is its own module, `ggml_lite.trace` (`viz.timeline` only draws): it
# traces `ggml_gallocr_reserve` and cuts the trace into steps, in words, as the C's debug prints would:
#
# ```c
#     AT_PRINTF("%s: allocating %s (%zu bytes) - ", __func__, tensor->name, size);
#     AT_PRINTF("block %d, offset %zu\n", best_fit_block, offset);
# ```
#
# (`ggml-alloc.c:151` and :193.) The dynamic allocator's choice of a block comes right before the
# decision it serves.

# %%
# | export trace
"""The analysis of a graph-allocator plan (chapter 05): its trace, blocks and lifetimes, the bytes live
at each node (the peak-live lower bound), and one step per node in words. `viz.timeline` draws it."""

from dataclasses import dataclass

from ggml_lite.buffer import cpu_buffer_type
from ggml_lite.dyn_tallocr import AllocEvent, FreeEvent
from ggml_lite.gallocr import ExecEvent, FreeNodeEvent, GAllocr, PhaseEvent, PlaceEvent, RejectEvent


def trace_plan(graph, bufts=None) -> tuple:
    """`(galloc, events)`: `graph` planned by `GAllocr.reserve` (CPU buffer type by default), traced."""
    events: list = []
    galloc = GAllocr(bufts if bufts is not None else cpu_buffer_type(), trace=events.append)
    galloc.reserve(graph)
    return galloc, events


@dataclass
class Lifetime:
    """A block: `tensor` held `[offset, offset + size)` from node `start` to `end` (inclusive); `how`
    "leaf", "input", "new" or "inplace" (from `parent`); `kind` "tensor" or "view" (drawn only);
    `handed_at`: the node from which an in-place child holds it; `superseded`: placed again later."""

    tensor: object
    buffer_id: int
    offset: int
    size: int
    start: int
    end: int
    how: str
    parent: object = None
    kind: str = "tensor"
    handed_at: int | None = None
    superseded: bool = False


def plan_steps(events) -> list:
    """The trace in steps: 0 the leaf and counting loops, i+1 node i's visit; each
    `{"title", "events", "exec", "free_blocks"}` (the free list after it)."""
    steps: list[dict] = []
    cur: dict = {"title": "leafs and INPUT tensors", "events": [], "exec": None, "free_blocks": ()}
    free_blocks = ()
    for ev in events:
        if isinstance(ev, PhaseEvent) and ev.phase == "allocate":
            cur["free_blocks"] = free_blocks
            steps.append(cur)
            cur = {"title": None, "events": [], "exec": None, "free_blocks": ()}
            continue
        if isinstance(ev, (AllocEvent, FreeEvent)):
            free_blocks = ev.free_blocks
        if isinstance(ev, ExecEvent):
            cur.update(title=ev.describe(), exec=ev, free_blocks=free_blocks)
            steps.append(cur)
            cur = {"title": None, "events": [], "exec": None, "free_blocks": ()}
            continue
        if not isinstance(ev, PhaseEvent):
            cur["events"].append(ev)
    return steps


def decision_lines(step) -> list:
    """A step's decisions in words: placements (with the block chosen), refusals and frees."""
    lines, choice = [], None
    for ev in step["events"]:
        if isinstance(ev, AllocEvent):  # comes just before the PlaceEvent of the same tensor
            grows = f", max_size grows to {ev.max_size} B" if ev.max_size > ev.max_size_before else ""
            choice = (f"best fit: block {ev.block} of {ev.n_blocks} ({ev.block_size} B)" if ev.how == "best_fit"
                      else "the last block" + grows)
        elif isinstance(ev, PlaceEvent):
            lines.append(ev.describe() + (f" — {choice}" if ev.how == "new" and choice else ""))
            choice = None
        elif isinstance(ev, (RejectEvent, FreeNodeEvent)):
            lines.append(ev.describe())
    return lines


# %% [markdown]
# ```c
#     ggml_backend_buffer_type_t buft = galloc->bufts[buffer_id];
#     size_t size = ggml_backend_buft_get_alloc_size(buft, node);
#     ggml_dyn_tallocr_free_tensor(alloc, offset, size, node);
#     hn->allocated = false;
# ```
#
# (`ggml-alloc.c:553-556`, in `ggml_gallocr_free_node`.) A block lives from the `ggml_dyn_tallocr_alloc`
# that placed it to this free, or to the node that took it in place (a block handed over counts once).
# One quirk: loop 2 places an INPUT node *before* counting its own sources, so a parent read by an earlier
# node still shows one child; the INPUT node takes its block in place, and ggml places the parent again,
# in new memory. A tensor lives where it was placed last: `lifetimes` marks the first `superseded`.

# %%
# | export trace
def lifetimes(graph, events) -> list:
    """The blocks of a plan: one per placement, ending where it was freed, handed to an in-place child,
    or at the last node; an earlier placement of a tensor placed twice is `superseded`. Views of placed
    tensors are added from the graph, from their node to their last consumer."""
    n = len(graph.nodes)
    open_: dict[object, Lifetime] = {}
    latest: dict[object, Lifetime] = {}
    out: list[Lifetime] = []
    aligned: dict[object, int] = {}
    for ev in events:
        if isinstance(ev, AllocEvent):
            aligned[ev.tensor] = ev.size
        elif isinstance(ev, PlaceEvent):
            start = max(ev.node_index, 0) if ev.phase in ("parent", "node") else 0
            how = ev.phase if ev.phase in ("leaf", "input") and ev.how == "new" else ev.how
            size = aligned.get(ev.tensor, ev.size)
            if ev.parent is not None and ev.parent in open_:
                par = open_.pop(ev.parent)
                par.end, par.handed_at = ev.node_index, start
                size = par.size
            if ev.tensor in latest:  # placed again (an INPUT node took it in place while counting)
                latest[ev.tensor].superseded = True
            lt = Lifetime(ev.tensor, ev.buffer_id, ev.offset, size, start, max(n - 1, start), how, ev.parent)
            open_[ev.tensor] = latest[ev.tensor] = lt
            out.append(lt)
        elif isinstance(ev, FreeNodeEvent) and not ev.kept_output and ev.tensor in open_:
            open_.pop(ev.tensor).end = ev.node_index
    last_use: dict[object, int] = {}
    for i, node in enumerate(graph.nodes):
        for s in node.src:
            if s is not None:
                last_use[s] = i
    placed = {lt.tensor: lt for lt in out}
    for i, node in enumerate(graph.nodes):
        root = placed.get(node.view_src) if node.view_src is not None else None
        if root is not None:
            out.append(Lifetime(node, root.buffer_id, root.offset + node.view_offs, node.nbytes, i,
                                last_use.get(node, i), "view", node.view_src, "view"))
    return out


def live_bytes(lts, n_nodes: int) -> list:
    """Bytes in use during each node: the blocks alive then, views and superseded placements left out;
    a block handed over in place counts once (the parent holds it until its child does)."""
    live = [0] * max(n_nodes, 1)
    for lt in lts:
        if lt.kind != "tensor" or lt.superseded:
            continue
        end = lt.end if lt.handed_at is None else min(lt.end, lt.handed_at - 1)
        for i in range(lt.start, end + 1):
            live[i] += lt.size
    return live

# %% [markdown]
# ```c
#     alloc->max_size = MAX(alloc->max_size, offset + size);
#
#     return offset;
#
#     GGML_UNUSED(tensor);
# ```
#
# (`ggml-alloc.c:225-229`, the end of `ggml_dyn_tallocr_alloc`.) The solid line of the timeline is
# this `max_size`: the highest end of any block, the buffer the plan needs. Notice it only grows.

# %%
# | export viz.timeline
"""Pictures of a graph-allocator plan (chapter 05): a plotly memory timeline of its blocks, and an
ipywidgets stepper through its decisions. The analysis they draw is `ggml_lite.trace`."""

import plotly.graph_objects as go

from ggml_lite.trace import decision_lines, lifetimes, live_bytes, plan_steps
from ggml_lite.viz.memory import memory_bar, step_widget

COLORS = {"leaf": "#2ca02c", "input": "#17becf", "new": "#636efa", "inplace": "#ff7f0e", "inplace_view": "#ff7f0e"}


def _rect(x0, x1, y0, y1):
    return [x0, x1, x1, x0, x0, None], [y0, y0, y1, y1, y0, None]


def memory_timeline(graph, events, buffer_size: int | None = None, title: str = "memory timeline",
                    height: int = 520) -> go.Figure:
    """x = node, y = offset: one rectangle per block over its lifetime (views dotted), with the peak of
    live bytes (a lower bound for these lifetimes) and the buffer size (`max_size`) as lines."""
    lts = lifetimes(graph, events)
    fig = go.Figure()
    for how, color in COLORS.items():
        xs, ys, hx, hy, text = [], [], [], [], []
        for lt in lts:
            if lt.kind != "tensor" or lt.how != how or lt.superseded:
                continue
            x, y = _rect(lt.start - 0.42, lt.end + 0.42, lt.offset, lt.offset + lt.size)
            xs += x
            ys += y
            hx.append((lt.start + lt.end) / 2)
            hy.append(lt.offset + lt.size / 2)
            via = f"<br>in place of {lt.parent.name}" if lt.parent is not None else ""
            text.append(f"{lt.tensor.name} ({lt.tensor.op.name})<br>{lt.size} B at {lt.offset}<br>"
                        f"nodes {lt.start}..{lt.end}; {how}{via}")
        if xs:
            fig.add_trace(go.Scatter(x=xs, y=ys, fill="toself", mode="lines", line=dict(color="white", width=1),
                                     fillcolor=color, name=how, hoverinfo="skip"))
            fig.add_trace(go.Scatter(x=hx, y=hy, mode="markers", marker=dict(size=6, color=color, opacity=0.01),
                                     hovertext=text, hoverinfo="text", showlegend=False))
    xs, ys = [], []
    for lt in lts:
        if lt.kind == "view":
            x, y = _rect(lt.start - 0.3, lt.end + 0.3, lt.offset, lt.offset + lt.size)
            xs += x
            ys += y
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="black", width=1, dash="dot"),
                                 name="view", hoverinfo="skip"))
    n = len(graph.nodes)
    peak = max(live_bytes(lts, n))
    for y, label, dash in ((peak, f"peak live {peak} B (lower bound)", "dash"),
                           (buffer_size, f"buffer {buffer_size} B", "solid")):
        if y:
            fig.add_shape(type="line", x0=-0.5, x1=n - 0.5, y0=y, y1=y, line=dict(color="crimson", dash=dash))
            fig.add_annotation(x=n - 0.5, y=y, text=label, showarrow=False, xanchor="right", yanchor="bottom")
    fig.update_layout(title=title, height=height, xaxis_title="node (execution order)", yaxis_title="offset (bytes)",
                      margin=dict(l=60, r=20, t=50, b=90), legend=dict(orientation="h", y=-0.18, x=0, yanchor="top"),
                      plot_bgcolor="white")
    return fig

# %%
from ggml_lite.trace import lifetimes, live_bytes, trace_plan  # noqa: E402
from ggml_lite.viz.timeline import memory_timeline  # noqa: E402

graph2, wctx2 = llama_block()
gl.alloc_ctx_tensors(wctx2, gl.cpu_buffer_type())
traced, events = trace_plan(graph2)
lts = lifetimes(graph2, events)
peak = max(live_bytes(lts, len(graph2.nodes)))
print(f"peak live {peak} B, plan {traced.buf_tallocs[0].max_size} B: ratio {traced.buf_tallocs[0].max_size / peak:.3f}")
memory_timeline(graph2, events, traced.buf_tallocs[0].max_size, title="LLaMA block, 10 tokens: the plan").show()

# %% [markdown]
# The quirk in four tensors: the INPUT `u` takes `x`'s block at 0, `x` is placed again at 256.
# Counted at both offsets `x` would give 1,024 B at node 0, above the plan's 768 B; counted once,
# the peak is the plan's own size:

# %%
# NBVAL_CHECK_OUTPUT
c_tw = gl.Context("placed twice")
x_tw = c_tw.new_tensor_1d(gl.F32, 64, name="x")
gl.set_input(x_tw)
r_tw = gl.scale(c_tw, x_tw, 2.0).set_name("r")  # node 0: the earlier reader
u_tw = gl.scale(c_tw, x_tw, 3.0).set_name("u")  # node 1, INPUT: placed in loop 2
gl.set_input(u_tw)
y_tw = gl.add(c_tw, r_tw, u_tw).set_name("y")
gl.set_output(y_tw)
g_tw = gl.build_forward(y_tw)
ga_tw, ev_tw = trace_plan(g_tw)
print(*[e.describe() for e in ev_tw if isinstance(e, PlaceEvent)], sep="\n")
lts_tw = lifetimes(g_tw, ev_tw)
print("superseded:", [(lt.tensor.name, lt.offset) for lt in lts_tw if lt.superseded])
print("live bytes per node:", live_bytes(lts_tw, len(g_tw.nodes)), "plan:", ga_tw.buf_tallocs[0].max_size)

# %% [markdown]
# ## 5 · Stepping through the plan
#
# Step 0 is loops 1-2 (leafs, then INPUT tensors); every later step visits one node: its parents'
# children left, the decisions and why, the free list that the best-fit loop searches, a memory bar.
#
# ```c
#     for (int i = 0; i < alloc->n_free_blocks - 1; i++) {
# ...
#         if (block->size >= size && block->size <= best_fit_size) {
#             best_fit_block = i;
#             best_fit_size = block->size;
# ```
#
# (`ggml-alloc.c:158-163`, in `ggml_dyn_tallocr_alloc`.) Notice `<=`: of equal blocks the *last* wins.

# %%
# | export viz.timeline
def alloc_stepper(graph, events, end: int | None = None):
    """A stepper through a plan: per node its parents' children left, the decisions, the free list, a memory bar."""
    from IPython.display import display

    steps = plan_steps(events)
    lts = lifetimes(graph, events)
    end = end or int(max([lt.offset + lt.size for lt in lts] + [1]) * 1.1)

    def render(k):
        st = steps[k]
        node_i = k - 1  # step 0 is before the first node
        live = [(lt.tensor.name, lt.offset, lt.size) for lt in lts
                if lt.kind == "tensor" and not lt.superseded and lt.start <= max(node_i, 0) <= lt.end
                and not (k == 0 and lt.how not in ("leaf", "input"))]
        print(f"step {k}/{len(steps) - 1}: {st['title']}")
        if st["exec"] is not None:
            for p, c, v, a in st["exec"].parents:
                print(f"  parent {p.name}: children left {c}, views left {v}, {'held' if a else 'not held'}")
        for line in decision_lines(st) or ["(nothing to place or free)"]:
            print(line)
        print("free list:", ", ".join(f"[{o}, {o + s})" if s < 2**62 else f"[{o}, ...)" for o, s in st["free_blocks"]))
        display(memory_bar([b for b in st["free_blocks"]], sorted(live, key=lambda a: a[1]), end=end,
                           title="memory after this step"))

    return step_widget(len(steps), render, interval=900)

# %% tags=["nbval-ignore-output"]
alloc_stepper(graph2, events)

# %% [markdown]
# The same as text for nodes 1, 4 and 5: `attn_norm-0` takes `norm-0`'s block in place;
# `Qcur_rope-0` refuses its view parent and the positions, gets 5,120 new bytes from the last block
# (the buffer grows to 21,824), and `Qcur-0`'s block at 11,584 is freed:

# %%
# NBVAL_CHECK_OUTPUT
steps = plan_steps(events)
for k in (2, 5, 6):
    print(steps[k]["title"])
    print(*decision_lines(steps[k]), sep="\n")

# %% [markdown]
# ## 6 · Keeping a plan: `alloc_graph` on the next batch
#
# llama.cpp builds a new graph for every batch. `alloc_graph` places it at the kept offsets when
# `ggml_gallocr_needs_realloc` finds the same node and leaf counts and every tensor within its
# `size_max` (§2.6); otherwise it plans again.

# %%
# NBVAL_CHECK_OUTPUT
seq = GAllocr(gl.cpu_buffer_type())
for n_tokens in (10, 4, 16, 16):
    g, w = llama_block(n_tokens)
    gl.alloc_ctx_tensors(w, gl.cpu_buffer_type())
    before = seq.buffers[0]
    with captured_log() as lines:
        assert seq.alloc_graph(g)
    same = "same buffer" if before is seq.buffers[0] else "new buffer"
    print(f"{n_tokens:2d} tokens: buffer {seq.get_buffer_size(0)} B ({same}); log: {lines or 'nothing (plan kept)'}")

# %% [markdown]
# 10 tokens plan from nothing; 4 tokens fit the kept plan; 16 do not: the first node that outgrew
# its plan is named, and the buffer grows — and never shrinks. A multi-buffer allocator does not
# re-plan by itself: only its owner (chapter 09's scheduler) knows which node goes to which buffer.

# %%
two = GAllocr([gl.cpu_buffer_type(), gl.BufferType("OTHER", 64, is_host=True)])
g, w = llama_block()
gl.alloc_ctx_tensors(w, gl.cpu_buffer_type())
with captured_log() as refusal_log:
    refused = two.alloc_graph(g)
print(refused, refusal_log)

# %% [markdown]
# ## 7 · The quirks, collected
#
# Met above: the view-parent branch that cannot run (§3), a tensor placed twice (§4), the inverted
# name of `node_needs_realloc` (§2.6), `GGML_OP_NONE` nodes that are not view users, a buffer that
# never shrinks. And: **leafs of the compute context can be overwritten** by an in-place op that is
# their last user (fixtures 01-05 do it to their weights), INPUT or not — flag them OUTPUT or keep
# them in another buffer; a planned graph looks pre-allocated (reserving the *same* tensors again
# plans nothing); **in-place can take `src[1]`** (or any slot): the first source that passes wins.
# Below, `mul(a, b)`, where `a` has another user, takes `b`'s memory.

# %%
# NBVAL_CHECK_OUTPUT
ctx = gl.Context()
a, b = ctx.new_tensor_1d(gl.F32, 64, name="a"), ctx.new_tensor_1d(gl.F32, 64, name="b")
gl.set_input(a)
total = gl.add(ctx, gl.mul(ctx, a, b).set_name("prod"), a).set_name("total")  # a: INPUT, with a second user
gl.set_output(total)
ev: list = []
GAllocr(gl.cpu_buffer_type(), trace=ev.append).reserve(gl.build_forward(total))
print(*[e.describe() for e in ev if isinstance(e, (PlaceEvent, RejectEvent))], sep="\n")

# %% [markdown]
# ## 8 · Check

# %%
assert galloc.get_buffer_size(0) == 42912 and galloc.buf_tallocs[0].max_size == 42912 - 32
assert graph.nodes[1].data == graph.nodes[0].data  # attn_norm-0 in place of norm-0
assert graph.nodes[-1].data - base == 0 and graph.nodes[-1].flags & gl.TensorFlag.OUTPUT
assert node_needs_realloc(galloc, graph.nodes[0], galloc.node_allocs[0].dst)  # "true" = it fits
assert refused is False and "cannot reallocate multi buffer graph" in refusal_log[-1]
assert peak <= traced.buf_tallocs[0].max_size
assert max(live_bytes(lts_tw, len(g_tw.nodes))) == ga_tw.buf_tallocs[0].max_size == 768
assert any(isinstance(e, PlaceEvent) and e.how == "inplace" and e.parent is b for e in ev)
assert not any(isinstance(e, PlaceEvent) and e.how == "inplace_view" for e in events)
print("chapter 05: all checks passed")

# %% [markdown]
# ## 9 · Exercises
#
# Four exercises, about 45 minutes. Predictions are answered with `answer(id, value)`: replace the `...`
# and run the cell; it says right or wrong, then why. An implementation is graded with `check(id, fn)`
# against the port on the chapter's cases, on what the graph allocator met while planning the recorded
# fixtures of the real ggml, and on random cases; a failure shows the smallest case where your function
# and ggml disagree and the rule it breaks. `python -m ggml_lite exercises` lists what you have done.
# Solutions are in appendix A9; try first.

# %%
from ggml_lite.exercises import answer, check, done  # noqa: E402

# %% [markdown]
# **05.1 · Predict** (medium, 5 min). `x` is an INPUT of 256 f32 (1,024 bytes). The graph is
# `a = scale(x, 2.0)`, `b = sqr(a)`, `c = add(x, b)`, in that order, nothing flagged OUTPUT, and
# `GAllocr(cpu_buffer_type()).reserve(build_forward(c))` plans it (`x` lands at offset 0). At which offsets
# are `a`, `b` and `c`? Answer with a tuple `(a, b, c)`.

# %%
answer("05.1", ...)

# %% [markdown]
# **05.2 · Implement** the in-place decision of `ggml_gallocr_allocate_node` (medium, 15 min). The C, condensed
# and without its debug prints (`ggml-alloc.c:483-531`):
#
# ```c
#         if (ggml_op_can_inplace(node->op)) {
#             for (int i = 0; i < GGML_MAX_SRC; i++) {
#                 struct ggml_tensor * parent = node->src[i];
#                 if (parent == NULL) { continue; }
#                 // if the node's data is external, then we cannot re-use it
#                 if (!ggml_gallocr_is_own(galloc, parent)) { continue; }
#                 // outputs cannot be reused
#                 if (parent->flags & GGML_TENSOR_FLAG_OUTPUT || (parent->view_src != NULL &&
#                     parent->view_src->flags & GGML_TENSOR_FLAG_OUTPUT)) { continue; }
#                 if (!ggml_are_same_layout(node, parent)) { continue; }
#                 struct hash_node * p_hn = ggml_gallocr_hash_get(galloc, parent);
#                 if (p_hn->n_children == 1 && p_hn->n_views == 0) {
#                     if (ggml_is_view(parent)) { /* reuse the view's source: see 05.4 */ }
#                     else { /* take the parent's buffer_id and offset */ return; }
#                 }
#             }
#         }
#         // allocate tensor from the buffer
# ```
#
# Your function gets what the allocator knows at that moment, as plain facts: `can_inplace`
# (`ggml_op_can_inplace(node->op)`) and `parents`, `node->src` in slot order, each `None` (an empty slot)
# or a `Parent` with `own` (`ggml_gallocr_is_own`: placed by this allocator and its block still held; false
# for a pre-allocated tensor, a view, a freed block, or one already handed to another child), `output` (it,
# or the tensor it views, is OUTPUT), `same_layout`, `n_children` and `n_views` (consumers and views not
# yet run; this node still counts, as the counts drop only after it is placed). Leave the view branch out
# (05.4 asks why it may). Return the index of the slot whose memory the node takes, or `None` for a new
# block.

# %%
# exercise 05.2
def inplace_parent(can_inplace, parents):
    """can_inplace: bool; parents: a list of None or Parent(own, output, same_layout, n_children, n_views).
    Returns the slot index whose memory the node takes, or None (a new block)."""
    raise NotImplementedError  # your code here


check("05.2", inplace_parent)

# %% [markdown]
# **05.3 · Implement** `ggml_gallocr_node_needs_realloc` (easy, 10 min), from the C (`ggml-alloc.c:814-817`):
#
# ```c
# static bool ggml_gallocr_node_needs_realloc(ggml_gallocr_t galloc, struct ggml_tensor * node, struct tensor_alloc * talloc) {
#     size_t node_size = (node->data || node->view_src) ? 0 : ggml_backend_buft_get_alloc_size(galloc->bufts[talloc->buffer_id], node);
#     return talloc->size_max >= node_size;
# }
# ```
#
# The tensor comes as plain facts: `data` (its address, or `None` for NULL), `view_src` (the name of the
# tensor it views, or `None`) and `alloc_size` (the bytes it needs in the slot's buffer). `talloc` is its
# slot's record in the kept plan, a `TensorAlloc(buffer_id, offset, size_max)`. A record with `buffer_id`
# -1 means the plan placed nothing in that slot (a view or a pre-allocated tensor sat there); a tensor
# that needs memory is not valid there: return `False` (the C would read `bufts[-1]`). Mind the name.

# %%
# exercise 05.3
def node_needs_realloc(data, view_src, alloc_size, talloc):
    """data: int or None; view_src: str or None; alloc_size: int; talloc: TensorAlloc. Returns the C's bool."""
    raise NotImplementedError  # your code here


check("05.3", node_needs_realloc)

# %% [markdown]
# **05.4 · Explore** (hard, 15 min). `allocate_node` has a branch for a parent that is a view ("reusing view
# parent"), meant for `Qcur_rope-0` of §3, which reads `Qcur-0` only through its reshape. Show that the
# branch never runs. What would change if it did? Run `done("05.4")` when you have an answer.
#
# <details><summary>A worked answer</summary>
#
# A view is never `own`. `allocate_node` returns at once for a view (`!ggml_is_view(node)` is part of its
# first test), before it sets `allocated`, so a view's hash node keeps `allocated = false`, and the first
# test of the loop, `ggml_gallocr_is_own(galloc, parent)`, skips every view parent as "external" before
# the branch is reached. The branch's own tests were written for the case: `Qcur_rope-0` is the only user
# left of the reshape of `Qcur-0` (`n_children == 1`, `n_views == 0`), `Qcur-0` has that one view and no
# other child (`n_views == 1`, `n_children == 0`), and while planning both `data` are NULL, so they compare
# equal. Let the branch run (a subclass of `GAllocr` whose `allocate_node` first marks a view parent as
# held when its source is) and every ROPE takes its source's block: 2 reuses in §3's block, which still
# plans 42,880 bytes (`max_size`); 8 in fixture 07's four layers, from 38,560 to 34,464 bytes; 64 in the
# 7B of fixture 13, which stays at 73,924,608 bytes (70.50 MiB). ggml 0.15.3 still tests `is_own` first,
# so the branch is dead there too.
#
# </details>
