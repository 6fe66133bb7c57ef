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
# # 09 · The backend scheduler
#
# With one backend, chapter 05's graph allocator is enough. With a GPU in front of the CPU, someone
# must decide **which backend computes each node**, cut the graph into *splits* that run on one
# backend each, and copy every tensor that crosses between them: `ggml_backend_sched`
# (`ggml-backend.c:1034-2058`), what llama.cpp uses for partial offload.
#
# **Learning goals**
#
# 1. The five passes of `ggml_backend_sched_split_graph`: pre-allocated tensors and weights decide
#    first (pass 1), GPU assignments spread to their neighbours (2), the rest go where their inputs
#    are (3, 4), and the graph is cut into splits with input copies (5).
# 2. The cause of every assignment (`1.wgt0`, `2.sup`, `3.best`, ...), and the `GGML_SCHED_DEBUG`
#    printout that shows them.
# 3. The scheduler's own graph copy — inputs, their copies and dependencies added per split — which
#    is what the multi-buffer graph allocator plans in `ggml_backend_sched_reserve`.
# 4. Running the splits: input copies, events, `parallel` copies, the eval callback — and, on a
#    simulated clock, what pipeline parallelism buys and when it buys nothing.
#
# Exported: `ggml_lite.sched` (everything computed) and `ggml_lite.viz.sched` (the pictures, which
# only draw). Appendix A3 replays the 14 scheduler runs recorded from the real ggml with this code.

# %%
# | default_exp sched

# %% [markdown]
# ## 1 · The C
#
# The scheduler keeps, per tensor (a hash set keyed by the tensor pointer), a backend id
# (`hv_tensor_backend_ids`, −1 = unassigned) and its copies per backend and copy index
# (`hv_tensor_copies`). Backends are in **priority order**, the CPU last.
# `ggml_backend_sched_split_graph` (:1282-1736) then runs five passes over the graph:
#
# | pass | what it does | causes |
# |---|---|---|
# | 1 | leafs, then nodes: a tensor with a buffer goes to the first backend that supports its buffer type *and* the op; a view, to its view_src's; an INPUT, to the CPU; an op with a weight source, to the weight's backend — unless the weight is on the CPU and a higher-priority backend wants the op (`offload_op`) | `1.dst` `1.vsrc` `1.inp` `1.wgtN` `1.off` |
# | 2 | expand non-CPU assignments down then up, then all assignments down then up, skipping view ops, only where the backend supports the op | `2.sup` |
# | 3 | an assigned node moves to a higher-priority backend with the *same buffer type* if all its sources are usable there; an unassigned one goes to the backend that supports it with the most usable inputs | `3.upg` `3.best` |
# | 4 | views take their view_src's backend; unassigned sources take their consumer's | `4.vsrc` `4.cur` |
# | 5 | walk the nodes; a new split starts at a backend change, at a weight on another backend, or when the split's inputs are full; each source on another backend (whose memory the split's backend cannot use) gets a copy `BACKEND#name#c`, and the node reads the copy | `4.cpy` |
#
# The cause strings exist only in a debug build (`SET_CAUSE` is `#if 0` upstream); the fixtures were
# recorded with them on, and this port keeps them. Pass 5 produces splits (ggml-backend.c:1048-1054):
#
# ```c
# struct ggml_backend_sched_split {
#     int backend_id;
#     int i_start;
#     int i_end;
#     struct ggml_tensor * inputs[GGML_SCHED_MAX_SPLIT_INPUTS];
#     int n_inputs;
# ```
#
# Notice that a split owns no nodes: it is a range `[i_start, i_end)` of the user's graph, plus at
# most `GGML_SCHED_MAX_SPLIT_INPUTS` (= `GGML_MAX_SRC`, 10) tensors copied in, as `Split` below.

# %%
# | export
"""The backend scheduler `ggml_backend_sched`: assign a backend to every node, split the graph, add the
input copies, and plan the memory of all backends with one multi-buffer graph allocator. This module
mirrors the scheduler of ggml-backend.c (lines 1034-2058 at daa9623, over 1,000 lines of C), which is
why it is longer than 600 lines."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ggml_lite.backend import Backend, Status, dup_tensor_layout, tensor_buffer, tensor_copy
from ggml_lite.bind import method_of
from ggml_lite.buffer import BufferUsage
from ggml_lite.cpu import is_cpu
from ggml_lite.errors import SchedulerError
from ggml_lite.gallocr import GAllocr
from ggml_lite.graph import GGML_DEFAULT_GRAPH_SIZE, Graph, graph_view
from ggml_lite.tensor import GGML_MAX_SRC, Context, Op, Tensor, TensorFlag, UnaryOp, is_view_op, nbytes

log = logging.getLogger("ggml_lite")

GGML_SCHED_MAX_BACKENDS = 16
GGML_SCHED_MAX_SPLIT_INPUTS = GGML_MAX_SRC
GGML_SCHED_MAX_COPIES = 4
INPUT = int(TensorFlag.INPUT)

# The cause codes of the debug printout (`SET_CAUSE`): pass number and reason (the table above).
CAUSES = {
    "usr": "pinned by the user (ggml_backend_sched_set_tensor_backend)",
    "1.dst": "pass 1: the tensor's own buffer is on this backend (pre-allocated)",
    "1.vsrc": "pass 1: its view_src's buffer is on this backend",
    "1.inp": "pass 1: a graph input, so the last backend (the CPU)",
    "1.wgtN": "pass 1: src[N] is a weight on this backend",
    "1.off": "pass 1: a weight on the CPU, but this higher-priority backend offloads the op",
    "2.sup": "pass 2: expanded from a neighbouring node; the backend supports the op",
    "3.upg": "pass 3: upgraded to a higher-priority backend with the same buffer type",
    "3.best": "pass 3: the backend supporting the op with the most usable inputs",
    "4.vsrc": "pass 4: a view, on its view_src's backend",
    "4.cur": "pass 4: an unassigned source, on its consumer's backend",
    "4.cpy": "pass 5: a copy of an input made for the split's backend",
}


@dataclass
class Split:
    """`struct ggml_backend_sched_split`: a run of nodes `[i_start, i_end)` of the user's graph on one
    backend, the tensors it needs copied in, and its graph view."""

    backend_id: int
    i_start: int
    i_end: int = 0
    inputs: list = field(default_factory=list)
    graph: Graph | None = None

    @property
    def n_inputs(self) -> int:
        return len(self.inputs)


def op_desc(t) -> str:
    """`ggml_op_desc`: the unary op's name for UNARY, else the op's."""
    return UnaryOp(t.op_params[0]).name if t.op is Op.UNARY else t.op.name


def fmt_size(size: int) -> str:
    """`fmt_size` of the debug printout: whole MiB from 1 MiB on, else whole KiB."""
    return f"{size // 1024 // 1024}M" if size >= 1024 * 1024 else f"{size // 1024}K"


# %% [markdown]
# ## 2 · The scheduler
#
# `BackendSched` holds what `struct ggml_backend_sched` holds; its constructor is
# `ggml_backend_sched_new` (:1869-1921), which first checks (ggml-backend.c:1875-1877):
#
# ```c
#     GGML_ASSERT(n_backends > 0);
#     GGML_ASSERT(n_backends <= GGML_SCHED_MAX_BACKENDS);
#     GGML_ASSERT(ggml_backend_is_cpu(backends[n_backends - 1])); // last backend must be CPU
# ```
#
# Notice the CPU last: a pass that does not know better falls back to `n_backends - 1`; a wrong list is
# a `SchedulerError`. Per-tensor tables are dicts keyed by the tensor: `ids` (`hv_tensor_backend_ids`,
# missing = −1) and `copies` (`hv_tensor_copies`, keyed `(tensor, backend_id, copy)`).

# %%
# | export
class BackendSched:
    """`struct ggml_backend_sched` (`ggml_backend_sched_new`): `backends` in priority order, the CPU
    last; `bufts` (default: each backend's default buffer type); `parallel` gives
    `GGML_SCHED_MAX_COPIES` copies of every input for pipeline parallelism. `debug` (default: the
    GGML_SCHED_DEBUG environment variable) logs the assignments after every split."""

    galloc_class, max_split_inputs = GAllocr, GGML_SCHED_MAX_SPLIT_INPUTS  # chapter 12's scheduler changes these
    weights_split_always = True  # a weight on another backend starts a split (today: only if its buffer is unusable)
    passes = property(lambda sched: PASSES)  # the five passes (today's pass 4 adds a last resort)

    def __init__(self, backends, bufts=None, graph_size: int = GGML_DEFAULT_GRAPH_SIZE, parallel: bool = False,
                 debug: bool | None = None):
        backends = list(backends)
        if not 0 < len(backends) <= GGML_SCHED_MAX_BACKENDS:
            raise SchedulerError(f"{len(backends)} backends given: between 1 and {GGML_SCHED_MAX_BACKENDS} "
                                 "are possible")
        if not is_cpu(backends[-1]):
            raise SchedulerError(f"the last backend must be the CPU, got {backends[-1].get_name()}")
        self.debug = os.environ.get("GGML_SCHED_DEBUG") is not None if debug is None else debug
        self.backends = backends
        self.n_backends = len(backends)
        self.n_copies = GGML_SCHED_MAX_COPIES if parallel else 1
        self.cur_copy = 0
        self.bufts = list(bufts) if bufts is not None else [b.get_default_buffer_type() for b in backends]
        for b, buft in zip(backends, self.bufts):
            if not b.supports_buft(buft):
                raise SchedulerError(f"backend {b.get_name()} cannot use buffer type {buft.get_name()}")
        self.events = [[b.event_new() for _ in range(self.n_copies)] if self.n_copies > 1 else [None]
                       for b in backends]
        self.galloc = self.galloc_class(self.bufts)
        self.ctx = Context("sched")
        self.splits: list[Split] = []
        self.graph = Graph(0)
        self.graph_inputs: list = []
        self.ids: dict = {}  # hv_tensor_backend_ids: tensor -> backend id
        self.copies: dict = {}  # hv_tensor_copies: (tensor, backend id, copy) -> copy
        self.causes: dict = {}  # SET_CAUSE: tensor -> cause
        # calloc'ed arrays of the C, written in place: what a shorter graph leaves is still compared
        nodes_size = graph_size + graph_size * self.max_split_inputs * 2
        self.node_backend_ids, self.leaf_backend_ids = [0] * nodes_size, [0] * nodes_size
        self.prev_node_backend_ids, self.prev_leaf_backend_ids = [0] * nodes_size, [0] * nodes_size
        self.callback_eval: Callable[[Tensor, bool], bool] | None = None  # (tensor, ask) -> want it / go on
        self.is_reset = False
        self.is_alloc = False
        self.reset()

    @property
    def n_splits(self) -> int:
        """`ggml_backend_sched_get_n_splits`."""
        return len(self.splits)


# %% [markdown]
# ### 2.1 · Which backend: the helpers of pass 1
#
# `ggml_backend_sched_backend_from_buffer` (:1120-1141) answers "who can run `op` where this
# tensor's memory is" (ggml-backend.c:1126-1131):
#
# ```c
#     // find highest prio backend that supports the buffer type and the op
#     for (int i = 0; i < sched->n_backends; i++) {
#         if (ggml_backend_supports_buft(sched->backends[i], buffer->buft) &&
#             ggml_backend_supports_op(sched->backends[i], op)) {
#             return i;
# ```
#
# Notice the loop order: the first backend in priority order wins, so a host buffer that a GPU can read
# sends the op to the GPU. `ggml_backend_sched_backend_id_from_cur` (:1153-1217) is pass 1 for one
# tensor; its abort (a pre-allocated tensor where no backend runs its op) is a `SchedulerError`.

# %%
# | export
@method_of(BackendSched)
def backend_id(sched: BackendSched, backend) -> int:
    """`ggml_backend_sched_backend_id`: the backend's priority (its index), or -1."""
    return next((i for i, b in enumerate(sched.backends) if b is backend), -1)


@method_of(BackendSched)
def backend_from_buffer(sched: BackendSched, tensor, op) -> int:
    """`ggml_backend_sched_backend_from_buffer`: the first backend that supports the buffer type of
    `tensor`'s buffer and the op `op`; -1 (with the debug build's warning) when none does."""
    buffer = tensor.buffer
    if buffer is None:
        return -1
    for i, b in enumerate(sched.backends):  # find highest prio backend that supports the buffer type and the op
        if b.supports_buft(buffer.buft) and b.supports_op(op):
            return i
    log.warning("ggml_backend_sched_backend_from_buffer: warning: no backend supports op %s with a weight with "
                "buffer type %s used in tensor %s, the weight will need to be copied",
                op_desc(tensor), buffer.get_name(), tensor.name)
    return -1


@method_of(BackendSched)
def backend_id_from_cur(sched: BackendSched, tensor) -> int:
    """`ggml_backend_sched_backend_id_from_cur`: pass 1 for one tensor (sets its cause)."""
    cur = backend_from_buffer(sched, tensor, tensor)  # assign pre-allocated nodes to their backend
    if cur != -1:
        sched.causes[tensor] = "1.dst"
        return cur
    if tensor.view_src is not None:
        cur = backend_from_buffer(sched, tensor.view_src, tensor)
        if cur != -1:
            sched.causes[tensor] = "1.vsrc"
            return cur
    if tensor.buffer is not None or (tensor.view_src is not None and tensor.view_src.buffer is not None):
        # since the tensor is pre-allocated, it cannot be moved to another backend
        raise SchedulerError(f"pre-allocated tensor in a backend that cannot run the operation: {tensor.name!r} "
                             f"({tensor.op.name}) lives in a {tensor_buffer(tensor).get_name()} buffer, and no "
                             f"backend that can use that memory supports {tensor.op.name}")
    if tensor.flags & INPUT:  # graph input
        sched.causes[tensor] = "1.inp"
        return sched.n_backends - 1  # last backend (assumed CPU)
    for i, src in enumerate(tensor.src):  # operations with weights go preferably where the weights are
        if src is None:
            continue
        if src.buffer is not None and src.buffer.usage == BufferUsage.WEIGHTS:
            src_backend_id = backend_from_buffer(sched, src, tensor)
            if src_backend_id == sched.n_backends - 1:  # does a higher-priority backend want to offload it?
                for b in range(src_backend_id):
                    if sched.backends[b].supports_op(tensor) and sched.backends[b].offload_op(tensor):
                        sched.causes[tensor] = "1.off"
                        return b
            sched.causes[tensor] = f"1.wgt{i}"
            return src_backend_id
    return -1


@method_of(BackendSched)
def buffer_supported(sched: BackendSched, t, backend_id: int) -> bool:
    """`ggml_backend_sched_buffer_supported`: can backend `backend_id` use `t`'s memory (its buffer's
    type, or else the buffer type of its or its view_src's assigned backend)?"""
    buf = tensor_buffer(t)
    if buf is not None:
        buft = buf.buft  # the tensor is already allocated
    else:  # the buffer type of its backend, if it has one already
        tid = sched.ids.get(t, -1)
        if tid == -1 and t.view_src is not None:
            tid = sched.ids.get(t.view_src, -1)
        buft = sched.bufts[tid] if tid != -1 else None
    return buft is not None and sched.backends[backend_id].supports_buft(buft)


@method_of(BackendSched)
def set_if_supported(sched: BackendSched, node, cur_backend_id: int) -> None:
    """`ggml_backend_sched_set_if_supported`: pass 2's assignment, only where the op is supported."""
    if sched.backends[cur_backend_id].supports_op(node):
        sched.ids[node] = cur_backend_id
        sched.causes[node] = "2.sup"


# %% [markdown]
# ### 2.2 · The small API
#
# `ggml_backend_sched_reset` (ggml-backend.c:1948-1957) forgets every assignment, unless nothing
# happened since the last reset:
#
# ```c
#     if (!sched->is_reset) {
#         ggml_hash_set_reset(&sched->hash_set);
#         memset(sched->hv_tensor_backend_ids, -1, sched->hash_set.size * sizeof(sched->hv_tensor_backend_ids[0]));
#         memset(sched->hv_tensor_copies,       0, sched->hash_set.size * sched->n_backends * sched->n_copies * sizeof(struct ggml_tensor *));
#         sched->is_reset = true;
# ```
#
# Notice what that means for the user: a pin (`set_tensor_backend`) must be made after a reset and
# before the split, as llama.cpp does. The rest are accessors.

# %%
# | export
@method_of(BackendSched)
def reset(sched) -> None:
    """`ggml_backend_sched_reset`: forget every assignment and copy (unless nothing changed since
    the last reset); the next graph is split anew."""
    if not sched.is_reset:
        sched.ids, sched.copies, sched.causes = {}, {}, {}
        sched.is_reset = True
    sched.is_alloc = False


@method_of(BackendSched)
def set_tensor_backend(sched, node, backend: Backend) -> None:
    """`ggml_backend_sched_set_tensor_backend`: pin `node` to `backend` (cause "usr")."""
    b = sched.backend_id(backend)
    if b < 0:
        raise SchedulerError(f"set_tensor_backend({node.name!r}): {backend.get_name()} is not one of the "
                             f"scheduler's backends ({', '.join(x.get_name() for x in sched.backends)})")
    sched.ids[node] = b
    sched.causes[node] = "usr"
    sched.is_reset = False


@method_of(BackendSched)
def get_tensor_backend(sched, node):
    """`ggml_backend_sched_get_tensor_backend`: the node's backend, or None when unassigned."""
    b = sched.ids.get(node, -1)
    return None if b == -1 else sched.backends[b]


@method_of(BackendSched)
def get_cause(sched, node) -> str:
    """`GET_CAUSE`: why `node` has its backend ("" when nothing set one)."""
    return sched.causes.get(node, "")


@method_of(BackendSched)
def get_n_copies(sched) -> int:
    """`ggml_backend_sched_get_n_copies`."""
    return sched.n_copies


@method_of(BackendSched)
def get_n_backends(sched) -> int:
    """`ggml_backend_sched_get_n_backends`."""
    return sched.n_backends


@method_of(BackendSched)
def get_backend(sched, i: int) -> Backend:
    """`ggml_backend_sched_get_backend`."""
    if not 0 <= i < sched.n_backends:
        raise SchedulerError(f"backend {i} asked, the scheduler has {sched.n_backends}")
    return sched.backends[i]


@method_of(BackendSched)
def get_buffer_size(sched, backend: Backend) -> int:
    """`ggml_backend_sched_get_buffer_size`: the compute buffer of `backend` (its gallocr buffer)."""
    b = sched.backend_id(backend)
    if b < 0:
        raise SchedulerError(f"{backend.get_name()} is not one of the scheduler's backends")
    return sched.galloc.get_buffer_size(b)


# %% [markdown]
# ## 3 · The five passes
#
# ### 3.1 · Passes 1-4: a backend for every node
#
# Ported one pass per function, in the C's loop order. Pass 2's four sweeps are one function with a
# direction and a flag; the heart of the first sweep, "expand gpu down" (ggml-backend.c:1351-1359):
#
# ```c
#             if (*node_backend_id != -1) {
#                 if (*node_backend_id == sched->n_backends - 1) {
#                     // skip cpu (lowest prio backend)
#                     cur_backend_id = -1;
#                 } else {
#                     cur_backend_id = *node_backend_id;
#                 }
#             } else if (cur_backend_id != -1) {
# ```
#
# Notice the reset to −1 at a CPU node: the first two sweeps never carry the CPU, so "cpu will never
# be used unless weights are on cpu, or there are no gpu ops between cpu ops". `_expand` is that
# loop, `skip_cpu` a flag, the direction the order of `nodes`.

# %%
# | export
def _pass1(sched: BackendSched, graph) -> None:
    """Pass 1: leafs, then nodes, not yet assigned (user pins are kept) get `backend_id_from_cur`."""
    ids = sched.ids
    for t in (*graph.leafs, *graph.nodes):
        if ids.get(t, -1) == -1:  # do not overwrite user assignments
            ids[t] = sched.backend_id_from_cur(t)


def _expand(sched: BackendSched, nodes, skip_cpu: bool) -> None:
    """One sweep of pass 2 over `nodes` (in the order given): carry the last assigned backend to the
    unassigned nodes that it supports; with `skip_cpu`, the CPU is not carried."""
    ids, cpu = sched.ids, sched.n_backends - 1
    cur = -1
    for node in nodes:
        if is_view_op(node.op):
            continue
        b = ids.get(node, -1)
        if b != -1:
            cur = -1 if skip_cpu and b == cpu else b
        elif cur != -1:
            sched.set_if_supported(node, cur)


def _pass2(sched: BackendSched, graph) -> None:
    """Pass 2: expand gpu down, gpu up, rest down, rest up."""
    nodes = graph.nodes
    _expand(sched, nodes, True)
    _expand(sched, reversed(nodes), True)
    _expand(sched, nodes, False)
    _expand(sched, reversed(nodes), False)


def _pass3(sched: BackendSched, graph) -> None:
    """Pass 3: unassigned nodes to the backend supporting them with the most usable inputs (`3.best`);
    assigned ones up to a higher-priority backend of the same buffer type (`3.upg`)."""
    ids, backends, bufts = sched.ids, sched.backends, sched.bufts
    for node in graph.nodes:
        if is_view_op(node.op):
            continue
        cur = ids.get(node, -1)
        if cur == -1:  # unassigned node: find the backend with the most supported inputs
            best = -1
            for b in range(sched.n_backends):
                if not backends[b].supports_op(node):
                    continue
                n = sum(1 for s in node.src if s is not None
                        and (ids.get(s, -1) != -1 or ids.get(s.view_src, -1) != -1)
                        and sched.buffer_supported(s, b))
                if n > best:
                    best = n
                    ids[node] = b
                    sched.causes[node] = "3.best"
        else:  # assigned node: upgrade to higher prio backend if possible
            for b in range(cur):
                if bufts[b] is bufts[cur] and backends[b].supports_op(node) and \
                        all(sched.buffer_supported(s, b) for s in node.src if s is not None):
                    ids[node] = b
                    sched.causes[node] = "3.upg"
                    break


def _pass4(sched: BackendSched, graph) -> None:
    """Pass 4: views take their view_src's backend; unassigned sources their consumer's."""
    ids, causes = sched.ids, sched.causes
    for node in graph.nodes:
        if node.view_src is not None and ids.get(node, -1) == -1:
            ids[node] = ids.get(node.view_src, -1)
            causes[node] = "4.vsrc"
        cur = ids.get(node, -1)
        for s in node.src:
            if s is None or ids.get(s, -1) != -1:
                continue
            if s.view_src is not None:  # views are always on the same backend as the source
                ids[s] = ids.get(s.view_src, -1)
                causes[s] = "4.vsrc"
            else:
                ids[s] = cur
                causes[s] = "4.cur"


# %% [markdown]
# ### 3.2 · Pass 5: splits and input copies
#
# A split ends where the backend changes, or, once it has inputs, at a source that is a **weight of
# another backend** ("the memory of the previously offloaded weights can be reused") or when its
# inputs are **full** (10) and the source needs one more copy. Then each source is looked at
# (ggml-backend.c:1615-1621):
#
# ```c
#                 if (src_backend_id != cur_backend_id && !ggml_backend_sched_buffer_supported(sched, src, cur_backend_id)) {
#                     // create a copy of the input in the split's backend
#                     if (tensor_id_copy(src_id, cur_backend_id, 0) == NULL) {
#                         ggml_backend_t backend = sched->backends[cur_backend_id];
#                         for (int c = 0; c < sched->n_copies; c++) {
#                             struct ggml_tensor * tensor_copy = ggml_dup_tensor_layout(sched->ctx, src);
#                             ggml_format_name(tensor_copy, "%s#%s#%d", ggml_backend_name(backend), src->name, c);
# ```
#
# Notice that a copy is made only where the split's backend cannot use the source's memory, once per
# tensor and backend (copy 0 stands for all), one per copy index, named `BACKEND#name#c`; the node
# then reads the copy of `cur_copy`. With `n_copies > 1`, INPUT tensors also get a copy per index on
# their own backend, all flagged INPUT and OUTPUT so that the allocator never reuses them.

# %%
# | export
def _copy_of(sched: BackendSched, src, backend, c: int) -> object:
    """Copy `c` of `src` for `backend`: same layout, named `BACKEND#name#c`."""
    t = dup_tensor_layout(sched.ctx, src)
    t.format_name("%s#%s#%d", backend.get_name(), src.name, c)
    return t


def _mark_copy(sched: BackendSched, t) -> None:
    if sched.n_copies > 1:
        t.flags |= TensorFlag.INPUT | TensorFlag.OUTPUT  # prevent ggml-alloc from overwriting the tensor
    sched.causes[t] = "4.cpy"


def _pass5(sched: BackendSched, graph) -> None:
    """Pass 5: cut `graph` into splits and rewire sources to their copies."""
    ids, copies, nodes = sched.ids, sched.copies, graph.nodes
    first = next((k for k, n in enumerate(nodes) if not is_view_op(n.op)), len(nodes))
    split = Split(ids.get(nodes[first], -1) if first < len(nodes) else -1, 0)  # the first non-view node's backend
    sched.splits = [split]
    cur = split.backend_id
    for i in range(first, len(nodes)):
        node = nodes[i]
        if is_view_op(node.op):
            continue
        node_b = ids.get(node, -1)
        need_new_split = False
        if node_b == cur and split.n_inputs > 0:
            for s in node.src:
                if s is None:
                    continue
                if s.buffer is not None and s.buffer.usage == BufferUsage.WEIGHTS and ids.get(s, -1) != cur and \
                        (sched.weights_split_always or not sched.buffer_supported(s, cur)):
                    need_new_split = True  # a weight on another backend
                    break
                if split.n_inputs == sched.max_split_inputs:  # the split is full of inputs
                    if ids.get(s, -1) != cur and (s, cur, 0) not in copies and not sched.buffer_supported(s, cur):
                        need_new_split = True
                        break
        if node_b != cur or need_new_split:
            split.i_end = i
            split = Split(node_b, i)
            sched.splits.append(split)
            cur = node_b
        for j, s in enumerate(node.src):  # find inputs that are not on the same backend
            if s is None:
                continue
            s_b = ids.get(s, -1)
            if s.flags & INPUT and sched.n_copies > 1 and (s, s_b, 0) not in copies:
                for c in range(sched.n_copies):
                    t = s if c == sched.cur_copy else _copy_of(sched, s, sched.backends[s_b], c)
                    _mark_copy(sched, t)
                    copies[(s, s_b, c)] = t
                if len(sched.graph_inputs) >= sched.max_split_inputs:
                    raise SchedulerError(f"more than {sched.max_split_inputs} graph inputs with n_copies > 1")
                sched.graph_inputs.append(s)
            if s_b != cur and not sched.buffer_supported(s, cur):
                if (s, cur, 0) not in copies:  # create a copy of the input in the split's backend
                    for c in range(sched.n_copies):
                        t = _copy_of(sched, s, sched.backends[cur], c)
                        _mark_copy(sched, t)
                        copies[(s, cur, c)] = t
                    if split.n_inputs >= sched.max_split_inputs:
                        raise SchedulerError(f"split {len(sched.splits) - 1} needs more than "
                                             f"{sched.max_split_inputs} inputs (at {node.name!r})")
                    split.inputs.append(s)
                node.set_src(j, copies[(s, cur, sched.cur_copy)])
    split.i_end = len(nodes)


# %% [markdown]
# ### 3.3 · The scheduler's graph copy
#
# What the graph allocator plans is not the user's graph but `sched->graph`: per split, for each
# input, a dependency, then the input's copy, then the split's nodes (ggml-backend.c:1681-1685):
#
# ```c
#             // add a dependency to the input source so that it is not freed before the copy is done
#             struct ggml_tensor * input_dep = ggml_view_tensor(sched->ctx, input);
#             input_dep->src[0] = input;
#             sched->node_backend_ids[graph_copy->n_nodes] = sched->hv_tensor_backend_ids[input_id];
#             graph_copy->nodes[graph_copy->n_nodes++] = input_dep;
# ```
#
# Notice that the dependency is a view (`"<input> (view)"`, op NONE) on the *input's* backend that
# keeps the input alive until it is copied; the copy, a node of the split's backend, is allocated
# at the split's start. With `n_copies > 1` every copy is added as a leaf first, allocated before
# anything else. `node_backend_ids` / `leaf_backend_ids` name each tensor's buffer; the previous ids
# are kept for `alloc_splits` to compare.

# %%
# | export
class _Writer:
    """Appends into a fixed array from index 0 (`ids[graph_copy->n_nodes] = ...`)."""

    __slots__ = ("array", "n")

    def __init__(self, array):
        self.array, self.n = array, 0

    def append(self, value) -> None:
        if self.n >= len(self.array):
            self.array.extend([0] * len(self.array))  # the C reallocs the graph copy when it must grow
        self.array[self.n] = value
        self.n += 1


def _build_graph_copy(sched: BackendSched, graph) -> None:
    """The tail of `ggml_backend_sched_split_graph`: `sched.graph` and its backend ids."""
    ids, copies, cc = sched.ids, sched.copies, sched.cur_copy
    # swap node_backend_ids and leaf_backend_ids with the previous ones, then overwrite from index 0
    sched.prev_node_backend_ids, sched.node_backend_ids = sched.node_backend_ids, sched.prev_node_backend_ids
    sched.prev_leaf_backend_ids, sched.leaf_backend_ids = sched.leaf_backend_ids, sched.prev_leaf_backend_ids
    n_cap = max(graph.n_nodes, graph.n_leafs) + sched.n_splits * sched.max_split_inputs * 2 * sched.n_copies
    copy = Graph(max(sched.graph.size, n_cap))
    node_ids, leaf_ids = _Writer(sched.node_backend_ids), _Writer(sched.leaf_backend_ids)
    for split in sched.splits:
        split.graph = graph_view(graph, split.i_start, split.i_end)
        for inp in split.inputs:  # inputs are allocated by ggml-alloc at the start of the split
            dep = sched.ctx.view_tensor(inp)  # a dependency so that the input is not freed before the copy
            dep.set_src(0, inp)
            copy.nodes.append(dep)
            node_ids.append(ids.get(inp, -1))
            copy.nodes.append(copies[(inp, split.backend_id, cc)])
            node_ids.append(split.backend_id)
        for j in range(split.i_start, split.i_end):
            copy.nodes.append(graph.nodes[j])
            node_ids.append(ids.get(graph.nodes[j], -1))
    if sched.n_copies > 1:  # input copies as leafs, so that they are allocated first
        for inp in sched.graph_inputs:
            b = ids.get(inp, -1)
            for c in range(sched.n_copies):
                copy.leafs.append(copies[(inp, b, c)])
                leaf_ids.append(b)
        for split in sched.splits:
            for inp in split.inputs:
                for c in range(sched.n_copies):
                    copy.leafs.append(copies[(inp, split.backend_id, c)])
                    leaf_ids.append(split.backend_id)
    for leaf in graph.leafs:  # the leafs of the original graph
        copy.leafs.append(leaf)
        leaf_ids.append(ids.get(leaf, -1))
    sched.graph = copy


PASSES: tuple = (_pass1, _pass2, _pass3, _pass4, _pass5)


@method_of(BackendSched)
def split_graph(sched: BackendSched, graph) -> None:
    """`ggml_backend_sched_split_graph`: the five passes, the debug printout, the graph copy."""
    sched.splits, sched.graph_inputs = [], []
    sched.is_reset = False
    sched.ctx = Context("sched")
    for run in sched.passes:
        run(sched, graph)
    if sched.debug:
        log.debug("%s", print_assignments(sched, graph))
    _build_graph_copy(sched, graph)



# %% [markdown]
# ### 3.4 · The debug printout
#
# `ggml_backend_sched_print_assignments` (:1219-1251) writes what `GGML_SCHED_DEBUG` shows: a header
# per split with its inputs, then every non-view node with its backend and cause and those of its
# sources (ggml-backend.c:1234-1239):
#
# ```c
#         if (ggml_is_view_op(node->op)) {
#             continue;
#         }
#         ggml_backend_t tensor_backend = ggml_backend_sched_get_tensor_backend(sched, node);
#         fprintf(stderr, "node #%3d (%10.10s): %20.20s (%5.5s) [%5.5s %8.8s]:", i, ggml_op_name(node->op), node->name,
#             fmt_size(ggml_nbytes(node)), tensor_backend ? ggml_backend_name(tensor_backend) : "NULL", GET_CAUSE(node));
# ```
#
# Notice the printf widths: `%20.20s` **cuts** a longer name (`k_cache_view-0 (copy of Kcur-0)`
# shows as `k_cache_view-0 (copy`), and views are skipped. Copies have no backend id: `NULL`, cause
# `4.cpy`. `print_assignments` returns the text (the C writes it to stderr). For the pictures,
# `node_states` gives the same facts as a list, `pass_snapshots` the states after each pass (§6.2).

# %%
# | export
def _cell(s: str, width: int) -> str:
    """printf's `%W.Ws`: at most `width` characters, right-aligned in `width`."""
    return s[:width].rjust(width)


def _who(sched: BackendSched, t) -> str:
    b = sched.get_tensor_backend(t)
    return f"[{_cell(b.get_name() if b is not None else 'NULL', 5)} {_cell(sched.get_cause(t), 8)}]"


@method_of(BackendSched)
def print_assignments(sched: BackendSched, graph) -> str:
    """`ggml_backend_sched_print_assignments`: the GGML_SCHED_DEBUG text. Names are cut at 20
    characters and ops at 10, as ggml's printf widths cut them."""
    out, cur_split = [], 0
    for i, node in enumerate(graph.nodes):
        if cur_split < sched.n_splits and i == sched.splits[cur_split].i_start:
            split = sched.splits[cur_split]
            ins = "".join(f"[{t.name} ({_cell(fmt_size(nbytes(t)), 5)})] " for t in split.inputs)
            out.append(f"\n## SPLIT #{cur_split}: {sched.backends[split.backend_id].get_name()} # "
                       f"{split.n_inputs} inputs: {ins}\n")
            cur_split += 1
        if is_view_op(node.op):
            continue
        line = (f"node #{i:3d} ({_cell(node.op.name, 10)}): {_cell(node.name, 20)} "
                f"({_cell(fmt_size(nbytes(node)), 5)}) {_who(sched, node)}:")
        for s in node.src:
            if s is not None:
                line += f" {_cell(s.name, 20)} ({_cell(fmt_size(nbytes(s)), 5)}) {_who(sched, s)}"
        out.append(line + "\n")
    return "".join(out)


def node_states(sched: BackendSched, graph) -> list[tuple[str | None, str]]:
    """(backend name or None, cause) of every node of `graph`, as the scheduler has them now."""
    names = [b.get_name() for b in sched.backends]
    return [(names[sched.ids[t]] if sched.ids.get(t, -1) != -1 else None, sched.causes.get(t, "")) for t in graph.nodes]


def pass_snapshots(sched: BackendSched, graph, passes=PASSES) -> list:
    """Run `passes` (default: the five of `split_graph`) one by one on `graph` and return
    `[(title, node_states)]`: the states before any pass, then after each."""
    sched.splits, sched.graph_inputs, sched.ctx = [], [], Context("sched")
    snaps = [("before pass 1 (user pins only)", node_states(sched, graph))]
    for k, run in enumerate(passes, 1):
        run(sched, graph)
        snaps.append((f"after pass {k}", node_states(sched, graph)))
    return snaps


def changed_nodes(prev: list, state: list) -> list:
    """`[(i, backend, cause)]` of the nodes whose state differs between two `node_states`."""
    return [(i, b, c) for i, ((b, c), p) in enumerate(zip(state, prev)) if (b, c) != p]


# %% [markdown]
# ### 3.5 · Reserve
#
# `ggml_backend_sched_reserve` (:1959-1972) splits a worst-case graph and has the multi-buffer graph
# allocator plan `sched.graph` (ggml-backend.c:1962-1969):
#
# ```c
#     ggml_backend_sched_split_graph(sched, measure_graph);
#
#     if (!ggml_gallocr_reserve_n(sched->galloc, &sched->graph, sched->node_backend_ids, sched->leaf_backend_ids)) {
#         return false;
#     }
#
#     ggml_backend_sched_reset(sched);
# ```
#
# Notice that the backend ids *are* the allocator's buffer ids (one compute buffer per backend), and
# the reset at the end: the assignments are thrown away, only the buffer sizes stay.

# %%
# | export
@method_of(BackendSched)
def reserve(sched: BackendSched, measure_graph) -> bool:
    """`ggml_backend_sched_reserve`: split, plan every backend's compute buffer, reset."""
    split_graph(sched, measure_graph)
    if not sched.galloc.reserve_n(sched.graph, sched.node_backend_ids, sched.leaf_backend_ids):
        return False
    sched.reset()
    synchronize(sched)
    return True


@method_of(BackendSched)
def synchronize(sched: BackendSched) -> None:
    """`ggml_backend_sched_synchronize`: every backend."""
    for b in sched.backends:
        b.synchronize()


# %% [markdown]
# ## 4 · Allocating and running the splits
#
# `ggml_backend_sched_alloc_graph` (:1974-1987) splits the graph and places it with the kept plan
# (`ggml_backend_sched_alloc_splits`, :1738-1772), asking first whether a tensor moved (ggml-backend.c:1740-1745):
#
# ```c
#     for (int i = 0; i < sched->graph.n_nodes; i++) {
#         if (sched->node_backend_ids[i] != sched->prev_node_backend_ids[i] &&
#             sched->bufts[sched->node_backend_ids[i]] != sched->bufts[sched->prev_node_backend_ids[i]]) {
#             backend_ids_changed = true;
#             break;
#         }
# ```
#
# Notice the second condition: a move to the *same buffer type* does not count. The allocator plans again
# after such a move or when the kept plan does not fit ("failed to allocate graph, reserving").

# %%
# | export
def alloc_splits(sched: BackendSched) -> bool:
    """`ggml_backend_sched_alloc_splits`: place `sched.graph` with the kept plan, or plan it again
    when a tensor changed buffer type since the previous split or the plan does not fit."""
    bufts, now, prev = sched.bufts, sched.node_backend_ids, sched.prev_node_backend_ids

    def changed(ids, prev_ids, n):
        return any(ids[i] != prev_ids[i] and bufts[ids[i]] is not bufts[prev_ids[i]] for i in range(n))
    backend_ids_changed = changed(now, prev, sched.graph.n_nodes) or \
        changed(sched.leaf_backend_ids, sched.prev_leaf_backend_ids, sched.graph.n_leafs)
    if backend_ids_changed or not sched.galloc.alloc_graph(sched.graph):
        synchronize(sched)  # the re-allocation may move the split inputs to another address
        log.debug("ggml_backend_sched_alloc_splits: failed to allocate graph, reserving (backend_ids_changed = %d)",
                  int(backend_ids_changed))
        sched.galloc.reserve_n(sched.graph, sched.node_backend_ids, sched.leaf_backend_ids)
        if not sched.galloc.alloc_graph(sched.graph):
            log.error("ggml_backend_sched_alloc_splits: failed to allocate graph")
            return False
    return True


@method_of(BackendSched)
def alloc_graph(sched: BackendSched, graph) -> bool:
    """`ggml_backend_sched_alloc_graph`: split `graph` and give every tensor its memory."""
    split_graph(sched, graph)
    if not alloc_splits(sched):
        return False
    sched.is_alloc = True
    return True


@method_of(BackendSched)
def graph_compute_async(sched: BackendSched, graph) -> Status:
    """`ggml_backend_sched_graph_compute_async`: allocate when not done yet, then run the splits."""
    if not sched.is_reset and not sched.is_alloc:
        sched.reset()
    if not sched.is_alloc and not alloc_graph(sched, graph):
        return Status.ALLOC_FAILED
    return compute_splits(sched)


@method_of(BackendSched)
def graph_compute(sched: BackendSched, graph) -> Status:
    """`ggml_backend_sched_graph_compute`: `graph_compute_async`, then synchronize every backend."""
    err = graph_compute_async(sched, graph)
    synchronize(sched)
    return err


@method_of(BackendSched)
def set_eval_callback(sched: BackendSched, callback) -> None:
    """`ggml_backend_sched_set_eval_callback`: `callback(tensor, ask: bool) -> bool` (the C's user data
    is the closure)."""
    sched.callback_eval = callback


@method_of(BackendSched)
def free(sched: BackendSched) -> None:
    """`ggml_backend_sched_free`: the events and the compute buffers."""
    for row in sched.events:
        for event in row:
            if event is not None:
                event.free()
    sched.galloc.free()


# %% [markdown]
# `ggml_backend_sched_compute_splits` (:1774-1867) runs the splits in order, each after its inputs
# are copied in; for a user INPUT (ggml-backend.c:1788-1795):
#
# ```c
#             if (input->flags & GGML_TENSOR_FLAG_INPUT) {
#                 // inputs from the user must be copied immediately to prevent the user overwriting the data before the copy is done
#                 if (sched->events[split_backend_id][sched->cur_copy] != NULL) {
#                     ggml_backend_event_synchronize(sched->events[split_backend_id][sched->cur_copy]);
#                 } else {
#                     ggml_backend_synchronize(split_backend);
#                 }
#                 ggml_backend_tensor_copy(input, input_cpy);
# ```
#
# Notice that the host waits only for the split's backend to finish with this copy (its event, or a
# synchronize), then copies **at once**, so the user may overwrite their tensor afterwards. Other
# inputs are copied with `cpy_tensor_async` when the split's backend has it. With `parallel=True`,
# `cur_copy` rotates over four copies and events, so the next evaluation writes other buffers while
# the previous may still run. The eval callback is asked about each node (`ask=True`); runs of nodes
# nobody wants are computed together (`j0..j1`).

# %%
# | export
def _copy_inputs(sched: BackendSched, split) -> None:
    """The input copies before a split (the first loop of `ggml_backend_sched_compute_splits`)."""
    b = split.backend_id
    split_backend, event = sched.backends[b], sched.events[b][sched.cur_copy]
    for inp in split.inputs:
        input_backend = sched.get_tensor_backend(inp)
        cpy = sched.copies[(inp, b, sched.cur_copy)]
        if inp.flags & INPUT:  # user inputs are copied at once, so that the user may overwrite them after
            event.synchronize() if event is not None else split_backend.synchronize()
            tensor_copy(inp, cpy)
            continue
        # wait for the split backend to finish using the input before overwriting it
        split_backend.event_wait(event) if event is not None else split_backend.synchronize()
        if split_backend._cpy_tensor_async is None or not split_backend._cpy_tensor_async(input_backend, inp, cpy):
            input_backend.synchronize()
            event.synchronize() if event is not None else split_backend.synchronize()
            tensor_copy(inp, cpy)


def _compute_with_callback(sched: BackendSched, split, cb: Callable[[Tensor, bool], bool]) -> Status | None:
    """The eval-callback path: nodes in runs `j0..j1`, the callback `cb` asked (`ask=True`) about each."""
    backend, nodes = sched.backends[split.backend_id], split.graph.nodes
    j0 = 0
    while j0 < len(nodes):
        t = nodes[j0]
        need = cb(t, True)  # does the user need data from this node?
        j1 = j0
        while not need and j1 < len(nodes) - 1:  # the range of nodes that can be computed together
            j1 += 1
            t = nodes[j1]
            need = cb(t, True)
        ec = backend.graph_compute_async(graph_view(split.graph, j0, j1 + 1))
        if ec != Status.SUCCESS:
            return ec
        backend.synchronize()
        if need and not cb(t, False):
            return None  # the callback asked to stop: the remaining splits still run
        j0 = j1 + 1
    return Status.SUCCESS


def compute_splits(sched: BackendSched) -> Status:
    """`ggml_backend_sched_compute_splits`: copy each split's inputs in, compute it, record its event;
    then advance `cur_copy`."""
    for split in sched.splits:
        _copy_inputs(sched, split)
        if sched.callback_eval is None:
            ec = sched.backends[split.backend_id].graph_compute_async(split.graph)
        else:
            ec = _compute_with_callback(sched, split, sched.callback_eval)
        if ec is not None and ec != Status.SUCCESS:
            return ec
        event = sched.events[split.backend_id][sched.cur_copy]
        if split.inputs and event is not None:  # record the event of this copy
            event.record()
    sched.cur_copy = (sched.cur_copy + 1) % sched.n_copies
    return Status.SUCCESS



# %% [markdown]
# ## 5 · A worked example: two layers, two backends
#
# A small two-layer MLP: layer 1's weights live on a SIM device (configured like the fixtures' FAKE
# accelerator: synchronous), layer 2's on the CPU, the input on the CPU. Pass 1 sends each matrix product
# to its weight (`1.wgt0`) and the input to the CPU (`1.inp`); pass 2 spreads SIM to the unassigned ops
# around layer 1; pass 5 cuts the graph where the backend changes and copies the two tensors that cross.

# %%
import ggml_lite as gl  # noqa: E402

sim = gl.sim_init("SIM", asynchronous=False)
cpu = gl.cpu_init()
w_sim, w_cpu = gl.Context("weights:SIM"), gl.Context("weights:CPU")
w1 = w_sim.new_tensor_2d(gl.F16, 64, 128, name="w1")
b1 = w_sim.new_tensor_1d(gl.F32, 128, name="b1")
w2 = w_cpu.new_tensor_2d(gl.F16, 128, 32, name="w2")
for ctx, backend in ((w_sim, sim), (w_cpu, cpu)):
    gl.alloc_ctx_tensors(ctx, backend).set_usage(gl.BufferUsage.WEIGHTS)


def mlp():
    """A fresh compute graph over the same weights (a split rewires its graph: one graph, one split)."""
    c = gl.Context("compute")
    x = c.new_tensor_2d(gl.F32, 64, 8, name="x")
    gl.set_input(x)
    h = gl.add(c, gl.mul_mat(c, w1, x).set_name("h0"), b1).set_name("h1")
    h = gl.silu(c, h).set_name("h2")
    y = gl.soft_max(c, gl.mul_mat(c, w2, h).set_name("logits")).set_name("probs")
    gl.set_output(y)
    return gl.build_forward(y), x


graph, x = mlp()

sched = BackendSched([sim, cpu], debug=False)
split_graph(sched, graph)
print(print_assignments(sched, graph))

# %% [markdown]
# Reading it: `h0` follows its weight to SIM (`1.wgt0`); `h1` too (`b1` is in slot 1: `1.wgt1`); `h2`
# (silu) has no weight and is not an input, so pass 2 expands SIM down onto it (`2.sup`). `logits` follows
# `w2` to the CPU, which is never expanded first, so `probs` gets `2.sup` from the CPU in the "rest"
# sweeps. Two tensors cross: `x` into SIM (`SIM#x#0`), `h2` back (`CPU#h2#0`).
#
# The scheduler's graph copy holds the dependency views and the copies, and the reserve plans one
# compute buffer per backend:

# %%
# NBVAL_CHECK_OUTPUT
for t, b in zip(sched.graph.nodes, sched.node_backend_ids):
    print(f"{sched.backends[b].get_name():4s} {t.op.name:8s} {t.name}")
sched2 = BackendSched([sim, cpu], debug=False)
graph2, _ = mlp()
print("reserve:", reserve(sched2, graph2), "| splits", sched2.n_splits,
      "| compute buffers:", {b.get_name(): sched2.get_buffer_size(b) for b in (sim, cpu)})

# %% [markdown]
# Two splits; SIM's buffer is 6,144 bytes: `SIM#x#0` (2 KiB) and `h0` (4 KiB), with `h1` and `h2` computed
# in place of `h0`. The CPU's: `x` is freed once its dependency view has run, so `CPU#h2#0` (4 KiB) reuses
# its block; then `logits` (1 KiB), `probs` in place of it: 5,120 bytes, plus 32: 5,152.

# %% [markdown]
# ## 6 · Pictures
#
# Three pictures of a LLaMA-style model built with the ggml_lite API (the fixtures' 4-layer model,
# `build_llama` of chapter 10 in its recorded variant): **where every node runs** and where the graph
# is cut, **how the five passes get there**, and **what the splits cost in time and memory**. The
# first draws what the debug printout prints, split header and all (ggml-backend.c:1221-1225):
#
# ```c
#     for (int i = 0; i < graph->n_nodes; i++) {
#         if (cur_split < sched->n_splits && i == sched->splits[cur_split].i_start) {
#             ggml_backend_t split_backend = sched->backends[sched->splits[cur_split].backend_id];
#             fprintf(stderr, "\n## SPLIT #%d: %s # %d inputs: ", cur_split, ggml_backend_name(split_backend),
#                 sched->splits[cur_split].n_inputs);
# ```
#
# Notice the walk in execution order with a header at each `i_start`: the figure keeps it as its x
# axis, each node on the row of its backend, a dotted line at every `i_start`. `ggml_lite.viz.sched`
# only draws; its states come from `node_states` and `pass_snapshots`.

# %%
# | export viz.sched
"""Plotly figures and an ipywidgets stepper for the backend scheduler (chapter 09). Drawing only: the
states drawn come from `ggml_lite.sched` (`node_states`, `pass_snapshots`)."""

import plotly.graph_objects as go

from ggml_lite.sched import changed_nodes, node_states
from ggml_lite.viz.memory import step_widget

PALETTE = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a"]


def sched_graph_figure(sched, graph, state=None, title: str = "where every node runs",
                       copies: bool = True) -> go.Figure:
    """Nodes in execution order (x) on the row of their backend (y); grey: not assigned yet; dotted
    lines: split boundaries; lines between rows: the tensors copied into a split. `state` (a list of
    `(backend, cause)` per node, see `pass_snapshots`) replaces the scheduler's current assignment."""
    state = state or node_states(sched, graph)
    names = [b.get_name() for b in sched.backends]
    rows = {n: k for k, n in enumerate(names)}
    color = {n: PALETTE[k % len(PALETTE)] for k, n in enumerate(names)}
    fig = go.Figure()
    for n in [*names, None]:
        idx = [i for i, (b, _) in enumerate(state) if b == n]
        if not idx:
            continue
        y = [rows[n] if n is not None else len(names) for _ in idx]
        fig.add_trace(go.Scatter(
            x=idx, y=y, mode="markers", name=n or "unassigned", marker=dict(size=7, color=color.get(n, "#bbbbbb")),
            hovertext=[f"#{i} {graph.nodes[i].name} ({graph.nodes[i].op.name}): {state[i][0]} {state[i][1]}"
                       for i in idx], hoverinfo="text"))
    if copies:
        index = {id(t): i for i, t in enumerate(graph.nodes)}
        for split in sched.splits:
            fig.add_vline(x=split.i_start - 0.5, line=dict(color="#888", dash="dot", width=1))
            for inp in split.inputs:
                src = index.get(id(inp))
                b = sched.ids.get(inp, -1)
                if src is None or b == -1:
                    continue
                fig.add_trace(go.Scatter(x=[src, split.i_start], y=[rows[names[b]], split.backend_id], mode="lines",
                                         line=dict(color="#999", width=1), hoverinfo="text", showlegend=False,
                                         hovertext=f"copy {inp.name}: {names[b]} → {names[split.backend_id]}"))
    fig.update_layout(title=title, height=170 + 45 * len(names), xaxis=dict(title="node (execution order)"),
                      yaxis=dict(tickvals=list(range(len(names) + 1)), ticktext=[*names, "unassigned"],
                                 range=[-0.6, len(names) + 0.6]),
                      margin=dict(l=20, r=20, t=50, b=40))
    return fig


def pass_stepper(sched, graph, snaps):
    """A stepper through `pass_snapshots`: the figure of each state, and the nodes that state assigned
    (or re-assigned), with their causes."""
    from IPython.display import display

    def render(k):
        title, state = snaps[k]
        changed = changed_nodes(snaps[k - 1][1] if k else [(None, "")] * len(state), state)
        print(f"{title}: {len(changed)} node(s) changed")
        for i, b, c in changed[:12]:
            print(f"  #{i:3d} {graph.nodes[i].name:24s} -> {b} ({c})")
        if len(changed) > 12:
            print(f"  ... and {len(changed) - 12} more")
        display(sched_graph_figure(sched, graph, state, title, copies=False))

    return step_widget(len(snaps), render, label="state", interval=1200)


def buffer_sizes_figure(rows: dict, title: str = "compute buffer per backend") -> go.Figure:
    """Grouped bars: `rows` maps a placement's label to `{backend: bytes}`."""
    backends = list(dict.fromkeys(b for sizes in rows.values() for b in sizes))
    fig = go.Figure()
    for k, b in enumerate(backends):
        fig.add_trace(go.Bar(name=b, x=list(rows), y=[sizes.get(b, 0) / 1024 for sizes in rows.values()],
                             marker_color=PALETTE[k % len(PALETTE)],
                             hovertemplate=b + ": %{y:.1f} KiB<extra></extra>"))
    fig.update_layout(title=title, barmode="group", yaxis=dict(title="KiB"), height=340,
                      margin=dict(l=20, r=20, t=50, b=40))
    return fig


# %% [markdown]
# ### 6.1 · Where every node runs
#
# Layers 0-1 and their KV cache on the CPU, layers 2-3 and theirs on SIM, embeddings and output head
# on the CPU: scenario 03's placement. The graph is cut in three: CPU `[0, 66)`, SIM `[66, 136)`, CPU
# `[136, 138)`. Pass 2 pulls `l_out-1` (the residual add closing layer 1) and the final `norm_out` onto
# SIM, as it spreads SIM both ways and never the CPU. So `ffn_down-1` and `ffn_inp-1` cross to SIM, and
# the head (its weights on the CPU) gets `norm_out` back from SIM: the lines from row to row.

# %%
from ggml_lite.models.llama import batch_inputs, build_llama  # noqa: E402
from ggml_lite.viz.sched import buffer_sizes_figure, pass_stepper, sched_graph_figure  # noqa: E402

MODEL = dict(n_embd=64, n_head=4, n_head_kv=2, n_ff=172, n_vocab=256, n_layer=4, n_ctx=64, wtype="f16", kvtype="f16",
             rms_norm_eps=1e-5, rope=dict(mode=0, n_dims=16, n_ctx_orig=4096, freq_base=10000.0, freq_scale=1.0,
                                          ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0))
ROUND0 = dict(n_tokens=16, n_kv=32, kv_head=0, n_outputs=1)  # the first batch: 16 tokens, one output
PARTIAL = dict(token_embd="CPU", output="CPU", layers=["CPU", "CPU", "SIM", "SIM"], kv_cache=["CPU", "CPU", "SIM", "SIM"])


def llama_on(backends, placement, batch=ROUND0):
    """The model's weights and cache allocated on `backends` by `placement`, and its round-0 graph."""
    by_name = {b.get_name(): b for b in backends}
    ctxs, g, _ = build_llama(MODEL, placement, batch, recorded=True)
    for ctx in ctxs[:-1]:
        buf = gl.alloc_ctx_tensors(ctx, by_name[ctx.name.split(":")[1]])
        buf.set_usage(gl.BufferUsage.WEIGHTS if ctx.name.startswith("weights") else gl.BufferUsage.ANY)
    return g


sim7, cpu7 = gl.sim_init("SIM", asynchronous=False), gl.cpu_init()
g7 = llama_on([sim7, cpu7], PARTIAL)
sched7 = BackendSched([sim7, cpu7], debug=False)
split_graph(sched7, g7)
print([(sched7.backends[s.backend_id].get_name(), s.i_start, s.i_end, [i.name for i in s.inputs]) for s in sched7.splits])
sched_graph_figure(sched7, g7, title="partial offload: layers 0-1 and the head on the CPU, layers 2-3 on SIM")


# %% [markdown]
# ### 6.2 · The five passes, one at a time
#
# The same graph, fresh, the passes run one by one. Pass 1 places what weights and inputs decide
# (`1.wgt0`, `1.wgt1`, `1.inp`, `1.vsrc` for the KV cache views): 63 of 138 nodes. Pass 2 spreads
# them to 51 more (`2.sup`); pass 3 finds nothing left; pass 4 gives the 24 remaining views their
# view_src's backend (`4.vsrc`); pass 5 only cuts and copies. Move the slider.

# %% tags=["nbval-ignore-output"]
g72 = llama_on([sim7, cpu7], PARTIAL)
sched72 = BackendSched([sim7, cpu7], debug=False)
snaps = pass_snapshots(sched72, g72)
pass_stepper(sched72, g72, snaps)

# %%
# NBVAL_CHECK_OUTPUT
for title, state in snaps:
    assigned = sum(1 for b, _ in state if b is not None)
    print(f"{title:32s} assigned {assigned:3d} of {len(state)} nodes")

# %% [markdown]
# ### 6.3 · Time, and what pipeline parallelism buys
#
# Now SIM is asynchronous and shares a simulated clock with the CPU (0.5 TFLOP/s, 60 GB/s). Three evaluations
# are queued with `graph_compute_async`, as llama.cpp queues micro-batches. An input that is not a user INPUT is
# copied once the split's backend is done with the previous use of its copy buffer: with `parallel=False` the
# host **synchronizes SIM**, waiting for the whole previous evaluation; with `parallel=True` it waits for an
# event recorded four evaluations ago. For scenario 03's placement that buys **nothing**: its last split (the
# output head) runs on the CPU and needs `norm_out` from SIM, so each evaluation ends with the host waiting for
# SIM before the blocking copy. Put the head on SIM too and the host no longer waits at the end of an
# evaluation: with `parallel=True` the CPU computes evaluation *k+1*'s first layers while SIM still runs
# evaluation *k*.

# %%
from ggml_lite.models.llama import build_graph, model_tensors  # noqa: E402
from ggml_lite.viz.backends import timeline_figure  # noqa: E402

CPU_COST = gl.CostModel(flops=0.5e12, mem_bw=60e9, copy_bw=16e9, latency=2e-6)
HEAD_ON_SIM = dict(PARTIAL, output="SIM")


def pipelined(placement, parallel: bool, n_evals: int = 3):
    """Simulated time line of `n_evals` evaluations queued back to back: (clock, elapsed seconds)."""
    clock = gl.SimClock()
    sim_b, cpu_b = gl.sim_init("SIM", clock=clock), gl.cpu_init(clock=clock, cost=CPU_COST)
    g0 = llama_on([sim_b, cpu_b], placement)
    sch = BackendSched([sim_b, cpu_b], parallel=parallel, debug=False)
    reserve(sch, g0)
    w, layers = model_tensors({t.name: t for t in g0.leafs}, MODEL["n_layer"])
    start = clock.host
    for _ in range(n_evals):
        sch.reset()
        _, ge, _ = build_graph(MODEL, w, layers, ROUND0, recorded=True)
        alloc_graph(sch, ge)
        for key, value in batch_inputs(ROUND0).items():
            gl.tensor_set(ge.get_tensor(key), value)
        graph_compute_async(sch, ge)
    synchronize(sch)
    return clock, clock.host - start


runs = {(label, par): pipelined(pl, par) for label, pl in (("scenario 03", PARTIAL), ("head on SIM", HEAD_ON_SIM))
        for par in (False, True)}
for (label, par), (_, t) in runs.items():
    print(f"{label:12s} parallel={par!s:5s}: 3 evaluations in {t * 1e6:7.1f} µs of simulated time")

# %%
timeline_figure(runs[("head on SIM", False)][0].spans, lanes=["CPU", "SIM", "host copies"],
                title="head on SIM, parallel=False: every copy into SIM waits for SIM to be idle")

# %%
timeline_figure(runs[("head on SIM", True)][0].spans, lanes=["CPU", "SIM", "host copies"],
                title="head on SIM, parallel=True: the CPU runs ahead while SIM works")

# %%
timeline_figure(runs[("scenario 03", True)][0].spans, lanes=["CPU", "SIM", "host copies"],
                title="scenario 03, parallel=True: the CPU head waits for SIM — no overlap to gain")

# %% [markdown]
# ### 6.4 · What placements and copies cost in memory
#
# The compute buffers after `reserve` for the partial offload above (scenario 03); the same with
# `KQ_mask` pinned to SIM and `l_out-1` to the CPU (04: fewer bytes cross, but SIM must hold the
# mask); and with `parallel=True` (09: four copies of every input, so both buffers grow).

# %%
# NBVAL_CHECK_OUTPUT
def sizes(pins=(), parallel=False):
    sim_b, cpu_b = gl.sim_init("SIM", asynchronous=False), gl.cpu_init()
    g0 = llama_on([sim_b, cpu_b], PARTIAL)
    sch = BackendSched([sim_b, cpu_b], parallel=parallel, debug=False)
    for name, backend in pins:
        sch.set_tensor_backend(g0.get_tensor(name), sim_b if backend == "SIM" else cpu_b)
    reserve(sch, g0)
    return {b.get_name(): sch.get_buffer_size(b) for b in (sim_b, cpu_b)}


placements = {"partial (03)": sizes(),
              "pins (04)": sizes([("KQ_mask", "SIM"), ("l_out-1", "CPU")] +
                                 [(f"norm-{il}", be) for il, be in enumerate(PARTIAL["layers"])]),
              "parallel (09)": sizes(parallel=True)}
for label, row in placements.items():
    print(f"{label:14s} {row}")
buffer_sizes_figure(placements)


# %% [markdown]
# ## 7 · Check

# %%
assert {b.get_name(): sched2.get_buffer_size(b) for b in (sim, cpu)} == {"SIM": 2048 + 4096, "CPU": 4096 + 1024 + 32}
assert [(sched7.backends[sp.backend_id].get_name(), sp.i_start, sp.i_end) for sp in sched7.splits] == \
    [("CPU", 0, 66), ("SIM", 66, 136), ("CPU", 136, 138)]  # scenario 03's splits
assert placements["partial (03)"] == {"SIM": 34560, "CPU": 38592}  # scenario 03's recorded buffer sizes
assert placements["parallel (09)"] == {"SIM": 84480, "CPU": 52384}  # scenario 09's
assert placements["pins (04)"] == {"SIM": 38656, "CPU": 38592}  # scenario 04's
assert runs[("head on SIM", True)][1] < runs[("head on SIM", False)][1]
assert runs[("scenario 03", True)][1] == runs[("scenario 03", False)][1]
assert [sched.backends[s.backend_id].get_name() for s in sched.splits] == ["SIM", "CPU"]
assert [[i.name for i in s.inputs] for s in sched.splits] == [["x"], ["h2"]]
assert [sched.get_cause(t) for t in graph.nodes if t.op is not gl.Op.NONE][:3] == ["1.wgt0", "1.wgt1", "2.sup"]
assert sched.get_tensor_backend(x) is cpu and sched.get_cause(x) == "1.inp"
assert sched.copies[(x, 0, 0)].name == "SIM#x#0" and sched.get_cause(sched.copies[(x, 0, 0)]) == "4.cpy"
assert graph.nodes[0].src[1] is sched.copies[(x, 0, 0)]  # h0 now reads the copy
print("chapter 09: all checks passed")
# %% [markdown]
# ## 8 · Exercises
#
# Four exercises, about 75 minutes. Predictions are answered with `answer(id, value)`: replace the `...`
# and run the cell; it says right or wrong, then why. An implementation is graded with `check(id, fn)`
# against the port on small cases, 300 random ones and (09.3) the scheduler runs recorded from the real
# ggml; a failure shows the smallest case where your function and ggml disagree and the rule it breaks. `python -m ggml_lite exercises` lists what you have done. Solutions are in appendix A10; try
# first.

# %%
from ggml_lite.exercises import answer, check, done  # noqa: E402

# %% [markdown]
# **09.1 · Predict** (medium, 5 min). Take the MLP of §5 and move two weights: `b1` to the CPU and `w2` to
# SIM (`w1` stays on SIM, `x` is still an input). Which backends do the splits run on, in order? Answer
# with a tuple of names, e.g. `("CPU", "SIM")`.

# %%
answer("09.1", ...)

# %% [markdown]
# **09.2 · Implement** pass 1 for one tensor (medium, 20 min): `ggml_backend_sched_backend_id_from_cur`.
# It asks, in this order: can a backend run the op where the tensor's own buffer is (`1.dst`), or else
# where its view_src's buffer is (`1.vsrc`), each with `ggml_backend_sched_backend_from_buffer` of §2.1
# (the first backend that uses the buffer type *and* runs the op)? If the tensor is pre-allocated all
# the same, the C aborts. A graph INPUT goes to the last backend (`1.inp`). Then the weights
# (`ggml-backend.c:1184-1203`):
#
# ```c
#     // operations with weights are preferably run on the same backend as the weights
#     for (int i = 0; i < GGML_MAX_SRC; i++) {
#         const struct ggml_tensor * src = tensor->src[i];
#         if (src == NULL) {
#             continue;
#         }
#         if (src->buffer != NULL && src->buffer->usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS) {
#             int src_backend_id = ggml_backend_sched_backend_from_buffer(sched, src, tensor);
#             // check if a backend with higher prio wants to offload the op
#             if (src_backend_id == sched->n_backends - 1) {
#                 for (int b = 0; b < src_backend_id; b++) {
#                     if (ggml_backend_supports_op(sched->backends[b], tensor) && ggml_backend_offload_op(sched->backends[b], tensor)) {
#                         SET_CAUSE(tensor, "1.off");
#                         return b;
#                     }
#                 }
#             }
#             SET_CAUSE(tensor, "1.wgt%d", i);
#             return src_backend_id;
#         }
# ```
#
# Nothing decided: −1. The tensor and the backends come as plain data, described in the docstring; where
# the C aborts, raise `ggml_lite.errors.SchedulerError`.

# %%
# exercise 09.2
def pass1_backend(can_use, node):
    """The backend id (priority order, the CPU last) pass 1 gives a tensor, or -1. `can_use[i]`: the names of
    the buffer types backend i can use. `node`: `buffer` and `view_src`, the buffer type names of the tensor's
    buffer and of its view_src's (None: none); `is_input`; `weights[j]`, the buffer type name of src[j] when
    it is in a WEIGHTS buffer (else None); `runs[i]` and `offloads[i]`: backend i's `supports_op` and
    `offload_op` for this tensor."""
    raise NotImplementedError  # your code here


check("09.2", pass1_backend)

# %% [markdown]
# **09.3 · Implement** the splits of pass 5 (hard, 35 min). Passes 1-4 gave every node a backend; pass 5 of
# `ggml_backend_sched_split_graph` walks the nodes, skipping views, and starts a new split where the backend
# changes, or, in a split that already has inputs, at a weight of another backend
# (`ggml-backend.c:1535-1547`) or when the split is full (`ggml-backend.c:1552-1559`):
#
# ```c
#             if (node_backend_id == cur_backend_id && split->n_inputs > 0) {
#                 for (int j = 0; j < GGML_MAX_SRC; j++) {
#                     struct ggml_tensor * src = node->src[j];
#                     if (src == NULL) {
#                         continue;
#                     }
#                     // check if a weight is on a different backend
#                     // by starting a new split, the memory of the previously offloaded weights can be reused
#                     if (src->buffer != NULL && src->buffer->usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS) {
#                         int src_backend_id = tensor_backend_id(src);
#                         if (src_backend_id != cur_backend_id) {
#                             need_new_split = true;
#                             break;
# ```
# ```c
#                     if (split->n_inputs == GGML_SCHED_MAX_SPLIT_INPUTS) {
#                         const size_t id = hash_id(src);
#                         int src_backend_id = sched->hv_tensor_backend_ids[id];
#                         bool supported = ggml_backend_sched_buffer_supported(sched, src, cur_backend_id);
#                         if (src_backend_id != cur_backend_id && tensor_id_copy(id, cur_backend_id, 0) == NULL && !supported) {
#                             //printf("starting new split because of too many inputs: node %s, input %s\n", node->name, src->name);
#                             need_new_split = true;
#                             break;
# ```
#
# Then each source is copied as §3.2 shows: the first time a split of backend B needs a tensor of another
# backend that B cannot use, a copy for B is made, and that tensor becomes an input of the split (at most
# `max_inputs`: the C asserts it; raise `ggml_lite.errors.SchedulerError`). Return the splits as in the
# docstring.

# %%
# exercise 09.3
def make_splits(nodes, max_inputs=10):
    """[(backend, i_start, i_end, (input names...)), ...] in order. `nodes`: the graph's nodes in order, each
    with `name`, `backend`, `view` (a view op) and `srcs`: its sources, each with `name`, `backend`, `weight`
    (in a WEIGHTS buffer) and `usable` (the backends that can use its memory). `max_inputs`:
    GGML_SCHED_MAX_SPLIT_INPUTS."""
    raise NotImplementedError  # your code here


check("09.3", make_splits)

# %% [markdown]
# **09.4 · Explore** (medium, 15 min). In §6.4, `parallel=True` (n_copies 4) makes SIM's compute buffer
# grow from 34,560 to 84,480 bytes and the CPU's from 38,592 to 52,384. Why does pipeline parallelism keep
# four copies of every split input, and why do they cost more than four times the bytes of one? Run
# `done("09.4")` when you have an answer.
#
# <details><summary>A worked answer</summary>
#
# `compute_splits` rotates `cur_copy` over `GGML_SCHED_MAX_COPIES` = 4: evaluation *k* reads the copies
# `SIM#name#(k mod 4)`. While SIM may still be computing evaluation *k*, the host copies evaluation *k+1*'s
# inputs into the next copy, waiting only for the event recorded four evaluations ago on that copy. With
# one copy it would overwrite bytes SIM may still be reading, so it must synchronize SIM first: that wait is
# what §6.3 shows disappearing. The copies cost more than four times one because pass 5 flags every copy
# INPUT and OUTPUT and the graph copy lists them as leafs: the graph allocator places them first and never
# frees them, so they no longer share space with tensors that die before them, as a single copy does. The
# user's INPUT tensors (tokens, positions, mask, output ids) get four copies too, on their own backend: most
# of the CPU's growth. Memory bought for overlap: worth it only when the host does not wait at the end of each
# evaluation anyway (scenario 03's CPU head, §6.3).
#
# </details>
