"""graphio: file validation errors (each names the tensor), steps, schema, and round trips."""

import copy
import json

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
    d = copy.deepcopy(doc)
    edit(d["graph"]["tensors"])
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
    (lambda ts: ts[0].pop("ne"), errors.GraphFileError, "'ne'"),
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
    seq = {"schema": doc["schema"], "steps": [{"step": 0, "graph": doc["graph"]}, {"step": 1}]}
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
