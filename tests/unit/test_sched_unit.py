"""The scheduler's paths the recorded scenarios do not reach: the eval callback and its j0..j1 batching,
the re-reserve when an assignment moves to another buffer type or the graph outgrows the plan, the
getters' errors, and freeing."""

import logging

import numpy as np
import pytest

import ggml_lite as gl
from ggml_lite.sched import BackendSched


def _model(sim, cpu):
    w_sim, w_cpu = gl.Context("weights:SIM"), gl.Context("weights:CPU")
    w1 = w_sim.new_tensor_2d(gl.F32, 16, 32, name="w1")
    w2 = w_cpu.new_tensor_2d(gl.F32, 32, 8, name="w2")
    for ctx, b in ((w_sim, sim), (w_cpu, cpu)):
        gl.alloc_ctx_tensors(ctx, b).set_usage(gl.BufferUsage.WEIGHTS)
    rng = np.random.default_rng(0)
    gl.tensor_set(w1, rng.standard_normal((32, 16)).astype(np.float32))
    gl.tensor_set(w2, rng.standard_normal((8, 32)).astype(np.float32))
    return w1, w2


def _graph(w1, w2, n_tokens=4):
    c = gl.Context("compute")
    x = c.new_tensor_2d(gl.F32, 16, n_tokens, name="x")
    gl.set_input(x)
    h = gl.silu(c, gl.mul_mat(c, w1, x).set_name("h0")).set_name("h1")
    h = gl.scale(c, h, 0.5).set_name("h2")
    y = gl.soft_max(c, gl.mul_mat(c, w2, h).set_name("logits")).set_name("probs")
    gl.set_output(y)
    return gl.build_forward(y), x, y


def _run(sched, graph, x, y, n_tokens=4):
    assert sched.alloc_graph(graph)
    gl.tensor_set(x, np.linspace(-1, 1, 16 * n_tokens, dtype=np.float32).reshape(n_tokens, 16))
    assert sched.graph_compute(graph) == gl.Status.SUCCESS
    return gl.tensor_get(y)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_eval_callback_batches_the_nodes_nobody_wants(asynchronous):
    sim, cpu = gl.sim_init("SIM", asynchronous=asynchronous), gl.cpu_init()
    w1, w2 = _model(sim, cpu)
    plain = _run(BackendSched([sim, cpu], debug=False), *_graph(w1, w2))

    calls, computed = [], []
    sched = BackendSched([sim, cpu], debug=False)
    for b in (sim, cpu):  # record the node ranges each backend is asked to compute
        orig = b._graph_compute
        b._graph_compute = lambda g, orig=orig: (computed.append([n.name for n in g.nodes]), orig(g))[1]

    def cb(t, ask):
        calls.append((t.name, ask))
        if ask:
            return t.name in ("h1", "probs")  # the user wants these two
        assert not np.isnan(gl.tensor_get(t)).any()  # computed (and synchronized) when shown
        return True
    sched.set_eval_callback(cb)
    graph, x, y = _graph(w1, w2)
    got = _run(sched, graph, x, y)
    np.testing.assert_array_equal(got, plain)
    assert calls == [("h0", True), ("h1", True), ("h1", False), ("h2", True),
                     ("logits", True), ("probs", True), ("probs", False)]
    assert computed == [["h0", "h1"], ["h2"], ["logits", "probs"]]  # SIM: h0..h1, then h2; CPU: both


def test_a_callback_returning_false_stops_its_split():
    sim, cpu = gl.sim_init("SIM", asynchronous=False), gl.cpu_init()
    w1, w2 = _model(sim, cpu)
    sched = BackendSched([sim, cpu], debug=False)
    sched.set_eval_callback(lambda t, ask: True if ask else t.name != "h0")  # stop after h0
    graph, x, y = _graph(w1, w2)
    seen = []
    orig = sim._graph_compute
    sim._graph_compute = lambda g: (seen.extend(n.name for n in g.nodes), orig(g))[1]
    _run(sched, graph, x, y)
    assert seen == ["h0"]  # h1 and h2 of SIM's split were skipped; the CPU split still ran


def test_a_moved_assignment_or_a_larger_graph_reserves_again(caplog):
    sim, cpu = gl.sim_init("SIM", asynchronous=False), gl.cpu_init()
    w1, w2 = _model(sim, cpu)
    sched = BackendSched([sim, cpu], debug=False)
    graph, x, y = _graph(w1, w2)
    assert sched.reserve(graph)
    with caplog.at_level(logging.DEBUG, logger="ggml_lite"):
        sched.reset()
        g2, x2, y2 = _graph(w1, w2)
        sched.set_tensor_backend(g2.get_tensor("h2"), cpu)  # h2 moves from SIM to the CPU: another buffer type
        ref = _run(sched, g2, x2, y2)
    assert "failed to allocate graph, reserving (backend_ids_changed = 1)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="ggml_lite"):
        sched.reset()
        g3, x3, y3 = _graph(w1, w2, n_tokens=64)  # same assignments, tensors too large for the plan
        sched.set_tensor_backend(g3.get_tensor("h2"), cpu)
        _run(sched, g3, x3, y3, n_tokens=64)
    assert "failed to allocate graph, reserving (backend_ids_changed = 0)" in caplog.text
    assert np.isfinite(ref).all()


def test_getters_and_free():
    sim, cpu = gl.sim_init("SIM"), gl.cpu_init()
    sched = BackendSched([sim, cpu], parallel=True, debug=False)
    assert (sched.get_n_backends(), sched.get_n_copies(), sched.get_backend(0)) == (2, 4, sim)
    assert sum(e is not None for row in sched.events for e in row) == 4  # SIM has events, the CPU none
    with pytest.raises(gl.SchedulerError, match="backend 2 asked"):
        sched.get_backend(2)
    with pytest.raises(gl.SchedulerError, match="OTHER is not one of"):
        sched.get_buffer_size(gl.sim_init("OTHER"))
    sched.free()
    assert all(e.freed for e in sched.events[0])
