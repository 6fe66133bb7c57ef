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
# The project's promise is *byte-identical to ggml*. The evidence is a set of JSON files recorded
# from the real C library (`tests/fixtures/`, carried by the project): every tensor of a graph with its shape, strides,
# op, sources, view and flags, and what the allocator and scheduler did with it. This appendix
# turns such a file into ggml_lite tensors and a graph, and back.
#
# **Learning goals**
#
# 1. The fixture schema: tensors by *id* (creation order across contexts), sources by id,
#    `expand_roots` to rebuild the graph.
# 2. Loading is *replaying*: every tensor is rebuilt by calling the same ggml_lite op that ggml
#    called, then checked against the record — so a file that loads is a file whose shapes,
#    strides, sizes and views ggml_lite reproduces.
# 3. Bad files fail early with an error that names the tensor: unknown op or type, a dangling
#    source id, a cycle, a negative size.
#
# Exported: `ggml_lite.graphio`.

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
into ggml_lite tensors by replaying ggml's op constructors, check it against the record, and write it
back. Also writes a fixture-schema file for a graph built with the ggml_lite API."""

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ggml_lite import ops
from ggml_lite.buffer import cpu_buffer_type
from ggml_lite.errors import (
    DanglingSourceError, GraphCycleError, GraphFileError, InvalidSizeError, RecordMismatchError,
)
from ggml_lite.dyn_tallocr import captured_log
from ggml_lite.gallocr import GAllocr
from ggml_lite.graph import GGML_DEFAULT_GRAPH_SIZE, Graph, build_forward_expand
from ggml_lite.tallocr import alloc_ctx_tensors
from ggml_lite.tensor import (
    Context, Op, Tensor, TensorFlag, UnaryOp, op_by_name, type_by_name, word_to_float,
)

SCHEMAS = ("ggml-gallocr-fixture", "ggml-sched-fixture")
REQUIRED_FIELDS = ("id", "name", "type", "ne", "nb", "op", "src")
_AUTO_GRAPH_NAME = re.compile(r"(node|leaf)_\d+")

# %% [markdown]
# ## 2 · Validation before anything is built
#
# A file is checked as data first, so that a typo gives a message instead of a traceback from deep
# inside an op: ids must be `0..n-1` in order (they are creation positions), every type and op must be
# known, sizes non-negative, every source id present, and no tensor may depend on itself through
# its sources or view source (a cycle — something ggml cannot even create).

# %%
# | export
def _tname(e: dict) -> str:
    return f"tensor #{e.get('id')} {e.get('name')!r}"


def _check_entry(e: dict, n: int) -> None:
    for f in REQUIRED_FIELDS:
        if f not in e:
            raise GraphFileError(f"{_tname(e)} has no {f!r} field")
    try:
        type_by_name(e["type"])
        op_by_name(e["op"])
    except KeyError as err:
        raise type(err)(f"{_tname(e)}: {err}") from None
    for f in ("ne", "nb"):
        v = e[f]
        if not isinstance(v, list) or len(v) != 4 or not all(isinstance(x, int) for x in v):
            raise GraphFileError(f"{_tname(e)}: {f} must be a list of 4 integers, got {v!r}")
        if min(v) < 0:
            raise InvalidSizeError(f"{_tname(e)}: negative {f} {v}")
    for f in ("nbytes", "alloc_size", "view_offs"):
        if e.get(f) is not None and e[f] < 0:
            raise InvalidSizeError(f"{_tname(e)}: negative {f} {e[f]}")
    for ref in [*e["src"], e.get("view_src")]:
        if ref is not None and not (isinstance(ref, int) and 0 <= ref < n):
            raise DanglingSourceError(f"{_tname(e)} refers to tensor id {ref!r}, which is not in the file (ids 0..{n - 1})")


def creation_order(entries: list) -> list:
    """The order to rebuild tensors in: by id, except that a tensor waits for its sources and view
    source (Kahn's algorithm, smallest id first). A cycle raises `GraphCycleError` naming its tensors."""
    import heapq

    n = len(entries)
    deps = [{r for r in [*e["src"], e.get("view_src")] if r is not None} for e in entries]
    users = [[] for _ in range(n)]
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
                              + " -> ".join(_tname(entries[i]) for i in _a_cycle(deps, waiting)))
    return order


def _a_cycle(deps: list, waiting: list) -> list:
    """One cycle among the tensors Kahn's algorithm could not order (each has a waiting dependency)."""
    stuck = {i for i, w in enumerate(waiting) if w > 0}
    i, path, seen = min(stuck), [], {}
    while i not in seen:
        seen[i] = len(path)
        path.append(i)
        i = min(d for d in deps[i] if d in stuck)
    return path[seen[i]:] + [i]


# %%
# | export
def validate_graph_doc(g: dict) -> list:
    """Check a `graph` section (ids, types, ops, sizes, references, cycles); return the rebuild order."""
    if not isinstance(g, dict) or not isinstance(g.get("tensors"), list):
        raise GraphFileError("the graph section has no 'tensors' list")
    entries = g["tensors"]
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise GraphFileError(f"tensors[{i}] is not an object")
        if e.get("id") != i:
            raise GraphFileError(f"{_tname(e)} is at position {i}: ids must be 0..n-1 in creation order")
        _check_entry(e, len(entries))
    for key in ("nodes", "leafs", "expand_roots"):
        for ref in g.get(key) or []:
            if not (isinstance(ref, int) and 0 <= ref < len(entries)):
                raise DanglingSourceError(f"graph.{key} refers to tensor id {ref!r}, which is not in the file")
    return creation_order(entries)



# %% [markdown]
# ## 3 · Loading is replaying
#
# Each recorded tensor is rebuilt with the op constructor of chapter 01 that ggml itself called —
# `VIEW` with `view_4d` and the recorded strides and offset, `PERMUTE` with the recorded axes,
# `ROPE` with its eleven parameters, and so on. A tensor whose `view_src` is set but whose op is not
# a view op was made by an *in-place* op (`ggml_scale_inplace`: the result is a view of the input).
# Op NONE with a `view_src` is a bare `ggml_view_tensor`.
#
# After each rebuild the loader compares what ggml_lite computed — `ne`, `nb`, `nbytes`, the view
# root and offset, `op_params` — with the record, and stops at the first difference. Loading a file
# is therefore already a test of the op rules.

# %%
# | export
def _f(p, i):
    return word_to_float(p[i])


def _size_t(p, i):
    return (p[i] & 0xFFFFFFFF) | ((p[i + 1] & 0xFFFFFFFF) << 32)


def _view_tensor(ctx, e, T):
    """Op NONE with a view source: `ggml_view_tensor` of the root (strides as recorded)."""
    t = ctx._new_tensor_impl(type_by_name(e["type"]), e["ne"], T[e["view_src"]], e.get("view_offs", 0))
    t.nb = list(e["nb"])
    return t


# op -> rebuild(ctx, entry, sources, op_params, inplace)
_REBUILD = {
    Op.DUP: lambda c, e, s, p, ip: ops.dup(c, s[0], ip),
    Op.ADD: lambda c, e, s, p, ip: (ops.add_inplace if ip else ops.add)(c, s[0], s[1]),
    Op.SUB: lambda c, e, s, p, ip: (ops.sub_inplace if ip else ops.sub)(c, s[0], s[1]),
    Op.MUL: lambda c, e, s, p, ip: (ops.mul_inplace if ip else ops.mul)(c, s[0], s[1]),
    Op.DIV: lambda c, e, s, p, ip: (ops.div_inplace if ip else ops.div)(c, s[0], s[1]),
    Op.ADD1: lambda c, e, s, p, ip: ops.add1(c, s[0], s[1], ip),
    Op.SQR: lambda c, e, s, p, ip: ops.sqr(c, s[0], ip),
    Op.SQRT: lambda c, e, s, p, ip: ops.sqrt(c, s[0], ip),
    Op.LOG: lambda c, e, s, p, ip: ops.log(c, s[0], ip),
    Op.SUM: lambda c, e, s, p, ip: ops.sum(c, s[0]),
    Op.SUM_ROWS: lambda c, e, s, p, ip: ops.sum_rows(c, s[0]),
    Op.MEAN: lambda c, e, s, p, ip: ops.mean(c, s[0]),
    Op.LEAKY_RELU: lambda c, e, s, p, ip: ops.leaky_relu(c, s[0], _f(p, 0), ip),
    Op.CONCAT: lambda c, e, s, p, ip: ops.concat(c, s[0], s[1], p[0]),
    Op.NORM: lambda c, e, s, p, ip: ops.norm(c, s[0], _f(p, 0), ip),
    Op.RMS_NORM: lambda c, e, s, p, ip: ops.rms_norm(c, s[0], _f(p, 0), ip),
    Op.MUL_MAT: lambda c, e, s, p, ip: ops.mul_mat(c, s[0], s[1]),
    Op.SCALE: lambda c, e, s, p, ip: ops.scale(c, s[0], _f(p, 0), ip),
    Op.CPY: lambda c, e, s, p, ip: ops.cpy(c, s[0], s[1]),
    Op.CONT: lambda c, e, s, p, ip: ops.cont_4d(c, s[0], *e["ne"]),
    Op.RESHAPE: lambda c, e, s, p, ip: ops.reshape_4d(c, s[0], *e["ne"]),
    Op.VIEW: lambda c, e, s, p, ip: ops.view_4d(c, s[0], *e["ne"], *e["nb"][1:], _size_t(p, 0)),
    Op.PERMUTE: lambda c, e, s, p, ip: ops.permute(c, s[0], *p[:4]),
    Op.TRANSPOSE: lambda c, e, s, p, ip: ops.transpose(c, s[0]),
    Op.GET_ROWS: lambda c, e, s, p, ip: ops.get_rows(c, s[0], s[1]),
    Op.DIAG_MASK_INF: lambda c, e, s, p, ip: ops.diag_mask_inf(c, s[0], p[0], ip),
    Op.DIAG_MASK_ZERO: lambda c, e, s, p, ip: ops.diag_mask_zero(c, s[0], p[0], ip),
    Op.SOFT_MAX: lambda c, e, s, p, ip: ops.soft_max_ext(c, s[0], s[1], _f(p, 0), _f(p, 1), ip),
    Op.ROPE: lambda c, e, s, p, ip: ops.rope_ext(c, s[0], s[1], s[2], p[1], p[2], p[4],
                                                 *(_f(p, i) for i in range(5, 11)), inplace=ip),
    Op.UNARY: lambda c, e, s, p, ip: ops.unary(c, s[0], UnaryOp(p[0]), ip),
}


def rebuild_tensor(ctx: Context, e: dict, T: dict) -> Tensor:
    """Rebuild one recorded tensor by calling the ggml_lite op that ggml called (ids in `T`)."""
    op = op_by_name(e["op"])
    if op is Op.NONE:
        if e.get("view_src") is None:
            return ctx.new_tensor(type_by_name(e["type"]), e["ne"])
        return _view_tensor(ctx, e, T)
    src = [None if i is None else T[i] for i in e["src"]] + [None] * 3
    p = list(e.get("op_params", [])) + [0] * 16
    inplace = e.get("view_src") is not None and op not in _VIEW_LIKE
    try:
        return _REBUILD[op](ctx, e, src, p, inplace)
    except (TypeError, IndexError, AttributeError) as err:  # missing sources, wrong arity
        raise GraphFileError(f"{_tname(e)}: cannot rebuild op {op.name} from sources {e['src']}: {err}") from None


_VIEW_LIKE = frozenset({Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE, Op.CPY})


# %%
# | export
def _trimmed(words) -> list:
    words = list(words)
    while words and words[-1] == 0:
        words.pop()
    return words


def _compare(e: dict, t: Tensor, T: dict) -> None:
    """Raise RecordMismatchError at the first field where the rebuilt tensor differs from the record."""
    got = {
        "ne": list(t.ne), "nb": list(t.nb), "nbytes": t.nbytes,
        "op_params": _trimmed(t.op_params),
        "view_src": None if t.view_src is None else T.id_of[t.view_src],
        "view_offs": t.view_offs,
    }
    for f, v in got.items():
        if f in e and e[f] != v:
            raise RecordMismatchError(f"{_tname(e)} ({e['op']}): ggml recorded {f} = {e[f]}, ggml_lite gives {v}")
    if e["op"] == "UNARY" and "unary_op" in e and e["unary_op"] != t.unary_op.name:
        raise RecordMismatchError(f"{_tname(e)}: recorded unary_op {e['unary_op']}, op_params say {t.unary_op.name}")



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

    def __init__(self):
        super().__init__()
        self.id_of = {}

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
    tensors: dict
    contexts: dict
    records: dict
    auto_names: dict
    expand_roots: list = field(default_factory=list)
    step: int = None

    def id_of(self, t: Tensor) -> int:
        """The fixture id of a tensor of this file."""
        return self.tensors.id_of[t]

    def graph_section(self) -> dict:
        """The `graph` section of the document (of the selected step for a sequence file)."""
        return self.doc["steps"][self.step]["graph"] if self.step is not None else self.doc["graph"]


def _graph_section(doc: dict, step):
    if "graph" in doc and step is None:
        return doc["graph"]
    steps = [s for s in doc.get("steps", []) if isinstance(s, dict)]
    with_graph = [i for i, s in enumerate(steps) if "graph" in s]
    if step is None:
        raise GraphFileError(
            f"this file holds no single graph but {len(with_graph)} steps with graphs; pass step= one of {with_graph}"
            if with_graph else "this file has no 'graph' section")
    if step not in with_graph:
        raise GraphFileError(f"step {step!r} has no graph; steps with graphs: {with_graph}")
    return steps[step]["graph"]


# %%
# | export
def read_graph_file(source, step: int = None, graph_size: int = GGML_DEFAULT_GRAPH_SIZE) -> GraphFile:
    """Load a fixture-schema file (a path, or an already parsed dict): validate, rebuild every tensor
    with ggml_lite's ops, check each against the record, and rebuild the graph from `expand_roots`."""
    doc = source if isinstance(source, dict) else json.loads(Path(source).read_text())
    if doc.get("schema") not in SCHEMAS:
        raise GraphFileError(f"unknown schema {doc.get('schema')!r}; expected one of {SCHEMAS}")
    g = _graph_section(doc, step)
    order = validate_graph_doc(g)
    entries = g["tensors"]
    roots = g.get("expand_roots")
    contexts, T, auto_names = {}, _Ids(), {}
    for e in entries:  # contexts in order of first appearance
        contexts.setdefault(e.get("ctx", "compute"), Context(e.get("ctx", "compute")))
    for i in order:
        e = entries[i]
        ctx = contexts[e.get("ctx", "compute")]
        try:
            t = rebuild_tensor(ctx, e, T)
        except GraphFileError:
            raise
        except (ValueError, TypeError) as err:  # an op refused the recorded sources
            raise type(err)(f"{_tname(e)}: {err}") from None
        T.add(i, t)
        _compare(e, t, T)
        auto_names[i] = t.name
        t.set_name(_recorded_name(e, roots is not None))
        t.flags = int(e.get("flags_value", 0))
    for ctx in contexts.values():  # creation order = id order
        ctx.tensors.sort(key=T.id_of.__getitem__)
    graph = Graph(graph_size)
    if roots is not None:
        for r in roots:
            build_forward_expand(graph, T[r])
    else:
        graph.nodes = [T[i] for i in g.get("nodes", [])]
        graph.leafs = [T[i] for i in g.get("leafs", [])]
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
            raise RecordMismatchError(f"{_tname(gf.records[i])}: the graph named it {t.name!r}")


def load_graph(source, step: int = None):
    """`(Graph, {fixture id: Tensor})` of a fixture-schema file (DESIGN §4); see `read_graph_file`."""
    gf = read_graph_file(source, step)
    return gf.graph, gf.tensors



# %% [markdown]
# ## 5 · Writing: from tensors back to the schema
#
# `tensor_entry` derives every tensor field from the ggml_lite tensor; fields that are not part of a
# tensor (placement and plan results) come from the record when there is one, or get their neutral
# values (`buffer: null`). `graph_document` writes a file for a graph built with the API — the same
# schema the CLI (`python -m ggml_lite plan`) reads — and `save_graph_file` writes a loaded file back.
# The layout of the writer is the one of the `ggml-seed` files: top-level keys, `graph`, `steps` and
# `tensors` one item per line, everything else on one line; for those files the output is identical
# byte for byte.

# %%
# | export
_FLAG_NAMES = [(TensorFlag.INPUT, "INPUT"), (TensorFlag.OUTPUT, "OUTPUT"), (TensorFlag.PARAM, "PARAM")]


def _file_names(tensors: dict) -> dict:
    """`#id` suffixes as the fixture writer adds them: to empty names and names used more than once."""
    count = {}
    for t in tensors.values():
        count[t.name] = count.get(t.name, 0) + 1
    return {i: (t.name + f"#{i}" if not t.name or count[t.name] > 1 else t.name) for i, t in tensors.items()}


def tensor_entry(t: Tensor, i: int, ids: dict, names: dict, record: dict = None, role: str = "none") -> dict:
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


def graph_section(graph: Graph, tensors: dict, expand_roots: list, records: dict = None) -> dict:
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
    tensors = {}
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
# ## 7 · Errors that name the tensor
#
# Each broken file below differs from the good one in one field.

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
    "unknown type": lambda ts: ts[1].update(type="f64"),
    "dangling src": lambda ts: ts[2].update(src=[1, 99]),
    "cycle": lambda ts: ts[2].update(src=[3, 0]),
    "negative size": lambda ts: ts[0].update(ne=[32, -6, 1, 1]),
    "wrong stride": lambda ts: ts[2].update(nb=[4, 256, 1536, 1536]),
}
for what, edit in cases.items():
    print(f"{what:14s} -> {broken(edit)}")

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
# ## 9 · Plans: run a file through the graph allocator and compare
#
# A `ggml-seed` file records what `ggml_gallocr` did. To do it again the file's pre-allocated
# contexts (`external_buffers`: weights, KV cache) are first allocated as the recorder did —
# `ggml_backend_alloc_ctx_tensors` on the CPU buffer type, which also checks their recorded sizes
# and `ext_offset`s — then a fresh `GAllocr` (chapter 05) runs `reserve` and `alloc_graph`, and
# the allocator's log lines are collected per call. A sequence file (11, 12) replays its steps on
# one allocator. `check_plan_file` lists every difference with the record; the CLI's `check` and
# the tests use it.
#
# One recorded fact needs care: a step's `compute_buffer_replaced` compares the *address* of the
# compute buffer's C struct, as the recorder saw it through a tensor's `buffer` field — which only
# `alloc_graph` sets, so the fact exists from the second `alloc_graph` step on (null before). And
# glibc hands a just-freed struct's address to the next buffer, so a buffer that `reserve_n`
# reallocated usually reads "not replaced" (file 11, step 1: the log says "reallocating", the
# record says false). ggml_lite's simulated heap reuses small chunks the same way (chapter 03), so
# the comparison is made on the same terms.

# %%
# | export
def allocate_external(gf: GraphFile, buft=None) -> dict:
    """Allocate the file's `external_buffers` contexts (`ggml_backend_alloc_ctx_tensors`); returns
    `{label: Buffer}` after checking each buffer's size and every tensor's `ext_offset`."""
    buft = buft or cpu_buffer_type()
    buffers = {}
    for ext in gf.doc.get("external_buffers", []):
        label = ext["ctx"]
        ctx = gf.contexts.get(label)
        if ctx is None:
            continue
        buf = alloc_ctx_tensors(ctx, buft)
        size = buf.get_size() if buf is not None else 0
        if size != ext["size"]:
            raise RecordMismatchError(f"context {label!r}: ggml's buffer held {ext['size']} bytes, ggml_lite's {size}")
        for t in ctx.tensors:
            want = gf.records[gf.id_of(t)].get("ext_offset")
            if want is not None and t.view_src is None and t.data - buf.get_base() != want:
                raise RecordMismatchError(f"{t.name!r}: ggml put it at offset {want} of {label!r}, "
                                          f"ggml_lite at {t.data - buf.get_base()}")
        buffers[label] = buf
    return buffers


@dataclass
class Plan:
    """A compute-buffer plan: the buffer size and each tensor's offset in it (None: not in it),
    keyed by fixture id."""

    buffer_size: int
    offsets: dict


def plan_of(gf: GraphFile, galloc) -> Plan:
    """The plan `galloc` carried out on `gf`'s tensors: `data - base` of the compute buffer."""
    buf = galloc.buffers[0]
    base = buf.get_base() if buf is not None else None
    offsets = {}
    for i, t in gf.tensors.items():
        holder = t.view_src.buffer if t.view_src is not None else t.buffer
        offsets[i] = t.data - base if buf is not None and holder is buf and t.data is not None else None
    return Plan(galloc.get_buffer_size(0), offsets)


def recorded_plan(gf: GraphFile) -> Plan:
    """The plan the file recorded (for a sequence file: that of `gf.step`)."""
    where = gf.doc["steps"][gf.step] if gf.step is not None else gf.doc
    return Plan(where["buffer_size"], {i: r.get("offset") for i, r in gf.records.items()})


def plan_differences(want: Plan, got: Plan, gf: GraphFile, limit: int = 10) -> list:
    """The first `limit` differences between two plans, in id order, each naming the tensor."""
    out = []
    if want.buffer_size != got.buffer_size:
        out.append(f"buffer size: ggml {want.buffer_size}, ggml_lite {got.buffer_size}")
    for i in sorted(want.offsets):
        if want.offsets[i] != got.offsets.get(i):
            r = gf.records[i]
            out.append(f"tensor #{i} {r['name']!r} ({r['op']}, {r.get('nbytes')} B): "
                       f"ggml offset {want.offsets[i]}, ggml_lite {got.offsets.get(i)}")
            if len(out) >= limit:
                break
    return out


def _call(galloc, name: str, graph):
    with captured_log() as lines:
        ok = getattr(galloc, name)(graph)
    return ok, lines


# %%
# | export
def run_plan(source, step: int = None, galloc=None, call: str = None) -> tuple:
    """Load `source` (path or document, `step` of a sequence), allocate its external contexts, and
    run `call` ("reserve" or "alloc_graph"; default both, as the single-graph files record) on
    `galloc` (a new CPU `GAllocr` when None). Returns `(GraphFile, galloc, {call: result})`, where
    a result holds ok, buffer_size_before, buffer_size, the compute buffer's `handle` (the address
    of its C struct) before and after, and the log lines."""

    gf = read_graph_file(source, step)
    allocate_external(gf)
    galloc = galloc or GAllocr(cpu_buffer_type())
    results = {}
    for name in ([call] if call else ["reserve", "alloc_graph"]):
        before = galloc.buffers[0]
        handle, size_before = (before.handle, galloc.get_buffer_size(0)) if before is not None else (None, 0)
        ok, lines = _call(galloc, name, gf.graph)
        after = galloc.buffers[0]
        results[name] = {"ok": ok, "buffer_size_before": size_before, "buffer_size": galloc.get_buffer_size(0),
                         "handle_before": handle, "handle": after.handle if after is not None else None,
                         "log": lines}
    return gf, galloc, results


_CALLS = {"ggml_gallocr_reserve": "reserve", "ggml_gallocr_alloc_graph": "alloc_graph"}


def _compare_call(label: str, want: dict, got: dict) -> list:
    out = []
    for key, gkey in (("ok", "ok"), ("buffer_size", "buffer_size"), ("buffer_size_before", "buffer_size_before"),
                      ("compute_buffer_replaced", "replaced"), ("log", "log")):
        if key in want and want[key] != got[gkey]:
            out.append(f"{label}: {key}: ggml {want[key]!r}, ggml_lite {got[gkey]!r}")
    return out


# %%
# | export
def check_plan_file(source, limit: int = 10) -> list:
    """Every difference between the file's recorded plan(s) and ggml_lite's (empty: identical):
    offsets, buffer sizes, ok flags, logs; for a sequence file, each step on one allocator."""
    doc = source if isinstance(source, dict) else json.loads(Path(source).read_text())
    if doc.get("schema") != "ggml-gallocr-fixture":
        raise GraphFileError(f"not a graph-allocator fixture (schema {doc.get('schema')!r})")
    out = []
    if "steps" in doc:
        galloc = seen = None  # seen: the compute buffer's address after the last alloc_graph step
        for k, st in enumerate(doc["steps"]):
            call = _CALLS[st["call"]]
            gf, galloc, res = run_plan(doc, k, galloc, call)
            got = res[call]
            # the recorder saw the buffer through a tensor's `buffer`, which only alloc_graph sets
            got["replaced"] = None if call != "alloc_graph" or seen is None else got["handle"] != seen
            if call == "alloc_graph":
                seen = got["handle"]
            out += _compare_call(f"step {k} ({call})", st, got)
            if call == "alloc_graph" and st["ok"]:
                out += [f"step {k}: {d}" for d in plan_differences(recorded_plan(gf), plan_of(gf, galloc), gf, limit)]
    else:
        gf, galloc, res = run_plan(doc)
        for call in ("reserve", "alloc_graph"):
            res[call]["replaced"] = None
            out += _compare_call(call, doc.get(call, {}), res[call])
        out += plan_differences(recorded_plan(gf), plan_of(gf, galloc), gf, limit)
    return out[:limit] if limit else out


# ## 10 · `check` verifies numerics
#
# A fixture-schema file may also record what the real ggml *computed*
# (`tests/fixtures/README.md`): a seed (`data_generator.data_seed`), how each leaf is filled, and the values of every
# OUTPUT node and the last node. With a CPU backend, `python -m ggml_lite check FILE.json` can
# verify them: plan the graph (chapter 05), fill every leaf from its own 32-bit LCG stream,
# compute on the CPU backend, compare. The stream is generated with a jump-ahead — `s_k = M_k·s_0 +
# C_k (mod 2^32)`, where the coefficients for `k = 1..n` are doubled `log2 n` times — so a large
# leaf costs a few numpy operations, not a Python loop per value.
#
# The comparison is relative to the result's largest magnitude, `max|got − want| / max|want|`:
# ggml's SIMD kernels and these numpy ones differ in the last bits, and an element-wise relative
# error is meaningless for outputs near zero. The tolerance is `1e-4` for a graph of f32 tensors
# only and `5e-3` when an f16 or quantized tensor takes part (their rounding differs between the
# two implementations); `check` prints it and the worst error of every result.


# %%
# | export numerics
"""The `numerics` extension of the fixture schema (`tests/fixtures/README.md`): the leaf data
generator, and the verification of recorded results on the CPU backend."""

import numpy as np

from ggml_lite.backend import tensor_get, tensor_set
from ggml_lite.cpu import Arithmetic, cpu_init, quantize_q8_0
from ggml_lite.errors import GraphFileError
from ggml_lite.tensor import F16, F32, I32, Q8_0

MASK = 0xFFFFFFFF
LCG_A, LCG_C = 1664525, 1013904223
TOLERANCE_F32, TOLERANCE_MIXED = Arithmetic.TOLERANCE_F32, Arithmetic.TOLERANCE_MIXED  # the numpy tier's (chapter 07)


def lcg_states(seed: int, n: int) -> np.ndarray:
    """The states `s_1..s_n` of the LCG `s ← (1664525·s + 1013904223) mod 2^32` from `s_0 = seed`."""
    m = np.array([LCG_A], dtype=np.uint64)  # s_k = m[k-1]·s_0 + c[k-1]
    c = np.array([LCG_C], dtype=np.uint64)
    while m.size < n:  # s_{j+k} = m_k·s_j + c_k: double the known coefficients
        mj, cj = m[-1], c[-1]
        m = np.concatenate([m, (m * mj) & MASK])
        c = np.concatenate([c, (m[: c.size] * cj + c) & MASK])
    return ((m[:n] * np.uint64(seed & MASK) + c[:n]) & MASK).astype(np.uint64)


def leaf_values(data_seed: int, leaf_id: int, n: int, kind: str, value_range=None) -> np.ndarray:
    """The `n` values of leaf `leaf_id` in memory order: f32 in [-1, 1), or integers in `range`."""
    u = lcg_states((data_seed + 2654435761 * (leaf_id + 1)) & MASK, n) >> np.uint64(8)
    if value_range is not None or kind in ("int", "i32"):
        if value_range is None:
            raise GraphFileError(f"leaf {leaf_id}: an integer leaf needs a range [lo, hi)")
        lo, hi = value_range
        return (lo + (u % np.uint64(hi - lo)).astype(np.int64)).astype(np.int32)
    return ((u.astype(np.float64) - 2.0**23) / 2.0**23).astype(np.float32)


def fill_leaf(tensor, data_seed: int, leaf_id: int, kind: str = "float", value_range=None) -> None:
    """Write the generated data of one leaf: f32 as is, f16 rounded to nearest even, q8_0 quantized by
    ggml's reference quantizer, i32 integers."""
    n = tensor.ne[0] * tensor.ne[1] * tensor.ne[2] * tensor.ne[3]
    values = leaf_values(data_seed, leaf_id, n, kind, value_range)
    if tensor.type is F32 or tensor.type is I32:
        tensor_set(tensor, values.astype(np.float32 if tensor.type is F32 else np.int32))
    elif tensor.type is F16:
        tensor_set(tensor, values.astype(np.float16))
    elif tensor.type is Q8_0:
        tensor_set(tensor, quantize_q8_0(values).view(np.uint8))
    else:
        raise GraphFileError(f"leaf {leaf_id} ({tensor.name}): no generator for type {tensor.type.name}")


def _values_f32(tensor) -> np.ndarray:
    """The tensor's values as f32 in ggml memory order (i0 fastest)."""
    return tensor_get(tensor).astype(np.float32).reshape(-1)


def data_seed(doc: dict) -> int:
    """The leaf-data seed: `data_generator.data_seed` (the spec's place), else a top-level `data_seed`
    (files written before the spec said so)."""
    gen = doc.get("data_generator")
    seed = gen.get("data_seed") if isinstance(gen, dict) else None
    if seed is None:
        seed = doc.get("data_seed")
    if seed is None:
        raise GraphFileError("numerics: the file has no seed: expected `data_generator.data_seed` (an integer)")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise GraphFileError(f"numerics: the seed must be an integer in [0, 2^32), the file has {seed!r}")
    return seed


# %%
# | export numerics
def verify_numerics(doc: dict, gf, exact: bool = False) -> tuple:
    """Fill the leafs of the planned graph `gf` (a `graphio.GraphFile` after `run_plan`), compute it on
    the CPU backend (`exact`: with the bit-exact tier of appendix A2) and compare every recorded
    result. Returns `(tolerance, rows)` with one row per result: `(name, worst relative error, ok)`."""
    num = doc.get("numerics")
    if not isinstance(num, dict) or "results" not in num or "leaf_data" not in num:
        raise GraphFileError("numerics: the file has no `numerics` block with `leaf_data` and `results`")
    seed = data_seed(doc)
    for leaf in num["leaf_data"]:
        t = gf.tensors.get(leaf["id"])
        if t is None:
            raise GraphFileError(f"numerics: leaf_data names tensor id {leaf['id']}, which the graph does not have")
        fill_leaf(t, seed, leaf["id"], leaf.get("kind", "float"), leaf.get("range"))
    cpu_init(exact=exact).graph_compute(gf.graph)
    mixed = any(t.type.name != "f32" and t.type is not I32 for t in gf.tensors.values())
    tol = TOLERANCE_MIXED if mixed else TOLERANCE_F32
    errors = [(res["name"], _worst(res, _values_f32(gf.tensors[res["id"]]))) for res in num["results"]]
    return tol, [(name, err, err <= tol) for name, err in errors]


def _as_f32(values) -> np.ndarray:
    return np.array([float(v) for v in values], dtype=np.float64)


def _worst(res: dict, got: np.ndarray) -> float:
    """Relative error of one result: against its largest recorded magnitude; for a summarised result,
    the `first` values and the `sum` / `sum_sq` (relative to the sum of magnitudes / sum of squares)."""
    if got.size != res["n_elements"]:
        return float("inf")
    g = got.astype(np.float64)
    if not res.get("summary"):
        want = _as_f32(res["values"])
        scale = max(np.max(np.abs(want)), np.finfo(np.float32).tiny)
        return float(np.max(np.abs(g - want)) / scale) if want.size else 0.0
    first = _as_f32(res["first"])
    scale = max(np.max(np.abs(first)), np.finfo(np.float32).tiny)
    errs = [float(np.max(np.abs(g[: first.size] - first)) / scale)]
    errs.append(abs(g.sum() - res["sum"]) / max(np.abs(g).sum(), 1e-30))
    errs.append(abs((g * g).sum() - res["sum_sq"]) / max(res["sum_sq"], 1e-30))
    return max(errs)



# %% [markdown]
# The generator for leaf 3 of a file with `data_seed` 42 — floats in memory order — and the
# jump-ahead checked against the plain recurrence:

# %%
# NBVAL_CHECK_OUTPUT
print(leaf_values(42, 3, 5, "float"))
print(leaf_values(42, 3, 5, "int", (0, 10)))
s_, plain = (42 + 2654435761 * 4) & MASK, []
for _ in range(1000):
    s_ = (LCG_A * s_ + LCG_C) & MASK
    plain.append(s_)
print("jump-ahead == loop for 1000 states:", lcg_states((42 + 2654435761 * 4) & MASK, 1000).tolist() == plain)


# %% [markdown]
# ## 11 · Check

# %%
assert [t.name for t in back.graph.nodes] == [t.name for t in graph.nodes]
assert [t.name for t in back.graph.leafs] == ["wq", "x"]
assert dumps(to_document(back)) == text  # a round trip changes nothing
assert all(broken(e) != "loaded" for e in cases.values())
assert "tensor #2" in broken(cases["unknown op"]) and "99" in broken(cases["dangling src"])
assert lcg_states(7, 3).tolist()[:2] == [(LCG_A * 7 + LCG_C) & MASK, (LCG_A * ((LCG_A * 7 + LCG_C) & MASK) + LCG_C) & MASK]
print("appendix A1: all checks passed")
