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
# # 04 · The graph allocator
#
# A compute graph of a 7B LLaMA has a thousand intermediate tensors, but only a handful are alive
# at any moment: each dies once its last consumer has run. ggml's graph allocator `ggml_gallocr`
# walks the graph in execution order, gives each node memory from the dynamic allocator of
# chapter 03, lets a node **overwrite its parent** when that is safe, and frees a parent as soon as
# its last child has run. The highest offset ever handed out becomes the compute buffer's size —
# 70.50 MiB instead of the gigabytes that one buffer per tensor would take.
#
# **Learning goals**
#
# 1. The two phases: `reserve` *plans* (offsets only, from scratch, buffers grown when needed);
#    `alloc_graph` *places* the tensors of a graph from the kept plan, and plans again only when the
#    graph no longer fits it.
# 2. The per-tensor bookkeeping — children and views not yet run — and the exact rules for freeing
#    and for in-place reuse, with the quirks they have.
# 3. Reading a plan: a memory timeline of a LLaMA block, and a stepper that replays each decision.
#
# Exported: `ggml_lite.gallocr`, `ggml_lite.viz.timeline`.

# %% [markdown]
# ## 1 · The C
#
# `ggml-alloc.c:330-930`. The allocator owns one buffer type per buffer, one dynamic allocator per
# *distinct* buffer type, and, per plan, three tables:
#
# ```c
# struct hash_node { int n_children; int n_views; int buffer_id; size_t offset; bool allocated; };
# struct tensor_alloc { int buffer_id; size_t offset; size_t size_max; }; // 0 = pre-allocated, unused, or view
# struct node_alloc { struct tensor_alloc dst; struct tensor_alloc src[GGML_MAX_SRC]; };
# struct leaf_alloc { int buffer_id; struct tensor_alloc leaf; };
# ```
#
# The plan is made by `ggml_gallocr_alloc_graph_impl` (:566-660) in three loops:
#
# ```c
# for (int i = 0; i < graph->n_leafs; i++)                 // 1. every leaf gets memory
#     ggml_gallocr_allocate_node(galloc, leaf, ...);
# for (int i = 0; i < graph->n_nodes; i++) {               // 2. count children and views;
#     if (ggml_is_view(node) && node->op != GGML_OP_NONE)  //    place INPUT tensors early
#         ggml_gallocr_hash_get(galloc, view_src)->n_views += 1;
#     if (node->flags & GGML_TENSOR_FLAG_INPUT) ggml_gallocr_allocate_node(...);
#     for (int j = 0; j < GGML_MAX_SRC; j++) { ... ->n_children += 1; if (src is INPUT) allocate ... }
# }
# for (int i = 0; i < graph->n_nodes; i++) {               // 3. in execution order:
#     /* allocate parents */ /* allocate node */           //    place, then free every parent
#     /* update parents: n_children -= 1; free at 0 children and 0 views (a view frees its view_src) */
# }
# ```
#
# `ggml_gallocr_allocate_node` (:470-544) skips pre-allocated tensors, tensors already placed and
# views (a view lives in its `view_src`). For an op that `ggml_op_can_inplace`, it scans the sources
# in slot order and takes the first one that is the allocator's own (`allocated`), not an OUTPUT
# (nor a view of one), of the same layout, and has `n_children == 1 && n_views == 0` — this node is
# its last user. Otherwise `ggml_dyn_tallocr_alloc`. `ggml_gallocr_free_node` (:546-560) never frees
# an OUTPUT.

# %%
# | default_exp gallocr

# %%
# | export
"""The graph allocator `ggml_gallocr` (ggml-alloc.c:330-930): plan the memory of every tensor of a
graph with one dynamic allocator per buffer type, keep the plan, and place the tensors from it."""

import logging
from dataclasses import dataclass
from typing import NamedTuple

from ggml_lite.buffer import SIZE_MAX, tensor_alloc, view_init
from ggml_lite.dyn_tallocr import DynTAllocr
from ggml_lite.errors import BufferIdError, PlanMismatchError
from ggml_lite.tensor import Op, TensorFlag, describe

log = logging.getLogger("ggml_lite")

INPUT = int(TensorFlag.INPUT)
OUTPUT = int(TensorFlag.OUTPUT)
MiB = 1024.0 * 1024.0

# %% [markdown]
# ### 2.1 · Which ops may write over a source
#
# `ggml_op_can_inplace` (`ggml-alloc.c:40-62`) lists the ops whose kernels read each source element
# before they write the same element of the result, so result and source may share memory:

# %%
# | export
CAN_INPLACE = frozenset({
    Op.SCALE, Op.DIAG_MASK_ZERO, Op.DIAG_MASK_INF, Op.ADD, Op.ADD1, Op.SUB, Op.MUL, Op.DIV, Op.SQR,
    Op.SQRT, Op.LOG, Op.UNARY, Op.ROPE, Op.RMS_NORM, Op.SOFT_MAX,
})


def op_can_inplace(op: Op) -> bool:
    """`ggml_op_can_inplace`."""
    return op in CAN_INPLACE


def are_same_layout(a, b) -> bool:
    """`ggml_are_same_layout`: same type, same `ne`, same `nb`."""
    return a.type is b.type and a.ne == b.ne and a.nb == b.nb


# %% [markdown]
# ### 2.2 · The bookkeeping
#
# Three small records. `hash_node` is what the allocator knows of a tensor *while planning*; the
# other two are the plan it keeps *after* planning, one per node (its own place and each source's)
# and one per leaf. `size_max` is the size the plan reserved; 0 means "not placed by the
# allocator" (pre-allocated, a view, or an empty source slot), with `offset = SIZE_MAX`.

# %%
# | export
class HashNode:
    """`struct hash_node`: children and views not yet executed, and where the tensor was put."""

    __slots__ = ("n_children", "n_views", "buffer_id", "offset", "allocated")

    def __init__(self):
        self.n_children = 0
        self.n_views = 0
        self.buffer_id = 0
        self.offset = 0
        self.allocated = False

    def __repr__(self):
        return (f"HashNode(children={self.n_children}, views={self.n_views}, buffer={self.buffer_id}, "
                f"offset={self.offset}, allocated={self.allocated})")


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


# %% [markdown]
# ### 2.3 · Trace events
#
# The allocator tells an optional `trace` callable what it decides, as small events; the
# stepper and the timeline below are built from them. Without a trace nothing is built. The
# dynamic allocators underneath report to the same sink (chapter 03's `AllocEvent`, `FreeEvent`).

# %%
# | export
def _name(t) -> str:
    return t.name or "<unnamed>"


@dataclass(frozen=True)
class PlaceEvent:
    """A tensor got its memory: `how` is "new" (from the dynamic allocator), "inplace" (a parent's
    memory, `parent`), or "inplace_view" (the view-parent branch). `phase` says which loop of
    `ggml_gallocr_alloc_graph_impl` asked: "leaf", "input", "parent" or "node"; `node_index` is the
    node being visited (-1 for the leaf loop)."""

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
    """`node` could have taken `parent`'s memory but did not, for `reason` (the AT_PRINTF lines)."""

    tensor: object
    parent: object
    reason: str

    def describe(self) -> str:
        return f"not reusing {_name(self.parent)} for {_name(self.tensor)}: {self.reason}"


@dataclass(frozen=True)
class FreeNodeEvent:
    """`ggml_gallocr_free_node` gave `tensor`'s memory back (`via` the view it was freed through,
    or None); `kept_output`: it is an OUTPUT, so nothing was freed."""

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
class ExecEvent:
    """Node `index` was visited: its parents after the visit as `(parent, n_children, n_views,
    allocated)` — the AT_PRINTF "exec:" and "parent ..." lines."""

    index: int
    node: object
    parents: tuple

    def describe(self) -> str:
        ps = ", ".join(f"{_name(p)} ({c} children left)" for p, c, _, _ in self.parents)
        return f"exec {self.index}: {_name(self.node)} ({self.node.op.name}) <= {ps or 'nothing'}"


# %% [markdown]
# ### 2.4 · The allocator
#
# The C keeps `hash_values` in an open-addressing table keyed by the tensor pointer and clears it
# with `memset` before every plan; here it is a dict keyed by the tensor object (identity), made
# anew. Everything else follows the C line by line; the comments give the C line numbers.

# %%
# | export
class GAllocr:
    """`struct ggml_gallocr` — `ggml_gallocr_new` (one buffer type) or `ggml_gallocr_new_n` (a list).

    A buffer type listed twice shares one dynamic allocator and, later, one buffer (the C compares
    the pointers; here, identity). `trace` receives the events above and those of the dynamic
    allocators."""

    def __init__(self, bufts, trace=None):
        bufts = list(bufts) if isinstance(bufts, (list, tuple)) else [bufts]
        if not bufts:
            raise BufferIdError("a graph allocator needs at least one buffer type")
        self.bufts = bufts
        self.buffers = [None] * len(bufts)
        self.buf_tallocs = []
        self.trace = trace
        for i, buft in enumerate(bufts):  # :379-395
            shared = next((self.buf_tallocs[j] for j in range(i) if bufts[j] is buft), None)
            self.buf_tallocs.append(shared or DynTAllocr(buft.get_alignment(), trace=trace))
        self.n_buffers = len(bufts)
        self.hash_values = {}
        self.node_allocs = []
        self.leaf_allocs = []

    # -- ggml_gallocr_free -----------------------------------------------------------------------
    def free(self) -> None:
        """`ggml_gallocr_free`: free each distinct buffer once."""
        seen = []
        for buf in self.buffers:
            if buf is not None and not any(buf is s for s in seen):
                buf.free()
                seen.append(buf)
        self.buffers = [None] * self.n_buffers

    # -- the hash table ----------------------------------------------------------------------------
    def hash_get(self, t) -> HashNode:
        """`ggml_gallocr_hash_get`: the record of `t`, created (zeroed) on first use."""
        hn = self.hash_values.get(t)
        if hn is None:
            hn = self.hash_values[t] = HashNode()
        return hn

    def is_own(self, t) -> bool:
        """`ggml_gallocr_is_own`: `t`'s memory comes from this plan and is still held."""
        return self.hash_get(t).allocated

    def is_allocated(self, t) -> bool:
        """`ggml_gallocr_is_allocated`: pre-allocated (`data`) or placed by this plan."""
        return t.data is not None or self.hash_get(t).allocated

    def set_node_offset(self, node, buffer_id: int, offset: int) -> None:
        """`ggml_gallocr_set_node_offset` (defined but never called in the reference)."""
        hn = self.hash_get(node)
        hn.buffer_id, hn.offset, hn.allocated = buffer_id, offset, True

    def _size(self, buffer_id: int, t) -> int:
        """`ggml_backend_buft_get_alloc_size(galloc->bufts[buffer_id], t)`, memoised for one plan."""
        cache = self._sizes[buffer_id]
        size = cache.get(t)
        if size is None:
            size = cache[t] = self.bufts[buffer_id].get_alloc_size(t)
        return size

    # -- allocate / free one tensor ----------------------------------------------------------------
    def allocate_node(self, node, buffer_id: int, node_index: int = -1, phase: str = "node") -> None:
        """`ggml_gallocr_allocate_node` (:470-544): place `node` unless it is pre-allocated, already
        placed, or a view — in a parent's memory when the in-place rules allow, else in a new block."""
        hv = self.hash_values
        hn = hv.get(node)
        if hn is None:
            hn = hv[node] = HashNode()
        if node.data is not None or hn.allocated or node.view_src is not None:
            return
        hn.allocated = True
        trace = self.trace
        if node.op in CAN_INPLACE:  # try to reuse a parent's buffer (inplace)
            for parent in node.src:
                if parent is None:
                    continue
                p_hn = hv.get(parent) or self.hash_get(parent)
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
                        vs_hn = self.hash_get(vsrc)
                        if vs_hn.n_views == 1 and vs_hn.n_children == 0 and vsrc.data == parent.data:
                            hn.buffer_id, hn.offset = p_hn.buffer_id, p_hn.offset
                            p_hn.allocated = False  # avoid freeing the parent
                            vs_hn.allocated = False
                            if trace is not None:
                                trace(PlaceEvent(node, node_index, phase, hn.buffer_id, hn.offset,
                                                 self._size(hn.buffer_id, node), "inplace_view", parent))
                            return
                    else:
                        hn.buffer_id, hn.offset = p_hn.buffer_id, p_hn.offset
                        p_hn.allocated = False  # avoid freeing the parent
                        if trace is not None:
                            trace(PlaceEvent(node, node_index, phase, hn.buffer_id, hn.offset,
                                             self._size(hn.buffer_id, node), "inplace", parent))
                        return
                elif trace is not None:
                    trace(RejectEvent(node, parent, f"it still has {p_hn.n_children} children and {p_hn.n_views} views"))
        size = self._size(buffer_id, node)  # allocate tensor from the buffer
        hn.offset = self.buf_tallocs[buffer_id].alloc(size, node)
        hn.buffer_id = buffer_id
        if trace is not None:
            trace(PlaceEvent(node, node_index, phase, buffer_id, hn.offset, size, "new"))

    def free_node(self, node, node_index: int = -1, via=None) -> None:
        """`ggml_gallocr_free_node` (:546-560): give the memory back — never for an OUTPUT."""
        hn = self.hash_get(node)
        if node.flags & OUTPUT:  # graph outputs are never freed
            if self.trace is not None:
                self.trace(FreeNodeEvent(node, node_index, hn.buffer_id, hn.offset, 0, via, kept_output=True))
            return
        size = self._size(hn.buffer_id, node)
        self.buf_tallocs[hn.buffer_id].free_tensor(hn.offset, size, node)
        hn.allocated = False
        if self.trace is not None:
            self.trace(FreeNodeEvent(node, node_index, hn.buffer_id, hn.offset, size, via))

    # -- the graph-level calls (defined below, one section each) ----------------------------------
    def reserve_n(self, graph, node_buffer_ids=None, leaf_buffer_ids=None) -> bool:
        """`ggml_gallocr_reserve_n`: see `gallocr_reserve_n`."""
        return gallocr_reserve_n(self, graph, node_buffer_ids, leaf_buffer_ids)

    def reserve(self, graph) -> bool:
        """`ggml_gallocr_reserve`: `reserve_n` with every tensor in buffer 0."""
        return gallocr_reserve_n(self, graph, None, None)

    def alloc_graph(self, graph) -> bool:
        """`ggml_gallocr_alloc_graph`: see `gallocr_alloc_graph`."""
        return gallocr_alloc_graph(self, graph)

    def get_buffer_size(self, buffer_id: int) -> int:
        """`ggml_gallocr_get_buffer_size`: a shared buffer counts once, at its first id."""
        if not 0 <= buffer_id < self.n_buffers:
            raise BufferIdError(f"buffer id {buffer_id} asked, the allocator has {self.n_buffers} buffer(s)")
        buf = self.buffers[buffer_id]
        if buf is None:
            return 0
        if any(self.buffers[i] is buf for i in range(buffer_id)):
            return 0  # the same buffer type used several times: only count it once
        return buf.get_size()

    def __repr__(self):
        names = ", ".join(b.get_name() for b in self.bufts)
        return f"GAllocr([{names}], {len(self.node_allocs)} nodes planned)"


# %% [markdown]
# ### 2.5 · Planning a graph
#
# The three loops of `ggml_gallocr_alloc_graph_impl`, then `ggml_gallocr_reserve_n`, which resets
# the allocators, plans, keeps the plan as `node_allocs`/`leaf_allocs`, and grows a buffer only
# when the plan needs more than it has — it never shrinks one.

# %%
# | export
def _buffer_id(ids, i: int) -> int:
    """`get_node_buffer_id`: buffer 0 when no ids are given."""
    return ids[i] if ids is not None else 0


def alloc_graph_impl(galloc: GAllocr, graph, node_buffer_ids=None, leaf_buffer_ids=None) -> None:
    """`ggml_gallocr_alloc_graph_impl` (:566-660): plan every tensor of `graph` into
    `galloc.hash_values`, in three loops — leafs; children/views counting with the inputs placed
    early; then the nodes in execution order, each freeing the parents it was the last user of.

    For speed, `allocate_node`'s first test (pre-allocated, placed, or a view: nothing to do) is
    also made before each call, which changes nothing but the number of calls."""
    galloc.hash_values = hv = {}
    galloc._sizes = [{} for _ in range(galloc.n_buffers)]
    allocate_node, free_node, trace = galloc.allocate_node, galloc.free_node, galloc.trace
    get = hv.get

    # allocate leafs: "these may be tensors that the application is not using in the graph,
    # but may still want to allocate for other purposes"
    for i, leaf in enumerate(graph.leafs):
        if leaf.data is None and leaf.view_src is None:
            allocate_node(leaf, _buffer_id(leaf_buffer_ids, i), -1, "leaf")

    # count number of children and views; allocate other graph inputs and leafs first
    for i, node in enumerate(graph.nodes):
        # GGML_OP_NONE "is used by ggml-backend to add dependencies": such a node is not a view user
        view_src = node.view_src
        if view_src is not None and node.op is not Op.NONE:
            hn = get(view_src) or galloc.hash_get(view_src)
            hn.n_views += 1
        if node.flags & INPUT:
            allocate_node(node, _buffer_id(node_buffer_ids, i), i, "input")
        for src in node.src:
            if src is None:
                continue
            hn = get(src)
            if hn is None:
                hn = hv[src] = HashNode()
            hn.n_children += 1
            if src.flags & INPUT:  # allocate explicit inputs
                allocate_node(src, _buffer_id(node_buffer_ids, i), i, "input")

    # allocate tensors
    for i, node in enumerate(graph.nodes):
        buffer_id = _buffer_id(node_buffer_ids, i)
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
                    vs_hn = get(view_src) or galloc.hash_get(view_src)
                    vs_hn.n_views -= 1
                    if vs_hn.n_views == 0 and vs_hn.n_children == 0 and vs_hn.allocated:
                        free_node(view_src, i, parent)
                elif p_hn.allocated:
                    free_node(parent, i)
        if trace is not None:
            trace(ExecEvent(i, node, tuple((p, hv[p].n_children, hv[p].n_views, hv[p].allocated)
                                           for p in srcs if p is not None)))


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


def _tensor_alloc(galloc: GAllocr, t, _new=tuple.__new__) -> TensorAlloc:
    """The plan's record of `t`: NOT_PLACED for an empty slot, a view or pre-allocated data.
    (`tuple.__new__` builds the NamedTuple without its slower keyword-capable constructor.)"""
    if t is None or t.view_src is not None or t.data is not None:
        return NOT_PLACED
    hn = galloc.hash_values[t]  # every planned tensor has a record
    cache = galloc._sizes[hn.buffer_id]
    size = cache.get(t)
    if size is None:
        size = galloc._size(hn.buffer_id, t)
    return _new(TensorAlloc, (hn.buffer_id, hn.offset, size))


def gallocr_reserve_n(galloc: GAllocr, graph, node_buffer_ids=None, leaf_buffer_ids=None) -> bool:
    """`ggml_gallocr_reserve_n` (:662-765): plan `graph` from scratch, record the plan per node and
    leaf, and (re)allocate every buffer whose planned size exceeds its current size."""
    _check_ids(galloc, node_buffer_ids, len(graph.nodes), "node_buffer_ids")
    _check_ids(galloc, leaf_buffer_ids, len(graph.leafs), "leaf_buffer_ids")
    for talloc in galloc.buf_tallocs:  # reset allocators (a shared one is reset twice, as in C)
        talloc.reset()
    alloc_graph_impl(galloc, graph, node_buffer_ids, leaf_buffer_ids)

    # set the node_allocs from the hash table
    new, placed = tuple.__new__, _tensor_alloc
    galloc.node_allocs = [new(NodeAlloc, (placed(galloc, node), tuple([placed(galloc, s) for s in node.src])))
                          for node in graph.nodes]
    galloc.leaf_allocs = [LeafAlloc(galloc.hash_get(leaf).buffer_id, _tensor_alloc(galloc, leaf))
                          for leaf in graph.leafs]

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


# %% [markdown]
# ### 2.6 · From the plan to the tensors
#
# `ggml_gallocr_alloc_graph` uses the recorded plan, not the hash table: a later graph of the same
# shape (the next batch, with new tensor objects) is placed without planning again. Before that it
# asks whether the plan still fits the graph (`ggml_gallocr_needs_realloc`).

# %%
# | export
def gallocr_init_tensor(galloc: GAllocr, tensor, talloc: TensorAlloc) -> None:
    """`ggml_gallocr_init_tensor` (:771-800): a view takes its root's buffer (`ggml_backend_view_init`),
    a planned tensor its offset in the buffer (`ggml_backend_tensor_alloc`); pre-allocated tensors
    and views of memory outside ggml-backend are left alone."""
    if tensor.view_src is not None:
        if tensor.buffer is None:
            if tensor.view_src.buffer is None:
                return  # this tensor was allocated without ggml-backend
            view_init(tensor)
        return
    if tensor.data is not None:
        return  # pre-allocated (with or without ggml-backend)
    buffer = galloc.buffers[talloc.buffer_id] if talloc.buffer_id >= 0 else None
    need = buffer.get_alloc_size(tensor) if buffer is not None else None
    if buffer is None or talloc.offset == SIZE_MAX or need > talloc.size_max:  # the C's asserts
        raise PlanMismatchError(
            f"{describe(tensor)} needs {need if need is not None else '?'} bytes, but the plan reserved "
            f"{talloc.size_max} bytes for it{' (it was not placed at all)' if talloc.size_max == 0 else ''}: "
            f"call reserve() with this graph")
    tensor_alloc(buffer, tensor, buffer.get_base() + talloc.offset)


def gallocr_node_needs_realloc(galloc: GAllocr, node, talloc: TensorAlloc) -> bool:
    """`ggml_gallocr_node_needs_realloc` (:802-806) — despite its name, True when the planned size
    *suffices* (`size_max >= node_size`): the caller reads False as "not valid".

    One departure: for a tensor the plan did not place (buffer_id -1) that now needs memory, the C
    calls `ggml_backend_buft_get_alloc_size(NULL, node)` and crashes; here it is simply not valid."""
    if node.data is not None or node.view_src is not None:
        return True  # node_size is 0
    if talloc.buffer_id == -1:
        return False
    return talloc.size_max >= galloc.bufts[talloc.buffer_id].get_alloc_size(node)


def gallocr_needs_realloc(galloc: GAllocr, graph) -> bool:
    """`ggml_gallocr_needs_realloc` (:808-844): must the graph be planned again? Yes when the node or
    leaf count differs from the plan's, or when a node or a source outgrew its planned size."""
    if len(galloc.node_allocs) != len(graph.nodes):
        log.info("ggml_gallocr_needs_realloc: graph has different number of nodes")
        return True
    if len(galloc.leaf_allocs) != len(graph.leafs):
        log.info("ggml_gallocr_needs_realloc: graph has different number of leafs")
        return True
    fits = gallocr_node_needs_realloc
    for node, (dst, planned) in zip(graph.nodes, galloc.node_allocs):
        # (a pre-allocated tensor or a view has size 0 and always fits: tested here to save the call)
        if node.data is None and node.view_src is None and not fits(galloc, node, dst):
            log.info("ggml_gallocr_needs_realloc: node %s is not valid", node.name)
            return True
        for j, src in enumerate(node.src):
            if src is None or src.data is not None or src.view_src is not None:
                continue
            if not fits(galloc, src, planned[j] if j < len(planned) else NOT_PLACED):
                log.info("ggml_gallocr_needs_realloc: src %d (%s) of node %s is not valid", j, src.name, node.name)
                return True
    return False


def gallocr_alloc_graph(galloc: GAllocr, graph) -> bool:
    """`ggml_gallocr_alloc_graph` (:846-895): plan again if needed (only with a single buffer — a
    multi-buffer allocator must be `reserve_n`'ed by its owner), reset the buffers, then place every
    leaf, and every node's sources and the node itself, from the recorded plan."""
    if gallocr_needs_realloc(galloc, graph):
        if galloc.n_buffers == 1:
            log.info("ggml_gallocr_alloc_graph: reallocating buffers automatically")
            if not gallocr_reserve_n(galloc, graph):
                return False
        else:
            log.info("ggml_gallocr_alloc_graph: cannot reallocate multi buffer graph automatically, call reserve")
            return False
    for buf in galloc.buffers:  # reset buffers
        if buf is not None:
            buf.reset()
    for leaf, la in zip(graph.leafs, galloc.leaf_allocs):
        gallocr_init_tensor(galloc, leaf, la.leaf)
    init = gallocr_init_tensor
    for node, na in zip(graph.nodes, galloc.node_allocs):
        planned = na.src
        for j, src in enumerate(node.src):
            # init_tensor does nothing to a source already placed (most are: earlier nodes)
            if src is None or (src.data is not None if src.view_src is None else src.buffer is not None):
                continue
            init(galloc, src, planned[j] if j < len(planned) else NOT_PLACED)
        init(galloc, node, na.dst)
    return True
