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
# `tests/fixtures/ggml-seed-sched/` holds 14 runs of the real `ggml_backend_sched`, recorded with two
# FAKE accelerators in front of the CPU: a 4-layer LLaMA-style model placed in different ways, every
# assignment and its cause, the splits, the scheduler's graph copy with its offsets, the compute
# buffer sizes, the `GGML_SCHED_DEBUG` printout, every backend call, and the logits. This appendix
# rebuilds each set-up exactly and replays it through chapter 09's scheduler; the tests and
# `python -m ggml_lite sched SCENARIO.json --check` use the same code. Nothing in chapters 00–09
# depends on it.
#
# **What it takes to replay a scenario**
#
# 1. The model: chapter 10's LLaMA builder at toy size, in the variant the recorder used (§1).
# 2. The set-up: SIM configured as each FAKE backend, the weight and KV-cache buffers, the weights
#    regenerated from a hash of their names (§2).
# 3. The check: every field of the file validated before anything is built (§3).
# 4. The replay: every recorded step run again, every fact compared (§4), then all 14 at once (§5).
#
# Exported: `ggml_lite.scenario`.

# %%
# | default_exp scenario

# %% [markdown]
# ## 1 · The scenarios' model
#
# The scenarios' model is a 4-layer LLaMA at toy size, built by chapter 10's builder with
# `recorded=True` — the variant the fixtures were recorded with (one more RESHAPE per layer than
# llama.cpp's graph, and a few other names). `build_llama` creates its weights and cache in one
# context per backend, in the recorder's order; `build_graph` builds one batch's graph over them.

# %% [markdown]
# ## 2 · The set-up: backends, buffers and weights
#
# Each FAKE backend of a scenario becomes a SIM device with the same alignment, `max_size`,
# deny-list and offload rule, synchronous as the FAKE backends were. The weight contexts get WEIGHTS
# buffers on their backends and the KV cache is cleared; every weight is regenerated from the
# 32-bit FNV-1a hash of its name, which seeds the LCG of appendix A1's numerics generator.

# %%
# | export
"""Replaying a recorded scheduler scenario (tests/fixtures/ggml-seed-sched/README.md): the FAKE
backends as SIM, the weight and KV-cache buffers, the weight and input generators, and the replay
of every recorded step with the differences it finds."""

import json
import logging
import math
import re
from dataclasses import dataclass

import numpy as np

from ggml_lite.backend import tensor_get, tensor_set
from ggml_lite.buffer import TENSOR_ALIGNMENT, BufferUsage
from ggml_lite.cpu import cpu_init
from ggml_lite.errors import GraphFileError, GraphFullError, SchedulerError
from ggml_lite.dyn_tallocr import captured_log
from ggml_lite.graph import GGML_DEFAULT_GRAPH_SIZE
from ggml_lite.graphio import MAX_QUOTE, graph_document, quote, read_graph_file
from ggml_lite.models.llama import LAYER_WEIGHTS, batch_inputs, build_llama, build_graph, model_tensors
from ggml_lite.numerics import lcg_states
from ggml_lite.sched import GGML_SCHED_MAX_BACKENDS, GGML_SCHED_MAX_COPIES, GGML_SCHED_MAX_SPLIT_INPUTS, BackendSched
from ggml_lite.sim import sim_init
from ggml_lite.tallocr import alloc_ctx_tensors
from ggml_lite.tallocr import alloc_ctx_tensors_from_buft
from ggml_lite.tensor import F16, GGML_MAX_SRC, Op, TensorFlag, nelements
from ggml_lite.tensor import nbytes

FNV_OFFSET, FNV_PRIME = 2166136261, 16777619


def fnv1a32(data: bytes) -> int:
    """32-bit FNV-1a: start at 2166136261; per byte, xor it in, then multiply by 16777619 mod 2^32."""
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFF
    return h




def weight_values(seed: int, n: int, offset: float, scale: float) -> np.ndarray:
    """The README's weight generator: element k uses the LCG state after k+1 steps from `seed`,
    u = (s >> 8) / 2^24, value = offset + scale·(2u − 1) in double, rounded once to float32."""
    u = (lcg_states(seed, n) >> np.uint64(8)).astype(np.float64) / 2.0**24
    return (offset + scale * (2.0 * u - 1.0)).astype(np.float32)




def weight_gen(name: str) -> tuple:
    """(seed, offset, scale) of a weight, from its name."""
    if "norm.weight" in name:
        offset, scale = 1.0, 0.25
    elif name == "token_embd.weight":
        offset, scale = 0.0, 1.0
    else:
        offset, scale = 0.0, 0.125
    return fnv1a32(name.encode()), offset, scale




OFFLOAD_RULES = {  # the `offload_op` strings of the fixtures → SIM's rule names
    None: None,
    "op == MUL_MAT && ne[1] >= 32": "mul_mat",
}
CUDA_RULE = "ne[1] >= 32 && op != GET_ROWS"  # the CUDA rule's text starts so (the rest is a comment)


# %%
# | export
def offload_rule(text):
    """SIM's rule name for a scenario's `offload_op` text."""
    if text is not None and text.startswith(CUDA_RULE):
        return "cuda"
    return OFFLOAD_RULES[text]




def make_backends(doc: dict, clock=None) -> list:
    """The scenario's backends in priority order: SIM as FAKE (synchronous, its alignment, max_size,
    deny-list and offload rule), and the CPU last."""
    out = []
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
    gf: object  # graphio.GraphFile of the round-0 graph
    buffers: dict  # external context label -> Buffer




# %%
# | export
def load_scenario(doc: dict, clock=None, fill: bool = True) -> Scenario:
    """Backends, the graph, and the external buffers allocated; with `fill` (a replay) the KV cache
    cleared and the weights filled, else their memory is never touched (the printout needs none)."""
    if "graph" not in doc:
        raise GraphFileError(f"scenario {doc.get('fixture')} records no graph (outcome {doc.get('outcome')}); "
                                "build it with the LLaMA builder of the scenario's model")
    backends = make_backends(doc, clock)
    by_name = {b.get_name(): b for b in backends}
    # (validate=False: check_scenario found the graph equal to the one the builder makes of the model)
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
# ## 3 · Validation: nothing is built from a field before it is checked
#
# A scenario file is input like any other: someone may hand `sched` a file with a pin naming no tensor,
# an `n_head` of 0, a `max_size` of `NaN` or an empty `steps` list. `check_scenario` reads every field
# before anything is built and refuses the file with a `GraphFileError` that names the file, the field
# as a JSON path, what was expected and what was found. It checks, in this order:
#
# 1. **The form** of every field (`SCENARIO_SCHEMA` below): its JSON type (a bool is not an integer,
#    `2.0` is not an integer), its range (every count and size has an upper bound; NaN and Infinity
#    are not numbers anyone recorded), and no field ggml_lite does not know (it would be ignored).
# 2. **The constants**: `schema_version` 1, and `sched_params`' `GGML_SCHED_MAX_*` equal to ggml_lite's
#    (a file recorded with other limits cannot be replayed by this scheduler); a `graph_size` too small
#    for ggml's hash set to hold every tensor and copy is refused, since ggml would abort where
#    ggml_lite's dict would not.
# 3. **The cross references**: every backend, pin, placement, weight and external buffer names
#    something that exists; the buffer types are ones SIM and the CPU can be (CPU: alignment 32, no
#    `max_size`); the model is a LLaMA the builder can build (`n_head` divides `n_embd`, ...).
# 4. **The recorded graph against the model**: the round-0 graph must be the one chapter 10's
#    builder makes from `model`, `placement` and the first batch, record for record.
# 5. **The work**: a replay allocates the weights, the KV cache and compute buffers, generates and
#    checksums every weight, and multiplies every weight by every token; a file that asks for more than
#    `REPLAY_MAX_BYTES` (2 GiB), `REPLAY_MAX_WEIGHT_BYTES` (64 MiB) or `REPLAY_MAX_MACS` (2^31) is
#    refused before anything is allocated.
#
# What passes is either replayed or compared: a recorded fact that differs (a cause, an offset, a
# logit, a checksum, a FAKE allocation) is a *difference* (exit 1), and so is a valid set-up under which
# ggml_lite's scheduler aborts while the recorded run completed; a field of the wrong form, a name of
# nothing or a set-up that contradicts the recorded graph is an *error* (exit 2).
#
# The form is declared with small checkers: `Int`, `Num`, `Str`, `Bool`, `Opt` (or null), `List`,
# `Obj` (unknown keys refused), `Map` (an object whose keys are names), `Tagged` (a step's form depends
# on its `call`) and `Deferred` (the graph, compared with the model's as a whole in step 4). Step 5
# concerns `sched --check` only (`check_replay_work`): the printout needs no weight bytes.

# %%
# | export
_ABSENT = object()


def _found(v) -> str:
    """A short description of a JSON value, for error messages."""
    if v is _ABSENT:
        return "nothing (the field is missing)"
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    if isinstance(v, int):
        return f"{v}" + (f" (about 2^{v.bit_length() - 1})" if abs(v) >= 2**53 else "")
    if isinstance(v, float):
        return repr(v) + ("" if math.isfinite(v) else " (not a finite number)")
    if isinstance(v, str):
        return "the string " + quote(v)
    text = json.dumps(v)
    if len(text) <= 60:
        return text
    if isinstance(v, list):
        return f"a list of {len(v)} item{'s' if len(v) != 1 else ''}"
    return f"an object with keys {', '.join(quote(k) for k in list(v)[:6])}"


def _fail(where: str, path: str, expected: str, v=_ABSENT):
    raise GraphFileError(f"{where}: {path}: expected {expected}, found {_found(v)}")


def _at(path: str, key) -> str:
    key = key if isinstance(key, int) else key[:MAX_QUOTE]  # (a key of 100,000 characters is not all quoted)
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)


@dataclass(frozen=True)
class Int:
    lo: int
    hi: int

    def check(self, v, path, where):
        if isinstance(v, bool) or not isinstance(v, int) or not self.lo <= v <= self.hi:
            _fail(where, path, f"an integer in [{self.lo}, {self.hi}]", v)


@dataclass(frozen=True)
class Num:
    lo: float
    hi: float

    def check(self, v, path, where):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not self.lo <= v <= self.hi:
            _fail(where, path, f"a finite number in [{self.lo:g}, {self.hi:g}]", v)


@dataclass(frozen=True)
class Str:
    choices: tuple = None
    maxlen: int = 4096

    def check(self, v, path, where):
        if self.choices is not None and v not in self.choices:
            _fail(where, path, "one of " + ", ".join(json.dumps(c) for c in self.choices), v)
        if not isinstance(v, str) or len(v) > self.maxlen:
            _fail(where, path, f"a string of at most {self.maxlen} characters", v)


@dataclass(frozen=True)
class Opt:
    of: object

    def check(self, v, path, where):
        if v is not None:
            try:
                self.of.check(v, path, where)
            except GraphFileError as e:
                raise GraphFileError(str(e).replace(": expected ", ": expected null or ", 1)) from None


# %%
# | export
class Bool:
    def check(self, v, path, where):
        if not isinstance(v, bool):
            _fail(where, path, "true or false", v)


@dataclass(frozen=True)
class List:
    of: object
    lo: int = 0
    hi: int = 1 << 20

    def check(self, v, path, where):
        if not isinstance(v, list) or not self.lo <= len(v) <= self.hi:
            _fail(where, path, f"a list of {self.lo} to {self.hi} items", v)
        for i, x in enumerate(v):
            self.of.check(x, _at(path, i), where)


@dataclass(frozen=True)
class Obj:
    fields: dict
    optional: tuple = ()

    def check(self, v, path, where):
        if not isinstance(v, dict):
            _fail(where, path or "the top level", "an object", v)
        for k in v:
            if k not in self.fields:
                _fail(where, _at(path, k), f"no such field (a field ggml_lite does not know would be ignored; "
                      f"the fields here are {', '.join(self.fields)})", v[k])
        for k, spec in self.fields.items():
            if k in v:
                spec.check(v[k], _at(path, k), where)
            elif k not in self.optional:
                _fail(where, _at(path, k), "this field", _ABSENT)


@dataclass(frozen=True)
class Map:
    """An object whose keys are names (a backend's name -> its buffer size)."""
    of: object
    hi: int = 64

    def check(self, v, path, where):
        if not isinstance(v, dict) or len(v) > self.hi:
            _fail(where, path, f"an object of at most {self.hi} names", v)
        for k, x in v.items():
            self.of.check(x, _at(path, k), where)


@dataclass(frozen=True)
class Deferred:
    """An object checked later, as a whole (the recorded graph, against the model)."""
    what: str

    def check(self, v, path, where):
        if not isinstance(v, dict):
            _fail(where, path, self.what, v)


@dataclass(frozen=True)
class Tagged:
    """An object whose form depends on one of its string fields (a step on its `call`)."""
    tag: str
    forms: dict

    def check(self, v, path, where):
        if not isinstance(v, dict):
            _fail(where, path, "an object", v)
        Str(tuple(self.forms)).check(v.get(self.tag, _ABSENT), _at(path, self.tag), where)
        self.forms[v[self.tag]].check(v, path, where)


# %%
# | export
SCENARIO_FIELDS = {  # what a replay reads, by kind of scenario (the README's top-level keys)
    "completed": ("sched_params", "backends", "model", "placement", "external_buffers", "weights", "pins",
                  "graph", "steps"),
    "aborted": ("backends", "model", "placement"),
}
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


# %%
# | export
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
                               **{k: Num(-1e6, 1e6) for k in ("ext_factor", "attn_factor", "beta_fast", "beta_slow")}})}),
    "placement": Obj({"token_embd": NAME, "output": NAME, "layers": List(NAME, 1, LLAMA_MAX_LAYERS),
                      "kv_cache": List(NAME, 1, LLAMA_MAX_LAYERS)}),
    "external_buffers": List(Obj({"ctx": NAME, "buffer_type": NAME, "usage": Str(USAGES), "size": SIZE,
                                  "is_multi_buffer": Bool(), "parts": List(Obj({"size": SIZE, "usage": Str(USAGES)}), 1)},
                                 optional=("parts",)), 1, 2 * GGML_SCHED_MAX_BACKENDS),
    "weights": List(Obj({"name": NAME, "type": Str(("f16", "f32")), "ne": List(Int(1, 1 << 21), 1, 4), "buffer": NAME,
                         "ext_offset": SIZE, "gen": Obj({"seed": Int(0, 2**32 - 1), "offset": Num(-1e6, 1e6),
                                                         "scale": Num(-1e6, 1e6)}), "fnv1a32_of_bytes": Int(0, 2**32 - 1)}),
                    1, 3 + len(LAYER_WEIGHTS) * LLAMA_MAX_LAYERS),
    "pins": List(Obj({"tensor": NAME, "backend": NAME, "rule": TEXT}, optional=("rule",)), 0, 1 << 16),
    "graph": Deferred("an object (the round-0 graph, checked against the model below)"),
    "fake_buffer_allocations": List(TEXT, 0, 1 << 16),
    "steps": List(Tagged("call", {"ggml_backend_sched_reserve": Obj(RESERVE), "ggml_backend_sched_alloc_graph": ALLOC_GRAPH,
                                  "ggml_backend_sched_graph_compute": GRAPH_COMPUTE}), 0, 1 + 2 * MAX_ROUNDS),
    "outcome": Obj({"completed": Bool(), "failed_call": Str(("ggml_backend_sched_reserve",)), "signal": Int(6, 6),
                    "signal_name": Str(("SIGABRT",)), "stderr_until_abort": List(TEXT, 1)},
                   optional=("failed_call", "signal", "signal_name", "stderr_until_abort")),
}, optional=("fixture", "description", "ggml_commit", "ggml_build", "sched_params", "external_buffers", "weights",
             "pins", "graph", "fake_buffer_allocations", "steps"))


# %%
# | export
CPU_BACKEND = {"name": "CPU", "buffer_type": "CPU", "is_host": True, "alignment": TENSOR_ALIGNMENT, "max_size": None,
               "supports_op": "ggml_backend_cpu_supports_op", "supports_op_denied": [], "supports_buft": "host buffer types",
               "offload_op": None, "events": False, "cpy_tensor": "memcpy when the source is host memory, else false"}
FAKE_BACKEND = {"is_host": False, "supports_op": "all ops except the deny-list", "supports_buft": "only its own buffer type",
                "events": True, "cpy_tensor": "memcpy when the source is in any FAKE buffer, else false"}


def _same(a, b) -> bool:
    """JSON equality that tells a bool from an integer and an integer from a float (and NaN from itself)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _check_backends(doc, where) -> list:
    """The backends are FAKE devices SIM can be, and the CPU last; returns their names."""
    bs = doc["backends"]
    names = [b["name"] for b in bs]
    for i, b in enumerate(bs):
        p = f"backends[{i}]"
        if b["index"] != i:
            _fail(where, p + ".index", f"{i} (its position in the list)", b["index"])
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", b["name"]) or names.index(b["name"]) != i:
            _fail(where, p + ".name", "a name of letters, digits and _ that no other backend has", b["name"])
        if b["is_cpu"] != (i == len(bs) - 1):
            _fail(where, p + ".is_cpu", f"{json.dumps(i == len(bs) - 1)} (the CPU comes last, and only there)", b["is_cpu"])
        want = CPU_BACKEND if b["is_cpu"] else {**FAKE_BACKEND, "buffer_type": b["name"]}
        for k, v in want.items():
            if not _same(b[k], v):
                _fail(where, f"{p}.{k}", f"{json.dumps(v)} (what a{' CPU' if b['is_cpu'] else ' FAKE'} backend is "
                      "in ggml_lite's replay)", b[k])
        if b["alignment"] & (b["alignment"] - 1):
            _fail(where, p + ".alignment", "a power of two", b["alignment"])
        deny = b["supports_op_denied"]
        if len(set(deny)) != len(deny):
            _fail(where, p + ".supports_op_denied", "op names, each once", deny)
        if b["offload_op"] is not None and b["offload_op"] not in OFFLOAD_RULES and \
                not b["offload_op"].startswith(CUDA_RULE):
            _fail(where, p + ".offload_op", f"null, {json.dumps(next(k for k in OFFLOAD_RULES if k))} or a text "
                  f"starting {json.dumps(CUDA_RULE)} (the rules SIM has)", b["offload_op"])
    return names


def _check_names(doc, where, names) -> None:
    """Placement, pins and n_copies against the backends and the model."""
    pl, model = doc["placement"], doc["model"]
    for key in ("token_embd", "output"):
        if pl[key] not in names:
            _fail(where, f"placement.{key}", f"a backend's name ({', '.join(names)})", pl[key])
    for key in ("layers", "kv_cache"):
        if len(pl[key]) != model["n_layer"]:
            _fail(where, f"placement.{key}", f"a list of model.n_layer = {model['n_layer']} backend names", pl[key])
        for i, name in enumerate(pl[key]):
            if name not in names:
                _fail(where, f"placement.{key}[{i}]", f"a backend's name ({', '.join(names)})", name)
    for i, pin in enumerate(doc.get("pins", [])):
        if pin["backend"] not in names:
            _fail(where, f"pins[{i}].backend", f"a backend's name ({', '.join(names)})", pin["backend"])
    sp = doc.get("sched_params", {})
    if "n_copies" in sp and sp["n_copies"] != (GGML_SCHED_MAX_COPIES if sp["parallel"] else 1):
        _fail(where, "sched_params.n_copies", f"{GGML_SCHED_MAX_COPIES if sp['parallel'] else 1} (ggml's n_copies "
              f"for parallel {json.dumps(sp['parallel'])})", sp["n_copies"])


# %%
# | export
def _check_model(doc, where) -> None:
    """A LLaMA chapter 10's builder can build (the checks of `LlamaParams`, by JSON path)."""
    m = doc["model"]
    if not m["arch"].startswith("llama"):
        _fail(where, "model.arch", "a text starting \"llama\" (the only builder of the replay)", m["arch"])
    if m["n_embd"] % m["n_head"]:
        _fail(where, "model.n_head", f"a divisor of model.n_embd = {m['n_embd']}", m["n_head"])
    if m["n_head"] % m["n_head_kv"]:
        _fail(where, "model.n_head_kv", f"a divisor of model.n_head = {m['n_head']}", m["n_head_kv"])
    head = m["n_embd"] // m["n_head"]
    if m["rope"]["n_dims"] > head or m["rope"]["n_dims"] % 2:
        _fail(where, "model.rope.n_dims", f"an even number of at most the head size n_embd / n_head = {head}",
              m["rope"]["n_dims"])


def _check_steps(doc, where) -> list:
    """The steps in ggml's order (reserve, then alloc_graph and graph_compute per round), each batch in
    the cache; returns the batches the replay builds graphs for (the reserve's first)."""
    steps, n_ctx = doc.get("steps", []), doc["model"]["n_ctx"]
    outcome = doc["outcome"]
    if not outcome["completed"]:
        for key in ("failed_call", "signal", "signal_name", "stderr_until_abort"):
            if key not in outcome:
                _fail(where, f"outcome.{key}", "this field (the scenario did not complete)")
        if steps:
            _fail(where, "steps", "an empty list (the reference aborted in its first call)", steps)
        if not outcome["stderr_until_abort"][-1].partition(": ")[2].strip():
            _fail(where, f"outcome.stderr_until_abort[{len(outcome['stderr_until_abort']) - 1}]",
                  "ggml's abort line, `file:line: message`", outcome["stderr_until_abort"][-1])
        batches = [ROUND0]
    else:
        extra = [k for k in outcome if k != "completed"]
        if extra:
            _fail(where, f"outcome.{extra[0]}", "no such field in a scenario that completed", outcome[extra[0]])
        if len(steps) % 2 == 0:
            _fail(where, "steps", "the reserve, then an alloc_graph and a graph_compute step per round (there must "
                  "be something to replay)" if steps else "at least the reserve step: nothing to compare", steps)
        calls = ["ggml_backend_sched_reserve"] + ["ggml_backend_sched_alloc_graph", "ggml_backend_sched_graph_compute"] * (
            len(steps) // 2)
        for k, (st, call) in enumerate(zip(steps, calls)):
            if st["call"] != call:
                _fail(where, f"steps[{k}].call", json.dumps(call), st["call"])
            if st["step"] != k:
                _fail(where, f"steps[{k}].step", f"{k} (its position)", st["step"])
            if st["round"] != max(0, (k - 1) // 2):
                _fail(where, f"steps[{k}].round", f"{max(0, (k - 1) // 2)}", st["round"])
        batches = [st["batch"] for st in steps if "batch" in st]
    if not outcome["completed"] and ROUND0["n_kv"] > n_ctx:
        _fail(where, "model.n_ctx", f"at least {ROUND0['n_kv']} (the round-0 batch of the README has n_kv "
              f"{ROUND0['n_kv']})", n_ctx)
    for k, b in enumerate(batches if outcome["completed"] else []):
        p = f"steps[{2 * k - 1 if k else 0}].batch"
        if b["n_outputs"] > b["n_tokens"]:
            _fail(where, p + ".n_outputs", f"at most n_tokens = {b['n_tokens']}", b["n_outputs"])
        if not b["kv_head"] + b["n_tokens"] <= b["n_kv"] <= n_ctx:
            _fail(where, p + ".n_kv", f"at least kv_head + n_tokens = {b['kv_head'] + b['n_tokens']} (the cells the "
                  f"batch writes are attended to) and at most model.n_ctx = {n_ctx}", b["n_kv"])
    return batches


# %%
# | export
POST_ALLOC = {"preallocated": Bool(), "buffer": Opt(NAME), "offset": Opt(SIZE), "ext_offset": Opt(SIZE),
              "sched_backend": Opt(NAME), "sched_cause": Opt(Str(maxlen=16))}  # what the recorder saw after round 0


def _check_graph(doc, where, ctxs, graph, roots) -> None:
    """The recorded round-0 graph is the one the builder makes of `model`, `placement` and the first
    batch, record for record (parallel: ggml's scheduler also flagged the inputs OUTPUT)."""
    want = graph_document(graph, ctxs, roots)["graph"]
    got = doc["graph"]
    by = "model, placement" + (", steps[0].batch" if doc.get("steps") else "") + " and sched_params.parallel"
    for key in want:
        if key != "tensors" and not _same(got.get(key, _ABSENT), want[key]):
            _fail(where, f"graph.{key}", f"{_found(want[key])} (what the {by} give)",
                  got.get(key, _ABSENT))
    extra = set(got) - set(want)
    if extra:
        _fail(where, f"graph.{min(extra)}", "no such field", got[min(extra)])
    recs = got.get("tensors")
    if not isinstance(recs, list) or len(recs) != len(want["tensors"]):
        _fail(where, "graph.tensors", f"a list of the {len(want['tensors'])} tensors the model gives", recs)
    parallel = doc.get("sched_params", {}).get("parallel", False)
    for i, (rec, w) in enumerate(zip(recs, want["tensors"])):
        p = f"graph.tensors[{i}]"
        if not isinstance(rec, dict):
            _fail(where, p, "an object", rec)
        if parallel and "INPUT" in w["flags"]:
            w = {**w, "flags": ["INPUT", "OUTPUT"], "flags_value": int(TensorFlag.INPUT | TensorFlag.OUTPUT)}
        for key, spec in POST_ALLOC.items():
            spec.check(rec.get(key, _ABSENT), f"{p}.{key}", where)
        for key, value in rec.items():
            if key not in POST_ALLOC and not _same(value, w.get(key, _ABSENT)):
                _fail(where, f"{p}.{key}", f"{_found(w[key]) if key in w else 'no such field'} (what the {by} give)",
                      value)
        for key in w.keys() - rec.keys() - POST_ALLOC.keys():
            _fail(where, f"{p}.{key}", f"{_found(w[key])} (what the {by} give)")


def _check_weights(doc, where, ctxs) -> None:
    """One record per weight of the model, of its type, shape, context and generator; one external
    buffer per context of weights or cache, on that context's backend."""
    model_w = {t.name: (t, c.name) for c in ctxs if c.name.startswith("weights:") for t in c.tensors}
    seen = set()
    for i, w in enumerate(doc.get("weights", [])):
        p = f"weights[{i}]"
        if w["name"] not in model_w or w["name"] in seen:
            _fail(where, p + ".name", "the name of a weight of the model (e.g. blk.0.attn_q.weight), each once", w["name"])
        seen.add(w["name"])
        t, label = model_w[w["name"]]
        ne = list(t.ne)
        part = re.fullmatch(re.escape(label) + r"\[\d{1,5}\]", w["buffer"])  # a multi-buffer's part: a fact
        for key, value in (("type", t.type.name), ("ne", ne[:len(w["ne"])]), ("buffer", w["buffer"] if part else label)):
            if not _same(w[key], value) or (key == "ne" and any(n != 1 for n in ne[len(w["ne"]):])):
                _fail(where, f"{p}.{key}", f"{_found(value)} (what the model and placement give)", w[key])
        gen = dict(zip(("seed", "offset", "scale"), weight_gen(w["name"])))
        for key, value in gen.items():
            if w["gen"][key] != value:
                _fail(where, f"{p}.gen.{key}", f"{value:g} (the README's generator, from the name)", w["gen"][key])
    if doc.get("weights") is not None and len(seen) != len(model_w):
        _fail(where, "weights", f"a record of each of the model's {len(model_w)} weights; "
              f"{next(n for n in model_w if n not in seen)} has none", doc["weights"])
    labels = [c.name for c in ctxs[:-1]]
    exts = doc.get("external_buffers", [])
    for i, ext in enumerate(exts):
        p = f"external_buffers[{i}]"
        if ext["ctx"] not in labels or [e["ctx"] for e in exts].index(ext["ctx"]) != i:
            _fail(where, p + ".ctx", f"one of the model's contexts ({', '.join(labels)}), each once", ext["ctx"])
        if ext["buffer_type"] != ext["ctx"].split(":")[1]:
            _fail(where, p + ".buffer_type", json.dumps(ext["ctx"].split(":")[1]) + " (the context's backend)",
                  ext["buffer_type"])
        if ext["is_multi_buffer"] != ("parts" in ext):
            _fail(where, p + (".parts" if "parts" in ext else ".is_multi_buffer"), "parts exactly when "
                  "is_multi_buffer is true", ext.get("parts", ext["is_multi_buffer"]))
    if "external_buffers" in doc and len(exts) != len(labels):
        _fail(where, "external_buffers", f"a buffer for each of the model's contexts ({', '.join(labels)})", exts)


# %%
# | export
REPLAY_MAX_BYTES = 2 << 30  # what `sched --check` may allocate: weights, KV cache, compute buffers, generators
REPLAY_MAX_WEIGHT_BYTES = 64 << 20  # weights it generates and checksums (about 10 and 12 MB/s: some 10 s)
REPLAY_MAX_MACS = 1 << 31  # multiply-adds of all its rounds (the bit-exact tier does about 5e8 a second)


def _built(doc, where, batch) -> tuple:
    """`build_llama`'s (contexts, graph, roots) of the scenario's model for `batch` (tensors, no memory)."""
    try:
        return build_llama(doc["model"], doc["placement"], batch, recorded=True)
    except GraphFullError:
        _fail(where, "model.n_layer", f"a model whose graph fits the recorder's {GGML_DEFAULT_GRAPH_SIZE} nodes",
              doc["model"]["n_layer"])


def _check_graph_size(doc, where, graph, n_backends) -> None:
    """ggml's scheduler hashes every tensor it meets (and, in the recorder's build, every copy) in a
    hash set of at least `graph_size` slots and aborts when it is full; ggml_lite's keeps them in a dict.
    A graph size that leaves room for every tensor and every copy of it is honoured, a smaller one
    refused (ggml_lite would not reproduce the abort)."""
    sp = doc.get("sched_params")
    if sp is None:
        return
    n_copies = GGML_SCHED_MAX_COPIES if sp["parallel"] else 1
    need = (len(graph.nodes) + len(graph.leafs)) * (1 + n_copies * n_backends)
    if sp["graph_size"] < need:
        _fail(where, "sched_params.graph_size", f"at least {need}: room in ggml's hash set for the graph's "
              f"{len(graph.nodes) + len(graph.leafs)} tensors and each of their {n_copies} x {n_backends} possible "
              "copies (ggml aborts when it is full; ggml_lite's scheduler would not)", sp["graph_size"])


def check_replay_work(doc, where: str = "the scenario") -> None:
    """Refuse, before anything is allocated, a replay that needs more than `REPLAY_MAX_BYTES` of memory,
    `REPLAY_MAX_WEIGHT_BYTES` of weights to generate and checksum, or `REPLAY_MAX_MACS` multiply-adds (a
    file's model dimensions can ask for anything)."""
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
                             f"{stored / 2**20:.1f} MiB, compute buffers up to {2 * n_copies * compute / 2**20:.1f} MiB); "
                             f"expected at most {REPLAY_MAX_BYTES / 2**30:g} GiB")
    weight_bytes = sum(map(nbytes, weights))
    if weight_bytes > REPLAY_MAX_WEIGHT_BYTES:
        raise GraphFileError(f"{where}: model: the replay would generate and checksum {weight_bytes / 2**20:.1f} MiB of "
                             f"weights; expected at most {REPLAY_MAX_WEIGHT_BYTES / 2**20:g} MiB (about 10 s)")
    if macs > REPLAY_MAX_MACS:
        raise GraphFileError(f"{where}: steps: the rounds' replay would need {macs:.3g} multiply-adds; expected at most "
                             f"{REPLAY_MAX_MACS:.3g} (about 4 s of the bit-exact tier)")


# %%
# | export


def check_scenario(doc, where: str = "the scenario") -> dict:
    """`doc` if it is a scheduler scenario a replay can use, every field checked (§3); else `GraphFileError`
    naming the file, the field's JSON path, what was expected and what was found."""
    if not isinstance(doc, dict) or doc.get("schema") != "ggml-sched-fixture":
        schema = doc.get("schema") if isinstance(doc, dict) else None
        raise GraphFileError(f"{where}: not a scheduler scenario (schema {quote(schema)}, expected 'ggml-sched-fixture')")
    outcome = doc.get("outcome")
    if not isinstance(outcome, dict):
        raise GraphFileError(f"{where}: no `outcome` object (`{{\"completed\": true}}`, or false with the "
                             "reference's abort); every recorded scenario has one")
    Bool().check(outcome.get("completed", _ABSENT), "outcome.completed", where)  # it says which kind the file is
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
            _fail(where, f"pins[{i}].tensor", "the name of a node or leaf of the round-0 graph", pin["tensor"])
    if "graph" in doc:
        _check_graph(doc, where, ctxs, graph, roots)
    _check_weights(doc, where, ctxs)
    return doc


# %% [markdown]
# Two refused files: scenario 04 with its first pin naming a tensor the graph does not have, and
# scenario 03 with a model of `n_head` 0. Each message names the field by its path, says what was
# expected and what was found; nothing was built. A replay (`sched --check`) also states its cost first:
# `check_replay_work` refuses a file whose weights, cache and compute buffers would pass 2 GiB, whose
# weights pass 64 MiB, or whose rounds would pass 2^31 multiply-adds; the printout (`sched FILE`) fills
# no weight at all.

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
# The replay listens to the `ggml_lite` logger — pass 1's warnings, the debug printout, the graph
# allocator's messages — and rebuilds from them the text the C wrote to stderr, which the fixtures
# recorded line for line. Then it runs the recorded steps — reserve, and per round reset, a fresh
# graph, pins, alloc_graph, inputs, graph_compute — and lists every difference.

# %%
# | export
ROUND0 = {"n_tokens": 16, "n_kv": 32, "kv_head": 0, "n_outputs": 1}  # the README's round-0 batch




def _stderr_text(lines) -> str:
    """Captured messages as the C wrote them to stderr: one per line; the debug printout's split
    headers bring their own leading newline."""
    return "".join(m if m.startswith("\n## SPLIT") else m + "\n" for m in lines)


def _stderr_of(step) -> str:
    return "\n".join(step["stderr"]) + "\n" if step.get("stderr") else ""




def new_sched(doc, backends, debug: bool = None) -> BackendSched:
    """`ggml_backend_sched_new` as the scenario's `sched_params` say (graph size, parallel, debug)."""
    sp = doc.get("sched_params", {})
    return BackendSched(backends, graph_size=sp.get("graph_size", GGML_DEFAULT_GRAPH_SIZE),
                        parallel=sp.get("parallel", False), debug=sp.get("GGML_SCHED_DEBUG", True) if debug is None else debug)


def apply_pins(sched, graph, doc, backends) -> None:
    """The scenario's `ggml_backend_sched_set_tensor_backend` calls, on the tensors of `graph`."""
    by_name = {b.get_name(): b for b in backends}
    for p in doc.get("pins", []):
        sched.set_tensor_backend(graph.get_tensor(p["tensor"]), by_name[p["backend"]])




def built_scenario(doc, buffers: dict = None) -> tuple:
    """`(backends, round-0 graph)` of a scenario that recorded no graph (13: it aborted first): the
    graph built by `build_llama`, its weight and cache contexts allocated on their backends with the
    recorded usages (into `buffers`, by context, when given)."""
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




def _replay_abort(doc) -> list:
    """Scenario 13: the reference aborted in the reserve; ggml_lite must print the same messages before
    it (pass 1's warnings) and raise the same error (the abort's message, without ggml's file:line)."""
    buffers, out = {}, []
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



# %%
# | export
def _short(v) -> str:
    return quote(v, 240)


def _compare(what, got, want, out) -> None:
    """Append a difference to `out` when `got` (ggml_lite's) is not `want` (the record's); long lists and
    texts are shown from their first differing item or line."""
    if got == want:
        return
    if type(got) is type(want) and isinstance(got, (list, str)) and max(len(repr(got)), len(repr(want))) > 240:
        unit, g, w = ("line", got.splitlines(), want.splitlines()) if isinstance(got, str) else ("item", got, want)
        k = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
        out.append(f"{what}: first difference at {unit} {k} ({len(g)} in ggml_lite, {len(w)} in ggml): ggml_lite "
                   f"{_short(g[k]) if k < len(g) else '(none)'}, ggml {_short(w[k]) if k < len(w) else '(none)'}")
    else:
        out.append(f"{what}: ggml_lite {_short(got)}, ggml {_short(want)}")




def _labels(sched, buffers: dict) -> dict:
    """id(buffer) -> the name the recorder gave it: `compute:BACKEND`, or the weight or cache context
    (a multi-buffer's parts as `ctx[i]`)."""
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
    """(buffer, offset, ext_offset) of a tensor as the recorder wrote them: an offset in a compute
    buffer, an ext_offset in a weight or cache buffer."""
    if t.buffer is None or t.data is None:
        return None, None, None
    label, off = labels.get(id(t.buffer), t.buffer.get_name()), t.data - t.buffer.get_base()
    return (label, off, None) if label.startswith("compute:") else (label, None, off)


# %%
# | export


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


def _check_alloc(sched, step, out, buffers: dict, order: list) -> None:
    """A round's alloc_graph as recorded; `order`: the round's tensors in id order (weights and cache,
    then the compute context)."""
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
        _compare(f"{k}: graph copy {kind}", (len(tensors_), len(tensors_)), (len(recs), step["sched_graph"][f"n_{kind}"]), out)
        for i, (t, b, rec) in enumerate(zip(tensors_, ids, recs)):
            got = (i, t.name, t.op.name, sched.backends[b].get_name() if b != -1 else None,
                   t.view_src.name if t.view_src is not None else None, int(t.flags), nbytes(t), *_placed(t, labels))
            _compare(f"{k}: graph copy {kind}[{rec['i']}]", got, tuple(rec[f] for f in (
                "i", "name", "op", "backend", "view_src", "flags_value", "nbytes", "buffer", "offset", "ext_offset")), out)
    _compare(f"{k}: buffer sizes", {b.get_name(): sched.get_buffer_size(b) for b in sched.backends},
             step["buffer_sizes"], out)



# %%
# | export
def scenario_printout(doc: dict, where: str = "the scenario") -> str:
    """The GGML_SCHED_DEBUG printout of the scenario's round-0 graph after its pins (the text the
    reserve step recorded, pass 1's warnings first); the file checked first, no weight filled."""
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



# %%
# | export
class _Trace:
    """Records the backend calls made while it is active, in the fixtures' trace format: every call of
    the SIM backends (and their buffers) and the CPU's graph_compute. The hooks are wrapped on the
    backend objects and on the SimBuffer class, and restored on exit."""

    def __init__(self, sched):
        self.sched, self.lines, self.undo = sched, [], []
        self.event_names = {id(e): f"ev{c}" for row in sched.events for c, e in enumerate(row) if e is not None}

    def _wrap(self, obj, name, make):
        """Replace `obj.name` by `make(current)`; remember what `obj` itself held, to restore it."""
        self.undo.append((obj, name, obj.__dict__.get(name, _MISSING)))
        setattr(obj, name, make(getattr(obj, name)))

    def __enter__(self):
        from ggml_lite.sim import SimBackend, SimBuffer, computes_nothing

        lines, ev = self.lines, self.event_names
        for b in self.sched.backends:
            name = b.get_name()

            def gc(orig, name=name):
                def run(graph):
                    nodes = graph.nodes
                    real = [n for n in nodes if not computes_nothing(n.op)]
                    shown = real or nodes  # first and last name the non-view nodes
                    lines.append(f"{name}.graph_compute n_nodes={len(nodes)} ({len(real)} non-view) "
                                 f"first={shown[0].name} last={shown[-1].name}")
                    return orig(graph)
                return run
            self._wrap(b, "_graph_compute", gc)
            if not isinstance(b, SimBackend):
                continue
            self._wrap(b, "_synchronize", lambda orig, name=name: lambda: (lines.append(f"{name}.synchronize"), orig())[1])
            self._wrap(b, "_event_record", lambda orig, name=name: lambda e: (
                lines.append(f"{name}.event_record {ev.get(id(e), '?')}"), orig(e))[1])
            self._wrap(b, "_event_synchronize", lambda orig, name=name: lambda e: (
                lines.append(f"{name}.event_synchronize {ev.get(id(e), '?')}"), orig(e))[1])
            self._wrap(b, "_event_wait", lambda orig, name=name: lambda e: (
                lines.append(f"{name}.event_wait {e.backend.get_name()}.{ev.get(id(e), '?')}"), orig(e))[1])
        self._wrap(SimBuffer, "set_tensor", lambda orig: lambda buf, t, data, offset, size: (
            lines.append(f"{buf.buft.get_name()}.set_tensor {t.name} offset={offset} size={size}"),
            orig(buf, t, data, offset, size))[1])
        self._wrap(SimBuffer, "get_tensor", lambda orig: lambda buf, t, offset, size: (
            lines.append(f"{buf.buft.get_name()}.get_tensor {t.name} offset={offset} size={size}"),
            orig(buf, t, offset, size))[1])

        def cpy(orig):
            def run(buf, src, dst):
                done = orig(buf, src, dst)
                sbuf = src.view_src.buffer if src.view_src is not None else src.buffer
                lines.append(f"{buf.buft.get_name()}.cpy_tensor {src.name} ({sbuf.get_name()}) -> {dst.name} "
                             f"{'size=' + str(nbytes(src)) if done else 'declined'}")
                return done
            return run
        self._wrap(SimBuffer, "cpy_tensor", cpy)
        return self

    def __exit__(self, *exc):
        for obj, name, old in reversed(self.undo):
            if old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)




_MISSING = object()



# %%
# | export
def _check_setup(doc, buffers, tensors, sched, out) -> None:
    """The weight and cache buffers as recorded (sizes, parts), every weight where it was and with the
    recorded checksum of its bytes (`tensors`: name -> tensor)."""
    labels = _labels(sched, buffers)
    for ext in doc["external_buffers"]:
        buf = buffers[ext["ctx"]]
        parts = [{"size": p.get_size(), "usage": p.get_usage().name} for p in buf.buffers] if buf.is_multi_buffer() else None
        _compare(f"external buffer {ext['ctx']}: size, multi-buffer and parts", (buf.get_size(), buf.is_multi_buffer(), parts),
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


# %%
# | export
class _Allocations:
    """Records every SIM buffer allocation while active, as the fixtures' `fake_buffer_allocations`
    write them: `NAME.alloc_buffer size=N (why)`; `why` is set by the caller as the replay goes on."""

    def __init__(self, why: str):
        self.why, self.lines = why, []

    def __enter__(self):
        from ggml_lite.sim import SimBufferType

        orig, lines = SimBufferType.alloc_buffer, self.lines

        def alloc_buffer(buft, size):
            lines.append(f"{buft.get_name()}.alloc_buffer size={size} ({self.why})")
            return orig(buft, size)
        self.undo = lambda: setattr(SimBufferType, "alloc_buffer", orig)
        SimBufferType.alloc_buffer = alloc_buffer
        return self

    def __exit__(self, *exc):
        self.undo()


def replay(doc: dict, where: str = "the scenario") -> list:
    """Every difference between a recorded scenario and ggml_lite's replay of it (empty: identical):
    the set-up (buffers, weights and their checksums, the FAKE allocations), the reserve (stderr:
    warnings, GGML_SCHED_DEBUG printout, allocator messages; n_splits, n_copies, buffer sizes), and per
    round alloc_graph (stderr, splits and their inputs and copies, the graph inputs, every tensor's
    backend, cause, buffer and offset, the graph copy, buffer sizes) and graph_compute (status,
    cur_copy, inputs, the logits bit for bit, and every backend call in order). Scenario 13 must end
    in the reference's abort. The file is checked first (§3), and so is the work it asks for."""
    check_scenario(doc, where)
    if not doc["outcome"]["completed"]:
        return _replay_abort(doc)
    check_replay_work(doc, where)
    out = []
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
        _compare("reserve: stderr", _stderr_text(err), _stderr_of(res), out)
        _compare("reserve: n_splits, n_copies", (sched.n_splits, sched.n_copies), (res["n_splits"], res["n_copies"]), out)
        _compare("reserve: buffer sizes", {b.get_name(): sched.get_buffer_size(b) for b in sc.backends},
                 res["buffer_sizes"], out)
        allocs.why = "ggml_backend_sched_alloc_graph"
        _replay_rounds(doc, sc, sched, out)
    if "fake_buffer_allocations" in doc:
        _compare("FAKE buffer allocations", allocs.lines, doc["fake_buffer_allocations"], out)
    return out


# %%
# | export


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
        _compare(f"round {alloc_step['round']} alloc_graph: stderr", _stderr_text(err), _stderr_of(alloc_step), out)
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
        _compare(f"{r}: stderr", "", _stderr_of(compute_step), out)
        _check_compute(graph, alloc_step["batch"], compute_step, out)


def _check_graph_facts(sched, graph, doc, buffers, out) -> None:
    """What the recorder wrote into the round-0 graph's records after its alloc_graph: each tensor's
    backend, cause, buffer, offsets and whether it was preallocated."""
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
# ## 5 · All 14 scenarios
#
# All 14 recorded scenarios, replayed from the copies the project carries (`tests/fixtures/`): every
# recorded fact — assignments and causes, splits, the graph copy with its offsets, buffer sizes, the
# printout, every backend call, the logits bit for bit, and scenario 13's abort — must come out the same.

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
