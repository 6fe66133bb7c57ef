"""pytest set-up: `--long` (the sweeps run over many more random graphs: `make test-long`), and a header
line that says which real ggml the differential tests compare with, and how (bit for bit, or within
the documented tolerance)."""

import os
import tempfile

import pytest

import ggml_oracle as O

# The exercises' progress record: a test that answers or checks an exercise writes to a temporary file, never
# to the learner's ~/.ggml_lite (tools/run_tests.py sets one for every part; this covers a bare pytest).
os.environ.setdefault("GGML_LITE_PROGRESS", os.path.join(tempfile.mkdtemp(prefix="ggml_lite-progress-"),
                                                         "progress.json"))


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False,
                     help="run the random-graph sweeps over many more graphs (make test-long)")


@pytest.fixture(scope="session")
def long_run(request) -> bool:
    """True under `--long`: a sweep scales its graph count up (the default run keeps a few hundred)."""
    return request.config.getoption("--long")


def pytest_report_header(config):
    return f"oracle: {O.describe_build()}"
