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
# # A1 · Graph files — reading and writing graphs recorded from the real ggml
#
# The project's promise is *byte-identical to ggml*. The evidence is a set of JSON files recorded from the real C
# library (`tests/fixtures/`, carried by the project): every tensor of a graph with its shape, strides, op, sources,
# view and flags, and what the allocator and scheduler did with it. This appendix turns them into graphs and back.
#
# **Learning goals**
#
# 1. The fixture schema: tensors by *id* (creation order across contexts), sources by id,
#    `expand_roots` to rebuild the graph.
# 2. Loading is *replaying*: every tensor is rebuilt by calling the same ggml_lite op that ggml
#    called, then checked against the record — so a file that loads is a file whose shapes,
#    strides, sizes and views ggml_lite reproduces.
# 3. A graph file is untrusted input: it is validated field by field before anything is built, and a
#    bad file fails early with an error that names the field by its JSON path (and the tensor): a wrong
#    type or range, NaN, an unknown op or type, a dangling source id, a cycle, a name used twice.
#
# Exported: `ggml_lite.untrusted` (reading JSON as untrusted input), `ggml_lite.schema` (the
# checks of a graph file) and `ggml_lite.graphio` (loading and writing). Running a file's recorded
# plan again and checking its recorded numerics is appendix A5.

# %% [markdown]
# ## 1 · The schema in one tensor
#
# One entry of `graph.tensors` (the full description is `tests/fixtures/ggml-seed/README.md`):
#
# ```json
# {"id": 4, "name": "v_rows4_12", "ctx": "compute", "graph_role": "node", "type": "f32",
#  "ne": [48, 8, 1, 1], "nb": [4, 192, 1536, 1536], "nbytes": 1536, "alloc_size": 1536,
#  "op": "VIEW", "op_params": [768], "src": [3], "src_names": ["h_silu"],
#  "view_src": 3, "view_src_name": "h_silu", "view_offs": 768, "flags": [], "flags_value": 0,
#  "preallocated": false, "buffer": "compute", "offset": 17120, "ext_offset": null}
# ```
#
# Three fields need care:
#
# * `name` gets `#id` appended when it is empty or shared by several tensors of the file;
#   `node_N`/`leaf_N` names were given by `ggml_build_forward_expand`, not by the user.
# * `op_params` drops trailing zero words; floats are bit-cast (`925353388` is `1e-5f`).
# * `ctx`, `preallocated`, `buffer`, `offset`, `ext_offset` (and the scheduler's `sched_*`) are
#   *results* or placement facts, not part of the tensor: they are kept as the tensor's record.

# %%
# | default_exp graphio

# %%
# | export
"""Graph files in the fixture schema (`tests/fixtures/ggml-seed/README.md`): load a recorded graph
into ggml_lite tensors by replaying ggml's op constructors (chapter 01's op table), check each tensor
against the record, and write a graph back — a loaded one, or one built with the ggml_lite API; place a
file's external buffers as the recorder did. A file is checked as data first (`ggml_lite.schema`, which
reads JSON through `ggml_lite.untrusted`)."""

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ggml_lite import ops
from ggml_lite.errors import GGMLLiteError, GraphFileError, RecordMismatchError
from ggml_lite.graph import GGML_DEFAULT_GRAPH_SIZE, Graph, build_forward_expand
from ggml_lite.schema import SCHEMAS, buffer_type_of, creation_order, entry_label, ggml_version, validate_document
from ggml_lite.tallocr import alloc_ctx_tensors
from ggml_lite.tensor import Context, Op, Tensor, TensorFlag, op_by_name, type_by_name
from ggml_lite.untrusted import quote, read_json

_AUTO_GRAPH_NAME = re.compile(r"(node|leaf)_\d+")

# %% [markdown]
# ## 2 · Validation before anything is built
#
# A graph file is untrusted input (DESIGN §3). It is checked as data first, field by field, so that a
# typo or a hostile edit gives a message instead of a traceback from deep inside an op, a wrong answer,
# or unbounded work. Every message names the field by its JSON path (`graph.tensors[12].op_params[0]`,
# `steps[3].graph.nodes[7]`), what was expected and what was found, and quotes a name or string by at
# most its first 60 characters and its length (`quote`), and a kind by its JSON name (`json_kind`:
# object, array, string, number, true/false, null). What is checked:
#
# * **the file and JSON itself**: a regular file of at most 32 MiB (a FIFO or a device is named, not
#   read); `NaN`/`Infinity` (which Python's parser would accept) are refused where they are read, and so
#   are a key given twice in one object and nesting too deep to parse;
# * **every tensor field** the schema lists is present and of its type: `id` equals the position (ids
#   are creation positions); integers are integers (not floats, booleans or strings) within ggml's
#   ranges — sizes, strides and offsets in `[0, 2^63)` (ggml's `int64_t`/`size_t`), `op_params` at most
#   16 words of int32; a tensor's bytes must fit in 2^63; names are strings and unique (the writer
#   appends `#id`, so `plan --json` can key by name); `flags` agrees with `flags_value`; an op has the
#   sources it needs (two for `MUL_MAT`, `ADD`, `GET_ROWS`, `ROPE`, …, one for the others);
# * **cross references**: sources and view sources name tensors of the file, `src_names` and
#   `view_src_name` name them too, `graph_role` agrees with the `nodes` and `leafs` lists, no tensor
#   depends on itself (a cycle — something ggml cannot even create);
# * **the document**: `schema_version` 1, the `buffer_type` (a CPU-like type: alignment a power of two,
#   `max_size`; the planner uses exactly that type), `external_buffers`, a non-empty `steps` list, and —
#   for `check` — every recorded result it compares; an optional `ggml_version`, three integers ("0.15.3"):
#   from 0.10.1 on, the file is planned with chapter 12's allocator, and A5 checks its chunk fields.
#
# After loading, the rebuilt tensor must also agree with its record (`type`, `ne`, `nb`, `nbytes`, …,
# §3), so a file that loads is a file ggml_lite reproduces.

# %% [markdown]
# The checks come in two modules. `ggml_lite.untrusted` knows JSON and nothing about graphs: how to
# read a file as data, and how to say that the value at a path is not what was expected. Every reader
# of the project uses it — this appendix, the `numerics` block of appendix A5, the scheduler scenarios
# of A3 — so that all of them refuse the same things with messages of the same shape. The first
# helpers turn a value into words: `quote` cuts a long string, `found` names a value's JSON kind
# (a float where an integer belongs is "the number 6.0, not an integer"), and `check_int`,
# `check_size`, `check_type` and `check_list` raise with the path when a value does not fit.

# %%
# | export untrusted
"""Untrusted JSON input (DESIGN §3), for every reader of the project — graph files, numerics blocks,
scheduler scenarios: a file read as data within bounds, parsed without NaN, Infinity, repeated keys or
unbounded nesting, and checks that name a field by its JSON path and say what was expected and what
was found."""

import json
import math
import os
import stat
import sys

from ggml_lite.errors import GraphFileError, InvalidSizeError

INT64_MAX = 2**63 - 1
INT32_RANGE = (-(2**31), 2**31 - 1)


def _bound(x: int) -> str:
    return {INT64_MAX: "2^63-1", INT32_RANGE[0]: "-2^31", INT32_RANGE[1]: "2^31-1"}.get(x, str(x))


MAX_QUOTE = 60  # the characters of a name or string a message quotes (a 100,000-character name made 100 KB lines)


def quote(s, most: int = MAX_QUOTE) -> str:
    """A name or string as every message quotes it: in full up to `most` characters, else its first `most`
    and its length (`'blk.0.…'... (100,000 chars)`)."""
    if not isinstance(s, str):  # (a number, a list...: its repr, cut the same way)
        r = repr(s)
        return r if len(r) <= most else f"{r[:most]}... ({len(r):,} chars)"
    return repr(s) if len(s) <= most else f"{s[:most]!r}... ({len(s):,} chars)"


def json_kind(v) -> str:
    """The JSON name of a parsed value's kind: object, array, string, number, true/false or null."""
    if v is None or isinstance(v, bool):
        return "null" if v is None else "true/false"
    return ("number" if isinstance(v, (int, float)) else "string" if isinstance(v, str) else
            "array" if isinstance(v, list) else "object" if isinstance(v, dict) else "value of no JSON kind")


def found(v) -> str:
    """A JSON value as an error message names it: its kind and (a prefix of) its value."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"the boolean {str(v).lower()}"
    if isinstance(v, int):
        bits = f"about {'-' if v < 0 else ''}2^{abs(v).bit_length() - 1}"
        return str(v) if abs(v) < 2**53 else f"{v} ({bits})" if abs(v) < 2**128 else f"an integer of {bits}"
    if isinstance(v, float):
        return f"the number {v!r}, not an integer" if v == int(v) else f"the number {v!r}"
    if isinstance(v, str):
        return f"the string {quote(v)}" + ("" if _is_text(v) else " (not Unicode text)")
    if isinstance(v, list):
        return f"a list of {len(v)} item(s)"
    return "an object" if isinstance(v, dict) else f"a {json_kind(v)}"

# %%
# | export untrusted
def fail(path: str, expected: str, v, cls=GraphFileError):
    """Raise `cls` naming the field `path`, what was `expected` and what was found."""
    raise cls(f"{path}: expected {expected}, found {found(v)}")


def check_int(v, path: str, lo: int = 0, hi: int = INT64_MAX, cls=GraphFileError) -> int:
    """`v` must be a JSON integer in `[lo, hi]` (a float, boolean or string is refused)."""
    if not isinstance(v, int) or isinstance(v, bool):
        fail(path, f"an integer in [{_bound(lo)}, {_bound(hi)}]", v)
    if not lo <= v <= hi:
        fail(path, f"an integer in [{_bound(lo)}, {_bound(hi)}]", v, cls)
    return v


def check_size(v, path: str, nullable: bool = False):
    """A byte count, stride or offset: an integer in `[0, 2^63)`; a negative one is an `InvalidSizeError`."""
    return None if v is None and nullable else check_int(v, path, 0, INT64_MAX, InvalidSizeError)


def _is_text(s: str) -> bool:
    """Whether a JSON string is Unicode text (JSON's `\\ud800` escapes can make lone surrogates, which
    cannot be printed or written)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_type(v, path: str, kind, what: str, nullable: bool = False):
    """`v` must be of JSON kind `kind` (str, bool, list, dict), or null when `nullable`; a string must be
    Unicode text."""
    if (v is None and nullable) or (isinstance(v, kind) and not (kind is int and isinstance(v, bool))
                                    and not (kind is str and not _is_text(v))):
        return v
    fail(path, what + (" or null" if nullable else ""), v)


def need(d: dict, key: str, path: str):
    """`d[key]`, or `GraphFileError` saying that the field at `path` is missing."""
    if key not in d:
        raise GraphFileError(f"{path}: missing")
    return d[key]


def check_list(v, path: str, most: int | None = None, length: int | None = None) -> list:
    check_type(v, path, list, "a list")
    if length is not None and len(v) != length:
        fail(path, f"a list of {length} items", v)
    if most is not None and len(v) > most:
        fail(path, f"a list of at most {most} items", v)
    return v

# %% [markdown]
# Parsing comes first, and every JSON input of the project (graph files, numerics blocks, scheduler
# scenarios) goes through this one reader. Python's `json` accepts `NaN`, `Infinity` and `-Infinity`,
# which JSON does not have, and reads `1e400` as infinity; each is refused with the path where it
# stands. It also lets a repeated key win silently (`"schema_version": 99, "schema_version": 1` reads as
# 1), so a second value of a key is refused with the path of its object. A document nested deeper than
# the parser can follow (`[[[[…` 100,000 deep) is refused too, instead of ending in a `RecursionError`,
# and so is an integer of more digits than Python converts (4,300).
#
# Before a byte is read, the file is looked at with `os.stat`: a directory, a character device
# (`/dev/zero`), a FIFO (which would block the reader) or a socket is named as what it is, and a file larger
# than `MAX_JSON_BYTES`, 32 MiB, is refused. The largest legitimate file is far smaller: the 80-layer LLaMA
# graph that `graph_document` writes is 1.5 MB (2,566 nodes; the 7B fixtures are 0.7 MB), the 10,000-output
# fan-out of `benchmarks/budget.py` 4.2 MB. And 32 MiB keeps the whole command within about 0.9 GB even for
# the documents that cost the most per byte (`[{"a":0},…]`, `[{},…]`, `[[],…]`: a dict or list of 56 to 64
# bytes for every 3 to 8 bytes of text; measured: a peak of 0.90 to 0.94 GB, refused as no graph file after
# 2 to 4 s), where a 1.5 GB file took 3.1 GB and 12 s and a 2.2 GB one ran out of memory.

# %%
# | export untrusted
MAX_JSON_BYTES = 32 * 2**20  # 20x the 80-layer LLaMA's 1.5 MB; at most ~0.9 GB to parse, whatever the text


class _NonFinite:
    """What the parser puts where the text says NaN or Infinity, to be found and reported."""

    def __init__(self, text: str):
        self.text = text


class _Repeated(dict):
    """What the parser makes of an object whose text gives a key twice (`repeated`: that key)."""

    repeated = None


def _object(pairs: list) -> dict:
    d = dict(pairs)
    if len(d) == len(pairs):
        return d
    seen: dict = {}
    out = _Repeated(d)
    out.repeated = next(k for i, (k, _) in enumerate(pairs) if seen.setdefault(k, i) != i)
    return out


def _find(doc, bad):
    """(path, value) of the first value of a parsed document for which `bad` holds (iterative: depth is
    unbounded; keys in the path cut to MAX_QUOTE characters)."""
    stack = [("", doc)]
    while stack:
        path, v = stack.pop()
        if bad(v):
            return path or "the top level", v
        if isinstance(v, dict):
            stack.extend((f"{path}.{k[:MAX_QUOTE]}" if path else k[:MAX_QUOTE], x) for k, x in reversed([*v.items()]))
        elif isinstance(v, list):
            stack.extend((f"{path}[{k}]", x) for k, x in reversed(list(enumerate(v))))
    return None


def parse_json(text: str, where: str = "the document"):
    """Parse JSON text as untrusted input: `GraphFileError` (naming `where`) for text that is not JSON,
    a NaN or Infinity literal (with its path), a key given twice in one object (with the object's path)
    and nesting too deep to parse."""
    seen, repeated = [], []

    def constant(name):
        seen.append(name)
        return _NonFinite(name)

    def number(text):
        x = float(text)
        return x if math.isfinite(x) else constant(text)

    def pairs(items):
        d = _object(items)
        if isinstance(d, _Repeated):
            repeated.append(d)
        return d

    try:
        doc = json.loads(text, parse_constant=constant, parse_float=number, object_pairs_hook=pairs)
    except json.JSONDecodeError as e:
        raise GraphFileError(f"{where}: not JSON ({e})") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise GraphFileError(f"{where}: not JSON that can be read ({e})") from None
    except RecursionError:
        raise GraphFileError(f"{where}: JSON nested too deeply to read (more than about "
                             f"{sys.getrecursionlimit()} levels)") from None
    if seen:
        path, v = _find(doc, lambda v: isinstance(v, _NonFinite))
        raise GraphFileError(f"{where}: {path}: expected a finite number, found {v.text[:40]} "
                             "(JSON has no NaN or Infinity)")
    if repeated:
        path, v = _find(doc, lambda v: isinstance(v, _Repeated))
        raise GraphFileError(f"{where}: {path}: expected each key once in an object, found the key "
                             f"{quote(v.repeated)} more than once (which value counts would be a guess)")
    return doc

# %%
# | export untrusted
_NOT_REGULAR = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                (stat.S_ISFIFO, "a FIFO, a named pipe"), (stat.S_ISSOCK, "a socket"))


def _regular(st: os.stat_result, path) -> None:
    """Refuse what `st` says is not a regular file of at most MAX_JSON_BYTES, naming what it is."""
    if stat.S_ISDIR(st.st_mode):
        raise GraphFileError(f"{path} is a directory; give one JSON file (e.g. {str(path).rstrip('/')}/NAME.json)")
    if not stat.S_ISREG(st.st_mode):
        what = next((name for test, name in _NOT_REGULAR if test(st.st_mode)), "not a file")
        raise GraphFileError(f"{path}: not a regular file ({what}); give a JSON file")
    if st.st_size > MAX_JSON_BYTES:
        raise GraphFileError(f"{path}: expected a JSON file of at most {MAX_JSON_BYTES // 2**20} MiB, found "
                             f"{st.st_size:,} bytes (the largest graph ggml_lite writes, an 80-layer LLaMA, is "
                             f"1.5 MB; the limit keeps parsing within about 0.9 GB of memory)")


def read_json(path) -> dict:
    """The JSON object in the file at `path`, read as untrusted input (`parse_json`); `GraphFileError`
    says why it cannot be one. The file is looked at (`os.stat`) before it is opened, and opened without
    blocking: a FIFO, a device or a file above MAX_JSON_BYTES is refused before a byte is read."""
    try:
        _regular(os.stat(path), path)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (FileNotFoundError, NotADirectoryError):
        hint = " (standard input is not read: give a file)" if str(path) == "-" else ""
        raise GraphFileError(f"{path}: no such file{hint}") from None
    except OSError as e:
        raise GraphFileError(f"{path}: cannot be read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        _regular(os.fstat(f.fileno()), path)  # (the file opened is the file looked at)
        try:
            data = f.read(MAX_JSON_BYTES + 1)
        except OSError as e:  # (/proc/self/mem is a regular file that cannot be read)
            raise GraphFileError(f"{path}: cannot be read ({e.strerror or e})") from None
    if len(data) > MAX_JSON_BYTES:  # (it grew since)
        _regular(os.stat_result((stat.S_IFREG, 0, 0, 0, 0, 0, len(data), 0, 0, 0)), path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise GraphFileError(f"{path}: not a text file (JSON expected, in UTF-8)") from None
    doc = parse_json(text, str(path))
    if not isinstance(doc, dict):
        raise GraphFileError(f"{path}: the top level is a JSON {json_kind(doc)}, expected an object (a graph file "
                             "or a scheduler scenario)")
    return doc

# %% [markdown]
# `ggml_lite.schema` holds what is particular to graph files: the fields of a tensor entry, the graph
# section around them, and the document around the graphs, each checked with the helpers above. Its
# entry point is `validate_document`; the loader of §3 calls it before it builds a single tensor.
#
# One tensor entry, field by field. The types and ops must be known to ggml_lite; a quantized
# tensor's rows must hold whole blocks; and the bytes a tensor spans must fit in ggml's `int64_t`.

# %%
# | export schema
"""The graph file's schema (`tests/fixtures/ggml-seed/README.md`), checked as data before anything is
built: each tensor entry, the names, node and leaf lists and references of a graph section, the buffer
type, the external buffers and the recorded results. The entry point is `validate_document`."""

import heapq
import re

from ggml_lite import ops
from ggml_lite.buffer import HEAP, TENSOR_ALIGNMENT, Buffer, BufferType, CPUBufferType, cpu_buffer_type
from ggml_lite.errors import DanglingSourceError, GraphCycleError, GraphFileError, InvalidSizeError, UnknownOpError
from ggml_lite.tensor import GGML_MAX_OP_PARAMS, GGML_MAX_SRC, Op, TensorFlag, UnaryOp, op_by_name, type_by_name
from ggml_lite.untrusted import INT32_RANGE, INT64_MAX, check_int, check_list, check_size, check_type, fail, need, quote

SCHEMAS = ("ggml-gallocr-fixture", "ggml-sched-fixture")
MAX_ALIGNMENT = 2**20  # the largest buffer-type alignment accepted (ggml's are 32..256)
CALLS = {"ggml_gallocr_reserve": "reserve", "ggml_gallocr_alloc_graph": "alloc_graph"}  # a step's call -> GAllocr's
TENSOR_FIELDS = ("id", "name", "ctx", "graph_role", "type", "ne", "nb", "nbytes", "alloc_size", "op", "op_params",
                 "src", "src_names", "view_src", "view_src_name", "view_offs", "flags", "flags_value",
                 "preallocated", "buffer", "offset", "ext_offset")
REQUIRED_FIELDS = TENSOR_FIELDS  # (and `unary_op` for a UNARY tensor)
ROLES = ("node", "leaf", "none")
_FLAG_BITS = {"INPUT": int(TensorFlag.INPUT), "OUTPUT": int(TensorFlag.OUTPUT), "PARAM": int(TensorFlag.PARAM),
              "LOSS": 8, "COMPUTE": 16}  # ggml 0.10.1+ sets these two too: read, and dropped (no planner reads them)


def entry_label(e: dict) -> str:
    """A tensor entry as every message names it: `tensor #id 'name'`."""
    name = e.get("name")
    return f"tensor #{str(e.get('id'))[:20]} " + (quote(name) if isinstance(name, str) else "(no name)")


def _check_layout(e: dict, p: str) -> None:
    """`type`, `ne`, `nb`: known type, four sizes each, whole blocks, a span below 2^63 bytes."""
    try:
        tp = type_by_name(check_type(e["type"], f"{p}.type", str, "a type name"))
    except KeyError as err:
        raise type(err)(f"{p}.type: {entry_label(e)}: {err}") from None
    for f in ("ne", "nb"):
        for k, x in enumerate(check_list(e[f], f"{p}.{f}", length=4)):
            check_size(x, f"{p}.{f}[{k}]")
    ne, nb = e["ne"], e["nb"]
    if ne[0] % tp.blck_size:
        fail(f"{p}.ne[0]", f"a multiple of {tp.blck_size} (the block size of {tp.name})", ne[0])
    span = tp.type_size * (ne[0] // tp.blck_size) * ne[1] * ne[2] * ne[3]
    reach = sum((n - 1) * s for n, s in zip(ne, nb) if n > 0)
    if max(span, reach) > INT64_MAX:
        raise InvalidSizeError(f"{p}.ne: expected a shape whose bytes ggml's int64 can count (below 2^63), found "
                               f"ne {ne} (nb {nb}), about 2^{max(span, reach).bit_length() - 1} bytes "
                               f"({entry_label(e)})")

# %%
# | export schema
def _check_entry(e: dict, i: int, n: int, p: str) -> None:
    """Every field of the entry at position `i` of `n` (JSON path `p`): presence, type, range, ids."""
    for f in TENSOR_FIELDS + (("unary_op",) if e.get("op") == "UNARY" else ()):
        if f not in e:
            raise GraphFileError(f"{p}.{f}: missing ({entry_label(e)}; every tensor entry has the fields of "
                                 f"tests/fixtures/ggml-seed/README.md)")
    if check_int(e["id"], f"{p}.id") != i:
        raise GraphFileError(f"{p}.id: {entry_label(e)} is at position {i}: ids must be 0..n-1 in creation order")
    check_type(e["name"], f"{p}.name", str, "a string")
    check_type(e["ctx"], f"{p}.ctx", str, "a context label (a string)")
    if e["graph_role"] not in ROLES:
        fail(f"{p}.graph_role", f"one of {ROLES}", e["graph_role"])
    _check_layout(e, p)
    for f in ("nbytes", "alloc_size", "view_offs"):
        check_size(e[f], f"{p}.{f}")
    try:
        op = op_by_name(check_type(e["op"], f"{p}.op", str, "an op name"))
    except KeyError as err:
        raise type(err)(f"{p}.op: {entry_label(e)}: {err}") from None
    if "unary_op" in e:
        if op is not Op.UNARY:
            fail(f"{p}.unary_op", "no unary_op on a tensor whose op is not UNARY", e["unary_op"])
        if check_type(e["unary_op"], f"{p}.unary_op", str, "a unary op name") not in UnaryOp.__members__:
            fail(f"{p}.unary_op", "a unary op name of ggml", e["unary_op"], UnknownOpError)
    for k, w in enumerate(check_list(e["op_params"], f"{p}.op_params", most=GGML_MAX_OP_PARAMS // 4)):
        check_int(w, f"{p}.op_params[{k}]", *INT32_RANGE)
    if op is Op.UNARY:  # the unary op is op_params[0]
        w = e["op_params"][0] if e["op_params"] else 0
        if w not in UnaryOp._value2member_map_:
            fail(f"{p}.op_params[0]", f"a unary op code of ggml (0..{max(UnaryOp)})", w)
        if e["unary_op"] != UnaryOp(w).name:
            fail(f"{p}.unary_op", f"{UnaryOp(w).name!r}, the unary op of op_params[0] = {w}", e["unary_op"])
    for k, ref in enumerate(check_list(e["src"], f"{p}.src", most=GGML_MAX_SRC)):
        _check_ref(ref, f"{p}.src[{k}]", n)
        if (ref == i) != (k == 1 and op is Op.CPY and e["view_src"] is None):  # ggml_cast's src[1] is itself
            fail(f"{p}.src[{k}]", f"{i}, itself (ggml_cast: a CPY without view_src)" if ref != i else "not itself", ref)
    needed = 0 if op is Op.NONE else ops.OPS[op].n_required  # (SOFT_MAX's mask, ROPE's freq factors may be null)
    for k in range(needed):  # (an op rebuilt from a missing source ended in "'NoneType' object has no attribute")
        if k >= len(e["src"]) or e["src"][k] is None:
            fail(f"{p}.src[{k}]", f"the id of a tensor ({op.name} takes {needed} source(s); {entry_label(e)})",
                 e["src"][k] if k < len(e["src"]) else None)
    _check_ref(e["view_src"], f"{p}.view_src", n)
    check_list(e["src_names"], f"{p}.src_names", length=len(e["src"]))
    bits = 0
    for k, flag in enumerate(check_list(e["flags"], f"{p}.flags", most=len(_FLAG_BITS))):
        if not isinstance(flag, str) or flag not in _FLAG_BITS or bits & _FLAG_BITS[flag]:
            fail(f"{p}.flags[{k}]", f"one of {tuple(_FLAG_BITS)}, each once", flag)
        bits |= _FLAG_BITS[flag]
    if (check_int(e["flags_value"], f"{p}.flags_value", 0, sum(_FLAG_BITS.values())) | 24) != bits | 24:  # LOSS,
        fail(f"{p}.flags_value", f"{bits}, the value of flags {e['flags']}", e["flags_value"])  # COMPUTE may go unnamed
    check_type(e["preallocated"], f"{p}.preallocated", bool, "true or false")
    check_type(e["buffer"], f"{p}.buffer", str, "a buffer label (a string)", nullable=True)
    for f in ("offset", "ext_offset"):
        check_size(e[f], f"{p}.{f}", nullable=True)


def _check_ref(ref, path: str, n: int) -> None:
    if ref is None:
        return
    if not isinstance(ref, int) or isinstance(ref, bool):
        fail(path, "a tensor id (an integer) or null", ref)
    if not 0 <= ref < n:
        raise DanglingSourceError(f"{path}: refers to tensor id {ref}, which is not in the file (ids 0..{n - 1})")

# %% [markdown]
# The rebuild order is found by Kahn's algorithm, which also finds cycles; then the whole `graph`
# section: its tensors, the uniqueness of names, the names of sources, and the node and leaf lists.

# %%
# | export schema
def creation_order(entries: list) -> list:
    """The order to rebuild tensors in: by id, except that a tensor waits for its sources and view
    source (Kahn's algorithm, smallest id first). A cycle raises `GraphCycleError` naming its tensors."""
    n = len(entries)
    deps = [{r for r in [*e["src"], e.get("view_src")] if r is not None and r != i} for i, e in enumerate(entries)]
    users: list[list[int]] = [[] for _ in range(n)]
    for i, d in enumerate(deps):
        for r in d:
            users[r].append(i)
    waiting = [len(d) for d in deps]
    ready = [i for i in range(n) if waiting[i] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) < n:
        raise GraphCycleError("the tensors depend on each other in a cycle: "
                              + " -> ".join(entry_label(entries[i]) for i in _a_cycle(deps, waiting)))
    return order


def _a_cycle(deps: list, waiting: list) -> list:
    """One cycle among the tensors Kahn's algorithm could not order (each has a waiting dependency)."""
    stuck = {i for i, w in enumerate(waiting) if w > 0}
    i, path, seen = min(stuck), list[int](), dict[int, int]()
    while i not in seen:
        seen[i] = len(path)
        path.append(i)
        i = min(d for d in deps[i] if d in stuck)
    return path[seen[i]:] + [i]

# %%
# | export schema
def _check_names(entries: list, where: str) -> None:
    """Names are unique (the writer appends `#id`), and `src_names` / `view_src_name` name the sources."""
    first: dict[str, int] = {}
    for i, e in enumerate(entries):
        j = first.setdefault(e["name"], i)
        if j != i:
            raise GraphFileError(f"{where}.tensors[{i}].name: {quote(e['name'])} is also the name of tensors[{j}]; "
                                 "names in a graph file are unique (the writer appends #id to shared names)")
    for i, e in enumerate(entries):
        refs = [(f"src_names[{k}]", r, nm) for k, (r, nm) in enumerate(zip(e["src"], e["src_names"]))]
        for field_, r, nm in refs + [("view_src_name", e["view_src"], e["view_src_name"])]:
            want = None if r is None else entries[r]["name"]
            if nm != want:
                fail(f"{where}.tensors[{i}].{field_}",
                     "null" if want is None else f"{quote(want)}, the name of tensor #{r}", nm)


def _check_lists(g: dict, where: str, n: int) -> None:
    """`nodes`, `leafs` (ids, each once, in neither both), `n_nodes`, `n_leafs`, `expand_roots`, and
    each tensor's `graph_role` against the lists."""
    role = {}
    for key in ("nodes", "leafs"):
        for k, ref in enumerate(check_list(need(g, key, f"{where}.{key}"), f"{where}.{key}")):
            _check_ref(check_int(ref, f"{where}.{key}[{k}]", 0, INT64_MAX), f"{where}.{key}[{k}]", n)
            if ref in role:
                fail(f"{where}.{key}[{k}]", "a tensor id not listed before", ref)
            role[ref] = key[:-1]
        if check_int(need(g, f"n_{key}", f"{where}.n_{key}"), f"{where}.n_{key}") != len(g[key]):
            fail(f"{where}.n_{key}", f"{len(g[key])}, the length of {key}", g[f"n_{key}"])
    if "expand_roots" in g:
        for k, ref in enumerate(check_list(g["expand_roots"], f"{where}.expand_roots")):
            _check_ref(check_int(ref, f"{where}.expand_roots[{k}]"), f"{where}.expand_roots[{k}]", n)
    else:  # the recorded lists are the graph: a node's sources come before it, leafs have no op
        done = set(g["leafs"])
        for k, ref in enumerate(g["nodes"]):
            for s in g["tensors"][ref]["src"]:
                if s is not None and s not in done and s != ref:  # (ggml_cast is its own src[1])
                    fail(f"{where}.nodes[{k}]", f"a node whose sources are leafs or earlier nodes (no expand_roots); "
                         f"its source #{s} is not", ref)
            done.add(ref)
        for k, ref in enumerate(g["leafs"]):
            if g["tensors"][ref]["op"] != "NONE":
                fail(f"{where}.leafs[{k}]", "a tensor of op NONE", ref)
    for i, e in enumerate(g["tensors"]):
        if e["graph_role"] != role.get(i, "none"):
            fail(f"{where}.tensors[{i}].graph_role", f"{role.get(i, 'none')!r} ({where}.nodes and .leafs say so)",
                 e["graph_role"])


def validate_graph_doc(g: dict, where: str = "graph") -> list:
    """Check a `graph` section (at JSON path `where`) field by field: every tensor entry, names, node and
    leaf lists, references and cycles, before anything is built. Returns the rebuild order."""
    if not isinstance(g, dict):
        fail(where, "an object (a graph section)", g)
    entries = check_list(need(g, "tensors", f"{where}.tensors"), f"{where}.tensors")
    if not entries:
        fail(f"{where}.tensors", "at least one tensor", entries)
    for i, e in enumerate(entries):
        check_type(e, f"{where}.tensors[{i}]", dict, "an object (a tensor entry)")
        try:
            _check_entry(e, i, len(entries), f"{where}.tensors[{i}]")
        except GraphFileError as err:  # name the tensor too, when the message does not
            raise err if "tensor #" in str(err) else type(err)(f"{err} ({entry_label(e)})") from None
    try:
        order = creation_order(entries)
    except GraphCycleError as err:
        raise GraphCycleError(f"{where}.tensors[*].src: {err}") from None
    _check_names(entries, where)
    _check_lists(g, where, len(entries))
    return order

# %% [markdown]
# The document around the graphs. `schema_version` must be 1, the only version there is. The
# `buffer_type` is honoured, not ignored: `plan` and `check` allocate on a CPU buffer type with the
# recorded name, alignment and `max_size` (`RecordedBufferType`; the fixtures all record ggml's CPU type,
# alignment 32, no maximum). An external buffer must name a context of the graph, and a tensor is
# `preallocated` exactly when its memory (its view root's) lives in one. For `check`, every result it
# compares (the calls' `ok`, sizes and logs; every step of a sequence) must be there and well typed.

# %%
# | export schema
class RecordedBufferType(CPUBufferType):
    """A buffer type like ggml's CPU type (`ggml_backend_cpu_buffer_type`: host memory, a buffer padded by
    its alignment so that its base can be aligned) with the name, alignment and maximum size a graph file
    records in `buffer_type`."""

    def __init__(self, name: str, alignment: int, max_size: int | None = None):
        BufferType.__init__(self, name, alignment, max_size, True)

    def alloc_buffer(self, size: int) -> Buffer:
        """`ggml_backend_cpu_buffer_type_alloc_buffer` with this type's alignment for the CPU's 32."""
        size += self.alignment
        return Buffer(self, size, HEAP.malloc(size), base_alignment=self.alignment, name=self.name)


def _check_buffer_type(bt) -> None:
    check_type(bt, "buffer_type", dict, "an object {name, alignment, max_size, alloc_size}")
    check_type(need(bt, "name", "buffer_type.name"), "buffer_type.name", str, "a string")
    a = check_int(need(bt, "alignment", "buffer_type.alignment"), "buffer_type.alignment", 1, MAX_ALIGNMENT)
    if a & (a - 1):
        fail("buffer_type.alignment", "a power of two", a)
    if need(bt, "max_size", "buffer_type.max_size") is not None:  # up to SIZE_MAX, ggml's "no limit"
        check_int(bt["max_size"], "buffer_type.max_size", 1, 2**64 - 1)
    if bt.get("alloc_size", "ggml_nbytes") != "ggml_nbytes":
        fail("buffer_type.alloc_size", "'ggml_nbytes' (the only allocation size ggml_lite knows)", bt["alloc_size"])


def buffer_type_of(doc: dict, limited: bool = True) -> BufferType:
    """The file's buffer type: ggml's CPU type, or a `RecordedBufferType` like it (not `limited`: no max_size)."""
    bt = doc.get("buffer_type")
    max_size = bt["max_size"] if bt is not None and limited else None
    if bt is None or (bt["name"], bt["alignment"], max_size) == ("CPU", TENSOR_ALIGNMENT, None):
        return cpu_buffer_type()
    return RecordedBufferType(bt["name"], bt["alignment"], max_size)


def _check_external(doc: dict, sections: list) -> None:
    labels: dict[str, int] = {}
    for k, ext in enumerate(check_list(doc.get("external_buffers", []), "external_buffers")):
        p = f"external_buffers[{k}]"
        check_type(ext, p, dict, "an object {ctx, size}")
        label = check_type(need(ext, "ctx", f"{p}.ctx"), f"{p}.ctx", str, "a context label")
        if labels.setdefault(label, k) != k:
            fail(f"{p}.ctx", f"a label not used before (external_buffers[{labels[label]}] has it)", label)
        check_size(need(ext, "size", f"{p}.size"), f"{p}.size")
    for where, g in sections:
        ents = g["tensors"]
        ctxs = {e["ctx"] for e in ents}
        for label, k in labels.items():
            if label not in ctxs:
                fail(f"external_buffers[{k}].ctx", f"a context of {where}", label)
        roots = _root_ctxs(ents)
        for i, e in enumerate(ents):
            if e["preallocated"] != (roots[i] in labels):
                ext = roots[i] in labels
                fail(f"{where}.tensors[{i}].preallocated", f"{str(ext).lower()}: its memory (its view root's) is in "
                     f"context {quote(roots[i])}, {'an' if ext else 'not an'} external buffer", e["preallocated"])


def _root_ctxs(ents: list) -> list:
    """The context of the tensor that owns each tensor's memory (its view root), in creation order."""
    out = [None] * len(ents)
    for i in creation_order(ents):
        v = ents[i]["view_src"]
        out[i] = ents[i]["ctx"] if v is None else out[v]
    return out


def _sections(doc: dict) -> list:
    """[(JSON path, graph section)] of a validated document."""
    if "graph" in doc:
        return [("graph", doc["graph"])]
    return [(f"steps[{k}].graph", s["graph"]) for k, s in enumerate(doc["steps"]) if "graph" in s]

# %%
# | export schema
def validate_document(doc, record: bool = False) -> None:
    """Check a fixture-schema document before anything is built: schema and version, buffer type,
    external buffers, `graph` or a non-empty `steps`, every graph section; with `record`, also every
    recorded result `check` compares. Raises `GraphFileError` (or a subclass) naming the field."""
    check_type(doc, "the top level", dict, "an object")
    schema = need(doc, "schema", "schema")
    if schema not in SCHEMAS:
        fail("schema", f"one of {SCHEMAS}", schema)
    v = need(doc, "schema_version", "schema_version")
    if v != 1 or isinstance(v, bool) or not isinstance(v, int):
        fail("schema_version", "1 (the only version of the schema)", v)
    if schema != SCHEMAS[0]:  # a scheduler scenario: appendix A3 checks the rest; its graph here
        if "graph" in doc:
            validate_graph_doc(doc["graph"], "graph")
        return
    if "buffer_type" in doc:
        _check_buffer_type(doc["buffer_type"])
    ggml_version(doc)
    if ("graph" in doc) == ("steps" in doc):
        raise GraphFileError("the top level: expected either `graph` (one graph) or `steps` (a sequence), "
                             f"found {'both' if 'graph' in doc else 'neither'}")
    if "steps" in doc:
        for k, st in enumerate(check_list(doc["steps"], "steps")):
            check_type(st, f"steps[{k}]", dict, "an object (a step)")
        if not doc["steps"]:
            fail("steps", "at least one step", doc["steps"])
    sections = _sections(doc)
    for where, g in sections:
        validate_graph_doc(g, where)
    _check_external(doc, sections)
    if record:
        _check_record(doc)


def _check_call(c: dict, p: str, keys: tuple) -> None:
    check_type(c, p, dict, "an object (a call's record)")
    for key in keys:
        v = need(c, key, f"{p}.{key}")
        if key == "ok":
            check_type(v, f"{p}.ok", bool, "true or false")
        elif key == "log":
            for k, line in enumerate(check_list(v, f"{p}.log")):
                check_type(line, f"{p}.log[{k}]", str, "a string")
        elif key == "compute_buffer_replaced":
            check_type(v, f"{p}.{key}", bool, "true or false", nullable=True)
        else:
            check_size(v, f"{p}.{key}")


def _check_record(doc: dict) -> None:
    """The results `check` compares: each call's ok, buffer sizes and log; every step's graph."""
    if "steps" not in doc:
        _check_call(doc, "the top level", ("buffer_size",))
        for call in ("reserve", "alloc_graph"):
            _check_call(need(doc, call, call), call, ("ok", "buffer_size", "log"))
        return
    for k, st in enumerate(doc["steps"]):
        p = f"steps[{k}]"
        if check_type(need(st, "call", f"{p}.call"), f"{p}.call", str, "a call name") not in CALLS:
            fail(f"{p}.call", f"one of {tuple(CALLS)}", st["call"])
        need(st, "graph", f"{p}.graph")
        _check_call(st, p, ("ok", "buffer_size_before", "buffer_size", "compute_buffer_replaced", "log"))


def ggml_version(doc: dict) -> tuple | None:
    """The file's `ggml_version` ("0.15.3") as three integers; None when the file has none."""
    v = doc.get("ggml_version")
    if "ggml_version" in doc and not (isinstance(v, str) and re.fullmatch(r"[0-9]{1,9}(\.[0-9]{1,9}){2}", v)):
        fail("ggml_version", "a version string MAJOR.MINOR.PATCH of three integers >= 0 (e.g. '0.15.3')", v)
    return None if v is None else tuple(int(x) for x in v.split("."))

# %% [markdown]
# ## 3 · Loading is replaying
#
# Each recorded tensor is rebuilt with the op constructor of chapter 01 that ggml itself called — `VIEW`
# with `view_4d` and the recorded strides and offset, `PERMUTE` with the recorded axes, `ROPE` with its
# eleven parameters, and so on. Which constructor, and how the recorded words become its arguments, is not
# written here: it is one row of chapter 01's op table (`ops.OPS`), decoded by `ops.decode_op` and called
# by `ops.build` — the same table the test oracle uses to mirror a graph into the real ggml, so the reader
# and the oracle cannot disagree about an op. A tensor whose `view_src` is set but whose op is not a view
# op was made by an *in-place* op (`ggml_scale_inplace`: the result is a view of the input). Op NONE with
# a `view_src` is a bare `ggml_view_tensor`. A CPY that is no view is `ggml_cast`'s, its own `src[1]`.
#
# After each rebuild the loader compares what ggml_lite computed — `ne`, `nb`, `nbytes`, the view
# root and offset, `op_params` — with the record, and stops at the first difference. Loading a file
# is therefore already a test of the op rules.

# %%
# | export
def _view_tensor(ctx, e, T):
    """Op NONE with a view source: `ggml_view_tensor` of the root (strides as recorded)."""
    t = ctx._new_tensor_impl(type_by_name(e["type"]), e["ne"], T[e["view_src"]], e.get("view_offs", 0))
    t.nb = list(e["nb"])
    return t


def rebuild_tensor(ctx: Context, e: dict, T: dict) -> Tensor:
    """Rebuild one recorded tensor by calling the ggml_lite op that ggml called (ids in `T`): the op
    table of chapter 01 (`ops.decode_op`) says which constructor and with which arguments."""
    op = op_by_name(e["op"])
    if op is Op.NONE:
        if e.get("view_src") is None:
            return ctx.new_tensor(type_by_name(e["type"]), e["ne"])
        return _view_tensor(ctx, e, T)
    src = [None if i is None or i == e.get("id") else T[i] for i in e["src"]]  # (ggml_cast's src[1] is itself)
    call = ops.decode_op(op, e["op_params"], src, e["ne"], e["nb"], e["view_src"] is not None, type_by_name(e["type"]))
    try:
        return ops.build(ctx, call)
    except GGMLLiteError:
        raise
    except (TypeError, IndexError, AttributeError, ValueError) as err:  # missing sources, wrong arity, bad params
        raise GraphFileError(f"{entry_label(e)}: cannot rebuild op {op.name} from sources {e['src']} and op_params "
                             f"{e['op_params']}: {err}") from None

# %%
# | export
def _trimmed(words) -> list:
    words = list(words)
    while words and words[-1] == 0:
        words.pop()
    return words


def _compare(e: dict, t: Tensor, T: "_Ids") -> None:
    """Raise RecordMismatchError at the first field where the rebuilt tensor differs from the record."""
    got = {
        "type": t.type.name, "ne": list(t.ne), "nb": list(t.nb), "nbytes": t.nbytes, "alloc_size": t.nbytes,
        "op_params": _trimmed(t.op_params),
        "view_src": None if t.view_src is None else T.id_of[t.view_src],
        "view_offs": t.view_offs,
    }
    for f, v in got.items():
        if f in e and e[f] != v:
            raise RecordMismatchError(f"{entry_label(e)} ({e['op']}): ggml recorded {f} = {e[f]}, ggml_lite gives {v}")


# %% [markdown]
# ## 4 · Names and the graph
#
# The recorded name is applied after the rebuild — but first the loader keeps the name the op gave
# *automatically* (`auto_names`), so tests can check ggml_lite's `" (view)"`, `" (copy of X)"` …
# against ggml's. Names of the form `node_N`/`leaf_N` are left empty: `build_forward_expand` must
# produce them itself, which checks the visiting order once more. Then the graph is rebuilt by
# expanding `expand_roots` in call order, and its node and leaf lists are compared with the file's.

# %%
# | export
class _Ids(dict):
    """id -> Tensor, plus the reverse map `id_of` (keyed by tensor identity)."""

    def __init__(self) -> None:
        super().__init__()
        self.id_of: dict[Tensor, int] = {}

    def add(self, i: int, t: Tensor) -> None:
        self[i] = t
        self.id_of[t] = i


def _recorded_name(e: dict, auto_graph_names: bool) -> str:
    name = e["name"]
    suffix = f"#{e['id']}"
    if name.endswith(suffix):
        name = name[: -len(suffix)]
    if auto_graph_names and e.get("graph_role") in ("node", "leaf") and _AUTO_GRAPH_NAME.fullmatch(name):
        return ""  # given by ggml_build_forward_expand
    return name


@dataclass
class GraphFile:
    """A loaded fixture-schema file: the document, its contexts and tensors (by id), and the graph.

    `records[id]` is the file's entry for a tensor (placement and results such as `buffer`,
    `offset`, `preallocated`); `auto_names[id]` the name the op gave the tensor before the recorded
    name was applied; `step` the step of a sequence file, or None."""

    doc: dict
    graph: Graph
    tensors: _Ids
    contexts: dict
    records: dict
    auto_names: dict
    expand_roots: list = field(default_factory=list)
    step: int | None = None

    def id_of(self, t: Tensor) -> int:
        """The fixture id of a tensor of this file."""
        return self.tensors.id_of[t]

    def graph_section(self) -> dict:
        """The `graph` section of the document (of the selected step for a sequence file)."""
        return self.doc["steps"][self.step]["graph"] if self.step is not None else self.doc["graph"]


def _graph_section(doc: dict, step) -> tuple:
    """(JSON path, section) of the graph to load: the file's `graph`, or that of step `step`."""
    if "graph" in doc and step is None:
        return "graph", doc["graph"]
    with_graph = [i for i, s in enumerate(doc.get("steps", [])) if "graph" in s]
    if step is None:
        raise GraphFileError(
            f"this file holds no single graph but {len(with_graph)} steps with graphs; pass step= one of {with_graph}"
            if with_graph else "this file has no 'graph' section")
    if step not in with_graph or isinstance(step, bool):
        raise GraphFileError(f"step {quote(step)} has no graph; steps with graphs: {with_graph}")
    return f"steps[{step}].graph", doc["steps"][step]["graph"]


def load_document(source, record: bool = False) -> dict:
    """The document of `source` (a path, read as untrusted JSON, or a parsed dict), validated
    (`validate_document`); errors about a file name it."""
    if isinstance(source, dict):
        validate_document(source, record)
        return source
    doc = read_json(source)
    try:
        validate_document(doc, record)
    except GGMLLiteError as e:
        raise type(e)(f"{source}: {e}") from None
    return doc

# %%
# | export
def read_graph_file(source, step: int | None = None, graph_size: int = GGML_DEFAULT_GRAPH_SIZE,
                    validate: bool = True) -> GraphFile:
    """Load a fixture-schema file (a path, or an already parsed dict): validate it (`validate_document`;
    `validate=False`: a dict the caller has just validated), rebuild every tensor with ggml_lite's ops,
    check each against the record, and rebuild the graph from `expand_roots`. The graph holds at least as
    many tensors as the file (`graph_size` or more)."""
    doc = source if isinstance(source, dict) and not validate else load_document(source)
    where, g = _graph_section(doc, step)
    order = creation_order(g["tensors"])
    entries = g["tensors"]
    roots = g.get("expand_roots")
    contexts, T, auto_names = dict[str, Context](), _Ids(), {}
    for e in entries:  # contexts in order of first appearance
        contexts.setdefault(e["ctx"], Context(e["ctx"]))
    for i in order:
        e = entries[i]
        try:
            t = rebuild_tensor(contexts[e["ctx"]], e, T)
            T.add(i, t)
            _compare(e, t, T)
        except GGMLLiteError as err:  # an op refused the recorded sources, or the record differs
            named = "" if "tensor #" in str(err) else f" ({entry_label(e)})"
            raise type(err)(f"{where}.tensors[{i}]{named}: {err}") from None
        auto_names[i] = t.name
        t.set_name(_recorded_name(e, roots is not None))
        t.flags = e["flags_value"] & int(TensorFlag.INPUT | TensorFlag.OUTPUT | TensorFlag.PARAM)
    for ctx in contexts.values():  # creation order = id order
        ctx.tensors.sort(key=T.id_of.__getitem__)
    graph = Graph(max(graph_size, len(entries)))
    if roots is not None:
        for r in roots:
            build_forward_expand(graph, T[r])
    else:
        graph.nodes = [T[i] for i in g["nodes"]]
        graph.leafs = [T[i] for i in g["leafs"]]
        graph.visited = set(graph.nodes) | set(graph.leafs)
    gf = GraphFile(doc, graph, T, contexts, {e["id"]: e for e in entries}, auto_names, list(roots or []), step)
    _check_graph(gf, g)
    return gf


def _check_graph(gf: GraphFile, g: dict) -> None:
    for key, got in (("nodes", gf.graph.nodes), ("leafs", gf.graph.leafs)):
        if key not in g:
            continue
        ids = [gf.id_of(t) for t in got]
        if ids != g[key]:
            k = next((k for k, (a, b) in enumerate(zip(ids, g[key])) if a != b), min(len(ids), len(g[key])))
            raise RecordMismatchError(
                f"rebuilding the graph from expand_roots gives a different {key} list at position {k}: "
                f"ggml recorded {g[key][k:k + 3]}, ggml_lite gives {ids[k:k + 3]} ({len(g[key])} vs {len(ids)} {key})")
    for i, t in gf.tensors.items():
        want = _recorded_name(gf.records[i], False)
        if t.name != want:
            raise RecordMismatchError(f"{entry_label(gf.records[i])}: the graph named it {quote(t.name)}")


def load_graph(source, step: int | None = None):
    """`(Graph, {fixture id: Tensor})` of a fixture-schema file (DESIGN §4); see `read_graph_file`."""
    gf = read_graph_file(source, step)
    return gf.graph, gf.tensors


# %% [markdown]
# ## 5 · Writing: from tensors back to the schema
#
# `tensor_entry` derives every tensor field from the ggml_lite tensor; fields that are not part of a tensor
# (placement and plan results) come from the record when there is one, or get their neutral values
# (`buffer: null`). `graph_document` writes a file for a graph built with the API — the same schema the CLI
# (`python -m ggml_lite plan`) reads — and `save_graph_file` writes a loaded file back. The layout of the
# writer is the one of the `ggml-seed` files: top-level keys, `graph`, `steps` and `tensors` one item per
# line, everything else on one line; for those files the output is identical byte for byte.

# %%
# | export
_FLAG_NAMES = [(TensorFlag.INPUT, "INPUT"), (TensorFlag.OUTPUT, "OUTPUT"), (TensorFlag.PARAM, "PARAM")]


def _file_names(tensors: dict) -> dict:
    """`#id` suffixes as the fixture writer adds them: to empty names and names used more than once."""
    count: dict[str, int] = {}
    for t in tensors.values():
        count[t.name] = count.get(t.name, 0) + 1
    return {i: (t.name + f"#{i}" if not t.name or count[t.name] > 1 else t.name) for i, t in tensors.items()}


def tensor_entry(t: Tensor, i: int, ids: dict, names: dict, record: dict | None = None, role: str = "none") -> dict:
    """One `graph.tensors` entry for tensor `t` with fixture id `i`; `ids` maps tensors to ids and
    `names` ids to file names. Tensor fields are derived from `t`; the rest comes from `record`."""
    src = [None if s is None else ids[s] for s in t.src]
    derived = {
        "id": i, "name": names[i], "type": t.type.name, "ne": list(t.ne), "nb": list(t.nb),
        "nbytes": t.nbytes, "op": t.op.name,
    }
    if t.op is Op.UNARY:
        derived["unary_op"] = t.unary_op.name
    derived.update({
        "op_params": _trimmed(t.op_params), "src": src,
        "src_names": [None if s is None else names[ids[s]] for s in t.src],
        "view_src": None if t.view_src is None else ids[t.view_src],
        "view_src_name": None if t.view_src is None else names[ids[t.view_src]],
        "view_offs": t.view_offs,
        "flags": [n for f, n in _FLAG_NAMES if t.flags & f], "flags_value": int(t.flags),
    })
    if record is not None:
        entry = dict(record)
        entry.update(derived)
        return entry
    entry = {"id": i, "name": names[i], "ctx": t.ctx.name if t.ctx is not None else "compute",
             "graph_role": role, "type": t.type.name, "ne": list(t.ne), "nb": list(t.nb),
             "nbytes": t.nbytes, "alloc_size": t.nbytes}
    entry.update(derived)
    entry.update({"preallocated": t.data is not None, "buffer": None, "offset": None, "ext_offset": None})
    return entry


def graph_section(graph: Graph, tensors: dict, expand_roots: list, records: dict | None = None) -> dict:
    """The `graph` section for `graph`, whose tensors are `tensors` ({id: Tensor})."""
    ids = {t: i for i, t in tensors.items()}
    names = _file_names(tensors)
    roles = {t: "node" for t in graph.nodes} | {t: "leaf" for t in graph.leafs}
    return {
        "n_nodes": graph.n_nodes, "n_leafs": graph.n_leafs,
        "nodes": [ids[t] for t in graph.nodes], "leafs": [ids[t] for t in graph.leafs],
        "expand_roots": [ids[t] for t in expand_roots],
        "tensors": [tensor_entry(t, i, ids, names, (records or {}).get(i), roles.get(t, "none"))
                    for i, t in sorted(tensors.items())],
    }


def graph_document(graph: Graph, contexts: list, expand_roots: list, fixture: str = "graph",
                   description: str = "") -> dict:
    """A fixture-schema document for a graph built with the ggml_lite API. `contexts` lists the contexts
    in id order (their tensors in creation order give the ids); `expand_roots` the tensors passed to
    `build_forward_expand`, in call order."""
    tensors: dict[int, Tensor] = {}
    for ctx in contexts:
        for t in ctx.tensors:
            tensors[len(tensors)] = t
    return {"schema": SCHEMAS[0], "schema_version": 1, "fixture": fixture, "description": description,
            "graph": graph_section(graph, tensors, expand_roots)}

# %%
# | export
def to_document(gf: GraphFile) -> dict:
    """The document of a loaded file, its graph section regenerated from the tensors."""
    doc = json.loads(json.dumps(gf.doc))
    sec = graph_section(gf.graph, gf.tensors, [gf.tensors[i] for i in gf.expand_roots], gf.records)
    old = gf.graph_section()
    new = {k: sec.get(k, v) for k, v in old.items()}  # keep the file's key order
    if gf.step is None:
        doc["graph"] = new
    else:
        doc["steps"][gf.step]["graph"] = new
    return doc


_EXPANDED = ("graph", "steps", "tensors")


def dumps(doc, _key=None, _indent=0) -> str:
    """JSON text in the layout of the ggml-seed fixtures."""
    pad, inner = "  " * _indent, "  " * (_indent + 1)
    expand = _indent == 0 or _key in _EXPANDED or _key == "steps[]"
    if isinstance(doc, dict) and expand and doc:
        items = [f'{inner}{json.dumps(k)}: {dumps(v, k, _indent + 1)}' for k, v in doc.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(doc, list) and _key in ("steps", "tensors") and doc:
        child = "steps[]" if _key == "steps" else None
        items = [f"{inner}{dumps(v, child, _indent + 1)}" for v in doc]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(doc)


def save_graph_file(gf: GraphFile, path) -> None:
    """Write a loaded file back (`to_document` in the layout of `dumps`)."""
    Path(path).write_text(dumps(to_document(gf)) + "\n")


# %% [markdown]
# ## 6 · A worked example: a graph, written and read back
#
# Build a small attention-like graph with the API, write it in the fixture schema, load it again —
# the loader rebuilds every tensor and the graph, and checks them — and compare.

# %%
import ggml_lite as gl

ctx = gl.Context("compute")
x = ctx.new_tensor_2d(gl.F32, 32, 6, name="x")
gl.set_input(x)
wq = ctx.new_tensor_2d(gl.F16, 32, 32, name="wq")
q = gl.reshape_3d(ctx, gl.mul_mat(ctx, wq, x), 8, 4, 6)  # the mul_mat has no name yet
qp = gl.permute(ctx, q, 0, 2, 1, 3).set_name("q_heads")
kq = gl.soft_max_ext(ctx, gl.mul_mat(ctx, qp, qp), None, 0.125, 0.0).set_name("kq")
out = gl.cont_2d(ctx, gl.transpose(ctx, gl.reshape_2d(ctx, kq, 6, 24)), 24, 6).set_name("out")
gl.set_output(out)
graph = gl.build_forward(out)

doc = graph_document(graph, [ctx], [out], fixture="attention_toy")
text = dumps(doc)
print("\n".join(text.splitlines()[:12]), "\n  ...")
back = read_graph_file(json.loads(text))
print(back.graph, [t.name for t in back.graph.nodes])

# %% [markdown]
# The rebuilt graph has the same node names — including `node_0`, which the graph gave the unnamed
# mul_mat, and the automatic names. Note a ggml quirk: the reshape of that mul_mat is called
# `" (reshaped)"`, with nothing before the suffix, because the automatic name is formed when the
# op is *created*, and the mul_mat only got its name `node_0` later, when the graph was built.
#
# ### A picture: which tensors own memory
#
# Per tensor of the file: its size, coloured by what it is. Views and reshapes cost nothing — they
# share their root's bytes — which is why the allocator of chapter 05 skips them.

# %%
import plotly.graph_objects as go


def tensor_kinds(gf: GraphFile):
    rows = []
    for i, t in gf.tensors.items():
        kind = "view" if t.view_src is not None else ("leaf" if t.op is Op.NONE else "op result")
        rows.append((i, t.name, t.nbytes, kind))
    return rows


rows = tensor_kinds(back)
colors = {"leaf": "#636efa", "op result": "#ef553b", "view": "#00cc96"}
fig = go.Figure()
for kind, col in colors.items():
    sel = [r for r in rows if r[3] == kind]
    fig.add_trace(go.Bar(x=[r[1] for r in sel], y=[r[2] for r in sel], name=kind, marker_color=col))
fig.update_layout(title="bytes per tensor of the toy graph (views own none of theirs)", yaxis_title="nbytes",
                  height=340, margin=dict(l=40, r=20, t=50, b=120))
fig

# %% [markdown]
# ## 7 · Errors that name the field
#
# Each broken file below differs from the good one in one field; each message starts with the field's
# JSON path, then says what was expected and what was found (§2).

# %%
# NBVAL_CHECK_OUTPUT
import copy


def broken(edit):
    d = copy.deepcopy(doc)
    edit(d["graph"]["tensors"])
    try:
        read_graph_file(d)
    except gl.errors.GGMLLiteError as e:
        return f"{type(e).__name__}: {e}"
    return "loaded"


cases = {
    "unknown op": lambda ts: ts[2].update(op="CONV_2D"),
    "unknown type": lambda ts: ts[1].update(type="f99"),
    "dangling src": lambda ts: ts[2].update(src=[1, 99]),
    "cycle": lambda ts: ts[2].update(src=[3, 0]),
    "negative size": lambda ts: ts[0].update(ne=[32, -6, 1, 1]),
    "wrong stride": lambda ts: ts[2].update(nb=[4, 256, 1536, 1536]),
    "float size": lambda ts: ts[0].update(ne=[32, 6.0, 1, 1]),
    "2^70 param": lambda ts: ts[3].update(op_params=[2**70]),
    "name twice": lambda ts: ts[1].update(name="x"),
    "wrong type": lambda ts: ts[2].update(type="f16"),
    "no sources": lambda ts: ts[2].update(src=[], src_names=[]),
    "long name": lambda ts: ts[1].update(name="w" * 100_000, type="f99"),
}
for what, edit in cases.items():
    print(f"{what:14s} -> {broken(edit)}")

# %% [markdown]
# A worked example of a refused file: the text of the toy graph with one size replaced by `NaN` — which
# Python's `json` would read as a float — is refused where it is parsed, with the path of the field; so
# is a key given twice (Python's `json` would keep the second value: a file saying `schema_version` 99
# and then 1 would be read as version 1), with the path of its object:

# %%
# NBVAL_CHECK_OUTPUT
bad_text = text.replace('"ne": [32, 6, 1, 1]', '"ne": [32, NaN, 1, 1]', 1)
try:
    parse_json(bad_text, "attention_toy.json")
except gl.errors.GraphFileError as e:
    print(f"{type(e).__name__}: {e}")
try:
    parse_json("[" * 100_000 + "]" * 100_000, "deep.json")
except gl.errors.GraphFileError as e:
    print(f"{type(e).__name__}: {e}")
try:
    parse_json(text.replace('"offset": null', '"offset": 64, "offset": null', 1), "attention_toy.json")
except gl.errors.GraphFileError as e:
    print(f"{type(e).__name__}: {e}")

# %% [markdown]
# ## 8 · The recorded fixtures
#
# The project carries the 14 graph files ggml recorded (`tests/fixtures/ggml-seed/`); this cell
# rebuilds every graph they hold and says what it checked.

# %%
n_files = n_tensors = 0
for f in sorted(Path("../tests/fixtures/ggml-seed").glob("*.json")):
    d = json.loads(f.read_text())
    for s in ([None] if "graph" in d else [i for i, st in enumerate(d["steps"]) if "graph" in st]):
        gf = read_graph_file(d, step=s)
        n_files += s in (None, 0)
        n_tensors += len(gf.tensors)
assert n_files == 14
print(f"{n_files} fixture files: {n_tensors} tensors rebuilt; shapes, strides, sizes, views, names and node/leaf order match")

# %% [markdown]
# ## 9 · External buffers: weights and cache placed as the recorder placed them
#
# A graph file says which of its contexts were allocated before planning (`external_buffers`: the
# weights, the KV cache) and how large their buffers were. `allocate_external` allocates them the way
# the recorder did — `ggml_backend_alloc_ctx_tensors` (chapter 03) on the file's buffer type without its
# `max_size` (today's recorder, A5, limits the compute buffer only), ggml's CPU type in every fixture — and checks
# each buffer's recorded size (for today's ggml, also without the 2024 type's padding) and every `ext_offset`.
# After it, a fresh graph allocator sees the graph as `ggml_gallocr` saw it; comparing the plan is appendix A5's.

# %%
# | export
def allocate_external(gf: GraphFile, buft=None) -> dict:
    """Allocate the file's `external_buffers` contexts (`ggml_backend_alloc_ctx_tensors`); returns
    `{label: Buffer}` after checking each buffer's size and every tensor's `ext_offset`. The buffer type
    is the file's without its limit (`buffer_type_of(doc, limited=False)`) unless `buft` is given."""
    buft = buft or buffer_type_of(gf.doc, limited=False)
    buffers = {}
    for ext in gf.doc.get("external_buffers", []):
        label = ext["ctx"]
        ctx = gf.contexts[label]  # (validated: every label is a context of the graph)
        buf = alloc_ctx_tensors(ctx, buft)
        size, today = (buf.get_size() if buf is not None else 0), (ggml_version(gf.doc) or (0,)) >= (0, 10, 1)
        if size != ext["size"] and not (today and size == ext["size"] + buft.alignment):  # today's CPU type: unpadded
            raise RecordMismatchError(f"context {quote(label)}: ggml's buffer held {ext['size']} bytes, "
                                      f"ggml_lite's {size}")
        for t in ctx.tensors:
            want = gf.records[gf.id_of(t)].get("ext_offset")
            if want is not None and t.view_src is None and t.data - buf.get_base() != want:
                raise RecordMismatchError(f"{quote(t.name)}: ggml put it at offset {want} of {quote(label)}, "
                                          f"ggml_lite at {t.data - buf.get_base()}")
        buffers[label] = buf
    return buffers

# %% [markdown]
# ## 10 · Check

# %%
assert [t.name for t in back.graph.nodes] == [t.name for t in graph.nodes]
assert [t.name for t in back.graph.leafs] == ["wq", "x"]
assert dumps(to_document(back)) == text  # a round trip changes nothing
assert all(broken(e) != "loaded" for e in cases.values())
assert "tensor #2" in broken(cases["unknown op"]) and "99" in broken(cases["dangling src"])
assert broken(cases["float size"]).startswith("GraphFileError: graph.tensors[0].ne[1]: expected an integer")
assert "graph.tensors[3].op_params[0]" in broken(cases["2^70 param"]) and "type = f16" in broken(cases["wrong type"])
assert "src[0]: expected the id of a tensor" in broken(cases["no sources"]) and "NoneType" not in broken(cases["no sources"])
assert "... (100,000 chars)" in broken(cases["long name"]) and len(broken(cases["long name"])) < 1000
assert MAX_JSON_BYTES == 32 * 2**20 and quote("w" * 61).endswith("... (61 chars)") and json_kind(None) == "null"
buffers = allocate_external(read_graph_file("../tests/fixtures/ggml-seed/06_llama_block.json"))
assert buffers and all(b.get_size() > 0 for b in buffers.values())
print("appendix A1: all checks passed")
