"""Chapter 12's scheduler of today (ggml 0.15.3) against chapter 09's of 2024, change by change: 30 inputs
per split, `op_offload` and the host-memory rule, ROPE's weight, a view's cause, pass 5's weight rule, the
CPU-last check, and compute buffers in chunks through the scheduler. The 2024 scheduler's own results are
the recorded scenarios' (tests/replay/test_sched_scenarios.py); here it only stands beside today's."""

import numpy as np
import pytest

import ggml_lite as gl
from ggml_lite.buffer import BufferType
from ggml_lite.errors import SchedulerError
from ggml_lite.gallocr import GAllocr
from ggml_lite.gallocr_today import GAllocr2026
from ggml_lite.scenario import apply_pins, built_scenario, load_scenario
from ggml_lite.sched import BackendSched
from ggml_lite.sched_today import BackendSched2026, backend_dev_type
from ggml_lite.schema import RecordedBufferType
from helpers import fixture_path, load_json

ERAS = {"2024": BackendSched, "2026": BackendSched2026}


def _weight(backend, ne0=64, ne1=64, name="w", buft=None, seed=0):
    c = gl.Context(f"weights:{name}")
    w = c.new_tensor_2d(gl.F32, ne0, ne1, name=name)
    buf = gl.alloc_ctx_tensors_from_buft(c, buft) if buft is not None else gl.alloc_ctx_tensors(c, backend)
    buf.set_usage(gl.BufferUsage.WEIGHTS)
    if buft is None:
        gl.tensor_set(w, np.random.default_rng(seed).standard_normal((ne1, ne0)).astype(np.float32) / 8)
    return w


def _fan_in(weight, n, overflow=False):
    """weight·x_i for n inputs x_i (the CPU's), summed; `overflow`: the product after the 9th is of x9 + x10."""
    c = gl.Context("compute")
    xs = [c.new_tensor_2d(gl.F32, weight.ne[0], 8, name=f"x{i}") for i in range(n)]
    for x in xs:
        gl.set_input(x)
    if overflow:
        xs = [*xs[:9], gl.add(c, xs[9], xs[10]).set_name("x9+x10"), *xs[11:]]
    out = gl.mul_mat(c, weight, xs[0])
    for x in xs[1:]:
        out = gl.add(c, out, gl.mul_mat(c, weight, x))
    gl.set_output(out)
    return gl.build_forward(out), [t for t in c.tensors if t.name.startswith("x") and t.op is gl.Op.NONE], out


@pytest.fixture
def sim_cpu():
    return gl.sim_init("SIM", asynchronous=False), gl.cpu_init()


def test_the_seams_keep_2024_and_set_today():
    assert (BackendSched.galloc_class, BackendSched.max_split_inputs, BackendSched.weights_split_always) == \
        (GAllocr, 10, True)
    assert (BackendSched2026.galloc_class, BackendSched2026.max_split_inputs,
            BackendSched2026.weights_split_always) == (GAllocr2026, 30, False)
    assert type(BackendSched2026([gl.cpu_init()]).galloc) is GAllocr2026


def test_more_than_ten_inputs_to_one_split(sim_cpu):
    sim, cpu = sim_cpu
    w = _weight(sim)
    counts = {}
    for era, cls in ERAS.items():
        s = cls([sim, cpu])
        s.split_graph(_fan_in(w, 12)[0])
        counts[era] = [(sp.backend_id, sp.n_inputs) for sp in s.splits]
    assert counts == {"2024": [(0, 10), (0, 2)], "2026": [(0, 12)]}  # 2 splits in 2024, 1 today


def test_a_node_that_overflows_the_split_raises_in_2024_only(sim_cpu):
    sim, cpu = sim_cpu
    w = _weight(sim)
    with pytest.raises(SchedulerError, match="split 0 needs more than 10 inputs"):
        BackendSched([sim, cpu]).split_graph(_fan_in(w, 11, overflow=True)[0])
    s = BackendSched2026([sim, cpu])
    s.split_graph(_fan_in(w, 11, overflow=True)[0])
    assert [sp.n_inputs for sp in s.splits] == [11]


def test_thirty_is_today_s_limit(sim_cpu):
    sim, cpu = sim_cpu
    w = _weight(sim)
    s = BackendSched2026([sim, cpu])
    s.split_graph(_fan_in(w, 32)[0])
    assert [sp.n_inputs for sp in s.splits] == [30, 2]
    with pytest.raises(SchedulerError, match="split 0 needs more than 30 inputs"):
        BackendSched2026([sim, cpu]).split_graph(_overflow_at(w, 29))


def _overflow_at(weight, k):
    """k single-input products, then one product of two new inputs added: k + 2 inputs, k taken on arrival."""
    c = gl.Context("compute")
    xs = [c.new_tensor_2d(gl.F32, weight.ne[0], 8, name=f"x{i}") for i in range(k + 2)]
    for x in xs:
        gl.set_input(x)
    out = gl.mul_mat(c, weight, xs[0])
    for x in [*xs[1:k], gl.add(c, xs[k], xs[k + 1])]:
        out = gl.add(c, out, gl.mul_mat(c, weight, x))
    gl.set_output(out)
    return gl.build_forward(out)


def _batch(weight, n_rows):
    c = gl.Context("compute")
    x = c.new_tensor_2d(gl.F32, weight.ne[0], n_rows, name="x")
    gl.set_input(x)
    y = gl.silu(c, gl.mul_mat(c, weight, x).set_name("h")).set_name("y")
    gl.set_output(y)
    return gl.build_forward(y)


@pytest.mark.parametrize("n_rows", [32, 16])
def test_op_offload_switch(n_rows):
    sim, cpu = gl.sim_init("SIM", asynchronous=False, offload="cuda"), gl.cpu_init()
    w = _weight(cpu)
    placed = {}
    for label, cls, kw in (("2024", BackendSched, {}), ("2026", BackendSched2026, {}),
                           ("off", BackendSched2026, {"op_offload": False})):
        g = _batch(w, n_rows)
        s = cls([sim, cpu], **kw)
        s.split_graph(g)
        placed[label] = (s.get_tensor_backend(g.nodes[0]).get_name(), s.get_cause(g.nodes[0]), s.n_splits)
    if n_rows >= 32:  # CUDA's rule asks for the op: offloaded unless op_offload is off
        assert placed == {"2024": ("SIM", "1.off", 1), "2026": ("SIM", "1.off", 1), "off": ("CPU", "1.wgt0", 1)}
    else:
        assert set(placed.values()) == {("CPU", "1.wgt0", 1)}


def test_op_offload_on_recorded_scenario_08():
    """Scenario 08 (a 4-layer LLaMA, every weight on the CPU, a FAKE device with CUDA's offload rule): the
    2024 scheduler makes the 43 splits ggml recorded; today's the same, its 24 KV views "1.dst" where 2024
    says "1.vsrc"; with op_offload=False nothing leaves the CPU: one split."""
    doc = load_json(fixture_path("ggml-seed-sched", "08_op_offload_cuda_rule"))
    seen = {}
    for label, cls, kw in (("2024", BackendSched, {}), ("2026", BackendSched2026, {}),
                           ("off", BackendSched2026, {"op_offload": False})):
        sc = load_scenario(doc, fill=False)
        s = cls(sc.backends, graph_size=doc["sched_params"]["graph_size"], debug=False, **kw)
        s.split_graph(sc.gf.graph)
        seen[label] = (s.n_splits, [(n.name, s.get_tensor_backend(n).get_name(), s.get_cause(n))
                                    for n in sc.gf.graph.nodes])
    assert seen["2024"][0] == seen["2026"][0] == doc["steps"][0]["n_splits"] == 43 and seen["off"][0] == 1
    moved = [(a, b) for a, b in zip(seen["2024"][1], seen["2026"][1]) if a != b]
    assert len(moved) == 24 and all(a[:2] == b[:2] and (a[2], b[2]) == ("1.vsrc", "1.dst") for a, b in moved)
    assert sum(c == "1.off" for _, _, c in seen["2024"][1]) == 32
    assert {b for _, b, _ in seen["off"][1]} == {"CPU"} and all(c != "1.off" for _, _, c in seen["off"][1])


def test_only_weights_in_host_memory_are_offloaded():
    """A CPU that also takes a non-host buffer type (as today's CPU backend takes its repacked weights):
    2024 offloads an op on such a weight, today keeps it with its weight."""
    sim, cpu = gl.sim_init("SIM", asynchronous=False, offload="cuda"), gl.cpu_init()
    repack = BufferType("CPU_REPACK", 32, is_host=False)
    cpu._supports_buft = lambda buft: buft.is_host() or buft is repack
    w = _weight(cpu, buft=repack)
    placed = {}
    for era, cls in ERAS.items():
        g = _batch(w, 32)
        s = cls([sim, cpu])
        s.split_graph(g)
        placed[era] = (s.get_tensor_backend(g.nodes[0]).get_name(), s.get_cause(g.nodes[0]))
    assert placed == {"2024": ("SIM", "1.off"), "2026": ("CPU", "1.wgt0")}


def test_rope_s_weight_decides_nothing_today_and_a_view_is_placed_by_its_buffer(sim_cpu):
    sim, cpu = sim_cpu
    wc = gl.Context("weights:SIM")
    freq, wv = wc.new_tensor_1d(gl.F32, 8, name="freq"), wc.new_tensor_2d(gl.F32, 16, 4, name="wv")
    gl.alloc_ctx_tensors(wc, sim).set_usage(gl.BufferUsage.WEIGHTS)
    seen = {}
    for era, cls in ERAS.items():
        c = gl.Context("compute")  # a graph per scheduler: a split rewires its graph's sources to copies
        x, pos, xv = c.new_tensor_3d(gl.F32, 16, 2, 4, name="x"), c.new_tensor_1d(gl.I32, 4, name="pos"), \
            c.new_tensor_1d(gl.F32, 16, name="xv")
        for t in (x, pos, xv):
            gl.set_input(t)
        r = gl.rope_ext(c, x, pos, freq, 16, 0, 512, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0).set_name("r")
        v = gl.view_1d(c, wv, 16, 0).set_name("v")
        s = cls([sim, cpu])
        s.split_graph(gl.build_forward(r))
        seen[era, "r"] = (s.get_tensor_backend(r).get_name(), s.get_cause(r))
        s = cls([sim, cpu])
        s.split_graph(gl.build_forward(gl.add(c, v, xv)))
        seen[era, "v"] = (s.get_tensor_backend(v).get_name(), s.get_cause(v))
    assert seen == {("2024", "r"): ("SIM", "1.wgt2"), ("2026", "r"): ("CPU", "3.best"),
                    ("2024", "v"): ("SIM", "1.vsrc"), ("2026", "v"): ("SIM", "1.dst")}


def test_a_weight_the_split_s_backend_can_read_starts_no_split():
    """Backends [CPU A, SIM, CPU B] (A with a buffer type of its own, so pass 3 does not merge B into A):
    a weight on A read by nodes pinned to B. 2024 cuts B's split at the weight; today B reads A's memory."""
    cpu_a, sim, cpu_b = gl.cpu_init(), gl.sim_init("SIM", asynchronous=False), gl.cpu_init()
    host_a = RecordedBufferType("CPU", 32, None)
    w_sim, w_a = _weight(sim, 16, 16, "ws"), _weight(cpu_a, 16, 16, "wa", buft=host_a)
    n_splits = {}
    for era, cls in ERAS.items():
        c = gl.Context("compute")
        x = c.new_tensor_2d(gl.F32, 16, 4, name="x")
        gl.set_input(x)
        n0 = gl.mul_mat(c, w_sim, x).set_name("n0")  # on SIM
        n1 = gl.scale(c, n0, 2.0).set_name("n1")  # pinned to B: n0 is copied in (B's first input)
        n2 = gl.mul_mat(c, w_a, n1).set_name("n2")  # pinned to B, its weight on A
        gl.set_output(n2)
        s = cls([cpu_a, sim, cpu_b], bufts=[host_a, sim.get_default_buffer_type(), gl.cpu_buffer_type()])
        s.set_tensor_backend(n1, cpu_b)
        s.set_tensor_backend(n2, cpu_b)
        s.split_graph(gl.build_forward(n2))
        n_splits[era] = [(s.backends[sp.backend_id] is cpu_b, sp.n_inputs) for sp in s.splits]
    assert n_splits == {"2024": [(False, 1), (True, 1), (True, 0)], "2026": [(False, 1), (True, 1)]}


def test_the_cpu_last_both_eras(sim_cpu):
    sim, cpu = sim_cpu
    assert (backend_dev_type(cpu), backend_dev_type(sim)) == ("CPU", "GPU")
    with pytest.raises(SchedulerError, match="the last backend must be the CPU, got SIM"):
        BackendSched([cpu, sim])
    with pytest.raises(SchedulerError, match=r"last backend's device must be of type CPU, got SIM \(device type GPU\)"):
        BackendSched2026([cpu, sim])
    with pytest.raises(SchedulerError, match="17 backends given"):  # the count is checked first, as in the C
        BackendSched2026([sim] * 17)
    assert BackendSched2026([sim, cpu]).n_backends == 2


def test_chunked_compute_buffers_through_the_scheduler():
    """SIM limited to 8 KiB per allocation, the CPU's buffer type too: every backend's compute buffer in
    chunks, each tensor inside the chunk its plan names, the sizes the sums of the chunks (+32 per CPU
    chunk), and the results those of the unlimited 2024 scheduler."""
    results = {}
    for era, limit in (("2024", None), ("2026", 8192)):
        sim, cpu = gl.sim_init("SIM", asynchronous=False, max_size=limit), gl.cpu_init()
        w = _weight(sim, 64, 32)
        s = ERAS[era]([sim, cpu], bufts=[sim.get_default_buffer_type(), RecordedBufferType("CPU", 32, limit)])
        graph, xs, out = _fan_in(w, 8)
        assert s.reserve(_fan_in(w, 8)[0]) and s.alloc_graph(graph)
        for i, x in enumerate(xs):
            gl.tensor_set(x, np.full((8, 64), (i + 1) / 16, dtype=np.float32))
        assert s.graph_compute(graph) == gl.Status.SUCCESS
        results[era] = gl.tensor_get(out).copy()
        if era == "2024":
            continue
        chunks = [s.galloc.chunk_sizes(i) for i in (0, 1)]
        assert chunks == [[8192, 8192, 1024], [8192, 8192]] and all(c <= 8192 for cs in chunks for c in cs)
        assert [s.get_buffer_size(b) for b in (sim, cpu)] == [sum(chunks[0]), sum(chunks[1]) + 32 * len(chunks[1])]
        placed = 0
        kept = [(n, a.dst) for n, a in zip(s.graph.nodes, s.galloc.node_allocs, strict=True)]  # slot by slot
        for t, where in kept + [(leaf, a.leaf) for leaf, a in zip(s.graph.leafs, s.galloc.leaf_allocs, strict=True)]:
            if where.size_max == 0:  # a view, pre-allocated, or not in a compute buffer
                continue
            buf = s.galloc.buffers[where.buffer_id].chunks[where.offset.chunk]  # the chunk the plan names
            assert t.buffer is buf and t.data == buf.get_base() + where.offset.offset
            assert t.data + t.nbytes <= buf.get_base() + buf.get_size()
            placed += 1
        assert placed > 20
    np.testing.assert_allclose(results["2026"], results["2024"], rtol=1e-6)


SCENARIOS = [p.stem for p in sorted(fixture_path("ggml-seed-sched", "01_full_offload_all").parent.glob("*.json"))]


@pytest.mark.parametrize("name", SCENARIOS)
def test_recorded_scenarios_split_and_plan_alike_in_both_eras(name):
    """Each recorded scenario, reserved and split by both eras: the same splits and compute buffers, every
    node on the same backend, only "1.vsrc" read as "1.dst". Scenario 13, where ggml aborted (a KV cache in a
    device that refuses CPY), aborts in both eras."""
    doc = load_json(fixture_path("ggml-seed-sched", name))
    if "graph" not in doc:
        for cls in ERAS.values():
            backends, graph = built_scenario(doc)
            with pytest.raises(SchedulerError, match="pre-allocated tensor"):
                cls(backends, graph_size=doc["sched_params"]["graph_size"], debug=False).reserve(graph)
        return
    seen = {}
    for era, cls in ERAS.items():
        sizes, assigned = [], []
        for step in ("reserve", "split"):
            sc = load_scenario(doc, fill=False)
            s = cls(sc.backends, graph_size=doc["sched_params"]["graph_size"], parallel=doc["sched_params"]["parallel"],
                    debug=False)
            apply_pins(s, sc.gf.graph, doc, sc.backends)
            if step == "reserve":
                assert s.reserve(sc.gf.graph)
                sizes = [s.n_splits, *(s.get_buffer_size(b) for b in sc.backends)]
            else:
                s.split_graph(sc.gf.graph)
                assigned = [(s.get_tensor_backend(n).get_name(), s.get_cause(n)) for n in sc.gf.graph.nodes]
        seen[era] = sizes, assigned
    assert seen["2024"][0] == seen["2026"][0]
    pairs = list(zip(seen["2024"][1], seen["2026"][1], strict=True))
    assert all(a == b or (a[0] == b[0] and (a[1], b[1]) == ("1.vsrc", "1.dst")) for a, b in pairs)
