"""Chapter 05: the backend interface, copies, events, the registry, graph_copy / compare, the SIM device
(queue, events, clock, counters, FAKE mode) and the errors a user can reach."""

import logging

import numpy as np
import pytest

import ggml_lite as gl
from ggml_lite import registry as R


def _host_tensor(ne=(8, 4), type=gl.F32, name="t"):
    ctx = gl.Context("host")
    t = ctx.new_tensor(type, list(ne), name=name)
    buf = gl.alloc_ctx_tensors(ctx, gl.cpu_buffer_type())
    return t, buf


def _sim_tensor(sim, ne=(8, 4), type=gl.F32, name="t"):
    ctx = gl.Context("dev")
    t = ctx.new_tensor(type, list(ne), name=name)
    buf = gl.alloc_ctx_tensors(ctx, sim)
    return t, buf


def _data(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _close(got, want, rel=1e-5):
    """Normwise: ggml's dot products sum in another order than numpy's, which matters only near zero."""
    assert np.abs(np.asarray(got, np.float64) - want).max() <= rel * np.abs(want).max()


# -- data in and out ------------------------------------------------------------------------------------

@pytest.mark.parametrize("type, dtype", [(gl.F32, np.float32), (gl.F16, np.float16), (gl.I32, np.int32)])
def test_set_get_round_trip(type, dtype):
    t, _ = _host_tensor(type=type)
    x = (np.arange(32).reshape(4, 8) - 7).astype(dtype)
    gl.tensor_set(t, x)
    np.testing.assert_array_equal(gl.tensor_get(t), x)
    assert gl.tensor_get(t, offset=4, size=8).tolist() == list(x.reshape(-1).view(np.uint8)[4:12])


def test_get_follows_a_views_strides():
    ctx = gl.Context("c")
    a = ctx.new_tensor_2d(gl.F32, 8, 4, name="a")
    at = gl.transpose(ctx, a)
    gl.alloc_ctx_tensors(ctx, gl.cpu_buffer_type())
    x = _data((4, 8))
    gl.tensor_set(a, x)
    np.testing.assert_array_equal(gl.tensor_get(at), x.T)


def test_quantized_data_goes_in_as_raw_bytes():
    t, _ = _host_tensor(ne=(32, 2), type=gl.Q8_0)
    raw = np.arange(68, dtype=np.uint8)
    gl.tensor_set(t, raw)
    got = gl.tensor_get(t)
    assert got.dtype.names == ("d", "qs") and got.shape == (2, 1)
    assert gl.tensor_get(t, 0, 68).tobytes() == raw.tobytes()


@pytest.mark.parametrize("call, exc, needle", [
    (lambda t: gl.tensor_set(t, np.zeros(33, np.float32)), gl.TensorBoundsError, "write out of bounds: 132 bytes"),
    (lambda t: gl.tensor_set(t, np.zeros(4, np.float32), offset=120), gl.TensorBoundsError, "at offset 120"),
    (lambda t: gl.tensor_get(t, offset=100, size=40), gl.TensorBoundsError, "read out of bounds"),
    (lambda t: gl.tensor_set(t, np.zeros(32, np.float64)), gl.DataTypeError, "the array is float64"),
])
def test_bad_access_names_what_was_asked(call, exc, needle):
    t, _ = _host_tensor(name="weights")
    with pytest.raises(exc, match=needle) as e:
        call(t)
    assert "'weights'" in str(e.value) or exc is gl.DataTypeError


def test_unallocated_and_freed():
    ctx = gl.Context("c")
    t = ctx.new_tensor_1d(gl.F32, 4, name="nowhere")
    with pytest.raises(gl.TensorNotAllocatedError, match="'nowhere'.*no buffer"):
        gl.tensor_get(t)
    t2, buf = _host_tensor(name="gone")
    buf.free()
    with pytest.raises(gl.BufferFreedError):
        gl.tensor_set(t2, np.zeros(32, np.float32))
    with pytest.raises(gl.BufferFreedError):
        buf.free()


# -- copies --------------------------------------------------------------------------------------------

def test_copy_paths_between_host_and_sim(caplog):
    sim = gl.sim_init(name="SIMc")
    h1, _ = _host_tensor(name="h1")
    h2, _ = _host_tensor(name="h2")
    d1, _ = _sim_tensor(sim, name="d1")
    d2, _ = _sim_tensor(sim, name="d2")
    x = _data((4, 8))
    gl.tensor_set(h1, x)
    gl.tensor_copy(h1, d1)       # host source: tensor_set of the destination
    gl.tensor_copy(d1, d2)       # device to device: SIM's cpy_tensor
    gl.tensor_copy(d2, h2)       # host destination: tensor_get into it
    np.testing.assert_array_equal(gl.tensor_get(h2), x)
    assert sim.bytes_copied == {"h2d": 128, "d2h": 128, "d2d": 128}

    other = gl.BufferType("OTHER", 64, is_host=False)  # a device whose buffers decline cpy_tensor
    ctx = gl.Context("o")
    o = ctx.new_tensor_2d(gl.F32, 8, 4, name="o")
    gl.alloc_ctx_tensors(ctx, other)
    with caplog.at_level(logging.WARNING, logger="ggml_lite"):
        gl.tensor_copy(d1, o)
    assert "slow copy from SIMc to OTHER" in caplog.text
    np.testing.assert_array_equal(gl.tensor_get(o), x)


def test_copy_between_different_layouts_is_refused():
    a, _ = _host_tensor(ne=(8, 4), name="a")
    b, _ = _host_tensor(ne=(4, 8), name="b")
    with pytest.raises(gl.LayoutMismatchError, match="'a' f32 \\[8, 4, 1, 1\\].*'b'"):
        gl.tensor_copy(a, b)
    with pytest.raises(gl.LayoutMismatchError):
        gl.tensor_copy_async(gl.cpu_init(), gl.cpu_init(), a, b)


# -- SIM: the queue, events and time ------------------------------------------------------------------------

def _mul_graph(w, x_ne=(64, 8)):
    ctx = gl.Context("compute")
    x = ctx.new_tensor(gl.F32, list(x_ne), name="x")
    gl.set_input(x)
    y = gl.scale(ctx, gl.mul_mat(ctx, w, x), 0.5).set_name("y")
    gl.set_output(y)
    return gl.build_forward(y), x, y


def _model(backend, seed=0):
    """A 64×32 f32 weight in a WEIGHTS buffer of `backend`, and its values."""
    wctx = gl.Context("weights")
    w = wctx.new_tensor_2d(gl.F32, 64, 32, name="w")
    gl.alloc_ctx_tensors(wctx, backend).set_usage(gl.BufferUsage.WEIGHTS)
    W = _data((32, 64), seed)
    gl.tensor_set(w, W)
    return w, W


def test_sim_work_runs_on_synchronize_and_reads_host_bytes_then():
    clock = gl.SimClock()
    sim = gl.sim_init(clock=clock)
    w, W = _model(sim)
    gf, x, y = _mul_graph(w)
    gl.GAllocr(sim.get_default_buffer_type()).alloc_graph(gf)
    X = _data((8, 64), 1)
    sim.tensor_set_async(x, X)
    sim.graph_compute_async(gf)
    assert len(sim.queue) == 2 and np.isnan(gl.tensor_get(y)).all()  # nothing ran: 0xFF bytes are NaN
    X[:] = 1.0  # an async upload reads the host bytes when it runs, not when it was queued
    out = np.zeros(gl.nbytes(y), np.uint8)
    sim.tensor_get_async(y, out)
    sim.synchronize()
    assert not sim.queue
    _close(out.view(np.float32).reshape(8, 32), 0.5 * np.ones((8, 64), np.float32) @ W.T)
    kinds = [(s.lane, s.kind) for s in clock.spans]
    assert kinds == [("host copies", "h2d"), ("host copies", "d2h"), ("SIM", "h2d"), ("SIM", "compute"), ("SIM", "d2h")]
    lane = [s for s in clock.spans if s.lane == "SIM"]
    assert all(a.end <= b.start + 1e-15 for a, b in zip(lane, lane[1:]))
    assert clock.host == pytest.approx(lane[-1].end)


def test_events_order_two_devices():
    clock = gl.SimClock()
    s0, s1 = gl.sim_init("SIM0", clock=clock), gl.sim_init("SIM1", clock=clock)
    w, W = _model(s0)
    gf, x, y = _mul_graph(w)
    gl.GAllocr(s0.get_default_buffer_type()).alloc_graph(gf)
    gl.tensor_set(x, _data((8, 64), 2))
    y1, _ = _sim_tensor(s1, ne=(32, 8), name="y1")
    s0.graph_compute_async(gf)
    ev = s0.event_new()
    ev.record()
    s1.event_wait(ev)
    gl.tensor_copy_async(s0, s1, y, y1)  # device to device, after s0's queued work
    s1.synchronize()                      # runs s0's queue as far as s1 needs
    np.testing.assert_array_equal(gl.tensor_get(y1), gl.tensor_get(y))
    compute = next(s for s in clock.spans if s.kind == "compute")
    d2d = next(s for s in clock.spans if s.kind == "d2d")
    assert d2d.lane == "SIM1" and d2d.start >= compute.end
    ev.synchronize()
    ev.free()
    with pytest.raises(gl.BackendError, match="freed"):
        ev.record()


def test_fake_mode_is_synchronous():
    fake = gl.sim_init("FAKE", asynchronous=False)
    assert not fake.asynchronous and fake._cpy_tensor_async(fake, None, None) is False  # no async copy
    w, W = _model(fake)
    gf, x, y = _mul_graph(w)
    gl.GAllocr(fake.get_default_buffer_type()).alloc_graph(gf)
    X = _data((8, 64), 3)
    fake.tensor_set_async(x, X)   # falls back to the blocking tensor_set
    fake.graph_compute_async(gf)  # runs at once
    assert not fake.queue
    _close(gl.tensor_get(y), 0.5 * X @ W.T)
    ev = fake.event_new()
    ev.record()
    fake.event_wait(ev)
    ev.synchronize()


def test_sim_refuses_denied_ops_and_foreign_memory():
    sim = gl.sim_init("SIMd", deny_ops=["MUL_MAT"])
    w, _ = _model(sim)
    gf, x, y = _mul_graph(w)
    gl.GAllocr(sim.get_default_buffer_type()).alloc_graph(gf)
    assert not sim.supports_op(gf.nodes[0]) and sim.supports_op(gf.nodes[1])
    with pytest.raises(gl.UnsupportedOpError, match="SIMd does not support MUL_MAT"):
        sim.graph_compute(gf)
    sim2 = gl.sim_init("SIMe")
    h, _ = _host_tensor(name="host_x")
    with pytest.raises(gl.BackendError, match="SIMe cannot write 'host_x'.*CPU memory"):
        sim2.tensor_set_async(h, np.zeros(32, np.float32))
    assert sim2.supports_buft(sim2.get_default_buffer_type()) and not sim2.supports_buft(gl.cpu_buffer_type())
    assert not sim2.supports_buft(sim.get_default_buffer_type())


def test_cpu_refuses_a_mul_mat_it_cannot_do():
    ctx = gl.Context("c")
    a = ctx.new_tensor_2d(gl.F32, 8, 4, name="a")
    b = ctx.new_tensor_2d(gl.F16, 8, 2, name="b")
    c = gl.mul_mat(ctx, a, b)
    gf = gl.build_forward(c)
    gl.alloc_ctx_tensors(ctx, gl.cpu_buffer_type())
    cpu = gl.cpu_init()
    assert not cpu.supports_op(c)
    with pytest.raises(gl.UnsupportedOpError, match="src1 f16 is neither f32 nor the dot type of f32"):
        cpu.graph_compute(gf)


def test_offload_rules():
    ctx = gl.Context("c")
    w = ctx.new_tensor_2d(gl.F16, 64, 64)
    small, big = (gl.mul_mat(ctx, w, ctx.new_tensor_2d(gl.F32, 64, n)) for n in (8, 32))
    rows = gl.get_rows(ctx, w, ctx.new_tensor_1d(gl.I32, 40))
    assert [gl.sim_init(offload=r).offload_op(t) for r in (None, "mul_mat", "cuda")
            for t in (small, big, rows)] == [False, False, False, False, True, False, False, True, False]
    assert gl.sim_init(offload=lambda op: op.op is gl.Op.GET_ROWS).offload_op(rows)
    assert gl.cpu_init().offload_op(big) is False
    with pytest.raises(gl.BackendError, match="unknown offload rule"):
        gl.sim_init(offload="always")


# -- graph plans, registry, graph copy ---------------------------------------------------------------------------

def test_cpu_graph_plans():
    cpu = gl.cpu_init()
    w, _ = _model(cpu)
    gf, x, y = _mul_graph(w)
    gl.GAllocr(gl.cpu_buffer_type()).alloc_graph(gf)
    X = _data((8, 64), 4)
    gl.tensor_set(x, X)
    plan = cpu.graph_plan_create(gf)
    assert cpu.graph_plan_compute(plan) is gl.Status.SUCCESS
    _close(gl.tensor_get(y), 0.5 * X @ gl.tensor_get(w).T)
    cpu.graph_plan_free(plan)
    with pytest.raises(gl.BackendError, match="plan was freed"):
        cpu.graph_plan_compute(plan)
    with pytest.raises(gl.BackendError, match="SIM has no graph plans"):
        gl.sim_init().graph_plan_create(gf)
    cpu.free()
    with pytest.raises(gl.BackendError, match="CPU was freed"):
        cpu.graph_compute(gf)


def test_registry(monkeypatch):
    assert gl.reg_get_count() >= 2 and gl.reg_get_name(0) == "CPU" and gl.reg_find_by_name("SIM") == 1
    assert gl.reg_find_by_name("cpu") is None  # exact names, as strcmp
    assert gl.is_cpu(gl.reg_init_backend_from_str("CPU:whatever"))
    s = gl.reg_init_backend_from_str("SIM:name=SIM7,alignment=64,max_size=4096,deny=SOFT_MAX+ROPE,offload=cuda,async=0")
    assert (s.get_name(), s.get_alignment(), s.get_max_size(), s.asynchronous) == ("SIM7", 64, 4096, False)
    assert s.deny_ops == {gl.Op.SOFT_MAX, gl.Op.ROPE} and s.offload_rule == "cuda"
    assert gl.reg_init_backend_from_str("SIM").get_default_buffer_type() is gl.reg_get_default_buffer_type(1)
    assert gl.reg_alloc_buffer(0, 100).get_size() == 132
    with pytest.raises(gl.UnknownBackendError, match="'CUDA' not found.*registered: CPU, SIM"):
        gl.reg_init_backend_from_str("CUDA:0")
    with pytest.raises(gl.BackendError, match="unknown SIM parameter 'colour'"):
        gl.reg_init_backend_from_str("SIM:colour=red")
    monkeypatch.setattr(R, "_REGISTRY", list(R._REGISTRY))
    gl.register("MINE", lambda params, user: ("made", params, user), gl.cpu_buffer_type(), user_data=7)
    assert gl.reg_init_backend_from_str("MINE:p=1") == ("made", "p=1", 7)
    monkeypatch.setattr(R, "_REGISTRY", [None] * R.GGML_REG_MAX_BACKENDS)
    with pytest.raises(gl.BackendError, match="holds 64 backends"):
        gl.register("ONE_TOO_MANY", None, None)


def test_graph_copy_and_compare_cpu_with_sim():
    cpu, sim = gl.cpu_init(), gl.sim_init("SIMg")
    w, _ = _model(cpu)
    gf, x, y = _mul_graph(w)
    gl.GAllocr(gl.cpu_buffer_type()).alloc_graph(gf)
    gl.tensor_set(x, _data((8, 64), 5))
    seen = []

    def same(i, t1, t2):
        seen.append((i, t1.name, float(np.abs(gl.tensor_get(t1) - gl.tensor_get(t2)).max())))
        return True
    assert gl.compare_graph_backend(cpu, sim, gf, same)
    assert [(i, n) for i, n, _ in seen] == [(0, gf.nodes[0].name), (1, "y")] and all(d == 0 for *_, d in seen)
    assert gl.compare_graph_backend(cpu, sim, gf, lambda i, a, b: False)  # stops after the first node
    copy = gl.graph_copy(sim, gf)
    assert [t.name for t in copy.graph.nodes] == [t.name for t in gf.nodes]
    assert all(not t.flags for t in copy.graph.nodes)  # flags are not copied (as in the C)
    assert copy.buffer.get_type() is sim.get_default_buffer_type()
    gl.graph_copy_free(copy)
    assert copy.buffer.freed
