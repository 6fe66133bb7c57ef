"""Plausible wrong solutions of chapter 03's implement-exercise 03.3 (the split of
`ggml_backend_alloc_ctx_tensors_from_buft` into buffers), each with the rule its grader must reject it by."""

from ggml_lite.errors import TensorTooLargeError


def _split(pad=True, exact_fits=True, check_large=True, flush_last=True, trailing_views=True, empty=True,
           split_after=False, check_unpadded=False):
    """A split_buffers with one step of the C changed."""
    def split_buffers(sizes, alignment, max_size):
        ranges, first, cur, last_real = [], 0, 0, 0
        for i, s in enumerate(sizes):
            this = 0 if s is None else ((s + alignment - 1) // alignment * alignment if pad else s)
            if check_large and (s or 0 if check_unpadded else this) > max_size:
                raise TensorTooLargeError(f"tensor {i}: {this} bytes > {max_size}")
            if s is not None:
                last_real = i + 1
            if cur + this > max_size or (not exact_fits and this and cur + this == max_size):
                if split_after:
                    ranges.append((first, i + 1, cur + this))
                    first, cur = i + 1, 0
                    continue
                ranges.append((first, i, cur))
                first, cur = i, this
            else:
                cur += this
        if cur > 0 and flush_last:
            ranges.append((first, len(sizes) if trailing_views else last_real, cur))
        if not ranges and not empty:
            return [(0, len(sizes), 0)]
        return ranges
    return split_buffers


WRONG = {
    "03.3": [
        ("a buffer closed when it reaches max_size (>=)", _split(exact_fits=False), "fits exactly"),
        ("sizes not padded to the alignment", _split(pad=False), "pad"),
        ("no check for a tensor larger than max_size", _split(check_large=False), "too large"),
        ("the too-large check on the unpadded size", _split(check_unpadded=True), "too large"),
        ("the last buffer forgotten", _split(flush_last=False), "last range"),
        ("trailing views left out of the last range", _split(trailing_views=False), "no memory"),
        ("an empty buffer when nothing needs memory", _split(empty=False), "nothing to allocate"),
        ("the tensor that does not fit kept in the old buffer", _split(split_after=True), "split"),
    ],
}
