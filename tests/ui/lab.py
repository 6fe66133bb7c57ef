"""A JupyterLab for the browser test: started on a copy of the notebooks, stopped by its PID.

`find_chromium()` names the system Chromium (the test never downloads a browser); `Lab` starts
`python -m jupyter lab` (this interpreter) on a free port with a random token, on a temporary copy of
`notebooks/` beside a link to `tests/` (the notebooks read `../tests/fixtures`), so that JupyterLab's
autosave can never touch the committed files. Its settings and workspaces live in the same temporary
folder: notebooks render every cell (no windowing, so every output is in the page), documents are never
autosaved (a test edits and runs cells, and nothing it does may be written back), and the app is exposed as
`window.jupyterapp` so the test can run commands and read the notebook model. The server, and so every
kernel it starts, runs with `GGML_LITE_PROGRESS` pointing into that folder: an exercise answered or checked
in the browser never writes the learner's ~/.ggml_lite.
"""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# the JupyterLab app (exposed by `Lab`), its current notebook panel, and "that notebook's kernel is idle"
APP = "window.jupyterapp"
PANEL = f"{APP}.shell.currentWidget"
KERNEL_READY = f"() => {APP} && {PANEL} && {PANEL}.sessionContext && {PANEL}.sessionContext.session " \
               f"&& {PANEL}.sessionContext.session.kernel && {PANEL}.sessionContext.session.kernel.status === 'idle'"

# what the browser test checked, counted by test_browser and printed by conftest at the end of the run
# (and by test_exercises_browser: the exercise outputs it read from the page)
CHECKED = {"notebooks": 0, "cells": 0, "figures": 0, "committed figures": 0, "steppers": 0, "other widgets": 0,
           "exercise outputs": 0}


def find_chromium() -> str | None:
    """The Chromium to drive: `$CHROMIUM` if set, else Debian's binary, else the first on PATH."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    # Debian's /usr/bin/chromium is a shell wrapper; the binary behind it takes playwright's flags as is
    if Path("/usr/lib/chromium/chromium").is_file():
        return "/usr/lib/chromium/chromium"
    return next((shutil.which(n) for n in CHROMIUM_NAMES if shutil.which(n)), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A running JupyterLab; `url(path)` for a page, `stop()` ends it (and its kernels) by PID."""

    def __init__(self, timeout: float = 60.0):
        self.tmp = Path(tempfile.mkdtemp(prefix="ggml_lite_ui_"))
        shutil.copytree(ROOT / "notebooks", self.tmp / "notebooks", ignore=shutil.ignore_patterns("*.py", ".*"))
        (self.tmp / "tests").symlink_to(ROOT / "tests")
        settings = self.tmp / "settings" / "@jupyterlab" / "notebook-extension"
        settings.mkdir(parents=True)
        (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
        docmanager = self.tmp / "settings" / "@jupyterlab" / "docmanager-extension"
        docmanager.mkdir(parents=True)
        (docmanager / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False}))
        self.progress = self.tmp / "progress.json"  # the exercises' record (ggml_lite.exercises)
        self.port, self.token = _free_port(), secrets.token_hex(16)
        cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={self.port}", "--ip=127.0.0.1",
               f"--ServerApp.token={self.token}", f"--notebook-dir={self.tmp / 'notebooks'}",
               f"--LabApp.user_settings_dir={self.tmp / 'settings'}",
               f"--LabApp.workspaces_dir={self.tmp / 'workspaces'}", "--LabApp.expose_app_in_browser=True"]
        if hasattr(os, "getuid") and os.getuid() == 0:
            cmd.append("--allow-root")
        self.log = open(self.tmp / "lab.log", "w")
        # a session of its own, so that stop() reaches the kernels JupyterLab starts, too
        env = {**os.environ, "GGML_LITE_PROGRESS": str(self.progress)}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        self.pid = self.proc.pid
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/status?token={self.token}", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"JupyterLab did not answer within {timeout:.0f} s:\n{self.log_tail()}")

    def url(self, notebook: str) -> str:
        return f"http://127.0.0.1:{self.port}/lab/tree/{notebook}?reset&token={self.token}"

    def log_tail(self, lines: int = 30) -> str:
        self.log.flush()
        return "\n".join((self.tmp / "lab.log").read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to the process group of the PID started here, SIGKILL after 10 s; then clean up."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        try:  # kernels still alive in the group (the server usually stops them itself)
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
