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
# # 02 · Aligned offsets
#
# Every allocator in ggml places tensors at offsets that are multiples of an **alignment**. This
# chapter ports the two tiny functions that do it — `aligned_offset` (ggml-alloc.c) and the macro
# `GGML_PAD` (ggml.h) — and shows what alignment costs.
#
# **Learning goals**
#
# 1. Why alignment: SIMD loads (AVX2 reads 32 bytes at a time and is fastest, or only legal, on
#    32-byte boundaries), device rules (CUDA and Metal want 128 or 256), and files: GGUF aligns tensor
#    data to 32 bytes so that a memory-mapped weight can be used in place — which is why the CPU
#    backend's `TENSOR_ALIGNMENT` is 32.
# 2. `aligned_offset(base, offset, alignment)` aligns the *address* `base + offset`, not the offset.
# 3. `GGML_PAD(x, n)` rounds a size up; both need `n` to be a power of two.
#
# Exported: `ggml_lite.align`.

# %% [markdown]
# ## 1 · The C
#
# `ggml-alloc.c:64-68`:
#
# ```c
# static size_t aligned_offset(const void * buffer, size_t offset, size_t alignment) {
#     assert(alignment && !(alignment & (alignment - 1))); // power of 2
#     size_t align = (alignment - (((uintptr_t)buffer + offset) % alignment)) % alignment;
#     return offset + align;
# }
# ```
#
# and ggml.h: `#define GGML_PAD(x, n) (((x) + (n) - 1) & ~((n) - 1))`.
#
# `aligned_offset(NULL, size, alignment)` is how the dynamic allocator rounds a *size* up
# (ggml-alloc.c:149); `aligned_offset(base, 0, alignment)` is where the linear allocator starts in a
# buffer whose base may not be aligned (ggml-alloc.c:82). The C only `assert`s the power of two —
# compiled out in release builds, where a bad alignment silently gives wrong offsets. Here it raises.

# %%
# | default_exp align

# %%
# | export
"""Aligned offsets: `aligned_offset` (ggml-alloc.c) and `GGML_PAD` (ggml.h)."""

from ggml_lite.errors import AlignmentError


def is_power_of_two(n: int) -> bool:
    """True for 1, 2, 4, 8, ...: the test `alignment && !(alignment & (alignment - 1))`."""
    return isinstance(n, int) and n > 0 and not n & (n - 1)


def _check(alignment: int, what: str) -> None:
    if not is_power_of_two(alignment):
        raise AlignmentError(f"{what}: alignment {alignment!r} is not a power of two (1, 2, 4, 8, ...)")


def aligned_offset(buffer, offset: int, alignment: int) -> int:
    """`aligned_offset`: the smallest `o >= offset` such that `buffer + o` is a multiple of
    `alignment` (`buffer` is an address, or None for NULL)."""
    # the C asserts a power of two; the test is written out because this runs for every tensor
    if not (type(alignment) is int and alignment > 0 and not alignment & (alignment - 1)):
        _check(alignment, "aligned_offset")  # (raises, naming the bad alignment)
    base = buffer or 0
    return offset + (alignment - (base + offset) % alignment) % alignment


def GGML_PAD(x: int, n: int) -> int:
    """`GGML_PAD`: `x` rounded up to a multiple of `n` (a power of two)."""
    _check(n, "GGML_PAD")
    return (x + n - 1) & ~(n - 1)


# %% [markdown]
# ## 2 · Worked examples
#
# A size of 100 bytes occupies 128 with alignment 32 (28 bytes of padding), 112 with 16. An offset
# of 0 in a buffer whose base address ends in `...0x10` moves to 16 so that the *address* lands on
# a 32-byte boundary.

# %%
# NBVAL_CHECK_OUTPUT
print(aligned_offset(None, 100, 32), GGML_PAD(100, 32), GGML_PAD(100, 16), GGML_PAD(128, 32))
print(aligned_offset(0x1010, 0, 32), aligned_offset(0x1010, 20, 32), aligned_offset(0x1000, 0, 32))
try:
    GGML_PAD(100, 24)
except AlignmentError as e:
    print("AlignmentError:", e)

# %% [markdown]
# Both functions agree whenever the base is aligned: `aligned_offset(None, x, n) == GGML_PAD(x, n)`.
# The bit trick in `GGML_PAD` is why the power of two matters — with `n = 24`, `~(n-1)` is not a
# mask of high bits, and the "rounded" value would not even be a multiple of 24.

# %%
for x in (0, 1, 31, 32, 33, 1000):
    assert aligned_offset(None, x, 32) == GGML_PAD(x, 32)
print("unchecked GGML_PAD(100, 24) would give", (100 + 23) & ~23, "— not a multiple of 24")

# %% [markdown]
# ## 3 · A picture: what padding costs
#
# Six tensors placed one after another, as the linear allocator of chapter 03 does, with alignment
# 32 and with 128 (a typical GPU alignment). Blue is data, grey is padding. Small tensors pay the
# most: a 4-byte scalar takes a whole 128-byte slot on the GPU.

# %%
import plotly.graph_objects as go

sizes = [("token ids", 12), ("embeddings", 4096), ("norm weight", 256), ("scalar", 4), ("logits", 1000), ("mask", 2048)]


def layout(sizes, alignment):
    """(name, offset, size, padded) of tensors placed back to back with `alignment`."""
    off, out = 0, []
    for name, size in sizes:
        padded = GGML_PAD(size, alignment)
        out.append((name, off, size, padded))
        off += padded
    return out


fig = go.Figure()
for row, alignment in enumerate((32, 128)):
    for name, off, size, padded in layout(sizes, alignment):
        y = f"alignment {alignment}"
        fig.add_trace(go.Bar(y=[y], x=[size], base=[off], orientation="h", marker_color="#636efa",
                             showlegend=False, hovertext=f"{name}: {size} B at {off}", hoverinfo="text"))
        if padded > size:
            fig.add_trace(go.Bar(y=[y], x=[padded - size], base=[off + size], orientation="h",
                                 marker_color="#cccccc", showlegend=False,
                                 hovertext=f"padding after {name}: {padded - size} B", hoverinfo="text"))
fig.update_layout(barmode="overlay", title="six tensors placed back to back: data (blue) and padding (grey)",
                  xaxis_title="byte offset", height=260, margin=dict(l=110, r=20, t=50, b=40))
fig

# %%
# NBVAL_CHECK_OUTPUT
for alignment in (32, 128):
    lay = layout(sizes, alignment)
    used = sum(s for _, _, s, _ in lay)
    total = sum(p for _, _, _, p in lay)
    print(f"alignment {alignment:3d}: {used} bytes of data in {total} bytes ({total - used} of padding)")

# %% [markdown]
# The same 7,416 bytes of data take 7,488 bytes at alignment 32 (72 bytes of padding) and 7,680
# at alignment 128 (264 bytes): the larger the alignment, the more every odd-sized tensor costs.

# %% [markdown]
# ## 4 · Check

# %%
import ggml_lite.align as al

assert al.aligned_offset(None, 0, 32) == 0 and al.aligned_offset(None, 1, 32) == 32
assert al.aligned_offset(0x20, 0, 32) == 0 and al.aligned_offset(0x21, 0, 32) == 31
assert al.GGML_PAD(1, 1) == 1 and al.GGML_PAD(33, 32) == 64
assert all(al.is_power_of_two(1 << k) for k in range(40)) and not al.is_power_of_two(0)
for bad in (0, 3, 24, -32):
    try:
        al.GGML_PAD(8, bad)
        raise AssertionError("expected AlignmentError")
    except al.AlignmentError:
        pass
print("chapter 02: all checks passed")

# %% [markdown]
# ## 5 · Exercises
#
# Four exercises, about 25 minutes. Predictions are answered with `answer(id, value)`: replace the `...`
# and run the cell; it says right or wrong, then why. An implementation is graded with `check(id, fn)`
# against the port on the chapter's cases and 300 random ones; a failure shows the smallest case where
# your function and ggml disagree and the rule it breaks. `python -m ggml_lite exercises` lists what you
# have done. Solutions are in appendix A8; try first.

# %%
from ggml_lite.exercises import answer, check, done  # noqa: E402

# %% [markdown]
# **02.1 · Predict** (easy, 3 min). A buffer's base address is `0x1004` (not on a 32-byte boundary). What
# does `aligned_offset(0x1004, 100, 32)` return?

# %%
answer("02.1", ...)

# %% [markdown]
# **02.2 · Predict** (easy, 3 min). Three tensors of 100, 32 and 200 bytes are placed back to back from
# offset 0 of an aligned buffer, each starting at a multiple of 64. At which offset does the third start?

# %%
answer("02.2", ...)

# %% [markdown]
# **02.3 · Implement** `aligned_offset` (easy, 10 min). Write it without scrolling up, from the C
# (`ggml-alloc.c:64-68`):
#
# ```c
# static size_t aligned_offset(const void * buffer, size_t offset, size_t alignment) {
#     assert(alignment && !(alignment & (alignment - 1))); // power of 2
#     size_t align = (alignment - (((uintptr_t)buffer + offset) % alignment)) % alignment;
#     return offset + align;
# }
# ```
#
# `buffer` is an address (an `int`) or `None` for NULL. Where the C asserts, raise
# `ggml_lite.errors.AlignmentError`.

# %%
# exercise 02.3
def aligned_offset(buffer, offset, alignment):
    raise NotImplementedError  # your code here


check("02.3", aligned_offset)

# %% [markdown]
# **02.4 · Explore** (medium, 10 min). Without its power-of-two check, what would `GGML_PAD(x, 24)` give
# for x = 1 … 48? Would a placement built from it still be safe? Run `done("02.4")` when you have an answer.
#
# <details><summary>A worked answer</summary>
#
# `~(24 - 1)` is `~0b10111`: it clears bits 0, 1, 2 and 4, not "everything below 24". So the result is a
# multiple of 8 with bit 4 clear: x = 1…8 give 8, 9…16 give 32, 17…24 give 40, 25…32 give 32 again, 33…40
# give 40, 41…48 give 64. None is a multiple of 24 except by luck, and the function is not even monotonic:
# a 24-byte tensor would take 40 bytes and a 25-byte one 32. Every result happens to be ≥ x, so tensors
# would not overlap, but their offsets would break a device's 24-byte rule. This is why both functions
# refuse a non-power-of-two here, where the C only asserts, and release builds compile asserts out.
#
# </details>
