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
# # A4 · GGUF headers — a model file read without trusting it
#
# Chapter 10 plans a LLaMA from its model file: `from_gguf(path)` gives the hyperparameters and the
# type of every weight, and `python -m ggml_lite llama --gguf FILE` plans with them. This appendix is
# what stands behind that one call. A GGUF file is a header — key/value metadata and one record per
# tensor — followed by the weights, and planning needs only the header: a file whose data is missing
# (header only) or a hole (sparse) plans as well as the real 13 GB one.
#
# Why a reader of the project's own, and not the `gguf` package's? Because the header is untrusted
# input. Its counts and lengths are 64-bit numbers that the file itself states: a 51-byte file can
# claim an array of 2^40 strings, and a reader that takes the count at its word allocates for it, or
# loops over it, for a very long time. The reader here, written after ggml's `gguf_init_from_file`,
# checks every count and length against the bytes left in the file *before* it reads or allocates
# anything, then applies llama.cpp's loader's checks of a LLaMA, so that whatever llama.cpp would
# refuse is refused here too, with a message that names the file and the field. Nothing in chapters
# 00–11 depends on the details.
#
# **Learning goals**
#
# 1. The GGUF layout: magic, version, counts, typed key/value pairs, tensor infos, aligned data (§1).
# 2. A bounded reader: a cursor that checks before it reads; N items of at least k bytes need N·k
#    bytes; caps far above any real file (§2).
# 3. Where each tensor's bytes lie: llama.cpp's bounds check, header-only and sparse files (§3).
# 4. llama.cpp's checks of a LLaMA: each key of its exact type, every tensor present with its shape,
#    none left over (§4); then a tiny header read whole, made hostile, cut short, of mixed types and
#    mistyped (§5), and a picture of where its bytes go (§6).
#
# Exported: `ggml_lite.models.gguf` (chapter 10's `from_gguf`; the fuzz test `test_fuzz_gguf.py` holds
# it to its promise: a right answer or a `ModelError` naming the field, never a crash).

# %%
# | default_exp models.gguf

# %% [markdown]
# ## 1 · The file, and what is checked
#
# All numbers are little-endian; a string is a `uint64` length and that many UTF-8 bytes. Each part of
# the header, and what the reader checks before it goes on:
#
# | part | layout | checked |
# |---|---|---|
# | magic, version | `"GGUF"`, `uint32` | version 2 or 3 (1 is refused, as llama.cpp does) |
# | counts | `uint64` tensor count, `uint64` key/value count | at most 65,536 each; room for them in the file |
# | key/value pairs | key (string), `uint32` value type, value | 13 value types: 10 integer and float types, bool, string, array (`uint32` item type, `uint64` length, items; no arrays of arrays, as in ggml) |
# | tensor infos | name (string), `uint32` n_dims, n_dims × `int64` ne, `uint32` ggml type, `uint64` offset | n_dims ≤ 4 (`GGML_MAX_DIMS`), ne ≥ 1, a known type whose block divides ne[0], offset aligned |
# | padding, data | to `general.alignment` (a `uint32` power of two, default 32), then each tensor's bytes at its offset | not read; each tensor's bytes lie within the file (header-only files: within 2^63 − 1) |
#
# Three caps of the reader's own bound what any file can cost — ggml has none: 65,536 pairs and
# tensors (a 512-layer LLaMA has 4,611 tensors), 2^23 array items in the whole header (a tokenizer
# has about 10^5 per array; 2^23 take about a second to walk) and 16 MiB of values kept in memory (a
# tokenizer's scores take 1 MiB).

# %%
# | export
"""Models from GGUF files (appendix A4; chapter 10 plans with `from_gguf`): a bounded reader of a GGUF header
(after ggml's `gguf_init_from_file`: every count and length checked against the bytes left in the file before
anything is read or allocated), then llama.cpp's checks of a LLaMA's metadata (`llm_load_hparams`) and tensors
(`llm_load_tensors`)."""

import json
import math
import mmap
import os
import stat
import struct
from dataclasses import dataclass
from typing import NoReturn

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
# `enum gguf_type`: code -> (name, struct format of one item); a STRING starts with its uint64 length, an ARRAY
# with its uint32 item type (its items have the format of that type: the array's own is empty)
GGUF_TYPES: dict[int, tuple[str, str]] = {
    0: ("uint8", "B"), 1: ("int8", "b"), 2: ("uint16", "H"), 3: ("int16", "h"), 4: ("uint32", "I"), 5: ("int32", "i"),
    6: ("float32", "f"), 7: ("bool", "B"), 8: ("string", "Q"), 9: ("array", ""), 10: ("uint64", "Q"),
    11: ("int64", "q"), 12: ("float64", "d")}


# %% [markdown]
# Three records hold what is read: a value with its GGUF type (an array keeps its numbers as one numpy
# array, and of its strings only their count), a tensor info, and the header with where its data starts.

# %%
# | export
@dataclass
class GGUFValue:
    """A metadata value: its GGUF type name, and the value (int, float, bool or str; for an array, the item
    type, the length and the items as a numpy array -- None for strings, which are checked and skipped)."""

    type: str
    value: object
    item_type: str | None = None
    count: int | None = None

    def describe(self) -> str:
        """The value as a message shows it: its type, and the value cut to 80 characters."""
        if self.type == "array":
            return f"an array of {self.count} {self.item_type}"
        text = repr(self.value)
        article = "an" if self.type.startswith("i") else "a"  # an int32, a uint32
        return f"{article} {self.type} ({text if len(text) <= 80 else text[:77] + '...'})"


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
    kv: dict[str, GGUFValue]
    tensors: list[GGUFTensorInfo]
    alignment: int
    data_offset: int
    file_size: int

    @property
    def header_only(self) -> bool:
        """The file ends at or before the data section's start: only its header was copied."""
        return self.file_size <= self.data_offset


# %% [markdown]
# ## 2 · A reader that counts before it reads
#
# The reader walks the file's bytes through a cursor whose every read first checks that the bytes are
# there, and names the field it was reading — as a path (`kv["llama.block_count"].value`,
# `tensors[7].ne[1]`) — when they are not.

# %%
# | export
class _Cursor:
    """The file's bytes and a position; reads little-endian fields, each checked against the bytes left."""

    def __init__(self, data, path: str):
        self.data, self.pos, self.path, self.items, self.kept = data, 0, path, 0, 0

    def fail(self, field: str, message: str) -> NoReturn:
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
# | export
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
# | export
def _read_tensor_info(cur: _Cursor, i: int, alignment: int, seen: dict[str, int]) -> GGUFTensorInfo:
    """One `gguf_tensor_info`, checked (`gguf_tensor_info_sanitize`); `seen` maps names read to their index."""
    field = f"tensors[{i}]"
    text = cur.text(f"{field}.name", GGML_MAX_NAME - 1)
    name = text or "(empty name)"
    if text in seen:
        cur.fail(f"{field}.name", f"duplicated tensor name {text!r} (also tensors[{seen[text]}])")
    seen[text] = i
    n_dims = cur.scalar("I", f"{field}.n_dims", "a dimension count")
    if n_dims > GGML_MAX_DIMS:
        cur.fail(f"{field}.n_dims", f"{name}: expected at most {GGML_MAX_DIMS} dimensions (GGML_MAX_DIMS), "
                                    f"found {n_dims}")
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
# | export
def read_gguf_header(path) -> GGUFHeader:
    """`gguf_init_from_file` (ggml.c) with `no_alloc`: the header of the GGUF file at `path`, every field
    checked before it is used; a `ModelError` naming the file, the field, what was expected and found."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ModelError(f"{path}: not a regular file (a GGUF model file expected)")
        with open(path, "rb") as f:
            if not os.fstat(f.fileno()).st_size:  # (mmap cannot map an empty file)
                return _read_header(_Cursor(b"", str(path)))
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _read_header(_Cursor(data, str(path)))
    except OSError as e:
        raise ModelError(f"{path}: cannot read the file ({e.strerror or e})") from None


def _read_header(cur: _Cursor) -> GGUFHeader:
    """The header's fields in the file's order, each checked before the next is read."""
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
    kv: dict[str, GGUFValue] = {}
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
    alignment = align.value if align.type == "uint32" else None
    if not isinstance(alignment, int) or not alignment or alignment & (alignment - 1):
        cur.fail('kv["general.alignment"]', f"expected a uint32 power of two, found {align.describe()}")
    seen: dict[str, int] = {}
    tensors = [_read_tensor_info(cur, i, alignment, seen) for i in range(n_tensors)]
    return GGUFHeader(cur.path, version, kv, tensors, alignment, GGML_PAD(cur.pos, alignment), len(cur.data))


# %% [markdown]
# The smallest hostile file: a version-3 header of no tensors and one key, whose value is an array of
# 2^40 strings, and nothing after it — 51 bytes. Each string takes at least its 8-byte length, so the
# array needs 8 TiB; the file has 0 bytes left, and the reader says so before it reads one item.

# %%
# NBVAL_CHECK_OUTPUT
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

hostile = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 3) + b"key" + struct.pack("<IIQ", 9, 8, 2**40)
path = Path(tempfile.mkdtemp()) / "hostile.gguf"
path.write_bytes(hostile)
try:
    read_gguf_header(path)
except ModelError as e:
    hostile_refusal = str(e).replace(str(path), "hostile.gguf")
print(len(hostile), "bytes:", hostile_refusal)


# %% [markdown]
# ## 3 · Where each tensor's bytes lie
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
# | export
def check_tensor_data(h: GGUFHeader) -> None:
    """`llama_model_loader::llama_tensor_weight`'s bounds check, tensor by tensor in the file's order: the
    `ggml_nbytes` bytes from `data_offset + offset` end by 2^63 - 1 (`INT64_MAX`, the largest file) and,
    unless the file is header only, by the file's end; a `ModelError` naming the tensor otherwise."""
    for i, t in enumerate(h.tensors):
        ty = TYPES_BY_CODE[t.type_code]
        nbytes = math.prod(t.ne) // ty.blck_size * ty.type_size  # ggml_nbytes (ne[0] is whole blocks)
        start = h.data_offset + t.offset
        end = start + nbytes
        where = (f"{h.path}: tensors[{i}].offset: {t.name or '(empty name)'}: {nbytes} bytes at offset {t.offset} "
                 f"of the data")
        llama = (f"(llama.cpp: tensor '{t.name[:63]}' data is not within the file bounds, model is corrupted or "
                 f"incomplete)")
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
# ## 4 · llama.cpp's checks of a LLaMA
#
# `llm_load_hparams` reads each hyperparameter with `get_key`, which refuses a value whose GGUF type is
# not exactly the field's (`key … has wrong type … but expected type …`): `llama.block_count` is a
# `uint32` — not a string, a float or an `int32`. The head counts and the feed-forward width go through
# `get_key_or_arr`: one `uint32`, or an `int32` array of one value per layer, after checking that there
# are at most `LLAMA_MAX_LAYERS` layers. This port's LLaMA has alike layers, so per-layer values must be
# equal. llama.cpp requires `n_rot` to be the head size for a LLaMA; the RMS epsilon and the training
# context are required; the vocabulary is `llama.vocab_size` or the length of the tokenizer's list.

# %%
# | export
def _key(h: GGUFHeader, key: str, want: str, required: bool = True, default=None):
    """`llama_model_loader::get_key` (`GGUFMeta::GKV::get_kv`): the value of `key`, of GGUF type `want` exactly."""
    v = h.kv.get(key)
    if v is None:
        if required:
            raise ModelError(f"{h.path}: kv[{json.dumps(key)}]: missing (llama.cpp requires it: key not found in "
                             f"model)")
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
    values = sorted(set(np.asarray(v.value).tolist()))
    if len(values) != 1:
        raise ModelError(f"{field}: the layers' values differ ({values[:6]}); this port plans LLaMAs whose layers "
                         f"are alike")
    return values[0]


# %%
# | export
HPARAM_KEYS = {"n_vocab": "llama.vocab_size", "n_embd": "llama.embedding_length", "n_layer": "llama.block_count",
               "n_head": "llama.attention.head_count", "n_head_kv": "llama.attention.head_count_kv",
               "n_ff": "llama.feed_forward_length", "rms_norm_eps": "llama.attention.layer_norm_rms_epsilon",
               "rope_freq_base": "llama.rope.freq_base", "n_ctx_train": "llama.context_length",
               "n_rot": "llama.rope.dimension_count", "n_expert": "llama.expert_count",
               "n_expert_used": "llama.expert_used_count",
               "n_embd_head": "llama.attention.key_length"}  # LlamaParams' fields and the GGUF keys they come from


def llama_hparams(h: GGUFHeader, wtype: str = "f16") -> LlamaParams:
    """`llm_load_hparams` for `LLM_ARCH_LLAMA`: the hyperparameters, each of its exact GGUF type; a
    head size or `n_rot` this port's LLaMA does not have is refused. A mixture of experts has
    `llama.expert_count` and `llama.expert_used_count` (both optional, 0 without experts)."""
    arch = _key(h, "general.architecture", "string")
    if arch != "llama":
        raise ModelError(f"{h.path}: a {arch[:80]!r} model; this report plans llama models only")
    n_layer = _key(h, "llama.block_count", "uint32")
    if not 1 <= n_layer <= LLAMA_MAX_LAYERS:
        raise ModelError(f'{h.path}: kv["llama.block_count"]: expected 1 to {LLAMA_MAX_LAYERS} layers '
                         f"(LLAMA_MAX_LAYERS), found {n_layer}")
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
            n_ctx_train=_key(h, "llama.context_length", "uint32"), wtype=wtype,
            n_expert=_key(h, "llama.expert_count", "uint32", False, 0),
            n_expert_used=_key(h, "llama.expert_used_count", "uint32", False, 0),
            n_embd_head=_key(h, "llama.attention.key_length", "uint32", False, None))  # (None: n_embd // n_head)
    except ModelError as e:
        if str(e).startswith(h.path):
            raise
        field = str(e).removeprefix("LlamaParams: ").split(" ")[0].rstrip(":")
        key = f"kv[{json.dumps(HPARAM_KEYS[field])}]: " if field in HPARAM_KEYS else ""
        raise ModelError(f"{h.path}: {key}the header's hyperparameters make no model: {e}") from None
    for key, default in (("llama.attention.value_length", p.n_embd // p.n_head),  # (key_length is the head size)
                         ("llama.rope.dimension_count", p.n_embd_head)):
        got = _key(h, key, "uint32", False, None)  # llama.cpp: "invalid n_rot: %u, expected %u"; a V head of its
        if (default if got is None else got) != p.n_embd_head:  # own it plans, this port does not
            raise ModelError(f"{h.path}: kv[{json.dumps(key)}]: expected the head size (attention.key_length, else "
                             f"n_embd / n_head) = {p.n_embd_head}, found "
                             + (f"{got}" if got is not None else f"none, which means n_embd / n_head = {default}"))
    return p


# %% [markdown]
# `llm_load_tensors` then creates every tensor a LLaMA has and checks each against the file: present
# (`tensor '…' not found`), of the shape the hyperparameters give (`check_tensor_dims`: trailing
# dimensions of 1 allowed), and no tensor left over (`done_getting_tensors`: `wrong number of
# tensors`). `output.weight` may be absent: the output then reuses `token_embd` (tied embeddings).
# `rope_freqs.weight` may be present (Llama 3.1): `n_rot / 2` f32 frequency factors for RoPE.
# Weights of an integer type are refused: no ggml matrix product takes them.

# %%
# | export
def llama_tensor_shapes(p: LlamaParams) -> dict:
    """{name: ne} of the tensors `llm_load_tensors` creates for `LLM_ARCH_LLAMA` without biases: dense, or
    with experts the router `ffn_gate_inp` and the experts' merged 3-d matrices `ffn_*_exps`."""
    gqa, n_q, n_x = p.n_embd_head * p.n_head_kv, p.n_embd_head * p.n_head, p.n_expert
    layer = {"attn_norm": [p.n_embd], "attn_q": [p.n_embd, n_q], "attn_k": [p.n_embd, gqa],
             "attn_v": [p.n_embd, gqa], "attn_output": [n_q, p.n_embd], "ffn_norm": [p.n_embd]}
    layer.update({"ffn_gate_inp": [p.n_embd, n_x], "ffn_gate_exps": [p.n_embd, p.n_ff, n_x],
                  "ffn_down_exps": [p.n_ff, p.n_embd, n_x], "ffn_up_exps": [p.n_embd, p.n_ff, n_x]} if n_x else
                 {"ffn_gate": [p.n_embd, p.n_ff], "ffn_down": [p.n_ff, p.n_embd], "ffn_up": [p.n_embd, p.n_ff]})
    shapes = {"token_embd.weight": [p.n_embd, p.n_vocab], "output_norm.weight": [p.n_embd],
              "output.weight": [p.n_embd, p.n_vocab]}
    shapes.update({f"blk.{il}.{name}.weight": ne for il in range(p.n_layer) for name, ne in layer.items()})
    return shapes


# %%
# | export
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
        i = index["rope_freqs.weight"]
        if h.tensors[i].type_code != 0:
            raise ModelError(f"{h.path}: tensors[{i}] rope_freqs.weight: expected f32 (ggml_rope's frequency "
                             f"factors), found {TYPES_BY_CODE[h.tensors[i].type_code].name}")
    types = {}
    for name, ne in want.items():
        if name not in index:
            old = p.n_expert and name.endswith("_exps.weight") and name.replace("_exps.", ".0.") in index
            raise ModelError(f"{h.path}: missing {name} (llama.cpp: tensor '{name}' not found; the header's "
                             f"{p.n_layer} layers need {len(want)} tensors)" + (
                                 "; this file stores each expert in a tensor of its own, the older layout llama.cpp "
                                 "merges by copying, which this port does not plan" if old else ""))
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
        kind = f"LLaMA with {p.n_expert} experts" if p.n_expert else "dense LLaMA"
        raise ModelError(f"{h.path}: tensors[{index[extra[0]]}] {extra[0]}: a tensor a {kind} of {p.n_layer} "
                         f"layers does not have (llama.cpp: wrong number of tensors; expected {len(want)}, got "
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
    data_offset: int | None = None
    file_size: int | None = None
    offsets: dict | None = None  # {name: where its data starts in the data section}: what llama.cpp maps


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
                     h.file_size, {t.name: t.offset for t in h.tensors})


# %% [markdown]
# ## 5 · A tiny LLaMA's header, whole, hostile and short
#
# A tiny LLaMA's header, written with the `gguf` package's writer: one layer, 12 tensors, a few keys and a
# tokenizer list of 64 strings, and no data at all. `from_gguf` reads back the hyperparameters it was
# written from (the RMS epsilon as the `float32` the file holds). Then the same bytes with the list's
# length overwritten by 2^40: refused at once, by the field and the sizes.

# %%
# NBVAL_CHECK_OUTPUT
import gguf  # noqa: E402


def write_tiny(path, layers_as: str = "uint32") -> None:
    """The tiny LLaMA's header at `path` (`llama.block_count` written as a `layers_as`)."""
    w = gguf.GGUFWriter(str(path), "llama")
    getattr(w, f"add_{layers_as}")("llama.block_count", 1)
    for key, value in (("embedding_length", 64), ("feed_forward_length", 96), ("context_length", 256),
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


tiny = LlamaParams(n_vocab=64, n_embd=64, n_layer=1, n_head=4, n_head_kv=2, n_ff=96, n_ctx_train=256, wtype="f32")
path = Path(tempfile.mkdtemp()) / "tiny.gguf"
write_tiny(path)
read_back = from_gguf(path).params == LlamaParams(**{**tiny.__dict__, "rms_norm_eps": float(np.float32(1e-5))})
print(f"{path.stat().st_size} bytes:", read_back)
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

path.write_bytes(header)
h = read_gguf_header(path)
print(f"{h.file_size} bytes, the data from byte {h.data_offset}: header only", from_gguf(path).header_only)
end = max(h.data_offset + t.offset + 4 * math.prod(t.ne) for t in h.tensors)  # (all f32)
holes = []
for size in (end, end - 1):
    os.truncate(path, size)  # a hole: nothing is written
    try:
        holes.append(f"{size} bytes: header only {from_gguf(path).header_only}")
    except ModelError as e:
        holes.append(str(e).replace(str(path), "tiny.gguf"))
    print(holes[-1])

# %% [markdown]
# A real file mixes types: a "Q4_K_M" model holds q4_K and q6_K matrices, and every file keeps its norms
# in f32. `from_gguf` gives each weight its own type (`tensor_types`), and chapter 10's builder creates
# every weight of its type. The tiny LLaMA once more, as a quantized file is written: its matrices q8_0
# (34 bytes per block of 32), its norms f32, the vocabulary given by `llama.vocab_size` instead of a
# tokenizer list, and no data.

# %%
# NBVAL_CHECK_OUTPUT
tiny_q8 = LlamaParams(n_vocab=64, n_embd=64, n_layer=1, n_head=4, n_head_kv=2, n_ff=96, n_ctx_train=256, wtype="q8_0")
path_q8 = Path(tempfile.mkdtemp()) / "tiny_q8.gguf"
w = gguf.GGUFWriter(str(path_q8), "llama")
for key, value in (("block_count", 1), ("embedding_length", 64), ("feed_forward_length", 96), ("context_length", 256),
                   ("attention.head_count", 4), ("attention.head_count_kv", 2), ("vocab_size", 64)):
    w.add_uint32(f"llama.{key}", value)
w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
for name, ne in llama_tensor_shapes(tiny_q8).items():
    if len(ne) == 1:  # the norms: f32
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), 4 * ne[0])
    else:  # the matrices: q8_0, 34 bytes per 32 elements (the writer takes a row's length in bytes)
        w.add_tensor_info(name, (*reversed(ne[1:]), ne[0] // 32 * 34), np.dtype(np.uint8), math.prod(ne) // 32 * 34,
                          raw_dtype=gguf.GGMLQuantizationType.Q8_0)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_ti_data_to_file()
w.close()
tiny_model = from_gguf(path_q8)
print(f"{path_q8.stat().st_size} bytes, header only: {tiny_model.header_only}")
print(tiny_model.params)
print({name: t.name for name, t in tiny_model.tensor_types.items() if name.startswith(("output", "blk.0.attn_"))})

# %% [markdown]
# 1,079 bytes, header only; the hyperparameters as written (`n_rot` the head size, 16; the epsilon as
# the `float32` the file holds), and each weight's own type: the matrices q8_0, the norms f32. The
# model's `wtype` is the type of `blk.0.attn_q.weight`, q8_0. Chapter 10's `plan_memory(...,
# tensor_types=...)` builds every weight of its type; `python -m ggml_lite llama --gguf FILE` does both.

# %% [markdown]
# Last, a file that is well formed but not what llama.cpp expects: the first tiny header with
# `llama.block_count` written as an `int32`. A reader of GGUF takes it; llama.cpp's `get_key` refuses
# it (`key llama.block_count has wrong type i32 but expected type u32`), and so does `from_gguf`.

# %%
# NBVAL_CHECK_OUTPUT
write_tiny(path, layers_as="int32")
try:
    from_gguf(path)
except ModelError as e:
    wrong_type = str(e).replace(str(path), "tiny.gguf")
print(wrong_type)

# %% [markdown]
# ## 6 · A picture: where a header's bytes go
#
# The tiny header's 1,792 bytes, walked again with the reader's own functions, one segment per part:
# the fixed start (magic, version, the two counts), each key/value pair, each tensor info, and the
# padding to the data section. Hover over a segment for its name and size. A real file looks the
# same at a larger scale: the tokenizer's lists take most of its header, the tensor infos the rest.

# %%
import plotly.graph_objects as go  # noqa: E402

cur = _Cursor(header, "tiny.gguf")
cur.pos = 24  # past the magic, the version and the two counts
parts = [("fixed", "magic, version, counts", 0, 24)]
for _ in h.kv:
    start = cur.pos
    key = cur.text("key", MAX_KEY_BYTES)
    _read_value(cur, cur.scalar("I", "type", "a value type"), key)
    parts.append(("tokenizer" if key.startswith("tokenizer.") else "metadata", key, start, cur.pos))
names: dict[str, int] = {}
for i in range(len(h.tensors)):
    start = cur.pos
    parts.append(("tensor infos", _read_tensor_info(cur, i, h.alignment, names).name, start, cur.pos))
parts.append(("padding", "padding to general.alignment", cur.pos, h.data_offset))
colors = {"fixed": "#7f7f7f", "metadata": "#636efa", "tokenizer": "#ffa15a", "tensor infos": "#00cc96",
          "padding": "#cccccc"}
fig = go.Figure()
for kind, name, start, end in parts:
    fig.add_trace(go.Bar(y=["tiny.gguf"], x=[end - start], base=[start], orientation="h", marker_color=colors[kind],
                         name=kind, legendgroup=kind, showlegend=not any(b.name == kind for b in fig.data),
                         hovertext=f"{name}: {end - start} bytes at {start}", hoverinfo="text"))
fig.update_layout(barmode="overlay", title="the tiny LLaMA's header, byte by byte", xaxis_title="byte offset",
                  height=220, margin=dict(l=80, r=20, t=50, b=40), legend=dict(orientation="h", y=-0.5))
fig

# %%
# NBVAL_CHECK_OUTPUT
by_kind = {kind: sum(end - start for k, _, start, end in parts if k == kind) for kind in colors}
print(by_kind, "=", sum(by_kind.values()), "bytes")

# %% [markdown]
# 24 fixed bytes, 334 of metadata (the architecture and the hyperparameters), 739 of the tokenizer's
# list of 64 short strings, 689 of the 12 tensor infos and 6 of padding to the 32-byte alignment:
# 1,792 bytes, where the data section starts. Every one of those bytes was checked before it was
# used; the 156,416 bytes of data after them are never read.

# %% [markdown]
# ## 7 · Check

# %%
assert "an array of 1099511627776 string items (8 bytes each at least) needs 8796093022208 bytes" in refusal
assert len(hostile) == 51 and "needs 8796093022208 bytes at offset 51, the file has 0 left" in hostile_refusal
assert read_back and h.header_only and (h.file_size, h.data_offset) == (1786, 1792)
assert holes[0] == "158208 bytes: header only False" and "blk.0.ffn_up.weight" in holes[1], holes
assert 'kv["llama.block_count"]: expected a uint32, found an int32' in wrong_type
assert tiny_model.header_only and tiny_model.params == LlamaParams(**{**tiny_q8.__dict__, "rms_norm_eps": float(np.float32(1e-5))})
assert tiny_model.tensor_types["blk.0.attn_q.weight"].name == "q8_0" and tiny_model.tensor_types["output_norm.weight"].name == "f32"
assert sum(by_kind.values()) == h.data_offset and parts[-1][2] == h.file_size
print("appendix A4: all checks passed")
