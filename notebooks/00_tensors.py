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
# # 00 · Tensors — ggml's data model for numpy users
#
# Everything later in this project — the allocators, the graph allocator, the scheduler — works on
# **tensors**: a type, a shape, strides, the op that produces them, their sources, and perhaps the
# tensor whose memory they share. This chapter ports exactly as much of `ggml.h`/`ggml.c` (llama.cpp
# `daa9623`, September 2024) as the planner needs: no arithmetic, only *types, shapes, strides and
# sizes*, each equal to what ggml computes. Chapter 01 builds ops and graphs on top of it.
#
# **Learning goals**
#
# 1. Read a ggml shape: `ne` lists dimensions *fastest first* — the reverse of numpy's `shape`.
# 2. Read ggml strides: `nb` are byte strides, also fastest first; quantized types pack
#    elements in blocks, so `nb[0]` is the size of a *block*, and `nbytes` is not `nelements·size`.
# 3. Understand views: a view shares memory with a *root* tensor (`view_src`) at a byte offset
#    (`view_offs`), and owns no memory of its own.
# 4. Know the context: the arena that creates tensors, and the flags (`INPUT`, `OUTPUT`) a user sets.
#
# Modules exported here: `ggml_lite.tensor` and `ggml_lite.errors`.

# %%
# | default_exp tensor

# %% [markdown]
# ## 1 · Types: elements, blocks and bytes
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

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ggml_lite.bind import method_of
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


def row_size(type: GGMLType, ne0: int) -> int:
    """`ggml_row_size`: bytes of one row of `ne0` elements (`ne0` must be a whole number of blocks)."""
    if ne0 % type.blck_size:
        raise ShapeError(
            f"a row of {ne0} {type.name} elements is not a whole number of blocks "
            f"({type.blck_size} elements per block)"
        )
    return type.type_size * ne0 // type.blck_size


# %% [markdown]
# Those five are the types this port computes with. A model file uses many more — k-quants in
# 256-element super-blocks, i-quants, bf16 — and sizing its weights needs only each type's block
# and byte counts. The sizes below are written as the block structs of `ggml-common.h` lay them
# out (an f16 scale is 2 bytes), so each can be checked by eye: a `q4_K` block is two f16 scales,
# 12 bytes of packed 6-bit sub-block scales and 128 bytes of nibbles — 144 bytes for 256 weights,
# 4.5 bits a weight. This port computes only with f32, f16, i32, q8_0 and q4_0; the others it sizes.

# %%
# | export
QK_K, HALF, K_SCALE_SIZE = 256, 2, 12  # super-block size, sizeof(ggml_half), packed k-quant scales

_MORE_TYPES = [  # (name, type_size, blck_size, code): `type_traits` of ggml.c, `enum ggml_type` of ggml.h
    ("q4_1", 2 * HALF + 32 // 2, 32, 3), ("q5_0", HALF + 4 + 32 // 2, 32, 6),
    ("q5_1", 2 * HALF + 4 + 32 // 2, 32, 7), ("q8_1", 2 * HALF + 32, 32, 9),
    ("q2_K", 2 * HALF + QK_K // 16 + QK_K // 4, QK_K, 10),
    ("q3_K", HALF + QK_K // 4 + QK_K // 8 + 12, QK_K, 11),
    ("q4_K", 2 * HALF + K_SCALE_SIZE + QK_K // 2, QK_K, 12),
    ("q5_K", 2 * HALF + K_SCALE_SIZE + QK_K // 2 + QK_K // 8, QK_K, 13),
    ("q6_K", HALF + QK_K // 16 + 3 * QK_K // 4, QK_K, 14), ("q8_K", 4 + QK_K + QK_K // 16 * 2, QK_K, 15),
    ("iq2_xxs", HALF + QK_K // 8 * 2, QK_K, 16), ("iq2_xs", HALF + QK_K // 8 * 2 + QK_K // 32, QK_K, 17),
    ("iq3_xxs", HALF + 3 * (QK_K // 8), QK_K, 18), ("iq1_s", HALF + QK_K // 8 + QK_K // 16, QK_K, 19),
    ("iq4_nl", HALF + 32 // 2, 32, 20), ("iq3_s", HALF + 13 * (QK_K // 32) + QK_K // 64, QK_K, 21),
    ("iq2_s", HALF + QK_K // 4 + QK_K // 16, QK_K, 22), ("iq4_xs", HALF + 2 + QK_K // 64 + QK_K // 2, QK_K, 23),
    ("i8", 1, 1, 24), ("i16", 2, 1, 25), ("i64", 8, 1, 27), ("f64", 8, 1, 28),
    ("iq1_m", QK_K // 8 + QK_K // 16 + QK_K // 32, QK_K, 29), ("bf16", 2, 1, 30),
    ("q4_0_4x4", 18, 32, 31), ("q4_0_4x8", 18, 32, 32), ("q4_0_8x8", 18, 32, 33),
    ("tq1_0", HALF + QK_K // 64 + (QK_K - 4 * QK_K // 64) // 5, QK_K, 34), ("tq2_0", HALF + QK_K // 4, QK_K, 35),
]
TYPES = {t.name: t for t in (F32, F16, Q4_0, Q8_0, I32, *(GGMLType(*row) for row in _MORE_TYPES))}
TYPES_BY_CODE = {t.code: t for t in TYPES.values()}
_TYPES_LOWER = {name.lower(): t for name, t in TYPES.items()}


def type_by_name(name) -> GGMLType:
    """The type called `name` (as `ggml_type_name` prints it, e.g. "f16", "q4_K"; any case); a
    GGMLType passes through."""
    if isinstance(name, GGMLType):
        return name
    t = _TYPES_LOWER.get(str(name).lower())
    if t is None:
        raise UnknownTypeError(f"unknown ggml type {name!r}; known types: {', '.join(TYPES)}")
    return t


def type_by_code(code: int) -> GGMLType:
    """The type whose `enum ggml_type` value is `code` (how GGUF files name a tensor's type)."""
    t = TYPES_BY_CODE.get(code)
    if t is None:
        raise UnknownTypeError(f"unknown ggml type code {code!r}; known codes: {sorted(TYPES_BY_CODE)}")
    return t


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
# ### Errors: what a request ggml cannot honour raises
#
# That was the first error of the course. In C, ggml stops the process with `GGML_ASSERT` when it is
# given a row that is not whole blocks, or an op tensors of the wrong shape. A Python user deserves an
# exception that says what was asked, what was there and which tensor. Every failure a user can
# reach raises one of the classes below; each also derives from the closest built-in (`ValueError`,
# `KeyError`, `TypeError`) so generic handlers still work. They are all here, in one module, so that
# `except ggml_lite.errors.GGMLLiteError` catches any of them; later chapters raise the ones named
# after their own subject (the allocators' `OutOfBufferSpaceError`, the scheduler's
# `SchedulerError`, ...).


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


# %% [markdown]
# The errors of allocation and of graph files. Several stand for a C abort: the "not enough space" of
# `ggml_tallocr_alloc`, the asserts of `ggml_gallocr_init_tensor`, `ggml_gallocr_get_buffer_size` and
# `ggml_backend_tensor_alloc`, a buffer used after `ggml_backend_buffer_free`, and the checks of
# `GGML_ALLOCATOR_DEBUG`. Those functions are ported in chapters 03 to 05.

# %%
# | export errors
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
    """A backend cannot do what it was asked (chapters 06–08)."""


# %% [markdown]
# The errors of backends, models, the scheduler and the planners. Some stand for a C abort: an unknown
# name in `ggml_backend_reg_init_backend_from_str` and a copy between different layouts in
# `ggml_backend_tensor_copy` (both ported in chapter 06), and the aborts of the scheduler (chapter 09).

# %%
# | export errors
class UnsupportedOpError(BackendError):
    """A backend was asked to compute an op (or a type combination) it does not support."""


class UnknownBackendError(BackendError, KeyError):
    """A backend name that is not in the registry (`ggml_backend_reg_init_backend_from_str`)."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


class ModelError(GGMLLiteError, ValueError):
    """A model or context that cannot be planned: an unknown preset, inconsistent hyperparameters, a
    bad context size or tensor split (chapter 10)."""


class SchedulerError(BackendError):
    """The backend scheduler cannot place or run a graph (the aborts of `ggml_backend_sched_*`)."""


class PlannerError(GGMLLiteError, ValueError):
    """An offline planner was asked for something it does not have or cannot use: an unknown planner or
    way of computing, a hand-made block that ends before it starts or has a negative size (chapter 11)."""


class ExerciseError(GGMLLiteError, ValueError):
    """An exercise that does not exist or was asked the wrong way (an answer to an implement-exercise, a
    grader handed something that is not a function), or a progress record that cannot be read (A8)."""


class LayoutMismatchError(BackendError, ValueError):
    """A tensor copy between tensors of different type, shape or strides (`ggml_backend_tensor_copy`)."""



# %% [markdown]

# ## 2 · The tensor: `ne`, `nb`, op, sources, views
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
# | `buffer`, `data` | where the tensor lives once allocated (chapter 03 on) |
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
    MUL_MAT_ID = "MUL_MAT_ID"
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
    ARGSORT = "ARGSORT"
    LEAKY_RELU = "LEAKY_RELU"
    FLASH_ATTN_EXT = "FLASH_ATTN_EXT"
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


# %% [markdown]
# Ops are looked up by the name `ggml_op_name` prints (`"MUL_MAT"`), which is how graph files and
# error messages name them; an unknown name raises `UnknownOpError` listing the known ones. Float op
# parameters (a scale, an epsilon) travel as the int32 words that hold their f32 bits, so two
# helpers convert between the two views of one word. Notice that `VIEW_OPS` is the whole of
# `ggml_is_view_op`: those four ops make no data, only a new way to read existing bytes.

# %%
# | export
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
        self.src: list[Tensor | None] = []  # slots 0..k; an empty slot is None; trailing empty slots are dropped
        self.view_src = view_src
        self.view_offs = view_offs
        self.name = ""
        self.buffer: Any = None  # a ggml_lite.buffer.Buffer (chapter 03) once placed
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

    @property
    def unary_op(self):
        """`ggml_get_unary_op`: the UnaryOp of a UNARY tensor, else None."""
        return UnaryOp(self.op_params[0]) if self.op is Op.UNARY else None

    def __repr__(self):
        op = self.op.name if self.op is not Op.UNARY else f"UNARY:{self.unary_op.name}"
        view = f", view of {self.view_src.name!r}+{self.view_offs}" if self.view_src is not None else ""
        return f"Tensor({self.name!r}, {self.type.name}, ne={list(self.ne)}, op={op}{view})"


# %% [markdown]
# ### How a C function becomes a method
#
# C has structs and functions named `ggml_<object>_<verb>(obj, ...)`; Python has classes and
# methods. This course keeps the C shape: a struct is a small class holding its fields, and each C
# function is a plain function in a cell of its own, right after the C it ports, then attached to
# its class by one decorator, `@method_of(Cls)`. The function is named after the C function minus
# its object prefix (`ggml_get_name` → `get_name`, `ggml_gallocr_reserve_n` → `reserve_n`), so
# `t.get_name()` and `get_name(t)` are the same call, and a search for the C name finds the cell.
# When one module holds two structs whose functions would share a name, the function keeps its
# object word and the decorator is given the method name: `@method_of(Buffer, "get_size")` on
# `def buffer_get_size`.
#
# A type checker cannot see methods attached at run time, so the exporter (`tools/nbexport.py`)
# writes, inside the class of the generated module, an `if TYPE_CHECKING:` block with the signature
# of every method attached to it below; at run time that block does nothing.

# %%
# | export bind
"""`method_of`: the one way this package attaches a ported C function to the class of its struct."""

import abc
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def method_of(cls: type, name: str | None = None) -> Callable[[F], F]:
    """Attach the decorated function to `cls` as the method `name` (default: the function's own
    name) and return the function unchanged, so it stays callable as a plain function too.
    `tools/nbexport.py` writes the method's signature into `cls` for type checkers. An abstract
    class (a backend's interface) learns that the method is no longer abstract."""
    if not isinstance(cls, type):
        raise TypeError(f"method_of: {cls!r} is not a class")

    def attach(fn: F) -> F:
        setattr(cls, name or fn.__name__, fn)
        if getattr(cls, "__abstractmethods__", None):
            abc.update_abstractmethods(cls)  # Python fixes the set when the class is made; attached later
        return fn

    return attach


# %% [markdown]
# Sources, names and op parameters: the small accessors of `ggml.c` that read or write one
# field of a tensor, each a function of the tensor attached as a method, so `set_name(t, "x")`
# and `t.set_name("x")` are the same call.

# %%
# | export
@method_of(Tensor)
def set_src(tensor, i: int, t) -> None:
    """Set source slot `i` (`tensor->src[i] = t`)."""
    if not 0 <= i < GGML_MAX_SRC:
        raise IndexError(f"source slot {i} of {describe(tensor)} is out of range 0..{GGML_MAX_SRC - 1}")
    src = tensor.src
    while len(src) <= i:
        src.append(None)
    src[i] = t
    while src and src[-1] is None:
        src.pop()


@method_of(Tensor)
def get_src(tensor, i: int):
    """Source slot `i`, or None (`tensor->src[i]`)."""
    return tensor.src[i] if i < len(tensor.src) else None


@method_of(Tensor)
def set_name(tensor, name: str) -> Tensor:
    """`ggml_set_name`: at most 63 bytes are kept, as in C."""
    tensor.name = _truncate_name(name)
    return tensor


@method_of(Tensor)
def format_name(tensor, fmt: str, *args) -> Tensor:
    """`ggml_format_name` (printf-style `%s`/`%d` formatting, truncated to 63 bytes)."""
    tensor.name = _truncate_name(fmt % args)
    return tensor


@method_of(Tensor)
def get_name(tensor) -> str:
    """`ggml_get_name`."""
    return tensor.name


@method_of(Tensor)
def set_op_params(tensor, *words: int) -> None:
    """`ggml_set_op_params`: store int32 words from slot 0 on."""
    tensor.op_params[: len(words)] = words


@method_of(Tensor)
def op_params_i32(tensor, i: int) -> int:
    """`ggml_get_op_params_i32`."""
    return tensor.op_params[i]


@method_of(Tensor)
def op_params_f32(tensor, i: int) -> float:
    """`ggml_get_op_params_f32`."""
    return word_to_float(tensor.op_params[i])




# %%
# | export
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


# %% [markdown]
# The shape predicates every op checks its operands with. They read `ne` only, except
# `ggml_are_same_layout`, which also compares type and strides (the allocator's test for "these two
# tensors can share bytes"). What to notice: `ggml_can_repeat(t0, t1)` is ggml's whole broadcasting
# rule: every dimension of `t1` must be a multiple of `t0`'s, not just 1 or equal as in numpy.

# %%
# | export
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


def are_same_layout(a: Tensor, b: Tensor) -> bool:
    """`ggml_are_same_layout` (a static helper in both ggml-alloc.c and ggml-backend.c): same type,
    same `ne`, same `nb`."""
    return a.type is b.type and a.ne == b.ne and a.nb == b.nb


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
# — it holds no data: memory comes later from a buffer (chapter 03) or the graph allocator
# (chapter 05). The context keeps its tensors in creation order, which `ggml_backend_alloc_ctx_tensors`
# and the fixtures (tensor ids) rely on.

# %%
# | export
class Context:
    """A `no_alloc` `ggml_context` (`ggml_init` with `no_alloc = true`): tensor headers in creation
    order (`ggml_get_first_tensor` / `ggml_get_next_tensor`), no data."""

    def __init__(self, name: str = ""):
        self.name = name
        self.tensors: list[Tensor] = []

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self):
        return len(self.tensors)

    def __repr__(self):
        return f"Context({self.name!r}, {len(self.tensors)} tensors)"


# %% [markdown]
# Every tensor is born in `ggml_new_tensor_impl`. What to notice: a view of a view is re-rooted at
# the tensor that owns the memory (the offsets added up), so `view_src` is never itself a view; and
# the bounds check sizes a view as if it were contiguous (`row_size(ne0)·ne1·ne2·ne3` bytes from
# `view_offs`) against the root's `ggml_nbytes`. The strides a view op sets afterwards are not
# checked here; each op checks its own.

# %%
# | export
@method_of(Context)
def _new_tensor_impl(ctx, type, ne, view_src=None, view_offs=0) -> Tensor:
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
    t = Tensor(type, ne, contiguous_strides(type, ne), view_src, view_offs, ctx)
    ctx.tensors.append(t)
    return t


# %% [markdown]
# The public constructors all go through it: `ggml_new_tensor_Nd` only pads the shape with ones,
# `ggml_dup_tensor` copies type and shape (not the name, not the strides: the copy is contiguous), and
# `ggml_view_tensor` shares the whole of its source, strides included, under the name "<src> (view)".
# In C the context is the first argument of each (`ggml_new_tensor_2d(ctx, ...)`); here it is too,
# so `new_tensor_2d(ctx, F32, 4, 3)` and `ctx.new_tensor_2d(F32, 4, 3)` are the same call.

# %%
# | export
@method_of(Context)
def new_tensor(ctx, type, ne, name: str = "") -> Tensor:
    """`ggml_new_tensor`: a fresh contiguous tensor of shape `ne` (fastest dimension first)."""
    t = ctx._new_tensor_impl(type, ne)
    if name:
        t.set_name(name)
    return t


@method_of(Context)
def new_tensor_1d(ctx, type, ne0, name: str = "") -> Tensor:
    """`ggml_new_tensor_1d`."""
    return new_tensor(ctx, type, [ne0], name)


@method_of(Context)
def new_tensor_2d(ctx, type, ne0, ne1, name: str = "") -> Tensor:
    """`ggml_new_tensor_2d`."""
    return new_tensor(ctx, type, [ne0, ne1], name)


@method_of(Context)
def new_tensor_3d(ctx, type, ne0, ne1, ne2, name: str = "") -> Tensor:
    """`ggml_new_tensor_3d`."""
    return new_tensor(ctx, type, [ne0, ne1, ne2], name)


@method_of(Context)
def new_tensor_4d(ctx, type, ne0, ne1, ne2, ne3, name: str = "") -> Tensor:
    """`ggml_new_tensor_4d`."""
    return new_tensor(ctx, type, [ne0, ne1, ne2, ne3], name)


@method_of(Context)
def dup_tensor(ctx, src: Tensor) -> Tensor:
    """`ggml_dup_tensor`: a new tensor with the type and shape of `src` (contiguous, unnamed)."""
    return _new_tensor_impl(ctx, src.type, src.ne)


@method_of(Context)
def view_tensor(ctx, src: Tensor) -> Tensor:
    """`ggml_view_tensor`: a tensor sharing all of `src`'s memory and strides, named
    "<src> (view)"; its op stays NONE (callers such as `cpy` and the in-place ops set it)."""
    t = _new_tensor_impl(ctx, src.type, src.ne, src, 0)
    t.format_name("%s (view)", src.name)
    t.nb = list(src.nb)
    return t


@method_of(Context)
def get_tensor(ctx, name: str) -> Tensor | None:
    """`ggml_get_tensor`: the first tensor called `name`, or None."""
    return next((t for t in ctx.tensors if t.name == name), None)


# %% [markdown]
# Three flags the user sets on a tensor and the allocators read. `ggml_set_input` marks a tensor
# the user fills before compute, `ggml_set_output` one the user reads after it, and `ggml_set_param`
# a trainable weight. Notice that the flags only change *when* memory is handed out and given back.
# An input is placed before any node runs. An output is never freed, so no later node may reuse its
# bytes. Chapter 05 shows both.

# %%
# | export
def set_input(t: Tensor) -> None:
    """`ggml_set_input`: the user fills the tensor before compute. The graph allocator places it before
    any node is computed (chapter 05); that is all the flag does -- it does not keep its memory."""
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
# ## 3 · Check
#
# The facts this chapter established, as asserts. The fixture tests in `tests/` replay 14 graphs
# recorded from the real ggml and compare every name, shape, stride, size and view offset.

# %%
import ggml_lite as gl

c = gl.Context()
t = c.new_tensor_3d(gl.F32, 32, 16, 4)
assert t.nb == [4, 128, 2048, 8192] and t.nbytes == 8192 and t.shape == (4, 16, 32)
assert c.new_tensor_2d(gl.Q8_0, 64, 8).nbytes == 8 * 2 * 34
assert c.new_tensor_2d(gl.Q4_0, 64, 8).nb == [18, 36, 288, 288]
assert gl.row_size(gl.Q8_0, 64) == 68
try:
    gl.row_size(gl.Q4_0, 33)
except gl.errors.ShapeError as e:
    assert "not a whole number of blocks" in str(e)
else:
    raise AssertionError("expected a ShapeError")
print("chapter 00: all checks passed")
