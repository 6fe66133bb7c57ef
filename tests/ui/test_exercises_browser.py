"""The exercises in a real browser: chapter 02's answered and checked in JupyterLab under headless Chromium.

Opens notebooks/02_aligned_offsets.ipynb, runs the import cell of its Exercises section, then edits and runs
two exercise cells as a learner would, reading the feedback from the page (the text of the cell's output
area as rendered, not the notebook model):

* the prediction 02.1 (`answer("02.1", ...)`): left at `...` it says "not answered yet"; a wrong value
  says "not quite" and shows "Why:"; the right value (computed here with `ggml_lite.align`) says "right.";
* the implementation 02.3 (the cell `# exercise 02.3`): the stub as committed says "not done yet"; a
  solution that forgets the buffer's address "disagrees with ggml" and names the rule "address"; a right
  one has "passed".

Only the right answers are recorded as done, in a progress record of the test's own (the kernel's
`GGML_LITE_PROGRESS`; the lab's own record is in its temporary folder, see lab.py), never in ~/.ggml_lite;
the notebook is never saved: the committed file and JupyterLab's copy are byte for byte what they were.
Runs only where a Chromium is installed (see conftest.py), like test_browser.py.
"""

import hashlib
import json
from pathlib import Path

from ggml_lite.align import aligned_offset
from ui.lab import APP, CHECKED, KERNEL_READY, PANEL

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = "02_aligned_offsets.ipynb"
IMPORT = "from ggml_lite.exercises import"
PREDICT = 'answer("02.1",'
IMPLEMENT = "# exercise 02.3"

# a learner's solutions of 02.3: one that aligns the offset alone (the buffer's address forgotten), one right
WRONG_SOLUTION = '''# exercise 02.3
def aligned_offset(buffer, offset, alignment):
    return offset + (alignment - offset % alignment) % alignment


check("02.3", aligned_offset)
'''
RIGHT_SOLUTION = '''# exercise 02.3
from ggml_lite.errors import AlignmentError


def aligned_offset(buffer, offset, alignment):
    if alignment <= 0 or alignment & (alignment - 1):
        raise AlignmentError(f"alignment {alignment} is not a power of two")
    return offset + (alignment - ((buffer or 0) + offset) % alignment) % alignment


check("02.3", aligned_offset)
'''

SOURCES = f"() => Array.from({{length: {PANEL}.content.model.cells.length}}, " \
          f"(_, i) => {PANEL}.content.model.cells.get(i)).map(c => [c.type, c.sharedModel.getSource()])"
# put `source` (unless null) into cell i, select it alone and run it (the committed execution count cleared
# first: a fresh kernel's count can be lower); resolves once JupyterLab has run it
RUN_CELL = f"""([i, source]) => {{
    const notebook = {PANEL}.content, cell = notebook.model.cells.get(i);
    if (source !== null) cell.sharedModel.setSource(source);
    cell.executionCount = null;
    notebook.activeCellIndex = i;
    notebook.deselectAll();
    return {APP}.commands.execute('notebook:run-cell').then(() => true);
}}"""
RAN = f"""(i) => {PANEL}.content.model.cells.get(i).executionCount !== null
    && {PANEL}.sessionContext.session.kernel.status === 'idle'"""
# what the cell printed, as JupyterLab rendered it (the stream's text, not the value a last expression shows)
STDOUT = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stdout"]'
# the cell's outputs in the model: the test wants plain stdout, no error and no stderr
MODEL_OUTPUTS = f"(i) => {PANEL}.content.model.cells.get(i).outputs.toJSON()"
DIRTY = f"() => {PANEL}.context.model.dirty"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def find_cell(sources, start: str, what: str) -> int:
    hits = [i for i, (kind, src) in enumerate(sources) if kind == "code" and src.lstrip().startswith(start)]
    assert len(hits) == 1, f"{NOTEBOOK}: expected one code cell starting {start!r} ({what}), found {len(hits)} " \
                           "(is the .ipynb in sync with its .py? make sync)"
    return hits[0]


def run_cell(page, cell, i: int, source: str | None, shown: str | None, timeout_ms: int = 30000) -> str:
    """Run code cell i (its source replaced by `source` unless None) and return its output as the page
    shows it, once it contains `shown` (None: no output expected); fail with what the page shows if not."""
    page.evaluate(RUN_CELL, [i, source])
    page.wait_for_function(RAN, arg=i, timeout=timeout_ms, polling=100)
    outputs = page.evaluate(MODEL_OUTPUTS, i)
    bad = [o for o in outputs if o["output_type"] == "error" or o.get("name") == "stderr"]
    assert not bad, f"{NOTEBOOK} cell {i}: {bad}"
    if shown is None:
        return ""
    printed = cell.locator(STDOUT)
    text = ""
    for _ in range(timeout_ms // 100):  # the model has it; the page renders it a moment later
        text = "".join(printed.all_inner_texts())
        if shown in text:
            break
        page.wait_for_timeout(100)
    shows = cell.locator(".jp-OutputArea").inner_text() if cell.locator(".jp-OutputArea").count() else ""
    assert shown in text, f"{NOTEBOOK} cell {i}: the page prints {text!r}, not {shown!r} (its output area: {shows!r})"
    assert printed.first.is_visible(), f"{NOTEBOOK} cell {i}: the printed output is hidden"
    return text


def progress(kernel_record: Path) -> dict:
    return json.loads(kernel_record.read_text())["done"] if kernel_record.exists() else {}


def test_exercises_give_their_feedback_in_the_page(lab, browser, tmp_path):
    committed, copy = ROOT / "notebooks" / NOTEBOOK, lab.tmp / "notebooks" / NOTEBOOK
    home_record = Path.home() / ".ggml_lite" / "progress.json"
    home_before = home_record.stat().st_mtime_ns if home_record.exists() else None
    disk_before = sha256(committed), sha256(copy)
    record = tmp_path / "progress.json"  # this test's record: what it marks done, and nothing else
    right = aligned_offset(0x1004, 100, 32)
    wrong = aligned_offset(None, 100, 32)  # the offset aligned alone: the tempting answer
    assert wrong != right

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(lab.url(NOTEBOOK))
        page.wait_for_function(KERNEL_READY, timeout=60000)
        sources = page.evaluate(SOURCES)
        cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")
        assert cells.count() == len(sources), (cells.count(), len(sources))
        imports = find_cell(sources, IMPORT, "the Exercises section's import")
        predict = find_cell(sources, PREDICT, "prediction 02.1")
        implement = find_cell(sources, IMPLEMENT, "the stub of 02.3")
        assert imports < predict < implement
        # the lab's kernels record in the lab's temporary folder; this test's, in a file of its own (set
        # through the kernel directly: the notebook's cells stay as they are)
        kernel = f"{PANEL}.sessionContext.session.kernel"
        seen = page.evaluate(f"(e) => {kernel}.requestExecute({{code: '', user_expressions: {{p: e}}}}).done"
                             ".then(m => m.content.user_expressions.p.data['text/plain'])",
                             "__import__('os').environ.get('GGML_LITE_PROGRESS')")
        assert seen == repr(str(lab.progress)), f"the kernel's GGML_LITE_PROGRESS is {seen}, not {lab.progress}"
        page.evaluate(f"(code) => {kernel}.requestExecute({{code}}).done.then(() => true)",
                      f"__import__('os').environ['GGML_LITE_PROGRESS'] = {str(record)!r}")
        ran = []

        run_cell(page, cells.nth(imports), imports, None, None, 60000)
        text = run_cell(page, cells.nth(predict), predict, None, "not answered yet")
        ran.append("02.1 as committed (...): not answered yet")

        text = run_cell(page, cells.nth(predict), predict, f'answer("02.1", {wrong})', "not quite")
        assert "Why:" in text and "right." not in text, text
        assert "02.1" not in progress(record), "a wrong answer was recorded as done"
        ran.append(f"02.1 = {wrong}: not quite, Why: shown")

        text = run_cell(page, cells.nth(predict), predict, f'answer("02.1", {right})', "right.")
        assert "Why:" in text and "not quite" not in text, text
        assert "02.1" in progress(record), "the right answer was not recorded as done"
        ran.append(f"02.1 = {right}: right., Why: shown")

        run_cell(page, cells.nth(implement), implement, None, "not done yet")
        ran.append("02.3 stub as committed: not done yet")

        text = run_cell(page, cells.nth(implement), implement, WRONG_SOLUTION, "disagree with ggml")
        assert "rule: address" in text and "ggml:" in text and "yours:" in text and "passed" not in text, text
        assert "02.3" not in progress(record), "a wrong solution was recorded as done"
        verdict = next(ln for ln in text.splitlines() if "disagree" in ln).split(": ", 1)[1].split(".")[0]
        ran.append(f"02.3 ignoring the buffer: {verdict}, rule: address")

        text = run_cell(page, cells.nth(implement), implement, RIGHT_SOLUTION, "passed")
        assert "disagree" not in text, text
        assert "02.3" in progress(record), "a passing solution was not recorded as done"
        ran.append("02.3 right: " + text.strip().split(": ", 1)[1])

        assert page.evaluate(DIRTY), "the edited notebook should be unsaved (dirty) in the page"
    finally:
        page.close()
    assert (sha256(committed), sha256(copy)) == disk_before, "the notebook was written to disk"
    assert (home_record.stat().st_mtime_ns if home_record.exists() else None) == home_before, \
        f"{home_record} was written"
    CHECKED["exercise outputs"] += len(ran)
    print(f"\nbrowser test, exercises in {NOTEBOOK} (feedback read from the page):\n  " + "\n  ".join(ran)
          + "\n  recorded as done: only the right answers, in a temporary record; the notebook not saved")
