"""The graph allocator against the 14 ggml-seed fixtures: every offset, every buffer size, and for the
sequence files every step's size, buffer replacement and log lines (plancheck.check_plan_file)."""

import copy

import pytest

from ggml_lite.plancheck import check_plan_file, plan_of, recorded_plan, run_plan
from helpers import SEED_FILES, fixture_path, load_json


@pytest.mark.parametrize("name", SEED_FILES)
def test_fixture_plan_is_identical(name):
    assert check_plan_file(fixture_path("ggml-seed", name), limit=0) == []


@pytest.mark.parametrize("name", ["06_llama_block", "13_llama7b_ctx512_all_outputs"])
def test_every_compute_tensor_is_placed_where_ggml_put_it(name):
    doc = load_json(fixture_path("ggml-seed", name))
    gf, galloc, res = run_plan(doc)
    got, want = plan_of(gf, galloc), recorded_plan(gf)
    placed = [i for i, off in want.offsets.items() if off is not None]
    assert len(placed) == sum(1 for t in doc["graph"]["tensors"] if t["buffer"] == "compute")
    assert {i: got.offsets[i] for i in placed} == {i: want.offsets[i] for i in placed}
    assert got.buffer_size == want.buffer_size == doc["buffer_size"]
    assert res["reserve"]["log"] == doc["reserve"]["log"] and res["alloc_graph"]["log"] == []


def _first_compute(doc):
    return next(t for t in doc["graph"]["tensors"] if t["offset"] is not None and t["view_src"] is None)


@pytest.mark.parametrize("edit, expect", [
    (lambda d: _first_compute(d).update(offset=_first_compute(d)["offset"] + 32), "ggml offset"),
    (lambda d: d.update(buffer_size=d["buffer_size"] + 32), "buffer size"),
    (lambda d: d["reserve"]["log"].append("an extra line"), "reserve: log"),
    (lambda d: d["alloc_graph"].update(ok=False), "alloc_graph: ok"),
])
def test_a_changed_record_is_reported(edit, expect):
    doc = copy.deepcopy(load_json(fixture_path("ggml-seed", "06_llama_block")))
    edit(doc)
    diffs = check_plan_file(doc)
    assert len(diffs) == 1 and expect in diffs[0], diffs


def test_a_changed_sequence_step_is_reported():
    doc = copy.deepcopy(load_json(fixture_path("ggml-seed", "11_realloc_sequence_grow")))
    doc["steps"][2]["log"] = ["ggml_gallocr_needs_realloc: graph has different number of nodes"]
    doc["steps"][3]["compute_buffer_replaced"] = True
    diffs = check_plan_file(doc)
    assert [d.split(":")[0] for d in diffs] == ["step 2 (alloc_graph)", "step 3 (alloc_graph)"], diffs


def test_sequence_facts_per_step():
    """File 11: the reasons ggml gave for re-planning, and a buffer reallocated but at the same
    struct address (glibc reuses the freed chunk; the simulated heap does too)."""
    doc = load_json(fixture_path("ggml-seed", "11_realloc_sequence_grow"))
    galloc, seen = None, []
    for k in range(len(doc["steps"])):
        gf, galloc, res = run_plan(doc, k, galloc, "alloc_graph")
        seen.append((res["alloc_graph"]["buffer_size"], res["alloc_graph"]["log"][:1]))
    assert [s for s, _ in seen] == [st["buffer_size"] for st in doc["steps"]]
    assert seen[1][1] == ["ggml_gallocr_needs_realloc: node inp_embd is not valid"]
    assert seen[2][1] == []  # smaller graph of the same shape: the plan is kept
