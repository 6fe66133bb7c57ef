"""The course in a real browser: every notebook run in JupyterLab under headless Chromium.

For every committed notebook: open it and see its committed figures as pictures (a notebook nobody ran
here is not trusted, so the PNG kept beside each figure is what shows, as on GitHub); clear it, run all
cells, and assert that no cell shows an error or writes to stderr and that every figure renders (a
plotly plot with its SVG). For every stepper (a play button and a slider): press the slider's right arrow
and see the step and the shown frame change; press play and see them change again. The chapter-10
widget (sliders only) must redraw when its first slider moves.

Runs only where a Chromium is installed (see conftest.py); `make test` says when it skipped it.
"""

from pathlib import Path

import pytest

from ui.lab import APP, CHECKED, KERNEL_READY, PANEL

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
PLOTLY = "application/vnd.plotly.v1+json"

ALL_RUN = f"""() => {{
    const cells = {PANEL}.content.model.cells;
    for (let i = 0; i < cells.length; i++) {{
        const c = cells.get(i);
        if (c.type === 'code' && c.sharedModel.getSource().trim() && !c.executionCount) return false;
    }}
    return {PANEL}.sessionContext.session.kernel.status === 'idle';
}}"""
OUTPUTS = f"""() => {{
    const cells = {PANEL}.content.model.cells, out = [];
    for (let i = 0; i < cells.length; i++) {{
        const c = cells.get(i);
        if (c.type === 'code') out.push(c.outputs.toJSON());
    }}
    return out;
}}"""
# plotly's own renderer shows the stored PNG (img.plot-img) for an untrusted output; JupyterLab's image one, img
PICTURES = "() => document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output img').length"
RENDERED = "() => Array.from(document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .js-plotly-plot'))" \
           ".filter(p => p.querySelector('svg.main-svg')).length"


def plotly_outputs(cells) -> int:
    return sum(PLOTLY in out.get("data", {}) for outs in cells for out in outs)


def wait_for_change(page, locator, before: str, what: str, timeout_ms: int = 15000) -> str:
    """Poll `locator`'s text until it differs from `before`; fail naming `what` if it never does."""
    step = 100
    for _ in range(timeout_ms // step):
        now = locator.text_content()
        if now != before:
            return now
        page.wait_for_timeout(step)
    raise AssertionError(f"{what}: still {before[:120]!r} after {timeout_ms / 1000:.0f} s")


def check_stepper(page, box, where: str) -> None:
    """Slider one step right, then play: the readout and the frame must change each time."""
    readout, frame = box.locator(".widget-readout").first, box.locator(".widget-output").first
    step0, frame0 = readout.text_content(), frame.text_content()
    box.locator(".noUi-handle").first.focus()
    page.keyboard.press("ArrowRight")
    step1 = wait_for_change(page, readout, step0, f"{where}: the slider's step after ArrowRight")
    frame1 = wait_for_change(page, frame, frame0, f"{where}: the frame after the slider moved")
    box.locator(".widget-play button").first.click()  # play
    step2 = wait_for_change(page, readout, step1, f"{where}: the step after play")
    wait_for_change(page, frame, frame1, f"{where}: the frame after play")
    box.locator(".widget-play button").nth(1).click()  # stop
    assert int(step2) > int(step1) > int(step0), (where, step0, step1, step2)


def check_slider_widget(page, box, where: str) -> None:
    """A widget of sliders only: moving its first slider must redraw its output."""
    frame = box.locator(".widget-output").first
    before = frame.text_content()
    box.locator(".noUi-handle").first.focus()
    page.keyboard.press("ArrowRight")
    wait_for_change(page, frame, before, f"{where}: the output after its first slider moved")


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_runs_and_its_figures_and_widgets_work(lab, browser, notebook):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(lab.url(notebook))
        page.wait_for_function(KERNEL_READY, timeout=60000)
        committed = plotly_outputs(page.evaluate(OUTPUTS))
        if committed:  # untrusted, the committed figures show as their PNGs; run, they are drawn by plotly
            page.wait_for_function(f"() => ({PICTURES})() >= {committed}", timeout=30000)
        page.evaluate(f"{APP}.commands.execute('notebook:clear-all-cell-outputs')")
        page.evaluate(f"{APP}.commands.execute('notebook:run-all-cells')")
        page.wait_for_function(ALL_RUN, timeout=240000, polling=250)
        cells = page.evaluate(OUTPUTS)
        errors = [f"code cell {i}: {o.get('ename', '')}: {o.get('evalue', '')}" if o["output_type"] == "error"
                  else f"code cell {i} wrote to stderr: {''.join(o['text'])[:200]}"
                  for i, outs in enumerate(cells) for o in outs
                  if o["output_type"] == "error" or (o["output_type"] == "stream" and o["name"] == "stderr")]
        assert not errors, f"{notebook}:\n" + "\n".join(errors)
        figures = plotly_outputs(cells)
        steppers = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .widget-vbox", has=page.locator(".widget-play"))
        sliders_only = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .widget-vbox",
                                    has=page.locator(".widget-hslider"), has_not=page.locator(".widget-play"))
        # figures inside widget outputs are drawn too: at least one more per widget
        want = figures + steppers.count() + sliders_only.count()
        page.wait_for_function(f"() => ({RENDERED})() >= {want}", timeout=60000)
        for k in range(steppers.count()):
            check_stepper(page, steppers.nth(k), f"{notebook} stepper {k}")
        for k in range(sliders_only.count()):
            check_slider_widget(page, sliders_only.nth(k), f"{notebook} widget {k}")
        CHECKED["notebooks"] += 1
        CHECKED["cells"] += len(cells)
        CHECKED["figures"] += page.evaluate(RENDERED)
        CHECKED["committed figures"] += committed
        CHECKED["steppers"] += steppers.count()
        CHECKED["other widgets"] += sliders_only.count()
    finally:
        page.close()
