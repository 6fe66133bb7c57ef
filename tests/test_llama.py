"""Chapter 10's LLaMA builder (ggml_lite.models.llama) against llama.cpp's printed numbers and the
recorded fixture 13."""

import json

import pytest

import ggml_lite as gl
from ggml_lite.models.llama import PRESETS, LlamaParams, build_llama, padded_n_ctx, worst_case_batch
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
    (dict(n_embd=4096, n_head=30), "n_head 30 must divide n_embd 4096"),
    (dict(n_head_kv=5), "n_head_kv 5 must divide n_head"),
    (dict(n_layer=-1), "n_layer must be a positive integer"),
])
def test_bad_hyperparameters_are_refused(kwargs, field):
    base = dict(n_vocab=32000, n_embd=4096, n_layer=32, n_head=32, n_head_kv=32, n_ff=11008)
    with pytest.raises(gl.errors.ShapeError, match=field):
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
    got = (r["nodes"], r["splits"], f"{gpu['compute'] / MiB:.2f}", f"{gpu['kv'] / MiB:.2f}", f"{cpu['compute'] / MiB:.2f}")
    assert got == want


def test_layer_placement_follows_llm_load_tensors():
    from ggml_lite.models.llama import layer_placement

    p = layer_placement(32, 20, 2)  # 12 layers on the CPU, the other 20 split evenly
    assert p["layers"] == ["CPU"] * 12 + ["GPU0"] * 10 + ["GPU1"] * 10 and p["output"] == "CPU"
    full = layer_placement(32, 33, 2, tensor_split=[3, 1])
    assert full["layers"].count("GPU0") == 25 and full["output"] == "GPU1" and full["token_embd"] == "CPU"
    assert layer_placement(32, 33, 1, offload_kqv=False)["kv_cache"] == ["CPU"] * 32
    with pytest.raises(gl.errors.ShapeError, match="tensor_split"):
        layer_placement(32, 33, 2, tensor_split=[1, 2, 3])
