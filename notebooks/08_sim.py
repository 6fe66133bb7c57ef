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
# # 08 · SIM, a simulated accelerator
#
# The interesting half of ggml-backend exists for devices the host cannot read: a GPU's memory is
# reached only through copies, its work is queued and runs later, and the host learns that it is done
# through `synchronize` or events. This chapter builds such a device in software — SIM — faithful
# enough that a wrong order of operations gives wrong numbers, and with a simulated clock, so that
# chapter 09 can show what the scheduler's copies and pipelines cost.
#
# **Learning goals**
#
# 1. Non-host memory: buffers the host cannot map, reached through `set_tensor` / `get_tensor` /
#    `cpy_tensor`, and why their bytes start as NaN here.
# 2. The queue: async calls only enqueue; `synchronize` and events decide when work runs.
# 3. Events between two devices, and a device-to-device copy that waits for one.
# 4. Time: a cost model, a shared clock, and the timeline it draws.
#
# Exported: `ggml_lite.sim`, `ggml_lite.viz.backends`.

# %%
# | default_exp sim

# %%
import numpy as np

import ggml_lite as gl

# %% [markdown]
# ## 1 · What a device the host cannot read needs
#
# SIM simulates the device of the introduction in four parts:
#
# * **Memory.** Its buffer type (named like the device, alignment 128 by default, `is_host` false,
#   optional `max_size`) allocates buffers whose size is exactly the request and whose bytes start as
#   `0xFF` — NaN in f32 and f16 — so reading what was never written shows. `tensor_array` refuses
#   them; only the device's own kernels read them (`device=True`).
# * **A queue.** `graph_compute_async`, `tensor_set_async`, `tensor_get_async` and
#   `cpy_tensor_async` only *enqueue*; the work runs, in order, on `synchronize`, on an event
#   synchronize, or when another queue waits for one of its events. Data moves when the work runs:
#   an async upload reads the host bytes at that moment, as a DMA engine would.
# * **Time.** A cost model (`CostModel`: FLOP/s and bytes/s for ops, bytes/s for copies, a launch
#   latency) gives each queued item a duration. A shared `SimClock` keeps the host's time; the device
#   starts an item when it is free, the item was issued and its waits are over, and records a span.
#   Blocking calls move the host's time forward to the device's. Counters keep the bytes copied in
#   each direction.
# * **Rules.** An op deny-list (`supports_op`), an `offload_op` rule (`None`, `"mul_mat"`: MUL_MAT with
#   `ne[1] >= 32`, `"cuda"`: `ne[1] >= 32` and not GET_ROWS — the CUDA backend's rule of this era — or
#   any callable), `supports_buft` only for its own buffer type, and `cpy_tensor` accepting sources in
#   any SIM memory.
#
# `asynchronous=False` gives the FAKE backend of the scheduler fixtures
# (`tests/fixtures/ggml-seed-sched/README.md`): no async tensor functions and no async copy (the
# hooks take the blocking path, as the C does for a NULL entry), work done at once, and events that
# exist but are synchronous.

# %%
# | export
"""SIM, a simulated accelerator: non-host memory, an asynchronous queue with events, a cost model and
a simulated clock (DESIGN §3). Configured with `asynchronous=False` it behaves like the FAKE backend
of the scheduler fixtures."""

import dataclasses
import logging
from typing import TYPE_CHECKING

import numpy as np

from ggml_lite.backend import Backend, Event, Status, tensor_buffer, tensor_get, tensor_set
from ggml_lite.bind import method_of
from ggml_lite.buffer import HEAP, Buffer, BufferType
from ggml_lite.cpu import NUMPY, ComputeParams, compute_forward, graph_label, mul_mat_supported, tier
from ggml_lite.errors import BackendError, UnsupportedOpError
from ggml_lite.registry import declare_builtin
from ggml_lite.tensor import VIEW_OPS, Op, describe, nbytes, nelements, op_by_name

log = logging.getLogger("ggml_lite")


# %% [markdown]
# ## 2 · Time: the clock and the cost model
#
# A span is one item of work on one lane (a device, or the host for the CPU backend). FLOPs are
# counted the usual way: `2·K` per output of a matrix product, a few per element for the
# transcendental ops, one per element otherwise; copies and view ops do no arithmetic. An item costs
# its launch latency plus the larger of its compute time and its memory time.

# %%
# | export
@dataclasses.dataclass(frozen=True)
class Span:
    """One item of work on a lane: `kind` is "compute", "h2d", "d2h", "d2d" or "wait"."""

    lane: str
    kind: str
    label: str
    start: float
    end: float


class SimClock:
    """Simulated time in seconds, shared by the host and the devices that are given the same clock.
    `host` is the host thread's time; `spans` is every span recorded so far."""

    def __init__(self):
        self.host = 0.0
        self.spans = []

    def record(self, lane: str, kind: str, label: str, start: float, end: float) -> None:
        self.spans.append(Span(lane, kind, label, start, end))

    def host_work(self, lane: str, kind: str, label: str, seconds: float) -> None:
        """Work that the host does itself (the CPU backend): it takes `seconds` of host time."""
        start = self.host
        self.host = start + seconds
        self.record(lane, kind, label, start, self.host)

    def wait_until(self, t: float) -> None:
        """The host blocks until `t` (a synchronize, a blocking copy)."""
        self.host = max(self.host, t)


def computes_nothing(op) -> bool:
    """A view op or a leaf (op NONE): nothing to compute, no bytes moved."""
    return op in VIEW_OPS or op is Op.NONE


_FLOPS_PER_ELEMENT = {Op.SOFT_MAX: 5, Op.ROPE: 6, Op.NORM: 5, Op.RMS_NORM: 4, Op.UNARY: 4, Op.LOG: 4}


def node_flops(node) -> int:
    """Floating point operations of one node (an estimate; copies and views do none)."""
    op = node.op
    if computes_nothing(op) or op in (Op.CPY, Op.CONT, Op.DUP, Op.GET_ROWS, Op.CONCAT):
        return 0
    if op is Op.MUL_MAT:
        return 2 * node.src[0].ne[0] * nelements(node)
    return _FLOPS_PER_ELEMENT.get(op, 1) * nelements(node)


def node_bytes(node) -> int:
    """Bytes a node reads and writes: its sources and itself (views move nothing)."""
    if computes_nothing(node.op):
        return 0
    return nbytes(node) + sum(nbytes(s) for s in node.src if s is not None)


@dataclasses.dataclass
class CostModel:
    """Durations of SIM's work: `flops` FLOP/s and `mem_bw` bytes/s for ops, `copy_bw` bytes/s for
    copies, `latency` seconds per queued item. The defaults are those of a mid-range GPU over PCIe 4."""

    flops: float = 20e12
    mem_bw: float = 500e9
    copy_bw: float = 16e9
    latency: float = 5e-6

    def op_seconds(self, node) -> float:
        if computes_nothing(node.op):
            return 0.0
        return self.latency + max(node_flops(node) / self.flops, node_bytes(node) / self.mem_bw)

    def graph_seconds(self, graph) -> float:
        return sum(self.op_seconds(n) for n in graph.nodes)

    def copy_seconds(self, n: int) -> float:
        return self.latency + n / self.copy_bw


# %% [markdown]
# ## 3 · Memory: the device's buffer type and buffers
#
# One `SimBufferType` per device: it is the device's memory, so it also keeps the device's clock,
# cost model and copy counters. A blocking copy (`ggml_backend_tensor_set` / `_get` on SIM memory)
# takes host time; `cpy_tensor` copies device to device when the source is in any SIM memory and
# declines otherwise — then `ggml_backend_tensor_copy` takes the slow path through the host.

# %%
# | export
class SimBufferType(BufferType):
    """A SIM device's buffer type (a `ggml_backend_buffer_type` whose `is_host` is false): buffers of
    exactly the requested size, base aligned to `alignment`, bytes starting as 0xFF. It carries the
    device's `clock`, `cost` model and copy counters `bytes_h2d`, `bytes_d2h`, `bytes_d2d`."""

    def __init__(self, name: str = "SIM", alignment: int = 128, max_size: int | None = None, clock=None,
                 cost=None):
        super().__init__(name, alignment, max_size, is_host=False)
        self.clock = clock if clock is not None else SimClock()
        self.cost = cost if cost is not None else CostModel()
        self.bytes_h2d = self.bytes_d2h = self.bytes_d2d = 0

    def alloc_buffer(self, size: int) -> "SimBuffer":
        """`ggml_backend_buft_alloc_buffer` of a SIM device."""
        buf = SimBuffer(self, size, HEAP.malloc(size + self.alignment), base_alignment=self.alignment)
        buf.malloc_size = size + self.alignment
        return buf

    def count(self, kind: str, n: int) -> None:
        """Add `n` bytes to the counter of `kind`: "h2d", "d2h" or "d2d"."""
        if kind == "h2d":
            self.bytes_h2d += n
        elif kind == "d2h":
            self.bytes_d2h += n
        else:
            self.bytes_d2d += n


BLOCKING_LANE = "host copies"  # blocking copies are the host thread's time, not a device queue's


class SimBuffer(Buffer):
    """A buffer in a SIM device's memory: `set_tensor`/`get_tensor` are blocking copies (host time,
    on the lane `BLOCKING_LANE`), `cpy_tensor` is a device-to-device copy from any SIM memory."""

    buft: SimBufferType  # (a SIM buffer's type is always a SIM buffer type)

    def memory(self) -> np.ndarray:
        """The device bytes, 0xFF until written (NaN for f32 and f16)."""
        self._alive()
        if self._mem is None:
            self._mem = np.full(self._extent(), 0xFF, dtype=np.uint8)
        return self._mem

    def _blocking(self, kind: str, n: int, tensor) -> None:
        self.buft.count(kind, n)
        clock = self.buft.clock
        clock.host_work(BLOCKING_LANE, kind, f"{self.buft.name} {kind} {tensor.name or '<unnamed>'}",
                        self.buft.cost.copy_seconds(n))

    def set_tensor(self, tensor, data, offset: int, size: int) -> None:
        """A blocking host-to-device copy."""
        super().set_tensor(tensor, data, offset, size)
        self._blocking("h2d", size, tensor)

    def get_tensor(self, tensor, offset: int, size: int) -> bytes:
        """A blocking device-to-host copy."""
        out = super().get_tensor(tensor, offset, size)
        self._blocking("d2h", size, tensor)
        return out

    def cpy_tensor(self, src, dst) -> bool:
        """Device to device when `src` lies in any SIM memory (the FAKE backend's rule), else False."""
        sbuf = tensor_buffer(src)
        if not isinstance(sbuf, SimBuffer):
            return False
        n = nbytes(src)
        self.span(dst.data, n, "copy")[:] = sbuf.span(src.data, n, "copy")
        self._blocking("d2d", n, dst)
        return True


# %% [markdown]
# ## 4 · The queue, events and the backend
#
# A queued item has a duration, the host time it was issued at, and what it does to the bytes. When
# it runs it starts at `max(device free, issued, waits over)`. An event is a counter of records;
# a record is an item that notes the time the device reached it; `event_wait(e)` queues an item
# that first makes `e`'s device run far enough, then waits for that time. Unsupported work is
# refused when it is *queued*, with the op and tensor in the message.

# %%
# | export
class _Item:
    """One queued piece of work."""

    __slots__ = ("kind", "label", "seconds", "run", "issued", "wait", "record")

    def __init__(self, kind, label, seconds, run=None, wait=None, record=None):
        self.kind, self.label, self.seconds, self.run = kind, label, seconds, run
        self.issued, self.wait, self.record = 0.0, wait, record


OFFLOAD_RULES = {
    None: lambda op: False,
    "mul_mat": lambda op: op.op is Op.MUL_MAT and op.ne[1] >= 32,
    "cuda": lambda op: op.ne[1] >= 32 and op.op is not Op.GET_ROWS,  # ggml-cuda's rule of this era
}


# %%
# | export
class SimBackend(Backend):
    """A SIM device's backend (one queue on one device): see `sim_init`."""

    def __init__(self, name="SIM", alignment=128, max_size=None, deny_ops=(), offload=None,
                 asynchronous=True, clock=None, cost=None, buft=None, arith=None):
        super().__init__()
        self.name = name
        self.arith = arith or NUMPY  # the CPU's numerics tier (chapter 07): SIM computes with its kernels
        self.buft = buft if buft is not None else SimBufferType(name, alignment, max_size, clock, cost)
        self.deny_ops = frozenset(op_by_name(o) for o in deny_ops)
        if not callable(offload) and offload not in OFFLOAD_RULES:
            raise BackendError(f"unknown offload rule {offload!r}: use None, 'mul_mat', 'cuda' or a function "
                               f"of the node")
        self.offload_rule = offload
        self._offload = offload if callable(offload) else OFFLOAD_RULES[offload]
        self.asynchronous = asynchronous
        self.queue = []
        self.free_at = 0.0  # when the device finishes what it has run

    # -- device state ----------------------------------------------------------------------------------
    @property
    def clock(self) -> SimClock:
        return self.buft.clock

    @property
    def cost(self) -> CostModel:
        return self.buft.cost

    @property
    def bytes_copied(self) -> dict:
        """Bytes copied host→device, device→host and device→device so far."""
        return {"h2d": self.buft.bytes_h2d, "d2h": self.buft.bytes_d2h, "d2d": self.buft.bytes_d2d}

    # -- compute ---------------------------------------------------------------------------------------------
    def _get_default_buffer_type(self):
        return self.buft

    def _supports_op(self, op) -> bool:
        """Every op but the deny-list (and, since SIM runs the CPU kernels, the CPU's MUL_MAT rule)."""
        if op.op in self.deny_ops:
            return False
        if op.op is Op.MUL_MAT:
            return mul_mat_supported(op)
        return True

    def _supports_buft(self, buft) -> bool:
        """Only this device's own buffer type."""
        return buft is self.buft

    def _graph_compute(self, graph) -> Status:
        """Queue the graph: it runs the CPU kernels on the device's memory when the queue runs."""
        for node in graph.nodes:
            if not self._supports_op(node):
                raise UnsupportedOpError(f"{self.name} does not support {node.op.name}: "
                                         f"cannot compute {describe(node)}")
        nodes = list(graph.nodes)
        if not nodes:
            return Status.SUCCESS

        def run():
            params = ComputeParams(self.arith, device=True)  # the kernels read and write this device's bytes
            for node in nodes:
                if computes_nothing(node.op):
                    continue
                for t in (node, *node.src):
                    if t is not None:
                        self._own(t, "read")
                compute_forward(node, params)
        self._enqueue(_Item("compute", graph_label(graph), self.cost.graph_seconds(graph), run))
        return Status.SUCCESS

    def __repr__(self):
        mode = "async" if self.asynchronous else "sync"
        return f"SimBackend({self.name!r}, {mode}, alignment={self.buft.alignment}, {len(self.queue)} queued)"


# %% [markdown]
# The queue: work is enqueued with its duration; `execute` runs one item when the device is free,
# its waits are over and it was issued; `drain` runs everything, `reach` runs up to an event; `own`
# refuses bytes of another device. These functions, and the entries of `struct ggml_backend_i` below,
# are attached to `SimBackend` with `@method_of` (chapter 00), under the hook names that chapter 06's
# `Backend` calls (`_enqueue`, `_set_tensor_async`, `_event_new`, ...). Each function is named as the
# naming rule says: the C entry minus `ggml_backend_` and the backend's name (CUDA's
# `ggml_backend_cuda_event_new` is `event_new`), callable also as a plain function of the module.

# %%
# | export
@method_of(SimBackend, "_enqueue")
def enqueue(sim, item: _Item) -> None:
    sim._alive()
    item.issued = sim.clock.host
    if sim.asynchronous:
        sim.queue.append(item)
    else:
        sim._execute(item)
        sim.clock.wait_until(sim.free_at)


@method_of(SimBackend, "_execute")
def execute(sim, item: _Item) -> None:
    ready = 0.0
    if item.wait is not None:
        event, gen = item.wait
        ready = event.backend._reach(event, gen)
    start = max(sim.free_at, item.issued, ready)
    if item.run is not None:
        item.run()
    sim.free_at = start + item.seconds
    if item.record is not None:
        event, gen = item.record
        _state(event)["times"][gen] = sim.free_at
    if item.seconds > 0:
        sim.clock.record(sim.name, item.kind, item.label, start, sim.free_at)


@method_of(SimBackend, "_drain")
def drain(sim, until=None) -> None:
    """Run queued items in order (all, or until the predicate `until()` holds)."""
    while sim.queue and (until is None or not until()):
        sim._execute(sim.queue.pop(0))


@method_of(SimBackend, "_reach")
def reach(sim, event: Event, gen: int) -> float:
    """Run this queue until `event`'s record number `gen` has run; its time (0 if never recorded)."""
    times = _state(event)["times"]
    sim._drain(lambda: gen in times)
    return times.get(gen, 0.0)


@method_of(SimBackend, "_synchronize")
def synchronize(sim) -> None:
    """Run everything queued; the host waits for the device."""
    sim._drain()
    sim.clock.wait_until(sim.free_at)


@method_of(SimBackend, "_own")
def own(sim, t, what: str):
    buf = tensor_buffer(t)
    if buf is None or buf.buft is not sim.buft:
        where = buf.get_name() if buf is not None else "no"
        raise BackendError(f"{sim.name} cannot {what} {describe(t)}: it lives in {where} memory, not {sim.name}'s")
    return buf



# %% [markdown]
# Copies: the async tensor functions only enqueue, and the bytes move when the item runs;
# `cpy_tensor_async` copies from any SIM memory into this device's. FAKE lacks these entries: its
# `asynchronous` flag sends them down the path the C takes for a NULL entry (a blocking copy, or
# `False` for the copy, after which the caller copies through the host).

# %%
# | export
@method_of(SimBackend, "_set_tensor_async")
def set_tensor_async(sim, tensor, raw, offset: int, size: int) -> None:
    if not sim.asynchronous:
        tensor_set(tensor, raw, offset, size)
        return
    buf = sim._own(tensor, "write")

    def run():
        buf.span(tensor.data + offset, size, "write")[:] = raw[:size]
        sim.buft.count("h2d", size)
    sim._enqueue(_Item("h2d", f"h2d {tensor.name}", sim.cost.copy_seconds(size), run))


@method_of(SimBackend, "_get_tensor_async")
def get_tensor_async(sim, tensor, out, offset: int, size: int) -> None:
    if not sim.asynchronous:
        out[:size] = tensor_get(tensor, offset, size)
        return
    buf = sim._own(tensor, "read")

    def run():
        out[:size] = buf.span(tensor.data + offset, size, "read")
        sim.buft.count("d2h", size)
    sim._enqueue(_Item("d2h", f"d2h {tensor.name}", sim.cost.copy_seconds(size), run))


@method_of(SimBackend, "_cpy_tensor_async")
def cpy_tensor_async(sim, backend_src, src, dst) -> bool:
    """Device to device between SIM backends (as CUDA's `cpy_tensor_async`: both sides must be
    devices), ordered after the work queued on `backend_src`; False otherwise (and always on FAKE)."""
    if not sim.asynchronous:
        return False
    sbuf, dbuf = tensor_buffer(src), tensor_buffer(dst)
    if not isinstance(backend_src, SimBackend) or not isinstance(sbuf, SimBuffer) or dbuf.buft is not sim.buft:
        return False
    n = nbytes(src)
    wait = None
    if backend_src is not sim:  # the C records an event on the source stream and waits for it
        event = backend_src.event_new()
        event.record()
        wait = (event, _state(event)["gen"])

    def run():
        dbuf.span(dst.data, n, "copy")[:] = sbuf.span(src.data, n, "copy")
        sim.buft.count("d2d", n)
    sim._enqueue(_Item("d2d", f"d2d {src.name}", sim.cost.copy_seconds(n), run, wait=wait))
    return True



# %% [markdown]
# Computing: `graph_compute` enqueues the CPU kernels on this device's bytes (the mandatory
# entries — default buffer type, `supports_op`, `supports_buft` — stay in the class above).

# %%
# | export
@method_of(SimBackend, "_offload_op")
def offload_op(sim, op) -> bool:
    return bool(sim._offload(op))



# %% [markdown]
# Events: recorded after what was queued so far; waiting on one makes this queue start only after
# the other reached it.

# %%
# | export
@method_of(SimBackend, "_event_new")
def event_new(sim) -> Event:
    event = Event(sim)
    event.context = {"gen": 0, "times": {}}
    return event


@method_of(SimBackend, "_event_free")
def event_free(sim, event: Event) -> None:
    event.context = None


def _state(event: Event) -> dict:
    """A live SIM event's `context`: {"gen": how many records, "times": {gen: when that record ran}}."""
    if event.context is None:
        raise BackendError("the event was freed")
    return event.context


@method_of(SimBackend, "_event_record")
def event_record(sim, event: Event) -> None:
    _state(event)["gen"] += 1
    sim._enqueue(_Item("record", "record", 0.0, record=(event, _state(event)["gen"])))


@method_of(SimBackend, "_event_synchronize")
def event_synchronize(sim, event: Event) -> None:
    sim.clock.wait_until(sim._reach(event, _state(event)["gen"]))


@method_of(SimBackend, "_event_wait")
def event_wait(sim, event: Event) -> None:
    sim._enqueue(_Item("wait", f"wait {event.backend.name}", 0.0, wait=(event, _state(event)["gen"])))



# %% [markdown]
# ## 5 · Making one

# %%
# | export
def sim_init(name="SIM", alignment=128, max_size=None, deny_ops=(), offload=None, asynchronous=True,
             clock=None, cost=None, exact: bool = False) -> SimBackend:
    """A new SIM device and its backend. `deny_ops`: ops (or names) it refuses; `offload`: None,
    "mul_mat", "cuda" or `f(node) -> bool`; `asynchronous=False`: the FAKE backend's synchronous
    behaviour; `clock`: a `SimClock` to share with other devices (and the CPU backend); `exact`: compute
    with the bit-exact tier (appendix A2), as `cpu_init(exact=True)`."""
    return SimBackend(name, alignment, max_size, deny_ops, offload, asynchronous, clock, cost,
                      arith=tier("exact" if exact else "numpy"))


def is_sim(backend) -> bool:
    """Is `backend` a SIM backend (the C's `ggml_backend_is_*` pattern)?"""
    return isinstance(backend, SimBackend)


_DEFAULT_DEVICE: list[SimBufferType] = []


def sim_default_buffer_type() -> SimBufferType:
    """The buffer type of the registry's "SIM" device (made on first use)."""
    if not _DEFAULT_DEVICE:
        _DEFAULT_DEVICE.append(SimBufferType("SIM"))
    return _DEFAULT_DEVICE[0]


_PINNED: list[BufferType] = []


def sim_host_buffer_type() -> BufferType:
    """The pinned host buffer type of a SIM setup, as CUDA's `ggml_backend_cuda_host_buffer_type`
    ("CUDA_Host"): host memory a device copies from directly. Alignment 32, like the CPU's, but a buffer
    is exactly the size asked for (the CPU buffer type adds 32 bytes)."""
    if not _PINNED:
        _PINNED.append(BufferType("CUDA_Host", 32, is_host=True))
    return _PINNED[0]


def _param(key: str, value: str):
    try:
        if key in ("alignment", "max_size"):
            return int(value, 0)
        if key == "deny":
            return tuple(v for v in value.split("+") if v)
        if key == "async":
            return {"1": True, "true": True, "0": False, "false": False}[value.lower()]
        if key == "offload":
            return None if value in ("", "none") else value
        if key == "name":
            return value
    except (ValueError, KeyError):
        raise BackendError(f"SIM parameter {key}={value!r}: not a valid value") from None
    raise BackendError(f"unknown SIM parameter {key!r}: use name, alignment, max_size, deny, offload, async")


def reg_sim_init(params: str, user_data) -> SimBackend:
    """The registry's init function for "SIM": no params gives a backend on the default "SIM" device;
    `name=SIM1,alignment=64,max_size=65536,deny=SOFT_MAX+ROPE,offload=cuda,async=0` a new device."""
    if not params:
        return SimBackend(buft=sim_default_buffer_type())
    kw = {}
    for part in params.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise BackendError(f"SIM parameter {part!r} is not key=value (in {params!r})")
        kw[key.strip()] = _param(key.strip(), value.strip())
    if "async" in kw:
        kw["asynchronous"] = kw.pop("async")
    if "deny" in kw:
        kw["deny_ops"] = kw.pop("deny")
    return sim_init(**kw)


declare_builtin("SIM", reg_sim_init, sim_default_buffer_type)  # the registry's entry after the CPU


# %% [markdown]
# ## 6 · SIM at work
#
# The same small model with its weight on a SIM device. Uploading the input, computing and
# downloading the result are only *queued*; until `synchronize` the device memory still holds 0xFF
# (NaN) where the result will be. Then the queue runs, the spans show where the time went, and the
# counters how many bytes crossed.

# %% [markdown]
# The small graph of chapter 07 §4 again — `out = sq + s` with `s = 0.25·(W·x)` and `sq = s²` — and its
# result on the CPU backend, the yardstick for the SIM runs below.

# %%
rng = np.random.default_rng(0)
W = rng.standard_normal((48, 64)).astype(np.float32)
X = rng.standard_normal((8, 64)).astype(np.float32)


def small_graph(w):
    """x -> h = w·x -> s = 0.25·h -> sq = s² -> out = sq + s, over the weight `w`."""
    c = gl.Context("compute")
    x = c.new_tensor_2d(gl.F32, 64, 8, name="x")
    gl.set_input(x)
    s = gl.scale(c, gl.mul_mat(c, w, x).set_name("h"), 0.25).set_name("s")
    out = gl.add(c, gl.sqr(c, s).set_name("sq"), s).set_name("out")
    gl.set_output(out)
    return gl.build_forward(out), x, out


cpu_b = gl.cpu_init()
wctx = gl.Context("weights")
w_cpu = wctx.new_tensor_2d(gl.F32, 64, 48, name="w")
gl.alloc_ctx_tensors(wctx, cpu_b)
gl.tensor_set(w_cpu, W)
graph, x, out = small_graph(w_cpu)
galloc = gl.GAllocr(gl.cpu_buffer_type())
galloc.alloc_graph(graph)
gl.tensor_set(x, X)
cpu_b.graph_compute(graph)
cpu_result = gl.tensor_get(out)

# %%
clock = SimClock()
sim = sim_init("SIM", clock=clock)
wctx = gl.Context("weights on SIM")
w_sim = wctx.new_tensor_2d(gl.F32, 64, 48, name="w")
gl.alloc_ctx_tensors(wctx, sim).set_usage(gl.BufferUsage.WEIGHTS)
gl.tensor_set(w_sim, W)                   # a blocking upload: host time passes
graph, x, out = small_graph(w_sim)
gl.GAllocr(sim.get_default_buffer_type()).alloc_graph(graph)
sim.tensor_set_async(x, X)
sim.graph_compute_async(graph)
result = np.zeros(gl.nbytes(out), np.uint8)
sim.tensor_get_async(out, result)
print("queued:", [item.kind for item in sim.queue], "| out on the device before synchronize: all NaN =",
      bool(np.isnan(gl.tensor_get(out)).all()))

# %% [markdown]
# (That `tensor_get` was itself a blocking copy: it shows on the host's lane below.)

# %%
sim.synchronize()
print("SIM == CPU backend, bit for bit:", np.array_equal(result.view(np.float32).reshape(8, 48), cpu_result))
print("bytes copied:", sim.bytes_copied, f"| host time {clock.host * 1e6:.1f} µs")
for span in clock.spans:
    print(f"  {span.lane:12s} {span.kind:8s} {span.start * 1e6:7.2f} → {span.end * 1e6:7.2f} µs  {span.label}")

# %% [markdown]
# Two devices and an event: SIM0 computes `out`, records an event; SIM1 waits for it and copies
# `out` into its own memory (`ggml_backend_tensor_copy_async` → SIM1's `cpy_tensor_async`). Only
# SIM1 is synchronized, and that is enough: waiting for the event makes SIM0 run as far as needed.

# %%
clock2 = SimClock()
sim0, sim1 = sim_init("SIM0", clock=clock2), sim_init("SIM1", clock=clock2)
wctx = gl.Context("weights on SIM0")
w_sim0 = wctx.new_tensor_2d(gl.F32, 64, 48, name="w")
gl.alloc_ctx_tensors(wctx, sim0)
gl.tensor_set(w_sim0, W)
graph, x, out = small_graph(w_sim0)
gl.GAllocr(sim0.get_default_buffer_type()).alloc_graph(graph)
copy_ctx = gl.Context("on SIM1")
out1 = copy_ctx.new_tensor_2d(gl.F32, 48, 8, name="out on SIM1")
gl.alloc_ctx_tensors(copy_ctx, sim1)
sim0.tensor_set_async(x, X)
sim0.graph_compute_async(graph)
done = sim0.event_new()
done.record()
sim1.event_wait(done)
gl.tensor_copy_async(sim0, sim1, out, out1)
sim1.synchronize()
print("SIM1's copy == CPU backend, bit for bit:", np.array_equal(gl.tensor_get(out1), cpu_result))
print("SIM0 queue left:", len(sim0.queue), "| SIM1 bytes:", sim1.bytes_copied)


# %% [markdown]
# ## 7 · Pictures
#
# Two figures, kept in `ggml_lite.viz.backends`: who can use what — each backend, the buffer types
# it can use (`supports_buft`; its default one drawn solid), and the buffers that exist of each
# type — and a timeline of simulated spans, one lane per device or host, which chapter 09 reuses
# for the scheduler's pipelines.

# %%
# | export viz.backends
"""Plotly figures for chapter 08 (and 09): backends, buffer types and buffers; a timeline of SIM spans."""

import plotly.graph_objects as go

KIND_COLORS = {"compute": "#636efa", "h2d": "#ef553b", "d2h": "#00cc96", "d2d": "#ab63fa", "wait": "#bbbbbb"}


def _column(names, x):
    n = len(names)
    return {name: (x, (n - 1) / 2 - i) for i, name in enumerate(names)}


def backends_figure(backends, bufts, buffers=(), title: str = "backends, buffer types and buffers") -> go.Figure:
    """Three columns: backends, buffer types, buffers. An edge backend → buffer type where
    `supports_buft` holds (solid for the backend's default type, dotted otherwise); an edge buffer
    type → buffer for every buffer of that type."""
    bnames = [b.get_name() for b in backends]
    tnames = [f"{t.get_name()} ({'host' if t.is_host() else 'device'}, align {t.get_alignment()})" for t in bufts]
    fnames = [f"{buf.get_name()} #{k}: {buf.get_size()} B, {buf.get_usage().name.lower()}"
              for k, buf in enumerate(buffers)]
    pos = {**_column(bnames, 0), **_column(tnames, 1), **_column(fnames, 2)}
    fig = go.Figure()
    for b, bname in zip(backends, bnames):
        for t, tname in zip(bufts, tnames):
            if b.supports_buft(t):
                default = b.get_default_buffer_type() is t
                (x0, y0), (x1, y1) = pos[bname], pos[tname]
                fig.add_trace(go.Scatter(x=[x0, x1], y=[y0, y1], mode="lines", hoverinfo="skip", showlegend=False,
                                         line=dict(color="#444" if default else "#999", width=2 if default else 1,
                                                   dash="solid" if default else "dot")))
    for buf, fname in zip(buffers, fnames):
        owner = next((tn for t, tn in zip(bufts, tnames) if t is buf.get_type()), None)
        if owner is not None:
            (x0, y0), (x1, y1) = pos[owner], pos[fname]
            fig.add_trace(go.Scatter(x=[x0, x1], y=[y0, y1], mode="lines", hoverinfo="skip", showlegend=False,
                                     line=dict(color="#bbb", width=1)))
    for names, color, what in ((bnames, "#636efa", "backend"), (tnames, "#ef553b", "buffer type"),
                               (fnames, "#00cc96", "buffer")):
        if names:
            fig.add_trace(go.Scatter(x=[pos[n][0] for n in names], y=[pos[n][1] for n in names], mode="markers+text",
                                     text=names, textposition="middle right" if what != "backend" else "middle left",
                                     marker=dict(size=14, color=color), name=what, hovertext=names, hoverinfo="text"))
    fig.update_layout(title=title, height=140 + 45 * max(len(bnames), len(tnames), len(fnames), 1),
                      xaxis=dict(visible=False, range=[-0.8, 3.2]), yaxis=dict(visible=False),
                      margin=dict(l=20, r=20, t=50, b=20), legend=dict(orientation="h"))
    return fig


def timeline_figure(spans, title: str = "simulated timeline", lanes=None, unit: float = 1e-6) -> go.Figure:
    """One lane per device (or host), a bar per span coloured by kind; x in µs (`unit` seconds)."""
    lanes = lanes or list(dict.fromkeys(s.lane for s in spans))
    fig = go.Figure()
    shown = set()
    for s in spans:
        fig.add_trace(go.Bar(y=[s.lane], x=[(s.end - s.start) / unit], base=[s.start / unit], orientation="h",
                             marker_color=KIND_COLORS.get(s.kind, "#888"), marker_line=dict(color="white", width=1),
                             name=s.kind, legendgroup=s.kind, showlegend=s.kind not in shown,
                             hovertext=f"{s.lane} {s.kind}: {s.label}<br>{s.start / unit:.1f} → {s.end / unit:.1f} µs",
                             hoverinfo="text"))
        shown.add(s.kind)
    end = max((s.end for s in spans), default=0) / unit
    fig.update_layout(title=title, barmode="overlay", height=120 + 50 * len(lanes),
                      xaxis=dict(title="simulated time (µs)", range=[0, end * 1.02 or 1]),
                      yaxis=dict(categoryorder="array", categoryarray=list(reversed(lanes))),
                      margin=dict(l=20, r=20, t=50, b=40))
    return fig


# %% [markdown]
# Who can use what, for the backends of this chapter: the CPU uses any host memory; each SIM only
# its own. Buffers hang off their type.

# %%
from ggml_lite.viz.backends import backends_figure, timeline_figure  # noqa: E402

bufts = [gl.cpu_buffer_type(), sim0.get_default_buffer_type(), sim1.get_default_buffer_type()]
shown = [galloc.buffers[0], w_cpu.buffer, w_sim0.buffer, out1.buffer]
backends_figure([cpu_b, sim0, sim1], bufts, shown)

# %% [markdown]
# The two-device run on the simulated clock: uploads (red) and the compute (blue) on SIM0; SIM1's
# device-to-device copy (purple) waits for SIM0's compute to end; the blocking copies the host made
# on its own lane. Hover for labels and times.

# %%
timeline_figure(clock2.spans, title="SIM0 computes, SIM1 waits for its event and copies the result")


# %% [markdown]
# ## 8 · Comparing two backends
#
# `ggml_backend_compare_graph_backend` (chapter 06) runs a graph node by node on one backend and on a
# copy of it on another, and shows each pair of results to a callback. The small graph on the CPU
# against a SIM created through the registry: all four nodes agree to the bit, because SIM computes
# with the CPU's kernels on its own bytes.

# %%
# NBVAL_CHECK_OUTPUT
from ggml_lite import backend as be  # noqa: E402
from ggml_lite import registry as reg  # noqa: E402

sim_r = reg.reg_init_backend_from_str("SIM:name=SIM2,alignment=256")
graph, x, out = small_graph(w_cpu)
gl.GAllocr(gl.cpu_buffer_type()).alloc_graph(graph)
gl.tensor_set(x, X)
diffs = []
be.compare_graph_backend(cpu_b, sim_r, graph,
                         lambda i, t1, t2: diffs.append((i, t1.name, float(np.abs(gl.tensor_get(t1) - gl.tensor_get(t2)).max()))) or True)
print(diffs)

# %% [markdown]
# A SIM that denies an op refuses the graph that contains it, with the op and the tensor named:

# %%
# NBVAL_CHECK_OUTPUT
sim_d = sim_init("SIMd", deny_ops=("SOFT_MAX",))
ctx = gl.Context("denied")
t = ctx.new_tensor_2d(gl.F32, 4, 2, name="t")
try:
    sim_d.graph_compute(gl.build_forward(gl.soft_max(ctx, t)))
except gl.GGMLLiteError as e:
    print(f"{type(e).__name__}: {e}")

# %% [markdown]
# ## 9 · Check

# %%
assert all(d == 0.0 for *_, d in diffs) and len(diffs) == 4
assert sim.bytes_copied["h2d"] == 64 * 48 * 4 + 64 * 8 * 4 and sim.bytes_copied["d2h"] == 2 * 48 * 8 * 4
lanes = {}
for span in clock2.spans:
    lanes.setdefault(span.lane, []).append(span)
assert all(a.end <= b.start + 1e-12 for ss in lanes.values() for a, b in zip(ss, ss[1:]))  # a lane does one thing at a time
d2d = next(sp for sp in clock2.spans if sp.kind == "d2d")
assert d2d.lane == "SIM1" and d2d.start >= max(sp.end for sp in clock2.spans if sp.kind == "compute")
assert cpu_b.supports_buft(gl.cpu_buffer_type()) and not sim0.supports_buft(gl.cpu_buffer_type())
print("chapter 08: all checks passed")

# %% [markdown]
# ## 10 · Exercises
#
# Three exercises, about 55 minutes. Predictions are answered with `answer(id, value)`: replace the `...`
# and run the cell; it says right or wrong, then why. An implementation is graded with `check(id, fn)`
# against the port on the chapter's cases and 250 random ones; a failure shows the smallest case where
# your function and SIM disagree and the rule it breaks. `python -m ggml_lite exercises` lists what you
# have done. Solutions are in appendix A9; try first.

# %%
from ggml_lite.exercises import answer, check, done  # noqa: E402

# %% [markdown]
# **08.1 · Predict** (easy, 5 min). Two SIM devices share one clock, both with `CostModel(copy_bw=1e9,
# latency=0)`: a byte takes a nanosecond, nothing else takes time. `x` (3 MB, MB = 10⁶ bytes) lives on
# SIM0, `y` (2 MB) on SIM1. From host time 0 the host calls:
#
# ```python
# sim1.tensor_set_async(y, ...)  # 2 MB up to SIM1
# sim0.tensor_set_async(x, ...)  # 3 MB up to SIM0
# e = sim0.event_new()
# e.record()
# sim1.event_wait(e)
# sim1.tensor_get_async(y, ...)  # 2 MB back from SIM1
# sim1.synchronize()
# ```
#
# What is the host's time, in µs, after the synchronize?

# %%
answer("08.1", ...)

# %% [markdown]
# **08.2 · Implement** SIM's queue (hard, 35 min). Events are how ggml orders work on two queues without
# stopping the host; the scheduler, before it overwrites a split's input (`ggml-backend.c:1797-1801`):
#
# ```c
# // wait for the split backend to finish using the input before overwriting it
# if (sched->events[split_backend_id][sched->cur_copy] != NULL) {
#     ggml_backend_event_wait(split_backend, sched->events[split_backend_id][sched->cur_copy]);
# } else {
#     ggml_backend_synchronize(split_backend);
# ```
#
# Write what SIM does with such calls: play the host's `calls` in order and return `(spans, host)`, the
# spans of the work items in the order they ran, each `(device, label, start, end)`, and the host's time at
# the end. Times are integers (µs) and everything starts at 0. A call is one of:
#
# - `("work", device, label, us)`: queue `us` µs of work on the device (as `graph_compute_async` does);
# - `("host", us)`: the host works `us` µs itself;
# - `("record", device, event)`: queue a record of `event` (always recorded by this device);
# - `("wait", device, event)`: queue a wait for `event`'s latest record so far (another device's event);
# - `("sync", device)`: `synchronize` the device; `("event_sync", event)`: `event.synchronize()`.
#
# The rules are §4's: a queue runs in order, an item starts no earlier than it was queued, and nothing runs
# before a synchronize or a wait needs it.

# %%
# exercise 08.2
def simulate(calls):
    """calls: a list of tuples as above -> (spans, host): spans [(device, label, start, end), ...] of the work
    items that ran (in any order), host the host's time at the end."""
    raise NotImplementedError  # your code here


check("08.2", simulate)

# %% [markdown]
# **08.3 · Explore** (medium, 15 min). On a SIM, queue an upload of ones into an f32 tensor `x` with
# `sim.tensor_set_async(x, ones)`, then write twos into it with the blocking `gl.tensor_set(x, twos)`,
# then `sim.synchronize()`. What does `x` hold at the end, and why? What must a program, or ggml's
# scheduler, do about it? Run `done("08.3")` when you have an answer.
#
# <details><summary>A worked answer</summary>
#
# Ones. The blocking copy is the *buffer's* `set_tensor`: it knows nothing of any backend's queue, so it
# writes the twos at once (host time passes on the lane "host copies"), while the async upload of the ones
# is still queued. `synchronize` then runs the queue, and the upload writes its ones over the twos. A read
# with `gl.tensor_get(x)` between the two would have shown the twos. The C has the same shape: CUDA's
# `ggml_backend_cuda_buffer_set_tensor` copies on `cudaStreamPerThread` and waits for that stream only, not
# for the backend's. So a program must synchronize the backend (or an event recorded after the async work)
# before a blocking call touches memory the queue still uses, and ggml's scheduler does exactly that for
# the user's inputs (`ggml-backend.c:1788-1795`): it synchronizes the split's backend (or the event of
# that copy slot), then copies the input at once with the blocking `ggml_backend_tensor_copy`, so that the
# user cannot overwrite the data before the copy is done.
#
# </details>
