"""ggml_dyn_tallocr: every branch, the errors, the debug bookkeeping, traces, and property tests."""

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ggml_lite as gl
from ggml_lite import errors
from ggml_lite.dyn_tallocr import DEBUG_SLOTS, MAX_FREE_BLOCKS, SIZE_MAX, DynTAllocr

OPEN = SIZE_MAX // 2


class T:
    def __init__(self, name, size=0):
        self.name, self.size = name, size


def test_new_and_reset():
    d = DynTAllocr(32)
    assert d.free_blocks == [(0, OPEN)] and d.max_size == 0 and d.get_max_size() == 0
    d.alloc(100)
    d.reset()
    assert d.free_blocks == [(0, OPEN)] and d.max_size == 0
    d.free()
    assert d.free_blocks == []


def test_sizes_are_rounded_to_the_alignment():
    d = DynTAllocr(64)
    assert [d.alloc(n) for n in (1, 64, 65, 0)] == [0, 64, 128, 256]
    assert d.max_size == 256  # a zero-size request takes nothing


def test_best_fit_ignores_the_last_block_and_prefers_later_ties():
    d = DynTAllocr(32)
    offs = [d.alloc(64) for _ in range(6)]  # 0, 64, ..., 320
    d.free_tensor(offs[0], 64)
    d.free_tensor(offs[2], 64)
    d.free_tensor(offs[4], 64)
    assert d.free_blocks[:-1] == [(0, 64), (128, 64), (256, 64)]
    assert d.alloc(32) == 256  # three equal candidates: the last of them wins (<=)
    assert d.alloc(64) == 128  # tie between 64-byte blocks at 0 and 128: the later one
    assert d.alloc(64) == 0
    assert d.alloc(32) == 288  # the 32-byte remainder at 288 is an exact fit
    assert d.free_blocks == [(384, OPEN - 384)]


def test_last_block_is_last_resort_and_grows_max_size():
    d = DynTAllocr(32)
    a = d.alloc(64)
    d.alloc(32)
    d.free_tensor(a, 64)
    assert d.alloc(96) == 96 and d.max_size == 192  # the 64-byte hole is too small
    assert d.free_blocks == [(0, 64), (192, OPEN - 192)]


def test_not_enough_space(caplog):
    d = DynTAllocr(32)
    with caplog.at_level(logging.ERROR, logger="ggml_lite"), \
            pytest.raises(errors.OutOfBufferSpaceError, match=r"'?huge'?.*largest free block"):
        d.alloc(OPEN + 1, T("huge"))
    assert "not enough space in the buffer to allocate" in caplog.text
    d.alloc(OPEN - 32)
    with pytest.raises(errors.OutOfBufferSpaceError, match="needed 64 bytes, largest free block 31"):
        d.alloc(64)


def test_free_merges():
    d = DynTAllocr(32)
    o = [d.alloc(32) for _ in range(5)]  # 0 32 64 96 128
    d.free_tensor(o[1], 32)  # insert
    assert d.free_blocks[:-1] == [(32, 32)]
    d.free_tensor(o[2], 32)  # right after block 0: merge with the previous block
    assert d.free_blocks[:-1] == [(32, 64)]
    d.free_tensor(o[0], 32)  # right before block 0: merge with the next block
    assert d.free_blocks[:-1] == [(0, 96)]
    d.free_tensor(o[4], 32)  # right before the open block
    assert d.free_blocks == [(0, 96), (128, OPEN - 128)]
    d.free_tensor(o[3], 32)  # between two blocks: merges both
    assert d.free_blocks == [(0, OPEN)]


def test_free_inserts_in_address_order():
    d = DynTAllocr(32)
    o = [d.alloc(32) for _ in range(7)]
    for k in (5, 1, 3):
        d.free_tensor(o[k], 32)
    assert [b[0] for b in d.free_blocks] == [32, 96, 160, 224]


def test_merge_with_both_neighbours_goes_through_the_previous_block():
    """Freeing a gap between two blocks is always found at the earlier block ("after_block+next");
    the C's "before a block, then the previous one" branch is dead code (see the property test)."""
    events = []
    d = DynTAllocr(16, trace=events.append)
    d.blocks = [[0, 16], [32, 32], [200, OPEN]]
    d.free_tensor(16, 16)
    assert events[-1].how == "after_block+next" and d.blocks[0] == [0, 64] and d.n_free_blocks == 2


def test_zero_size_allocation_leaves_an_empty_block_when_freed():
    """A quirk of the C: a 0-byte request takes an offset, and freeing it inserts a 0-byte block."""
    d = DynTAllocr(1)
    a = d.alloc(1)
    z = d.alloc(0)
    assert z == 1 and d.max_size == 1
    d.free_tensor(a, 1)
    d.free_tensor(z, 0)
    assert d.free_blocks == [(0, OPEN), (1, 0)]


def test_out_of_free_blocks():
    d = DynTAllocr(32)
    offs = [d.alloc(32) for _ in range(2 * MAX_FREE_BLOCKS)]
    for k in range(0, 2 * (MAX_FREE_BLOCKS - 1), 2):
        d.free_tensor(offs[k], 32)
    assert d.n_free_blocks == MAX_FREE_BLOCKS
    with pytest.raises(errors.OutOfFreeBlocksError, match=r"'?t'?.*all 256"):
        d.free_tensor(offs[2 * (MAX_FREE_BLOCKS - 1)], 32, T("t"))
    d.free_tensor(offs[1], 32)  # a merge needs no new block
    assert d.n_free_blocks == MAX_FREE_BLOCKS - 1


def test_trace_events_describe_the_decisions():
    ev = []
    d = DynTAllocr(32, trace=ev.append)
    a = d.alloc(64, T("a"))
    d.alloc(32, T("b"))
    d.free_tensor(a, 64, T("a"))
    d.alloc(32, T("c"))
    texts = [e.describe() for e in ev]
    assert texts[0].startswith("reset")
    assert "last block: grows max_size to 64 B" in texts[1]
    assert "new free block 0" in texts[3]
    assert "best fit: block 0 of 2 (64 B)" in texts[4]
    assert ev[4].free_blocks == ((32, 32), (96, OPEN - 96)) and ev[4].offset == 0


def test_debug_bookkeeping(caplog):
    d = DynTAllocr(32, debug=True)
    a, b = T("a", 64), T("b", 32)
    with caplog.at_level(logging.DEBUG, logger="ggml_lite"):
        oa = d.alloc(64, a)
        ob = d.alloc(32, b)
    assert "max_size = 0.00 MB: tensors: a [0-40] (0.00 MB) b [40-60] (0.00 MB)" in caplog.text
    assert {t.name for t, _ in d.live_debug_tensors()} == {"a", "b"}
    d.free_tensor(ob, 32, b)
    assert [t.name for t, _ in d.live_debug_tensors()] == ["a"]
    with pytest.raises(errors.AllocatorDebugError, match="stray"):
        d.free_tensor(4096, 32, T("stray"))
    assert oa == 0


def test_debug_slots_run_out():
    d = DynTAllocr(1, debug=True)
    for i in range(DEBUG_SLOTS):
        d.allocated_tensors[i][0] = T(f"x{i}")
    with pytest.raises(errors.AllocatorDebugError, match="out of allocated_tensors"):
        d.alloc(1, T("one too many"))


# -- properties ------------------------------------------------------------------------------------

ops = st.lists(st.tuples(st.booleans(), st.integers(1, 300), st.integers(0, 10**6)), min_size=1, max_size=60)


def expected_block(blocks, size):
    """The specification of the choice: best fit over all but the last block, ties to the later one,
    else the last block."""
    best = None
    for i, (_, s) in enumerate(blocks[:-1]):
        if s >= size and (best is None or s <= blocks[best][1]):
            best = i
    return best if best is not None else len(blocks) - 1


@settings(max_examples=600, deadline=None)
@given(script=ops, alignment=st.sampled_from([1, 16, 32, 128]))
def test_random_alloc_free_sequences(script, alignment):
    events = []
    d = DynTAllocr(alignment, trace=events.append)
    live, highest = {}, 0
    for is_alloc, size, pick in script:
        if is_alloc or not live:
            before = d.free_blocks
            asize = gl.GGML_PAD(size, alignment)
            k = expected_block(before, asize)
            off = d.alloc(size)
            assert off == before[k][0] and off % alignment == 0
            live[off] = asize
            highest = max(highest, off + asize)
        else:
            off = sorted(live)[pick % len(live)]
            d.free_tensor(off, live.pop(off))
        blocks = d.free_blocks
        assert blocks[-1][0] + blocks[-1][1] == OPEN  # the open block always reaches the end
        for (o1, s1), (o2, _) in zip(blocks, blocks[1:]):
            assert s1 > 0 and o1 + s1 < o2  # sorted, non-overlapping, never adjacent
        spans = sorted([(o, o + s) for o, s in live.items() if s] + [(o, o + s) for o, s in blocks])
        for (_, e1), (s2, _) in zip(spans, spans[1:]):
            assert e1 <= s2  # no two live allocations overlap, nor does any with a free block
        assert d.max_size == highest
    for off in sorted(live):
        d.free_tensor(off, live[off])
    assert d.free_blocks == [(0, OPEN)]
    assert all(getattr(e, "how", "") != "before_block+previous" for e in events)  # dead branch of the C
