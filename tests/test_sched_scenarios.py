"""Issue 6, deliverable 2: every scheduler scenario's set-up replays with ggml_lite — SIM configured as
each FAKE backend, the weight and KV-cache buffers allocated on their backends exactly as ggml did
(sizes, multi-buffer parts, offsets, usages), every weight regenerated to its recorded checksum, and the
inputs of every batch equal to the recorded ones."""

import numpy as np
import pytest

import ggml_lite as gl
from helpers import SCHED_FILES, fixture_path, load_json
from ggml_lite.scenario import batch_inputs, fnv1a32, load_scenario, make_backends, offload_rule, weight_gen


def _doc(name):
    return load_json(fixture_path("ggml-seed-sched", name))


def test_fnv1a32_known_values():
    assert fnv1a32(b"") == 2166136261
    assert fnv1a32(b"a") == 0xE40C292C  # the published FNV-1a test vector
    assert fnv1a32(b"foobar") == 0xBF9CF968


@pytest.mark.parametrize("name", SCHED_FILES)
def test_backends_are_configured_like_the_recorded_ones(name):
    doc = _doc(name)
    backends = make_backends(doc)
    assert len(backends) == len(doc["backends"]) and gl.is_cpu(backends[-1])
    for b, rec in zip(backends, doc["backends"]):
        buft = b.get_default_buffer_type()
        assert (b.get_name(), buft.get_name(), buft.is_host(), buft.get_alignment()) == \
            (rec["name"], rec["buffer_type"], rec["is_host"], rec["alignment"])
        assert buft.get_max_size() == (gl.SIZE_MAX if rec["max_size"] is None else rec["max_size"])
        assert (b.event_new() is not None) == rec["events"]
        if not rec["is_cpu"]:
            assert sorted(o.name for o in b.deny_ops) == sorted(rec["supports_op_denied"])
            assert b.offload_rule == offload_rule(rec["offload_op"]) and not b.asynchronous
            assert b.supports_buft(buft) and not b.supports_buft(gl.cpu_buffer_type())


WITH_GRAPH = [n for n in SCHED_FILES if not n.startswith("13_")]  # 13 aborts in reserve and records no graph


@pytest.mark.parametrize("name", WITH_GRAPH)
def test_external_buffers_and_weights_replay(name):
    doc = _doc(name)
    sc = load_scenario(doc)
    for ext in doc["external_buffers"]:
        buf = sc.buffers[ext["ctx"]]
        assert buf.get_size() == ext["size"] and buf.is_multi_buffer() == ext["is_multi_buffer"]
        assert buf.get_usage().name == ext["usage"]
        if ext["is_multi_buffer"]:
            assert [(p.get_size(), p.get_usage().name) for p in buf.buffers] == \
                [(p["size"], p["usage"]) for p in ext["parts"]]
    for w in doc["weights"]:
        t = next(t for t in sc.gf.tensors.values() if t.name == w["name"])
        assert (t.type.name, list(t.ne[:len(w["ne"])])) == (w["type"], w["ne"])
        assert weight_gen(w["name"]) == (w["gen"]["seed"], w["gen"]["offset"], w["gen"]["scale"])
        assert t.data - t.buffer.get_base() == w["ext_offset"]
        assert fnv1a32(gl.tensor_get(t, 0, gl.nbytes(t)).tobytes()) == w["fnv1a32_of_bytes"], w["name"]


@pytest.mark.parametrize("name", WITH_GRAPH)
def test_batch_inputs_are_the_recorded_ones(name):
    doc = _doc(name)
    steps = doc["steps"]
    graph = {t["name"]: t for t in doc["graph"]["tensors"]}
    for k, st in enumerate(steps):
        if st.get("call") != "ggml_backend_sched_graph_compute":
            continue
        batch = steps[k - 1]["batch"]  # the alloc_graph step of the same round
        got = batch_inputs(batch)
        for key in ("inp_tokens", "inp_pos", "inp_out_ids"):
            assert got[key].tolist() == st["inputs"][key], (name, key)
        assert list(reversed(got["KQ_mask"].shape)) == graph["KQ_mask"]["ne"][:2]
        assert np.isneginf(got["KQ_mask"][batch["n_tokens"]:]).all()  # padding rows are masked


def test_the_generators_can_fail():
    """A weight regenerated with another scale does not match its checksum."""
    doc = _doc("03_partial_offload")
    sc = load_scenario(doc)
    w = doc["weights"][3]
    t = next(t for t in sc.gf.tensors.values() if t.name == w["name"])
    raw = gl.tensor_get(t, 0, gl.nbytes(t))
    raw[0] ^= 1
    assert fnv1a32(raw.tobytes()) != w["fnv1a32_of_bytes"]


def _round0_batch(doc):
    return next(s["batch"] for s in doc["steps"] if s.get("call") == "ggml_backend_sched_reserve")


@pytest.mark.parametrize("name", WITH_GRAPH)
def test_the_llama_builder_gives_the_recorded_graph(name):
    """The scenario graph rebuilt with the ggml_lite API equals the recorded one tensor for tensor (ids,
    names, contexts, types, shapes, strides, ops, op_params, sources, views, flags) and node for node."""
    from ggml_lite.graphio import graph_document
    from ggml_lite.models.llama import build_llama

    doc = _doc(name)
    ctxs, graph, roots = build_llama(doc["model"], doc["placement"], _round0_batch(doc), recorded=True)
    mine = graph_document(graph, ctxs, roots)["graph"]
    want = doc["graph"]
    keys = ("id", "name", "ctx", "graph_role", "type", "ne", "nb", "op", "op_params", "src", "view_src",
            "view_offs", "flags")
    got_t = [{k: t.get(k) for k in keys} for t in mine["tensors"]]
    want_t = [{k: t.get(k) for k in keys} for t in want["tensors"]]
    if doc["sched_params"]["parallel"]:  # with n_copies > 1 the scheduler flags graph inputs OUTPUT too
        for t in want_t:                 # (pass 5: "prevent ggml-alloc from overwriting the tensor")
            if "INPUT" in t["flags"]:
                t["flags"] = [f for f in t["flags"] if f != "OUTPUT"]
    diffs = [(a["id"], a["name"], {k: (a[k], b[k]) for k in keys if a[k] != b[k]})
             for a, b in zip(got_t, want_t) if a != b]
    assert len(got_t) == len(want_t) and not diffs, diffs[:5]
    assert [mine[k] for k in ("n_nodes", "n_leafs", "nodes", "leafs", "expand_roots")] == \
        [want[k] for k in ("n_nodes", "n_leafs", "nodes", "leafs", "expand_roots")]


def test_the_builder_makes_scenario_13s_graph_and_round_1_of_09():
    """Graphs no file records: scenario 13 (it aborts before anything is recorded) and the second
    round of 09 (16 tokens at kv_head 16, so the cache views start at cell 16)."""
    from ggml_lite.models.llama import build_llama

    doc13 = _doc("13_abort_deny_cpy_kv_in_fake")  # no steps: the round-0 batch of the README
    batch0 = {"n_tokens": 16, "n_kv": 32, "kv_head": 0, "n_outputs": 1}
    ctxs, graph, _ = build_llama(doc13["model"], doc13["placement"], batch0, recorded=True)
    assert graph.n_nodes == 138 and graph.n_leafs == 51
    assert [c.name for c in ctxs] == ["weights:CPU", "weights:FAKE", "kv_cache:FAKE", "compute"]
    doc9 = _doc("09_parallel_partial")
    batch1 = [s["batch"] for s in doc9["steps"] if s.get("call") == "ggml_backend_sched_alloc_graph"][1]
    _, g1, _ = build_llama(doc9["model"], doc9["placement"], batch1, recorded=True)
    k_view = g1.get_tensor("k_cache_view-0")
    assert k_view.view_offs == 16 * 32 * 2 and g1.get_tensor("v_cache_view-0").view_offs == 16 * 2
