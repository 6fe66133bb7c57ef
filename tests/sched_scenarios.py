"""Replaying the set-up of a scheduler scenario (../shared/fixtures/ggml-seed-sched/README.md) with
ggml_lite: the backends (SIM configured as the FAKE accelerator, then the CPU), the weight and KV-cache
buffers on their backends, the weights regenerated bit for bit, and the inputs of a batch.

    sc = load_scenario(doc)          # backends, graph (GraphFile), external buffers, weights set
    inputs = batch_inputs(batch)     # {"inp_tokens": ..., "inp_pos": ..., "KQ_mask": ..., "inp_out_ids": ...}

The scheduler itself (chapter 06) is not involved: this is what a scenario does before
`ggml_backend_sched_new`."""

from dataclasses import dataclass

import numpy as np

import ggml_lite as gl
from ggml_lite.numerics import lcg_states

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
            out.append(gl.cpu_init())
        else:
            out.append(gl.sim_init(b["name"], alignment=b["alignment"], max_size=b["max_size"],
                                   deny_ops=b["supports_op_denied"], offload=offload_rule(b["offload_op"]),
                                   asynchronous=False, clock=clock))
    return out


@dataclass
class Scenario:
    doc: dict
    backends: list
    gf: object  # graphio.GraphFile of the round-0 graph
    buffers: dict  # external context label -> Buffer


def load_scenario(doc: dict, clock=None) -> Scenario:
    """Backends, the graph, and the external buffers allocated, cleared (KV cache) and filled (weights)."""
    if "graph" not in doc:
        raise gl.GraphFileError(f"scenario {doc.get('fixture')} records no graph (outcome {doc.get('outcome')}); "
                                "build it with the LLaMA builder of the scenario's model")
    backends = make_backends(doc, clock)
    by_name = {b.get_name(): b for b in backends}
    gf = gl.read_graph_file(doc)
    buffers = {}
    for ext in doc["external_buffers"]:
        ctx = gf.contexts[ext["ctx"]]
        buf = gl.alloc_ctx_tensors_from_buft(ctx, by_name[ext["buffer_type"]].get_default_buffer_type())
        buf.set_usage(gl.BufferUsage[ext["usage"]])
        if ext["ctx"].startswith("kv_cache:"):
            buf.clear(0)
        buffers[ext["ctx"]] = buf
    for w in doc["weights"]:
        t = gf.graph.get_tensor(w["name"]) or next(t for t in gf.tensors.values() if t.name == w["name"])
        seed, offset, scale = weight_gen(w["name"])
        values = weight_values(seed, gl.nelements(t), offset, scale)
        gl.tensor_set(t, values.astype(np.float16) if t.type is gl.F16 else values)
    return Scenario(doc, backends, gf, buffers)


def batch_inputs(batch: dict) -> dict:
    """The inputs of a batch (n_tokens, n_kv, kv_head, n_outputs), as the README defines them."""
    n, n_kv, head, n_out = batch["n_tokens"], batch["n_kv"], batch["kv_head"], batch["n_outputs"]
    pos = np.arange(head, head + n, dtype=np.int32)
    mask = np.full((gl.GGML_PAD(n, 32), n_kv), -np.inf, dtype=np.float32)  # numpy shape: [rows, n_kv]
    for i in range(n):
        mask[i, : head + i + 1] = 0.0
    return {"inp_tokens": ((37 * pos + 11) % 256).astype(np.int32), "inp_pos": pos, "KQ_mask": mask,
            "inp_out_ids": np.arange(n - n_out, n, dtype=np.int32)}


# -- the scenarios' model: llama.cpp's build_llama of Sep 2024, at toy size --------------------------------

CONTEXT_ORDER = ("CPU", "FAKE", "FAKE1")  # weight contexts first, then cache contexts, each in this order


def build_llama(model: dict, placement: dict, batch: dict):
    """The scenario graph, built with the ggml_lite API as the recorder built it: weights in
    `weights:<backend>` contexts and the KV cache in `kv_cache:<backend>` contexts by `placement`,
    then the compute context. Returns `(contexts in id order, graph, expand roots)`."""
    n_embd, n_head, n_head_kv = model["n_embd"], model["n_head"], model["n_head_kv"]
    n_ff, n_vocab, n_ctx = model["n_ff"], model["n_vocab"], model["n_ctx"]
    n_gqa = n_embd // n_head * n_head_kv
    wtype, kvtype = gl.type_by_name(model["wtype"]), gl.type_by_name(model["kvtype"])
    ctxs = {}

    def ctx_of(kind, backend):
        label = f"{kind}:{backend}"
        if label not in ctxs:
            ctxs[label] = gl.Context(label)
        return ctxs[label]

    def weight(backend, name, type, *ne):
        return ctx_of("weights", backend).new_tensor(type, list(ne), name=name)

    out_be = placement["output"]
    w = {"token_embd": weight(placement["token_embd"], "token_embd.weight", wtype, n_embd, n_vocab),
         "output_norm": weight(out_be, "output_norm.weight", gl.F32, n_embd),
         "output": weight(out_be, "output.weight", wtype, n_embd, n_vocab)}
    layers = []
    for il, be in enumerate(placement["layers"]):
        p = f"blk.{il}."
        layers.append({
            "attn_norm": weight(be, p + "attn_norm.weight", gl.F32, n_embd),
            "wq": weight(be, p + "attn_q.weight", wtype, n_embd, n_embd),
            "wk": weight(be, p + "attn_k.weight", wtype, n_embd, n_gqa),
            "wv": weight(be, p + "attn_v.weight", wtype, n_embd, n_gqa),
            "wo": weight(be, p + "attn_output.weight", wtype, n_embd, n_embd),
            "ffn_norm": weight(be, p + "ffn_norm.weight", gl.F32, n_embd),
            "gate": weight(be, p + "ffn_gate.weight", wtype, n_embd, n_ff),
            "up": weight(be, p + "ffn_up.weight", wtype, n_embd, n_ff),
            "down": weight(be, p + "ffn_down.weight", wtype, n_ff, n_embd),
        })
    for il, be in enumerate(placement["kv_cache"]):
        c = ctx_of("kv_cache", be)
        layers[il]["k_l"] = c.new_tensor_1d(kvtype, n_gqa * n_ctx, name=f"cache_k_l{il}")
        layers[il]["v_l"] = c.new_tensor_1d(kvtype, n_gqa * n_ctx, name=f"cache_v_l{il}")

    ctx, graph, roots = build_graph(model, w, layers, batch)
    ordered = [ctxs[f"{kind}:{be}"] for kind in ("weights", "kv_cache") for be in CONTEXT_ORDER
               if f"{kind}:{be}" in ctxs] + [ctx]
    return ordered, graph, roots


def model_tensors(tensors_by_name: dict, n_layer: int) -> tuple:
    """`(w, layers)` of `build_graph` from existing tensors (the weights and cache of a loaded scenario)."""
    t = tensors_by_name
    w = {"token_embd": t["token_embd.weight"], "output_norm": t["output_norm.weight"], "output": t["output.weight"]}
    roles = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
             "ffn_norm": "ffn_norm", "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}
    layers = [{**{r: t[f"blk.{il}.{n}.weight"] for r, n in roles.items()},
               "k_l": t[f"cache_k_l{il}"], "v_l": t[f"cache_v_l{il}"]} for il in range(n_layer)]
    return w, layers


def build_graph(model: dict, w: dict, layers: list, batch: dict):
    """The compute context and graph of one batch over the weights `w` / `layers` (a fresh graph per
    evaluation, as llama.cpp builds one). Returns `(context, graph, expand roots)`."""
    n_embd, n_head, n_head_kv = model["n_embd"], model["n_head"], model["n_head_kv"]
    n_layer, n_ctx = model["n_layer"], model["n_ctx"]
    head = n_embd // n_head
    n_gqa = head * n_head_kv
    rope, eps = model["rope"], model["rms_norm_eps"]
    kvtype = gl.type_by_name(model["kvtype"])
    n_tokens, n_kv, kv_head, n_outputs = batch["n_tokens"], batch["n_kv"], batch["kv_head"], batch["n_outputs"]
    ctx = gl.Context("compute")
    roots = []
    inp_tokens = ctx.new_tensor_1d(gl.I32, n_tokens, name="inp_tokens")
    gl.set_input(inp_tokens)
    inp_l = gl.get_rows(ctx, w["token_embd"], inp_tokens).set_name("inp_embd")
    inp_pos = ctx.new_tensor_1d(gl.I32, n_tokens, name="inp_pos")
    gl.set_input(inp_pos)
    kq_mask = ctx.new_tensor_2d(gl.F32, n_kv, gl.GGML_PAD(n_tokens, 32), name="KQ_mask")
    gl.set_input(kq_mask)
    rope_args = (rope["n_dims"], rope["mode"], rope["n_ctx_orig"], rope["freq_base"], rope["freq_scale"],
                 rope["ext_factor"], rope["attn_factor"], rope["beta_fast"], rope["beta_slow"])
    elt = kvtype.type_size
    for il, L in enumerate(layers):
        inp_sa = inp_l
        cur = gl.rms_norm(ctx, inp_l, eps).set_name(f"norm-{il}")
        cur = gl.mul(ctx, cur, L["attn_norm"]).set_name(f"attn_norm-{il}")
        q = gl.mul_mat(ctx, L["wq"], cur).set_name(f"Qcur-{il}")
        k = gl.mul_mat(ctx, L["wk"], cur).set_name(f"Kcur-{il}")
        v = gl.mul_mat(ctx, L["wv"], cur).set_name(f"Vcur-{il}")
        q = gl.rope_ext(ctx, gl.reshape_3d(ctx, q, head, n_head, n_tokens), inp_pos, None, *rope_args).set_name(f"Qcur_rope-{il}")
        k = gl.rope_ext(ctx, gl.reshape_3d(ctx, k, head, n_head_kv, n_tokens), inp_pos, None, *rope_args).set_name(f"Kcur_rope-{il}")
        roots += [q, k, v]
        qp = gl.permute(ctx, q, 0, 2, 1, 3).set_name(f"q-{il}")
        k_view = gl.view_1d(ctx, L["k_l"], n_tokens * n_gqa, gl.row_size(kvtype, n_gqa) * kv_head).set_name(f"k_cache_view-{il}")
        roots.append(gl.cpy(ctx, k, k_view))
        v_t = gl.transpose(ctx, gl.reshape_2d(ctx, v, n_gqa, n_tokens))
        v_view = gl.view_2d(ctx, L["v_l"], n_tokens, n_gqa, n_ctx * elt, kv_head * elt).set_name(f"v_cache_view-{il}")
        roots.append(gl.cpy(ctx, v_t, v_view))
        kk = gl.view_3d(ctx, L["k_l"], head, n_kv, n_head_kv, gl.row_size(kvtype, n_gqa), gl.row_size(kvtype, head),
                        0).set_name(f"k-{il}")
        vv = gl.view_3d(ctx, L["v_l"], n_kv, head, n_head_kv, elt * n_ctx, elt * n_ctx * head, 0).set_name(f"v-{il}")
        kq = gl.mul_mat(ctx, kk, qp).set_name(f"kq-{il}")
        kq = gl.soft_max_ext(ctx, kq, kq_mask, 1.0 / head ** 0.5, 0.0).set_name(f"kq_soft_max_ext-{il}")
        kqv = gl.mul_mat(ctx, vv, kq).set_name(f"kqv-{il}")
        merged = gl.permute(ctx, kqv, 0, 2, 1, 3).set_name(f"kqv_merged-{il}")
        cur = gl.cont_2d(ctx, merged, n_embd, n_tokens).set_name(f"kqv_merged_cont-{il}")
        roots.append(cur)
        cur = gl.mul_mat(ctx, L["wo"], cur).set_name(f"kqv_out-{il}")
        if il == n_layer - 1:  # skip computing output for unused tokens
            out_ids = ctx.new_tensor_1d(gl.I32, n_outputs, name="inp_out_ids")
            gl.set_input(out_ids)
            cur = gl.get_rows(ctx, cur, out_ids)
            inp_sa = gl.get_rows(ctx, inp_sa, out_ids)
        ffn_inp = gl.add(ctx, cur, inp_sa).set_name(f"ffn_inp-{il}")
        cur = gl.rms_norm(ctx, ffn_inp, eps).set_name(f"norm_ffn-{il}")
        cur = gl.mul(ctx, cur, L["ffn_norm"]).set_name(f"ffn_norm-{il}")
        up = gl.mul_mat(ctx, L["up"], cur).set_name(f"ffn_up-{il}")
        gate = gl.mul_mat(ctx, L["gate"], cur).set_name(f"ffn_gate-{il}")
        gate = gl.silu(ctx, gate).set_name(f"ffn_silu-{il}")
        cur = gl.mul(ctx, gate, up).set_name(f"ffn_gate_par-{il}")
        cur = gl.mul_mat(ctx, L["down"], cur).set_name(f"ffn_down-{il}")
        inp_l = gl.add(ctx, cur, ffn_inp).set_name(f"l_out-{il}")
    cur = gl.rms_norm(ctx, inp_l, eps).set_name("norm_out")
    cur = gl.mul(ctx, cur, w["output_norm"]).set_name("result_norm")
    cur = gl.mul_mat(ctx, w["output"], cur).set_name("result_output")
    gl.set_output(cur)
    roots.append(cur)
    graph = gl.Graph()
    for r in roots:
        gl.build_forward_expand(graph, r)
    return ctx, graph, roots
