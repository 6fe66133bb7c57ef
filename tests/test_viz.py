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
