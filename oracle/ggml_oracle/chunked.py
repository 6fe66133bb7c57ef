"""The real ggml's chunked compute buffers: a buffer type with a `max_size`, and a plan read per chunk.

ggml 0.15.3 (the ggml that ggml-python 0.0.45 bundles) plans a compute buffer as a *virtual buffer*
of up to `GGML_VBUFFER_MAX_CHUNKS` = 16 backend buffers, the chunks (ggml-alloc.c:95-101, `struct
vbuffer` :397-399): a tensor's place is a `struct buffer_address {chunk, offset}` and a new chunk is
opened when no chunk has room, with a first free block of `MAX(min_size, max_chunk_size)` bytes and
the 16th chunk unbounded (`ggml_dyn_tallocr_new_chunk`, :159-177). The limit comes from the buffer
type: `ggml_gallocr_new_n` (:497-531) asks `ggml_backend_buft_get_max_size`, which is SIZE_MAX for
the CPU buffer type (its interface leaves `get_max_size` NULL), so the CPU buffer type always gives
one chunk. To see chunks through the C API this module builds a buffer type of its own:

* `max_size_buffer_type(max_size)`: a `struct ggml_backend_buffer_type` (ggml-backend-impl.h:31-35)
  whose `struct ggml_backend_buffer_type_i` (:17-29) is a copy of the CPU buffer type's
  (`ggml_backend_cpu_buffer_type`, ggml-backend.cpp:2328-2343) with `get_max_size` replaced by a
  ctypes callback returning `max_size`. Buffers it allocates are ordinary CPU buffers (the copied
  `alloc_buffer` is `ggml_backend_cpu_buffer_type_alloc_buffer`, ggml-backend.cpp:2305-2314) whose
  `buft` is this struct. ggml keeps the pointer in every buffer and allocator made from it, so the
  struct and its callback must outlive them: whoever makes an allocator holds the `MaxSizeBufferType`
  (`RealGAllocr` does), and the last `KEPT` values are cached besides (one object per value).
* `chunked_plan(...)`: mirror a ggml_lite graph (`mirror.mirror`), run `ggml_gallocr_new(that buft)`,
  `ggml_gallocr_reserve` and `ggml_gallocr_alloc_graph`, and read for every tensor its (chunk,
  offset). ggml has no accessor for the chunks, so they are read from the allocator's own structs:
  `struct ggml_gallocr` (:481-495) starts with `bufts`, `buffers` (`struct vbuffer **`) and
  `buf_tallocs` (`struct ggml_dyn_tallocr **`); `vbuffer.chunks[16]` are the backend buffers (NULL
  after the last); `struct ggml_dyn_tallocr` (:120-132, release build: no `allocated_tensors`) holds
  `alignment`, `max_chunk_size`, `chunks[16]` (`struct tallocr_chunk *`, :114-118: 256 free blocks,
  `n_free_blocks`, `max_size`) and `n_chunks`. The layout is checked on every read (`bufts[0]` is
  our buffer type, the alignment 32, `max_chunk_size` = MIN(max_size, SIZE_MAX/2)), and a tensor's
  chunk is the index of its `tensor->buffer` among `vbuffer.chunks`: `ggml_vbuffer_tensor_alloc`
  (:441-445) calls `ggml_backend_tensor_alloc(chunks[addr.chunk], tensor, base + addr.offset)`, and
  a view gets its source's buffer (`ggml_backend_view_init`). The offset is `tensor->data -
  ggml_backend_buffer_get_base(chunk)`. Chunk sizes are `ggml_backend_buffer_get_size` of each chunk
  (`ggml_vbuffer_chunk_size`, :411-413); their sum is `ggml_gallocr_get_buffer_size` (:1099-1115,
  `ggml_vbuffer_size`), checked too.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import ggml_lite as gl
from ggml_lite.trace import lifetimes, trace_plan

from .bindings import ALIGNMENT, need_ggml
from .mirror import Mirror, mirror

VBUFFER_MAX_CHUNKS = 16  # GGML_VBUFFER_MAX_CHUNKS, ggml-alloc.c:95
MAX_FREE_BLOCKS = 256  # ggml-alloc.c:14
SIZE_MAX = 2**64 - 1
UNLIMITED = SIZE_MAX  # what ggml_backend_buft_get_max_size returns for a buffer type without a limit

_fn = ctypes.c_void_p  # a C function pointer, as stored in the interface struct
_GET_MAX_SIZE = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p)


class BufferTypeI(ctypes.Structure):
    """`struct ggml_backend_buffer_type_i` (ggml 0.15.3, ggml-backend-impl.h:17-29)."""

    _fields_ = [("get_name", _fn), ("alloc_buffer", _fn), ("get_alignment", _fn), ("get_max_size", _fn),
                ("get_alloc_size", _fn), ("is_host", _fn)]


class BufferType(ctypes.Structure):
    """`struct ggml_backend_buffer_type` (ggml-backend-impl.h:31-35)."""

    _fields_ = [("iface", BufferTypeI), ("device", ctypes.c_void_p), ("context", ctypes.c_void_p)]


class _TallocrChunk(ctypes.Structure):
    """`struct tallocr_chunk` (ggml-alloc.c:114-118)."""

    _fields_ = [("free_blocks", ctypes.c_size_t * (2 * MAX_FREE_BLOCKS)), ("n_free_blocks", ctypes.c_int),
                ("max_size", ctypes.c_size_t)]


class _DynTallocr(ctypes.Structure):
    """`struct ggml_dyn_tallocr` of a release build (ggml-alloc.c:120-132, no GGML_ALLOCATOR_DEBUG)."""

    _fields_ = [("alignment", ctypes.c_size_t), ("max_chunk_size", ctypes.c_size_t),
                ("chunks", ctypes.POINTER(_TallocrChunk) * VBUFFER_MAX_CHUNKS), ("n_chunks", ctypes.c_int)]


class _GAllocrHead(ctypes.Structure):
    """The first fields of `struct ggml_gallocr` (ggml-alloc.c:481-485)."""

    _fields_ = [("bufts", ctypes.POINTER(ctypes.c_void_p)), ("buffers", ctypes.POINTER(ctypes.c_void_p)),
                ("buf_tallocs", ctypes.POINTER(ctypes.POINTER(_DynTallocr))), ("n_buffers", ctypes.c_int)]


@dataclass
class MaxSizeBufferType:
    """A CPU buffer type whose `get_max_size` returns `max_size`; `ptr` is its
    `ggml_backend_buffer_type_t` (an int), to pass to `ggml_gallocr_new`."""

    max_size: int
    struct: BufferType
    callback: object  # the ctypes callback the struct points to: must stay alive as long as the struct
    ptr: int = field(init=False)

    def __post_init__(self):
        self.ptr = ctypes.addressof(self.struct)


KEPT = 256  # buffer types cached, the most recent values (a sweep draws a new limit per plan)
_KEEP: dict[int, MaxSizeBufferType] = {}


def max_size_buffer_type(max_size: int) -> MaxSizeBufferType:
    """The CPU buffer type (`ggml_backend_cpu_buffer_type`) with `get_max_size` returning `max_size`
    (1 <= max_size <= SIZE_MAX); one object per value while it is among the last `KEPT` asked for
    (hold it as long as a ggml allocator or buffer made from it lives). ggml reads it through
    `ggml_backend_buft_get_max_size`; every other hook is the CPU buffer type's own."""
    if not 1 <= max_size <= SIZE_MAX:
        raise ValueError(f"max_size must be in [1, 2**64 - 1], got {max_size}")
    kept = _KEEP.get(max_size)
    if kept is not None:
        return kept
    g = need_ggml()
    cpu = BufferType.from_address(g.ggml_backend_cpu_buffer_type())
    if cpu.iface.get_max_size:
        raise RuntimeError("the CPU buffer type has a get_max_size of its own; ggml 0.15.3's has none")
    if not (cpu.iface.alloc_buffer and cpu.iface.get_alignment and cpu.iface.get_name):
        raise RuntimeError("the CPU buffer type's interface does not have the layout of ggml 0.15.3")
    struct = BufferType()
    ctypes.pointer(struct)[0] = cpu  # a copy of the whole struct: interface, device, context
    callback = _GET_MAX_SIZE(lambda buft: max_size)
    struct.iface.get_max_size = ctypes.cast(callback, ctypes.c_void_p).value
    buft = _KEEP[max_size] = MaxSizeBufferType(max_size, struct, callback)
    while len(_KEEP) > KEPT:  # the oldest value (a dict keeps insertion order)
        del _KEEP[next(iter(_KEEP))]
    if (g.ggml_backend_buft_get_max_size(buft.ptr) != max_size
            or g.ggml_backend_buft_get_alignment(buft.ptr) != ALIGNMENT
            or g.ggml_backend_buft_name(buft.ptr) != g.ggml_backend_buft_name(g.ggml_backend_cpu_buffer_type())):
        raise RuntimeError("the copied buffer type does not answer like the CPU one with a max_size")
    return buft


@dataclass
class GAllocrChunks:
    """What `struct ggml_gallocr` holds for buffer 0: the backend buffers of its `vbuffer` (`chunks`,
    addresses, in chunk order) and its `ggml_dyn_tallocr`'s `max_chunk_size` and chunk sizes."""

    chunks: list
    max_chunk_size: int
    planned_sizes: list
    sizes: list = field(default_factory=list)  # each chunk buffer's size (filled by `RealGAllocr.chunks`)


def gallocr_chunks(galloc: int, buft: MaxSizeBufferType) -> GAllocrChunks:
    """Read buffer 0 of a `ggml_gallocr_new(buft)` allocator: `galloc->buffers[0]->chunks[]` (`struct
    vbuffer`, ggml-alloc.c:397-399) and `galloc->buf_tallocs[0]` (`struct ggml_dyn_tallocr`), checking
    the layout against what is known (`bufts[0]`, the alignment, `max_chunk_size`)."""
    head = _GAllocrHead.from_address(galloc)
    if head.n_buffers != 1 or head.bufts[0] != buft.ptr:
        raise RuntimeError("struct ggml_gallocr does not have the layout of ggml 0.15.3 (bufts[0], n_buffers)")
    dyn = head.buf_tallocs[0].contents
    if dyn.alignment != ALIGNMENT or dyn.max_chunk_size != min(buft.max_size, SIZE_MAX // 2) \
            or not 0 <= dyn.n_chunks <= VBUFFER_MAX_CHUNKS:
        raise RuntimeError(f"struct ggml_dyn_tallocr does not have the layout of ggml 0.15.3: alignment "
                           f"{dyn.alignment}, max_chunk_size {dyn.max_chunk_size}, n_chunks {dyn.n_chunks}")
    planned = [int(dyn.chunks[c].contents.max_size) for c in range(dyn.n_chunks)]
    chunks: list = []
    vbuf = head.buffers[0]
    if vbuf:
        arr = (ctypes.c_void_p * VBUFFER_MAX_CHUNKS).from_address(vbuf)
        for p in arr:
            if not p:
                break
            chunks.append(int(p))
    return GAllocrChunks(chunks, int(dyn.max_chunk_size), planned)


class RealGAllocr:
    """One real `ggml_gallocr_new(max_size_buffer_type(max_size))`, kept open across calls so that a
    sequence of graphs can be planned on it as an application does (`free()` when done; also a context
    manager). Each call takes a `Mirror` (`mirror.mirror`) of the graph.

    * `reserve(m)`, `alloc_graph(m)`: `ggml_gallocr_reserve` / `ggml_gallocr_alloc_graph`; each returns
      the ok flag and notes in `replaced` whether the call reallocated the compute buffer (see below).
    * `reserve_n_size(m)`: `ggml_gallocr_reserve_n_size` (ggml-alloc.c:950-959), the dry run: the
      bytes buffer 0 would need, without allocating it.
    * `chunks()`: `gallocr_chunks` plus each chunk buffer's size (`ggml_backend_buffer_get_size`);
      `buffer_allocated()`: is `galloc->buffers[0]` (the `struct vbuffer`) there at all.
    * `placements(m)`: every mirrored tensor's (chunk, offset) in the compute buffer, None outside it.

    Whether a call reallocated: `ggml_gallocr_reserve_n_impl` (:824-948) frees the virtual buffer and
    allocates a new one when a chunk grew, and logs it only in a debug build (ggml-python's is a
    release build). A freed buffer's struct may come back at the same address, so addresses cannot
    tell. Instead every chunk buffer is marked before the call (`ggml_backend_buffer_set_usage(...,
    GGML_BACKEND_BUFFER_USAGE_ANY)`): `ggml_vbuffer_alloc` (:423-439) gives every new chunk
    `GGML_BACKEND_BUFFER_USAGE_COMPUTE`, so a chunk that does not carry the mark is a new one."""

    def __init__(self, max_size: int = UNLIMITED):
        self.g = need_ggml()
        self.buft = max_size_buffer_type(max_size)
        self.galloc = self.g.ggml_gallocr_new(self.buft.ptr)
        self.replaced: bool | None = None  # did the last call reallocate the compute buffer

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def free(self) -> None:
        if self.galloc:
            self.g.ggml_gallocr_free(self.galloc)
            self.galloc = None

    def _call(self, fn, m: Mirror) -> bool:
        had, before = self.buffer_allocated(), self.chunks().chunks
        for p in before:
            self.g.ggml_backend_buffer_set_usage(p, USAGE_ANY)
        ok = bool(fn(self.galloc, m.gf))
        after = self.chunks().chunks
        get_usage = buffer_get_usage()
        # (a virtual buffer of no chunks, for a graph with nothing in the compute buffer, is new when it was NULL)
        self.replaced = self.buffer_allocated() and (not had or len(after) != len(before)
                                                     or any(get_usage(p) != USAGE_ANY for p in after))
        for p in after:  # back to what ggml_vbuffer_alloc set
            self.g.ggml_backend_buffer_set_usage(p, USAGE_COMPUTE)
        return ok

    def reserve(self, m: Mirror) -> bool:
        """`ggml_gallocr_reserve`."""
        return self._call(self.g.ggml_gallocr_reserve, m)

    def alloc_graph(self, m: Mirror) -> bool:
        """`ggml_gallocr_alloc_graph`."""
        return self._call(self.g.ggml_gallocr_alloc_graph, m)

    def reserve_n_size(self, m: Mirror) -> int:
        """`ggml_gallocr_reserve_n_size(galloc, graph, NULL, NULL, sizes)`: sizes[0]."""
        sizes = (ctypes.c_size_t * 1)()
        self.g.ggml_gallocr_reserve_n_size(self.galloc, m.gf, None, None, sizes)
        self.replaced = None
        return int(sizes[0])

    def buffer_allocated(self) -> bool:
        """Does `galloc->buffers[0]` hold a virtual buffer (NULL before the first reserve and after a
        dry run that had to grow it)?"""
        return bool(_GAllocrHead.from_address(self.galloc).buffers[0])

    def chunks(self) -> GAllocrChunks:
        """`gallocr_chunks`, with `sizes`: each chunk buffer's `ggml_backend_buffer_get_size`."""
        info = gallocr_chunks(self.galloc, self.buft)
        info.sizes = [int(self.g.ggml_backend_buffer_get_size(p)) for p in info.chunks]
        return info

    def buffer_size(self) -> int:
        """`ggml_gallocr_get_buffer_size(galloc, 0)` (the sum of the chunk buffers' sizes)."""
        return int(self.g.ggml_gallocr_get_buffer_size(self.galloc, 0))

    def placements(self, m: Mirror) -> dict:
        """{ggml_lite tensor: (chunk, offset) in the compute buffer, or None} for every mirrored tensor."""
        chunks = self.chunks().chunks
        index = {p: c for c, p in enumerate(chunks)}
        bases = [self.g.ggml_backend_buffer_get_base(p) or 0 for p in chunks]
        out: dict[gl.Tensor, tuple[int, int] | None] = {}
        for t in m.tensors:
            c = m.ptr[t].contents
            chunk = index.get(c.buffer) if c.buffer else None
            out[t] = None if chunk is None or not c.data else (chunk, c.data - bases[chunk])
        return out


USAGE_ANY, USAGE_COMPUTE = 0, 2  # enum ggml_backend_buffer_usage (ggml-backend.h)


def buffer_get_usage():
    """`ggml_backend_buffer_get_usage` (exported by the library, not wrapped by ggml-python 0.0.45)."""
    fn = need_ggml().lib.ggml_backend_buffer_get_usage
    fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_int
    return fn


def snapshot(m: Mirror) -> list:
    """Every mirrored tensor's `data` and `buffer` now (before planning), for `restore`."""
    return [(m.ptr[t].contents, m.ptr[t].contents.data, m.ptr[t].contents.buffer) for t in m.tensors]


def restore(saved: list) -> None:
    """Put back what `snapshot` saw: the tensors a plan placed are unplaced, so the mirror can be
    planned again (by another allocator, with another max_size)."""
    for c, data, buffer in saved:
        c.data, c.buffer = data, buffer


def chunked_plan(graph_or_tensors, roots=None, preallocated=(), max_size: int = UNLIMITED,
                 graph_size: int | None = None, mirrored: Mirror | None = None) -> dict:
    """Plan a ggml_lite graph with the real ggml on `max_size_buffer_type(max_size)`: mirror it (or use
    `mirrored`, left open and, afterwards, as it was: `snapshot`/`restore`), `ggml_gallocr_new`,
    `ggml_gallocr_reserve`, `ggml_gallocr_alloc_graph`, read the chunks (`gallocr_chunks`), free the
    allocator, and return

    ``{"max_size": max_size,
       "chunk_sizes": [ggml_backend_buffer_get_size of each chunk],    # as ggml-python reports them
       "planned_chunk_sizes": [tallocr_chunk.max_size of each chunk],  # the dyn_tallocr's plan
       "buffer_size": ggml_gallocr_get_buffer_size(galloc, 0),        # == sum(chunk_sizes)
       "placements": {ggml_lite tensor: (chunk, offset), or None when not in the compute buffer},
       "reserve_ok": bool, "alloc_ok": bool}``

    for every tensor the mirror holds. ggml-python's CPU buffers report the size asked for, so each
    chunk is 32 bytes smaller than the 2024 reference CPU buffer type's would be
    (`CPU_BUFFER_SIZE_DELTA`)."""
    m = mirrored or mirror(graph_or_tensors, roots, preallocated, graph_size)
    saved = snapshot(m) if mirrored is not None else []
    try:
        with RealGAllocr(max_size) as real:
            reserve_ok = real.reserve(m)
            alloc_ok = real.alloc_graph(m) if reserve_ok else False
            size = real.buffer_size()
            info = real.chunks()
            if reserve_ok and sum(info.sizes) != size:
                raise RuntimeError(f"chunk sizes {info.sizes} do not add up to ggml_gallocr_get_buffer_size {size}")
            return {"max_size": max_size, "chunk_sizes": info.sizes, "planned_chunk_sizes": info.planned_sizes,
                    "buffer_size": size, "placements": real.placements(m), "reserve_ok": reserve_ok,
                    "alloc_ok": alloc_ok}
    finally:
        if mirrored is None:
            m.close()
        else:
            restore(saved)


def aligned_size(t) -> int:
    """The bytes the allocator reserves for `t`: `ggml_nbytes` rounded up to the alignment (what
    `ggml_dyn_tallocr_alloc` does first, ggml-alloc.c:202)."""
    n = gl.nbytes(t)
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def chunk_rule_violations(plan: dict) -> list:
    """Where `plan` (a `chunked_plan`) breaks the chunk rules of `ggml_dyn_tallocr_new_chunk`
    (ggml-alloc.c:159-177), as messages (empty: none): at most 16 chunks; every tensor inside its
    chunk; a chunk other than the 16th no larger than MAX(max_size, its largest tensor) (a chunk opens
    with one free block of MAX(size of the tensor that opened it, max_chunk_size) bytes)."""
    out = []
    sizes = plan["chunk_sizes"]
    if len(sizes) > VBUFFER_MAX_CHUNKS:
        out.append(f"{len(sizes)} chunks, more than GGML_VBUFFER_MAX_CHUNKS = {VBUFFER_MAX_CHUNKS}")
    largest = [0] * len(sizes)
    for t, where in plan["placements"].items():
        if where is None:
            continue
        c, off = where
        end = off + gl.nbytes(t)
        if off < 0 or end > sizes[c]:
            out.append(f"tensor {t.name!r} at chunk {c} [{off}, {end}) outside the chunk's {sizes[c]} B")
        if t.view_src is None:
            largest[c] = max(largest[c], aligned_size(t))
    for c, size in enumerate(sizes):
        if c < VBUFFER_MAX_CHUNKS - 1 and size > max(plan["max_size"], largest[c]):
            out.append(f"chunk {c} has {size} B, more than max_size {plan['max_size']} and its largest "
                       f"tensor {largest[c]} B")
    return out


def overlaps(plan: dict, graph) -> list:
    """Tensors of `plan` (a `chunked_plan` of `graph`) that share bytes of one chunk while both are
    live, as messages (empty: none). Liveness is ggml_lite's (`ggml_lite.trace.lifetimes` of a traced
    2024 plan: from the node where a tensor is placed to the node where it is freed or handed to an
    in-place child, views left out): which node frees or takes over which tensor depends on the graph
    and the in-place rules, not on where tensors are placed, so it holds for a chunked plan too. The
    bytes are the tensor's own (`ggml_nbytes`): an in-place child holds only its own size, the
    parent's tail being freed by `ggml_gallocr_free_extra_space` (ggml-alloc.c:599-620)."""
    galloc, events = trace_plan(graph)
    try:
        lts = [lt for lt in lifetimes(graph, events) if lt.kind == "tensor" and not lt.superseded]
    finally:
        galloc.free()
    spans = []
    for lt in lts:
        where = plan["placements"].get(lt.tensor)
        if where is None:
            continue
        end = lt.end if lt.handed_at is None else min(lt.end, lt.handed_at - 1)
        if end < lt.start:
            continue
        spans.append((where[0], where[1], where[1] + gl.nbytes(lt.tensor), lt.start, end, lt.tensor))
    out = []
    spans.sort(key=lambda s: (s[0], s[1]))
    for i, (c, lo, hi, s0, e0, t) in enumerate(spans):
        for c2, lo2, hi2, s1, e1, u in spans[i + 1:]:
            if c2 != c or lo2 >= hi:
                break
            if lo2 < hi and lo < hi2 and s0 <= e1 and s1 <= e0 and hi > lo and hi2 > lo2:
                out.append(f"{t.name!r} [{lo}, {hi}) nodes {s0}-{e0} and {u.name!r} [{lo2}, {hi2}) nodes "
                           f"{s1}-{e1} overlap in chunk {c}")
    return out


def op_can_inplace_table() -> dict:
    """{op name: `ggml_op_can_inplace(op)`} for every `enum ggml_op` value below GGML_OP_COUNT, from the
    library itself: ggml 0.15.3 exports the function (GGML_API in ggml-impl.h, ggml-alloc.c:22-50),
    which ggml-python does not wrap; each code is named by `ggml_op_name`."""
    g = need_ggml()
    fn = g.lib.ggml_op_can_inplace
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_bool
    return {g.ggml_op_name(code).decode(): bool(fn(code)) for code in range(g.GGML_OP_COUNT)}


_LOG_CALLBACK: list = []  # the ctypes callback ggml holds while a capture runs (kept alive here)


@contextmanager
def captured_ggml_log() -> Iterator[list]:
    """Collect the lines the real ggml logs (every level, through `ggml_log_set`) inside the block, as
    a list of strings without their newlines; ggml's default logger (stderr) is put back afterwards."""
    g = need_ggml()
    pieces: list[str] = []
    lines: list[str] = []
    callback = g.ggml_log_callback(lambda level, text, user_data: pieces.append(text.decode(errors="replace")))
    _LOG_CALLBACK.append(callback)
    g.ggml_log_set(callback, None)
    try:
        yield lines
    finally:
        g.ggml_log_set(g.ggml_log_callback(), None)  # NULL: ggml_log_callback_default again
        _LOG_CALLBACK.remove(callback)
        text = "".join(pieces)
        lines.extend(text[:-1].split("\n") if text.endswith("\n") else text.split("\n") if text else [])
