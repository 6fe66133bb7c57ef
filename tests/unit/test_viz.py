"""The stepper scaffold shared by the course's three steppers (viz.memory.step_widget), driven without
a browser: moving the slider renders that step; every step of a real trace renders. Chapter 05's
timeline (trace, viz.timeline): its peak of live bytes is chapter 11's lower bound, never above ggml's plan,
also when ggml places a tensor twice."""

import contextlib
import io

import ggml_lite as gl
import ggml_oracle as O
from ggml_lite import planners as P
from ggml_lite.trace import lifetimes, live_bytes, trace_plan
from ggml_lite.viz.memory import step_widget, stepper
from ggml_lite.viz.timeline import memory_timeline
from helpers import SEED_FILES, fixture_path, graph_sections, load_json


def test_the_slider_renders_the_step_it_shows():
    seen = []
    widget = step_widget(5, seen.append, label="state")
    play, slider = widget.children[0].children
    assert (play.max, slider.max, slider.description) == (4, 4, "state")
    slider.value = 3
    slider.value = 1
    assert seen == [0, 3, 1]


def test_every_step_of_an_allocator_trace_renders():
    trace = []
    dyn = gl.DynTAllocr(alignment=32, trace=trace.append)
    a = dyn.alloc(100, None)
    dyn.alloc(64, None)
    dyn.free_tensor(a, 100, None)
    widget = stepper(trace)
    slider = widget.children[0].children[1]
    with contextlib.redirect_stdout(io.StringIO()):
        for k in range(slider.max + 1):
            slider.value = k
    assert slider.max == len(trace) - 1 >= 2


def test_the_report_widget_replans_when_a_slider_moves(monkeypatch):
    """viz.report: the left panel stacks the four parts per device, the right one shows the three beside
    the weights, each labelled with its size; moving n_gpu_layers re-plans (the GPU's weights grow with
    the layers offloaded), and so does the flash attention box."""
    from ggml_lite.models.llama import PRESETS
    from ggml_lite.report import memory_report
    from ggml_lite.viz.report import report_figure, report_widget

    rep = memory_report(PRESETS["tinyllama-1.1b"], 512, n_gpu_layers=10, devices=1)
    fig = report_figure(rep)
    left = [t for t in fig.data if t.type == "bar" and t.xaxis == "x"]
    right = [t for t in fig.data if t.type == "bar" and t.xaxis == "x2"]
    assert [t.name for t in left] == ["weights", "kv", "output", "compute"]
    assert [t.name for t in right] == ["kv", "output", "compute"]
    assert all(list(t.y) == ["GPU0", "CPU"] for t in left + right)
    gpu = rep.devices[0]
    assert right[0].text[0] == f"kv {gpu['kv'] / 2**20:.2f} MiB" and right[1].text[0] == "output 0"
    assert list(right[2].customdata) == [d["compute"] / 2**20 for d in rep.devices]  # the exact MiB, hovered
    import ggml_lite.viz.report as vr

    asked = []
    monkeypatch.setattr(vr, "memory_report", lambda *a, **kw: asked.append((kw["n_gpu_layers"], kw["flash_attn"]))
                        or memory_report(*a, **kw))
    widget = report_widget(PRESETS["tinyllama-1.1b"], n_gpu_layers=0)
    n_ctx, n_ubatch, layers, flash = widget.children[0].children
    with contextlib.redirect_stdout(io.StringIO()):
        layers.value = 23
        n_ctx.value = 1024
        flash.value = True
    assert layers.max == 23 and flash.description == "flash attention"
    assert asked == [(0, False), (23, False), (23, False), (23, True)]  # planned at start, then at every move


# -- the timeline's peak of live bytes ---------------------------------------------------------------

# Seeds of random_graph (max_ops=40) in which an INPUT node takes a parent in place while gallocr counts
# children, and ggml places that parent a second time (12 of the 50 found in seeds 0..9999).
PLACED_TWICE = (615, 962, 1096, 1823, 1950, 1984, 2328, 2340, 2426, 2786, 2793, 3267)


def _peaks(seed: int) -> tuple:
    """(peak of live bytes, ggml's peak, chapter 11's lower bound, lifetimes) of random_graph(seed)."""
    graph = O.random_graph(seed).graph
    galloc, events = trace_plan(graph)
    lts = lifetimes(graph, events)
    live = max(live_bytes(lts, len(graph.nodes)))
    return live, galloc.get_buffer_size(0) - 32, P.blocks_of(O.random_graph(seed).graph).lower_bound, lts


def test_a_tensor_placed_twice_is_counted_once():
    """random_graph(615): INPUT node_12 takes leaf inp1's block (3104) in place while counting, and inp1
    is placed again at 8544. Only the last placement counts: the peak is ggml's own 16,928 B (it was
    18,976 B, above the buffer), chapter 11's lower bound; the timeline draws inp1 once."""
    live, ggml_peak, lower_bound, lts = _peaks(615)
    assert live == lower_bound == ggml_peak == 16928
    inp1 = [(lt.offset, lt.superseded) for lt in lts if lt.kind == "tensor" and lt.tensor.name == "inp1"]
    assert inp1 == [(3104, True), (8544, False)]
    graph = O.random_graph(615).graph
    galloc, events = trace_plan(graph)
    fig = memory_timeline(graph, events, galloc.get_buffer_size(0))
    hovers = [h for t in fig.data if t.hovertext for h in t.hovertext]
    assert [h.split("<br>")[1] for h in hovers if h.startswith("inp1 ")] == ["2048 B at 8544"]
    assert len(hovers) == sum(lt.kind == "tensor" and not lt.superseded for lt in lts)
    assert [s.y0 for s in fig.layout.shapes] == [16928, 16928 + 32]  # the peak line, then the buffer


def test_peak_live_is_the_lower_bound_on_random_graphs(long_run):
    """On ~200 random graphs (10,000 with --long), 12 with a tensor placed twice: the peak of live bytes
    equals chapter 11's lower bound and never exceeds ggml's peak."""
    seeds = range(10_000) if long_run else sorted(set(range(188)) | set(PLACED_TWICE))
    twice = 0
    for seed in seeds:
        live, ggml_peak, lower_bound, lts = _peaks(seed)
        assert live == lower_bound <= ggml_peak, seed
        twice += any(lt.superseded for lt in lts)
    assert twice >= len(PLACED_TWICE)


def test_peak_live_is_the_lower_bound_on_every_recorded_graph():
    """Every graph of tests/fixtures/ggml-seed (each step of the sequences 11 and 12): the peak of live
    bytes equals chapter 11's lower bound and never exceeds ggml's peak."""
    checked = 0
    for name in SEED_FILES:
        for step, _ in graph_sections(load_json(fixture_path("ggml-seed", name))):
            gf = gl.read_graph_file(fixture_path("ggml-seed", name), step)
            gl.graphio.allocate_external(gf)
            problem = P.blocks_of(gf.graph)
            live = max(live_bytes(lifetimes(problem.graph, problem.events), len(problem.graph.nodes)))
            assert live == problem.lower_bound <= problem.ggml_peak, (name, step)
            checked += 1
    assert checked == 23
