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
# # A3 · Replaying the recorded scheduler scenarios
#
# `tests/fixtures/ggml-seed-sched/` holds 14 runs of the real `ggml_backend_sched` with two FAKE accelerators in
# front of the CPU: a 4-layer LLaMA-style model placed in different ways, every assignment and its cause, the
# splits, the scheduler's graph copy with its offsets, the buffer sizes, the `GGML_SCHED_DEBUG` printout, every
# backend call, and the logits. This appendix rebuilds each set-up and replays it through chapter 09's scheduler, as
# the tests and `python -m ggml_lite sched SCENARIO.json --check` do. Nothing in chapters 00–09 needs it.
#
# **What it takes**: the model, chapter 10's LLaMA builder at toy size (§1); the set-up, SIM configured as each FAKE
# backend, the buffers, the weights regenerated from a hash of their names (§2); every field of the file checked
# before anything is built (§3); every recorded step run again and every fact compared (§4), for all 14 (§5).
# Exported, one idea per module: `ggml_lite.scenario` (the set-up), `ggml_lite.scenario_check` (the file validated,
# form and meaning) and `ggml_lite.scenario_replay` (the replay and its comparisons).

# %%
# | default_exp scenario

# %% [markdown]
# ## 1 · The scenarios' model
#
# A 4-layer LLaMA at toy size, built by chapter 10's builder in the variant the fixtures were recorded with
# (`recorded=True`): `build_llama` makes its weights and cache in one context per backend, `build_graph` a graph.
#
# ## 2 · The set-up: backends, buffers and weights
#
# A replay compares logits bit for bit, so the weights must be the very numbers the recorder used. The file carries
# how to make them: the 32-bit FNV-1a hash of a weight's name seeds the LCG of appendix A1's generator; element *k*
# takes the state after *k*+1 steps, keeps its top 24 bits as *u* in [0, 1), and becomes `offset + scale·(2u − 1)`,
# rounded once to float32. The recorder also wrote the FNV-1a checksum of each weight's stored bytes, so a weight
# generated or converted to f16 differently is caught before any logit is. The FAKE backends' offload rules are
# texts; `offload_rule` maps one to the rule SIM knows.

# %%
# | export
"""What a recorded scheduler scenario sets up (tests/fixtures/ggml-seed-sched/README.md): the FAKE backends
as SIM, buffers, weights, the scheduler and its pins (checks: `scenario_check`; replay: `scenario_replay`)."""

from dataclasses import dataclass

import numpy as np

from ggml_lite.backend import Backend, tensor_set
from ggml_lite.buffer import BufferUsage
from ggml_lite.cpu import cpu_init
from ggml_lite.errors import GraphFileError
from ggml_lite.graph import GGML_DEFAULT_GRAPH_SIZE
from ggml_lite.graphio import GraphFile, read_graph_file
from ggml_lite.models.llama import build_llama
from ggml_lite.numerics import lcg_states
from ggml_lite.sched import BackendSched
from ggml_lite.sim import sim_init
from ggml_lite.tallocr import alloc_ctx_tensors, alloc_ctx_tensors_from_buft
from ggml_lite.tensor import F16, nelements

FNV_OFFSET, FNV_PRIME = 2166136261, 16777619


def fnv1a32(data: bytes) -> int:
    """32-bit FNV-1a: start at 2166136261; per byte, xor it in, then multiply by 16777619 mod 2^32."""
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFF
    return h


def weight_values(seed: int, n: int, offset: float, scale: float) -> np.ndarray:
    """The README's weight generator: `offset + scale·(2u − 1)` per element, u from the LCG of `seed` (§2)."""
    u = (lcg_states(seed, n) >> np.uint64(8)).astype(np.float64) / 2.0**24
    return (offset + scale * (2.0 * u - 1.0)).astype(np.float32)


def weight_gen(name: str) -> tuple:
    """(seed, offset, scale) of a weight, from its name."""
    offset, scale = ((1.0, 0.25) if "norm.weight" in name else (0.0, 1.0) if name == "token_embd.weight"
                     else (0.0, 0.125))
    return fnv1a32(name.encode()), offset, scale


OFFLOAD_RULES = {  # the `offload_op` strings of the fixtures → SIM's rule names
    None: None,
    "op == MUL_MAT && ne[1] >= 32": "mul_mat",
}
CUDA_RULE = "ne[1] >= 32 && op != GET_ROWS"  # the CUDA rule's text starts so (the rest is a comment)


def offload_rule(text):
    """SIM's rule name for a scenario's `offload_op` text."""
    return "cuda" if text is not None and text.startswith(CUDA_RULE) else OFFLOAD_RULES[text]

# %% [markdown]
# From the file to live objects. Each FAKE backend becomes a synchronous SIM device with its alignment, `max_size`,
# deny-list and offload rule, the CPU last, both on appendix A2's bit-exact tier. `load_scenario` reads the round-0
# graph (`validate=False`: `check_scenario` found it equal to the model's) and allocates each weight and cache
# context on its backend. Only a replay (`fill=True`) clears the KV cache (a new SIM buffer holds 0xFF, NaN when
# read) and generates the weights; the debug printout needs neither.

# %%
# | export
def make_backends(doc: dict, clock=None) -> list:
    """The scenario's backends in priority order: SIM as each FAKE backend, the CPU last (§2)."""
    out: list[Backend] = []
    for b in doc["backends"]:
        if b["is_cpu"]:
            out.append(cpu_init(exact=True))  # the recorded logits are compared bit for bit
        else:
            out.append(sim_init(b["name"], alignment=b["alignment"], max_size=b["max_size"],
                                   deny_ops=b["supports_op_denied"], offload=offload_rule(b["offload_op"]),
                                   asynchronous=False, clock=clock, exact=True))
    return out


@dataclass
class Scenario:
    doc: dict
    backends: list
    gf: GraphFile  # the round-0 graph
    buffers: dict  # external context label -> Buffer


def load_scenario(doc: dict, clock=None, fill: bool = True) -> Scenario:
    """Backends, round-0 graph and external buffers; with `fill` (a replay) the cache cleared, the weights made."""
    if "graph" not in doc:
        raise GraphFileError(f"scenario {doc.get('fixture')} records no graph (outcome {doc.get('outcome')}); "
                                "build it with the LLaMA builder of the scenario's model")
    backends = make_backends(doc, clock)
    by_name = {b.get_name(): b for b in backends}
    gf = read_graph_file(doc, graph_size=doc["sched_params"]["graph_size"], validate=False)
    buffers = {}
    for ext in doc["external_buffers"]:
        ctx = gf.contexts[ext["ctx"]]
        buf = alloc_ctx_tensors_from_buft(ctx, by_name[ext["buffer_type"]].get_default_buffer_type())
        buf.set_usage(BufferUsage[ext["usage"]])
        if fill and ext["ctx"].startswith("kv_cache:"):
            buf.clear(0)
        buffers[ext["ctx"]] = buf
    if fill:
        fill_weights(doc, {t.name: t for t in gf.tensors.values()})
    return Scenario(doc, backends, gf, buffers)


def fill_weights(doc: dict, tensors: dict) -> None:
    """Every weight of the scenario regenerated from its name (`tensors`: name -> tensor)."""
    for w in doc["weights"]:
        t = tensors[w["name"]]
        seed, offset, scale = weight_gen(w["name"])
        values = weight_values(seed, nelements(t), offset, scale)
        tensor_set(t, values.astype(np.float16) if t.type is F16 else values)

# %% [markdown]
# The scheduler and its pins. `new_sched` is `ggml_backend_sched_new` with the scenario's `sched_params`;
# `apply_pins` makes the recorded `ggml_backend_sched_set_tensor_backend` calls, again after every reset, which
# forgets them (chapter 09, §2.2). Scenario 13 recorded no graph, as the reference aborted in its first call:
# `built_scenario` builds its set-up from the model alone, with the README's round-0 batch `ROUND0` (16 tokens, 32
# cells of cache attended, one output).

# %%
# | export
ROUND0 = {"n_tokens": 16, "n_kv": 32, "kv_head": 0, "n_outputs": 1}  # the README's round-0 batch


def new_sched(doc, backends, debug: bool | None = None) -> BackendSched:
    """`ggml_backend_sched_new` as the scenario's `sched_params` say (graph size, parallel, debug)."""
    sp = doc.get("sched_params", {})
    return BackendSched(backends, graph_size=sp.get("graph_size", GGML_DEFAULT_GRAPH_SIZE),
                        parallel=sp.get("parallel", False),
                        debug=sp.get("GGML_SCHED_DEBUG", True) if debug is None else debug)


def apply_pins(sched, graph, doc, backends) -> None:
    """The scenario's `ggml_backend_sched_set_tensor_backend` calls, on the tensors of `graph`."""
    by_name = {b.get_name(): b for b in backends}
    for p in doc.get("pins", []):
        sched.set_tensor_backend(graph.get_tensor(p["tensor"]), by_name[p["backend"]])


def built_scenario(doc, buffers: dict | None = None) -> tuple:
    """`(backends, round-0 graph)` built from the model alone, for a scenario that recorded no graph (13)."""
    backends = make_backends(doc)
    by_name = {b.get_name(): b for b in backends}
    usage = {e["ctx"]: e["usage"] for e in doc.get("external_buffers", [])}
    ctxs, graph, _ = build_llama(doc["model"], doc["placement"], ROUND0, recorded=True)
    for ctx in ctxs[:-1]:
        buf = alloc_ctx_tensors(ctx, by_name[ctx.name.split(":")[1]])
        kind = BufferUsage.WEIGHTS if ctx.name.startswith("weights") else BufferUsage.ANY
        buf.set_usage(BufferUsage[usage[ctx.name]] if ctx.name in usage else kind)
        if buffers is not None:
            buffers[ctx.name] = buf
    return backends, graph

# %% [markdown]
# ## 3 · Validation: nothing is built from a field before it is checked
#
# A scenario file is input like any other: a pin may name no tensor, `n_head` may be 0, `max_size` `NaN`.
# `check_scenario` reads every field before anything is built and refuses the file with a `GraphFileError` naming
# the file, the field as a JSON path, what was expected and what was found. In order: **the form** of every field
# (§3.1); **the constants** (`schema_version` 1, ggml_lite's `GGML_SCHED_MAX_*`: other limits cannot be replayed);
# **the cross references** (§3.2); **the recorded graph** against the model's; and, for a replay, **the work**. What
# passes is replayed: a recorded fact that differs is a *difference* (exit 1), and so is an abort of ggml_lite's
# scheduler where the recorded run completed; a field of the wrong form or meaning is an *error* (exit 2).
#
# ### 3.1 · The form
#
# The form is declared, not programmed: small checkers, each with one method `check(value, path, where)` that
# returns quietly or raises. First what every refusal needs: `found` describes a value in a few words (a number's
# size, a string quoted to 60 characters, a long list by its length), `refuse` builds the one message every check
# gives, and `same_json` is an equality that tells `true` from 1 and 1 from 1.0 (`==` does not).

# %%
# | export scenario_check
"""Validation of a scheduler scenario file before anything is built from it: the form of every field
(`SCENARIO_SCHEMA`), what the fields must mean (`check_scenario`) and the work a replay would take
(`check_replay_work`); every refusal a `GraphFileError` naming the field by its JSON path."""

import json
import math
import re
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from ggml_lite.buffer import TENSOR_ALIGNMENT, BufferUsage
from ggml_lite.errors import GraphFileError, GraphFullError
from ggml_lite.graph import GGML_DEFAULT_GRAPH_SIZE
from ggml_lite.graphio import graph_document
from ggml_lite.models.llama import LAYER_WEIGHTS, build_graph, build_llama, model_tensors
from ggml_lite.scenario import CUDA_RULE, OFFLOAD_RULES, ROUND0, weight_gen
from ggml_lite.sched import GGML_SCHED_MAX_BACKENDS, GGML_SCHED_MAX_COPIES, GGML_SCHED_MAX_SPLIT_INPUTS
from ggml_lite.tensor import GGML_MAX_SRC, Op, TensorFlag, nbytes, nelements
from ggml_lite.untrusted import MAX_QUOTE, quote

ABSENT = object()  # a field the file does not have


def found(v) -> str:
    """A short description of a JSON value, for error messages."""
    if v is ABSENT:
        return "nothing (the field is missing)"
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    if isinstance(v, int):
        return f"{v}" + (f" (about 2^{v.bit_length() - 1})" if abs(v) >= 2**53 else "")
    if isinstance(v, float):
        return repr(v) + ("" if math.isfinite(v) else " (not a finite number)")
    if isinstance(v, str):
        return "the string " + quote(v)
    if len(text := json.dumps(v)) <= 60:
        return text
    if isinstance(v, list):
        return f"a list of {len(v)} item{'s' if len(v) != 1 else ''}"
    return f"an object with keys {', '.join(quote(k) for k in list(v)[:6])}"


def refuse(where: str, path: str, expected: str, v=ABSENT) -> NoReturn:
    raise GraphFileError(f"{where}: {path}: expected {expected}, found {found(v)}")


def _at(path: str, key) -> str:
    key = key if isinstance(key, int) else key[:MAX_QUOTE]  # (a key of 100,000 characters is not all quoted)
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)


def same_json(a, b) -> bool:
    """JSON equality that tells a bool from an integer and an integer from a float (and NaN from itself)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(map(same_json, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    return a == b

# %% [markdown]
# The scalars. `Int` refuses a bool (Python's `True` is an integer, JSON's `true` is not) and a float (`2.0`); `Num`
# takes both, inside its bounds, and since every comparison with NaN is false, NaN fails `lo <= v <= hi` with no
# test of its own, as do the infinities. `Str` bounds the length (a name of a million characters is refused, not
# quoted); `Opt` admits null and says so in the message.

# %%
# | export scenario_check
@dataclass(frozen=True)
class Int:
    lo: int
    hi: int

    def check(self, v, path, where):
        if isinstance(v, bool) or not isinstance(v, int) or not self.lo <= v <= self.hi:
            refuse(where, path, f"an integer in [{self.lo}, {self.hi}]", v)


@dataclass(frozen=True)
class Num:
    lo: float
    hi: float

    def check(self, v, path, where):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not self.lo <= v <= self.hi:
            refuse(where, path, f"a finite number in [{self.lo:g}, {self.hi:g}]", v)


@dataclass(frozen=True)
class Str:
    choices: tuple | None = None
    maxlen: int = 4096

    def check(self, v, path, where):
        if self.choices is not None and v not in self.choices:
            refuse(where, path, "one of " + ", ".join(json.dumps(c) for c in self.choices), v)
        if not isinstance(v, str) or len(v) > self.maxlen:
            refuse(where, path, f"a string of at most {self.maxlen} characters", v)


@dataclass(frozen=True)
class Opt:
    of: Any  # a checker

    def check(self, v, path, where):
        if v is not None:
            try:
                self.of.check(v, path, where)
            except GraphFileError as e:
                raise GraphFileError(str(e).replace(": expected ", ": expected null or ", 1)) from None


class Bool:
    def check(self, v, path, where):
        if not isinstance(v, bool):
            refuse(where, path, "true or false", v)

# %% [markdown]
# The containers nest them. `List` bounds its length and checks each item at its own path (`steps[3].splits[0]`);
# `Obj` names a missing field and refuses one it does not declare: a misspelt optional field would be ignored, and
# the replay would check less than its author thinks. `Map` is an object keyed by names. `Deferred` only asks for an
# object, since the graph is compared whole with the model's (§3.2), and `Tagged` picks a step's form by its `call`.

# %%
# | export scenario_check
@dataclass(frozen=True)
class List:
    of: Any  # a checker
    lo: int = 0
    hi: int = 1 << 20

    def check(self, v, path, where):
        if not isinstance(v, list) or not self.lo <= len(v) <= self.hi:
            refuse(where, path, f"a list of {self.lo} to {self.hi} items", v)
        for i, x in enumerate(v):
            self.of.check(x, _at(path, i), where)


@dataclass(frozen=True)
class Obj:
    fields: dict
    optional: tuple = ()

    def check(self, v, path, where):
        if not isinstance(v, dict):
            refuse(where, path or "the top level", "an object", v)
        for k in v:
            if k not in self.fields:
                refuse(where, _at(path, k), f"no such field (a field ggml_lite does not know would be ignored; "
                       f"the fields here are {', '.join(self.fields)})", v[k])
        for k, spec in self.fields.items():
            if k in v:
                spec.check(v[k], _at(path, k), where)
            elif k not in self.optional:
                refuse(where, _at(path, k), "this field", ABSENT)


@dataclass(frozen=True)
class Map:
    """An object whose keys are names (a backend's name -> its buffer size)."""
    of: Any  # a checker
    hi: int = 64

    def check(self, v, path, where):
        if not isinstance(v, dict) or len(v) > self.hi:
            refuse(where, path, f"an object of at most {self.hi} names", v)
        for k, x in v.items():
            self.of.check(x, _at(path, k), where)


@dataclass(frozen=True)
class Deferred:
    """An object checked later, as a whole (the recorded graph, against the model)."""
    what: str

    def check(self, v, path, where):
        if not isinstance(v, dict):
            refuse(where, path, self.what, v)


@dataclass(frozen=True)
class Tagged:
    """An object whose form depends on one of its string fields (a step on its `call`)."""
    tag: str
    forms: dict

    def check(self, v, path, where):
        if not isinstance(v, dict):
            refuse(where, path, "an object", v)
        Str(tuple(self.forms)).check(v.get(self.tag, ABSENT), _at(path, self.tag), where)
        self.forms[v[self.tag]].check(v, path, where)

# %% [markdown]
# The schema of a step. Every count has a bound with a reason: `MAX_CTX` (2^20 cells or tokens), `MAX_ROUNDS` (16),
# `MAX_GRAPH_SIZE` (the scheduler allocates four arrays of 21 times it), the scheduler's `GGML_SCHED_MAX_*`. A
# reserve step records its batch, buffer sizes and stderr; an alloc_graph step adds the splits, every tensor's
# backend, cause and place, and the scheduler's graph copy.

# %%
# | export scenario_check
LLAMA_MAX_LAYERS = 512  # llama.cpp's limit on n_layer
MAX_CTX = 1 << 20  # cells of KV cache (and tokens of a batch)
MAX_ROUNDS = 16  # alloc_graph + graph_compute pairs after the reserve
MAX_GRAPH_SIZE = 1 << 16  # sched_params.graph_size: the scheduler allocates 4 arrays of 21x this
SIZE, COUNT, NAME, TEXT = Int(0, 1 << 48), Int(0, 1 << 20), Str(maxlen=128), Str()
OP_NAMES = tuple(op.name for op in Op)
USAGES = tuple(u.name for u in BufferUsage)
KQ_MASK_TEXT = "0 where row i < n_tokens and column j <= kv_head + i, else -inf"
BATCH = Obj({"n_tokens": Int(1, MAX_CTX), "n_kv": Int(1, MAX_CTX), "kv_head": Int(0, MAX_CTX - 1),
             "n_outputs": Int(1, MAX_CTX)})
COPY_NAMES = List(NAME, 0, GGML_SCHED_MAX_COPIES)
STEP_COMMON = {"step": COUNT, "call": Str(), "round": Int(0, MAX_ROUNDS)}
RESERVE = {**STEP_COMMON, "batch": BATCH, "ok": Bool(), "n_splits": COUNT,
           "n_copies": Int(1, GGML_SCHED_MAX_COPIES), "buffer_sizes": Map(SIZE, GGML_SCHED_MAX_BACKENDS),
           "stderr": List(TEXT)}
PLACED = {"buffer": Opt(NAME), "offset": Opt(SIZE), "ext_offset": Opt(SIZE)}
ALLOC_GRAPH = Obj({
    **RESERVE, "cur_copy": Int(0, GGML_SCHED_MAX_COPIES - 1),
    "splits": List(Obj({"index": COUNT, "backend": NAME, "i_start": COUNT, "i_end": COUNT,
                        "n_inputs": Int(0, GGML_SCHED_MAX_SPLIT_INPUTS), "graph_n_nodes": COUNT,
                        "inputs": List(Obj({"name": NAME, "from_backend": NAME, "nbytes": SIZE, "copies": COPY_NAMES}),
                                       0, GGML_SCHED_MAX_SPLIT_INPUTS)})),
    "graph_inputs": List(Obj({"name": NAME, "backend": NAME, "copies": COPY_NAMES}), 0, GGML_SCHED_MAX_SPLIT_INPUTS),
    "tensors": List(Obj({"id": COUNT, "name": NAME, "backend": Opt(NAME), "cause": Opt(Str(maxlen=16)),
                         "src_names": List(NAME, 0, GGML_MAX_SRC), **PLACED})),
    "sched_graph": Obj({"n_nodes": COUNT, "n_leafs": COUNT, **{k: List(Obj({
        "i": COUNT, "name": NAME, "op": Str(OP_NAMES), "backend": Opt(NAME), "view_src": Opt(NAME),
        "flags_value": Int(0, 7), "nbytes": SIZE, **PLACED})) for k in ("nodes", "leafs")}})})

# %% [markdown]
# A graph_compute step records the inputs (the mask in words: it is causal), the backend calls in order, and the
# logits, each within float32's range. The top level lists the set-up and the steps; a field only some files have is
# optional.

# %%
# | export scenario_check
INT32S = List(Int(-(1 << 31), (1 << 31) - 1), 0, MAX_CTX)
F32_MAX = float(np.finfo(np.float32).max)  # a recorded logit is a float32
GRAPH_COMPUTE = Obj({
    **STEP_COMMON, "status": Int(-2, 1), "cur_copy_after": Int(0, GGML_SCHED_MAX_COPIES - 1),
    "inputs": Obj({"inp_tokens": INT32S, "inp_pos": INT32S, "inp_out_ids": INT32S, "KQ_mask": Str((KQ_MASK_TEXT,))}),
    "trace": List(TEXT), "stderr": List(TEXT),
    "outputs": List(Obj({"name": Str(("result_output",)), "type": Str(("f32",)), "ne": List(Int(1, 1 << 24), 4, 4),
                         "sum": Num(-1e300, 1e300), "sum_abs": Num(0, 1e300), "all_finite": Bool(),
                         "max_abs_diff_vs_cpu_reference": Num(0, 1e300),
                         "values": List(Num(-F32_MAX, F32_MAX), 1, 1 << 24)}), 1, 1)})
SCENARIO_SCHEMA = Obj({
    "schema": Str(("ggml-sched-fixture",)), "schema_version": Int(1, 1), "fixture": Str(maxlen=256),
    "description": TEXT, "ggml_commit": Str(maxlen=64), "ggml_build": TEXT,
    "sched_params": Obj({"graph_size": Int(1, MAX_GRAPH_SIZE), "parallel": Bool(),
                         "GGML_SCHED_MAX_BACKENDS": Int(GGML_SCHED_MAX_BACKENDS, GGML_SCHED_MAX_BACKENDS),
                         "GGML_SCHED_MAX_SPLIT_INPUTS": Int(GGML_SCHED_MAX_SPLIT_INPUTS, GGML_SCHED_MAX_SPLIT_INPUTS),
                         "GGML_SCHED_MAX_COPIES": Int(GGML_SCHED_MAX_COPIES, GGML_SCHED_MAX_COPIES),
                         "GGML_SCHED_DEBUG": Bool(), "cpu_n_threads": Int(1, 1),
                         "n_copies": Int(1, GGML_SCHED_MAX_COPIES)}, optional=("n_copies",)),
    "backends": List(Obj({"index": Int(0, GGML_SCHED_MAX_BACKENDS - 1), "name": Str(maxlen=32), "is_cpu": Bool(),
                          "buffer_type": Str(maxlen=32), "is_host": Bool(), "alignment": Int(1, 1 << 16),
                          "max_size": Opt(Int(1, 1 << 62)), "alloc_size": Str(("ggml_nbytes",)), "supports_op": TEXT,
                          "supports_op_denied": List(Str(OP_NAMES), 0, len(OP_NAMES)), "supports_buft": TEXT,
                          "offload_op": Opt(TEXT), "events": Bool(), "cpy_tensor": TEXT}), 2, GGML_SCHED_MAX_BACKENDS),
    "model": Obj({"arch": TEXT, "n_embd": Int(1, 1 << 16), "n_head": Int(1, 1 << 10), "n_head_kv": Int(1, 1 << 10),
                  "n_ff": Int(1, 1 << 18), "n_vocab": Int(1, 1 << 21), "n_layer": Int(1, LLAMA_MAX_LAYERS),
                  "n_ctx": Int(1, MAX_CTX), "wtype": Str(("f16", "f32")), "kvtype": Str(("f16", "f32")),
                  "rms_norm_eps": Num(1e-12, 1.0),
                  "rope": Obj({"mode": Int(0, 0), "n_dims": Int(2, 1 << 16), "n_ctx_orig": Int(1, 1 << 24),
                               "freq_base": Num(1e-6, 1e9), "freq_scale": Num(1e-6, 1e6),
                               **{k: Num(-1e6, 1e6)
                                  for k in ("ext_factor", "attn_factor", "beta_fast", "beta_slow")}})}),
    "placement": Obj({"token_embd": NAME, "output": NAME, "layers": List(NAME, 1, LLAMA_MAX_LAYERS),
                      "kv_cache": List(NAME, 1, LLAMA_MAX_LAYERS)}),
    "external_buffers": List(Obj({"ctx": NAME, "buffer_type": NAME, "usage": Str(USAGES), "size": SIZE,
                                  "is_multi_buffer": Bool(),
                                  "parts": List(Obj({"size": SIZE, "usage": Str(USAGES)}), 1)},
                                 optional=("parts",)), 1, 2 * GGML_SCHED_MAX_BACKENDS),
    "weights": List(Obj({"name": NAME, "type": Str(("f16", "f32")), "ne": List(Int(1, 1 << 21), 1, 4), "buffer": NAME,
                         "ext_offset": SIZE, "gen": Obj({"seed": Int(0, 2**32 - 1), "offset": Num(-1e6, 1e6),
                                                         "scale": Num(-1e6, 1e6)}),
                         "fnv1a32_of_bytes": Int(0, 2**32 - 1)}),
                    1, 3 + len(LAYER_WEIGHTS) * LLAMA_MAX_LAYERS),
    "pins": List(Obj({"tensor": NAME, "backend": NAME, "rule": TEXT}, optional=("rule",)), 0, 1 << 16),
    "graph": Deferred("an object (the round-0 graph, checked against the model below)"),
    "fake_buffer_allocations": List(TEXT, 0, 1 << 16),
    "steps": List(Tagged("call", {"ggml_backend_sched_reserve": Obj(RESERVE),
                                  "ggml_backend_sched_alloc_graph": ALLOC_GRAPH,
                                  "ggml_backend_sched_graph_compute": GRAPH_COMPUTE}), 0, 1 + 2 * MAX_ROUNDS),
    "outcome": Obj({"completed": Bool(), "failed_call": Str(("ggml_backend_sched_reserve",)), "signal": Int(6, 6),
                    "signal_name": Str(("SIGABRT",)), "stderr_until_abort": List(TEXT, 1)},
                   optional=("failed_call", "signal", "signal_name", "stderr_until_abort")),
}, optional=("fixture", "description", "ggml_commit", "ggml_build", "sched_params", "external_buffers", "weights",
             "pins", "graph", "fake_buffer_allocations", "steps"))
POST_ALLOC: dict[str, Any] = {  # what the recorder saw after round 0
    "preallocated": Bool(), "buffer": Opt(NAME), "offset": Opt(SIZE), "ext_offset": Opt(SIZE),
    "sched_backend": Opt(NAME), "sched_cause": Opt(Str(maxlen=16))}

# %% [markdown]
# ### 3.2 · What the fields must mean
#
# The form says nothing of meaning: a backend list may put the CPU first, a placement may name no backend. Backends:
# `index` is the position, names are unique identifiers, the CPU is last and only there, and what the replay cannot
# vary (host memory, events, how copies work) must be what a FAKE backend or the CPU *is* here (`CPU_BACKEND`,
# `FAKE_BACKEND`); an alignment is a power of two, an offload rule one SIM knows. Names: the placement (one backend
# per layer) and the pins name backends, and `n_copies` is what `parallel` makes it.

# %%
# | export scenario_check
CPU_BACKEND = {"name": "CPU", "buffer_type": "CPU", "is_host": True, "alignment": TENSOR_ALIGNMENT, "max_size": None,
               "supports_op": "ggml_backend_cpu_supports_op", "supports_op_denied": [],
               "supports_buft": "host buffer types",
               "offload_op": None, "events": False, "cpy_tensor": "memcpy when the source is host memory, else false"}
FAKE_BACKEND = {"is_host": False, "supports_op": "all ops except the deny-list",
                "supports_buft": "only its own buffer type",
                "events": True, "cpy_tensor": "memcpy when the source is in any FAKE buffer, else false"}




def _check_backends(doc, where) -> list:
    """The backends are FAKE devices SIM can be, and the CPU last; returns their names."""
    bs = doc["backends"]
    names = [b["name"] for b in bs]
    for i, b in enumerate(bs):
        p = f"backends[{i}]"
        if b["index"] != i:
            refuse(where, p + ".index", f"{i} (its position in the list)", b["index"])
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", b["name"]) or names.index(b["name"]) != i:
            refuse(where, p + ".name", "a name of letters, digits and _ that no other backend has", b["name"])
        if b["is_cpu"] != (i == len(bs) - 1):
            refuse(where, p + ".is_cpu", f"{json.dumps(i == len(bs) - 1)} (the CPU comes last, and only there)",
                   b["is_cpu"])
        want = CPU_BACKEND if b["is_cpu"] else {**FAKE_BACKEND, "buffer_type": b["name"]}
        for k, v in want.items():
            if not same_json(b[k], v):
                refuse(where, f"{p}.{k}", f"{json.dumps(v)} (what a{' CPU' if b['is_cpu'] else ' FAKE'} backend is "
                       "in ggml_lite's replay)", b[k])
        if b["alignment"] & (b["alignment"] - 1):
            refuse(where, p + ".alignment", "a power of two", b["alignment"])
        deny = b["supports_op_denied"]
        if len(set(deny)) != len(deny):
            refuse(where, p + ".supports_op_denied", "op names, each once", deny)
        if b["offload_op"] is not None and b["offload_op"] not in OFFLOAD_RULES and \
                not b["offload_op"].startswith(CUDA_RULE):
            refuse(where, p + ".offload_op", f"null, {json.dumps(next(k for k in OFFLOAD_RULES if k))} or a text "
                   f"starting {json.dumps(CUDA_RULE)} (the rules SIM has)", b["offload_op"])
    return names


def _check_names(doc, where, names) -> None:
    """Placement, pins and n_copies against the backends and the model."""
    pl, model = doc["placement"], doc["model"]
    for key in ("token_embd", "output"):
        if pl[key] not in names:
            refuse(where, f"placement.{key}", f"a backend's name ({', '.join(names)})", pl[key])
    for key in ("layers", "kv_cache"):
        if len(pl[key]) != model["n_layer"]:
            refuse(where, f"placement.{key}", f"a list of model.n_layer = {model['n_layer']} backend names", pl[key])
        for i, name in enumerate(pl[key]):
            if name not in names:
                refuse(where, f"placement.{key}[{i}]", f"a backend's name ({', '.join(names)})", name)
    for i, pin in enumerate(doc.get("pins", [])):
        if pin["backend"] not in names:
            refuse(where, f"pins[{i}].backend", f"a backend's name ({', '.join(names)})", pin["backend"])
    sp = doc.get("sched_params", {})
    if "n_copies" in sp and sp["n_copies"] != (GGML_SCHED_MAX_COPIES if sp["parallel"] else 1):
        refuse(where, "sched_params.n_copies", f"{GGML_SCHED_MAX_COPIES if sp['parallel'] else 1} (ggml's n_copies "
               f"for parallel {json.dumps(sp['parallel'])})", sp["n_copies"])

# %% [markdown]
# The model must be a LLaMA chapter 10's builder can build (the checks of `LlamaParams`, by JSON path). The steps
# come in ggml's order: the reserve, then an alloc_graph and a graph_compute per round, each numbered by its
# position and round; an aborted scenario has no steps and ends with ggml's abort line. A batch fits the cache
# (`kv_head + n_tokens ≤ n_kv ≤ n_ctx`) and asks for no more outputs than tokens.

# %%
# | export scenario_check
def _check_model(doc, where) -> None:
    """A LLaMA chapter 10's builder can build (the checks of `LlamaParams`, by JSON path)."""
    m = doc["model"]
    if not m["arch"].startswith("llama"):
        refuse(where, "model.arch", "a text starting \"llama\" (the only builder of the replay)", m["arch"])
    if m["n_embd"] % m["n_head"]:
        refuse(where, "model.n_head", f"a divisor of model.n_embd = {m['n_embd']}", m["n_head"])
    if m["n_head"] % m["n_head_kv"]:
        refuse(where, "model.n_head_kv", f"a divisor of model.n_head = {m['n_head']}", m["n_head_kv"])
    head = m["n_embd"] // m["n_head"]
    if m["rope"]["n_dims"] > head or m["rope"]["n_dims"] % 2:
        refuse(where, "model.rope.n_dims", f"an even number of at most the head size n_embd / n_head = {head}",
               m["rope"]["n_dims"])


def _check_steps(doc, where) -> list:
    """The steps in ggml's order, each batch within the cache; the batches, the reserve's first (§3.2)."""
    steps, n_ctx = doc.get("steps", []), doc["model"]["n_ctx"]
    outcome = doc["outcome"]
    if not outcome["completed"]:
        for key in ("failed_call", "signal", "signal_name", "stderr_until_abort"):
            if key not in outcome:
                refuse(where, f"outcome.{key}", "this field (the scenario did not complete)")
        if steps:
            refuse(where, "steps", "an empty list (the reference aborted in its first call)", steps)
        if not outcome["stderr_until_abort"][-1].partition(": ")[2].strip():
            refuse(where, f"outcome.stderr_until_abort[{len(outcome['stderr_until_abort']) - 1}]",
                   "ggml's abort line, `file:line: message`", outcome["stderr_until_abort"][-1])
        batches = [ROUND0]
    else:
        extra = [k for k in outcome if k != "completed"]
        if extra:
            refuse(where, f"outcome.{extra[0]}", "no such field in a scenario that completed", outcome[extra[0]])
        if len(steps) % 2 == 0:
            refuse(where, "steps", "the reserve, then an alloc_graph and a graph_compute step per round (there must "
                   "be something to replay)" if steps else "at least the reserve step: nothing to compare", steps)
        calls = ["ggml_backend_sched_reserve"] + [
            "ggml_backend_sched_alloc_graph", "ggml_backend_sched_graph_compute"] * (len(steps) // 2)
        for k, (st, call) in enumerate(zip(steps, calls)):
            if st["call"] != call:
                refuse(where, f"steps[{k}].call", json.dumps(call), st["call"])
            if st["step"] != k:
                refuse(where, f"steps[{k}].step", f"{k} (its position)", st["step"])
            if st["round"] != max(0, (k - 1) // 2):
                refuse(where, f"steps[{k}].round", f"{max(0, (k - 1) // 2)}", st["round"])
        batches = [st["batch"] for st in steps if "batch" in st]
    if not outcome["completed"] and ROUND0["n_kv"] > n_ctx:
        refuse(where, "model.n_ctx", f"at least {ROUND0['n_kv']} (the round-0 batch of the README has n_kv "
               f"{ROUND0['n_kv']})", n_ctx)
    for k, b in enumerate(batches if outcome["completed"] else []):
        p = f"steps[{2 * k - 1 if k else 0}].batch"
        if b["n_outputs"] > b["n_tokens"]:
            refuse(where, p + ".n_outputs", f"at most n_tokens = {b['n_tokens']}", b["n_outputs"])
        if not b["kv_head"] + b["n_tokens"] <= b["n_kv"] <= n_ctx:
            refuse(where, p + ".n_kv", f"at least kv_head + n_tokens = {b['kv_head'] + b['n_tokens']} (the cells the "
                   f"batch writes are attended to) and at most model.n_ctx = {n_ctx}", b["n_kv"])
    return batches

# %% [markdown]
# The recorded round-0 graph is not trusted to describe the model: `_check_graph` compares it, record for record,
# with the one the model, placement and first batch give (`graph_document`, appendix A1's writer), so the replay
# computes the very graph the recorder did (`POST_ALLOC`, written after round 0, is compared by the replay).
# `_check_weights` wants one record per weight of the model, of its type, shape, context and generator, and one
# external buffer per context, on its backend.

# %%
# | export scenario_check
def _check_graph(doc, where, ctxs, graph, roots) -> None:
    """The recorded round-0 graph is the one the builder makes of the model, record for record (§3.2)."""
    want = graph_document(graph, ctxs, roots)["graph"]
    got = doc["graph"]
    by = "model, placement" + (", steps[0].batch" if doc.get("steps") else "") + " and sched_params.parallel"
    for key in want:
        if key != "tensors" and not same_json(got.get(key, ABSENT), want[key]):
            refuse(where, f"graph.{key}", f"{found(want[key])} (what the {by} give)",
                   got.get(key, ABSENT))
    extra = set(got) - set(want)
    if extra:
        refuse(where, f"graph.{min(extra)}", "no such field", got[min(extra)])
    recs = got.get("tensors")
    if not isinstance(recs, list) or len(recs) != len(want["tensors"]):
        refuse(where, "graph.tensors", f"a list of the {len(want['tensors'])} tensors the model gives", recs)
    parallel = doc.get("sched_params", {}).get("parallel", False)
    for i, (rec, w) in enumerate(zip(recs, want["tensors"])):
        p = f"graph.tensors[{i}]"
        if not isinstance(rec, dict):
            refuse(where, p, "an object", rec)
        if parallel and "INPUT" in w["flags"]:
            w = {**w, "flags": ["INPUT", "OUTPUT"], "flags_value": int(TensorFlag.INPUT | TensorFlag.OUTPUT)}
        for key, spec in POST_ALLOC.items():
            spec.check(rec.get(key, ABSENT), f"{p}.{key}", where)
        for key, value in rec.items():
            if key not in POST_ALLOC and not same_json(value, w.get(key, ABSENT)):
                refuse(where, f"{p}.{key}", f"{found(w[key]) if key in w else 'no such field'} (what the {by} give)",
                       value)
        for key in w.keys() - rec.keys() - POST_ALLOC.keys():
            refuse(where, f"{p}.{key}", f"{found(w[key])} (what the {by} give)")


def _check_weights(doc, where, ctxs) -> None:
    """One record per weight of the model and one external buffer per context, as the model gives (§3.2)."""
    model_w = {t.name: (t, c.name) for c in ctxs if c.name.startswith("weights:") for t in c.tensors}
    seen = set()
    for i, w in enumerate(doc.get("weights", [])):
        p = f"weights[{i}]"
        if w["name"] not in model_w or w["name"] in seen:
            refuse(where, p + ".name", "the name of a weight of the model (e.g. blk.0.attn_q.weight), each once",
                   w["name"])
        seen.add(w["name"])
        t, label = model_w[w["name"]]
        ne = list(t.ne)
        part = re.fullmatch(re.escape(label) + r"\[\d{1,5}\]", w["buffer"])  # a multi-buffer's part: a fact
        facts = (("type", t.type.name), ("ne", ne[:len(w["ne"])]), ("buffer", w["buffer"] if part else label))
        for key, value in facts:
            if not same_json(w[key], value) or (key == "ne" and any(n != 1 for n in ne[len(w["ne"]):])):
                refuse(where, f"{p}.{key}", f"{found(value)} (what the model and placement give)", w[key])
        gen = dict(zip(("seed", "offset", "scale"), weight_gen(w["name"])))
        for key, value in gen.items():
            if w["gen"][key] != value:
                refuse(where, f"{p}.gen.{key}", f"{value:g} (the README's generator, from the name)", w["gen"][key])
    if doc.get("weights") is not None and len(seen) != len(model_w):
        refuse(where, "weights", f"a record of each of the model's {len(model_w)} weights; "
               f"{next(n for n in model_w if n not in seen)} has none", doc["weights"])
    labels = [c.name for c in ctxs[:-1]]
    exts = doc.get("external_buffers", [])
    for i, ext in enumerate(exts):
        p = f"external_buffers[{i}]"
        if ext["ctx"] not in labels or [e["ctx"] for e in exts].index(ext["ctx"]) != i:
            refuse(where, p + ".ctx", f"one of the model's contexts ({', '.join(labels)}), each once", ext["ctx"])
        if ext["buffer_type"] != ext["ctx"].split(":")[1]:
            refuse(where, p + ".buffer_type", json.dumps(ext["ctx"].split(":")[1]) + " (the context's backend)",
                   ext["buffer_type"])
        if ext["is_multi_buffer"] != ("parts" in ext):
            refuse(where, p + (".parts" if "parts" in ext else ".is_multi_buffer"), "parts exactly when "
                   "is_multi_buffer is true", ext.get("parts", ext["is_multi_buffer"]))
    if "external_buffers" in doc and len(exts) != len(labels):
        refuse(where, "external_buffers", f"a buffer per context of model and placement ({', '.join(labels)})", exts)

# %% [markdown]
# The work. A file's model dimensions can ask for anything: `check_replay_work` estimates, before anything is
# allocated, the bytes of weights, cache, compute buffers and the generator's temporaries, the weight bytes to
# generate and checksum, and the multiply-adds of all rounds, and refuses a file past 2 GiB, 64 MiB or 2^31.
# `_check_graph_size` refuses a `graph_size` without room in ggml's hash set for every tensor and copy: ggml would
# abort where ggml_lite's dict would not.

# %%
# | export scenario_check
REPLAY_MAX_BYTES = 2 << 30  # what `sched --check` may allocate: weights, KV cache, compute buffers, generators
REPLAY_MAX_WEIGHT_BYTES = 64 << 20  # weights it generates and checksums (about 10 and 12 MB/s: some 10 s)
REPLAY_MAX_MACS = 1 << 31  # multiply-adds of all its rounds (the bit-exact tier does about 5e8 a second)


def _built(doc, where, batch) -> tuple:
    """`build_llama`'s (contexts, graph, roots) of the scenario's model for `batch` (tensors, no memory)."""
    try:
        return build_llama(doc["model"], doc["placement"], batch, recorded=True)
    except GraphFullError:
        refuse(where, "model.n_layer", f"a model whose graph fits the recorder's {GGML_DEFAULT_GRAPH_SIZE} nodes",
               doc["model"]["n_layer"])


def _check_graph_size(doc, where, graph, n_backends) -> None:
    """Refuse a graph size with no room in ggml's hash set for every tensor and copy (§3.2)."""
    sp = doc.get("sched_params")
    if sp is None:
        return
    n_copies = GGML_SCHED_MAX_COPIES if sp["parallel"] else 1
    need = (len(graph.nodes) + len(graph.leafs)) * (1 + n_copies * n_backends)
    if sp["graph_size"] < need:
        refuse(where, "sched_params.graph_size", f"at least {need}: room in ggml's hash set for the graph's "
               f"{len(graph.nodes) + len(graph.leafs)} tensors and each of their {n_copies} x {n_backends} possible "
               "copies (ggml aborts when it is full; ggml_lite's scheduler would not)", sp["graph_size"])


def check_replay_work(doc, where: str = "the scenario") -> None:
    """Refuse, before anything is allocated, a replay past the memory, weight or work bounds (§3.2)."""
    m, batches = doc["model"], [s["batch"] for s in doc.get("steps", []) if "batch" in s] or [ROUND0]
    ctxs, _, _ = _built(doc, where, batches[0])
    weights = [t for c in ctxs if c.name.startswith("weights:") for t in c.tensors]
    stored = sum(nbytes(t) for c in ctxs[:-1] for t in c.tensors)
    n_copies = GGML_SCHED_MAX_COPIES if doc.get("sched_params", {}).get("parallel") else 1
    w, layers = model_tensors({t.name: t for c in ctxs[:-1] for t in c.tensors}, m["n_layer"])
    compute = 0
    for b in {tuple(sorted(b.items())): b for b in batches}.values():
        ctx, _, _ = build_graph(m, w, layers, b, recorded=True)
        compute = max(compute, sum(nbytes(t) for t in ctx.tensors if t.view_src is None))
    need = stored + 2 * n_copies * compute + 48 * max(nelements(t) for t in weights)
    macs = sum(b["n_tokens"] * (sum(map(nelements, weights)) + 2 * m["n_layer"] * b["n_kv"] * m["n_embd"])
               for b in batches[1:])
    if need > REPLAY_MAX_BYTES:
        raise GraphFileError(f"{where}: model: the replay would need {need / 2**30:.2f} GiB (weights and KV cache "
                             f"{stored / 2**20:.1f} MiB, compute buffers up to "
                             f"{2 * n_copies * compute / 2**20:.1f} MiB); "
                             f"expected at most {REPLAY_MAX_BYTES / 2**30:g} GiB")
    weight_bytes = sum(map(nbytes, weights))
    if weight_bytes > REPLAY_MAX_WEIGHT_BYTES:
        raise GraphFileError(f"{where}: model: the replay would generate and checksum {weight_bytes / 2**20:.1f} "
                             f"MiB of weights; expected at most {REPLAY_MAX_WEIGHT_BYTES / 2**20:g} MiB (about 10 s)")
    if macs > REPLAY_MAX_MACS:
        raise GraphFileError(f"{where}: steps: the rounds' replay would need {macs:.3g} multiply-adds; expected "
                             f"at most {REPLAY_MAX_MACS:.3g} (about 4 s of the bit-exact tier)")

# %% [markdown]
# `check_scenario` runs it all. Before the form it reads only what says which kind of file this is, the schema's
# name and `outcome.completed` (a completed scenario needs its set-up and steps, an aborted one its backends, model,
# placement and the stderr up to the abort), so that a file missing a whole part is told so in one sentence.

# %%
# | export scenario_check
SCENARIO_FIELDS = {  # what a replay reads, by kind of scenario (the README's top-level keys)
    "completed": ("sched_params", "backends", "model", "placement", "external_buffers", "weights", "pins",
                  "graph", "steps"),
    "aborted": ("backends", "model", "placement"),
}


def check_scenario(doc, where: str = "the scenario") -> dict:
    """`doc` if it is a scheduler scenario a replay can use, every field checked (§3); else `GraphFileError`."""
    if not isinstance(doc, dict) or doc.get("schema") != "ggml-sched-fixture":
        schema = doc.get("schema") if isinstance(doc, dict) else None
        raise GraphFileError(f"{where}: not a scheduler scenario (schema {quote(schema)}, "
                             "expected 'ggml-sched-fixture')")
    outcome = doc.get("outcome")
    if not isinstance(outcome, dict):
        raise GraphFileError(f"{where}: no `outcome` object (`{{\"completed\": true}}`, or false with the "
                             "reference's abort); every recorded scenario has one")
    Bool().check(outcome.get("completed", ABSENT), "outcome.completed", where)  # it says which kind the file is
    kind = "completed" if outcome["completed"] else "aborted"
    missing = [k for k in SCENARIO_FIELDS[kind] if k not in doc]
    if kind == "aborted" and not outcome.get("stderr_until_abort"):
        missing.append("outcome.stderr_until_abort")
    if missing:
        raise GraphFileError(f"{where}: a {kind} scenario (outcome.completed {json.dumps(outcome['completed'])}) "
                             f"needs {', '.join(f'`{k}`' for k in missing)}, which the file lacks")
    SCENARIO_SCHEMA.check(doc, "", where)
    names = _check_backends(doc, where)
    _check_model(doc, where)
    _check_names(doc, where, names)
    batches = _check_steps(doc, where)
    ctxs, graph, roots = _built(doc, where, batches[0])
    _check_graph_size(doc, where, graph, len(names))
    in_graph = {t.name for t in (*graph.nodes, *graph.leafs)}
    for i, pin in enumerate(doc.get("pins", [])):
        if pin["tensor"] not in in_graph:
            refuse(where, f"pins[{i}].tensor", "the name of a node or leaf of the round-0 graph", pin["tensor"])
    if "graph" in doc:
        _check_graph(doc, where, ctxs, graph, roots)
    _check_weights(doc, where, ctxs)
    return doc

# %% [markdown]
# Two refused files: scenario 04 with its first pin naming a tensor the graph does not have, and scenario 03 with a
# model of `n_head` 0. Each message names the field by its path, what was expected and what was found; nothing was
# built.

# %%
# NBVAL_CHECK_OUTPUT
import copy
import json
from pathlib import Path

SCHED_DIR = Path("../tests/fixtures/ggml-seed-sched")
bad_pin = json.loads((SCHED_DIR / "04_partial_offload_pinned.json").read_text())
bad_pin["pins"][0]["tensor"] = "norm-9"
bad_head = json.loads((SCHED_DIR / "03_partial_offload.json").read_text())
bad_head["model"]["n_head"] = 0
for bad in (bad_pin, bad_head):
    try:
        check_scenario(bad, f"{bad['fixture']} (changed)")
    except GraphFileError as e:
        print(e)

# %% [markdown]
# ## 4 · The replay
#
# The C writes its messages to stderr and the recorder kept them line for line. ggml_lite sends the same messages to
# its logger, so the replay listens (`captured_log`) and rebuilds the text: a message per line, the printout's split
# headers with their own leading newline. Every comparison goes through `_compare`, which appends a *difference*
# instead of stopping, and reports a long list or text from its first differing item or line.
#
# Where a tensor is, as the recorder wrote it. It named buffers by what they hold: `compute:BACKEND`, the context's
# label (`weights:FAKE`, `kv_cache:CPU`), and `label[i]` for a multi-buffer's parts (`_labels`). A tensor's place is
# `(buffer, offset, ext_offset)`: an offset in a compute buffer, an `ext_offset` in a weight or cache buffer, which
# tells planned memory from memory given before the scheduler ran.

# %%
# | export scenario_replay
"""Replaying a recorded scheduler scenario: every recorded step run again, every recorded fact compared
(`replay`); and a scenario's `GGML_SCHED_DEBUG` printout (`scenario_printout`)."""

import logging
import math
from contextlib import ExitStack
from unittest.mock import patch

import numpy as np

from ggml_lite.backend import tensor_get, tensor_set
from ggml_lite.dyn_tallocr import captured_log
from ggml_lite.errors import SchedulerError
from ggml_lite.models.llama import batch_inputs, build_graph, model_tensors
from ggml_lite.scenario import apply_pins, built_scenario, fill_weights, fnv1a32, load_scenario, new_sched
from ggml_lite.scenario_check import check_replay_work, check_scenario
from ggml_lite.sim import SimBackend, SimBuffer, SimBufferType, computes_nothing
from ggml_lite.tensor import nbytes
from ggml_lite.untrusted import quote


def _stderr_text(lines) -> str:
    """Captured messages as the C wrote them to stderr (split headers bring their own newline)."""
    return "".join(m if m.startswith("\n## SPLIT") else m + "\n" for m in lines)


def _compare(what, got, want, out) -> None:
    """Append to `out` how `got` (ggml_lite's) differs from `want` (the record's), if it does."""
    if got == want:
        return
    if type(got) is type(want) and isinstance(got, (list, str)) and max(len(repr(got)), len(repr(want))) > 240:
        unit, g, w = ("line", got.splitlines(), want.splitlines()) if isinstance(got, str) else ("item", got, want)
        k = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
        mine, theirs = (quote(g[k], 240) if k < len(g) else "(none)"), (quote(w[k], 240) if k < len(w) else "(none)")
        out.append(f"{what}: first difference at {unit} {k} ({len(g)} in ggml_lite, {len(w)} in ggml): ggml_lite "
                   f"{mine}, ggml {theirs}")
    else:
        out.append(f"{what}: ggml_lite {quote(got, 240)}, ggml {quote(want, 240)}")


def _labels(sched, buffers: dict) -> dict:
    """id(buffer) -> the recorder's name for it: `compute:BACKEND`, a context's label, or `label[i]`."""
    labels = {}
    for label, buf in buffers.items():
        labels[id(buf)] = label
        if buf.is_multi_buffer():
            labels.update({id(part): f"{label}[{i}]" for i, part in enumerate(buf.buffers)})
    for i, b in enumerate(sched.backends):
        if sched.galloc.buffers[i] is not None:
            labels[id(sched.galloc.buffers[i])] = f"compute:{b.get_name()}"
    return labels


def _placed(t, labels: dict) -> tuple:
    """(buffer, offset, ext_offset) of a tensor as the recorder wrote them (§4)."""
    if t.buffer is None or t.data is None:
        return None, None, None
    label, off = labels.get(id(t.buffer), t.buffer.get_name()), t.data - t.buffer.get_base()
    return (label, off, None) if label.startswith("compute:") else (label, None, off)


def _splits_and_inputs(sched) -> tuple:
    """The splits (with their inputs and copies) and the graph inputs, as the recorder wrote them."""
    names = [b.get_name() for b in sched.backends] + [None]  # id -1: none

    def copies(t, b):
        return [sched.copies[(t, b, c)].name for c in range(sched.n_copies)]
    splits = [{"index": i, "backend": names[s.backend_id], "i_start": s.i_start, "i_end": s.i_end,
               "n_inputs": s.n_inputs, "graph_n_nodes": len(s.graph.nodes) if s.graph is not None else None,
               "inputs": [{"name": t.name, "from_backend": names[sched.ids.get(t, -1)], "nbytes": nbytes(t),
                           "copies": copies(t, s.backend_id)} for t in s.inputs]} for i, s in enumerate(sched.splits)]
    inputs = [{"name": t.name, "backend": names[sched.ids.get(t, -1)], "copies": copies(t, sched.ids.get(t, -1))}
              for t in sched.graph_inputs]
    return splits, inputs

# %% [markdown]
# One alloc_graph step. The recorder wrote down everything the scheduler decided: the counts, the splits and graph
# inputs, every tensor of the round in id order with its backend, cause, place and sources, the scheduler's graph
# copy, and the buffer sizes; `_check_alloc` compares them tensor by tensor. `_check_setup` compares the external
# buffers and every weight's place and checksum; `_check_compute` a round's inputs and its logits, bit for bit: FAKE
# computed with the CPU's kernels, SIM with the bit-exact tier.

# %%
# | export scenario_replay
COPY_FIELDS = ("i", "name", "op", "backend", "view_src", "flags_value", "nbytes", "buffer", "offset", "ext_offset")


def _check_alloc(sched, step, out, buffers: dict, order: list) -> None:
    """A round's alloc_graph as recorded; `order`: the round's tensors in id order."""
    k = f"round {step['round']} alloc_graph"
    _compare(f"{k}: n_splits", sched.n_splits, step["n_splits"], out)
    _compare(f"{k}: n_copies", sched.n_copies, step["n_copies"], out)
    _compare(f"{k}: cur_copy", sched.cur_copy, step["cur_copy"], out)
    splits, inputs = _splits_and_inputs(sched)
    _compare(f"{k}: splits", splits, step["splits"], out)
    _compare(f"{k}: graph inputs", inputs, step["graph_inputs"], out)
    labels = _labels(sched, buffers)
    _compare(f"{k}: tensors (id, name)", [(i, t.name) for i, t in enumerate(order)],
             [(r["id"], r["name"]) for r in step["tensors"]], out)
    for rec in step["tensors"]:
        t = order[rec["id"]] if rec["id"] < len(order) and order[rec["id"]].name == rec["name"] else None
        b = sched.get_tensor_backend(t) if t is not None else None
        _compare(f"{k}: {rec['name']}: backend and cause", (b.get_name() if b else None, sched.get_cause(t)),
                 (rec["backend"], rec["cause"]), out)
        _compare(f"{k}: {rec['name']}: buffer, offset, ext_offset and sources",
                 (*_placed(t, labels), [s.name for s in t.src if s is not None]) if t is not None else None,
                 (rec["buffer"], rec["offset"], rec["ext_offset"], rec["src_names"]), out)
    for kind, tensors_, ids in (("nodes", sched.graph.nodes, sched.node_backend_ids),
                                ("leafs", sched.graph.leafs, sched.leaf_backend_ids)):
        recs = step["sched_graph"][kind]
        _compare(f"{k}: graph copy {kind}", (len(tensors_), len(tensors_)),
                 (len(recs), step["sched_graph"][f"n_{kind}"]), out)
        for i, (t, b, rec) in enumerate(zip(tensors_, ids, recs)):
            got = (i, t.name, t.op.name, sched.backends[b].get_name() if b != -1 else None,
                   t.view_src.name if t.view_src is not None else None, int(t.flags), nbytes(t), *_placed(t, labels))
            _compare(f"{k}: graph copy {kind}[{rec['i']}]", got, tuple(rec[f] for f in COPY_FIELDS), out)
    _compare(f"{k}: buffer sizes", {b.get_name(): sched.get_buffer_size(b) for b in sched.backends},
             step["buffer_sizes"], out)


def _check_setup(doc, buffers, tensors, sched, out) -> None:
    """The external buffers and every weight's place and checksum as recorded (`tensors`: by name)."""
    labels = _labels(sched, buffers)
    for ext in doc["external_buffers"]:
        buf = buffers[ext["ctx"]]
        multi = buf.is_multi_buffer()
        parts = [{"size": p.get_size(), "usage": p.get_usage().name} for p in buf.buffers] if multi else None
        _compare(f"external buffer {ext['ctx']}: size, multi-buffer and parts", (buf.get_size(), multi, parts),
                 (ext["size"], ext["is_multi_buffer"], ext.get("parts")), out)
    for w in doc["weights"]:
        t = tensors[w["name"]]
        label, _, ext_offset = _placed(t, labels)
        _compare(f"weight {w['name']}: buffer, ext_offset and checksum of its bytes",
                 (label, ext_offset, fnv1a32(tensor_get(t, 0, nbytes(t)).tobytes())),
                 (w["buffer"], w["ext_offset"], w["fnv1a32_of_bytes"]), out)


def _check_compute(graph, batch, step, out) -> None:
    """A round's inputs and its logits (bit for bit; their shape, sums and finiteness too)."""
    r = f"round {step['round']} graph_compute"
    for key, value in batch_inputs(batch).items():
        if key != "KQ_mask":  # (the file describes the mask in words)
            _compare(f"{r}: input {key}", value.tolist(), step["inputs"][key], out)
    rec = step["outputs"][0]
    t = graph.get_tensor("result_output")
    got = tensor_get(t).reshape(-1).astype(np.float32)
    _compare(f"{r}: result_output type and shape", (t.type.name, list(t.ne)), (rec["type"], rec["ne"]), out)
    want = np.array(rec["values"], dtype=np.float64).astype(np.float32)
    if got.size != want.size:
        out.append(f"{r}: {got.size} logits computed, {want.size} recorded")
        return
    n_diff = int((got != want).sum())
    if n_diff:
        out.append(f"{r}: {n_diff} of {want.size} logits differ (max |diff| {float(np.abs(got - want).max()):.3g})")
    values = got.astype(np.float64)
    _compare(f"{r}: all_finite", bool(np.isfinite(values).all()), rec["all_finite"], out)
    # FAKE and SIM compute with the CPU's kernels: a CPU-only run gives the same bits (ggml recorded 0)
    _compare(f"{r}: max_abs_diff_vs_cpu_reference", 0, rec["max_abs_diff_vs_cpu_reference"], out)
    for key, value in (("sum", math.fsum(values)), ("sum_abs", math.fsum(np.abs(values)))):
        if not math.isclose(value, rec[key], rel_tol=1e-9, abs_tol=1e-9):
            out.append(f"{r}: {key} of the logits: ggml_lite {value!r}, ggml {rec[key]!r}")

# %% [markdown]
# Every backend call. The recorder logged each call the scheduler made on a FAKE backend or its buffers
# (graph_compute, synchronize, events, tensor set/get/copy) and the CPU's graph_compute: the order of copies and
# waits that chapter 09's `compute_splits` ports. `_Trace` wraps the same hooks of SIM and the CPU for a round with
# `unittest.mock.patch.object`, which puts the originals back on exit.

# %%
# | export scenario_replay
class _Trace:
    """Records, while active, the backend calls of a round in the fixtures' trace format (`lines`)."""

    def __init__(self, sched):
        self.sched, self.lines, self.patches = sched, list[str](), ExitStack()

    def _log(self, obj, name: str, text, after: bool = False) -> None:
        """Until exit, each call of `obj.name` appends `text(*args)` (`after`: `text(result, *args)`)."""
        orig = getattr(obj, name)

        def run(*args):
            if not after:
                self.lines.append(text(*args))
                return orig(*args)
            result = orig(*args)
            self.lines.append(text(result, *args))
            return result
        self.patches.enter_context(patch.object(obj, name, run))

    def __enter__(self):
        ev = {id(e): f"ev{c}" for row in self.sched.events for c, e in enumerate(row) if e is not None}
        for b in self.sched.backends:
            name = b.get_name()
            self._log(b, "_graph_compute", lambda graph, name=name: _compute_line(name, graph.nodes))
            if isinstance(b, SimBackend):
                self._log(b, "_synchronize", lambda name=name: f"{name}.synchronize")
                self._log(b, "_event_record", lambda e, name=name: f"{name}.event_record {ev.get(id(e), '?')}")
                self._log(b, "_event_synchronize",
                          lambda e, name=name: f"{name}.event_synchronize {ev.get(id(e), '?')}")
                self._log(b, "_event_wait",
                          lambda e, name=name: f"{name}.event_wait {e.backend.get_name()}.{ev.get(id(e), '?')}")
        self._log(SimBuffer, "set_tensor", lambda buf, t, data, offset, size:
                  f"{buf.buft.get_name()}.set_tensor {t.name} offset={offset} size={size}")
        self._log(SimBuffer, "get_tensor", lambda buf, t, offset, size:
                  f"{buf.buft.get_name()}.get_tensor {t.name} offset={offset} size={size}")
        self._log(SimBuffer, "cpy_tensor", _copy_line, after=True)
        return self

    def __exit__(self, *exc):
        self.patches.close()


def _compute_line(name: str, nodes) -> str:
    real = [n for n in nodes if not computes_nothing(n.op)]
    shown = real or nodes  # first and last name the non-view nodes
    return (f"{name}.graph_compute n_nodes={len(nodes)} ({len(real)} non-view) "
            f"first={shown[0].name} last={shown[-1].name}")


def _copy_line(done: bool, buf, src, dst) -> str:
    sbuf = src.view_src.buffer if src.view_src is not None else src.buffer
    return (f"{buf.buft.get_name()}.cpy_tensor {src.name} ({sbuf.get_name()}) -> {dst.name} "
            f"{'size=' + str(nbytes(src)) if done else 'declined'}")

# %% [markdown]
# `replay` itself, under `_Allocations` (which records each SIM buffer allocation, as `fake_buffer_allocations` do):
# check the file and the work, load the scenario, compare the set-up, then the reserve's stderr, counts and buffer
# sizes. A scheduler error where the reference completed is a difference, not a crash.

# %%
# | export scenario_replay
class _Allocations:
    """Records every SIM buffer allocation while active: `NAME.alloc_buffer size=N (why)`."""

    def __init__(self, why: str):
        self.why, self.lines = why, list[str]()
        orig = SimBufferType.alloc_buffer

        def alloc_buffer(buft, size):
            self.lines.append(f"{buft.get_name()}.alloc_buffer size={size} ({self.why})")
            return orig(buft, size)
        self.patch = patch.object(SimBufferType, "alloc_buffer", alloc_buffer)

    def __enter__(self):
        self.patch.start()
        return self

    def __exit__(self, *exc):
        self.patch.stop()


def replay(doc: dict, where: str = "the scenario") -> list:
    """Every difference between a recorded scenario and ggml_lite's replay of it (empty: identical; A3 §4)."""
    check_scenario(doc, where)
    if not doc["outcome"]["completed"]:
        return _replay_abort(doc)
    check_replay_work(doc, where)
    out: list[str] = []
    with _Allocations("model weights and KV cache") as allocs:
        sc = load_scenario(doc)
        sched = new_sched(doc, sc.backends)
        _check_setup(doc, sc.buffers, {t.name: t for t in sc.gf.tensors.values()}, sched, out)
        apply_pins(sched, sc.gf.graph, doc, sc.backends)
        allocs.why = "ggml_backend_sched_reserve"
        with captured_log(logging.DEBUG) as err:
            try:
                ok = sched.reserve(sc.gf.graph)
            except SchedulerError as e:  # ggml would abort here; the recorded run did not
                return out + [f"reserve: ggml_lite aborts ({e}), the reference completed"]
        res = doc["steps"][0]
        _compare("reserve: ok", ok, res["ok"], out)
        _compare("reserve: stderr", _stderr_text(err), _stderr_text(res["stderr"]), out)
        _compare("reserve: n_splits, n_copies", (sched.n_splits, sched.n_copies),
                 (res["n_splits"], res["n_copies"]), out)
        _compare("reserve: buffer sizes", {b.get_name(): sched.get_buffer_size(b) for b in sc.backends},
                 res["buffer_sizes"], out)
        allocs.why = "ggml_backend_sched_alloc_graph"
        _replay_rounds(doc, sc, sched, out)
    if "fake_buffer_allocations" in doc:
        _compare("FAKE buffer allocations", allocs.lines, doc["fake_buffer_allocations"], out)
    return out

# %% [markdown]
# The rounds, each as llama.cpp runs one: reset, a fresh graph for the round's batch over the same weights and
# cache, the pins again, `alloc_graph` and its comparison, the inputs, `graph_compute` under `_Trace`, and the
# calls, status, `cur_copy` and logits compared. After round 0, `_check_graph_facts` compares the `POST_ALLOC` facts
# of the recorded graph too.

# %%
# | export scenario_replay
def _replay_rounds(doc, sc, sched, out) -> None:
    """Every round after the reserve: a fresh graph, the pins, alloc_graph, the inputs, graph_compute."""
    steps = doc["steps"]
    w, layers = model_tensors({t.name: t for t in sc.gf.tensors.values()}, doc["model"]["n_layer"])
    for k in range(1, len(steps), 2):
        alloc_step, compute_step = steps[k], steps[k + 1]
        sched.reset()
        ctx, graph, _ = build_graph(doc["model"], w, layers, alloc_step["batch"], recorded=True)
        stored = [t for i, t in sorted(sc.gf.tensors.items()) if sc.gf.records[i]["ctx"] != "compute"]
        apply_pins(sched, graph, doc, sc.backends)
        with captured_log(logging.DEBUG) as err:
            try:
                ok = sched.alloc_graph(graph)
            except SchedulerError as e:
                out.append(f"round {alloc_step['round']} alloc_graph: ggml_lite aborts ({e}), the reference completed")
                return
        _compare(f"round {alloc_step['round']} alloc_graph: ok", ok, alloc_step["ok"], out)
        _compare(f"round {alloc_step['round']} alloc_graph: stderr", _stderr_text(err),
                 _stderr_text(alloc_step["stderr"]), out)
        _check_alloc(sched, alloc_step, out, sc.buffers, stored + ctx.tensors)
        if k == 1:
            _check_graph_facts(sched, graph, doc, sc.buffers, out)
        for key, value in batch_inputs(alloc_step["batch"]).items():
            tensor_set(graph.get_tensor(key), value)
        with _Trace(sched) as trace:
            status = sched.graph_compute(graph)
        r = f"round {compute_step['round']} graph_compute"
        _compare(f"{r}: backend calls", trace.lines, compute_step["trace"], out)
        _compare(f"{r}: status", int(status), compute_step["status"], out)
        _compare(f"{r}: cur_copy after", sched.cur_copy, compute_step["cur_copy_after"], out)
        _compare(f"{r}: stderr", "", _stderr_text(compute_step["stderr"]), out)
        _check_compute(graph, alloc_step["batch"], compute_step, out)


def _check_graph_facts(sched, graph, doc, buffers, out) -> None:
    """What the recorder wrote into the round-0 graph's records after round 0 (`POST_ALLOC`)."""
    labels = _labels(sched, buffers)
    tensors = {t.name: t for t in (*graph.nodes, *graph.leafs)}
    for rec in doc["graph"]["tensors"]:
        t = tensors.get(rec["name"])
        if t is None:
            continue  # (a tensor no node uses: the graph section records it, the graph does not hold it)
        b = sched.get_tensor_backend(t)
        placed = _placed(t, labels)  # preallocated: in a weight or cache buffer before the scheduler ran
        got = (b.get_name() if b else None, sched.get_cause(t), *placed, placed[2] is not None)
        _compare(f"graph.tensors[{rec['id']}] ({rec['name']}): after round 0", got, tuple(rec[k] for k in (
            "sched_backend", "sched_cause", "buffer", "offset", "ext_offset", "preallocated")), out)

# %% [markdown]
# `scenario_printout` is what `sched FILE` prints: one `split_graph` of the set-up, built without a weight byte,
# with the printout on (and the scheduler's error after it if it aborts). `_replay_abort` replays scenario 13, whose
# reference aborted in the reserve (a pre-allocated KV-cache view in a FAKE buffer whose backend denies the copy
# op): the same warnings first, then the same error without ggml's `file:line`.

# %%
# | export scenario_replay
def scenario_printout(doc: dict, where: str = "the scenario") -> str:
    """The GGML_SCHED_DEBUG text of the scenario's round-0 graph after its pins; no weight filled."""
    check_scenario(doc, where)
    if not doc["outcome"]["completed"]:
        backends, graph = built_scenario(doc)
    else:
        sc = load_scenario(doc, fill=False)  # the assignments need no weight bytes
        backends, graph = sc.backends, sc.gf.graph
    sched = new_sched(doc, backends, debug=True)
    apply_pins(sched, graph, doc, backends)
    with captured_log(logging.DEBUG) as err:
        try:
            sched.split_graph(graph)
        except SchedulerError as e:
            return _stderr_text(err) + f"error: {e}\n"
    return _stderr_text(err)


def _replay_abort(doc) -> list:
    """Scenario 13: the same warnings, then the same error as the reference's abort in the reserve."""
    buffers: dict = {}
    out: list[str] = []
    backends, graph = built_scenario(doc, buffers)
    sched = new_sched(doc, backends)
    if "weights" in doc and "external_buffers" in doc:  # the set-up before the abort, as recorded
        tensors = {t.name: t for t in graph.leafs}
        fill_weights(doc, tensors)
        _check_setup(doc, buffers, tensors, sched, out)
    apply_pins(sched, graph, doc, backends)
    *before, last = doc["outcome"]["stderr_until_abort"]
    want = last.split(": ", 1)[-1]
    with captured_log(logging.WARNING) as err:
        try:
            sched.reserve(graph)
        except SchedulerError as e:
            if want not in str(e):
                out.append(f"reserve: aborted with {quote(str(e), 240)}, the reference with {quote(want, 240)}")
            _compare("reserve: stderr before the abort", list(err), before, out)
            return out
    return out + [f"reserve: completed, the reference aborted ({want})"]

# %% [markdown]
# ## 5 · All 14 scenarios
#
# All 14 recorded scenarios, replayed from the project's copies (`tests/fixtures/`): every recorded fact, from the
# causes to the logits' bits and scenario 13's abort, must come out the same.

# %%
# NBVAL_CHECK_OUTPUT
scenario_diffs = {}
for path in sorted(SCHED_DIR.glob("*.json")):
    scenario_diffs[path.stem] = replay(json.loads(path.read_text()))
n_same = sum(not d for d in scenario_diffs.values())
print(f"{n_same} of {len(scenario_diffs)} recorded scenarios identical to the real ggml's scheduler")


# %% [markdown]
# ## 6 · Check

# %%
assert len(scenario_diffs) == 14 and not any(scenario_diffs.values()), scenario_diffs
worse = copy.deepcopy(bad_head)
worse["model"]["n_head"] = 4
worse["steps"][2]["outputs"][0]["values"][0] += 0.5  # a recorded fact changed: a difference, not an error
worse_diffs = replay(worse)
assert len(worse_diffs) == 1 and "1 of 256 logits differ" in worse_diffs[0], worse_diffs
print("appendix A3: all checks passed")
