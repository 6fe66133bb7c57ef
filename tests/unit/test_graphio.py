"""graphio: file validation errors (each names the tensor), steps, schema, and round trips."""

import copy
import json
import re

import pytest

import ggml_lite as gl
from ggml_lite import errors
from ggml_lite.graphio import dumps, graph_document, load_graph, read_graph_file, save_graph_file, to_document


@pytest.fixture
def doc():
    ctx = gl.Context("compute")
    x = ctx.new_tensor_2d(gl.F32, 16, 4, name="x")
    w = ctx.new_tensor_2d(gl.Q8_0, 32, 16, name="w")  # in the context, not in the graph
    y = gl.mul_mat(ctx, ctx.new_tensor_2d(gl.F16, 16, 8, name="w2"), x).set_name("y")
    z = gl.soft_max(ctx, gl.cont(ctx, gl.permute(ctx, gl.reshape_3d(ctx, y, 4, 2, 4), 0, 2, 1, 3)))
    gl.set_output(z)
    g = gl.build_forward(z)
    assert w not in g.leafs and z.name == "node_4"
    return graph_document(g, [ctx], [z], fixture="toy")


def load_edited(doc, edit):
    """Load `doc` after `edit(tensors)`, its `src_names` / `view_src_name` following the edited ids (so
    that the check an edit aims at is the one that fires)."""
    d = copy.deepcopy(doc)
    ts = d["graph"]["tensors"]
    edit(ts)
    name = {i: e["name"] for i, e in enumerate(ts)}
    for e in ts:
        if isinstance(e.get("src"), list):
            e["src_names"] = [name.get(s) if isinstance(s, int) else None for s in e["src"]]
        e["view_src_name"] = name.get(e.get("view_src"))
    return read_graph_file(d)


def test_round_trip(doc, tmp_path):
    gf = read_graph_file(doc)
    assert json.dumps(to_document(gf)) == json.dumps(doc)
    p = tmp_path / "g.json"
    save_graph_file(gf, p)
    assert p.read_text() == dumps(doc) + "\n"
    g, tensors = load_graph(p)
    assert [t.name for t in g.nodes] == [t.name for t in gf.graph.nodes]
    roles = [e["graph_role"] for e in doc["graph"]["tensors"]]
    assert roles.count("none") == 1  # "w" is in the file but not in the graph


@pytest.mark.parametrize("edit,exc,needle", [
    (lambda ts: ts[2].update(op="CONV_2D"), errors.UnknownOpError, "tensor #2"),
    (lambda ts: ts[0].update(type="q9_9"), errors.UnknownTypeError, "tensor #0 'x'"),
    (lambda ts: ts[3].update(src=[2, 42]), errors.DanglingSourceError, "42"),
    (lambda ts: ts[3].update(view_src=17), errors.DanglingSourceError, "17"),
    (lambda ts: ts[2].update(src=[4, 0]), errors.GraphCycleError, "tensor #2"),
    (lambda ts: ts[1].update(ne=[32, -16, 1, 1]), errors.InvalidSizeError, "tensor #1 'w'"),
    (lambda ts: ts[0].update(nbytes=-1), errors.InvalidSizeError, "nbytes"),
    (lambda ts: ts[3].update(nb=[4, 64, 512, 512]), errors.RecordMismatchError, "nb"),
    (lambda ts: ts[7].update(name="node_9"), errors.RecordMismatchError, "node_4"),
    (lambda ts: ts[4].update(src=[0]), errors.ReshapeError, "tensor #4"),
    (lambda ts: ts[0].pop("ne"), errors.GraphFileError, "graph.tensors[0].ne: missing"),
    (lambda ts: ts[1].update(id=7), errors.GraphFileError, "position 1"),
])
def test_bad_files_raise_specific_errors(doc, edit, exc, needle):
    with pytest.raises(exc) as info:
        load_edited(doc, edit)
    if needle:
        assert needle in str(info.value)


def test_cycle_message_lists_the_cycle(doc):
    with pytest.raises(errors.GraphCycleError) as info:
        load_edited(doc, lambda ts: ts[2].update(src=[4, 0]))
    msg = str(info.value)
    assert msg.count("->") >= 2 and "tensor #0" not in msg  # only the tensors on the cycle


def test_schema_and_steps(doc):
    with pytest.raises(errors.GraphFileError, match="schema"):
        read_graph_file({**doc, "schema": "something"})
    seq = {"schema": doc["schema"], "schema_version": 1, "steps": [{"step": 0, "graph": doc["graph"]}, {"step": 1}]}
    with pytest.raises(errors.GraphFileError, match=r"step= one of \[0\]"):
        read_graph_file(seq)
    with pytest.raises(errors.GraphFileError, match="step 1 has no graph"):
        read_graph_file(seq, step=1)
    assert read_graph_file(seq, step=0).graph.n_nodes == len(doc["graph"]["nodes"])


def test_graph_without_expand_roots_uses_recorded_lists(doc):
    d = copy.deepcopy(doc)
    del d["graph"]["expand_roots"]
    gf = read_graph_file(d)
    assert [gf.id_of(t) for t in gf.graph.nodes] == doc["graph"]["nodes"]


# -- untrusted input (issue 22): each class of bad field is refused, naming its JSON path ----------------

def _toy_text(doc, old: str, new: str) -> str:
    """The document as JSON text with one piece of text replaced (for literals json.dumps cannot write)."""
    text = json.dumps(doc)
    assert text.count(old) >= 1, old
    return text.replace(old, new, 1)


@pytest.mark.parametrize("edit, path, exc", [
    (lambda ts: ts[1].update(name=17), "graph.tensors[1].name", errors.GraphFileError),
    (lambda ts: ts[0].update(ne=[16.0, 4, 1, 1]), "graph.tensors[0].ne[0]", errors.GraphFileError),
    (lambda ts: ts[0].update(ne=[16, True, 1, 1]), "graph.tensors[0].ne[1]", errors.GraphFileError),
    (lambda ts: ts[0].update(ne=[2**70, 1, 1, 1]), "graph.tensors[0].ne[0]", errors.InvalidSizeError),
    (lambda ts: ts[0].update(ne=[2**31, 2**31, 2**2, 1]), "graph.tensors[0].ne", errors.InvalidSizeError),
    (lambda ts: ts[0].update(nb=[4, 64, 2**70, 256]), "graph.tensors[0].nb[2]", errors.InvalidSizeError),
    (lambda ts: ts[0].update(id=0.0), "graph.tensors[0].id", errors.GraphFileError),
    (lambda ts: ts[0].update(flags_value=True), "graph.tensors[0].flags_value", errors.GraphFileError),
    (lambda ts: ts[0].update(flags_value=2), "graph.tensors[0].flags_value", errors.GraphFileError),
    (lambda ts: ts[0].update(flags=["INPUT", "GRAD"], flags_value=1), "graph.tensors[0].flags[1]",
     errors.GraphFileError),
    (lambda ts: ts[5].update(op_params=[2**40]), "graph.tensors[5].op_params[0]", errors.GraphFileError),
    (lambda ts: ts[5].update(op_params=[1.5]), "graph.tensors[5].op_params[0]", errors.GraphFileError),
    (lambda ts: ts[5].update(op_params=[0] * 17), "graph.tensors[5].op_params", errors.GraphFileError),
    (lambda ts: ts[0].update(nbytes=2**70), "graph.tensors[0].nbytes", errors.InvalidSizeError),
    (lambda ts: ts[0].update(alloc_size="256"), "graph.tensors[0].alloc_size", errors.GraphFileError),
    (lambda ts: ts[3].update(view_offs=0.5), "graph.tensors[3].view_offs", errors.GraphFileError),
    (lambda ts: ts[0].update(offset=-3), "graph.tensors[0].offset", errors.InvalidSizeError),
    (lambda ts: ts[0].update(ext_offset=float("1e300")), "graph.tensors[0].ext_offset", errors.GraphFileError),
    (lambda ts: ts[3].update(src=[True]), "graph.tensors[3].src[0]", errors.GraphFileError),
    (lambda ts: ts[3].update(src=[2] * 11), "graph.tensors[3].src", errors.GraphFileError),
    (lambda ts: ts[1].update(type=None), "graph.tensors[1].type", errors.GraphFileError),
    (lambda ts: ts[1].update(ne=[30, 16, 1, 1]), "graph.tensors[1].ne[0]", errors.GraphFileError),  # q8_0 blocks
    (lambda ts: ts[0].update(graph_role="node"), "graph.tensors[0].graph_role", errors.GraphFileError),
    (lambda ts: ts[0].update(preallocated="no"), "graph.tensors[0].preallocated", errors.GraphFileError),
    (lambda ts: ts[0].update(preallocated=True), "graph.tensors[0].preallocated", errors.GraphFileError),
    (lambda ts: ts[0].update(buffer=3), "graph.tensors[0].buffer", errors.GraphFileError),
    (lambda ts: ts[0].pop("flags"), "graph.tensors[0].flags: missing", errors.GraphFileError),
])
def test_each_bad_field_is_refused_by_its_path(doc, edit, path, exc):
    with pytest.raises(exc) as info:
        load_edited(doc, edit)
    assert str(info.value).startswith(path), str(info.value)
    assert "expected" in str(info.value) or "missing" in str(info.value)


def test_names_must_be_unique_and_sources_named_right(doc):
    """plan --json keys tensors by name: a file with a name twice is refused (the writer appends #id)."""
    d = copy.deepcopy(doc)
    d["graph"]["tensors"][3]["name"] = d["graph"]["tensors"][0]["name"]
    with pytest.raises(errors.GraphFileError, match=r"graph.tensors\[3\].name: 'x' is also the name of tensors\[0\]"):
        read_graph_file(d)
    d = copy.deepcopy(doc)
    d["graph"]["tensors"][3]["src_names"] = ["w", "x"]
    with pytest.raises(errors.GraphFileError, match=r"graph.tensors\[3\].src_names\[0\]: expected 'w2'"):
        read_graph_file(d)


def test_a_recorded_type_is_compared_not_ignored(doc):
    """The type of an op's result is the op's; a file saying otherwise is refused."""
    with pytest.raises(errors.RecordMismatchError, match=r"graph.tensors\[3\].*type = f16, ggml_lite gives f32"):
        load_edited(doc, lambda ts: ts[3].update(type="f16", nb=[2, 16, 64, 64], nbytes=64, alloc_size=64))


@pytest.mark.parametrize("literal, path", [("Infinity", "graph.tensors[0].ne[1]"), ("NaN", "graph.tensors[0].ne[1]"),
                                           ("-Infinity", "graph.tensors[0].ne[1]")])
def test_nan_and_infinity_are_refused_where_they_stand(doc, tmp_path, literal, path):
    p = tmp_path / "g.json"
    p.write_text(_toy_text(doc, '"ne": [16, 4, 1, 1]', f'"ne": [16, {literal}, 1, 1]'))
    with pytest.raises(errors.GraphFileError) as info:
        read_graph_file(p)
    assert f"{path}: expected a finite number, found {literal}" in str(info.value) and str(p) in str(info.value)


def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(errors.GraphFileError, match="nested too deeply"):
        read_graph_file(p)
    p.write_text('{"schema": "ggml-gallocr-fixture", "graph": ' + "{\"a\": " * 50_000 + "1" + "}" * 50_001)
    with pytest.raises(errors.GraphFileError, match="nested too deeply"):
        read_graph_file(p)


@pytest.mark.parametrize("top, path", [
    ({"schema_version": 2}, "schema_version: expected 1"),
    ({"schema_version": True}, "schema_version: expected 1"),
    ({"steps": []}, "the top level: expected either `graph`"),
    ({"buffer_type": {"name": "CPU", "alignment": 48, "max_size": None}},
     "buffer_type.alignment: expected a power of two"),
    ({"buffer_type": {"name": "CPU", "alignment": 2**40, "max_size": None}}, "buffer_type.alignment"),
    ({"buffer_type": {"name": "CPU", "alignment": 32, "max_size": 0}}, "buffer_type.max_size"),
    ({"buffer_type": {"name": "CPU", "alignment": 32, "max_size": None, "alloc_size": "padded"}},
     "buffer_type.alloc_size"),
    ({"buffer_type": {"name": "CPU", "alignment": 32}}, "buffer_type.max_size: missing"),
    ({"external_buffers": [{"ctx": "weights", "size": 10}]}, "external_buffers[0].ctx: expected a context of graph"),
    ({"external_buffers": [{"ctx": "compute", "size": -1}]}, "external_buffers[0].size"),
    ({"ggml_version": "0.15"}, "ggml_version: expected a version string MAJOR.MINOR.PATCH"),
    ({"ggml_version": None}, "ggml_version: expected a version string"),
    ({"ggml_version": 10}, "ggml_version: expected a version string"),
    ({"ggml_version": "0.15.3-rc1"}, "ggml_version: expected a version string"),
    ({"ggml_version": "1234567890.0.0"}, "ggml_version: expected a version string"),
])
def test_the_document_around_the_graph_is_checked(doc, top, path):
    with pytest.raises(errors.GraphFileError) as info:
        read_graph_file({**doc, **top})
    assert str(info.value).startswith(path.split(":")[0]) and path in str(info.value), str(info.value)


def test_an_empty_steps_list_is_refused(doc):
    seq = {"schema": doc["schema"], "schema_version": 1, "steps": []}
    with pytest.raises(errors.GraphFileError, match="steps: expected at least one step"):
        read_graph_file(seq, step=0)


def test_the_recorded_buffer_type_is_honoured(doc):
    """A file recording a CPU-like buffer type of alignment 256 is planned on that type: every offset is a
    multiple of 256 (the CPU type's 32 would pack them tighter)."""
    from ggml_lite.plancheck import plan_of, run_plan
    from ggml_lite.schema import RecordedBufferType

    bt = {"name": "CPU_256", "alignment": 256, "max_size": None, "alloc_size": "ggml_nbytes"}
    gf, galloc, res = run_plan({**doc, "buffer_type": bt})
    assert isinstance(galloc.bufts[0], RecordedBufferType) and galloc.bufts[0].get_alignment() == 256
    offsets = [o for o in plan_of(gf, galloc).offsets.values() if o is not None]
    assert offsets and all(o % 256 == 0 for o in offsets) and any(o for o in offsets)
    assert "reallocating CPU_256 buffer" in res["reserve"]["log"][0]
    gf32, galloc32, _ = run_plan(doc)
    assert galloc32.get_buffer_size(0) < galloc.get_buffer_size(0)


def test_a_graph_of_more_than_2048_nodes_loads_and_plans(tmp_path, capsys):
    """Chapter 10's builder with 80 layers (2,566 nodes): read with a graph as large as the file."""
    from ggml_lite.__main__ import main
    from ggml_lite.models.llama import build_llama
    from helpers import fixture_path, load_json

    model = {**load_json(fixture_path("ggml-seed-sched", "02_full_offload_llama"))["model"], "n_layer": 80}
    placement = {"token_embd": "CPU", "output": "CPU", "layers": ["CPU"] * 80, "kv_cache": ["CPU"] * 80}
    ctxs, graph, roots = build_llama(model, placement, {"n_tokens": 8, "n_kv": 32, "kv_head": 0, "n_outputs": 1})
    assert graph.n_nodes > 2048
    p = tmp_path / "llama80.json"
    p.write_text(dumps(graph_document(graph, ctxs, roots, fixture="llama80")))
    assert read_graph_file(p).graph.n_nodes == graph.n_nodes
    assert main(["plan", str(p), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["buffer_size"] > 0 and len(out["tensors"]) == sum(len(c.tensors) for c in ctxs)


def test_recorded_lists_without_expand_roots_must_be_a_graph(doc):
    d = copy.deepcopy(doc)
    del d["graph"]["expand_roots"]
    d["graph"]["nodes"] = list(reversed(d["graph"]["nodes"]))
    with pytest.raises(errors.GraphFileError, match=r"graph.nodes\[0\]: expected a node whose sources"):
        read_graph_file(d)


# -- the reader: repeated keys, quoting, JSON kinds, sources an op needs, the generator -----------------

@pytest.mark.parametrize("text, path, key", [
    ('{"a": 1, "a": 2}', "the top level", "a"),
    ('{"a": 1, "b": {"c": [1, {"d": 0, "e": 1, "d": 0}]}}', "b.c[1]", "d"),  # (equal values: refused too)
    ('[{"x": {"y": 1, "y": 1}}]', "[0].x", "y"),
])
def test_parse_json_refuses_a_repeated_key_naming_the_object(text, path, key):
    from ggml_lite.untrusted import parse_json

    with pytest.raises(errors.GraphFileError) as info:
        parse_json(text, "F")
    assert str(info.value) == (f"F: {path}: expected each key once in an object, found the key {key!r} more "
                               f"than once (which value counts would be a guess)")
    assert parse_json('{"a": {"a": 1}, "b": [{"a": 2}]}') == {"a": {"a": 1}, "b": [{"a": 2}]}  # one per object


def test_a_repeated_key_of_a_graph_file_is_refused_not_last_wins(doc, tmp_path):
    """"schema_version": 99, "schema_version": 1 read as version 1; a repeated "offset" as its last value."""
    p = tmp_path / "g.json"
    for old, new, path in [('"schema_version": 1', '"schema_version": 99, "schema_version": 1', "the top level"),
                           ('"offset": null', '"offset": 0, "offset": null', "graph.tensors[0]")]:
        text = dumps(doc)
        assert old in text
        p.write_text(text.replace(old, new, 1))
        with pytest.raises(errors.GraphFileError, match=re.escape(f"{path}: expected each key once in an object")):
            read_graph_file(p)


def test_quote_cuts_long_strings_and_says_how_long():
    from ggml_lite.untrusted import found, quote

    assert quote("w2") == "'w2'" and quote("x" * 60) == repr("x" * 60)
    assert quote("y" * 100_000) == f"{'y' * 60!r}... (100,000 chars)"
    assert quote(list(range(100))).endswith("... (390 chars)") and quote(7) == "7"
    assert found("z" * 100_000) == f"the string {'z' * 60!r}... (100,000 chars)"


def test_a_long_name_is_quoted_in_part_in_every_message(doc):
    """A 100,000-character name (and a repeated one) makes messages of a few hundred characters."""
    long = "n" * 100_000
    for edit in (lambda ts: ts[0].update(name=long, type="f99"),              # the entry's own check
                 lambda ts: (ts[0].update(name=long), ts[1].update(name=long))):  # unique names
        with pytest.raises(errors.GGMLLiteError) as info:
            load_edited(doc, edit)
        assert "... (100,000 chars)" in str(info.value) and len(str(info.value)) < 600, str(info.value)[:1000]


@pytest.mark.parametrize("value, kind", [(None, "null"), (True, "true/false"), (1, "number"), (1.5, "number"),
                                         ("s", "string"), ([], "array"), ({}, "object")])
def test_json_kinds_are_named_as_json_names_them(value, kind, tmp_path):
    from ggml_lite.untrusted import json_kind, read_json

    assert json_kind(value) == kind
    p = tmp_path / "top.json"
    p.write_text(json.dumps(value))
    if kind != "object":
        with pytest.raises(errors.GraphFileError, match=f"the top level is a JSON {kind}, expected an object"):
            read_json(p)


@pytest.mark.parametrize("op_index, src, k", [(1, [], 0), (1, [0], 1), (1, [None, 0], 0)])
def test_an_op_missing_a_source_it_needs_is_refused_by_its_path(doc, op_index, src, k):
    """MUL_MAT with fewer than two sources ended in "'NoneType' object has no attribute 'ne'"."""
    ts = doc["graph"]["tensors"]
    i = next(j for j, e in enumerate(ts) if e["op"] == "MUL_MAT")
    with pytest.raises(errors.GraphFileError) as info:
        load_edited(doc, lambda ts: ts[i].update(src=src))
    assert f"graph.tensors[{i}].src[{k}]: expected the id of a tensor (MUL_MAT takes 2 source(s)" in str(info.value)
    assert "NoneType" not in str(info.value)


def test_only_the_lcg_the_format_defines_is_accepted():
    from ggml_lite.numerics import GENERATOR_KIND, data_seed

    assert GENERATOR_KIND == "lcg32"
    assert data_seed({"data_generator": {"kind": "lcg32", "data_seed": 7}}) == 7
    assert data_seed({"data_generator": "LCG", "data_seed": 7}) == 7  # (older files)
    for gen, path in [({"kind": "mt19937", "data_seed": 7}, "data_generator.kind"),
                      ({"kind": None, "data_seed": 7}, "data_generator.kind"),
                      ("mt19937", "data_generator"), (5, "data_generator")]:
        with pytest.raises(errors.GraphFileError, match=rf"^{path}: expected "):
            data_seed({"data_generator": gen, "data_seed": 7})


def test_ggml_version_is_three_integers():
    from ggml_lite.schema import ggml_version

    assert ggml_version({"ggml_version": "0.15.3"}) == (0, 15, 3) and ggml_version({}) is None
    assert ggml_version({"ggml_version": "999999999.0.010"}) == (999999999, 0, 10)


def test_external_buffers_ignore_the_compute_buffer_s_limit(tmp_path):
    """A file whose buffer type has a max_size smaller than a weight: the weights are placed as the recorder
    placed them, in one buffer of the type without its limit (ggml_backend_alloc_ctx_tensors would refuse a
    tensor above max_size); the graph allocator still gets the limited type."""
    from ggml_lite.graphio import allocate_external
    from ggml_lite.plancheck import run_plan
    from ggml_lite.schema import buffer_type_of
    from helpers import fixture_path, load_json

    doc = load_json(fixture_path("ggml-seed", "06_llama_block"))
    doc["buffer_type"]["max_size"] = 1024
    assert buffer_type_of(doc).get_max_size() == 1024 and buffer_type_of(doc, limited=False).get_max_size() > 2**60
    buffers = allocate_external(read_graph_file(doc))
    assert [b.get_size() for b in buffers.values()] == [e["size"] for e in doc["external_buffers"]]
    _, galloc, _ = run_plan(doc, ggml="2026")
    assert galloc.bufts[0].get_max_size() == 1024 and len(galloc.chunk_sizes(0)) > 1


def test_flags_of_ggml_0_10_1_are_read_and_dropped(doc):
    """ggml 0.10.1 and later set LOSS (8) and COMPUTE (16) too (`ggml_build_forward_expand` marks every op node
    COMPUTE): a file recording them loads, and the tensors keep only INPUT, OUTPUT and PARAM, which is all a
    planner reads."""
    from ggml_lite.graphio import read_graph_file

    ts = doc["graph"]["tensors"]
    nodes = [e for e in ts if e["op"] != "NONE"]
    for e in nodes:
        e["flags"], e["flags_value"] = e["flags"] + ["COMPUTE"], e["flags_value"] | 16
    ts[0]["flags"], ts[0]["flags_value"] = ts[0]["flags"] + ["LOSS"], ts[0]["flags_value"] | 8
    gf = read_graph_file(doc)
    assert nodes and all(int(t.flags) < 8 for t in gf.tensors.values())
    assert [int(gf.tensors[e["id"]].flags) for e in nodes] == [e["flags_value"] & 7 for e in nodes]


def test_flags_copied_raw_from_ggml_0_10_1_load(doc):
    """A recorder that copies `tensor->flags` as it is writes 16 (COMPUTE) in `flags_value` of every op node
    without naming it: accepted, and dropped; an unnamed INPUT bit is still a mismatch."""
    from ggml_lite import errors
    from ggml_lite.graphio import read_graph_file

    ts = doc["graph"]["tensors"]
    for e in ts:
        if e["op"] != "NONE":
            e["flags_value"] |= 16
    gf = read_graph_file(doc)
    assert all(int(t.flags) < 8 for t in gf.tensors.values())
    ts[0]["flags_value"] |= 1 if "INPUT" not in ts[0]["flags"] else 2
    with pytest.raises(errors.GraphFileError, match=r"graph.tensors\[0\].flags_value"):
        read_graph_file(doc)


def test_flash_attn_ext_round_trips_with_its_precision():
    """FLASH_ATTN_EXT through a graph file: four sources (the mask may be null), three floats and the
    precision word that `flash_attn_ext_set_prec` wrote; a mask too short is refused with the tensor named."""
    ctx = gl.Context("compute")
    q = ctx.new_tensor_3d(gl.F32, 32, 5, 4, name="q")
    k = ctx.new_tensor_3d(gl.F16, 32, 64, 2, name="k")
    v = ctx.new_tensor_3d(gl.F16, 32, 64, 2, name="v")
    fa = gl.flash_attn_ext(ctx, q, k, v, ctx.new_tensor_2d(gl.F16, 64, 32, name="mask"), 0.25, 0.0, 0.0)
    gl.flash_attn_ext_set_prec(fa, gl.GGML_PREC_F32)
    fb = gl.flash_attn_ext(ctx, q, k, v, None, 0.5, 0.0, 20.0)
    out = gl.add(ctx, gl.reshape_2d(ctx, fa, 128, 5), gl.reshape_2d(ctx, fb, 128, 5))
    g = gl.build_forward(out)
    doc = graph_document(g, [ctx], [out], fixture="fa")
    gf = read_graph_file(doc)
    assert json.dumps(to_document(gf)) == json.dumps(doc)
    got = {t.name: t for t in gf.graph.nodes}
    assert got[fa.name].op_params[:4] == fa.op_params[:4] and got[fa.name].op_params[3] == 1
    assert len(got[fb.name].src) == 3 and got[fb.name].ne == [32, 4, 5, 1]  # no mask: src[3] stays NULL
    m = next(j for j, e in enumerate(doc["graph"]["tensors"]) if e["name"] == "mask")

    def short_mask(ts):
        ts[m].update(ne=[64, 8, 1, 1], nb=[2, 128, 1024, 1024], nbytes=1024, alloc_size=1024)
    with pytest.raises(errors.ShapeError, match="'mask'.*need at least 32"):
        load_edited(doc, short_mask)


def _moe_doc():
    """A graph with every new op of issue 26's MoE and flash-attention graphs: ggml_cast (its src[1] is
    itself), ARGSORT and its top-k VIEW, MUL_MAT_ID; nodes listed without expand_roots too."""
    ctx = gl.Context("compute")
    probs = gl.soft_max(ctx, ctx.new_tensor_2d(gl.F32, 8, 5, name="logits"))
    sel = gl.top_k(ctx, probs, 2)
    up = gl.mul_mat_id(ctx, ctx.new_tensor_3d(gl.Q8_0, 32, 16, 8, name="up_exps"),
                       ctx.new_tensor_3d(gl.F32, 32, 1, 5, name="cur"), sel)
    asc = gl.argsort(ctx, ctx.new_tensor_2d(gl.F32, 6, 3, name="scores"), gl.SortOrder.ASC)
    mask = gl.cast(ctx, ctx.new_tensor_2d(gl.F32, 64, 32, name="KQ_mask"), gl.F16)
    gf = gl.Graph()
    for r in (up, asc, mask):
        gl.build_forward_expand(gf, r)
    return gf, graph_document(gf, [ctx], [up, asc, mask], fixture="moe"), mask


def test_moe_ops_and_cast_round_trip():
    gf, doc, mask = _moe_doc()
    gf2 = read_graph_file(doc)
    assert json.dumps(to_document(gf2)) == json.dumps(doc)
    got = {t.name: t for t in gf2.graph.nodes}
    m2 = got["KQ_mask (copy)"]
    assert m2.src[1] is m2 and m2.view_src is None and m2.type is gl.F16 and gf2.auto_names[gf2.id_of(m2)] == m2.name
    assert [t.op for t in gf2.graph.nodes] == [t.op for t in gf.nodes]
    assert {t.op for t in gf2.graph.nodes} >= {gl.Op.ARGSORT, gl.Op.MUL_MAT_ID, gl.Op.VIEW, gl.Op.CPY}
    d = copy.deepcopy(doc)  # the recorded lists alone (no expand_roots): the cast's self-edge is no later source
    del d["graph"]["expand_roots"]
    assert [t.name for t in read_graph_file(d).graph.nodes] == [t.name for t in gf.nodes]


def test_a_self_reference_other_than_the_cast_s_is_refused():
    _, doc, _ = _moe_doc()
    ts = doc["graph"]["tensors"]
    c = next(i for i, e in enumerate(ts) if e["name"] == "KQ_mask (copy)")
    a = next(i for i, e in enumerate(ts) if e["op"] == "ARGSORT" and e["op_params"] == [])  # the ASC one

    def self_add(ts):
        ts[a]["src"] = [a]
    with pytest.raises(errors.GraphFileError, match=rf"tensors\[{a}\].src\[0\]: expected not itself"):
        load_edited(doc, self_add)

    def cast_of_other(ts):
        ts[c]["src"][1] = a
    with pytest.raises(errors.GraphFileError, match=rf"tensors\[{c}\].src\[1\]: expected {c}, itself \(ggml_cast"):
        load_edited(doc, cast_of_other)

    def order_7(ts):  # ggml_argsort's order is ASC or DESC
        ts[a]["op_params"] = [7]
    with pytest.raises(errors.TensorError, match="order 7"):
        load_edited(doc, order_7)
