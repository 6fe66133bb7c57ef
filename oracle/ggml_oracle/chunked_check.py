"""ggml_lite's chunked allocator (`ggml_lite.gallocr_today.GAllocr2026`) against the real ggml 0.15.3 on
buffer types with a `max_size`: one graph at many limits, one allocator across two graphs, the dry run.

ggml_lite plans on `RecordedBufferType("CPU", 32, max_size)` (the CPU buffer type with a limit, as a
graph file records it); ggml on `chunked.max_size_buffer_type(max_size)`. A tensor's chunk on ggml_lite's
side is the index of its `buffer` among `galloc.buffers[0].chunks` (a view carries its source's
buffer), its offset `data` minus that chunk's base. Compared: the ok flags, the chunk sizes ggml_lite
asked for (`galloc.chunk_sizes(0)`) against the dynamic allocator's plan in the C (`tallocr_chunk.max_size`,
which is also what each chunk buffer was asked for), the buffer size (ggml_lite's CPU buffers keep the
2024 padding of 32 bytes per buffer, so ggml_lite's = ggml's + 32 per chunk) and every tensor's
(chunk, offset), views and tensors outside the compute buffer included.

`draw_max_sizes` draws the limits relative to the graph's unbounded peak and its largest tensor so that
plans of 2 to 16 chunks all occur; `check_chunked_graph` mirrors a random graph once and plans it at
each limit on both sides (the mirror and ggml_lite's tensors are put back as they were between plans).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import ggml_lite as gl
from ggml_lite.gallocr_today import ChunkedDynTAllocr, GAllocr2026
from ggml_lite.schema import RecordedBufferType

from .bindings import ALIGNMENT, CPU_BUFFER_SIZE_DELTA
from .chunked import UNLIMITED, VBUFFER_MAX_CHUNKS, RealGAllocr, aligned_size, chunked_plan, restore, snapshot
from .mirror import Mirror, mirror
from .plans import Difference

LIMIT_KINDS = ("between", "log", "below_largest")


def lite_buffer_type(max_size: int = UNLIMITED):
    """ggml_lite's counterpart of `max_size_buffer_type(max_size)`: the CPU buffer type itself when
    unlimited, else a `RecordedBufferType` named "CPU" with alignment 32 and that limit."""
    return gl.cpu_buffer_type() if max_size == UNLIMITED else RecordedBufferType("CPU", ALIGNMENT, max_size)


def lite_placements(galloc, tensors) -> dict:
    """{tensor: (chunk, offset) in `galloc`'s compute buffer (buffer 0), or None outside it}."""
    vbuf = galloc.buffers[0]
    chunks = list(vbuf.chunks) if vbuf is not None else []
    out = {}
    for t in tensors:
        c = next((i for i, b in enumerate(chunks) if t.buffer is b), None)
        out[t] = None if c is None or t.data is None else (c, t.data - chunks[c].get_base())
    return out


def lite_chunked_plan(graph, tensors, max_size: int = UNLIMITED) -> dict:
    """`chunked_plan`'s counterpart: `GAllocr2026(lite_buffer_type(max_size))`, reserve, alloc_graph;
    ``{"chunk_sizes": asked per chunk, "buffer_size", "placements", "reserve_ok", "alloc_ok"}``."""
    galloc = GAllocr2026(lite_buffer_type(max_size))
    try:
        reserve_ok = bool(galloc.reserve(graph))
        alloc_ok = bool(galloc.alloc_graph(graph)) if reserve_ok else False
        return {"chunk_sizes": galloc.chunk_sizes(0), "buffer_size": galloc.get_buffer_size(0),
                "placements": lite_placements(galloc, tensors), "reserve_ok": reserve_ok, "alloc_ok": alloc_ok}
    finally:
        galloc.free()


def compare_chunked(lite: dict, ref: dict) -> list:
    """The differences between a `lite_chunked_plan` and a `chunked_plan` (empty: identical)."""
    out = []
    for key in ("reserve_ok", "alloc_ok"):
        if lite[key] != ref[key]:
            out.append(Difference(key, None, lite[key], ref[key]))
    if lite["chunk_sizes"] != ref["planned_chunk_sizes"]:
        out.append(Difference("chunk sizes", None, lite["chunk_sizes"], ref["planned_chunk_sizes"]))
    if ref["chunk_sizes"] != ref["planned_chunk_sizes"]:  # ggml's own buffers against its plan
        out.append(Difference("ggml's chunk buffers against its plan", None, ref["planned_chunk_sizes"],
                              ref["chunk_sizes"]))
    want = ref["buffer_size"] + CPU_BUFFER_SIZE_DELTA * len(ref["chunk_sizes"])
    if lite["buffer_size"] != want:
        out.append(Difference("buffer size (ggml: ggml-python's + 32 per chunk)", None, lite["buffer_size"], want))
    for t, where in ref["placements"].items():
        mine = lite["placements"].get(t, "missing")
        if mine != where:
            out.append(Difference("(chunk, offset)", t, mine, where))
    return out


def largest_tensor(plan: dict) -> int:
    """The largest aligned size of a tensor a plan placed (views left out)."""
    return max((aligned_size(t) for t, w in plan["placements"].items() if w and t.view_src is None), default=0)


def draw_max_sizes(peak: int, largest: int, rnd: random.Random, count: int) -> list:
    """`count` limits for a graph whose unbounded plan needs `peak` bytes and whose largest tensor has
    `largest` (aligned): in turn of three kinds (`LIMIT_KINDS`) — "between" (uniform in [largest/2,
    peak): 2 to a few chunks), "log" (log-uniform in [32, peak)), "below_largest" (uniform in [1,
    largest/4]: every tensor near the largest opens a chunk of its own; up to the 16th, unbounded).
    Empty when the whole plan fits 64 bytes (nothing to split)."""
    if peak <= 64 or largest <= 0:
        return []
    out = []
    for k in range(count):
        kind = LIMIT_KINDS[k % len(LIMIT_KINDS)]
        if kind == "between":
            lo = max(1, largest // 2)
            out.append(rnd.randrange(lo, peak) if lo < peak else peak - 1)
        elif kind == "log":
            out.append(max(1, int(math.exp(rnd.uniform(math.log(32), math.log(peak))))))
        else:
            out.append(rnd.randint(1, max(1, largest // 4)))
    return out


@dataclass
class ChunkedResult:
    """One limit of `check_chunked_graph`: how many chunks ggml used, and the differences."""

    max_size: int
    n_chunks: int
    diffs: list = field(default_factory=list)


def check_chunked_graph(rg, count: int = 4, seed: int | None = None, max_sizes: list | None = None) -> list:
    """Plan the random graph `rg` without a limit and at `count` limits (`draw_max_sizes` from
    `random.Random(seed)`, or the given `max_sizes`), on both sides, from one mirror. The first result is
    the unlimited plan: one chunk (none when nothing is in the compute buffer), compared with ggml_lite's
    2026 allocator and its 2024 one (`GAllocr`: the same offsets). Returns a `ChunkedResult` per plan."""
    tensors = rg.tensors
    m = mirror(rg.graph, rg.roots, rg.preallocated)
    lite_saved = [(t, t.data, t.buffer) for t in tensors]
    try:
        whole, first = _one(rg.graph, tensors, m, UNLIMITED, lite_saved)
        if first.n_chunks > 1:  # (none: nothing in the compute buffer, e.g. only views of weights)
            first.diffs.append(Difference("unlimited: chunks", None, "at most 1", first.n_chunks))
        _restore_lite(lite_saved)
        first.diffs += _against_2024(rg.graph, tensors, whole)
        _restore_lite(lite_saved)
        if max_sizes is None:
            max_sizes = draw_max_sizes(whole["buffer_size"], largest_tensor(whole), random.Random(seed), count)
        return [first] + [_one(rg.graph, tensors, m, ms, lite_saved)[1] for ms in max_sizes]
    finally:
        m.close()
        _restore_lite(lite_saved)


def _restore_lite(saved: list) -> None:
    for t, data, buffer in saved:
        t.data, t.buffer = data, buffer


def _one(graph, tensors, m: Mirror, max_size: int, lite_saved: list) -> tuple:
    """(ggml's plan, its `ChunkedResult`) of one limit, both sides starting from unplaced tensors."""
    ref = chunked_plan(None, max_size=max_size, mirrored=m)
    _restore_lite(lite_saved)
    mine = lite_chunked_plan(graph, tensors, max_size)
    res = ChunkedResult(max_size, len(ref["chunk_sizes"]), compare_chunked(mine, ref))
    if len(ref["chunk_sizes"]) > VBUFFER_MAX_CHUNKS:
        res.diffs.append(Difference("more than 16 chunks", None, None, len(ref["chunk_sizes"])))
    return ref, res


def _against_2024(graph, tensors, whole: dict) -> list:
    """Without a limit, ggml_lite's 2024 allocator places every tensor at the offset of the one chunk."""
    galloc = gl.GAllocr(gl.cpu_buffer_type())
    try:
        galloc.reserve(graph)
        galloc.alloc_graph(graph)
        buf = galloc.buffers[0]
        out = []
        for t in tensors:
            w = whole["placements"].get(t)
            mine = t.data - buf.get_base() if buf is not None and t.buffer is buf and t.data is not None else None
            if mine != (None if w is None else w[1]):
                out.append(Difference("offset (2024 allocator, unlimited)", t, mine, w))
        return out
    finally:
        galloc.free()


# -- one allocator, two graphs -------------------------------------------------------------------------------

@dataclass
class StepRecord:
    """What one side showed after one call of a sequence."""

    call: str
    ok: bool
    buffer_chunks: list  # the sizes of the compute buffer's chunks (kept from an earlier plan unless one grew)
    planned_chunks: list  # the sizes the dynamic allocator planned for this graph
    replaced: bool | None
    placements: dict | None  # after alloc_graph only


def check_chunked_sequence(steps: list, max_size: int, seen: list | None = None) -> list:
    """`steps` = [(call, rg)] with call "reserve" or "alloc_graph": ONE allocator on each side
    (`RealGAllocr(max_size)` and `GAllocr2026`) runs them in order. After each step the chunk buffers'
    sizes, the planned chunk sizes and whether the compute buffer was reallocated (today's rule: a
    chunk grew) are compared, after an alloc_graph every tensor's (chunk, offset) too. A graph is
    mirrored once: pass the same `rg` to reserve it and then allocate it, and a fresh build of it
    (`random_graph(seed)` again) to plan it anew later, as an application rebuilds its graph.
    Returns [(step, Difference)]; ggml's `StepRecord`s are appended to `seen` when given."""
    mirrors: dict[int, Mirror] = {}
    lite = GAllocr2026(lite_buffer_type(max_size))
    out: list = []
    try:
        with RealGAllocr(max_size) as real:
            for k, (call, rg) in enumerate(steps):
                m = mirrors.get(id(rg)) or mirrors.setdefault(id(rg), mirror(rg.graph, rg.roots, rg.preallocated))
                ok_c = getattr(real, call)(m)
                info = real.chunks()
                c_rec = StepRecord(call, ok_c, info.sizes, info.planned_sizes, real.replaced,
                                   real.placements(m) if call == "alloc_graph" else None)
                before = lite.buffers[0]
                ok_l = bool(getattr(lite, call)(rg.graph))
                after, talloc = lite.buffers[0], lite.buf_tallocs[0]
                assert isinstance(talloc, ChunkedDynTAllocr)
                l_rec = StepRecord(call, ok_l, lite.chunk_sizes(0), [c.max_size for c in talloc.chunks],
                                   after is not None and after is not before,
                                   lite_placements(lite, m.tensors) if call == "alloc_graph" else None)
                out += [(k, d) for d in _compare_steps(l_rec, c_rec)]
                if seen is not None:
                    seen.append(c_rec)
    finally:
        lite.free()
        for m in mirrors.values():
            m.close()
    return out


def _compare_steps(lite: StepRecord, ref: StepRecord) -> list:
    out = []
    for key in ("ok", "buffer_chunks", "planned_chunks", "replaced"):
        if getattr(lite, key) != getattr(ref, key):
            out.append(Difference(f"{lite.call}: {key}", None, getattr(lite, key), getattr(ref, key)))
    if ref.placements is not None:
        for t, where in ref.placements.items():
            mine = (lite.placements or {}).get(t, "missing")
            if mine != where:
                out.append(Difference(f"{lite.call}: (chunk, offset)", t, mine, where))
    return out


def check_reserve_n_size(rg, max_size: int) -> list:
    """The dry run on both sides: `ggml_gallocr_reserve_n_size` and `GAllocr2026.reserve_n_size` on a
    fresh allocator give the same size for buffer 0, and neither allocates a compute buffer; then a
    `reserve` on the same allocators needs the same chunks. Returns the differences."""
    lite = GAllocr2026(lite_buffer_type(max_size))
    out = []
    with mirror(rg.graph, rg.roots, rg.preallocated) as m, RealGAllocr(max_size) as real:
        saved = snapshot(m)
        c_size = real.reserve_n_size(m)
        l_size = lite.reserve_n_size(rg.graph)[0]
        if c_size != l_size:
            out.append(Difference("reserve_n_size", None, l_size, c_size))
        if real.buffer_allocated() or lite.buffers[0] is not None:
            out.append(Difference("a buffer after reserve_n_size", None, lite.buffers[0] is not None,
                                  real.buffer_allocated()))
        restore(saved)
        real.reserve(m)
        lite.reserve(rg.graph)
        if sum(real.chunks().sizes) != c_size or sum(lite.chunk_sizes(0)) != l_size:
            out.append(Difference("reserve after reserve_n_size: sum of chunks", None, lite.chunk_sizes(0),
                                  real.chunks().sizes))
        lite.free()
    return out
