"""Plausible wrong solutions of chapter 04's implement-exercises (`ggml_dyn_tallocr_alloc`'s best fit, 04.2, and
`ggml_dyn_tallocr_free_tensor`'s merging, 04.3), each with the rule its grader must reject it by."""

from ggml_lite.errors import OutOfBufferSpaceError, OutOfFreeBlocksError

MAX_FREE_BLOCKS = 256


def _pad(n, a):
    return (n + a - 1) // a * a


def _take(blocks, i, size):
    """Cut `size` bytes from the front of block i: (offset, free list after), an emptied block removed."""
    offset = blocks[i][0]
    blocks[i] = (offset + size, blocks[i][1] - size)
    if blocks[i][1] == 0:
        del blocks[i]
    return offset, blocks


def _alloc(choose, aligned=True, remove=True):
    """A best_fit_alloc whose choice of block is `choose(blocks, size)` (None: no block fits)."""
    def best_fit_alloc(free_blocks, size, alignment):
        blocks = [tuple(b) for b in free_blocks]
        size = _pad(size, alignment) if aligned else size
        i = choose(blocks, size)
        if i is None:
            raise OutOfBufferSpaceError(f"no block of {size} bytes")
        if not remove:
            offset = blocks[i][0]
            blocks[i] = (offset + size, blocks[i][1] - size)
            return offset, blocks
        return _take(blocks, i, size)
    return best_fit_alloc


def _ggml_choice(blocks, size, tie_later=True, search=None):
    search = len(blocks) - 1 if search is None else search
    best = None
    for i in range(search):
        s = blocks[i][1]
        if s >= size and (best is None or (s <= blocks[best][1] if tie_later else s < blocks[best][1])):
            best = i
    if best is None and search < len(blocks) and blocks[-1][1] >= size:
        best = len(blocks) - 1
    return best


def _first_fit(blocks, size):
    return next((i for i, (_, s) in enumerate(blocks) if s >= size), None)


def _free(merge_next=True, merge_before=True, aligned=True, insert_at=None, limit=MAX_FREE_BLOCKS):
    """A free_range with one step of `ggml_dyn_tallocr_free_tensor` changed."""
    def free_range(free_blocks, offset, size, alignment):
        blocks = [list(b) for b in free_blocks]
        size = _pad(size, alignment) if aligned else size
        for i, b in enumerate(blocks):
            if b[0] + b[1] == offset:
                b[1] += size
                if merge_next and i + 1 < len(blocks) and b[0] + b[1] == blocks[i + 1][0]:
                    b[1] += blocks.pop(i + 1)[1]
                return [tuple(x) for x in blocks]
            if merge_before and offset + size == b[0]:
                b[0], b[1] = offset, b[1] + size
                return [tuple(x) for x in blocks]
        if limit is not None and len(blocks) >= limit:
            raise OutOfFreeBlocksError("out of free blocks")
        pos = next((k for k, b in enumerate(blocks) if b[0] >= offset), len(blocks))
        blocks.insert(pos if insert_at is None else insert_at(blocks), [offset, size])
        return [tuple(x) for x in blocks]
    return free_range


WRONG = {
    "04.2": [
        ("first fit instead of best fit", _alloc(_first_fit), "best fit"),
        ("ties go to the earlier block (<)", _alloc(lambda b, s: _ggml_choice(b, s, tie_later=False)), "ties go later"),
        ("the last block searched like the others", _alloc(lambda b, s: _ggml_choice(b, s, search=len(b))),
         "last block last"),
        ("an emptied block kept in the list", _alloc(_ggml_choice, remove=False), "used up"),
        ("the size not rounded up", _alloc(_ggml_choice, aligned=False), "round up"),
    ],
    "04.3": [
        ("no merge with the next block", _free(merge_next=False), "merge both"),
        ("no merge with the block after the range", _free(merge_before=False), "merge before"),
        ("a new block appended at the end", _free(insert_at=len), "insert sorted"),
        ("a new block put just before the last", _free(insert_at=lambda b: max(len(b) - 1, 0)), "insert sorted"),
        ("the size not rounded up", _free(aligned=False), "round up"),
        ("no MAX_FREE_BLOCKS check", _free(limit=None), "out of free blocks"),
        ("the limit off by one (n > 256)", _free(limit=MAX_FREE_BLOCKS + 1), "out of free blocks"),
    ],
}
