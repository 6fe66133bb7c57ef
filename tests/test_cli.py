"""The command line (DESIGN §4): `python -m ggml_lite plan` and `check`, their output and exit codes.

Most tests call `ggml_lite.__main__.main` in-process (fast); one runs the module as a user would."""

import copy
import json
import subprocess
import sys

import pytest

from helpers import ROOT, SEED_FILES, fixture_path, load_json
from ggml_lite.__main__ import main


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
    assert "expected `data_generator.data_seed`" in capsys.readouterr().err


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


# -- unusable inputs: a specific message and exit 2, never a traceback or exit 1 ----------------------

@pytest.mark.parametrize("command", ["plan", "check", "sched"])
@pytest.mark.parametrize("content, needle", [
    ("[1, 2, 3]", "the top level is a JSON list, expected an object"),
    ('"text"', "the top level is a JSON str, expected an object"),
    ("42", "the top level is a JSON int, expected an object"),
])
def test_a_top_level_that_is_not_an_object_exits_2(tmp_path, capsys, command, content, needle):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["plan", "check", "sched"])
def test_a_directory_is_named_as_such(tmp_path, capsys, command):
    assert main([command, str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a directory" in err and "no such file" not in err


@pytest.mark.parametrize("command", ["plan", "check"])
def test_plan_and_check_point_a_scenario_to_sched(capsys, command):
    path = str(fixture_path("ggml-seed-sched", "03_partial_offload"))
    assert main([command, path]) == 2
    err = capsys.readouterr().err
    assert "is a scheduler scenario" in err and "python -m ggml_lite sched" in err
    assert "sequence of 0 graphs" not in err


@pytest.mark.parametrize("check", [False, True])
def test_a_scenario_without_outcome_names_the_field(tmp_path, capsys, check):
    doc = load_json(fixture_path("ggml-seed-sched", "03_partial_offload"))
    del doc["outcome"]
    assert main(["sched", _write(tmp_path, doc)] + (["--check"] if check else [])) == 2
    err = capsys.readouterr().err
    assert "no `outcome` object" in err and "KeyError" not in err


def test_a_scenario_missing_a_section_names_it(tmp_path, capsys):
    doc = load_json(fixture_path("ggml-seed-sched", "03_partial_offload"))
    del doc["weights"], doc["pins"]
    assert main(["sched", _write(tmp_path, doc), "--check"]) == 2
    assert "needs `weights`, `pins`" in capsys.readouterr().err


def test_a_graph_file_given_to_sched_is_refused(capsys):
    assert main(["sched", str(fixture_path("ggml-seed", "01_mlp_small"))]) == 2
    assert "not a scheduler scenario (schema 'ggml-gallocr-fixture'" in capsys.readouterr().err


def test_a_json_object_that_is_no_graph_file(tmp_path, capsys):
    assert main(["plan", _write(tmp_path, {"schema": "something-else"})]) == 2
    assert "no `graph` and no `steps`" in capsys.readouterr().err


def test_sched_help_explains_every_cause_code():
    from ggml_lite.sched import CAUSES

    p = subprocess.run([sys.executable, "-m", "ggml_lite", "sched", "--help"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 0
    for code in ("usr", "1.dst", "1.vsrc", "1.inp", "1.wgtN", "1.off", "2.sup", "3.upg", "3.best", "4.vsrc",
                 "4.cur", "4.cpy"):
        assert code in CAUSES and f"  {code} " in p.stdout, code
    assert "cut to 20 characters" in p.stdout


def test_every_cause_the_scheduler_sets_is_explained():
    """The legend cannot fall behind the code: every cause string sched.py assigns is in CAUSES."""
    import re

    src = (ROOT / "ggml_lite" / "sched.py").read_text()
    set_causes = set(re.findall(r'causes\[\w+\] = f?"([^"]+)"', src))
    from ggml_lite.sched import CAUSES

    assert set_causes and {c.replace("{i}", "N") for c in set_causes} <= set(CAUSES)


def test_llama_json_report(capsys):
    """`llama --json`: the documented schema, sizes in bytes, llama.cpp's numbers for Llama-2 7B on one GPU."""
    assert main(["llama", "--preset", "llama-2-7b", "--n-gpu-layers", "33", "--devices", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"model", "context", "graph", "devices", "peak"}
    assert doc["peak"]["GPU0"]["node"] == "result_output" and doc["peak"]["GPU0"]["live"][0]["name"] == "result_output"
    assert doc["graph"] == {"nodes": 1030, "splits": 2, "n_copies": 1}
    gpu, cpu = doc["devices"]
    assert (gpu["name"], cpu["name"]) == ("GPU0", "CPU")
    assert f"{gpu['compute'] / 2**20:.2f}" == "70.50" and f"{cpu['compute'] / 2**20:.2f}" == "9.01"
    assert gpu["kv"] == 256 * 2**20 and gpu["total"] == gpu["weights"] + gpu["kv"] + gpu["output"] + gpu["compute"]


def test_llama_text_report_prints_llama_cpp_lines(capsys):
    assert main(["llama", "--preset", "llama-2-7b", "--n-ctx", "2048"]) == 0
    out = capsys.readouterr().out
    assert "CPU compute buffer size =   164.01 MiB" in out and "graph nodes  = 1030" in out


@pytest.mark.parametrize("argv, message", [
    (["llama", "--preset", "llama-9-1b"], "unknown preset 'llama-9-1b'"),
    (["llama", "--n-vocab", "100"], "missing --n-embd"),
    (["llama", "--n-vocab", "100", "--n-embd", "100", "--n-layer", "2", "--n-head", "3", "--n-ff", "8"], "n_head 3 must divide"),
    (["llama", "--preset", "llama-2-7b", "--n-ctx", "-5"], "--n-ctx must be positive"),
    (["llama", "--preset", "llama-2-7b", "--devices", "2", "--n-gpu-layers", "33", "--tensor-split", "1,x"], "--tensor-split"),
    (["llama", "--preset", "llama-2-7b", "--n-gpu-layers", "-1", "--devices", "1"], "cannot be negative"),
    (["llama", "--preset", "llama-2-7b", "--type-k", "q9"], "type_k 'q9'"),
    (["llama", "--preset", "llama-2-7b", "--type-v", "q8_0"], "V cache quantization requires flash attention"),
    (["llama", "--preset", "llama-2-7b", "--wtype", "i32"], "weights cannot be of type i32"),
    (["llama", "--preset", "llama-2-7b", "--fit"], "--fit needs --vram"),
])
def test_llama_bad_input_exits_2(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_llama_fit_finds_the_largest_offload_then_context(capsys):
    """`--fit`: the answer fits, one more layer (at the asked n_ctx) or 32 more cells do not."""
    from ggml_lite.models.llama import PRESETS
    from ggml_lite.report import fits, memory_report

    assert main(["llama", "--preset", "llama-2-7b", "--devices", "1", "--vram", "8", "--fit", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["fit"]
    p, layers, n_ctx = PRESETS["llama-2-7b"], got["n_gpu_layers"], got["n_ctx"]
    assert 0 < layers < 33 and n_ctx >= 512 and n_ctx % 32 == 0
    assert fits(memory_report(p, n_ctx, n_gpu_layers=layers, devices=1), 8)
    assert not fits(memory_report(p, 512, n_gpu_layers=layers + 1, devices=1), 8)
    assert not fits(memory_report(p, n_ctx + 32, n_gpu_layers=layers, devices=1), 8)
