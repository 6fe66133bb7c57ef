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
# 3. The replay: every recorded step run again, every fact compared (§3), then all 14 at once (§4).
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

import logging
from dataclasses import dataclass

import numpy as np

from ggml_lite.backend import tensor_get, tensor_set
from ggml_lite.buffer import BufferUsage
from ggml_lite.cpu import cpu_init
from ggml_lite.errors import GraphFileError, SchedulerError
from ggml_lite.dyn_tallocr import captured_log
from ggml_lite.graphio import read_graph_file
from ggml_lite.models.llama import batch_inputs, build_llama, build_graph, model_tensors
from ggml_lite.numerics import lcg_states
from ggml_lite.sched import BackendSched
from ggml_lite.sim import sim_init
from ggml_lite.tallocr import alloc_ctx_tensors
from ggml_lite.tallocr import alloc_ctx_tensors_from_buft
from ggml_lite.tensor import F16, nelements
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


# %%
# | export
def offload_rule(text):
    if text is not None and text.startswith("ne[1] >= 32 && op != GET_ROWS"):
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
def load_scenario(doc: dict, clock=None) -> Scenario:
    """Backends, the graph, and the external buffers allocated, cleared (KV cache) and filled (weights)."""
    if "graph" not in doc:
        raise GraphFileError(f"scenario {doc.get('fixture')} records no graph (outcome {doc.get('outcome')}); "
                                "build it with the LLaMA builder of the scenario's model")
    backends = make_backends(doc, clock)
    by_name = {b.get_name(): b for b in backends}
    gf = read_graph_file(doc)
    buffers = {}
    for ext in doc["external_buffers"]:
        ctx = gf.contexts[ext["ctx"]]
        buf = alloc_ctx_tensors_from_buft(ctx, by_name[ext["buffer_type"]].get_default_buffer_type())
        buf.set_usage(BufferUsage[ext["usage"]])
        if ext["ctx"].startswith("kv_cache:"):
            buf.clear(0)
        buffers[ext["ctx"]] = buf
    for w in doc["weights"]:
        t = gf.graph.get_tensor(w["name"]) or next(t for t in gf.tensors.values() if t.name == w["name"])
        seed, offset, scale = weight_gen(w["name"])
        values = weight_values(seed, nelements(t), offset, scale)
        tensor_set(t, values.astype(np.float16) if t.type is F16 else values)
    return Scenario(doc, backends, gf, buffers)



# %% [markdown]
# ## 3 · The replay
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




def apply_pins(sched, graph, doc, backends) -> None:
    """The scenario's `ggml_backend_sched_set_tensor_backend` calls, on the tensors of `graph`."""
    by_name = {b.get_name(): b for b in backends}
    for p in doc["pins"]:
        sched.set_tensor_backend(graph.get_tensor(p["tensor"]), by_name[p["backend"]])




def built_scenario(doc) -> tuple:
    """`(backends, round-0 graph)` of a scenario that recorded no graph (13: it aborted first): the
    graph built by `build_llama`, its weight and cache contexts allocated on their backends."""
    backends = make_backends(doc)
    by_name = {b.get_name(): b for b in backends}
    ctxs, graph, _ = build_llama(doc["model"], doc["placement"], ROUND0, recorded=True)
    for ctx in ctxs[:-1]:
        buf = alloc_ctx_tensors(ctx, by_name[ctx.name.split(":")[1]])
        buf.set_usage(BufferUsage.WEIGHTS if ctx.name.startswith("weights") else BufferUsage.ANY)
    return backends, graph




def _replay_abort(doc) -> list:
    """Scenario 13: the reference aborted in the reserve; ggml_lite must raise the same error."""
    backends, graph = built_scenario(doc)
    sched = BackendSched(backends, debug=True)
    want = doc["outcome"]["stderr_until_abort"][-1].split(": ", 1)[-1]
    try:
        sched.reserve(graph)
    except SchedulerError as err:
        return [] if want in str(err) else [f"reserve: aborted with {err!r}, the reference with {want!r}"]
    return [f"reserve: completed, the reference aborted ({want})"]



# %%
# | export
def _compare(what, got, want, out) -> None:
    if got != want:
        out.append(f"{what}: ggml_lite {got!r}, ggml {want!r}")




def _check_alloc(sched, graph, step, out) -> None:
    k = f"round {step['round']} alloc_graph"
    _compare(f"{k}: n_splits", sched.n_splits, step["n_splits"], out)
    _compare(f"{k}: cur_copy", sched.cur_copy, step["cur_copy"], out)
    _compare(f"{k}: splits", [(sched.backends[s.backend_id].get_name(), s.i_start, s.i_end, [i.name for i in s.inputs])
                              for s in sched.splits],
             [(s["backend"], s["i_start"], s["i_end"], [i["name"] for i in s["inputs"]]) for s in step["splits"]], out)
    tensors = {t.name: t for t in (*graph.nodes, *graph.leafs)}
    for rec in step["tensors"]:
        t = tensors.get(rec["name"])
        b = sched.get_tensor_backend(t) if t is not None else None
        _compare(f"{k}: {rec['name']}: backend and cause", (b.get_name() if b else None, sched.get_cause(t)),
                 (rec["backend"], rec["cause"]), out)
    base = {f"compute:{b.get_name()}": (sched.galloc.buffers[i].get_base() if sched.galloc.buffers[i] else None)
            for i, b in enumerate(sched.backends)}
    for kind, tensors_, ids in (("nodes", sched.graph.nodes, sched.node_backend_ids),
                                ("leafs", sched.graph.leafs, sched.leaf_backend_ids)):
        recs = step["sched_graph"][kind]
        _compare(f"{k}: graph copy {kind}", len(tensors_), len(recs), out)
        for t, b, rec in zip(tensors_, ids, recs):
            got = (t.name, sched.backends[b].get_name() if b != -1 else None, int(t.flags))
            off = t.data - base[rec["buffer"]] if rec["buffer"] in base and t.data is not None else rec["offset"]
            _compare(f"{k}: graph copy {kind}[{rec['i']}]", got + (off,),
                     (rec["name"], rec["backend"], rec["flags_value"], rec["offset"]), out)
    _compare(f"{k}: buffer sizes", {b.get_name(): sched.get_buffer_size(b) for b in sched.backends},
             step["buffer_sizes"], out)




SCENARIO_FIELDS = {  # what a replay reads, by kind of scenario (the README's top-level keys)
    "completed": ("sched_params", "backends", "model", "placement", "external_buffers", "weights", "pins",
                  "graph", "steps"),
    "aborted": ("backends", "model", "placement"),
}




def check_scenario(doc, where: str = "the scenario") -> dict:
    """`doc` if it is a scheduler scenario a replay can use; else `GraphFileError` naming what is
    missing (its `outcome` first: it says which of the two kinds the file is)."""
    if not isinstance(doc, dict) or doc.get("schema") != "ggml-sched-fixture":
        schema = doc.get("schema") if isinstance(doc, dict) else None
        raise GraphFileError(f"{where}: not a scheduler scenario (schema {schema!r}, "
                                "expected 'ggml-sched-fixture')")
    outcome = doc.get("outcome")
    if not isinstance(outcome, dict):
        raise GraphFileError(f"{where}: no `outcome` object (`{{\"completed\": true}}`, or false with the "
                                "reference's abort); every recorded scenario has one")
    kind = "completed" if outcome.get("completed", True) else "aborted"
    missing = [k for k in SCENARIO_FIELDS[kind] if k not in doc]
    if kind == "aborted" and not outcome.get("stderr_until_abort"):
        missing.append("outcome.stderr_until_abort")
    if missing:
        raise GraphFileError(f"{where}: a {kind} scenario needs {', '.join(f'`{k}`' for k in missing)}, "
                                "which the file lacks")
    return doc



# %%
# | export
def scenario_printout(doc: dict) -> str:
    """The GGML_SCHED_DEBUG printout of the scenario's round-0 graph after its pins (the text the
    reserve step recorded, pass 1's warnings first)."""
    check_scenario(doc)
    if not doc["outcome"].get("completed", True):
        backends, graph = built_scenario(doc)
        sched = BackendSched(backends, debug=True)
    else:
        sc = load_scenario(doc)
        graph, sched = sc.gf.graph, BackendSched(sc.backends, parallel=doc["sched_params"]["parallel"], debug=True)
        apply_pins(sched, graph, doc, sc.backends)
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
def replay(doc: dict) -> list:
    """Every difference between a recorded scenario and ggml_lite's replay of it (empty: identical):
    the reserve (stderr: warnings, GGML_SCHED_DEBUG printout, allocator messages; n_splits, n_copies,
    buffer sizes), and per round alloc_graph (stderr, splits, every tensor's backend and cause, the
    graph copy with every offset, buffer sizes) and graph_compute (status, cur_copy, the logits bit for
    bit, and every backend call in order). Scenario 13 must end in the reference's abort."""
    check_scenario(doc)
    if not doc["outcome"].get("completed", True):
        return _replay_abort(doc)
    out = []
    sc = load_scenario(doc)
    sched = BackendSched(sc.backends, parallel=doc["sched_params"]["parallel"], debug=True)
    steps = doc["steps"]
    apply_pins(sched, sc.gf.graph, doc, sc.backends)
    with captured_log(logging.DEBUG) as err:
        ok = sched.reserve(sc.gf.graph)
    res = steps[0]
    _compare("reserve: ok", ok, res["ok"], out)
    _compare("reserve: stderr", _stderr_text(err), _stderr_of(res), out)
    _compare("reserve: n_splits, n_copies", (sched.n_splits, sched.n_copies), (res["n_splits"], res["n_copies"]), out)
    _compare("reserve: buffer sizes", {b.get_name(): sched.get_buffer_size(b) for b in sc.backends},
             res["buffer_sizes"], out)
    w, layers = model_tensors({t.name: t for t in sc.gf.tensors.values()}, doc["model"]["n_layer"])
    for k in range(1, len(steps), 2):
        alloc_step, compute_step = steps[k], steps[k + 1]
        sched.reset()
        _, graph, _ = build_graph(doc["model"], w, layers, alloc_step["batch"], recorded=True)
        apply_pins(sched, graph, doc, sc.backends)
        with captured_log(logging.DEBUG) as err:
            ok = sched.alloc_graph(graph)
        _compare(f"round {alloc_step['round']} alloc_graph: ok", ok, alloc_step["ok"], out)
        _compare(f"round {alloc_step['round']} alloc_graph: stderr", _stderr_text(err), _stderr_of(alloc_step), out)
        _check_alloc(sched, graph, alloc_step, out)
        for key, value in batch_inputs(alloc_step["batch"]).items():
            tensor_set(graph.get_tensor(key), value)
        with _Trace(sched) as trace:
            status = sched.graph_compute(graph)
        r = f"round {compute_step['round']} graph_compute"
        _compare(f"{r}: backend calls", trace.lines, compute_step["trace"], out)
        _compare(f"{r}: status", int(status), compute_step["status"], out)
        _compare(f"{r}: cur_copy after", sched.cur_copy, compute_step["cur_copy_after"], out)
        rec = next(o for o in compute_step["outputs"] if o["name"] == "result_output")
        got = tensor_get(graph.get_tensor("result_output")).reshape(-1)
        want = np.array(rec["values"], dtype=np.float64).astype(np.float32)
        n_diff = int((got != want).sum())
        if n_diff:
            out.append(f"{r}: {n_diff} of {want.size} logits differ (max |diff| {float(np.abs(got - want).max()):.3g})")
    return out



# %% [markdown]
# ## 4 · All 14 scenarios
#
# All 14 recorded scenarios, replayed from the copies the project carries (`tests/fixtures/`): every
# recorded fact — assignments and causes, splits, the graph copy with its offsets, buffer sizes, the
# printout, every backend call, the logits bit for bit, and scenario 13's abort — must come out the same.

# %%
# NBVAL_CHECK_OUTPUT
import json
from pathlib import Path

scenario_diffs = {}
for path in sorted(Path("../tests/fixtures/ggml-seed-sched").glob("*.json")):
    scenario_diffs[path.stem] = replay(json.loads(path.read_text()))
n_same = sum(not d for d in scenario_diffs.values())
print(f"{n_same} of {len(scenario_diffs)} recorded scenarios identical to the real ggml's scheduler")


# %% [markdown]
# ## 5 · Check

# %%
assert len(scenario_diffs) == 14 and not any(scenario_diffs.values()), scenario_diffs
print("appendix A3: all checks passed")
