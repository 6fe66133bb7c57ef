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
# # 10 · A LLaMA, end to end — how much memory, and why
#
# Every chapter so far taught one mechanism. The question people bring to this subject is their
# sum: *how much memory does this model need?* llama.cpp answers it only by running: it builds the
# worst-case graph of one micro-batch, lets the scheduler and the graph allocator of chapters 05 and
# 09 plan it, and prints `CPU compute buffer size = … MiB`. This chapter builds that very graph — the
# LLaMA of `llm_build_context::build_llama` at llama.cpp daa9623 — for any size of model, and plans
# it with the machinery of the course, so the numbers are llama.cpp's to the byte.
#
# **Learning goals**
#
# 1. A model's hyperparameters, and what each one sizes: the weights, the KV cache, the graph.
# 2. llama.cpp's LLaMA graph: 32 nodes per layer and 6 around them, built by a handful of
#    `llm_build_*` helpers; the KV cache written through views and read through views.
# 3. The worst case llama.cpp reserves: `n_ubatch` tokens, every one an output, the whole cache.
# 4. Predicting a compute buffer: which tensors are alive at the peak, and why.
#
# Exported: `ggml_lite.models.llama` (appendix A3 replays the recorded scheduler runs with it).

# %%
# | default_exp models.llama

# %% [markdown]
# ## 1 · A model's hyperparameters
#
# A LLaMA is described by nine numbers: the vocabulary, the embedding width `n_embd`, the number of
# layers, the attention heads and the key/value heads (fewer than the heads with grouped-query
# attention: each K/V head serves `n_head / n_head_kv` query heads), the feed-forward width `n_ff`,
# the rotary dimensions `n_rot` (the head size), the RMS-norm epsilon and the RoPE base. Weights
# have a type (f16, or a quantized type); the KV cache has its own (f16 by default).
#
# The builder works on a plain dictionary — the form the recorded fixtures use — so `LlamaParams`
# turns hyperparameters and a context size into it.

# %%
# | export
"""llama.cpp's LLaMA (`llm_build_context::build_llama` at llama.cpp daa9623, September 2024): the
model's hyperparameters, its weights and KV cache as llama.cpp names and creates them, and its
compute graph, exact to llama.cpp's; with `recorded=True`, the variant the ggml_lite fixtures were
recorded with (an extra RESHAPE of Vcur per layer and other names)."""

import math
from dataclasses import dataclass

import numpy as np

from ggml_lite.align import GGML_PAD
from ggml_lite.buffer import BufferUsage, cpu_buffer_type
from ggml_lite.cpu import cpu_init
from ggml_lite.errors import ModelError, UnknownTypeError
from ggml_lite.graph import GGML_DEFAULT_GRAPH_SIZE, Graph, build_forward_expand
from ggml_lite.ops import (
    add, cont_2d, cpy, get_rows, mul, mul_mat, permute, reshape_2d, reshape_3d, rms_norm, rope_ext, silu,
    soft_max_ext, transpose, view_1d, view_2d, view_3d,
)
from ggml_lite.sched import GGML_SCHED_MAX_BACKENDS, BackendSched
from ggml_lite.sim import sim_host_buffer_type, sim_init
from ggml_lite.tallocr import alloc_ctx_tensors_from_buft
from ggml_lite.tensor import Context, F32, I32, row_size, set_input, set_output, type_by_name

GGML_KQ_MASK_PAD = 32  # the mask's rows are padded to this many (llama.cpp's GGML_KQ_MASK_PAD)
LLAMA_MAX_LAYERS = 512  # llama.cpp's per-layer hyperparameter arrays hold this many layers
UINT32_MAX = 2**32 - 1  # llama_hparams' counts are uint32_t
INT32_MAX = 2**31 - 1  # n_gpu_layers, n_batch, n_ubatch and the graph's n_kv / n_tokens are int32_t
INT64_MAX = 2**63 - 1  # ggml's ne and nb are int64_t / size_t: no tensor may hold more elements or bytes
MAX_N_CTX = INT32_MAX // 32 * 32  # n_ctx, padded to 32, stays an int32 (n_kv in llm_build_context)
MAX_DEVICES = GGML_SCHED_MAX_BACKENDS - 1  # the scheduler takes 16 backends, the CPU being one of them
INT_TYPES = ("i8", "i16", "i32", "i64", "f64")  # no matrix product in ggml takes weights of these types


def check_int(name: str, value, least: int, most: int, flag: str = None, why: str = "") -> int:
    """`value` if it is an integer in [least, most], else a `ModelError` naming the parameter (and the
    command line's flag), what was expected and what was found."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not least <= value <= most:
        where = f"{name} ({flag})" if flag else name
        raise ModelError(f"{where}: expected an integer from {least} to {most}{why}, found {value!r}")
    return int(value)


def check_float(name: str, value, least: float, flag: str = None, most: float = math.inf, strict: bool = True):
    """`value` if it is a finite number above `least` (at least `least` when not `strict`), at most `most`."""
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value > least if strict else value >= least) and value <= most
    if not ok:
        where = f"{name} ({flag})" if flag else name
        raise ModelError(f"{where}: expected a finite number {'above' if strict else 'at least'} {least:g}"
                         f"{f' and at most {most:g}' if most != math.inf else ''}, found {value!r}")
    return float(value)


# %% [markdown]
# Every field is checked when a `LlamaParams` is made — from a preset, the command line's flags or a
# GGUF header alike — against the limits llama.cpp and ggml have: at most 512 layers
# (`LLAMA_MAX_LAYERS`, the size of llama.cpp's per-layer arrays), counts that fit the `uint32_t` of
# `llama_hparams`, no weight of more than 2^63 − 1 elements (ggml's `int64_t` sizes), heads that divide
# the embedding and K/V heads that divide the heads, RoPE dimensions even and at most the head size.

# %%
# | export
@dataclass(frozen=True)
class LlamaParams:
    """A LLaMA's hyperparameters (`llama_hparams`, the LLaMA subset) and the types of its weights. A
    value no llama.cpp model can have is a `ModelError` naming the field."""

    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_rot: int = None  # default: the head size, n_embd / n_head
    rms_norm_eps: float = 1e-5
    rope_freq_base: float = 10000.0
    n_ctx_train: int = 4096
    wtype: str = "f16"

    def __post_init__(self):
        for field in ("n_vocab", "n_embd", "n_head", "n_head_kv", "n_ff", "n_ctx_train"):
            flag = "--" + field.replace("_", "-") if field != "n_ctx_train" else None
            check_int(f"LlamaParams: {field}", getattr(self, field), 1, UINT32_MAX, flag, " (a uint32_t)")
        check_int("LlamaParams: n_layer", self.n_layer, 1, LLAMA_MAX_LAYERS, "--n-layer", " (LLAMA_MAX_LAYERS)")
        if self.n_embd % self.n_head:
            raise ModelError(f"LlamaParams: n_head (--n-head): expected a divisor of n_embd {self.n_embd}, "
                             f"found {self.n_head}")
        if self.n_head % self.n_head_kv:
            raise ModelError(f"LlamaParams: n_head_kv (--n-head-kv): expected a divisor of n_head {self.n_head}, "
                             f"found {self.n_head_kv}")
        for name, n in (("n_embd * n_vocab (token_embd)", self.n_embd * self.n_vocab),
                        ("n_embd * n_ff (ffn_up)", self.n_embd * self.n_ff), ("n_embd^2 (attn_q)", self.n_embd ** 2)):
            if n > INT64_MAX:
                raise ModelError(f"LlamaParams: {name} = {n} elements, more than a ggml tensor holds (2^63 - 1)")
        head = self.n_embd // self.n_head
        if self.n_rot is None:
            object.__setattr__(self, "n_rot", head)
        check_int("LlamaParams: n_rot", self.n_rot, 1, head, None, f" (the head size n_embd / n_head = {head})")
        if self.n_rot % 2:
            raise ModelError(f"LlamaParams: n_rot {self.n_rot} must be even (RoPE rotates pairs of dimensions; the "
                             f"head size is n_embd / n_head, --n-embd {self.n_embd} / --n-head {self.n_head} = {head})")
        object.__setattr__(self, "rms_norm_eps", check_float("LlamaParams: rms_norm_eps", self.rms_norm_eps, 0, strict=False))
        object.__setattr__(self, "rope_freq_base", check_float("LlamaParams: rope_freq_base", self.rope_freq_base, 0))
        try:
            wt = type_by_name(self.wtype) if isinstance(self.wtype, str) else None
        except UnknownTypeError:
            wt = None
        if wt is None:
            raise ModelError(f"LlamaParams: wtype (--wtype): expected a ggml type (f16, q8_0, q4_K, ...), found {self.wtype!r}")
        if wt.name in INT_TYPES:
            raise ModelError(f"LlamaParams: wtype (--wtype): weights cannot be of type {wt.name} (a float or a quantized type)")
        for field in ("n_embd", "n_ff"):  # the rows of the matrices: ne[0] of every weight, ffn_down's too
            if getattr(self, field) % wt.blck_size:
                raise ModelError(f"LlamaParams: {field} (--{field.replace('_', '-')}) {getattr(self, field)}: the rows of "
                                 f"{wt.name} weights must be a whole number of its blocks ({wt.blck_size} elements each)")
        object.__setattr__(self, "wtype", wt.name)

    def model(self, n_ctx: int, type_k: str = "f16", type_v: str = None) -> dict:
        """The builder's model dictionary for a context of `n_ctx` cells (the KV cache's size) and the
        cache's K and V types (`type_v` defaults to `type_k`)."""
        return dict(n_vocab=self.n_vocab, n_embd=self.n_embd, n_layer=self.n_layer, n_head=self.n_head,
                    n_head_kv=self.n_head_kv, n_ff=self.n_ff, n_ctx=n_ctx, wtype=self.wtype, kvtype=type_k,
                    type_v=type_v or type_k,
                    rms_norm_eps=self.rms_norm_eps,
                    rope=dict(mode=0, n_dims=self.n_rot, n_ctx_orig=self.n_ctx_train, freq_base=self.rope_freq_base,
                              freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0))


# %% [markdown]
# The models people ask about, as their GGUF headers give them (n_ctx_train is the context they
# were trained for; RoPE bases of 500,000 and 1,000,000 belong to Llama 3 and Mistral's later models).

# %%
# | export
PRESETS = {
    "llama-2-7b": LlamaParams(32000, 4096, 32, 32, 32, 11008, n_ctx_train=4096),
    "llama-2-13b": LlamaParams(32000, 5120, 40, 40, 40, 13824, n_ctx_train=4096),
    "llama-2-70b": LlamaParams(32000, 8192, 80, 64, 8, 28672, n_ctx_train=4096),
    "llama-3-8b": LlamaParams(128256, 4096, 32, 32, 8, 14336, rope_freq_base=500000.0, n_ctx_train=8192),
    "llama-3-70b": LlamaParams(128256, 8192, 80, 64, 8, 28672, rope_freq_base=500000.0, n_ctx_train=8192),
    "llama-3.1-8b": LlamaParams(128256, 4096, 32, 32, 8, 14336, rope_freq_base=500000.0, n_ctx_train=131072),
    "llama-3.1-70b": LlamaParams(128256, 8192, 80, 64, 8, 28672, rope_freq_base=500000.0, n_ctx_train=131072),
    "mistral-7b": LlamaParams(32000, 4096, 32, 32, 8, 14336, n_ctx_train=32768),
    "tinyllama-1.1b": LlamaParams(32000, 2048, 22, 32, 4, 5632, n_ctx_train=2048),
}


def preset(name: str) -> LlamaParams:
    """The preset called `name`, in any case; a `ModelError` listing the presets otherwise."""
    if not isinstance(name, str) or name.lower() not in PRESETS:
        raise ModelError(f"preset (--preset): expected one of {', '.join(PRESETS)} (any case), found {name!r}")
    return PRESETS[name.lower()]


# %% [markdown]
# ### Models from GGUF files
#
# A real model comes as a GGUF file: a header of key/value metadata (`llama.embedding_length`,
# `llama.block_count`, …) and one record per tensor (its name, ggml type code and shape), then the
# data. Planning needs only the header, so a file whose data is missing (header only) or sparse plans
# as well as the real one. Each weight keeps its own type — a "Q4_K_M" file mixes q4_K and q6_K.
#
# The header is untrusted input: a 1.7 KB file can claim 2^40 array items. So the course reads it
# with a reader of its own, after ggml's `gguf_init_from_file`, that checks every count and length
# against the bytes left in the file *before* reading or allocating anything (N items of at least k
# bytes each need N·k bytes), and against a few caps far above any real file. All numbers are
# little-endian; a string is a `uint64` length and that many UTF-8 bytes.
#
# | part | layout | checked |
# |---|---|---|
# | magic, version | `"GGUF"`, `uint32` | version 2 or 3 (1 is refused, as llama.cpp does) |
# | counts | `uint64` tensor count, `uint64` key/value count | at most 65,536 each; room for them in the file |
# | key/value pairs | key (string), `uint32` value type, value | 13 value types: 10 integer and float types, bool, string, array (`uint32` item type, `uint64` length, items; no arrays of arrays, as in ggml) |
# | tensor infos | name (string), `uint32` n_dims, n_dims × `int64` ne, `uint32` ggml type, `uint64` offset | n_dims ≤ 4 (`GGML_MAX_DIMS`), ne ≥ 1, a known type whose block divides ne[0], offset aligned |
# | padding, data | to `general.alignment` (a `uint32` power of two, default 32), then each tensor's bytes at its offset | not read; each tensor's bytes lie within the file (header-only files: within 2^63 − 1) |

# %%
# | export models.gguf
"""Models from GGUF files (chapter 10): a bounded reader of a GGUF header (after ggml's `gguf_init_from_file`:
every count and length checked against the bytes left in the file before anything is read or allocated),
then llama.cpp's checks of a LLaMA's metadata (`llm_load_hparams`) and tensors (`llm_load_tensors`)."""

import json
import math
import mmap
import os
import stat
import struct
from dataclasses import dataclass

import numpy as np

from ggml_lite.align import GGML_PAD
from ggml_lite.errors import ModelError
from ggml_lite.models.llama import INT64_MAX, INT_TYPES, LLAMA_MAX_LAYERS, LlamaParams
from ggml_lite.tensor import TYPES_BY_CODE

GGUF_MAGIC = b"GGUF"
GGML_MAX_DIMS = 4  # ggml.h: a tensor has at most 4 dimensions
GGML_MAX_NAME = 64  # ggml.h: a tensor's name and its terminating NUL
GGUF_DEFAULT_ALIGNMENT = 32  # the data's alignment when the file does not set general.alignment
MAX_KEY_BYTES = 2**16 - 1  # the GGUF specification: a key is at most 65,535 bytes
# This reader's own caps (ggml has none): far above any real file, low enough to bound time and memory.
MAX_COUNT = 2**16  # key/value pairs, and tensors (a 512-layer LLaMA has 4,611 tensors)
MAX_ITEMS = 2**23  # array items in the whole header: about 1 s to walk (a tokenizer has ~10^5 per array)
MAX_KEPT = 2**24  # bytes of strings and numeric arrays kept in memory (16 MiB; a tokenizer's scores take 1 MiB)
# `enum gguf_type`: code -> (name, struct format of one item); STRING and ARRAY start with a uint64 length
GGUF_TYPES = {0: ("uint8", "B"), 1: ("int8", "b"), 2: ("uint16", "H"), 3: ("int16", "h"), 4: ("uint32", "I"),
              5: ("int32", "i"), 6: ("float32", "f"), 7: ("bool", "B"), 8: ("string", "Q"), 9: ("array", None),
              10: ("uint64", "Q"), 11: ("int64", "q"), 12: ("float64", "d")}


@dataclass
class GGUFValue:
    """A metadata value: its GGUF type name, and the value (int, float, bool or str; for an array, the item
    type, the length and the items as a numpy array -- None for strings, which are checked and skipped)."""

    type: str
    value: object
    item_type: str = None
    count: int = None

    def describe(self) -> str:
        if self.type == "array":
            return f"an array of {self.count} {self.item_type}"
        text = repr(self.value)
        return f"a {self.type} ({text if len(text) <= 80 else text[:77] + '...'})"


@dataclass
class GGUFTensorInfo:
    """`gguf_tensor_info`: a tensor's name, ggml type code, ne (n_dims of them) and data offset."""

    name: str
    type_code: int
    ne: list
    offset: int


@dataclass
class GGUFHeader:
    """What `gguf_init_from_file` reads with `no_alloc`: the version, the key/value pairs in file order,
    the tensor infos, the alignment, where the data starts (it is never read) and the file's size."""

    path: str
    version: int
    kv: dict
    tensors: list
    alignment: int
    data_offset: int
    file_size: int

    @property
    def header_only(self) -> bool:
        """The file ends at or before the data section's start: only its header was copied."""
        return self.file_size <= self.data_offset


# %% [markdown]
# The reader walks the file's bytes through a cursor whose every read first checks that the bytes are
# there, and names the field it was reading — as a path (`kv["llama.block_count"].value`,
# `tensors[7].ne[1]`) — when they are not.

# %%
# | export models.gguf
class _Cursor:
    """The file's bytes and a position; reads little-endian fields, each checked against the bytes left."""

    def __init__(self, data, path: str):
        self.data, self.pos, self.path, self.items, self.kept = data, 0, path, 0, 0

    def fail(self, field: str, message: str):
        raise ModelError(f"{self.path}: {field}: {message}")

    def need(self, n: int, field: str, what: str) -> None:
        left = len(self.data) - self.pos
        if n > left:
            self.fail(field, f"{what} needs {n} bytes at offset {self.pos}, the file has {left} left")

    def scalar(self, fmt: str, field: str, what: str):
        size = struct.calcsize("<" + fmt)
        self.need(size, field, what)
        value = struct.unpack_from("<" + fmt, self.data, self.pos)[0]
        self.pos += size
        return value

    def keep(self, n: int, field: str) -> None:
        """Count `n` more bytes kept in memory against `MAX_KEPT`."""
        self.kept += n
        if self.kept > MAX_KEPT:
            self.fail(field, f"the header's values would take more than {MAX_KEPT} bytes of memory (this reader's cap)")

    def text(self, field: str, most: int, strict: bool = True) -> str:
        """A GGUF string of at most `most` bytes, decoded as UTF-8 (`strict`: a name or a key)."""
        n = self.scalar("Q", field, "a string's length")
        if n > most:
            self.fail(field, f"a string of {n} bytes, expected at most {most}")
        self.need(n, field, f"a string of {n} bytes")
        self.keep(n, field)
        raw, self.pos = bytes(self.data[self.pos:self.pos + n]), self.pos + n
        try:
            return raw.decode("utf-8", "strict" if strict else "replace")
        except UnicodeDecodeError:
            self.fail(field, f"expected UTF-8 text, found {raw[:40]!r}")


# %% [markdown]
# A value is read by its type. An array's length is checked against the bytes left before any item is
# read — `n` items of `size` bytes need `n · size` bytes (a string item at least its 8-byte length) — and
# against the header's budget of items; numeric items are kept as one numpy array, strings (a
# tokenizer's vocabulary) are walked, every length checked, and skipped: planning never reads them.

# %%
# | export models.gguf
def _read_value(cur: _Cursor, vtype: int, field: str) -> GGUFValue:
    """One value of GGUF type `vtype` (the switch over `enum gguf_type` in `gguf_init_from_file`)."""
    name, fmt = GGUF_TYPES[vtype]
    if name == "string":
        return GGUFValue("string", cur.text(field, MAX_KEPT, strict=False))
    if name == "array":
        return _read_array(cur, field)
    value = cur.scalar(fmt, field, f"a {name}")
    if name == "bool" and value > 1:
        cur.fail(field, f"expected a bool (0 or 1), found {value}")
    return GGUFValue(name, bool(value) if name == "bool" else value)


def _read_array(cur: _Cursor, field: str) -> GGUFValue:
    """An array: its item type (ggml reads no arrays of arrays), its length, checked before its items."""
    itype = cur.scalar("I", f"{field}.item_type", "an array's item type")
    if itype not in GGUF_TYPES or GGUF_TYPES[itype][0] == "array":
        cur.fail(f"{field}.item_type", f"expected an item type from 0 to 12 other than 9 (ggml reads no arrays of "
                                       f"arrays), found {itype}")
    name, fmt = GGUF_TYPES[itype]
    n = cur.scalar("Q", f"{field}.count", "an array's length")
    size = struct.calcsize("<" + fmt)
    cur.need(n * size, field, f"an array of {n} {name} items ({size} bytes each at least)")
    cur.items += n
    if cur.items > MAX_ITEMS:
        cur.fail(field, f"the header's arrays hold more than {MAX_ITEMS} items (this reader's cap)")
    if name == "string":
        _skip_strings(cur, n, field)
        return GGUFValue("array", None, "string", n)
    cur.keep(n * size, field)
    items = np.frombuffer(cur.data, dtype="<" + fmt, count=n, offset=cur.pos).copy()
    cur.pos += n * size
    if name == "bool" and (items > 1).any():
        cur.fail(field, f"expected bools (0 or 1), found {int(items.max())}")
    return GGUFValue("array", items.astype(bool) if name == "bool" else items, name, n)


def _skip_strings(cur: _Cursor, n: int, field: str) -> None:
    """Walk `n` strings: each length checked against the bytes left, the texts skipped."""
    data, pos, end, length = cur.data, cur.pos, len(cur.data), struct.Struct("<Q").unpack_from
    for i in range(n):
        if end - pos < 8:
            cur.pos = pos
            cur.need(8, f"{field}[{i}]", "a string's length")
        (k,) = length(data, pos)
        pos += 8
        if k > end - pos:
            cur.pos = pos
            cur.need(k, f"{field}[{i}]", f"a string of {k} bytes")
        pos += k
    cur.pos = pos


# %% [markdown]
# A tensor info is checked as `gguf_init_from_file` and `gguf_tensor_info_sanitize` check it: a name of
# at most 63 bytes (`GGML_MAX_NAME`) that no other tensor has, at most four dimensions, each at least 1
# and all together fewer than 2^63 elements, a type ggml knows whose block divides a row, and a data
# offset on the alignment.

# %%
# | export models.gguf
def _read_tensor_info(cur: _Cursor, i: int, alignment: int, seen: dict) -> GGUFTensorInfo:
    """One `gguf_tensor_info`, checked (`gguf_tensor_info_sanitize`); `seen` maps names read to their index."""
    field = f"tensors[{i}]"
    text = cur.text(f"{field}.name", GGML_MAX_NAME - 1)
    name = text or "(empty name)"
    if text in seen:
        cur.fail(f"{field}.name", f"duplicated tensor name {text!r} (also tensors[{seen[text]}])")
    seen[text] = i
    n_dims = cur.scalar("I", f"{field}.n_dims", "a dimension count")
    if n_dims > GGML_MAX_DIMS:
        cur.fail(f"{field}.n_dims", f"{name}: expected at most {GGML_MAX_DIMS} dimensions (GGML_MAX_DIMS), found {n_dims}")
    ne = [cur.scalar("q", f"{field}.ne[{j}]", "a dimension") for j in range(n_dims)]
    for j, d in enumerate(ne):
        if d < 1:
            cur.fail(f"{field}.ne[{j}]", f"{name}: expected a dimension of at least 1, found {d}")
    if math.prod(ne) > INT64_MAX:
        cur.fail(f"{field}.ne", f"{name}: {ne} holds {math.prod(ne)} elements, more than ggml's int64 (2^63 - 1)")
    code = cur.scalar("I", f"{field}.type", "a ggml type")
    t = TYPES_BY_CODE.get(code)
    if t is None:
        cur.fail(f"{field}.type", f"{name}: expected a ggml type code (one of {sorted(TYPES_BY_CODE)}), found {code}")
    if (ne[0] if ne else 1) % t.blck_size:
        cur.fail(f"{field}.ne[0]", f"{name}: a row of {ne[0] if ne else 1} elements is not a whole number of {t.name} "
                                   f"blocks ({t.blck_size} elements each)")
    offset = cur.scalar("Q", f"{field}.offset", "a data offset")
    if offset % alignment:
        cur.fail(f"{field}.offset", f"{name}: expected a multiple of the alignment {alignment}, found {offset}")
    return GGUFTensorInfo(text, code, ne, offset)


# %% [markdown]
# The header: the magic and the version, the two counts — checked against the bytes left at once (a
# pair takes 13 bytes at least, a tensor info 24) — the pairs, the alignment, the tensor infos. The
# file is memory-mapped and only the header's pages are touched, so a sparse 13 GB file costs nothing.

# %%
# | export models.gguf
def read_gguf_header(path) -> GGUFHeader:
    """`gguf_init_from_file` (ggml.c) with `no_alloc`: the header of the GGUF file at `path`, every field
    checked before it is used; a `ModelError` naming the file, the field, what was expected and found."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ModelError(f"{path}: not a regular file (a GGUF model file expected)")
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
            try:
                return _read_header(_Cursor(data, str(path)))
            finally:
                if size:
                    data.close()
    except OSError as e:
        raise ModelError(f"{path}: cannot read the file ({e.strerror or e})") from None


def _read_header(cur: _Cursor) -> GGUFHeader:
    cur.need(4, "header.magic", "the magic 'GGUF'")
    magic = bytes(cur.data[:4])
    if magic != GGUF_MAGIC:
        cur.fail("header.magic", f"expected b'GGUF' (a GGUF file), found {magic!r}: not a GGUF file")
    cur.pos = 4
    version = cur.scalar("I", "header.version", "the version")
    if version not in (2, 3):
        swapped = " (a big-endian file, which ggml does not read)" if version in (2 << 24, 3 << 24) else \
            " (version 1 is no longer supported, as in llama.cpp)" if version == 1 else ""
        cur.fail("header.version", f"expected 2 or 3, found {version}{swapped}")
    n_tensors = cur.scalar("Q", "header.tensor_count", "the tensor count")
    n_kv = cur.scalar("Q", "header.kv_count", "the key/value count")
    for n, field in ((n_tensors, "header.tensor_count"), (n_kv, "header.kv_count")):
        if n > MAX_COUNT:
            cur.fail(field, f"expected at most {MAX_COUNT} (this reader's cap), found {n}")
    cur.need(13 * n_kv + 24 * n_tensors, "header", f"{n_kv} key/value pairs (13 bytes each at least) and "
                                                   f"{n_tensors} tensor infos (24 bytes each at least)")
    kv = {}
    for i in range(n_kv):
        key = cur.text(f"kv[{i}].key", MAX_KEY_BYTES)
        field = f"kv[{json.dumps(key if len(key) <= 80 else key[:77] + '...')}]"
        if key in kv:
            cur.fail(field, "the key appears twice")
        vtype = cur.scalar("I", f"{field}.type", "a value type")
        if vtype not in GGUF_TYPES:
            cur.fail(f"{field}.type", f"expected a value type from 0 to 12 (enum gguf_type), found {vtype}")
        kv[key] = _read_value(cur, vtype, f"{field}.value")
    align = kv.get("general.alignment", GGUFValue("uint32", GGUF_DEFAULT_ALIGNMENT))
    if align.type != "uint32" or not align.value or align.value & (align.value - 1):
        cur.fail('kv["general.alignment"]', f"expected a uint32 power of two, found {align.describe()}")
    seen = {}
    tensors = [_read_tensor_info(cur, i, align.value, seen) for i in range(n_tensors)]
    return GGUFHeader(cur.path, version, kv, tensors, align.value, GGML_PAD(cur.pos, align.value), len(cur.data))


# %% [markdown]
# ### Where each tensor's bytes lie
#
# The data section starts where the header ends, rounded up to `general.alignment` (`data_offset`
# above), and a tensor's bytes are `ggml_nbytes` of its shape and type (`ne[0]` / the block size ×
# the type size × the other dimensions) from `data_offset + offset`. The reader above checks only that
# each offset is on the alignment, as ggml's later `gguf.cpp` does (mid-2024's `gguf_init_from_file`
# reads the offsets unchecked). llama.cpp's loader checks where the bytes lie as soon as the header is read, before any
# hyperparameter: the `llama_model_loader` constructor makes one `llama_tensor_weight` per tensor, in
# the file's order, and each refuses a tensor whose end, `offs + nbytes` in a `size_t`, wraps around or
# passes the file's size ("tensor '…' data is not within the file bounds, model is corrupted or
# incomplete"). `from_gguf` checks in the same place and the same order, with two differences:
#
# - Python's integers do not wrap, so the sums here are exact. llama.cpp does not check its first sum,
#   `data_offset + offset`, for wrapping: an offset of 2^64 − 32 lands 32 bytes before the data section,
#   and llama.cpp at daa9623 loads the tensor from there, the wrong bytes. Here no tensor may end past
#   2^63 − 1, the largest size a file can have (llama.cpp's `llama_file` measures it with `ftell`, a
#   `long`), whatever the file: an offset of 2^63 or 2^64 − 32 is refused by the tensor's name.
# - A *header-only* file — one that ends at or before the data section's start: only its header was
#   copied, to plan with, as the tiny file below is — is planned without the end-of-file check, since
#   every tensor lies past its end by construction. llama.cpp would refuse it (it loads the weights;
#   a plan needs only the header), so the model says so (`GGUFModel.header_only`) and `llama --gguf`
#   prints a note on stderr. A full-length file with holes (*sparse*: a 13 GB model in a few kB of
#   disk) is checked like a real one: one byte short is refused, naming the first tensor, in the
#   file's order, that would end past it.
#
# Tensors whose bytes overlap are accepted, as llama.cpp at daa9623 accepts them: nothing there
# compares two tensors' ranges (ggml's later `gguf.cpp` requires each offset to be the end of the
# tensor before it, padded). A plan reads shapes and types, never the bytes.

# %%
# | export models.gguf
def check_tensor_data(h: GGUFHeader) -> None:
    """`llama_model_loader::llama_tensor_weight`'s bounds check, tensor by tensor in the file's order: the
    `ggml_nbytes` bytes from `data_offset + offset` end by 2^63 - 1 (`INT64_MAX`, the largest file) and,
    unless the file is header only, by the file's end; a `ModelError` naming the tensor otherwise."""
    for i, t in enumerate(h.tensors):
        ty = TYPES_BY_CODE[t.type_code]
        nbytes = math.prod(t.ne) // ty.blck_size * ty.type_size  # ggml_nbytes (ne[0] is whole blocks)
        start = h.data_offset + t.offset
        end = start + nbytes
        where = f"{h.path}: tensors[{i}].offset: {t.name or '(empty name)'}: {nbytes} bytes at offset {t.offset} of the data"
        llama = f"(llama.cpp: tensor '{t.name[:63]}' data is not within the file bounds, model is corrupted or incomplete)"
        if end > INT64_MAX:
            offs = start % 2**64  # llama.cpp's size_t sum, unchecked: it wraps around
            if offs + nbytes < 2**64 and offs + nbytes <= h.file_size:
                llama = f"(llama.cpp at daa9623 wraps the sum around to byte {offs} and loads the wrong bytes)"
            raise ModelError(f"{where} section (byte {h.data_offset}) would end at byte {end}, past 2^63 - 1, the "
                             f"largest size a file can have {llama}")
        if not h.header_only and end > h.file_size:
            raise ModelError(f"{where} section would lie at bytes {start} to {end}, past the file's end "
                             f"({h.file_size} bytes) {llama}")


# %% [markdown]
# ### llama.cpp's checks of a LLaMA
#
# `llm_load_hparams` reads each hyperparameter with `get_key`, which refuses a value whose GGUF type is
# not exactly the field's (`key … has wrong type … but expected type …`): `llama.block_count` is a
# `uint32` — not a string, a float or an `int32`. The head counts and the feed-forward width go through
# `get_key_or_arr`: one `uint32`, or an `int32` array of one value per layer, after checking that there
# are at most `LLAMA_MAX_LAYERS` layers. This port's LLaMA has alike layers, so per-layer values must be
# equal. llama.cpp requires `n_rot` to be the head size for a LLaMA; the RMS epsilon and the training
# context are required; the vocabulary is `llama.vocab_size` or the length of the tokenizer's list.

# %%
# | export models.gguf
def _key(h: GGUFHeader, key: str, want: str, required: bool = True, default=None):
    """`llama_model_loader::get_key` (`GGUFMeta::GKV::get_kv`): the value of `key`, of GGUF type `want` exactly."""
    v = h.kv.get(key)
    if v is None:
        if required:
            raise ModelError(f"{h.path}: kv[{json.dumps(key)}]: missing (llama.cpp requires it: key not found in model)")
        return default
    if v.type != want:
        raise ModelError(f"{h.path}: kv[{json.dumps(key)}]: expected a {want}, found {v.describe()}")
    return v if want == "array" else v.value


def _key_or_arr(h: GGUFHeader, key: str, n_layer: int, required: bool = True, default=None):
    """`llama_model_loader::get_key_or_arr`: a uint32, or an int32 array of one value per layer (equal here)."""
    v = h.kv.get(key)
    if v is None or v.type != "array":
        return _key(h, key, "uint32", required, default)
    field = f"{h.path}: kv[{json.dumps(key)}]"
    if v.item_type != "int32":
        raise ModelError(f"{field}: expected a uint32 or an int32 array, found {v.describe()}")
    if v.count != n_layer:
        raise ModelError(f"{field}: expected {n_layer} values (one per layer), found {v.count}")
    values = sorted(set(v.value.tolist()))
    if len(values) != 1:
        raise ModelError(f"{field}: the layers' values differ ({values[:6]}); this port plans LLaMAs whose layers are alike")
    return values[0]


HPARAM_KEYS = {"n_vocab": "llama.vocab_size", "n_embd": "llama.embedding_length", "n_layer": "llama.block_count",
               "n_head": "llama.attention.head_count", "n_head_kv": "llama.attention.head_count_kv",
               "n_ff": "llama.feed_forward_length", "rms_norm_eps": "llama.attention.layer_norm_rms_epsilon",
               "rope_freq_base": "llama.rope.freq_base", "n_ctx_train": "llama.context_length",
               "n_rot": "llama.rope.dimension_count"}  # LlamaParams' fields and the GGUF keys they come from


def llama_hparams(h: GGUFHeader, wtype: str = "f16") -> LlamaParams:
    """`llm_load_hparams` for `LLM_ARCH_LLAMA`: the hyperparameters, each of its exact GGUF type; a
    mixture of experts, or a head size or `n_rot` this port's LLaMA does not have, is refused."""
    arch = _key(h, "general.architecture", "string")
    if arch != "llama":
        raise ModelError(f"{h.path}: a {arch[:80]!r} model; this report plans llama models only")
    n_layer = _key(h, "llama.block_count", "uint32")
    if not 1 <= n_layer <= LLAMA_MAX_LAYERS:
        raise ModelError(f'{h.path}: kv["llama.block_count"]: expected 1 to {LLAMA_MAX_LAYERS} layers '
                         f"(LLAMA_MAX_LAYERS), found {n_layer}")
    for key in ("llama.expert_count", "llama.expert_used_count"):
        if _key(h, key, "uint32", False, 0):
            raise ModelError(f"{h.path}: kv[{json.dumps(key)}]: {h.kv[key].value}, a mixture-of-experts llama; this "
                             f"report plans dense llama models only")
    n_head = _key_or_arr(h, "llama.attention.head_count", n_layer)
    n_vocab = _key(h, "llama.vocab_size", "uint32", False)
    if n_vocab is None and "tokenizer.ggml.tokens" not in h.kv:
        raise ModelError(f'{h.path}: kv["llama.vocab_size"]: missing, and no tokenizer.ggml.tokens to count')
    try:
        p = LlamaParams(
            n_vocab=n_vocab if n_vocab is not None else _key(h, "tokenizer.ggml.tokens", "array").count,
            n_embd=_key(h, "llama.embedding_length", "uint32"), n_layer=n_layer, n_head=n_head,
            n_head_kv=_key_or_arr(h, "llama.attention.head_count_kv", n_layer, False, n_head),
            n_ff=_key_or_arr(h, "llama.feed_forward_length", n_layer),
            rms_norm_eps=_key(h, "llama.attention.layer_norm_rms_epsilon", "float32"),
            rope_freq_base=_key(h, "llama.rope.freq_base", "float32", False, 10000.0),
            n_ctx_train=_key(h, "llama.context_length", "uint32"), wtype=wtype)
    except ModelError as e:
        if str(e).startswith(h.path):
            raise
        field = str(e).removeprefix("LlamaParams: ").split(" ")[0].rstrip(":")
        key = f"kv[{json.dumps(HPARAM_KEYS[field])}]: " if field in HPARAM_KEYS else ""
        raise ModelError(f"{h.path}: {key}the header's hyperparameters make no model: {e}") from None
    for key in ("llama.attention.key_length", "llama.attention.value_length", "llama.rope.dimension_count"):
        got = _key(h, key, "uint32", False, p.n_rot)
        if got != p.n_rot:  # llama.cpp: "invalid n_rot: %u, expected %u"
            raise ModelError(f"{h.path}: kv[{json.dumps(key)}]: expected the head size n_embd / n_head = {p.n_rot}, found {got}")
    return p


# %% [markdown]
# `llm_load_tensors` then creates every tensor a LLaMA has and checks each against the file: present
# (`tensor '…' not found`), of the shape the hyperparameters give (`check_tensor_dims`: trailing
# dimensions of 1 allowed), and no tensor left over (`done_getting_tensors`: `wrong number of
# tensors`). `output.weight` may be absent: the output then reuses `token_embd` (tied embeddings).
# `rope_freqs.weight` may be present (Llama 3.1): `n_rot / 2` f32 frequency factors for RoPE.
# Weights of an integer type are refused: no ggml matrix product takes them.

# %%
# | export models.gguf
def llama_tensor_shapes(p: LlamaParams) -> dict:
    """{name: ne} of the tensors `llm_load_tensors` creates for a dense `LLM_ARCH_LLAMA` without biases."""
    gqa = p.n_embd // p.n_head * p.n_head_kv
    layer = {"attn_norm": [p.n_embd], "attn_q": [p.n_embd, p.n_embd], "attn_k": [p.n_embd, gqa],
             "attn_v": [p.n_embd, gqa], "attn_output": [p.n_embd, p.n_embd], "ffn_norm": [p.n_embd],
             "ffn_gate": [p.n_embd, p.n_ff], "ffn_down": [p.n_ff, p.n_embd], "ffn_up": [p.n_embd, p.n_ff]}
    shapes = {"token_embd.weight": [p.n_embd, p.n_vocab], "output_norm.weight": [p.n_embd],
              "output.weight": [p.n_embd, p.n_vocab]}
    shapes.update({f"blk.{il}.{name}.weight": ne for il in range(p.n_layer) for name, ne in layer.items()})
    return shapes


def check_llama_tensors(h: GGUFHeader, p: LlamaParams) -> dict:
    """`llm_load_tensors`' checks for `LLM_ARCH_LLAMA` (`create_tensor`, `check_tensor_dims`,
    `done_getting_tensors`): {name: GGMLType} of every weight in the file (no output.weight: tied), or a
    `ModelError` naming the tensor."""
    index = {t.name: i for i, t in enumerate(h.tensors)}
    want = llama_tensor_shapes(p)
    if "output.weight" not in index:  # TENSOR_NOT_REQUIRED, then token_embd again (TENSOR_DUPLICATED)
        del want["output.weight"]
    if "rope_freqs.weight" in index:  # TENSOR_NOT_REQUIRED: RoPE's frequency factors (Llama 3.1), f32 for ggml_rope
        want["rope_freqs.weight"] = [p.n_rot // 2]
        if h.tensors[index["rope_freqs.weight"]].type_code != 0:
            raise ModelError(f"{h.path}: tensors[{index['rope_freqs.weight']}] rope_freqs.weight: expected f32 (ggml_rope's "
                             f"frequency factors), found {TYPES_BY_CODE[h.tensors[index['rope_freqs.weight']].type_code].name}")
    types = {}
    for name, ne in want.items():
        if name not in index:
            raise ModelError(f"{h.path}: missing {name} (llama.cpp: tensor '{name}' not found; the header's "
                             f"{p.n_layer} layers need {len(want)} tensors)")
        info = h.tensors[index[name]]
        pad = [1] * GGML_MAX_DIMS
        if (info.ne + pad)[:GGML_MAX_DIMS] != (ne + pad)[:GGML_MAX_DIMS]:
            raise ModelError(f"{h.path}: tensors[{index[name]}] {name}: expected ne {ne}, found {info.ne}")
        types[name] = TYPES_BY_CODE[info.type_code]
        if types[name].name in INT_TYPES:
            raise ModelError(f"{h.path}: tensors[{index[name]}] {name}: expected a float or quantized type, "
                             f"found {types[name].name}")
    extra = [t.name for t in h.tensors if t.name not in want]
    if extra:
        raise ModelError(f"{h.path}: tensors[{index[extra[0]]}] {extra[0]}: a tensor a dense LLaMA of {p.n_layer} layers "
                         f"does not have (llama.cpp: wrong number of tensors; expected {len(want)}, got "
                         f"{len(h.tensors)}; {len(extra)} unexpected)")
    return types  # (no output.weight: tied, see build_llama)


@dataclass
class GGUFModel:
    """A model file's `params` and `tensor_types` ({name: GGMLType}); `shapes` ({name: ne}); `header_only`: the
    file ends at `file_size`, at or before its data section's start `data_offset` (planned, not loadable)."""

    path: str
    params: LlamaParams
    tensor_types: dict
    shapes: dict
    header_only: bool = False
    data_offset: int = None
    file_size: int = None


def from_gguf(path) -> GGUFModel:
    """The LLaMA in the GGUF file at `path`, from its header alone (`read_gguf_header`, `check_tensor_data`,
    `llama_hparams`, `check_llama_tensors`, in llama.cpp's order). Anything llama.cpp would refuse, and
    anything this port cannot plan, is a `ModelError` naming the file and the key or tensor -- except the
    missing data of a header-only file, which the model's `header_only` records."""
    h = read_gguf_header(path)
    check_tensor_data(h)
    params = llama_hparams(h)
    types = check_llama_tensors(h, params)
    params = LlamaParams(**{**params.__dict__, "wtype": types["blk.0.attn_q.weight"].name})
    return GGUFModel(str(path), params, types, {t.name: t.ne for t in h.tensors}, h.header_only, h.data_offset,
                     h.file_size)


# %% [markdown]
# A tiny LLaMA's header, written with the `gguf` package's writer: one layer, 12 tensors, a few keys and a
# tokenizer list of 64 strings, and no data at all. Then the same bytes with the list's length
# overwritten by 2^40: refused at once, by the field and the sizes.

# %%
# NBVAL_CHECK_OUTPUT
import struct  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import gguf  # noqa: E402

from ggml_lite.errors import ModelError  # noqa: E402
from ggml_lite.models.gguf import from_gguf, llama_tensor_shapes  # noqa: E402

tiny = LlamaParams(n_vocab=64, n_embd=64, n_layer=1, n_head=4, n_head_kv=2, n_ff=96, n_ctx_train=256, wtype="f32")
path = Path(tempfile.mkdtemp()) / "tiny.gguf"
w = gguf.GGUFWriter(str(path), "llama")
for key, value in (("block_count", 1), ("embedding_length", 64), ("feed_forward_length", 96), ("context_length", 256),
                   ("attention.head_count", 4), ("attention.head_count_kv", 2)):
    w.add_uint32(f"llama.{key}", value)
w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
w.add_token_list([f"t{i}" for i in range(64)])
for name, ne in llama_tensor_shapes(tiny).items():
    w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), 4 * int(np.prod(ne)))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_ti_data_to_file()
w.close()
print(f"{path.stat().st_size} bytes:", from_gguf(path).params == LlamaParams(**{**tiny.__dict__, "rms_norm_eps": float(np.float32(1e-5))}))
header = path.read_bytes()
data = bytearray(header)
at = data.index(b"tokenizer.ggml.tokens") + len("tokenizer.ggml.tokens") + 8  # past the value type and item type
data[at:at + 8] = struct.pack("<Q", 2**40)
path.write_bytes(data)
try:
    from_gguf(path)
except ModelError as e:
    refusal = str(e).replace(str(path), "tiny.gguf")
print(refusal)


# %% [markdown]
# The tiny header is a header-only file: 1,786 bytes, where the data would start at byte 1,792. It
# plans, and says so. Extended with a hole to the end of its last tensor's bytes, it is a sparse file of
# 158,208 bytes that llama.cpp would load; one byte shorter, the last tensor (`blk.0.ffn_up.weight`,
# 24,576 bytes from byte 133,632) ends past the file and is refused by its name, as llama.cpp refuses it.

# %%
# NBVAL_CHECK_OUTPUT
import os  # noqa: E402

from ggml_lite.models.gguf import read_gguf_header  # noqa: E402

path.write_bytes(header)
h = read_gguf_header(path)
print(f"{h.file_size} bytes, the data from byte {h.data_offset}: header only", from_gguf(path).header_only)
end = max(h.data_offset + t.offset + 4 * math.prod(t.ne) for t in h.tensors)  # (all f32)
for size in (end, end - 1):
    os.truncate(path, size)  # a hole: nothing is written
    try:
        print(f"{size} bytes: header only", from_gguf(path).header_only)
    except ModelError as e:
        print(str(e).replace(str(path), "tiny.gguf"))


# %% [markdown]
# ## 2 · Weights and the KV cache, as llama.cpp creates them
#
# `llm_load_tensors` creates the weights in a fixed order — the embeddings, the output head, then
# layer by layer — in one context per buffer type, and `llama_kv_cache_init` makes two 1-d tensors
# per layer, `cache_k_l<i>` and `cache_v_l<i>`, of `n_embd_k_gqa · n_ctx` elements each (the cache
# for all heads of a layer in one row per cell). `build_llama` below does both, by a placement that
# says which backend holds each part, then builds the graph.
#
# A Llama 3.1 file has one more tensor, `rope_freqs.weight`: RoPE's frequency factors, `n_rot / 2` floats
# that both RoPEs of every layer read. `llm_load_tensors` creates it in each layer's context
# (`TENSOR_DUPLICATED` after the first), so a GPU holding layers holds a copy of its own, while the
# host's layers read the one copy in the file, which llama.cpp maps by default. A file without
# `output.weight` ties the output to `token_embd` the same way (`TENSOR_DUPLICATED`): a copy on a GPU,
# the embeddings' own mapped bytes on the host.

# %%
# | export
# the per-layer weights: their role in `build_graph` -> their name `blk.<il>.<name>.weight`, in the recorder's
# creation order (llama.cpp creates ffn_down before ffn_up: offsets differ, buffer sizes do not)
LAYER_WEIGHTS = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
                 "ffn_norm": "ffn_norm", "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}
CONTEXT_ORDER = ("CPU", "FAKE", "FAKE1")  # weight contexts first, then cache contexts, each in this order


def build_llama(model: dict, placement: dict, batch: dict, recorded: bool = False):
    """`llm_load_tensors` (the LLaMA tensors), `llama_kv_cache_init` and `build_llama`: the weights
    in `weights:<backend>` contexts and the KV cache in `kv_cache:<backend>` contexts by `placement`
    (`token_embd`, `output`, `layers` and `kv_cache` name a backend each), then the compute graph of
    `batch`. Returns `(contexts in id order, graph, expand roots)`."""
    n_embd, n_head, n_head_kv = model["n_embd"], model["n_head"], model["n_head_kv"]
    n_ff, n_vocab, n_ctx = model["n_ff"], model["n_vocab"], model["n_ctx"]
    n_gqa = n_embd // n_head * n_head_kv
    wtype, type_k = type_by_name(model["wtype"]), type_by_name(model["kvtype"])
    type_v = type_by_name(model.get("type_v", model["kvtype"]))
    ctxs = {}

    def ctx_of(kind, backend):
        label = f"{kind}:{backend}"
        if label not in ctxs:
            ctxs[label] = Context(label)
        return ctxs[label]

    types = model.get("tensor_types") or {}  # a real file's own type per tensor (models.gguf)

    def weight(backend, name, type, *ne):
        return ctx_of("weights", backend).new_tensor(types.get(name, type), list(ne), name=name)

    out_be = placement["output"]  # created in llama.cpp's order: embeddings, head, then layer by layer
    weight(placement["token_embd"], "token_embd.weight", wtype, n_embd, n_vocab)
    weight(out_be, "output_norm.weight", F32, n_embd)
    tied = bool(types) and "output.weight" not in types  # a file without output.weight: token_embd's matrix
    if not (tied and out_be == "CPU"):  # (tied on the host: the mapped token_embd itself, no copy)
        weight(out_be, "output.weight", types.get("token_embd.weight", wtype) if tied else wtype, n_embd, n_vocab)
    shapes = {"attn_norm": (F32, n_embd), "attn_q": (wtype, n_embd, n_embd), "attn_k": (wtype, n_embd, n_gqa),
              "attn_v": (wtype, n_embd, n_gqa), "attn_output": (wtype, n_embd, n_embd), "ffn_norm": (F32, n_embd),
              "ffn_gate": (wtype, n_embd, n_ff), "ffn_up": (wtype, n_embd, n_ff), "ffn_down": (wtype, n_ff, n_embd)}
    rope, mapped = {}, []  # a Llama 3.1 file's RoPE frequency factors, per layer; the host's one copy
    for il, be in enumerate(placement["layers"]):
        for name in LAYER_WEIGHTS.values():
            weight(be, f"blk.{il}.{name}.weight", *shapes[name])
            if name == "ffn_norm" and "rope_freqs.weight" in types:  # (created after ffn_norm, as llama.cpp does)
                if be != "CPU" or not mapped:
                    t = weight(be, "rope_freqs.weight", F32, model["rope"]["n_dims"] // 2)
                    mapped += [t] if be == "CPU" else []
                rope[il] = mapped[0] if be == "CPU" else t
    for il, be in enumerate(placement["kv_cache"]):
        c = ctx_of("kv_cache", be)
        c.new_tensor_1d(type_k, n_gqa * n_ctx, name=f"cache_k_l{il}")
        c.new_tensor_1d(type_v, n_gqa * n_ctx, name=f"cache_v_l{il}")
    w, layers = model_tensors({t.name: t for c in ctxs.values() for t in c.tensors}, len(placement["layers"]))
    for il, t in rope.items():
        layers[il]["rope_freqs"] = t
    ctx, graph, roots = build_graph(model, w, layers, batch, recorded)

    def rank(label):  # CPU, FAKE, FAKE1 as the recorder ordered them; other backends after, as created
        be = label.split(":")[1]
        return CONTEXT_ORDER.index(be) if be in CONTEXT_ORDER else len(CONTEXT_ORDER)
    ordered = [ctxs[label] for kind in ("weights", "kv_cache")
               for label in sorted((x for x in ctxs if x.startswith(kind + ":")), key=rank)] + [ctx]
    return ordered, graph, roots


# %%
# | export
def model_tensors(tensors_by_name: dict, n_layer: int) -> tuple:
    """`(w, layers)` of `build_graph` from existing tensors (a loaded model's weights and cache); without
    `output.weight`, the output is `token_embd.weight` (tied embeddings)."""
    t = tensors_by_name
    w = {"token_embd": t["token_embd.weight"], "output_norm": t["output_norm.weight"],
         "output": t.get("output.weight", t["token_embd.weight"])}
    layers = [{**{r: t[f"blk.{il}.{n}.weight"] for r, n in LAYER_WEIGHTS.items()},
               "k_l": t[f"cache_k_l{il}"], "v_l": t[f"cache_v_l{il}"]} for il in range(n_layer)]
    return w, layers


# %% [markdown]
# ## 3 · The graph
#
# `build_llama` is a loop over layers of five helpers, each a few ggml calls. The builder state —
# the compute context, the model, the batch and the list of `ggml_build_forward_expand` roots in
# the order llama.cpp expands them — travels in a small record. Names follow llama.cpp's callback:
# `cb(t, "Qcur", il)` names a tensor `Qcur-<il>`.
#
# The recorded variant (`recorded=True`) is how the project's LLaMA fixtures were built before this
# chapter existed: it reshapes Vcur once more before transposing it (one more node per layer), names
# the roped Q and K `Qcur_rope`/`Kcur_rope`, the second norm `norm_ffn`, the last `norm_out`, the
# down projection `ffn_down`, computes the attention scale in double, and flags the logits OUTPUT.
# None of it changes a buffer size; all of it changes node counts and names.

# %%
# | export
@dataclass
class _Build:
    """What the `llm_build_*` helpers share while building one graph (`llm_build_context`)."""

    ctx: Context
    model: dict
    batch: dict
    recorded: bool
    roots: list

    def name(self, t, name: str, il: int = -1):
        """llama.cpp's `cb(t, name, il)`: `name-il`, or `name` outside the layers."""
        return t.set_name(f"{name}-{il}" if il >= 0 else name)


def llm_build_norm(b: _Build, x, weight, il: int, name: str = "norm"):
    """`llm_build_norm` (LLM_NORM_RMS, a weight, no bias): rms_norm, then times the weight."""
    cur = b.name(rms_norm(b.ctx, x, b.model["rms_norm_eps"]), name, il)
    return mul(b.ctx, cur, weight)


def llm_build_kv_store(b: _Build, k_cur, v_cur, L: dict, il: int) -> None:
    """`llm_build_kv_store`: copy this batch's K rows into the cache at cell `kv_head` (a 1-d view), and
    V transposed (a 2-d view whose rows are the cache's columns: V is stored one row per dimension)."""
    n_tokens, kv_head = b.batch["n_tokens"], b.batch["kv_head"]
    n_gqa, kvtype = L["k_l"].ne[0] // b.model["n_ctx"], L["k_l"].type
    k_view = b.name(view_1d(b.ctx, L["k_l"], n_tokens * n_gqa, row_size(kvtype, n_gqa) * kv_head), "k_cache_view", il)
    b.roots.append(cpy(b.ctx, k_cur, k_view))
    elt = L["v_l"].type.type_size

    def v_cache_view():
        return view_2d(b.ctx, L["v_l"], n_tokens, n_gqa, b.model["n_ctx"] * elt, kv_head * elt)
    if b.recorded:  # the recorder reshaped Vcur, transposed it, then made the view
        v_t = transpose(b.ctx, reshape_2d(b.ctx, v_cur, n_gqa, n_tokens))
        v_view = v_cache_view()
    else:  # llama.cpp makes the view first
        v_view = v_cache_view()
        v_t = transpose(b.ctx, v_cur)
    b.name(v_view, "v_cache_view", il)
    b.roots.append(cpy(b.ctx, v_t, v_view))


# %% [markdown]
# Attention reads the whole cache, `n_kv` cells, through two 3-d views — K as `[head, n_kv, n_head_kv]`,
# V as `[n_kv, head, n_head_kv]` — so that `kq = K·Q` has one `n_kv × n_tokens` matrix per head, and
# `kqv = V·softmax(kq)` the heads' outputs, merged back into `n_embd` rows.

# %%
# | export
def llm_build_kqv(b: _Build, wo, q, kq_mask, L: dict, il: int):
    """`llm_build_kqv` (no flash attention): scores, masked soft_max, weighted values, heads merged,
    output projection. `q` is Q permuted to heads-major (`q-<il>`)."""
    m, n_tokens, n_kv = b.model, b.batch["n_tokens"], b.batch["n_kv"]
    head = m["n_embd"] // m["n_head"]
    n_gqa, kvtype, elt = head * m["n_head_kv"], L["k_l"].type, L["v_l"].type.type_size
    k = b.name(view_3d(b.ctx, L["k_l"], head, n_kv, m["n_head_kv"], row_size(kvtype, n_gqa), row_size(kvtype, head), 0),
               "k", il)

    def v_view():
        return b.name(view_3d(b.ctx, L["v_l"], n_kv, head, m["n_head_kv"], elt * m["n_ctx"], elt * m["n_ctx"] * head, 0),
                      "v", il)
    v = v_view() if b.recorded else None  # (the recorder made both views before the scores)
    kq = b.name(mul_mat(b.ctx, k, q), "kq", il)
    scale = 1.0 / head ** 0.5 if b.recorded else float(np.float32(1) / np.sqrt(np.float32(head)))  # 1.0f/sqrtf(head)
    kq = b.name(soft_max_ext(b.ctx, kq, kq_mask, scale, 0.0), "kq_soft_max_ext", il)
    v = v if v is not None else v_view()
    kqv = b.name(mul_mat(b.ctx, v, kq), "kqv", il)
    merged = b.name(permute(b.ctx, kqv, 0, 2, 1, 3), "kqv_merged", il)
    cur = b.name(cont_2d(b.ctx, merged, m["n_embd"], n_tokens), "kqv_merged_cont", il)
    b.roots.append(cur)
    return b.name(mul_mat(b.ctx, wo, cur), "kqv_out", il)


def llm_build_ffn(b: _Build, x, L: dict, il: int):
    """`llm_build_ffn` (LLM_FFN_SILU, LLM_FFN_PAR, no biases): down(silu(gate·x) ⊙ up·x)."""
    up = b.name(mul_mat(b.ctx, L["up"], x), "ffn_up", il)
    gate = b.name(silu(b.ctx, b.name(mul_mat(b.ctx, L["gate"], x), "ffn_gate", il)), "ffn_silu", il)
    par = b.name(mul(b.ctx, gate, up), "ffn_gate_par", il)
    return b.name(mul_mat(b.ctx, L["down"], par), "ffn_down" if b.recorded else "ffn_out", il)


# %% [markdown]
# One layer: norm, Q/K/V, RoPE on Q and K, the cache written (its two copies expanded right after
# Q, K and V, so they run before attention reads the cache), attention, the residual; in the last
# layer only the output rows go on (`inp_out_ids`); then the feed-forward and its residual.

# %%
# | export
def llm_build_layer(b: _Build, inp_l, inp_pos, kq_mask, L: dict, il: int):
    """One iteration of `build_llama`'s layer loop; returns the layer's output `l_out-<il>`."""
    m, n_tokens, ctx = b.model, b.batch["n_tokens"], b.ctx
    head, r = m["n_embd"] // m["n_head"], m["rope"]
    rope_args = (r["n_dims"], r["mode"], r["n_ctx_orig"], r["freq_base"], r["freq_scale"], r["ext_factor"],
                 r["attn_factor"], r["beta_fast"], r["beta_slow"])
    inp_sa = inp_l
    cur = b.name(llm_build_norm(b, inp_l, L["attn_norm"], il), "attn_norm", il)
    q = b.name(mul_mat(ctx, L["wq"], cur), "Qcur", il)
    k = b.name(mul_mat(ctx, L["wk"], cur), "Kcur", il)
    v = b.name(mul_mat(ctx, L["wv"], cur), "Vcur", il)
    factors = L.get("rope_freqs")  # (build_rope_factors: a Llama 3.1 file's, else none)
    q = b.name(rope_ext(ctx, reshape_3d(ctx, q, head, m["n_head"], n_tokens), inp_pos, factors, *rope_args),
               "Qcur_rope" if b.recorded else "Qcur", il)
    k = b.name(rope_ext(ctx, reshape_3d(ctx, k, head, m["n_head_kv"], n_tokens), inp_pos, factors, *rope_args),
               "Kcur_rope" if b.recorded else "Kcur", il)
    b.roots += [q, k, v]  # llm_build_kv expands Q, K and V first
    qp = b.name(permute(ctx, q, 0, 2, 1, 3), "q", il) if b.recorded else None  # (the recorder's order)
    llm_build_kv_store(b, k, v, L, il)
    qp = qp if qp is not None else b.name(permute(ctx, q, 0, 2, 1, 3), "q", il)  # in llm_build_kqv
    cur = llm_build_kqv(b, L["wo"], qp, kq_mask, L, il)
    if il == m["n_layer"] - 1:  # "skip computing output for unused tokens"
        out_ids = b.name(ctx.new_tensor_1d(I32, b.batch["n_outputs"]), "inp_out_ids")
        set_input(out_ids)
        cur = get_rows(ctx, cur, out_ids)
        inp_sa = get_rows(ctx, inp_sa, out_ids)
    ffn_inp = b.name(add(ctx, cur, inp_sa), "ffn_inp", il)
    cur = b.name(llm_build_norm(b, ffn_inp, L["ffn_norm"], il, "norm_ffn" if b.recorded else "norm"), "ffn_norm", il)
    cur = llm_build_ffn(b, cur, L, il)
    return b.name(add(ctx, cur, ffn_inp), "l_out", il)


# %% [markdown]
# The whole graph: the inputs (token ids, positions, the causal mask padded to 32 rows), the layers,
# the final norm and the output head; then the roots are expanded in llama.cpp's order into a graph
# of `llama_model_max_nodes` slots — max(8192, 5 × the model's tensors).

# %%
# | export
def llama_model_max_nodes(n_layer: int) -> int:
    """`llama_model_max_nodes`: max(8192, 5 × the number of model tensors)."""
    return max(8192, 5 * (3 + len(LAYER_WEIGHTS) * n_layer))


def build_graph(model: dict, w: dict, layers: list, batch: dict, recorded: bool = False):
    """`build_llama`: the compute context and graph of one batch (`n_tokens`, `n_kv`, `kv_head`,
    `n_outputs`) over the weights `w` / `layers` (a fresh graph per evaluation, as llama.cpp builds
    one). Returns `(context, graph, expand roots)`."""
    b = _Build(Context("compute"), model, batch, recorded, [])
    n_tokens, ctx = batch["n_tokens"], b.ctx
    inp_tokens = b.name(ctx.new_tensor_1d(I32, n_tokens), "inp_tokens")
    set_input(inp_tokens)
    inp_l = b.name(get_rows(ctx, w["token_embd"], inp_tokens), "inp_embd")
    inp_pos = b.name(ctx.new_tensor_1d(I32, n_tokens), "inp_pos")
    set_input(inp_pos)
    kq_mask = b.name(ctx.new_tensor_2d(F32, batch["n_kv"], GGML_PAD(n_tokens, GGML_KQ_MASK_PAD)), "KQ_mask")
    set_input(kq_mask)
    for il, L in enumerate(layers):
        inp_l = llm_build_layer(b, inp_l, inp_pos, kq_mask, L, il)
    cur = b.name(llm_build_norm(b, inp_l, w["output_norm"], -1, "norm_out" if recorded else "norm"), "result_norm")
    cur = b.name(mul_mat(ctx, w["output"], cur), "result_output")
    if recorded:
        set_output(cur)
    b.roots.append(cur)
    graph = Graph(GGML_DEFAULT_GRAPH_SIZE if recorded else llama_model_max_nodes(len(layers)))
    for r in b.roots:
        build_forward_expand(graph, r)
    return ctx, graph, b.roots


# %% [markdown]
# The inputs of a batch, as the recorded scenarios define them: positions from `kv_head` on, a causal
# mask (0 where a token may look, −∞ elsewhere), token ids from a fixed formula, the last
# `n_outputs` tokens as outputs.

# %%
# | export
def batch_inputs(batch: dict) -> dict:
    """The inputs of a batch (n_tokens, n_kv, kv_head, n_outputs), as the scenario README defines them."""
    n, n_kv, head, n_out = batch["n_tokens"], batch["n_kv"], batch["kv_head"], batch["n_outputs"]
    pos = np.arange(head, head + n, dtype=np.int32)
    mask = np.full((GGML_PAD(n, GGML_KQ_MASK_PAD), n_kv), -np.inf, dtype=np.float32)  # numpy shape: [rows, n_kv]
    for i in range(n):
        mask[i, : head + i + 1] = 0.0
    return {"inp_tokens": ((37 * pos + 11) % 256).astype(np.int32), "inp_pos": pos, "KQ_mask": mask,
            "inp_out_ids": np.arange(n - n_out, n, dtype=np.int32)}


# %% [markdown]
# ## 4 · The worst case llama.cpp reserves
#
# `llama_new_context_with_model` pads `n_ctx` to a multiple of 32 (256 with flash attention), makes a
# KV cache of that many cells, and reserves the compute buffers once, for the largest graph it will
# ever run: `n_tokens = min(n_ctx, n_ubatch)` tokens, every one an output, written at the end of the
# cache and attending to all of it (`n_kv = n_ctx`). Every later batch fits in that plan.

# %%
# | export
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")  # llama.cpp's --cache-type-k


def padded_n_ctx(n_ctx: int, flash_attn: bool = False) -> int:
    """`llama_new_context_with_model`'s `n_ctx`: padded to `llama_kv_cache_get_padding` (256 with flash
    attention, else 32)."""
    check_int("n_ctx", n_ctx, 1, MAX_N_CTX, "--n-ctx", " (padded to 32, an int32 in llama.cpp's graph)")
    return GGML_PAD(n_ctx, 256 if flash_attn else 32)


def batch_sizes(n_ctx: int, n_batch: int = 2048, n_ubatch: int = 512) -> tuple:
    """`llama_new_context_with_model`'s (n_batch, n_ubatch) for a padded `n_ctx`: n_batch at most n_ctx
    (causal attention) and at least 32 (the mask's padding); n_ubatch at most n_batch (0: n_batch)."""
    check_int("n_batch", n_batch, 0, INT32_MAX, "--n-batch")
    check_int("n_ubatch", n_ubatch, 0, INT32_MAX, "--n-ubatch")
    if n_batch == 0 and n_ubatch == 0:
        raise ModelError("n_batch (--n-batch) and n_ubatch (--n-ubatch) cannot both be zero")
    n_batch = max(min(n_ctx, n_batch), GGML_KQ_MASK_PAD)
    return n_batch, min(n_batch, n_ubatch if n_ubatch > 0 else n_batch)


def worst_case_batch(n_ctx: int, n_ubatch: int = 512) -> dict:
    """The batch of llama.cpp's reserve: `min(n_ctx, n_ubatch)` tokens, all outputs, the whole cache."""
    n_tokens = min(n_ctx, n_ubatch)
    return dict(n_tokens=n_tokens, n_kv=n_ctx, kv_head=n_ctx - n_tokens, n_outputs=n_tokens)


# %% [markdown]
# A context is checked before anything is built, against what llama.cpp's types and limits allow:
# `n_ctx` up to 2^31 − 32 (padded to 32 it stays an `int32_t`, the graph's `n_kv`), batch sizes and
# `n_gpu_layers` that are `int32_t`, at most 15 GPUs (the scheduler takes `GGML_SCHED_MAX_BACKENDS` = 16
# backends and the CPU is one of them; CUDA's `GGML_CUDA_MAX_DEVICES` is 16 too), one finite,
# non-negative `tensor_split` weight per GPU, the cache types llama.cpp offers, and a head size that is
# a whole number of the K type's blocks (`GGML_ASSERT(n_embd_head_k % ggml_blck_size(type_k) == 0)`).

# %%
# | export
def check_context(params: LlamaParams, n_ctx: int, n_ubatch: int, n_gpu_layers: int = 0, devices: int = 0,
                  tensor_split=None, type_k: str = "f16", type_v: str = None) -> None:
    """The checks of `llama_new_context_with_model` and `llm_load_tensors` on a context's parameters, made
    before any planning: a `ModelError` naming the parameter and its flag, what was expected and found."""
    padded_n_ctx(n_ctx)
    check_int("n_ubatch", n_ubatch, 1, INT32_MAX, "--n-ubatch")
    check_int("n_gpu_layers", n_gpu_layers, 0, INT32_MAX, "--n-gpu-layers")
    check_int("devices", devices, 0, MAX_DEVICES, "--devices",
              f" (GGML_SCHED_MAX_BACKENDS = {GGML_SCHED_MAX_BACKENDS} backends, the CPU being one)")
    if tensor_split is not None:
        if isinstance(tensor_split, (str, bytes)) or not hasattr(tensor_split, "__len__"):
            raise ModelError(f"tensor_split (--tensor-split): expected a list of numbers, found {tensor_split!r}")
        if len(tensor_split) != devices:
            raise ModelError(f"tensor_split (--tensor-split): expected {devices} weight(s), one per GPU (--devices "
                             f"{devices}), found {len(tensor_split)}: {list(tensor_split)}")
        flt_max = float(np.finfo(np.float32).max)  # llama.cpp's tensor_split is a float array, summed in float
        for i, x in enumerate(tensor_split):
            check_float(f"tensor_split[{i}]", x, 0.0, "--tensor-split", strict=False, most=flt_max)
        if sum(tensor_split) > flt_max:
            raise ModelError(f"tensor_split (--tensor-split): the weights add up to {sum(tensor_split):g}, more than a "
                             f"float holds ({flt_max:g})")
    if type_k not in KV_TYPES:
        raise ModelError(f"type_k (--type-k): expected one of {', '.join(KV_TYPES)}, found {type_k!r}")
    if (type_v or "f16") != "f16":
        raise ModelError(f"type_v (--type-v): expected f16, found {type_v!r}: V cache quantization requires flash "
                         f"attention, which llama.cpp's graph here leaves off")
    head, blck = params.n_embd // params.n_head, type_by_name(type_k).blck_size
    if head % blck:
        raise ModelError(f"type_k (--type-k) {type_k}: the head size {head} is not a whole number of its blocks "
                         f"({blck} elements each)")


# %% [markdown]
# Llama-2 7B on the CPU alone, `n_ctx` 2048, `n_ubatch` 512. Before running it, predict: the KV cache
# is 2 (K and V) × 32 layers × 4096 × 2048 cells × 2 bytes = 1024 MiB; the graph has 32 nodes per
# layer and 6 more, 1,030. llama.cpp printed `CPU compute buffer size = 164.01 MiB` for this setup;
# the plan below is the graph allocator of chapter 05 on this graph.

# %%
# NBVAL_CHECK_OUTPUT
import ggml_lite as gl  # noqa: E402

MiB = 1024 * 1024
p7 = PRESETS["llama-2-7b"]
n_ctx = padded_n_ctx(2048)
model = p7.model(n_ctx)
on_cpu = dict(token_embd="CPU", output="CPU", layers=["CPU"] * p7.n_layer, kv_cache=["CPU"] * p7.n_layer)
ctxs, graph, _ = build_llama(model, on_cpu, worst_case_batch(n_ctx, 512))
for c in ctxs[:-1]:  # weights and cache get their buffers (lazily: no byte is allocated yet)
    gl.alloc_ctx_tensors(c, gl.cpu_buffer_type())
galloc = gl.GAllocr(gl.cpu_buffer_type())
galloc.reserve(graph)
kv_bytes = sum(t.nbytes for c in ctxs if c.name.startswith("kv_cache") for t in c.tensors)  # as llama.cpp sums it
print(f"graph: {len(graph.nodes)} nodes, {len(graph.leafs)} leafs")
print(f"KV self size  = {kv_bytes / MiB:7.2f} MiB")
print(f"CPU compute buffer size = {galloc.get_buffer_size(0) / MiB:.2f} MiB")

# %% [markdown]
# 1,030 nodes, 1024.00 MiB and 164.01 MiB — llama.cpp's three numbers.

# %% [markdown]
# ## 5 · The recorded variant, and fixture 13
#
# The project's LLaMA fixtures were recorded from the real ggml with the recorded variant of this
# builder. Fixture 13 is a 7B at `n_ctx` 512 with every token an output: `recorded=True` rebuilds it
# tensor for tensor — 1,062 nodes, 33 per layer — and its compute buffer is the same as the
# llama.cpp variant's: the extra RESHAPE is a view, and names take no memory.

# %%
# NBVAL_CHECK_OUTPUT
import json  # noqa: E402
from pathlib import Path  # noqa: E402

fx = json.loads(Path("../tests/fixtures/ggml-seed/13_llama7b_ctx512_all_outputs.json").read_text())
by_id = {t["id"]: t for t in fx["graph"]["tensors"]}
recorded_nodes = [by_id[i] for i in fx["graph"]["nodes"]]
sizes = {}
for recorded in (True, False):
    m = p7.model(512)
    ctxs13, g13, _ = build_llama(m, dict(on_cpu), worst_case_batch(512, 512), recorded=recorded)
    for c in ctxs13[:-1]:
        gl.alloc_ctx_tensors(c, gl.cpu_buffer_type())
    ga = gl.GAllocr(gl.cpu_buffer_type())
    ga.reserve(g13)
    sizes[recorded] = (len(g13.nodes), ga.get_buffer_size(0))
    if recorded:
        same = [(n.name, n.op.name, list(n.ne)) for n in g13.nodes] == \
               [(t["name"], t["op"], t["ne"]) for t in recorded_nodes]
print("recorded variant:", sizes[True], "| llama.cpp:", sizes[False], "| fixture 13 node for node:", same,
      "| recorded buffer:", fx["buffer_size"])

# %% [markdown]
# ## 6 · Placement as llama.cpp placed it
#
# `llm_load_tensors` keeps the input layer (`token_embd`) on the host — "there is very little benefit
# to offloading the input layer" — and gives the last `n_gpu_layers` layers to the GPUs, split by
# `tensor_split` (by free memory when none is given: here, evenly); the output layer goes to the last
# GPU only when `n_gpu_layers > n_layer`. The KV cache of a layer lives with its layer (with
# `--no-kv-offload`, on the host). The split points are cumulative fractions compared in float32,
# `upper_bound(splits, float(i - i_gpu_start) / act_gpu_layers)`.

# %%
# | export
def layer_placement(n_layer: int, n_gpu_layers: int = 0, n_devices: int = 0, tensor_split=None,
                    offload_kqv: bool = True) -> dict:
    """`llm_load_tensors`' placement (split mode layer) and `llama_kv_cache_init`'s: a backend name
    ("CPU", "GPU0", "GPU1", ...) for `token_embd`, `output`, each layer and each layer's KV cache."""
    if n_gpu_layers < 0 or n_devices < 0:
        raise ModelError(f"n_gpu_layers ({n_gpu_layers}) and devices ({n_devices}) cannot be negative")
    n_gpu_layers = n_gpu_layers if n_devices else 0
    i_gpu_start = max(n_layer - n_gpu_layers, 0)
    given = list(tensor_split or [])[:max(n_devices, 1)]
    given += [0.0] * (max(n_devices, 1) - len(given))  # a short list: the other devices get nothing
    weights = np.asarray(given, dtype=np.float32)
    if not np.isfinite(weights).all() or (weights < 0).any():
        raise ModelError(f"tensor_split {list(tensor_split)}: the weights must be finite and non-negative")
    if not weights.any():  # all zero (or none given): the default split, by free memory -- here equal
        weights = np.ones(max(n_devices, 1), dtype=np.float32)
    cumulative = np.cumsum(weights, dtype=np.float32)  # summed in order, as the C loop does
    splits = cumulative / cumulative[-1]
    act = min(n_gpu_layers, n_layer + 1)

    def gpu(x):  # std::upper_bound over the split points
        return f"GPU{int(np.searchsorted(splits, np.float32(x) / np.float32(act), side='right'))}"
    layers = ["CPU" if i < i_gpu_start else gpu(i - i_gpu_start) for i in range(n_layer)]
    output = gpu(act - 1) if n_gpu_layers > n_layer else "CPU"
    kv = layers if offload_kqv else ["CPU"] * n_layer
    return dict(token_embd="CPU", output=output, layers=layers, kv_cache=list(kv))


# %% [markdown]
# Then `llama_new_context_with_model` makes one backend per GPU and the CPU last, gives the CPU
# backend's compute buffer a host buffer type, turns on pipeline parallelism (`n_copies` 4) only with
# several GPUs, every layer offloaded and the KV cache with them, and reserves the worst-case graph
# through the scheduler. While building the graph, its callback pins every layer's `norm` to the
# layer's backend when everything is offloaded or the batch has fewer than 32 tokens (else the
# scheduler would run it where the previous layer ran), and, without KV offload, `kqv_merged_cont`
# to the CPU. The GPUs are SIM devices configured like CUDA: alignment 128 and CUDA's offload rule
# (an op whose batch has at least 32 rows, except GET_ROWS).

# %%
# | export
def plan_memory(params: LlamaParams, n_ctx: int = 512, n_ubatch: int = 512, n_gpu_layers: int = 0,
                devices: int = 0, tensor_split=None, type_k: str = "f16", type_v: str = None,
                offload_kqv: bool = True, trace: bool = False, tensor_types: dict = None) -> dict:
    """What `llama_new_context_with_model` allocates: per backend the weights, the KV cache and the
    compute buffer of the worst-case graph (`ggml_backend_sched_reserve`), with the graph's node and
    split counts and the scheduler's n_copies. Sizes in bytes. With `trace`, also the graph allocator's
    trace of the reserve (`events`: chapter 05's events, for `report.peaks`)."""
    check_context(params, n_ctx, n_ubatch, n_gpu_layers, devices, tensor_split, type_k, type_v)
    n_ctx, type_v = padded_n_ctx(n_ctx), type_v or "f16"
    placement = layer_placement(params.n_layer, n_gpu_layers, devices, tensor_split, offload_kqv)
    batch = worst_case_batch(n_ctx, n_ubatch)
    model = {**params.model(n_ctx, type_k, type_v), "tensor_types": tensor_types}
    ctxs, graph, _ = build_llama(model, placement, batch)
    _check_sizes(ctxs, n_ctx, batch["n_tokens"])
    gpus = [sim_init(f"GPU{i}", alignment=128, offload="cuda") for i in range(devices)]
    backends = {b.get_name(): b for b in (*gpus, cpu_init())}
    host_buft = sim_host_buffer_type() if devices else cpu_buffer_type()  # llama_default_buffer_type_cpu(true)
    bufts = {name: host_buft if name == "CPU" else b.get_default_buffer_type() for name, b in backends.items()}
    report = {name: dict(weights=0, kv=0, output=0, compute=0) for name in backends}
    for c in ctxs[:-1]:
        kind, name = c.name.split(":")
        buf = alloc_ctx_tensors_from_buft(c, bufts[name])
        buf.set_usage(BufferUsage.WEIGHTS if kind == "weights" else BufferUsage.ANY)
        report[name]["weights"] += buf.get_size() if kind == "weights" else 0  # as llama.cpp prints buffer sizes
        report[name]["kv"] += sum(t.nbytes for t in c.tensors) if kind == "kv_cache" else 0  # "KV self size"
    # llama_output_reserve at init: the logits of n_seq_max (1) outputs, f32, in a host buffer
    report["CPU"]["output"] = host_buft.alloc_buffer(params.n_vocab * 4).get_size()
    full_offload = n_gpu_layers > params.n_layer and devices > 0
    parallel = devices > 1 and full_offload and offload_kqv
    sched = BackendSched(list(backends.values()), bufts=list(bufts.values()),
                         graph_size=llama_model_max_nodes(params.n_layer), parallel=parallel)
    _pin_like_llama_cpp(sched, graph, placement, backends, batch["n_tokens"] < 32 or full_offload, offload_kqv)
    events = []
    if trace:  # the scheduler's graph allocator and its dynamic allocators report every decision
        sched.galloc.trace = events.append
        for dyn in sched.galloc.buf_tallocs:
            dyn.trace = events.append
    sched.reserve(graph)
    for name, b in backends.items():
        report[name]["compute"] = sched.get_buffer_size(b)
    return dict(devices=report, nodes=len(graph.nodes), splits=sched.n_splits, n_copies=sched.n_copies,
                placement=placement, graph=graph, sched=sched, events=events)


def _check_sizes(ctxs: list, n_ctx: int, n_tokens: int) -> None:
    """The model, its cache and its worst-case graph must fit ggml's sizes: no tensor of more than 2^63 - 1
    elements, and all of them together at most SIZE_MAX / 2 bytes (the dynamic allocator's largest block),
    so that no buffer can fail to plan; a `ModelError` naming the largest tensor otherwise."""
    tensors = [t for c in ctxs for t in c.tensors]
    big = max(tensors, key=lambda t: t.nbytes)
    total = sum(t.nbytes for t in tensors if t.view_src is None)
    if max(t.nelements for t in tensors) > INT64_MAX or total > INT64_MAX:
        raise ModelError(f"n_ctx {n_ctx} with {n_tokens} tokens per micro-batch (--n-ctx, --n-ubatch): the model, "
                         f"its KV cache and its graph need {total} bytes ({big.name}: {big.nbytes}), more than ggml's "
                         f"allocator can hand out (SIZE_MAX / 2 = 2^63 - 1)")


def _pin_like_llama_cpp(sched, graph, placement, backends, pin_norm: bool, offload_kqv: bool) -> None:
    """`llama_build_graph`'s callback: `norm-<il>` to its layer's backend (when `pin_norm`), and
    `kqv_merged_cont-<il>` to the CPU without KV offload."""
    for node in graph.nodes:
        name, _, il = node.name.rpartition("-")
        if pin_norm and name == "norm" and il.isdigit():
            sched.set_tensor_backend(node, backends[placement["layers"][int(il)]])
        elif not offload_kqv and name == "kqv_merged_cont" and il.isdigit():
            sched.set_tensor_backend(node, backends["CPU"])


# %% [markdown]
# Three setups whose llama.cpp logs are public (bug reports of mid-2024). Predict the first from the
# CPU-only run above: the GPU now plans the layers' tensors, the host only the embeddings' rows and
# the mask.

# %%
# NBVAL_CHECK_OUTPUT
cases = {"Llama-2 7B, 1 GPU, 33 layers, n_ctx 512": plan_memory(p7, 512, n_gpu_layers=33, devices=1),
         "Llama-3.1 8B, 1 GPU, 33 layers, n_ctx 8192": plan_memory(PRESETS["llama-3.1-8b"], 8192, n_gpu_layers=33, devices=1),
         "Llama-2 7B, CPU only, n_ctx 2048": plan_memory(p7, 2048)}
for label, r in cases.items():
    per_device = ", ".join(f"{n} compute {d['compute'] / MiB:.2f} MiB, KV {d['kv'] / MiB:.2f} MiB"
                           for n, d in r["devices"].items() if d["compute"] or d["kv"])
    print(f"{label}: {r['nodes']} nodes, {r['splits']} splits; {per_device}")

# %% [markdown]
# llama.cpp printed: 70.50 MiB on the GPU and 9.01 MiB on the host, 256.00 MiB of KV cache, 1,030
# nodes and 2 splits; 560.00 and 24.01 MiB, 1024.00 MiB of KV; 164.01 MiB and 1024.00 MiB on the CPU,
# one split. Every number matches.

# %% [markdown]
# ## 7 · The report
#
# `memory_report` gathers what a user asks: per device the weights, the KV cache, the output buffer
# and the compute buffer, their total, and the graph's node and split counts — the figures of
# `python -m ggml_lite llama`, which also prints them the way llama.cpp logs them, so that a user can
# hold one against the other. `--vram` says per device whether it fits.

# %%
# | export report
"""The memory report of a LLaMA (chapter 10): what llama.cpp allocates on each device for a model and a
context, and the lines llama.cpp prints about it."""

from dataclasses import asdict, dataclass

from ggml_lite.gallocr import PlaceEvent
from ggml_lite.errors import ModelError
from ggml_lite.models.llama import (
    MAX_DEVICES, MAX_N_CTX, LlamaParams, batch_sizes, check_float, check_int, padded_n_ctx, plan_memory,
)
from ggml_lite.tensor import TensorFlag
from ggml_lite.trace import lifetimes

MiB = 1024 * 1024


@dataclass
class MemoryReport:
    """`model` and `context` (what was asked), `graph` ({nodes, splits, n_copies}), `devices` (one
    {name, weights, kv, output, compute, total} per device, the GPUs then the CPU; bytes) and `peaks`
    (per compute buffer: the node of its peak and the tensors live there, see `peaks`)."""

    model: dict
    context: dict
    graph: dict
    devices: list
    peaks: dict

    def to_json(self) -> dict:
        """The document of `python -m ggml_lite llama --json`."""
        return dict(model=self.model, context=self.context, graph=self.graph, devices=self.devices, peak=self.peaks)


def memory_report(params: LlamaParams, n_ctx: int = 512, n_batch: int = 2048, n_ubatch: int = 512,
                  n_gpu_layers: int = 0, devices: int = 0, tensor_split=None, type_k: str = "f16",
                  type_v: str = None, offload_kqv: bool = True, tensor_types: dict = None,
                  why: bool = True) -> MemoryReport:
    """Plan the model (a `LlamaParams`, or a `GGUFModel` with its tensors' types) as
    `llama_new_context_with_model` would (`plan_memory`) and report it; `why=False`
    skips the trace behind `peaks` (for searches that need only the totals, as `fit`). Every argument is
    checked before planning (`check_context`)."""
    if hasattr(params, "params") and hasattr(params, "tensor_types"):  # a GGUFModel: its hyperparameters and types
        params, tensor_types = params.params, params.tensor_types if tensor_types is None else tensor_types
    if not callable(getattr(params, "model", None)):  # (duck-typed: a notebook may define its own LlamaParams)
        raise ModelError(f"memory_report: expected a LlamaParams model, found {type(params).__name__}")
    n_batch, n_ubatch = batch_sizes(padded_n_ctx(n_ctx), n_batch, n_ubatch)
    r = plan_memory(params, n_ctx, n_ubatch, n_gpu_layers, devices, tensor_split, type_k, type_v, offload_kqv,
                    trace=why, tensor_types=tensor_types)
    rows = [dict(name=name, **d, total=sum(d.values())) for name, d in r["devices"].items()]
    context = dict(n_ctx=padded_n_ctx(n_ctx), n_batch=n_batch, n_ubatch=n_ubatch, type_k=type_k,
                   type_v=type_v or "f16", n_gpu_layers=n_gpu_layers, devices=devices,
                   tensor_split=list(tensor_split) if tensor_split else None, offload_kqv=offload_kqv)
    return MemoryReport(asdict(params), context, dict(nodes=r["nodes"], splits=r["splits"], n_copies=r["n_copies"]),
                        rows, peaks(r) if why else {})


# %%
# | export report
def llama_cpp_lines(rep: MemoryReport) -> list:
    """The lines llama.cpp prints about these buffers (`llm_load_tensors`, `llama_new_context_with_model`),
    with this setup's buffer type names: GPU<i> for a device, CPU or CUDA_Host (the pinned host type of an
    accelerator setup) for the host's compute and output buffers. Weights kept on the host print as
    "CPU", as llama.cpp prints them when it maps the file (its default)."""
    host = "CUDA_Host" if rep.context["devices"] else "CPU"
    lines = [f"llm_load_tensors: {d['name']:>10s} buffer size = {d['weights'] / MiB:8.2f} MiB"
             for d in rep.devices if d["weights"]]
    kv = sum(d["kv"] for d in rep.devices)
    lines.append(f"llama_new_context_with_model: KV self size  = {kv / MiB:7.2f} MiB, K ({rep.context['type_k']}): "
                 f"{kv / 2 / MiB:7.2f} MiB, V ({rep.context['type_v']}): {kv / 2 / MiB:7.2f} MiB"
                 if rep.context["type_k"] == rep.context["type_v"] else
                 f"llama_new_context_with_model: KV self size  = {kv / MiB:7.2f} MiB")
    lines.append(f"llama_new_context_with_model: {host:>10s}  output buffer size = "
                 f"{sum(d['output'] for d in rep.devices) / MiB:8.2f} MiB")
    if rep.graph["n_copies"] > 1:
        lines.append(f"llama_new_context_with_model: pipeline parallelism enabled (n_copies={rep.graph['n_copies']})")
    lines += [f"llama_new_context_with_model: {d['name'] if d['name'] != 'CPU' else host:>10s} compute buffer size = "
              f"{d['compute'] / MiB:8.2f} MiB" for d in rep.devices if d["compute"] > 1]
    lines += [f"llama_new_context_with_model: graph nodes  = {rep.graph['nodes']}",
              f"llama_new_context_with_model: graph splits = {rep.graph['splits']}"]
    return lines


def format_report(rep: MemoryReport, vram_gib: float = None) -> str:
    """The report as a table (MiB), then llama.cpp's lines; with `vram_gib`, whether each GPU fits."""
    if vram_gib is not None:
        check_vram(vram_gib)
    head = f"{'device':8s} {'weights':>10s} {'KV':>10s} {'output':>10s} {'compute':>10s} {'total':>10s}"
    rows = [f"{d['name']:8s} " + " ".join(f"{d[k] / MiB:10.2f}" for k in ("weights", "kv", "output", "compute", "total"))
            for d in rep.devices]
    out = [head + "   (MiB)", *rows, f"graph: {rep.graph['nodes']} nodes, {rep.graph['splits']} splits, "
           f"n_copies {rep.graph['n_copies']}"]
    if vram_gib is not None:
        for d in rep.devices:
            if d["name"] != "CPU":
                out.append(f"{d['name']}: {d['total'] / MiB:.2f} MiB of {vram_gib * 1024:.2f} MiB: "
                           f"{'fits' if _fits(d, vram_gib) else 'does NOT fit'}")
    for buft, pk in rep.peaks.items():
        out.append(f"{buft} compute buffer peaks at node {pk['node_index']} ({pk['node']}); live there:")
        out += [f"  {t['bytes'] / MiB:10.2f} MiB  {t['name']}: {t['reason']}" for t in pk["live"][:6]]
        if len(pk["live"]) > 6:
            out.append(f"  ... and {len(pk['live']) - 6} smaller")
    return "\n".join(out + ["", "as llama.cpp prints it:", *llama_cpp_lines(rep)])


# %% [markdown]
# "Does it fit?" has a follow-up: *what is the most I can offload, and then the longest context?*
# `fit` answers it the only exact way — by planning: the largest `n_gpu_layers` whose every GPU total
# fits in `vram_gib`, then, with it, the largest `n_ctx` (a multiple of 32, at most the training
# context) that still fits. The totals grow with layers and with the context, almost linearly, so each
# search keeps a bracket — a value that fits, one that does not — and plans next where the spare bytes,
# interpolated, reach zero, halving the bracket whenever a guess does not: a handful of plans for most
# models, and a bounded number (about 2·log2 of the range) for any. `--vram` is a finite number of GiB,
# above 0 and at most 2^34 (2^64 bytes).

# %%
# | export report
MAX_VRAM_GIB = 2.0**34  # 2^64 bytes: the whole address space of a size_t


def check_vram(vram_gib) -> float:
    """`vram_gib` if it is a finite number of GiB above 0 and at most 2^34 (2^64 bytes), else a `ModelError`."""
    return check_float("vram", vram_gib, 0.0, "--vram", most=MAX_VRAM_GIB)


def _fits(device: dict, vram_gib: float) -> bool:
    return device["total"] <= vram_gib * 1024 * MiB


def fits(rep: MemoryReport, vram_gib: float) -> bool:
    """Does every GPU's total fit in `vram_gib` GiB?"""
    return all(_fits(d, vram_gib) for d in rep.devices if d["name"] != "CPU")


def fit(params: LlamaParams, vram_gib: float, n_ctx: int = 512, devices: int = 1, **kw) -> tuple:
    """(the largest n_gpu_layers that fits at `n_ctx`, then the largest n_ctx that fits with it).
    Every layer and the output first (full offload also turns on pipeline parallelism, which needs more
    memory), then a search over 1..n_layer layers: a GPU's total grows with its layers. The context grows
    in multiples of 32 up to `n_ctx_train` (the totals grow with n_ctx). (0, ...) when not even one layer
    fits. Both searches are `_largest`: a handful of plans for most models, at most about 2 log2 of the
    range. (With an uneven `tensor_split`, a GPU's share can dip by one layer as layers are added; the
    search assumes it does not matter, and tests check it against a scan of every layer count.)"""
    check_vram(vram_gib)
    check_int("devices", devices, 1, MAX_DEVICES, "--devices", " (fit needs a GPU)")
    budget = vram_gib * 1024 * MiB

    def probe(layers, ctx):  # (does it fit, the spare bytes of the fullest GPU)
        rep = memory_report(params, ctx, n_gpu_layers=layers, devices=devices, why=False, **kw)
        return fits(rep, vram_gib), min(budget - d["total"] for d in rep.devices if d["name"] != "CPU")
    if probe(params.n_layer + 1, n_ctx)[0]:
        layers = params.n_layer + 1
    else:  # (0 layers is not planned: the GPUs then compute what the scheduler offloads, not a layer's share)
        layers = _largest(lambda n: probe(n, n_ctx), 0, params.n_layer, at_lo=(True, budget))
    lo, hi = padded_n_ctx(n_ctx) // 32, max(min(params.n_ctx_train, MAX_N_CTX) // 32, padded_n_ctx(n_ctx) // 32)
    first = probe(layers, lo * 32)
    if not first[0]:
        return layers, None
    return layers, _largest(lambda k: probe(layers, k * 32), lo, hi, at_lo=first) * 32  # the largest multiple of 32


def _largest(probe, lo: int, hi: int, at_lo: tuple) -> int:
    """The largest n in [lo, hi] whose `probe(n)` = (fits, spare bytes) fits, given that it fits at lo
    (`at_lo`) and turns false only once as n grows. Keeps a bracket (fits, does not fit) and plans next
    where the spare bytes, interpolated linearly, reach zero (the totals grow about linearly); an end kept
    twice in a row has its spare bytes halved (the Illinois rule), and after log2 of the range such steps
    the rest is bisected: at most about 2 log2(hi - lo) + 2 plans."""
    at_hi = probe(hi)
    if at_hi[0]:
        return hi
    spare_lo, spare_hi, kept, steps = at_lo[1], at_hi[1], 0, (hi - lo).bit_length() + 1
    while hi - lo > 1:
        drop = spare_lo - spare_hi
        guess = lo + round((hi - lo) * spare_lo / drop) if steps > 0 and drop > 0 else (lo + hi) // 2
        mid, steps = min(max(guess, lo + 1), hi - 1), steps - 1
        fits_mid, spare = probe(mid)
        if fits_mid:
            lo, spare_lo = mid, spare
            spare_hi, kept = (spare_hi / 2 if kept == 1 else spare_hi), 1
        else:
            hi, spare_hi = mid, spare
            spare_lo, kept = (spare_lo / 2 if kept == -1 else spare_lo), -1
    return lo


# %% [markdown]
# ## 8 · Why this peak
#
# A compute buffer is as large as the highest block the graph allocator ever handed out. Replaying the
# reserve with chapter 05's trace finds, for each buffer, the node at which that block was placed,
# and the blocks live at that node — each with the reason it is still there: it is the node's own
# result, a later node still reads it (or a view of it), or it is an output.

# %%
# | export report
def peaks(result: dict) -> dict:
    """{buffer type name: {node, node_index, bytes, live: [{name, bytes, reason}], largest first}} for a
    `plan_memory(..., trace=True)` result: where each compute buffer's highest block was placed."""
    sched, events = result["sched"], result["events"]
    graph = sched.graph  # the scheduler's graph copy: what the graph allocator planned
    top = {}  # buffer id -> (end, node index) of the highest block placed so far
    for ev in events:
        if isinstance(ev, PlaceEvent) and ev.how == "new" and ev.offset + ev.size > top.get(ev.buffer_id, (0,))[0]:
            top[ev.buffer_id] = (ev.offset + ev.size, max(ev.node_index, 0))
    last_use, via_view = {}, {}
    for i, node in enumerate(graph.nodes):
        for src in node.src:
            if src is not None:
                root = src.view_src if src.view_src is not None else src
                last_use[root], via_view[root] = (i, node), (src if src is not root else None)
    blocks = lifetimes(graph, events)
    out = {}
    for b, (end, at) in sorted(top.items()):
        handed = {lt.parent for lt in blocks if lt.parent is not None and lt.start == at}
        live = [lt for lt in blocks if lt.kind == "tensor" and lt.buffer_id == b and lt.start <= at <= lt.end
                and lt.tensor not in handed]
        out[sched.bufts[b].get_name()] = dict(
            node=graph.nodes[at].name, node_index=at, bytes=end,
            live=[dict(name=lt.tensor.name, bytes=lt.size, reason=_reason(lt.tensor, at, graph, last_use, via_view))
                  for lt in sorted(live, key=lambda lt: -lt.size)])
    return out


def _reason(t, at: int, graph, last_use: dict, via_view: dict) -> str:
    if t.flags & TensorFlag.OUTPUT:
        return "an output: kept to the end"
    if graph.nodes[at] is t:
        return "computed at this node"
    j, reader = last_use.get(t, (at, None))
    if j > at:
        view = via_view.get(t)
        return f"read later by {reader.name} (node {j})" + (f" through its view {view.name}" if view is not None else "")
    return "read by this node, freed after it"


# %% [markdown]
# Predict the GPU's peak for the 7B on one GPU at n_ctx 512 before the code says it. Attention's
# scores are `n_kv × n_tokens × n_head` floats — 512 · 512 · 32 · 4 bytes = 32 MiB — and a
# feed-forward activation 11008 · 512 · 4 = 21.5 MiB; but the logits are `n_vocab × n_tokens` floats,
# 32000 · 512 · 4 = 62.5 MiB, and every token is an output in the worst case. So the peak is the last
# node: the logits, with the normalized input they are computed from (8 MiB): 70.50 MiB.

# %%
# NBVAL_CHECK_OUTPUT
for buft, pk in peaks(plan_memory(p7, 512, n_gpu_layers=33, devices=1, trace=True)).items():
    print(f"{buft}: peak {pk['bytes'] / MiB:.2f} MiB at node {pk['node_index']} ({pk['node']})")
    for t in pk["live"][:3]:
        print(f"  {t['bytes'] / MiB:7.2f} MiB  {t['name']}: {t['reason']}")

# %% [markdown]
# The GPU's 70.50 MiB are the logits (62.50 MiB) and `result_norm` (8.00 MiB); the host's 9.01 MiB
# are the embeddings' rows (8.00 MiB) and the mask (1.00 MiB) — inputs waiting to be copied to the GPU.

# %% [markdown]
# Llama-2 7B, all 33 layers on one GPU with 16 GiB, n_ctx 4096:

# %%
from ggml_lite.report import fit, format_report, memory_report, peaks  # noqa: E402

print(format_report(memory_report(p7, 4096, n_gpu_layers=33, devices=1), vram_gib=16))
print("on an 8 GiB GPU: (n_gpu_layers, n_ctx) =", fit(p7, 8, n_ctx=512))

# %% [markdown]
# ## 9 · A picture, and the knobs
#
# Stacked bars per device — weights, KV cache, output and compute buffers — show where the memory
# goes; the widget below moves `n_ctx`, `n_ubatch` and `n_gpu_layers` and re-plans at every move (a
# 7B plans in about 30 ms, a 70B in about 60), with the tensors at each compute buffer's peak.

# %%
# | export viz.report
"""Pictures of the memory report (chapter 10): stacked bars per device, and a widget that re-plans."""

import plotly.graph_objects as go

from ggml_lite.report import MiB, memory_report
from ggml_lite.viz.memory import show_static_frame

PARTS = {"weights": "#636efa", "kv": "#00cc96", "output": "#ffa15a", "compute": "#ef553b"}


def report_figure(rep, title: str = None) -> go.Figure:
    """Stacked bars, one per device: its weights, KV cache, output and compute buffers (MiB)."""
    names = [d["name"] for d in rep.devices]
    fig = go.Figure([go.Bar(name=part, x=names, y=[d[part] / MiB for d in rep.devices], marker_color=color,
                            hovertemplate=part + ": %{y:.2f} MiB<extra></extra>") for part, color in PARTS.items()])
    fig.update_layout(barmode="stack", title=title or "memory per device", yaxis=dict(title="MiB"), height=360,
                      margin=dict(l=20, r=20, t=50, b=40), legend=dict(orientation="h", y=-0.15))
    return fig


def report_widget(params, n_ctx: int = 512, n_ubatch: int = 512, n_gpu_layers: int = 0, devices: int = 1):
    """Sliders for n_ctx, n_ubatch and n_gpu_layers; each move re-plans (`memory_report`) and redraws
    the bars and the peak's tensors (its first frame shown statically too, as `show_static_frame` says)."""
    import ipywidgets as w
    from IPython.display import display

    ctx = w.IntSlider(value=n_ctx, min=32, max=max(params.n_ctx_train, n_ctx), step=32, description="n_ctx")
    ub = w.IntSlider(value=n_ubatch, min=32, max=2048, step=32, description="n_ubatch")
    gl_ = w.IntSlider(value=n_gpu_layers, min=0, max=params.n_layer + 1, description="n_gpu_layers")
    out = w.Output()

    def render():
        rep = memory_report(params, ctx.value, n_ubatch=ub.value, n_gpu_layers=gl_.value, devices=devices)
        display(report_figure(rep, f"n_ctx {ctx.value}, n_ubatch {ub.value}, {gl_.value} layers offloaded"))
        for buft, pk in rep.peaks.items():
            top = ", ".join(f"{t['name']} {t['bytes'] / MiB:.1f}" for t in pk["live"][:3])
            print(f"{buft}: peak {pk['bytes'] / MiB:.2f} MiB at {pk['node']} — {top} (MiB)")

    def show(change=None):
        with out:
            out.clear_output(wait=True)
            render()

    show_static_frame("a widget with sliders for n_ctx, n_ubatch and n_gpu_layers", render)
    for s in (ctx, ub, gl_):
        s.observe(show, names="value")
    show()
    return w.VBox([w.HBox([ctx, ub, gl_]), out])


# %%
from ggml_lite.viz.report import report_figure, report_widget  # noqa: E402

report_figure(memory_report(PRESETS["llama-3.1-70b"], 8192, n_gpu_layers=81, devices=2),
              "Llama-3.1 70B, n_ctx 8192, 2 GPUs, all 81 layers offloaded")

# %% [markdown]
# The weights dominate; the KV cache of 8,192 cells comes second (1.28 and 1.22 GiB); the compute
# buffers are 1.19 GiB per GPU — pipeline parallelism keeps four copies of each split's inputs.

# %% tags=["nbval-ignore-output"]
report_widget(p7, n_ctx=2048, n_gpu_layers=20)

# %% [markdown]
# ## 10 · Check

# %%
assert len(graph.nodes) == 32 * p7.n_layer + 6 and kv_bytes == 1024 * MiB
assert round(galloc.get_buffer_size(0) / MiB, 2) == 164.01
assert same and sizes[True][0] == 1062 and sizes[False][0] == 1030
assert sizes[True][1] == sizes[False][1] == fx["buffer_size"]
assert "an array of 1099511627776 string items (8 bytes each at least) needs 8796093022208 bytes" in refusal
got = {label: (r["nodes"], r["splits"], *(round(d[k] / MiB, 2) for d in r["devices"].values() for k in ("compute", "kv")))
       for label, r in cases.items()}
assert list(got.values()) == [(1030, 2, 70.50, 256.0, 9.01, 0.0), (1030, 2, 560.0, 1024.0, 24.01, 0.0),
                              (1030, 1, 164.01, 1024.0)]
print("chapter 10: all checks passed")
