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
# # 12 · ggml today — the allocator and scheduler of 2025–26, as a diff
#
# Chapters 02–11 port ggml as llama.cpp vendored it at daa9623 (September 2024). In today's ggml (0.15.3, June 2026,
# in the tests' oracle `ggml-python` 0.0.45) a compute buffer may be split into **chunks**. Without a size limit
# nothing shows: every tensor lands where it did in 2024. It shows on devices with a per-allocation limit (Vulkan's
# 1 or 4 GiB, Metal's, SYCL's), where the 2024 allocator asks for one buffer the device cannot give. This chapter is
# a diff: per change, the C of 2024 beside today's, why upstream changed it, the Python, an example ggml confirms.
#
# **Learning goals**
#
# 1. The chunked virtual buffer: `struct vbuffer`, `tallocr_chunk`, `buffer_address {chunk, offset}`, at most
#    `GGML_VBUFFER_MAX_CHUNKS` = 16 chunks, the 16th unbounded.
# 2. Where a tensor goes: best fit across the chunks, the `reuse_factor` choice of a last block, or a new chunk.
# 3. The smaller changes: an in-place child hands back its parent's unused tail, buffers are replaced when any chunk
#    grows (and may then shrink), and a dry run sizes them without allocating.
# 4. One graph, two eras: on a device that refuses an allocation above its limit, the 2024 allocator fails where
#    today's splits the compute buffer into chunks, and today's has limits of its own.
# 5. The scheduler today: 30 inputs per split, the `op_offload` switch, the CPU-last check.
# 6. What it changes for chapter 10's LLaMA on a device that allocates at most 1 GiB at once.
#
# Exported: `gallocr_today` (drawn by `viz.chunks`), `sched_today`, `llama_today`. Only what changed is new code: a
# chunk *is* chapter 04's `DynTAllocr`, today's graph allocator chapter 05's `GAllocr` with four methods replaced,
# today's scheduler chapter 09's `BackendSched`. Citations: ggml 0.15.3's `ggml-alloc.c` unless a line says 2024.

# %%
# | default_exp gallocr_today

# %% [markdown]
# ## 1 · A place is a chunk and an offset
#
# ```c
# #define GGML_VBUFFER_MAX_CHUNKS 16
# // relative memory address within an allocation that can be split into multiple buffers (chunks)
# struct buffer_address {
#     int chunk;     // index of a backend buffer
#     size_t offset; // local memory offset within the buffer
# };
# static const struct buffer_address GGML_BUFFER_ADDRESS_INVALID = { -1, SIZE_MAX };
# ```
#
# (`ggml-alloc.c:95-103`.) In 2024 a hash node held `size_t offset`; today it holds this pair, as does the port
# where chapter 05 kept the offset. The first version of pull request 15815 (September 2025) kept one offset and cut
# it into chunks afterwards; the reviewers asked for the pair, so that a tensor's chunk is decided once.

# %%
# | export
"""ggml's graph allocator as of ggml 0.15.3 (ggml-alloc.c, June 2026) beside the 2024 one of chapters
04-05: a compute buffer of up to 16 chunks. Only what changed is here; the rest is `ggml_lite.gallocr`."""

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from ggml_lite.align import aligned_offset
from ggml_lite.bind import method_of
from ggml_lite.buffer import SIZE_MAX, BufferUsage, tensor_alloc
from ggml_lite.dyn_tallocr import DynTAllocr
from ggml_lite.errors import AllocationError, GGMLLiteError, OutOfBufferSpaceError
from ggml_lite.gallocr import CAN_INPLACE, GAllocr, MiB, PlaceEvent
from ggml_lite.tensor import Op
from ggml_lite.trace import Lifetime, lifetimes

log = logging.getLogger("ggml_lite")

VBUFFER_MAX_CHUNKS = 16  # GGML_VBUFFER_MAX_CHUNKS


class BufferAddress(NamedTuple):
    """`struct buffer_address`: which chunk of the virtual buffer, and the offset inside it."""

    chunk: int
    offset: int

    def __str__(self):
        return f"{self.chunk}:{self.offset}"


ADDRESS_INVALID = BufferAddress(-1, SIZE_MAX)  # GGML_BUFFER_ADDRESS_INVALID

# %% [markdown]
# ## 2 · Today's dynamic allocator: a row of 2024 allocators
#
# ```c
# struct tallocr_chunk {
#     struct free_block free_blocks[MAX_FREE_BLOCKS];
#     int n_free_blocks;
#     size_t max_size;
# };
#
# struct ggml_dyn_tallocr {
#     size_t alignment;
#     size_t max_chunk_size;
#     struct tallocr_chunk * chunks[GGML_VBUFFER_MAX_CHUNKS];
#     int n_chunks;
# ```
#
# (`ggml-alloc.c:114-124`.) Chapter 04's `struct ggml_dyn_tallocr` (2024 `ggml-alloc.c:113-120`) is `tallocr_chunk`
# plus an alignment: the same free list, the same high-water mark. So each chunk is a `DynTAllocr`, and only two
# fields are new: `max_chunk_size` (the buffer type's `get_max_size` clamped to `SIZE_MAX/2`,
# `ggml_dyn_tallocr_new`, :365-381) and the chunks. `ggml_dyn_tallocr_reset` (:351-363) frees every chunk.

# %%
# | export
@dataclass(frozen=True)
class ChunkAllocEvent:
    """Today's `ggml_dyn_tallocr_alloc` placed `tensor` at `chunk:offset`, found by `how`: "best_fit"
    (a block besides a chunk's last), "last_block" (a chunk's last block) or "new_chunk"."""

    kind = "chunk_alloc"
    tensor: object
    size: int  # aligned size
    chunk: int
    offset: int
    how: str
    chunk_sizes: tuple  # every chunk's max_size after the allocation


@dataclass(frozen=True)
class ChunkFreeEvent:
    """Today's `ggml_dyn_tallocr_free_bytes` gave `[offset, offset + size)` of `chunk` back."""

    kind = "chunk_free"
    tensor: object
    size: int
    chunk: int
    offset: int


class ChunkedDynTAllocr:
    """`struct ggml_dyn_tallocr` of ggml 0.15.3 (`ggml_dyn_tallocr_new`, `ggml_dyn_tallocr_reset`,
    `ggml_dyn_tallocr_free`): up to 16 chunks, each a chapter-04 `DynTAllocr` (`struct tallocr_chunk`).

    `last_block` picks the rule for growing a chunk: "reuse_factor" (today's, since October 2025) or
    "first" (the first chunked version of September 2025: the first chunk whose last block fits)."""

    __slots__ = ("alignment", "max_chunk_size", "chunks", "last_block", "trace")

    def __init__(self, alignment: int, max_buffer_size: int = SIZE_MAX, last_block: str = "reuse_factor",
                 trace=None):
        aligned_offset(None, 0, alignment)  # raises AlignmentError for a bad alignment
        if last_block not in ("reuse_factor", "first"):
            raise GGMLLiteError(f"last_block: 'reuse_factor' or 'first', not {last_block!r}")
        if not isinstance(max_buffer_size, int) or max_buffer_size < 1:
            raise AllocationError(f"max_buffer_size: a positive number of bytes, not {max_buffer_size!r}")
        self.alignment = alignment
        self.max_chunk_size = min(max_buffer_size, SIZE_MAX // 2)  # clamp to avoid overflows
        self.last_block = last_block
        self.trace = trace
        self.chunks: list[DynTAllocr] = []

    @property
    def n_chunks(self) -> int:
        return len(self.chunks)


@method_of(ChunkedDynTAllocr)
def reset(dyn) -> None:
    """`ggml_dyn_tallocr_reset` (:351-363): every chunk freed; the next allocation opens chunk 0."""
    dyn.chunks = []


@method_of(ChunkedDynTAllocr)
def free(dyn) -> None:
    """`ggml_dyn_tallocr_free` (:383-388)."""
    dyn.chunks = []


@method_of(ChunkedDynTAllocr)
def chunk_max_size(dyn, chunk: int) -> int:
    """`ggml_dyn_tallocr_max_size` (:390-392): a chunk's high-water mark, 0 past the last chunk."""
    return dyn.chunks[chunk].max_size if chunk < len(dyn.chunks) else 0

# %% [markdown]
# ### 2.1 · A new chunk
#
# ```c
#     // available space in a chunk is limited to max_chunk_size, but can be higher if:
#     // 1. a single tensor exceeds the maximum, and cannot fit any other way
#     // 2. we are running out of chunks
#     // backends will either manage to allocate the larger size, or report an error.
#     chunk->free_blocks[0].size = MAX(min_size, alloc->max_chunk_size);
#     if (alloc->n_chunks == GGML_VBUFFER_MAX_CHUNKS - 1) {
#         chunk->free_blocks[0].size = SIZE_MAX/2;
#     }
# ```
#
# (`ggml_dyn_tallocr_new_chunk`, :159-177.) A chunk's one free block is the buffer type's limit, or the tensor that
# opens it when that is larger: a chunk never splits a tensor, so a 3 GiB tensor on a 1 GiB device still asks for 3
# GiB (and the device may refuse). The 16th chunk is the 2024 allocator's open end, `SIZE_MAX/2`, so allocation
# never fails for want of chunks. With no limit, chunk 0 is exactly the 2024 allocator and no second chunk opens.

# %%
# | export
@method_of(ChunkedDynTAllocr)
def new_chunk(dyn, min_size: int) -> int:
    """`ggml_dyn_tallocr_new_chunk` (:159-177): open a chunk with one free block of
    MAX(min_size, max_chunk_size) bytes (SIZE_MAX/2 for the 16th); -1 when 16 chunks exist."""
    if len(dyn.chunks) >= VBUFFER_MAX_CHUNKS:
        return -1
    chunk = DynTAllocr(dyn.alignment)  # calloc: no blocks, max_size 0
    size = max(min_size, dyn.max_chunk_size)
    if len(dyn.chunks) == VBUFFER_MAX_CHUNKS - 1:
        size = SIZE_MAX // 2
    chunk.blocks = [[0, size]]
    dyn.chunks.append(chunk)
    return len(dyn.chunks) - 1

# %% [markdown]
# ### 2.2 · Where a tensor goes
#
# In 2024, one free list (`ggml_dyn_tallocr_alloc` (ggml-alloc.c:148-230) of 2024):
#
# ```c
#     // find the best fitting free block besides the last block
#     size_t best_fit_size = SIZE_MAX;
#     for (int i = 0; i < alloc->n_free_blocks - 1; i++) {
# ...
#         // the last block is our last resort
# ```
#
# Today, every chunk's:
#
# ```c
#     // find the best fitting free block besides the last block, within any chunk
#     for (int c = 0; c < alloc->n_chunks; ++c) {
#         struct tallocr_chunk * chunk = alloc->chunks[c];
#         size_t best_fit_size = SIZE_MAX;
#         for (int i = 0; i < chunk->n_free_blocks - 1; i++) {
# ...
#                 int64_t reuse_factor = chunk->max_size - block->offset - size;
#                 // reuse_factor < 0 : amount of extra memory that needs to be allocated
#                 bool better_reuse = best_reuse < 0 && reuse_factor > best_reuse;
#                 bool better_fit = reuse_factor >= 0 && reuse_factor < best_reuse;
# ```
#
# (`ggml_dyn_tallocr_alloc`, :201-308.) Three tries. **Best fit besides the last block**, in every chunk — but
# `best_fit_size` is reset *inside* the chunk loop: the block taken is the best fit of the *last* chunk that has
# one. **A last block**, which grows its chunk: the first chunked version took the first that fits; pull request
# 16788 (October 2025) scores each by `reuse_factor`, the bytes of the chunk left unused after the tensor (negative:
# how much it must grow): no growth and least waste wins, else least growth. **A new chunk.** The port chooses the
# chunk and hands over to its chapter-04 `alloc`, which picks that very block.

# %%
# | export
@method_of(ChunkedDynTAllocr)
def alloc(dyn, size: int, tensor=None) -> BufferAddress:
    """`ggml_dyn_tallocr_alloc` (:201-308): best fit besides the last blocks (the last chunk with a fit
    wins), else a chunk's last block by `reuse_factor`, else a new chunk; the chosen chunk's 2024
    `DynTAllocr.alloc` then takes that block."""
    size = aligned_offset(None, size, dyn.alignment)
    best, how = -1, "best_fit"
    for c, chunk in enumerate(dyn.chunks):  # best fit besides the last block, within any chunk
        best_fit_size = SIZE_MAX  # reset for every chunk: a fit in a later chunk wins
        for _offset, bsize in chunk.blocks[:-1]:
            if size <= bsize <= best_fit_size:
                best, best_fit_size = c, bsize
    if best == -1:  # no suitable block found, try the last block (this may grow a chunk's size)
        best, how = dyn._last_block_chunk(size), "last_block"
    if best == -1:  # none of the existing chunks have enough space left
        best, how = dyn.new_chunk(size), "new_chunk"
    if best == -1:  # unreachable: the 16th chunk is unbounded
        raise OutOfBufferSpaceError(f"graph allocation: no chunk can hold {size} bytes")
    offset = dyn.chunks[best].alloc(size, tensor)
    if dyn.trace is not None:
        dyn.trace(ChunkAllocEvent(tensor, size, best, offset, how, tuple(c.max_size for c in dyn.chunks)))
    return BufferAddress(best, offset)


@method_of(ChunkedDynTAllocr)
def _last_block_chunk(dyn, size: int) -> int:
    """The chunk whose last free block `ggml_dyn_tallocr_alloc` takes (-1: none fits): the best
    `reuse_factor` today, the first that fits in September 2025 (`last_block="first"`)."""
    best, best_reuse = -1, -(2**63)  # INT64_MIN
    for c, chunk in enumerate(dyn.chunks):
        if not chunk.blocks:
            continue
        offset, bsize = chunk.blocks[-1]
        if dyn.last_block == "first":
            if bsize >= size:
                return c
            continue
        reuse_factor = chunk.max_size - offset - size
        better_reuse = best_reuse < 0 and reuse_factor > best_reuse
        better_fit = 0 <= reuse_factor < best_reuse
        if bsize >= size and (better_reuse or better_fit):
            best, best_reuse = c, reuse_factor
    return best

# %% [markdown]
# ### 2.3 · Freeing
#
# ```c
# static void ggml_dyn_tallocr_free_bytes(struct ggml_dyn_tallocr * alloc, struct buffer_address addr, size_t size) {
#     size = aligned_offset(NULL, size, alloc->alignment);
#     struct tallocr_chunk * chunk = alloc->chunks[addr.chunk];
# ```
#
# (`ggml_dyn_tallocr_free_bytes`, :311-349.) The rest is the 2024 free on one chunk (`ggml_dyn_tallocr_free_tensor`,
# 2024 `ggml-alloc.c:236-283`). The new name (pull request 17884, December 2025) says what it does now: it frees
# *bytes*, not always a whole tensor — the unused tail of an in-place parent (4.1). The port keeps the old name.

# %%
# | export
@method_of(ChunkedDynTAllocr)
def free_tensor(dyn, addr: BufferAddress, size: int, tensor=None) -> None:
    """`ggml_dyn_tallocr_free_bytes` (:311-349; `ggml_dyn_tallocr_free_tensor` until December 2025):
    `[addr.offset, + size)` back to chunk `addr.chunk`, merged there by the 2024 rule."""
    size = aligned_offset(None, size, dyn.alignment)
    dyn.chunks[addr.chunk].free_tensor(addr.offset, size, tensor)
    if dyn.trace is not None:
        dyn.trace(ChunkFreeEvent(tensor, size, addr.chunk, addr.offset))

# %% [markdown]
# ### 2.4 · The rules at work
#
# **New chunks.** Limit 1,024 B, no frees. 600, 3,000 and 600 B (aligned: 608, 3,008, 608): the first opens chunk 0;
# the second opens chunk 1 of MAX(3,008, 1,024) = 3,008 B, its own; the third fits neither chunk 0's last 416 B nor
# the full chunk 1: chunk 2. Twenty of 1,024 B: chunks 0–14 take one each, the unbounded 16th five.

# %%
# NBVAL_CHECK_OUTPUT
dyn = ChunkedDynTAllocr(alignment=32, max_buffer_size=1024)
print("placed at", [str(dyn.alloc(size)) for size in (600, 3000, 600)], "- chunks", [c.max_size for c in dyn.chunks])
dyn = ChunkedDynTAllocr(alignment=32, max_buffer_size=1024)
addrs = [dyn.alloc(1024) for _ in range(20)]
print(dyn.n_chunks, "chunks; the last five at", [str(a) for a in addrs[15:]], "- chunk 15:", dyn.chunks[15].max_size)

# %% [markdown]
# **Best fit, chunk by chunk.** Limit 1,024 B: `a` (256 B) and `b` (512) fill chunk 0 to 768, `d` (384) opens chunk
# 1, `e` (384) follows it at 384. Free `a` and `d`: chunk 0 has a 256-B hole at 0, chunk 1 a 384-B one. Now `z`, 256
# B. One best fit over the whole buffer, 2024's rule, would take chunk 0's exact hole; today's loop resets
# `best_fit_size` per chunk, so chunk 1's hole, seen later, wins: `z` at 1:0, a 128-B hole beside it. A quirk, kept.

# %%
# NBVAL_CHECK_OUTPUT
def free_list(blocks):
    """Free blocks as (offset, size), an open-ended last block as (offset, "…")."""
    return [(o, size if size < 2**62 else "…") for o, size in blocks]


dyn = ChunkedDynTAllocr(alignment=32, max_buffer_size=1024)
a, b, d, e = (dyn.alloc(size) for size in (256, 512, 384, 384))
dyn.free_tensor(a, 256)
dyn.free_tensor(d, 384)
print(f"a {a}, b {b}, d {d}, e {e}; after freeing a and d:", [free_list(c.blocks) for c in dyn.chunks])
z_addr = dyn.alloc(256)
print(f"z {z_addr}; free lists:", [free_list(c.blocks) for c in dyn.chunks])

# %% [markdown]
# The real ggml does the same: `tests/differential/test_today_examples.py` builds a graph that allocates in this
# very order (`a`, `b`, `d` negate weights, `e = a @ d` is the last use of `a` and `d`, `z` comes after it), plans
# it with ggml 0.15.3 on a buffer type whose `get_max_size` is 1,024, and finds `z` at 1:0.
#
# **A last block by `reuse_factor`.** Limit 1,024 B again: `p` (512 B) opens chunk 0, `q` (768 B) does not fit chunk
# 0's last 512 B and opens chunk 1, and `q` is freed, so chunk 1 is empty but 768 B large. Now `r`, 256 B. Neither
# chunk has a hole besides its last block, so the last blocks decide. The first chunked version (September 2025)
# takes the first chunk whose last block fits: chunk 0, at 512, and chunk 0 grows to 768 B — 1,536 B in all. Today's
# scores the chunks: chunk 0's `reuse_factor` is 512 − 512 − 256 = −256 (it must grow), chunk 1's 768 − 0 − 256 =
# 512 (it need not), so `r` goes to 1:0 and the chunks stay at 512 + 768 = 1,280 B. Pull request 16788 measured it
# on Vulkan (Llama-2 7B Q4_0, 19 layers offloaded, a 12,500-token prompt): compute buffer 1,711.19 → 1,026.94 MiB.

# %%
# NBVAL_CHECK_OUTPUT
chunk_totals = {}
for rule in ("first", "reuse_factor"):
    dyn = ChunkedDynTAllocr(alignment=32, max_buffer_size=1024, last_block=rule)
    p, q = dyn.alloc(512), dyn.alloc(768)
    dyn.free_tensor(q, 768)
    r = dyn.alloc(256)
    sizes = [c.max_size for c in dyn.chunks]
    chunk_totals[rule] = sum(sizes)
    print(f"{rule:>12}: p {p}, q {q}, r {r}; chunk sizes {sizes} = {sum(sizes)} B")

# %% [markdown]
# ## 3 · The virtual buffer
#
# ```c
# struct vbuffer {
#     ggml_backend_buffer_t chunks[GGML_VBUFFER_MAX_CHUNKS];
# };
# ```
#
# (:397-399, with `ggml_vbuffer_alloc` (:423-439) and `ggml_vbuffer_tensor_alloc` (:441-445).) A compute buffer is
# now one backend buffer per chunk, of its chunk's `max_size`; its size is their sum.
#
# One deliberate difference. ggml_lite's CPU buffer type is the 2024 one, which pads every buffer by 32 bytes;
# today's does not. So a compute buffer's size is the sum of its chunks plus 32 per chunk, as every size in this
# course counts. But then a chunk grown by one 32-byte step would not be reallocated (4.2), where today's ggml
# reallocates it. So `chunk_size` answers the size the allocator asked for, what today's CPU buffer reports.

# %%
# | export
class VBuffer:
    """`struct vbuffer` (`ggml_vbuffer_alloc`, `ggml_vbuffer_free`, `ggml_vbuffer_size`,
    `ggml_vbuffer_chunk_size`, `ggml_vbuffer_tensor_alloc`, `ggml_vbuffer_reset`): the chunks' buffers
    and the size each was asked for."""

    __slots__ = ("chunks", "asked")

    def __init__(self):
        self.chunks: list = []  # backend buffers, chunk order
        self.asked: list[int] = []  # the size alloc_buffer was given for each

    @property
    def handle(self):
        """The first chunk's buffer handle (what a tensor's `buffer` shows), None without chunks."""
        return self.chunks[0].handle if self.chunks else None

    def __repr__(self):
        return f"VBuffer(chunks={self.asked})"

    def free(self) -> None:
        """`ggml_vbuffer_free`."""
        for buf in self.chunks:
            buf.free()
        self.chunks, self.asked = [], []

    def chunk_size(self, chunk: int) -> int:
        """`ggml_vbuffer_chunk_size`: the size asked for chunk `chunk` (0 past the last; see the text)."""
        return self.asked[chunk] if chunk < len(self.asked) else 0

    def get_size(self) -> int:
        """`ggml_vbuffer_size`: the sum of the chunks' buffer sizes."""
        return sum(buf.get_size() for buf in self.chunks)

    def tensor_alloc(self, tensor, addr: BufferAddress, need: int) -> None:
        """`ggml_vbuffer_tensor_alloc`: `ggml_backend_tensor_alloc` in chunk `addr.chunk`."""
        buf = self.chunks[addr.chunk]
        tensor_alloc(buf, tensor, buf.get_base() + addr.offset, need)

    def reset(self) -> None:
        """`ggml_vbuffer_reset`."""
        for buf in self.chunks:
            buf.reset()


def vbuffer_alloc(buft, talloc: ChunkedDynTAllocr, usage=BufferUsage.COMPUTE):
    """`ggml_vbuffer_alloc` (:423-439): one buffer per chunk of `talloc`, each of its `max_size`;
    None (and nothing kept) when the buffer type refuses one."""
    vbuf = VBuffer()
    for chunk in talloc.chunks:
        buf = buft.alloc_buffer(chunk.max_size)
        if buf is None:
            vbuf.free()
            return None
        buf.set_usage(usage)
        vbuf.chunks.append(buf)
        vbuf.asked.append(chunk.max_size)
    return vbuf

# %% [markdown]
# ## 4 · Today's graph allocator: chapter 05 with four methods replaced
#
# ```c
#             size_t alignment = ggml_backend_buft_get_alignment(bufts[i]);
#             size_t max_size = ggml_backend_buft_get_max_size(bufts[i]);
#             galloc->buf_tallocs[i] = ggml_dyn_tallocr_new(alignment, max_size);
# ```
#
# (`ggml_gallocr_new_n`, :497-531.) In 2024 the allocator asked a buffer type for its alignment only. `GAllocr2026`
# is chapter 05's `GAllocr` — the same loops, in-place and freeing rules, kept plan — with a chunked allocator per
# buffer type, a `BufferAddress` where chapter 05 kept an offset, and four methods replaced: `take_parent` (then
# `ggml_gallocr_free_extra_space`, 4.1), `reserve_n` (4.2), `place` (into a chunk), `is_allocated`.

# %%
# | export
class GAllocr2026(GAllocr):
    """`struct ggml_gallocr` of ggml 0.15.3 (`ggml_gallocr_new`, `ggml_gallocr_new_n`): chapter 05's
    graph allocator on chunked dynamic allocators (`ChunkedDynTAllocr`) and virtual buffers (`VBuffer`).
    `last_block` as for `ChunkedDynTAllocr` ("first": the allocator of September 2025)."""

    ggml = "2026"

    def __init__(self, bufts, trace=None, last_block: str = "reuse_factor") -> None:
        super().__init__(bufts)  # (its 2024 allocators, replaced below, report to no trace)
        self.trace = trace
        # the same sharing as chapter 05 (one allocator per distinct buffer type), today's allocators
        made: dict[int, ChunkedDynTAllocr] = {}
        for i, (old, buft) in enumerate(zip(self.buf_tallocs, self.bufts)):
            if id(old) not in made:
                made[id(old)] = ChunkedDynTAllocr(buft.get_alignment(), buft.get_max_size(), last_block, trace)
            self.buf_tallocs[i] = made[id(old)]  # type: ignore[call-overload]

    def __repr__(self):
        names = ", ".join(b.get_name() for b in self.bufts)
        return f"GAllocr2026([{names}], {len(self.planned_nodes)} nodes planned)"


@method_of(GAllocr2026)
def is_allocated(galloc, t) -> bool:
    """`ggml_gallocr_is_allocated` (:592-596): data set, a buffer set ("on external buffer but not yet
    allocated"), or placed by this plan. (A ggml_lite tensor never has a buffer without data.)"""
    return t.data is not None or t.buffer is not None or galloc.hash_get(t).allocated

# %% [markdown]
# ### 4.1 · An in-place child hands back its parent's tail
#
# ```c
#     // note: we want after the freeing the chunks to continue to be aligned
#     parent_size = aligned_offset(NULL, parent_size, p_alloc->alignment);
#     node_size = aligned_offset(NULL, node_size, p_alloc->alignment);
#
#     if (parent_size > node_size) {
# ```
#
# (`ggml_gallocr_free_extra_space`, :599-620.) In 2024, a child freed (`ggml_gallocr_free_node` (ggml-alloc.c:542-557)):
#
# ```c
#     size_t size = ggml_backend_buft_get_alloc_size(buft, node);
#     ggml_dyn_tallocr_free_tensor(alloc, offset, size, node);
# ```
#
# A child takes its parent's memory in place only when both have the same layout, so the same `ggml_nbytes`. But a
# buffer type may ask more than `nbytes` for a tensor (`get_alloc_size`): Metal pads some tensors, and a child can
# then need less than its parent. In 2024 that tail was lost for the rest of the graph: the child took the parent's
# block whole, and freeing the child frees the *child's* size. Since pull request 16679 (October 2025) the tail is
# handed back at once, and since 17884 (December 2025) both sizes are rounded to the alignment first, so that it
# starts aligned. On the CPU buffer type the sizes are equal and nothing is freed.

# %%
# | export
@method_of(GAllocr2026)
def free_extra_space(galloc, node, parent) -> None:
    """`ggml_gallocr_free_extra_space` (:599-620): after `node` took `parent`'s memory in place, give
    back the parent's bytes beyond the node's (both sizes rounded up to the alignment)."""
    hn, p_hn = galloc.hash_get(node), galloc.hash_get(parent)
    parent_size = galloc._alloc_size[p_hn.buffer_id](parent)
    node_size = galloc._alloc_size[hn.buffer_id](node)
    if parent_size < node_size:  # GGML_ASSERT(parent_size >= node_size)
        raise AllocationError(f"in-place {node.name!r} needs {node_size} B, more than its parent "
                              f"{parent.name!r}'s {parent_size} B")
    p_alloc = galloc.buf_tallocs[p_hn.buffer_id]
    parent_size = aligned_offset(None, parent_size, p_alloc.alignment)
    node_size = aligned_offset(None, node_size, p_alloc.alignment)
    if parent_size > node_size:
        p_addr = p_hn.offset
        p_alloc.free_tensor(BufferAddress(p_addr.chunk, p_addr.offset + node_size), parent_size - node_size)


@method_of(GAllocr2026)
def take_parent(galloc, node, parent, owner) -> None:
    """`ggml_gallocr_allocate_node`'s in-place step (:641-677): chapter 05's, then
    `ggml_gallocr_free_extra_space(galloc, node, owner)`."""
    GAllocr.take_parent(galloc, node, parent, owner)
    galloc.free_extra_space(node, owner)

# %% [markdown]
# A Metal-like buffer type: `get_alloc_size` adds 1 KiB to a MUL_MAT result. `m = W @ x` (1,024 B, 2,048 allocated),
# `y = m + bias` in place of `m` (1,024 B), `z = -c` (1,024 B), `s = y + z` in place of `y`. In 2024 `z` goes above
# `m`'s 2,048 B: 3,072 B. Today `y` hands the tail back, `z` lands in it: 2,048 B.

# %%
# NBVAL_CHECK_OUTPUT
import ggml_lite as gl  # noqa: E402
from ggml_lite.buffer import BufferType  # noqa: E402


def padded_graph():
    """m = W @ x, y = m + bias (in place), z = -c, s = y + z (in place, the output)."""
    w, ctx = gl.Context(), gl.Context()
    W, x, bias, c = w.new_tensor_2d(gl.F32, 256, 256), *(w.new_tensor_1d(gl.F32, 256) for _ in range(3))
    gl.alloc_ctx_tensors_from_buft(w, gl.cpu_buffer_type())
    m, z = gl.mul_mat(ctx, W, x), gl.neg(ctx, c)
    y = gl.add(ctx, m, bias)
    s = gl.add(ctx, y, z)
    m.name, y.name, z.name, s.name = "m", "y", "z", "s"
    gl.set_output(s)
    return gl.build_forward(s)


metal_like = BufferType("Metal-like", 32, alloc_size=lambda t: gl.nbytes(t) + (1024 if t.op == Op.MUL_MAT else 0))
padded_sizes = {}
for era in ("2024", "2026"):
    gf = padded_graph()
    galloc = gl.new_gallocr(metal_like, ggml=era)
    assert galloc.reserve(gf)
    chunk = galloc.buf_tallocs[0] if era == "2024" else galloc.buf_tallocs[0].chunks[0]
    padded_sizes[era] = chunk.max_size
    where = {n.name: str(galloc.hash_get(n).offset) for n in gf.nodes}
    print(f"{era}: {where}, buffer {chunk.max_size} B, free list at the end {free_list(chunk.blocks)}")

# %% [markdown]
# ### 4.2 · Buffers: any chunk that grew, and a dry run
#
# ```c
#         bool realloc = galloc->buffers[i] == NULL;
#         for (int c = 0; c < galloc->buf_tallocs[i]->n_chunks; c++) {
#             size_t cur_chunk_size = galloc->buffers[i] ? ggml_vbuffer_chunk_size(galloc->buffers[i], c) : 0;
#             size_t new_chunk_size = ggml_dyn_tallocr_max_size(galloc->buf_tallocs[i], c);
#             if (new_chunk_size > cur_chunk_size) {
#                 realloc = true;
# ```
#
# (`ggml_gallocr_reserve_n_impl`, :824-948.) In 2024, one comparison (`ggml_gallocr_reserve_n` (ggml-alloc.c:670-779)):
#
# ```c
#         if (new_size > cur_size || galloc->buffers[i] == NULL) {
# ```
#
# The 2024 buffer was replaced only when the new total exceeded it, so it never shrank. Today, if *any* chunk grew,
# the whole virtual buffer is reallocated at the new plan's sizes, fewer, smaller ones if it needs less. The dry run
# allocates nothing; `ggml_gallocr_reserve_n_size` (:950-959) sums each buffer's chunks, for llama.cpp's `--fit`.

# %%
# | export
@method_of(GAllocr2026)
def reserve_n_impl(galloc, graph, node_buffer_ids, leaf_buffer_ids, no_alloc: bool) -> bool:
    """`ggml_gallocr_reserve_n_impl` (:824-948): plan `graph` as chapter 05 does (`plan_and_keep`), then
    reallocate every virtual buffer one of whose chunks grew — or, with `no_alloc`, drop it."""
    galloc.plan_and_keep(graph, node_buffer_ids, leaf_buffer_ids)
    for i in range(galloc.n_buffers):  # reallocate buffers if needed
        for j in range(i):  # if the buffer type is used multiple times, we reuse the same buffer
            if galloc.buf_tallocs[j] is galloc.buf_tallocs[i]:
                galloc.buffers[i] = galloc.buffers[j]
                break
        vbuf, talloc = galloc.buffers[i], galloc.buf_tallocs[i]
        realloc = vbuf is None  # even with no tensors, views need the buffer
        new_size = 0
        for c in range(talloc.n_chunks):
            cur_chunk_size = vbuf.chunk_size(c) if vbuf is not None else 0
            new_chunk_size = talloc.chunk_max_size(c)
            new_size += new_chunk_size
            if new_chunk_size > cur_chunk_size:
                realloc = True
        if not realloc:
            continue
        name = galloc.bufts[i].get_name()
        cur_size = sum(vbuf.asked) if vbuf is not None else 0
        if cur_size > 0:
            log.info("ggml_gallocr_reserve_n_impl: reallocating %s buffer from size %.02f MiB to %.02f MiB",
                      name, cur_size / MiB, new_size / MiB)
        if vbuf is not None:
            vbuf.free()
        galloc.buffers[i] = None if no_alloc else vbuffer_alloc(galloc.bufts[i], talloc, BufferUsage.COMPUTE)
        if not no_alloc and galloc.buffers[i] is None:
            log.error("ggml_gallocr_reserve_n_impl: failed to allocate %s buffer of size %d", name, new_size)
            return False
    return True


@method_of(GAllocr2026)
def reserve_n(galloc, graph, node_buffer_ids=None, leaf_buffer_ids=None) -> bool:
    """`ggml_gallocr_reserve_n` (:961-963): `reserve_n_impl` that allocates."""
    return galloc.reserve_n_impl(graph, node_buffer_ids, leaf_buffer_ids, False)


@method_of(GAllocr2026)
def reserve_n_size(galloc, graph, node_buffer_ids=None, leaf_buffer_ids=None) -> list:
    """`ggml_gallocr_reserve_n_size` (:950-959): plan without allocating; per buffer id the sum of its
    chunks' sizes (a shared allocator's at each of its ids, as in the C)."""
    if not galloc.reserve_n_impl(graph, node_buffer_ids, leaf_buffer_ids, True):  # GGML_ASSERT
        raise AllocationError("ggml_gallocr_reserve_n_size: the dry run failed")
    return [sum(c.max_size for c in talloc.chunks) for talloc in galloc.buf_tallocs]


@method_of(GAllocr2026)
def place(galloc, buffer, tensor, offset, need: int) -> None:
    """`ggml_gallocr_init_tensor`'s last step today (:969-994): `ggml_vbuffer_tensor_alloc`."""
    buffer.tensor_alloc(tensor, offset, need)


@method_of(GAllocr2026)
def chunk_sizes(galloc, buffer_id: int = 0) -> list:
    """The sizes the allocator asked for each chunk of buffer `buffer_id` (empty: no buffer)."""
    galloc.get_buffer_size(buffer_id)  # the buffer id's check
    buf = galloc.buffers[buffer_id]
    return list(buf.asked) if buf is not None else []

# %% [markdown]
# Four reserves on one allocator, 20 KiB limit: chapter 05's LLaMA block (fixture 06) gets chunks of 16,704, 10,240
# and 13,760 B; the same graph again grows nothing, the buffer is kept; fixture 03 needs 16,352 and 12,288 B, chunk
# 1 grew, so the buffer is replaced by two chunks, 28,640 B (the 2024 one would have kept its 42,880 B); the block
# again: chunk 0 grew, three chunks. The real ggml does the same (`test_today_examples.py`).

# %%
# NBVAL_CHECK_OUTPUT
from pathlib import Path  # noqa: E402

from ggml_lite.graphio import allocate_external  # noqa: E402
from ggml_lite.schema import RecordedBufferType  # noqa: E402


def fixture_graph(name):
    """A recorded graph of `tests/fixtures/ggml-seed`, its weights placed as recorded."""
    f = gl.read_graph_file(Path("../tests/fixtures/ggml-seed") / f"{name}.json")
    allocate_external(f)
    return f.graph


galloc, replaced = GAllocr2026(RecordedBufferType("CPU", 32, 20480)), []
for name in ("06_llama_block", "06_llama_block", "03_views_layout", "06_llama_block"):
    before = galloc.buffers[0]
    assert galloc.reserve(fixture_graph(name))
    replaced.append(galloc.buffers[0] is not before)
    print(f"{name:16} chunks {galloc.chunk_sizes(0)}, buffer", "replaced" if replaced[-1] else "kept")


# %% [markdown]
# ## 5 · Two eras in one package
#
# `GAllocr` plans as llama.cpp's ggml of September 2024 did and stays the default; `GAllocr2026` plans as ggml
# 0.15.3 does. `new_gallocr(buft, ggml="2026")` picks one by name, which is how the command line's `--ggml
# 2024|2026` and a recorded file's `"ggml_version"` choose. The list of ops that may work in place is private to the
# allocator in 2024 (`ggml_op_can_inplace` (ggml-alloc.c:40-62) of 2024) and exported by today's ggml
# (`ggml_op_can_inplace`, :22-50, declared in `ggml-impl.h`):
#
# ```c
# static bool ggml_op_can_inplace(enum ggml_op op) {  // 2024
# bool ggml_op_can_inplace(enum ggml_op op) {         // today: its first case is the new GGML_OP_FILL
# ```
#
# It grew by six ops ggml_lite does not have — FILL, ADD_ID (mixture-of-experts biases) and four backward ops — so
# on every graph ggml_lite builds, the two eras take the same in-place decisions.

# %%
# | export
ERAS = {"2024": GAllocr, "2026": GAllocr2026}


def new_gallocr(bufts, trace=None, ggml: str = "2024"):
    """A graph allocator of the given era: "2024" (llama.cpp daa9623, chapter 05) or "2026" (ggml
    0.15.3, this chapter)."""
    if ggml not in ERAS:
        raise GGMLLiteError(f"ggml: one of {sorted(ERAS)}, not {ggml!r}")
    return ERAS[ggml](bufts, trace)


def op_can_inplace_today(op) -> bool:
    """`ggml_op_can_inplace` of ggml 0.15.3 (:22-50), now exported: the 2024 list plus FILL, ADD_ID,
    ROPE_BACK, SILU_BACK, RMS_NORM_BACK and SOFT_MAX_BACK, ops ggml_lite does not have."""
    return op in CAN_INPLACE or getattr(op, "name", op) in CAN_INPLACE_TODAY_ONLY


CAN_INPLACE_TODAY_ONLY = frozenset({"FILL", "ADD_ID", "ROPE_BACK", "SILU_BACK", "RMS_NORM_BACK", "SOFT_MAX_BACK"})
assert not CAN_INPLACE_TODAY_ONLY & {op.name for op in Op}, "ggml_lite learnt an op today's list adds: see above"

# %% [markdown]
# ## 6 · A worked example: one LLaMA block in 20 KiB chunks
#
# Chapter 05's LLaMA block (fixture 06) needs a 42,880-byte compute buffer (ggml reports 42,912 with the CPU
# buffer's 32 bytes). Give the CPU buffer type a limit of 20 KiB. The 2024 allocator ignores it: one 42,880-byte
# buffer. Today's: three chunks of 16,704, 10,240 and 13,760 B, whose sum, 40,704 B, is *smaller* — best fit is a
# heuristic, and this layout left fewer holes. (16 KiB chunks: 42,880 B; 8 KiB: 54,464 B in seven.)

# %%
# NBVAL_CHECK_OUTPUT
def planned(era, max_size=None, trace=None):
    """Fixture 06 planned by `era` ("2024" or "2026") on the CPU buffer type with `max_size`, traced."""
    graph = fixture_graph("06_llama_block")
    galloc = gl.new_gallocr(RecordedBufferType("CPU", 32, max_size), trace=trace, ggml=era)
    assert galloc.reserve(graph) and galloc.alloc_graph(graph)
    return graph, galloc


ev24, ev26 = [], []
gf24, g24 = planned("2024", 20480, ev24.append)
gf26, g26 = planned("2026", 20480, ev26.append)
print("2024:", g24.buf_tallocs[0].max_size, "B in one buffer")
print("2026:", g26.chunk_sizes(0), "=", sum(g26.chunk_sizes(0)), "B; get_buffer_size", g26.get_buffer_size(0))

# %% [markdown]
# That CPU buffer type reports its limit but allocates anything; section 9's `LimitedSimBufferType` refuses more, as
# Vulkan's does. On it the 2024 `reserve` returns false and logs the 42,880 B it could not get; today's gets its
# three chunks, after a dry run: `reserve_n_size` answers [40,704] and leaves no buffer (`[None]`). Today's has
# limits too: fixture 09 in 8 KiB chunks uses all 16, the 16th holding 161,600 B, and its 24 KiB tensors open chunks
# that size, which such a device refuses.

# %%
# NBVAL_CHECK_OUTPUT
from ggml_lite.dyn_tallocr import captured_log  # noqa: E402
from ggml_lite.llama_today import LimitedSimBufferType  # noqa: E402

device_ok = {}
for era in ("2024", "2026"):
    galloc = gl.new_gallocr(LimitedSimBufferType("GPU", 32, 20480), ggml=era)
    if era == "2026":
        dry = galloc.reserve_n_size(fixture_graph("06_llama_block"))
        print("2026 dry run:", dry, "buffers", galloc.buffers)
    with captured_log() as logged:
        device_ok[era] = galloc.reserve(fixture_graph("06_llama_block"))
    print(f"{era}: reserve {device_ok[era]}", galloc.chunk_sizes(0) if era == "2026" else logged[-1])

# %% [markdown]
# ## 7 · Pictures: a compute buffer in chunks
#
# Chapter 05 drew a plan as a memory timeline computed by `trace.lifetimes` from the allocator's events. Today's
# emits them too (a `BufferAddress` for the offset), plus `ChunkAllocEvent` and `ChunkFreeEvent`. `chunk_lifetimes`
# splits the addresses, runs chapter 05's analysis and restores aligned sizes and handed-back tails.

# %%
# | export
def chunk_lifetimes(graph, events) -> list:
    """`[(chunk, trace.Lifetime)]` of a plan traced from `GAllocr2026`: `trace.lifetimes` with offsets in
    their chunk, aligned sizes, an in-place child ending where `ggml_gallocr_free_extra_space` cut the tail."""
    plain, sizes, pending = [], {}, None
    chunks: list[int] = []
    tail: dict = {}
    for ev in events:
        if isinstance(ev, ChunkAllocEvent):
            sizes[ev.tensor] = ev.size
        elif isinstance(ev, ChunkFreeEvent) and ev.tensor is None:
            pending = ev  # a tail, freed just before the in-place child's PlaceEvent
        elif isinstance(ev, PlaceEvent) and isinstance(ev.offset, BufferAddress):
            chunks.append(ev.offset.chunk)
            if pending is not None and ev.how != "new":
                tail[ev.tensor] = pending.offset - ev.offset.offset
            pending, ev = None, replace(ev, offset=ev.offset.offset)
        plain.append(ev)
    out: list[tuple[int, Lifetime]] = []
    placed: dict = {}
    k = 0  # the tensor blocks come one per PlaceEvent, in their order
    for lt in lifetimes(graph, plain):
        if lt.kind == "tensor":
            parent = placed.get(lt.parent)
            own = parent[1].size if parent and lt.how != "new" else sizes.get(lt.tensor, lt.size)
            lt.size = tail.get(lt.tensor, own)
            placed[lt.tensor], k = (chunks[k] if k < len(chunks) else 0, lt), k + 1
            out.append(placed[lt.tensor])
        else:
            out.append((placed[lt.parent][0] if lt.parent in placed else 0, lt))
    return out

# %%
# | export viz.chunks
"""A chunked compute buffer drawn (chapter 12): today's chunks stacked, each as chapter 05's memory timeline,
beside the 2024 allocator's one buffer when given. The analysis is `gallocr_today.chunk_lifetimes`."""

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ggml_lite.gallocr_today import chunk_lifetimes
from ggml_lite.trace import lifetimes
from ggml_lite.viz.timeline import COLORS, _rect


def _blocks(fig, lts, col: int, base: int = 0, legend: bool = True) -> None:
    """A filled rectangle per tensor block of `lts` (`trace.Lifetime`s) at `base` + its offset, named on hover."""
    shown = set()
    for lt in (lt for lt in lts if lt.kind == "tensor" and not lt.superseded):
        x, y = _rect(lt.start - 0.42, lt.end + 0.42, base + lt.offset, base + lt.offset + lt.size)
        fig.add_trace(go.Scatter(x=x[:5], y=y[:5], fill="toself", mode="lines", line=dict(color="white", width=1),
                                 fillcolor=COLORS[lt.how], name=lt.how, legendgroup=lt.how, hoveron="fills",
                                 showlegend=legend and lt.how not in shown, hoverinfo="text",
                                 text=f"{lt.tensor.name}: {lt.size} B at {lt.offset}, nodes {lt.start}..{lt.end}"),
                      row=1, col=col)
        shown.add(lt.how)


def chunk_map(new, chunk_sizes, max_size: int | None = None, old=None, title: str = "a compute buffer in chunks"):
    """`new` = (graph, events) of today's allocator: x = node, y = bytes, its chunks stacked bottom to top in
    boxes with gaps, a rectangle per tensor over its lifetime. With `old` = (graph, events) of the 2024
    allocator, its one buffer on the left, on the same scale, with `max_size` (if any) as a dashed line."""
    n, col, base, k = len(new[0].nodes), 1 + (old is not None), 0, len(chunk_sizes)
    limit = f" (max_size {max_size:,} B)" if max_size else ""
    titles = [f"today: {k} chunk{'s' * (k != 1)}, {sum(chunk_sizes):,} B{limit}"]
    if old is not None:
        lts = lifetimes(*old)
        titles.insert(0, f"2024: one buffer of {max(lt.offset + lt.size for lt in lts if lt.kind == 'tensor'):,} B")
    fig = make_subplots(rows=1, cols=col, shared_yaxes=True, horizontal_spacing=0.04, subplot_titles=titles)
    if old is not None:
        _blocks(fig, lts, 1)
    if old is not None and max_size:
        fig.add_shape(type="line", x0=-0.5, x1=n - 0.5, y0=max_size, y1=max_size, row=1, col=1,
                      line=dict(color="crimson", dash="dash"))
    cls = chunk_lifetimes(*new)
    for c, size in enumerate(chunk_sizes):
        _blocks(fig, [lt for chunk, lt in cls if chunk == c], col, base, legend=old is None and c == 0)
        fig.add_shape(type="rect", x0=-0.5, x1=n - 0.5, y0=base, y1=base + size, line=dict(color="gray"),
                      row=1, col=col)
        fig.add_annotation(x=-0.5, y=base + size, text=f"chunk {c}: {size:,} B", showarrow=False, xanchor="left",
                           yanchor="bottom", font=dict(size=10), row=1, col=col)
        base += size + max((max_size or max(chunk_sizes)) // 8, 1)
    fig.update_xaxes(title_text="node (execution order)")
    fig.update_layout(title=title, height=520, plot_bgcolor="white", margin=dict(l=60, r=20, t=70, b=50),
                      yaxis_title="bytes", legend=dict(orientation="h", y=-0.15, x=0, yanchor="top"))
    return fig

# %% [markdown]
# The LLaMA block of the example, both eras on one byte scale: the 2024 buffer crosses the 20 KiB line at node 4 and
# reaches 42,880 B; today's chunk 1 opens at node 4, and chunk 2 holds one tensor, `ffn_up-0` (13,760 B, node 25),
# that fitted no hole. Then 4.1's graph on the Metal-like buffer type: in 2024 `z` sits above `m`'s dead tail.

# %%
from ggml_lite.viz.chunks import chunk_map  # noqa: E402

chunk_map((gf26, ev26), g26.chunk_sizes(0), 20480, old=(gf24, ev24), title="fixture 06 in 20 KiB chunks").show()
traced = {era: (padded_graph(), []) for era in ("2024", "2026")}
for era, (gf, ev) in traced.items():
    assert gl.new_gallocr(metal_like, trace=ev.append, ggml=era).reserve(gf)
chunk_map(traced["2026"], [2048], old=traced["2024"], title="an in-place child's tail, 2024 and today").show()

# %% [markdown]
# ## 8 · The scheduler today
#
# The scheduler that drives this allocator changed too. Chapter 09's is `ggml-backend.c` of 2024; today's is
# `ggml-backend.cpp`, mostly the same code in C++ dress. What changed, for ggml_lite's graphs:
#
# | change | 2024 | ggml 0.15.3 | the port |
# |---|---|---|---|
# | inputs copied into one split | at most 10 (`GGML_MAX_SRC`) | at most 30 | `max_split_inputs` |
# | an op whose weight is on the CPU | a device that asks for it gets it | only with `op_offload`, from host memory | `op_offload=` |
# | a ROPE with a weight source | follows the weight | the weight is ignored | pass 1 |
# | a view of an allocated tensor | cause `1.vsrc` | cause `1.dst` (same backend) | pass 1 |
# | a weight on another backend whose memory the split's backend can use | starts a split | stays in the split | `weights_split_always` |
# | a node unassigned after pass 4 | stays at −1 | the first backend that supports it, or an assert | `pass4` |
# | the last backend | `ggml_backend_is_cpu` | its device's type is CPU | `backend_dev_type` |
# | the compute buffers | one per backend | chunks where the buffer type has a `max_size` | `GAllocr2026` (1–7) |
#
# Not ported, as they change no placement: the pipeline copy's choice, the synchronizations, the dry run
# `ggml_backend_sched_reserve_size`; nor what ggml_lite has nothing for (`MUL_MAT_ID`'s experts, `graph_optimize`).
#
# ### 8.1 · `ggml_backend_sched_new`: 30 inputs, a switch, a device type
#
# 2024 (`ggml_backend_sched_new`, ggml-backend.c:1547-1590, and ggml-backend.c:808-809):
#
# ```c
# #define GGML_SCHED_MAX_SPLIT_INPUTS GGML_MAX_SRC
#     GGML_ASSERT(ggml_backend_is_cpu(backends[n_backends - 1])); // last backend must be CPU
# ```
#
# ggml 0.15.3 (`ggml_backend_sched_new` (ggml-backend.cpp:1727-1794), and ggml-backend.cpp:756-757):
#
# ```c
# #define GGML_SCHED_MAX_SPLIT_INPUTS 30
#         bool op_offload) {
#     GGML_ASSERT(ggml_backend_dev_type(ggml_backend_get_device(backends[n_backends - 1])) == GGML_BACKEND_DEVICE_TYPE_CPU);
#     sched->op_offload = op_offload;
# ```
#
# **30 inputs.** Pass 5 tests a split's inputs only when it is *full*: a node that arrives with 9 taken and brings
# two new ones overflows it, and the C asserts. Pull request 15722 (September 2025) met this with Gemma 3n and flash
# attention on six GPUs (19 inputs in a split) and raised the limit to 30. **The CPU check** asks the device's type:
# `ggml-backend.cpp` is part of ggml-base, which no longer links the CPU backend (home of `ggml_backend_is_cpu`).
# For ggml_lite's backends both rules accept the same lists; the error names the device type. The port: chapter 09's
# class, four class attributes set otherwise (allocator, input limit, 8.2's passes and weight rule), a constructor.

# %%
# | export sched_today
"""ggml's backend scheduler as of ggml 0.15.3 (ggml-backend.cpp) beside the 2024 one of chapter 09: what
changes where tensors go and how the compute buffers are planned. The rest is `ggml_lite.sched`."""

from typing import TYPE_CHECKING

from ggml_lite.bind import method_of
from ggml_lite.buffer import BufferUsage
from ggml_lite.cpu import is_cpu
from ggml_lite.errors import SchedulerError
from ggml_lite.gallocr_today import GAllocr2026
from ggml_lite.graph import GGML_DEFAULT_GRAPH_SIZE, graph_view
from ggml_lite.sched import GGML_SCHED_MAX_BACKENDS, PASSES, BackendSched
from ggml_lite.tensor import Op


def backend_dev_type(backend) -> str:
    """`ggml_backend_dev_type` (ggml-backend.cpp:583-586) of a backend's device. ggml_lite has no device
    objects: the CPU backend's device is of type "CPU", any other's (SIM) "GPU"."""
    return "CPU" if is_cpu(backend) else "GPU"


class BackendSched2026(BackendSched):
    """`struct ggml_backend_sched` of ggml 0.15.3 (`ggml_backend_sched_new` (ggml-backend.cpp:1727-1794)):
    chapter 09's scheduler with 30 inputs per split, `op_offload` (False: llama.cpp's `--no-op-offload`),
    the last backend's device type checked, pass 4's last resort, pass 5's weight rule of today, and
    `GAllocr2026` planning the compute buffers (in chunks where a buffer type has a `max_size`)."""

    galloc_class, max_split_inputs, weights_split_always = GAllocr2026, 30, False
    passes = property(lambda sched: (*PASSES[:3], pass4, PASSES[4]))  # pass 4 with its last resort

    def __init__(self, backends, bufts=None, graph_size: int = GGML_DEFAULT_GRAPH_SIZE, parallel: bool = False,
                 op_offload: bool = True, debug: bool | None = None):
        backends = list(backends)
        if 0 < len(backends) <= GGML_SCHED_MAX_BACKENDS and backend_dev_type(backends[-1]) != "CPU":
            raise SchedulerError(f"the last backend's device must be of type CPU, got {backends[-1].get_name()} "
                                 f"(device type {backend_dev_type(backends[-1])})")
        self.op_offload = bool(op_offload)
        super().__init__(backends, bufts, graph_size, parallel, debug)

# %% [markdown]
# ### 8.2 · Passes 1, 4 and 5: which weights decide, and a last resort
#
# 2024 (`ggml_backend_sched_backend_id_from_cur`, ggml-backend.c:898-946; then its split_graph):
#
# ```c
#         if (src->buffer != NULL && src->buffer->usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS) {
#             if (src_backend_id == sched->n_backends - 1) {
#                         if (src_backend_id != cur_backend_id) {
# ```
#
# ggml 0.15.3 (`ggml_backend_sched_backend_id_from_cur` (ggml-backend.cpp:878-933), then pass 5):
#
# ```c
#         if (tensor->op != GGML_OP_ROPE && src->buffer != NULL && src->buffer->usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS) {
#             if (sched->op_offload && src_backend_id == sched->n_backends - 1 && ggml_backend_buffer_is_host(src->buffer)) {
#                         if (src_backend_id != cur_backend_id && !ggml_backend_sched_buffer_supported(sched, src, cur_backend_id)) {
# ```
#
# **`op_offload`.** Since March 2024 a device may take an op whose weight is in CPU memory (CUDA asks for batches of
# 32 rows or more), copying the weight each time. Once `--override-tensor` (January 2025) let users keep the experts
# of large mixture-of-experts models in host memory on purpose, those copies made prompt processing slow (issue
# 13241, llama 4 400B; the only escape was a micro-batch under 32). Pull request 13386 (May 2025) added
# `--no-op-offload` (`op_offload` false). **Host memory only** (pull requests 11120 and 11124, January 2025): the
# CPU backend's repacked weight buffers hold rearranged bytes a device cannot copy as they are; ggml_lite's CPU
# backend takes host buffer types only. **ROPE's** weight is a small table of frequency factors. **A view** is
# placed by its view_src's buffer in the first test, so `1.vsrc` never happens. **Pass 5** cuts at a weight on
# another backend only when the split's backend cannot read its memory. The port corrects chapter 09's pass 1 in
# these cases; pass 5 reads `weights_split_always`.

# %%
# | export sched_today
@method_of(BackendSched2026)
def backend_id_from_cur(sched, tensor) -> int:
    """`ggml_backend_sched_backend_id_from_cur` (ggml-backend.cpp:878-933): chapter 09's pass 1, its answer
    corrected where today's C decides otherwise: "1.vsrc" is "1.dst" (`ggml_backend_sched_backend_from_buffer`
    (ggml-backend.cpp:845-865) reads a view's view_src), a ROPE's weight decides nothing, and an op leaves
    its CPU weight only with `op_offload` and a weight in host memory."""
    b = BackendSched.backend_id_from_cur(sched, tensor)
    cause = sched.causes.get(tensor, "")
    if cause == "1.vsrc":
        sched.causes[tensor] = "1.dst"
    elif cause == "1.off" or cause.startswith("1.wgt"):
        if tensor.op is Op.ROPE:  # skip ROPE: the rope freqs tensor is too small to choose a backend
            del sched.causes[tensor]
            return -1
        i, src = next((i, s) for i, s in enumerate(tensor.src)
                      if s is not None and s.buffer is not None and s.buffer.usage == BufferUsage.WEIGHTS)
        if cause == "1.off" and not (sched.op_offload and src.buffer.is_host()):
            sched.causes[tensor] = f"1.wgt{i}"  # it stays with its weight, on the CPU
            return sched.n_backends - 1
    return b

# %% [markdown]
# Pass 4 gained a last resort (`ggml_backend_sched_split_graph` (ggml-backend.cpp:1014-1487)):
#
# ```c
#         // if the node is still unassigned, assign it to the first backend that supports it
#         for (int b = 0; b < sched->n_backends && *cur_backend_id == -1; b++) {
#             ggml_backend_sched_set_if_supported(sched, node, b, cur_backend_id);
#         }
#         GGML_ASSERT(*cur_backend_id != -1);
# ```
#
# It catches a view of a leaf that is neither an input nor allocated (the differential generator's graphs have such
# leafs): no pass before gives the leaf a backend, so in 2024 the view stays at −1. The port runs chapter 09's pass
# 4 one node at a time (a one-node `graph_view`) and the resort after each; the leaf itself stays unassigned, and
# today's allocator then stops on it (`GGML_ASSERT(buffer_id >= 0)`; here a `BufferIdError`). On 150 random graphs
# ggml 0.15.3's scheduler makes the same splits, backends and chunks (`test_sched_today_differential.py`).

# %%
# | export sched_today
def pass4(sched, graph) -> None:
    """Pass 4 of `ggml_backend_sched_split_graph` (ggml-backend.cpp:1014-1487): chapter 09's, node by node,
    each node still unassigned then given the first backend that supports it."""
    for i, node in enumerate(graph.nodes):
        PASSES[3](sched, graph_view(graph, i, i + 1))  # chapter 09's pass 4 on this node
        for b in range(sched.n_backends):
            if sched.ids.get(node, -1) != -1:
                break
            sched.set_if_supported(node, b)
        if sched.ids.get(node, -1) == -1:  # GGML_ASSERT(*cur_backend_id != -1)
            raise SchedulerError(f"pass 4: no backend supports {node.name!r} ({node.op.name})")

# %% [markdown]
# ### 8.3 · Worked examples
#
# **Many inputs.** A SIM device holds a weight `w`, the CPU the inputs. *Overflow*: nine products `w·x_i`, then
# `w·(x9 + x10)`: the add, on SIM by pass 2, brings two new inputs when nine are taken. *Fan-in*: twelve summed.

# %%
# NBVAL_CHECK_OUTPUT
from ggml_lite.errors import SchedulerError  # noqa: E402
from ggml_lite.sched_today import BackendSched2026  # noqa: E402

ERAS_S = (("2024", gl.BackendSched), ("2026", BackendSched2026))
sim_s, cpu_s = gl.sim_init("SIM", asynchronous=False), gl.cpu_init()


def weight_on(backend):
    """A 64×64 f32 weight in a weights buffer of `backend`."""
    c = gl.Context(f"weights:{backend.get_name()}")
    w = c.new_tensor_2d(gl.F32, 64, 64, name="w")
    gl.alloc_ctx_tensors(c, backend).set_usage(gl.BufferUsage.WEIGHTS)
    return w


def fan_in(weight, n=12, overflow=False):
    """`weight`·x_i for `n` inputs x_i (on the CPU), summed; `overflow`: the tenth product is of x9 + x10."""
    c = gl.Context("compute")
    xs = [c.new_tensor_2d(gl.F32, 64, 8, name=f"x{i}") for i in range(n)]
    for x in xs:
        gl.set_input(x)
    xs = [*xs[:9], gl.add(c, xs[9], xs[10]).set_name("x9+x10")] if overflow else xs
    out = gl.mul_mat(c, weight, xs[0])
    for i, x in enumerate(xs[1:], 1):
        out = gl.add(c, out, gl.mul_mat(c, weight, x).set_name(f"y{i}")).set_name(f"s{i}")
    gl.set_output(out)
    return gl.build_forward(out)


w_s, fans, fan_graphs = weight_on(sim_s), {}, {}
for era, cls in ERAS_S:
    try:
        cls([sim_s, cpu_s]).split_graph(fan_in(w_s, 11, overflow=True))
        print(era, "overflow: one split")
    except SchedulerError as e:
        print(era, "overflow:", e)
    fans[era] = s = cls([sim_s, cpu_s])
    assert s.reserve(fan_in(w_s))
    s.split_graph(fan_graphs.setdefault(era, fan_in(w_s)))
    print(era, "fan-in: (start, end, inputs)", [(p.i_start, p.i_end, p.n_inputs) for p in s.splits],
          "buffers", {b.get_name(): s.get_buffer_size(b) for b in (sim_s, cpu_s)})

# %% [markdown]
# In 2024 the overflow is an assert (here a `SchedulerError`): the test for a full split looks for exactly 10
# inputs, and the add arrives at 9. Today it is one split of 11. The fan-in is cut after its tenth input in 2024
# (nodes 0-18, then 19-22) and stays whole today: one synchronization fewer, but a split's inputs are all copied in
# at its start, so twelve copies live together and SIM's compute buffer grows from 22,528 B to 26,624 B (two more 2
# KiB copies); the CPU's stays 24,608 B. Below, the 2024 split; today's makes no cut at node 19 (dotted).

# %%
from ggml_lite.viz.sched import sched_graph_figure  # noqa: E402

sched_graph_figure(fans["2024"], fan_graphs["2024"], title="2024: the fan-in of twelve inputs, cut after ten")

# %% [markdown]
# **`--no-op-offload`.** Now the weight is on the CPU and SIM offloads like CUDA (`offload="cuda"`, chapter 08). A
# product of 32 rows goes to SIM in both eras (`1.off`), with a copy of the weight among its split's two inputs;
# with `op_offload=False` it stays with its weight (`1.wgt0`): one CPU split, nothing copied. On recorded scenario
# 08 (a 4-layer LLaMA, weights on the CPU, a FAKE device with CUDA's rule) both eras make ggml's 43 splits;
# `op_offload=False`, one. Both eras agree on all 14 recorded scenarios (`test_sched_today.py`).

# %%
# NBVAL_CHECK_OUTPUT
sim_o = gl.sim_init("SIM", asynchronous=False, offload="cuda")
w_c, offload, placed = weight_on(cpu_s), {}, {}
for label, cls, kw in (*((era, cls, {}) for era, cls in ERAS_S), ("2026 op_offload=False", BackendSched2026,
                                                                 {"op_offload": False})):
    c = gl.Context("compute")
    x = c.new_tensor_2d(gl.F32, 64, 32, name="x")
    gl.set_input(x)
    y = gl.silu(c, gl.mul_mat(c, w_c, x).set_name("h"))
    gl.set_output(y)
    offload[label] = s = cls([sim_o, cpu_s], **kw)
    s.split_graph(g := gl.build_forward(y))
    placed[label] = (s.get_tensor_backend(g.nodes[0]).get_name(), s.get_cause(g.nodes[0]))
    print(f"{label:22s} h on {placed[label]}, splits", [(s.backends[p.backend_id].get_name(),
                                                          [t.name for t in p.inputs]) for p in s.splits])

# %% [markdown]
# ## 9 · What it changes for real models
#
# Both, at a model's scale. Since PR 15815 ggml-vulkan's buffer type reports its suballocation block, 1 GiB by
# default, as `get_max_size`, and its `alloc_buffer` returns NULL for a size the driver refuses. Below, chapter 10's
# GPU on a device that allocates at most 1 GiB at once (a subclass: chapter 08's SIM type allocates any size),
# passed to `plan_memory` as `gpu_init` with the scheduler as `sched_class`. **Scope:** every graph here is
# llama.cpp daa9623's (chapter 10's builder: no flash attention, an f32 `KQ` of n_kv × n_ubatch × n_head per layer).

# %%
# | export llama_today
"""Chapter 10's LLaMA on a GPU that allocates at most 1 GiB at once, like Vulkan (chapter 12, section 9).
Every graph is llama.cpp daa9623's builder."""

import logging
from collections import namedtuple

from ggml_lite.gallocr_today import ChunkedDynTAllocr, GAllocr2026
from ggml_lite.models.llama import plan_memory, preset
from ggml_lite.sched_today import BackendSched2026
from ggml_lite.sim import SimBackend, SimBufferType

GiB = 1 << 30


class LimitedSimBufferType(SimBufferType):
    """A SIM buffer type that refuses an allocation above its `max_size`, as ggml-vulkan's
    `ggml_backend_vk_buffer_type_alloc_buffer` does (an error, then NULL)."""

    def alloc_buffer(self, size):
        if size <= self.max_size:
            return super().alloc_buffer(size)
        logging.getLogger("ggml_lite").error("%s: cannot allocate %d B (max_size %d)", self.name, size, self.max_size)
        return None


def vulkan_like(max_size: int = GiB):
    """`plan_memory`'s `gpu_init`: chapter 10's GPU, allocating at most `max_size` bytes at once."""
    return lambda name: SimBackend(name, 128, offload="cuda", buft=LimitedSimBufferType(name, 128, max_size))

# %% [markdown]
# A `Row` is one configuration's GPU compute buffer. **2024 buffer**: the one buffer the 2024 scheduler and
# allocator ask for; *refused* above the limit (`ggml_gallocr_reserve_n` returns false, llama.cpp "failed to
# allocate compute buffers"). **Chunks**: today's scheduler and allocator's. **Tails**: their sum minus `unbounded`,
# today's plan of the same split graph without a limit — what the room a chunk could not use costs. **Live peak**:
# the most bytes live at once. **Sept 2025**: the same split graph by `last_block="first"`; **saved**: its excess.

# %%
# | export llama_today
class Row(namedtuple("Row", "config buffer_2024 ok_2024 chunks ok chunks_first ok_first unbounded live_peak largest")):
    """One configuration's GPU compute buffer, in bytes (`ok*`: the device allocated it)."""

    tails = property(lambda r: sum(r.chunks) - r.unbounded)
    saved = property(lambda r: sum(r.chunks_first) - sum(r.chunks))


def compare(model: str, n_ctx: int, n_ubatch: int = 512, n_gpu_layers: int = 0, max_size: int = GiB,
            sched_class=BackendSched2026) -> Row:
    """`plan_memory` on one `vulkan_like(max_size)` GPU by the 2024 scheduler and by `sched_class`; then
    that split graph by September 2025's rule and, with no limit, by today's (counting live bytes)."""
    kw: dict = dict(n_ctx=n_ctx, n_ubatch=n_ubatch, n_gpu_layers=n_gpu_layers, devices=1,
                    gpu_init=vulkan_like(max_size))
    old, new = plan_memory(preset(model), **kw), plan_memory(preset(model), **kw, sched_class=sched_class)
    sched = new["sched"]
    split, gpu = (sched.graph, sched.node_backend_ids, sched.leaf_backend_ids), sched.bufts[0]
    first = GAllocr2026(sched.bufts, last_block="first")
    ok_first = first.reserve_n(*split)
    free = GAllocr2026([SimBufferType(gpu.name, gpu.alignment) if b is gpu else b for b in sched.bufts])
    live = [0, 0, 0]  # bytes live now, their most, the largest tensor

    def count(ev):
        size = ev.size if ev.kind == "chunk_alloc" else -ev.size
        live[:] = [live[0] + size, max(live[1], live[0] + size), max(live[2], size)]
    free.buf_tallocs[0].trace = count
    unbounded = free.reserve_n_size(*split)[0]
    chunks = [tuple(c.max_size for c in t.chunks) for t in (sched.galloc.buf_tallocs[0], first.buf_tallocs[0])
              if isinstance(t, ChunkedDynTAllocr)]  # (today's allocators)
    return Row((model, n_ctx, n_ubatch, n_gpu_layers), old["sched"].galloc.buf_tallocs[0].get_max_size(),
               old["reserved"], chunks[0], new["reserved"], chunks[1], ok_first, unbounded, live[1], live[2])


def table(rows) -> str:
    """`rows` as a markdown table, in MiB with two decimals."""
    def mib(n, ok=True):
        return f"{n / 2**20:.2f}" + ("" if ok else " refused")
    return "\n".join(["| model | n_ctx | n_ubatch | ngl | 2024 buffer | today's chunks | sum | tails | live peak | "
                      "Sept 2025 | saved |", "|---" * 11 + "|"] + [" | ".join(
        ["", *map(str, r.config), mib(r.buffer_2024, r.ok_2024), " + ".join(map(mib, r.chunks)),
         mib(sum(r.chunks), r.ok), mib(r.tails), mib(r.live_peak), mib(sum(r.chunks_first), r.ok_first),
         mib(r.saved), ""]).strip() for r in rows])

# %%
# NBVAL_CHECK_OUTPUT
from ggml_lite.llama_today import compare, table  # noqa: E402

print(table([compare("llama-2-7b", 12500, 512, 19), compare("llama-2-7b", 8192, 1024, 19)]))

# %% [markdown]
# The first is PR 16788's own example (Llama-2 7B, 19 layers offloaded, micro-batch 512, 12,500 tokens). The 2024
# llama.cpp stops there: one buffer of 1049.94 MiB, 782 MiB of it a layer's `KQ`. Today's gives the `KQ`s a chunk of
# their own: the same 1049.94 MiB in two allocations the device accepts. September 2025's rule grew the first chunk
# whose last block fitted and asks 684.25 MiB more, the very saving PR 16788 measured on today's graph (1711.19 →
# 1026.94 MiB). In the second each `KQ` is exactly 1 GiB: once one is freed, `reuse_factor` puts the next layer's 64
# MiB copy of `v` at the start of its empty chunk (it fits without growing a chunk), so the next `KQ` opens a third
# chunk. A heuristic: here it costs 857 MiB. `python benchmarks/chunked_llama.py` prints these two and six more (in 1
# s; the 2024 scheduler with today's allocator gives the same numbers, so the allocator alone makes them):
#
# | model | n_ctx | n_ubatch | ngl | 2024 buffer | today's chunks | sum | tails | live peak | Sept 2025 | saved |
# |---|---|---|---|---|---|---|---|---|---|---|
# | llama-2-7b | 4096 | 512 | 33 | 296.00 | 296.00 | 296.00 | 0.00 | 280.00 | 296.00 | 0.00 |
# | llama-2-7b | 16384 | 512 | 33 | 1088.00 refused | 72.00 + 1024.00 | 1096.00 | 8.00 | 1072.00 | 1115.00 | 19.00 |
# | llama-2-7b | 12288 | 1024 | 33 | 1648.01 refused | 128.01 + 1536.00 | 1664.01 refused | 16.00 | 1616.01 | 1702.01 refused | 38.00 |
# | llama-2-13b | 12288 | 512 | 20 | 1270.00 refused | 310.00 + 960.00 | 1270.00 | 0.00 | 1244.00 | 1345.00 | 75.00 |
# | llama-2-70b | 8192 | 512 | 40 | 1184.00 refused | 176.00 + 1024.00 | 1200.00 | 16.00 | 1104.00 | 1688.00 | 488.00 |
# | llama-3-8b | 16384 | 512 | 19 | 1268.50 refused | 266.50 + 1024.00 | 1290.50 | 22.00 | 1260.50 | 2042.00 | 751.50 |
#
# `--all` plans 324 configurations (every preset, n_ctx 4096 to 32,768, micro-batch 512 and 1024, no, half and full
# offload) in about a minute. Of the 300 that load, the 2024 buffer is refused in 235; today's chunks are allocated
# in 64 of those, and the other 171 hold a `KQ` above 1 GiB, which no chunk splits. Where both rules allocate,
# `reuse_factor` saves in 34 (up to 804 MiB), costs in 6 (up to 857 MiB), ties in 24; tails cost in 20 (≤ 1008 MiB).

# %% [markdown]
# ## 10 · Check

# %%
_, unlimited = planned("2026")
assert unlimited.chunk_sizes(0) == [g24.buf_tallocs[0].max_size]  # no limit: one chunk, the 2024 plan
assert g26.chunk_sizes(0) == [16704, 10240, 13760] and g24.buf_tallocs[0].max_size == 42880
assert g26.get_buffer_size(0) == 40704 + 3 * 32  # the chunks, each a 2024 CPU buffer (+32)
assert str(z_addr) == "1:0"  # best fit chunk by chunk: the last chunk with a fitting hole wins
assert chunk_totals == {"first": 1536, "reuse_factor": 1280}  # reuse_factor: no chunk grows
assert padded_sizes == {"2024": 3072, "2026": 2048}  # the in-place child's tail handed back
assert replaced == [True, False, True, True]  # any chunk grew: a new buffer, here with fewer chunks
assert device_ok == {"2024": False, "2026": True} and dry == [40704]
assert all(op_can_inplace_today(op) == (op in CAN_INPLACE) for op in Op)  # same in-place ops on ggml_lite's graphs
assert [p.n_inputs for p in fans["2024"].splits] == [10, 2] and [p.n_inputs for p in fans["2026"].splits] == [12]
assert placed == {"2024": ("SIM", "1.off"), "2026": ("SIM", "1.off"), "2026 op_offload=False": ("CPU", "1.wgt0")}
assert BackendSched2026.max_split_inputs == 30 and gl.BackendSched.max_split_inputs == 10
print("chapter 12 checks passed")

# %% [markdown]
# ## 11 · Exercises
#
# Three exercises, about 45 minutes, all on today's chunked dynamic allocator (§2). Predictions are answered
# with `answer(id, value)`: replace the `...` and run the cell; it says right or wrong, then why. An
# implementation is graded with `check(id, fn)` against `ChunkedDynTAllocr` on the chapter's cases, on
# every allocation today's allocator makes while planning the 13 single graphs of `tests/fixtures/ggml-today`
# and on random ones; a failure shows the smallest case where your function and ggml 0.15.3 disagree and the
# rule it breaks. `python -m ggml_lite exercises` lists what you have done. Solutions are in appendix A10;
# try first.

# %%
from ggml_lite.exercises import answer, check, done  # noqa: E402

# %% [markdown]
# **12.1 · Predict** (medium, 5 min). A `ChunkedDynTAllocr(alignment=32, max_buffer_size=1024)`, empty. Allocate
# `a` (300 B), `b` (900 B) and `c` (2,000 B), free `b`, then allocate `d` (100 B). What are the chunks' sizes
# then (each chunk's `max_size`, in chunk order), as a list?

# %%
answer("12.1", ...)

# %% [markdown]
# **12.2 · Implement** the chunk `ggml_dyn_tallocr_alloc` chooses (medium, 25 min). From the C of ggml
# 0.15.3 (`ggml_dyn_tallocr_alloc`, ggml-alloc.c:201-308):
#
# ```c
#     for (int c = 0; c < alloc->n_chunks; ++c) {
#         struct tallocr_chunk * chunk = alloc->chunks[c];
#         size_t best_fit_size = SIZE_MAX;
#         for (int i = 0; i < chunk->n_free_blocks - 1; i++) {
#             struct free_block * block = &chunk->free_blocks[i];
#             if (block->size >= size && block->size <= best_fit_size) {
#                 best_fit_chunk = c;
#                 best_fit_block = i;
#                 best_fit_size = block->size;
#             }
#         }
#     }
#     if (best_fit_block == -1) {
#         int64_t best_reuse = INT64_MIN;
#         for (int c = 0; c < alloc->n_chunks; ++c) {
#             struct tallocr_chunk * chunk = alloc->chunks[c];
#             if (chunk->n_free_blocks > 0) {
#                 struct free_block * block = &chunk->free_blocks[chunk->n_free_blocks - 1];
#                 int64_t reuse_factor = chunk->max_size - block->offset - size;
#                 bool better_reuse = best_reuse < 0 && reuse_factor > best_reuse;
#                 bool better_fit = reuse_factor >= 0 && reuse_factor < best_reuse;
#                 if (block->size >= size && (better_reuse || better_fit)) {
#                     best_fit_chunk = c;
#                     best_fit_block = chunk->n_free_blocks - 1;
#                     best_reuse = reuse_factor;
# ...
#     if (best_fit_block == -1) {
#         best_fit_chunk = ggml_dyn_tallocr_new_chunk(alloc, size);
# ```
#
# A chunk is given as `(free_blocks, max_size)`: its free list `[(offset, size), ...]` sorted by offset (the
# last entry is its last block; a full chunk has none) and its high-water mark. `size` is already aligned.
# Return the index of the chosen chunk, or `len(chunks)` for a new one (there are never 16 chunks here).

# %%
# exercise 12.2
def choose_chunk(chunks, size):
    """`chunks`: a list of `(free_blocks, max_size)`, `free_blocks` a list of `(offset, size)`; `size`: the
    tensor's aligned size. Returns the index of the chunk it goes to, `len(chunks)` for a new chunk."""
    raise NotImplementedError  # your code here


check("12.2", choose_chunk)

# %% [markdown]
# **12.3 · Explore** (medium, 15 min). `reuse_factor` saved 684 MiB on PR 16788's example and cost 857 MiB on
# another (§9). Make it cost in miniature: on a `ChunkedDynTAllocr(32, 1024)`, find a short sequence of
# allocations and frees after which today's chunks add up to more bytes than those of `last_block="first"`
# (September 2025's rule: the first chunk whose last block fits). Run `done("12.3")` when you have an answer.
#
# <details><summary>A worked answer</summary>
#
# Allocate `p` (512 B), then `q` (1,024 B), free `q`, then allocate `r` (256 B) and `s` (1,024 B). `p` opens
# chunk 0, and `q`, too large for chunk 0's last 512 B, opens chunk 1 and fills it. Once `q` is freed, chunk
# 1 is empty but 1,024 B large. For `r`, no chunk has a hole besides its last block, so the last blocks
# decide. `reuse_factor` scores chunk 0 at 512 − 512 − 256 = −256 (it would grow) and chunk 1 at
# 1,024 − 0 − 256 = 768 (it would not), so `r` goes to 1:0. Now `s` finds no room anywhere: chunk 0 has
# 512 B left, chunk 1 has 768. It opens chunk 2: the chunks are 512 + 1,024 + 1,024 = 2,560 B.
#
# The September 2025 rule puts `r` in the first chunk whose last block fits, chunk 0, at 512 (chunk 0 grows to
# 768 B), and `s` then takes the empty chunk 1 whole: 768 + 1,024 = 1,792 B, 768 B less. `reuse_factor`
# judges one tensor at a time: to spare chunk 0 256 B of growth, it put `r` into the one place where the
# next large tensor would have fitted. This is §9's second model at 1/2²⁰ scale: a small copy of `v` at the
# start of a freed 1 GiB chunk, and the next `KQ` in a chunk of its own.
#
# </details>
