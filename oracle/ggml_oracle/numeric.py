"""Whole numeric graphs: MLPs and attention stacks with softmax heads (issue 22), computed by ggml and by
ggml_lite's tiers, and written as fixture-schema files with a `numerics` block."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np

import ggml_lite as gl
from ggml_lite.tensor import Op, TensorFlag

from .bindings import ALIGNMENT
from .compute import ggml_compute, graph_data_tensors
from .plans import ggml_plan
from .random_graphs import F16, F32, I32, Q8_0


@dataclass
class NumericGraph:
    """A whole graph to compute: one compute context, its leafs filled by the numerics generator
    (`ranges`: [lo, hi) of the integer leafs by name), `roots` as given to build_forward_expand."""

    graph: gl.Graph
    roots: list
    ctx: gl.Context
    ranges: dict
    label: str

    @property
    def weight_types(self) -> set:
        """The types of the mul_mat weights (src0 leafs)."""
        weights = [n.src[0] for n in self.graph.nodes if n.op is Op.MUL_MAT]
        return {w.type.name for w in weights if w is not None and w.op is Op.NONE}

    def results(self) -> list:
        """What a `numerics` file records: every OUTPUT node and the final node, in node order."""
        nodes = self.graph.nodes
        return [t for t in nodes if t.flags & TensorFlag.OUTPUT or t is nodes[-1]]

    def mixed(self) -> bool:
        """Does an f16 or quantized tensor take part (`numerics.verify_numerics`'s test)?"""
        return any(t.type.name != "f32" and t.type is not I32 for t in self.ctx.tensors)


def _leaf(ctx, type, ne, name):
    t = ctx.new_tensor(type, ne, name=name)
    gl.set_input(t)  # numeric graphs flag every leaf INPUT (tests/fixtures/README.md)
    return t


def _finish(ctx, out, ranges, label, outputs=()) -> NumericGraph:
    for t in (*outputs, out):
        gl.set_output(t)
    graph = gl.build_forward(out)
    return NumericGraph(graph, [out], ctx, ranges, label)


def mlp_graph(width: int, n_layers: int, n_tokens: int, wtype, act: str = "gelu", n_out: int = 32,
              scaled: bool = False) -> NumericGraph:
    """x [width, n_tokens] -> n_layers x (act(W·h + b)) -> soft_max(W_out·h): an MLP with a softmax
    head (as fixture 01); `scaled`: each pre-activation scaled by 1/sqrt(width)."""
    ctx = gl.Context("compute")
    h = _leaf(ctx, F32, [width, n_tokens], "x")
    for i in range(n_layers):
        w = _leaf(ctx, wtype, [width, width], f"w{i}")
        b = _leaf(ctx, F32, [width, 1], f"b{i}")
        z = gl.mul_mat(ctx, w, h)
        if scaled:
            z = gl.scale(ctx, z, 1.0 / math.sqrt(width))
        h = getattr(gl, act)(ctx, gl.add(ctx, z, b))
        h.set_name(f"h{i}")
    logits = gl.mul_mat(ctx, _leaf(ctx, wtype, [width, n_out], "w_out"), h).set_name("logits")
    probs = gl.soft_max(ctx, logits).set_name("probs")
    label = f"mlp {n_layers}x{width} {act} tokens={n_tokens} w={wtype.name}{' scaled' if scaled else ''}"
    return _finish(ctx, probs, {}, label, [logits])


def attention_graph(n_embd: int, n_head: int, n_head_kv: int, n_tokens: int, n_layers: int, wtype,
                    kv_type=F32, mask_type=F32, rope_mode: int = 2, n_ff: int | None = None,
                    n_vocab: int = 64) -> NumericGraph:
    """A LLaMA-like stack without a KV cache: per layer rms_norm·g, Q/K/V mul_mats (`wtype`), rope_ext
    (`rope_mode`: 0 normal, 2 NeoX) on Q and K, K and V stored as `kv_type` (a cpy, as into a cache),
    KQ = mul_mat(K, Q) (GQA when n_head_kv < n_head), soft_max_ext with a `mask_type` mask and scale
    1/sqrt(head_dim), KQV, the output projection and residual, a SiLU-gated FFN and residual; then a
    rms_norm'd vocabulary projection and its soft_max."""
    ctx = gl.Context("compute")
    hd = n_embd // n_head
    n_ff = n_ff or 2 * n_embd
    T = n_tokens
    x = _leaf(ctx, F32, [n_embd, T], "inp_embd")
    pos = _leaf(ctx, I32, [T], "inp_pos")
    mask = _leaf(ctx, mask_type, [T, T], "kq_mask")

    def w(name, n_in, n_out):
        return _leaf(ctx, wtype, [n_in, n_out], name)

    def normed(h, name):
        return gl.mul(ctx, gl.rms_norm(ctx, h, 1e-5), _leaf(ctx, F32, [n_embd, 1], name))

    def rope(t):
        return gl.rope_ext(ctx, t, pos, None, hd, rope_mode, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)

    def stored(t):  # K and V as a cache holds them
        return t if kv_type is F32 else gl.cpy(ctx, t, ctx.new_tensor(kv_type, list(t.ne[:3]), name=f"{t.name}_cache"))

    for il in range(n_layers):
        cur = normed(x, f"blk.{il}.attn_norm")
        q = rope(gl.reshape_3d(ctx, gl.mul_mat(ctx, w(f"blk.{il}.wq", n_embd, n_embd), cur), hd, n_head, T))
        k = rope(gl.reshape_3d(ctx, gl.mul_mat(ctx, w(f"blk.{il}.wk", n_embd, hd * n_head_kv), cur), hd, n_head_kv, T))
        v = gl.reshape_3d(ctx, gl.mul_mat(ctx, w(f"blk.{il}.wv", n_embd, hd * n_head_kv), cur), hd, n_head_kv, T)
        k, v = stored(k.set_name(f"k{il}")), stored(v.set_name(f"v{il}"))
        kq = gl.mul_mat(ctx, gl.permute(ctx, k, 0, 2, 1, 3), gl.permute(ctx, q, 0, 2, 1, 3))
        kq = gl.soft_max_ext(ctx, kq, mask, 1.0 / math.sqrt(hd), 0.0).set_name(f"kq_soft_max{il}")
        vt = gl.cont(ctx, gl.permute(ctx, v, 1, 2, 0, 3))
        kqv = gl.mul_mat(ctx, vt, kq)
        cur = gl.cont_2d(ctx, gl.permute(ctx, kqv, 0, 2, 1, 3), n_embd, T)
        x = gl.add(ctx, x, gl.mul_mat(ctx, w(f"blk.{il}.wo", n_embd, n_embd), cur))
        cur = normed(x, f"blk.{il}.ffn_norm")
        gate = gl.silu(ctx, gl.mul_mat(ctx, w(f"blk.{il}.ffn_gate", n_embd, n_ff), cur))
        up = gl.mul_mat(ctx, w(f"blk.{il}.ffn_up", n_embd, n_ff), cur)
        x = gl.add(ctx, x, gl.mul_mat(ctx, w(f"blk.{il}.ffn_down", n_ff, n_embd), gl.mul(ctx, gate, up)))
        x.set_name(f"l_out{il}")
    logits = gl.mul_mat(ctx, w("output", n_embd, n_vocab), normed(x, "output_norm")).set_name("logits")
    probs = gl.soft_max(ctx, logits).set_name("probs")
    label = (f"attention {n_layers}x{n_embd} heads={n_head}/{n_head_kv} tokens={T} w={wtype.name} "
             f"kv={kv_type.name} mask={mask_type.name} rope={'neox' if rope_mode & 2 else 'normal'}")
    return _finish(ctx, probs, {"inp_pos": (0, 512)}, label, [logits])


def numeric_corpus(n_mlp: int = 48, n_attention: int = 48, seed: int = 22) -> list:
    """A seeded corpus of whole graphs: MLPs of 1-4 layers (widths 32-512, gelu/relu/silu, f32/f16/
    q8_0/q4_0 weights, one in four scaled) and attention stacks of 1-2 layers (widths 64-512, GQA or
    not, f32/f16/q8_0/q4_0 weights, f32/f16 K and V, f32/f16 masks, NeoX or normal rope)."""
    rng = random.Random(seed)
    wtypes = (F32, F16, Q8_0, gl.Q4_0)
    out = []
    for i in range(n_mlp):
        out.append(mlp_graph(rng.choice((32, 64, 128, 256, 512)), 1 + i % 4, rng.choice((1, 4, 8, 16)),
                             wtypes[(i // 4) % 4], rng.choice(("gelu", "relu", "silu")), scaled=rng.random() < 0.25))
    for i in range(n_attention):
        n_embd = rng.choice((64, 128, 256, 512))
        n_head = rng.choice([h for h in (2, 4, 8) if n_embd // h >= 16])
        out.append(attention_graph(n_embd, n_head, rng.choice([d for d in (1, 2, n_head) if n_head % d == 0]),
                                   rng.choice((1, 7, 16, 32)), 1 + i % 2, wtypes[i % 4],
                                   kv_type=rng.choice((F32, F16)), mask_type=rng.choice((F32, F16)),
                                   rope_mode=rng.choice((0, 2))))
    return out


def numerics_data(ng: NumericGraph, seed: int) -> dict:
    """{tensor: bytes} for every tensor the graph reads without computing it, as the numerics generator
    of tests/fixtures/README.md fills it (`numerics.leaf_bytes`): the fixture id is the tensor's index in
    its context (the ids `graphio.graph_document` gives); q4_0 (which the file layout does not cover) by
    q4_0's reference quantizer."""
    from ggml_lite.numerics import leaf_bytes

    ids = {t: i for i, t in enumerate(ng.ctx.tensors)}
    return {t: leaf_bytes(t.type, t.ne, seed, ids[t], "int" if t.type is I32 else "float", ng.ranges.get(t.name),
                          t.name)
            for t in graph_data_tensors(ng.graph)}


def result_values(t, raw: bytes) -> np.ndarray:
    """The f32 values of a result's bytes (f32 or f16 results), in memory order."""
    return np.frombuffer(raw, np.float16 if t.type is F16 else np.float32).astype(np.float32)


def ggml_results(ng: NumericGraph, seed: int) -> list:
    """The bytes of `ng.results()` computed by the real ggml from `numerics_data(ng, seed)` (call it
    through `run_isolated` / `run_batch`: ggml aborts on what it refuses)."""
    return ggml_compute(ng.graph, ng.roots, (), numerics_data(ng, seed), ng.results())


def numerics_document(ng: NumericGraph, seed: int, results: list, fixture: str = "numeric") -> dict:
    """A fixture-schema file of `ng` with the plan the real ggml made and a `numerics` block recording
    `results` (the bytes `ggml_results` returned): the layout of tests/fixtures/README.md."""
    from ggml_lite.graphio import graph_document

    doc = graph_document(ng.graph, [ng.ctx], ng.roots, fixture=fixture, description=ng.label)
    plan = ggml_plan(ng.graph, ng.roots)
    size = plan["reference_buffer_size"]
    # what the reference's debug build logs (ggml-alloc.c:770): the allocator's peak, ggml-python's size
    realloc = (f"ggml_gallocr_reserve_n: reallocating CPU buffer from size 0.00 MiB to "
               f"{plan['buffer_size'] / 1024.0 / 1024.0:.2f} MiB")
    ids = {t: i for i, t in enumerate(ng.ctx.tensors)}
    for entry in doc["graph"]["tensors"]:
        t = ng.ctx.tensors[entry["id"]]
        off = plan["offsets"].get(t)
        # every tensor is the compute context's (ggml_lite may have planned `ng` already: not pre-allocated)
        entry.update(preallocated=False, buffer="compute" if off is not None else None, offset=off)
    doc.update(buffer_type={"name": "CPU", "alignment": ALIGNMENT, "max_size": None, "alloc_size": "ggml_nbytes"},
               external_buffers=[], reserve={"ok": plan["reserve_ok"], "buffer_size": size, "log": [realloc]},
               alloc_graph={"ok": plan["alloc_ok"], "buffer_size": size, "log": []}, buffer_size=size, numeric=True,
               data_generator={"kind": "lcg32", "data_seed": seed})
    leaf_data = []
    for t in graph_data_tensors(ng.graph):
        rng = ng.ranges.get(t.name)
        leaf_data.append({"id": ids[t], "name": t.name, "type": t.type.name,
                          "kind": "int" if t.type is I32 else "float", **({"range": list(rng)} if rng else {})})
    entries = [result_entry(ids[t], t, result_values(t, raw)) for t, raw in zip(ng.results(), results)]
    doc["numerics"] = {"leaf_data": leaf_data, "results": entries}
    return doc


def result_entry(i: int, t, v) -> dict:
    """One `numerics.results` entry (tests/fixtures/README.md) for tensor `t` of fixture id `i` whose
    f32 values are `v`: the values, or past 4096 of them a summary (sums and the first 256)."""
    entry = {"id": i, "name": t.name, "reason": "output" if t.flags & TensorFlag.OUTPUT else "final",
             "type": t.type.name, "ne": list(t.ne), "n_elements": int(v.size)}
    if v.size > 4096:
        v64 = v.astype(np.float64)
        entry.update(summary=True, sum=float(v64.sum()), sum_sq=float((v64 * v64).sum()),
                     first=[float(x) for x in v[:256]])
    else:
        entry["values"] = [float(x) for x in v]
    return entry


class UnconvertedArithmetic(gl.Arithmetic):
    """The numpy tier as it was before issue 22: mul_mat multiplied an f32 src1 in f32, without the
    conversion to the weight's dot type (for measurements and for tests that must see the difference)."""

    name = "numpy-unconverted"

    def to_vec_dot(self, type, y):
        return y


def lite_numeric_results(ng: NumericGraph, seed: int, tiers: dict) -> dict:
    """`ng`'s results computed by ggml_lite as `check` computes them, once per tier: planned once by a
    `GAllocr`, then for each tier ({name: Arithmetic}) the leafs filled from `numerics_data(ng, seed)`
    and the graph computed on a CPU backend with that tier (the exact tier's libm under
    `libm_exact`). Returns {name: [float64 arrays]} in `ng.results()` order; frees the plan."""
    from ggml_lite.exact import ExactArithmetic, libm_exact

    galloc = gl.GAllocr(gl.cpu_buffer_type())
    if not (galloc.reserve(ng.graph) and galloc.alloc_graph(ng.graph)):
        raise RuntimeError(f"{ng.label}: the graph allocator failed")
    data = numerics_data(ng, seed)
    out = {}
    try:
        for name, arith in tiers.items():
            for t, raw in data.items():
                holder = t.view_src.buffer if t.view_src is not None else t.buffer
                holder.set_tensor(t, raw, 0, len(raw))
            with libm_exact(isinstance(arith, ExactArithmetic)):
                gl.CPUBackend(arith=arith).graph_compute(ng.graph)
            out[name] = [gl.tensor_get(t).astype(np.float64).reshape(-1) for t in ng.results()]
    finally:
        galloc.free()
    return out
