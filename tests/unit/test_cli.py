"""The command line (DESIGN §4): `python -m ggml_lite plan` and `check`, their output and exit codes.

Most tests call `ggml_lite.__main__.main` in-process (fast); one runs the module as a user would."""

import copy
import json
import subprocess
import sys

import pytest

from ggml_lite import errors
from ggml_lite.__main__ import main
from helpers import ROOT, SEED_FILES, fixture_path, load_json


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


def test_check_with_numerics_refuses_nothing_to_compare_or_skips(tmp_path, capsys):
    """A file that says it records computed results but records none: `check` refuses it (exit 2: there is
    nothing to compare, it is not "identical") unless --no-numerics is given. Real result files are
    checked in tests/differential/test_numerics.py."""
    doc = copy.deepcopy(load_json(fixture_path("ggml-seed", "01_mlp_small")))
    leafs = [{"id": i, "name": e["name"], "type": e["type"], "kind": "float"}
             for i, e in enumerate(doc["graph"]["tensors"]) if e["graph_role"] == "leaf"]
    doc.update(numeric=True, data_seed=1, numerics={"leaf_data": leafs, "results": []})
    path = _write(tmp_path, doc)
    assert main(["check", path]) == 2
    err = capsys.readouterr().err
    assert "numerics.results: expected at least one result (an empty list leaves nothing to compare)" in err
    assert main(["check", path, "--no-numerics"]) == 0
    out = capsys.readouterr().out
    assert "plan identical" in out and "numerics: skipped" in out
    del doc["data_seed"]
    last = doc["graph"]["tensors"][doc["graph"]["nodes"][-1]]
    n = last["ne"][0] * last["ne"][1] * last["ne"][2] * last["ne"][3]
    doc["numerics"]["results"] = [{"id": last["id"], "name": last["name"], "type": last["type"], "ne": last["ne"],
                                   "n_elements": n, "values": [0.0] * n}]
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
    path = fixture_path("ggml-seed", "02_elementwise_inplace")
    p = subprocess.run([sys.executable, "-m", "ggml_lite", "check", str(path)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "plan identical" in p.stdout


# -- unusable inputs: a specific message and exit 2, never a traceback or exit 1 ----------------------

@pytest.mark.parametrize("command", ["plan", "check", "sched"])
@pytest.mark.parametrize("content, needle", [
    ("[1, 2, 3]", "the top level is a JSON array, expected an object"),
    ('"text"', "the top level is a JSON string, expected an object"),
    ("42", "the top level is a JSON number, expected an object"),
    ("null", "the top level is a JSON null, expected an object"),  # (not "a JSON NoneType")
    ("true", "the top level is a JSON true/false, expected an object"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # json would raise RecursionError
    ('{"schema": NaN}', "schema: expected a finite number, found NaN"),  # json would accept these
    ('{"a": [1, -Infinity]}', "a[1]: expected a finite number, found -Infinity"),
])
def test_a_top_level_that_is_not_an_object_exits_2(tmp_path, capsys, command, content, needle):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and "internal error" not in err, err


@pytest.mark.parametrize("command", ["plan", "check", "sched"])
@pytest.mark.parametrize("text, path", [
    ('{"schema_version": 99, "schema_version": 1}', "the top level"),  # (the last value won: check exited 0)
    ('{"graph": {"tensors": [{"offset": 0, "id": 1, "offset": 64}]}}', "graph.tensors[0]"),
    ('{"a": [{"b": {"c": 1, "c": 1}}]}', "a[0].b"),  # (even with equal values)
])
def test_a_key_given_twice_is_refused_with_its_object_path(tmp_path, capsys, command, text, path):
    """A repeated key is refused at parse time, naming the object's JSON path and the key."""
    fixture = load_json(fixture_path("ggml-seed", "01_mlp_small"))
    p = tmp_path / "dup.json"
    if text.startswith('{"schema_version"'):  # in a fixture that is valid without the first value
        assert '"schema_version": 1,' in json.dumps(fixture)
        text = json.dumps(fixture).replace('"schema_version": 1', text[1:-1], 1)
    p.write_text(text)
    assert main([command, str(p)]) == 2
    err = capsys.readouterr().err
    key = "schema_version" if "schema_version" in text else "offset" if "offset" in text else "c"
    assert f"{path}: expected each key once in an object, found the key '{key}' more than once" in err, err


@pytest.mark.parametrize("command", ["plan", "check", "sched"])
@pytest.mark.parametrize("path, what", [("/dev/zero", "a character device"), ("/dev/null", "a character device"),
                                        ("FIFO", "a FIFO"), ("-", "no such file (standard input is not read"),
                                        ("/proc/self/mem", "cannot be read (Input/output error)")])
def test_special_files_are_named_for_what_they_are(tmp_path, capsys, command, path, what):
    """/dev/zero, /dev/null, a FIFO (never opened for a blocking read: this test would hang) and `-`."""
    import os

    if path == "FIFO":
        path = str(tmp_path / "pipe.json")
        os.mkfifo(path)
    assert main([command, path]) == 2
    err = capsys.readouterr().err
    assert what in err and (what.startswith("no such") or "no such file" not in err), err


@pytest.mark.parametrize("command", ["plan", "check", "sched"])
def test_a_file_above_the_size_cap_is_refused_before_it_is_read(tmp_path, capsys, command, monkeypatch):
    """A sparse file of 1 TiB (os.truncate: no disk, no memory) is refused by its size, before a byte is
    read (reading it is made to fail)."""
    import os

    from ggml_lite import untrusted

    p = tmp_path / "huge.json"
    p.write_text("{}")
    os.truncate(p, 2**40)
    monkeypatch.setattr(untrusted.os, "open", lambda *a, **k: pytest.fail("opened a file above the cap"))
    assert main([command, str(p)]) == 2
    err = capsys.readouterr().err
    assert f"expected a JSON file of at most 32 MiB, found {2**40:,} bytes" in err, err
    assert untrusted.MAX_JSON_BYTES == 32 * 2**20


def test_a_file_at_the_size_cap_is_read(tmp_path, capsys):
    """The cap refuses only what is above it: a document of exactly MAX_JSON_BYTES parses (and is then
    judged as a graph file)."""
    from ggml_lite.untrusted import MAX_JSON_BYTES

    p = tmp_path / "padded.json"
    text = '{"pad": ""}'
    p.write_text(text[:-2] + " " * (MAX_JSON_BYTES - len(text)) + text[-2:])
    assert p.stat().st_size == MAX_JSON_BYTES
    assert main(["plan", str(p)]) == 2
    assert "no `graph` and no `steps`" in capsys.readouterr().err


def test_a_long_name_is_quoted_in_part(tmp_path, capsys):
    """A 100,000-character tensor name is quoted by its first 60 characters and its length."""
    doc = load_json(fixture_path("ggml-seed", "01_mlp_small"))
    doc["graph"]["tensors"][1]["name"] = "n" * 100_000
    doc["graph"]["tensors"][1]["type"] = "f99"
    assert main(["check", _write(tmp_path, doc)]) == 2
    err = capsys.readouterr().err
    assert f"{'n' * 60!r}... (100,000 chars)" in err and len(err) < 1000, err[:2000]


def test_a_memory_error_is_named_and_exits_2(tmp_path, capsys, monkeypatch):
    """Running out of memory anywhere gets its own message and exit 2, not the last-resort handler."""
    import ggml_lite.__main__ as cli

    def exhausted(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(cli, "validate_document", exhausted)
    path = str(fixture_path("ggml-seed", "01_mlp_small"))
    assert main(["check", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: AllocationError: {path}: not enough memory") and "internal error" not in err, err
    assert "--max-gib" in err


@pytest.mark.parametrize("command", [["plan", "--verify"], ["check"]])
def test_max_gib_above_the_machines_memory_is_refused(capsys, command):
    """`plan --verify --max-gib 100` ran out of memory on a small machine: a --max-gib above the physical
    memory is refused before anything is read."""
    import os

    phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    path = str(fixture_path("ggml-seed", "14_llama7b_ctx512_one_output"))
    with pytest.raises(SystemExit) as e:
        main([command[0], path, *command[1:], "--max-gib", str(phys * 2)])
    assert e.value.code == 2
    assert "this machine's physical memory" in capsys.readouterr().err


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
    (["llama", "--preset", "llama-9-1b"], "preset (--preset): expected one of llama-2-7b, llama-2-13b"),
    (["llama", "--n-vocab", "100"], "missing --n-embd"),
    (["llama", "--n-vocab", "100", "--n-embd", "100", "--n-layer", "2", "--n-head", "3", "--n-ff", "8"],
     "n_rot 33 must be even (RoPE rotates pairs of dimensions; the head size is 33: --n-embd 100 / --n-head 3"),
    (["llama", "--preset", "llama-2-7b", "--n-ctx", "-5"], "n_ctx (--n-ctx): expected an integer from 1 to 2147483616"),
    (["llama", "--preset", "llama-2-7b", "--devices", "2", "--n-gpu-layers", "33", "--tensor-split", "1,x"],
     "tensor_split (--tensor-split): expected numbers separated by commas, found '1,x'"),
    (["llama", "--preset", "llama-2-7b", "--n-gpu-layers", "-1", "--devices", "1"],
     "n_gpu_layers (--n-gpu-layers): expected an integer from 0 to 2147483647, found -1"),
    (["llama", "--preset", "llama-2-7b", "--type-k", "q9"], "type_k (--type-k): expected one of f32, f16"),
    (["llama", "--preset", "llama-2-7b", "--type-v", "q8_0"],
     "V cache quantization requires flash_attn (--flash-attn)"),
    (["llama", "--preset", "llama-2-7b", "--type-v", "f32"], "type_v (--type-v) f32: V cache quantization requires"),
    (["llama", "--preset", "llama-2-7b", "-fa", "--type-v", "q9"], "type_v (--type-v): expected one of f32, f16"),
    (["llama", "--preset", "llama-2-7b", "-fa", "-c", str(2**31 - 200)],
     "n_ctx (--n-ctx): expected an integer from 1 to 2147483392 (padded to 256"),
    (["llama", "--n-vocab", "100", "--n-embd", "64", "--n-layer", "2", "--n-head", "8", "--n-ff", "64",
      "--n-expert", "8"], "n_expert_used (--n-expert-used) 0 with 8 experts"),
    (["llama", "--n-vocab", "100", "--n-embd", "64", "--n-layer", "2", "--n-head", "8", "--n-ff", "64",
      "--n-expert", "2", "--n-expert-used", "3"], "GGML_ASSERT(hparams.n_expert_used <= hparams.n_expert)"),
    (["llama", "--n-vocab", "100", "--n-embd", "64", "--n-layer", "2", "--n-head", "8", "--n-ff", "64",
      "--n-expert", "161", "--n-expert-used", "3"], "n_expert (--n-expert): expected an integer from 0 to 160"),
    (["llama", "--n-vocab", "100", "--n-embd", "64", "--n-layer", "2", "--n-head", "8", "--n-ff", "64",
      "--n-expert-used", "1"], "GGML_ASSERT(hparams.n_expert_used <= hparams.n_expert)"),
    (["llama", "--preset", "mixtral-8x7b", "--n-expert", "4"],
     "--n-expert and --n-expert-used go with hyperparameters"),
    (["llama", "--preset", "llama-2-7b", "--wtype", "i32"], "weights cannot be of type i32"),
    (["llama", "--preset", "llama-2-7b", "--wtype", "q9_9"],
     "wtype (--wtype): expected a ggml type (f16, q8_0, q4_K, ...), found 'q9_9'"),
    # issue 22: absurd values, refused before any work with the flag, what was expected and what was found
    (["llama", "--preset", "llama-2-7b", "--devices", str(10**12)],
     "devices (--devices): expected an integer from 0 to 15 (GGML_SCHED_MAX_BACKENDS = 16 backends, "
     "the CPU being one)"),
    (["llama", "--n-vocab", "100", "--n-embd", "64", "--n-layer", str(10**6), "--n-head", "8", "--n-ff", "8"],
     "n_layer (--n-layer): expected an integer from 1 to 512 (LLAMA_MAX_LAYERS), found 1000000"),
    (["llama", "--n-vocab", "100", "--n-embd", str(2**40), "--n-layer", "2", "--n-head", "8", "--n-ff", "8"],
     "n_embd (--n-embd): expected an integer from 1 to 4294967295 (a uint32_t), found 1099511627776"),
    (["llama", "--n-vocab", "-3", "--n-embd", "64", "--n-layer", "2", "--n-head", "8", "--n-ff", "8"],
     "n_vocab (--n-vocab)"),
    (["llama", "--n-vocab", "100", "--n-embd", "64", "--n-layer", "2", "--n-head", "8", "--n-head-kv", "0",
      "--n-ff", "8"],
     "n_head_kv (--n-head-kv): expected an integer from 1"),
    (["llama", "--n-vocab", "100", "--n-embd", "64", "--n-layer", "2", "--n-head", "8", "--n-head-kv", "3",
      "--n-ff", "8"],
     "n_head_kv (--n-head-kv): expected a divisor of n_head 8, found 3"),
    (["llama", "--preset", "llama-2-7b", "--n-ctx", str(2**40)],
     "n_ctx (--n-ctx): expected an integer from 1 to 2147483616"),
    (["llama", "--preset", "llama-2-7b", "--n-batch", "-1"],
     "n_batch (--n-batch): expected an integer from 0 to 2147483647"),
    (["llama", "--preset", "llama-2-7b", "--n-ubatch", str(2**31)],
     "n_ubatch (--n-ubatch): expected an integer from 0"),
    (["llama", "--preset", "llama-2-7b", "--n-batch", "0", "--n-ubatch", "0"], "cannot both be zero"),
    (["llama", "--preset", "llama-2-7b", "--n-gpu-layers", str(2**31), "--devices", "1"],
     "n_gpu_layers (--n-gpu-layers)"),
    (["llama", "--preset", "llama-2-7b", "--devices", "1", "--vram", "nan"],
     "vram (--vram): expected a finite number above 0"),
    (["llama", "--preset", "llama-2-7b", "--devices", "1", "--vram", "inf"], "vram (--vram)"),
    (["llama", "--preset", "llama-2-7b", "--devices", "1", "--vram", "-8"], "found -8.0"),
    (["llama", "--preset", "llama-2-7b", "--devices", "1", "--vram", "0"], "found 0.0"),
    (["llama", "--preset", "llama-2-7b", "--devices", "2", "--tensor-split", "1"],
     "tensor_split (--tensor-split): expected 2 weight(s), one per GPU (--devices 2), found 1: [1.0]"),
    (["llama", "--preset", "llama-2-7b", "--devices", "1", "--tensor-split", "1,1"], "expected 1 weight(s)"),
    (["llama", "--preset", "llama-2-7b", "--tensor-split", "1"], "expected 0 weight(s), one per GPU (--devices 0)"),
    (["llama", "--preset", "llama-2-7b", "--devices", "2", "--tensor-split", "nan,1"],
     "tensor_split[0] (--tensor-split): expected a finite number at least 0 and at most 3.40282e+38, found nan"),
    (["llama", "--preset", "llama-2-7b", "--devices", "2", "--tensor-split", "1,-1"],
     "tensor_split[1] (--tensor-split)"),
    (["llama", "--preset", "llama-2-7b", "--devices", "2", "--tensor-split", "inf,1"], "found inf"),
    (["llama", "--preset", "llama-2-7b", "--devices", "2", "--tensor-split", "1e39,1"],
     "and at most 3.40282e+38, found 1e+39"),
    (["llama", "--preset", "llama-2-7b", "--devices", "2", "-ngl", "33", "--tensor-split", "3e38,3e38"],
     "the weights add up to 6e+38, more than a float holds"),
    (["llama", "--preset", "llama-2-7b", "--devices", "2", "--tensor-split", ""],
     "expected numbers separated by commas"),
    (["llama", "--preset", "Llama-2-7B ", "--devices", "1"], "(any case), found 'Llama-2-7B '"),
    (["llama", "--preset", "LLAMA-2-7B", "--devices", "1"], None),  # any case
    (["llama", "--preset", "llama-2-7b", "--type-k", "q4_0", "--n-ctx", "64"], None),  # head 128: 4 q4_0 blocks
    (["llama", "--n-vocab", "100", "--n-embd", "96", "--n-layer", "1", "--n-head", "2", "--n-ff", "8",
      "--type-k", "q8_0"],
     "type_k (--type-k) q8_0: the head size 48 is not a whole number of its blocks (32 elements each"),
    (["llama", "--preset", "llama-2-7b", "--fit"], "--fit needs --vram"),
])
def test_llama_bad_input_exits_2(argv, message, capsys):
    if message is None:  # a legal request near a limit: it plans
        assert main(argv) == 0
        return
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


# -- plan and check on hostile input (issue 22) ------------------------------------------------------

@pytest.mark.parametrize("limit", ["-1", "0", "1.5", "x"])
def test_check_limit_must_be_positive(limit, capsys):
    with pytest.raises(SystemExit) as info:
        main(["check", str(fixture_path("ggml-seed", "01_mlp_small")), "--limit", limit])
    assert info.value.code == 2
    assert "--limit: expected a number of differences, an integer >= 1" in capsys.readouterr().err


def test_check_limit_1_still_reports_a_difference(tmp_path, capsys):
    """--limit 1 on a file with one difference prints that one (before, a limit of -1 sliced it away and
    printed "identical")."""
    from ggml_lite.plancheck import check_plan_file

    doc = copy.deepcopy(load_json(fixture_path("ggml-seed", "01_mlp_small")))
    doc["graph"]["tensors"][-1]["offset"] += 32
    assert main(["check", _write(tmp_path, doc), "--limit", "1"]) == 1
    assert capsys.readouterr().out.count("ggml offset") == 1
    assert len(check_plan_file(doc, limit=0)) == len(check_plan_file(doc, limit=None)) == 1
    with pytest.raises(errors.GraphFileError, match="limit: expected an integer >= 1"):
        check_plan_file(doc, limit=-1)


@pytest.mark.parametrize("argv, needle", [
    (["--step", "-1"], "--step: expected a step number, an integer >= 0"),
    (["--step", "99"], "step 99 has no graph"),
    (["--step", "1e3"], "--step: expected a step number"),
])
def test_plan_step_out_of_range(argv, needle, capsys):
    seq = str(fixture_path("ggml-seed", "11_realloc_sequence_grow"))
    try:
        code = main(["plan", seq] + argv)
    except SystemExit as e:
        code = e.code
    assert code == 2 and needle in capsys.readouterr().err


def test_plan_step_on_a_single_graph_is_refused(capsys):
    assert main(["plan", str(fixture_path("ggml-seed", "01_mlp_small")), "--step", "0"]) == 2
    assert "holds one graph, not a sequence: --step 0 does not apply" in capsys.readouterr().err


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d.update(steps=[]), "steps: expected at least one step"),
    (lambda d: d["steps"][1].pop("graph"), "steps[1].graph: missing"),
    (lambda d: d["steps"][2].update(call="ggml_gallocr_free"), "steps[2].call: expected one of"),
    (lambda d: d["steps"][0].update(buffer_size=1.5), "steps[0].buffer_size: expected an integer"),
    (lambda d: d["steps"][0].update(log="one line"), "steps[0].log: expected a list"),
    (lambda d: d["steps"][0]["graph"]["nodes"].__setitem__(5, d["steps"][0]["graph"]["nodes"][0]),
     "steps[0].graph.nodes[5]: expected a tensor id not listed"),
    (lambda d: d.update(graph={}), "the top level: expected either `graph`"),
])
def test_check_refuses_a_malformed_sequence(tmp_path, capsys, edit, needle):
    doc = copy.deepcopy(load_json(fixture_path("ggml-seed", "11_realloc_sequence_grow")))
    edit(doc)
    assert main(["check", _write(tmp_path, doc)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "internal error" not in err, err


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d.pop("reserve"), "reserve: missing"),
    (lambda d: d["alloc_graph"].update(ok="true"), "alloc_graph.ok: expected true or false"),
    (lambda d: d.update(buffer_size=None), "the top level.buffer_size: expected an integer"),
    (lambda d: d.update(schema_version=2), "schema_version: expected 1"),
])
def test_check_refuses_missing_or_malformed_records(tmp_path, capsys, edit, needle):
    doc = copy.deepcopy(load_json(fixture_path("ggml-seed", "06_llama_block")))
    edit(doc)
    assert main(["check", _write(tmp_path, doc)]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("field, value", [("buffer", "weights"), ("ext_offset", 64)])
def test_check_compares_where_each_tensor_went(tmp_path, capsys, field, value):
    """A recorded buffer label or external offset that is not where ggml_lite (and ggml) put the tensor
    is a difference (exit 1), not "identical"."""
    doc = copy.deepcopy(load_json(fixture_path("ggml-seed", "07_llama4_kvcache")))
    t = next(t for t in doc["graph"]["tensors"] if t["ctx"] == "compute" and t["buffer"] == "kv_cache")
    t[field] = value
    assert main(["check", _write(tmp_path, doc)]) == 1
    assert f"ggml {field} {value!r}" in capsys.readouterr().out


def test_plan_json_keys_are_the_unique_names(tmp_path, capsys):
    """Names are unique in a file (the writer appends #id), so `plan --json` has one key per tensor; a
    file naming two tensors alike is refused rather than collapsed."""
    doc = copy.deepcopy(load_json(fixture_path("ggml-seed", "03_views_layout")))
    assert main(["plan", _write(tmp_path, doc), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["tensors"]) == len(doc["graph"]["tensors"])
    ts = doc["graph"]["tensors"]
    ts[5]["name"] = ts[4]["name"]
    assert main(["plan", _write(tmp_path, doc), "--json"]) == 2
    assert "graph.tensors[5].name" in capsys.readouterr().err


def test_planners_refuse_a_buffer_type_they_do_not_plan_on(tmp_path, capsys):
    doc = copy.deepcopy(load_json(fixture_path("ggml-seed", "01_mlp_small")))
    doc["buffer_type"] = {"name": "CPU", "alignment": 512, "max_size": None, "alloc_size": "ggml_nbytes"}
    path = _write(tmp_path, doc)
    assert main(["plan", path]) == 0
    capsys.readouterr()
    assert main(["plan", path, "--planner", "greedy-size"]) == 2
    assert "buffer_type" in capsys.readouterr().err
    assert main(["check", path]) == 1  # honoured: planned at alignment 512, which is not what ggml recorded


def test_llama_short_flags_are_llama_cpp_s(capsys):
    """llama.cpp's short flags (-c, -b, -ub, -ctk, -ctv, -ngl, -ts, -nkvo) are aliases of the long ones."""
    long = ["--n-ctx", "1024", "--n-batch", "256", "--n-ubatch", "128", "--type-k", "q8_0", "--type-v", "f16",
            "--n-gpu-layers", "20", "--devices", "2", "--tensor-split", "3,1", "--no-kv-offload"]
    short = ["-c", "1024", "-b", "256", "-ub", "128", "-ctk", "q8_0", "-ctv", "f16", "-ngl", "20", "--devices", "2",
             "-ts", "3,1", "-nkvo"]
    docs = []
    for flags in (long, short):
        assert main(["llama", "--preset", "llama-2-7b", *flags, "--json"]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    assert docs[0] == docs[1]
    assert docs[0]["context"]["n_ubatch"] == 128 and docs[0]["context"]["tensor_split"] == [3.0, 1.0]


def test_llama_n_ctx_0_is_the_training_context(tmp_path, capsys):
    """llama.cpp reads a context of 0 as the model's training context (`hparams.n_ctx_train`): a GGUF's
    llama.context_length or a preset's; hyperparameters given as flags do not say it, so 0 is refused there,
    naming what is missing."""
    from ggml_lite.models.llama import LlamaParams
    from gguf_writer import TINY, write_llama_gguf

    path = tmp_path / "ctx1000.gguf"
    write_llama_gguf(path, LlamaParams(**{**TINY.__dict__, "n_ctx_train": 1000}), sparse=True)
    for model, want in ((["--gguf", str(path)], 1024), (["--preset", "tinyllama-1.1b"], 2048)):
        assert main(["llama", *model, "-c", "0", "--json"]) == 0
        zero = json.loads(capsys.readouterr().out)
        assert zero["context"]["n_ctx"] == want  # padded to 32, as any n_ctx
        assert main(["llama", *model, "-c", str(want), "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == zero
    flags = ["--n-vocab", "64", "--n-embd", "64", "--n-layer", "2", "--n-head", "4", "--n-ff", "96"]
    assert main(["llama", *flags, "--n-ctx", "0"]) == 2
    assert "n_ctx (--n-ctx) 0 means the model's training context" in capsys.readouterr().err
    # a llama.context_length of 0 is a model llama.cpp starts when a context is asked for, and refuses with 0
    write_llama_gguf(path, LlamaParams(**{**TINY.__dict__, "n_ctx_train": 0}), sparse=True)
    assert main(["llama", "--gguf", str(path), "-c", "256"]) == 0
    capsys.readouterr()
    assert main(["llama", "--gguf", str(path), "-c", "0"]) == 2
    assert "n_ctx and model->hparams.n_ctx_train cannot both be zero" in capsys.readouterr().err
