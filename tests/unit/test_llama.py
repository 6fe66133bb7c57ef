"""Chapter 10's LLaMA builder (ggml_lite.models.llama) against llama.cpp's printed numbers and the
recorded fixture 13."""

import json

import numpy as np
import pytest

import ggml_lite as gl
from ggml_lite.models.llama import PRESETS, LlamaParams, build_llama, padded_n_ctx, worst_case_batch
from gguf_writer import write_llama_gguf
from helpers import FIXTURES

MiB = 1024 * 1024


def _plan_on_cpu(params: LlamaParams, n_ctx: int, n_ubatch: int = 512, recorded: bool = False):
    """(graph, KV bytes as llama.cpp sums them, CPU compute buffer size) of llama.cpp's reserve."""
    n_ctx = padded_n_ctx(n_ctx)
    cpu = dict(token_embd="CPU", output="CPU", layers=["CPU"] * params.n_layer, kv_cache=["CPU"] * params.n_layer)
    ctxs, graph, _ = build_llama(params.model(n_ctx), cpu, worst_case_batch(n_ctx, n_ubatch), recorded=recorded)
    for c in ctxs[:-1]:
        gl.alloc_ctx_tensors(c, gl.cpu_buffer_type())
    galloc = gl.GAllocr(gl.cpu_buffer_type())
    assert galloc.reserve(graph)
    kv = sum(t.nbytes for c in ctxs if c.name.startswith("kv_cache") for t in c.tensors)
    return graph, kv, galloc.get_buffer_size(0)


def test_llama2_7b_on_the_cpu_at_n_ctx_2048_is_what_llama_cpp_printed():
    """llama.cpp (mid-2024), Llama-2 7B, CPU only, n_ctx 2048: "KV self size = 1024.00 MiB",
    "CPU compute buffer size = 164.01 MiB", "graph nodes = 1030"."""
    graph, kv, compute = _plan_on_cpu(PRESETS["llama-2-7b"], 2048)
    assert len(graph.nodes) == 1030 == 32 * 32 + 6
    assert kv == 1024 * MiB
    assert f"{compute / MiB:.2f}" == "164.01"


def test_fixture_13_is_rebuilt_tensor_for_tensor_by_the_recorded_variant():
    fx = json.loads((FIXTURES / "ggml-seed" / "13_llama7b_ctx512_all_outputs.json").read_text())
    by_id = {t["id"]: t for t in fx["graph"]["tensors"]}
    want = [(by_id[i]["name"], by_id[i]["op"], by_id[i]["ne"], by_id[i]["nb"]) for i in fx["graph"]["nodes"]]
    graph, _, recorded_size = _plan_on_cpu(PRESETS["llama-2-7b"], 512, recorded=True)
    assert [(n.name, n.op.name, list(n.ne), list(n.nb)) for n in graph.nodes] == want
    llama_graph, _, llama_size = _plan_on_cpu(PRESETS["llama-2-7b"], 512)
    assert len(llama_graph.nodes) == 1030 and len(graph.nodes) == 1062
    assert recorded_size == llama_size == fx["buffer_size"]


@pytest.mark.parametrize("kwargs, field", [
    (dict(n_embd=16, n_head=32, n_head_kv=32),
     r"n_embd_head: expected an integer from 1 to 4294967295 \(the head size; n_embd / n_head = 16 / 32 rounded down"),
    (dict(n_embd=4095, n_head=32, n_head_kv=32), r"n_rot 127 must be even"),  # (4095 // 32 = 127: rounded down)
    (dict(n_head_kv=5), r"n_head_kv \(--n-head-kv\): expected a divisor of n_head 32, found 5"),
    (dict(n_layer=-1), r"n_layer \(--n-layer\): expected an integer from 1 to 512 \(LLAMA_MAX_LAYERS\), found -1"),
    (dict(n_layer=513), "expected an integer from 1 to 512"),
    (dict(n_head=0), r"n_head \(--n-head\): expected an integer from 1 to 4294967295"),
    (dict(n_head_kv=0), "n_head_kv"),
    (dict(n_vocab=2**32), "n_vocab"),
    (dict(n_layer=True), "found True"),
    (dict(n_embd=4096.0), "found 4096.0"),
    (dict(n_rot=130), r"n_rot: expected an integer from 1 to 128 \(the head size"),
    (dict(n_embd=96, n_head=32, n_head_kv=1), "n_rot 3 must be even"),
    (dict(n_rot=63), "n_rot 63 must be even"),
    (dict(rms_norm_eps=float("nan")), "rms_norm_eps: expected a finite number"),
    (dict(rope_freq_base=0.0), "rope_freq_base: expected a finite number above 0"),
    (dict(wtype="i32"), "weights cannot be of type i32"),
    (dict(wtype="q4_0", n_ff=11000),
     r"n_ff \(--n-ff\) 11000: the rows of q4_0 weights must be a whole number of its blocks"),
    (dict(wtype="q4_K", n_embd=4000, n_head=40, n_head_kv=40), "n_embd"),
    (dict(n_embd=2**32 - 1, n_head=2**32 - 1, n_head_kv=1, n_ff=2**32 - 1), "more than a ggml tensor holds"),
])
def test_bad_hyperparameters_are_refused(kwargs, field):
    """Whatever makes them (a preset, flags, a GGUF header), hyperparameters no llama.cpp model can have are
    refused with the field, its flag, what was expected and what was found."""
    base = dict(n_vocab=32000, n_embd=4096, n_layer=32, n_head=32, n_head_kv=32, n_ff=11008)
    with pytest.raises(gl.errors.ModelError, match=field):
        LlamaParams(**{**base, **kwargs})


@pytest.mark.parametrize("preset, n_ctx, n_gpu_layers, devices, want", [
    # (nodes, splits, GPU0 compute MiB, GPU0 KV MiB, host compute MiB): llama.cpp's printed lines
    ("llama-2-7b", 512, 33, 1, (1030, 2, "70.50", "256.00", "9.01")),
    ("llama-3.1-8b", 8192, 33, 1, (1030, 2, "560.00", "1024.00", "24.01")),
])
def test_one_gpu_setups_are_what_llama_cpp_printed(preset, n_ctx, n_gpu_layers, devices, want):
    from ggml_lite.models.llama import plan_memory

    r = plan_memory(PRESETS[preset], n_ctx, n_gpu_layers=n_gpu_layers, devices=devices)
    gpu, cpu = r["devices"]["GPU0"], r["devices"]["CPU"]
    got = (r["nodes"], r["splits"], f"{gpu['compute'] / MiB:.2f}", f"{gpu['kv'] / MiB:.2f}",
           f"{cpu['compute'] / MiB:.2f}")
    assert got == want


def test_layer_placement_follows_llm_load_tensors():
    from ggml_lite.models.llama import layer_placement

    p = layer_placement(32, 20, 2)  # 12 layers on the CPU, the other 20 split evenly
    assert p["layers"] == ["CPU"] * 12 + ["GPU0"] * 10 + ["GPU1"] * 10 and p["output"] == "CPU"
    full = layer_placement(32, 33, 2, tensor_split=[3, 1])
    assert full["layers"].count("GPU0") == 25 and full["output"] == "GPU1" and full["token_embd"] == "CPU"
    assert layer_placement(32, 33, 1, offload_kqv=False)["kv_cache"] == ["CPU"] * 32
    with pytest.raises(gl.errors.ModelError, match="tensor_split"):
        layer_placement(32, 33, 2, tensor_split=[float("nan"), 1])
    assert layer_placement(32, 33, 2, tensor_split=[0, 0]) == layer_placement(32, 33, 2)  # all zero: the default
    assert layer_placement(32, 33, 3, tensor_split=[1])["layers"] == ["GPU0"] * 32  # the others get nothing


def _numpy_llama(p: dict, W: dict, tokens: np.ndarray) -> np.ndarray:
    """An independent LLaMA forward pass over the whole sequence `tokens`, in float32 numpy: RMS norm,
    rotary embeddings (normal mode: pairs (2i, 2i+1)), grouped-query causal attention with K and V
    rounded to f16 as the cache stores them (and Q and the attention probabilities rounded to f16, as
    ggml converts a product's f32 operand to the f16 weights' type), SwiGLU; the logits of every position."""
    n_embd, n_head, n_head_kv = p["n_embd"], p["n_head"], p["n_head_kv"]
    head, eps, base = n_embd // n_head, p["rms_norm_eps"], p["rope"]["freq_base"]
    n = len(tokens)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rope(x):  # x: [n, heads, head]
        theta = np.arange(n)[:, None] * base ** (-np.arange(0, head, 2) / head)  # [n, head/2]
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        out = x.copy()
        out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
        out[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
        return out

    f16 = lambda a: a.astype(np.float16).astype(np.float32)  # noqa: E731
    x = W["token_embd"][tokens]
    causal = np.triu(np.full((n, n), -np.inf), 1)
    for L in W["layers"]:
        h = rms(x, L["attn_norm"])
        q = rope((h @ L["wq"].T).reshape(n, n_head, head))
        k = f16(rope((h @ L["wk"].T).reshape(n, n_head_kv, head)))
        v = f16((h @ L["wv"].T).reshape(n, n_head_kv, head))
        k, v = (np.repeat(a, n_head // n_head_kv, axis=1) for a in (k, v))
        att = np.einsum("qhd,khd->hqk", f16(q), k) / np.sqrt(head) + causal  # Q meets f16 K as f16 (from_float)
        att = np.exp(att - att.max(-1, keepdims=True))
        att = f16(att / att.sum(-1, keepdims=True))  # and the probabilities meet f16 V as f16
        x = x + np.einsum("hqk,khd->qhd", att, v).reshape(n, n_embd) @ L["wo"].T
        h = rms(x, L["ffn_norm"])
        g = h @ L["gate"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ L["up"].T)) @ L["down"].T
    return rms(x, W["output_norm"]) @ W["output"].T


def test_a_tiny_llama_on_sim_and_cpu_computes_what_numpy_computes():
    """End to end: a 4-layer LLaMA (random weights, f32; the KV cache f16) built by this builder, placed
    as llama.cpp would with 2 of 4 layers on a GPU (SIM) and run by the scheduler — a prompt of 12
    tokens, then 3 tokens one at a time with the KV cache — gives the logits of the numpy pass above,
    within the default tier's stated f32 tolerance (measured: 2e-7 to 4e-7; positions off by one: 4e-4)."""
    from ggml_lite.cpu import Arithmetic
    from ggml_lite.models.llama import batch_inputs, build_graph, layer_placement, model_tensors

    params = LlamaParams(n_vocab=64, n_embd=64, n_layer=4, n_head=8, n_head_kv=2, n_ff=96, wtype="f32")
    n_ctx = 32
    model = params.model(n_ctx)
    placement = layer_placement(4, 2, 1)
    prompt = dict(n_tokens=12, n_kv=n_ctx, kv_head=0, n_outputs=12)
    ctxs, graph, _ = build_llama(model, placement, prompt)
    gpu, cpu = gl.sim_init("GPU0", offload="cuda"), gl.cpu_init()
    by_name = {"GPU0": gpu, "CPU": cpu}
    rng = np.random.default_rng(7)
    for c in ctxs[:-1]:
        buf = gl.alloc_ctx_tensors(c, by_name[c.name.split(":")[1]])
        if c.name.startswith("kv_cache"):
            buf.clear(0)
        for t in c.tensors:
            if c.name.startswith("weights"):
                scale = 1.0 if t.ne[1] == 1 else 1 / np.sqrt(t.ne[0])
                gl.tensor_set(t, (1 + 0.1 * rng.standard_normal(t.ne[0]) if t.ne[1] == 1 else
                                  scale * rng.standard_normal((t.ne[1], t.ne[0]))).astype(np.float32))
    tensors = {t.name: t for c in ctxs[:-1] for t in c.tensors}
    w, layers = model_tensors(tensors, 4)
    W = {k: gl.tensor_get(t) for k, t in w.items()}
    W["layers"] = [{k: gl.tensor_get(t) for k, t in L.items() if k not in ("k_l", "v_l")} for L in layers]
    sched = gl.BackendSched([gpu, cpu], graph_size=8192)
    seq = list(range(3, 15))
    batches = [(prompt, seq)] + [(dict(n_tokens=1, n_kv=n_ctx, kv_head=12 + i, n_outputs=1), [20 + i])
                                 for i in range(3)]
    for i, (batch, toks) in enumerate(batches):
        g = graph if i == 0 else build_graph(model, w, layers, batch)[1]
        sched.reset()
        assert sched.alloc_graph(g)
        inputs = batch_inputs(batch)
        inputs["inp_tokens"] = np.array(toks, dtype=np.int32)
        for t in g.leafs:
            if t.name in inputs:
                gl.tensor_set(t, inputs[t.name].reshape(-1) if t.name != "KQ_mask" else inputs[t.name])
        sched.graph_compute(g)
        assert sched.n_splits >= 2
        assert {sched.backends[sp.backend_id].get_name() for sp in sched.splits} == {"GPU0", "CPU"}
        got = gl.tensor_get(g.nodes[-1]).reshape(batch["n_outputs"], -1)
        if i:
            seq.append(toks[0])
        want = _numpy_llama(model, W, np.array(seq))[-batch["n_outputs"]:]
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err <= Arithmetic.TOLERANCE_F32, (i, err)  # K and V are rounded to f16 on both sides


def test_the_peaks_are_explained_by_the_tensors_live_there():
    """`report.peaks`: the GPU buffer of the 7B on one GPU at n_ctx 512 peaks at the last node — the
    logits (32000 x 512 f32 = 62.5 MiB) and the normalized input they read (8 MiB): 70.50 MiB; the
    host's at the embeddings' rows (8 MiB) and the mask (1 MiB). The live blocks add up to the peak."""
    from ggml_lite.models.llama import plan_memory
    from ggml_lite.report import peaks

    pk = peaks(plan_memory(PRESETS["llama-2-7b"], 512, n_gpu_layers=33, devices=1, trace=True))
    gpu, host = pk["GPU0"], pk["CUDA_Host"]
    assert gpu["node"] == "result_output" and gpu["bytes"] == 70.5 * MiB
    assert [(t["name"], t["bytes"]) for t in gpu["live"]] == [("result_output", 62.5 * MiB), ("result_norm", 8 * MiB)]
    assert gpu["live"][0]["reason"] == "computed at this node"
    assert sum(t["bytes"] for t in gpu["live"]) == gpu["bytes"]
    assert [t["name"] for t in host["live"][:2]] == ["inp_embd", "KQ_mask"]
    assert "read later" in host["live"][1]["reason"]
    assert sum(t["bytes"] for t in host["live"]) == host["bytes"]


def _write_gguf(path, params: LlamaParams, matrix_type=None, sparse: bool = True):
    """A GGUF file of a LLaMA with `gguf`'s writer (tests/gguf_writer.py): the header and every tensor's
    info; the data region extended sparsely to its full length (`sparse`), or left out (header only)."""
    return write_llama_gguf(path, params, matrix_type, sparse=sparse)


def test_a_sparse_gguf_of_a_7b_plans_like_the_preset(tmp_path):
    """A 13 GB Llama-2 7B f16 GGUF that takes a few kB on disk (sparse): its header gives the preset's
    hyperparameters and the same report; a header-only file works too."""
    from ggml_lite.models.gguf import from_gguf
    from ggml_lite.report import memory_report

    p7 = PRESETS["llama-2-7b"]
    path = _write_gguf(tmp_path / "llama-2-7b-f16.gguf", p7)
    m = from_gguf(path)
    assert m.params.rms_norm_eps == float(np.float32(1e-5))  # GGUF stores it as a float32
    p7 = LlamaParams(**{**p7.__dict__, "rms_norm_eps": m.params.rms_norm_eps})
    assert m.params == p7 and m.tensor_types["blk.0.attn_q.weight"].name == "f16"
    rep = memory_report(m.params, 512, n_gpu_layers=33, devices=1, tensor_types=m.tensor_types)
    assert rep.devices == memory_report(p7, 512, n_gpu_layers=33, devices=1).devices
    header_only = from_gguf(_write_gguf(tmp_path / "header.gguf", p7, sparse=False))
    assert header_only.params == p7


def test_a_quantized_70b_gguf_sizes_every_weight_by_its_own_type(tmp_path, capsys):
    """A Llama-2 70B in q4_K with a q6_K output (as a Q4_K_M file has it), sparse: the GPU weights are
    the sum of every tensor's own size, and `llama --gguf` prints the report."""
    import gguf

    from ggml_lite.__main__ import main
    from ggml_lite.models.gguf import from_gguf

    p70 = PRESETS["llama-2-70b"]
    path = _write_gguf(tmp_path / "llama-2-70b-q4_k.gguf", p70, gguf.GGMLQuantizationType.Q4_K)
    m = from_gguf(path)
    assert m.params == LlamaParams(**{**p70.__dict__, "wtype": "q4_K", "rms_norm_eps": float(np.float32(1e-5))})
    assert m.tensor_types["output.weight"].name == "q6_K"
    assert main(["llama", "--gguf", str(path), "--n-gpu-layers", "81", "--devices", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    gpu_weights = sum(d["weights"] for d in doc["devices"] if d["name"] != "CPU")
    expected = sum(gl.Context().new_tensor(m.tensor_types[n], ne).nbytes
                   for n, ne in m.shapes.items() if n != "token_embd.weight")
    assert 0 <= gpu_weights - expected < 81 * 9 * 128 * 2  # + each tensor padded to 128 in its GPU buffer
    assert doc["graph"]["nodes"] == 32 * 80 + 6


@pytest.mark.parametrize("content, message", [
    (b"not a gguf file at all", "header.magic: expected b'GGUF' (a GGUF file), found b'not '"),
    (b"", "header.magic: the magic 'GGUF' needs 4 bytes at offset 0, the file has 0 left"),
])
def test_a_file_that_is_not_gguf_is_refused(tmp_path, content, message, capsys):
    from ggml_lite.__main__ import main

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    assert main(["llama", "--gguf", str(bad)]) == 2 and message in capsys.readouterr().err


def test_n_batch_limits_the_worst_case_as_llama_cpp_does():
    """n_batch 8 is raised to 32 (the mask's padding), and n_ubatch is at most n_batch: the worst case is
    32 tokens, not 512."""
    from ggml_lite.models.llama import batch_sizes
    from ggml_lite.report import memory_report

    assert batch_sizes(512, 8, 512) == (32, 32) and batch_sizes(512, 2048, 512) == (512, 512)
    assert batch_sizes(256, 2048, 512) == (256, 256)
    small = memory_report(PRESETS["llama-2-7b"], 512, n_batch=8)
    assert small.devices[0]["compute"] < memory_report(PRESETS["llama-2-7b"], 512).devices[0]["compute"] / 10


def test_fit_on_a_sparse_gguf_and_a_non_llama_file(tmp_path, capsys):
    import gguf

    from ggml_lite.__main__ import main

    path = _write_gguf(tmp_path / "llama-2-7b-f16.gguf", PRESETS["llama-2-7b"])
    assert main(["llama", "--gguf", str(path), "--devices", "1", "--vram", "8", "--fit", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fit"] == {"n_gpu_layers": 19, "n_ctx": 1792}
    other = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(other), "gpt2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    assert main(["llama", "--gguf", str(other)]) == 2 and "a 'gpt2' model" in capsys.readouterr().err
