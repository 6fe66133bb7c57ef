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
# # 06 · Backends
#
# Chapters 02–05 decided *where* every tensor lives. A **backend** is what *computes* with those
# bytes: the CPU, or an accelerator with memory of its own that the host cannot read directly. ggml
# hides the difference behind one table of function pointers, `struct ggml_backend_i`, and a handful
# of generic functions that fall back sensibly when a backend leaves an entry `NULL`. The scheduler
# of chapter 09 only ever talks to backends through that table; chapters 07 and 08 fill it in twice,
# for the CPU and for a simulated accelerator.
#
# **Learning goals**
#
# 1. The backend interface: what is mandatory, what is optional, and the fallbacks of
#    `ggml_backend_tensor_set_async`, `ggml_backend_graph_compute` and `ggml_backend_tensor_copy_async`.
# 2. Data in and out of a tensor, whatever its buffer: `ggml_backend_tensor_set` / `_get`.
# 3. Copies between backends, `ggml_backend_graph_copy` and `ggml_backend_compare_graph_backend`.
# 4. The registry: backends created by name, `"NAME:params"`.
#
# Exported: `ggml_lite.backend`, `ggml_lite.registry`.

# %% [markdown]
# ## 1 · The interface
#
# `ggml-backend-impl.h` declares the table; `ggml-backend.c:168-393` wraps it. Mandatory entries
# are called directly; optional ones are tested for `NULL` first:
#
# ```c
# void ggml_backend_tensor_set_async(ggml_backend_t backend, struct ggml_tensor * tensor, ...) {  // :199
#     if (backend->iface.set_tensor_async == NULL) {
#         ggml_backend_tensor_set(tensor, data, offset, size);          // a blocking copy instead
#     } else {
#         backend->iface.set_tensor_async(backend, tensor, data, offset, size);
#     }
# }
# enum ggml_status ggml_backend_graph_compute(ggml_backend_t backend, struct ggml_cgraph * cgraph) { // :275
#     enum ggml_status err = ggml_backend_graph_compute_async(backend, cgraph);
#     ggml_backend_synchronize(backend);                                // compute = async + wait
#     return err;
# }
# bool ggml_backend_offload_op(ggml_backend_t backend, const struct ggml_tensor * op) {          // :293
#     if (backend->iface.offload_op != NULL) { return backend->iface.offload_op(backend, op); }
#     return false;
# }
# ```
#
# The port keeps that shape. A `Backend` subclass implements the hooks, named after the table's
# entries with a leading underscore (`_graph_compute`, `_supports_op`, ...); an optional hook it
# does not have stays `None` in the base class, as `NULL` in the C table. The public methods
# (`graph_compute`, `tensor_set_async`, ...) are the `ggml_backend_*` wrappers with the C's
# fallbacks. Tensor data goes in and out through `tensor_set` / `tensor_get`
# (`ggml-backend.c:221-247`), which find the tensor's buffer (its `view_src`'s for a view) and
# check that the tensor is allocated and that the bytes asked lie inside it.

# %%
# | default_exp backend

# %%
# | export
"""Backends (ggml-backend.c:168-393, 2060-2269): the interface a backend implements, tensor data in
and out, copies, events, graph plans, `ggml_backend_graph_copy` and `ggml_backend_compare_graph_backend`
(the registry is `ggml_lite.registry`)."""

import abc
import enum
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ggml_lite.bind import method_of
from ggml_lite.buffer import _DTYPES, buffer_copy_tensor, strided_view, view_init
from ggml_lite.errors import (
    BackendError,
    DataTypeError,
    LayoutMismatchError,
    TensorBoundsError,
    TensorNotAllocatedError,
)
from ggml_lite.graph import Graph, graph_view
from ggml_lite.tallocr import alloc_ctx_tensors
from ggml_lite.tensor import Context, are_same_layout, describe, is_view_op, nbytes

log = logging.getLogger("ggml_lite")
Hook = Callable[..., Any] | None  # an optional entry of `struct ggml_backend_i`: NULL when missing


class Status(enum.IntEnum):
    """`enum ggml_status`: what a graph computation returns."""

    ALLOC_FAILED = -2
    FAILED = -1
    SUCCESS = 0
    ABORTED = 1


def tensor_buffer(t):
    """The buffer that holds `t`'s bytes: its own, or its `view_src`'s (`tensor->view_src ?
    tensor->view_src->buffer : tensor->buffer`)."""
    return t.view_src.buffer if t.view_src is not None else t.buffer


# %% [markdown]
# ### 1.1 · Data in and out
#
# The C copies raw bytes. Here `tensor_set` takes bytes, or a numpy array **of the tensor's own
# dtype** (an f32 array for an f16 tensor is refused rather than converted behind your back), and
# `tensor_get` returns the tensor as an array of its dtype and shape — or raw bytes when a part
# of it is asked for.

# %%
# | export
def _raw_bytes(tensor, data) -> np.ndarray:
    """`data` as uint8 bytes; a numpy array must have `tensor`'s dtype (bytes pass as they are)."""
    if isinstance(data, np.ndarray) and data.dtype != np.uint8:
        want: np.dtype = _DTYPES[tensor.type.name]
        if data.dtype != want:
            raise DataTypeError(f"tensor_set: {describe(tensor)} holds {tensor.type.name} ({want}), the array is "
                                f"{data.dtype}: convert it first (e.g. .astype(np.{want.name}))")
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)


def _check_access(tensor, offset: int, size: int, what: str):
    """The asserts of `ggml_backend_tensor_set` / `_get` (:174-193); returns the buffer."""
    buf = tensor_buffer(tensor)
    if buf is None:
        raise TensorNotAllocatedError(f"tensor {what}: {describe(tensor)} has no buffer (tensor buffer not set)")
    if tensor.data is None:
        raise TensorNotAllocatedError(f"tensor {what}: {describe(tensor)} is not allocated (data is NULL)")
    if offset < 0 or size < 0 or offset + size > nbytes(tensor):
        raise TensorBoundsError(f"tensor {what} out of bounds: {size} bytes at offset {offset} asked, "
                                f"{describe(tensor)} has {nbytes(tensor)} bytes")
    return buf


def tensor_set(tensor, data, offset: int = 0, size: int | None = None) -> None:
    """`ggml_backend_tensor_set`: write `size` bytes of `data` (default: all of it) into the tensor from
    byte `offset`, through its buffer's `set_tensor`."""
    raw = _raw_bytes(tensor, data)
    size = raw.size if size is None else size
    if size > raw.size:
        raise TensorBoundsError(f"tensor write: {size} bytes asked, the data has only {raw.size}")
    buf = _check_access(tensor, offset, size, "write")
    if size:
        buf.set_tensor(tensor, raw, offset, size)


def tensor_get(tensor, offset: int = 0, size: int | None = None) -> np.ndarray:
    """`ggml_backend_tensor_get`: the whole tensor as a new array of its dtype and shape (strides
    followed, so a view reads what it views), or, when `offset` or `size` is given, those raw bytes."""
    whole = offset == 0 and size is None
    size = nbytes(tensor) - offset if size is None else size
    buf = _check_access(tensor, offset, size, "read")
    raw = np.frombuffer(buf.get_tensor(tensor, offset, size), dtype=np.uint8) if size else np.zeros(0, np.uint8)
    return strided_view(tensor, raw).copy() if whole else raw.copy()


# %% [markdown]
# A small example: a 4×3 matrix in, the same bytes read back through a transposed view, and a part
# of the bytes raw.

# %%
# NBVAL_CHECK_OUTPUT
import ggml_lite as gl

ctx = gl.Context("demo")
a = ctx.new_tensor_2d(gl.F32, 4, 3, name="a")
a_t = gl.transpose(ctx, a)
demo_buf = gl.alloc_ctx_tensors(ctx, gl.cpu_buffer_type())
tensor_set(a, np.arange(12, dtype=np.float32).reshape(3, 4))
print(tensor_get(a))
print(tensor_get(a_t))                     # the view reads a's bytes with its own strides
print(tensor_get(a, offset=4, size=8))     # bytes 4..11: the floats 1.0 and 2.0


# %% [markdown]
# ### 1.2 · The `Backend` class
#
# One class for `struct ggml_backend` and its table. Names, default buffer type and `_graph_compute`
# / `_supports_op` / `_supports_buft` are mandatory; everything else is optional. `free` marks the
# backend unusable, as `ggml_backend_free` releases it.

# %%
# | export
class GraphPlan:
    """`ggml_backend_graph_plan_t`: a graph prepared once and computed many times. Like the C's
    (`cpu_plan->cgraph = *cgraph`), it holds a shallow copy: the node list, not the tensors."""

    def __init__(self, backend, graph):
        self.backend = backend
        self.graph = Graph(graph.size)
        self.graph.nodes = list(graph.nodes)
        self.graph.leafs = list(graph.leafs)
        self.freed = False


class Event:
    """`struct ggml_backend_event` (`ggml_backend_event_new`): a marker in a backend's stream of work.
    `record` (`ggml_backend_event_record`) places it after what was queued so far; `synchronize`
    (`ggml_backend_event_synchronize`) waits on the host until the backend reached it; another backend
    waits for it with `Backend.event_wait`. `free` is `ggml_backend_event_free`."""

    def __init__(self, backend):
        self.backend = backend
        self.context = None  # the backend's own state of the event
        self.freed = False

    def _alive(self) -> None:
        if self.freed:
            raise BackendError(f"event of backend {self.backend.get_name()} used after it was freed")

    def __repr__(self):
        return f"Event({self.backend.get_name()}{', freed' if self.freed else ''})"


@method_of(Event, "record")
def event_record(event) -> None:
    """`ggml_backend_event_record`."""
    event._alive()
    event.backend._event_record(event)


@method_of(Event, "synchronize")
def event_synchronize(event) -> None:
    """`ggml_backend_event_synchronize`."""
    event._alive()
    event.backend._event_synchronize(event)


@method_of(Event, "free")
def event_free(event) -> None:
    """`ggml_backend_event_free`."""
    event._alive()
    event.backend._event_free(event)
    event.freed = True


# %% [markdown]
# `struct ggml_backend_i` is a table of function pointers: a backend fills in what it supports and
# leaves the rest `NULL`. The class keeps the four entries every backend must have as abstract
# methods and the optional ones as class attributes set to `None`, so each wrapper below tests
# `backend._x is None` exactly where the C tests `backend->iface.x == NULL`.

# %%
# | export
class Backend(abc.ABC):
    """`struct ggml_backend` with its `ggml_backend_i` table. Subclasses set `name` and implement the
    four abstract hooks (`_get_default_buffer_type`, `_graph_compute`, `_supports_op`,
    `_supports_buft`); the optional hooks are None here, as NULL in the C table, and the public
    methods fall back as the C does."""

    name = "backend"
    # optional entries of `struct ggml_backend_i` (NULL in the C when a backend lacks them)
    _set_tensor_async: Hook = None
    _get_tensor_async: Hook = None
    _cpy_tensor_async: Hook = None
    _synchronize: Hook = None
    _graph_plan_create: Hook = None
    _graph_plan_free: Hook = None
    _graph_plan_compute: Hook = None
    _offload_op: Hook = None
    _event_new: Hook = None
    _event_free: Hook = None
    _event_record: Hook = None
    _event_wait: Hook = None
    _event_synchronize: Hook = None

    def __init__(self):
        self.freed = False

    # -- the mandatory hooks (a backend without one cannot be created) ---------------------------------
    @abc.abstractmethod
    def _get_default_buffer_type(self):
        """`iface.get_default_buffer_type`."""

    @abc.abstractmethod
    def _graph_compute(self, graph) -> Status:
        """`iface.graph_compute`: compute (or queue) every node of `graph`."""

    @abc.abstractmethod
    def _supports_op(self, op) -> bool:
        """`iface.supports_op`."""

    @abc.abstractmethod
    def _supports_buft(self, buft) -> bool:
        """`iface.supports_buft`."""

    def _alive(self) -> None:
        if self.freed:
            raise BackendError(f"backend {self.name} was freed")

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r}{', freed' if self.freed else ''})"


# %% [markdown]
# Its name and its end (`ggml_backend_name`, `ggml_backend_free`), then its buffers, all through the
# default buffer type: `ggml_backend_get_default_buffer_type`, `ggml_backend_alloc_buffer`,
# `ggml_backend_get_alignment`, `ggml_backend_get_max_size`.

# %%
# | export
@method_of(Backend)
def get_name(backend) -> str:
    """`ggml_backend_name`."""
    return backend.name


@method_of(Backend)
def free(backend) -> None:
    """`ggml_backend_free`: the backend cannot be used afterwards."""
    backend._alive()
    backend.freed = True


@method_of(Backend)
def get_default_buffer_type(backend):
    """`ggml_backend_get_default_buffer_type`."""
    return backend._get_default_buffer_type()


@method_of(Backend)
def alloc_buffer(backend, size: int):
    """`ggml_backend_alloc_buffer`: a buffer of the default buffer type."""
    return backend.get_default_buffer_type().alloc_buffer(size)


@method_of(Backend)
def get_alignment(backend) -> int:
    """`ggml_backend_get_alignment`: the default buffer type's."""
    return backend.get_default_buffer_type().get_alignment()


@method_of(Backend)
def get_max_size(backend) -> int:
    """`ggml_backend_get_max_size`: the default buffer type's."""
    return backend.get_default_buffer_type().get_max_size()


# %% [markdown]
# Data, asynchronously where the backend can: `ggml_backend_tensor_set_async` and
# `ggml_backend_tensor_get_async` fall back to the blocking copy when the entry is `NULL`;
# `ggml_backend_synchronize` does nothing for a backend without a queue.

# %%
# | export
@method_of(Backend)
def tensor_set_async(backend, tensor, data, offset: int = 0, size: int | None = None) -> None:
    """`ggml_backend_tensor_set_async`: queued on this backend, or `tensor_set` when it has no queue."""
    if backend._set_tensor_async is None:
        tensor_set(tensor, data, offset, size)
        return
    raw = _raw_bytes(tensor, data)
    size = raw.size if size is None else size
    _check_access(tensor, offset, size, "write")
    backend._set_tensor_async(tensor, raw, offset, size)


@method_of(Backend)
def tensor_get_async(backend, tensor, out: np.ndarray, offset: int = 0, size: int | None = None) -> None:
    """`ggml_backend_tensor_get_async`: the bytes land in `out` (uint8, at least `size` long) once
    the backend has run what was queued before; `tensor_get` at once when it has no queue."""
    size = nbytes(tensor) - offset if size is None else size
    _check_access(tensor, offset, size, "read")
    if out.dtype != np.uint8 or out.size < size:
        raise TensorBoundsError(f"tensor_get_async: the destination must be uint8 with {size} bytes, "
                                f"got {out.dtype} with {out.size}")
    if backend._get_tensor_async is None:
        out[:size] = tensor_get(tensor, offset, size)
        return
    backend._get_tensor_async(tensor, out, offset, size)


@method_of(Backend)
def synchronize(backend) -> None:
    """`ggml_backend_synchronize`: wait until everything queued has run (nothing to do without a queue)."""
    if backend._synchronize is not None:
        backend._synchronize()


# %% [markdown]
# Graphs: `ggml_backend_graph_plan_create` / `_free` / `_compute` (only for backends that have
# plans), `ggml_backend_graph_compute` (async, then synchronize) and `ggml_backend_graph_compute_async`.

# %%
# | export
@method_of(Backend)
def graph_plan_create(backend, graph) -> GraphPlan:
    """`ggml_backend_graph_plan_create`."""
    if backend._graph_plan_create is None:
        raise BackendError(f"backend {backend.name} has no graph plans (graph_plan_create is NULL)")
    return backend._graph_plan_create(graph)


@method_of(Backend)
def graph_plan_free(backend, plan: GraphPlan) -> None:
    """`ggml_backend_graph_plan_free`."""
    if backend._graph_plan_free is None:
        raise BackendError(f"backend {backend.name} has no graph plans (graph_plan_free is NULL)")
    backend._graph_plan_free(plan)


@method_of(Backend)
def graph_plan_compute(backend, plan: GraphPlan) -> Status:
    """`ggml_backend_graph_plan_compute`."""
    if backend._graph_plan_compute is None:
        raise BackendError(f"backend {backend.name} has no graph plans (graph_plan_compute is NULL)")
    if plan.freed:
        raise BackendError("graph_plan_compute: the plan was freed")
    return backend._graph_plan_compute(plan)


@method_of(Backend)
def graph_compute(backend, graph) -> Status:
    """`ggml_backend_graph_compute`: `graph_compute_async`, then `synchronize`."""
    err = backend.graph_compute_async(graph)
    backend.synchronize()
    return err


@method_of(Backend)
def graph_compute_async(backend, graph) -> Status:
    """`ggml_backend_graph_compute_async`: the backend's `graph_compute` (it may only queue the work)."""
    backend._alive()
    return backend._graph_compute(graph)


# %% [markdown]
# What it can do: `ggml_backend_supports_op`, `ggml_backend_supports_buft`, `ggml_backend_offload_op`
# (false when the entry is `NULL`); and its events, `ggml_backend_event_new` (NULL without
# event support) and `ggml_backend_event_wait`.

# %%
# | export
@method_of(Backend)
def supports_op(backend, op) -> bool:
    """`ggml_backend_supports_op`: can this backend compute the node `op`?"""
    return backend._supports_op(op)


@method_of(Backend)
def supports_buft(backend, buft) -> bool:
    """`ggml_backend_supports_buft`: can this backend use memory of buffer type `buft`?"""
    return backend._supports_buft(buft)


@method_of(Backend)
def offload_op(backend, op) -> bool:
    """`ggml_backend_offload_op`: does this backend want an op whose weight lives elsewhere (False
    when the backend has no opinion)?"""
    return backend._offload_op(op) if backend._offload_op is not None else False


@method_of(Backend)
def event_new(backend):
    """`ggml_backend_event_new`: an Event, or None when the backend has no events."""
    if backend._event_new is None:
        return None
    return backend._event_new()


@method_of(Backend)
def event_wait(backend, event: Event) -> None:
    """`ggml_backend_event_wait`: work queued on this backend after this call waits for `event`."""
    event._alive()
    if backend._event_wait is None:
        raise BackendError(f"backend {backend.name} cannot wait for events (event_wait is NULL)")
    backend._event_wait(event)


# %% [markdown]
# ### 1.3 · Copies
#
# `ggml_backend_tensor_copy` (:317-338) picks the cheapest path: if the source is host memory, it
# is a `tensor_set` of the destination from the source's bytes; if the destination is host memory,
# a `tensor_get` into it; otherwise it asks the destination's buffer to copy (`cpy_tensor`, a device
# to device copy) and, when that buffer declines, prints **"slow copy"** and goes through a
# temporary host array. `ggml_backend_tensor_copy_async` (:340-358) tries the destination
# backend's `cpy_tensor_async`; without one it synchronizes both backends first — "an async copy
# would normally happen after all the queued operations on both backends are completed" — and
# copies blocking. Both assert that the layouts are the same; here that is a
# `LayoutMismatchError`.

# %%
# | export
def _host_bytes(t) -> np.ndarray:
    """The `nbytes` bytes at `t.data`, read in place from its host buffer (the C passes `t->data`)."""
    return tensor_buffer(t).span(t.data, nbytes(t), "copy")


def _check_copy(src, dst) -> None:
    if not are_same_layout(src, dst):
        raise LayoutMismatchError(f"cannot copy {describe(src)} (nb {list(src.nb)}) to {describe(dst)} "
                                  f"(nb {list(dst.nb)}): the layouts differ")
    for t in (src, dst):
        if tensor_buffer(t) is None or t.data is None:
            raise TensorNotAllocatedError(f"tensor copy: {describe(t)} is not allocated")


def tensor_copy(src, dst) -> None:
    """`ggml_backend_tensor_copy`: host source → `tensor_set`; host destination → `tensor_get`; else the
    destination buffer's `cpy_tensor` (`ggml_backend_buffer_copy_tensor`), or the slow copy through host."""
    _check_copy(src, dst)
    if src is dst:
        return
    if tensor_buffer(src).is_host():
        tensor_set(dst, _host_bytes(src), 0, nbytes(src))
    elif tensor_buffer(dst).is_host():
        _host_bytes(dst)[:] = tensor_get(src, 0, nbytes(src))
    elif not buffer_copy_tensor(src, dst):
        log.warning("ggml_backend_tensor_copy: warning: slow copy from %s to %s",
                    tensor_buffer(src).get_name(), tensor_buffer(dst).get_name())
        tensor_set(dst, tensor_get(src, 0, nbytes(src)), 0, nbytes(src))


def tensor_copy_async(backend_src: Backend, backend_dst: Backend, src, dst) -> None:
    """`ggml_backend_tensor_copy_async`: the destination backend's `cpy_tensor_async`, or both backends
    synchronized and a blocking `tensor_copy`."""
    _check_copy(src, dst)
    if src is dst:
        return
    if backend_dst._cpy_tensor_async is not None and backend_dst._cpy_tensor_async(backend_src, src, dst):
        return
    # an async copy would normally happen after all the queued operations on both backends are completed
    backend_src.synchronize()
    backend_dst.synchronize()
    tensor_copy(src, dst)


# %% [markdown]
# ### 1.4 · Copying a whole graph to another backend, and comparing two backends
#
# `ggml_backend_graph_copy` (:2145-2224) rebuilds a computed graph on another backend: every tensor
# is duplicated **with its layout** (`ggml_dup_tensor_layout`, :1022), non-view tensors with data go
# to one context that is allocated on the backend in one buffer, views to another; then
# `graph_copy_init_tensor` copies the data in (views are `view_init`ed). Flags are not copied.
# `ggml_backend_compare_graph_backend` (:2232-2269) uses it to run a graph node by node on two
# backends and hands each pair of results to a callback — how ggml's `test-backend-ops` checks a
# GPU against the CPU. View ops are computed but not compared.

# %%
# | export
def dup_tensor_layout(ctx: Context, t):
    """`ggml_dup_tensor_layout`: `ggml_dup_tensor` keeping `t`'s strides `nb`."""
    d = ctx.dup_tensor(t)
    d.nb = list(t.nb)
    return d


class GraphCopy:
    """`struct ggml_backend_graph_copy`: the buffer, the two contexts and the copied graph."""

    __slots__ = ("buffer", "ctx_allocated", "ctx_unallocated", "graph")

    def __init__(self, buffer=None, ctx_allocated=None, ctx_unallocated=None, graph=None):
        self.buffer, self.ctx_allocated = buffer, ctx_allocated
        self.ctx_unallocated, self.graph = ctx_unallocated, graph


def graph_copy_dup_tensor(node_copies: dict, ctx_allocated, ctx_unallocated, src):
    """`graph_copy_dup_tensor`: `src`'s copy, made once, with its view source and sources copied first."""
    if src.data is None:
        raise TensorNotAllocatedError(f"graph_copy: {describe(src)} has no data (graph must be allocated)")
    dst = node_copies.get(src)
    if dst is not None:
        return dst
    dst = dup_tensor_layout(ctx_allocated if src.view_src is None else ctx_unallocated, src)
    if src.view_src is not None:
        dst.view_src = graph_copy_dup_tensor(node_copies, ctx_allocated, ctx_unallocated, src.view_src)
        dst.view_offs = src.view_offs
    dst.op = src.op
    dst.op_params = list(src.op_params)
    dst.set_name(src.name)
    for i, s in enumerate(src.src):
        if s is not None:
            dst.set_src(i, graph_copy_dup_tensor(node_copies, ctx_allocated, ctx_unallocated, s))
    node_copies[src] = dst
    return dst


def graph_copy_init_tensor(node_copies: dict, node_init: set, src) -> None:
    """`graph_copy_init_tensor`: give `src`'s copy its data (a view: `view_init` after its source)."""
    if src in node_init:
        return
    node_init.add(src)
    dst = node_copies[src]
    if dst.view_src is not None:
        graph_copy_init_tensor(node_copies, node_init, src.view_src)
        view_init(dst)
    else:
        tensor_copy(src, dst)
    for s in src.src:
        if s is not None:
            graph_copy_init_tensor(node_copies, node_init, s)


def graph_copy(backend: Backend, graph) -> GraphCopy:
    """`ggml_backend_graph_copy`: `graph` (allocated, with data) duplicated on `backend`; an empty
    GraphCopy when the buffer cannot be allocated."""
    node_copies: dict = {}
    node_init: set = set()
    ctx_allocated, ctx_unallocated = Context("graph_copy (allocated)"), Context("graph_copy (views)")
    for node in graph.nodes:  # dup nodes
        graph_copy_dup_tensor(node_copies, ctx_allocated, ctx_unallocated, node)
    buffer = alloc_ctx_tensors(ctx_allocated, backend)  # allocate nodes
    if buffer is None:
        log.error("failed to allocate buffer for graph copy")
        return GraphCopy()
    for node in graph.nodes:  # copy data and init views
        graph_copy_init_tensor(node_copies, node_init, node)
    copy = Graph(graph.size)
    copy.nodes = [node_copies[node] for node in graph.nodes]
    return GraphCopy(buffer, ctx_allocated, ctx_unallocated, copy)


# %% [markdown]
# The copy is freed with its buffer (`ggml_backend_graph_copy_free`). `ggml_backend_compare_graph_backend`
# is what the copy is for: it computes the graph on one backend and the copy on the other one node at
# a time (`graph_view` of a single node), and hands each pair of non-view results to a callback that
# compares them and may stop the walk. Chapter 08 uses it to check SIM against the CPU.

# %%
# | export
def graph_copy_free(copy: GraphCopy) -> None:
    """`ggml_backend_graph_copy_free`: free the copy's buffer."""
    if copy.buffer is not None:
        copy.buffer.free()


def compare_graph_backend(backend1: Backend, backend2: Backend, graph, callback) -> bool:
    """`ggml_backend_compare_graph_backend`: compute `graph` on `backend1` and a copy of it on
    `backend2` one node at a time; `callback(i, t1, t2)` sees each pair of non-view results and
    returns False to stop. False when the copy cannot be made."""
    copy = graph_copy(backend2, graph)
    if copy.buffer is None:
        return False
    g1, g2 = graph, copy.graph
    for i, (t1, t2) in enumerate(zip(g1.nodes, g2.nodes)):
        if t1.op is not t2.op or not are_same_layout(t1, t2):
            raise LayoutMismatchError(f"graph copy node {i}: {describe(t1)} and {describe(t2)} differ")
        backend1.graph_compute(graph_view(g1, i, i + 1))
        backend2.graph_compute(graph_view(g2, i, i + 1))
        if is_view_op(t1.op):
            continue
        if not callback(i, t1, t2):  # compare results, calculate rms etc
            break
    graph_copy_free(copy)
    return True



# %% [markdown]
# ## 2 · The registry
#
# `ggml-backend.c:394-545`: a fixed table of at most 64 entries (name, init function, default buffer
# type, user data), filled on first use by `ggml_backend_registry_init` with the CPU and whatever
# accelerators were compiled in. `ggml_backend_reg_init_backend_from_str("NAME:params")` splits at
# the first `:` and hands the rest to the backend's init function. Here the built-in entries are
# `CPU` and `SIM` (params `name=SIM1,alignment=64,max_size=65536,deny=SOFT_MAX+ROPE`, chapter 08). Two
# departures, both for Python callers: a name that is not found gives None from `reg_find_by_name`
# (the C returns `SIZE_MAX`) and an `UnknownBackendError` from `reg_init_backend_from_str` (the C
# prints "backend X not found" and returns NULL).
#
# The registry is a module of its own (`ggml_lite.registry`). It names no backend: the CPU backend
# (chapter 07) and SIM (chapter 08) declare themselves when their modules are imported, and the
# first lookup registers them in that order — CPU first, as in the C.

# %%
# | export registry
"""The backend registry (ggml-backend.c:394-545): backends created by name, "NAME:params"."""

import logging

from ggml_lite.backend import Backend
from ggml_lite.errors import BackendError, UnknownBackendError

log = logging.getLogger("ggml_lite")

GGML_REG_MAX_BACKENDS = 64


class _RegEntry:
    """`struct ggml_backend_reg`."""

    __slots__ = ("name", "init_fn", "default_buffer_type", "user_data")

    def __init__(self, name, init_fn, default_buffer_type, user_data):
        self.name, self.init_fn = name, init_fn
        self.default_buffer_type, self.user_data = default_buffer_type, user_data


_REGISTRY: list = []
_REGISTRY_INITIALIZED = False
_BUILTIN: list = []  # (name, init_fn, default buffer type function), in the order the backends declared them


def declare_builtin(name: str, init_fn, default_buffer_type_fn) -> None:
    """Declares a built-in backend, which `ggml_backend_registry_init` will register. The C lists its
    built-ins in that function (CPU, then whatever was compiled in); here each backend's module declares
    itself when it is imported (the CPU in chapter 07, SIM in chapter 08), so that this module, which
    comes first, imports neither."""
    _BUILTIN.append((name, init_fn, default_buffer_type_fn))


def _registry_init() -> None:
    """`ggml_backend_registry_init`: registers the built-in backends once, in declaration order."""
    global _REGISTRY_INITIALIZED
    if _REGISTRY_INITIALIZED:
        return
    _REGISTRY_INITIALIZED = True
    for name, init_fn, default_buffer_type_fn in _BUILTIN:
        register(name, init_fn, default_buffer_type_fn(), None)


def register(name: str, init_fn, default_buffer_type, user_data=None) -> None:
    """`ggml_backend_register`: `init_fn(params: str, user_data)` creates a backend."""
    if len(_REGISTRY) >= GGML_REG_MAX_BACKENDS:
        raise BackendError(f"cannot register backend {name!r}: the registry holds {GGML_REG_MAX_BACKENDS} backends")
    _REGISTRY.append(_RegEntry(str(name)[:127], init_fn, default_buffer_type, user_data))
    log.debug("ggml_backend_register: registered backend %s", name)



# %% [markdown]
# Lookups and creation by name; every one fills the table first (`ggml_backend_registry_init`).

# %%
# | export registry
def reg_get_count() -> int:
    """`ggml_backend_reg_get_count`."""
    _registry_init()
    return len(_REGISTRY)


def reg_find_by_name(name: str):
    """`ggml_backend_reg_find_by_name`: the index of the first backend called exactly `name`, or None."""
    _registry_init()
    return next((i for i, e in enumerate(_REGISTRY) if e.name == name), None)


def _reg_entry(i: int) -> _RegEntry:
    _registry_init()
    if not 0 <= i < len(_REGISTRY):
        raise UnknownBackendError(f"registry index {i} asked, the registry holds {len(_REGISTRY)} backends")
    return _REGISTRY[i]


def reg_get_name(i: int) -> str:
    """`ggml_backend_reg_get_name`."""
    return _reg_entry(i).name


def reg_init_backend(i: int, params: str = "") -> Backend:
    """`ggml_backend_reg_init_backend`: call entry `i`'s init function with `params`."""
    e = _reg_entry(i)
    return e.init_fn(params, e.user_data)


def reg_init_backend_from_str(backend_str: str) -> Backend:
    """`ggml_backend_reg_init_backend_from_str`: "NAME" or "NAME:params"."""
    name, sep, params = backend_str.partition(":")
    i = reg_find_by_name(name)
    if i is None:
        log.error("ggml_backend_reg_init_backend_from_str: backend %s not found", name)
        known = ", ".join(e.name for e in _REGISTRY)
        raise UnknownBackendError(f"backend {name!r} not found (from {backend_str!r}); registered: {known}")
    return reg_init_backend(i, params)


def reg_get_default_buffer_type(i: int):
    """`ggml_backend_reg_get_default_buffer_type`."""
    return _reg_entry(i).default_buffer_type


def reg_alloc_buffer(i: int, size: int):
    """`ggml_backend_reg_alloc_buffer`: a buffer of entry `i`'s default buffer type."""
    return reg_get_default_buffer_type(i).alloc_buffer(size)


# %% [markdown]
# The package's registry holds the two built-in backends. A backend is created by name, with its
# parameters after the colon; a name that is not registered is an `UnknownBackendError`.

# %%
# NBVAL_CHECK_OUTPUT
from ggml_lite import registry as reg  # noqa: E402

print([reg.reg_get_name(i) for i in range(reg.reg_get_count())])
cpu_r = reg.reg_init_backend_from_str("CPU")
sim_r = reg.reg_init_backend_from_str("SIM:name=SIM2,alignment=256,deny=SOFT_MAX")
print(cpu_r.get_name(), "|", sim_r, "| alignment", sim_r.get_alignment(), "| denies", sorted(o.name for o in sim_r.deny_ops))

# %% [markdown]
# ## 3 · Errors
#
# What a user can get wrong with tensor data and backends, each a specific exception from
# `ggml_lite.errors` that says what was asked, what was there, and which tensor. The output below is
# the lesson: reading a tensor that has no memory, writing too many bytes or the wrong dtype, copying
# between different layouts, an unknown backend, a freed buffer.

# %%
# NBVAL_CHECK_OUTPUT
def show(f):
    try:
        f()
    except gl.GGMLLiteError as e:
        print(f"{type(e).__name__}: {e}")


ctx = gl.Context("errors")
t = ctx.new_tensor_2d(gl.F32, 4, 2, name="t")
show(lambda: tensor_get(t))                                          # not allocated
err_buf = gl.alloc_ctx_tensors(ctx, gl.cpu_buffer_type())
show(lambda: tensor_set(t, np.zeros(12, np.float32)))                # out of bounds
show(lambda: tensor_set(t, np.zeros(8, np.float64)))                 # wrong dtype
show(lambda: tensor_copy(t, a))                                      # different layouts
show(lambda: reg.reg_init_backend_from_str("CUDA:0"))                 # unknown backend
err_buf.free()
show(lambda: tensor_get(t))                                          # freed buffer
show(err_buf.free)                                                   # freed twice

# %% [markdown]
# ## 4 · Check

# %%
assert [reg.reg_get_name(i) for i in range(reg.reg_get_count())] == ["CPU", "SIM"]
assert reg.reg_find_by_name("CUDA") is None and sim_r.get_alignment() == 256
assert np.array_equal(tensor_get(a_t), np.arange(12, dtype=np.float32).reshape(3, 4).T)
assert cpu_r.supports_buft(gl.cpu_buffer_type()) and not sim_r.supports_buft(gl.cpu_buffer_type())
print("chapter 06: all checks passed")

# %% [markdown]
# ## 5 · Exercises
#
# Three exercises, about 30 minutes. Predictions are answered with `answer(id, value)`: replace the `...`
# and run the cell; it says right or wrong, then why. An implementation is graded with `check(id, fn)`
# against the port on the chapter's cases, on the copies the real ggml's scheduler made in its recorded
# scenarios, and on random cases; a failure shows the smallest case where your function and ggml disagree
# and the rule it breaks. `python -m ggml_lite exercises` lists what you have done. Solutions are in
# appendix A9; try first.

# %%
from ggml_lite.exercises import answer, check, done  # noqa: E402

# %% [markdown]
# **06.1 · Predict** (medium, 5 min). Take §1.1's `a` again (4×3 f32, filled with 0 … 11 row by row) and
# its transpose `a_t`, whose whole read printed the matrix turned over. Which float do the four bytes
# `tensor_get(a_t, offset=16, size=4)` hold (read them with `np.frombuffer(..., np.float32)`)?

# %%
answer("06.1", ...)

# %% [markdown]
# **06.2 · Implement** the dispatch of `ggml_backend_tensor_copy` (medium, 15 min), from the C
# (`ggml-backend.c:317-338`; the slow copy condensed):
#
# ```c
# void ggml_backend_tensor_copy(struct ggml_tensor * src, struct ggml_tensor * dst) {
#     GGML_ASSERT(ggml_are_same_layout(src, dst) && "cannot copy tensors with different layouts");
#     if (src == dst) {
#         return;
#     }
#     if (ggml_backend_buffer_is_host(src->buffer)) {
#         ggml_backend_tensor_set(dst, src->data, 0, ggml_nbytes(src));
#     } else if (ggml_backend_buffer_is_host(dst->buffer)) {
#         ggml_backend_tensor_get(src, dst->data, 0, ggml_nbytes(src));
#     } else if (!ggml_backend_buffer_copy_tensor(src, dst)) {
#         /* "slow copy": malloc a host array, */
#         ggml_backend_tensor_get(src, data, 0, nbytes);
#         ggml_backend_tensor_set(dst, data, 0, nbytes);
#     }
# }
# ```
#
# Your function gets the facts as booleans: `same_layout`, `same_tensor` (`src == dst`), `src_host` and
# `dst_host` (`ggml_backend_buffer_is_host` of each buffer), and `dst_copies`: what the destination
# buffer's `cpy_tensor` answers when `ggml_backend_buffer_copy_tensor` asks it (true: it copied). Return
# the list of calls the copy makes on the two buffers, in order, each one of `"dst.set_tensor"`,
# `"src.get_tensor"` and `"dst.cpy_tensor"` (the question counts as a call, whatever it answers). Where the
# C asserts, raise `ggml_lite.errors.LayoutMismatchError`.

# %%
# exercise 06.2
def tensor_copy_calls(same_layout, same_tensor, src_host, dst_host, dst_copies):
    """Five booleans; returns a list of "dst.set_tensor", "src.get_tensor", "dst.cpy_tensor" in call order."""
    raise NotImplementedError  # your code here


check("06.2", tensor_copy_calls)

# %% [markdown]
# **06.3 · Explore** (medium, 10 min). When the destination backend has no `cpy_tensor_async`,
# `ggml_backend_tensor_copy_async` (:340-358) synchronizes the source backend *and* the destination backend
# before its blocking copy. Why the destination too: what could go wrong if only the source were waited
# for? Run `done("06.3")` when you have an answer.
#
# <details><summary>A worked answer</summary>
#
# Waiting for the source makes sure `src` holds its final bytes: the work that computes it may still be
# queued. Waiting for the destination protects the other side. Its queue may still hold work that *reads*
# `dst`, such as the previous batch's graph, which uses the input copied last time. A blocking
# `set_tensor` into `dst` now would change those bytes under a computation in flight (a write after a
# read), and nothing would report it: the results would just be wrong, now and then, depending on timing.
# An asynchronous copy queued on the destination backend is ordered after that work by the queue itself,
# which is why `cpy_tensor_async` needs no wait. The scheduler of chapter 09 avoids the full wait in its
# own copies: it waits for an event recorded after the split that last used the copy, and with
# `n_copies` > 1 it writes the next batch's inputs into another copy while the device still reads this
# one. The recorded traces show the plain case: in `ggml-seed-sched` 03 each copy into FAKE comes after a
# `FAKE.synchronize`.
#
# </details>
