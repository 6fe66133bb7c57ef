"""`python -m ggml_lite solve PROBLEM.csv` and `plan --export-problem` (issue 27, point 3): problem files in
MiniMalloc's CSV format read, planned and written back with offsets; the exit codes (0 the capacity met or
none asked, 1 not met, 2 a bad file or bad arguments, naming the line, row and column).

In-process (`ggml_lite.__main__.main`), as tests/unit/test_cli.py; one run as a user would. The plans
written are checked here without the package's planners (pairwise overlaps)."""

import json
import subprocess
import sys

import pytest

from ggml_lite import planners
from ggml_lite.__main__ import main
from ggml_lite.problem_csv import read_problem_csv, write_problem_csv
from ggml_lite.problem_gen import perfect_packing, perfect_problem
from helpers import ROOT, fixture_path
from placements import conflicts

SIX, SIX_CAPACITY, SIX_OFFSETS = perfect_packing(6, 1, horizon=10, capacity=8)


def _csv(tmp_path, text: str | bytes, name: str = "p.csv") -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def _solve(argv, capsys):
    code = main(["solve", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def _field(out: str, name: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(name + ": ")).split(": ", 1)[1]


def test_solve_meets_a_feasible_capacity_and_writes_the_offsets(tmp_path, capsys):
    src = tmp_path / "six.csv"
    write_problem_csv(src, SIX)
    out_path = tmp_path / "out.csv"
    code, out, err = _solve([src, "--capacity", SIX_CAPACITY, "--out", out_path], capsys)
    assert code == 0, out + err
    assert _field(out, "peak").startswith("8 bytes (1.0000 x") and _field(out, "lower bound") == "8 bytes"
    assert _field(out, "capacity") == "8 bytes, met" and _field(out, "optimal") == "proven"
    back = read_problem_csv(out_path)
    assert out_path.read_text().splitlines()[0] == "id,lower,upper,size,offset"
    assert back.rows == [(str(i), lo, up, size) for i, lo, up, size in SIX] and back.offsets is not None
    assert not conflicts(back.rows, back.offsets) and max(o + r[3] for r, o in zip(back.rows, back.offsets)) == 8


def test_without_a_capacity_exit_0_and_the_peak_is_what_the_offsets_need(tmp_path, capsys):
    rows, capacity = perfect_problem(40, 3)
    src, out_path = tmp_path / "p.csv", tmp_path / "o.csv"
    write_problem_csv(src, rows)
    code, out, _ = _solve([src, "--planner", "greedy-size", "--out", out_path], capsys)
    assert code == 0 and not any(line.startswith("capacity:") for line in out.splitlines())
    back = read_problem_csv(out_path)
    peak = max(o + r[3] for r, o in zip(back.rows, back.offsets))
    assert not conflicts(back.rows, back.offsets)
    assert _field(out, "peak").startswith(f"{peak} bytes") and _field(out, "lower bound") == f"{capacity} bytes"


def test_a_capacity_below_the_lower_bound_exits_1_and_says_why(tmp_path, capsys):
    src = tmp_path / "six.csv"
    write_problem_csv(src, SIX)
    code, out, _ = _solve([src, "--capacity", 7, "--budget", 0.2], capsys)
    assert code == 1 and _field(out, "capacity") == "7 bytes, not met: below the lower bound, no plan can meet it"


def test_a_capacity_the_search_proves_impossible_exits_1_and_says_so(tmp_path, capsys):
    """Chapter 11's seven blocks (appendix A6, §1) in bytes: alive at most 5 at once, yet no placement fits in
    5; the exact search proves it within the budget."""
    rows = [("A", 0, 1, 3), ("B", 0, 2, 2), ("C", 1, 3, 1), ("D", 1, 4, 2), ("E", 2, 4, 1), ("F", 3, 5, 2),
            ("G", 4, 5, 3)]
    src = tmp_path / "seven.csv"
    write_problem_csv(src, rows)
    code, out, _ = _solve([src, "--capacity", 5, "--budget", 10], capsys)
    assert code == 1 and _field(out, "lower bound") == "5 bytes"
    assert _field(out, "capacity") == "5 bytes, not met: the search proved that no plan fits in it"
    code, out, _ = _solve([src, "--capacity", 6, "--budget", 10], capsys)
    assert code == 0 and _field(out, "capacity") == "6 bytes, met" and _field(out, "peak").startswith("6 bytes")


def test_a_capacity_missed_within_the_budget_exits_1(tmp_path, capsys):
    """Greedy by size misses the capacity of a perfect problem it cannot pack (seed 1: 1.12 x)."""
    rows, capacity = perfect_problem(50, 1)
    src = tmp_path / "p.csv"
    write_problem_csv(src, rows)
    code, out, _ = _solve([src, "--capacity", capacity, "--planner", "greedy-size"], capsys)
    assert code == 1 and int(_field(out, "peak").split()[0]) > capacity
    assert _field(out, "capacity") == f"{capacity} bytes, not met within the budget (1 s)"


def test_the_output_file_reads_back_and_solves_again(tmp_path, capsys):
    """A solution file (with its offset column) is a problem file too: the offsets are ignored."""
    src, first = tmp_path / "six.csv", tmp_path / "first.csv"
    write_problem_csv(src, SIX)
    assert _solve([src, "--out", first], capsys)[0] == 0
    code, out, _ = _solve([first, "--capacity", 8], capsys)
    assert code == 0 and "its offset column ignored" in out


@pytest.mark.parametrize("text, where", [
    ("", "empty: expected the header id,lower,upper,size"),
    ("id,lower,upper\n0,0,1\n", "line 1 (the header): no column `size`"),
    ("id,lower,upper,size,lower\n", "line 1 (the header): column `lower` twice"),
    ("id,lower,upper,size,name\n", "line 1 (the header): column 5 is 'name'"),
    ("id,lower,upper,size\n", "no rows after the header"),
    ("id,lower,upper,size\n0,0,1,8\n1,0,1\n", "line 3 (row 2): 3 fields, the header has 4"),
    ("id,lower,upper,size\n0,0,1,-8\n", "line 2 (row 1), column `size`: expected a decimal integer >= 0, found a "
     "negative number"),
    ("id,lower,upper,size\n0,0,1.5,8\n", "line 2 (row 1), column `upper`: expected a decimal integer >= 0, found "
     "'1.5'"),
    ("id,lower,upper,size\n0,0,1,1_000\n", "column `size`: expected a decimal integer >= 0, found '1_000'"),
    ("id,lower,upper,size\n0,x,1,8\n", "line 2 (row 1), column `lower`"),
    ("id,lower,upper,size\n0,0,1,9223372036854775808\n", "column `size`: 9223372036854775808 is above 2^63 - 1"),
    ("id,lower,upper,size\n0,4,4,8\n", "line 2 (row 1), column `upper`: 4 is not above lower 4"),
    ("id,lower,upper,size\n0,5,4,8\n", "line 2 (row 1), column `upper`: 4 is not above lower 5"),
    ("id,lower,upper,size\n\n7,0,1,8\n7,1,2,8\n", "line 4 (row 2), column `id`: '7' again (first on line 3)"),
    ("id,lower,upper,size\n,0,1,8\n", "line 2 (row 1), column `id`: expected an id"),
    ("id,lower,upper,size\n0,0,1,9223372036854775807\n1,0,1,1\n", "line 3 (row 2), column `size`: the sizes so far "
     "add up past 2^63 - 1"),
    (b"id,lower,upper,size\n0,0,1,\xff\n", "line 2: not UTF-8 text"),
    (b"\x00\x01\x02\x03", "line 1: a NUL byte (binary data"),
    ("id,lower,upper,size\n0,0,1," + "9" * 2000 + "\n", "line 2: longer than 1024 bytes"),
])
def test_a_bad_file_exits_2_naming_the_line_and_column(tmp_path, capsys, text, where):
    path = _csv(tmp_path, text)
    code, out, err = _solve([path, "--out", tmp_path / "never.csv"], capsys)
    assert code == 2 and out == "", out
    assert err.startswith(f"error: PlannerError: {path}: ") and where in err, err
    assert not (tmp_path / "never.csv").exists()


def test_what_the_reader_tolerates(tmp_path, capsys):
    """A byte-order mark, CRLF line ends, blank lines, spaces around fields, columns in any order, text ids."""
    text = "\ufeffsize , upper,id,lower\r\n\r\n 8,10, big ,0\r\n3,5,a.1,0\r\n3,10,b-2,5\r\n\r\n"
    out_path = tmp_path / "o.csv"
    code, out, _ = _solve([_csv(tmp_path, text), "--capacity", 11, "--out", out_path], capsys)
    assert code == 0 and _field(out, "lower bound") == "11 bytes"
    assert out_path.read_text().splitlines() == ["id,lower,upper,size,offset", "big,0,10,8,0", "a.1,0,5,3,8",
                                                 "b-2,5,10,3,8"]


@pytest.mark.parametrize("limit, value, text, message", [
    ("MAX_ROWS", 3, "id,lower,upper,size\n" + "".join(f"{i},0,1,1\n" for i in range(4)), "line 5 (row 4): more "
     "than 3 rows"),
    ("MAX_BYTES", 60, "id,lower,upper,size\n" + "".join(f"{i},0,1,1\n" for i in range(10)), "past 60 bytes"),
])
def test_the_bounds_on_rows_and_bytes(tmp_path, capsys, monkeypatch, limit, value, text, message):
    import ggml_lite.problem_csv as problem_csv

    monkeypatch.setattr(problem_csv, limit, value)
    code, _, err = _solve([_csv(tmp_path, text)], capsys)
    assert code == 2 and message in err, err


def test_a_gigabyte_of_zeros_costs_one_line(tmp_path, capsys):
    path = tmp_path / "huge.csv"
    with open(path, "wb") as f:
        f.truncate(2**30)  # sparse: no disk
    code, _, err = _solve([path], capsys)
    assert code == 2 and "line 1: longer than 1024 bytes" in err


@pytest.mark.parametrize("argv, message", [
    (["--capacity", "0"], "expected a number of bytes, an integer >= 1"),
    (["--capacity", "-5"], "expected a number of bytes, an integer >= 1"),
    (["--capacity", "12.5"], "expected a number of bytes, an integer >= 1"),
    (["--capacity", str(2**63)], "an integer >= 1 and <= 9223372036854775807"),
    (["--budget", "0"], "expected a positive number of seconds"),
    (["--planner", "ggml"], "invalid choice: 'ggml'"),
])
def test_bad_arguments_exit_2(tmp_path, capsys, argv, message):
    src = tmp_path / "six.csv"
    write_problem_csv(src, SIX)
    with pytest.raises(SystemExit) as e:
        main(["solve", str(src), *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_export_problem_writes_the_blocks_of_the_graph(tmp_path, capsys):
    """The exported file holds chapter 11's blocks, node range [start, end + 1); solving it gives the peak
    `plan --planner best` gives the graph, and its lower bound."""
    graph = str(fixture_path("ggml-seed", "06_llama_block"))
    csv = tmp_path / "06.csv"
    assert main(["plan", graph, "--planner", "best", "--json", "--export-problem", str(csv)]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)  # (the note goes to stderr with --json)
    assert f"wrote {csv}: 18 blocks, lower bound {doc['lower_bound']} bytes" in err
    rows = read_problem_csv(csv).rows
    from ggml_lite.graphio import allocate_external, read_graph_file

    gf = read_graph_file(graph)
    allocate_external(gf)
    problem = planners.blocks_of(gf.graph)
    assert rows == [(str(b.index), b.start, b.end + 1, b.size) for b in problem.blocks]
    code, solved, _ = _solve([csv, "--capacity", doc["buffer_size"] - 32], capsys)
    assert code == 0 and _field(solved, "lower bound") == f"{doc['lower_bound']} bytes"


def test_export_problem_of_a_chunked_file_writes_the_2024_blocks(tmp_path, capsys):
    """A buffer type with a max_size (today's allocator plans chunks): the exported problem is the one buffer
    the offline planners plan, the 2024 allocator's blocks, as for the file without the limit."""
    doc = json.loads(fixture_path("ggml-seed", "06_llama_block").read_text())
    plain, limited = tmp_path / "plain.json", tmp_path / "limited.json"
    plain.write_text(json.dumps(doc))
    doc["buffer_type"]["max_size"] = 8192
    limited.write_text(json.dumps(doc))
    assert main(["plan", str(plain), "--export-problem", str(tmp_path / "a.csv")]) == 0
    assert main(["plan", str(limited), "--ggml", "2026", "--export-problem", str(tmp_path / "b.csv")]) == 0
    assert "in 7 chunks" in capsys.readouterr().out
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()


def test_solve_as_a_user_runs_it(tmp_path):
    src = tmp_path / "six.csv"
    write_problem_csv(src, SIX)
    run = subprocess.run([sys.executable, "-m", "ggml_lite", "solve", str(src), "--capacity", "8"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "capacity: 8 bytes, met" in run.stdout, run.stderr


def test_minimallocs_own_column_names_and_its_inclusive_end(tmp_path, capsys):
    """MiniMalloc's reader (converter.cc) also takes `buffer`/`buffer_id` for id, `start`/`begin` for lower and
    `end` for upper; `end` is read half-open, as MiniMalloc's benchmark files mean it (appendix A6 says why); its
    per-block `alignment` and `gaps` columns are read when they ask for nothing and refused otherwise."""
    path = tmp_path / "mm.csv"
    path.write_text("buffer,start,end,size\n0,0,10,4\n1,10,20,4\n2,9,11,8\n")
    assert read_problem_csv(path).rows == [("0", 0, 10, 4), ("1", 10, 20, 4), ("2", 9, 11, 8)]
    path.write_text("buffer_id,begin,upper,size,alignment,gaps\nx,0,9,4,1,\n")
    assert read_problem_csv(path).rows == [("x", 0, 9, 4)]
    path.write_text("id,lower,upper,size,gaps\n0,0,9,4,2-3\n")
    assert main(["solve", str(path)]) == 2
    assert "column `gaps`" in capsys.readouterr().err
    path.write_text("buffer,id,end,size\n0,1,9,4\n")  # two names for the id
    assert main(["solve", str(path)]) == 2
    assert "column `id` twice (as `id`)" in capsys.readouterr().err
