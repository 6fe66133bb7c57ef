"""Issue 6, deliverable 2: every scheduler scenario's set-up replays with ggml_lite — SIM configured as
each FAKE backend, the weight and KV-cache buffers allocated on their backends exactly as ggml did
(sizes, multi-buffer parts, offsets, usages), every weight regenerated to its recorded checksum, and the
inputs of every batch equal to the recorded ones."""

import numpy as np
import pytest

import ggml_lite as gl
from ggml_lite.models.llama import batch_inputs
from ggml_lite.scenario import fnv1a32, load_scenario, make_backends, offload_rule, weight_gen
from helpers import SCHED_FILES, fixture_path, load_json


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


# Issue 22: every field checked before anything is built; the error names the file and the JSON path.
def _refused(tmp_path, capsys, doc, *paths, check=True, raw=None):
    """`sched FILE` (and `--check`) exit 2 with a GraphFileError naming the file and each of `paths`."""
    import json

    from ggml_lite.__main__ import main

    f = tmp_path / "mutated.json"
    f.write_text(raw if raw is not None else json.dumps(doc))
    for argv in (["sched", str(f)], ["sched", str(f), "--check"]) if check else (["sched", str(f)],):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: GraphFileError: ") and str(f) in err, err
        for p in paths:
            assert p in err, (p, err)
    return err


def _mutated(name="03_partial_offload"):
    import copy

    return copy.deepcopy(_doc(name))


def _mutated_at(path, value, name="03_partial_offload"):
    """A copy of scenario `name` with the field at `path` (keys and indices) set to `value`."""
    doc = _mutated(name)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = value
    return doc


@pytest.mark.parametrize("path, value, says", [
    (("weights", 3, "name"), "no.such.weight", "weights[3].name"),
    (("weights", 3, "name"), 17, "weights[3].name"),
    (("pins",), [{"tensor": "no_such_tensor", "backend": "CPU"}], "pins[0].tensor"),
    (("pins",), [{"tensor": "norm-0", "backend": "GPU9"}], "pins[0].backend"),
    (("pins",), [{"tensor": ["norm-0"], "backend": "CPU"}], "pins[0].tensor"),
    (("backends", 0, "offload_op"), "op == SOFT_MAX", "backends[0].offload_op"),
    (("backends", 0, "offload_op"), 3, "backends[0].offload_op"),
    (("backends", 0, "supports_op_denied"), ["NO_SUCH_OP"], "backends[0].supports_op_denied[0]"),
    (("placement", "layers", 2), "FAKE2", "placement.layers[2]"),
])
def test_names_of_nothing_and_wrong_types_are_refused(tmp_path, capsys, path, value, says):
    _refused(tmp_path, capsys, _mutated_at(path, value), says)


@pytest.mark.parametrize("field", ["n_ctx", "n_head"])
@pytest.mark.parametrize("value", [0, -4, 4.0, True, None, 2**70, "4"])
def test_model_dimensions_out_of_range_or_of_the_wrong_type(tmp_path, capsys, field, value):
    doc = _mutated()
    doc["model"][field] = value
    _refused(tmp_path, capsys, doc, f"model.{field}", "expected an integer in [1, ")


def test_nan_and_infinity_as_raw_json_text(tmp_path, capsys):
    import json

    text = json.dumps(_mutated()).replace('"n_ctx": 64', '"n_ctx": NaN', 1)
    _refused(tmp_path, capsys, None, "model.n_ctx", raw=text)
    text = json.dumps(_mutated()).replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": Infinity', 1)
    _refused(tmp_path, capsys, None, "model.rms_norm_eps", raw=text)


def test_inconsistent_model_dimensions(tmp_path, capsys):
    doc = _mutated()
    doc["model"]["n_head"] = 3  # 64 is not divisible by 3
    _refused(tmp_path, capsys, doc, "model.n_head", "a divisor of model.n_embd = 64")
    doc = _mutated()
    doc["model"]["n_ctx"] = 128  # a valid model, but not the one whose graph the file records
    _refused(tmp_path, capsys, doc, "graph.tensors[",
             "what the model, placement, steps[0].batch and sched_params.parallel give")


def test_an_empty_steps_list_is_not_identical(tmp_path, capsys):
    doc = _mutated()
    doc["steps"] = []
    _refused(tmp_path, capsys, doc, "steps", "nothing to compare")
    doc = _mutated()
    doc["steps"] = doc["steps"][:2]  # an alloc_graph without its graph_compute
    _refused(tmp_path, capsys, doc, "steps", "a graph_compute step per round")


@pytest.mark.parametrize("path, value, says", [
    (("backends", 1, "alignment"), 64, "backends[1].alignment"),  # the CPU buffer type's alignment is 32
    (("backends", 1, "max_size"), 4096, "backends[1].max_size"),
    (("backends", 0, "alignment"), 96, "backends[0].alignment"),  # not a power of two
    (("backends", 0, "max_size"), 0, "backends[0].max_size"),
    (("schema_version",), 2, "schema_version"),
    (("sched_params", "GGML_SCHED_MAX_COPIES"), 8, "sched_params.GGML_SCHED_MAX_COPIES"),
    (("sched_params", "n_copies"), 4, "sched_params.n_copies"),  # 03 is not parallel: ggml has 1 copy
    (("sched_params", "graph_size"), 2**40, "sched_params.graph_size"),
    (("sched_params", "graph_size"), 100, "sched_params.graph_size"),  # ggml's hash set would be full
    (("model", "tensor_types"), {}, "model.tensor_types"),  # a field the builder would read, unchecked
    (("steps", 2, "call"), "ggml_backend_sched_reserve", "steps[2]."),
    (("steps", 2, "call"), "ggml_backend_sched_free", "steps[2].call"),
])
def test_recorded_fields_are_honoured_or_refused(tmp_path, capsys, path, value, says):
    _refused(tmp_path, capsys, _mutated_at(path, value), says)


def test_a_fake_max_size_is_honoured(tmp_path, capsys):
    """A FAKE buffer type's max_size is used: a smaller one splits the weights into other parts, which the
    replay reports as a difference from the recorded buffers (exit 1), not as identical."""
    import json

    from ggml_lite.__main__ import main

    doc = _mutated("11_fake_max_size_multibuffer")
    doc["backends"][0]["max_size"] = 32768
    f = tmp_path / "smaller.json"
    f.write_text(json.dumps(doc))
    assert main(["sched", str(f), "--check"]) == 1
    assert "external buffer weights:FAKE: size, multi-buffer and parts" in capsys.readouterr().out


def test_the_printout_fills_no_weight(monkeypatch, capsys):
    """`sched FILE` prints the assignments without generating a single weight value."""
    from ggml_lite import scenario
    from ggml_lite.__main__ import main

    def no(*a, **k):
        raise AssertionError("a weight was generated")
    monkeypatch.setattr(scenario, "weight_values", no)
    assert main(["sched", str(fixture_path("ggml-seed-sched", "03_partial_offload"))]) == 0
    assert "## SPLIT #0" in capsys.readouterr().out


def _consistent(doc, layers, **dims):
    """`doc` with another model (`dims`, one layer per backend name in `layers`), every record that depends
    on it rebuilt to match (graph, weights, buffers), the recorded facts left as they are."""
    from ggml_lite.graphio import graph_document
    from ggml_lite.models.llama import build_llama

    doc["model"].update(n_layer=len(layers), **dims)
    doc["model"]["rope"]["n_dims"] = doc["model"]["n_embd"] // doc["model"]["n_head"]
    doc["placement"].update(layers=layers, kv_cache=layers)
    ctxs, graph, roots = build_llama(doc["model"], doc["placement"], _round0_batch(doc), recorded=True)
    g = graph_document(graph, ctxs, roots)["graph"]
    post = dict.fromkeys(("buffer", "offset", "ext_offset", "sched_backend", "sched_cause"), None)
    doc["graph"] = {**g, "tensors": [{**t, **post, "preallocated": False} for t in g["tensors"]]}
    doc["weights"] = [{"name": t.name, "type": t.type.name, "ne": list(t.ne[:2]), "buffer": c.name, "ext_offset": 0,
                       "gen": dict(zip(("seed", "offset", "scale"), weight_gen(t.name))), "fnv1a32_of_bytes": 0}
                      for c in ctxs if c.name.startswith("weights:") for t in c.tensors]
    doc["external_buffers"] = [{"ctx": c.name, "buffer_type": c.name.split(":")[1], "is_multi_buffer": False, "size": 0,
                                "usage": "WEIGHTS" if c.name.startswith("weights") else "ANY"} for c in ctxs[:-1]]
    return doc


@pytest.mark.parametrize("dims, says", [
    (dict(n_embd=4096, n_ff=11008, n_vocab=65536, n_head=32, n_head_kv=32), "expected at most 2 GiB"),
    (dict(n_embd=1024, n_ff=4096, n_vocab=8192, n_head=16, n_head_kv=16), "expected at most 64 MiB"),
])
def test_a_replay_that_asks_for_too_much_is_refused_before_allocating(tmp_path, capsys, dims, says):
    """Models a file may describe consistently but whose replay needs more than 2 GiB, or more than 64 MiB
    of weights to generate and checksum: `--check` refuses them before any buffer exists, and the
    printout, which fills nothing, still prints the assignments."""
    import json

    from ggml_lite.__main__ import main

    f = tmp_path / "big.json"
    f.write_text(json.dumps(_consistent(_mutated(), ["CPU", "CPU", "FAKE", "FAKE"], **dims)))
    assert main(["sched", str(f), "--check"]) == 2
    err = capsys.readouterr().err
    assert "model: the replay would" in err and says in err, err
    assert main(["sched", str(f)]) == 0 and "## SPLIT #0" in capsys.readouterr().out


def test_rounds_that_ask_for_too_many_multiply_adds_are_refused(tmp_path, capsys):
    """Sixteen rounds of 1,024 tokens over the toy model: more than 2^31 multiply-adds."""
    import copy
    import json

    from ggml_lite.__main__ import main

    doc = _consistent(_mutated(), ["CPU", "CPU", "FAKE", "FAKE"], n_ctx=1024)
    reserve, alloc, compute = doc["steps"]
    big = {"n_tokens": 1024, "n_kv": 1024, "kv_head": 0, "n_outputs": 1}
    doc["steps"] = [reserve] + [dict(copy.deepcopy(s), step=2 * r + 1 + k, round=r,
                                     **({"batch": big} if k == 0 else {}))
                                for r in range(16) for k, s in enumerate((alloc, compute))]
    f = tmp_path / "many.json"
    f.write_text(json.dumps(doc))
    assert main(["sched", str(f), "--check"]) == 2
    err = capsys.readouterr().err
    assert "steps: the rounds' replay would need" in err and "multiply-adds" in err, err


def test_a_set_up_that_makes_ggml_lite_abort_is_a_difference(tmp_path, capsys):
    """A completed scenario whose (valid) set-up makes the scheduler abort — CPY denied while the KV
    cache lives in FAKE buffers, scenario 13's case — is a difference from the record (exit 1)."""
    import json

    from ggml_lite.__main__ import main

    f = tmp_path / "deny_cpy.json"
    f.write_text(json.dumps(_mutated_at(("backends", 0, "supports_op_denied"), ["CPY"])))
    assert main(["sched", str(f), "--check"]) == 1
    assert "reserve: ggml_lite aborts (pre-allocated tensor" in capsys.readouterr().out
