"""Today's chunked dynamic allocator (`ggml_lite.gallocr_today.ChunkedDynTAllocr`, ggml 0.15.3's
`struct ggml_dyn_tallocr`) under random alloc/free sequences: hypothesis draws the sequence, the sizes,
the alignment, the chunk limit (`max_chunk_size`, SIZE_MAX included) and the last-block rule (today's
`reuse_factor` and September 2025's `first`), and after every step the chunked free lists must keep:

* at most 16 chunks; a new chunk only when no chunk has a free block that fits;
* in every chunk the free blocks and the live allocations tile the chunk exactly, from 0 to the size
  its first block was opened with: so live allocations never overlap, every allocation lies inside its
  chunk, and the free blocks are sorted, do not overlap and are never adjacent (they would have merged);
* every chunk's `max_size` is its high-water mark, and a chunk other than the 16th is never larger
  than MAX(max_chunk_size, its largest allocation); the 16th is unbounded;
* with max_chunk_size = SIZE_MAX there is one chunk and every offset is the one chapter 04's
  `DynTAllocr` gives for the same sequence.

Zero-byte requests are left out: the C's quirk there (a zero-byte free block inside another) is chapter
04's, tested in `test_dyn_tallocr.py`.
"""

from hypothesis import given, settings, target
from hypothesis import strategies as st

import ggml_lite as gl
from ggml_lite.dyn_tallocr import SIZE_MAX, DynTAllocr
from ggml_lite.gallocr_today import VBUFFER_MAX_CHUNKS, BufferAddress, ChunkedDynTAllocr

OPEN = SIZE_MAX // 2  # the size of an unbounded chunk's first block (and of the 16th chunk's)

script_st = st.lists(st.tuples(st.booleans(), st.integers(1, 2048), st.integers(0, 10**6)), min_size=1, max_size=90)
limit_st = st.one_of(st.integers(1, 512), st.integers(1, 8192), st.just(SIZE_MAX))


class Model:
    """What the test knows independently of the allocator: live allocations per chunk, each chunk's
    opening size (its capacity), high-water mark and largest allocation."""

    def __init__(self) -> None:
        self.live: dict[BufferAddress, int] = {}
        self.capacity: list[int] = []
        self.high: list[int] = []
        self.largest: list[int] = []
        self.opened_with: list[int] = []  # the size of the allocation that opened each chunk


def _fits_somewhere(dyn: ChunkedDynTAllocr, size: int) -> bool:
    return any(bsize >= size for chunk in dyn.chunks for _, bsize in chunk.blocks)


def _check(dyn: ChunkedDynTAllocr, model: Model) -> None:
    assert dyn.n_chunks <= VBUFFER_MAX_CHUNKS
    for c, chunk in enumerate(dyn.chunks):
        pieces = sorted([(o, s, "free") for o, s in chunk.blocks]
                        + [(a.offset, s, "live") for a, s in model.live.items() if a.chunk == c])
        at = 0
        for off, size, _kind in pieces:  # free and live pieces tile [0, capacity) exactly
            assert off == at, (c, pieces)
            at = off + size
        assert at == model.capacity[c], (c, at, model.capacity[c])
        for (o1, s1), (o2, _) in zip(chunk.blocks, chunk.blocks[1:]):
            assert o1 + s1 < o2  # sorted, disjoint, never adjacent
        assert chunk.max_size == model.high[c]
        if c < VBUFFER_MAX_CHUNKS - 1:
            assert chunk.max_size <= max(dyn.max_chunk_size, model.largest[c])
            assert model.capacity[c] == max(dyn.max_chunk_size, model.opened_with[c])
        else:
            assert model.capacity[c] == OPEN


def _run(script, alignment: int, max_chunk_size: int, last_block: str):
    dyn = ChunkedDynTAllocr(alignment, max_chunk_size, last_block)
    model = Model()
    offsets = []
    for is_alloc, size, pick in script:
        if is_alloc or not model.live:
            asize = gl.GGML_PAD(size, alignment)
            n_before, fits = dyn.n_chunks, _fits_somewhere(dyn, asize)
            addr = dyn.alloc(size)
            assert addr.offset % alignment == 0
            if dyn.n_chunks > n_before:  # a new chunk: only when no chunk had room
                assert not fits and addr.chunk == n_before and addr.offset == 0
                last = n_before == VBUFFER_MAX_CHUNKS - 1
                model.capacity.append(OPEN if last else max(asize, dyn.max_chunk_size))
                model.opened_with.append(asize)
                model.high.append(0)
                model.largest.append(0)
            else:
                assert fits and addr.chunk < dyn.n_chunks
            model.live[addr] = asize
            model.high[addr.chunk] = max(model.high[addr.chunk], addr.offset + asize)
            model.largest[addr.chunk] = max(model.largest[addr.chunk], asize)
            offsets.append(addr)
        else:
            addr = sorted(model.live)[pick % len(model.live)]
            dyn.free_tensor(addr, model.live.pop(addr))
        _check(dyn, model)
    return dyn, offsets


@settings(max_examples=400, deadline=None)
@given(script=script_st, alignment=st.sampled_from([1, 16, 32]), max_chunk_size=limit_st,
       last_block=st.sampled_from(["reuse_factor", "first"]))
def test_chunked_free_lists_keep_their_invariants(script, alignment, max_chunk_size, last_block):
    dyn, _ = _run(script, alignment, max_chunk_size, last_block)
    target(float(dyn.n_chunks), label="chunks")  # steer hypothesis towards many chunks (up to 16)


@settings(max_examples=200, deadline=None)
@given(script=script_st, alignment=st.sampled_from([1, 16, 32]), last_block=st.sampled_from(["reuse_factor", "first"]))
def test_without_a_limit_it_is_chapter_04s_allocator(script, alignment, last_block):
    """max_chunk_size = SIZE_MAX: one chunk, the offsets and free blocks of `DynTAllocr` (chapter 04)."""
    dyn, addrs = _run(script, alignment, SIZE_MAX, last_block)
    old, live, got = DynTAllocr(alignment), {}, []
    for is_alloc, size, pick in script:
        if is_alloc or not live:
            off = old.alloc(size)
            live[off] = gl.GGML_PAD(size, alignment)
            got.append(BufferAddress(0, off))
        else:
            off = sorted(live)[pick % len(live)]
            old.free_tensor(off, live.pop(off))
    assert addrs == got
    assert dyn.n_chunks == 1 and dyn.chunks[0].free_blocks == old.free_blocks
    assert dyn.chunks[0].max_size == old.max_size


def test_sixteen_chunks_and_the_last_is_unbounded():
    """Allocations larger than the limit each open a chunk of their own size, until the 16th, which
    takes every later one (its first block is SIZE_MAX/2)."""
    dyn, addrs = _run([(True, 64, 0)] * 40, 32, 32, "reuse_factor")
    assert dyn.n_chunks == VBUFFER_MAX_CHUNKS
    assert [a.chunk for a in addrs] == list(range(15)) + [15] * 25
    assert [c.max_size for c in dyn.chunks] == [64] * 15 + [25 * 64]


def test_reuse_factor_and_first_choose_different_last_blocks():
    """The two rules part ways where an earlier chunk's last block fits but would grow its chunk, and a
    later chunk's fits inside what that chunk already has. Limit 1024: A (512 B) opens chunk 0, whose
    last block is then [512, 1024); B (1024 B) does not fit there and opens chunk 1; B is freed. C (256
    B): "first" takes chunk 0's last block (the first that fits), growing chunk 0 to 768 B;
    "reuse_factor" takes chunk 1 (reuse factor 1024 - 0 - 256 = 768 >= 0, against 512 - 512 - 256 < 0
    for chunk 0), and no chunk grows."""
    script = [(True, 512, 0), (True, 1024, 0), (False, 0, 1), (True, 256, 0)]
    first, a = _run(script, 32, 1024, "first")
    today, b = _run(script, 32, 1024, "reuse_factor")
    assert a[-1] == BufferAddress(0, 512) and [c.max_size for c in first.chunks] == [768, 1024]
    assert b[-1] == BufferAddress(1, 0) and [c.max_size for c in today.chunks] == [512, 1024]
