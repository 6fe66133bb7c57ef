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
