"""The scheduler's assignment and splitting (`ggml_backend_sched_split_graph`) and its reserve, against the
14 recorded scenarios (tests/fixtures/ggml-seed-sched): every tensor's backend and cause, the splits
and their inputs and copies, the scheduler's graph copy, the GGML_SCHED_DEBUG printout, n_splits,
n_copies and every backend's compute-buffer size after the reserve; scenario 13's abort as an error."""

import logging

import pytest

import ggml_lite as gl
from ggml_lite.scenario import apply_pins, load_scenario
from ggml_lite.sched import BackendSched, print_assignments
from helpers import SCHED_FILES, fixture_path, load_json

WITH_GRAPH = [n for n in SCHED_FILES if not n.startswith("13_")]


def _setup(name):
    """A fresh scenario: backends, weights, the round-0 graph, and a scheduler with the pins applied."""
    doc = load_json(fixture_path("ggml-seed-sched", name))
    sc = load_scenario(doc)
    sched = BackendSched(sc.backends, parallel=doc["sched_params"]["parallel"], debug=False)
    apply_pins(sched, sc.gf.graph, doc, sc.backends)
    return doc, sc, sched


def _printout(stderr_lines) -> str:
    """The GGML_SCHED_DEBUG part of a step's stderr (the gallocr messages follow it)."""
    text = "\n".join(stderr_lines) + "\n"
    text = text[text.find("\n## SPLIT #0"):]  # pass 1's warnings come before it
    end = text.find("ggml_gallocr")
    return text if end < 0 else text[:end]


@pytest.mark.parametrize("name", WITH_GRAPH)
def test_reserve_matches_the_recorded_step(name, caplog):
    doc, sc, sched = _setup(name)
    step = next(s for s in doc["steps"] if s["call"] == "ggml_backend_sched_reserve")
    graph = sc.gf.graph
    with caplog.at_level(logging.WARNING, logger="ggml_lite"):
        sched.split_graph(graph)
    printout = print_assignments(sched, graph)
    assert printout == _printout(step["stderr"])
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [line for line in step["stderr"] if line.startswith("ggml_backend_sched_backend_from_buffer")]
    caplog.clear()
    # the reserve proper, on a fresh scheduler and graph (the split above rewired the graph's sources)
    doc, sc, sched = _setup(name)
    with caplog.at_level(logging.INFO, logger="ggml_lite"):
        assert sched.reserve(sc.gf.graph) == step["ok"]
    assert (sched.n_splits, sched.get_n_copies()) == (step["n_splits"], step["n_copies"])
    assert {b.get_name(): sched.get_buffer_size(b) for b in sc.backends} == step["buffer_sizes"]
    gallocr_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ggml_gallocr")]
    assert gallocr_lines == [line for line in step["stderr"] if line.startswith("ggml_gallocr")]


@pytest.mark.parametrize("name", WITH_GRAPH)
def test_every_assignment_split_and_copy(name):
    """After a split like round 0's alloc_graph: backend and cause of every tensor, sources rewired to
    the copies, the splits, and the scheduler's graph copy node for node."""
    doc, sc, sched = _setup(name)
    step = next(s for s in doc["steps"] if s["call"] == "ggml_backend_sched_alloc_graph")
    sched.split_graph(sc.gf.graph)
    by_name = {t.name: t for t in sc.gf.tensors.values()}
    for rec in step["tensors"]:
        t = by_name[rec["name"]]
        b = sched.get_tensor_backend(t)
        assert (b.get_name() if b else None, sched.get_cause(t)) == (rec["backend"], rec["cause"]), rec["name"]
        assert [s.name if s is not None else None for s in t.src] == rec["src_names"][:len(t.src)], rec["name"]
    assert [(sched.backends[s.backend_id].get_name(), s.i_start, s.i_end, [i.name for i in s.inputs])
            for s in sched.splits] == \
        [(s["backend"], s["i_start"], s["i_end"], [i["name"] for i in s["inputs"]]) for s in step["splits"]]
    for s, rec in zip(sched.splits, step["splits"]):
        for inp, want in zip(s.inputs, rec["inputs"]):
            assert [sched.copies[(inp, s.backend_id, c)].name for c in range(sched.n_copies)] == want["copies"]
    sg = step["sched_graph"]
    got = [(t.name, t.op.name, sched.backends[b].get_name() if b != -1 else None)
           for t, b in zip(sched.graph.nodes, sched.node_backend_ids)]
    assert got == [(n["name"], n["op"], n["backend"]) for n in sg["nodes"]]
    got = [(t.name, sched.backends[b].get_name() if b != -1 else None)
           for t, b in zip(sched.graph.leafs, sched.leaf_backend_ids)]
    assert got == [(n["name"], n["backend"]) for n in sg["leafs"]]
    assert [int(t.flags) for t in sched.graph.nodes] == [n["flags_value"] for n in sg["nodes"]]


def test_scenario_13_aborts_as_an_error(caplog):
    """FAKE cannot CPY while the KV cache is in FAKE memory: the cpy into the cache view is
    pre-allocated and no backend can run it. The reference aborts in pass 1 of the reserve."""
    from ggml_lite.scenario import built_scenario

    doc = load_json(fixture_path("ggml-seed-sched", "13_abort_deny_cpy_kv_in_fake"))
    backends, graph = built_scenario(doc)
    sched = BackendSched(backends, debug=False)
    with caplog.at_level(logging.WARNING, logger="ggml_lite"):
        with pytest.raises(gl.SchedulerError, match="pre-allocated tensor in a backend that cannot run the operation"):
            sched.reserve(graph)
    assert caplog.records[0].getMessage() == doc["outcome"]["stderr_until_abort"][0]


def test_the_last_backend_must_be_the_cpu():
    with pytest.raises(gl.SchedulerError, match="last backend must be the CPU"):
        BackendSched([gl.cpu_init(), gl.sim_init()])
    with pytest.raises(gl.SchedulerError, match="not one of the scheduler's backends"):
        BackendSched([gl.sim_init(), gl.cpu_init()]).set_tensor_backend(gl.Context().new_tensor_1d(gl.F32, 4),
                                                                          gl.sim_init("OTHER"))


def _rounds(doc):
    """(alloc_graph step, graph_compute step) of every round."""
    steps = doc["steps"]
    return [(steps[k], steps[k + 1]) for k, s in enumerate(steps) if s["call"] == "ggml_backend_sched_alloc_graph"]


@pytest.mark.parametrize("name", WITH_GRAPH)
def test_graph_compute_gives_the_recorded_logits(name):
    """Reserve with the round-0 graph, then per round: reset, a fresh graph, pins, alloc_graph, inputs,
    graph_compute — all 256 logits equal ggml's bit for bit (the CPU kernels follow ggml's arithmetic,
    SIM runs the same kernels, and the splits and copies move the same bytes)."""
    import numpy as np

    from ggml_lite.models.llama import batch_inputs, build_graph, model_tensors

    doc, sc, sched = _setup(name)
    assert sched.reserve(sc.gf.graph)
    w, layers = model_tensors({t.name: t for t in sc.gf.tensors.values()}, doc["model"]["n_layer"])
    for alloc_step, compute_step in _rounds(doc):
        sched.reset()
        _, graph, _ = build_graph(doc["model"], w, layers, alloc_step["batch"], recorded=True)
        apply_pins(sched, graph, doc, sc.backends)
        assert sched.alloc_graph(graph)
        assert (sched.n_splits, sched.cur_copy) == (alloc_step["n_splits"], alloc_step["cur_copy"])
        for key, value in batch_inputs(alloc_step["batch"]).items():
            gl.tensor_set(graph.get_tensor(key), value)
        assert sched.graph_compute(graph) == gl.Status.SUCCESS
        assert sched.cur_copy == compute_step["cur_copy_after"]
        got = gl.tensor_get(graph.get_tensor("result_output")).reshape(-1).astype(np.float64)
        rec = next(o for o in compute_step["outputs"] if o["name"] == "result_output")
        want = np.array(rec["values"], dtype=np.float64)
        same = got.astype(np.float32) == want.astype(np.float32)  # 9 printed digits round-trip float32
        assert same.all(), (name, compute_step["round"], int(same.sum()), np.abs(got - want).max())


@pytest.mark.parametrize("name", SCHED_FILES)
def test_sched_check_replays_every_scenario(name, capsys):
    from ggml_lite.__main__ import main

    assert main(["sched", str(fixture_path("ggml-seed-sched", name)), "--check"]) == 0
    out = capsys.readouterr().out
    assert ("abort reproduced" in out) if name.startswith("13_") else ("identical" in out)


def test_a_changed_record_is_reported(tmp_path, capsys):
    """The replay can fail: a cause, a buffer size, a graph-copy offset and a logit changed in the
    record are each reported, and `sched --check` exits 1."""
    import copy
    import json

    from ggml_lite.__main__ import main
    from ggml_lite.scenario_replay import replay

    doc = copy.deepcopy(load_json(fixture_path("ggml-seed-sched", "03_partial_offload")))
    alloc = doc["steps"][1]
    alloc["tensors"][5]["cause"] = "2.sup" if alloc["tensors"][5]["cause"] != "2.sup" else "3.best"
    alloc["buffer_sizes"]["CPU"] += 32
    node = next(n for n in alloc["sched_graph"]["nodes"] if n["offset"])
    node["offset"] += 32
    doc["steps"][2]["outputs"][0]["values"][7] += 1.0
    diffs = replay(doc)
    assert len(diffs) == 4, diffs
    assert any("backend and cause" in d for d in diffs) and any("buffer sizes" in d for d in diffs)
    assert any("graph copy nodes" in d for d in diffs) and any("1 of 256 logits differ" in d for d in diffs)
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(doc))
    assert main(["sched", str(path), "--check"]) == 1
    assert "4 difference(s)" in capsys.readouterr().out


def test_sched_prints_the_assignments(capsys):
    from ggml_lite.__main__ import main

    doc = load_json(fixture_path("ggml-seed-sched", "05_deny_soft_max"))
    assert main(["sched", str(fixture_path("ggml-seed-sched", "05_deny_soft_max"))]) == 0
    printed = capsys.readouterr().out
    assert printed == "\n".join(doc["steps"][0]["stderr"][:len(printed.splitlines())]) + "\n"
