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
# # 00 · Tensors and graphs — ggml's data model for numpy users
#
# Everything later in this project — the allocators, the graph allocator, the scheduler — works on
# two things: **tensors** (a shape, strides, a type, the op that produces them and their sources)
# and **graphs** (the tensors to compute, in execution order). This chapter ports exactly as much of
# `ggml.h`/`ggml.c` (llama.cpp `daa9623`, September 2024) as the planner needs: no arithmetic yet,
# only *shapes, strides, names and the order of a graph*, each equal to what ggml computes.
#
# **Learning goals**
#
# 1. Read a ggml shape: `ne` lists dimensions *fastest first* — the reverse of numpy's `shape`.
# 2. Read ggml strides: `nb` are byte strides, also fastest first; quantized types pack
#    elements in blocks, so `nb[0]` is the size of a *block*, and `nbytes` is not `nelements·size`.
# 3. Understand views: `view`, `reshape`, `permute`, `transpose` and `cpy` make tensors that share
#    memory with a *root* tensor (`view_src`) at a byte offset (`view_offs`).
# 4. Understand a graph: `build_forward_expand` visits sources depth-first and lists **nodes**
#    (things to compute) in execution order and **leafs** (inputs, weights, constants) in the order
#    they were first reached.
#
# Modules exported here: `ggml_lite.errors`, `ggml_lite.tensor`, `ggml_lite.ops`, `ggml_lite.graph`.

# %% [markdown]
# ## 1 · Errors first
#
# In C, ggml stops the process with `GGML_ASSERT` when an op is given tensors of the wrong shape.
# A Python user deserves an exception that says what was asked, what was there and which tensor.
# Every failure a user can reach raises one of these classes; each also derives from the closest
# built-in (`ValueError`, `KeyError`, `TypeError`) so generic handlers still work.

# %%
# | default_exp tensor

# %%
# | export errors
"""Exceptions raised by ggml_lite.

ggml aborts (`GGML_ASSERT`, `GGML_ABORT`) when it meets a condition a caller can reach; ggml_lite raises
one of these instead. Every message names the tensor involved and states what was asked and what was
available.
"""


class GGMLLiteError(Exception):
    """Base class of every error ggml_lite raises on purpose."""


class UnknownTypeError(GGMLLiteError, KeyError):
    """A ggml type name (or object) that ggml_lite does not know."""

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownOpError(GGMLLiteError, KeyError):
    """An op name that ggml_lite does not know."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


class TensorError(GGMLLiteError, ValueError):
    """An op was given tensors it cannot combine (the `GGML_ASSERT`s of the op constructors)."""


class ShapeError(TensorError):
    """Shapes that the op cannot combine (add/mul broadcast, mul_mat, concat, get_rows, ...)."""


class ReshapeError(ShapeError):
    """A reshape or cont_Nd that would change the number of elements."""


class LayoutError(TensorError):
    """An op that needs contiguous (or row-contiguous) memory got a strided tensor."""


class DataTypeError(TensorError, TypeError):
    """An op got a tensor of a type it does not accept (e.g. get_rows indices that are not i32)."""


class ViewBoundsError(TensorError):
    """A view that would reach past the end of the tensor it views."""


class PermuteAxisError(TensorError):
    """permute() axes that are out of range or repeated."""


class GraphError(GGMLLiteError):
    """A graph cannot be built as asked."""


class GraphFullError(GraphError, OverflowError):
    """More nodes or leafs than the graph was created for (ggml's `cgraph->size`)."""


class AlignmentError(GGMLLiteError, ValueError):
    """An alignment that is not a power of two, or an address that is not aligned."""


class AllocationError(GGMLLiteError, MemoryError):
    """Memory cannot be handed out as asked (the allocators' "not enough space" aborts)."""


class OutOfBufferSpaceError(AllocationError):
    """A tensor does not fit in what is left of a buffer (`ggml_tallocr_alloc`)."""


class OutOfFreeBlocksError(AllocationError):
    """The dynamic allocator's free list is full (`MAX_FREE_BLOCKS`)."""


class TensorTooLargeError(AllocationError):
    """A tensor larger than the buffer type's maximum buffer size."""


class PlanMismatchError(AllocationError):
    """A tensor needs more bytes than the graph allocator's plan reserved for it (the asserts of
    `ggml_gallocr_init_tensor`), e.g. a leaf that grew while no node uses it."""


class BufferIdError(GGMLLiteError, IndexError):
    """A buffer id outside `[0, n_buffers)` (`ggml_gallocr_get_buffer_size`'s assert, bad
    `node_buffer_ids`/`leaf_buffer_ids`)."""


class AllocatorDebugError(GGMLLiteError, RuntimeError):
    """The dynamic allocator's debug bookkeeping (`GGML_ALLOCATOR_DEBUG`) found an inconsistency."""


class BufferStateError(GGMLLiteError, RuntimeError):
    """A buffer or tensor-placement operation that the buffer's state does not allow."""


class TensorNotAllocatedError(BufferStateError):
    """Data access on a tensor that has no memory yet (`tensor->data == NULL`)."""


class TensorAlreadyAllocatedError(BufferStateError):
    """Placing a tensor that already has memory, or a view through `ggml_backend_tensor_alloc`."""


class TensorBoundsError(BufferStateError, IndexError):
    """Reading or writing outside a tensor's bytes or outside its buffer."""


class BufferFreedError(BufferStateError):
    """Using a buffer after `ggml_backend_buffer_free`, or freeing it twice."""


class GraphFileError(GGMLLiteError, ValueError):
    """A graph file (fixture schema) that is malformed; the message names the tensor and the field."""


class DanglingSourceError(GraphFileError):
    """A tensor in a graph file refers to a source or view_src id that is not in the file."""


class GraphCycleError(GraphFileError):
    """The tensors of a graph file depend on each other in a cycle."""


class InvalidSizeError(GraphFileError):
    """A negative (or otherwise impossible) size in a graph file."""


class RecordMismatchError(GraphFileError):
    """Rebuilding a recorded tensor gives a different shape, stride, size or view than the file says."""


class BackendError(GGMLLiteError, RuntimeError):
    """A backend cannot do what it was asked (chapter 05)."""


class UnsupportedOpError(BackendError):
    """A backend was asked to compute an op (or a type combination) it does not support."""


class UnknownBackendError(BackendError, KeyError):
    """A backend name that is not in the registry (`ggml_backend_reg_init_backend_from_str`)."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


class SchedulerError(BackendError):
    """The backend scheduler cannot place or run a graph (the aborts of `ggml_backend_sched_*`)."""


class LayoutMismatchError(BackendError, ValueError):
    """A tensor copy between tensors of different type, shape or strides (`ggml_backend_tensor_copy`)."""


# %% [markdown]
# ## 2 · Types: elements, blocks and bytes
#
# ggml stores each type as a *block* of `blck_size` elements that takes `type_size` bytes.
# For f32/f16/i32 a block is one element. The quantized types pack 32 weights into one block:
# `q8_0` is an f16 scale plus 32 int8 (2 + 32 = 34 bytes), `q4_0` an f16 scale plus 32 4-bit
# values (2 + 16 = 18 bytes). The numbers below are ggml's `type_traits` table (`ggml.c`); the
# `code` is the value of `enum ggml_type` in `ggml.h`.

# %%
# | export
"""Tensors, types and contexts — ggml's data model (`ggml.h`: `struct ggml_tensor`, `ggml_type`,
`ggml_context`), without arithmetic. Shapes, strides, sizes, views and names equal ggml's."""

import enum
import struct
from dataclasses import dataclass

from ggml_lite.errors import ShapeError, UnknownOpError, UnknownTypeError, ViewBoundsError

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64  # bytes: 16 int32 words
GGML_MAX_NAME = 64  # bytes including the terminating NUL


@dataclass(frozen=True)
class GGMLType:
    """One entry of ggml's type table: `enum ggml_type` plus `ggml_type_size`, `ggml_blck_size`
    and `ggml_type_name`."""

    name: str
    type_size: int  # bytes per block (`ggml_type_size`)
    blck_size: int  # elements per block (`ggml_blck_size`)
    code: int  # value of `enum ggml_type`

    @property
    def is_quantized(self) -> bool:
        """`ggml_is_quantized` (for the types ported here: a block holds more than one element)."""
        return self.blck_size > 1

    def __repr__(self):
        return self.name.upper()


F32 = GGMLType("f32", 4, 1, 0)
F16 = GGMLType("f16", 2, 1, 1)
Q4_0 = GGMLType("q4_0", 18, 32, 2)
Q8_0 = GGMLType("q8_0", 34, 32, 8)
I32 = GGMLType("i32", 4, 1, 26)
TYPES = {t.name: t for t in (F32, F16, Q4_0, Q8_0, I32)}


def type_by_name(name) -> GGMLType:
    """The type called `name` (as `ggml_type_name` prints it, e.g. "f16"); a GGMLType passes through."""
    if isinstance(name, GGMLType):
        return name
    t = TYPES.get(str(name).lower())
    if t is None:
        raise UnknownTypeError(f"unknown ggml type {name!r}; known types: {', '.join(TYPES)}")
    return t


def row_size(type: GGMLType, ne0: int) -> int:
    """`ggml_row_size`: bytes of one row of `ne0` elements (`ne0` must be a whole number of blocks)."""
    if ne0 % type.blck_size:
        raise ShapeError(
            f"a row of {ne0} {type.name} elements is not a whole number of blocks "
            f"({type.blck_size} elements per block)"
        )
    return type.type_size * ne0 // type.blck_size


# %% [markdown]
# Four elements of f32 take 16 bytes; 64 weights of q8_0 are two blocks, 68 bytes; 33 weights of
# q4_0 are not a whole number of blocks, so ggml refuses them (here: a `ShapeError`).

# %%
print(row_size(F32, 4), row_size(Q8_0, 64), row_size(Q4_0, 64))
try:
    row_size(Q4_0, 33)
except ShapeError as e:
    print("ShapeError:", e)

# %% [markdown]
# ## 3 · The tensor: `ne`, `nb`, op, sources, views
#
# `struct ggml_tensor` (ggml.h) is a plain record. The fields this port keeps:
#
# | field | meaning |
# |---|---|
# | `type` | element type |
# | `ne[4]` | number of elements per dimension, **fastest first** (`ne[0]` is a row) |
# | `nb[4]` | byte stride per dimension: `nb[0]` = block size, `nb[1]` = row size, ... |
# | `op`, `op_params` | the op that produces the tensor (`NONE` for data) and 16 int32 words of parameters |
# | `src[10]` | the op's inputs, slot by slot (a slot may be empty) |
# | `view_src`, `view_offs` | the tensor whose memory this one shares, and the byte offset into it |
# | `flags` | INPUT / OUTPUT / PARAM |
# | `buffer`, `data` | where the tensor lives once allocated (chapter 02 on) |
# | `name` | up to 63 bytes |
#
# A numpy user's array of `shape=(4, 16, 32)` is a ggml tensor with `ne = [32, 16, 4, 1]`:
# reverse the shape, pad with ones to four dimensions. The C builds a new tensor in
# `ggml_new_tensor_impl` (ggml.c); the essential lines are
#
# ```c
# if (view_src != NULL && view_src->view_src != NULL) {   // a view of a view ...
#     view_offs += view_src->view_offs;                    // ... accumulates the offset
#     view_src   = view_src->view_src;                     // ... and points at the root
# }
# size_t data_size = ggml_row_size(type, ne[0]);
# for (int i = 1; i < n_dims; i++) data_size *= ne[i];
# GGML_ASSERT(view_src == NULL || data_size == 0 || data_size + view_offs <= ggml_nbytes(view_src));
# ...
# result->nb[0] = ggml_type_size(type);
# result->nb[1] = result->nb[0]*(result->ne[0]/ggml_blck_size(type));
# for (int i = 2; i < GGML_MAX_DIMS; i++) result->nb[i] = result->nb[i - 1]*result->ne[i - 1];
# ```
#
# so `view_src` is **always the root** and the bounds check uses the view's *contiguous* size.

# %%
# | export
class TensorFlag(enum.IntFlag):
    """`enum ggml_tensor_flag`: `GGML_TENSOR_FLAG_INPUT`, `_OUTPUT`, `_PARAM`."""

    INPUT = 1
    OUTPUT = 2
    PARAM = 4


class Op(enum.Enum):
    """`enum ggml_op`, restricted to the ops this project ports (`ggml_op_name` is `.name`)."""

    NONE = "NONE"
    DUP = "DUP"
    ADD = "ADD"
    ADD1 = "ADD1"
    SUB = "SUB"
    MUL = "MUL"
    DIV = "DIV"
    SQR = "SQR"
    SQRT = "SQRT"
    LOG = "LOG"
    SUM = "SUM"
    SUM_ROWS = "SUM_ROWS"
    MEAN = "MEAN"
    CONCAT = "CONCAT"
    NORM = "NORM"
    RMS_NORM = "RMS_NORM"
    MUL_MAT = "MUL_MAT"
    SCALE = "SCALE"
    CPY = "CPY"
    CONT = "CONT"
    RESHAPE = "RESHAPE"
    VIEW = "VIEW"
    PERMUTE = "PERMUTE"
    TRANSPOSE = "TRANSPOSE"
    GET_ROWS = "GET_ROWS"
    DIAG_MASK_INF = "DIAG_MASK_INF"
    DIAG_MASK_ZERO = "DIAG_MASK_ZERO"
    SOFT_MAX = "SOFT_MAX"
    ROPE = "ROPE"
    LEAKY_RELU = "LEAKY_RELU"
    UNARY = "UNARY"

    def __repr__(self):
        return f"Op.{self.name}"

    # Members are singletons compared by identity, so the identity hash is correct; Enum's own
    # `__hash__` is a Python function, and `op in SOME_SET` runs on every node of the planner.
    __hash__ = object.__hash__


class UnaryOp(enum.IntEnum):
    """`enum ggml_unary_op`; the value is what `op_params[0]` of a UNARY tensor holds."""

    ABS = 0
    SGN = 1
    NEG = 2
    STEP = 3
    TANH = 4
    ELU = 5
    RELU = 6
    SIGMOID = 7
    GELU = 8
    GELU_QUICK = 9
    SILU = 10
    HARDSWISH = 11
    HARDSIGMOID = 12
    EXP = 13


VIEW_OPS = frozenset({Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE})  # `ggml_is_view_op`


def op_by_name(name) -> Op:
    """The Op called `name` (as `ggml_op_name` prints it); an Op passes through."""
    if isinstance(name, Op):
        return name
    try:
        return Op[str(name)]
    except KeyError:
        raise UnknownOpError(f"unknown ggml op {name!r}; known ops: {', '.join(o.name for o in Op)}") from None


def float_to_word(x: float) -> int:
    """A float's f32 bits as a signed int32 — how ggml stores float op parameters (`memcpy`)."""
    return struct.unpack("<i", struct.pack("<f", x))[0]


def word_to_float(w: int) -> float:
    """The inverse of `float_to_word`: read an int32 op parameter as the f32 it holds."""
    return struct.unpack("<f", struct.pack("<i", w))[0]


# %% [markdown]
# `op_params` is 64 bytes in C; here it is a list of 16 int32 words, and floats are stored by their
# bits, exactly as `ggml_set_op_params_f32` does: `1.0f` is the word `1065353216`.

# %%
print(float_to_word(1.0), word_to_float(1065353216), float_to_word(1e-5))

# %% [markdown]
# The tensor class itself. It uses `__slots__` because large graphs hold thousands of tensors and
# the planner reads their fields in hot loops; `src` keeps only the slots up to the last one used,
# so visiting sources costs no time for the eight empty slots a C tensor carries.

# %%
# | export
class Tensor:
    """`struct ggml_tensor` (ggml.h): type, `ne`, `nb`, op, op_params, src, view_src, view_offs,
    flags, name, buffer and data. Create tensors through a `Context` or an op, not directly.

    Identity matters: two tensors are the same only if they are the same object (ggml compares
    pointers), so Tensor keeps object identity for `==` and `hash`.
    """

    __slots__ = ("type", "ne", "nb", "op", "op_params", "flags", "src", "view_src", "view_offs",
                 "name", "buffer", "data", "extra", "ctx")

    def __init__(self, type: GGMLType, ne, nb, view_src=None, view_offs=0, ctx=None):
        self.type = type
        self.ne = ne  # list of 4 ints, fastest dimension first
        self.nb = nb  # list of 4 byte strides
        self.op = Op.NONE
        self.op_params = [0] * (GGML_MAX_OP_PARAMS // 4)
        self.flags = 0
        self.src = []  # slots 0..k; an empty slot is None; trailing empty slots are dropped
        self.view_src = view_src
        self.view_offs = view_offs
        self.name = ""
        self.buffer = None
        self.data = None if view_src is None or view_src.data is None else view_src.data + view_offs
        self.extra = None
        self.ctx = ctx

    # -- sizes -------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """`ggml_nbytes`."""
        return nbytes(self)

    @property
    def nelements(self) -> int:
        """`ggml_nelements`."""
        ne = self.ne
        return ne[0] * ne[1] * ne[2] * ne[3]

    @property
    def shape(self) -> tuple:
        """The numpy shape of this tensor: `ne` reversed, with leading ones dropped."""
        ne = list(self.ne)
        while len(ne) > 1 and ne[-1] == 1:
            ne.pop()
        return tuple(reversed(ne))

    # -- graph and names -------------------------------------------------------------------
    def set_src(self, i: int, t) -> None:
        """Set source slot `i` (`tensor->src[i] = t`)."""
        if not 0 <= i < GGML_MAX_SRC:
            raise IndexError(f"source slot {i} of {describe(self)} is out of range 0..{GGML_MAX_SRC - 1}")
        src = self.src
        while len(src) <= i:
            src.append(None)
        src[i] = t
        while src and src[-1] is None:
            src.pop()

    def get_src(self, i: int):
        """Source slot `i`, or None (`tensor->src[i]`)."""
        return self.src[i] if i < len(self.src) else None

    def set_name(self, name: str) -> "Tensor":
        """`ggml_set_name`: at most 63 bytes are kept, as in C."""
        self.name = _truncate_name(name)
        return self

    def format_name(self, fmt: str, *args) -> "Tensor":
        """`ggml_format_name` (printf-style `%s`/`%d` formatting, truncated to 63 bytes)."""
        self.name = _truncate_name(fmt % args)
        return self

    def get_name(self) -> str:
        """`ggml_get_name`."""
        return self.name

    def set_op_params(self, *words: int) -> None:
        """`ggml_set_op_params`: store int32 words from slot 0 on."""
        self.op_params[: len(words)] = words

    def op_params_i32(self, i: int) -> int:
        """`ggml_get_op_params_i32`."""
        return self.op_params[i]

    def op_params_f32(self, i: int) -> float:
        """`ggml_get_op_params_f32`."""
        return word_to_float(self.op_params[i])

    @property
    def unary_op(self):
        """`ggml_get_unary_op`: the UnaryOp of a UNARY tensor, else None."""
        return UnaryOp(self.op_params[0]) if self.op is Op.UNARY else None

    def __repr__(self):
        op = self.op.name if self.op is not Op.UNARY else f"UNARY:{self.unary_op.name}"
        view = f", view of {self.view_src.name!r}+{self.view_offs}" if self.view_src is not None else ""
        return f"Tensor({self.name!r}, {self.type.name}, ne={list(self.ne)}, op={op}{view})"


def _truncate_name(name: str) -> str:
    raw = str(name).encode("utf-8")[: GGML_MAX_NAME - 1]
    return raw.decode("utf-8", errors="ignore")


def describe(t: Tensor) -> str:
    """A tensor as error messages name it: `'name' f32 [ne0, ne1, ne2, ne3]`."""
    name = repr(t.name) if t.name else "<unnamed>"
    return f"{name} {t.type.name} {list(t.ne)}"


# %% [markdown]
# ### Sizes, as ggml computes them
#
# `ggml_nbytes` does not multiply the shape out. It adds, for every dimension, how far the last
# element is from the first (`(ne[i]-1)·nb[i]`), plus one element (or, for block types, one row of
# blocks). For a contiguous tensor this equals `nelements·type_size/blck_size`; for a permuted or
# strided view it is the *span* the view touches — the number the allocator reserves.
#
# ```c
# if (blck_size == 1) {
#     nbytes = ggml_type_size(tensor->type);
#     for (int i = 0; i < GGML_MAX_DIMS; ++i) nbytes += (tensor->ne[i] - 1)*tensor->nb[i];
# } else {
#     nbytes = tensor->ne[0]*tensor->nb[0]/blck_size;
#     for (int i = 1; i < GGML_MAX_DIMS; ++i) nbytes += (tensor->ne[i] - 1)*tensor->nb[i];
# }
# ```

# %%
# | export
def nbytes(t: Tensor) -> int:
    """`ggml_nbytes`: the bytes spanned by the tensor (its strides included), as ggml computes it."""
    ne0, ne1, ne2, ne3 = t.ne
    nb0, nb1, nb2, nb3 = t.nb
    tp = t.type
    if tp.blck_size == 1:
        return tp.type_size + (ne0 - 1) * nb0 + (ne1 - 1) * nb1 + (ne2 - 1) * nb2 + (ne3 - 1) * nb3
    return ne0 * nb0 // tp.blck_size + (ne1 - 1) * nb1 + (ne2 - 1) * nb2 + (ne3 - 1) * nb3


def nelements(t: Tensor) -> int:
    """`ggml_nelements`."""
    return t.nelements


def nrows(t: Tensor) -> int:
    """`ggml_nrows`: rows of `ne[0]` elements."""
    return t.ne[1] * t.ne[2] * t.ne[3]


def contiguous_strides(type: GGMLType, ne) -> list:
    """The strides `ggml_new_tensor_impl` gives a fresh tensor of shape `ne`."""
    nb0 = type.type_size
    nb1 = nb0 * (ne[0] // type.blck_size)
    nb2 = nb1 * ne[1]
    return [nb0, nb1, nb2, nb2 * ne[2]]


def is_contiguous_n(t: Tensor, n: int) -> bool:
    """`ggml_is_contiguous_n`: dimensions above `n` follow each other without gaps (size-1
    dimensions are ignored); dimensions 1..n may have any stride."""
    ne, nb, tp = t.ne, t.nb, t.type
    next_nb = tp.type_size
    if ne[0] != tp.blck_size and nb[0] != next_nb:
        return False
    next_nb *= ne[0] // tp.blck_size
    for i in range(1, GGML_MAX_DIMS):
        if ne[i] != 1:
            if i > n:
                if nb[i] != next_nb:
                    return False
                next_nb *= ne[i]
            else:
                next_nb = ne[i] * nb[i]
    return True


def is_contiguous(t: Tensor) -> bool:
    """`ggml_is_contiguous` (= `ggml_is_contiguous_0`)."""
    return is_contiguous_n(t, 0)


def is_contiguous_1(t: Tensor) -> bool:
    """`ggml_is_contiguous_1`: rows are contiguous, the rows themselves may be strided."""
    return is_contiguous_n(t, 1)


def is_transposed(t: Tensor) -> bool:
    """`ggml_is_transposed`: `nb[0] > nb[1]`."""
    return t.nb[0] > t.nb[1]


def is_padded_1d(t: Tensor) -> bool:
    """`ggml_is_padded_1d`: contiguous elements, rows may be padded."""
    ne, nb = t.ne, t.nb
    return nb[0] == t.type.type_size and nb[2] == nb[1] * ne[1] and nb[3] == nb[2] * ne[2]


def is_empty(t: Tensor) -> bool:
    """`ggml_is_empty`: some dimension is 0."""
    return 0 in t.ne


def is_scalar(t: Tensor) -> bool:
    """`ggml_is_scalar`."""
    return t.ne[0] == 1 and t.ne[1] == 1 and t.ne[2] == 1 and t.ne[3] == 1


def is_vector(t: Tensor) -> bool:
    """`ggml_is_vector`."""
    return t.ne[1] == 1 and t.ne[2] == 1 and t.ne[3] == 1


def is_matrix(t: Tensor) -> bool:
    """`ggml_is_matrix`."""
    return t.ne[2] == 1 and t.ne[3] == 1


def are_same_shape(a: Tensor, b: Tensor) -> bool:
    """`ggml_are_same_shape`."""
    return list(a.ne) == list(b.ne)


def can_repeat(t0: Tensor, t1: Tensor) -> bool:
    """`ggml_can_repeat`: `t0` broadcasts to `t1` (every `t1.ne[i]` is a multiple of `t0.ne[i]`)."""
    if is_empty(t0):
        return is_empty(t1)
    return all(t1.ne[i] % t0.ne[i] == 0 for i in range(GGML_MAX_DIMS))


def is_view_op(op: Op) -> bool:
    """`ggml_is_view_op`: VIEW, RESHAPE, PERMUTE, TRANSPOSE."""
    return op in VIEW_OPS


# %% [markdown]
# ### The context: where tensors are created
#
# A ggml context is an arena of tensor headers. With `no_alloc = true` — the only mode of this port
# — it holds no data: memory comes later from a buffer (chapter 02) or the graph allocator
# (chapter 04). The context keeps its tensors in creation order, which `ggml_backend_alloc_ctx_tensors`
# and the fixtures (tensor ids) rely on.

# %%
# | export
class Context:
    """A `no_alloc` `ggml_context` (`ggml_init` with `no_alloc = true`): tensor headers in creation
    order (`ggml_get_first_tensor` / `ggml_get_next_tensor`), no data."""

    def __init__(self, name: str = ""):
        self.name = name
        self.tensors = []

    def _new_tensor_impl(self, type, ne, view_src=None, view_offs=0) -> Tensor:
        """`ggml_new_tensor_impl`: resolve the view root, check the view's bounds, set strides."""
        type = type_by_name(type)
        ne = [int(x) for x in ne] + [1] * (GGML_MAX_DIMS - len(ne))
        if len(ne) != GGML_MAX_DIMS or min(ne) < 0:
            raise ShapeError(f"a tensor needs 1..4 non-negative dimensions, got ne={ne}")
        if view_src is not None and view_src.view_src is not None:
            view_offs += view_src.view_offs
            view_src = view_src.view_src
        data_size = row_size(type, ne[0]) * ne[1] * ne[2] * ne[3]
        if view_src is not None and data_size != 0 and data_size + view_offs > nbytes(view_src):
            raise ViewBoundsError(
                f"a view of {describe(view_src)} at byte offset {view_offs} with ne={ne} needs "
                f"{data_size} bytes up to byte {data_size + view_offs}, but the tensor has {nbytes(view_src)} bytes"
            )
        if view_offs < 0:
            raise ViewBoundsError(f"a view of {describe(view_src)} cannot start at a negative offset {view_offs}")
        t = Tensor(type, ne, contiguous_strides(type, ne), view_src, view_offs, self)
        self.tensors.append(t)
        return t

    def new_tensor(self, type, ne, name: str = "") -> Tensor:
        """`ggml_new_tensor`: a fresh contiguous tensor of shape `ne` (fastest dimension first)."""
        t = self._new_tensor_impl(type, ne)
        if name:
            t.set_name(name)
        return t

    def new_tensor_1d(self, type, ne0, name: str = "") -> Tensor:
        """`ggml_new_tensor_1d`."""
        return self.new_tensor(type, [ne0], name)

    def new_tensor_2d(self, type, ne0, ne1, name: str = "") -> Tensor:
        """`ggml_new_tensor_2d`."""
        return self.new_tensor(type, [ne0, ne1], name)

    def new_tensor_3d(self, type, ne0, ne1, ne2, name: str = "") -> Tensor:
        """`ggml_new_tensor_3d`."""
        return self.new_tensor(type, [ne0, ne1, ne2], name)

    def new_tensor_4d(self, type, ne0, ne1, ne2, ne3, name: str = "") -> Tensor:
        """`ggml_new_tensor_4d`."""
        return self.new_tensor(type, [ne0, ne1, ne2, ne3], name)

    def dup_tensor(self, src: Tensor) -> Tensor:
        """`ggml_dup_tensor`: a new tensor with the type and shape of `src` (contiguous, unnamed)."""
        return self._new_tensor_impl(src.type, src.ne)

    def view_tensor(self, src: Tensor) -> Tensor:
        """`ggml_view_tensor`: a tensor sharing all of `src`'s memory and strides, named
        "<src> (view)"; its op stays NONE (callers such as `cpy` and the in-place ops set it)."""
        t = self._new_tensor_impl(src.type, src.ne, src, 0)
        t.format_name("%s (view)", src.name)
        t.nb = list(src.nb)
        return t

    def get_tensor(self, name: str):
        """`ggml_get_tensor`: the first tensor called `name`, or None."""
        return next((t for t in self.tensors if t.name == name), None)

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self):
        return len(self.tensors)

    def __repr__(self):
        return f"Context({self.name!r}, {len(self.tensors)} tensors)"


def set_input(t: Tensor) -> None:
    """`ggml_set_input`: the tensor is filled by the user before compute (allocated early, never reused)."""
    t.flags |= TensorFlag.INPUT


def set_output(t: Tensor) -> None:
    """`ggml_set_output`: the tensor is read by the user after compute (never freed or overwritten)."""
    t.flags |= TensorFlag.OUTPUT


def set_param(t: Tensor) -> None:
    """`ggml_set_param` (forward-only port: the flag only, no gradient tensor)."""
    t.flags |= TensorFlag.PARAM


# %% [markdown]
# A first look. A numpy array of shape `(4, 16, 32)` of f32 is `ne = [32, 16, 4, 1]` and
# `nb = [4, 128, 2048, 8192]`: one element is 4 bytes, one row of 32 is 128 bytes, and so on.
# A q8_0 matrix of 64×8 has `nb[0] = 34` — the size of a 32-element block — and `nbytes` 544.

# %%
import numpy as np

ctx = Context("demo")
x = ctx.new_tensor_3d(F32, 32, 16, 4, name="x")
a = np.zeros((4, 16, 32), dtype=np.float32)
print(x, "nb =", x.nb, "nbytes =", x.nbytes)
print("numpy shape", a.shape, "strides", a.strides, "-> ggml ne reversed:", x.shape)
wq = ctx.new_tensor_2d(Q8_0, 64, 8, name="wq")
print(wq, "nb =", wq.nb, "nbytes =", wq.nbytes)

# %% [markdown]
# ## 4 · Ops: shapes, strides, names and parameters
#
# A ggml op does not compute: it creates the result tensor, records the op and its sources, and
# returns. The rules below follow the op constructors of `ggml.c`. Three families:
#
# * **fresh results** (`ggml_dup_tensor` or `ggml_new_tensor`): add, mul, mul_mat, soft_max, ... —
#   new memory, contiguous strides;
# * **views** (`ggml_new_tensor_impl` with a `view_src`): view_Nd, reshape, permute, transpose and
#   cpy — no memory of their own; they get automatic names: `" (view)"`, `" (reshaped)"`,
#   `" (permuted)"`, `" (transposed)"`, `" (copy of X)"`, and cont gets `" (cont)"`;
# * **in-place** variants (`ggml_add_inplace`, ...): the result is `ggml_view_tensor(a)`, a view
#   of the first source, so the op writes over its input.
#
# The binary element-wise ops broadcast `b` over `a` (`ggml_can_repeat(b, a)`: each `a.ne[i]` is a
# multiple of `b.ne[i]`) and the result has `a`'s shape. `mul_mat(a, b)` contracts `ne[0]` of both
# and gives `[a.ne[1], b.ne[1], b.ne[2], b.ne[3]]` in f32 — in numpy terms `b @ a.T`.

# %%
# | export ops
"""ggml's op constructors (ggml.c): each creates the result tensor with ggml's shape, strides,
op_params and automatic name, and records its sources. No arithmetic happens here."""

from ggml_lite.errors import DataTypeError, LayoutError, PermuteAxisError, ReshapeError, ShapeError
from ggml_lite.tensor import (
    F16, F32, GGML_MAX_DIMS, I32, Op, Tensor, UnaryOp, are_same_shape, can_repeat, describe,
    float_to_word, is_contiguous, is_contiguous_1, is_matrix, is_padded_1d, is_scalar, is_transposed,
    is_vector,
)


def _result(ctx, a: Tensor, inplace: bool) -> Tensor:
    """The result tensor of an element-wise op: `ggml_view_tensor(a)` in place, else `ggml_dup_tensor(a)`."""
    return ctx.view_tensor(a) if inplace else ctx.dup_tensor(a)


def _set(t: Tensor, op: Op, *srcs) -> Tensor:
    t.op = op
    for i, s in enumerate(srcs):
        if s is not None:
            t.set_src(i, s)
    return t


def _binary(ctx, op: Op, a: Tensor, b: Tensor, inplace: bool) -> Tensor:
    # ggml_add_impl / ggml_sub_impl / ggml_mul_impl / ggml_div_impl
    if not can_repeat(b, a):
        raise ShapeError(
            f"ggml_{op.name.lower()}: {describe(b)} does not broadcast to {describe(a)} "
            f"(each ne of the first must be a multiple of the second's)"
        )
    return _set(_result(ctx, a, inplace), op, a, b)


def add(ctx, a: Tensor, b: Tensor) -> Tensor:
    """`ggml_add`: a + b, b broadcast over a."""
    return _binary(ctx, Op.ADD, a, b, False)


def add_inplace(ctx, a: Tensor, b: Tensor) -> Tensor:
    """`ggml_add_inplace`: the result is a view of `a`."""
    return _binary(ctx, Op.ADD, a, b, True)


def sub(ctx, a: Tensor, b: Tensor) -> Tensor:
    """`ggml_sub`: a - b, b broadcast over a."""
    return _binary(ctx, Op.SUB, a, b, False)


def sub_inplace(ctx, a: Tensor, b: Tensor) -> Tensor:
    """`ggml_sub_inplace`."""
    return _binary(ctx, Op.SUB, a, b, True)


def mul(ctx, a: Tensor, b: Tensor) -> Tensor:
    """`ggml_mul`: a * b, b broadcast over a."""
    return _binary(ctx, Op.MUL, a, b, False)


def mul_inplace(ctx, a: Tensor, b: Tensor) -> Tensor:
    """`ggml_mul_inplace`."""
    return _binary(ctx, Op.MUL, a, b, True)


def div(ctx, a: Tensor, b: Tensor) -> Tensor:
    """`ggml_div`: a / b, b broadcast over a."""
    return _binary(ctx, Op.DIV, a, b, False)


def div_inplace(ctx, a: Tensor, b: Tensor) -> Tensor:
    """`ggml_div_inplace`."""
    return _binary(ctx, Op.DIV, a, b, True)


def add1(ctx, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_add1` (`ggml_add1_inplace` with inplace=True): a + the scalar b."""
    if not is_scalar(b):
        raise ShapeError(f"ggml_add1: {describe(b)} must be a scalar (ne = [1, 1, 1, 1])")
    if not is_padded_1d(a):
        raise LayoutError(f"ggml_add1: {describe(a)} must have contiguous rows (nb = {a.nb})")
    return _set(_result(ctx, a, inplace), Op.ADD1, a, b)


def _elementwise(ctx, op: Op, a: Tensor, inplace: bool) -> Tensor:
    # ggml_sqr_impl / ggml_sqrt_impl / ggml_log_impl / ggml_dup_impl
    return _set(_result(ctx, a, inplace), op, a)


def sqr(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_sqr` (`ggml_sqr_inplace`): a²."""
    return _elementwise(ctx, Op.SQR, a, inplace)


def sqrt(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_sqrt` (`ggml_sqrt_inplace`)."""
    return _elementwise(ctx, Op.SQRT, a, inplace)


def log(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_log` (`ggml_log_inplace`)."""
    return _elementwise(ctx, Op.LOG, a, inplace)


def dup(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_dup` (`ggml_dup_inplace`): a copy of `a` (contiguous)."""
    return _elementwise(ctx, Op.DUP, a, inplace)


def sum_rows(ctx, a: Tensor) -> Tensor:
    """`ggml_sum_rows`: the sum of every row; the result has `ne = [1, ne1, ne2, ne3]`."""
    return _set(ctx.new_tensor(a.type, [1, a.ne[1], a.ne[2], a.ne[3]]), Op.SUM_ROWS, a)


def sum(ctx, a: Tensor) -> Tensor:  # noqa: A001 (ggml's name; shadows the builtin only in this module)
    """`ggml_sum`: the sum of all elements, a 1-element tensor of `a`'s type."""
    return _set(ctx.new_tensor(a.type, [1, 1, 1, 1]), Op.SUM, a)


def mean(ctx, a: Tensor) -> Tensor:
    """`ggml_mean`: the mean of every row, f32 `[1, ne1, ne2, ne3]`."""
    return _set(ctx.new_tensor(F32, [1, a.ne[1], a.ne[2], a.ne[3]]), Op.MEAN, a)


def scale(ctx, a: Tensor, s: float, inplace: bool = False) -> Tensor:
    """`ggml_scale` (`ggml_scale_inplace`): a·s; `op_params[0]` holds s as f32 bits."""
    if not is_padded_1d(a):
        raise LayoutError(f"ggml_scale: {describe(a)} must have contiguous rows (nb = {a.nb})")
    t = _set(_result(ctx, a, inplace), Op.SCALE, a)
    t.set_op_params(float_to_word(s))
    return t


def scale_inplace(ctx, a: Tensor, s: float) -> Tensor:
    """`ggml_scale_inplace`."""
    return scale(ctx, a, s, inplace=True)


def unary(ctx, a: Tensor, op, inplace: bool = False) -> Tensor:
    """`ggml_unary` (`ggml_unary_inplace`, `ggml_unary_impl`): op UNARY, `op_params[0]` = the unary op."""
    op = UnaryOp[op] if isinstance(op, str) else UnaryOp(op)
    if not is_contiguous_1(a):
        raise LayoutError(f"ggml_unary({op.name.lower()}): {describe(a)} must have contiguous rows (nb = {a.nb})")
    t = _set(_result(ctx, a, inplace), Op.UNARY, a)
    t.set_op_params(int(op))
    return t


def silu(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_silu` (`ggml_silu_inplace`)."""
    return unary(ctx, a, UnaryOp.SILU, inplace)


def gelu(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_gelu` (`ggml_gelu_inplace`)."""
    return unary(ctx, a, UnaryOp.GELU, inplace)


def relu(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_relu` (`ggml_relu_inplace`)."""
    return unary(ctx, a, UnaryOp.RELU, inplace)


def tanh(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_tanh` (`ggml_tanh_inplace`)."""
    return unary(ctx, a, UnaryOp.TANH, inplace)


def neg(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_neg` (`ggml_neg_inplace`)."""
    return unary(ctx, a, UnaryOp.NEG, inplace)


def exp(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_exp` (`ggml_exp_inplace`)."""
    return unary(ctx, a, UnaryOp.EXP, inplace)


def leaky_relu(ctx, a: Tensor, negative_slope: float, inplace: bool = False) -> Tensor:
    """`ggml_leaky_relu` (`ggml_leaky_relu_impl`): op LEAKY_RELU, `op_params[0]` = the slope as f32 bits."""
    t = _set(_result(ctx, a, inplace), Op.LEAKY_RELU, a)
    t.set_op_params(float_to_word(negative_slope))
    return t


def _norm(ctx, op: Op, a: Tensor, eps: float, inplace: bool) -> Tensor:
    # ggml_norm_impl / ggml_rms_norm_impl
    t = _set(_result(ctx, a, inplace), op, a)
    t.set_op_params(float_to_word(eps))
    return t


def norm(ctx, a: Tensor, eps: float, inplace: bool = False) -> Tensor:
    """`ggml_norm` (`ggml_norm_inplace`): normalize each row; `op_params[0]` = eps."""
    return _norm(ctx, Op.NORM, a, eps, inplace)


def rms_norm(ctx, a: Tensor, eps: float, inplace: bool = False) -> Tensor:
    """`ggml_rms_norm` (`ggml_rms_norm_inplace`): RMS-normalize each row; `op_params[0]` = eps."""
    return _norm(ctx, Op.RMS_NORM, a, eps, inplace)


def concat(ctx, a: Tensor, b: Tensor, dim: int) -> Tensor:
    """`ggml_concat`: join along `dim`; every other dimension must match; `op_params[0]` = dim."""
    if not 0 <= dim < GGML_MAX_DIMS:
        raise ShapeError(f"ggml_concat: dim {dim} of {describe(a)} is out of range 0..3")
    if a.type is not b.type:
        raise DataTypeError(f"ggml_concat: {describe(a)} and {describe(b)} must have the same type")
    ne = []
    for d in range(GGML_MAX_DIMS):
        if d != dim and a.ne[d] != b.ne[d]:
            raise ShapeError(f"ggml_concat along dim {dim}: {describe(a)} and {describe(b)} differ in dim {d}")
        ne.append(a.ne[d] + b.ne[d] if d == dim else a.ne[d])
    t = _set(ctx.new_tensor(a.type, ne), Op.CONCAT, a, b)
    t.set_op_params(dim)
    return t


def mul_mat(ctx, a: Tensor, b: Tensor) -> Tensor:
    """`ggml_mul_mat`: contracts `ne[0]`; result f32 `[a.ne1, b.ne1, b.ne2, b.ne3]` (numpy: `b @ a.T`),
    `a` broadcast over dims 2 and 3 (`ggml_can_mul_mat`)."""
    if not (a.ne[0] == b.ne[0] and b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0):
        raise ShapeError(
            f"ggml_mul_mat: cannot multiply {describe(a)} by {describe(b)} (need equal ne[0] and "
            f"b.ne[2], b.ne[3] multiples of a's)"
        )
    if is_transposed(a):
        raise LayoutError(f"ggml_mul_mat: {describe(a)} must not be transposed (nb = {a.nb})")
    return _set(ctx.new_tensor(F32, [a.ne[1], b.ne[1], b.ne[2], b.ne[3]]), Op.MUL_MAT, a, b)


def get_rows(ctx, a: Tensor, b: Tensor) -> Tensor:
    """`ggml_get_rows`: rows of `a` picked by the i32 indices `b`; result `[a.ne0, b.ne0, b.ne1, b.ne2]`,
    f32 (i32 when `a` is i32)."""
    if b.type is not I32:
        raise DataTypeError(f"ggml_get_rows: the indices {describe(b)} must be i32")
    if a.ne[2] != b.ne[1] or b.ne[3] != 1:
        raise ShapeError(f"ggml_get_rows: indices {describe(b)} do not fit rows of {describe(a)} (a.ne[2] == b.ne[1], b.ne[3] == 1)")
    type = I32 if a.type is I32 else F32
    return _set(ctx.new_tensor(type, [a.ne[0], b.ne[0], b.ne[1], b.ne[2]]), Op.GET_ROWS, a, b)


def diag_mask_inf(ctx, a: Tensor, n_past: int, inplace: bool = False) -> Tensor:
    """`ggml_diag_mask_inf` (`_inplace`): -inf above the diagonal shifted by n_past; `op_params[0]` = n_past."""
    t = _set(_result(ctx, a, inplace), Op.DIAG_MASK_INF, a)
    t.set_op_params(n_past)
    return t


def diag_mask_zero(ctx, a: Tensor, n_past: int, inplace: bool = False) -> Tensor:
    """`ggml_diag_mask_zero` (`_inplace`): 0 above the diagonal shifted by n_past."""
    t = _set(_result(ctx, a, inplace), Op.DIAG_MASK_ZERO, a)
    t.set_op_params(n_past)
    return t


def soft_max_ext(ctx, a: Tensor, mask, scale: float, max_bias: float, inplace: bool = False) -> Tensor:
    """`ggml_soft_max_ext` (`ggml_soft_max_impl`): softmax(a·scale + mask) per row; `op_params` =
    (scale, max_bias) as f32 bits; `src[1]` = mask."""
    if not is_contiguous(a):
        raise LayoutError(f"ggml_soft_max: {describe(a)} must be contiguous (nb = {a.nb})")
    if mask is not None:
        if mask.type not in (F16, F32):
            raise DataTypeError(f"ggml_soft_max: the mask {describe(mask)} must be f16 or f32")
        if not is_contiguous(mask) or not is_matrix(mask):
            raise LayoutError(f"ggml_soft_max: the mask {describe(mask)} must be a contiguous matrix")
        if mask.ne[0] != a.ne[0] or mask.ne[1] < a.ne[1]:
            raise ShapeError(f"ggml_soft_max: the mask {describe(mask)} does not cover {describe(a)}")
    if max_bias > 0 and mask is None:
        raise ShapeError(f"ggml_soft_max: max_bias > 0 needs a mask ({describe(a)})")
    t = _set(_result(ctx, a, inplace), Op.SOFT_MAX, a, mask)
    t.set_op_params(float_to_word(scale), float_to_word(max_bias))
    return t


def soft_max(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """`ggml_soft_max` (`ggml_soft_max_inplace`): softmax of each row (scale 1, no mask)."""
    return soft_max_ext(ctx, a, None, 1.0, 0.0, inplace)


def rope_ext(ctx, a: Tensor, pos: Tensor, freq_factors, n_dims: int, mode: int, n_ctx_orig: int,
             freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
             beta_fast: float, beta_slow: float, inplace: bool = False) -> Tensor:
    """`ggml_rope_ext` (`ggml_rope_impl`): rotary embedding; `op_params` = (0, n_dims, mode, 0,
    n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow), floats as bits."""
    if mode & 1:
        raise ShapeError(f"ggml_rope: mode & 1 is no longer supported ({describe(a)})")
    if pos.type is not I32:
        raise DataTypeError(f"ggml_rope: the positions {describe(pos)} must be i32")
    if not is_vector(pos) or a.ne[2] != pos.ne[0]:
        raise ShapeError(f"ggml_rope: positions {describe(pos)} must be a vector of a.ne[2] = {a.ne[2]} for {describe(a)}")
    if freq_factors is not None and (freq_factors.type is not F32 or freq_factors.ne[0] < n_dims // 2):
        raise ShapeError(f"ggml_rope: freq_factors {describe(freq_factors)} must be f32 with ne[0] >= {n_dims // 2}")
    t = _set(_result(ctx, a, inplace), Op.ROPE, a, pos, freq_factors)
    t.set_op_params(0, n_dims, mode, 0, n_ctx_orig,
                    *(float_to_word(v) for v in (freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)))
    return t


# %% [markdown]
# ### Views, reshapes, permutes, copies
#
# These make a tensor that **shares memory** with its source. ggml keeps `view_src` pointing at the
# root and accumulates `view_offs`, so a view of a view of `h` still names `h`. `view_2d(a, ne0, ne1,
# nb1, offset)` takes the row stride from the caller — that is how llama.cpp cuts heads out of a
# KV cache. `permute(a, 0, 2, 1, 3)` sends dimension `i` of `a` to position `axis_i` of the result
# and swaps the strides with it; nothing moves in memory. `cont` makes a permuted view contiguous
# again (a real copy, a new tensor). `cpy(a, b)` writes `a` into `b`'s memory: its result is a view
# of `b`.

# %%
# | export ops
def _view_impl(ctx, a: Tensor, ne, offset: int) -> Tensor:
    # ggml_view_impl: op VIEW, op_params = the byte offset as a size_t (two int32 words)
    t = ctx._new_tensor_impl(a.type, ne, a, offset)
    t.format_name("%s (view)", a.name)
    t.set_op_params(*_size_t_words(offset))
    return _set(t, Op.VIEW, a)


def _size_t_words(v: int):
    """A size_t as the two int32 words `memcpy` puts in op_params (little-endian)."""
    lo, hi = v & 0xFFFFFFFF, (v >> 32) & 0xFFFFFFFF
    return (lo - (1 << 32) if lo >= 1 << 31 else lo), (hi - (1 << 32) if hi >= 1 << 31 else hi)


def view_1d(ctx, a: Tensor, ne0: int, offset: int) -> Tensor:
    """`ggml_view_1d`: `ne0` elements of `a` from byte `offset`."""
    return _view_impl(ctx, a, [ne0], offset)


def view_2d(ctx, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int) -> Tensor:
    """`ggml_view_2d`: `ne1` rows of `ne0` elements, `nb1` bytes apart, from byte `offset`."""
    t = _view_impl(ctx, a, [ne0, ne1], offset)
    t.nb[1] = nb1
    t.nb[2] = t.nb[3] = nb1 * ne1
    return t


def view_3d(ctx, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int) -> Tensor:
    """`ggml_view_3d`."""
    t = _view_impl(ctx, a, [ne0, ne1, ne2], offset)
    t.nb[1], t.nb[2] = nb1, nb2
    t.nb[3] = nb2 * ne2
    return t


def view_4d(ctx, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int, nb3: int,
            offset: int) -> Tensor:
    """`ggml_view_4d`."""
    t = _view_impl(ctx, a, [ne0, ne1, ne2, ne3], offset)
    t.nb[1], t.nb[2], t.nb[3] = nb1, nb2, nb3
    return t


def _check_reshape(fn: str, a: Tensor, ne) -> None:
    if not is_contiguous(a):
        raise LayoutError(f"ggml_{fn}: {describe(a)} must be contiguous to reshape (nb = {a.nb})")
    n = 1
    for x in ne:
        n *= x
    if n != a.nelements:
        raise ReshapeError(f"ggml_{fn}: cannot reshape {describe(a)} ({a.nelements} elements) to {list(ne)} ({n} elements)")


def _reshape_impl(ctx, a: Tensor, ne, fn: str) -> Tensor:
    _check_reshape(fn, a, ne)
    t = ctx._new_tensor_impl(a.type, ne, a, 0)
    t.format_name("%s (reshaped)", a.name)
    return _set(t, Op.RESHAPE, a)


def reshape(ctx, a: Tensor, b: Tensor) -> Tensor:
    """`ggml_reshape`: `a` with the shape of `b` (only `b.ne` is used)."""
    return _reshape_impl(ctx, a, b.ne, "reshape")


def reshape_1d(ctx, a: Tensor, ne0: int) -> Tensor:
    """`ggml_reshape_1d`."""
    return _reshape_impl(ctx, a, [ne0], "reshape_1d")


def reshape_2d(ctx, a: Tensor, ne0: int, ne1: int) -> Tensor:
    """`ggml_reshape_2d`."""
    return _reshape_impl(ctx, a, [ne0, ne1], "reshape_2d")


def reshape_3d(ctx, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    """`ggml_reshape_3d`."""
    return _reshape_impl(ctx, a, [ne0, ne1, ne2], "reshape_3d")


def reshape_4d(ctx, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """`ggml_reshape_4d`."""
    return _reshape_impl(ctx, a, [ne0, ne1, ne2, ne3], "reshape_4d")


def permute(ctx, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    """`ggml_permute`: dimension i of `a` goes to position `axis_i`; strides move with it;
    `op_params` = the four axes."""
    axes = (axis0, axis1, axis2, axis3)
    if any(not 0 <= x < GGML_MAX_DIMS for x in axes) or len(set(axes)) != GGML_MAX_DIMS:
        raise PermuteAxisError(f"ggml_permute of {describe(a)}: axes {list(axes)} must be a permutation of 0..3")
    t = ctx.view_tensor(a)
    t.format_name("%s (permuted)", a.name)
    ne, nb = [0] * 4, [0] * 4
    for i, ax in enumerate(axes):
        ne[ax], nb[ax] = a.ne[i], a.nb[i]
    t.ne, t.nb = ne, nb
    t.set_op_params(*axes)
    return _set(t, Op.PERMUTE, a)


def transpose(ctx, a: Tensor) -> Tensor:
    """`ggml_transpose`: swap dimensions 0 and 1 (a view: only `ne` and `nb` change)."""
    t = ctx.view_tensor(a)
    t.format_name("%s (transposed)", a.name)
    t.ne[0], t.ne[1] = a.ne[1], a.ne[0]
    t.nb[0], t.nb[1] = a.nb[1], a.nb[0]
    return _set(t, Op.TRANSPOSE, a)


def cont(ctx, a: Tensor) -> Tensor:
    """`ggml_cont` (`ggml_cont_impl`): a contiguous copy of `a`, named "<a> (cont)"."""
    t = ctx.dup_tensor(a)
    t.format_name("%s (cont)", a.name)
    return _set(t, Op.CONT, a)


def cont_4d(ctx, a: Tensor, ne0: int, ne1: int = 1, ne2: int = 1, ne3: int = 1) -> Tensor:
    """`ggml_cont_4d` (and `ggml_cont_1d/2d/3d`): a contiguous copy of `a` with a new shape of the same size."""
    if ne0 * ne1 * ne2 * ne3 != a.nelements:
        raise ReshapeError(f"ggml_cont_4d: {describe(a)} has {a.nelements} elements, not {ne0 * ne1 * ne2 * ne3} = {[ne0, ne1, ne2, ne3]}")
    t = ctx.new_tensor(a.type, [ne0, ne1, ne2, ne3])
    t.format_name("%s (cont)", a.name)
    return _set(t, Op.CONT, a)


def cont_2d(ctx, a: Tensor, ne0: int, ne1: int) -> Tensor:
    """`ggml_cont_2d`."""
    return cont_4d(ctx, a, ne0, ne1)


def cont_3d(ctx, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    """`ggml_cont_3d`."""
    return cont_4d(ctx, a, ne0, ne1, ne2)


def cpy(ctx, a: Tensor, b: Tensor) -> Tensor:
    """`ggml_cpy` (`ggml_cpy_impl`): copy (and convert) `a` into `b`'s memory; the result is a view of
    `b` named "<b> (copy of <a>)" (or "<a> (copy)" when `b` has no name)."""
    if a.nelements != b.nelements:
        raise ShapeError(f"ggml_cpy: {describe(a)} has {a.nelements} elements but {describe(b)} has {b.nelements}")
    t = ctx.view_tensor(b)
    if b.name:
        t.format_name("%s (copy of %s)", b.name, a.name)
    else:
        t.format_name("%s (copy)", a.name)
    return _set(t, Op.CPY, a, b)


# %% [markdown]
# A worked example: the attention-head reshuffle of a LLaMA block. `q` is `[n_embd, n_tokens]`,
# reshaped to `[head_dim, n_head, n_tokens]`, then permuted so heads come last but one. The
# permute changes no byte: look at its strides.

# %%
ctx = Context("demo")
q = ctx.new_tensor_2d(F32, 64, 16, name="Qcur")
q3 = reshape_3d(ctx, q, 16, 4, 16)
qp = permute(ctx, q3, 0, 2, 1, 3)
qc = cont(ctx, qp)
for t in (q, q3, qp, qc):
    print(f"{t.name:24s} op={t.op.name:9s} ne={t.ne} nb={t.nb} view_src={t.view_src.name if t.view_src else None}")

# %% [markdown]
# `Qcur (reshaped) (permuted)` views **`Qcur`** directly — not the reshape — because ggml resolves
# `view_src` to the root. Offsets accumulate the same way: a row view into a row view.

# %%
h = ctx.new_tensor_2d(F32, 48, 64, name="h")
rows = view_2d(ctx, h, 48, 8, h.nb[1], 4 * h.nb[1])  # rows 4..11
row = view_1d(ctx, rows, 48, 2 * h.nb[1])  # row 2 of that = row 6 of h
print(rows, "\n", row, "op_params", row.op_params[:2])
try:
    view_1d(ctx, h, 48, 64 * h.nb[1])  # one row past the end
except ViewBoundsError as e:
    print("ViewBoundsError:", e)

# %% [markdown]
# ## 5 · Graphs: nodes in execution order, leafs in first-use order
#
# `ggml_build_forward_expand(gf, t)` calls `ggml_visit_parents` (ggml.c), a depth-first walk:
#
# ```c
# if (ggml_hash_insert(&cgraph->visited_hash_set, node) == GGML_HASHSET_ALREADY_EXISTS) return;
# for (int i = 0; i < GGML_MAX_SRC; ++i) {           // sources in slot order
#     if (node->src[k]) ggml_visit_parents(cgraph, node->src[k]);
# }
# if (node->op == GGML_OP_NONE && node->grad == NULL) {   // data: a leaf
#     if (strlen(node->name) == 0) ggml_format_name(node, "leaf_%d", cgraph->n_leafs);
#     cgraph->leafs[cgraph->n_leafs++] = node;
# } else {                                                // an op (or a parameter): a node
#     if (strlen(node->name) == 0) ggml_format_name(node, "node_%d", cgraph->n_nodes);
#     cgraph->nodes[cgraph->n_nodes++] = node;
# }
# ```
#
# Three consequences the planner depends on: a node always comes after all of its sources (the node
# list *is* the execution order); a tensor reached twice is listed once, where it was first
# finished; and the order of `expand` calls matters — llama.cpp expands the KV-cache copies first so
# that they run before attention reads the cache. Only `src` is followed, never `view_src`: every
# view op has its source in `src[0]`, but a bare `ggml_view_tensor` (op NONE) is a leaf.
#
# The C recursion can go as deep as the graph; Python's stack cannot (a 7B LLaMA graph is over a
# thousand nodes deep), so the port walks with an explicit stack in exactly the same order.

# %%
# | export graph
"""`struct ggml_cgraph` and `ggml_build_forward_expand` (ggml.c), forward graphs only."""

from ggml_lite.errors import GraphFullError
from ggml_lite.tensor import Op, Tensor, TensorFlag, describe

GGML_DEFAULT_GRAPH_SIZE = 2048


class Graph:
    """`struct ggml_cgraph` for forward graphs (`ggml_new_graph`, `ggml_new_graph_custom` with
    `grads = false`): `nodes` in execution order, `leafs` in first-visit order, at most `size` of each,
    and the visited set (`visited_hash_set`, here a set keyed by tensor identity)."""

    __slots__ = ("size", "nodes", "leafs", "visited")

    def __init__(self, size: int = GGML_DEFAULT_GRAPH_SIZE):
        self.size = size
        self.nodes = []
        self.leafs = []
        self.visited = set()

    @property
    def n_nodes(self) -> int:
        """`ggml_graph_n_nodes`."""
        return len(self.nodes)

    @property
    def n_leafs(self) -> int:
        """`cgraph->n_leafs`."""
        return len(self.leafs)

    def node(self, i: int) -> Tensor:
        """`ggml_graph_node`: node `i`; a negative `i` counts from the end."""
        return self.nodes[i]

    def get_tensor(self, name: str):
        """`ggml_graph_get_tensor`: the first node, then leaf, called `name`, or None."""
        return next((t for t in (*self.nodes, *self.leafs) if t.name == name), None)

    def clear(self) -> None:
        """`ggml_graph_clear`: no nodes, no leafs, nothing visited."""
        self.nodes.clear()
        self.leafs.clear()
        self.visited.clear()

    def __repr__(self):
        return f"Graph({self.n_nodes} nodes, {self.n_leafs} leafs, size {self.size})"


def _add(graph: Graph, t: Tensor) -> None:
    """The tail of `ggml_visit_parents`: append `t` to the leafs (op NONE, not PARAM) or the nodes,
    naming it `leaf_N` / `node_N` when it has no name."""
    if t.op is Op.NONE and not t.flags & TensorFlag.PARAM:
        lst, kind = graph.leafs, "leaf"
    else:
        lst, kind = graph.nodes, "node"
    if len(lst) >= graph.size:
        raise GraphFullError(f"cannot add {describe(t)}: the graph already holds {graph.size} {kind}s (its size)")
    if not t.name:
        t.format_name("%s_%d", kind, len(lst))
    lst.append(t)


def visit_parents(graph: Graph, root: Tensor) -> None:
    """`ggml_visit_parents`: depth-first over `src` in slot order, each tensor once, appending each
    tensor after its sources. Iterative (an explicit stack) but in exactly the recursive order."""
    visited = graph.visited
    if root in visited:
        return
    visited.add(root)
    stack = [(root, 0)]
    while stack:
        t, i = stack[-1]
        src = t.src
        n = len(src)
        while i < n:
            s = src[i]
            i += 1
            if s is not None and s not in visited:
                visited.add(s)
                stack[-1] = (t, i)
                stack.append((s, 0))
                break
        else:
            stack.pop()
            _add(graph, t)


def build_forward_expand(graph: Graph, tensor: Tensor) -> Graph:
    """`ggml_build_forward_expand` (`ggml_build_forward_impl` with expand): add `tensor` and every
    tensor it depends on that the graph does not hold yet."""
    visit_parents(graph, tensor)
    return graph


def build_forward(tensor: Tensor, size: int = GGML_DEFAULT_GRAPH_SIZE) -> Graph:
    """A new graph (`ggml_new_graph_custom`) expanded from `tensor` (`ggml_build_forward_expand`)."""
    return build_forward_expand(Graph(size), tensor)


def graph_view(graph: Graph, i0: int, i1: int) -> Graph:
    """`ggml_graph_view`: the nodes `i0..i1-1` of `graph` as a graph of their own — no leafs, nothing
    visited, size `i1 - i0`. The scheduler hands such slices (splits) to backends."""
    g = Graph(i1 - i0)
    g.nodes = graph.nodes[i0:i1]
    return g


# %% [markdown]
# A small MLP: `y = softmax(W2 · silu(W1 · x + b1))`. Watch the order. The walk starts at the
# output and always takes `src[0]` first, so the first leaf it *reaches* is `W2` (`src[0]` of the
# last mul_mat) — leafs are listed in first-reached order, not in creation order. Nodes are listed
# when *finished*, so they come out in a valid execution order. The unnamed add becomes `node_1`.

# %%
# NBVAL_CHECK_OUTPUT
ctx = Context("mlp")
x = ctx.new_tensor_2d(F32, 64, 8, name="x")
set_input(x)
W1 = ctx.new_tensor_2d(F16, 64, 128, name="W1")
b1 = ctx.new_tensor_1d(F32, 128, name="b1")
W2 = ctx.new_tensor_2d(F16, 128, 32, name="W2")
h = mul_mat(ctx, W1, x).set_name("h")
hb = add(ctx, h, b1)  # unnamed: the graph will call it node_1
y = soft_max(ctx, mul_mat(ctx, W2, silu(ctx, hb)).set_name("logits")).set_name("probs")
set_output(y)
gf = build_forward(y)
print(gf)
print("nodes:", [t.name for t in gf.nodes])
print("leafs:", [t.name for t in gf.leafs])

# %% [markdown]
# ### A picture of a graph
#
# Columns are execution steps: leafs on the left, then each node in graph order. Edges run from a
# source to its consumer; views are drawn hollow because they own no memory — exactly the
# distinction the allocator will make.

# %%
import plotly.graph_objects as go


def graph_figure(gf: Graph, title: str = "") -> go.Figure:
    """Leafs in column 0, node i in column i+1; an edge per source slot; views hollow."""
    pos = {}
    for j, t in enumerate(gf.leafs):
        pos[t] = (0, -j)
    for i, t in enumerate(gf.nodes):
        pos[t] = (i + 1, -(i % 4) - 0.5 * (i // 4 % 2))
    ex, ey = [], []
    for t in gf.nodes:
        for s in t.src:
            if s is not None and s in pos:
                ex += [pos[s][0], pos[t][0], None]
                ey += [pos[s][1], pos[t][1], None]
    fig = go.Figure(go.Scatter(x=ex, y=ey, mode="lines", line=dict(color="#bbb", width=1), hoverinfo="skip"))
    kinds = {
        "leaf": [t for t in gf.leafs],
        "op": [t for t in gf.nodes if t.view_src is None],
        "view": [t for t in gf.nodes if t.view_src is not None],
    }
    style = {"leaf": ("square", "#636efa"), "op": ("circle", "#ef553b"), "view": ("circle-open", "#00cc96")}
    for kind, ts in kinds.items():
        sym, col = style[kind]
        fig.add_trace(go.Scatter(
            x=[pos[t][0] for t in ts], y=[pos[t][1] for t in ts], mode="markers+text", name=kind,
            marker=dict(symbol=sym, size=14, color=col, line=dict(width=2, color=col)),
            text=[t.name for t in ts], textposition="top center", textfont=dict(size=9),
            hovertext=[f"{t.name}<br>{t.op.name} {t.type.name} ne={t.ne}<br>{t.nbytes} B" for t in ts],
            hoverinfo="text"))
    fig.update_layout(title=title or f"{gf.n_nodes} nodes, {gf.n_leafs} leafs", height=360,
                      xaxis=dict(title="leafs | node index + 1 (execution order)", dtick=1),
                      yaxis=dict(visible=False), margin=dict(l=20, r=20, t=50, b=40))
    return fig


graph_figure(gf, "y = softmax(W2 · silu(W1 · x + b1))")

# %% [markdown]
# ### Expand order matters, and `graph_view` slices
#
# Expanding a second root only adds what the graph does not hold yet. A KV-cache write is its own
# root: expanded first, its copy runs before anything that reads the cache.

# %%
# NBVAL_CHECK_OUTPUT
ctx = Context("kv")
cache = ctx.new_tensor_1d(F16, 4 * 64, name="cache_k")
k = ctx.new_tensor_2d(F32, 64, 2, name="k")
k_view = view_1d(ctx, cache, 128, 2 * 64 * 2).set_name("k_cache_view")
store = cpy(ctx, k, k_view)
keys = view_2d(ctx, cache, 64, 4, 128, 0).set_name("k_all")
qv = ctx.new_tensor_2d(F32, 64, 2, name="q")
kq = mul_mat(ctx, keys, qv).set_name("kq")
gf2 = Graph()
build_forward_expand(gf2, store)
build_forward_expand(gf2, kq)
print([t.name for t in gf2.nodes], [t.name for t in gf2.leafs])
print("a view of nodes 1..3:", [t.name for t in graph_view(gf2, 1, 3).nodes])

# %% [markdown]
# ## 6 · Check
#
# The facts this chapter established, as asserts. The fixture tests in `tests/` replay 14 graphs
# recorded from the real ggml and compare every name, shape, stride, size, view offset and the node
# and leaf order.

# %%
import ggml_lite as gl

c = gl.Context()
t = c.new_tensor_3d(gl.F32, 32, 16, 4)
assert t.nb == [4, 128, 2048, 8192] and t.nbytes == 8192 and t.shape == (4, 16, 32)
assert c.new_tensor_2d(gl.Q8_0, 64, 8).nbytes == 8 * 2 * 34
assert c.new_tensor_2d(gl.Q4_0, 64, 8).nb == [18, 36, 288, 288]
p = gl.permute(c, t, 2, 0, 1, 3)
assert p.ne == [16, 4, 32, 1] and p.nb == [128, 2048, 4, 8192] and p.nbytes == 8192
assert p.view_src is t and p.name == " (permuted)"  # an unnamed source gives " (permuted)"
v = gl.view_1d(c, gl.view_1d(c, t, 64, 256), 16, 64)
assert v.view_src is t and v.view_offs == 320 and v.op_params[:2] == [64, 0]
assert gl.transpose(c, t).nb[:2] == [128, 4]
assert gl.mul_mat(c, c.new_tensor_2d(gl.F16, 32, 10), t).ne == [10, 16, 4, 1]
assert gl.soft_max(c, t).op_params[:2] == [1065353216, 0]
cp = gl.cpy(c, t, c.new_tensor_1d(gl.F16, 2048, name="dst"))
assert cp.name == "dst (copy of )" and cp.view_src.name == "dst" and cp.op is gl.Op.CPY
for bad in (lambda: gl.add(c, t, c.new_tensor_1d(gl.F32, 5)),
            lambda: gl.reshape_2d(c, t, 7, 7),
            lambda: gl.permute(c, t, 0, 0, 1, 2)):
    try:
        bad()
        raise AssertionError("expected an error")
    except gl.errors.TensorError:
        pass
assert [x.name for x in gf.nodes] == ["h", "node_1", "node_2", "logits", "probs"]
assert [x.name for x in gf.leafs] == ["W2", "W1", "x", "b1"]
print("chapter 00: all checks passed")
