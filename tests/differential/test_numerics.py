"""The `numerics` extension (tests/fixtures/README.md): the leaf data generator and `check`'s
verification of recorded results, on files built here with the real ggml (ggml-python) computing the
results."""

import json

import numpy as np
import pytest

import ggml_lite as gl
from ggml_lite.numerics import LCG_A, LCG_C, MASK, fill_leaf, lcg_states, leaf_bytes, leaf_values
from helpers import fixture_path, load_json


def _loop(seed, n):
    s, out = seed, []
    for _ in range(n):
        s = (LCG_A * s + LCG_C) & MASK
        out.append(s)
    return out


@pytest.mark.parametrize("seed, n", [(0, 1), (1, 2), (12345, 3), (2**32 - 1, 17), (987654321, 1000)])
def test_jump_ahead_equals_the_recurrence(seed, n):
    assert lcg_states(seed, n).tolist() == _loop(seed, n)


def test_values_follow_the_spec():
    seed, leaf = 42, 5
    s0 = (seed + 2654435761 * (leaf + 1)) & MASK
    u = np.array(_loop(s0, 64), dtype=np.uint64) >> np.uint64(8)
    floats = leaf_values(seed, leaf, 64, "float")
    assert floats.dtype == np.float32
    assert floats.tolist() == ((u.astype(np.float64) - 2**23) / 2**23).astype(np.float32).tolist()
    assert floats.min() >= -1 and floats.max() < 1
    ints = leaf_values(seed, leaf, 64, "int", (3, 10))
    assert ints.tolist() == (3 + u % 7).astype(np.int32).tolist()


def test_fill_rounds_f16_to_nearest_even_and_quantizes_q8_0():
    ctx = gl.Context("leafs")
    a = ctx.new_tensor_1d(gl.F16, 64, name="a")
    q = ctx.new_tensor_1d(gl.Q8_0, 64, name="q")
    gl.alloc_ctx_tensors(ctx, gl.cpu_buffer_type())
    fill_leaf(a, 7, 0)
    fill_leaf(q, 7, 1)
    assert gl.tensor_get(a).tolist() == leaf_values(7, 0, 64, "float").astype(np.float16).tolist()
    blocks = gl.tensor_get(q)
    x = leaf_values(7, 1, 64, "float").reshape(2, 32)
    d = np.abs(x).max(axis=1) / 127
    assert blocks["d"].reshape(-1).tolist() == d.astype(np.float16).tolist()
    want_q = np.sign(x * (1 / d)[:, None]) * np.floor(np.abs(x * (1 / d)[:, None]) + 0.5)  # roundf
    assert blocks["qs"].reshape(2, 32).tolist() == want_q.astype(np.int8).tolist()


def test_fill_quantizes_q4_0_by_its_reference_quantizer():
    """q4_0 leafs (beyond the spec; the oracle's numeric graphs have q4_0 weights) are filled the way
    `ggml_oracle.numerics_data` fills them: q4_0's reference quantizer, row by row."""
    from ggml_lite.quants import quantize_row_q4_0_ref

    ctx = gl.Context("leafs")
    q = ctx.new_tensor_2d(gl.Q4_0, 64, 3, name="q")
    gl.alloc_ctx_tensors(ctx, gl.cpu_buffer_type())
    fill_leaf(q, 7, 1)
    want = quantize_row_q4_0_ref(leaf_values(7, 1, 192, "float").reshape(-1, 64)).tobytes()
    assert np.asarray(gl.tensor_get(q)).tobytes() == want


def test_integer_leaf_without_range_is_refused():
    with pytest.raises(gl.GraphFileError, match="needs a range"):
        leaf_values(1, 2, 4, "int")


# -- files with recorded results, built with the real ggml -------------------------------------------------

def _numerics_document(name: str, seed: int, ranges: dict, legacy_seed: bool = False) -> dict:
    """Fixture `name` with a `numerics` block whose results the real ggml (ggml-python) computed from
    the specified leaf data; the seed in `data_generator.data_seed` (the spec's layout), or at the top
    level with `legacy_seed` (the layout this project wrote before)."""
    import copy

    import ggml_oracle as O
    from ggml_lite.graphio import allocate_external

    doc = copy.deepcopy(load_json(fixture_path("ggml-seed", name)))
    gf = gl.read_graph_file(doc)
    allocate_external(gf)
    leaf_data, data = [], {}
    for leaf in O.graph_data_tensors(gf.graph):
        i = gf.id_of(leaf)
        rng = ranges.get(leaf.name)
        kind = "int" if leaf.type is gl.I32 else "float"
        data[leaf] = leaf_bytes(leaf.type, leaf.ne, seed, i, kind, rng, leaf.name)
        leaf_data.append({"id": i, "name": leaf.name, "type": leaf.type.name, "kind": kind,
                          **({"range": list(rng)} if rng else {})})
    wanted = [t for t in gf.graph.nodes if t.flags & gl.TensorFlag.OUTPUT]
    if gf.graph.nodes[-1] not in wanted:
        wanted.append(gf.graph.nodes[-1])
    roots = [gf.tensors[i] for i in gf.expand_roots]
    pre = list({id(t.ctx): t.ctx for i, t in gf.tensors.items() if gf.records[i].get("preallocated")}.values())
    outs = O.ggml_compute(gf.graph, roots, pre, data=data, read=wanted)
    results = []
    for t, raw in zip(wanted, outs):
        v = O.result_values(t, raw)[: gl.nelements(t)]  # contiguous results
        results.append(O.result_entry(gf.id_of(t), t, v))
    doc.update(numeric=True, numerics={"leaf_data": leaf_data, "results": results})
    if legacy_seed:
        doc.update(data_generator="LCG", data_seed=seed)
    else:
        doc["data_generator"] = {"kind": "lcg32", "data_seed": seed}
    return doc


needs_ggml = pytest.mark.skipif(not __import__("ggml_oracle").available(), reason="ggml-python is not importable")


@needs_ggml
@pytest.mark.parametrize("name, ranges, legacy_seed", [
    ("06_llama_block", {"inp_pos": (0, 64)}, False),
    ("07_llama4_kvcache", {"inp_tokens": (0, 256), "inp_pos": (0, 64), "inp_out_ids": (0, 16)}, False),
    ("06_llama_block", {"inp_pos": (0, 64)}, True),
])
def test_check_verifies_results_computed_by_ggml(name, ranges, legacy_seed, tmp_path, capsys):
    """A file in the spec's layout (seed in `data_generator.data_seed`; the last row: the older
    top-level `data_seed`) whose results ggml computed: `check` verifies it, and a changed value fails."""
    from ggml_lite.__main__ import main
    from ggml_lite.graphio import dumps

    doc = _numerics_document(name, 1234, ranges, legacy_seed)
    assert ("data_seed" in doc) == legacy_seed and (doc["data_generator"] == "LCG") == legacy_seed
    path = tmp_path / f"{name}_numeric.json"
    path.write_text(dumps(doc))
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "plan identical" in out and "numerics:" in out and "FAIL" not in out
    assert out.count("worst relative error") == len(doc["numerics"]["results"])

    res = doc["numerics"]["results"][-1]   # a recorded value changed by 5% of the largest: caught
    vals = res.get("values") or res["first"]
    k = int(np.argmax(np.abs(vals)))
    vals[k] = vals[k] * 0.95
    path.write_text(dumps(doc))
    assert main(["check", str(path)]) == 1
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.parametrize("generator, top, message", [
    ({"data_seed": 7}, {}, None),
    ({"data_seed": 7}, {"data_seed": 9}, None),  # the spec's place wins
    ("LCG", {"data_seed": 7}, None),
    ({"kind": "lcg32"}, {}, "expected `data_generator.data_seed`"),
    ({"data_seed": "7"}, {}, "data_generator.data_seed: expected an integer in"),
    ({"data_seed": -1}, {}, "data_generator.data_seed: expected an integer in"),
    ({"data_seed": 2**32}, {}, "data_generator.data_seed: expected an integer in"),
    ({"data_seed": 7.0}, {}, "data_generator.data_seed: expected an integer in"),
    ({"data_seed": True}, {}, "data_generator.data_seed: expected an integer in"),
    ("LCG", {"data_seed": 2**40}, "data_seed: expected an integer in"),
])
def test_the_seed_is_read_where_the_spec_puts_it(generator, top, message):
    from ggml_lite.numerics import data_seed

    doc = {"data_generator": generator, **top}
    if message is None:
        assert data_seed(doc) == 7
    else:
        with pytest.raises(gl.GraphFileError, match=message):
            data_seed(doc)


# -- a numerics block is validated before anything is computed (issue 22) ---------------------------------

def _shaped_document(name: str = "06_llama_block") -> dict:
    """Fixture `name` with a well-formed numerics block (every data leaf described, the last node's
    result of the right length; the values are zeros: these tests stop at validation)."""
    import copy

    doc = copy.deepcopy(load_json(fixture_path("ggml-seed", name)))
    ents = doc["graph"]["tensors"]
    leafs = [{"id": i, "name": e["name"], "type": e["type"], "kind": "int" if e["type"] == "i32" else "float",
              **({"range": [0, 8]} if e["type"] == "i32" else {})}
             for i, e in enumerate(ents) if e["graph_role"] == "leaf" and e["view_src"] is None]
    leafs.sort(key=lambda leaf: leaf["type"] != "i32")  # the integer leaf first (any order is allowed)
    last = ents[doc["graph"]["nodes"][-1]]
    n = int(np.prod(last["ne"]))
    results = [{"id": last["id"], "name": last["name"], "reason": "final", "type": last["type"], "ne": last["ne"],
                "n_elements": n, "values": [0.0] * n}]
    doc.update(numeric=True, data_generator={"kind": "lcg32", "data_seed": 5},
               numerics={"leaf_data": leafs, "results": results})
    return doc


def _edit(doc, path: str, value):
    """Set (or with value ... delete) the field at a dotted path with [k] indices."""
    import re

    keys = [int(k) if k.isdigit() else k for k in re.findall(r"[^.\[\]]+", path)]
    target = doc
    for k in keys[:-1]:
        target = target[k]
    if value is ...:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return doc


def test_a_well_formed_block_passes_validation():
    from ggml_lite.numerics import validate_numerics

    validate_numerics(_shaped_document())


@pytest.mark.parametrize("path, value, message", [
    ("numerics.results", [], "numerics.results: expected at least one result"),
    ("numerics.leaf_data.0.range", [64, 0], "numerics.leaf_data[0].range: expected [lo, hi) with lo < hi"),
    ("numerics.leaf_data.0.range", [0, 2**40], "numerics.leaf_data[0].range[1]: expected an integer in"),
    ("numerics.leaf_data.0.range", [0.0, 8], "numerics.leaf_data[0].range[0]: expected an integer in"),
    ("numerics.leaf_data.0.range", ..., "numerics.leaf_data[0].range: missing"),
    ("numerics.leaf_data.1.range", [0, 4], "numerics.leaf_data[1].range: expected no range on a float leaf"),
    ("numerics.leaf_data.1.id", 40, "numerics.leaf_data[1].id: expected the id of a leaf"),
    ("numerics.leaf_data.1.id", 4000, "numerics.leaf_data[1].id: expected an integer in [0, 40]"),
    ("numerics.leaf_data.1.type", "f16", "numerics.leaf_data[1].type: expected 'f32'"),
    ("numerics.leaf_data.1.name", "x", "numerics.leaf_data[1].name: expected 'blk.0.attn_norm.weight'"),
    ("numerics.leaf_data.1.kind", "int", "numerics.leaf_data[1].kind: expected 'float'"),
    ("numerics.leaf_data.0.kind", "float", "numerics.leaf_data[0].kind: expected 'int'"),
    ("numerics.leaf_data.1", ..., "numerics.leaf_data: no entry for graph.tensors[0]"),
    ("numerics.results.0.values", [0.0] * 3, "numerics.results[0].values: expected a list of 1280 items"),
    ("numerics.results.0.values.7", 1e300, "numerics.results[0].values[7]: expected a finite f32 value"),
    ("numerics.results.0.values.7", "1", "numerics.results[0].values[7]: expected a finite f32 value"),
    ("numerics.results.0.n_elements", 1281, "numerics.results[0].n_elements: expected 1280"),
    ("numerics.results.0.ne", [128, 10, 1, 2], "numerics.results[0].ne: expected [128, 10, 1, 1]"),
    ("numerics.results.0.type", "f16", "numerics.results[0].type: expected 'f32'"),
    ("numerics.results.0.id", 0, "numerics.results[0].id: expected the id of a node"),
    ("numerics.results.0.summary", "yes", "numerics.results[0].summary: expected true or false"),
    ("numerics", [], "numerics: expected an object"),
    ("numeric", "yes", "numeric: expected true or false"),
    ("numeric", False, "numeric / numerics"),
    ("data_generator.data_seed", -5, "data_generator.data_seed: expected an integer in [0, 2^32)"),
])
def test_each_bad_numerics_field_is_refused_by_its_path(path, value, message):
    from ggml_lite.numerics import validate_numerics

    doc = _edit(_shaped_document(), path, value)
    with pytest.raises(gl.GraphFileError) as info:
        validate_numerics(doc)
    assert str(info.value).startswith(message.split(":")[0]) and message in str(info.value), str(info.value)


def test_a_summarised_result_is_checked_too():
    from ggml_lite.numerics import validate_numerics

    doc = _shaped_document()
    res = doc["numerics"]["results"][0]
    del res["values"]
    res.update(summary=True, sum=1.0, sum_sq=-1.0, first=[0.0] * 256)
    with pytest.raises(gl.GraphFileError, match=r"numerics.results\[0\].sum_sq: expected a finite number >= 0"):
        validate_numerics(doc)
    res.update(sum_sq=1.0, first=[0.0] * 300)
    with pytest.raises(gl.GraphFileError, match=r"numerics.results\[0\].first: expected a list of 256 items"):
        validate_numerics(doc)


def test_a_numerics_check_needing_too_much_memory_is_refused(tmp_path, capsys):
    """Nothing is allocated before the memory a numerics check needs is known to be within --max-gib."""
    from ggml_lite.__main__ import main
    from ggml_lite.numerics import validate_numerics

    doc = _shaped_document()
    with pytest.raises(gl.AllocationError, match="more than the 0.000977 GiB allowed"):
        validate_numerics(doc, max_bytes=2**20)
    doc["buffer_size"] = 2**40  # what a file can claim; the plan check would fail later, memory is refused first
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    assert main(["check", str(path)]) == 2
    assert "GiB allowed (check --max-gib raises it)" in capsys.readouterr().err


def test_the_generator_is_chunked_and_equals_the_recurrence():
    from ggml_lite import numerics

    n = numerics.CHUNK + 77  # two chunks, the second one short
    s0 = (3 + 2654435761 * 2) & MASK
    want = (numerics.lcg_states(s0, n) >> np.uint64(8)).astype(np.float64)
    got = leaf_values(3, 1, n, "float")
    assert got.tolist() == ((want - 2**23) / 2**23).astype(np.float32).tolist()
    ints = leaf_values(3, 1, n, "int", (-5, 1000))
    expected = (-5 + (want.astype(np.uint64) % 1005).astype(np.int64)).astype(np.int32)
    assert ints.dtype == np.int32 and ints.tolist() == expected.tolist()


def test_a_numerics_check_taking_too_long_is_refused():
    """The work a file can ask for is bounded too: a MUL_MAT of 2^40 outputs is refused before computing."""
    from ggml_lite.numerics import validate_numerics

    doc = _shaped_document()
    mm = next(e for e in doc["graph"]["tensors"] if e["op"] == "MUL_MAT")
    mm["ne"] = [2**20, 2**20, 1, 1]
    with pytest.raises(gl.AllocationError, match="multiply-adds, more than the 8.59e"):
        validate_numerics(doc)
