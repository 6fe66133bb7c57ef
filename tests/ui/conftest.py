"""Fixtures of the browser test: one JupyterLab and one headless Chromium for the whole run, and the
counts of what was checked, printed at the end of the run."""

import pytest

from ui.lab import CHECKED, Lab, find_chromium


def pytest_sessionfinish(session):
    """Under pytest-xdist (`make test` runs two workers) each worker hands its counts to the controller."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["checked"] = dict(CHECKED)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller adds up what each worker checked (an xdist hook: no xdist, never called)."""
    for key, n in getattr(node, "workeroutput", {}).get("checked", {}).items():
        CHECKED[key] += n


def pytest_terminal_summary(terminalreporter):
    if CHECKED["notebooks"]:
        c = CHECKED
        terminalreporter.write_line(
            f"browser test: {c['notebooks']} notebooks run in JupyterLab ({c['cells']} code cells, no error output), "
            f"{c['figures']} figures rendered ({c['committed figures']} shown as pictures from the committed files), "
            f"{c['steppers']} steppers stepped by slider and by play, {c['other widgets']} other widget(s) moved")
    if CHECKED["exercise outputs"]:
        terminalreporter.write_line(
            f"browser test: {CHECKED['exercise outputs']} runs of chapter 02's exercise cells in JupyterLab, their "
            "feedback read from the page (02.1 answered wrong then right, 02.3 checked failing then passing)")


@pytest.fixture(scope="session")
def chromium():
    path = find_chromium()
    if path is None:
        pytest.skip("no Chromium (Debian: apt-get install chromium; or set CHROMIUM)")
    return path


@pytest.fixture(scope="session")
def lab(chromium):
    server = Lab()
    yield server
    server.stop()
    assert server.proc.poll() is not None, f"JupyterLab (PID {server.pid}) is still running"


@pytest.fixture(scope="session")
def browser(chromium):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()
