"""The command line (DESIGN §4): `python -m ggml_lite plan` and `check`, their output and exit codes.

Most tests call `ggml_lite.__main__.main` in-process (fast); one runs the module as a user would."""

import copy
import json
import subprocess
import sys

import pytest

from conftest import NEEDS_SHARED, ROOT, SEED_FILES, fixture_path, load_json
from ggml_lite.__main__ import main

pytestmark = NEEDS_SHARED


def _write(tmp_path, doc, name="graph.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("name", SEED_FILES)
def test_check_passes_on_every_fixture(name, capsys):
    assert main(["check", str(fixture_path("ggml-seed", name))]) == 0
    assert "plan identical to ggml's" in capsys.readouterr().out


def test_check_prints_the_first_differing_tensors_and_exits_1(tmp_path, capsys):
    doc = copy.deepcopy(load_json(fixture_path("ggml-seed", "06_llama_block")))
    moved = [t for t in doc["graph"]["tensors"] if t["offset"] is not None and t["view_src"] is None][:2]
    for t in moved:
        t["offset"] += 64
    assert main(["check", _write(tmp_path, doc)]) == 1
    out = capsys.readouterr().out
    assert "differs from the recorded one" in out
    assert all(t["name"] in out for t in moved), out


def test_check_with_numerics_computes_or_skips(tmp_path, capsys):
    """A file that records computed results: `check` computes them (here: none recorded, nothing to
    compare, still the plan is checked) unless --no-numerics is given. Real result files are checked in
    tests/test_numerics.py."""
    doc = copy.deepcopy(load_json(fixture_path("ggml-seed", "01_mlp_small")))
    doc.update(numeric=True, data_seed=1, numerics={"leaf_data": [], "results": []})
    path = _write(tmp_path, doc)
    assert main(["check", path]) == 0
    out = capsys.readouterr().out
    assert "plan identical" in out and "numerics: 0 result(s) computed on the CPU backend" in out
    assert main(["check", path, "--no-numerics"]) == 0
    assert "numerics: skipped" in capsys.readouterr().out
    del doc["data_seed"]
    assert main(["check", _write(tmp_path, doc)]) == 2
    assert "no `data_seed`" in capsys.readouterr().err


def test_plan_json_gives_every_offset_and_the_buffer_size(capsys):
    name = "06_llama_block"
    doc = load_json(fixture_path("ggml-seed", name))
    assert main(["plan", str(fixture_path("ggml-seed", name)), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["buffer_size"] == doc["buffer_size"]
    assert out["tensors"] == {t["name"]: {"offset": t["offset"]} for t in doc["graph"]["tensors"]}


def test_plan_text_and_sequence_steps(capsys):
    seq = str(fixture_path("ggml-seed", "11_realloc_sequence_grow"))
    assert main(["plan", seq]) == 2  # a sequence needs --step
    assert "pass --step" in capsys.readouterr().err
    assert main(["plan", seq, "--step", "0"]) == 0
    out = capsys.readouterr().out
    assert "compute buffer:" in out and "offset" in out.splitlines()[0]


@pytest.mark.parametrize("content, needle", [(None, "no such file"), ("{not json", "not JSON")])
def test_unusable_files_exit_2_with_a_message(tmp_path, capsys, content, needle):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    assert main(["check", str(path)]) == 2
    assert needle in capsys.readouterr().err


def test_the_module_runs_as_a_command():
    p = subprocess.run([sys.executable, "-m", "ggml_lite", "check", str(fixture_path("ggml-seed", "02_elementwise_inplace"))],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "plan identical" in p.stdout
