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
# # 03 · Buffers and the linear allocator `tallocr`
#
# A tensor gets memory in two steps: a **buffer type** hands out a **buffer** (one block of memory
# on some device), and an allocator decides where in that buffer each tensor goes. This chapter
# ports the buffer layer of `ggml-backend.c` (buffer types, buffers, the CPU buffer type,
# multi-buffers) and the simplest allocator of `ggml-alloc.c`, the linear `ggml_tallocr`, with its
# main user `ggml_backend_alloc_ctx_tensors` — how llama.cpp places model weights.
#
# **Learning goals**
#
# 1. Buffer type vs buffer: the type knows the rules (alignment, maximum size, how many bytes a
#    tensor needs, host or device); the buffer is one allocation with a base address and a size.
# 2. The CPU buffer type's exact arithmetic: it mallocs `size + 32` bytes, reports that as the
#    buffer size, and aligns the base — the "+32" every compute-buffer size in the fixtures shows.
# 3. Placing a tensor means setting `tensor.buffer` and `tensor.data` (an address); views get
#    `view_src.data + view_offs`. Host memory is real here: numpy views read and write the bytes.
# 4. `alloc_ctx_tensors` packs a context's tensors back to back, and splits them over several buffers
#    (joined as a multi-buffer) when the buffer type has a maximum size.
#
# Exported: `ggml_lite.heap` (the simulated address space), `ggml_lite.buffer`, `ggml_lite.tallocr`.

# %% [markdown]
# ## 1 · Addresses, not Python objects
#
# ggml works with pointers. This port keeps them as integers in a simulated address space: a
# small `malloc` hands out addresses 16-byte aligned, as glibc does, so a buffer's memory is *not*
# necessarily 32-byte aligned — exactly the situation the CPU buffer type's extra 32 bytes exist
# for. A buffer's bytes (for host buffers: a numpy `uint8` array) are only created when someone
# reads or writes them, so planning a 70B model allocates nothing.

# %%
# | default_exp buffer

# %%
# | export heap
"""The simulated address space: a `malloc`/`free` that hands out addresses as glibc does (chapter 03).
Every buffer's memory and every `struct ggml_backend_buffer` gets its address here."""

from ggml_lite.align import GGML_PAD


class AddressSpace:
    """A simulated `malloc`/`free`: 16-byte aligned addresses (like glibc) with a 16-byte header
    before each block. Nothing is stored here; it only hands out addresses.

    Like glibc's per-thread cache, a freed *small* chunk (≤ 1,032 bytes) is handed out again, last
    freed first, to the next request of the same padded size; large chunks are never reused here.
    This matters for one observable fact: freeing a buffer and allocating a new one usually gives
    the new `struct ggml_backend_buffer` the old one's address (see `Buffer.handle`)."""

    SMALL = 1032

    def __init__(self, start: int = 0x7F0000000000):
        self.next = start
        self.cache: dict[int, list[int]] = {}  # padded size -> addresses of freed small chunks (LIFO)

    def malloc(self, size: int) -> int:
        padded = GGML_PAD(max(size, 1), 16)
        reuse = self.cache.get(padded)
        if reuse:
            return reuse.pop()
        addr = self.next + 16  # the allocator's header precedes the block
        self.next = addr + padded
        return addr

    def free(self, addr: int, size: int) -> None:
        padded = GGML_PAD(max(size, 1), 16)
        if padded <= self.SMALL:
            self.cache.setdefault(padded, []).append(addr)


HEAP = AddressSpace()  # the one address space of the process


# %% [markdown]
# The buffer module itself starts with the constants and the usage enum of `ggml-backend.h`, and the
# size of the C's `struct ggml_backend_buffer`, which gets an address of its own from `HEAP`.

# %%
# | export
"""Buffer types and buffers (ggml-backend.c): `ggml_backend_buft_*`, `ggml_backend_buffer_*`, the CPU
buffer type, multi-buffers, `ggml_backend_tensor_alloc` / `ggml_backend_view_init`, and numpy views
of allocated tensors. Addresses are integers in a simulated address space; bytes are created lazily."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ggml_lite.align import GGML_PAD
from ggml_lite.bind import method_of
from ggml_lite.errors import (
    AlignmentError,
    BufferFreedError,
    BufferStateError,
    TensorAlreadyAllocatedError,
    TensorBoundsError,
    TensorNotAllocatedError,
)
from ggml_lite.heap import HEAP
from ggml_lite.tensor import F16, F32, I32, Q4_0, Q8_0, TYPES, Tensor, describe, nbytes

log = logging.getLogger("ggml_lite")

SIZE_MAX = 2**64 - 1  # `SIZE_MAX` of a 64-bit C: the largest size_t (every later module uses this one)
TENSOR_ALIGNMENT = 32  # ggml-backend.c: "required for mmap as gguf only guarantees 32-byte alignment"


class BufferUsage(enum.IntEnum):
    """`enum ggml_backend_buffer_usage`."""

    ANY = 0
    WEIGHTS = 1
    COMPUTE = 2


# sizeof(struct ggml_backend_buffer) on x86-64: 9 interface pointers, buft, context, size, usage
BUFFER_STRUCT_SIZE = 104


# %% [markdown]
# ## 2 · Buffer types
#
# `struct ggml_backend_buffer_type` is an interface: `get_name`, `alloc_buffer`, `get_alignment`,
# optional `get_max_size` (default `SIZE_MAX`), optional `get_alloc_size` (default `ggml_nbytes`;
# a device may need padding), `is_host`. Here a buffer type is a small class holding what those
# entries return; `alloc_size` may be a function of the tensor (a device that pads tensors).

# %%
# | export
class BufferType:
    """`struct ggml_backend_buffer_type`; the `ggml_backend_buft_*` functions are attached below.

    `max_size=None` means `SIZE_MAX`; `alloc_size=None` means `ggml_nbytes`. The base class allocates
    plain buffers whose base is aligned to `alignment`; the CPU buffer type overrides the arithmetic."""

    def __init__(self, name: str, alignment: int, max_size: int | None = None, is_host: bool = False,
                 alloc_size: Callable[[Tensor], int] | None = None):
        if alignment <= 0 or alignment & (alignment - 1):
            raise AlignmentError(f"buffer type {name}: alignment {alignment} is not a power of two")
        self.name = name
        self.alignment = alignment
        self.max_size = SIZE_MAX if max_size is None else max_size
        self.host = is_host
        self._alloc_size = alloc_size

    def __repr__(self):
        return f"BufferType({self.name!r}, alignment={self.alignment}, host={self.host})"


# %% [markdown]
# The free functions `ggml_backend_buft_*` (ggml-backend.c:17-54) only forward to the interface,
# filling in the defaults of the optional entries:
#
# ```c
# size_t ggml_backend_buft_get_max_size(ggml_backend_buffer_type_t buft) {
#     // get_max_size is optional, defaults to SIZE_MAX
#     if (buft->iface.get_max_size) { return buft->iface.get_max_size(buft); }
#     return SIZE_MAX;
# }
# ```
#
# Buffers have functions of the same names (`ggml_backend_buffer_get_alignment`, ...), so in this
# module each function keeps its object word (`buft_get_alignment`) and is attached under the short
# name (`buft.get_alignment()`). What to notice: `get_alloc_size` may only *add* bytes; the C asserts
# `size >= ggml_nbytes(tensor)` and so does the port, naming the tensor.

# %%
# | export
@method_of(BufferType, "get_name")
def buft_name(buft) -> str:
    """`ggml_backend_buft_name`."""
    return buft.name


@method_of(BufferType, "alloc_buffer")
def buft_alloc_buffer(buft, size: int) -> Buffer:
    """`ggml_backend_buft_alloc_buffer`."""
    buf = Buffer(buft, size, HEAP.malloc(size + buft.alignment), base_alignment=buft.alignment)
    buf.malloc_size = size + buft.alignment
    return buf


@method_of(BufferType, "get_alignment")
def buft_get_alignment(buft) -> int:
    """`ggml_backend_buft_get_alignment`."""
    return buft.alignment


@method_of(BufferType, "get_max_size")
def buft_get_max_size(buft) -> int:
    """`ggml_backend_buft_get_max_size` (`SIZE_MAX` unless the type sets one)."""
    return buft.max_size


@method_of(BufferType, "get_alloc_size")
def buft_get_alloc_size(buft, tensor: Tensor) -> int:
    """`ggml_backend_buft_get_alloc_size`: bytes the tensor needs here (default `ggml_nbytes`)."""
    if buft._alloc_size is None:
        return nbytes(tensor)
    size = buft._alloc_size(tensor)
    if size < nbytes(tensor):
        raise BufferStateError(f"buffer type {buft.name}: alloc_size {size} of {describe(tensor)} "
                               f"is below its nbytes {nbytes(tensor)}")
    return size


@method_of(BufferType, "alloc_size_fn")
def buft_alloc_size_fn(buft) -> Callable[[Tensor], int]:
    """`get_alloc_size` as one callable for hot loops: `ggml_nbytes` itself when the type has no
    `get_alloc_size` of its own (the C's NULL interface entry), else the bound method."""
    if buft._alloc_size is None and type(buft).get_alloc_size is buft_get_alloc_size \
            and "get_alloc_size" not in vars(buft):
        return nbytes
    return buft.get_alloc_size


@method_of(BufferType, "is_host")
def buft_is_host(buft) -> bool:
    """`ggml_backend_buft_is_host`: is the memory directly readable by the CPU?"""
    return buft.host


# %% [markdown]
# The CPU buffer type is the one every chapter uses. Its allocation adds the alignment to the size
# before it mallocs, because malloc may return an address that is not 32-byte aligned, and the buffer
# keeps that larger size (`ggml_backend_cpu_buffer_type_alloc_buffer`, ggml-backend.c:629-638; ggml's own
# comments left out):
#
# ```c
# size += TENSOR_ALIGNMENT;
# void * data = malloc(size);
# ...
# return ggml_backend_buffer_init(buft, cpu_backend_buffer_i, data, size);
# ```

# %%
# | export
class CPUBufferType(BufferType):
    """`ggml_backend_cpu_buffer_type()`: name "CPU", alignment `TENSOR_ALIGNMENT` (32), host memory,
    no maximum size, alloc size = nbytes (`ggml_backend_cpu_buffer_type_get_name`,
    `ggml_backend_cpu_buffer_type_get_alignment`, `ggml_backend_cpu_buffer_type_is_host`)."""

    def __init__(self):
        super().__init__("CPU", TENSOR_ALIGNMENT, None, True)


@method_of(CPUBufferType, "alloc_buffer")
def cpu_buffer_type_alloc_buffer(buft, size: int) -> Buffer:
    """`ggml_backend_cpu_buffer_type_alloc_buffer`: `size += TENSOR_ALIGNMENT` ("malloc may return
    an address that is not aligned"), malloc, and that larger size becomes the buffer's size."""
    size += TENSOR_ALIGNMENT
    return CPUBuffer(buft, size, HEAP.malloc(size))


_CPU_BUFT = CPUBufferType()


def cpu_buffer_type() -> CPUBufferType:
    """`ggml_backend_cpu_buffer_type`: the one CPU buffer type."""
    return _CPU_BUFT


# %% [markdown]
# ## 3 · Buffers
#
# `struct ggml_backend_buffer` is `{iface, buft, context, size, usage}`
# (`ggml_backend_buffer_init`, ggml-backend.c:56-72). The CPU buffer's context is the malloc'ed pointer; its base is that pointer
# rounded up to 32 (`ggml_backend_cpu_buffer_get_base`, ggml-backend.c:557-566):
#
# ```c
# uintptr_t data = (uintptr_t)buffer->context;
# if (data % TENSOR_ALIGNMENT != 0) data = GGML_PAD(data, TENSOR_ALIGNMENT);
# ```
#
# So a CPU buffer asked for `n` bytes reports `n + 32`, and at most 31 of the extra bytes are lost to
# aligning the base — the rest is slack at the end. `usage` tells the scheduler which buffers hold
# weights (chapter 09).

# %%
# | export
class Buffer:
    """`struct ggml_backend_buffer` (`ggml_backend_buffer_init`); the `ggml_backend_buffer_*` functions
    are attached below. `data` is the address of its memory; its bytes (`memory()`) are created on
    first access. `base_alignment` aligns the base like the CPU buffer does (None: base = data)."""

    def __init__(self, buft: BufferType, size: int, data: int, base_alignment: int | None = None,
                 name: str | None = None, memory: np.ndarray | None = None, owns_memory: bool = True):
        self.buft = buft
        self.size = size
        self.usage = BufferUsage.ANY
        self.data = data
        self._base = data if not base_alignment else GGML_PAD(data, base_alignment)
        self._name = name
        self._mem = memory
        self.owns_memory = owns_memory
        self.freed = False
        # the address of the C's `struct ggml_backend_buffer` (`ggml_backend_buffer_init` mallocs it):
        # what a C caller compares when it asks "is this still the same buffer?"
        self.handle = HEAP.malloc(BUFFER_STRUCT_SIZE)
        self.malloc_size = size  # bytes malloc'ed at `data` (freed with the buffer when owned)

    def __repr__(self):
        state = " freed" if self.freed else ""
        return f"Buffer({self.get_name()!r}, size={self.size}, usage={self.usage.name}{state})"


# %% [markdown]
# Its identity and geometry. Most `ggml_backend_buffer_*` functions ask the buffer's type
# (`ggml_backend_buffer_get_alignment(buffer)` is `ggml_backend_buft_get_alignment(buffer->buft)`).
# One is worth reading, because it is how a multi-buffer (below) passes its usage on to its parts
# (`ggml_backend_buffer_set_usage`, ggml-backend.c:128-135; ggml's comment left out):
#
# ```c
# buffer->usage = usage;
# if (ggml_backend_buffer_is_multi_buffer(buffer)) {
#     ggml_backend_multi_buffer_set_usage(buffer, usage);
# }
# ```

# %%
# | export
@method_of(Buffer, "get_name")
def buffer_name(buffer) -> str:
    """`ggml_backend_buffer_name`."""
    return buffer._name or buffer.buft.get_name()


@method_of(Buffer, "get_size")
def buffer_get_size(buffer) -> int:
    """`ggml_backend_buffer_get_size`."""
    return buffer.size


@method_of(Buffer, "get_base")
def buffer_get_base(buffer) -> int:
    """`ggml_backend_buffer_get_base`: the address of the first usable byte."""
    if buffer.freed:
        buffer._alive()  # raises
    return buffer._base


@method_of(Buffer, "get_type")
def buffer_get_type(buffer) -> BufferType:
    """`ggml_backend_buffer_get_type`."""
    return buffer.buft


@method_of(Buffer, "get_alignment")
def buffer_get_alignment(buffer) -> int:
    """`ggml_backend_buffer_get_alignment`."""
    return buffer.buft.get_alignment()


@method_of(Buffer, "get_max_size")
def buffer_get_max_size(buffer) -> int:
    """`ggml_backend_buffer_get_max_size`."""
    return buffer.buft.get_max_size()


@method_of(Buffer, "get_alloc_size")
def buffer_get_alloc_size(buffer, tensor: Tensor) -> int:
    """`ggml_backend_buffer_get_alloc_size`."""
    return buffer.buft.get_alloc_size(tensor)


@method_of(Buffer, "is_host")
def buffer_is_host(buffer) -> bool:
    """`ggml_backend_buffer_is_host`."""
    return buffer.buft.is_host()


@method_of(Buffer, "is_multi_buffer")
def buffer_is_multi_buffer(buffer) -> bool:
    """`ggml_backend_buffer_is_multi_buffer` (the C compares the interface's `get_name` with the
    multi-buffer's; here, the class)."""
    return isinstance(buffer, MultiBuffer)


@method_of(Buffer, "set_usage")
def buffer_set_usage(buffer, usage: BufferUsage) -> None:
    """`ggml_backend_buffer_set_usage` (a multi-buffer passes it on to its parts)."""
    buffer.usage = BufferUsage(usage)
    if buffer.is_multi_buffer():
        multi_buffer_set_usage(buffer, usage)


@method_of(Buffer, "get_usage")
def buffer_get_usage(buffer) -> BufferUsage:
    """`ggml_backend_buffer_get_usage`."""
    return buffer.usage


# %% [markdown]
# A buffer's lifetime: `ggml_backend_buffer_free` (once: a second free is an error here, a crash in
# the C), `ggml_backend_buffer_init_tensor` and `ggml_backend_buffer_reset` (nothing to do for host
# memory). What to notice: freeing gives back two blocks, the memory and the struct, so the next
# buffer allocated often gets the old struct's address, as the C's does.

# %%
# | export
@method_of(Buffer, "free")
def buffer_free(buffer) -> None:
    """`ggml_backend_buffer_free` (`ggml_backend_cpu_buffer_free_buffer`): the buffer and its
    bytes are gone; using it again, or freeing it twice, raises `BufferFreedError`."""
    buffer._alive()
    buffer.freed = True
    buffer._mem = None
    if buffer.owns_memory:
        HEAP.free(buffer.data, buffer.malloc_size)  # the type's free_buffer: `free(buffer->context)`
    HEAP.free(buffer.handle, BUFFER_STRUCT_SIZE)  # then `free(buffer)`


@method_of(Buffer, "_alive")
def _buffer_alive(buffer) -> None:
    if buffer.freed:
        raise BufferFreedError(f"buffer {buffer.get_name()} of {buffer.size} bytes was freed")


@method_of(Buffer, "init_tensor")
def buffer_init_tensor(buffer, tensor: Tensor) -> None:
    """`ggml_backend_buffer_init_tensor`: optional per-tensor setup (none for CPU buffers)."""


@method_of(Buffer, "reset")
def buffer_reset(buffer) -> None:
    """`ggml_backend_buffer_reset`: optional (no-op for CPU buffers)."""


# %% [markdown]
# Its bytes: `ggml_backend_buffer_clear` and the CPU buffer's `set_tensor`, `get_tensor` and
# `cpy_tensor` (ggml-backend.c:572-596), which in C are one `memcpy` each. The numpy array behind the
# buffer is made on first access (`memory`), so planning a large model allocates nothing. What to
# notice: in C these copy without a check (`ggml_backend_tensor_set` checked the range before calling
# them); here the buffer's functions check the range against the tensor and the buffer themselves,
# and `cpy_tensor` declines (False) a source that is not host memory, as in C.

# %%
# | export
@method_of(Buffer, "_extent")
def _buffer_extent(buffer) -> int:
    """Bytes from `data` to the end of the buffer: `size`, plus the padding before an aligned base
    (a buffer type that aligns the base of a `size`-byte buffer malloc'ed `size + alignment` bytes)."""
    return buffer.size + (buffer._base - buffer.data)


@method_of(Buffer, "memory")
def buffer_memory(buffer) -> np.ndarray:
    """The buffer's bytes from `data` to `base + size`, created (zeroed) on first use."""
    buffer._alive()
    if buffer._mem is None:
        buffer._mem = np.zeros(buffer._extent(), dtype=np.uint8)
    return buffer._mem


@method_of(Buffer, "span")
def buffer_span(buffer, addr: int, n: int, what: str = "access") -> np.ndarray:
    """The `n` bytes at address `addr`, which must lie inside the buffer."""
    lo, extent = addr - buffer.data, buffer._extent()
    if lo < 0 or lo + n > extent:
        raise TensorBoundsError(f"{what} of {n} bytes at address {addr:#x} is outside buffer {buffer.get_name()} "
                                f"[{buffer.data:#x}, {buffer.data + extent:#x})")
    return buffer.memory()[lo:lo + n]


@method_of(Buffer, "clear")
def buffer_clear(buffer, value: int) -> None:
    """`ggml_backend_buffer_clear` (`ggml_backend_cpu_buffer_clear`): set every byte to `value`."""
    buffer.memory()[:] = value


@method_of(Buffer, "set_tensor")
def buffer_set_tensor(buffer, tensor: Tensor, data, offset: int, size: int) -> None:
    """`ggml_backend_cpu_buffer_set_tensor`: copy `size` bytes of `data` to `tensor.data + offset`."""
    src = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    addr = _tensor_range(tensor, offset, size, "write")
    if src.size < size:
        raise TensorBoundsError(f"write to {describe(tensor)}: {size} bytes asked, only {src.size} given")
    buffer.span(addr, size, "write")[:] = src[:size]


@method_of(Buffer, "get_tensor")
def buffer_get_tensor(buffer, tensor: Tensor, offset: int, size: int) -> bytes:
    """`ggml_backend_cpu_buffer_get_tensor`: `size` bytes from `tensor.data + offset`."""
    return buffer.span(_tensor_range(tensor, offset, size, "read"), size, "read").tobytes()


@method_of(Buffer, "cpy_tensor")
def buffer_cpy_tensor(buffer, src: Tensor, dst: Tensor) -> bool:
    """`ggml_backend_cpu_buffer_cpy_tensor`: copy when the source is host memory, else decline (False)."""
    if not _buffer_of(src).is_host():
        return False
    n = nbytes(src)
    _buffer_of(dst).span(_address_of(dst), n, "copy")[:] = _buffer_of(src).span(_address_of(src), n, "copy")
    return True


# %% [markdown]
# A CPU buffer is a buffer whose base is its malloc'ed address rounded up to 32
# (`ggml_backend_cpu_buffer_get_base`, ggml-backend.c:557-566) and whose name is "CPU". It can also
# wrap memory that already exists (`ggml_backend_cpu_buffer_from_ptr`, ggml-backend.c:933-936), as
# llama.cpp wraps a model file it has mmap'ed. What to notice: such a buffer does not own its
# bytes, so freeing it leaves them alone, and the pointer must already be 32-byte aligned.

# %%
# | export
class CPUBuffer(Buffer):
    """A buffer of the CPU buffer type: base aligned to 32 (`ggml_backend_cpu_buffer_get_base`),
    named "CPU" (`ggml_backend_cpu_buffer_name`)."""

    def __init__(self, buft, size, data, memory=None, owns_memory=True):
        super().__init__(buft, size, data, TENSOR_ALIGNMENT, "CPU", memory, owns_memory)


def cpu_buffer_from_ptr(memory: np.ndarray, size: int | None = None, address: int | None = None) -> CPUBuffer:
    """`ggml_backend_cpu_buffer_from_ptr`: a CPU buffer over memory that already exists (a numpy array
    whose bytes are used in place, as llama.cpp wraps an mmap'ed model file). `address` is where that
    memory is in the simulated address space (a fresh aligned address when omitted); it must be
    32-byte aligned. Freeing the buffer does not free the memory."""
    mem = (memory.reshape(-1).view(np.uint8) if isinstance(memory, np.ndarray)
           else np.frombuffer(memoryview(memory).cast("B"), dtype=np.uint8))
    size = mem.size if size is None else size
    if address is None:
        address = GGML_PAD(HEAP.malloc(size + TENSOR_ALIGNMENT), TENSOR_ALIGNMENT)
    if address % TENSOR_ALIGNMENT:
        raise AlignmentError(f"buffer pointer {address:#x} must be {TENSOR_ALIGNMENT}-byte aligned")
    return CPUBuffer(_CPU_BUFT, size, address, memory=mem[:size], owns_memory=False)


# %% [markdown]
# ### Multi-buffers
#
# When a buffer type has a maximum size (a GPU that cannot allocate more than 4 GiB at once, say),
# `alloc_ctx_tensors` makes several buffers and joins them into one **multi-buffer**
# (ggml-backend.c:947-1032): its size is the sum, its name the first part's, `free` and `clear`
# reach every part, and — the reason it exists — `set_usage(WEIGHTS)` marks every part, so the
# scheduler recognizes the weights whichever part they are in. Its interface has NULL for
# `get_base`, `set_tensor`, `get_tensor` and `cpy_tensor`: tensors always point at their part.
#
# ```c
# static struct ggml_backend_buffer_i multi_backend_buffer_i = {
#     /* .get_name        = */ ggml_backend_multi_buffer_get_name,
#     /* .free_buffer     = */ ggml_backend_multi_buffer_free_buffer,
#     /* .get_base        = */ NULL,
# ```

# %%
# | export
class MultiBuffer(Buffer):
    """`ggml_backend_multi_buffer_alloc_buffer`: several buffers seen as one; the
    `ggml_backend_multi_buffer_*` functions are attached below."""

    def __init__(self, buffers: list[Buffer]):
        if not buffers:
            raise BufferStateError("a multi-buffer needs at least one buffer")
        self.buffers = list(buffers)
        super().__init__(buffers[0].buft, sum(b.get_size() for b in buffers), 0)


def multi_buffer_alloc_buffer(buffers: list[Buffer]) -> MultiBuffer:
    """`ggml_backend_multi_buffer_alloc_buffer`."""
    return MultiBuffer(buffers)


def multi_buffer_set_usage(buffer: MultiBuffer, usage: BufferUsage) -> None:
    """`ggml_backend_multi_buffer_set_usage`: every part gets the usage."""
    for b in buffer.buffers:
        b.set_usage(usage)


# %% [markdown]
# Its interface: the entries ggml fills (`ggml_backend_multi_buffer_get_name`, `_free_buffer`,
# `_clear`, ggml-backend.c:954-975) reach every part; the NULL entries become errors that say where the
# tensor's bytes really are, and `cpy_tensor` declines as `ggml_backend_buffer_copy_tensor` does when
# the entry is NULL.

# %%
# | export
@method_of(MultiBuffer, "get_name")
def multi_buffer_get_name(buffer) -> str:
    """`ggml_backend_multi_buffer_get_name`: the first part's name."""
    return buffer.buffers[0].get_name()


@method_of(MultiBuffer, "free")
def multi_buffer_free_buffer(buffer) -> None:
    """`ggml_backend_multi_buffer_free_buffer`: free every part, then the multi-buffer itself."""
    buffer._alive()
    for b in buffer.buffers:
        b.free()
    buffer.freed = True
    HEAP.free(buffer.handle, BUFFER_STRUCT_SIZE)


@method_of(MultiBuffer, "clear")
def multi_buffer_clear(buffer, value: int) -> None:
    """`ggml_backend_multi_buffer_clear`: clear every part."""
    buffer._alive()
    for b in buffer.buffers:
        b.clear(value)


@method_of(MultiBuffer, "get_base")
def multi_buffer_get_base(buffer) -> int:
    """No `get_base` (NULL in the multi-buffer's interface): an error naming the parts."""
    raise BufferStateError(f"multi-buffer {buffer.get_name()} has no base address: its tensors live in its "
                           f"{len(buffer.buffers)} parts")


@method_of(MultiBuffer, "memory")
def multi_buffer_memory(buffer) -> np.ndarray:
    """No memory of its own: an error."""
    raise BufferStateError(f"multi-buffer {buffer.get_name()} has no memory of its own; use its parts")


@method_of(MultiBuffer, "set_tensor")
def multi_buffer_set_tensor(buffer, tensor: Tensor, data, offset: int, size: int) -> None:
    """No `set_tensor` (NULL): an error naming the tensor."""
    raise BufferStateError(f"multi-buffer {buffer.get_name()}: set {describe(tensor)} through the part that holds it")


@method_of(MultiBuffer, "get_tensor")
def multi_buffer_get_tensor(buffer, tensor: Tensor, offset: int, size: int) -> bytes:
    """No `get_tensor` (NULL): an error naming the tensor."""
    raise BufferStateError(f"multi-buffer {buffer.get_name()}: get {describe(tensor)} through the part that holds it")


@method_of(MultiBuffer, "cpy_tensor")
def multi_buffer_cpy_tensor(buffer, src: Tensor, dst: Tensor) -> bool:
    """No `cpy_tensor` (NULL): declined, as `ggml_backend_buffer_copy_tensor` does."""
    return False


# %% [markdown]
# ## 4 · Placing tensors
#
# `ggml_backend_tensor_alloc` (ggml-backend.c:2073-2084) gives a tensor its buffer and address after
# checking that it has none yet, is not a view, and fits; `ggml_backend_view_init` (ggml-backend.c:2062-2071)
# gives a view its root's buffer and `view_src.data + view_offs`. Each C `GGML_ASSERT` becomes an
# error that names the tensor.

# %%
# | export
def _buffer_of(t: Tensor) -> Buffer:
    buf = t.view_src.buffer if t.view_src is not None else t.buffer
    if buf is None or t.data is None:
        raise TensorNotAllocatedError(f"{describe(t)} has no memory yet (data is NULL)")
    return buf


def _address_of(t: Tensor) -> int:
    """`t.data`, which must be set."""
    if t.data is None:
        raise TensorNotAllocatedError(f"{describe(t)} has no memory yet (data is NULL)")
    return t.data


def _tensor_range(t: Tensor, offset: int, size: int, what: str) -> int:
    """The address of byte `offset` of `t`, once `[offset, offset + size)` is checked to lie in `t`."""
    if t.data is None:
        raise TensorNotAllocatedError(f"cannot {what} {describe(t)}: the tensor has no memory yet")
    if offset < 0 or size < 0 or offset + size > nbytes(t):
        raise TensorBoundsError(f"tensor {what} out of bounds: bytes [{offset}, {offset + size}) of {describe(t)}, "
                                f"which has {nbytes(t)} bytes")
    return t.data + offset


def tensor_alloc(buffer: Buffer, tensor: Tensor, addr: int, alloc_size: int | None = None) -> None:
    """`ggml_backend_tensor_alloc`: place `tensor` at address `addr` of `buffer`. A caller that has
    just computed `ggml_backend_buffer_get_alloc_size(buffer, tensor)` may pass it as `alloc_size`."""
    if tensor.buffer is not None or tensor.data is not None:
        holder = tensor.buffer or (tensor.view_src.buffer if tensor.view_src is not None else None)
        raise TensorAlreadyAllocatedError(f"{describe(tensor)} already has memory (in {holder})")
    if tensor.view_src is not None:
        raise TensorAlreadyAllocatedError(f"{describe(tensor)} is a view: it takes its memory from its view_src "
                                          f"(view_init)")
    base = buffer.get_base()
    need = alloc_size if alloc_size is not None else buffer.get_alloc_size(tensor)
    if addr < base or addr + need > base + buffer.get_size():
        raise TensorBoundsError(f"{describe(tensor)} needs {need} bytes at offset {addr - base} of buffer "
                                f"{buffer.get_name()}, which has {buffer.get_size()} bytes")
    tensor.buffer = buffer
    tensor.data = addr
    buffer.init_tensor(tensor)


def view_init(tensor: Tensor) -> None:
    """`ggml_backend_view_init`: a view takes its root's buffer and `view_src.data + view_offs`."""
    if tensor.buffer is not None:
        raise TensorAlreadyAllocatedError(f"{describe(tensor)} already has a buffer")
    if tensor.view_src is None:
        raise BufferStateError(f"{describe(tensor)} is not a view (no view_src)")
    src = tensor.view_src
    if src.buffer is None or src.data is None:
        raise TensorNotAllocatedError(f"the view {describe(tensor)} cannot be placed: its view_src {describe(src)} "
                                      f"has no memory yet")
    tensor.buffer = src.buffer
    tensor.data = src.data + tensor.view_offs
    tensor.buffer.init_tensor(tensor)


def buffer_copy_tensor(src: Tensor, dst: Tensor) -> bool:
    """`ggml_backend_buffer_copy_tensor`: ask `dst`'s buffer to copy `src` into it (False: declined)."""
    dst_buf = dst.view_src.buffer if dst.view_src is not None else dst.buffer
    if dst_buf is None:
        raise TensorNotAllocatedError(f"copy into {describe(dst)}: the tensor has no buffer")
    return dst_buf.cpy_tensor(src, dst)


# %% [markdown]
# ### Real bytes: numpy views of tensors
#
# A tensor in host memory *is* a numpy array: the buffer's bytes, starting at `data - buffer.data`,
# with shape `ne` reversed and strides `nb` reversed. Views, permutes and transposes become numpy
# views of the same bytes — write through one and the root changes. Quantized tensors are viewed as
# arrays of their blocks (`q8_0`: an f16 scale `d` and 32 int8 `qs`).

# %%
# | export
# how numpy sees one block of each type; types without a layout here are opaque blocks
_DTYPES: dict[str, np.dtype] = {
    F32.name: np.dtype("<f4"), F16.name: np.dtype("<f2"), I32.name: np.dtype("<i4"),
    Q8_0.name: np.dtype([("d", "<f2"), ("qs", "i1", 32)]),
    Q4_0.name: np.dtype([("d", "<f2"), ("qs", "u1", 16)]),
    "i8": np.dtype("i1"), "i16": np.dtype("<i2"), "i64": np.dtype("<i8"), "f64": np.dtype("<f8"),
    "bf16": np.dtype("<u2"),  # the raw 16 bits: numpy has no bfloat16
    **{name: np.dtype((np.void, t.type_size)) for name, t in TYPES.items()
       if name not in ("f32", "f16", "i32", "q8_0", "q4_0", "i8", "i16", "i64", "f64", "bf16")},
}


def tensor_array(t: Tensor, device: bool = False) -> np.ndarray:
    """A numpy view of an allocated host tensor: shape `ne` reversed (trailing size-1 dimensions of
    `ne` dropped), strides `nb` reversed. Reads and writes go to the buffer's bytes. `device=True` is
    for the backend that owns non-host memory (its kernels read their own memory directly)."""
    buf = _buffer_of(t)
    if not device and not buf.is_host():
        raise BufferStateError(f"{describe(t)} is in {buf.get_name()} memory, not host memory: "
                               f"use tensor_get/tensor_set")
    if buf.is_multi_buffer():
        raise BufferStateError(f"{describe(t)} points at a multi-buffer, not at one of its parts")
    n = nbytes(t)
    start = _address_of(t) - buf.data
    if start < 0 or start + n > buf._extent():
        raise TensorBoundsError(f"{describe(t)} spans bytes [{start}, {start + n}) of buffer {buf.get_name()}, "
                                f"which has {buf.size}")
    return strided_view(t, buf.memory(), start)


def strided_view(t: Tensor, memory: np.ndarray, offset: int = 0) -> np.ndarray:
    """`t` seen in the bytes `memory` from `offset`: its dtype (blocks for quantized types), shape `ne`
    reversed (trailing size-1 dimensions dropped) and strides `nb` reversed."""
    ne, nb = list(t.ne), list(t.nb)
    if t.type.blck_size > 1:
        ne[0] //= t.type.blck_size
    k = len(t.shape)
    return np.ndarray(tuple(reversed(ne[:k])), dtype=_DTYPES[t.type.name], buffer=memory,
                      offset=offset, strides=tuple(reversed(nb[:k])))


# %% [markdown]
# A CPU buffer of 1000 bytes: the buffer type adds 32, the base is the malloc'ed address rounded
# up to 32, and the first tensor goes at offset 0 of the base.

# %%
import ggml_lite as gl

buft = cpu_buffer_type()
buf = buft.alloc_buffer(1000)
print(buf, f"data={buf.data:#x} base={buf.get_base():#x} (lost to alignment: {buf.get_base() - buf.data} bytes)")
ctx = gl.Context()
m = ctx.new_tensor_2d(gl.F32, 4, 3, name="m")
tensor_alloc(buf, m, buf.get_base())
mt = gl.transpose(ctx, m)
view_init(mt)
tensor_array(m)[:] = np.arange(12, dtype=np.float32).reshape(3, 4)
print(tensor_array(mt))  # the transposed view reads the same bytes
tensor_array(mt)[0, 1] = -1  # and writes them: row 1, column 0 of m
print(tensor_array(m))

# %% [markdown]
# ## 5 · The linear allocator `tallocr`
#
# `ggml_tallocr` (`ggml_tallocr_new` (ggml-alloc.c:72-85), `ggml_tallocr_alloc` (ggml-alloc.c:87-103)) is a bump allocator: start at the first aligned offset of
# the buffer, give each tensor `GGML_PAD(alloc_size, alignment)` bytes, never free.
#
# ```c
# size_t size = ggml_backend_buffer_get_alloc_size(talloc->buffer, tensor);
# size = GGML_PAD(size, talloc->alignment);
# if (talloc->offset + size > ggml_backend_buffer_get_size(talloc->buffer)) { ... abort }
# void * addr = (char *)ggml_backend_buffer_get_base(talloc->buffer) + talloc->offset;
# talloc->offset += size;
# ```
#
# A quirk worth seeing: the space check compares with the buffer's *size*, measured from the base.
# For a CPU buffer, whose size includes the 32 extra bytes and whose base may have moved up by up to
# 31 of them, the last tensor may end a few bytes past the malloc'ed block — up to 31 bytes —
# whenever the sizes were not computed to the byte by `alloc_ctx_tensors` (which never asks for
# more than it computed, so it never happens there).

# %%
# | export tallocr
"""The linear allocator `ggml_tallocr` and `ggml_backend_alloc_ctx_tensors` (ggml-alloc.c)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ggml_lite.align import GGML_PAD, aligned_offset
from ggml_lite.bind import method_of
from ggml_lite.buffer import Buffer, BufferType, multi_buffer_alloc_buffer, tensor_alloc, view_init
from ggml_lite.errors import OutOfBufferSpaceError, TensorTooLargeError
from ggml_lite.tensor import Context, Tensor, describe

log = logging.getLogger("ggml_lite")


class TAllocr:
    """`struct ggml_tallocr` / `ggml_tallocr_new`: a bump allocator over one buffer."""

    def __init__(self, buffer: Buffer):
        self.buffer = buffer
        self.base = buffer.get_base()
        self.alignment = buffer.get_alignment()
        self.offset = aligned_offset(self.base, 0, self.alignment)


@method_of(TAllocr)
def alloc(talloc, tensor: Tensor) -> int:
    """`ggml_tallocr_alloc`: place `tensor` at the current offset; returns its address."""
    size = GGML_PAD(talloc.buffer.get_alloc_size(tensor), talloc.alignment)
    available = talloc.buffer.get_size() - talloc.offset
    if size > available:
        log.error("ggml_tallocr_alloc: not enough space in the buffer to allocate %s (needed %d, available %d)",
                  tensor.name, size, available)
        raise OutOfBufferSpaceError(f"not enough space in buffer {talloc.buffer.get_name()} for {describe(tensor)}: "
                                    f"needed {size} bytes, available {available}")
    addr = talloc.base + talloc.offset
    talloc.offset += size
    tensor_alloc(talloc.buffer, tensor, addr)
    return addr


# %% [markdown]
# ## 6 · Allocating a whole context: `alloc_ctx_tensors`
#
# `ggml_backend_alloc_ctx_tensors_from_buft` (ggml-alloc.c:969-1032) walks the context in creation
# order, summing `GGML_PAD(alloc_size, alignment)` of every tensor that has no data and is not a
# view. When adding the next tensor would pass the buffer type's `max_size`, the tensors so far get
# a buffer of their own (`alloc_tensor_range`, :935-972), and a new range starts. Views are placed
# (`view_init`) in the range where they appear. Facts to notice:
#
# * a tensor larger than `max_size` on its own stops everything (C: message and NULL; here
#   `TensorTooLargeError`, after freeing what was allocated);
# * a context with nothing to allocate returns **None** ("all tensors in the context are already
#   allocated");
# * several ranges become one multi-buffer.

# %%
# | export tallocr
def alloc_tensor_range(ctx: Context, first: int, last: int, buft: BufferType, size: int, buffers: list) -> bool:
    """`alloc_tensor_range`: one buffer of `size` bytes for `ctx.tensors[first:last]` (views are
    initialized, pre-allocated tensors skipped); appended to `buffers`. False if the buffer type
    could not allocate (the buffers so far are freed)."""
    buffer = buft.alloc_buffer(size)
    if buffer is None:
        log.error("alloc_tensor_range: failed to allocate %s buffer of size %d", buft.get_name(), size)
        for b in buffers:
            b.free()
        buffers.clear()
        return False
    talloc = TAllocr(buffer)
    for t in ctx.tensors[first:last]:
        if t.data is None:
            if t.view_src is None:
                talloc.alloc(t)
            elif t.buffer is None:
                view_init(t)
        elif t.view_src is not None and t.buffer is None:
            view_init(t)  # a view of a pre-allocated tensor
    buffers.append(buffer)
    return True


def alloc_ctx_tensors_from_buft(ctx: Context, buft: BufferType):
    """`ggml_backend_alloc_ctx_tensors_from_buft`: allocate every tensor of `ctx` in buffers of `buft`;
    returns the buffer (a multi-buffer when `max_size` forced several), or None when nothing needed memory."""
    alignment, max_size = buft.get_alignment(), buft.get_max_size()
    buffers: list[Buffer] = []
    cur_buf_size, first = 0, 0
    for i, t in enumerate(ctx.tensors):
        this_size = GGML_PAD(buft.get_alloc_size(t), alignment) if t.data is None and t.view_src is None else 0
        if this_size > max_size:
            log.error("ggml_backend_alloc_ctx_tensors_from_buft: tensor %s is too large to fit in a %s buffer "
                      "(tensor size: %d, max buffer size: %d)", t.name, buft.get_name(), this_size, max_size)
            for b in buffers:
                b.free()
            raise TensorTooLargeError(f"{describe(t)} needs {this_size} bytes, more than the maximum buffer size "
                                      f"{max_size} of buffer type {buft.get_name()}")
        if cur_buf_size + this_size > max_size:
            if not alloc_tensor_range(ctx, first, i, buft, cur_buf_size, buffers):
                return None
            first, cur_buf_size = i, this_size
        else:
            cur_buf_size += this_size
    if cur_buf_size > 0 and not alloc_tensor_range(ctx, first, len(ctx.tensors), buft, cur_buf_size, buffers):
        return None
    if not buffers:
        log.debug("ggml_backend_alloc_ctx_tensors_from_buft: all tensors in the context are already allocated")
        return None
    return buffers[0] if len(buffers) == 1 else multi_buffer_alloc_buffer(buffers)


def alloc_ctx_tensors(ctx: Context, backend):
    """`ggml_backend_alloc_ctx_tensors`: `alloc_ctx_tensors_from_buft` with the backend's default buffer
    type (a BufferType is accepted too)."""
    get_default = getattr(backend, "get_default_buffer_type", None)
    buft = get_default() if get_default is not None else backend
    return alloc_ctx_tensors_from_buft(ctx, buft)


# %% [markdown]
# ## 7 · Worked example: weights over a buffer type with a maximum size
#
# Five weights on a device buffer type with alignment 128 and a 4 KiB maximum buffer: the
# allocator packs them in creation order and starts a new buffer whenever the next one would not
# fit: `tok_embd` fills a buffer on its own (4000 bytes pad to 4096), `attn_q` and `attn_k` do not fit
# together (2 × 2432 > 4096), `ffn_up` and `output` do. The result is a multi-buffer of four parts;
# `set_usage(WEIGHTS)` reaches all of them.

# %%
from ggml_lite.tallocr import TAllocr, alloc_ctx_tensors, alloc_ctx_tensors_from_buft  # noqa: E402

dev = BufferType("DEV", alignment=128, max_size=4096)
wctx = gl.Context("weights")
specs = [("tok_embd", 1000), ("attn_q", 600), ("attn_k", 600), ("ffn_up", 700), ("output", 100)]
weights = [wctx.new_tensor_1d(gl.F32, n, name=name) for name, n in specs]
wview = gl.view_1d(wctx, weights[1], 10, 40)  # a view: placed, never sized
wbuf = alloc_ctx_tensors_from_buft(wctx, dev)
wbuf.set_usage(BufferUsage.WEIGHTS)
print(wbuf, "parts:", [(b.get_size(), b.get_usage().name) for b in wbuf.buffers])
for t in [*weights, wview]:
    part = wbuf.buffers.index(t.buffer)
    print(f"{t.name:16s} {t.nbytes:5d} B  part {part}  offset {t.data - t.buffer.get_base():5d}")

# %% [markdown]
# ### A picture: four buffers, back-to-back tensors, padding
#
# Each bar is one part of the multi-buffer; blue is tensor data, grey the padding to 128 bytes,
# white what the buffer type never filled (the part is only as big as its tensors).

# %%
import plotly.graph_objects as go

fig = go.Figure()
for k, part in enumerate(wbuf.buffers):
    y = f"part {k} ({part.get_size()} B)"
    for t in weights:
        if t.buffer is part:
            off = t.data - part.get_base()
            padded = GGML_PAD(t.nbytes, 128)
            fig.add_trace(go.Bar(y=[y], x=[t.nbytes], base=[off], orientation="h", marker_color="#636efa",
                                 text=t.name, textposition="inside", showlegend=False,
                                 hovertext=f"{t.name}: {t.nbytes} B at {off}", hoverinfo="text"))
            fig.add_trace(go.Bar(y=[y], x=[padded - t.nbytes], base=[off + t.nbytes], orientation="h",
                                 marker_color="#cccccc", showlegend=False, hoverinfo="skip"))
fig.add_vline(x=4096, line_dash="dash", annotation_text="max_size 4096")
fig.update_layout(barmode="overlay", height=260, xaxis_title="offset in the part", margin=dict(l=120, r=20, t=40, b=40),
                  title="alloc_ctx_tensors with max_size: one buffer per range, joined as a multi-buffer")
fig

# %% [markdown]
# ## 8 · Errors
#
# Each failure names the tensor and the numbers involved.

# %%
# NBVAL_CHECK_OUTPUT
import ggml_lite.errors as E

small = cpu_buffer_type().alloc_buffer(64)
ta = TAllocr(small)
ctx2 = gl.Context()
a, b = ctx2.new_tensor_1d(gl.F32, 16, name="a"), ctx2.new_tensor_1d(gl.F32, 16, name="b")
ta.alloc(a)
for what, fn in {
    "no space": lambda: ta.alloc(b),
    "too large": lambda: alloc_ctx_tensors_from_buft(ctx2, BufferType("TINY", 32, max_size=32)),
    "read out of bounds": lambda: small.get_tensor(a, 60, 8),
    "unallocated": lambda: tensor_array(b),
    "double free": lambda: (small.free(), small.free()),
}.items():
    try:
        fn()
    except E.GGMLLiteError as e:
        print(f"{what:18s} {type(e).__name__}: {e}")

# %% [markdown]
# ## 9 · Check

# %%
from ggml_lite.buffer import tensor_array, cpu_buffer_type  # the package's own, not this notebook's copies

c = gl.Context()
x = c.new_tensor_2d(gl.F32, 10, 3, name="x")
y = c.new_tensor_1d(gl.Q8_0, 64, name="y")
xv = gl.permute(c, x, 1, 0, 2, 3)
cb = alloc_ctx_tensors(c, cpu_buffer_type())
assert cb.get_size() == GGML_PAD(120, 32) + GGML_PAD(68, 32) + 32 and cb.get_base() % 32 == 0
assert x.data == cb.get_base() and y.data == cb.get_base() + 128 and xv.data == x.data and xv.buffer is cb
assert alloc_ctx_tensors(c, cpu_buffer_type()) is None  # everything already allocated
tensor_array(x)[:] = np.arange(30, dtype=np.float32).reshape(3, 10)
assert tensor_array(xv).shape == (10, 3) and tensor_array(xv)[4, 2] == 24
assert tensor_array(y).shape == (2,) and tensor_array(y).dtype.names == ("d", "qs")
assert cb.get_tensor(x, 4, 4) == np.float32(1).tobytes()
assert len(wbuf.buffers) == 4 and all(p.get_usage() == BufferUsage.WEIGHTS for p in wbuf.buffers)
assert wbuf.get_size() == sum(p.get_size() for p in wbuf.buffers)
print("chapter 03: all checks passed")

# %% [markdown]
# ## 10 · Exercises
#
# Four exercises, about 45 minutes. A prediction is answered with `answer(id, value)`: replace the `...` and
# run the cell; it says right or wrong, then why. The implementation is graded with `check(id, fn)` against
# the port on the chapter's cases, the weights and KV caches of three recorded models (a 7B among them) and
# 400 random contexts; a failure shows the smallest case where your function and ggml disagree and the rule
# it breaks. `python -m ggml_lite exercises` lists what you have done. Solutions are in appendix A8; try
# first.

# %%
from ggml_lite.exercises import answer, check, done  # noqa: E402

# %% [markdown]
# **03.1 · Predict** (easy, 5 min). A context holds three f32 tensors of 10, 25 and 8 elements, in that order,
# and a `view_1d` of 5 elements of the second. `alloc_ctx_tensors(ctx, cpu_buffer_type())` allocates them.
# How many bytes does the returned buffer's `get_size()` report?

# %%
answer("03.1", ...)

# %% [markdown]
# **03.2 · Predict** (medium, 5 min). `talloc = TAllocr(cpu_buffer_type().alloc_buffer(100))`; then f32
# tensors of 8 elements each are placed with `talloc.alloc`, one after another. How many are placed before
# one is refused with `OutOfBufferSpaceError`?

# %%
answer("03.2", ...)

# %% [markdown]
# **03.3 · Implement** the split of `ggml_backend_alloc_ctx_tensors_from_buft` into buffers (medium, 20 min).
# Write it without scrolling up, from the C (`ggml-alloc.c:978-1014`, its message and cleanup left out):
#
# ```c
# size_t cur_buf_size = 0;
# struct ggml_tensor * first = ggml_get_first_tensor(ctx);
# for (struct ggml_tensor * t = first; t != NULL; t = ggml_get_next_tensor(ctx, t)) {
#     size_t this_size = 0;
#     if (t->data == NULL && t->view_src == NULL) {
#         this_size = GGML_PAD(ggml_backend_buft_get_alloc_size(buft, t), alignment);
#     }
#     if (this_size > max_size) {
#         /* "tensor is too large to fit", free the buffers so far */ return NULL;
#     }
#     if ((cur_buf_size + this_size) > max_size) {
#         // allocate tensors in the current buffer
#         if (!alloc_tensor_range(ctx, first, t, buft, cur_buf_size, &buffers, &n_buffers)) { return NULL; }
#         first = t;
#         cur_buf_size = this_size;
#     } else {
#         cur_buf_size += this_size;
#     }
# }
# // allocate remaining tensors
# if (cur_buf_size > 0) {
#     if (!alloc_tensor_range(ctx, first, NULL, buft, cur_buf_size, &buffers, &n_buffers)) { return NULL; }
# }
# ```
#
# `sizes` lists the context's tensors in creation order: each one's alloc size in bytes (at least 1), or
# `None` for a tensor that needs no memory of its own (a view, or one allocated before). Return the buffers
# as a list of `(first, last, size)`: tensors `first` to `last - 1` go into a buffer of `size` bytes
# (`alloc_tensor_range` from `first` up to `t`, or to the end for the last). Where the C gives up on a tensor
# larger than `max_size`, raise `ggml_lite.errors.TensorTooLargeError`.

# %%
# exercise 03.3
def split_buffers(sizes, alignment, max_size):
    """sizes: [bytes or None, ...]; returns [(first, last, size), ...], one per buffer."""
    raise NotImplementedError  # your code here


check("03.3", split_buffers)

# %% [markdown]
# **03.4 · Explore** (medium, 15 min). `alloc_ctx_tensors_from_buft` splits in creation order and never looks
# back. Find tensor sizes for which another order of the same tensors needs fewer buffers under the same
# `max_size`. Does splitting in creation order ever cost *bytes*? Run `done("03.4")` when you have an answer.
#
# <details><summary>A worked answer</summary>
#
# Eight 512-byte tensors alternating with eight 32-byte ones, `max_size` 1024, alignment 32: in creation
# order each 512 is joined by the 32 after it (544 bytes), and the next 512 no longer fits, so there are 8
# buffers of 544 bytes. The same tensors with the 512s first fill four buffers of exactly 1024 bytes and a
# fifth of 8 × 32 = 256: 5 buffers. The rule is *next fit* from bin packing: a buffer closes only when the
# next tensor does not fit, so any two neighbouring buffers together hold more than `max_size`, and the count
# stays below 2 · total / max_size + 1, about twice the fewest possible at worst. No bytes are lost to the
# split: each buffer is exactly its range's padded sum (4,352 bytes either way here), so the cost is the
# number of buffers, plus whatever a buffer type adds to each (the CPU type's 32 bytes). In exchange, one pass
# decides everything, and a tensor's buffer depends only on the tensors created before it.
#
# </details>
