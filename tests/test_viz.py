"""The stepper scaffold shared by the course's three steppers (viz.memory.step_widget), driven without
a browser: moving the slider renders that step; every step of a real trace renders."""

import contextlib
import io

import ggml_lite as gl
from ggml_lite.viz.memory import step_widget, stepper


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
    """viz.report: the bars have the four parts per device, and moving n_gpu_layers re-plans (the GPU's
    weights grow with the layers offloaded)."""
    from ggml_lite.models.llama import PRESETS
    from ggml_lite.report import memory_report
    from ggml_lite.viz.report import report_figure, report_widget

    rep = memory_report(PRESETS["tinyllama-1.1b"], 512, n_gpu_layers=10, devices=1)
    fig = report_figure(rep)
    assert [t.name for t in fig.data] == ["weights", "kv", "output", "compute"] and list(fig.data[0].x) == ["GPU0", "CPU"]
    import ggml_lite.viz.report as vr

    asked = []
    monkeypatch.setattr(vr, "memory_report", lambda *a, **kw: asked.append(kw["n_gpu_layers"]) or memory_report(*a, **kw))
    widget = report_widget(PRESETS["tinyllama-1.1b"], n_gpu_layers=0)
    n_ctx, n_ubatch, layers = widget.children[0].children
    with contextlib.redirect_stdout(io.StringIO()):
        layers.value = 23
        n_ctx.value = 1024
    assert layers.max == 23 and asked == [0, 23, 23]  # planned at start, then at every move
