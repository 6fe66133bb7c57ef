"""The command line on graph files of today's ggml (issue 24): `check` and `plan` with `--ggml 2024|2026`,
a file's `ggml_version`, and the chunk fields of a compute buffer split under a buffer type's `max_size`
(appendix A5: `plancheck.era_of`, `check_today`; chapter 12: `GAllocr2026`).

The chunked files are recorded fixtures given a `max_size` and planned by the real ggml 0.15.3
(tests/chunked_docs.py; the tests that claim identity with it skip without ggml-python). The comparison
must be able to fail: a chunk index, a chunk size or an offset changed is reported, exit 1."""

import copy
import json
import subprocess
import sys

import pytest

import ggml_oracle as O
from chunked_docs import RELEASE, chunked_document
from ggml_lite.__main__ import main
from ggml_lite.plancheck import check_plan_file, era_of, release_build, run_plan
from helpers import FIXTURES, ROOT, SEED_FILES, fixture_path, load_json

SINGLE = [n for n in SEED_FILES if not n.startswith(("11_", "12_"))]
SMALL = [n for n in SINGLE if not n.startswith(("13_", "14_"))]
needs_ggml = pytest.mark.skipif(not O.available(), reason=f"the real ggml is not available: {O.IMPORT_ERROR}")


def _write(tmp_path, doc, name="today.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def _run(capsys, *argv) -> tuple:
    code = main([str(a) for a in argv])
    cap = capsys.readouterr()
    assert "internal error" not in cap.err, cap.err
    return code, cap.out, cap.err


# -- identical to the real ggml -------------------------------------------------------------------------

@needs_ggml
@pytest.mark.parametrize("parts", [2, 3, 6, 40])
@pytest.mark.parametrize("name", SMALL)
def test_check_is_identical_on_chunked_plans_of_the_real_ggml(name, parts, tmp_path, capsys):
    """Fixtures 01-10 on a limit of 1/2 to 1/40 of their peak (1 to 16 chunks), planned by ggml 0.15.3: every
    chunk size, chunk index, offset and buffer size equal."""
    doc = chunked_document(name, parts, source="ggml")
    code, out, _ = _run(capsys, "check", _write(tmp_path, doc))
    assert code == 0, out
    assert "plan identical to ggml's" in out and f"in {len(doc['chunks'])} chunk(s)" in out and "ggml 2026" in out


@needs_ggml
@pytest.mark.parametrize("name", ["13_llama7b_ctx512_all_outputs", "14_llama7b_ctx512_one_output"])
def test_check_is_identical_on_a_chunked_7b_graph(name, tmp_path, capsys):
    doc = chunked_document(name, 20, source="ggml")
    assert len(doc["chunks"]) > 4
    code, out, _ = _run(capsys, "check", _write(tmp_path, doc))
    assert code == 0, out


def test_the_chunked_documents_have_many_chunks():
    """The documents the tests use do chunk: 2 to 16 chunks, the 16th holding the rest."""
    counts = {len(chunked_document(n, parts)["chunks"]) for n in SMALL for parts in (2, 40)}
    assert min(counts) >= 2 and max(counts) == 16, counts


@pytest.mark.parametrize("name", ["11_realloc_sequence_grow", "12_realloc_sequence_reserve_first"])
def test_a_chunked_sequence_checks_step_by_step(name, tmp_path, capsys):
    """A sequence file with `chunks` per step (made by ggml_lite's allocator: the oracle plans one graph): each
    step compared, and a step's chunks changed is reported for that step."""
    doc = chunked_document(name, 3)
    assert any(len(s["chunks"]) > 1 for s in doc["steps"])
    assert _run(capsys, "check", _write(tmp_path, doc))[0] == 0
    k = next(k for k, s in enumerate(doc["steps"]) if len(s["chunks"]) > 1)
    doc["steps"][k]["chunks"][-1] += 32
    code, out, _ = _run(capsys, "check", _write(tmp_path, doc))
    assert code == 1 and f"step {k}: chunks: ggml" in out, out


def test_compute_buffer_replaced_reads_the_first_chunk(tmp_path, capsys):
    """A chunked buffer's handle is its first chunk's. Where ggml_lite kept its buffer the recorded fact must
    say "not replaced" (flipped, it differs); where it allocated a new one, either record agrees (the new
    struct's address depends on the recording process's heap)."""
    doc = chunked_document("11_realloc_sequence_grow", 3)
    facts = [s["compute_buffer_replaced"] for s in doc["steps"]]
    assert True in facts and False in facts  # (reallocated chunks: a new first chunk, or the old one's address)
    flipped_true = copy.deepcopy(doc)
    flipped_true["steps"][facts.index(True)]["compute_buffer_replaced"] = False
    assert _run(capsys, "check", _write(tmp_path, flipped_true))[0] == 0
    reported = []
    for k in (k for k, f in enumerate(facts) if f is False):
        d = copy.deepcopy(doc)
        d["steps"][k]["compute_buffer_replaced"] = True
        code, out, _ = _run(capsys, "check", _write(tmp_path, d))
        reported += [k] if code == 1 and f"step {k} (alloc_graph): compute_buffer_replaced: ggml True" in out else []
    assert reported  # a kept buffer said to be replaced is a difference


# -- the comparison can fail ----------------------------------------------------------------------------

def _placed(doc, chunk=None):
    return next(i for i, e in enumerate(doc["graph"]["tensors"])
                if e["chunk"] is not None and e["view_src"] is None and (chunk is None or e["chunk"] == chunk))


def test_a_chunk_index_changed_is_reported(tmp_path, capsys):
    doc = chunked_document("06_llama_block", 2)
    i = _placed(doc, 1)
    doc["graph"]["tensors"][i]["chunk"] = 0
    code, out, _ = _run(capsys, "check", _write(tmp_path, doc))
    name = doc["graph"]["tensors"][i]["name"]
    assert code == 1 and f"tensor #{i} '{name}'" in out and "ggml chunk 0, ggml_lite chunk 1" in out, out


def test_a_chunk_size_changed_is_reported(tmp_path, capsys):
    doc = chunked_document("06_llama_block", 2)
    want = list(doc["chunks"])
    doc["chunks"][1] -= 32
    code, out, _ = _run(capsys, "check", _write(tmp_path, doc))
    assert code == 1 and f"chunks: ggml {doc['chunks']}, ggml_lite {want}" in out, out


def test_an_offset_inside_a_chunk_changed_is_reported(tmp_path, capsys):
    doc = chunked_document("07_llama4_kvcache", 3)
    i = _placed(doc, 2)
    doc["graph"]["tensors"][i]["offset"] += 32
    code, out, _ = _run(capsys, "check", _write(tmp_path, doc))
    assert code == 1 and f"tensor #{i}" in out and "ggml offset" in out and "chunk" not in out.split(f"#{i}")[1], out


def test_the_buffer_size_of_a_chunked_plan_counts_32_bytes_per_chunk(tmp_path, capsys):
    doc = chunked_document("05_inputs_flagged", 3)
    assert doc["buffer_size"] == sum(doc["chunks"]) + 32 * len(doc["chunks"])
    doc["buffer_size"] = doc["alloc_graph"]["buffer_size"] = sum(doc["chunks"]) + 32  # one pad only
    code, out, _ = _run(capsys, "check", _write(tmp_path, doc))
    assert code == 1 and "buffer size: ggml" in out and "alloc_graph: buffer_size" in out, out


def test_a_tensor_moved_out_of_the_compute_buffer_is_reported(tmp_path, capsys):
    doc = chunked_document("06_llama_block", 3)
    e = doc["graph"]["tensors"][_placed(doc)]
    e["chunk"] = e["offset"] = None
    code, out, _ = _run(capsys, "check", _write(tmp_path, doc))
    assert code == 1 and "ggml offset None" in out and "ggml chunk None, ggml_lite chunk" in out, out


# -- eras -----------------------------------------------------------------------------------------------

def test_the_era_of_a_file():
    assert era_of({}) == "2024" and era_of({"ggml_version": "0.9.9"}) == "2024"
    assert era_of({"ggml_version": "0.10.1"}) == "2026" and era_of({"ggml_version": "1.0.0"}) == "2026"
    assert era_of({"ggml_version": "0.10.0"}) == "2024" and era_of({"ggml_version": "0.15.3"}, "2024") == "2024"
    assert era_of({}, "2026") == "2026"


@pytest.mark.parametrize("name", SEED_FILES)
def test_every_2024_fixture_stays_identical_and_says_2024(name, capsys):
    code, out, _ = _run(capsys, "check", fixture_path("ggml-seed", name))
    assert code == 0 and "ggml 2024's allocator" in out
    assert _run(capsys, "check", fixture_path("ggml-seed", name), "--ggml", "2024")[0] == 0


@pytest.mark.parametrize("name", SMALL + ["11_realloc_sequence_grow", "12_realloc_sequence_reserve_first"])
def test_a_2024_fixture_under_today_s_allocator_differs_only_in_its_log(name, capsys):
    """Without a limit today's allocator places every tensor where the 2024 one did (one chunk): under
    --ggml 2026 a 2024 fixture differs only where today's ggml logs otherwise (no "reallocating ... from
    size 0.00 MiB" for a first buffer)."""
    diffs = check_plan_file(load_json(fixture_path("ggml-seed", name)), limit=None, ggml="2026")
    assert diffs and all("log[" in d for d in diffs), diffs


def test_ggml_flag_overrides_the_file(tmp_path, capsys):
    doc = chunked_document("02_elementwise_inplace", 3)
    del doc["ggml_version"]  # then the file is 2024's, and its chunks are refused ...
    path = _write(tmp_path, doc)
    code, _, err = _run(capsys, "check", path)
    assert code == 2 and "chunks: chunks are planned by today's ggml" in err and "--ggml 2026" in err
    assert _run(capsys, "check", path, "--ggml", "2026")[0] == 0  # ... unless --ggml 2026 says otherwise
    doc["ggml_version"] = "0.15.3"
    code, _, err = _run(capsys, "check", _write(tmp_path, doc), "--ggml", "2024")
    assert code == 2 and "planned with the 2024 allocator" in err


@pytest.mark.parametrize("command", ["plan", "check"])
@pytest.mark.parametrize("value", ["2025", "today", "", "2024 "])
def test_an_unknown_ggml_flag_exits_2(command, value, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, str(fixture_path("ggml-seed", "01_mlp_small")), "--ggml", value])
    assert e.value.code == 2 and "--ggml: invalid choice" in capsys.readouterr().err


# -- the logs of a release build --------------------------------------------------------------------------

@pytest.mark.parametrize("build, release", [
    ("release", True), ("Release build", True), ("release (NDEBUG)", True), ("-O3 -DNDEBUG", True),
    ("debug (no NDEBUG: gallocr diagnostics captured in logs)", False), ("DEBUG (NO NDEBUG)", False),
    ("RelWithDebInfo", True), ("MinSizeRel -Os", True),
    ("debug", False), ("Debug (assertions on)", False), ("debug build, NDEBUG not defined", False),
    ("ggml-py 0.10.1, release build", True), ("ggml 0.10.1 (Release)", True), ("CMAKE_BUILD_TYPE=Release", True),
    ("ndebug", True), ("NDEBUG undefined", False)])
def test_which_builds_are_release_builds(build, release):
    assert release_build({"ggml_build": build}) is release


@pytest.mark.parametrize("build", ["", "pip install ggml-py==0.10.1", "a build without release"])
def test_a_build_that_says_neither_is_read_from_its_logs(build):
    """Neither release nor debug in a file of today's ggml: a debug build when a recorded line is a diagnostic."""
    diagnostic = {"log": ["ggml_gallocr_needs_realloc: graph has different number of nodes"]}
    error = {"log": ["ggml_gallocr_reserve_n_impl: failed to allocate CPU buffer of size 99"]}
    today = {"ggml_build": build, "ggml_version": "0.10.1"}
    assert release_build(today) and release_build({**today, "steps": [error]})
    assert not release_build({**today, "steps": [error, diagnostic]})
    assert not release_build({**today, "reserve": diagnostic})
    assert not release_build({"ggml_build": build})  # a 2024 file: a debug build, as the 2024 recordings were


def test_a_release_build_compares_only_error_lines(tmp_path, capsys):
    """The chunked sequence makes ggml_lite log needs_realloc's and reserve's diagnostics (INFO): a release
    build's file records none and checks identical; the same file said to be a debug build differs in them."""
    doc = chunked_document("11_realloc_sequence_grow", 3)
    assert doc["ggml_build"] == RELEASE and all(s["log"] == [] for s in doc["steps"])
    assert _run(capsys, "check", _write(tmp_path, doc))[0] == 0
    doc["ggml_build"] = "debug (no NDEBUG)"
    code, out, _ = _run(capsys, "check", _write(tmp_path, doc))
    assert code == 1 and "log[0]: ggml (no more lines), ggml_lite 'ggml_gallocr_needs_realloc" in out, out
    doc["ggml_build"] = RELEASE
    doc["steps"][0]["log"] = ["ggml_gallocr_reserve_n_impl: failed to allocate CPU buffer of size 1"]
    code, out, _ = _run(capsys, "check", _write(tmp_path, doc))
    assert code == 1 and "step 0 (alloc_graph): log[0]: ggml 'ggml_gallocr_reserve_n_impl: failed" in out, out


# -- plan ---------------------------------------------------------------------------------------------------

def test_plan_json_of_a_chunked_file_gives_chunks_and_each_tensor_s_chunk(tmp_path, capsys):
    doc = chunked_document("07_llama4_kvcache", 3)
    code, out, _ = _run(capsys, "plan", _write(tmp_path, doc), "--json")
    got = json.loads(out)
    assert code == 0 and got["ggml"] == "2026" and got["chunks"] == doc["chunks"]
    assert got["buffer_size"] == doc["buffer_size"]
    assert got["tensors"] == {e["name"]: {"offset": e["offset"], "chunk": e["chunk"]} for e in doc["graph"]["tensors"]}
    assert got["planner"] == "ggml" and got["optimal"] in (True, None) and got["lower_bound"] > 0


def test_plan_json_of_a_2024_file_keeps_its_keys(capsys):
    path = fixture_path("ggml-seed", "06_llama_block")
    doc = load_json(path)
    got = json.loads(_run(capsys, "plan", path, "--json")[1])
    assert got["ggml"] == "2024" and "chunks" not in got
    assert got["tensors"] == {e["name"]: {"offset": e["offset"]} for e in doc["graph"]["tensors"]}
    today = json.loads(_run(capsys, "plan", path, "--json", "--ggml", "2026")[1])  # no limit: one chunk
    assert today["ggml"] == "2026" and "chunks" not in today and today["tensors"] == got["tensors"]
    assert today["buffer_size"] == got["buffer_size"] and today["optimal"] == got["optimal"]


def test_plan_text_of_a_chunked_file(tmp_path, capsys):
    doc = chunked_document("06_llama_block", 2)
    code, out, _ = _run(capsys, "plan", _write(tmp_path, doc))
    e = doc["graph"]["tensors"][_placed(doc, 1)]
    assert code == 0 and "chunk:offset" in out.splitlines()[0] and f"1:{e['offset']}" in out
    assert f"in {len(doc['chunks'])} chunks of {doc['chunks']} bytes" in out and "planned as ggml 2026 does" in out


@pytest.mark.parametrize("extra", [["--planner", "greedy-size"], ["--planner", "best"], ["--verify"]])
def test_offline_planners_refuse_a_limited_buffer_type(extra, tmp_path, capsys):
    """The offline planners and --verify plan one buffer without a limit: a file with a max_size is refused
    (exit 2, naming the field), whichever era."""
    doc = chunked_document("06_llama_block", 3)
    for ggml in ("2026", "2024"):
        if ggml == "2024":
            doc = {k: v for k, v in doc.items() if k not in ("chunks", "ggml_version")}
            for e in doc["graph"]["tensors"]:
                e.pop("chunk")
        code, _, err = _run(capsys, "plan", _write(tmp_path, doc), *extra, "--ggml", ggml)
        assert code == 2 and "buffer_type.max_size: --planner and --verify plan one buffer without a limit" in err


def test_offline_planners_run_on_an_unlimited_file_of_today(capsys):
    path = fixture_path("ggml-seed", "03_views_layout")
    got = json.loads(_run(capsys, "plan", path, "--planner", "greedy-size", "--json", "--ggml", "2026")[1])
    assert got["ggml"] == "2026" and got["planner"] == "greedy-size" and "chunks" not in got


def test_the_module_checks_a_chunked_file_as_a_command(tmp_path):
    path = _write(tmp_path, chunked_document("04_outputs_middle", 6))
    r = subprocess.run([sys.executable, "-m", "ggml_lite", "check", path], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0 and "plan identical" in r.stdout, r.stderr


# -- the new fields are checked -------------------------------------------------------------------------------

def _edit(doc, path, value):
    d = copy.deepcopy(doc)
    *head, last = path
    obj = d
    for k in head:
        obj = obj[k]
    if value is KeyError:
        del obj[last]
    else:
        obj[last] = value
    return d


BAD = [  # (path, value, what the message names)
    (("ggml_version",), "0.10", "ggml_version: expected a version string"),
    (("ggml_version",), "0.10.1.2", "ggml_version"), (("ggml_version",), "v0.10.1", "ggml_version"),
    (("ggml_version",), "-1.0.0", "ggml_version"), (("ggml_version",), "0.15.3 ", "ggml_version"),
    (("ggml_version",), "1" * 5000 + ".0.0", "ggml_version"), (("ggml_version",), None, "ggml_version"),
    (("ggml_version",), 0.15, "ggml_version"), (("ggml_version",), [0, 15, 3], "ggml_version"),
    (("ggml_version",), "٠.١٠.١", "ggml_version"),  # (Arabic-Indic digits: \d would take them)
    (("ggml_build",), 7, "ggml_build: expected a string"),
    (("chunks",), "x", "chunks: expected a list"), (("chunks",), [1.5], "chunks[0]: expected an integer"),
    (("chunks",), [0], "chunks[0]: expected an integer in [1, 2^63-1]"), (("chunks",), [-32], "chunks[0]"),
    (("chunks",), [True], "chunks[0]"), (("chunks",), [32] * 17, "chunks: expected a list of at most 16 items"),
    (("chunks",), [2**64], "chunks[0]"), (("chunks",), None, "chunks: expected a list"),
    (("graph", "tensors", "P", "chunk"), -1, "chunk: expected null or a chunk index in [0, "),
    (("graph", "tensors", "P", "chunk"), 3, "chunk: expected null or a chunk index in [0, 2]"),
    (("graph", "tensors", "P", "chunk"), 16, "chunk"), (("graph", "tensors", "P", "chunk"), "0", "chunk"),
    (("graph", "tensors", "P", "chunk"), True, "chunk"), (("graph", "tensors", "P", "chunk"), 1.0, "chunk"),
    (("graph", "tensors", "P", "chunk"), None, "chunk: expected a chunk index: the tensor has an offset"),
    (("graph", "tensors", "P", "offset"), None, "chunk: expected null: the tensor's offset is null"),
    (("graph", "tensors", "E", "chunk"), 0, "chunk: expected null: the tensor's offset is null"),
    (("buffer_type", "max_size"), 2**64, "buffer_type.max_size"), (("buffer_type", "max_size"), 0, "max_size"),
    (("buffer_type", "max_size"), -1, "max_size"), (("buffer_type", "max_size"), "1GiB", "max_size"),
]


@pytest.mark.parametrize("command", ["plan", "check"])
@pytest.mark.parametrize("path, value, needle", BAD, ids=[f"{'.'.join(map(str, p))}={str(v)[:12]}" for p, v, _ in BAD])
def test_a_wrong_chunk_field_exits_2_naming_it(path, value, needle, command, tmp_path, capsys):
    doc = chunked_document("06_llama_block", 2)  # three chunks
    assert len(doc["chunks"]) == 3
    ents = doc["graph"]["tensors"]
    index = {"P": _placed(doc), "E": next(i for i, e in enumerate(ents) if e["preallocated"])}
    path = tuple(index.get(k, k) for k in path)
    code, _, err = _run(capsys, command, _write(tmp_path, _edit(doc, path, value)))
    assert code == 2 and needle in err, err
    assert len(err) < 2000


def test_chunk_fields_without_chunks_index_below_16(tmp_path, capsys):
    """Without `chunks` a tensor's chunk is checked against GGML_VBUFFER_MAX_CHUNKS, and still compared."""
    doc = chunked_document("06_llama_block", 2)
    del doc["chunks"]
    assert _run(capsys, "check", _write(tmp_path, doc))[0] == 0
    i = _placed(doc, 1)
    doc["graph"]["tensors"][i]["chunk"] = 15
    code, out, _ = _run(capsys, "check", _write(tmp_path, doc))
    assert code == 1 and "ggml chunk 15, ggml_lite chunk 1" in out
    doc["graph"]["tensors"][i]["chunk"] = 16
    code, _, err = _run(capsys, "check", _write(tmp_path, doc))
    assert code == 2 and "graph.tensors[" in err and "[0, 15]" in err


def test_a_huge_or_tiny_max_size_plans_within_bounds(tmp_path, capsys):
    """max_size 2^63-1 (clamped to SIZE_MAX/2 as in the C): one chunk; max_size 1: 16 chunks at most, the
    16th unbounded. Both plan, and check says what differs from the recorded chunks."""
    doc = chunked_document("09_random_dag_wide_s42", 3)
    for max_size, n in ((2**63 - 1, 1), (1, 16)):
        d = _edit(doc, ("buffer_type", "max_size"), max_size)
        got = json.loads(_run(capsys, "plan", _write(tmp_path, d), "--json")[1])
        assert len(got.get("chunks", [0])) == n
        code, out, _ = _run(capsys, "check", _write(tmp_path, d))
        assert code == 1 and "chunks: ggml" in out


# -- recorded fixtures of today's ggml (tests/fixtures/ggml-today/, when recorded) ----------------------------

TODAY_FILES = sorted((FIXTURES / "ggml-today").glob("*.json")) if (FIXTURES / "ggml-today").is_dir() else []


@pytest.mark.skipif(not TODAY_FILES, reason="no recorded fixtures of today's ggml in tests/fixtures/ggml-today/")
@pytest.mark.parametrize("path", TODAY_FILES, ids=[p.stem for p in TODAY_FILES])
def test_check_is_identical_on_every_recorded_fixture_of_today(path, capsys):
    code, out, err = _run(capsys, "check", path)
    assert code == 0, out + err
    assert "plan identical to ggml's" in out


@pytest.mark.parametrize("name", ["02_elementwise_inplace", "06_llama_block", "07_llama4_kvcache"])
def test_every_tensor_moved_to_another_chunk_is_reported(name):
    """Exhaustively: each tensor of the compute buffer given each other chunk (and each chunk size changed by
    32 bytes, each way): check_plan_file reports that tensor's chunk (that chunk list), every time."""
    doc = chunked_document(name, 3)
    n = len(doc["chunks"])
    for i, e in enumerate(doc["graph"]["tensors"]):
        for c in range(n) if e["chunk"] is not None else []:
            if c != e["chunk"]:
                d = _edit(doc, ("graph", "tensors", i, "chunk"), c)
                diffs = check_plan_file(d, limit=None)
                assert any(f"tensor #{i} " in x and f"ggml chunk {c}, ggml_lite chunk {e['chunk']}" in x
                           for x in diffs), (i, c, diffs)
    for k in range(n):
        for delta in (-32, 32):
            d = _edit(doc, ("chunks", k), doc["chunks"][k] + delta)
            assert any(x.startswith("chunks: ggml") for x in check_plan_file(d)), (k, delta)


@pytest.mark.parametrize("parts", [2, 6, 40])
def test_a_graph_computed_in_chunks_equals_it_computed_in_one_buffer(parts):
    """Fixture 06 computed (bit-exact tier, seeded leaves) in its 2024 plan and in a chunked plan of today's:
    the last node's bytes are equal, so no chunked placement overwrote a tensor still to be read (and `check`
    computes a file's numerics in chunks: test_fuzz_graph_files's numerics documents go through it)."""
    from ggml_lite.backend import tensor_get
    from ggml_lite.cpu import cpu_init
    from ggml_lite.numerics import fill_leaf

    out = []
    for ggml, doc in (("2024", load_json(fixture_path("ggml-seed", "06_llama_block"))),
                      ("2026", chunked_document("06_llama_block", parts))):
        gf, galloc, _ = run_plan(doc, ggml=ggml)
        assert len(galloc.chunk_sizes(0)) > 1 if ggml == "2026" else not hasattr(galloc, "chunk_sizes")
        for i, e in enumerate(doc["graph"]["tensors"]):
            if e["graph_role"] == "leaf" and e["view_src"] is None:
                i32 = e["type"] == "i32"
                fill_leaf(gf.tensors[i], 77, i, "int" if i32 else "float", (0, 64) if i32 else None)
        cpu_init(exact=True).graph_compute(gf.graph)
        out.append(tensor_get(gf.graph.nodes[-1]).tobytes())
    assert out[0] == out[1]


@pytest.mark.skipif(not TODAY_FILES, reason="no recorded fixtures of today's ggml in tests/fixtures/ggml-today/")
@pytest.mark.parametrize("path", TODAY_FILES, ids=[p.stem for p in TODAY_FILES])
def test_plan_json_gives_every_recorded_chunk_and_offset(path, capsys):
    """plan --json of a recorded single-graph file of today's ggml: its buffer size, chunks (for more than one),
    and every tensor's offset and chunk, as recorded; and --ggml 2024 refuses the file's chunk fields."""
    doc = load_json(path)
    if "graph" not in doc:
        pytest.skip("a sequence: plan plans one step on a fresh allocator, the record holds the sequence's")
    code, out, _ = _run(capsys, "plan", path, "--json")
    got = json.loads(out)
    assert code == 0 and got["ggml"] == "2026" and got["buffer_size"] == doc["buffer_size"]
    many = len(doc["chunks"]) > 1
    assert got.get("chunks") == (doc["chunks"] if many else None)
    assert got["tensors"] == {e["name"]: {"offset": e["offset"], **({"chunk": e["chunk"]} if many else {})}
                              for e in doc["graph"]["tensors"]}
    code, _, err = _run(capsys, "check", path, "--ggml", "2024")
    assert code == 2 and "drop --ggml 2024" in err


def test_a_tensor_without_its_chunk_where_others_have_one_is_refused(tmp_path, capsys):
    """Every tensor records its chunk, or none does: a tensor left without one would go unchecked."""
    doc = chunked_document("06_llama_block", 2)
    i = _placed(doc, 1)
    del doc["graph"]["tensors"][i]["chunk"]
    code, _, err = _run(capsys, "check", _write(tmp_path, doc))
    assert code == 2 and f"graph.tensors[{i}].chunk: missing" in err
    for e in doc["graph"]["tensors"]:  # none records it: the chunks are not compared per tensor, and that is allowed
        e.pop("chunk", None)
    assert _run(capsys, "check", _write(tmp_path, doc))[0] == 0
